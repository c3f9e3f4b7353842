//! The configuration file's reference, written from the code's own defaults: the annotated
//! example the package installs (dist/proxy.toml, `satpep generate config`) and the
//! proxy.toml(5) page. A test holds dist/proxy.toml to this text and every key of
//! [`ProxyFile`] to a line here, so neither can drift from the code.

use crate::config::{self, ProxySection};
use std::fmt::Write as _;

/// One key of the file.
pub struct Key {
    /// `[section]` it sits in.
    pub section: &'static str,
    /// Its name.
    pub name: &'static str,
    /// Its value as TOML: the default, or an example where `default` is false.
    pub value: String,
    /// Whether `value` is the default (else an example of a key with no default).
    pub default: bool,
    /// What it does.
    pub about: &'static str,
}

/// The sections in file order, each with a line saying what it is.
pub const SECTIONS: [(&str, &str); 6] = [
    (
        "intercept",
        "which forwarded TCP connections are split (firewall-style selection)",
    ),
    (
        "proxy",
        "the listener, limits, endpoints and behaviour of the proxy itself",
    ),
    ("satellite", "the leg across the satellite"),
    (
        "terrestrial",
        "the leg on the local network; the same keys as [satellite]",
    ),
    (
        "adaptive",
        "per-connection choice of controller (satellite.congestion = \"adaptive\")",
    ),
    (
        "tunnel",
        "distributed mode: flows cross the hop in one QUIC connection to a peer satpep",
    ),
];

fn s(v: &str) -> String {
    toml::Value::String(v.into()).to_string()
}

