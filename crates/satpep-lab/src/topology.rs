//! The five-namespace testbed: `client — terminal — link — gateway — server`.
//!
//! The terminal and gateway are routers (later, PEPs) joined by one Ethernet segment that
//! crosses the emulator running in `link`. Every lab uses the same addresses (from the
//! benchmarking ranges 198.18.0.0/15 and 2001:2::/48) inside its own namespaces, so labs never
//! collide; namespace names carry the lab's name (`sp-NAME-HOST`).
//!
//! State lives in `/run/satpep/lab/NAME/` (state.json, the emulator's config, control socket
//! and log), written before anything is created, so `satpep lab down NAME` can remove a lab
//! whatever killed the process that built it.

use crate::sys::{ip_batch, require_root, run};
use satpep_link::config::LinkSpec;
use satpep_link::stats::LinkSnapshot;
use satpep_proxy::config::ProxyFile;
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Keeps the emulated link quiet: no MLD reports or router solicitations from the routers
/// cross it, so only experiment traffic does and a seeded loss pattern is reproducible.
const QUIET_LINK: &str = "table inet satpep_lab {\n chain out { type filter hook output priority 0; oifname \"to-link\" icmpv6 type { mld-listener-report, mld2-listener-report, mld-listener-done, nd-router-solicit } drop; }\n}\n";

/// Frames crossing the userspace emulator must be whole, checksummed wire frames: no
/// TSO/GSO super-frames and no checksums left for hardware on the routers' side.
const LINK_OFFLOADS_OFF: [&str; 10] = [
    "-K", "to-link", "tso", "off", "gso", "off", "gro", "off", "tx", "off",
];

/// Where lab state lives.
pub const STATE_ROOT: &str = "/run/satpep/lab";

/// A host of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Host {
    /// The user's machine behind the satellite terminal.
    Client,
    /// The satellite-terminal side router (the PEP in integrated mode).
    Terminal,
    /// The emulated satellite link.
    Link,
    /// The satellite-gateway side router.
    Gateway,
    /// A server on the Internet side.
    Server,
}

/// The client's and the server's one interface, towards their router (`lab up` names them
/// so; secondary addresses and the ESP tunnel's routes go on it).
pub const CLIENT_DEV: &str = "to-term";
/// See [`CLIENT_DEV`].
pub const SERVER_DEV: &str = "to-gw";
/// The terminal's interface towards the client (the far end of [`CLIENT_DEV`]).
pub const TERMINAL_CLIENT_DEV: &str = "to-client";
/// The terminal's address on the client's link: the client's IPv4 gateway.
pub const TERMINAL_CLIENT_V4: &str = "198.18.1.1";

impl Host {
    /// All hosts, in line order.
    pub const ALL: [Host; 5] = [
        Host::Client,
        Host::Terminal,
        Host::Link,
        Host::Gateway,
        Host::Server,
    ];
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Host::Client => "client",
            Host::Terminal => "terminal",
            Host::Link => "link",
            Host::Gateway => "gateway",
            Host::Server => "server",
        }
    }
    /// Parses a host name.
    pub fn parse(s: &str) -> Result<Host, String> {
        Host::ALL
            .into_iter()
            .find(|h| h.name() == s)
            .ok_or_else(|| {
                format!("unknown host '{s}' (hosts: client, terminal, link, gateway, server)")
            })
    }
}

/// One host's addresses, as printed by `lab up --json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostInfo {
    /// Host role.
    pub host: Host,
    /// Network namespace name.
    pub netns: String,
    /// IPv4 addresses with prefix length.
    pub ipv4: Vec<String>,
    /// IPv6 addresses with prefix length.
    pub ipv6: Vec<String>,
}

/// A star's other node (`clientK`, `terminalK`) and its addresses, as `lab up --json`
/// prints them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeInfo {
    /// Node name (the key `lab up --json` gives every host).
    pub host: String,
    /// Network namespace name.
    pub netns: String,
    /// IPv4 addresses with prefix length.
    pub ipv4: Vec<String>,
    /// IPv6 addresses with prefix length.
    pub ipv6: Vec<String>,
}

/// Client's IPv4 address.
pub const CLIENT_V4: &str = "198.18.1.2";
/// Server's IPv4 address.
pub const SERVER_V4: &str = "198.18.3.2";
/// Client's IPv6 address.
pub const CLIENT_V6: &str = "2001:2:0:1::2";
/// Server's IPv6 address.
pub const SERVER_V6: &str = "2001:2:0:3::2";
/// Terminal's MAC on the satellite segment (static neighbour entries need it).
const TERMINAL_SAT_MAC: &str = "02:00:c6:12:02:01";
/// Gateway's MAC on the satellite segment.
const GATEWAY_SAT_MAC: &str = "02:00:c6:12:02:02";

/// Most terminals a lab holds (`lab up --terminals`): terminal K's client subnet is
/// 198.19.K.0/24 and its address on the satellite segment 198.18.2.(10 + K).
pub const MAX_TERMINALS: u16 = 240;

/// One terminal of a lab and the client behind it: namespaces and addresses. Terminal 1 is
/// the lab's `terminal` and `client` hosts (the line testbed); a star's others, 2 to N, are
/// `terminalK` and `clientK`, each client on its own subnet behind its own terminal, every
/// terminal on the one satellite segment to the gateway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Site {
    /// 1 to N.
    pub index: u16,
    /// The terminal's node name (`terminal`, `terminal2`, …): its namespace's suffix, its
    /// proxy's configuration and log, its tunnel certificate's name.
    pub terminal: String,
    /// The client's node name (`client`, `client2`, …).
    pub client: String,
    /// The client's IPv4 address.
    pub client_v4: String,
    /// The client's IPv6 address.
    pub client_v6: String,
    /// The client's IPv4 subnet (with prefix length).
    pub client_net_v4: String,
    /// The client's IPv6 subnet.
    pub client_net_v6: String,
    /// The terminal's IPv4 address on the client's subnet (the client's router).
    pub router_v4: String,
    /// The terminal's IPv6 address on the client's subnet.
    pub router_v6: String,
    /// The terminal's IPv4 address on the satellite segment.
    pub sat_v4: String,
    /// The terminal's IPv6 address on the satellite segment.
    pub sat_v6: String,
    /// The terminal's MAC on the satellite segment (static neighbour entries need it).
    pub mac: String,
}

/// Terminal `k` (1 to [`MAX_TERMINALS`]) of any lab.
pub fn site(k: u16) -> Site {
    assert!((1..=MAX_TERMINALS).contains(&k), "terminal {k}");
    if k == 1 {
        return Site {
            index: 1,
            terminal: "terminal".into(),
            client: "client".into(),
            client_v4: CLIENT_V4.into(),
            client_v6: CLIENT_V6.into(),
            client_net_v4: "198.18.1.0/24".into(),
            client_net_v6: "2001:2:0:1::/64".into(),
            router_v4: TERMINAL_CLIENT_V4.into(),
            router_v6: "2001:2:0:1::1".into(),
            sat_v4: "198.18.2.1".into(),
            sat_v6: "2001:2:0:2::1".into(),
            mac: TERMINAL_SAT_MAC.into(),
        };
    }
    let host = 10 + k;
    // Inside 2001:2::/48: the fourth group is the subnet.
    let net6 = 0x100 + k;
    Site {
        index: k,
        terminal: format!("terminal{k}"),
        client: format!("client{k}"),
        client_v4: format!("198.19.{k}.2"),
        client_v6: format!("2001:2:0:{net6:x}::2"),
        client_net_v4: format!("198.19.{k}.0/24"),
        client_net_v6: format!("2001:2:0:{net6:x}::/64"),
        router_v4: format!("198.19.{k}.1"),
        router_v6: format!("2001:2:0:{net6:x}::1"),
        sat_v4: format!("198.18.2.{host}"),
        sat_v6: format!("2001:2:0:2::{host:x}"),
        mac: format!("02:00:c6:12:02:{host:02x}"),
    }
}

