//! `satpep proxy --check`: what a start would refuse or quietly degrade, found without
//! starting (nothing is intercepted, no socket listens). A start refuses the same errors.

use crate::config::{ProxyConfig, Role};
use crate::sockets::FdBudget;
use std::io::Write;
use std::process::{Command, Stdio};

/// The host's TCP buffer settings satpep needs on a long path (`net.ipv4.tcp_rmem` and
/// `tcp_wmem`: min, default, max bytes), applied as `sysctl -w KEY="VALUE"`.
///
/// - The maxima bound what autotuning gives one socket: with the kernel's 4 MiB send maximum
///   a leg over a 50 Mbit/s, 560 ms GEO path ran at 35.5 Mbit/s (47.2 with 128 MiB).
/// - The receive default is where autotuning starts. It grows a buffer by what reached the
///   application in the last RTT, so on a long lossy path every hole in the data holds the
///   window back for an RTT: from the kernel's 128 KiB, the satellite leg's window set the
///   pace of a `satpep_sat` sender for 2.2 s of its 5 s start (GEO, BER 1e-6), 0.6 s from
///   4 MiB (docs/proxy.md, "Host settings"). It is a limit, not an allocation: a socket
///   holds that much only when its reader falls behind.
pub const HOST_SYSCTLS: [(&str, [u64; 3]); 2] = [
    ("net.ipv4.tcp_rmem", [4096, 4 << 20, 128 << 20]),
    ("net.ipv4.tcp_wmem", [4096, 65536, 128 << 20]),
];

/// A [`HOST_SYSCTLS`] value as sysctl writes and reads it ("min default max").
pub fn sysctl_triple(v: [u64; 3]) -> String {
    format!("{} {} {}", v[0], v[1], v[2])
}

/// Where the host's settings fall short of [`HOST_SYSCTLS`], read from `/proc/sys` (nothing
/// if they cannot be read): one warning per setting, with the command that fixes it. None
/// for a tunnel, which carries the satellite hop over UDP with buffers of its own.
pub fn host_shortfall(cfg: &ProxyConfig) -> Vec<String> {
    let mut out = Vec::new();
    if cfg.tunnel.is_some() {
        return out;
    }
    for (key, want) in HOST_SYSCTLS {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let Some(have) = std::fs::read_to_string(&path).ok().and_then(|s| {
            let v: Vec<u64> = s
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            <[u64; 3]>::try_from(v).ok()
        }) else {
            continue;
        };
        let low: Vec<&str> = [(1, "default"), (2, "maximum")]
            .into_iter()
            .filter(|&(i, _)| have[i] < want[i])
            .map(|(_, n)| n)
            .collect();
        if !low.is_empty() {
            out.push(format!(
                "{key} = \"{}\": its {} {} below satpep's, so TCP legs over a long path are held back by their windows (sysctl -w {key}=\"{}\"; docs/proxy.md, \"Host settings\")",
                sysctl_triple(have),
                low.join(" and "),
                if low.len() > 1 { "are" } else { "is" },
                sysctl_triple([have[0], have[1].max(want[1]), have[2].max(want[2])])
            ));
        }
    }
    out
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// A start would fail.
    Error,
    /// A start would run, but not as configured (fewer connections, copies instead of
    /// splice, traffic not forwarded).
    Warning,
}

/// One thing the check found, naming the config key or the system setting at fault.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong and what to do about it.
    pub message: String,
}

/// Raises the descriptor limit as a start would and says what fits (see
/// [`crate::sockets::fd_budget`]): a split connection holds two sockets, a tunnel flow one.
pub fn fd_budget(cfg: &ProxyConfig) -> FdBudget {
    crate::sockets::fd_budget(
        cfg.connections_per_process(),
        if cfg.tunnel.is_some() { 1 } else { 2 },
    )
}

/// What the descriptor budget leaves out of the configuration: connections past it bypass,
/// and with splice, directions past the pipes copy. Connections come first.
pub fn budget_shortfall(cfg: &ProxyConfig, b: &FdBudget) -> Vec<String> {
    let share = cfg.connections_per_process();
    let all = u64::from(share) * 6 + 1280;
    let mut v = Vec::new();
    if b.connections < u64::from(share) {
        let what = if cfg.workers > 1 {
            format!(
                "a process's share of proxy.max_connections = {} among proxy.workers = {} ({share})",
                cfg.max_connections, cfg.workers
            )
        } else {
            format!("proxy.max_connections = {}", cfg.max_connections)
        };
        v.push(format!(
            "the descriptor limit ({}) fits {} connections, not {what}: past them new connections bypass; raise the hard limit (LimitNOFILE) to {all} for all, or proxy.workers",
            b.limit, b.connections
        ));
    }
    if cfg.splice && b.pipes < 2 * b.connections {
        v.push(format!(
            "proxy.relay = \"splice\": the descriptor limit ({}) leaves kernel pipes for {} of {} connections, the rest copy (satpep_connections_copied_total); raise the hard limit (LimitNOFILE) to {all} to splice all",
            b.limit,
            b.pipes / 2,
            b.connections
        ));
    }
    v
}

