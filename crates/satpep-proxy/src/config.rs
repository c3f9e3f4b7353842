//! `satpep proxy` configuration: one TOML file. Every key has a default that works on a box
//! with a client-facing and a satellite-facing interface; every bad value is rejected with a
//! message naming its key.

use ipnet::IpNet;
use satpep_link::units::{parse_duration_ns, parse_rate, parse_size};
use serde::{Deserialize, Serialize};

/// `adaptive.interval`'s default.
pub const ADAPTIVE_INTERVAL: &str = "1s";
/// `adaptive.dwell`'s default.
pub const ADAPTIVE_DWELL: &str = "10s";
/// `adaptive.interactive_ports`' default (ssh, telnet).
pub const INTERACTIVE_PORTS: [u16; 2] = [22, 23];
/// `tunnel.listen`'s default at a terminal (any address, a port the kernel picks).
pub const TUNNEL_LISTEN_TERMINAL: &str = "[::]:0";
/// `tunnel.listen`'s default at a gateway.
pub const TUNNEL_LISTEN_GATEWAY: &str = "[::]:7701";
/// `tunnel.peer_name`'s default.
pub const TUNNEL_PEER_NAME: &str = "gateway";
/// `tunnel.congestion`'s default.
pub const TUNNEL_CONGESTION: &str = "satellite";
/// `tunnel.rtt`'s default when `satellite.rtt` is not given either.
pub const TUNNEL_RTT: &str = "600ms";
/// `tunnel.outage`'s default.
pub const TUNNEL_OUTAGE: &str = "60s";

/// The file as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    /// Which connections to split.
    #[serde(default)]
    pub intercept: InterceptFile,
    /// Listener, marks and limits.
    #[serde(default)]
    pub proxy: ProxySection,
    /// The leg facing the satellite.
    #[serde(default)]
    pub satellite: LegFile,
    /// The leg facing the terrestrial network.
    #[serde(default)]
    pub terrestrial: LegFile,
    /// Adaptive congestion control (`congestion = "adaptive"` on the satellite leg).
    #[serde(default)]
    pub adaptive: AdaptiveFile,
    /// Distributed mode: flows cross the satellite hop in a QUIC tunnel to a peer satpep.
    pub tunnel: Option<TunnelFile>,
}

/// The `[tunnel]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelFile {
    /// "terminal" (intercepts clients, opens flows) or "gateway" (carries them to servers).
    pub role: Option<String>,
    /// Terminal: the gateway's UDP address.
    pub peer: Option<String>,
    /// UDP address to listen on (gateway, default [::]:7701) or send from (terminal,
    /// default [::]:0).
    pub listen: Option<String>,
    /// The deployment's CA certificate (PEM); peers must chain to it.
    pub ca: Option<String>,
    /// This satpep's certificate (PEM), signed by the CA.
    pub cert: Option<String>,
    /// This satpep's private key (PEM).
    pub key: Option<String>,
    /// Terminal: the name in the gateway's certificate (default "gateway").
    pub peer_name: Option<String>,
    /// Congestion control of this side's sending direction (default "satellite").
    pub congestion: Option<String>,
    /// This side's sending rate on the hop (default: satellite.rate).
    pub rate: Option<String>,
    /// The peer's sending rate, sizing receive windows (default: this side's rate).
    pub receive_rate: Option<String>,
    /// The hop's round-trip time (default: satellite.rtt, else 600ms).
    pub rtt: Option<String>,
    /// How long the hop may be down before flows are given up (default 60s).
    pub outage: Option<String>,
    /// Gateway: the terminals admitted, by certificate name (default: any the CA signed).
    pub terminals: Option<Vec<String>>,
    /// Gateway: the CA's revocation list (PEM or DER, `satpep keygen revoke` writes it).
    pub crl: Option<String>,
    /// Gateway: one forward carrier shared among the terminals (a hub).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<CarrierFile>,
}

/// The `[tunnel.carrier]` section: the gateway shares one forward carrier among its
/// terminals (see `satpep_tunnel::hub`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarrierFile {
    /// The carrier's rate for the tunnel, e.g. "200Mbit".
    pub rate: Option<String>,
    /// What is shared: "time" (default; carrier time by weight) or "bits" (bits by weight).
    pub share: Option<String>,
    /// Settings per terminal, by certificate name: `[tunnel.carrier.terminal.NAME]`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub terminal: std::collections::BTreeMap<String, TerminalShareFile>,
}

/// One terminal's settings on a shared carrier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalShareFile {
    /// Its weight (default 1).
    pub weight: Option<f64>,
    /// Committed rate: it gets at least this while busy, e.g. "5Mbit".
    pub cir: Option<String>,
    /// Maximum rate, e.g. "50Mbit".
    pub mir: Option<String>,
    /// Its link's rate (modulation and coding), for sharing time (default: the carrier's).
    pub rate: Option<String>,
    /// A split gateway's (`[proxy.carrier]`): the client subnets behind this terminal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subnets: Option<Vec<String>>,
}

impl CarrierFile {
    /// A tunnel gateway's carrier (`[tunnel.carrier]`: terminals by certificate name).
    fn resolve(&self) -> Result<satpep_tunnel::hub::Carrier, String> {
        if let Some(name) = self
            .terminal
            .iter()
            .find(|(_, t)| t.subnets.is_some())
            .map(|(n, _)| n)
        {
            return Err(format!(
                "tunnel.carrier.terminal.{name}.subnets: a tunnel's terminal is known by its certificate name (subnets are for a split gateway's [proxy.carrier])"
            ));
        }
        self.resolve_at("tunnel.carrier")
    }

    /// A split gateway's carrier (`[proxy.carrier]`: terminals by their client subnets).
    fn resolve_split(&self) -> Result<crate::share::SplitCarrier, String> {
        let carrier = self.resolve_at("proxy.carrier")?;
        let mut subnets: Vec<(IpNet, String)> = Vec::new();
        for (name, t) in &self.terminal {
            let key = format!("proxy.carrier.terminal.{name}.subnets");
            let list = match &t.subnets {
                Some(l) if !l.is_empty() => l,
                _ => {
                    return Err(format!(
                        "{key}: missing: the client subnets behind this terminal, e.g. [\"198.18.1.0/24\"]"
                    ))
                }
            };
            for net in nets(&key, list)? {
                if let Some((_, other)) = subnets.iter().find(|(n, _)| *n == net) {
                    return Err(format!("{key}: {net} is also {other}'s"));
                }
                subnets.push((net, name.clone()));
            }
        }
        Ok(crate::share::SplitCarrier { carrier, subnets })
    }