/// The node a name such as `gateway`, `client3` or `terminal12` names in a lab of
/// `terminals` terminals: its namespace's suffix, checked.
pub fn parse_node(s: &str, terminals: u16) -> Result<String, String> {
    if Host::parse(s).is_ok() {
        return Ok(s.into());
    }
    let k = ["client", "terminal"]
        .iter()
        .find_map(|p| s.strip_prefix(p)?.parse::<u16>().ok());
    match k {
        Some(1) => Ok(s.trim_end_matches('1').into()),
        Some(k) if (2..=terminals).contains(&k) => Ok(s.into()),
        Some(_) => Err(format!(
            "no {s} in this lab: it has {terminals} terminal(s) (a star's clientK and terminalK, K = 2 to N)"
        )),
        None => Err(format!(
            "unknown host '{s}' (hosts: client, terminal, link, gateway, server; a star's clientK and terminalK)"
        )),
    }
}

/// What `lab up` records, and `lab down` / `lab exec` read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabState {
    /// Lab name.
    pub name: String,
    /// Namespaces (created or about to be).
    pub namespaces: Vec<String>,
    /// PID of the emulator process, once started.
    pub emulator_pid: Option<u32>,
    /// PIDs of proxy processes (terminal, gateway), once started.
    #[serde(default)]
    pub proxy_pids: Vec<u32>,
    /// The proxies' log filter ([`Pep::log_filter`]), kept for restarts.
    #[serde(default)]
    pub log_filter: Option<String>,
    /// Hosts and addresses.
    pub hosts: Vec<HostInfo>,
    /// Terminals sharing the satellite segment (1: the line testbed).
    #[serde(default = "one_terminal")]
    pub terminals: u16,
    /// A star's other terminals and clients (2 to N) and their addresses.
    #[serde(default)]
    pub star: Vec<NodeInfo>,
}

fn one_terminal() -> u16 {
    1
}

impl LabState {
    /// Every node and its addresses: the line's hosts, then a star's other clients and
    /// terminals (`lab up --json` prints this list).
    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.hosts
            .iter()
            .map(|h| NodeInfo {
                host: h.host.name().into(),
                netns: h.netns.clone(),
                ipv4: h.ipv4.clone(),
                ipv6: h.ipv6.clone(),
            })
            .chain(self.star.iter().cloned())
            .collect()
    }
}

/// Checks a lab name: short, and safe in namespace and file names.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 24
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid lab name '{name}': use 1-24 characters of a-z, 0-9, '-' and '_'"
        ))
    }
}

/// Namespace name of `host` in lab `name`.
pub fn netns(name: &str, host: Host) -> String {
    node_netns(name, host.name())
}

/// Namespace name of node `node` (a host's name, or a star's `clientK` / `terminalK`).
pub fn node_netns(name: &str, node: &str) -> String {
    format!("sp-{name}-{node}")
}

/// Directory holding lab `name`'s state.
pub fn state_dir(name: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(name)
}

fn hosts(name: &str) -> Vec<HostInfo> {
    let h = |host, v4: &[&str], v6: &[&str]| HostInfo {
        host,
        netns: netns(name, host),
        ipv4: v4.iter().map(|s| s.to_string()).collect(),
        ipv6: v6.iter().map(|s| s.to_string()).collect(),
    };
    vec![
        h(Host::Client, &["198.18.1.2/24"], &["2001:2:0:1::2/64"]),
        h(
            Host::Terminal,
            &["198.18.1.1/24", "198.18.2.1/24"],
            &["2001:2:0:1::1/64", "2001:2:0:2::1/64"],
        ),
        h(Host::Link, &[], &[]),
        h(
            Host::Gateway,
            &["198.18.2.2/24", "198.18.3.1/24"],
            &["2001:2:0:2::2/64", "2001:2:0:3::1/64"],
        ),
        h(Host::Server, &["198.18.3.2/24"], &["2001:2:0:3::2/64"]),
    ]
}

/// A star's other terminals and clients (2 to N), as `lab up --json` prints them.
fn star_hosts(name: &str, terminals: u16) -> Vec<NodeInfo> {
    (2..=terminals)
        .flat_map(|k| {
            let st = site(k);
            let len = |net: &str| net.rsplit('/').next().unwrap_or("24").to_string();
            [
                NodeInfo {
                    host: st.client.clone(),
                    netns: node_netns(name, &st.client),
                    ipv4: vec![format!("{}/{}", st.client_v4, len(&st.client_net_v4))],
                    ipv6: vec![format!("{}/{}", st.client_v6, len(&st.client_net_v6))],
                },
                NodeInfo {
                    host: st.terminal.clone(),
                    netns: node_netns(name, &st.terminal),
                    ipv4: vec![
                        format!("{}/{}", st.router_v4, len(&st.client_net_v4)),
                        format!("{}/24", st.sat_v4),
                    ],
                    ipv6: vec![
                        format!("{}/{}", st.router_v6, len(&st.client_net_v6)),
                        format!("{}/64", st.sat_v6),
                    ],
                },
            ]
        })
        .collect()
}

/// Makes sure congestion control `cc` is registered: satpep's bundled ones are loaded and
/// pinned (they stay for other labs and runs; `satpep cc unload` removes them). Others must be
/// the kernel's.
pub fn ensure_cc(cc: &str) -> Result<(), String> {
    // A pin left by another build (an earlier lab run before a change) is this build's now:
    // a lab measuring a change to a controller measures the change.
    satpep_cc::refresh(cc, &satpep_cc::Options::default())?;
    if satpep_cc::available().iter().any(|a| a == cc) {
        return Ok(());
    }
    if !satpep_cc::BUNDLED.iter().any(|b| b.name == cc) {
        return Err(format!(
            "congestion control '{cc}' is neither the kernel's ({}) nor satpep's (satpep cc list)",
            satpep_cc::available().join(" ")
        ));
    }
    let mut l = satpep_cc::load(cc, &satpep_cc::Options::default())?;
    l.pin()?;
    Ok(())
}

/// Options for building a lab.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The `satpep` executable that runs the emulator.
    pub satpep_bin: PathBuf,
    /// Check client→server reachability before returning.
    pub check: bool,
    /// Run the split proxy on the terminal and gateway.
    pub pep: Option<Pep>,
    /// Terminals sharing the satellite segment, 1 to [`MAX_TERMINALS`] (1: the line).
    pub terminals: u16,
}

/// How traffic crosses the link: the one place that knows the PEP modes (scenario files'
/// `pep.mode` and `satpep lab up --pep`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PepMode {
    /// End to end: the hosts' own TCP across the link (terminal and gateway are routers).
    #[default]
    None,
    /// Split TCP at both ends (or the terminal only), one controller on the satellite leg.
    Split,
    /// Split TCP whose satellite-leg controller the proxy chooses per connection.
    Adaptive,
    /// Every flow in one encrypted QUIC connection between the two proxies.
    Tunnel,
}

/// A setting that does not fit the PEP mode: which one, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct PepError {
    /// `cc`, `terminal_only`, `handshake` or `relay`.
    pub key: &'static str,
    /// What is wrong with it.
    pub why: String,
}

impl PepMode {
    /// Whether the satellite leg is the proxies' own TCP (split or adaptive).
    pub fn splits(self) -> bool {
        matches!(self, PepMode::Split | PepMode::Adaptive)
    }