/// The congestion controls the configuration names, each with the key that names it.
pub fn wanted_congestion(cfg: &ProxyConfig) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        (&cfg.satellite, "satellite"),
        (&cfg.terrestrial, "terrestrial"),
    ]
    .iter()
    .filter_map(|(l, side)| Some((l.congestion.clone()?, format!("{side}.congestion"))))
    .collect();
    if let Some(a) = &cfg.adaptive {
        for (class, cc) in &a.policy {
            if !cc.is_empty() {
                v.push((cc.clone(), format!("adaptive.policy.{}", class.name())));
            }
        }
    }
    v
}

/// Everything a start refuses before it installs anything, each naming the key at fault:
/// Fast Open the host does not allow, interfaces that do not exist, strict handshakes
/// without iptables. `--check` reports the same list, so it never passes what a start
/// refuses.
pub fn start_refusals(cfg: &ProxyConfig) -> Vec<String> {
    let mut v = fastopen_refusals(cfg);
    v.extend(interface_refusals(cfg, interface_exists));
    v.extend(strict_refusals(cfg, on_path));
    v
}

/// Whether this network namespace has an interface `name`. Asked of the kernel through a
/// socket (if_nametoindex), not read from /sys/class/net, which shows the namespace that
/// mounted sysfs: a unit with NetworkNamespacePath= (or `nsenter --net`) keeps the host's.
pub fn interface_exists(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a NUL-terminated string that outlives the call.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// The interfaces of this network namespace, sorted (if_nameindex, for the same reason).
fn interface_names() -> Vec<String> {
    let mut names = Vec::new();
    // SAFETY: if_nameindex returns an array ended by a zero entry, or null; it is freed once
    // with if_freenameindex after its names were copied.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return names;
        }
        let mut p = list;
        while (*p).if_index != 0 && !(*p).if_name.is_null() {
            names.push(
                std::ffi::CStr::from_ptr((*p).if_name)
                    .to_string_lossy()
                    .into_owned(),
            );
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    names.sort();
    names
}

/// Interfaces the configuration names that `exists` does not know. An interception
/// interface that is not there catches nothing, silently; a leg's is where its routes go.
pub fn interface_refusals(cfg: &ProxyConfig, exists: impl Fn(&str) -> bool) -> Vec<String> {
    let known = || interface_names().join(" ");
    let mut v = Vec::new();
    for i in cfg.interfaces.iter().filter(|i| !exists(i)) {
        v.push(format!(
            "intercept.interfaces: '{i}' is not an interface of this host (it has: {}): nothing arriving on it would be intercepted",
            known()
        ));
    }
    for (leg, key) in [
        (&cfg.satellite, "satellite"),
        (&cfg.terrestrial, "terrestrial"),
    ] {
        if let Some(i) = leg.interface.as_ref().filter(|i| !exists(i)) {
            v.push(format!(
                "{key}.interface: '{i}' is not an interface of this host (it has: {})",
                known()
            ));
        }
    }
    v
}

/// Strict handshakes hold SYNs with iptables' NFQUEUE target (both families): without the
/// programs a start fails half-way. A gateway holds nothing.
pub fn strict_refusals(cfg: &ProxyConfig, found: impl Fn(&str) -> bool) -> Vec<String> {
    let gateway = cfg.tunnel.as_ref().is_some_and(|t| t.role == Role::Gateway);
    if !cfg.strict || gateway {
        return Vec::new();
    }
    ["iptables", "ip6tables"]
        .into_iter()
        .filter(|p| !found(p))
        .map(|p| {
            format!(
                "proxy.handshake = \"strict\" holds SYNs with {p}'s NFQUEUE target, and {p} is not installed (apt install iptables), or use handshake = \"fast\""
            )
        })
        .collect()
}

/// Whether `prog` is an executable file in a directory of `PATH`.
fn on_path(prog: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p).any(|d| {
                std::fs::metadata(d.join(prog))
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
        })
        .unwrap_or(false)
}

/// What a start refuses about Fast Open: a leg that asks for it where the host does not
/// allow it. The leg toward the clients listens, the other connects.
pub fn fastopen_refusals(cfg: &ProxyConfig) -> Vec<String> {
    let (client, server) = crate::sockets::fastopen_enabled();
    let (sat, ter) = (
        (&cfg.satellite, "satellite"),
        (&cfg.terrestrial, "terrestrial"),
    );
    let (down, up) = if cfg.satellite_upstream {
        (ter, sat)
    } else {
        (sat, ter)
    };
    let mut v = Vec::new();
    if down.0.fastopen && !server {
        v.push(format!(
            "{}.fastopen: this host refuses Fast Open on listeners; allow it with sysctl -w net.ipv4.tcp_fastopen=3",
            down.1
        ));
    }
    if up.0.fastopen && !client {
        v.push(format!(
            "{}.fastopen: this host refuses Fast Open on connecting sockets; allow it with sysctl -w net.ipv4.tcp_fastopen=3",
            up.1
        ));
    }
    v
}

