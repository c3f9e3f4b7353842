//! `satpep lab run faults`: the fault matrix. Each fault is applied to a checked transfer
//! ([`crate::checked`]: every byte verified at its offset, both ways) end to end, through the
//! split proxies and through the tunnel, and the table says what the client and the server
//! saw, how long after the fault, and whether any byte was corrupted or a cut stream ended
//! with a clean FIN (a silent truncation). Any of those, or a hang, fails the run.
//!
//! The link: 20 Mbit/s each way, 50 ms each way. A download is 8 MB (about 3.4 s).

use crate::checked::{self, connect_and_run, in_netns, serve_one, End, Outcome, Plan};
use crate::experiment::RunArgs;
use crate::progress::Progress;
use crate::topology::{Host, Lab, Pep, UpOptions, SERVER_V4};
use satpep_link::config::LinkSpec;
use serde::Serialize;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LINK: &str = "[both]\nrate = '20Mbit'\ndelay = '50ms'\n";
const MB: u64 = 1 << 20;
/// Faults that hit a live transfer strike once the client has this much.
const TRIGGER: u64 = MB;

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Nothing but the ends' own behaviour (their plans).
    None,
    /// The server process is killed (SIGKILL) mid-transfer.
    ServerCrash,
    /// The link is down this many seconds, from 2 s into the transfer.
    Outage(u32),
    /// The emulator is stopped and started again mid-transfer (frames in flight are lost).
    EmulatorRestart,
    /// Every proxy is stopped (SIGTERM) mid-transfer, then started again.
    ProxyRestart,
    /// Every proxy is killed (SIGKILL) mid-transfer, then started again.
    ProxyCrash,
    /// The tunnel gateway is stopped (SIGTERM) mid-transfer and started again.
    GatewayRestart,
    /// The tunnel gateway is killed (SIGKILL) mid-transfer and started again.
    GatewayCrash,
}

impl Fault {
    fn strikes_live(self) -> bool {
        !matches!(self, Fault::None | Fault::Outage(_))
    }
    fn needs_proxy(self) -> bool {
        matches!(
            self,
            Fault::ProxyRestart | Fault::ProxyCrash | Fault::GatewayRestart | Fault::GatewayCrash
        )
    }
    fn tunnel_only(self) -> bool {
        matches!(self, Fault::GatewayRestart | Fault::GatewayCrash)
    }
}

/// One row of the matrix: a fault, the two ends' plans and what each end may see.
struct Case {
    name: &'static str,
    what: &'static str,
    fault: Fault,
    client: Plan,
    /// `None`: the crash server (a process that sends forever and never reads).
    server: Option<Plan>,
    expect_client: &'static [End],
    expect_server: &'static [End],
}

fn plan(send: u64, seed_out: u64, seed_in: u64) -> Plan {
    Plan::new(send, seed_out, seed_in)
}