/// Every key of the file, with its default (or an example) and what it does.
pub fn keys() -> Vec<Key> {
    let d = |section, name, value: String, about| Key {
        section,
        name,
        value,
        default: true,
        about,
    };
    let e = |section, name, value: String, about| Key {
        section,
        name,
        value,
        default: false,
        about,
    };
    let p = toml::Value::try_from(ProxySection::default()).expect("the defaults serialize");
    let pv = |k: &str| p.get(k).map(|v| v.to_string()).unwrap_or_default();
    let mut v = vec![
        d("intercept", "interfaces", "[]".into(), "ingress interfaces of the clients (empty: every interface); e.g. [\"eth1\"]"),
        d("intercept", "sources", "[]".into(), "client prefixes split (empty: any); IPv4 and IPv6 mixed freely, e.g. [\"198.18.1.0/24\"]"),
        d("intercept", "destinations", "[]".into(), "server prefixes split (empty: any)"),
        d("intercept", "ports", "[]".into(), "server ports split (empty: any)"),
        d("intercept", "exclude_sources", "[]".into(), "client prefixes never split"),
        d("intercept", "exclude_destinations", "[]".into(), "server prefixes never split"),
        d("intercept", "exclude_ports", "[]".into(), "server ports never split, e.g. [22]"),
        d("proxy", "port", pv("port"), "TPROXY listener port (IPv4 and IPv6)"),
        d("proxy", "mark", pv("mark"), "firewall mark of intercepted packets (0x5350)"),
        d("proxy", "table", pv("table"), "routing table that delivers marked packets locally"),
        d("proxy", "satellite_side", pv("satellite_side"), "\"upstream\" at a terminal (servers are across the satellite), \"downstream\" at a gateway"),
        d("proxy", "handshake", pv("handshake"), "\"fast\" (clients answered at once) or \"strict\" (after the server answered; needs iptables)"),
        d("proxy", "queue", pv("queue"), "NFQUEUE number that holds SYNs in strict mode"),
        d("proxy", "buffer", pv("buffer"), "relay pipe per direction per connection"),
        d("proxy", "relay", pv("relay"), "\"splice\" (zero-copy through a kernel pipe) or \"copy\" (through user space)"),
        d("proxy", "back_pressure", pv("back_pressure"), "\"improved\" (each socket holds at most 256 KiB unsent: the excess stays upstream, whose window shrinks; Bharadwaj 1999 4.3) or \"plain\" (the excess waits in the relay and the downstream send buffer, which can hold tens of MB per connection); split connections only"),
        d("proxy", "drop_flow_control", pv("drop_flow_control"), "drop one arriving segment when a direction buffers more than max(half its receive window, twice the far leg's cwnd), none again until its retransmission (Bharadwaj 1999 4.2; needs BPF)"),
        d("proxy", "buffer_sizing", pv("buffer_sizing"), "size each upstream receive window from the downstream leg every two upstream RTTs (Bharadwaj 1999 ch. 6)"),
        d("proxy", "max_connections", pv("max_connections"), "past it new connections bypass the proxy (never refused); in a tunnel also the flows its peer may open at once"),
        d("proxy", "workers", pv("workers"), "processes accepting and relaying split connections, each with its own descriptor table (SO_REUSEPORT); for a descriptor limit that cannot be raised"),
        d("proxy", "max_memory", pv("max_memory"), "of physical memory, or a size (\"2GiB\"); past it, the same"),
        d("proxy", "metrics", pv("metrics"), "Prometheus /metrics (\"\": off)"),
        d("proxy", "connections", pv("connections"), "/connections: beside /metrics, its own \"ADDR:PORT\", or \"\" (off)"),
        d("proxy", "keepalive", pv("keepalive"), "TCP keepalive on both legs: a vanished peer is found and reset (\"0s\": off)"),
        d("proxy", "idle_timeout", pv("idle_timeout"), "reset connections idle this long (\"0s\": never)"),
        d("proxy", "drain", pv("drain"), "on stop, live connections may finish this long (the unit's TimeoutStopSec must be longer)"),
        d("proxy", "log_summary", pv("log_summary"), "one info line per interval summing it up (\"0s\": off)"),
        e("proxy", "carrier", "{ rate = \"200Mbit\", share = \"time\", terminal = { terminal-17 = { subnets = [\"198.19.17.0/24\"], weight = 2, cir = \"5Mbit\", mir = \"50Mbit\", rate = \"100Mbit\" } } }".into(), "a split gateway's (satellite_side = \"downstream\"): one forward carrier shared among its terminals, as [tunnel.carrier], each named terminal known by its client subnets (also written as [proxy.carrier] and [proxy.carrier.terminal.NAME]); clients in no listed subnet form one terminal per /24 (IPv4) or /64 (IPv6), weight 1; applied as each connection's pacing ceiling every 50 ms; default: none; a reload applies a change"),
    ];
    for leg in ["satellite", "terrestrial"] {
        let sat = leg == "satellite";
        v.extend([
            if sat {
                d(leg, "congestion", s(satpep_cc::SPLIT_DEFAULT), "satpep's satellite controller (bbr where it cannot load); or a kernel one (bbr, cubic), one of satpep's (satpep_hybla, …), or \"adaptive\"")
            } else {
                e(leg, "congestion", s("cubic"), "no default: the kernel's (net.ipv4.tcp_congestion_control)")
            },
            e(leg, "rate", s("50Mbit"), "no default; with rtt, socket buffers are 4 × rate × rtt (without both the kernel autotunes them)"),
            e(leg, "rtt", s("600ms"), "no default; see rate"),
            e(leg, "buffer", s("16MiB"), "no default; an explicit socket buffer size (overrides rate × rtt)"),
            d(leg, "nodelay", "false".into(), "TCP_NODELAY: no Nagle"),
            e(leg, "notsent_lowat", s("128KiB"), "no default (the kernel's: unlimited); TCP_NOTSENT_LOWAT, unsent bytes a socket holds at most"),
            e(leg, "interface", s(if sat { "eth0" } else { "eth1" }), "no default; the interface this leg leaves by, for initcwnd, initrwnd and mss"),
            e(leg, "initcwnd", "40".into(), "no default (the kernel's: 10); initial congestion window on the routes out of interface, segments"),
            e(leg, "initrwnd", "40".into(), "no default (the kernel's); initial advertised window on those routes, segments"),
            e(leg, "mss", "1360".into(), "no default; TCP_MAXSEG, and MSS clamping of forwarded SYNs out of interface"),
            d(leg, "fastopen", "false".into(), "TCP Fast Open on this leg (needs net.ipv4.tcp_fastopen = 3)"),
        ]);
    }
    let policy: Vec<String> = crate::adaptive::Class::ALL
        .iter()
        .map(|c| {
            let cc = c.default_cc();
            format!(
                "{} = {}",
                c.name(),
                s(if cc.is_empty() { "default" } else { cc })
            )
        })
        .collect();
    let ports: Vec<String> = config::INTERACTIVE_PORTS
        .iter()
        .map(|p| p.to_string())
        .collect();
    v.extend([
        d("adaptive", "interval", s(config::ADAPTIVE_INTERVAL), "how often each connection is classified"),
        d("adaptive", "dwell", s(config::ADAPTIVE_DWELL), "least time a connection keeps a controller before another switch"),
        d("adaptive", "interactive_ports", format!("[{}]", ports.join(", ")), "server ports of interactive applications, left on the default controller"),
        d("adaptive", "policy", format!("{{ {} }}", policy.join(", ")), "class → controller (\"default\": the kernel's); give only the classes to change"),
        e("tunnel", "role", s("terminal"), "no default: \"terminal\" (intercepts clients, opens flows) or \"gateway\" (carries them to the servers)"),
        e("tunnel", "peer", s("198.18.2.2:7701"), "the terminal's: the gateway's UDP address (a gateway has none)"),
        d("tunnel", "listen", s(config::TUNNEL_LISTEN_GATEWAY), "UDP address: a gateway listens on it (this default); a terminal sends from it (default \"[::]:0\")"),
        e("tunnel", "ca", s("/etc/satpep/keys/ca.pem"), "no default: the deployment's CA certificate (satpep keygen)"),
        e("tunnel", "cert", s("/etc/satpep/keys/terminal.pem"), "no default: this satpep's certificate, signed by the CA"),
        e("tunnel", "key", s("/etc/satpep/keys/terminal.key"), "no default: this satpep's private key"),
        d("tunnel", "peer_name", s(config::TUNNEL_PEER_NAME), "the terminal's: the name in the gateway's certificate"),
        d("tunnel", "congestion", s(config::TUNNEL_CONGESTION), "this side's sending direction: satellite (needs no rate), hybla, cubic, bbr or newreno"),
        e("tunnel", "rate", s("50Mbit"), "default: satellite.rate, else none (the satellite controller finds it); this side's sending rate, a hint"),
        e("tunnel", "receive_rate", s("10Mbit"), "default: this side's rate; the peer's sending rate, sizing receive windows"),
        d("tunnel", "rtt", s(config::TUNNEL_RTT), "the hop's round-trip time, sizing windows (default satellite.rtt, else this)"),
        d("tunnel", "outage", s(config::TUNNEL_OUTAGE), "how long the hop may be down before flows are given up"),
        e("tunnel", "terminals", "[\"terminal-17\", \"terminal-18\"]".into(), "the gateway's: the terminals admitted, by certificate name (default: any the CA signed); a reload applies it"),
        e("tunnel", "crl", s("/etc/satpep/keys/crl.pem"), "the gateway's: the CA's revocation list (satpep keygen revoke writes it; default: none); read again at every reload"),
        e("tunnel", "carrier", "{ rate = \"200Mbit\", share = \"time\", terminal = { terminal-17 = { weight = 2, cir = \"5Mbit\", mir = \"50Mbit\", rate = \"100Mbit\" } } }".into(), "the gateway's: one forward carrier shared among its terminals (a hub; also written as [tunnel.carrier] and [tunnel.carrier.terminal.NAME]): its rate, what is shared (\"time\": carrier time by weight, a faded terminal gets fewer bits; \"bits\": bits by weight), and per terminal a weight (1), committed and maximum rates, and its link's rate (default the carrier's); default: none, each terminal at its own controller's rate; a reload applies a change"),
    ]);
    v
}

