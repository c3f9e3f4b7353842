//! `satpep link` on its own: bad input is refused with a message naming it and changes
//! nothing; offloads are turned off while running and restored after; counters are served
//! while running and printed on exit.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn fails_with(args: &[&str], needle: &str) {
    let out = satpep().arg("link").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "satpep link {args:?} succeeded");
    assert!(
        err.contains(needle),
        "satpep link {args:?}: '{err}' lacks '{needle}'"
    );
}

#[test]
fn bad_values_are_named() {
    fails_with(
        &["--check", "--rate", "0"],
        "forward rate 0 bit/s: must be between",
    );
    fails_with(&["--check", "--rate", "500Gbit"], "must be between");
    fails_with(&["--check", "--rate", "10MB/s"], "bits per second");
    fails_with(
        &["--check", "--rate", "1Mbit", "--ber", "1"],
        "forward ber 1 is outside [0, 1)",
    );
    fails_with(
        &["--check", "--rate", "1Mbit", "--ret-ber", "-0.5"],
        "return ber -0.5",
    );
    fails_with(
        &["--check", "--rate", "1Mbit", "--per", "1.5"],
        "per 1.5 is outside",
    );
    fails_with(
        &["--check", "--rate", "1Mbit", "--delay", "280"],
        "needs a unit",
    );
    fails_with(&["--check", "--rate", "1Mbit", "--queue", "0"], "queue");
    fails_with(&["--check", "--preset", "mars"], "unknown preset 'mars'");
    fails_with(&["--check", "--rate", "1Mbit", "--gilbert", "p=0.1"], "r=");
    // Any loss process by its name.
    fails_with(
        &["--check", "--rate", "1Mbit", "--loss", "gilbert:p=0.1"],
        "r=",
    );
    fails_with(
        &["--check", "--rate", "1Mbit", "--loss", "fade:0.1"],
        "unknown loss process 'fade' (known: ber, per, gilbert)",
    );
    fails_with(
        &["--check", "--rate", "1Mbit", "--loss", "0.1"],
        "NAME:SPEC",
    );
    fails_with(
        &["--check", "--rate", "1Mbit", "--ret-loss", "per:2"],
        "return per 2 is outside [0, 1)",
    );
    fails_with(&["--check", "--rate", "1Mbit", "--down", "5s"], "FROM..TO");
    fails_with(
        &["--check", "--rate", "1Mbit", "--outage-every", "10s"],
        "outage",
    );
    fails_with(&["--check"], "no forward rate");
}