    fn resolve_at(&self, at: &str) -> Result<satpep_tunnel::hub::Carrier, String> {
        let rate = |key: &str, v: &str| -> Result<u64, String> {
            let bps = parse_rate(v).map_err(|e| format!("{at}.{key}: {e}"))?;
            if bps < 1e3 {
                return Err(format!("{at}.{key}: {v} is below 1 kbit/s"));
            }
            Ok(satpep_tunnel::hub::payload_bytes_per_s(bps))
        };
        let total = match self.rate.as_deref() {
            Some(r) => rate("rate", r)?,
            None => {
                return Err(format!(
                    "{at}.rate: missing: the rate shared, e.g. \"200Mbit\""
                ))
            }
        };
        let by = satpep_tunnel::hub::ShareBy::parse(self.share.as_deref().unwrap_or("time"))
            .map_err(|e| format!("{at}.share: {e}"))?;
        let mut terminals = Vec::new();
        for (name, t) in &self.terminal {
            if !satpep_tunnel::keys::valid_name(name) {
                let what = if at.starts_with("tunnel") {
                    "a certificate name"
                } else {
                    "a terminal name (letters, digits and '-', in labels split by '.')"
                };
                return Err(format!("{at}.terminal.{name}: not {what}"));
            }
            let key = |k: &str| format!("terminal.{name}.{k}");
            let opt = |k: &str, v: &Option<String>| -> Result<u64, String> {
                v.as_deref().map_or(Ok(0), |v| rate(&key(k), v))
            };
            let weight = t.weight.unwrap_or(1.0);
            if !(weight.is_finite() && weight > 0.0 && weight <= 1e6) {
                return Err(format!(
                    "{at}.{}: {weight}: a weight is above 0 and at most 1000000",
                    key("weight")
                ));
            }
            let share = satpep_tunnel::hub::TerminalShare {
                weight,
                cir: opt("cir", &t.cir)?,
                mir: opt("mir", &t.mir)?,
                rate: opt("rate", &t.rate)?,
            };
            if share.mir > 0 && share.cir > share.mir {
                return Err(format!(
                    "{at}.{}: the committed rate is above the maximum",
                    key("cir")
                ));
            }
            terminals.push((name.clone(), share));
        }
        Ok(satpep_tunnel::hub::Carrier {
            rate: total,
            by,
            terminals,
        })
    }
}

/// Which end of the tunnel this satpep is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Intercepts client connections and opens a stream per flow to the gateway.
    Terminal,
    /// Accepts the terminal's streams and connects to the servers.
    Gateway,
}

/// The tunnel's resolved settings.
#[derive(Debug, Clone)]
pub struct TunnelConfig {
    /// This end.
    pub role: Role,
    /// The gateway (terminal only).
    pub peer: Option<std::net::SocketAddr>,
    /// Local UDP address.
    pub listen: std::net::SocketAddr,
    /// CA, certificate and key files.
    pub ca: std::path::PathBuf,
    /// This satpep's certificate.
    pub cert: std::path::PathBuf,
    /// Its key.
    pub key: std::path::PathBuf,
    /// Expected name of the gateway's certificate.
    pub peer_name: String,
    /// The hop: rates, RTT, outage, controller.
    pub hop: satpep_tunnel::transport::Hop,
    /// Gateway: the terminals admitted by name (`None`: any the CA signed). A reload
    /// applies it.
    pub terminals: Option<Vec<String>>,
    /// Gateway: the revocation list's file. A reload reads it again.
    pub crl: Option<std::path::PathBuf>,
    /// Gateway: the forward carrier shared among the terminals (None: each terminal at its
    /// own controller's rate). A reload applies it.
    pub carrier: Option<satpep_tunnel::hub::Carrier>,
}

impl TunnelConfig {
    /// What the gateway admits, read now (the revocation list from its file).
    pub fn admission(&self) -> Result<satpep_tunnel::admission::Admission, String> {
        satpep_tunnel::admission::Admission::load(self.terminals.as_deref(), self.crl.as_deref())
    }

    /// Equal but for what a reload applies (the admission's keys and the shared carrier).
    pub fn same_but_reloadable(&self, o: &Self) -> bool {
        self == &TunnelConfig {
            terminals: self.terminals.clone(),
            crl: self.crl.clone(),
            carrier: self.carrier.clone(),
            ..o.clone()
        }
    }
}

impl PartialEq for TunnelConfig {
    fn eq(&self, o: &Self) -> bool {
        // Hop has no PartialEq (it holds floats nowhere, but quinn types are not comparable).
        self.role == o.role
            && self.peer == o.peer
            && self.listen == o.listen
            && (&self.ca, &self.cert, &self.key) == (&o.ca, &o.cert, &o.key)
            && self.peer_name == o.peer_name
            && format!("{:?}", self.hop) == format!("{:?}", o.hop)
            && (&self.terminals, &self.crl) == (&o.terminals, &o.crl)
            && self.carrier == o.carrier
    }
}

impl TunnelFile {
    fn resolve(&self, sat: &LegFile, max_flows: u32) -> Result<TunnelConfig, String> {
        let role = match self.role.as_deref() {
            Some("terminal") => Role::Terminal,
            Some("gateway") => Role::Gateway,
            Some(x) => {
                return Err(format!(
                    "tunnel.role: '{x}' (use \"terminal\" or \"gateway\")"
                ))
            }
            None => return Err("tunnel.role: missing (\"terminal\" or \"gateway\")".into()),
        };
        let addr = |key: &str, v: &str| -> Result<std::net::SocketAddr, String> {
            v.parse().map_err(|_| {
                format!("tunnel.{key}: '{v}' is not an address:port (e.g. 198.18.2.2:7701)")
            })
        };
        let peer = match (role, &self.peer) {
            (Role::Terminal, Some(p)) => Some(addr("peer", p)?),
            (Role::Terminal, None) => {
                return Err("tunnel.peer: the terminal needs the gateway's address".into())
            }
            (Role::Gateway, Some(_)) => {
                return Err("tunnel.peer: only the terminal names a peer".into())
            }
            (Role::Gateway, None) => None,
        };
        let listen = addr(
            "listen",
            self.listen.as_deref().unwrap_or(match role {
                Role::Terminal => TUNNEL_LISTEN_TERMINAL,
                Role::Gateway => TUNNEL_LISTEN_GATEWAY,
            }),
        )?;
        let file = |key: &str, v: &Option<String>| -> Result<std::path::PathBuf, String> {
            match v {
                Some(p) if !p.is_empty() => Ok(p.into()),
                _ => Err(format!(
                    "tunnel.{key}: missing (make credentials with `satpep keygen`)"
                )),
            }
        };
        let peer_name = self.peer_name.clone().unwrap_or(TUNNEL_PEER_NAME.into());
        if !satpep_tunnel::keys::valid_name(&peer_name) {
            return Err(format!(
                "tunnel.peer_name: '{peer_name}' is not a certificate name"
            ));
        }
        let congestion = satpep_tunnel::congestion::Algorithm::parse(
            self.congestion.as_deref().unwrap_or(TUNNEL_CONGESTION),
        )
        .map_err(|e| format!("tunnel.congestion: {e}"))?;
        let rate = |key: &str, v: Option<&String>| -> Result<Option<u64>, String> {
            v.map(|r| {
                let bps = parse_rate(r).map_err(|e| format!("tunnel.{key}: {e}"))?;
                if !(1e3..=1e11).contains(&bps) {
                    return Err(format!(
                        "tunnel.{key}: {r} is outside 1 kbit/s … 100 Gbit/s"
                    ));
                }
                Ok(bps as u64)
            })
            .transpose()
        };
        let send_rate = rate("rate", self.rate.as_ref().or(sat.rate.as_ref()))?;
        let receive_rate = rate("receive_rate", self.receive_rate.as_ref())?.or(send_rate);
        let dur = |key: &str, v: &str, lo: &str, hi: &str| -> Result<std::time::Duration, String> {
            let ns = parse_duration_ns(v).map_err(|e| format!("tunnel.{key}: {e}"))?;
            let bound = |b: &str| parse_duration_ns(b).expect("literal");
            if !(bound(lo)..=bound(hi)).contains(&ns) {
                return Err(format!("tunnel.{key}: {v} is outside {lo} … {hi}"));
            }
            Ok(std::time::Duration::from_nanos(ns))
        };
        let rtt = dur(
            "rtt",
            self.rtt
                .as_deref()
                .or(sat.rtt.as_deref())
                .unwrap_or(TUNNEL_RTT),
            "1ms",
            "10s",
        )?;
        let outage = dur(
            "outage",
            self.outage.as_deref().unwrap_or(TUNNEL_OUTAGE),
            "1s",
            "1h",
        )?;
        if role == Role::Terminal {
            for (key, set, does) in [
                ("terminals", self.terminals.is_some(), "admits terminals"),
                ("crl", self.crl.is_some(), "admits terminals"),
                (
                    "carrier",
                    self.carrier.is_some(),
                    "shares a carrier among terminals",
                ),
            ] {
                if set {
                    return Err(format!("tunnel.{key}: only a gateway {does}"));
                }
            }
        }
        let terminals = match &self.terminals {
            Some(names) => {
                if names.is_empty() {
                    return Err("tunnel.terminals: empty: no terminal could connect (leave the key out to admit any the CA signed)".into());
                }
                for n in names {
                    if !satpep_tunnel::keys::valid_name(n) {
                        return Err(format!("tunnel.terminals: '{n}' is not a certificate name"));
                    }
                }
                Some(names.clone())
            }
            None => None,
        };
        let crl = match self.crl.as_deref() {
            Some("") => return Err("tunnel.crl: empty (leave the key out for none)".into()),
            c => c.map(std::path::PathBuf::from),
        };
        let carrier = self
            .carrier
            .as_ref()
            .map(CarrierFile::resolve)
            .transpose()?;
        Ok(TunnelConfig {
            terminals,
            crl,
            carrier,
            role,
            peer,
            listen,
            ca: file("ca", &self.ca)?,
            cert: file("cert", &self.cert)?,
            key: file("key", &self.key)?,
            peer_name,
            hop: satpep_tunnel::transport::Hop {
                send_rate,
                receive_rate,
                rtt,
                outage,
                congestion,
                max_flows: max_flows.into(),
            },
        })
    }
}

