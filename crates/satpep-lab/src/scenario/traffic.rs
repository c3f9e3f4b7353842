//! One repetition of one cell: the traffic itself (iperf3, nginx + curl), a sampler of the
//! satellite-leg sender's congestion window and RTT (`ss -ti`), and the emulator's counters.

use super::beside::{Beside, BesideRecord};
use super::spec::{CellSpec, Direction, Size, TrafficKind};
use crate::http::{finish_fetch, spawn_fetch, HttpServer};
use crate::iperf::Server;
use crate::topology::{Host, Lab, SERVER_V4};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First iperf3 port; flow i uses BASE_PORT + i.
const BASE_PORT: u16 = 5201;

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

/// Runs `ss -tinH state established` in one host every `every` and hands each output to a
/// step function with the seconds since the start, until the step says it is done, `limit`
/// passes, or [`SsPoll::finish`] is called; the step's state comes back from `finish`. The
/// socket sampler and the first-data watcher run on it.
struct SsPoll<S> {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<S>>,
}

impl<S: Default + Send + 'static> SsPoll<S> {
    fn start(
        lab: &Lab,
        host: Host,
        every: Duration,
        limit: Duration,
        mut step: impl FnMut(&mut S, &str, f64) -> bool + Send + 'static,
    ) -> SsPoll<S> {
        let stop = Arc::new(AtomicBool::new(false));
        let ns = lab.ns(host);
        let s2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut state = S::default();
            let t0 = Instant::now();
            while !s2.load(Ordering::Relaxed) && t0.elapsed() < limit {
                let t = t0.elapsed();
                if let Ok(o) = std::process::Command::new("ip")
                    .args(["netns", "exec", &ns, "ss", "-tinH", "state", "established"])
                    .output()
                {
                    let text = String::from_utf8_lossy(&o.stdout);
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
        SsPoll {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> S {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

/// Samples the satellite-leg sender's sockets every half second.
fn sample_sockets(lab: &Lab, host: Host, ports: std::ops::Range<u16>) -> SsPoll<Vec<SocketSample>> {
    SsPoll::start(
        lab,
        host,
        Duration::from_millis(500),
        Duration::MAX,
        move |out: &mut Vec<SocketSample>, text, t| {
            out.extend(parse_ss(text, t, &ports));
            false
        },
    )
}

/// Watches the receiving host for the first data of the flow on `port`: iperf3's intervals
/// count from there, seconds after the client started (its control exchange takes about six
/// round trips, 3.4 s on a GEO path). Its state is the wall clock then, s since the epoch.
fn watch_first_data(lab: &Lab, host: Host, port: u16, limit: Duration) -> SsPoll<Option<f64>> {
    SsPoll::start(
        lab,
        host,
        Duration::from_millis(20),
        limit,
        move |seen: &mut Option<f64>, text, _| {
            let arrived = received(text, port) >= FIRST_DATA_BYTES;
            if arrived {
                *seen = Some(super::beside::epoch_now());
            }
            arrived
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
    lab: &Lab,
    spec: &CellSpec,
    cell: usize,
    repetition: u32,
    limit_bps: f64,
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
        leg_retransmits: 0,
        failures: 0,
        errors: Vec::new(),
        link: LinkDelta::default(),
        beside: None,
        limit_bps: None,
        provenance: Some(super::provenance::Provenance::here()),
    };
    let before = lab.link_stats().ok();
    let t = &spec.traffic;
    let download = t.direction == Direction::Download;
    let ports = match t.kind {
        TrafficKind::Bulk => BASE_PORT..BASE_PORT + t.flows as u16,
        TrafficKind::Http | TrafficKind::Page | TrafficKind::Interactive => 80..81,
    };
    let sampler = sample_sockets(lab, leg_sender(spec, download), ports);
    let res = match t.kind {
        TrafficKind::Bulk => bulk(lab, spec, &mut rec, limit_bps, tick),
        TrafficKind::Http => http(lab, spec, &mut rec, tick),
        TrafficKind::Page => page(lab, spec, &mut rec, tick),
        TrafficKind::Interactive => interactive(lab, spec, &mut rec, tick),
    };
    rec.sockets = sampler.finish();
    // Each flow's socket counts up; sum the flows' last (largest) counts.
    let mut per_flow = std::collections::BTreeMap::new();
    for s in &rec.sockets {
        let m = per_flow.entry(s.flow).or_insert(0u64);
        *m = (*m).max(s.retrans);
    }
    rec.leg_retransmits = per_flow.values().sum();
    res?;
    if let (Some(b), Ok(a)) = (before, lab.link_stats()) {
        rec.link = link_delta(&b, &a);
    }
    Ok(rec)
}

fn wait_child(
    child: &mut Child,
    deadline: Instant,
    start: Instant,
    tick: &mut dyn FnMut(f64),
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
        if Instant::now() > deadline {
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

fn bulk(
    lab: &Lab,
    spec: &CellSpec,
    rec: &mut RunRecord,
    limit_bps: f64,
    tick: &mut dyn FnMut(f64),
) -> Result<(), String> {
    let t = &spec.traffic;
    let dur = spec.duration.secs();
    let warm = spec.warmup.secs();
    let stagger = t.stagger.secs();
    let download = t.direction == Direction::Download;
    let (client_host, server_host) = (Host::Client, Host::Server);
    let n = t.flows as usize;
    let mut servers = Vec::new();
    for i in 0..n {
        match Server::start(lab, server_host, BASE_PORT + i as u16) {
            Ok(s) => servers.push(Some(s)),
            Err(e) => {
                rec.failures += 1;
                rec.errors.push(format!("flow {i}: {e}"));
                servers.push(None);
            }
        }
    }
    let beside = Beside::start(lab, spec, dur);
    let receiver = if download { client_host } else { server_host };
    let first_data = watch_first_data(lab, receiver, BASE_PORT, Duration::from_secs_f64(dur));
    let start = Instant::now();
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut ccs = Vec::new();
    let mut last_tick = Instant::now();
    for (i, server) in servers.iter().enumerate() {
        let at = Duration::from_secs_f64(stagger * i as f64);
        while start.elapsed() < at {
            if crate::interrupted() {
                for c in children.iter_mut().flatten() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err("interrupted".into());
            }
            if last_tick.elapsed() >= Duration::from_secs(1) {
                last_tick = Instant::now();
                tick(start.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let cc = if t.cc.is_empty() {
            String::new()
        } else {
            t.cc[i % t.cc.len()].clone()
        };
        ccs.push(cc.clone());
        let run_for = (dur - stagger * i as f64).round().max(1.0) as u32;
        let mut args: Vec<String> = vec![
            "-c".into(),
            SERVER_V4.into(),
            "-p".into(),
            (BASE_PORT + i as u16).to_string(),
            "-t".into(),
            run_for.to_string(),
            "-J".into(),
        ];
        if download {
            args.push("-R".into());
        }
        if !cc.is_empty() {
            crate::topology::ensure_cc(&cc)?;
            args.extend(["-C".into(), cc]);
        }
        if let Some(w) = &t.window {
            args.extend(["-w".into(), w.bytes().to_string()]);
        }
        let child = if server.is_some() {
            lab.command(client_host, "iperf3")
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start iperf3: {e}"))
                .ok()
        } else {
            None
        };
        children.push(child);
    }
    // iperf3 ends on its own after -t; allow the queue to drain and slow closes.
    let deadline = start + Duration::from_secs_f64(dur + 30.0);
    let mut outputs = Vec::new();
    for c in children.iter_mut() {
        match c {
            Some(ch) => {
                let done = wait_child(ch, deadline, start, tick)?;
                outputs.push(Some(done));
            }
            None => outputs.push(None),
        }
    }
    let mut flows = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let start_s = stagger * i as f64;
        let mut flow = FlowRecord {
            start_s,
            cc: ccs[i].clone(),
            bytes: 0,
            goodput_bps: 0.0,
            retransmits: 0,
            series: Vec::new(),
        };
        let (Some(child), Some(done)) = (child, outputs[i]) else {
            flows.push(flow);
            continue;
        };
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let cv: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let sv = servers[i]
            .take()
            .and_then(|s| s.output().ok())
            .unwrap_or(Value::Null);
        if !done || cv["error"].is_string() || !out.status.success() {
            rec.failures += 1;
            rec.errors.push(format!(
                "flow {i}: {}",
                cv["error"].as_str().map(String::from).unwrap_or_else(|| {
                    if done {
                        String::from_utf8_lossy(&out.stderr).trim().to_string()
                    } else {
                        "iperf3 did not finish".into()
                    }
                })
            ));
        }
        let (recv, send) = if download { (&cv, &sv) } else { (&sv, &cv) };
        flow.series = crate::iperf::intervals(recv)
            .into_iter()
            .map(|(end, bytes)| (end + start_s, bytes))
            .collect();
        flow.bytes = flow.series.iter().map(|(_, b)| b).sum();
        flow.retransmits = send["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
        flows.push(flow);
    }
    // Aggregate goodput after the warm-up; per-flow goodput while all flows ran.
    let all_from = warm.max(stagger * (n as f64 - 1.0));
    // A flow's last interval is left out: it also holds what was still queued when its
    // sender stopped, which would count the queue as goodput (as TcpResult::goodput_after).
    let window = |f: &FlowRecord, from: f64| -> (u64, f64, f64) {
        let mut prev = f.start_s;
        let (mut b, mut s, mut last) = (0u64, 0.0, from);
        let n = f.series.len();
        for (k, &(end, bytes)) in f.series.iter().enumerate() {
            if prev >= from - 1e-6 && k + 1 < n {
                b += bytes;
                s += end - prev;
                last = end;
            }
            prev = end;
        }
        (b, s, last)
    };
    // iperf3's intervals count from the first data's arrival, seconds after the client
    // started; what arrived then passed the emulator one forward delay earlier.
    let data_epoch = first_data.finish();
    let total_bytes: u64 = flows.iter().map(|f| window(f, warm).0).sum();
    let last_end = flows.iter().map(|f| window(f, warm).2).fold(warm, f64::max);
    let span = (last_end - warm).max(1e-3);
    let goodput = total_bytes as f64 * 8.0 / span;
    for f in flows.iter_mut() {
        let (b, s, _) = window(f, all_from);
        f.goodput_bps = if s > 0.0 { b as f64 * 8.0 / s } else { 0.0 };
    }
    // The link as the emulator runs it, resolved once (traces may be files): the limit's
    // rate trace and the probe's delay traces are read from it.
    let cfg = spec.link_spec().and_then(|l| l.resolve());
    let limit_bps = match &cfg {
        Ok(cfg) => {
            let d = if download { &cfg.forward } else { &cfg.ret };
            // With a rate trace the limit is the trace's mean over the measured span.
            let at_link = beside
                .clock()
                .uptime_at_data(data_epoch)
                .map(|u| u - d.delay.at(u * 1e9) / 1e9);
            let limit_bps = match at_link {
                Some(u0) => {
                    let (a, b) = ((u0 + warm) * 1e9, (u0 + last_end) * 1e9);
                    limit_bps * d.rate.mean_bps(a, b) / d.rate.max_bps()
                }
                None => limit_bps,
            };
            // Cross traffic takes its share of the link first: 1200-byte datagrams in
            // 1242-byte frames.
            match t.cross_udp.as_deref().map(satpep_link::units::parse_rate) {
                Some(Ok(cross)) => {
                    limit_bps * (1.0 - cross * 1242.0 / 1200.0 / d.rate.max_bps()).max(0.0)
                }
                _ => limit_bps,
            }
        }
        Err(_) => limit_bps,
    };
    rec.limit_bps = Some(limit_bps);
    if rec.failures == 0 {
        rec.samples.push(goodput);
        rec.utilization = Some(goodput / limit_bps);
    }
    if t.runs_beside() {
        let base = |u: f64| {
            cfg.as_ref()
                .map_or(0.0, |c| super::beside::base_rtt_ms(c, u))
        };
        rec.beside = Some(beside.finish(&base, warm, data_epoch, &mut rec.errors));
    }
    if n > 1 {
        rec.jain = Some(jain(
            &flows.iter().map(|f| f.goodput_bps).collect::<Vec<_>>(),
        ));
    }
    rec.flows = flows;
    Ok(())
}

/// Starts nginx serving one file of `traffic.size` called `name`; returns its size, the
/// server, the time limit (s) and the file's URL.
fn serve_one(
    lab: &Lab,
    spec: &CellSpec,
    name: &str,
) -> Result<(u64, HttpServer, u32, String), String> {
    let size = spec.traffic.size.as_ref().map_or(0, Size::bytes);
    let server = HttpServer::start(lab, Host::Server, &[(name, size as usize)])?;
    let max = spec.duration.secs().ceil() as u32;
    Ok((size, server, max, format!("http://{SERVER_V4}/{name}")))
}

fn http(
    lab: &Lab,
    spec: &CellSpec,
    rec: &mut RunRecord,
    tick: &mut dyn FnMut(f64),
) -> Result<(), String> {
    let t = &spec.traffic;
    let (size, server, max, url) = serve_one(lab, spec, "file.bin")?;
    let start = Instant::now();
    for _ in 0..t.count {
        let f = fetch_checked(lab, &url, size, max, start, tick)?;
        match f {
            Ok(s) => rec.samples.push(s),
            Err(e) => {
                rec.failures += 1;
                rec.errors.push(e);
            }
        }
    }
    drop(server);
    Ok(())
}

/// One curl download, waiting with progress; Ok(Err) when it failed or arrived short.
fn fetch_checked(
    lab: &Lab,
    url: &str,
    size: u64,
    max_s: u32,
    start: Instant,
    tick: &mut dyn FnMut(f64),
) -> Result<Result<f64, String>, String> {
    let mut child = spawn_fetch(lab, Host::Client, url, None, max_s);
    wait_child(
        &mut child,
        Instant::now() + Duration::from_secs(max_s as u64 + 5),
        start,
        tick,
    )?;
    let f = finish_fetch(child, None);
    if f.exit != 0 || f.status != 200 || f.bytes != size {
        return Ok(Err(format!(
            "{url}: curl exit {}, HTTP {}, {} of {size} bytes",
            f.exit, f.status, f.bytes
        )));
    }
    Ok(Ok(f.total_s))
}

/// Runs a prepared curl command (its `--max-time` is `max_s`) with progress; returns whether
/// it ended by itself, and its output.
fn run_curl(
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

fn page(
    lab: &Lab,
    spec: &CellSpec,
    rec: &mut RunRecord,
    tick: &mut dyn FnMut(f64),
) -> Result<(), String> {
    let t = &spec.traffic;
    let sizes: Vec<u64> = t.objects.iter().map(Size::bytes).collect();
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("o{i}.bin")).collect();
    let files: Vec<(&str, usize)> = names
        .iter()
        .map(String::as_str)
        .zip(sizes.iter().map(|&s| s as usize))
        .collect();
    let server = HttpServer::start(lab, Host::Server, &files)?;
    let max = spec.duration.secs().ceil() as u32;
    let start = Instant::now();
    let base = format!("http://{SERVER_V4}/");
    // The document first, then its objects over `connections` parallel connections.
    let doc = fetch_checked(
        lab,
        &format!("{base}{}", names[0]),
        sizes[0],
        max,
        start,
        tick,
    )?;
    if let Err(e) = doc {
        rec.failures += 1;
        rec.errors.push(e);
        return Ok(());
    }
    if sizes.len() > 1 {
        let mut c = lab.command(Host::Client, "curl");
        c.args([
            "-s",
            "--parallel",
            "--parallel-max",
            &t.connections.to_string(),
            "--max-time",
            &max.to_string(),
            "-w",
            "%{size_download} %{http_code}\n",
        ]);
        for n in &names[1..] {
            c.args(["-o", "/dev/null", &format!("{base}{n}")]);
        }
        let (ok, out) = run_curl(c, max, start, tick)?;
        let text = String::from_utf8_lossy(&out.stdout);
        // Completion order is not request order: compare the multisets of sizes.
        let mut got: Vec<u64> = text
            .lines()
            .filter(|l| l.ends_with(" 200"))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect();
        let mut want = sizes[1..].to_vec();
        got.sort_unstable();
        want.sort_unstable();
        if !ok || !out.status.success() || got != want {
            rec.failures += 1;
            rec.errors.push(format!(
                "page objects: {} of {} arrived whole (curl {})",
                got.len(),
                want.len(),
                out.status
            ));
            return Ok(());
        }
    }
    rec.samples.push(start.elapsed().as_secs_f64());
    drop(server);
    Ok(())
}

fn interactive(
    lab: &Lab,
    spec: &CellSpec,
    rec: &mut RunRecord,
    tick: &mut dyn FnMut(f64),
) -> Result<(), String> {
    let t = &spec.traffic;
    let (size, server, max, url) = serve_one(lab, spec, "r.bin")?;
    // count + 1 requests on one keep-alive connection; the first also opens it.
    let mut c = lab.command(Host::Client, "curl");
    c.args([
        "-s",
        "--max-time",
        &max.to_string(),
        "-w",
        "%{time_total} %{size_download} %{http_code} %{num_connects}\n",
    ]);
    for _ in 0..=t.count {
        c.args(["-o", "/dev/null", &url]);
    }
    let start = Instant::now();
    let (ok, out) = run_curl(c, max, start, tick)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut reconnects = 0;
    for (k, l) in text.lines().enumerate() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (Some(ts), Some(b), Some(code), Some(conn)) = (w.first(), w.get(1), w.get(2), w.get(3))
        else {
            continue;
        };
        if *code != "200" || b.parse::<u64>().ok() != Some(size) {
            rec.failures += 1;
            rec.errors
                .push(format!("request {k}: HTTP {code}, {b} of {size} bytes"));
            continue;
        }
        if k > 0 {
            if *conn != "0" {
                reconnects += 1;
            }
            rec.samples.push(ts.parse().unwrap_or(0.0));
        }
    }
    if !ok || rec.samples.len() < t.count as usize {
        rec.failures += 1;
        rec.errors.push(format!(
            "{} of {} responses arrived",
            rec.samples.len(),
            t.count
        ));
    }
    if reconnects > 0 {
        rec.errors
            .push(format!("{reconnects} requests needed a new connection"));
    }
    drop(server);
    Ok(())
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
