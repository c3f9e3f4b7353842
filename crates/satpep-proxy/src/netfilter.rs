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

/// The nftables ruleset for `cfg`, as text for `nft -f`.
pub fn ruleset(cfg: &ProxyConfig) -> String {
    let mark = format!("0x{:x}", cfg.mark);
    let mut r = vec![
        format!("table inet {TABLE} {{"),
        "  # Holds `tcp` while the proxy is at its connection limit: new connections bypass it."
            .into(),
        "  set overload { type inet_proto; }".into(),
        "  counter bypassed {}".into(),
        "  chain prerouting {".into(),
        "    type filter hook prerouting priority mangle; policy accept;".into(),
        "    # Packets for the proxy's own transparent sockets (replies to upstream connections)."
            .into(),
        format!("    meta l4proto tcp socket transparent 1 meta mark set {mark} accept"),
    ];
    let ifs = if cfg.interfaces.is_empty() {
        String::new()
    } else {
        let q: Vec<String> = cfg.interfaces.iter().map(|i| format!("\"{i}\"")).collect();
        format!("iifname {} ", set(&q))
    };
    r.push("    # Exclusions.".into());
    let (ex_s4, ex_s6) = split(&cfg.exclude_sources);
    let (ex_d4, ex_d6) = split(&cfg.exclude_destinations);
    for (fam, key, list) in [
        ("ip", "saddr", &ex_s4),
        ("ip6", "saddr", &ex_s6),
        ("ip", "daddr", &ex_d4),
        ("ip6", "daddr", &ex_d6),
    ] {
        if !list.is_empty() {
            r.push(format!("    {fam} {key} {} return", set(list)));
        }
    }
    if !cfg.exclude_ports.is_empty() {
        r.push(format!("    tcp dport {} return", set(&cfg.exclude_ports)));
    }
    let ports = if cfg.ports.is_empty() {
        String::new()
    } else {
        format!("tcp dport {} ", set(&cfg.ports))
    };
    let (s4, s6) = split(&cfg.sources);
    let (d4, d6) = split(&cfg.destinations);
    r.push("    # Selected connections go to the proxy.".into());
    for (fam, s, d) in [("ip", &s4, &d4), ("ip6", &s6, &d6)] {
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
        let sel = format!("{ifs}{m}meta l4proto tcp {ports}ct state new ");
        r.push(format!(
            "    {sel}meta l4proto @overload counter name bypassed return"
        ));
        r.push(format!(
            "    {sel}tproxy {fam} to :{} meta mark set {mark} accept",
            cfg.port
        ));
    }
    r.push("  }".into());
    // Forwarded connections (bypassed, excluded, older) get the legs' MSS in their SYNs.
    let clamps: Vec<(&String, u32)> = [&cfg.satellite, &cfg.terrestrial]
        .iter()
        .filter_map(|l| Some((l.interface.as_ref()?, l.mss?)))
        .collect();
    if !clamps.is_empty() {
        r.push("  chain forward {".into());
        r.push("    type filter hook forward priority mangle; policy accept;".into());
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
    let out = run("nft", &["list", "counter", "inet", TABLE, "bypassed"], None)?;
    out.split("packets ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| "cannot read the bypassed counter".into())
}

/// Removes satpep's table, policy rules and routes, whatever is left of them. Returns what
/// was found.
pub fn cleanup(mark: u32, table: u32) -> Vec<String> {
    let mut found = Vec::new();
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
    fn default_intercepts_everything_both_families() {
        let r = rules("");
        assert!(r.contains("socket transparent 1 meta mark set 0x5350 accept"));
        for (nf, fam) in [("ipv4", "ip"), ("ipv6", "ip6")] {
            let sel = format!("meta nfproto {nf} meta l4proto tcp ct state new ");
            let bypass = format!("{sel}meta l4proto @overload counter name bypassed return");
            let divert = format!("{sel}tproxy {fam} to :7700 meta mark set 0x5350 accept");
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
        assert!(r.contains("iifname { \"to-client\" } meta nfproto ipv4 ip saddr { 198.18.1.0/24 } meta l4proto tcp tcp dport { 80, 443 } ct state new tproxy ip to :7700"), "{r}");
        // Sources given for IPv4 only: IPv6 is not intercepted.
        assert!(!r.contains("tproxy ip6"), "{r}");
    }
}