/// The `[adaptive]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveFile {
    /// How often each connection is classified (default 1s).
    pub interval: Option<String>,
    /// Least time a connection keeps a controller before another switch (default 10s).
    pub dwell: Option<String>,
    /// Server ports of interactive applications, left on the default controller
    /// (default [22, 23]).
    pub interactive_ports: Option<Vec<u16>>,
    /// Class name → controller ("" or "default": the kernel's default), overriding the
    /// shipped policy class by class.
    #[serde(default)]
    pub policy: std::collections::BTreeMap<String, String>,
}

/// The adaptive selection's resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// Classification period.
    pub interval: std::time::Duration,
    /// Least time between switches.
    pub dwell: std::time::Duration,
    /// Ports left alone.
    pub interactive_ports: Vec<u16>,
    /// Controller per class ("" for the default), in `Class::ALL` order.
    pub policy: Vec<(crate::adaptive::Class, String)>,
}

impl AdaptiveConfig {
    /// The controller for `class` ("" for the default).
    pub fn cc_for(&self, class: crate::adaptive::Class) -> &str {
        self.policy
            .iter()
            .find(|(c, _)| *c == class)
            .map(|(_, cc)| cc.as_str())
            .unwrap_or("")
    }
}

impl AdaptiveFile {
    fn resolve(&self) -> Result<AdaptiveConfig, String> {
        let dur =
            |key: &str, v: &Option<String>, default: &str| -> Result<std::time::Duration, String> {
                let ns = parse_duration_ns(v.as_deref().unwrap_or(default))
                    .map_err(|e| format!("adaptive.{key}: {e}"))?;
                if !(100_000_000..=3_600_000_000_000).contains(&ns) {
                    return Err(format!("adaptive.{key}: must be between 100 ms and 1 h"));
                }
                Ok(std::time::Duration::from_nanos(ns))
            };
        let mut policy: Vec<(crate::adaptive::Class, String)> = crate::adaptive::Class::ALL
            .iter()
            .map(|c| (*c, c.default_cc().to_string()))
            .collect();
        for (k, v) in &self.policy {
            let slot = policy
                .iter_mut()
                .find(|(c, _)| c.name() == k.as_str())
                .ok_or_else(|| {
                    let names: Vec<&str> = crate::adaptive::Class::ALL
                        .iter()
                        .map(|c| c.name())
                        .collect();
                    format!(
                        "adaptive.policy: '{k}' is not a class ({})",
                        names.join(", ")
                    )
                })?;
            let cc = if v == "default" { "" } else { v.as_str() };
            if !cc.is_empty()
                && (cc.len() > 15 || !cc.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            {
                return Err(format!(
                    "adaptive.policy.{k}: '{v}' is not a congestion control name"
                ));
            }
            slot.1 = cc.to_string();
        }
        Ok(AdaptiveConfig {
            interval: dur("interval", &self.interval, ADAPTIVE_INTERVAL)?,
            dwell: dur("dwell", &self.dwell, ADAPTIVE_DWELL)?,
            interactive_ports: self
                .interactive_ports
                .clone()
                .unwrap_or(INTERACTIVE_PORTS.to_vec()),
            policy,
        })
    }
}

/// Selection rules, firewall style.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterceptFile {
    /// Ingress interfaces whose TCP connections are split (empty: every interface).
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Client prefixes (empty: any).
    #[serde(default)]
    pub sources: Vec<String>,
    /// Server prefixes (empty: any).
    #[serde(default)]
    pub destinations: Vec<String>,
    /// Server ports (empty: any).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Client prefixes never split.
    #[serde(default)]
    pub exclude_sources: Vec<String>,
    /// Server prefixes never split.
    #[serde(default)]
    pub exclude_destinations: Vec<String>,
    /// Server ports never split.
    #[serde(default)]
    pub exclude_ports: Vec<u16>,
}

