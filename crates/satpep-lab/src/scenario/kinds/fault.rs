//! `kind = "fault"`: one fault applied to a checked transfer ([`crate::checked`]: every byte
//! verified at its offset, both ways), end to end, through the split proxies or through the
//! tunnel (the cell's `pep`). The record says what the client and the server saw, how long
//! after the fault, and whether any byte was corrupted or a cut stream ended with a clean FIN
//! (a silent truncation). Any of those, a hang, or an end the case does not allow fails the
//! run. The `faults` preset is the matrix.

use super::Kind;
use crate::checked::{self, connect_and_run, in_netns, serve_one, End, Outcome, Plan};
use crate::scenario::spec::{CellSpec, Metric, PepMode, Span};
use crate::scenario::traffic::RunRecord;
use crate::topology::{Host, Lab, SERVER_V4};
use satpep_link::config::LinkSpec;
use serde::{Deserialize, Serialize};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MB: u64 = 1 << 20;
/// Faults that hit a live transfer strike once the client has this much.
const TRIGGER: u64 = MB;

/// One fault on a checked transfer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// Which fault.
    pub case: Case,
    /// outage: how long the link is down, from 2 s into the exchange (default 1 s).
    #[serde(default)]
    pub down: Option<Span>,
}

/// The faults, as scenarios name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// 1 MB up and 8 MB down, FIN both ways.
    Baseline,
    /// The server resets after sending 2 MB of 8.
    ServerReset,
    /// The server process is killed (SIGKILL) mid-download.
    ServerCrash,
    /// The client resets after 1 MB of an endless download.
    ClientAbort,
    /// The client sends 4 MB and FIN; only then the server sends 4 MB and FIN.
    HalfCloseClientFirst,
    /// The server sends 4 MB and FIN; only then the client sends 4 MB and FIN.
    HalfCloseServerFirst,
    /// The link goes down for `down`, 2 s into the exchange.
    Outage,
    /// The link emulator is stopped and started mid-download.
    EmulatorRestart,
    /// Every proxy is stopped (SIGTERM) mid-download, then started.
    ProxyRestart,
    /// Every proxy is killed (SIGKILL) mid-download, then started.
    ProxyCrash,
    /// The tunnel's gateway is stopped (SIGTERM) mid-download, then started.
    TunnelPeerRestart,
    /// The tunnel's gateway is killed (SIGKILL) mid-download, then started.
    TunnelPeerCrash,
}

/// What goes wrong, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Strike {
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

impl Strike {
    fn strikes_live(self) -> bool {
        !matches!(self, Strike::None | Strike::Outage(_))
    }
}

/// A fault's definition: what strikes, the two ends' plans and what each end may see.
struct CaseDef {
    what: &'static str,
    fault: Strike,
    client: Plan,
    /// `None`: the crash server (a process that sends forever and never reads).
    server: Option<Plan>,
    expect_client: &'static [End],
    expect_server: &'static [End],
}

fn plan(send: u64, seed_out: u64, seed_in: u64) -> Plan {
    Plan::new(send, seed_out, seed_in)
}