/// Runs every check. The proxy's own controllers are loaded and unloaded again to prove the
/// kernel takes them; the ruleset goes through `nft --check`.
pub fn preflight(cfg: &ProxyConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut error = |m: String| {
        out.push(Finding {
            severity: Severity::Error,
            message: m,
        })
    };
    for e in start_refusals(cfg) {
        error(e);
    }
    // Congestion controls: the kernel's, or satpep's own (loaded for the check).
    let available = satpep_cc::available();
    for (cc, key) in wanted_congestion(cfg) {
        if available.contains(&cc) || crate::server::try_congestion(&cc).is_ok() {
            continue;
        }
        if satpep_cc::BUNDLED.iter().any(|b| b.name == cc) {
            if let Err(e) = satpep_cc::load(&cc, &satpep_cc::Options::default()) {
                error(format!("{key}: {e}"));
            }
            continue;
        }
        let ours: Vec<&str> = satpep_cc::BUNDLED.iter().map(|b| b.name).collect();
        error(format!(
            "{key}: '{cc}' is not a congestion control of this kernel (it has: {}; satpep brings: {})",
            available.join(" "),
            ours.join(" ")
        ));
    }
    // The tunnel's certificates: readable, chained to a CA file, the key matching the
    // certificate (rustls compares their public keys); a gateway's revocation list readable.
    if let Some(t) = &cfg.tunnel {
        let tls = satpep_tunnel::keys::Credentials::load(&t.ca, &t.cert, &t.key).and_then(|c| {
            match t.role {
                Role::Gateway => t
                    .admission()
                    .and_then(|a| c.server_tls(&std::sync::Arc::new(a)).map(|_| ())),
                Role::Terminal => c.client_tls().map(|_| ()),
            }
        });
        if let Err(e) = tls {
            error(e);
        }
    }
    // The ruleset, as nftables would take it.
    if let Err(e) = nft_check(&crate::netfilter::ruleset(cfg)) {
        error(e);
    }
    let mut warning = |m: String| {
        out.push(Finding {
            severity: Severity::Warning,
            message: m,
        })
    };
    for w in budget_shortfall(cfg, &fd_budget(cfg)) {
        warning(w);
    }
    if let Some(w) = cfg.connections_exposed() {
        warning(w);
    }
    for w in host_shortfall(cfg) {
        warning(w);
    }
    // A PEP sits in the path: what it does not intercept (UDP, other ports, bypassed
    // connections) it must route.
    for (path, v) in [
        ("net/ipv4/ip_forward", "IPv4"),
        ("net/ipv6/conf/all/forwarding", "IPv6"),
    ] {
        let on = std::fs::read_to_string(format!("/proc/sys/{path}"))
            .map(|s| s.trim() != "0")
            .unwrap_or(true);
        if !on {
            let key = path.replace('/', ".");
            warning(format!(
                "{key} = 0: this host does not forward {v}, so only intercepted connections cross it (sysctl -w {key}=1)"
            ));
        }
    }
    out
}

/// `nft --check` of `ruleset`: the error names what nftables refused.
fn nft_check(ruleset: &str) -> Result<(), String> {
    let mut child = Command::new("nft")
        .args(["--check", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft (is nftables installed?): {e}"))?;
    // nft reads the whole file before it answers, so one write then wait cannot deadlock.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(ruleset.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nftables refuses the ruleset (nft --check): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyFile;

    fn cfg(t: &str) -> ProxyConfig {
        ProxyFile::parse(t).unwrap().resolve().unwrap()
    }

    #[test]
    fn interfaces_that_are_not_there_are_refused_by_key() {
        let c = cfg("[intercept]\ninterfaces = ['lan0', 'ghost0']\n[satellite]\ninterface = 'sat0'\n[terrestrial]\ninterface = 'ghost1'\n");
        let have = |n: &str| n == "lan0" || n == "sat0";
        let v = interface_refusals(&c, have);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].starts_with("intercept.interfaces: 'ghost0'"), "{v:?}");
        assert!(v[1].starts_with("terrestrial.interface: 'ghost1'"), "{v:?}");
        assert!(interface_refusals(&c, |_| true).is_empty());
        // No interface named: nothing to refuse.
        assert!(interface_refusals(&cfg(""), |_| false).is_empty());
    }

    #[test]
    fn strict_handshakes_need_iptables_except_at_a_gateway() {
        let strict = cfg("[proxy]\nhandshake = 'strict'\n");
        let v = strict_refusals(&strict, |p| p == "iptables");
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("ip6tables") && v[0].contains("proxy.handshake"),
            "{v:?}"
        );
        assert!(strict_refusals(&strict, |_| true).is_empty());
        assert!(strict_refusals(&cfg(""), |_| false).is_empty());
        let gw = cfg("[proxy]\nhandshake = 'strict'\n[tunnel]\nrole = 'gateway'\nca = 'ca.pem'\ncert = 'g.pem'\nkey = 'g.key'\n");
        assert!(strict_refusals(&gw, |_| false).is_empty());
    }
}