#[test]
fn malformed_traces_name_file_and_line() {
    let dir = std::env::temp_dir().join(format!("satpep-badtrace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = dir.join("bad.trace");
    std::fs::write(&t, "0 10Mbit\n1 fast\n").unwrap();
    let p = t.to_str().unwrap();
    fails_with(&["--check", "--rate-trace", p], "line 2");
    std::fs::write(&t, "0 10Mbit\n1 0\n").unwrap();
    fails_with(&["--check", "--rate-trace", p], "not positive");
    std::fs::write(&t, "2 10ms\n1 20ms\n").unwrap();
    fails_with(
        &["--check", "--rate", "1Mbit", "--delay-trace", p],
        "backwards",
    );
    fails_with(
        &[
            "--check",
            "--rate",
            "1Mbit",
            "--delay-trace",
            "/no/such/file",
        ],
        "/no/such/file",
    );
    let cfg = dir.join("link.toml");
    std::fs::write(&cfg, "[forward]\nrat = '1Mbit'\n").unwrap();
    fails_with(&["--check", "--config", cfg.to_str().unwrap()], "rat");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_prints_the_resolved_link() {
    let out = satpep()
        .args([
            "link",
            "--check",
            "--preset",
            "urke2011",
            "--ret-rate",
            "2Mbit",
            "--fwd-ber",
            "1e-6",
            "--ret-loss",
            "gilbert:p=0.01,r=0.5",
            "--loss",
            "per:0.001",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("forward: 500 kbit/s, delay 264 ms, queue 33000 B, BER 1e-6, PER 0.001\n"),
        "{s}"
    );
    assert!(
        s.contains(
            "return:  2 Mbit/s, delay 264 ms, queue 33000 B, PER 0.001, \
             Gilbert-Elliott p=0.01 r=0.5 loss 0/1\n"
        ),
        "{s}"
    );
}

/// A namespace with two veth pairs: the emulator bridges a0 and b0.
struct Ns(String);
impl Ns {
    fn new(tag: &str) -> Ns {
        require_root();
        let n = format!("sp-{}", name(tag));
        let ok = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success());
        ok(&["netns", "add", &n]);
        let ns = Ns(n);
        ok(&[
            "-n", &ns.0, "link", "add", "a0", "type", "veth", "peer", "name", "a1",
        ]);
        ok(&[
            "-n", &ns.0, "link", "add", "b0", "type", "veth", "peer", "name", "b1",
        ]);
        for d in ["a0", "a1", "b0", "b1"] {
            ok(&["-n", &ns.0, "link", "set", d, "up"]);
        }
        ns
    }
    /// `satpep link ARGS…` inside this namespace.
    fn link_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0, bin(), "link"]).args(args);
        c
    }
    fn gro(&self, dev: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "ethtool", "-k", dev])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("generic-receive-offload"))
            .unwrap_or("")
            .to_string()
    }
    fn set_gro_on(&self, dev: &str) {
        let st = Command::new("ip")
            .args(["netns", "exec", &self.0, "ethtool", "-K", dev, "gro", "on"])
            .status()
            .unwrap();
        assert!(st.success());
    }
}
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn unknown_interface_is_named_and_nothing_changes() {
    let ns = Ns::new("lnk1");
    ns.set_gro_on("a0");
    let out = ns
        .link_cmd(&["--terminal", "a0", "--gateway", "nope0", "--rate", "1Mbit"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'nope0' does not exist"), "{err}");
    assert!(
        ns.gro("a0").ends_with("on"),
        "a0 was changed: {}",
        ns.gro("a0")
    );
    let out = ns
        .link_cmd(&["--terminal", "a0", "--gateway", "a0", "--rate", "1Mbit"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("two interfaces"));
}

#[test]
fn offloads_off_while_running_restored_after_and_counters_served() {
    let ns = Ns::new("lnk2");
    ns.set_gro_on("a0");
    ns.set_gro_on("b0");
    let sock = std::env::temp_dir().join(format!("satpep-ctl-{}.sock", std::process::id()));
    let mut child = ns
        .link_cmd(&[
            "--terminal",
            "a0",
            "--gateway",
            "b0",
            "--rate",
            "1Mbit",
            "--json",
            "--control",
        ])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "control socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(ns.gro("a0").ends_with("off"), "{}", ns.gro("a0"));
    assert!(ns.gro("b0").ends_with("off"), "{}", ns.gro("b0"));
    let out = satpep()
        .args(["link", "stats", sock.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let live: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(live["uptime_s"].as_f64().unwrap() > 0.0, "{live}");
    assert!(live["forward"]["frames_in"].is_u64());
    // SAFETY: signalling our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "emulator ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fin: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(fin["return"]["dropped_queue"].is_u64(), "{fin}");
    assert!(
        ns.gro("a0").ends_with("on"),
        "GRO not restored: {}",
        ns.gro("a0")
    );
    assert!(
        ns.gro("b0").ends_with("on"),
        "GRO not restored: {}",
        ns.gro("b0")
    );
    assert!(!sock.exists(), "control socket left behind");
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        vec!["--help"],
        vec!["link", "--help"],
        vec!["lab", "--help"],
        vec!["lab", "up", "--help"],
        vec!["lab", "run", "--help"],
        vec!["proxy", "--help"],
        vec!["status", "--help"],
    ] {
        let out = satpep().args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).len() > 300,
            "{args:?} help too thin"
        );
    }
    // The long descriptions reach --help (a variant doc comment once hid them).
    for (cmd, phrase) in [
        ("link", "Dummynet"),
        ("lab", "five namespaces"),
        ("proxy", "TPROXY"),
        ("status", "TCP_INFO"),
    ] {
        let out = satpep().args([cmd, "--help"]).output().unwrap();
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(phrase),
            "{cmd} --help lacks its long text"
        );
    }
    let out = satpep().args(["link", "--help"]).output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--fwd-rate",
        "--ret-delay",
        "--gilbert",
        "--fwd-loss",
        "--outage-every",
        "--rate-trace",
        "--seed",
    ] {
        assert!(s.contains(flag), "link --help lacks {flag}");
    }
}