/// The annotated example file: every key, commented out, with its default or an example.
pub fn toml_text() -> String {
    let mut out = String::from(
        "# /etc/satpep/proxy.toml: satpep's proxy (satpep-proxy.service); proxy.toml(5).\n\
         # Written by `satpep generate config` from the code's own defaults.\n\
         #\n\
         # Every key is optional. Each `# key = value` line shows the key's default, unless\n\
         # the note under it begins with \"(example)\": then the key has no default and the value is\n\
         # an example. Read docs/proxy.md (or\n\
         # `man satpep-proxy`) before enabling the service: with no [intercept] selection satpep\n\
         # splits every TCP connection forwarded through this box, on every interface (never\n\
         # those to the box itself). Check a change with\n\
         #     satpep proxy --check --config /etc/satpep/proxy.toml\n\
         # and apply it with `systemctl reload satpep-proxy` (live connections carry on).\n",
    );
    let keys = keys();
    for (section, about) in SECTIONS {
        let _ = write!(out, "\n# {about}.\n");
        // The tunnel's keys are in a section that turns distributed mode on: commented out.
        if section == "tunnel" {
            let _ = writeln!(out, "# [{section}]");
        } else {
            let _ = writeln!(out, "[{section}]");
        }
        for k in keys.iter().filter(|k| k.section == section) {
            let line = format!("# {} = {}", k.name, k.value);
            let mark = if k.default { "" } else { "(example) " };
            let _ = writeln!(out, "{line}\n#     {mark}{}", k.about);
        }
    }
    out
}

