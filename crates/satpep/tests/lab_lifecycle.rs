//! `satpep lab` through its command line: up, exec, stats, down, several labs at once, and
//! cleanup after crashes and failures.

mod common;

use common::*;
use std::process::Command;

fn run_ok(args: &[&str]) -> String {
    let out = satpep().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "satpep {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn up_exec_stats_down() {
    require_root();
    let n = name("cli");
    let json = run_ok(&[
        "lab", "up", &n, "--rate", "10Mbit", "--delay", "10ms", "--json",
    ]);
    let hosts: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(hosts.as_array().unwrap().len(), 5);
    assert_eq!(hosts[0]["netns"], format!("sp-{n}-client"));
    assert_eq!(hosts[4]["ipv4"][0], "198.18.3.2/24");
    assert_eq!(hosts[4]["ipv6"][0], "2001:2:0:3::2/64");
    // exec runs in the host's namespace and passes the exit status through.
    let out = run_ok(&[
        "lab", "exec", &n, "server", "--", "ip", "-br", "addr", "show", "to-gw",
    ]);
    assert!(out.contains("198.18.3.2/24"), "{out}");
    let st = satpep()
        .args(["lab", "exec", &n, "client", "--", "false"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1));
    let out = run_ok(&[
        "lab",
        "exec",
        &n,
        "client",
        "--",
        "ping",
        "-c",
        "2",
        "-i",
        "0.2",
        "198.18.3.2",
    ]);
    assert!(out.contains("2 received"), "{out}");
    let stats: serde_json::Value =
        serde_json::from_str(&run_ok(&["lab", "stats", &n, "--json"])).unwrap();
    // lab up's own check pings plus ours.
    assert!(
        stats["forward"]["delivered"].as_u64().unwrap() >= 2,
        "{stats}"
    );
    assert!(run_ok(&["lab", "list"]).lines().any(|l| l == n));
    run_ok(&["lab", "down", &n]);
    assert!(namespaces_with(&format!("sp-{n}-")).is_empty());
    assert!(!satpep_lab::topology::state_dir(&n).exists());
}

#[test]
fn labs_coexist() {
    let a = lab("coa", "[both]\nrate='10Mbit'\ndelay='1ms'\n");
    let b = lab("cob", "[both]\nrate='10Mbit'\ndelay='40ms'\n");
    let pa = satpep_lab::iperf::ping(&a, "198.18.3.2", 3, 0.1, 56).unwrap();
    let pb = satpep_lab::iperf::ping(&b, "198.18.3.2", 3, 0.1, 56).unwrap();
    assert!(pa.avg < 5.0 && pb.avg > 80.0, "{pa:?} {pb:?}");
}

#[test]
fn down_cleans_up_after_a_crashed_emulator_and_a_half_built_lab() {
    require_root();
    let n = name("crash");
    run_ok(&["lab", "up", &n, "--rate", "10Mbit", "--no-check"]);
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(satpep_lab::topology::state_dir(&n).join("state.json")).unwrap(),
    )
    .unwrap();
    let pid = state["emulator_pid"].as_u64().unwrap() as i32;
    // SAFETY: killing the emulator this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    run_ok(&["lab", "down", &n]);
    assert!(namespaces_with(&format!("sp-{n}-")).is_empty());

    // A lab whose builder died after creating one namespace and no state file.
    let st = Command::new("ip")
        .args(["netns", "add", &format!("sp-{n}-client")])
        .status()
        .unwrap();
    assert!(st.success());
    let out = satpep()
        .args(["lab", "up", &n, "--rate", "1Mbit"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    run_ok(&["lab", "down", &n]);
    assert!(namespaces_with(&format!("sp-{n}-")).is_empty());
}

#[test]
fn a_failed_up_leaves_nothing() {
    require_root();
    let n = name("fail");
    // Invalid link: rejected before anything is created.
    let out = satpep()
        .args(["lab", "up", &n, "--rate", "10Mbit", "--ber", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ber 2 is outside [0, 1)"));
    // A trace that vanishes is caught before building too.
    let out = satpep()
        .args([
            "lab",
            "up",
            &n,
            "--rate",
            "10Mbit",
            "--delay-trace",
            "/nonexistent/trace",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace"));
    assert!(namespaces_with(&format!("sp-{n}-")).is_empty());
    assert!(!satpep_lab::topology::state_dir(&n).exists());
    // Bad names and hosts are named.
    let out = satpep()
        .args(["lab", "up", "Bad/Name", "--rate", "1Mbit"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid lab name"));
    let out = satpep()
        .args(["lab", "exec", &n, "router", "--", "true"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown host 'router'"));
}
