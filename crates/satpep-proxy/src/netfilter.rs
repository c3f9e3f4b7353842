//! The interception plumbing satpep owns: one nftables table (`inet satpep`) and, per address
//! family, one policy rule plus one local route. Installed at start, removed at exit, and
//! removed first thing at the next start (or by `satpep proxy --cleanup`) after a crash.
//!
//! Packets of selected new connections are diverted with TPROXY to the proxy's listener and
//! marked; packets belonging to any transparent socket of the proxy (the replies to its
//! upstream connections, addressed to the client) are marked too. The mark routes both to
//! the local stack through the `table` with a `local` default route.

use crate::config::ProxyConfig;
use ipnet::IpNet;
use std::process::{Command, Stdio};

/// Name of the nftables table (family inet).
pub const TABLE: &str = "satpep";

fn set<T: std::fmt::Display>(items: &[T]) -> String {
    let v: Vec<String> = items.iter().map(|x| x.to_string()).collect();
    format!("{{ {} }}", v.join(", "))
}

fn split(nets: &[IpNet]) -> (Vec<IpNet>, Vec<IpNet>) {
    nets.iter().partition(|n| matches!(n, IpNet::V4(_)))
}

/// Marks derived from `proxy.mark` (M). M itself routes a packet to the local listener.
pub struct Marks {
    /// M: deliver locally (TPROXY, replies to the proxy's transparent sockets).
    pub local: u32,
    /// A new SYN held in the queue until the server answers (strict handshake).
    pub hold: u32,
    /// Verdict: the server refused; the client gets a TCP reset.
    pub refused: u32,
    /// Verdict: the server is unreachable or silent; the client gets host-unreachable.
    pub unreachable: u32,
    /// The proxy's upstream sockets (SO_MARK), whose packets live in conntrack zone
    /// [`UPSTREAM_ZONE`] so they never clash with the client's connection of the same tuple.
    pub upstream: u32,
}

/// Conntrack zone of the upstream legs.
pub const UPSTREAM_ZONE: u16 = 0x5350;

impl Marks {
    /// The marks for base mark `m`.
    pub fn new(m: u32) -> Marks {
        Marks {
            local: m,
            hold: m.wrapping_add(1),
            refused: m.wrapping_add(2),
            unreachable: m.wrapping_add(3),
            upstream: m.wrapping_add(4),
        }
    }
}