    /// The lab's PEP for this mode: `cc` is the satellite leg's controller (split) or the
    /// tunnel's (default satellite), `relay` the split proxies' (splice or copy); None for
    /// end to end.
    pub fn pep(
        self,
        cc: Option<String>,
        terminal_only: bool,
        handshake: Option<String>,
        relay: Option<String>,
        told: Told,
    ) -> Result<Option<Pep>, PepError> {
        let err = |key, why: &str| {
            Err(PepError {
                key,
                why: why.into(),
            })
        };
        if let Some(h) = handshake
            .as_deref()
            .filter(|h| !["fast", "strict"].contains(h))
        {
            return err("handshake", &format!("'{h}': fast or strict"));
        }
        if let Some(r) = relay.as_deref().filter(|r| !["splice", "copy"].contains(r)) {
            return err("relay", &format!("'{r}': splice or copy"));
        }
        if relay.is_some() && self == PepMode::Tunnel {
            return err("relay", "is for mode split or adaptive");
        }
        let base = Pep {
            handshake,
            relay,
            told,
            ..Default::default()
        };
        Ok(Some(match self {
            PepMode::None => {
                for (key, set) in [
                    ("cc", cc.is_some()),
                    ("terminal_only", terminal_only),
                    ("handshake", base.handshake.is_some()),
                    ("relay", base.relay.is_some()),
                ] {
                    if set {
                        return err(key, "needs a PEP mode (split, adaptive or tunnel)");
                    }
                }
                return Ok(None);
            }
            PepMode::Split => Pep {
                cc,
                terminal_only,
                ..base
            },
            PepMode::Adaptive if cc.is_some() => {
                return err("cc", "mode adaptive chooses the controller itself")
            }
            PepMode::Adaptive => Pep {
                cc: Some("adaptive".into()),
                terminal_only,
                ..base
            },
            PepMode::Tunnel if terminal_only => {
                return err("terminal_only", "is for mode split: a tunnel has two ends")
            }
            PepMode::Tunnel => {
                let t = cc.unwrap_or_else(|| "satellite".into());
                satpep_tunnel::congestion::Algorithm::parse(&t)
                    .map_err(|why| PepError { key: "cc", why })?;
                Pep {
                    tunnel: Some(t),
                    ..base
                }
            }
        }))
    }
}

/// PEP settings of a lab.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pep {
    /// Congestion control of the satellite legs (default: the kernel's).
    pub cc: Option<String>,
    /// Connection limit of each proxy (default: the proxy's).
    pub max_connections: Option<u32>,
    /// Relay method, "splice" or "copy" (default: the proxy's).
    pub relay: Option<String>,
    /// Handshake mode, "fast" or "strict" (default: the proxy's).
    pub handshake: Option<String>,
    /// Memory limit of each proxy, e.g. "64MiB" (default: the proxy's).
    pub max_memory: Option<String>,
    /// The configuration both proxies start from (the proxy crate's own typed file; default:
    /// every key at the proxy's default). The lab then sets interception, the satellite
    /// side, the satellite leg's controller and sizing, the tunnel and the fields above.
    pub file: ProxyFile,
    /// How long the proxies let live connections finish when stopped, e.g. "10s" (default
    /// "0s": a lab is torn down at once, not drained for the proxy's default 30 s).
    pub drain: Option<String>,
    /// The proxies' log filter (RUST_LOG; default: info, and every connection's lines).
    pub log_filter: Option<String>,
    /// Run a proxy only in the terminal host, not also in the gateway.
    pub terminal_only: bool,
    /// Distributed mode with this tunnel controller (satellite, hybla, cubic, bbr, newreno):
    /// the terminal carries every flow to the gateway in one QUIC connection.
    pub tunnel: Option<String>,
    /// What the proxies are told about the link (default: nothing, as an operator who does
    /// not know the link's exact rate and RTT would configure them).
    pub told: Told,
}

/// The configuration of `host`'s proxy: `pep.file` with interception on the client-facing
/// (terminal) or satellite-facing (gateway) interface, the satellite side, and what
/// `pep.told` says of `link`. Told it exactly, a satellite-leg socket sends one way and
/// receives the other, so its buffers are sized from the faster direction.
fn proxy_file(
    pep: &Pep,
    host: Host,
    cert: &str,
    link: &satpep_link::config::LinkConfig,
    keys: &Path,
    spliced_limit: Option<u32>,
) -> ProxyFile {
    let mut f = pep.file.clone();
    let gateway = host == Host::Gateway;
    f.intercept.interfaces = vec![if gateway {
        "to-link"
    } else {
        TERMINAL_CLIENT_DEV
    }
    .into()];
    // The scenarios' competing end-to-end flow, and the dumbbell's other hosts (their
    // background flows share the link, never the proxies).
    f.intercept.exclude_ports.push(END_TO_END_PORT);
    f.intercept.exclude_sources = BACKGROUND_NETS.iter().map(|s| s.to_string()).collect();
    f.intercept.exclude_destinations = f.intercept.exclude_sources.clone();
    let p = &mut f.proxy;
    p.satellite_side = if gateway { "downstream" } else { "upstream" }.into();
    // A split gateway's shared carrier is the gateway's alone.
    if !gateway {
        p.carrier = None;
    }
    if let Some(m) = pep.max_connections.or(spliced_limit) {
        p.max_connections = m;
    }
    if let Some(m) = &pep.max_memory {
        p.max_memory = m.clone();
    }
    if let Some(h) = &pep.handshake {
        p.handshake = h.clone();
    }
    if let Some(r) = &pep.relay {
        p.relay = r.clone();
    }
    p.drain = pep.drain.clone().unwrap_or_else(|| "0s".into());
    let (fwd, ret) = match pep.told {
        Told::Nothing => (None, None),
        Told::Nominal(f, r) => (Some(f), Some(r)),
        Told::Exact => (
            Some(link.forward.rate.max_bps()),
            Some(link.ret.rate.max_bps()),
        ),
    };
    let rtt_ns = link.forward.delay.max_ns() + link.ret.delay.max_ns();
    let exact_rtt = (pep.told == Told::Exact).then(|| format!("{}ns", rtt_ns.max(1_000_000)));
    let bps = |r: Option<f64>| r.map(|r| (r.round() as u64).to_string());
    match &pep.tunnel {
        None => {
            if pep.cc.is_some() {
                f.satellite.congestion = pep.cc.clone();
            }
            // Split mode sizes its buffers from rate × RTT only when told both; otherwise
            // the kernel's autotuning does (the lab's hosts allow 128 MiB).
            if let Some(rtt) = exact_rtt {
                let rate = link.forward.rate.max_bps().max(link.ret.rate.max_bps());
                f.satellite.rate = bps(Some(rate));
                f.satellite.rtt = Some(rtt);
            }
        }
        Some(cc) => {
            // Each end sends at its own direction's rate (the gateway forward, down to the
            // terminal; the terminal return).
            let (send, receive) = if gateway { (fwd, ret) } else { (ret, fwd) };
            let role = if gateway { "gateway" } else { "terminal" };
            let key = |name: &str| Some(keys.join(name).display().to_string());
            f.tunnel = Some(satpep_proxy::config::TunnelFile {
                role: Some(role.into()),
                peer: (!gateway).then(|| "198.18.2.2:7701".into()),
                ca: key("ca.pem"),
                cert: key(&format!("{cert}.pem")),
                key: key(&format!("{cert}.key")),
                congestion: Some(cc.clone()),
                rate: bps(send),
                receive_rate: bps(receive),
                rtt: exact_rtt,
                ..f.tunnel.unwrap_or_default()
            });
            // What only a gateway takes (admission, a shared carrier) stays off terminals.
            if let (false, Some(t)) = (gateway, f.tunnel.as_mut()) {
                t.carrier = None;
                t.terminals = None;
                t.crl = None;
            }
        }
    }
    f
}

/// The dumbbell's other hosts (the scenarios' background flows), client side then server
/// side: the proxies never intercept them.
pub const BACKGROUND_NETS: [&str; 2] = ["198.18.1.16/28", "198.18.3.16/28"];

/// A server port the lab's proxies never intercept: the scenarios' competing end-to-end
/// flow uses it.
pub const END_TO_END_PORT: u16 = 5401;

/// What the lab writes into the proxies' configurations about the link.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Told {
    /// No rate and no RTT: the proxies find the link themselves.
    #[default]
    Nothing,
    /// A nominal rate per direction, bit/s (forward, return), as on a service plan, and no
    /// RTT; the tunnel takes it as its rate hint and cap.
    Nominal(f64, f64),
    /// The emulator's own rates and round-trip time (an explicit option for experiments
    /// that reproduce a document's set-up, never the default).
    Exact,
}

