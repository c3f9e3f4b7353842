//! `satpep lab run FILE.toml`: scenarios are checked before anything runs, run real traffic
//! on a real lab, write their reports, and resume after an interrupt.

mod common;

use common::{namespaces_with, orphaned_scenario_namespaces, require_root, satpep};
use satpep_lab::scenario::hosts::HostTuner;
use satpep_lab::scenario::spec::{HostTcp, Size};
use satpep_lab::Host;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("satpep-sc-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `satpep lab run` on scenario text; returns (success, stdout, stderr).
fn run_text(dir: &Path, text: &str, extra: &[&str]) -> (bool, String, String) {
    let f = dir.join("s.toml");
    std::fs::write(&f, text).unwrap();
    let out = satpep()
        .args(["lab", "run", f.to_str().unwrap(), "--out"])
        .arg(dir.join("out"))
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const BASE: &str =
    "name = \"t\"\nduration = \"3s\"\n[link]\nboth = { rate = \"20Mbit\", delay = \"25ms\" }\n";

#[test]
fn bad_scenarios_are_refused_with_the_key_named() {
    let dir = tmpdir("bad");
    let cases: &[(&str, &str)] = &[
        ("[traffic]\nflowz = 2\n", "traffic: flowz: unknown field"),
        ("[pep]\nmode = \"bogus\"\n", "pep.mode: unknown variant `bogus`"),
        ("[traffic]\nkind = \"bulkk\"\n", "traffic: kind: unknown kind `bulkk`"),
        ("[traffic]\ndirection = \"up\"\n", "traffic: direction: unknown variant `up`"),
        ("[traffic]\nkind = \"http\"\n", "traffic: missing field `size` (kind = \"http\")"),
        ("[traffic]\nkind = \"http\"\nsize = \"1KB\"\nflows = 2\n", "traffic: flows: unknown field `flows`"),
        ("[traffic]\nkind = \"page\"\n", "missing field `objects`"),
        ("[traffic]\nkind = \"page\"\nobjects = []\n", "traffic.objects: a page needs"),
        ("[traffic]\nkind = \"http\"\nsize = \"1KB\"\nprobe = true\n", "traffic: probe: unknown field"),
        ("[hosts.client]\ninitcwnd = 0\n", "hosts.client.initcwnd"),
        ("[hosts.server]\nrmem_max = \"lots\"\n", "hosts.server.rmem_max"),
        ("[hosts.server]\ncc = \"no such cc!\"\n", "hosts.server.cc"),
        ("repetitions = 0\n", "repetitions"),
        ("warmup = \"5s\"\n", "warmup"),
        ("[[sweep]]\nparam = \"link.both.ber\"\nvalues = [0.0, 2.0]\n", "ber=2"),
        ("[[sweep]]\nparam = \"link.both.bre\"\nvalues = [0.0]\n", "bre"),
        ("[[sweep]]\nparam = \"name\"\nvalues = [\"x\"]\n", "cannot sweep"),
        ("[[config]]\nname = \"a\"\n[[config]]\nname = \"a\"\n", "used twice"),
        ("[[config]]\nname = \"a\"\n[[reference]]\nconfig = \"b\"\nvalue = 1.0\nsource = \"x\"\n", "no config named 'b'"),
        ("[[config]]\nname = \"a\"\npep = { mode = \"tunnel\", cc = \"warp\" }\n", "pep.cc"),
        ("[[part]]\ntitle = \"no name\"\n", "part #1: needs a name"),
        ("[traffic]\ncompeting_after = \"1s\"\n", "traffic.competing_after '1s': needs competing = true"),
        ("[traffic]\ncompeting = true\ncompeting_after = \"2s\"\n", "traffic.competing_after '2s': with the"),
        ("[traffic]\ncompeting = true\ncompeting_after = \"soon\"\n", "traffic: competing_after"),
        ("[traffic]\nkind = \"udp\"\nload = 3.0\n", "traffic.load = 3: a share"),
        ("[traffic]\nkind = \"udp\"\nflows = 2\n", "traffic: flows: unknown field"),
        ("[[part]]\nname = \"b\"\nbridge = true\ntraffic = { kind = \"udp\" }\n", "not with bridge = true"),
        ("[traffic]\nkind = \"ping\"\nsize = 2\n", "traffic.size = 2"),
        ("[traffic]\nkind = \"ping\"\ninterval = \"1us\"\n", "traffic.interval '1us'"),
        ("[traffic]\nkind = \"connections\"\ncount = 0\n", "traffic.count = 0"),
        ("[pep]\nmax_connections = 5\n", "pep.max_connections: there is no proxy"),
        ("[pep]\nmode = \"split\"\nmax_connections = 0\n", "pep.max_connections = 0"),
        ("[traffic]\nkind = \"fault\"\ncase = \"proxy-crash\"\n", "traffic.case 'proxy-crash': needs a proxy"),
        ("[pep]\nmode = \"split\"\n[traffic]\nkind = \"fault\"\ncase = \"tunnel-peer-crash\"\n", "needs the tunnel"),
        ("[traffic]\nkind = \"fault\"\ncase = \"baseline\"\ndown = \"5s\"\n", "traffic.down '5s': only for case 'outage'"),
        ("[traffic]\nkind = \"fault\"\ncase = \"meteor\"\n", "unknown variant `meteor`"),
        ("[pep]\nconfig = { proxy = { idle_timeout = \"90s\" } }\n", "pep.config: there is no proxy to configure"),
        ("[pep]\nmode = \"split\"\nconfig = { proxy = { bogus = 1 } }\n", "pep.config.proxy.bogus: unknown field `bogus`"),
        ("[pep]\nmode = \"split\"\nconfig = { satellite = { buffer = \"lots\" } }\n", "satellite.buffer"),
        ("[pep]\nmode = \"tunnel\"\nconfig = { proxy = { carrier = { rate = \"1Mbit\" } } }\n", "pep.config: proxy.carrier: a split gateway's"),
        ("[pep]\nmode = \"split\"\nconfig = { proxy = { carrier = { rate = \"1Mbit\", terminal = { t2 = { weight = 2.0 } } } } }\n", "proxy.carrier.terminal.t2.subnets: missing"),
        ("[[part]]\nname = \"d\"\ndraw = { links = 2 }\n", "draw.links = 2"),
        ("[[part]]\nname = \"d\"\ndraw = { links = 5, bogus = 1 }\n", "draw: unknown field `bogus`"),
        ("[[sweep]]\nparam = \".\"\nvalues = [1]\n", "each value must be a table"),
        ("[link.forward]\nrate_schedule = \"0 1Mbit; 2 slow\"\n", "rate_schedule: line 2"),
        ("[statistics]\nbaseline = \"x\"\n", "statistics: needs at least two configurations"),
        ("[statistics]\nbaseline = \"c\"\n[[config]]\nname = \"a\"\n[[config]]\nname = \"b\"\n", "statistics.baseline: no configuration named 'c' (there are: a, b)"),
        ("[statistics]\nalpha = 2.0\n[[config]]\nname = \"a\"\n[[config]]\nname = \"b\"\n", "statistics.alpha"),
        ("[statistics]\nlevel = 2.0\n", "statistics: unknown field `level`"),
        ("[traffic]\nbackground = { flows = 0, rtt = \"25ms\" }\n", "background.flows = 0: between 1 and 16"),
        ("[traffic]\nbackground = { flows = 2 }\n", "missing field `rtt`"),
        ("[traffic]\nbackground = { flows = 2, rtt = \"25ms\", cc = \"no such cc!\" }\n", "background.cc"),
        ("[[link.forward.path]]\nhosts = [\"198.18.3.0/99\"]\ndelay = \"1ms\"\n", "forward path #1: hosts: '198.18.3.0/99': the prefix length must be 0 to 32"),
        ("[star]\nterminals = 300\n", "star.terminals = 300: between 1 and 240"),
        ("[star]\nterminals = 3\npath = [{ terminals = [4], rate = \"1Mbit\" }]\n", "star.path[0].terminals: 4 is not a terminal of this star"),
        ("[star]\nterminals = 3\npath = [{ terminals = [2], queue = \"1ms\" }]\n", "star.path[0].queue: not a key"),
        ("[star]\nterminals = 3\n[traffic]\nkind = \"hub\"\nbusy = 4\n", "traffic.busy = 4: between 1 and star.terminals (3)"),
        ("[star]\nterminals = 3\n[traffic]\nkind = \"hub\"\nstop = [2]\n", "traffic.stop_after: needed with stop"),
        ("[star]\nterminals = 3\n[traffic]\nkind = \"hub\"\nbusy = 2\nstop = [3]\nstop_after = \"2s\"\n", "traffic.stop: 3 is not a busy terminal"),
    ];
    for (extra, want) in cases {
        let (ok, _, err) = run_text(&dir, &format!("{BASE}{extra}"), &[]);
        assert!(!ok, "{extra:?} was accepted");
        assert!(
            err.contains(want),
            "{extra:?}: error {err:?} does not name {want:?}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = satpep()
        .args(["lab", "run", "no-such-preset"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("lawson2006") && err.contains("link-accuracy"),
        "{err}"
    );
    let out = satpep().args(["lab", "run", "--list"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for p in [
        "demo",
        "lawson2006",
        "bharadwaj1999",
        "urke2011",
        "shao2002",
        "vanzara2017",
    ] {
        assert!(text.contains(p), "--list lacks {p}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A scenario with every traffic kind, two configurations and a sweep.
const SMALL: &str = r#"
name = "small"
title = "small test scenario"
reproduces = "nothing"
duration = "3s"
seed = 7
pcap = true

[link]
both = { rate = "20Mbit", delay = "25ms" }

[[part]]
name = "bulk"
traffic = { kind = "bulk", flows = 2 }

[[part.sweep]]
param = "link.both.ber"
label = "BER"
values = [0.0, 1e-5]

[[part.config]]
name = "end-to-end"

[[part.config]]
name = "split"
pep = { mode = "split" }

[[part.reference]]
config = "split"
at = { "link.both.ber" = 0.0 }
value = 12345678.0
source = "a made-up figure"

[[part]]
name = "http"
traffic = { kind = "http", size = "200KB", count = 2, parallel = 2 }
duration = "20s"

[[part]]
name = "page"
traffic = { kind = "page", objects = ["1KB", "30KB", "30KB", "50KB"], connections = 2 }
duration = "20s"

[[part]]
name = "rr"
traffic = { kind = "interactive", size = "100B", count = 5 }
duration = "20s"
"#;

fn runs_in(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out.join("runs"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Tests that run a lab through `satpep lab run` (namespaces `sp-sc-*`) one at a time: the
/// interrupt test counts those namespaces.
static LAB_RUNS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_scenario_runs_reports_and_resumes_after_an_interrupt() {
    require_root();
    let _one = LAB_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("small");
    let out = dir.join("out");
    let f = dir.join("s.toml");
    std::fs::write(&f, SMALL).unwrap();
    let before = namespaces_with("sp-sc-");

    // Interrupt after the first run is saved.
    let mut child = satpep()
        .args([
            "lab",
            "run",
            f.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while runs_in(&out).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no run saved within 60 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(100));
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an interrupted run must fail");
    assert!(
        err.contains("interrupted") && err.contains("resume"),
        "{err}"
    );
    assert_eq!(
        namespaces_with("sp-sc-"),
        before,
        "the interrupted run left namespaces"
    );
    let saved = runs_in(&out);
    assert!(!saved.is_empty() && saved.len() < 7, "{saved:?}");
    let first = std::fs::read_to_string(out.join("runs").join(&saved[0])).unwrap();

    // Resume: only the missing runs are made.
    let o = satpep()
        .args([
            "lab",
            "run",
            f.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("resuming: {} of 7 runs", saved.len())),
        "{err}"
    );
    assert_eq!(runs_in(&out).len(), 7);
    assert_eq!(
        std::fs::read_to_string(out.join("runs").join(&saved[0])).unwrap(),
        first,
        "a saved run was redone"
    );
    assert_eq!(namespaces_with("sp-sc-"), before, "the run left namespaces");

    // The results: JSON on stdout, and the files.
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json prints JSON");
    let cells = j["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 7);
    let limit = 20e6 * 1448.0 / 1514.0;
    for c in &cells[..4] {
        let g = c["metric"]["mean"].as_f64().unwrap();
        assert!(
            g > 1e6 && g < limit * 1.02,
            "bulk goodput {g} outside (1 Mbit/s, limit)"
        );
        let jain = c["jain"]["mean"].as_f64().unwrap();
        assert!((0.5..=1.0).contains(&jain), "Jain {jain}");
        assert_eq!(c["failures"], 0, "{c}");
    }
    // Loss-free split fills most of the link.
    let u = cells[1]["utilization"]["mean"].as_f64().unwrap();
    assert!(u > 0.6, "split at BER 0: {u}");
    assert_eq!(cells[1]["reference"], 12345678.0);
    // http: two rounds of two simultaneous downloads of 200 KB, each at least one RTT plus
    // serialization.
    let http = &cells[4]["metric"];
    assert_eq!(http["n"], 4);
    let ht = http["mean"].as_f64().unwrap();
    assert!(ht > 0.05 + 200e3 * 8.0 / 20e6 && ht < 5.0, "http {ht}");
    // What the link carried per payload byte of the files: at least the payload with its
    // headers (1514-byte frames for 1448 bytes), plus handshakes and requests; none for bulk,
    // whose iperf3 does not count what was still in flight when its test ended.
    for c in &cells[4..6] {
        let fwd = c["link_fwd_per_byte"]["mean"].as_f64().unwrap();
        let ret = c["link_ret_per_byte"]["mean"].as_f64().unwrap();
        assert!((1514.0 / 1448.0..1.3).contains(&fwd), "forward {fwd}: {c}");
        assert!(ret > 0.0 && ret < 0.2, "return {ret}: {c}");
    }
    assert_eq!(cells[0]["link_fwd_per_byte"]["n"], 0);
    // page: the document then three objects over two connections, at least two RTTs.
    let pt = cells[5]["metric"]["mean"].as_f64().unwrap();
    assert!(pt > 0.1 && pt < 10.0, "page {pt}");
    // interactive: five request/responses on one connection, one RTT each.
    let rr = &cells[6]["metric"];
    assert_eq!(rr["n"], 5);
    let rt = rr["mean"].as_f64().unwrap();
    assert!((0.049..0.2).contains(&rt), "request/response {rt}");
    // The sampler saw the satellite-leg sender's window.
    let runs = j["runs"].as_array().unwrap();
    assert!(runs
        .iter()
        .any(|r| r["sockets"].as_array().is_some_and(|s| !s.is_empty())));
    // Every run says which build, kernel and time measured it; the report opens with it.
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    for r in runs {
        let p = &r["provenance"];
        assert_eq!(p["kernel"], kernel.trim(), "{p}");
        assert_eq!(p["satpep"], env!("CARGO_PKG_VERSION"), "{p}");
        assert!(
            p["started"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{p}"
        );
    }
    let setups = j["provenance"]["setups"].as_array().unwrap();
    assert_eq!(setups.len(), 1, "one build measured every run: {setups:?}");
    assert_eq!(setups[0][1], runs.len());

    for f in [
        "report.md",
        "report.html",
        "runs.csv",
        "summary.csv",
        "series.csv",
        "sockets.csv",
        "results.json",
        "metric-bulk.svg",
        "metric-bulk.png",
        "fairness-bulk.svg",
        "plan.json",
        "scenario.toml",
    ] {
        let m = std::fs::metadata(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(m.len() > 0, "{f} is empty");
    }
    // Every run's capture: a pcap file (either byte order) holding frames.
    for run in runs_in(&out) {
        let f = out.join("pcap").join(run.replace(".json", ".pcap"));
        let b = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            b.starts_with(&[0xd4, 0xc3, 0xb2, 0xa1]) || b.starts_with(&[0xa1, 0xb2, 0xc3, 0xd4]),
            "{} is not a pcap file",
            f.display()
        );
        // Both directions: frames from the server (data) and to it (requests, ACKs).
        let (mut from, mut to, mut at) = (0, 0, 24);
        while at + 16 <= b.len() {
            let incl = u32::from_le_bytes(b[at + 8..at + 12].try_into().unwrap()) as usize;
            let frame = &b[at + 16..(at + 16 + incl).min(b.len())];
            if frame.len() >= 34 && frame[12..14] == [0x08, 0x00] {
                from += (frame[26..30] == [198, 18, 3, 2]) as u32;
                to += (frame[30..34] == [198, 18, 3, 2]) as u32;
            }
            at += 16 + incl;
        }
        assert!(
            from >= 5 && to >= 5,
            "{}: {from} frames from the server, {to} to it",
            f.display()
        );
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains(&format!(
            "Measured with satpep {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "no provenance in the report:\n{md}"
    );
    assert!(
        md.contains("(doc 12.3)"),
        "the reference is not beside ours:\n{md}"
    );
    assert!(md.contains("| BER | end-to-end | split |"), "{md}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("<table>"));
    assert!(
        !html.contains("src="),
        "the HTML report must be self-contained"
    );
    // Distributions of the completion and response times, and the configurations' goodput
    // overlaid per BER.
    for f in [
        "cdf-http-time-0.png",
        "cdf-rr-time-0.svg",
        "series/overlay-bulk-0.svg",
    ] {
        let m = std::fs::metadata(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(m.len() > 1000, "{f} is nearly empty");
    }
    assert!(md.contains("p50 / p95 / p99"), "{md}");
    let png = std::fs::read(out.join("metric-bulk.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert_eq!(
        std::fs::read_to_string(out.join("runs.csv"))
            .unwrap()
            .lines()
            .count(),
        8
    );
    // Every figure's column names its unit.
    let head = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let head = head.lines().next().unwrap();
    for col in [
        "goodput_bps_mean",
        "time_s_p99",
        "utilization_frac",
        "queue_p95_ms",
    ] {
        assert!(
            head.split(',').any(|c| c == col),
            "summary.csv: no {col} in {head}"
        );
    }

    // Another scenario in the same directory is refused, --fresh replaces it.
    let other = SMALL.replace("count = 5", "count = 6");
    std::fs::write(&f, &other).unwrap();
    let o = satpep()
        .args([
            "lab",
            "run",
            f.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--only",
            "rr",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--fresh"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn sysctl(lab: &satpep_lab::Lab, host: Host, key: &str) -> String {
    let o = lab
        .command(host, "sysctl")
        .args(["-n", key])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn routes(lab: &satpep_lab::Lab, host: Host) -> String {
    let o = Command::new("ip")
        .args(["-n", &lab.ns(host), "route", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn host_settings_are_applied_and_undone() {
    let lab = common::lab("hosts", "both = { rate = \"10Mbit\", delay = \"5ms\" }");
    let before = (
        sysctl(&lab, Host::Client, "net.ipv4.tcp_sack"),
        sysctl(&lab, Host::Client, "net.ipv4.tcp_rmem"),
        sysctl(&lab, Host::Client, "net.ipv4.tcp_congestion_control"),
        routes(&lab, Host::Client),
    );
    let mut t = HostTuner::default();
    let want = HostTcp {
        sack: Some(false),
        window_scaling: Some(false),
        timestamps: Some(false),
        initcwnd: Some(4),
        mss: Some(1000),
        rmem_max: Some(Size::parse("64KB").unwrap()),
        cc: Some("reno".into()),
        quickack: Some(true),
        ..Default::default()
    };
    t.apply(&lab, Host::Client, &want).unwrap();
    assert_eq!(sysctl(&lab, Host::Client, "net.ipv4.tcp_sack"), "0");
    assert_eq!(
        sysctl(&lab, Host::Client, "net.ipv4.tcp_window_scaling"),
        "0"
    );
    assert_eq!(sysctl(&lab, Host::Client, "net.ipv4.tcp_timestamps"), "0");
    assert_eq!(
        sysctl(&lab, Host::Client, "net.ipv4.tcp_congestion_control"),
        "reno"
    );
    assert!(sysctl(&lab, Host::Client, "net.ipv4.tcp_rmem").ends_with(" 64000"));
    let r = routes(&lab, Host::Client);
    assert!(r.contains("default via 198.18.1.1"), "{r}");
    for attr in ["initcwnd 4", "advmss 1000", "quickack 1"] {
        assert!(
            r.lines()
                .filter(|l| l.starts_with("default"))
                .all(|l| l.contains(attr)),
            "{attr} missing:\n{r}"
        );
    }
    // The server was not touched.
    assert_eq!(sysctl(&lab, Host::Server, "net.ipv4.tcp_sack"), "1");
    // Back to nothing set: everything as it was.
    t.apply(&lab, Host::Client, &HostTcp::default()).unwrap();
    let after = (
        sysctl(&lab, Host::Client, "net.ipv4.tcp_sack"),
        sysctl(&lab, Host::Client, "net.ipv4.tcp_rmem"),
        sysctl(&lab, Host::Client, "net.ipv4.tcp_congestion_control"),
        routes(&lab, Host::Client),
    );
    assert_eq!(after, before);
    // The lab still carries traffic.
    let (seqs, out) = common::ping_seqs(&lab, &["-n", "-c", "2", "-i", "0.2", "198.18.3.2"]);
    assert_eq!(seqs.len(), 2, "{out}");
}

/// The link measured from outside (the link-accuracy preset's kinds, CI-sized): udp's
/// delivered rate and loss, ping's RTT, against the link's configuration.
const LINK_CHECK: &str = r#"
name = "link-check"
duration = "6s"
warmup = "1s"
[link]
both = { rate = "20Mbit", delay = "25ms" }

[[part]]
name = "rate"
traffic = { kind = "udp" }
[[part.config]]
name = "forward"
[[part.config]]
name = "return"
traffic = { kind = "udp", direction = "upload" }

[[part]]
name = "loss"
link = { forward = { ber = 1e-5 } }
traffic = { kind = "udp", load = 0.5 }

[[part]]
name = "ping"
traffic = { kind = "ping", count = 40, interval = "20ms" }

[[part]]
name = "bridge"
bridge = true
traffic = { kind = "ping", count = 20, interval = "20ms" }
"#;

#[test]
fn the_udp_and_ping_kinds_measure_the_link_against_its_configuration() {
    require_root();
    let _one = LAB_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("link-check");
    let (ok, out, err) = run_text(&dir, LINK_CHECK, &["--json"]);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let cells = j["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 5);
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
    }
    // Both directions deliver their configured rate, to a small fraction of a per cent.
    for c in &cells[..2] {
        let e = c["link_check"]["rate_error_pct"]["mean"].as_f64().unwrap();
        assert!(e.abs() < 0.5, "rate error {e} %: {c}");
        let g = c["metric"]["mean"].as_f64().unwrap();
        assert!((g / 20e6 - 1.0).abs() < 0.005, "delivered {g}");
    }
    // At half the rate only the loss model drops: BER 1e-5 on 1514-byte frames, 11.4 %.
    let l = &cells[2]["link_check"];
    let (lost, want) = (
        l["loss_pct"].as_f64().unwrap(),
        l["loss_expected_pct"].as_f64().unwrap(),
    );
    assert!((want - 11.4).abs() < 0.1, "expected {want} %");
    let (lo, hi) = (
        l["loss_interval_pct"][0].as_f64().unwrap(),
        l["loss_interval_pct"][1].as_f64().unwrap(),
    );
    // The 99 % interval, widened by half: a correct emulator fails this far less than once in
    // a thousand runs; one dropping twice or half as much fails always.
    let half = (hi - lo) / 2.0 * 1.5;
    assert!(
        (lost - want).abs() < half,
        "lost {lost} %, expected {want} ± {half}"
    );
    assert!(l["datagrams"].as_u64().unwrap() > 3000, "{l}");
    // ping: both delays and two 98-byte frames at 20 Mbit/s, plus what the hosts add.
    let p = &cells[3]["link_check"];
    let expected = p["ping_expected_ms"].as_f64().unwrap();
    assert!((expected - (50.0 + 2.0 * 98.0 * 8.0 / 20e6 * 1e3)).abs() < 1e-9);
    let avg = p["ping_avg_ms"]["mean"].as_f64().unwrap();
    assert!(avg > expected && avg < expected + 2.0, "avg {avg} ms");
    assert_eq!(cells[3]["metric"]["n"], 40);
    // Through a kernel bridge nothing is expected, and the RTT is the hosts' alone.
    let b = &cells[4]["link_check"];
    assert!(b["ping_expected_ms"].is_null(), "{b}");
    assert!(b["ping_avg_ms"]["mean"].as_f64().unwrap() < 5.0, "{b}");
    let report = std::fs::read_to_string(dir.join("out").join("report.md")).unwrap();
    for heading in [
        "UDP: delivered frame rate",
        "UDP: datagrams lost",
        "ping: RTT min",
    ] {
        assert!(report.contains(heading), "the report lacks '{heading}'");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lab compare` on two real results directories of one small scenario, run with two seeds
/// and two repetitions each: every cell is matched, each figure says whether the intervals
/// overlap, and a directory that holds no results is named.
#[test]
fn lab_compare_puts_two_results_directories_side_by_side() {
    require_root();
    let dir = tmpdir("compare");
    let text = format!("{BASE}[[config]]\nname = \"cubic\"\nhosts.server.cc = \"cubic\"\n[[config]]\nname = \"bbr\"\nhosts.server.cc = \"bbr\"\n");
    let f = dir.join("s.toml");
    std::fs::write(&f, &text).unwrap();
    for (seed, name) in [("1", "a"), ("2", "b")] {
        let out = satpep()
            .args([
                "lab",
                "run",
                f.to_str().unwrap(),
                "--repetitions",
                "2",
                "--seed",
                seed,
                "--out",
            ])
            .arg(dir.join(name))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // --seed went into every cell's loss seed.
    let plan = std::fs::read_to_string(dir.join("b/plan.json")).unwrap();
    assert!(plan.contains("\"seed\": 2"), "{plan}");
    let out = satpep()
        .args(["lab", "compare"])
        .arg(dir.join("a"))
        .arg(dir.join("b"))
        .arg("--out")
        .arg(dir.join("c"))
        .arg("--json")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let figs = j["figures"].as_array().unwrap();
    for config in ["cubic", "bbr"] {
        let f = figs
            .iter()
            .find(|f| f["config"] == config && f["figure"] == "metric")
            .unwrap_or_else(|| panic!("no goodput of {config}: {j}"));
        assert!(f["a"]["mean"].as_f64().unwrap() > 1e6, "{f}");
        assert!(f["a"]["ci95"].as_f64().unwrap() >= 0.0, "{f}");
        assert!(f["overlap"].is_boolean(), "{f}");
    }
    assert!(j["only_in_a"].as_array().unwrap().is_empty(), "{j}");
    let md = std::fs::read_to_string(dir.join("c/compare.md")).unwrap();
    assert!(
        md.contains("| part | configuration | point | figure | A | B | change | overlap |"),
        "{md}"
    );
    assert!(dir.join("c/compare-0.png").exists());
    // Not a results directory: named.
    let out = satpep()
        .args(["lab", "compare"])
        .arg(dir.join("a"))
        .arg(&dir)
        .arg("--out")
        .arg(dir.join("d"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("results.json"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The saved record of cell `c`'s first run in results directory `out`.
fn first_run(out: &Path, c: usize) -> serde_json::Value {
    let t = std::fs::read_to_string(out.join(format!("runs/c{c:04}-r000.json"))).unwrap();
    serde_json::from_str(&t).unwrap()
}

/// `ipsec = true`: the client and server talk through ESP, which the split proxies between
/// them cannot read, so it passes unsplit (no satellite-leg socket), and the physical limit
/// counts ESP's bytes; the same transfer in plaintext is split. The report carries the
/// `[statistics]` tables.
#[test]
fn esp_between_the_hosts_passes_the_split_proxies_unsplit() {
    require_root();
    let _one = LAB_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("esp");
    let text = format!(
        "{BASE}[statistics]\nbaseline = \"e2e, ESP\"\n\
         [[config]]\nname = \"e2e, ESP\"\nipsec = true\n\
         [[config]]\nname = \"split, ESP\"\nipsec = true\npep = {{ mode = \"split\" }}\n\
         [[config]]\nname = \"split\"\npep = {{ mode = \"split\" }}\n"
    );
    let (ok, _, err) = run_text(&dir, &text, &["--repetitions", "1"]);
    assert!(ok, "{err}");
    let out = dir.join("out");
    let (esp, split_esp, split) = (first_run(&out, 0), first_run(&out, 1), first_run(&out, 2));
    for (name, r) in [
        ("e2e, ESP", &esp),
        ("split, ESP", &split_esp),
        ("split", &split),
    ] {
        let g = r["samples"][0].as_f64().unwrap_or(0.0);
        assert!(g > 2e6, "{name}: {g} bit/s on a 20 Mbit/s link: {r}");
        let u = r["utilization"].as_f64().unwrap();
        assert!(u < 1.0, "{name}: {u} of its limit");
    }
    let legs = |r: &serde_json::Value| r["sockets"].as_array().map_or(0, |a| a.len());
    assert_eq!(legs(&split_esp), 0, "ESP was split: {split_esp}");
    assert!(legs(&split) > 0, "plaintext was not split");
    // 1386 of 1506 bytes a frame inside ESP against 1448 of 1514 without.
    let (le, lp) = (
        esp["limit_bps"].as_f64().unwrap(),
        split["limit_bps"].as_f64().unwrap(),
    );
    let want = (1386.0 / 1506.0) / (1448.0 / 1514.0);
    assert!((le / lp - want).abs() < 0.002, "{le} / {lp}, want {want}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("analysis of variance"), "{md}");
    assert!(md.contains("% improvement over e2e, ESP"), "{md}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[star]` with `kind = "hub"`: three terminals download at once across one carrier (two
/// connections each, from the lab's own sender: `generator = "sockets"`); the gateway
/// sharing it by weight (terminal2 weighs 2) gives terminal2 twice the others' share with a
/// short queue, and the others take terminal3's share once its download stops; end to end,
/// the same star runs with no proxy to measure. The lab (a star of 3) is gone after.
#[test]
fn a_hub_cell_shares_a_stars_carrier_by_weight_and_reports_each_terminal() {
    require_root();
    let _one = LAB_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("hub");
    let text = "name = \"t\"\nduration = \"16s\"\nwarmup = \"3s\"\n\
                [link]\nforward = { rate = \"24Mbit\", delay = \"20ms\", queue = \"100%\" }\n\
                return = { rate = \"10Mbit\", delay = \"20ms\" }\n\
                [star]\nterminals = 3\n\
                [traffic]\nkind = \"hub\"\nflows = 2\ngenerator = \"sockets\"\n\
                stop = [3]\nstop_after = \"8s\"\n\
                [[config]]\nname = \"e2e\"\n\
                [[config]]\nname = \"shared\"\n\
                pep = { mode = \"tunnel\", config.tunnel.carrier = { rate = \"24Mbit\", terminal = { terminal2 = { weight = 2.0 } } } }\n";
    let (ok, _, err) = run_text(&dir, text, &["--repetitions", "1"]);
    assert!(ok, "{err}");
    let out = dir.join("out");
    let (e2e, shared) = (first_run(&out, 0), first_run(&out, 1));
    for r in [&e2e, &shared] {
        let t = r["hub"]["terminals"].as_array().unwrap();
        assert_eq!(t.len(), 3, "{r}");
        for x in t {
            assert!(x["goodput_bps"].as_f64().unwrap() > 0.5e6, "{x}");
            assert!(x["probes"][1].as_u64().unwrap() > 10, "{x}");
        }
        assert_eq!(r["failures"], 0, "{r}");
    }
    assert!(e2e["hub"]["gateway"].is_null(), "no proxy end to end");
    let h = &shared["hub"];
    let g = |i: usize| h["terminals"][i]["goodput_bps"].as_f64().unwrap();
    let fair = |i: usize| h["terminals"][i]["fair_bps"].as_f64().unwrap();
    // Weights 1 : 2 : 1 on 24 Mbit/s: 5.7, 11.5, 5.7 Mbit/s of payload.
    assert!((fair(1) / fair(0) - 2.0).abs() < 1e-9);
    eprintln!(
        "shared: {:.2} / {:.2} / {:.2} Mbit/s, Jain {}, taken in {} s ({} s after the last byte), queue p95 {} ms",
        g(0) / 1e6,
        g(1) / 1e6,
        g(2) / 1e6,
        shared["jain"],
        h["taken_s"],
        h["taken_after_last_byte_s"],
        h["terminals"][1]["queue_p95_ms"]
    );
    // terminal and terminal2 ran throughout; terminal2 had twice the share (before the
    // stop) and as much more after it, so the ratio lies near 2.
    let ratio = g(1) / g(0);
    assert!((1.7..2.5).contains(&ratio), "terminal2 ÷ terminal {ratio}");
    assert!(shared["jain"].as_f64().unwrap() > 0.95, "{shared}");
    assert!(
        h["terminals"][1]["queue_p95_ms"].as_f64().unwrap() < 15.0,
        "{h}"
    );
    let taken = h["taken_s"].as_f64().expect("the share was taken");
    // From the stop, when terminal3's client closed its connections: quiet 200 ms later
    // (its window has room), the others' controllers follow the freed share within a round
    // trip of 40 ms, read on a 0.1 s grid (0.2-0.3 s seen).
    assert!(taken <= 1.0, "{taken} s");
    // The gateway's own view: one tunnel per terminal, terminal2 sent about twice as much.
    let sent = |i: usize| h["terminals"][i]["gateway_sent_bytes"].as_u64().unwrap() as f64;
    for i in 0..3 {
        assert_eq!(h["terminals"][i]["tunnels"], 1, "{h}");
    }
    assert!((1.5..3.0).contains(&(sent(1) / sent(0))), "{h}");
    assert!(e2e["hub"]["terminals"][0]["gateway_sent_bytes"].is_null());
    let gw = &h["gateway"];
    assert!(gw["rss_idle_kb"].as_u64().unwrap() > 1000, "{gw}");
    assert!(gw["cpu_s"].as_f64().unwrap() > 0.0, "{gw}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("hub: each terminal's goodput"), "{md}");
    assert!(md.contains("| terminal2 (limit"), "{md}");
    assert!(
        orphaned_scenario_namespaces().is_empty(),
        "the star was left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `traffic.background`: the dumbbell's other host pairs cross the same queue on a path of
/// their own (10 ms RTT beside the link's 400 ms) and bypass the split proxies; on the short
/// path, each NewReno flow takes far more than the long-path transfer, as RTT unfairness has
/// it (with one path for all, each would have about a third).
#[test]
fn background_flows_share_the_queue_on_a_shorter_path_of_their_own() {
    require_root();
    let _one = LAB_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("bg");
    let text = "name = \"t\"\nduration = \"8s\"\nwarmup = \"2s\"\n\
                [link]\nboth = { rate = \"10Mbit\", delay = \"200ms\", queue = \"100p\" }\n\
                [hosts.both]\ncc = \"reno\"\n\
                [traffic]\nbackground = { flows = 2, rtt = \"10ms\", cc = \"reno\" }\n\
                [pep]\nmode = \"split\"\ncc = \"reno\"\n";
    let (ok, _, err) = run_text(&dir, text, &["--repetitions", "1"]);
    assert!(ok, "{err}");
    let out = dir.join("out");
    let r = first_run(&out, 0);
    let g = r["samples"][0].as_f64().unwrap();
    let bg: Vec<f64> = r["beside"]["background_bps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap_or(0.0))
        .collect();
    assert_eq!(bg.len(), 2, "{r}");
    for b in &bg {
        assert!(
            *b > 2.0 * g,
            "background {b} against the transfer's {g}: {bg:?}"
        );
    }
    // Still split: the proxies took the transfer, not the background.
    assert!(
        r["sockets"].as_array().is_some_and(|a| !a.is_empty()),
        "{r}"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("background flows (the dumbbell's 2 other host pairs"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `access`: a rate on the client's link makes it the bottleneck (the physical limit is its
/// own), flood pings across it take their share (more of it when the two directions share
/// the rate, half duplex), and a cell without it gets the plain link back on the same lab.
#[test]
fn the_client_s_access_link_takes_a_rate_and_flood_pings_and_gives_them_back() {
    require_root();
    let _one = LAB_RUNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tmpdir("access");
    let text = "name = \"t\"\nduration = \"6s\"\nwarmup = \"2s\"\n\
                [link]\nboth = { rate = \"20Mbit\", delay = \"25ms\" }\n\
                [[config]]\nname = \"slow\"\naccess = { rate = \"5Mbit\" }\n\
                [[config]]\nname = \"pinged\"\naccess = { rate = \"5Mbit\", pings = 2 }\n\
                [[config]]\nname = \"half\"\naccess = { rate = \"5Mbit\", duplex = \"half\", pings = 2 }\n\
                [[config]]\nname = \"plain\"\n";
    let (ok, out, err) = run_text(&dir, text, &["--json"]);
    assert!(ok, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let cells = j["cells"].as_array().unwrap();
    let g = |i: usize| cells[i]["metric"]["mean"].as_f64().unwrap();
    let (slow, pinged, half, plain) = (g(0), g(1), g(2), g(3));
    // 5 Mbit/s × 1436/1502 is the limit; the transfer fills it.
    assert!((4.2e6..4.9e6).contains(&slow), "slow {slow}");
    assert!(pinged < 0.8 * slow, "pinged {pinged} against {slow}");
    // The echo requests now take the download's time as well as the replies.
    assert!(half < 0.85 * pinged, "half duplex {half} against {pinged}");
    assert!(
        plain > 15e6,
        "plain {plain}: the token bucket or its ifb stayed"
    );
    for c in cells {
        assert_eq!(c["failures"], 0, "{c}");
    }
    for i in 0..4 {
        let r = first_run(&dir.join("out"), i);
        assert!(!r["errors"].to_string().contains("flood pings"), "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
