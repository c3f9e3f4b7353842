//! One repetition of one cell: the traffic itself (iperf3, nginx + curl), a sampler of the
//! satellite-leg sender's congestion window and RTT (`ss -ti`), and the emulator's counters.

use super::beside::BesideRecord;
use super::spec::CellSpec;
use super::tunnel_state::sample_tunnel;
use crate::http::{finish_fetch, spawn_fetch_at, HttpServer};
use crate::topology::{Host, Lab, SERVER_V4};
use serde::{Deserialize, Serialize};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One flow of a bulk run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlowRecord {
    /// Start, seconds after the first flow's.
    pub start_s: f64,
    /// Sender's congestion control ("" for the host's default).
    pub cc: String,
    /// Bytes received.
    pub bytes: u64,
    /// Goodput while every flow was running (after the warm-up), bit/s.
    pub goodput_bps: f64,
    /// Sender's retransmitted segments (the end host's, as iperf3 reports them).
    pub retransmits: u64,
    /// (end of interval, seconds since the first flow's start; bytes received in it).
    pub series: Vec<(f64, u64)>,
}

/// One sample of a satellite-leg sender's socket.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SocketSample {
    /// Seconds since the traffic started.
    pub t: f64,
    /// Flow number (iperf3 port − 5201; 0 for HTTP).
    pub flow: u32,
    /// Congestion window, segments.
    pub cwnd: u64,
    /// Smoothed RTT, ms.
    pub rtt_ms: f64,
    /// Segments retransmitted so far.
    pub retrans: u64,
    /// The congestion control the socket runs, as `ss` names it: the record of what ran
    /// (split's default falls back to `bbr` where `satpep_sat` cannot load).
    #[serde(default)]
    pub cc: String,
}

/// What the emulator counted during a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LinkDelta {
    /// Forward frames in.
    pub fwd_frames: u64,
    /// Forward frames dropped as corrupted.
    pub fwd_errors: u64,
    /// Forward frames dropped by the full queue.
    pub fwd_queue_drops: u64,
    /// Forward bytes delivered.
    pub fwd_bytes: u64,
    /// Return frames in.
    pub ret_frames: u64,
    /// Return frames dropped as corrupted.
    pub ret_errors: u64,
    /// Return frames dropped by the full queue.
    pub ret_queue_drops: u64,
    /// Return bytes delivered.
    pub ret_bytes: u64,
}

/// The outcome of one repetition of one cell.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    /// Cell index.
    pub cell: usize,
    /// Repetition, from 0.
    pub repetition: u32,
    /// Seed of the link's loss process.
    pub seed: u64,
    /// The main metric's samples: bulk one goodput (bit/s); http one time per download;
    /// page one load time; interactive one time per request after the first (s).
    pub samples: Vec<f64>,
    /// Bulk: goodput as a share of the physical limit.
    pub utilization: Option<f64>,
    /// Bulk with several flows: Jain's fairness index over the flows' goodputs.
    pub jain: Option<f64>,
    /// Bulk: the flows.
    pub flows: Vec<FlowRecord>,
    /// Satellite-leg sender's sockets over time.
    pub sockets: Vec<SocketSample>,
    /// Tunnel mode: the tunnel's sending end over time (its proxy's `/metrics`).
    #[serde(default)]
    pub tunnel: Vec<super::tunnel_state::TunnelSample>,
    /// Split mode: the satellite model of each connection's sending leg over time (its
    /// proxy's `/connections`).
    #[serde(default)]
    pub split: Vec<super::split_state::SplitSample>,
    /// Split mode: what the proxies held for their connections (sockets' queues and relay
    /// pipes, both proxies), and what their flow control dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<super::split_state::HeldRecord>,
    /// Satellite-leg sender's retransmitted segments (largest socket total seen).
    pub leg_retransmits: u64,
    /// Transfers that failed or arrived short (each is also in `errors`).
    pub failures: u32,
    /// What went wrong, if anything.
    pub errors: Vec<String>,
    /// The emulator's counters over the run.
    pub link: LinkDelta,
    /// Bulk: what the traffic beside it saw (probe, cross traffic, competing flow,
    /// request/responses), when the scenario runs any.
    #[serde(default)]
    pub beside: Option<BesideRecord>,
    /// Bulk: the physical limit over the measured span, bit/s (a rate trace's mean rate).
    #[serde(default)]
    pub limit_bps: Option<f64>,
    /// The build and machine that measured it, and when (absent in older records).
    #[serde(default)]
    pub provenance: Option<super::provenance::Provenance>,
    /// With proxies: the CPU time they used during the run, all together, s.
    #[serde(default)]
    pub proxy_cpu_s: Option<f64>,
    /// The whole machine's busy CPU time during the run, all CPUs, s (end hosts, emulator,
    /// proxies and the kernel's work for them: see [`crate::sys::machine_busy_seconds`]).
    #[serde(default)]
    pub machine_cpu_s: Option<f64>,
    /// With proxies: how many ran.
    #[serde(default)]
    pub proxies: u32,
    /// The run's wall-clock length, s.
    #[serde(default)]
    pub wall_s: f64,
    /// Payload the traffic delivered, where it is exact: http and page, the files that
    /// arrived whole. With [`RunRecord::link`], the protocols' overhead on the link. (Not
    /// bulk: iperf3 counts what arrived within its test, and the link also carried what was
    /// still in flight and queued when it ended.)
    #[serde(default)]
    pub payload_bytes: Option<u64>,
    /// udp: what the run measured beside its delivered rate.
    #[serde(default)]
    pub udp: Option<super::kinds::udp::UdpRecord>,
    /// ping: ping's own summary, and what the link should give.
    #[serde(default)]
    pub ping: Option<super::kinds::ping::PingRecord>,
    /// connections: what many concurrent connections did and cost.
    #[serde(default)]
    pub connections: Option<super::kinds::connections::ConnectionsRecord>,
    /// fault: what each end of the checked transfer saw.
    #[serde(default)]
    pub fault: Option<super::kinds::fault::FaultRecord>,
    /// hub: each terminal's share of the carrier, and the gateway's cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<super::kinds::hub::HubRecord>,
    /// The emulator's release lateness since it started, p99 in the worse direction, ms:
    /// how long after its scheduled time a frame was written (absent on a kernel bridge).
    #[serde(default)]
    pub late_p99_ms: Option<f64>,
    /// Bulk, one flow and no competing one: how long the transfer took to reach the link's
    /// rate (absent where that is not judged, and in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartRecord>,
}