impl Case {
    /// What it does: what strikes, the ends' plans and the ends each may see; an outage
    /// lasts `down_s`.
    fn def(self, down_s: u32) -> CaseDef {
        const FIN: &[End] = &[End::Fin];
        const RESET: &[End] = &[End::Reset];
        const EITHER: &[End] = &[End::Fin, End::Reset];
        let down = |mut p: Plan| {
            p.send = 8 * MB;
            p
        };
        let endless = || plan(u64::MAX, 2, 1);
        let downloader = || plan(0, 1, 2);
        // Faults that cut an endless download: both ends must see a reset.
        let cut = |what, fault| CaseDef {
            what,
            fault,
            client: downloader(),
            server: Some(endless()),
            expect_client: RESET,
            expect_server: RESET,
        };
        match self {
            Case::Baseline => CaseDef {
                what: "1 MB up and 8 MB down, FIN both ways",
                fault: Strike::None,
                client: plan(MB, 1, 2),
                server: Some(down(plan(0, 2, 1))),
                expect_client: FIN,
                expect_server: FIN,
            },
            Case::ServerReset => CaseDef {
                what: "the server resets after sending 2 MB of 8",
                fault: Strike::None,
                client: plan(MB, 1, 2),
                server: Some(Plan {
                    abort_after_sent: Some(2 * MB),
                    ..down(plan(0, 2, 1))
                }),
                expect_client: RESET,
                expect_server: &[End::Aborted],
            },
            Case::ServerCrash => CaseDef {
                what: "the server process is killed (SIGKILL) mid-download",
                fault: Strike::ServerCrash,
                client: plan(256 << 10, 1, 2),
                server: None,
                expect_client: RESET,
                expect_server: &[End::Killed],
            },
            Case::ClientAbort => CaseDef {
                what: "the client resets after 1 MB of an endless download",
                fault: Strike::None,
                client: Plan {
                    abort_after_received: Some(MB),
                    ..downloader()
                },
                server: Some(endless()),
                expect_client: &[End::Aborted],
                expect_server: RESET,
            },
            Case::HalfCloseClientFirst => CaseDef {
                what: "the client sends 4 MB and FIN; only then the server sends 4 MB and FIN",
                fault: Strike::None,
                client: plan(4 * MB, 1, 2),
                server: Some(Plan {
                    send_after_peer_fin: true,
                    ..plan(4 * MB, 2, 1)
                }),
                expect_client: FIN,
                expect_server: FIN,
            },
            Case::HalfCloseServerFirst => CaseDef {
                what: "the server sends 4 MB and FIN; only then the client sends 4 MB and FIN",
                fault: Strike::None,
                client: Plan {
                    send_after_peer_fin: true,
                    ..plan(4 * MB, 1, 2)
                },
                server: Some(plan(4 * MB, 2, 1)),
                expect_client: FIN,
                expect_server: FIN,
            },
            // TCP's retransmission back-off may wait up to 2 min after the link is back.
            Case::Outage => CaseDef {
                what: "the link goes down 2 s into the 1 MB up / 8 MB down exchange",
                fault: Strike::Outage(down_s),
                client: Plan {
                    deadline: Duration::from_secs(u64::from(down_s) + 300),
                    ..plan(MB, 1, 2)
                },
                server: Some(Plan {
                    deadline: Duration::from_secs(u64::from(down_s) + 300),
                    ..down(plan(0, 2, 1))
                }),
                expect_client: EITHER,
                expect_server: EITHER,
            },
            Case::EmulatorRestart => CaseDef {
                what: "the link emulator is stopped and started mid-download",
                fault: Strike::EmulatorRestart,
                client: plan(MB, 1, 2),
                server: Some(down(plan(0, 2, 1))),
                expect_client: FIN,
                expect_server: FIN,
            },
            Case::ProxyRestart => cut(
                "every proxy is stopped (SIGTERM) mid-download, then started",
                Strike::ProxyRestart,
            ),
            Case::ProxyCrash => cut(
                "every proxy is killed (SIGKILL) mid-download, then started",
                Strike::ProxyCrash,
            ),
            Case::TunnelPeerRestart => cut(
                "the gateway is stopped (SIGTERM) mid-download, then started",
                Strike::GatewayRestart,
            ),
            Case::TunnelPeerCrash => cut(
                "the gateway is killed (SIGKILL) mid-download, then started",
                Strike::GatewayCrash,
            ),
        }
    }
}

/// What a fault run saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// What was done.
    pub what: String,
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
    /// Empty when the run passed; else why it failed.
    pub problems: Vec<String>,
}

impl Kind for Fault {
    fn metric(&self) -> Metric {
        Metric::Time
    }

    fn check(&self, cell: &CellSpec) -> Result<(), String> {
        let mode = cell.pep.mode;
        match self.case {
            Case::ProxyRestart | Case::ProxyCrash if mode == PepMode::None => {
                return Err(format!(
                    "case '{}': needs a proxy (pep.mode split or tunnel)",
                    self.case.name()
                ))
            }
            Case::TunnelPeerRestart | Case::TunnelPeerCrash if mode != PepMode::Tunnel => {
                return Err(format!(
                    "case '{}': needs the tunnel (pep.mode = \"tunnel\")",
                    self.case.name()
                ))
            }
            _ => {}
        }
        if cell.bridge {
            return Err("kind = \"fault\" needs the emulated link: not with bridge = true".into());
        }
        match (&self.down, self.case) {
            (Some(d), Case::Outage) if !(1.0..=600.0).contains(&d.secs()) => {
                Err(format!("down '{d}': between 1 s and 10 min"))
            }
            (Some(d), c) if c != Case::Outage => Err(format!(
                "down '{d}': only for case 'outage' (not '{}')",
                c.name()
            )),
            _ => Ok(()),
        }
    }