/// The nftables ruleset for `cfg`.
pub fn ruleset(cfg: &ProxyConfig) -> String {
    let k = Marks::new(cfg.mark);
    let hex = |v: u32| format!("0x{v:x}");
    let mark = hex(k.local);
    let ifs = if cfg.interfaces.is_empty() {
        String::new()
    } else {
        let q: Vec<String> = cfg.interfaces.iter().map(|i| format!("\"{i}\"")).collect();
        format!("iifname {} ", set(&q))
    };
    let mut exclusions = vec![
        "    # Connections to this box itself (any of its addresses, on any interface: an".into(),
        "    # operator's SSH, a local service) are never intercepted.".into(),
        "    fib daddr type local return".into(),
        "    # Exclusions.".to_string(),
    ];
    let (ex_s4, ex_s6) = split(&cfg.exclude_sources);
    let (ex_d4, ex_d6) = split(&cfg.exclude_destinations);
    for (fam, key, list) in [
        ("ip", "saddr", &ex_s4),
        ("ip6", "saddr", &ex_s6),
        ("ip", "daddr", &ex_d4),
        ("ip6", "daddr", &ex_d6),
    ] {
        if !list.is_empty() {
            exclusions.push(format!("    {fam} {key} {} return", set(list)));
        }
    }
    if !cfg.exclude_ports.is_empty() {
        exclusions.push(format!("    tcp dport {} return", set(&cfg.exclude_ports)));
    }
    let ports = if cfg.ports.is_empty() {
        String::new()
    } else {
        format!("tcp dport {} ", set(&cfg.ports))
    };
    let (s4, s6) = split(&cfg.sources);
    let (d4, d6) = split(&cfg.destinations);
    // One selector per family: (family, match of selected new connections).
    let mut selectors = Vec::new();
    // A tunnel gateway intercepts nothing: its flows come out of the tunnel.
    let gateway = matches!(&cfg.tunnel, Some(t) if t.role == crate::config::Role::Gateway);
    for (fam, s, d) in [("ip", &s4, &d4), ("ip6", &s6, &d6)] {
        if gateway {
            continue;
        }
        // A family the user restricted to nothing is not intercepted at all.
        if (!cfg.sources.is_empty() && s.is_empty())
            || (!cfg.destinations.is_empty() && d.is_empty())
        {
            continue;
        }
        let mut m = format!(
            "meta nfproto {} ",
            if fam == "ip" { "ipv4" } else { "ipv6" }
        );
        if !s.is_empty() {
            m += &format!("{fam} saddr {} ", set(s));
        }
        if !d.is_empty() {
            m += &format!("{fam} daddr {} ", set(d));
        }
        // Only new connections are diverted: packets of connections the proxy does not hold
        // (bypassed, or older than the proxy) are forwarded, never reset by the listener.
        selectors.push((
            fam,
            format!("{ifs}{m}meta l4proto tcp {ports}ct state new "),
        ));
    }
    let mut r = vec![
        format!("table inet {TABLE} {{"),
        "  # Holds `tcp` while the proxy is at a limit: new connections bypass it.".into(),
        "  set overload { type inet_proto; }".into(),
        "  counter bypassed {}".into(),
        "  # The upstream legs live in their own conntrack zone: in strict mode the client's held"
            .into(),
        "  # SYN and the proxy's own SYN have the same addresses and would clash.".into(),
        "  chain upstream_out {".into(),
        "    type filter hook output priority raw; policy accept;".into(),
        format!(
            "    meta mark {} ct zone set {UPSTREAM_ZONE}",
            hex(k.upstream)
        ),
        "  }".into(),
        "  chain upstream_in {".into(),
        "    type filter hook prerouting priority raw; policy accept;".into(),
        format!(
            "    meta l4proto {{ tcp, icmp, ipv6-icmp }} socket mark {} ct zone set {UPSTREAM_ZONE}",
            hex(k.upstream)
        ),
        "  }".into(),
    ];
    if cfg.strict {
        r.push(
            "  # Strict handshake: selected new SYNs are marked to be held (queued by the".into(),
        );
        r.push("  # xtables mangle chain SATPEP_HOLD) until the server has answered.".into());
        r.push("  chain hold {".into());
        r.push("    type filter hook prerouting priority mangle - 1; policy accept;".into());
        r.push("    meta mark != 0 return".into());
        r.extend(exclusions.iter().cloned());
        for (_, sel) in &selectors {
            r.push(format!("    {sel}meta l4proto @overload return"));
            r.push(format!(
                "    {sel}tcp flags & (fin | syn | rst | ack) == syn meta mark set {}",
                hex(k.hold)
            ));
        }
        r.push("  }".into());
    }
    r.push("  chain prerouting {".into());
    r.push("    type filter hook prerouting priority mangle + 1; policy accept;".into());
    r.push(
        "    # Packets for the proxy's own transparent sockets (replies to upstream connections)."
            .into(),
    );
    r.push(format!(
        "    meta l4proto tcp socket transparent 1 meta mark set {mark} accept"
    ));
    r.push(
        "    # ICMP errors about their packets (a router saying the server is unreachable).".into(),
    );
    r.push(format!(
        "    meta l4proto {{ icmp, ipv6-icmp }} socket transparent 1 meta mark set {mark} accept"
    ));
    if cfg.strict {
        r.push(
            "    # Held SYNs whose server refused or is unreachable: rejected in forward.".into(),
        );
        r.push(format!(
            "    meta mark {{ {}, {} }} accept",
            hex(k.refused),
            hex(k.unreachable)
        ));
    }
    r.extend(exclusions);
    r.push("    # Selected connections go to the proxy.".into());
    for (fam, sel) in &selectors {
        r.push(format!(
            "    {sel}meta l4proto @overload counter name bypassed return"
        ));
        r.push(format!(
            "    {sel}ct mark set {mark} tproxy {fam} to :{} meta mark set {mark} accept",
            cfg.port
        ));
    }
    r.push(
        "    # Later packets of diverted connections that no socket holds go to the listener too:
    # under a SYN flood the listener answers with SYN cookies and keeps no state, so the
    # client's ACK finds no socket and must meet the listener to complete the handshake."
            .into(),
    );
    for (nf, fam) in [("ipv4", "ip"), ("ipv6", "ip6")] {
        if selectors.iter().any(|(f, _)| *f == fam) {
            r.push(format!(
                "    meta nfproto {nf} meta l4proto tcp ct mark {mark} tproxy {fam} to :{} meta mark set {mark} accept",
                cfg.port
            ));
        }
    }
    r.push("  }".into());
    // Forwarded connections (bypassed, excluded, older) get the legs' MSS in their SYNs.
    let clamps: Vec<(&String, u32)> = [&cfg.satellite, &cfg.terrestrial]
        .iter()
        .filter_map(|l| Some((l.interface.as_ref()?, l.mss?)))
        .collect();
    if !clamps.is_empty() || cfg.strict {
        r.push("  chain forward {".into());
        r.push("    type filter hook forward priority mangle; policy accept;".into());
        if cfg.strict {
            r.push(format!(
                "    meta mark {} reject with tcp reset",
                hex(k.refused)
            ));
            r.push(format!(
                "    meta mark {} reject with icmpx host-unreachable",
                hex(k.unreachable)
            ));
        }
        for (dev, mss) in clamps {
            for dir in ["iifname", "oifname"] {
                r.push(format!(
                    "    {dir} \"{dev}\" tcp flags & (syn | rst) == syn tcp option maxseg size > {mss} tcp option maxseg size set {mss}"
                ));
            }
        }
        r.push("  }".into());
    }
    r.push("}".into());
    r.join("\n") + "\n"
}

