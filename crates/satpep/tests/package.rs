//! The `.deb` as an operator gets it: built by scripts/package.sh, installed with dpkg, its
//! unit verified, the service run the way its unit's Exec lines say (systemd is not PID 1
//! here: the test is the service manager), a download split through it, reloaded mid-transfer
//! and stopped with a drain, then purged. Every system call and socket family the service
//! makes is checked against the unit's sandbox.

mod common;

use common::*;
use satpep_lab::{Host, Lab};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const UNIT: &str = "/usr/lib/systemd/system/satpep-proxy.service";
const CONFIG: &str = "/etc/satpep/proxy.toml";

/// Runs `cmd`, panicking with its output unless it succeeds; its stdout.
fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Purges the package when dropped, so a failing test leaves nothing installed.
struct Installed;
impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "satpep"]).output();
    }
}

/// Puts back, when dropped, an `/etc/satpep` that was there before the test (a developer's
/// own configuration), moved aside to `.0`.
struct Restore(Option<PathBuf>);
impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = std::fs::remove_dir_all("/etc/satpep");
            let _ = Command::new("mv").arg(saved).arg("/etc/satpep").status();
        }
    }
}

/// The unit's `KEY=` lines, in order, by key.
fn unit_lines(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in text.lines().map(str::trim) {
        if l.starts_with('#') || l.starts_with('[') {
            continue;
        }
        if let Some((k, v)) = l.split_once('=') {
            m.entry(k.into()).or_default().push(v.into());
        }
    }
    m
}

/// The system calls a `SystemCallFilter=` allow-list admits: its groups expanded with
/// `systemd-analyze syscall-filter` (nested groups too), plus `@default`, which systemd
/// always adds to an allow-list.
fn allowed_syscalls(filter: &str) -> BTreeSet<String> {
    let listing = ok(Command::new("systemd-analyze").arg("syscall-filter"));
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for l in listing.lines() {
        if l.starts_with('@') {
            current = Some(l.trim().to_string());
        } else if l.trim().is_empty() || l.trim_start().starts_with('#') {
            continue;
        } else if let Some(g) = &current {
            groups
                .entry(g.clone())
                .or_default()
                .push(l.trim().to_string());
        }
    }
    let mut todo: Vec<String> = filter.split_whitespace().map(String::from).collect();
    todo.push("@default".into());
    let (mut out, mut seen) = (BTreeSet::new(), BTreeSet::new());
    while let Some(n) = todo.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        match groups.get(&n) {
            Some(members) => todo.extend(members.iter().cloned()),
            None => {
                assert!(
                    !n.starts_with('@'),
                    "no group {n} in systemd-analyze's list"
                );
                out.insert(n);
            }
        }
    }
    out
}

/// The system calls and socket families in strace files (`strace -f -o`).
fn traced(files: &[PathBuf]) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut calls, mut families) = (BTreeSet::new(), BTreeSet::new());
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for l in text.lines() {
            // "PID name(args…" ; "PID <... name resumed>" repeats a call already seen;
            // signals and exits ("---", "+++") are not calls.
            let rest = l.split_once(' ').map_or(l, |(_, r)| r).trim_start();
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() || !rest[name.len()..].starts_with('(') {
                continue;
            }
            if name == "socket" || name == "socketpair" {
                let fam = rest[name.len() + 1..]
                    .split([',', ')'])
                    .next()
                    .unwrap_or("")
                    .to_string();
                families.insert(fam);
            }
            calls.insert(name);
        }
    }
    (calls, families)
}

