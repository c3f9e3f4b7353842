//! End-host TCP settings applied to a lab's namespaces: sysctls (SACK, window scaling,
//! timestamps, buffers, congestion control) and route attributes (initial windows, MSS,
//! quick ACKs). Every cell sets every managed key, to its own value or to the value the
//! namespace had before the first cell, so nothing leaks from one cell into the next.

use super::spec::{HostTcp, Size};
use crate::sys::run;
use crate::topology::{ensure_cc, Host, Lab};
use std::collections::HashMap;

/// Sysctls this module manages.
const SYSCTLS: [&str; 6] = [
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_window_scaling",
    "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_congestion_control",
];

/// Route attributes this module manages (each takes one value).
pub(crate) const ROUTE_ATTRS: [&str; 4] = ["initcwnd", "initrwnd", "advmss", "quickack"];

/// Applies [`HostTcp`] settings, remembering each namespace's original values.
#[derive(Default)]
pub struct HostTuner {
    defaults: HashMap<(Host, &'static str), String>,
    applied: HashMap<Host, HostTcp>,
}

fn sysctl_get(lab: &Lab, host: Host, key: &str) -> Result<String, String> {
    lab.run_in(host, "sysctl", &["-n", key])
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn sysctl_set(lab: &Lab, host: Host, key: &str, value: &str) -> Result<(), String> {
    run(
        "ip",
        &[
            "netns",
            "exec",
            &lab.ns(host),
            "sysctl",
            "-q",
            "-w",
            &format!("{key}={value}"),
        ],
    )
    .map(|_| ())
    .map_err(|e| format!("{} {key}={value}: {e}", host.name()))
}

impl HostTuner {
    /// Makes `host`'s namespace match `want` (unset keys go back to their original values).
    pub fn apply(&mut self, lab: &Lab, host: Host, want: &HostTcp) -> Result<(), String> {
        if self.applied.get(&host) == Some(want) {
            return Ok(());
        }
        for key in SYSCTLS {
            if let std::collections::hash_map::Entry::Vacant(e) = self.defaults.entry((host, key)) {
                e.insert(sysctl_get(lab, host, key)?);
            }
        }
        let def = |k: &'static str| self.defaults[&(host, k)].clone();
        let flag = |b: Option<bool>, k: &'static str| match b {
            Some(true) => "1".to_string(),
            Some(false) => "0".to_string(),
            None => def(k),
        };
        // The host's triple with the maximum and the default (middle) value replaced where
        // the cell sets them; the default never above the maximum.
        let triple = |max: &Option<Size>,
                      default: &Option<Size>,
                      k: &'static str|
         -> Result<String, String> {
            let d = def(k);
            if max.is_none() && default.is_none() {
                return Ok(d);
            }
            let v: Vec<u64> = d.split(' ').filter_map(|x| x.parse().ok()).collect();
            let m = max
                .as_ref()
                .map(Size::bytes)
                .or(v.get(2).copied())
                .unwrap_or(6 << 20);
            let mid = default
                .as_ref()
                .map(Size::bytes)
                .or(v.get(1).copied())
                .unwrap_or(m);
            let min = v.first().copied().unwrap_or(4096);
            Ok(format!("{} {} {m}", min.min(m), mid.min(m)))
        };
        if let Some(cc) = &want.cc {
            ensure_cc(cc).map_err(|e| format!("hosts.{}.cc: {e}", host.name()))?;
            allow_cc(cc).map_err(|e| format!("hosts.{}.cc: {e}", host.name()))?;
        }
        let values = [
            flag(want.sack, SYSCTLS[0]),
            flag(want.window_scaling, SYSCTLS[1]),
            flag(want.timestamps, SYSCTLS[2]),
            triple(&want.rmem_max, &want.rmem_default, SYSCTLS[3])?,
            triple(&want.wmem_max, &want.wmem_default, SYSCTLS[4])?,
            want.cc.clone().unwrap_or_else(|| def(SYSCTLS[5])),
        ];
        for (k, v) in SYSCTLS.iter().zip(&values) {
            sysctl_set(lab, host, k, v)?;
        }
        let mut attrs = Vec::new();
        if let Some(n) = want.initcwnd {
            attrs.push(format!("initcwnd {n}"));
        }
        if let Some(n) = want.initrwnd {
            attrs.push(format!("initrwnd {n}"));
        }
        if let Some(n) = want.mss {
            attrs.push(format!("advmss {n}"));
        }
        if want.quickack == Some(true) {
            attrs.push("quickack 1".into());
        }
        set_route_attrs(lab, host, &attrs)?;
        self.applied.insert(host, want.clone());
        Ok(())
    }
}

/// The kernel lets a namespace other than the first make a congestion control its default
/// only if it is in the (global) allowed list, so `cc` is added to that list.
fn allow_cc(cc: &str) -> Result<(), String> {
    const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let now = std::fs::read_to_string(ALLOWED).map_err(|e| format!("{ALLOWED}: {e}"))?;
    if now.split_whitespace().any(|c| c == cc) {
        return Ok(());
    }
    std::fs::write(ALLOWED, format!("{} {cc}", now.trim()))
        .map_err(|e| format!("cannot add {cc} to {ALLOWED}: {e}"))
}

/// Replaces every unicast route of `host` with itself plus `attrs` (and without any attribute
/// an earlier cell set).
fn set_route_attrs(lab: &Lab, host: Host, attrs: &[String]) -> Result<(), String> {
    let ns = lab.ns(host);
    for fam in ["-4", "-6"] {
        let table = run("ip", &["-n", &ns, fam, "route", "show"])?;
        for line in table.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            // Multicast, local and link-local routes are the kernel's business.
            if words.is_empty()
                || words[0].starts_with("fe80")
                || words[0].starts_with("ff")
                || words[0] == "multicast"
            {
                continue;
            }
            let mut kept = Vec::new();
            let mut i = 0;
            while i < words.len() {
                // Drop managed attributes and those `ip route show` prints but cannot take back.
                if ROUTE_ATTRS.contains(&words[i]) {
                    i += 2;
                    continue;
                }
                if words[i] == "linkdown" {
                    i += 1;
                    continue;
                }
                kept.push(words[i].to_string());
                i += 1;
            }
            kept.extend(attrs.iter().flat_map(|a| a.split(' ').map(String::from)));
            let mut args: Vec<&str> = vec!["-n", &ns, fam, "route", "replace"];
            args.extend(kept.iter().map(String::as_str));
            run("ip", &args).map_err(|e| {
                format!("{}: ip route replace {}: {e}", host.name(), kept.join(" "))
            })?;
        }
    }
    Ok(())
}