/// The `[proxy]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySection {
    /// TPROXY listener port (IPv4 and IPv6).
    pub port: u16,
    /// Firewall mark for intercepted packets.
    pub mark: u32,
    /// Routing table that delivers marked packets locally.
    pub table: u32,
    /// Which side of the proxy the satellite is on: "upstream" (the proxy sits at the
    /// terminal; servers are across the satellite) or "downstream" (at the gateway).
    pub satellite_side: String,
    /// When the client's handshake completes: "fast" (at once; a refused or unreachable
    /// server then resets the client) or "strict" (after the server's did; the client sees
    /// refusal, unreachability and slowness as from the server itself).
    pub handshake: String,
    /// NFQUEUE number that holds SYNs in strict mode.
    pub queue: u16,
    /// Relay buffer per direction per connection.
    pub buffer: String,
    /// How bytes move between the legs: "splice" (zero-copy through a kernel pipe) or "copy"
    /// (through user space; for comparison).
    pub relay: String,
    /// How a direction holds back a sender faster than the other leg: "improved" (the
    /// default; Bharadwaj 1999 §4.3: the downstream socket holds little beyond what its send
    /// window lets it send, so the excess waits upstream, whose advertised window shrinks at
    /// once) or "plain" (the excess waits in the pipe and the downstream socket's send
    /// buffer, then in the upstream receive buffer). Split connections only.
    pub back_pressure: String,
    /// Drop-based flow control (Bharadwaj 1999 §4.2): when more is buffered for a direction
    /// than max(half the upstream receive window, twice the downstream congestion window),
    /// drop one arriving segment unacknowledged, and no other until its retransmission
    /// arrives. Needs BPF at start.
    pub drop_flow_control: bool,
    /// Bharadwaj 1999 ch. 6's buffer sizing: the upstream receive window (B1) is set, every
    /// two upstream round trips, from the downstream leg's window, send window and queue.
    pub buffer_sizing: bool,
    /// Most connections split at once; past it new connections are forwarded end to end.
    pub max_connections: u32,
    /// Processes that accept and relay split connections (1 to 64): with more than one, the
    /// proxy starts that many worker processes, all listening on `port` (SO_REUSEPORT, the
    /// kernel spreads new connections among them), and only coordinates them. For a host
    /// whose descriptor limit holds fewer connections than `max_connections` and cannot be
    /// raised (a container without CAP_SYS_RESOURCE): each process has its own table. Split
    /// mode only.
    pub workers: u32,
    /// Most memory buffered for connections (kernel TCP memory plus relay pipes), as a size
    /// ("2GiB") or a share of physical memory ("25%"); past it new connections are
    /// forwarded end to end.
    pub max_memory: String,
    /// Address of the `/metrics` endpoint ("" to disable).
    pub metrics: String,
    /// Where `/connections` (every live connection with its client's address) is served:
    /// "metrics" (the default: beside `/metrics`, on its listener), an address:port of its
    /// own (then not on the metrics listener), or "" (nowhere).
    pub connections: String,
    /// TCP keepalive on both legs: after this long without traffic the kernel probes the
    /// peer, and a peer that has vanished (a half-open connection) is found within about a
    /// minute more and reset on the other leg. "0s" turns it off.
    pub keepalive: String,
    /// Connections with no byte either way for this long are reset on both legs. "0s"
    /// (the default) never does.
    pub idle_timeout: String,
    /// On SIGTERM or SIGINT, new connections bypass the proxy and live ones may finish for up
    /// to this long before the rest are reset; a second signal resets them at once. "0s"
    /// resets them at once.
    pub drain: String,
    /// Every this long, one info line sums up the interval (connections accepted, failed,
    /// bypassed, bytes each way), when anything happened; lines per connection are at
    /// debug (target `satpep::connection`). "0s" turns it off.
    pub log_summary: String,
    /// A split gateway's forward carrier shared among its terminals (a hub), as a tunnel
    /// gateway's `[tunnel.carrier]`, each named terminal with its client `subnets`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<CarrierFile>,
}

impl Default for ProxySection {
    fn default() -> Self {
        ProxySection {
            port: 7700,
            mark: 0x5350,
            table: 0x5350,
            satellite_side: "upstream".into(),
            handshake: "fast".into(),
            queue: 0x5350,
            buffer: "256KiB".into(),
            relay: "splice".into(),
            back_pressure: "improved".into(),
            drop_flow_control: false,
            buffer_sizing: false,
            max_connections: 10_000,
            workers: 1,
            max_memory: "25%".into(),
            metrics: "127.0.0.1:9917".into(),
            connections: "metrics".into(),
            keepalive: "2min".into(),
            idle_timeout: "0s".into(),
            drain: "30s".into(),
            log_summary: "1min".into(),
            carrier: None,
        }
    }
}

/// Per-leg TCP tuning as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegFile {
    /// Congestion control (kernel name, e.g. cubic, bbr).
    pub congestion: Option<String>,
    /// Link rate of this leg, used with `rtt` to size socket buffers.
    pub rate: Option<String>,
    /// Round-trip time of this leg.
    pub rtt: Option<String>,
    /// Explicit socket buffer size (overrides rate × rtt).
    pub buffer: Option<String>,
    /// Disable Nagle.
    pub nodelay: Option<bool>,
    /// TCP_NOTSENT_LOWAT: unsent bytes kept in the socket at most.
    pub notsent_lowat: Option<String>,
    /// The interface this leg leaves by (needed for initcwnd, initrwnd and the forwarded
    /// traffic's MSS clamp).
    pub interface: Option<String>,
    /// Initial congestion window, segments, set on the routes out of `interface`.
    pub initcwnd: Option<u32>,
    /// Initial advertised receive window, segments, set on the routes out of `interface`.
    pub initrwnd: Option<u32>,
    /// Largest segment this leg sends or is sent, bytes (TCP_MAXSEG; with `interface`, also
    /// clamped in forwarded SYNs).
    pub mss: Option<u32>,
    /// TCP Fast Open on this leg: accepting, or sending the client's first bytes in the SYN.
    pub fastopen: Option<bool>,
}

/// One leg's resolved tuning.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leg {
    /// Congestion control name.
    pub congestion: Option<String>,
    /// SO_SNDBUF/SO_RCVBUF bytes.
    pub buffer: Option<usize>,
    /// TCP_NODELAY.
    pub nodelay: bool,
    /// TCP_NOTSENT_LOWAT bytes.
    pub notsent_lowat: Option<u32>,
    /// Interface the leg leaves by.
    pub interface: Option<String>,
    /// Initial cwnd on its routes, segments.
    pub initcwnd: Option<u32>,
    /// Initial rwnd on its routes, segments.
    pub initrwnd: Option<u32>,
    /// TCP_MAXSEG bytes.
    pub mss: Option<u32>,
    /// TCP Fast Open.
    pub fastopen: bool,
}

/// Where the `/connections` endpoint is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionsAt {
    /// On the metrics listener, beside `/metrics` (nowhere if that is off).
    WithMetrics,
    /// On a listener of its own; the metrics listener does not serve it.
    Own(std::net::SocketAddr),
    /// Not served.
    Nowhere,
}

impl ProxyConfig {
    /// The connections each process may hold: its share of `max_connections` among
    /// `workers`.
    pub fn connections_per_process(&self) -> u32 {
        self.max_connections.div_ceil(self.workers.max(1))
    }

    /// Why `/connections` may be exposed beyond this host: it lists every client's address,
    /// and with `proxy.connections = "metrics"` it is wherever `/metrics` is, which
    /// operators often open to a Prometheus on another machine.
    pub fn connections_exposed(&self) -> Option<String> {
        let at = match (self.connections, self.metrics) {
            (ConnectionsAt::WithMetrics, Some(m)) => m,
            (ConnectionsAt::Own(a), _) => a,
            _ => return None,
        };
        (!at.ip().is_loopback()).then(|| {
            format!(
                "proxy.connections: /connections (every client's address) is served on {at}, which is not a loopback address; set proxy.connections to \"\" or to a loopback address such as 127.0.0.1:9918"
            )
        })
    }
}