    fn ports(&self) -> std::ops::Range<u16> {
        // Checked transfers, not iperf3: nothing for the socket sampler.
        0..0
    }

    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        _limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        let down_s = self.down.as_ref().map_or(1, |d| d.secs().round() as u32);
        let mut def = self.case.def(down_s);
        // The link as the runner started it, to restore after an outage.
        let mut base = match cell.link_spec() {
            Ok(b) => b,
            Err(e) => return super::failed_unless_interrupted(rec, e),
        };
        // A hang is no progress within the deadline, not a slow link: on a link slower than
        // the exchange's 60 s deadline assumes (8 MB down takes 32 s at 2 Mbit/s), each
        // end gets four times what its bytes take at the link's lowest rate on top.
        if let Ok(link) = base.resolve() {
            let (fwd, ret) = (link.forward.rate.min_bps(), link.ret.rate.min_bps());
            let ideal = |down_bytes: u64, up_bytes: u64| {
                let d = down_bytes.min(64 * MB) as f64 * 8.0 / fwd;
                let u = up_bytes.min(64 * MB) as f64 * 8.0 / ret;
                std::time::Duration::from_secs_f64(4.0 * d.max(u))
            };
            let server_send = def.server.as_ref().map_or(0, |p| p.send);
            let extra = ideal(server_send, def.client.send);
            def.client.deadline += extra;
            if let Some(p) = def.server.as_mut() {
                p.deadline += extra;
            }
        }
        base.seed = Some(rec.seed);
        // A port per cell and repetition: the last one's connections may linger.
        let port = 9400 + ((rec.cell * 3 + rec.repetition as usize) % 900) as u16;
        tick(0.0);
        let r = match run_case(lab, &def, port, &base) {
            Ok(r) => r,
            Err(e) => return super::failed_unless_interrupted(rec, e),
        };
        if crate::interrupted() {
            return Err("interrupted".into());
        }
        rec.samples.push(r.client.secs);
        if !r.problems.is_empty() {
            rec.failures += 1;
            rec.errors.extend(r.problems.iter().cloned());
        }
        rec.fault = Some(r);
        Ok(())
    }
}

impl Case {
    /// Its name in scenarios.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default()
    }
}

fn meant(p: &Plan) -> Option<u64> {
    (p.send != u64::MAX).then_some(p.send)
}

/// Why a cell failed: corruption, a hang, a silent truncation, or an end it should not have.
fn judge(case: &CaseDef, row: &mut FaultRecord) {
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
    let mut cmd = lab.command(Host::Server, exe);
    cmd.args([
        "lab",
        "fault-server",
        "--port",
        &port.to_string(),
        "--seed",
        "2",
    ]);
    crate::sys::spawn_ready(cmd, "crash server")
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
    fault: Strike,
    base: &LinkSpec,
    crash: &mut Option<std::process::Child>,
) -> Result<String, String> {
    let hosts = lab.proxy_hosts();
    match fault {
        Strike::ServerCrash => {
            if let Some(c) = crash.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            Ok(String::new())
        }
        Strike::EmulatorRestart => {
            lab.start_emulator(base)?;
            Ok("emulator back".into())
        }
        Strike::ProxyRestart | Strike::ProxyCrash => {
            let sig = if fault == Strike::ProxyCrash {
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
        Strike::GatewayRestart | Strike::GatewayCrash => {
            let sig = if fault == Strike::GatewayCrash {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            lab.signal_proxy(Host::Gateway, sig);
            lab.restart_proxy(Host::Gateway)?;
            Ok("gateway back".into())
        }
        Strike::None | Strike::Outage(_) => Ok(String::new()),
    }
}

fn run_case(
    lab: &mut Lab,
    case: &CaseDef,
    port: u16,
    base: &LinkSpec,
) -> Result<FaultRecord, String> {
    if let Strike::Outage(d) = case.fault {
        let mut down = base.clone();
        down.outage.down = vec![format!("2s..{}s", 2 + d)];
        lab.start_emulator(&down)?;
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
    if let Strike::Outage(_) = case.fault {
        lab.start_emulator(base)?;
    }
    if case.fault.strikes_live() || matches!(case.fault, Strike::Outage(_)) {
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
    let mut row = FaultRecord {
        what: case.what.into(),
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

/// A byte count for tables.
pub(crate) fn fmt_bytes(n: u64) -> String {
    if n >= MB {
        format!("{:.2} MB", n as f64 / MB as f64)
    } else if n >= 1024 {
        format!("{:.0} KB", n as f64 / 1024.0)
    } else {
        format!("{n} B")
    }
}