fn cases(quick: bool) -> Vec<Case> {
    const FIN: &[End] = &[End::Fin];
    const RESET: &[End] = &[End::Reset];
    const EITHER: &[End] = &[End::Fin, End::Reset];
    let down = |mut p: Plan| {
        p.send = 8 * MB;
        p
    };
    let endless = || plan(u64::MAX, 2, 1);
    let downloader = || plan(0, 1, 2);
    let mut v = vec![
        Case {
            name: "baseline",
            what: "1 MB up and 8 MB down, FIN both ways",
            fault: Fault::None,
            client: plan(MB, 1, 2),
            server: Some(down(plan(0, 2, 1))),
            expect_client: FIN,
            expect_server: FIN,
        },
        Case {
            name: "server reset",
            what: "the server resets after sending 2 MB of 8",
            fault: Fault::None,
            client: plan(MB, 1, 2),
            server: Some(Plan {
                abort_after_sent: Some(2 * MB),
                ..down(plan(0, 2, 1))
            }),
            expect_client: RESET,
            expect_server: &[End::Aborted],
        },
        Case {
            name: "server crash",
            what: "the server process is killed (SIGKILL) mid-download",
            fault: Fault::ServerCrash,
            client: plan(256 << 10, 1, 2),
            server: None,
            expect_client: RESET,
            expect_server: &[End::Killed],
        },
        Case {
            name: "client abort",
            what: "the client resets after 1 MB of an endless download",
            fault: Fault::None,
            client: Plan {
                abort_after_received: Some(MB),
                ..downloader()
            },
            server: Some(endless()),
            expect_client: &[End::Aborted],
            expect_server: RESET,
        },
        Case {
            name: "half-close, client first",
            what: "the client sends 4 MB and FIN; only then the server sends 4 MB and FIN",
            fault: Fault::None,
            client: plan(4 * MB, 1, 2),
            server: Some(Plan {
                send_after_peer_fin: true,
                ..plan(4 * MB, 2, 1)
            }),
            expect_client: FIN,
            expect_server: FIN,
        },
        Case {
            name: "half-close, server first",
            what: "the server sends 4 MB and FIN; only then the client sends 4 MB and FIN",
            fault: Fault::None,
            client: Plan {
                send_after_peer_fin: true,
                ..plan(4 * MB, 1, 2)
            },
            server: Some(plan(4 * MB, 2, 1)),
            expect_client: FIN,
            expect_server: FIN,
        },
    ];
    let outages: &[u32] = if quick { &[1] } else { &[1, 30, 120] };
    for &d in outages {
        v.push(Case {
            name: match d {
                1 => "outage 1 s",
                30 => "outage 30 s",
                _ => "outage 120 s",
            },
            what: "the link goes down 2 s into the 1 MB up / 8 MB down exchange",
            fault: Fault::Outage(d),
            client: Plan {
                // TCP's retransmission back-off may wait up to 2 min after the link is back.
                deadline: Duration::from_secs(u64::from(d) + 300),
                ..plan(MB, 1, 2)
            },
            server: Some(Plan {
                deadline: Duration::from_secs(u64::from(d) + 300),
                ..down(plan(0, 2, 1))
            }),
            expect_client: EITHER,
            expect_server: EITHER,
        });
    }
    v.extend([
        Case {
            name: "emulator restart",
            what: "the link emulator is stopped and started mid-download",
            fault: Fault::EmulatorRestart,
            client: plan(MB, 1, 2),
            server: Some(down(plan(0, 2, 1))),
            expect_client: FIN,
            expect_server: FIN,
        },
        Case {
            name: "proxy restart",
            what: "every proxy is stopped (SIGTERM) mid-download, then started",
            fault: Fault::ProxyRestart,
            client: downloader(),
            server: Some(endless()),
            expect_client: RESET,
            expect_server: RESET,
        },
        Case {
            name: "proxy crash",
            what: "every proxy is killed (SIGKILL) mid-download, then started",
            fault: Fault::ProxyCrash,
            client: downloader(),
            server: Some(endless()),
            expect_client: RESET,
            expect_server: RESET,
        },
        Case {
            name: "tunnel peer restart",
            what: "the gateway is stopped (SIGTERM) mid-download, then started",
            fault: Fault::GatewayRestart,
            client: downloader(),
            server: Some(endless()),
            expect_client: RESET,
            expect_server: RESET,
        },
        Case {
            name: "tunnel peer crash",
            what: "the gateway is killed (SIGKILL) mid-download, then started",
            fault: Fault::GatewayCrash,
            client: downloader(),
            server: Some(endless()),
            expect_client: RESET,
            expect_server: RESET,
        },
    ]);
    v
}

/// One cell of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The fault.
    pub fault: String,
    /// What was done.
    pub what: String,
    /// "end-to-end", "split" or "tunnel".
    pub mode: String,
    /// What the client saw.
    pub client: Outcome,
    /// What the server saw.
    pub server: Outcome,
    /// Bytes the server meant to send (`None`: until stopped).
    pub server_meant: Option<u64>,
    /// Bytes the client meant to send.
    pub client_meant: Option<u64>,
    /// Seconds from the fault to the client's end (faults on a live transfer).
    pub client_end_after_fault_s: Option<f64>,
    /// What was checked after the fault (rules removed, new flows).
    pub after: String,
    /// Empty when the cell passed; else why it failed.
    pub problems: Vec<String>,
}

fn meant(p: &Plan) -> Option<u64> {
    (p.send != u64::MAX).then_some(p.send)
}

/// Why a cell failed: corruption, a hang, a silent truncation, or an end it should not have.
fn judge(case: &Case, row: &mut Row) {
    let mut p = Vec::new();
    for (who, o, peer_meant, expect) in [
        ("client", &row.client, row.server_meant, case.expect_client),
        ("server", &row.server, row.client_meant, case.expect_server),
    ] {
        if let Some(at) = o.corrupt_at {
            p.push(format!("{who} received a corrupted byte at offset {at}"));
        }
        if o.end == End::Hung {
            p.push(format!("{who} hung"));
        }
        let read_all = peer_meant.is_some_and(|m| o.received == m);
        if o.peer_fin && !read_all && o.end != End::Killed {
            p.push(format!(
                "{who}: silent truncation, a clean FIN after {} of {} bytes",
                o.received,
                peer_meant.map_or("endless".into(), |m| m.to_string())
            ));
        }
        if !expect.contains(&o.end) {
            p.push(format!(
                "{who} saw {} (expected {})",
                o.end.word(),
                expect
                    .iter()
                    .map(|e| e.word())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ));
        }
    }
    row.problems.extend(p);
}