/// How a bulk transfer started: the start-up target of issue 39 (90 % of the link's rate
/// within the slow-start bound plus three round trips) is judged on it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartRecord {
    /// When the transfer first delivered at least 90 % of the physical limit over one
    /// second (the start of that second, on the receiver's 0.1 s intervals), seconds after
    /// its first byte arrived; None if no second did.
    pub reached_90_s: Option<f64>,
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n when one takes everything.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let q: f64 = x.iter().map(|v| v * v).sum();
    if q == 0.0 {
        return 1.0;
    }
    s * s / (x.len() as f64 * q)
}

/// Takes a reading in one host every `every` (`read` runs on a thread in that host's network
/// namespace; None: nothing this time) and hands each to a step function with the seconds
/// since the start, until the step says it is done, `limit` passes, or [`Poll::finish`] is
/// called; the step's state comes back from `finish`. The socket sampler, the first-data
/// watcher and the tunnel sampler run on it.
pub(crate) struct Poll<S> {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<S, String>>,
}

impl<S: Default + Send + 'static> Poll<S> {
    pub(crate) fn start(
        lab: &Lab,
        host: Host,
        every: Duration,
        limit: Duration,
        mut read: impl FnMut() -> Option<String> + Send + 'static,
        mut step: impl FnMut(&mut S, &str, f64) -> bool + Send + 'static,
    ) -> Poll<S> {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let handle = crate::checked::in_netns(&lab.ns(host), move || {
            let mut state = S::default();
            let t0 = Instant::now();
            while !s2.load(Ordering::Relaxed) && t0.elapsed() < limit {
                let t = t0.elapsed();
                if let Some(text) = read() {
                    if step(&mut state, &text, t.as_secs_f64()) {
                        break;
                    }
                }
                while t0.elapsed() < t + every && !s2.load(Ordering::Relaxed) {
                    std::thread::sleep(every.min(Duration::from_millis(20)));
                }
            }
            state
        });
        Poll { stop, handle }
    }

    /// Stops polling; the step's state, or why there is none (the namespace could not be
    /// entered, the reader or the step panicked).
    pub(crate) fn finish(self) -> Result<S, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.join()
    }

    /// Waits until the step says it is done or the limit passes; the step's state, or why
    /// there is none.
    pub(crate) fn join(self) -> Result<S, String> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err("its thread panicked".into()))
    }
}

