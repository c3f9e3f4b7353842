//! The fault matrix, quick form, through the one experiment engine: every fault on a checked
//! transfer through the split proxies and the tunnel; nothing corrupted, nothing silently
//! truncated, nothing hung.

mod common;
use common::*;

#[test]
fn the_quick_fault_matrix_loses_nothing_and_hangs_nowhere() {
    require_root();
    let out_dir = std::env::temp_dir().join(format!("satpep-faults-{}", std::process::id()));
    let child = satpep()
        .args([
            "lab", "run", "faults", "--quick", "--json", "--fresh", "--out",
        ])
        .arg(&out_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fault matrix failed:\n{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells = j["cells"].as_array().unwrap();
    // 10 faults in each of split and tunnel, plus the tunnel peer's restart and crash.
    assert_eq!(cells.len(), 22, "{err}");
    let points: std::collections::BTreeSet<String> =
        cells.iter().map(|c| c["point"].to_string()).collect();
    assert_eq!(points.len(), 12, "{points:?}");
    for c in cells {
        let (point, mode) = (c["point"].to_string(), c["config"].as_str().unwrap());
        assert_eq!(c["failures"], 0, "{point} {mode}: {c}");
        let r = &c["fault"];
        assert_eq!(
            r["problems"].as_array().unwrap().len(),
            0,
            "{point} {mode}: {r}"
        );
        assert!(r["client"]["corrupt_at"].is_null() && r["server"]["corrupt_at"].is_null());
        let client = r["client"]["end"].as_str().unwrap();
        let server = r["server"]["end"].as_str().unwrap();
        let case = point.trim_matches(|ch| ch == '[' || ch == ']' || ch == '"');
        match case {
            // A crashed proxy must not end a cut download with a clean FIN.
            "proxy-restart" | "proxy-crash" | "tunnel-peer-restart" | "tunnel-peer-crash" => {
                assert_eq!((client, server), ("reset", "reset"), "{case} {mode}");
                let after = r["client_end_after_fault_s"].as_f64().unwrap();
                assert!(after < 5.0, "{case} {mode}: the client waited {after} s");
                assert!(r["after"].as_str().unwrap().contains("new flow ok"), "{r}");
            }
            "baseline" | "half-close-client-first" | "half-close-server-first" => {
                assert_eq!((client, server), ("fin", "fin"), "{case} {mode}");
                assert_eq!(r["client"]["received"], r["server_meant"]);
                assert_eq!(r["server"]["received"], r["client_meant"]);
            }
            _ => {}
        }
    }
    // No lab left behind.
    assert!(namespaces_with(&format!("sp-sc-{pid}-")).is_empty());
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(report.contains("verdict: pass, or why not"));
    let _ = std::fs::remove_dir_all(&out_dir);
}
