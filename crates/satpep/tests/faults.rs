//! The fault matrix, quick form: every fault on a checked transfer through the split proxies
//! and the tunnel; nothing corrupted, nothing silently truncated, nothing hung.

mod common;
use common::*;

#[test]
fn the_quick_fault_matrix_loses_nothing_and_hangs_nowhere() {
    require_root();
    let child = satpep()
        .args(["lab", "run", "faults", "--quick", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fault matrix failed:\n{err}");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    // 10 faults in each mode, plus the tunnel peer's restart and crash.
    assert_eq!(rows.len(), 22, "{err}");
    for r in rows {
        let (fault, mode) = (r["fault"].as_str().unwrap(), r["mode"].as_str().unwrap());
        assert_eq!(
            r["problems"].as_array().unwrap().len(),
            0,
            "{fault} {mode}: {r}"
        );
        assert!(r["client"]["corrupt_at"].is_null() && r["server"]["corrupt_at"].is_null());
        let client = r["client"]["end"].as_str().unwrap();
        let server = r["server"]["end"].as_str().unwrap();
        match fault {
            // A crashed proxy must not end a cut download with a clean FIN.
            "proxy crash" | "proxy restart" | "tunnel peer crash" | "tunnel peer restart" => {
                assert_eq!((client, server), ("reset", "reset"), "{fault} {mode}");
                let after = r["client_end_after_fault_s"].as_f64().unwrap();
                assert!(after < 5.0, "{fault} {mode}: the client waited {after} s");
                assert!(r["after"].as_str().unwrap().contains("new flow ok"), "{r}");
            }
            "baseline" | "half-close, client first" | "half-close, server first" => {
                assert_eq!((client, server), ("fin", "fin"), "{fault} {mode}");
                assert_eq!(r["client"]["received"], r["server_meant"]);
                assert_eq!(r["server"]["received"], r["client_meant"]);
            }
            _ => {}
        }
    }
    // No lab left behind.
    assert!(namespaces_with(&format!("sp-flt-{pid}-")).is_empty());
}