/// `ss -tinH state established` in the host `ns`.
fn ss_established(ns: String) -> impl FnMut() -> Option<String> + Send + 'static {
    move || {
        crate::sys::in_ns(&ns, "ss")
            .args(["-tinH", "state", "established"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    }
}

/// Samples the satellite-leg sender's sockets every half second.
fn sample_sockets(lab: &Lab, host: Host, ports: std::ops::Range<u16>) -> Poll<Vec<SocketSample>> {
    Poll::start(
        lab,
        host,
        Duration::from_millis(500),
        Duration::MAX,
        ss_established(lab.ns(host)),
        move |out: &mut Vec<SocketSample>, text, t| {
            out.extend(parse_ss(text, t, &ports));
            false
        },
    )
}

/// Watches the receiving host for the first data of each flow on `ports`: iperf3's intervals
/// count from there, seconds after the client started (its control exchange takes about six
/// round trips, 3.4 s on a GEO path). Its state is, per port, the wall clock then (s since the
/// epoch; None if none came). Flows started together do not start together to the
/// millisecond, and a flow whose handshake lost a packet starts a second or more late: their
/// intervals are put on one clock with these.
pub(crate) fn watch_first_data(
    lab: &Lab,
    host: Host,
    ports: std::ops::Range<u16>,
    limit: Duration,
) -> Poll<Vec<Option<f64>>> {
    Poll::start(
        lab,
        host,
        Duration::from_millis(20),
        limit,
        ss_established(lab.ns(host)),
        move |seen: &mut Vec<Option<f64>>, text, _| {
            seen.resize(ports.len(), None);
            let now = super::beside::epoch_now();
            for (slot, port) in seen.iter_mut().zip(ports.clone()) {
                if slot.is_none() && received(text, port) >= FIRST_DATA_BYTES {
                    *slot = Some(now);
                }
            }
            seen.iter().all(Option::is_some)
        },
    )
}

/// More than iperf3's control connection receives before the test starts (its state bytes);
/// less than one full segment of data.
const FIRST_DATA_BYTES: u64 = 1000;

/// The sockets of `ss -tinH` output: a socket line, then an indented line of details. Yields
/// the socket line's ports ([state,] queues, local, peer: ss leaves the state out when
/// filtering by one) with its details line.
fn ss_sockets(text: &str) -> impl Iterator<Item = (Vec<u16>, &str)> {
    let mut ports = None;
    text.lines().filter_map(move |line| {
        if !line.starts_with(|c: char| c.is_whitespace()) {
            let port = |a: &str| a.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
            ports = Some(line.split_whitespace().filter_map(port).collect());
            return None;
        }
        ports.take().map(|p| (p, line))
    })
}

/// The most bytes any socket with local or peer port `port` received, from `ss -tinH`.
pub fn received(text: &str, port: u16) -> u64 {
    ss_sockets(text)
        .filter(|(ports, _)| ports.contains(&port))
        .filter_map(|(_, details)| {
            details
                .split_whitespace()
                .find_map(|t| t.strip_prefix("bytes_received:"))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .max()
        .unwrap_or(0)
}

/// Parses `ss -tinH` output: a socket line, then an indented line of details. Keeps sockets
/// with a local or peer port in `ports` that carried data, one (the busiest) per flow.
pub fn parse_ss(text: &str, t: f64, ports: &std::ops::Range<u16>) -> Vec<SocketSample> {
    let mut best: std::collections::BTreeMap<u32, (u64, SocketSample)> = Default::default();
    for (socket_ports, line) in ss_sockets(text) {
        let Some(f) = socket_ports
            .into_iter()
            .find(|p| ports.contains(p))
            .map(|p| (p - ports.start) as u32)
        else {
            continue;
        };
        let mut s = SocketSample {
            t,
            flow: f,
            cwnd: 0,
            rtt_ms: 0.0,
            retrans: 0,
            cc: String::new(),
        };
        let mut acked = 0u64;
        let mut named = false;
        for tok in line.split_whitespace() {
            // Options (ts, sack, ecn…), then the controller's name, then key:value pairs:
            // the name is the last bare word before the first pair.
            if !named {
                if tok.contains(':') {
                    named = true;
                } else {
                    s.cc = tok.to_string();
                    continue;
                }
            }
            if let Some(v) = tok.strip_prefix("cwnd:") {
                s.cwnd = v.parse().unwrap_or(0);
            } else if let Some(v) = tok.strip_prefix("rtt:") {
                s.rtt_ms = v
                    .split('/')
                    .next()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0.0);
            } else if let Some(v) = tok.strip_prefix("retrans:") {
                s.retrans = v
                    .split('/')
                    .nth(1)
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
            } else if let Some(v) = tok.strip_prefix("bytes_acked:") {
                acked = v.parse().unwrap_or(0);
            }
        }
        // iperf3's control connection shares the port; the data socket is the busy one.
        if acked > 10_000 && best.get(&f).is_none_or(|(a, _)| acked > *a) {
            best.insert(f, (acked, s));
        }
    }
    best.into_values().map(|(_, s)| s).collect()
}

/// The host whose TCP sockets send across the satellite in `direction`.
fn leg_sender(spec: &CellSpec, download: bool) -> Host {
    let split = spec.pep.mode.splits();
    match (download, split) {
        (true, true) if !spec.pep.terminal_only => Host::Gateway,
        (true, _) => Host::Server,
        (false, true) => Host::Terminal,
        (false, false) => Host::Client,
    }
}

fn link_delta(
    before: &satpep_link::stats::LinkSnapshot,
    after: &satpep_link::stats::LinkSnapshot,
) -> LinkDelta {
    let (f0, f1, r0, r1) = (&before.forward, &after.forward, &before.ret, &after.ret);
    LinkDelta {
        fwd_frames: f1.frames_in.saturating_sub(f0.frames_in),
        fwd_errors: f1.dropped_error.saturating_sub(f0.dropped_error),
        fwd_queue_drops: f1.dropped_queue.saturating_sub(f0.dropped_queue),
        fwd_bytes: f1.delivered_bytes.saturating_sub(f0.delivered_bytes),
        ret_frames: f1_sub(r1.frames_in, r0.frames_in),
        ret_errors: f1_sub(r1.dropped_error, r0.dropped_error),
        ret_queue_drops: f1_sub(r1.dropped_queue, r0.dropped_queue),
        ret_bytes: f1_sub(r1.delivered_bytes, r0.delivered_bytes),
    }
}

fn f1_sub(a: u64, b: u64) -> u64 {
    a.saturating_sub(b)
}

/// Runs one repetition of `spec` on `lab` (already set up for it). `limit_bps` is the
/// physical limit of the direction the traffic uses; `tick(elapsed)` reports progress.
/// Only an interrupt is an `Err`; failed transfers are counted in the record.
pub fn run_once(
    lab: &mut Lab,
    spec: &CellSpec,
    cell: usize,
    repetition: u32,
    limit_bps: Option<f64>,
    tick: &mut dyn FnMut(f64),
) -> Result<RunRecord, String> {
    let mut rec = RunRecord {
        cell,
        repetition,
        seed: spec.seed + repetition as u64,
        samples: Vec::new(),
        utilization: None,
        jain: None,
        flows: Vec::new(),
        sockets: Vec::new(),
        tunnel: Vec::new(),
        split: Vec::new(),
        held: None,
        leg_retransmits: 0,
        failures: 0,
        errors: Vec::new(),
        link: LinkDelta::default(),
        beside: None,
        limit_bps: None,
        provenance: Some(super::provenance::Provenance::here()),
        proxy_cpu_s: None,
        machine_cpu_s: None,
        proxies: 0,
        wall_s: 0.0,
        payload_bytes: None,
        udp: None,
        ping: None,
        connections: None,
        fault: None,
        hub: None,
        late_p99_ms: None,
        start: None,
    };
    let pids = lab.state().proxy_pids.clone();
    let cpu0: f64 = pids.iter().map(|&p| crate::sys::cpu_seconds(p)).sum();
    let machine0 = crate::sys::machine_busy_seconds();
    let t0 = Instant::now();
    let before = lab.link_stats().ok();
    let kind = spec.traffic.kind();
    let sampler = (!kind.ports().is_empty())
        .then(|| sample_sockets(lab, leg_sender(spec, kind.downloads()), kind.ports()));
    // The tunnel's sending end: the gateway for downloads, the terminal for uploads.
    let tunnel = (spec.pep.mode == super::spec::PepMode::Tunnel).then(|| {
        let host = if kind.downloads() {
            Host::Gateway
        } else {
            Host::Terminal
        };
        sample_tunnel(lab, host)
    });
    // Split's proxies, each read once every half second: what both hold for their
    // connections, and the satellite models of the one that sends across the link (none
    // without one there). Split starts the terminal's first, the gateway's unless the
    // terminal is alone.
    let sender = leg_sender(spec, kind.downloads());
    let proxies: Vec<_> = if spec.pep.mode == super::spec::PepMode::Split {
        [Host::Terminal, Host::Gateway]
            .into_iter()
            .take(lab.state().proxy_pids.len())
            .map(|h| (h, super::split_state::sample_proxy(lab, h, h == sender)))
            .collect()
    } else {
        Vec::new()
    };
    let res = kind.run(lab, spec, &mut rec, limit_bps, tick);
    let mut held = Vec::new();
    for (host, p) in proxies {
        match p.finish() {
            Ok(s) => {
                held.push(s.held);
                if host == sender {
                    rec.split = s.models;
                }
            }
            Err(e) => rec
                .errors
                .push(format!("split proxy sampler ({host:?}): {e}")),
        }
    }
    rec.held = super::split_state::held_record(&held);
    match sampler.map(Poll::finish) {
        Some(Ok(s)) => rec.sockets = s,
        Some(Err(e)) => rec.errors.push(format!("socket sampler: {e}")),
        None => {}
    }
    match tunnel.map(Poll::finish) {
        Some(Ok(t)) => rec.tunnel = t,
        Some(Err(e)) => rec.errors.push(format!("tunnel sampler: {e}")),
        None => {}
    }
    // Each flow's socket counts up; sum the flows' last (largest) counts.
    let mut per_flow = std::collections::BTreeMap::new();
    for s in &rec.sockets {
        let m = per_flow.entry(s.flow).or_insert(0u64);
        *m = (*m).max(s.retrans);
    }
    rec.leg_retransmits = per_flow.values().sum();
    rec.wall_s = t0.elapsed().as_secs_f64();
    if let (Some(a), Some(b)) = (machine0, crate::sys::machine_busy_seconds()) {
        rec.machine_cpu_s = Some(b - a);
    }
    if !pids.is_empty() {
        let cpu: f64 = pids.iter().map(|&p| crate::sys::cpu_seconds(p)).sum();
        rec.proxy_cpu_s = Some(cpu - cpu0);
        rec.proxies = pids.len() as u32;
    }
    res?;
    if let (Some(b), Ok(a)) = (before, lab.link_stats()) {
        rec.link = link_delta(&b, &a);
        rec.late_p99_ms = Some(a.forward.late_p99_ms.max(a.ret.late_p99_ms));
    }
    Ok(rec)
}

pub(crate) fn wait_child(
    child: &mut Child,
    deadline: Instant,
    start: Instant,
    tick: &mut dyn FnMut(f64),
) -> Result<bool, String> {
    wait_child_past(child, deadline, start, tick, &mut |_| false)
}

/// [`wait_child`], but past `deadline` it waits on for as long as `more(now)` says so
/// (asked about every 50 ms); killed once it says no.
pub(crate) fn wait_child_past(
    child: &mut Child,
    deadline: Instant,
    start: Instant,
    tick: &mut dyn FnMut(f64),
    more: &mut dyn FnMut(Instant) -> bool,
) -> Result<bool, String> {
    let mut last = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return Ok(true);
        }
        if crate::interrupted() {
            let _ = child.kill();
            let _ = child.wait();
            return Err("interrupted".into());
        }
        let now = Instant::now();
        if now > deadline && !more(now) {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(false);
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            tick(start.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts nginx serving one file of `size` bytes called `name`; returns the server, the time
/// limit (the cell's duration, s) and the file's URL.
pub(crate) fn serve_one(
    lab: &Lab,
    spec: &CellSpec,
    name: &str,
    size: u64,
) -> Result<(HttpServer, u32, String), String> {
    let server = HttpServer::start(lab, Host::Server, &[(name, size as usize)])?;
    let max = spec.duration.secs().ceil() as u32;
    Ok((server, max, format!("http://{SERVER_V4}/{name}")))
}

/// One curl download, waiting with progress; Ok(Err) when it failed or arrived short.
pub(crate) fn fetch_checked(
    lab: &Lab,
    url: &str,
    size: u64,
    max_s: u32,
    read_bps: Option<u64>,
    start: Instant,
    tick: &mut dyn FnMut(f64),
) -> Result<Result<f64, String>, String> {
    let mut all = fetch_all_checked(lab, url, size, max_s, read_bps, 1, start, tick)?;
    Ok(all.pop().expect("one download"))
}

/// `n` curl downloads started together, each on its own connection, waiting with progress;
/// one Ok(seconds) or Err(what went wrong) per download, in start order. Interrupted, every
/// download still running is stopped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fetch_all_checked(
    lab: &Lab,
    url: &str,
    size: u64,
    max_s: u32,
    read_bps: Option<u64>,
    n: u32,
    start: Instant,
    tick: &mut dyn FnMut(f64),
) -> Result<Vec<Result<f64, String>>, String> {
    let mut children: Vec<Child> = (0..n)
        .map(|_| spawn_fetch_at(lab, Host::Client, url, None, max_s, read_bps))
        .collect();
    // All started together, so one deadline holds for all of them.
    let deadline = Instant::now() + Duration::from_secs(max_s as u64 + 5);
    for i in 0..children.len() {
        if let Err(e) = wait_child(&mut children[i], deadline, start, tick) {
            for c in &mut children[i + 1..] {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Err(e);
        }
    }
    Ok(children
        .into_iter()
        .map(|child| {
            let f = finish_fetch(child, None);
            if f.exit != 0 || f.status != 200 || f.bytes != size {
                Err(format!(
                    "{url}: curl exit {}, HTTP {}, {} of {size} bytes",
                    f.exit, f.status, f.bytes
                ))
            } else {
                Ok(f.total_s)
            }
        })
        .collect())
}

/// Runs a prepared curl command (its `--max-time` is `max_s`) with progress; returns whether
/// it ended by itself, and its output.
pub(crate) fn run_curl(
    mut c: std::process::Command,
    max_s: u32,
    start: Instant,
    tick: &mut dyn FnMut(f64),
) -> Result<(bool, std::process::Output), String> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start curl: {e}"))?;
    let ok = wait_child(
        &mut child,
        Instant::now() + Duration::from_secs(max_s as u64 + 5),
        start,
        tick,
    )?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    Ok((ok, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert!((jain(&[5.0, 5.0, 5.0, 5.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
    }

    #[test]
    fn ss_output_keeps_the_busy_socket_per_flow() {
        let text = "0      0      198.18.3.2:5201 198.18.1.2:40000\n\t cubic wscale:7,7 rto:800 rtt:600.5/2.1 mss:1448 cwnd:10 bytes_acked:120 retrans:0/0\n\
ESTAB 0      0      198.18.3.2:5201 198.18.1.2:40002\n\t ts sack bbr rtt:612.25/3 mss:1448 cwnd:420 bytes_acked:9000000 retrans:2/37\n\
ESTAB 0      0      198.18.3.2:5202 198.18.1.2:40004\n\t cubic rtt:700/3 cwnd:55 bytes_acked:800000 retrans:0/4\n\
ESTAB 0      0      198.18.3.2:22 198.18.1.2:40006\n\t cubic rtt:1/1 cwnd:5 bytes_acked:99999999\n";
        let s = parse_ss(text, 1.5, &(5201..5203));
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].flow, s[0].cwnd, s[0].retrans), (0, 420, 37));
        assert!((s[0].rtt_ms - 612.25).abs() < 1e-9);
        assert_eq!((s[1].flow, s[1].cwnd, s[1].retrans), (1, 55, 4));
        assert_eq!(s[1].t, 1.5);
        assert_eq!((s[0].cc.as_str(), s[1].cc.as_str()), ("bbr", "cubic"));
        // Options come before the name; a BPF controller is named as the kernel's are.
        let text = "ESTAB 0 0 198.18.3.2:5201 198.18.1.2:40002\n\t ts sack satpep_sat wscale:7,7 rtt:600/1 cwnd:300 bytes_acked:50000\n";
        let s = parse_ss(text, 0.5, &(5201..5203));
        assert_eq!(s[0].cc, "satpep_sat");
        assert_eq!(s[0].cwnd, 300);
    }

    #[test]
    fn received_counts_the_sockets_of_one_port_only() {
        // The client of a download: iperf3's control connection and its data connection to
        // 5201, another flow's on 5202.
        let text = "0 0 198.18.1.2:40000 198.18.3.2:5201
	 cubic rtt:600/2 bytes_received:4 segs_in:3
0 0 198.18.1.2:40002 198.18.3.2:5201
	 cubic rtt:600/2 bytes_received:46336 segs_in:33
0 0 198.18.1.2:40004 198.18.3.2:5202
	 cubic rtt:600/2 bytes_received:9999999
";
        assert_eq!(received(text, 5201), 46336);
        assert_eq!(received(text, 5202), 9999999);
        assert_eq!(received(text, 5203), 0);
        // Before the test starts only the control bytes are there.
        assert!(
            received(&text.lines().take(2).collect::<Vec<_>>().join("\n"), 5201) < FIRST_DATA_BYTES
        );
    }
}