fn spec(text: &str) -> Result<LinkSpec, String> {
    let s: LinkSpec = toml::from_str(text).map_err(|e| e.to_string())?;
    LinkSpec::layered(&[&s])
}

fn pep_for(mode: &str) -> Option<Pep> {
    match mode {
        "split" => Some(Pep::default()),
        "tunnel" => Some(Pep {
            tunnel: Some("satellite".into()),
            ..Default::default()
        }),
        _ => None,
    }
}

/// Whether `host` has satpep's nftables table.
fn has_table(lab: &Lab, host: Host) -> bool {
    lab.command(host, "nft")
        .args(["list", "table", "inet", "satpep"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A crash server: this program in the server namespace, sending forever, never reading.
fn spawn_crash_server(lab: &Lab, port: u16) -> Result<std::process::Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut c = Command::new("ip")
        .args(["netns", "exec", &lab.ns(Host::Server)])
        .arg(exe)
        .args([
            "lab",
            "fault-server",
            "--port",
            &port.to_string(),
            "--seed",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the crash server: {e}"))?;
    let mut line = String::new();
    let out = c.stdout.take().expect("piped");
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        let _ = c.kill();
        let _ = c.wait();
        return Err(format!("the crash server did not start: {line:?}"));
    }
    Ok(c)
}

/// The hidden `satpep lab fault-server`: listens on `port`, accepts one connection, sends the
/// pattern seeded `seed` until killed, never reads.
pub fn fault_server(port: u16, seed: u64) -> Result<(), String> {
    let l = std::net::TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
    println!("ready");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let (s, _) = l.accept().map_err(|e| e.to_string())?;
    checked::write_pattern_forever(s, seed);
    Ok(())
}

/// What a new connection meets while the proxies are down: a listener waits in the server
/// host, so "connects" means the path forwards end to end.
fn while_down(lab: &Lab) -> String {
    let Ok(l) = listen(lab, 9399) else {
        return "not checked".into();
    };
    let addr: std::net::SocketAddr = format!("{SERVER_V4}:9399").parse().unwrap();
    let r = in_netns(&lab.ns(Host::Client), move || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map(|_| ())
    })
    .join();
    drop(l);
    match r {
        Ok(Ok(Ok(()))) => "new connections go end to end".into(),
        Ok(Ok(Err(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            "new connections refused".into()
        }
        Ok(Ok(Err(e))) if e.kind() == std::io::ErrorKind::TimedOut => {
            "new connections time out".into()
        }
        Ok(Ok(Err(e))) => format!("new connections fail: {e}"),
        _ => "not checked".into(),
    }
}

/// A short exchange on a new connection: does the path carry new flows?
fn new_flow_works(lab: &Lab, port: u16) -> Result<(), String> {
    let server = listen(lab, port)?;
    let srv = std::thread::spawn(move || {
        serve_one(
            &server,
            Duration::from_secs(30),
            &plan(MB, 12, 11),
            &AtomicU64::new(0),
        )
    });
    let addr = format!("{SERVER_V4}:{port}").parse().unwrap();
    let c = in_netns(&lab.ns(Host::Client), move || {
        connect_and_run(
            addr,
            Duration::from_secs(30),
            &Plan {
                deadline: Duration::from_secs(30),
                ..plan(100_000, 11, 12)
            },
            &AtomicU64::new(0),
        )
    })
    .join()
    .map_err(|_| "client panicked".to_string())??;
    let s = srv.join().map_err(|_| "server panicked".to_string())?;
    if c.end == End::Fin && s.end == End::Fin && c.received == MB && c.corrupt_at.is_none() {
        Ok(())
    } else {
        Err(format!(
            "a new flow failed: client {} ({} B, {}), server {}",
            c.end.word(),
            c.received,
            c.error.unwrap_or_default(),
            s.end.word()
        ))
    }
}

fn listen(lab: &Lab, port: u16) -> Result<std::net::TcpListener, String> {
    in_netns(&lab.ns(Host::Server), move || {
        std::net::TcpListener::bind(("0.0.0.0", port))
    })
    .join()
    .map_err(|_| "listener thread panicked".to_string())??
    .map_err(|e| format!("cannot listen on {port} in the server host: {e}"))
}

fn killed() -> Outcome {
    Outcome {
        sent: 0,
        received: 0,
        corrupt_at: None,
        peer_fin: false,
        end: End::Killed,
        secs: 0.0,
        error: None,
    }
}

/// Applies a fault to a live transfer; returns what was checked after it.
fn strike(
    lab: &mut Lab,
    fault: Fault,
    base: &LinkSpec,
    crash: &mut Option<std::process::Child>,
) -> Result<String, String> {
    let hosts = lab.proxy_hosts();
    match fault {
        Fault::ServerCrash => {
            if let Some(c) = crash.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            Ok(String::new())
        }
        Fault::EmulatorRestart => {
            lab.start_emulator(base)?;
            Ok("emulator back".into())
        }
        Fault::ProxyRestart | Fault::ProxyCrash => {
            let sig = if fault == Fault::ProxyCrash {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            for &h in &hosts {
                lab.signal_proxy(h, sig);
            }
            let left: Vec<&str> = hosts
                .iter()
                .filter(|h| has_table(lab, **h))
                .map(|h| h.name())
                .collect();
            let rules = if left.is_empty() {
                "rules removed".to_string()
            } else {
                format!("rules left in {} until the next start", left.join(", "))
            };
            let rules = format!("{rules}; while down: {}", while_down(lab));
            for &h in &hosts {
                lab.restart_proxy(h)?;
            }
            Ok(rules)
        }
        Fault::GatewayRestart | Fault::GatewayCrash => {
            let sig = if fault == Fault::GatewayCrash {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            lab.signal_proxy(Host::Gateway, sig);
            lab.restart_proxy(Host::Gateway)?;
            Ok("gateway back".into())
        }
        Fault::None | Fault::Outage(_) => Ok(String::new()),
    }
}

fn run_case(
    lab: &mut Lab,
    mode: &str,
    case: &Case,
    port: u16,
    base: &LinkSpec,
) -> Result<Row, String> {
    if let Fault::Outage(d) = case.fault {
        lab.start_emulator(&spec(&format!(
            "{LINK}[outage]\ndown = ['2s..{}s']\n",
            2 + d
        ))?)?;
    }
    let mut crash = None;
    let server = match &case.server {
        Some(p) => {
            let l = listen(lab, port)?;
            let p = p.clone();
            Some(std::thread::spawn(move || {
                serve_one(&l, Duration::from_secs(30), &p, &AtomicU64::new(0))
            }))
        }
        None => {
            crash = Some(spawn_crash_server(lab, port)?);
            None
        }
    };
    let got = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let client = {
        let (p, got) = (case.client.clone(), got.clone());
        let addr = format!("{SERVER_V4}:{port}").parse().unwrap();
        in_netns(&lab.ns(Host::Client), move || {
            connect_and_run(addr, Duration::from_secs(30), &p, &got)
        })
    };
    let mut struck_at = None;
    let mut after = String::new();
    if case.fault.strikes_live() {
        let t = Instant::now();
        while got.load(Relaxed) < TRIGGER && !client.is_finished() && t.elapsed().as_secs() < 60 {
            std::thread::sleep(Duration::from_millis(10));
        }
        struck_at = Some(Instant::now());
        after = strike(lab, case.fault, base, &mut crash)?;
    }
    let c = client.join().map_err(|_| "client panicked".to_string())??;
    let s = match server {
        Some(h) => h.join().map_err(|_| "server panicked".to_string())?,
        None => {
            if let Some(mut c) = crash {
                let _ = c.kill();
                let _ = c.wait();
            }
            killed()
        }
    };
    if let Fault::Outage(_) = case.fault {
        lab.start_emulator(base)?;
    }
    if case.fault.strikes_live() || matches!(case.fault, Fault::Outage(_)) {
        match new_flow_works(lab, port + 1000) {
            Ok(()) => {
                if !after.is_empty() {
                    after.push_str("; ");
                }
                after.push_str("new flow ok");
            }
            Err(e) => after = format!("{after}; {e}"),
        }
    }
    let mut row = Row {
        fault: case.name.into(),
        what: case.what.into(),
        mode: mode.into(),
        server_meant: case.server.as_ref().and_then(meant),
        client_meant: meant(&case.client),
        client_end_after_fault_s: struck_at.map(|t| {
            (started + Duration::from_secs_f64(c.secs))
                .saturating_duration_since(t)
                .as_secs_f64()
        }),
        client: c,
        server: s,
        after,
        problems: Vec::new(),
    };
    if row.after.contains("failed") {
        row.problems.push(row.after.clone());
    }
    judge(case, &mut row);
    Ok(row)
}

/// Runs the matrix and prints its table (or JSON). Fails if any cell failed.
pub fn run(args: &RunArgs) -> Result<(), String> {
    let modes: &[&str] = if args.quick {
        &["split", "tunnel"]
    } else {
        &["end-to-end", "split", "tunnel"]
    };
    let all = cases(args.quick);
    let plan: Vec<(&str, &Case)> = modes
        .iter()
        .flat_map(|m| {
            all.iter()
                .filter(move |c| {
                    (*m != "end-to-end" || !c.fault.needs_proxy())
                        && (*m == "tunnel" || !c.fault.tunnel_only())
                })
                .map(move |c| (*m, c))
        })
        .filter(|(_, c)| args.only.as_deref().is_none_or(|o| c.name.contains(o)))
        .collect();
    if plan.is_empty() {
        return Err(format!(
            "--only {}: no fault matches (faults: {})",
            args.only.as_deref().unwrap_or(""),
            all.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
        ));
    }
    let base = spec(LINK)?;
    let progress = Progress::new(plan.len(), 8.0, false);
    let mut rows = Vec::new();
    let mut lab: Option<(String, Lab)> = None;
    for (i, (mode, case)) in plan.iter().enumerate() {
        if crate::interrupted() {
            return Err("interrupted".into());
        }
        let pep = pep_for(mode);
        if lab.as_ref().is_none_or(|(m, _)| m != mode) {
            drop(lab.take());
            let name = format!("flt-{}", std::process::id());
            let opts = UpOptions {
                pep: pep.clone(),
                ..UpOptions::default()
            };
            lab = Some((mode.to_string(), Lab::up(&name, &base, &opts)?));
        }
        let l = &mut lab.as_mut().unwrap().1;
        let what = format!("{mode:<10} {}", case.name);
        progress.tick(i, &what, 0.0);
        let row = run_case(l, mode, case, 9400 + i as u16, &base)?;
        if !row.problems.is_empty() {
            // What the proxies and the emulator said, for a failure seen only in CI.
            for h in l.proxy_hosts() {
                eprintln!(
                    "--- {} proxy log (last 40 lines):\n{}",
                    h.name(),
                    tail(&l.proxy_log(h), 40)
                );
            }
            eprintln!(
                "--- emulator log (last 20 lines):\n{}",
                tail(&l.link_log(), 20)
            );
        }
        let verdict = if row.problems.is_empty() {
            format!(
                "ok: client {} ({} B), server {}",
                row.client.end.word(),
                row.client.received,
                row.server.end.word()
            )
        } else {
            format!("FAILED: {}", row.problems.join("; "))
        };
        progress.done(i, &what, &verdict);
        rows.push(row);
    }
    drop(lab);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
    } else {
        println!("{}", table(&rows));
    }
    let failed = rows.iter().filter(|r| !r.problems.is_empty()).count();
    if failed > 0 {
        return Err(format!("{failed} of {} fault cells failed", rows.len()));
    }
    Ok(())
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn fmt_bytes(n: u64) -> String {
    if n >= MB {
        format!("{:.2} MB", n as f64 / MB as f64)
    } else if n >= 1024 {
        format!("{:.0} KB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// The matrix as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| fault | mode | client saw | server saw | client got | server got | end after fault | corrupt / truncated | after | verdict |\n|---|---|---|---|---:|---:|---:|---|---|---|\n",
    );
    for r in rows {
        let of = |got: u64, meant: Option<u64>| match meant {
            Some(m) => format!("{} of {}", fmt_bytes(got), fmt_bytes(m)),
            None => fmt_bytes(got),
        };
        let bad = |o: &Outcome| o.corrupt_at.is_some();
        let trunc = r.problems.iter().any(|p| p.contains("truncation"));
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |\n",
            r.fault,
            r.mode,
            r.client.end.word(),
            r.server.end.word(),
            of(r.client.received, r.server_meant),
            of(r.server.received, r.client_meant),
            r.client_end_after_fault_s
                .map_or("".into(), |t| format!("{t:.2} s")),
            if bad(&r.client) || bad(&r.server) {
                "CORRUPT"
            } else {
                "0"
            },
            if trunc { "TRUNCATED" } else { "0" },
            r.after,
            if r.problems.is_empty() {
                "pass".to_string()
            } else {
                format!("FAIL: {}", r.problems.join("; "))
            }
        ));
    }
    s
}