/// How the relay holds back a sender faster than the other leg (Bharadwaj 1999 §4.2–4.3,
/// ch. 6); see `crate::flow_control`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowControl {
    /// Improved back-pressure: each socket holds at most a low-water mark unsent.
    pub improved: bool,
    /// Drop-based flow control.
    pub drop: bool,
    /// Chapter 6's buffer sizing of the upstream receive window.
    pub sizing: bool,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Ingress interfaces (empty: all).
    pub interfaces: Vec<String>,
    /// Client prefixes (empty: any).
    pub sources: Vec<IpNet>,
    /// Server prefixes (empty: any).
    pub destinations: Vec<IpNet>,
    /// Server ports (empty: any).
    pub ports: Vec<u16>,
    /// Excluded client prefixes.
    pub exclude_sources: Vec<IpNet>,
    /// Excluded server prefixes.
    pub exclude_destinations: Vec<IpNet>,
    /// Excluded server ports.
    pub exclude_ports: Vec<u16>,
    /// Listener port.
    pub port: u16,
    /// Firewall mark.
    pub mark: u32,
    /// Routing table.
    pub table: u32,
    /// True when the satellite is on the upstream (server) side.
    pub satellite_upstream: bool,
    /// Strict handshake (SYN held until the server answers).
    pub strict: bool,
    /// NFQUEUE number for held SYNs.
    pub queue: u16,
    /// Relay buffer bytes per direction.
    pub buffer: usize,
    /// Zero-copy relay (splice) rather than copying.
    pub splice: bool,
    /// How the relay holds back a fast sender (`proxy.back_pressure`,
    /// `proxy.drop_flow_control`, `proxy.buffer_sizing`).
    pub flow: FlowControl,
    /// Connection limit.
    pub max_connections: u32,
    /// Processes accepting and relaying (`proxy.workers`).
    pub workers: u32,
    /// Memory limit, bytes.
    pub max_memory: u64,
    /// Metrics endpoint.
    pub metrics: Option<std::net::SocketAddr>,
    /// Where `/connections` is served.
    pub connections: ConnectionsAt,
    /// Keepalive idle time on both legs.
    pub keepalive: Option<std::time::Duration>,
    /// Idle connections are reset after this long.
    pub idle_timeout: Option<std::time::Duration>,
    /// How long live connections may finish after a stop signal (`None`: reset at once).
    pub drain: Option<std::time::Duration>,
    /// How often the summary line is logged (`None`: never).
    pub log_summary: Option<std::time::Duration>,
    /// A split gateway's shared forward carrier (`proxy.carrier`).
    pub carrier: Option<std::sync::Arc<crate::share::SplitCarrier>>,
    /// Satellite leg.
    pub satellite: Leg,
    /// Terrestrial leg.
    pub terrestrial: Leg,
    /// Adaptive selection on the satellite leg (`congestion = "adaptive"`), if chosen.
    pub adaptive: Option<AdaptiveConfig>,
    /// Distributed mode, if configured.
    pub tunnel: Option<TunnelConfig>,
}

fn nets(key: &str, v: &[String]) -> Result<Vec<IpNet>, String> {
    v.iter()
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
                .map(|n| n.trunc())
                .map_err(|_| format!("{key}: '{s}' is not an IP prefix (e.g. 198.18.1.0/24)"))
        })
        .collect()
}

fn ifname_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() < 16
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
}

impl LegFile {
    fn resolve(&self, section: &str) -> Result<Leg, String> {
        let key = |k: &str| format!("{section}.{k}");
        if let Some(cc) = &self.congestion {
            if cc.is_empty()
                || cc.len() > 15
                || !cc.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(format!(
                    "{}: '{cc}' is not a congestion control name",
                    key("congestion")
                ));
            }
        }
        let buffer = match (&self.buffer, &self.rate, &self.rtt) {
            (Some(b), _, _) => Some(parse_size(b).map_err(|e| format!("{}: {e}", key("buffer")))?),
            (None, Some(r), Some(t)) => {
                let r = parse_rate(r).map_err(|e| format!("{}: {e}", key("rate")))?;
                let t = parse_duration_ns(t).map_err(|e| format!("{}: {e}", key("rtt")))?;
                // Four bandwidth-delay products: the kernel keeps half of a buffer for
                // overhead, and a full bottleneck queue can double the RTT the window must
                // cover.
                Some((4.0 * r * t as f64 / 8e9).ceil() as u64)
            }
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(format!(
                    "{}: give both rate and rtt to size buffers, or buffer",
                    key("rate")
                ))
            }
            (None, None, None) => None,
        };
        if let Some(b) = buffer {
            if !(4096..=1 << 30).contains(&b) {
                return Err(format!(
                    "{}: {b} bytes is outside 4 KiB … 1 GiB",
                    key("buffer")
                ));
            }
        }
        let notsent_lowat = match &self.notsent_lowat {
            Some(s) => Some(
                u32::try_from(parse_size(s).map_err(|e| format!("{}: {e}", key("notsent_lowat")))?)
                    .map_err(|_| format!("{}: too large", key("notsent_lowat")))?,
            ),
            None => None,
        };
        if let Some(i) = &self.interface {
            if !ifname_ok(i) {
                return Err(format!(
                    "{}: '{i}' is not an interface name",
                    key("interface")
                ));
            }
        }
        for (k, v) in [("initcwnd", self.initcwnd), ("initrwnd", self.initrwnd)] {
            if let Some(v) = v {
                if !(1..=1024).contains(&v) {
                    return Err(format!("{}: {v} segments is outside 1 … 1024", key(k)));
                }
                if self.interface.is_none() {
                    return Err(format!(
                        "{}: needs {} (the windows are set on its routes)",
                        key(k),
                        key("interface")
                    ));
                }
            }
        }
        if let Some(m) = self.mss {
            if !(536..=65495).contains(&m) {
                return Err(format!("{}: {m} bytes is outside 536 … 65495", key("mss")));
            }
        }
        Ok(Leg {
            congestion: self.congestion.clone(),
            buffer: buffer.map(|b| b as usize),
            nodelay: self.nodelay.unwrap_or(false),
            notsent_lowat,
            interface: self.interface.clone(),
            initcwnd: self.initcwnd,
            initrwnd: self.initrwnd,
            mss: self.mss,
            fastopen: self.fastopen.unwrap_or(false),
        })
    }
}

