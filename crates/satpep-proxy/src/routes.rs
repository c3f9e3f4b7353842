//! Initial congestion and receive windows on a leg's routes.
//!
//! Linux takes a new connection's initial cwnd and advertised window from its route
//! (`ip route … initcwnd N initrwnd N`), so the only way to give the satellite leg a larger
//! start is to set them on the routes out of the satellite-facing interface. satpep changes
//! those routes in the main table, records the originals, and puts them back on exit, or at
//! the next start / `--cleanup` after a crash. The metrics apply to every TCP connection this
//! host opens over those routes (on a PEP box: the proxy's); forwarded traffic is unaffected.

use std::path::PathBuf;
use std::process::Command;

/// Where the original routes of one proxy instance are kept: per network namespace (labs run
/// several proxies with the same table number) and per routing table.
fn state_file(table: u32) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let ns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0);
    PathBuf::from(format!("/run/satpep/proxy-routes-{ns}-{table}.txt"))
}

fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Words of `ip route show` output that are state, not something `ip route change` accepts.
const STATE_WORDS: [&str; 6] = [
    "linkdown",
    "dead",
    "offload",
    "trap",
    "rt_offload",
    "rt_trap",
];

/// The unicast routes of the main table out of `dev`, as `ip route change` arguments
/// (family flag first), link-local ones left out.
fn routes_of(dev: &str) -> Result<Vec<Vec<String>>, String> {
    let mut all = Vec::new();
    for fam in ["-4", "-6"] {
        let text = ip(&[fam, "route", "show", "table", "main", "dev", dev])?;
        for line in text.lines() {
            let words: Vec<String> = line
                .split_whitespace()
                .filter(|w| !STATE_WORDS.contains(w))
                .map(String::from)
                .collect();
            let Some(first) = words.first() else { continue };
            if first.starts_with("fe80:")
                || ["broadcast", "local", "multicast", "anycast", "unreachable"]
                    .contains(&first.as_str())
            {
                continue;
            }
            let mut a = vec![fam.to_string()];
            a.extend(words);
            a.extend(["dev".to_string(), dev.to_string()]);
            all.push(a);
        }
    }
    Ok(all)
}

/// Removes `initcwnd N` / `initrwnd N` pairs.
fn without_windows(route: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for w in route {
        if skip {
            skip = false;
        } else if w == "initcwnd" || w == "initrwnd" {
            skip = true;
        } else {
            out.push(w.clone());
        }
    }
    out
}

fn change(route: &[String]) -> Result<(), String> {
    let mut a: Vec<&str> = vec![&route[0], "route", "change"];
    a.extend(route[1..].iter().map(String::as_str));
    ip(&a).map(|_| ())
}

/// Sets `initcwnd`/`initrwnd` on every route out of each given interface, after restoring
/// whatever a previous run left. Returns how many routes were changed. On failure the routes
/// are put back.
pub fn apply(table: u32, legs: &[(String, Option<u32>, Option<u32>)]) -> Result<usize, String> {
    restore(table);
    let mut originals = Vec::new();
    for (dev, cwnd, rwnd) in legs {
        if cwnd.is_none() && rwnd.is_none() {
            continue;
        }
        let routes = routes_of(dev).map_err(|e| format!("routes of {dev}: {e}"))?;
        if routes.is_empty() {
            return Err(format!(
                "no routes out of interface '{dev}' to set the initial windows on"
            ));
        }
        originals.extend(routes);
    }
    if originals.is_empty() {
        return Ok(0);
    }
    let file = state_file(table);
    let _ = std::fs::create_dir_all(file.parent().unwrap());
    // Recorded before the first change, so a crash at any point can be undone.
    let text: String = originals.iter().map(|r| r.join(" ") + "\n").collect();
    std::fs::write(&file, text).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    for r in &originals {
        let dev = r.last().unwrap();
        let (_, cwnd, rwnd) = legs.iter().find(|l| &l.0 == dev).unwrap();
        let mut new = without_windows(r);
        if let Some(c) = cwnd {
            new.extend(["initcwnd".into(), c.to_string()]);
        }
        if let Some(w) = rwnd {
            new.extend(["initrwnd".into(), w.to_string()]);
        }
        if let Err(e) = change(&new) {
            restore(table);
            return Err(e);
        }
    }
    Ok(originals.len())
}

/// Puts back the routes a run changed. Returns how many.
pub fn restore(table: u32) -> usize {
    let file = state_file(table);
    let Ok(text) = std::fs::read_to_string(&file) else {
        return 0;
    };
    let mut n = 0;
    for line in text.lines() {
        let r: Vec<String> = line.split_whitespace().map(String::from).collect();
        if r.len() > 1 && change(&r).is_ok() {
            n += 1;
        }
    }
    let _ = std::fs::remove_file(&file);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_words_are_removed_in_pairs() {
        let r: Vec<String> = "-4 default via 198.18.2.2 initcwnd 10 proto static initrwnd 20 dev x"
            .split(' ')
            .map(String::from)
            .collect();
        assert_eq!(
            without_windows(&r).join(" "),
            "-4 default via 198.18.2.2 proto static dev x"
        );
    }
}
