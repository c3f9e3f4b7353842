//! The load preset, small: 1 000 concurrent connections end to end, split and tunnelled,
//! every one echoed and carrying 16 KB intact, and the proxies' descriptors back to where
//! they started once they close; run through the one experiment engine.

mod common;
use common::*;

#[test]
fn a_thousand_concurrent_connections_work_and_are_released() {
    require_root();
    let out_dir = std::env::temp_dir().join(format!("satpep-load-{}", std::process::id()));
    let out = satpep()
        .args([
            "lab", "run", "load", "--quick", "--json", "--fresh", "--out",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "load preset failed:\n{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells = j["cells"].as_array().unwrap();
    let modes: Vec<&str> = cells
        .iter()
        .map(|c| c["config"].as_str().unwrap())
        .collect();
    assert_eq!(
        modes,
        [
            "end-to-end",
            "split",
            "tunnel",
            "end-to-end",
            "split, 16 workers"
        ]
    );
    for (i, c) in cells.iter().enumerate() {
        let mode = c["config"].as_str().unwrap();
        // The scale part: 2 000 connections, the proxies in 16 processes each.
        let n = if i < 3 { 1000 } else { 2000 };
        assert_eq!(c["failures"], 0, "{mode}: {c}");
        let r = &c["connections"];
        for k in ["connected", "accepted", "echoed", "busy_intact"] {
            assert_eq!(r[k], n, "{mode}: {k}: {r}");
        }
        assert!(r["drain_s"].as_f64().is_some(), "{mode}: not released: {r}");
        // The main metric is the connection rate.
        let rate = c["metric"]["mean"].as_f64().unwrap();
        assert_eq!(rate, r["connects_per_s"].as_f64().unwrap());
        assert!(rate > 10.0, "{mode}: {rate} connections/s");
        if mode != "end-to-end" {
            let fds = r["fds"].as_array().unwrap();
            // Each split connection holds one socket per leg in each proxy, a tunnel flow
            // one in each; nothing more while idle (no duplicates, no idle pipes).
            // A connection the proxies let bypass them (their admission control counts the
            // machine's kernel TCP memory, which another test may still hold) has none.
            let per = if mode.starts_with("split") { 4 } else { 2 };
            let bypassed = r["bypassed"].as_u64().unwrap();
            assert!(bypassed < 100, "{mode}: {bypassed} bypassed: {r}");
            let idle = fds[1].as_u64().unwrap() - fds[0].as_u64().unwrap();
            assert!(
                idle >= per * (n - bypassed) && idle <= per * n + 50,
                "{mode}: {idle} descriptors for {n} idle connections, {bypassed} bypassed: {r}"
            );
            assert_eq!(
                fds[3], fds[0],
                "{mode}: descriptors not back to the start: {r}"
            );
            // Issue 43's bound, 8 KB of each proxy's memory per idle connection (the figure
            // is both proxies'): a tunnel flow held 29 KB while its TCP-to-stream direction
            // kept a 64 KiB buffer while idle.
            // (At the scale part's quick size, 2 000 connections over 32 processes, each
            // process's first heap growth is still most of the figure.)
            let per_idle = r["rss_per_idle"].as_f64().unwrap();
            assert!(
                i >= 3 || per_idle <= 16_384.0,
                "{mode}: {per_idle:.0} bytes of the proxies' memory per idle connection: {r}"
            );
        }
    }
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("the proxies' descriptors: start / all idle / after closing"));
    let _ = std::fs::remove_dir_all(&out_dir);
}