fn run(prog: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {prog}: {e} (is it installed?)"))?;
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Starts (`on`) or stops diverting new connections to the proxy, for its connection limit.
pub fn set_overload(on: bool) -> Result<(), String> {
    let verb = if on { "add" } else { "delete" };
    run(
        "nft",
        &[verb, "element", "inet", TABLE, "overload", "{ tcp }"],
        None,
    )
    .map(|_| ())
}

/// Connections bypassed so far because the proxy was at its limit.
pub fn bypassed() -> Result<u64, String> {
    // nft's JSON output, not its text: the machine interface, stable across versions.
    let out = run(
        "nft",
        &["-j", "list", "counter", "inet", TABLE, "bypassed"],
        None,
    )?;
    bypassed_from_json(&out)
}

/// The packet count in `nft -j list counter …` output.
fn bypassed_from_json(out: &str) -> Result<u64, String> {
    let v: serde_json::Value =
        serde_json::from_str(out).map_err(|e| format!("nft -j list counter: {e}"))?;
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|o| o["counter"]["packets"].as_u64())
        .ok_or_else(|| format!("no counter in nft's answer: {out}"))
}

/// The xtables chain that queues held SYNs (nftables' own `queue` needs nft_queue, which
/// kernels often lack; the xtables NFQUEUE target is always there with iptables-nft).
const HOLD_CHAIN: &str = "SATPEP_HOLD";

/// Installs the queueing of held SYNs, IPv4 and IPv6.
fn install_hold(cfg: &ProxyConfig) -> Result<(), String> {
    let hold = format!("0x{:x}", Marks::new(cfg.mark).hold);
    let q = cfg.queue.to_string();
    for prog in ["iptables", "ip6tables"] {
        for args in [
            vec!["-w", "-t", "mangle", "-N", HOLD_CHAIN],
            vec![
                "-w",
                "-t",
                "mangle",
                "-A",
                HOLD_CHAIN,
                "-m",
                "mark",
                "--mark",
                &hold,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &q,
                "--queue-bypass",
            ],
            vec!["-w", "-t", "mangle", "-I", "PREROUTING", "-j", HOLD_CHAIN],
        ] {
            run(prog, &args, None).map_err(|e| {
                format!("proxy.handshake = \"strict\" needs iptables' NFQUEUE target: {e}")
            })?;
        }
    }
    Ok(())
}