impl ProxyFile {
    /// Parses TOML text; errors name the key.
    pub fn parse(text: &str) -> Result<ProxyFile, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Validates everything.
    pub fn resolve(&self) -> Result<ProxyConfig, String> {
        let i = &self.intercept;
        if let Some(bad) = i.interfaces.iter().find(|s| !ifname_ok(s)) {
            return Err(format!(
                "intercept.interfaces: '{bad}' is not an interface name"
            ));
        }
        let p = &self.proxy;
        if p.port == 0 {
            return Err("proxy.port: 0 is not a port".into());
        }
        if p.mark == 0 {
            return Err("proxy.mark: must not be 0 (unmarked packets have mark 0)".into());
        }
        if p.table == 0 || p.table == 253 || p.table == 254 || p.table == 255 {
            return Err(format!(
                "proxy.table: {} is reserved (0, default 253, main 254, local 255)",
                p.table
            ));
        }
        let satellite_upstream = match p.satellite_side.as_str() {
            "upstream" => true,
            "downstream" => false,
            other => {
                return Err(format!(
                    "proxy.satellite_side: '{other}' (use \"upstream\" at a terminal, \"downstream\" at a gateway)"
                ))
            }
        };
        let buffer = parse_size(&p.buffer).map_err(|e| format!("proxy.buffer: {e}"))?;
        if !(4096..=16 << 20).contains(&buffer) {
            return Err(format!(
                "proxy.buffer: {buffer} bytes is outside 4 KiB … 16 MiB"
            ));
        }
        let strict = match p.handshake.as_str() {
            "fast" => false,
            "strict" => true,
            other => {
                return Err(format!(
                    "proxy.handshake: '{other}' (use \"fast\" or \"strict\")"
                ))
            }
        };
        let splice = match p.relay.as_str() {
            "splice" => true,
            "copy" => false,
            other => {
                return Err(format!(
                    "proxy.relay: '{other}' (use \"splice\" or \"copy\")"
                ))
            }
        };
        let improved = match p.back_pressure.as_str() {
            "plain" => false,
            "improved" => true,
            other => {
                return Err(format!(
                    "proxy.back_pressure: '{other}' (use \"plain\" or \"improved\")"
                ))
            }
        };
        let flow = FlowControl {
            improved,
            drop: p.drop_flow_control,
            sizing: p.buffer_sizing,
        };
        // Back-pressure is how the split relay writes (a tunnel's flows do not use it); the
        // other two act on a split connection's sockets, so a tunnel refuses them.
        if self.tunnel.is_some() && (flow.drop || flow.sizing) {
            let key = if flow.drop {
                "drop_flow_control"
            } else {
                "buffer_sizing"
            };
            return Err(format!(
                "proxy.{key}: applies to split connections; a tunnel's flows are held back by QUIC's own flow control (remove it from the [tunnel] configuration)"
            ));
        }
        if p.max_connections == 0 {
            return Err("proxy.max_connections: must be at least 1".into());
        }
        if !(1..=crate::workers::MAX_WORKERS as u32).contains(&p.workers) {
            return Err(format!(
                "proxy.workers: must be between 1 and {}",
                crate::workers::MAX_WORKERS
            ));
        }
        if p.workers > 1 {
            let why = if self.tunnel.is_some() {
                Some("a tunnel carries its flows over one QUIC connection per process")
            } else if strict {
                Some("proxy.handshake = \"strict\" holds each SYN in the one process that reads the queue")
            } else if p.carrier.is_some() {
                Some("proxy.carrier shares the carrier among every connection of one process")
            } else if p.drop_flow_control {
                Some("proxy.drop_flow_control's filter keeps the connections of one process")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(format!("proxy.workers: must be 1 here: {why}"));
            }
        }
        let max_memory = parse_memory(&p.max_memory, physical_memory())
            .map_err(|e| format!("proxy.max_memory: {e}"))?;
        let timeout = |key: &str, v: &str, min_s: u64| -> Result<_, String> {
            let ns = parse_duration_ns(v).map_err(|e| format!("proxy.{key}: {e}"))?;
            if ns == 0 {
                return Ok(None);
            }
            if ns < min_s * 1_000_000_000 || ns > 7 * 86_400 * 1_000_000_000 {
                return Err(format!(
                    "proxy.{key}: must be \"0s\" (off) or between {min_s} s and 7 days"
                ));
            }
            Ok(Some(std::time::Duration::from_nanos(ns)))
        };
        let keepalive = timeout("keepalive", &p.keepalive, 1)?;
        let idle_timeout = timeout("idle_timeout", &p.idle_timeout, 1)?;
        let drain = timeout("drain", &p.drain, 1)?;
        let log_summary = timeout("log_summary", &p.log_summary, 1)?;
        let carrier = match &p.carrier {
            None => None,
            Some(_) if satellite_upstream => {
                return Err("proxy.carrier: only a gateway shares a carrier (proxy.satellite_side = \"downstream\")".into())
            }
            Some(_) if self.tunnel.is_some() => {
                return Err("proxy.carrier: a split gateway's; a tunnel gateway shares its carrier with [tunnel.carrier]".into())
            }
            Some(c) => Some(std::sync::Arc::new(c.resolve_split()?)),
        };
        Ok(ProxyConfig {
            interfaces: i.interfaces.clone(),
            sources: nets("intercept.sources", &i.sources)?,
            destinations: nets("intercept.destinations", &i.destinations)?,
            ports: i.ports.clone(),
            exclude_sources: nets("intercept.exclude_sources", &i.exclude_sources)?,
            exclude_destinations: nets("intercept.exclude_destinations", &i.exclude_destinations)?,
            exclude_ports: i.exclude_ports.clone(),
            port: p.port,
            mark: p.mark,
            table: p.table,
            satellite_upstream,
            buffer: buffer as usize,
            strict,
            queue: p.queue,
            splice,
            flow,
            max_connections: p.max_connections,
            workers: p.workers,
            max_memory,
            keepalive,
            idle_timeout,
            drain,
            log_summary,
            carrier,
            metrics: if p.metrics.is_empty() {
                None
            } else {
                Some(p.metrics.parse().map_err(|_| {
                    format!(
                        "proxy.metrics: '{}' is not an address:port (e.g. 127.0.0.1:9917)",
                        p.metrics
                    )
                })?)
            },
            connections: match p.connections.as_str() {
                "metrics" => ConnectionsAt::WithMetrics,
                "" => ConnectionsAt::Nowhere,
                a => ConnectionsAt::Own(a.parse().map_err(|_| {
                    format!(
                        "proxy.connections: '{a}' is neither \"metrics\", \"\" nor an address:port (e.g. 127.0.0.1:9918)"
                    )
                })?),
            },
            satellite: {
                // "adaptive" is not a kernel name: the leg starts on the default.
                let mut leg = self.satellite.resolve("satellite")?;
                leg.congestion = leg.congestion.filter(|c| c != "adaptive");
                leg
            },
            terrestrial: self.terrestrial.resolve("terrestrial")?,
            adaptive: if self.satellite.congestion.as_deref() == Some("adaptive") {
                Some(self.adaptive.resolve()?)
            } else {
                if self.terrestrial.congestion.as_deref() == Some("adaptive") {
                    return Err(
                        "terrestrial.congestion: \"adaptive\" is for the satellite leg".into(),
                    );
                }
                None
            },
            tunnel: self
                .tunnel
                .as_ref()
                .map(|t| t.resolve(&self.satellite, p.max_connections))
                .transpose()?,
        })
    }
}

/// Physical memory in bytes (0 if unknown).
fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as u64).saturating_mul(size.max(0) as u64)
}