#[test]
fn the_package_installs_runs_as_its_unit_says_reloads_drains_and_purges() {
    require_root();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The binary under test is the one cargo built for these tests: package it as it is.
    let out = ok(Command::new("bash")
        .arg(root.join("scripts/package.sh"))
        .arg("--no-build"));
    let deb = root.join(
        out.lines()
            .last()
            .expect("package.sh printed no path")
            .trim(),
    );
    let size = std::fs::metadata(&deb).unwrap().len();
    eprintln!("package: {} ({size} bytes)", deb.display());
    let installed_before = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "satpep"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"));
    assert!(
        !installed_before,
        "the satpep package is installed on this machine; this test installs and purges it"
    );
    let saved = Path::new("/etc/satpep").exists().then(|| {
        let to = std::env::temp_dir().join(format!("satpep-etc-{}", std::process::id()));
        ok(Command::new("mv").arg("/etc/satpep").arg(&to));
        to
    });
    // As on a fresh machine, the service must load its controller itself (under the sandbox).
    let _ = Command::new(bin())
        .args(["cc", "unload", "satpep_sat"])
        .output();
    // Declared first, dropped last: after the purge.
    let _restore = Restore(saved);
    let installed = Installed;
    ok(Command::new("dpkg").arg("-i").arg(&deb));

    // What the package puts where, and what it marks as configuration.
    for f in [
        "/usr/bin/satpep",
        CONFIG,
        UNIT,
        "/usr/share/man/man1/satpep-proxy.1",
        "/usr/share/man/man5/proxy.toml.5",
        "/usr/share/bash-completion/completions/satpep",
        "/usr/share/satpep/prometheus/satpep-alerts.yml",
    ] {
        assert!(Path::new(f).exists(), "the package did not install {f}");
    }
    let status = ok(Command::new("dpkg").args(["-s", "satpep"]));
    assert!(
        status.contains(&format!(" {CONFIG} ")),
        "{CONFIG} is not a conffile:\n{status}"
    );
    let bin_size = std::fs::metadata("/usr/bin/satpep").unwrap().len();
    let debug_size = std::fs::metadata(bin()).unwrap().len();
    assert!(
        bin_size * 3 < debug_size,
        "the packaged binary ({bin_size} B) is not stripped (built: {debug_size} B)"
    );
    let version = ok(Command::new("/usr/bin/satpep").arg("--version"));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    ok(Command::new("systemd-analyze").args(["verify", UNIT]));
    let security = ok(Command::new("systemd-analyze").args([
        "security",
        "--offline=true",
        "--no-pager",
        UNIT,
    ]));
    let exposure = security
        .lines()
        .find_map(|l| l.split("satpep-proxy.service: ").nth(1))
        .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no exposure level in\n{security}"));
    eprintln!("systemd-analyze security: exposure {exposure}");
    assert!(exposure <= 3.5, "the unit's exposure is {exposure}");

    // The unit's lines, run as systemd would, in the lab's terminal.
    let unit = unit_lines(&std::fs::read_to_string(UNIT).unwrap());
    let one = |k: &str| -> String {
        let v = unit
            .get(k)
            .unwrap_or_else(|| panic!("the unit has no {k}="));
        assert_eq!(v.len(), 1, "{k}= more than once");
        v[0].clone()
    };
    let env: Vec<(String, String)> = unit
        .get("Environment")
        .into_iter()
        .flatten()
        .filter_map(|e| e.split_once('=').map(|(k, v)| (k.into(), v.into())))
        .collect();
    let lab = lab("pkg", "[both]\nrate='100Mbit'\ndelay='10ms'\n");
    let dir = std::env::temp_dir().join(format!("satpep-pkg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The shipped example, told which interface its clients are on, with a short drain.
    let example = std::fs::read_to_string(CONFIG).unwrap();
    let configured = example
        .replace(
            "[intercept]\n",
            "[intercept]\ninterfaces = [\"to-client\"]\n",
        )
        .replace("[proxy]\n", "[proxy]\ndrain = \"10s\"\n");
    assert_ne!(
        configured, example,
        "the example has no [intercept] or [proxy]"
    );
    std::fs::write(CONFIG, &configured).unwrap();
    // Without --config, satpep reads the package's configuration.
    let ruleset = ok(lab
        .command(Host::Terminal, "/usr/bin/satpep")
        .args(["proxy", "--check"]));
    assert!(
        ruleset.contains("\"to-client\""),
        "satpep proxy did not read {CONFIG} by default:\n{ruleset}"
    );
    // Every line runs under strace, to hold its system calls against the sandbox.
    let mut traces = Vec::new();
    let mut traced_cmd = |line: &str| {
        let t = dir.join(format!("strace-{}", traces.len()));
        traces.push(t.clone());
        // nsenter, not `ip netns exec`: only the network namespace changes, as with the
        // unit's NetworkNamespacePath=; the host's mounts (bpffs on /sys/fs/bpf) stay.
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", lab.ns(Host::Terminal)))
            .arg("strace")
            .args(["-f", "-qq", "-o"])
            .arg(&t)
            .args(["sh", "-c", line]);
        for (k, v) in &env {
            c.env(k, v);
        }
        c
    };
    ok(&mut traced_cmd(&one("ExecStartPre")));

    let sock = dir.join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let log = dir.join("proxy.log");
    let start = one("ExecStart");
    let mut service = traced_cmd(&format!("exec {start}"))
        .env("NOTIFY_SOCKET", &sock)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let next = || {
        let mut b = [0u8; 512];
        let n = manager
            .recv(&mut b)
            .unwrap_or_else(|e| panic!("no notification ({e}); the log:\n{}", read_log()));
        String::from_utf8_lossy(&b[..n]).into_owned()
    };
    while !next().contains("READY=1") {}
    // nsenter becomes strace, whose child is the service: $MAINPID.
    let main_pid: i32 = {
        let t = Instant::now();
        loop {
            let kids =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", service.id()))
                    .unwrap_or_default();
            let found = kids.split_whitespace().find(|k| {
                std::fs::read_to_string(format!("/proc/{k}/comm"))
                    .is_ok_and(|c| c.trim() == "satpep")
            });
            if let Some(p) = found {
                break p.parse().unwrap();
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "no satpep under strace"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let _kill = KillOnDrop(main_pid);

    // A server that sends `n` bytes of a pattern to each connection, then ends cleanly.
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9050").unwrap()
    })
    .join()
    .unwrap();
    const N: usize = 32 << 20;
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            std::thread::spawn(move || {
                let data = pattern(N, 5);
                let _ = s.write_all(&data);
            });
        }
    });
    let download = |lab: &Lab| {
        in_netns(&lab.ns(Host::Client), || {
            let mut s = TcpStream::connect("198.18.3.2:9050").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut got = Vec::with_capacity(N);
            let end = s.read_to_end(&mut got).err().map(|e| e.kind());
            (got, end)
        })
    };
    // Mid-download, a reload with a changed selection (systemctl reload runs ExecReload).
    let first = download(&lab);
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::write(
        CONFIG,
        configured.replace("[intercept]\n", "[intercept]\nexclude_ports = [9051]\n"),
    )
    .unwrap();
    let reload = one("ExecReload").replace("$MAINPID", &main_pid.to_string());
    ok(&mut traced_cmd(&reload));
    let (got, end) = first.join().unwrap();
    assert_eq!(
        end, None,
        "the download through a reload did not end cleanly"
    );
    assert_eq!(got.len(), N, "bytes of the download through a reload");
    assert!(
        got == pattern(N, 5),
        "the download through a reload is corrupted"
    );
    // The signal handler's work (nft) ends after `kill` returns: wait for its line.
    let t = Instant::now();
    while !read_log().contains("configuration reloaded") && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        read_log().contains("configuration reloaded"),
        "no reload within 15 s of the signal; the log:\n{}",
        read_log()
    );
    // The example names no controller: the one the start resolved is not a change.
    assert!(
        !read_log().contains("take effect at the next start"),
        "{}",
        read_log()
    );
    let m = metrics(&lab, Host::Terminal);
    let splits = m
        .lines()
        .find_map(|l| l.strip_prefix("satpep_connections_total "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(
        splits,
        Some(1.0),
        "the download was not split by the service:\n{m}"
    );
    // Stop mid-download (systemd sends SIGTERM): the live download finishes in the drain,
    // then the service exits and ExecStopPost cleans up.
    let second = download(&lab);
    std::thread::sleep(Duration::from_millis(1000));
    // SAFETY: signalling the service this test started.
    unsafe { libc::kill(main_pid, libc::SIGTERM) };
    let (got, end) = second.join().unwrap();
    assert_eq!((got.len(), end), (N, None), "the download live at the stop");
    assert!(
        got == pattern(N, 5),
        "the download live at the stop is corrupted"
    );
    let t = Instant::now();
    let status = loop {
        if let Some(s) = service.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the service did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "the service exited with {status}\n{}",
        read_log()
    );
    ok(&mut traced_cmd(&one("ExecStopPost")));
    let tables = ok(lab.command(Host::Terminal, "nft").args(["list", "tables"]));
    assert!(
        !tables.lines().any(|l| l.trim() == "table inet satpep"),
        "{tables}"
    );

    // Nothing it did would be refused by the unit's sandbox.
    let (calls, families) = traced(&traces);
    let allowed = allowed_syscalls(&one("SystemCallFilter"));
    assert!(
        calls.contains("bpf"),
        "the service loaded no controller: {calls:?}"
    );
    let refused: Vec<_> = calls.difference(&allowed).collect();
    assert!(
        refused.is_empty(),
        "system calls outside the unit's SystemCallFilter: {refused:?}"
    );
    let fams: BTreeSet<String> = one("RestrictAddressFamilies")
        .split_whitespace()
        .map(String::from)
        .collect();
    let refused: Vec<_> = families.difference(&fams).collect();
    assert!(
        refused.is_empty(),
        "socket families outside RestrictAddressFamilies: {refused:?}"
    );
    eprintln!(
        "{} system calls, families {families:?}, all within the unit's sandbox",
        calls.len()
    );

    // Purge removes everything, the edited configuration included.
    drop(installed);
    assert!(
        !Path::new("/etc/satpep").exists(),
        "/etc/satpep outlived the purge"
    );
    for f in [
        "/usr/bin/satpep",
        CONFIG,
        UNIT,
        "/sys/fs/bpf/satpep/satpep_sat",
    ] {
        assert!(!Path::new(f).exists(), "{f} outlived the purge");
    }
    let available =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control").unwrap();
    assert!(
        !available.split_whitespace().any(|c| c == "satpep_sat"),
        "satpep_sat is still registered after the purge: {available}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