/// Removes the queueing of held SYNs, and the xtables mangle table if it was only there for
/// it. Touches xtables only where the chain exists (iptables-nft creates tables on use).
fn cleanup_hold(found: &mut Vec<String>) {
    for (fam, prog) in [("ip", "iptables"), ("ip6", "ip6tables")] {
        if run("nft", &["list", "chain", fam, "mangle", HOLD_CHAIN], None).is_err() {
            continue;
        }
        while run(
            prog,
            &["-w", "-t", "mangle", "-D", "PREROUTING", "-j", HOLD_CHAIN],
            None,
        )
        .is_ok()
        {}
        let _ = run(prog, &["-w", "-t", "mangle", "-F", HOLD_CHAIN], None);
        let _ = run(prog, &["-w", "-t", "mangle", "-X", HOLD_CHAIN], None);
        found.push(format!("{prog} mangle chain {HOLD_CHAIN}"));
        let left = run("nft", &["list", "table", fam, "mangle"], None).unwrap_or_default();
        let rules = left.lines().map(str::trim).filter(|l| {
            !(l.is_empty()
                || l.starts_with("table ")
                || l.starts_with("chain ")
                || l.starts_with("type ")
                || *l == "}")
        });
        if rules.count() == 0 {
            let _ = run("nft", &["delete", "table", fam, "mangle"], None);
        }
    }
}

/// Removes satpep's table, policy rules and routes, whatever is left of them. Returns what
/// was found.
pub fn cleanup(mark: u32, table: u32) -> Vec<String> {
    let mut found = Vec::new();
    cleanup_hold(&mut found);
    let routes = crate::routes::restore(table);
    if routes > 0 {
        found.push(format!("initial windows on {routes} routes"));
    }
    if run("nft", &["delete", "table", "inet", TABLE], None).is_ok() {
        found.push(format!("nftables table inet {TABLE}"));
    }
    let (m, t) = (format!("0x{mark:x}"), table.to_string());
    for fam in ["-4", "-6"] {
        while run(
            "ip",
            &[fam, "rule", "del", "fwmark", &m, "lookup", &t],
            None,
        )
        .is_ok()
        {
            found.push(format!("ip {fam} rule fwmark {m} lookup {t}"));
        }
        let routes = run("ip", &[fam, "route", "show", "table", &t], None).unwrap_or_default();
        if !routes.trim().is_empty() {
            let _ = run("ip", &[fam, "route", "flush", "table", &t], None);
            found.push(format!("ip {fam} routes of table {t}"));
        }
    }
    found
}

/// Whether the proxy's nftables table is in place (Debian's `nftables.service` starts from
/// `flush ruleset`: a reload of it removes the table).
pub fn installed() -> bool {
    run("nft", &["list", "table", "inet", TABLE], None).is_ok()
}

/// Replaces the nftables table with `cfg`'s in one transaction, so that there is no moment
/// without it and live connections go on being delivered to their sockets.
pub fn replace_ruleset(cfg: &ProxyConfig) -> Result<(), String> {
    let text = format!(
        "table inet {TABLE} {{}}\ndelete table inet {TABLE}\n{}",
        ruleset(cfg)
    );
    run("nft", &["-f", "-"], Some(&text)).map(|_| ())
}