impl Told {
    /// `nothing`, `exact` or a nominal forward rate such as `25Mbit`; the return direction's
    /// nominal rate is its real rate (from `link`, asked only for a rate) scaled as the
    /// forward one is.
    pub fn parse(
        s: &str,
        link: impl FnOnce() -> Result<satpep_link::config::LinkConfig, String>,
    ) -> Result<Told, String> {
        Ok(match s {
            "nothing" => Told::Nothing,
            "exact" => Told::Exact,
            r => {
                let f = satpep_link::units::parse_rate(r)
                    .map_err(|e| format!("'{r}' is not nothing, exact or a rate ({e})"))?;
                let link = link()?;
                let scale = f / link.forward.rate.max_bps();
                Told::Nominal(f, link.ret.rate.max_bps() * scale)
            }
        })
    }
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            satpep_bin: std::env::current_exe().unwrap_or_else(|_| "satpep".into()),
            check: true,
            pep: None,
            terminals: 1,
        }
    }
}

/// A built testbed. Dropping it tears it down unless [`Lab::detach`] was called.
pub struct Lab {
    /// Lab name.
    pub name: String,
    state: LabState,
    emulator: Option<Child>,
    /// Running proxies, each with the socket it reports readiness on (kept open while it
    /// runs: it also reports reloads and its stop there).
    proxies: Vec<(String, Child, UnixDatagram)>,
    satpep_bin: PathBuf,
    attached: bool,
}