/// The proxy.toml(5) page (roff), from the same keys.
pub fn man_page() -> String {
    let esc = |t: &str| t.replace('\\', "\\\\").replace('-', "\\-");
    let mut out = String::from(
        ".TH PROXY.TOML 5 \"\" \"satpep\" \"File formats\"\n.SH NAME\nproxy.toml \\- satpep proxy configuration\n\
         .SH SYNOPSIS\n/etc/satpep/proxy.toml\n.SH DESCRIPTION\nThe configuration of \\fBsatpep proxy\\fR(1), \
         read from /etc/satpep/proxy.toml or the file given with \\fB\\-\\-config\\fR. It is TOML; every key is \
         optional and every section too. An unknown key or a bad value is refused with a message \
         naming it; \\fBsatpep proxy \\-\\-check\\fR finds everything a start would refuse. SIGHUP \
         (\\fBsystemctl reload satpep\\-proxy\\fR) applies a changed selection, limits and legs' options \
         without dropping connections.\n",
    );
    let keys = keys();
    for (section, about) in SECTIONS {
        let _ = write!(out, ".SH \"[{section}]\"\n{}.\n", esc(about));
        for k in keys.iter().filter(|k| k.section == section) {
            let what = if k.default { "default" } else { "for example" };
            let _ = write!(
                out,
                ".TP\n\\fB{}\\fR ({what} \\fI{}\\fR)\n{}.\n",
                k.name,
                esc(&k.value),
                esc(k.about)
            );
        }
    }
    out.push_str(".SH FILES\n/etc/satpep/proxy.toml\n.SH \"SEE ALSO\"\n\\fBsatpep\\-proxy\\fR(1), \\fBsatpep\\-keygen\\fR(1), /usr/share/doc/satpep/docs/proxy.md\n");
    out
}

/// Every field of `T`'s serde form, by asking its `Deserialize` for the struct's fields.
#[cfg(test)]
fn fields<'de, T: serde::Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Grab<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Grab<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut f: &'static [&'static str] = &[];
    let _ = T::deserialize(Grab(&mut f));
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AdaptiveFile, InterceptFile, LegFile, ProxyFile, TunnelFile};

    /// dist/proxy.toml is this module's text: a default changed in the code, a key added or
    /// a comment changed without regenerating it (`satpep generate config > dist/proxy.toml`)
    /// fails here.
    #[test]
    fn the_packaged_example_is_the_generated_reference() {
        let dist = include_str!("../../../dist/proxy.toml");
        assert!(
            dist == toml_text(),
            "dist/proxy.toml differs from `satpep generate config`: regenerate it"
        );
    }

    /// Every key the code reads has a line, and nothing else does.
    #[test]
    fn every_key_of_the_file_is_in_the_reference() {
        let keys = keys();
        let want: Vec<(&str, &[&str])> = vec![
            ("intercept", fields::<InterceptFile>()),
            ("proxy", fields::<ProxySection>()),
            ("satellite", fields::<LegFile>()),
            ("terrestrial", fields::<LegFile>()),
            ("adaptive", fields::<AdaptiveFile>()),
            ("tunnel", fields::<TunnelFile>()),
        ];
        let sections: Vec<&str> = fields::<ProxyFile>().to_vec();
        assert_eq!(sections.len(), SECTIONS.len(), "{sections:?}");
        for (section, names) in &want {
            assert!(sections.contains(section), "{section}");
            assert!(!names.is_empty(), "{section}");
            for n in *names {
                assert!(
                    keys.iter().any(|k| k.section == *section && k.name == *n),
                    "{section}.{n} is not in the reference"
                );
            }
            for k in keys.iter().filter(|k| k.section == *section) {
                assert!(names.contains(&k.name), "{section}.{} is not a key", k.name);
            }
        }
    }

    /// Uncommented, the reference is a file the proxy takes, and the defaults it shows are
    /// the ones the proxy resolves without them.
    #[test]
    fn the_reference_with_every_default_set_resolves_as_the_defaults_do() {
        let keys = keys();
        let mut section = "";
        let mut lines = Vec::new();
        let reference = toml_text();
        for l in reference.lines() {
            let header = l.trim_start_matches("# ");
            if let Some(name) = header.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                section = SECTIONS.iter().find(|s| s.0 == name).map_or("", |s| s.0);
            }
            // Uncomment each default, except the tunnel's: that section turns a mode on.
            let kv = l.strip_prefix("# ").unwrap_or("");
            let default = section != "tunnel"
                && keys.iter().any(|k| {
                    k.default && k.section == section && kv.starts_with(&format!("{} = ", k.name))
                });
            lines.push(if default { kv } else { l });
        }
        let text = lines.join("\n");
        let with = ProxyFile::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut plain = ProxyFile::default();
        // The one default the file's code leaves to the start (satpep_sat where it loads).
        plain.satellite.congestion = Some(satpep_cc::SPLIT_DEFAULT.into());
        assert_eq!(with.resolve().unwrap(), plain.resolve().unwrap(), "{text}");
        assert_eq!(with.proxy, ProxySection::default());
    }

    #[test]
    fn the_man_page_names_every_key() {
        let page = man_page();
        for k in keys() {
            assert!(page.contains(&format!("\\fB{}\\fR", k.name)), "{}", k.name);
        }
        assert!(page.starts_with(".TH PROXY.TOML 5"));
    }
}