/// Installs the table, rules and routes for `cfg`, after removing any leftovers. On failure
/// nothing is left installed.
pub fn install(cfg: &ProxyConfig) -> Result<(), String> {
    cleanup(cfg.mark, cfg.table);
    let (m, t) = (format!("0x{:x}", cfg.mark), cfg.table.to_string());
    let steps: [(&str, Vec<&str>); 4] = [
        ("ip", vec!["-4", "rule", "add", "fwmark", &m, "lookup", &t]),
        (
            "ip",
            vec![
                "-4",
                "route",
                "add",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                &t,
            ],
        ),
        ("ip", vec!["-6", "rule", "add", "fwmark", &m, "lookup", &t]),
        (
            "ip",
            vec![
                "-6", "route", "add", "local", "::/0", "dev", "lo", "table", &t,
            ],
        ),
    ];
    let result = steps
        .iter()
        .try_for_each(|(p, a)| run(p, a, None).map(|_| ()))
        // The queue rule before the ruleset that marks SYNs for it: the other way round, a SYN
        // marked in between is not held, and its client is answered the fast way.
        .and_then(|_| {
            if cfg.strict {
                install_hold(cfg)
            } else {
                Ok(())
            }
        })
        .and_then(|_| run("nft", &["-f", "-"], Some(&ruleset(cfg))).map(|_| ()))
        .and_then(|_| {
            let legs: Vec<_> = [&cfg.satellite, &cfg.terrestrial]
                .iter()
                .filter_map(|l| Some((l.interface.clone()?, l.initcwnd, l.initrwnd)))
                .collect();
            crate::routes::apply(cfg.table, &legs).map(|_| ())
        });
    if result.is_err() {
        cleanup(cfg.mark, cfg.table);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyFile;

    fn rules(t: &str) -> String {
        ruleset(&ProxyFile::parse(t).unwrap().resolve().unwrap())
    }

    #[test]
    fn the_bypassed_counter_is_read_from_nfts_json() {
        let out = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"counter": {"family": "inet", "name": "bypassed", "table": "satpep", "handle": 4, "packets": 17, "bytes": 1020}}]}"#;
        assert_eq!(bypassed_from_json(out), Ok(17));
        assert!(bypassed_from_json(r#"{"nftables": []}"#).is_err());
        assert!(bypassed_from_json("table inet satpep {").is_err());
    }

    #[test]
    fn default_intercepts_everything_both_families() {
        let r = rules("");
        assert!(r.contains("socket transparent 1 meta mark set 0x5350 accept"));
        // The box's own addresses first, before anything is diverted.
        let local = r.find("fib daddr type local return").unwrap();
        assert!(local < r.find("tproxy").unwrap(), "{r}");
        for (nf, fam) in [("ipv4", "ip"), ("ipv6", "ip6")] {
            let sel = format!("meta nfproto {nf} meta l4proto tcp ct state new ");
            let bypass = format!("{sel}meta l4proto @overload counter name bypassed return");
            let divert = format!(
                "{sel}ct mark set 0x5350 tproxy {fam} to :7700 meta mark set 0x5350 accept"
            );
            let cookie = format!(
                "meta nfproto {nf} meta l4proto tcp ct mark 0x5350 tproxy {fam} to :7700 meta mark set 0x5350 accept"
            );
            assert!(r.find(&cookie) > r.find(&divert), "{r}");
            // The bypass check comes first.
            let (b, d) = (r.find(&bypass), r.find(&divert));
            assert!(b.is_some() && d.is_some() && b < d, "{r}");
        }
        assert!(!r.contains("iifname"));
    }

    #[test]
    fn selectors_and_exclusions() {
        let r = rules(
            "[intercept]\ninterfaces=['to-client']\nsources=['198.18.1.0/24']\nports=[80,443]\nexclude_ports=[22]\nexclude_destinations=['198.18.3.9','2001:2::/64']\n",
        );
        assert!(r.contains("tcp dport { 22 } return"), "{r}");
        assert!(r.contains("ip daddr { 198.18.3.9/32 } return"), "{r}");
        assert!(r.contains("ip6 daddr { 2001:2::/64 } return"), "{r}");
        assert!(r.contains("iifname { \"to-client\" } meta nfproto ipv4 ip saddr { 198.18.1.0/24 } meta l4proto tcp tcp dport { 80, 443 } ct state new ct mark set 0x5350 tproxy ip to :7700"), "{r}");
        // Sources given for IPv4 only: IPv6 is not intercepted.
        assert!(!r.contains("tproxy ip6"), "{r}");
    }
}