fn write_state(s: &LabState) -> Result<(), String> {
    let dir = state_dir(&s.name);
    let tmp = dir.join("state.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(s).unwrap())
        .and_then(|_| std::fs::rename(&tmp, dir.join("state.json")))
        .map_err(|e| format!("cannot write lab state in {}: {e}", dir.display()))
}

/// Reads lab `name`'s state file.
pub fn read_state(name: &str) -> Result<LabState, String> {
    let p = state_dir(name).join("state.json");
    let text = std::fs::read_to_string(&p)
        .map_err(|_| format!("no lab named '{name}' (no {})", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("corrupt lab state {}: {e}", p.display()))
}

/// Names of labs that have a state directory.
pub fn list() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(STATE_ROOT)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("state.json").exists())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn existing_netns() -> Vec<String> {
    run("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// Whether `pid` is a live process of lab `name` (its command line names a file in the lab's
/// state directory; guards against a reused PID).
fn is_ours(pid: u32, name: &str) -> bool {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let cmd = String::from_utf8_lossy(&cmd);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit(')')
        .next()
        .is_some_and(|s| s.trim_start().starts_with('Z'));
    !zombie && cmd.contains(&state_dir(name).display().to_string())
}

fn stop_pid(pid: u32, name: &str) {
    if !is_ours(pid, name) {
        return;
    }
    // SAFETY: sending a signal to a PID we just checked.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    while is_ours(pid, name) {
        if t.elapsed() > Duration::from_secs(3) {
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits up to 10 s for `ready()`; fails with the child's log if it exits first.
fn wait_ready(
    child: &mut Child,
    log: &Path,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{what} exited ({st}): {}", text.trim()));
        }
        if ready() {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            return Err(format!("{what} did not come up within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops a child of ours: SIGTERM (so it cleans up), SIGKILL after 3 s.
fn stop_child(mut c: Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while !matches!(c.try_wait(), Ok(Some(_))) {
        if t.elapsed() > Duration::from_secs(3) {
            let _ = c.kill();
            let _ = c.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes everything lab `name` made: emulator, namespaces, state. Works from the state file
/// and, if that is gone, from the namespace names. Returns what was removed.
pub fn teardown(name: &str) -> Result<Vec<String>, String> {
    check_name(name)?;
    require_root()?;
    let mut removed = Vec::new();
    if let Ok(st) = read_state(name) {
        for pid in st.proxy_pids.iter().chain(st.emulator_pid.iter()) {
            stop_pid(*pid, name);
        }
    }
    let prefix = format!("sp-{name}-");
    for ns in existing_netns() {
        let node = &ns[ns.len().min(prefix.len())..];
        if ns.starts_with(&prefix) && parse_node(node, MAX_TERMINALS).is_ok_and(|n| n == node) {
            run("ip", &["netns", "del", &ns])?;
            removed.push(ns);
        }
    }
    let dir = state_dir(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    Ok(removed)
}

impl Lab {
    /// Builds lab `name` with the link `spec` and starts the emulator.
    ///
    /// The link spec is validated first; on any failure everything created so far is removed.
    pub fn up(name: &str, spec: &LinkSpec, opts: &UpOptions) -> Result<Lab, String> {
        check_name(name)?;
        require_root()?;
        spec.resolve()?;
        if !(1..=MAX_TERMINALS).contains(&opts.terminals) {
            return Err(format!(
                "--terminals {}: a lab has 1 to {MAX_TERMINALS} terminals",
                opts.terminals
            ));
        }
        let dir = state_dir(name);
        if dir.join("state.json").exists() {
            return Err(format!(
                "lab '{name}' already exists (remove it with `satpep lab down {name}`)"
            ));
        }
        let star = star_hosts(name, opts.terminals);
        let mut nss: Vec<String> = Host::ALL.iter().map(|h| netns(name, *h)).collect();
        nss.extend(star.iter().map(|n| n.netns.clone()));
        if let Some(ns) = existing_netns().iter().find(|n| nss.contains(n)) {
            return Err(format!(
                "namespace {ns} already exists (left by a crashed lab? `satpep lab down {name}`)"
            ));
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let state = LabState {
            name: name.into(),
            namespaces: nss,
            emulator_pid: None,
            proxy_pids: Vec::new(),
            log_filter: None,
            hosts: hosts(name),
            terminals: opts.terminals,
            star,
        };
        write_state(&state)?;
        let mut lab = Lab {
            name: name.into(),
            state,
            emulator: None,
            proxies: Vec::new(),
            satpep_bin: opts.satpep_bin.clone(),
            attached: true,
        };
        // On error, `lab` is dropped here and tears down what exists.
        lab.build()?;
        lab.start_emulator(spec)?;
        if let Some(pep) = &opts.pep {
            lab.start_proxies(spec, pep)?;
        }
        if opts.check {
            lab.check_path()?;
        }
        Ok(lab)
    }

    /// Opens an existing lab (built by another process) for commands.
    pub fn open(name: &str) -> Result<Lab, String> {
        check_name(name)?;
        let state = read_state(name)?;
        Ok(Lab {
            name: name.into(),
            state,
            emulator: None,
            proxies: Vec::new(),
            satpep_bin: std::env::current_exe().unwrap_or_else(|_| "satpep".into()),
            attached: false,
        })
    }

    /// Keeps the lab after this handle is dropped (for `satpep lab up`).
    pub fn detach(mut self) {
        self.attached = false;
        // Leave the emulator and proxies running; forget their handles.
        self.emulator.take();
        self.proxies.clear();
    }

    /// Namespace name of `host`.
    pub fn ns(&self, host: Host) -> String {
        netns(&self.name, host)
    }

    /// The recorded state.
    pub fn state(&self) -> &LabState {
        &self.state
    }

    /// A command that runs `prog` inside `host`'s namespace.
    pub fn command(&self, host: Host, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        crate::sys::in_ns(&self.ns(host), prog)
    }

    /// Runs `prog args…` inside `host`'s namespace and returns stdout.
    pub fn run_in(&self, host: Host, prog: &str, args: &[&str]) -> Result<String, String> {
        crate::sys::run_in(&self.ns(host), prog, args)
    }

    fn build(&mut self) -> Result<(), String> {
        for ns in &self.state.namespaces {
            run("ip", &["netns", "add", ns])?;
        }
        let [c, t, l, g, s] = Host::ALL.map(|h| self.ns(h));
        let star: Vec<Site> = (2..=self.state.terminals).map(site).collect();
        let clients = star.iter().map(|st| node_netns(&self.name, &st.client));
        let terminals = star.iter().map(|st| node_netns(&self.name, &st.terminal));
        // Set before any interface exists, so new interfaces inherit the defaults: no DAD
        // probes; no host caches an ssthresh carrying one run's losses into the next.
        let every = [
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv4.tcp_no_metrics_save=1",
        ];
        // End hosts: buffers big enough for a GEO bandwidth-delay product, autotuned from
        // the kernel's defaults.
        let end_host: Vec<&str> = every
            .iter()
            .copied()
            .chain([
                "net.ipv4.tcp_rmem=4096 131072 134217728",
                "net.ipv4.tcp_wmem=4096 65536 134217728",
            ])
            .collect();
        // The PEPs' hosts route, and have what satpep asks of the host it runs on (`satpep
        // proxy --check` warns where a host falls short; docs/proxy.md, "Host settings").
        use satpep_proxy::preflight::{sysctl_triple, HOST_SYSCTLS};
        let pep_host: Vec<String> = HOST_SYSCTLS
            .iter()
            .map(|&(k, v)| format!("{k}={}", sysctl_triple(v)))
            .collect();
        let router: Vec<&str> = every
            .iter()
            .copied()
            .chain(["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"])
            .chain(pep_host.iter().map(String::as_str))
            .collect();
        for ns in [c.clone(), s.clone()].into_iter().chain(clients) {
            self.sysctls(&ns, &end_host)?;
        }
        for ns in [t.clone(), g.clone()].into_iter().chain(terminals) {
            self.sysctls(&ns, &router)?;
        }
        // The link host is a wire, not a host: no IPv6 autoconfiguration chatter from it.
        self.sysctls(
            &l,
            &[
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )?;
        // veth pairs are created straight into their namespaces, so names never clash.
        ip_batch(
            None,
            &[
                format!("link add {CLIENT_DEV} netns {c} type veth peer name {TERMINAL_CLIENT_DEV} netns {t}"),
                format!("link add to-link netns {t} address {TERMINAL_SAT_MAC} type veth peer name to-term netns {l}"),
                format!("link add to-gw netns {l} type veth peer name to-link netns {g} address {GATEWAY_SAT_MAC}"),
                format!("link add to-server netns {g} type veth peer name {SERVER_DEV} netns {s}"),
            ],
        )?;
        let up = |dev: &str| format!("link set {dev} up");
        ip_batch(
            Some(&c),
            &[
                up("lo"),
                up(CLIENT_DEV),
                format!("addr add 198.18.1.2/24 dev {CLIENT_DEV}"),
                format!("addr add 2001:2:0:1::2/64 dev {CLIENT_DEV} nodad"),
                format!("route add default via {TERMINAL_CLIENT_V4}"),
                "route add default via 2001:2:0:1::1".into(),
            ],
        )?;
        ip_batch(
            Some(&t),
            &[
                up("lo"),
                up(TERMINAL_CLIENT_DEV),
                up("to-link"),
                format!("addr add {TERMINAL_CLIENT_V4}/24 dev {TERMINAL_CLIENT_DEV}"),
                format!("addr add 2001:2:0:1::1/64 dev {TERMINAL_CLIENT_DEV} nodad"),
                "addr add 198.18.2.1/24 dev to-link".into(),
                "addr add 2001:2:0:2::1/64 dev to-link nodad".into(),
                "route add default via 198.18.2.2".into(),
                "route add default via 2001:2:0:2::2".into(),
                // No ARP/ND across the emulated link: a satellite hop has none, and a lost
                // resolution would stall the first packets of a run.
                format!("neigh add 198.18.2.2 lladdr {GATEWAY_SAT_MAC} dev to-link nud permanent"),
                format!(
                    "neigh add 2001:2:0:2::2 lladdr {GATEWAY_SAT_MAC} dev to-link nud permanent"
                ),
            ],
        )?;
        ip_batch(Some(&l), &[up("lo"), up("to-term"), up("to-gw")])?;
        ip_batch(
            Some(&g),
            &[
                up("lo"),
                up("to-link"),
                up("to-server"),
                "addr add 198.18.2.2/24 dev to-link".into(),
                "addr add 2001:2:0:2::2/64 dev to-link nodad".into(),
                "addr add 198.18.3.1/24 dev to-server".into(),
                "addr add 2001:2:0:3::1/64 dev to-server nodad".into(),
                "route add 198.18.1.0/24 via 198.18.2.1".into(),
                "route add 2001:2:0:1::/64 via 2001:2:0:2::1".into(),
                format!("neigh add 198.18.2.1 lladdr {TERMINAL_SAT_MAC} dev to-link nud permanent"),
                format!(
                    "neigh add 2001:2:0:2::1 lladdr {TERMINAL_SAT_MAC} dev to-link nud permanent"
                ),
            ],
        )?;
        ip_batch(
            Some(&s),
            &[
                up("lo"),
                up(SERVER_DEV),
                format!("addr add 198.18.3.2/24 dev {SERVER_DEV}"),
                format!("addr add 2001:2:0:3::2/64 dev {SERVER_DEV} nodad"),
                "route add default via 198.18.3.1".into(),
                "route add default via 2001:2:0:3::1".into(),
            ],
        )?;
        for host in [Host::Terminal, Host::Gateway] {
            self.nft(host, QUIET_LINK)?;
        }
        for host in [Host::Terminal, Host::Gateway] {
            self.run_in(host, "ethtool", &LINK_OFFLOADS_OFF)?;
        }
        self.build_star()
    }

    /// A star's other terminals (2 to N), each with its client: every terminal's satellite
    /// interface becomes a port of a bridge in the link namespace whose one other port faces
    /// the emulator, so all terminals share the one emulated carrier as a gateway's beam is
    /// shared. The bridge forwards by static entries (no learning, no flooding across the
    /// link) and its terminal ports are isolated: terminals reach one another only through
    /// the gateway, as across a satellite.
    fn build_star(&self) -> Result<(), String> {
        let n = self.state.terminals;
        if n < 2 {
            return Ok(());
        }
        let [_, _, l, g, _] = Host::ALL.map(|h| self.ns(h));
        let sites: Vec<Site> = (2..=n).map(site).collect();
        let ns = |node: &str| node_netns(&self.name, node);
        // Terminal 1's link-side end becomes bridge port t1; the emulator's `to-term` faces
        // the bridge through star0.
        let mut links = vec![
            "link set to-term down".to_string(),
            "link set to-term name t1".into(),
            "link add to-term type veth peer name star0".into(),
            "link add star type bridge stp_state 0 mcast_snooping 0".into(),
        ];
        for st in &sites {
            let (c, t) = (ns(&st.client), ns(&st.terminal));
            links.push(format!(
                "link add {CLIENT_DEV} netns {c} type veth peer name {TERMINAL_CLIENT_DEV} netns {t}"
            ));
            links.push(format!(
                "link add t{} type veth peer name to-link netns {t} address {}",
                st.index, st.mac
            ));
        }
        ip_batch(Some(&l), &links)?;
        let mut bridge = vec![
            "link set star0 master star".to_string(),
            "link set star0 up".into(),
            "link set to-term up".into(),
            "link set star up".into(),
        ];
        for k in 1..=n {
            bridge.push(format!("link set t{k} master star"));
            bridge.push(format!("link set t{k} up"));
        }
        ip_batch(Some(&l), &bridge)?;
        // Static forwarding: each terminal's MAC on its port, the gateway's towards the link.
        let mut fdb = vec![
            "link set dev t1 isolated on learning off".to_string(),
            format!("fdb replace {TERMINAL_SAT_MAC} dev t1 master static"),
            format!("fdb replace {GATEWAY_SAT_MAC} dev star0 master static"),
            "link set dev star0 learning off".into(),
        ];
        for st in &sites {
            fdb.push(format!(
                "link set dev t{} isolated on learning off",
                st.index
            ));
            fdb.push(format!(
                "fdb replace {} dev t{} master static",
                st.mac, st.index
            ));
        }
        crate::sys::run_stdin_in(
            &l,
            "bridge",
            &["-batch", "-"],
            &fdb.join("\n"),
            &format!("bridge in {l}"),
        )?;
        let up = |dev: &str| format!("link set {dev} up");
        let mut gw = Vec::new();
        for st in &sites {
            ip_batch(
                Some(&ns(&st.client)),
                &[
                    up("lo"),
                    up(CLIENT_DEV),
                    format!("addr add {}/24 dev {CLIENT_DEV}", st.client_v4),
                    format!("addr add {}/64 dev {CLIENT_DEV} nodad", st.client_v6),
                    format!("route add default via {}", st.router_v4),
                    format!("route add default via {}", st.router_v6),
                ],
            )?;
            ip_batch(
                Some(&ns(&st.terminal)),
                &[
                    up("lo"),
                    up(TERMINAL_CLIENT_DEV),
                    up("to-link"),
                    format!("addr add {}/24 dev {TERMINAL_CLIENT_DEV}", st.router_v4),
                    format!(
                        "addr add {}/64 dev {TERMINAL_CLIENT_DEV} nodad",
                        st.router_v6
                    ),
                    format!("addr add {}/24 dev to-link", st.sat_v4),
                    format!("addr add {}/64 dev to-link nodad", st.sat_v6),
                    "route add default via 198.18.2.2".into(),
                    "route add default via 2001:2:0:2::2".into(),
                    format!(
                        "neigh add 198.18.2.2 lladdr {GATEWAY_SAT_MAC} dev to-link nud permanent"
                    ),
                    format!(
                        "neigh add 2001:2:0:2::2 lladdr {GATEWAY_SAT_MAC} dev to-link nud permanent"
                    ),
                ],
            )?;
            gw.push(format!("route add {} via {}", st.client_net_v4, st.sat_v4));
            gw.push(format!("route add {} via {}", st.client_net_v6, st.sat_v6));
            gw.push(format!(
                "neigh add {} lladdr {} dev to-link nud permanent",
                st.sat_v4, st.mac
            ));
            gw.push(format!(
                "neigh add {} lladdr {} dev to-link nud permanent",
                st.sat_v6, st.mac
            ));
        }
        ip_batch(Some(&g), &gw)?;
        for st in &sites {
            let t = ns(&st.terminal);
            crate::sys::run_stdin_in(&t, "nft", &["-f", "-"], QUIET_LINK, &format!("nft in {t}"))?;
            crate::sys::run_in(&t, "ethtool", &LINK_OFFLOADS_OFF)?;
        }
        // The bridge only passes frames on; none of its ports may hand it super-frames.
        for dev in ["to-term", "star0"]
            .into_iter()
            .map(String::from)
            .chain((1..=n).map(|k| format!("t{k}")))
        {
            crate::sys::run_in(
                &l,
                "ethtool",
                &[
                    "-K", &dev, "tso", "off", "gso", "off", "gro", "off", "tx", "off",
                ],
            )?;
        }
        Ok(())
    }

    /// Loads an nftables ruleset into `host`.
    fn nft(&self, host: Host, rules: &str) -> Result<(), String> {
        let ns = self.ns(host);
        crate::sys::run_stdin_in(&ns, "nft", &["-f", "-"], rules, &format!("nft in {ns}"))
    }

    fn sysctls(&self, ns: &str, kv: &[&str]) -> Result<(), String> {
        let mut a = vec!["-q", "-w"];
        a.extend_from_slice(kv);
        crate::sys::run_in(ns, "sysctl", &a).map(|_| ())
    }

    /// Replaces the emulator by a plain kernel bridge: the baseline a benchmark subtracts to
    /// get the delay the emulator adds.
    pub fn bridge_link(&mut self) -> Result<(), String> {
        self.stop_emulator();
        // Bridged already (another cell of a scenario): bridged anew.
        let _ = run("ip", &["-n", &self.ns(Host::Link), "link", "del", "br0"]);
        ip_batch(
            Some(&self.ns(Host::Link)),
            &[
                "link add br0 type bridge".into(),
                "link set to-term master br0".into(),
                "link set to-gw master br0".into(),
                "link set br0 up".into(),
            ],
        )
    }

    /// Turns TSO, GSO and tx checksum offload on the routers' link-facing interfaces on or
    /// off. Only a bridged link (see [`Lab::bridge_link`]) works with them on: the emulator
    /// needs whole, checksummed frames.
    pub fn set_link_offloads(&self, on: bool) -> Result<(), String> {
        let v = if on { "on" } else { "off" };
        for host in [Host::Terminal, Host::Gateway] {
            self.run_in(
                host,
                "ethtool",
                &["-K", "to-link", "tso", v, "gso", v, "tx", v],
            )?;
        }
        Ok(())
    }

    /// Starts `satpep ARGS…` in `host`'s namespace as a daemon of the lab: its own session (a
    /// Ctrl-C meant for the shell that ran `lab up` must not stop it), output to `log`.
    ///
    /// Only its network namespace is `host`'s, as a proxy deployed on a box runs in the
    /// host's mounts: `ip netns exec` would also give it a mount namespace with a fresh /sys,
    /// without bpffs, where the controllers' pins (`/sys/fs/bpf/satpep`) are not seen.
    fn spawn_satpep(
        &self,
        ns_name: &str,
        args: &[&std::ffi::OsStr],
        log: &Path,
        what: &str,
        env: &[(&str, &str)],
    ) -> Result<Child, String> {
        use std::os::unix::process::CommandExt;
        let logf = std::fs::File::create(log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let ns_path = Path::new("/run/netns").join(ns_name);
        let ns = std::fs::File::open(&ns_path)
            .map_err(|e| format!("cannot open {}: {e}", ns_path.display()))?;
        let mut cmd = Command::new(&self.satpep_bin);
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf);
        // SAFETY: setsid and setns are async-signal-safe system calls; `ns` outlives the
        // spawn (the child's copy closes at exec: std opens files close-on-exec).
        unsafe {
            use std::os::fd::AsRawFd;
            let fd = ns.as_raw_fd();
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::setsid();
                Ok(())
            });
        }
        cmd.spawn().map_err(|e| format!("cannot start {what}: {e}"))
    }

    /// Starts (or restarts, with a new link) the emulator in the link namespace.
    pub fn start_emulator(&mut self, spec: &LinkSpec) -> Result<(), String> {
        self.stop_emulator();
        // Undo a baseline bridge, if any.
        let _ = run("ip", &["-n", &self.ns(Host::Link), "link", "del", "br0"]);
        spec.resolve()?;
        let dir = state_dir(&self.name);
        let cfg = dir.join("link.toml");
        let sock = dir.join("link.sock");
        let log = dir.join("link.log");
        std::fs::write(&cfg, absolute_traces(spec)?)
            .map_err(|e| format!("cannot write {}: {e}", cfg.display()))?;
        let mut child = self.spawn_satpep(
            &self.ns(Host::Link),
            &[
                "link".as_ref(),
                "--terminal".as_ref(),
                "to-term".as_ref(),
                "--gateway".as_ref(),
                "to-gw".as_ref(),
                "--config".as_ref(),
                cfg.as_os_str(),
                "--control".as_ref(),
                sock.as_os_str(),
            ],
            &log,
            "the emulator",
            &[],
        )?;
        self.state.emulator_pid = Some(child.id());
        write_state(&self.state)?;
        wait_ready(&mut child, &log, "the emulator", || {
            satpep_link::run::query(&sock).is_ok()
        })?;
        self.emulator = Some(child);
        Ok(())
    }

    /// Starts the split proxy on the terminal (satellite upstream, for uploads) and on the
    /// gateway (satellite downstream, for downloads), configured with what `pep.told` says of
    /// the link. Told it exactly, a satellite-leg socket sends one way and receives the
    /// other, so its buffers are sized from the faster direction.
    pub fn start_proxies(&mut self, spec: &LinkSpec, pep: &Pep) -> Result<(), String> {
        match pep.cc.as_deref() {
            // The proxies switch among the shipped policy's controllers.
            Some("adaptive") => {
                for cc in satpep_proxy::adaptive::policy_controllers() {
                    if cc.starts_with("satpep_") {
                        ensure_cc(cc)?;
                    }
                }
            }
            Some(cc) => ensure_cc(cc)?,
            // The proxies' default: registered here, pinned, because the terminal's and the
            // gateway's proxies share one kernel and each would unregister it on exit
            // (their bpffs mounts are their own). If it cannot load, they fall back.
            None if pep.tunnel.is_none() => {
                if let Err(e) = ensure_cc(satpep_cc::SPLIT_DEFAULT) {
                    eprintln!("warning: {e}; the proxies fall back to bbr");
                }
            }
            None => {}
        }
        // satpep_sat remembers each destination's path for five minutes (a warm start), and
        // every lab uses the same addresses: a new lab's links are not the last one's (a
        // 1 Gbit/s, 5 ms path remembered for the client made the next lab's 200 ms path
        // look like 195 ms of queue). The memory is the host's: a lab running beside this
        // one loses its warm starts too.
        if let Err(e) = satpep_cc::forget_paths() {
            eprintln!("warning: cannot clear satpep_sat's path memory: {e}");
        }
        self.state.log_filter = pep.log_filter.clone();
        let cfg = spec.resolve()?;
        let dir = state_dir(&self.name);
        // Each node with a proxy: its role and name. A tunnel's gateway starts first, so
        // the terminals find it listening; a star's other terminals come last.
        let mut order = vec![(Host::Terminal, "terminal".to_string())];
        if pep.tunnel.is_some() {
            order.insert(0, (Host::Gateway, "gateway".into()));
        } else if !pep.terminal_only {
            order.push((Host::Gateway, "gateway".into()));
        }
        order.extend((2..=self.state.terminals).map(|k| (Host::Terminal, site(k).terminal)));
        let keys = dir.join("keys");
        if pep.tunnel.is_some() && !keys.join("gateway.pem").exists() {
            let names: Vec<String> = order.iter().map(|(_, n)| n.clone()).collect();
            satpep_tunnel::keys::keygen(
                &keys,
                &names,
                satpep_tunnel::authority::DEFAULT_DAYS,
                true,
            )?;
        }
        for (host, node) in order {
            let file = proxy_file(pep, host, &node, &cfg, &keys, spliced_max_connections());
            // What the proxy will refuse, refused here with the lab's own words.
            let text = toml::to_string(&file)
                .map_err(|e| format!("cannot write the {node} proxy's configuration: {e}"))?;
            ProxyFile::parse(&text)
                .and_then(|f| f.resolve())
                .map_err(|e| format!("the {node} proxy's configuration: {e}"))?;
            let text = format!(
                "# Written by satpep lab for the {node} of lab {}.\n{text}",
                self.name
            );
            let path = dir.join(format!("proxy-{node}.toml"));
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            self.launch_proxy(&node)?;
        }
        Ok(())
    }

    /// Starts node `node`'s proxy (`terminal`, `gateway`, a star's `terminalK`) from the
    /// configuration [`Lab::start_proxies`] wrote, and waits until it intercepts.
    fn launch_proxy(&mut self, node: &str) -> Result<(), String> {
        let dir = state_dir(&self.name);
        let path = dir.join(format!("proxy-{node}.toml"));
        let log = dir.join(format!("proxy-{node}.log"));
        let what = format!("the {node} proxy");
        // Every connection's lines (debug, target satpep::connection) stay in a lab's logs:
        // they are how a run is checked afterwards. RUST_LOG, when set, decides instead.
        let filter = self
            .state
            .log_filter
            .clone()
            .or_else(|| std::env::var("RUST_LOG").ok())
            .unwrap_or_else(|| "info,satpep::connection=debug".into());
        // Readiness as systemd's `Type=notify` sees it: the proxy sends READY=1 once it
        // intercepts (interception installed, privileges dropped), not when its nftables
        // table exists: after a crash the old table is still there while the new process
        // removes it and installs its own.
        let sock = dir.join(format!("notify-{node}.sock"));
        let _ = std::fs::remove_file(&sock);
        let notify = UnixDatagram::bind(&sock)
            .and_then(|s| s.set_nonblocking(true).map(|_| s))
            .map_err(|e| format!("cannot listen on {}: {e}", sock.display()))?;
        let notify_env = sock.display().to_string();
        let mut child = self.spawn_satpep(
            &node_netns(&self.name, node),
            &["proxy".as_ref(), "--config".as_ref(), path.as_os_str()],
            &log,
            &what,
            &[
                ("RUST_LOG", filter.as_str()),
                ("NOTIFY_SOCKET", &notify_env),
            ],
        )?;
        self.state.proxy_pids.push(child.id());
        write_state(&self.state)?;
        let mut buf = [0u8; 4096];
        wait_ready(&mut child, &log, &what, || {
            while let Ok(n) = notify.recv(&mut buf) {
                if String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .any(|l| l == "READY=1")
                {
                    return true;
                }
            }
            false
        })?;
        self.proxies.push((node.to_string(), child, notify));
        Ok(())
    }

    /// Stops `host`'s proxy with `signal` (SIGTERM: a clean stop; SIGKILL: a crash) and waits
    /// until it has exited. Returns whether one was running.
    pub fn signal_proxy(&mut self, host: Host, signal: i32) -> bool {
        let Some(i) = self.proxies.iter().position(|(h, ..)| h == host.name()) else {
            return false;
        };
        let (_, mut c, _) = self.proxies.remove(i);
        let pid = c.id();
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(pid as i32, signal) };
        let _ = c.wait();
        self.state.proxy_pids.retain(|p| *p != pid);
        let _ = write_state(&self.state);
        true
    }

    /// Starts `host`'s proxy again after [`Lab::signal_proxy`], with the same configuration.
    pub fn restart_proxy(&mut self, host: Host) -> Result<(), String> {
        self.launch_proxy(host.name())
    }

    /// The log of node `node`'s proxy (`terminal3`, …; empty if it has none).
    pub fn node_proxy_log(&self, node: &str) -> String {
        std::fs::read_to_string(state_dir(&self.name).join(format!("proxy-{node}.log")))
            .unwrap_or_default()
    }

    /// The process id of node `node`'s proxy (`gateway`, `terminal`, `terminal3`), if one runs.
    pub fn node_proxy_pid(&self, node: &str) -> Option<u32> {
        self.proxies
            .iter()
            .find(|(n, ..)| n == node)
            .map(|(_, c, _)| c.id())
    }

    /// Terminals and their clients, 1 to N.
    pub fn sites(&self) -> Vec<Site> {
        (1..=self.state.terminals).map(site).collect()
    }

    /// Namespace name of node `node` (a host's name, or a star's `clientK`/`terminalK`).
    pub fn node_ns(&self, node: &str) -> String {
        node_netns(&self.name, node)
    }

    /// Hosts whose proxy is running, in start order (the line's: a star's other terminals
    /// are not among them).
    pub fn proxy_hosts(&self) -> Vec<Host> {
        self.proxies
            .iter()
            .filter_map(|(h, ..)| Host::parse(h).ok())
            .collect()
    }

    /// Stops the proxies, if running.
    pub fn stop_proxies(&mut self) {
        for (_, c, _) in self.proxies.drain(..) {
            stop_child(c);
        }
        for pid in std::mem::take(&mut self.state.proxy_pids) {
            stop_pid(pid, &self.name);
        }
    }

    /// Stops the emulator, if running.
    pub fn stop_emulator(&mut self) {
        if let Some(c) = self.emulator.take() {
            stop_child(c);
        } else if let Some(pid) = self.state.emulator_pid {
            stop_pid(pid, &self.name);
        }
        self.state.emulator_pid = None;
    }

    /// PID of the running emulator.
    pub fn emulator_pid(&self) -> Option<u32> {
        self.state.emulator_pid
    }

    /// The emulator's counters.
    pub fn link_stats(&self) -> Result<LinkSnapshot, String> {
        satpep_link::run::query(&state_dir(&self.name).join("link.sock"))
    }

    /// The emulator's log.
    pub fn link_log(&self) -> String {
        std::fs::read_to_string(state_dir(&self.name).join("link.log")).unwrap_or_default()
    }

    /// The log of the proxy on `host` (empty if it has none).
    pub fn proxy_log(&self, host: Host) -> String {
        std::fs::read_to_string(state_dir(&self.name).join(format!("proxy-{}.log", host.name())))
            .unwrap_or_default()
    }

    /// Pings the server from every client (IPv4 and IPv6) until a reply comes, a few tries;
    /// a star's clients all at once.
    pub fn check_path(&self) -> Result<(), String> {
        let pings: Vec<(String, &str, Child)> = self
            .sites()
            .iter()
            .flat_map(|st| [(st.client.clone(), SERVER_V4), (st.client.clone(), SERVER_V6)])
            .map(|(client, dst)| {
                let mut c = crate::sys::in_ns(&self.node_ns(&client), "sh");
                // Five tries of one echo each, so a lost echo or reply is tried again.
                c.args([
                    "-c",
                    "for i in 1 2 3 4 5; do ping -c 1 -W 3 -q \"$0\" >/dev/null && exit 0; done; exit 1",
                    dst,
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
                c.spawn()
                    .map(|ch| (client, dst, ch))
                    .map_err(|e| format!("cannot run ping: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let mut failed = Vec::new();
        for (client, dst, mut ch) in pings {
            if !ch.wait().is_ok_and(|st| st.success()) {
                failed.push(format!("{client} to {dst}"));
            }
        }
        if !failed.is_empty() {
            return Err(format!(
                "no ping crossed the link ({}); emulator log:\n{}",
                failed.join(", "),
                self.link_log()
            ));
        }
        Ok(())
    }
}

/// The spec as TOML, with trace paths made absolute (the emulator may run elsewhere).
fn absolute_traces(spec: &LinkSpec) -> Result<String, String> {
    let mut s = spec.clone();
    for d in [&mut s.both, &mut s.forward, &mut s.ret] {
        for p in [&mut d.rate_trace, &mut d.delay_trace]
            .into_iter()
            .flatten()
        {
            *p = std::fs::canonicalize(&*p).map_err(|e| format!("trace {}: {e}", p.display()))?;
        }
    }
    toml::to_string(&s).map_err(|e| format!("cannot write link settings: {e}"))
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.attached {
            self.stop_proxies();
            self.stop_emulator();
            if let Err(e) = teardown(&self.name) {
                eprintln!("satpep lab: tearing down '{}': {e}", self.name);
            }
        }
    }
}

/// The lab's proxies' `max_connections` when a test names none: on a machine whose hard
/// descriptor limit cannot be raised (no CAP_SYS_RESOURCE, a 20 000 limit), the proxy's
/// default of 10 000 connections would take every descriptor and leave no kernel pipes, so
/// "splice" runs would silently copy. `None` when the limit fits the default.
fn spliced_max_connections() -> Option<u32> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    // The proxy's own reckoning: six descriptors per split connection (two sockets, two
    // pipes) and 1 280 spare.
    let fits = r.rlim_max.saturating_sub(1280) / 6;
    (fits < 10_000).then(|| fits.max(64) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_are_told_only_what_pep_told_says() {
        let link = satpep_link::presets::spec("geo")
            .unwrap()
            .resolve()
            .unwrap();
        let keys = Path::new("/k");
        let split = Pep::default();
        let f = proxy_file(&split, Host::Gateway, "gateway", &link, keys, None);
        assert_eq!(f.intercept.interfaces, ["to-link"]);
        assert_eq!(f.intercept.exclude_ports, [END_TO_END_PORT]);
        assert_eq!(f.proxy.satellite_side, "downstream");
        assert_eq!((f.satellite.rate, f.satellite.rtt), (None, None));
        assert!(f.tunnel.is_none());
        let exact = Pep {
            told: Told::Exact,
            cc: Some("satpep_hybla".into()),
            ..Default::default()
        };
        let f = proxy_file(&exact, Host::Terminal, "terminal", &link, keys, Some(9));
        assert_eq!(f.proxy.satellite_side, "upstream");
        assert_eq!(f.proxy.max_connections, 9);
        assert_eq!(f.satellite.congestion.as_deref(), Some("satpep_hybla"));
        assert_eq!(f.satellite.rate.as_deref(), Some("50000000"));
        assert_eq!(f.satellite.rtt.as_deref(), Some("560000000ns"));
        // A tunnel told a service plan's 25 Mbit/s forward: the gateway sends at it, the
        // terminal (return, 10 of 50 scaled alike) at 5, and neither is given an RTT.
        let tunnel = Pep {
            tunnel: Some("satellite".into()),
            told: Told::Nominal(25e6, 5e6),
            ..Default::default()
        };
        let t = proxy_file(&tunnel, Host::Terminal, "terminal", &link, keys, None)
            .tunnel
            .unwrap();
        assert_eq!(t.role.as_deref(), Some("terminal"));
        assert_eq!(t.peer.as_deref(), Some("198.18.2.2:7701"));
        assert_eq!(
            (t.rate.as_deref(), t.receive_rate.as_deref()),
            (Some("5000000"), Some("25000000"))
        );
        assert_eq!(t.rtt, None);
        assert_eq!(t.key.as_deref(), Some("/k/terminal.key"));
        let g = proxy_file(&tunnel, Host::Gateway, "gateway", &link, keys, None);
        assert_eq!(g.satellite.congestion, None);
        assert_eq!(g.tunnel.unwrap().peer, None);
    }

    #[test]
    fn names() {
        assert!(check_name("geo-1_a").is_ok());
        for bad in ["", "Geo", "a/b", "-x", "abcdefghijklmnopqrstuvwxy"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(netns("x", Host::Gateway), "sp-x-gateway");
        assert_eq!(Host::parse("server").unwrap(), Host::Server);
        assert!(Host::parse("router")
            .unwrap_err()
            .contains("client, terminal"));
    }

    #[test]
    fn a_stars_nodes_have_their_own_addresses_and_names() {
        let one = site(1);
        assert_eq!(
            (one.client_v4.as_str(), one.sat_v4.as_str()),
            (CLIENT_V4, "198.18.2.1")
        );
        let last = site(MAX_TERMINALS);
        assert_eq!(last.client_net_v4, "198.19.240.0/24");
        assert_eq!(last.sat_v4, "198.18.2.250");
        assert_eq!(last.sat_v6, "2001:2:0:2::fa");
        assert_eq!(last.mac, "02:00:c6:12:02:fa");
        // Every terminal's satellite address, MAC and subnet differ from the others' and
        // from the gateway's (198.18.2.2).
        let all: Vec<Site> = (1..=MAX_TERMINALS).map(site).collect();
        for key in [
            |s: &Site| s.sat_v4.clone(),
            |s: &Site| s.mac.clone(),
            |s: &Site| s.client_net_v6.clone(),
        ] {
            let mut v: Vec<String> = all.iter().map(key).collect();
            v.sort();
            v.dedup();
            assert_eq!(v.len(), all.len());
        }
        assert!(all.iter().all(|s| s.sat_v4 != "198.18.2.2"));
        assert_eq!(parse_node("client3", 3).unwrap(), "client3");
        assert_eq!(parse_node("terminal1", 1).unwrap(), "terminal");
        assert_eq!(parse_node("gateway", 1).unwrap(), "gateway");
        assert!(parse_node("client4", 3)
            .unwrap_err()
            .contains("it has 3 terminal"));
        assert!(parse_node("router", 3)
            .unwrap_err()
            .contains("unknown host"));
        let star = star_hosts("x", 3);
        assert_eq!(star.len(), 4);
        assert_eq!(star[3].netns, "sp-x-terminal3");
        assert_eq!(star[3].ipv4, ["198.19.3.1/24", "198.18.2.13/24"]);
    }

    #[test]
    fn addresses_are_benchmarking_ranges() {
        for h in star_hosts("x", MAX_TERMINALS) {
            for a in h.ipv4.iter().chain(&h.ipv6) {
                assert!(
                    a.starts_with("198.18.")
                        || a.starts_with("198.19.")
                        || a.starts_with("2001:2:0:"),
                    "{a}"
                );
            }
        }
        for h in hosts("x") {
            for a in &h.ipv6 {
                assert!(a.starts_with("2001:2:0:"), "{a}");
            }
            for a in &h.ipv4 {
                assert!(a.starts_with("198.18.") || a.starts_with("198.19."), "{a}");
            }
            for a in &h.ipv6 {
                assert!(a.starts_with("2001:2:"), "{a}");
            }
        }
    }
}
