//! The load benchmark, small: 1 000 concurrent connections end to end, split and tunnelled,
//! every one echoed and carrying 16 KB intact, and the proxies' descriptors back to where
//! they started once they close.

mod common;
use common::*;

#[test]
fn a_thousand_concurrent_connections_work_and_are_released() {
    require_root();
    let out = satpep()
        .args(["lab", "run", "load", "--quick", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "load benchmark failed:\n{err}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["end-to-end", "split", "tunnel"]);
    for r in rows {
        let mode = r["mode"].as_str().unwrap();
        for k in ["connected", "accepted", "echoed", "busy_intact"] {
            assert_eq!(r[k], 1000, "{mode}: {k}: {r}");
        }
        assert!(r["drain_s"].as_f64().is_some(), "{mode}: not released: {r}");
        if mode != "end-to-end" {
            let fds = r["fds"].as_array().unwrap();
            // Each split connection holds one socket per leg in each proxy, a tunnel flow
            // one in each; nothing more while idle (no duplicates, no idle pipes).
            let per = if mode == "split" { 4 } else { 2 };
            let idle = fds[1].as_u64().unwrap() - fds[0].as_u64().unwrap();
            assert!(
                idle >= per * 1000 && idle <= per * 1000 + 50,
                "{mode}: {idle} descriptors for 1000 idle connections"
            );
            assert_eq!(
                fds[3], fds[0],
                "{mode}: descriptors not back to the start: {r}"
            );
        }
    }
}