/// "25%" of `physical`, or a size; at least 1 MiB.
fn parse_memory(s: &str, physical: u64) -> Result<u64, String> {
    let v = match s.strip_suffix('%') {
        Some(p) => {
            let p: f64 = p
                .trim()
                .parse()
                .ok()
                .filter(|p| *p > 0.0 && *p <= 100.0)
                .ok_or_else(|| format!("'{s}' is not a share of memory between 0 and 100 %"))?;
            (physical as f64 * p / 100.0) as u64
        }
        None => parse_size(s).map_err(|e| e.to_string())?,
    };
    if v < 1 << 20 {
        return Err(format!("'{s}' is less than 1 MiB"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(t: &str) -> Result<ProxyConfig, String> {
        ProxyFile::parse(t)?.resolve()
    }

    #[test]
    fn a_file_written_as_toml_reads_back_the_same() {
        // The lab writes its proxies' files from this type: what it sets must survive the
        // trip, and what it leaves unset must stay unset (not become "" or 0).
        let f = ProxyFile {
            intercept: InterceptFile {
                interfaces: vec!["to-link".into()],
                exclude_ports: vec![5401],
                ..Default::default()
            },
            proxy: ProxySection {
                satellite_side: "downstream".into(),
                drain: "0s".into(),
                ..Default::default()
            },
            satellite: LegFile {
                congestion: Some("satpep_sat".into()),
                initcwnd: Some(40),
                ..Default::default()
            },
            tunnel: Some(TunnelFile {
                role: Some("gateway".into()),
                rate: Some("50000000".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = toml::to_string(&f).unwrap();
        assert!(!text.contains("peer"), "unset keys written:\n{text}");
        let back = ProxyFile::parse(&text).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn defaults_work() {
        let c = cfg("").unwrap();
        assert_eq!((c.port, c.mark, c.table), (7700, 0x5350, 0x5350));
        assert!(c.satellite_upstream && c.interfaces.is_empty());
        assert_eq!(c.buffer, 256 * 1024);
    }

    #[test]
    fn flow_control_defaults_to_improved_back_pressure_and_drops_are_split_only() {
        let d = cfg("").unwrap().flow;
        assert!(d.improved && !d.drop && !d.sizing, "{d:?}");
        assert!(
            !cfg("[proxy]\nback_pressure='plain'\n")
                .unwrap()
                .flow
                .improved
        );
        let c =
            cfg("[proxy]\nback_pressure='improved'\ndrop_flow_control=true\nbuffer_sizing=true\n")
                .unwrap();
        assert!(c.flow.improved && c.flow.drop && c.flow.sizing);
        let e = cfg("[proxy]\ndrop_flow_control=true\n[tunnel]\nrole='gateway'\nca='ca.pem'\ncert='g.pem'\nkey='g.key'\n")
            .unwrap_err();
        assert!(
            e.contains("proxy.drop_flow_control") && e.contains("QUIC"),
            "{e}"
        );
    }

    #[test]
    fn memory_limit_as_size_or_share() {
        assert_eq!(parse_memory("2GiB", 0), Ok(2 << 30));
        assert_eq!(parse_memory("25%", 8 << 30), Ok(2 << 30));
        assert!(parse_memory("0%", 8 << 30).is_err());
        assert!(cfg("").unwrap().max_memory > 1 << 20);
    }

    #[test]
    fn tunnel_defaults_come_from_the_satellite_leg() {
        let c = cfg("[satellite]\nrate='100Mbit'\nrtt='600ms'\n[tunnel]\nrole='terminal'\npeer='198.18.2.2:7701'\nca='ca.pem'\ncert='t.pem'\nkey='t.key'\n").unwrap();
        let t = c.tunnel.unwrap();
        assert_eq!(t.role, Role::Terminal);
        assert_eq!(t.hop.send_rate, Some(100_000_000));
        assert_eq!(t.hop.receive_rate, Some(100_000_000));
        assert_eq!(t.hop.rtt, std::time::Duration::from_millis(600));
        assert_eq!(t.hop.outage, std::time::Duration::from_secs(60));
        assert_eq!(t.peer_name, "gateway");
        assert_eq!(t.listen, "[::]:0".parse().unwrap());
    }

    #[test]
    fn buffers_from_rate_and_rtt() {
        let c = cfg("[satellite]\nrate='50Mbit'\nrtt='600ms'\ncongestion='bbr'\n").unwrap();
        assert_eq!(c.satellite.buffer, Some(15_000_000));
        assert_eq!(c.satellite.congestion.as_deref(), Some("bbr"));
    }

    #[test]
    fn bad_values_name_their_key() {
        for (t, key) in [
            ("[proxy]\nport=0", "proxy.port"),
            ("[proxy]\nmark=0", "proxy.mark"),
            ("[proxy]\ntable=254", "proxy.table"),
            ("[proxy]\nsatellite_side='left'", "proxy.satellite_side"),
            ("[proxy]\nbuffer='1B'", "proxy.buffer"),
            ("[proxy]\nrelay='mmap'", "proxy.relay"),
            ("[proxy]\nback_pressure='strong'", "proxy.back_pressure"),
            ("[proxy]\nbuffer_sizing='yes'", "buffer_sizing"),
            ("[proxy]\nhandshake='slow'", "proxy.handshake"),
            ("[proxy]\nworkers=0", "proxy.workers"),
            ("[proxy]\nworkers=65", "proxy.workers"),
            (
                "[proxy]\nworkers=2\nhandshake='strict'",
                "proxy.workers: must be 1 here",
            ),
            (
                "[proxy]\nworkers=2\ndrop_flow_control=true",
                "proxy.workers: must be 1 here",
            ),
            (
                "[proxy]\nworkers=2\n[tunnel]\nrole='terminal'\npeer='198.18.2.2:7701'\nca='c'\ncert='c'\nkey='k'",
                "proxy.workers: must be 1 here",
            ),
            ("[proxy]\nqueue=70000", "queue"),
            ("[proxy]\nmax_memory='120%'", "proxy.max_memory"),
            ("[proxy]\nmax_memory='10KiB'", "proxy.max_memory"),
            ("[intercept]\nsources=['10.0.0.0/33']", "intercept.sources"),
            ("[intercept]\ninterfaces=['a b']", "intercept.interfaces"),
            ("[satellite]\nrate='5Mbit'", "satellite.rate"),
            (
                "[terrestrial]\ncongestion='no such'",
                "terrestrial.congestion",
            ),
            ("[satellite]\nbuffer='2GiB'", "satellite.buffer"),
            ("[satellite]\ninitcwnd=10", "satellite.initcwnd"),
            (
                "[satellite]\ninterface='x'\ninitrwnd=0",
                "satellite.initrwnd",
            ),
            ("[satellite]\nmss=100", "satellite.mss"),
            ("[terrestrial]\ninterface='a/b'", "terrestrial.interface"),
            ("[satellite]\nfastopen='yes'", "fastopen"),
            (
                "[terrestrial]\ncongestion='adaptive'",
                "terrestrial.congestion",
            ),
            (
                "[satellite]\ncongestion='adaptive'\n[adaptive]\npolicy={long_fet='x'}",
                "adaptive.policy",
            ),
            (
                "[satellite]\ncongestion='adaptive'\n[adaptive]\ndwell='1ms'",
                "adaptive.dwell",
            ),
            ("[proxy]\nport='x'", "port"),
            ("[proxy]\nprot=1", "prot"),
            ("[proxy]\nmetrics='localhost'", "proxy.metrics"),
            ("[proxy]\nconnections='status'", "proxy.connections"),
            ("[proxy]\nkeepalive='1ms'", "proxy.keepalive"),
            ("[proxy]\nkeepalive=5", "keepalive"),
            ("[proxy]\nidle_timeout='30d'", "proxy.idle_timeout"),
            ("[proxy]\nlog_summary='10ms'", "proxy.log_summary"),
            ("[proxy]\nidle_timeout='soon'", "proxy.idle_timeout"),
            ("[tunnel]\npeer='1.2.3.4:5'", "tunnel.role"),
            ("[tunnel]\nrole='middle'", "tunnel.role"),
            ("[tunnel]\nrole='terminal'", "tunnel.peer"),
            (
                "[tunnel]\nrole='gateway'\npeer='198.18.0.1:1'",
                "tunnel.peer",
            ),
            ("[tunnel]\nrole='terminal'\npeer='x'", "tunnel.peer"),
            ("[tunnel]\nrole='gateway'\nlisten='[::]'", "tunnel.listen"),
            ("[tunnel]\nrole='gateway'", "tunnel.ca"),
            ("[tunnel]\nrole='gateway'\nca='a'\ncert='b'", "tunnel.key"),
            (
                "[tunnel]\nrole='gateway'\ncongestion='vegas'",
                "tunnel.congestion",
            ),
            ("[tunnel]\nrole='gateway'\nrate='fast'", "tunnel.rate"),
            ("[tunnel]\nrole='gateway'\nrate='1bit'", "tunnel.rate"),
            ("[tunnel]\nrole='gateway'\nrtt='1h'", "tunnel.rtt"),
            ("[tunnel]\nrole='gateway'\noutage='0s'", "tunnel.outage"),
            (
                "[tunnel]\nrole='gateway'\npeer_name='a b'",
                "tunnel.peer_name",
            ),
            ("[tunnel]\nrole='gateway'\nrate=5", "rate"),
            (
                "[tunnel]\nrole='terminal'\npeer='198.18.0.1:1'\nterminals=['t']",
                "tunnel.terminals: only a gateway",
            ),
            (
                "[tunnel]\nrole='terminal'\npeer='198.18.0.1:1'\ncrl='x'",
                "tunnel.crl: only a gateway",
            ),
            (
                "[tunnel]\nrole='gateway'\nterminals=[]",
                "tunnel.terminals: empty",
            ),
            (
                "[tunnel]\nrole='gateway'\nterminals=['a b']",
                "tunnel.terminals: 'a b'",
            ),
            ("[tunnel]\nrole='gateway'\ncrl=''", "tunnel.crl: empty"),
            (
                "[tunnel]\nrole='terminal'\npeer='198.18.0.1:1'\n[tunnel.carrier]\nrate='1Mbit'",
                "tunnel.carrier: only a gateway shares a carrier",
            ),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nshare='time'",
                "tunnel.carrier.rate: missing",
            ),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nrate='fast'",
                "tunnel.carrier.rate:",
            ),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nrate='1Mbit'\nshare='air'",
                "tunnel.carrier.share: 'air': time or bits",
            ),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nrate='1Mbit'\n[tunnel.carrier.terminal.t2]\nweight=0",
                "tunnel.carrier.terminal.t2.weight: 0",
            ),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nrate='1Mbit'\n[tunnel.carrier.terminal.t2]\ncir='2Mbit'\nmir='1Mbit'",
                "tunnel.carrier.terminal.t2.cir: the committed rate is above the maximum",
            ),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nrate='1Mbit'\n[tunnel.carrier.terminal.t2]\nmir='lots'",
                "tunnel.carrier.terminal.t2.mir:",
            ),
            ("[tunnel]\nrole='gateway'\nspeed=5", "speed"),
            (
                "[tunnel]\nrole='gateway'\n[tunnel.carrier]\nrate='1Mbit'\n[tunnel.carrier.terminal.t2]\nsubnets=['198.18.1.0/24']",
                "tunnel.carrier.terminal.t2.subnets: a tunnel's terminal is known by its certificate name",
            ),
            (
                "[proxy.carrier]\nrate='1Mbit'",
                "proxy.carrier: only a gateway shares a carrier",
            ),
            (
                "[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nshare='time'",
                "proxy.carrier.rate: missing",
            ),
            (
                "[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nrate='1Mbit'\nshare='air'",
                "proxy.carrier.share: 'air': time or bits",
            ),
            (
                "[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nrate='1Mbit'\n[proxy.carrier.terminal.t2]\nweight=2",
                "proxy.carrier.terminal.t2.subnets: missing",
            ),
            (
                "[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nrate='1Mbit'\n[proxy.carrier.terminal.t2]\nsubnets=['near']",
                "proxy.carrier.terminal.t2.subnets: 'near' is not an IP prefix",
            ),
            (
                "[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nrate='1Mbit'\n[proxy.carrier.terminal.t2]\nsubnets=['198.18.1.0/24']\n[proxy.carrier.terminal.t3]\nsubnets=['198.18.1.0/24']",
                "proxy.carrier.terminal.t3.subnets: 198.18.1.0/24 is also t2's",
            ),
            (
                "[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nrate='1Mbit'\n[proxy.carrier.terminal.t2]\nsubnets=['198.18.1.0/24']\nmir='lots'",
                "proxy.carrier.terminal.t2.mir:",
            ),
        ] {
            let e = cfg(t).unwrap_err();
            assert!(e.contains(key), "{t}: {e}");
        }
    }

    #[test]
    fn a_split_gateway_shares_its_carrier_among_terminals_by_client_subnet() {
        let c = cfg("[proxy]\nsatellite_side='downstream'\n[proxy.carrier]\nrate='30Mbit'\nshare='bits'\n[proxy.carrier.terminal.t2]\nweight=2\nsubnets=['198.19.2.0/24', '2001:2:0:102::/64']\n").unwrap();
        let c = c.carrier.expect("a carrier");
        assert_eq!(
            c.carrier.rate,
            satpep_tunnel::hub::payload_bytes_per_s(30e6)
        );
        assert_eq!(c.carrier.by, satpep_tunnel::hub::ShareBy::Bits);
        assert_eq!(c.carrier.terminal("t2").weight, 2.0);
        assert_eq!(c.terminal_of("198.19.2.2".parse().unwrap()), "t2");
        assert_eq!(c.terminal_of("2001:2:0:102::2".parse().unwrap()), "t2");
        assert_eq!(
            c.terminal_of("198.18.1.2".parse().unwrap()),
            "198.18.1.0/24"
        );
        assert!(cfg("[proxy]\nsatellite_side='downstream'\n")
            .unwrap()
            .carrier
            .is_none());
    }

    /// The first ```toml block after `after` in `doc`.
    fn toml_block(doc: &str, after: &str) -> String {
        let at = doc.find(after).expect("anchor in the doc");
        let start = doc[at..].find("```toml").unwrap() + at + 7;
        let end = doc[start..].find("```").unwrap() + start;
        doc[start..end]
            .lines()
            .map(|l| l.trim_start())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// A value of another type than `v`'s.
    fn wrong_type(v: &str) -> &'static str {
        match v.chars().next() {
            Some('"') | Some('\'') => "12345",
            Some('[') | Some('{') => "7",
            _ => "\"wrong\"",
        }
    }

    #[test]
    fn every_documented_key_with_a_wrong_type_is_refused_by_name() {
        // The documented configurations, every key in them: each must work as written, and
        // each key given a value of the wrong type must be refused with its name.
        let proxy_md = include_str!("../../../docs/proxy.md");
        let tunnel_md = include_str!("../../../docs/tunnel.md");
        let docs = [
            toml_block(proxy_md, "## Configuration"),
            toml_block(tunnel_md, "2. The gateway"),
            toml_block(tunnel_md, "3. The terminal"),
        ];
        let mut checked = 0;
        for doc in &docs {
            // The whole block parses (congestion controls are not resolved here: the kernel's
            // set is the host's business).
            ProxyFile::parse(doc)
                .unwrap_or_else(|e| panic!("documented config refused: {e}\n{doc}"));
            let lines: Vec<&str> = doc.lines().collect();
            for (n, line) in lines.iter().enumerate() {
                let code = line.split('#').next().unwrap().trim();
                let Some((key, value)) = code.split_once(" = ") else {
                    continue;
                };
                let mut bad = lines.clone();
                let replaced = format!("{key} = {}", wrong_type(value.trim()));
                bad[n] = &replaced;
                let text = bad.join("\n");
                let e = match ProxyFile::parse(&text).and_then(|f| f.resolve()) {
                    Err(e) => e,
                    Ok(_) => panic!("{key} = {} was accepted", wrong_type(value.trim())),
                };
                assert!(
                    e.contains(key.trim()),
                    "{replaced}: the message does not name it: {e}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 40, "only {checked} keys checked");
    }
}
