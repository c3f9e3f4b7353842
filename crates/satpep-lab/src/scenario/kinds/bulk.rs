//! `kind = "bulk"`: iperf3 transfers for the cell's duration, one server per flow; goodput
//! after the warm-up, with what runs beside them (probe, requests, UDP cross traffic, a
//! competing TCP flow).

use super::{check_count, one, Kind};
use crate::iperf::{spawn_client, Client, Server};
use crate::scenario::beside::{cross_frame_bps, Beside};
use crate::scenario::spec::{CellSpec, Metric, Size, Span};
use crate::scenario::traffic::{
    jain, wait_child_past, watch_first_data, FlowRecord, RunRecord, StartRecord,
};
use crate::topology::{Host, Lab};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::ops::Range;
use std::process::Child;
use std::time::{Duration, Instant};

/// First iperf3 port; flow i uses BASE_PORT + i.
pub const BASE_PORT: u16 = 5201;

/// iperf3 reports every 0.1 s (its least interval), client and server alike: the start-up
/// is read from them ([`reached`]), the one-second series from their sums ([`by_second`]).
/// Read from one-second intervals, a transfer at the link's rate 0.3 s in (a LEO path's
/// slow-start bound) showed 90 % only in its second interval: the first held its start.
const FINE_ARGS: [&str; 2] = ["-i", "0.1"];

/// The length of the window the start-up is read over, s.
const START_WINDOW_S: f64 = 1.0;

/// How far a window's intervals may run past or fall short of [`START_WINDOW_S`], s: half
/// an interval (iperf3's 0.1 s intervals last 0.1 s and a few hundred microseconds).
const START_SLACK_S: f64 = 0.05;

/// Which way a bulk transfer goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// The server sends (across the forward link).
    #[default]
    Download,
    /// The client sends (across the return link).
    Upload,
}

/// Bulk transfers, and what runs beside them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bulk {
    /// Number of flows.
    #[serde(default = "one")]
    pub flows: u32,
    /// Delay between flow starts; all flows end together.
    #[serde(default = "zero")]
    pub stagger: Span,
    /// The senders' congestion controls, one per flow (cycled); default the host's.
    #[serde(default)]
    pub cc: Vec<String>,
    /// download (server sends) or upload.
    #[serde(default)]
    pub direction: Direction,
    /// Socket buffer (iperf3 -w), which caps the window, e.g. "64KB".
    #[serde(default)]
    pub window: Option<Size>,
    /// A ping probe every 100 ms from the client to the server beside the transfer; its RTT
    /// above the path's base RTT is the queueing delay it met.
    #[serde(default)]
    pub probe: bool,
    /// Constant-rate UDP cross traffic from the server to the client beside the transfer,
    /// e.g. "20Mbit" (payload rate); its loss is reported.
    #[serde(default)]
    pub cross_udp: Option<String>,
    /// A competing end-to-end TCP download beside the transfer (never intercepted by a PEP;
    /// the server's controller); the shares are reported.
    #[serde(default)]
    pub competing: bool,
    /// The competing flow arrives this long after the transfer began (default 0: both start
    /// together), e.g. "10s"; the share is then read from its arrival plus the warm-up, for
    /// both flows over the same span.
    #[serde(default = "zero")]
    pub competing_after: Span,
    /// Small request/responses beside the transfer, one a second on one keep-alive
    /// connection through the PEP, each fetching a file of this size, e.g. "1KB".
    #[serde(default)]
    pub requests: Option<Size>,
    /// End-to-end TCP flows of the dumbbell's other hosts beside the transfer: they share
    /// the link's queue but take a path of their own (e.g. 25 ms RTT, terrestrial hosts
    /// near the bottleneck), and no proxy touches them; their goodput and the transfer's
    /// share of everything are reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background: Option<Background>,
}

/// `traffic.background`: the dumbbell's other host pairs, one flow each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Background {
    /// Host pairs (flows), 1 to 16.
    pub flows: u32,
    /// Their path's round-trip propagation delay (half each way after the shared queue),
    /// e.g. "25ms".
    pub rtt: Span,
    /// Their senders' congestion control (iperf3 -C); default the host's.
    #[serde(default)]
    pub cc: Option<String>,
}

/// The client-side addresses of the background pairs: 198.18.1.16 + i (the server side
/// 198.18.3.16 + i), in a /28 the proxies never intercept.
pub const BACKGROUND_CLIENTS: &str = crate::topology::BACKGROUND_NETS[0];
/// The server side of [`BACKGROUND_CLIENTS`].
pub const BACKGROUND_SERVERS: &str = crate::topology::BACKGROUND_NETS[1];

impl Background {
    /// The `i`-th pair's (client, server) addresses: the `i`-th address of each of the
    /// nets the proxies leave alone ([`crate::topology::BACKGROUND_NETS`]).
    pub fn pair(i: u32) -> (String, String) {
        let nth = |net: &str| {
            let net: ipnet::Ipv4Net = net.parse().expect("a valid IPv4 net");
            std::net::Ipv4Addr::from(u32::from(net.network()) + i).to_string()
        };
        (nth(BACKGROUND_CLIENTS), nth(BACKGROUND_SERVERS))
    }
}

fn zero() -> Span {
    Span::parse("0s").expect("a valid duration")
}

impl Default for Bulk {
    fn default() -> Self {
        Bulk {
            flows: 1,
            stagger: zero(),
            cc: Vec::new(),
            direction: Direction::Download,
            window: None,
            probe: false,
            cross_udp: None,
            competing: false,
            competing_after: zero(),
            requests: None,
            background: None,
        }
    }
}

impl Bulk {
    /// Whether anything runs beside the transfer (probe, cross traffic, a competing flow,
    /// requests).
    pub fn runs_beside(&self) -> bool {
        self.probe
            || self.cross_udp.is_some()
            || self.competing
            || self.requests.is_some()
            || self.background.is_some()
    }
}

impl Kind for Bulk {
    fn metric(&self) -> Metric {
        Metric::Goodput
    }

    fn check(&self, cell: &CellSpec) -> Result<(), String> {
        check_count("flows", self.flows, 1, 64)?;
        let (st, d) = (self.stagger.secs(), cell.duration.secs());
        if st * (self.flows as f64 - 1.0) >= d - 1.0 && self.flows > 1 {
            return Err(format!(
                "stagger '{}': the last of {} flows would start after the {} run ends",
                self.stagger, self.flows, cell.duration
            ));
        }
        for cc in &self.cc {
            crate::scenario::spec::check_cc_name(cc).map_err(|e| format!("cc: {e}"))?;
        }
        let after = self.competing_after.secs();
        if after > 0.0 && !self.competing {
            return Err(format!(
                "competing_after '{}': needs competing = true",
                self.competing_after
            ));
        }
        if after > 0.0 && after + cell.warmup.secs() + 2.0 > d {
            return Err(format!(
                "competing_after '{}': with the {} warm-up after it, less than 2 s of the {} \
                 run is left to measure the share",
                self.competing_after, cell.warmup, cell.duration
            ));
        }
        if let Some(r) = &self.cross_udp {
            satpep_link::units::parse_rate(r).map_err(|e| format!("cross_udp: {e}"))?;
        }
        if let Some(b) = &self.background {
            check_count("background.flows", b.flows, 1, 16)?;
            if !(0.0..=10.0).contains(&b.rtt.secs()) {
                return Err(format!("background.rtt '{}': must be at most 10 s", b.rtt));
            }
            if let Some(cc) = &b.cc {
                crate::scenario::spec::check_cc_name(cc)
                    .map_err(|e| format!("background.cc: {e}"))?;
            }
            if cell.bridge {
                return Err("background: needs the emulator (not bridge = true): its flows take a path of their own through it".into());
            }
        }
        Ok(())
    }

    fn ports(&self) -> Range<u16> {
        BASE_PORT..BASE_PORT + self.flows as u16
    }

    fn downloads(&self) -> bool {
        self.direction == Direction::Download
    }

    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        run_bulk(self, lab, cell, rec, limit_bps, tick)
    }
}

fn run_bulk(
    t: &Bulk,
    lab: &Lab,
    spec: &CellSpec,
    rec: &mut RunRecord,
    limit_bps: Option<f64>,
    tick: &mut dyn FnMut(f64),
) -> Result<(), String> {
    let dur = spec.duration.secs();
    let warm = spec.warmup.secs();
    let stagger = t.stagger.secs();
    let download = t.direction == Direction::Download;
    let n = t.flows as usize;
    let mut servers = Vec::new();
    for i in 0..n {
        match Server::start_with(lab, Host::Server, BASE_PORT + i as u16, &FINE_ARGS) {
            Ok(s) => servers.push(Some(s)),
            Err(e) => {
                rec.failures += 1;
                rec.errors.push(format!("flow {i}: {e}"));
                servers.push(None);
            }
        }
    }
    let beside = Beside::start(lab, t, dur);
    let receiver = if download { Host::Client } else { Host::Server };
    let first_data = watch_first_data(lab, receiver, t.ports(), Duration::from_secs_f64(dur));
    let start = Instant::now();
    let (mut children, ccs) = start_clients(t, lab, &servers, dur, start, tick)?;
    // iperf3 ends on its own after -t; allow the queue to drain and slow closes.
    let deadline = start + Duration::from_secs_f64(dur + 30.0 + drain_s(t, spec));
    let mut done = Vec::new();
    for c in children.iter_mut() {
        done.push(match c {
            Some(ch) => Some(wait_draining(lab, &mut ch.child, deadline, start, download, tick)?),
            None => None,
        });
    }
    // iperf3's intervals count from the first data's arrival, seconds after the client
    // started; what arrived then passed the emulator one forward delay earlier.
    let epochs = first_data.finish().unwrap_or_else(|e| {
        rec.errors.push(format!("first-data watcher: {e}"));
        Vec::new()
    });
    let epoch = |i: usize| epochs.get(i).copied().flatten();
    let data_epoch = epoch(0);
    let mut flows = Vec::new();
    // Each flow's 0.1 s intervals (end on flow 0's clock, bytes).
    let mut fine: Vec<Vec<(f64, u64)>> = Vec::new();
    for (i, (child, cc)) in children.into_iter().zip(ccs).enumerate() {
        let mut flow = FlowRecord {
            // Where the flow's intervals start on flow 0's clock: as measured, else as meant.
            start_s: match (epoch(i), data_epoch) {
                (Some(e), Some(e0)) => e - e0,
                _ => stagger * i as f64,
            },
            cc,
            bytes: 0,
            goodput_bps: 0.0,
            retransmits: 0,
            series: Vec::new(),
        };
        let mut intervals = Vec::new();
        if let (Some(child), Some(done)) = (child, done[i]) {
            let server = servers[i].take();
            intervals = read_flow(&mut flow, i, child, done, server, download, rec)?;
        }
        flows.push(flow);
        fine.push(intervals);
    }
    // Aggregate goodput after the warm-up; per-flow goodput while all flows ran.
    let all_from = flows.iter().fold(warm, |a, f| a.max(f.start_s));
    let (goodput, last_end) = match all_between(&flows, warm) {
        Some((bytes, end)) => (bytes * 8.0 / (end - warm), end),
        None => (0.0, warm),
    };
    for f in flows.iter_mut() {
        let (b, s, _) = window(f, all_from);
        f.goodput_bps = if s > 0.0 { b as f64 * 8.0 / s } else { 0.0 };
    }
    // The link as the emulator runs it, resolved once (traces may be files): the limit's
    // rate trace and the probe's delay traces are read from it.
    let cfg = spec.link_spec().and_then(|l| l.resolve());
    let clock = beside.clock();
    if t.runs_beside() {
        let base = |u: f64| {
            cfg.as_ref()
                .map_or(0.0, |c| crate::scenario::beside::base_rtt_ms(c, u))
        };
        let mut b = beside.finish(&base, warm, data_epoch, &mut rec.errors);
        // A competitor that arrived later is compared with what the transfer delivered
        // over the same span: from its arrival and the warm-up on.
        let after = t.competing_after.secs();
        if t.competing && after > 0.0 {
            let from = after + warm;
            b.transfer_beside_competing_bps =
                all_between(&flows, from).map(|(bytes, end)| bytes * 8.0 / (end - from));
        }
        rec.beside = Some(b);
    }
    rec.limit_bps = match (limit_bps, &cfg) {
        (Some(limit_bps), Ok(cfg)) => {
            let d = if download { &cfg.forward } else { &cfg.ret };
            // Where the measured span lies on the link's clock.
            let at_link = clock
                .uptime_at_data(data_epoch)
                .map(|u| u - d.delay.at(u * 1e9) / 1e9);
            let cross_loss = rec.beside.as_ref().and_then(|b| b.cross_loss);
            // The limit over `a..b` s of the flows' clock.
            let limit_at = |a: f64, b: f64| {
                let span = at_link.map(|u0| (u0 + a, u0 + b));
                limit_over(t, d, limit_bps, span, cross_loss)
            };
            if n == 1 && !t.competing {
                rec.start = Some(StartRecord {
                    reached_90_s: reached(flows[0].start_s, &fine[0], 0.9, limit_at),
                });
            }
            Some(limit_at(warm, last_end))
        }
        (limit_bps, _) => limit_bps,
    };
    if rec.failures == 0 {
        rec.samples.push(goodput);
        rec.utilization = rec.limit_bps.map(|l| goodput / l);
    }
    if n > 1 {
        rec.jain = Some(jain(
            &flows.iter().map(|f| f.goodput_bps).collect::<Vec<_>>(),
        ));
    }
    rec.flows = flows;
    Ok(())
}

/// Waits for an iperf3 client until `deadline`, and past it for as long as the link still
/// delivers the transfer's direction at 5 kB/s or more (at most 10 minutes more): a sender
/// that lost much of a full buffer drains it at what its loss recovery leaves (WS without
/// SACK on a T1: 146 kbit/s, four minutes for 4 MiB), and iperf3 reports only once it has.
fn wait_draining(
    lab: &Lab,
    child: &mut Child,
    deadline: Instant,
    start: Instant,
    download: bool,
    tick: &mut dyn FnMut(f64),
) -> Result<bool, String> {
    const STILL_MOVING: u64 = 10_000; // bytes per check
    const EVERY: Duration = Duration::from_secs(2);
    let cap = deadline + Duration::from_secs(600);
    let delivered = || {
        lab.link_stats().ok().map(|s| match download {
            true => s.forward.delivered_bytes,
            false => s.ret.delivered_bytes,
        })
    };
    let mut seen = (Instant::now(), delivered());
    wait_child_past(child, deadline, start, tick, &mut |now| {
        if now.duration_since(seen.0) < EVERY {
            return true;
        }
        let d = delivered();
        let moving = matches!((seen.1, d), (Some(a), Some(b)) if b >= a + STILL_MOVING);
        seen = (now, d);
        moving && now <= cap
    })
}

/// How long what the senders may still hold when iperf3 stops writing takes to cross the
/// link at its slowest rate: each flow's send buffer (the sending host's `wmem_max`, Linux's
/// 4 MiB by default), at most 10 minutes. With window scaling on a T1 a flow's buffer holds
/// over 20 s of data, and iperf3 reports only once it has arrived.
fn drain_s(t: &Bulk, spec: &CellSpec) -> f64 {
    const LINUX_WMEM_MAX: f64 = 4_194_304.0;
    let sender = match t.direction {
        Direction::Download => Host::Server,
        Direction::Upload => Host::Client,
    };
    let held = t.flows as f64
        * spec
            .host(sender)
            .wmem_max
            .map_or(LINUX_WMEM_MAX, |w| w.bytes() as f64);
    let slowest = spec.link_spec().and_then(|l| l.resolve()).ok().map(|c| {
        match t.direction {
            Direction::Download => c.forward.rate.min_bps(),
            Direction::Upload => c.ret.rate.min_bps(),
        }
    });
    match slowest {
        Some(r) if r > 0.0 && !spec.bridge => (held * 8.0 / r).min(600.0),
        _ => 0.0,
    }
}

/// Starts one iperf3 client per server that came up, `stagger` apart from `start`: the
/// clients (None where the server or the client failed) and each flow's controller.
fn start_clients(
    t: &Bulk,
    lab: &Lab,
    servers: &[Option<Server>],
    dur: f64,
    start: Instant,
    tick: &mut dyn FnMut(f64),
) -> Result<(Vec<Option<Client>>, Vec<String>), String> {
    let stagger = t.stagger.secs();
    let download = t.direction == Direction::Download;
    let mut children: Vec<Option<Client>> = Vec::new();
    let mut ccs = Vec::new();
    let mut last_tick = Instant::now();
    for (i, server) in servers.iter().enumerate() {
        let at = Duration::from_secs_f64(stagger * i as f64);
        while start.elapsed() < at {
            if crate::interrupted() {
                for c in children.iter_mut().flatten() {
                    let _ = c.child.kill();
                    let _ = c.child.wait();
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
        let mut extra: Vec<String> = FINE_ARGS.iter().map(|a| a.to_string()).collect();
        if !cc.is_empty() {
            crate::topology::ensure_cc(&cc)?;
            extra.extend(["-C".into(), cc]);
        }
        if let Some(w) = &t.window {
            extra.extend(["-w".into(), w.bytes().to_string()]);
        }
        let port = BASE_PORT + i as u16;
        children.push(match server {
            Some(_) => spawn_client(lab, port, run_for, download, &extra)
                .ok()
                .map(Client::reading),
            None => None,
        });
    }
    Ok((children, ccs))
}

/// Reads flow `i`'s outcome from its client (`done`: it ended by itself) and server into
/// `flow`: its one-second series as the receiver saw it, its bytes and the sender's
/// retransmissions; a failure goes into `rec`. Returns the receiver's 0.1 s intervals
/// (end on flow 0's clock, bytes).
fn read_flow(
    flow: &mut FlowRecord,
    i: usize,
    child: Client,
    done: bool,
    server: Option<Server>,
    download: bool,
    rec: &mut RunRecord,
) -> Result<Vec<(f64, u64)>, String> {
    let out = child.output().map_err(|e| e.to_string())?;
    let cv: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let sv = server.and_then(|s| s.output().ok()).unwrap_or(Value::Null);
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
    let fine: Vec<(f64, u64)> = crate::iperf::intervals(recv)
        .into_iter()
        .map(|(end, bytes)| (end + flow.start_s, bytes))
        .collect();
    flow.series = by_second(flow.start_s, &fine);
    flow.bytes = flow.series.iter().map(|(_, b)| b).sum();
    flow.retransmits = send["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    Ok(fine)
}

/// Intervals (end, bytes) that began at `start` summed into one-second ones on the same
/// clock, each in the second its middle falls in (iperf3's 0.1 s intervals last a little
/// longer, and an interval ending just past a whole second belongs to the one before); the
/// last may be shorter: the test's end.
fn by_second(start: f64, fine: &[(f64, u64)]) -> Vec<(f64, u64)> {
    let mut out: Vec<(f64, u64)> = Vec::new();
    let (mut prev, mut second) = (start, None::<i64>);
    for &(end, bytes) in fine {
        let k = ((prev + end) / 2.0 - start).max(0.0).floor() as i64;
        prev = end;
        match out.last_mut() {
            Some(last) if second == Some(k) => *last = (end, last.1 + bytes),
            _ => out.push((end, bytes)),
        }
        second = Some(k);
    }
    out
}

/// A flow's bytes in its one-second intervals from `from` s on, the seconds they span, and
/// where the last of them ends. Its last interval is left out: it also holds what was still
/// queued when its sender stopped, which would count the queue as goodput (as
/// TcpResult::goodput_after).
fn window(f: &FlowRecord, from: f64) -> (u64, f64, f64) {
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
}

/// All flows' bytes from `from` s on, up to where the first flow's measured intervals end
/// (so no flow's tail is missing), and that end; None if that span is empty. Flows' intervals
/// are not aligned: one that straddles an edge counts in proportion to its time inside.
fn all_between(flows: &[FlowRecord], from: f64) -> Option<(f64, f64)> {
    let to = flows
        .iter()
        .filter(|f| f.series.len() > 1)
        .map(|f| window(f, f.start_s).2)
        .fold(f64::INFINITY, f64::min);
    if !to.is_finite() || to <= from {
        return None;
    }
    let mut bytes = 0.0;
    for f in flows {
        let mut prev = f.start_s;
        // The last interval also holds what was queued when the sender stopped (see window).
        for &(end, b) in f.series.iter().take(f.series.len().saturating_sub(1)) {
            let inside = end.min(to) - prev.max(from);
            if inside > 0.0 && end > prev {
                bytes += b as f64 * inside / (end - prev);
            }
            prev = end;
        }
    }
    Some((bytes, to))
}

/// When the transfer first delivered `share` of the limit over [`START_WINDOW_S`] (the
/// limit over that span, `limit_at(from, to)` s on the flow's clock): the start of the
/// first such window on the intervals' grid (`fine`: (end, bytes) from `start`), s after
/// its first byte. The last interval is left out: it also holds what was queued when the
/// sender stopped.
fn reached(
    start: f64,
    fine: &[(f64, u64)],
    share: f64,
    limit_at: impl Fn(f64, f64) -> f64,
) -> Option<f64> {
    let n = fine.len().saturating_sub(1);
    let begins = |i: usize| if i == 0 { start } else { fine[i - 1].0 };
    for i in 0..n {
        let from = begins(i);
        // The intervals that end within the window.
        let mut bytes = 0u64;
        let mut to = from;
        for &(end, b) in &fine[i..n] {
            if end > from + START_WINDOW_S + START_SLACK_S {
                break;
            }
            bytes += b;
            to = end;
        }
        if to - from < START_WINDOW_S - START_SLACK_S {
            // The measured intervals end before a whole window: no later one has one.
            return None;
        }
        if bytes as f64 * 8.0 / (to - from) >= share * limit_at(from, to) {
            return Some(from - start);
        }
    }
    None
}

/// The physical limit `limit_bps` (at the direction's peak rate) over the measured span
/// (`span`, s on the link's clock, when known): a rate trace's mean over it, less what
/// constant-rate cross traffic delivered ([`cross_frame_bps`] less its loss `cross_loss`:
/// datagrams a full queue dropped left their share to TCP, which can take it).
fn limit_over(
    t: &Bulk,
    d: &satpep_link::config::DirectionConfig,
    limit_bps: f64,
    span: Option<(f64, f64)>,
    cross_loss: Option<f64>,
) -> f64 {
    let rate = match span {
        Some((a, b)) => d.rate.mean_bps(a * 1e9, b * 1e9),
        None => d.rate.max_bps(),
    };
    let limit_bps = limit_bps * rate / d.rate.max_bps();
    match t.cross_udp.as_deref().map(satpep_link::units::parse_rate) {
        Some(Ok(cross)) => {
            let lost = cross_loss.unwrap_or(0.0).clamp(0.0, 1.0);
            let delivered = cross_frame_bps(cross) * (1.0 - lost);
            limit_bps * (1.0 - delivered / rate).max(0.0)
        }
        _ => limit_bps,
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    /// Every background pair the scenario allows (1-16) lies in the nets the proxies
    /// exclude, each address once.
    #[test]
    fn background_pairs_lie_in_the_excluded_nets() {
        let nets: Vec<ipnet::Ipv4Net> = [BACKGROUND_CLIENTS, BACKGROUND_SERVERS]
            .iter()
            .map(|n| n.parse().unwrap())
            .collect();
        assert_eq!(
            Background::pair(0),
            ("198.18.1.16".to_string(), "198.18.3.16".to_string())
        );
        let mut seen = std::collections::HashSet::new();
        for i in 0..16 {
            let (c, s) = Background::pair(i);
            assert!(nets[0].contains(&c.parse::<std::net::Ipv4Addr>().unwrap()), "{c}");
            assert!(nets[1].contains(&s.parse::<std::net::Ipv4Addr>().unwrap()), "{s}");
            assert!(seen.insert(c) && seen.insert(s));
        }
    }

    /// The start is read from the first second, on the 0.1 s grid, at 90 % of the limit
    /// over it (a rate step counted), never from the last interval (it holds the drained
    /// queue); the one-second series are the sums of whole seconds.
    #[test]
    fn the_start_is_the_first_second_at_the_limit() {
        // From 0.5 s: 1 Mbit/s for 1.3 s, then 10 Mbit/s; the last interval a burst.
        // iperf3's intervals last a little more than 0.1 s (here 0.1003).
        let mut fine: Vec<(f64, u64)> = (1..=40)
            .map(|i| {
                let end = 0.5 + i as f64 * 0.1003;
                (end, if i <= 13 { 12_500 } else { 125_000 })
            })
            .collect();
        fine.push((4.6, 1_000_000));
        let flat = |_: f64, _: f64| 10e6;
        // The second from 1.3 s after the start carries 10 Mbit/s, the one from 1.2 s 9.1,
        // the one from 1.1 s 8.2.
        let at = |share: f64, limit: &dyn Fn(f64, f64) -> f64| {
            reached(0.5, &fine, share, limit).map(|t| (t * 10.0).round() / 10.0)
        };
        assert_eq!(at(0.95, &flat), Some(1.3));
        assert_eq!(at(0.9, &flat), Some(1.2));
        assert_eq!(at(0.8, &flat), Some(1.1));
        // The link at 8 Mbit/s from 1.7 s on the flow's clock: the second from 1.2 s is
        // 95 % of that.
        let step = |a: f64, _: f64| if a >= 1.7 - 1e-9 { 8e6 } else { 10e6 };
        assert_eq!(at(0.95, &step), Some(1.2));
        assert_eq!(at(0.9, &|_: f64, _: f64| 12e6), None);
        // Seconds summed: 0.1 + ... on whole seconds from the start.
        let s = by_second(0.5, &fine);
        assert_eq!(s.len(), 5);
        assert!((s[0].0 - 1.503).abs() < 1e-9 && s[0].1 == 10 * 12_500, "{s:?}");
        assert_eq!(s[1].1, 3 * 12_500 + 7 * 125_000);
        assert_eq!(s[3].1, 10 * 125_000);
        assert_eq!(s[4], (4.6, 1_000_000));
        // One-second intervals are their own seconds.
        let coarse = [(1.5, 1u64), (2.5, 2), (3.5, 3)];
        assert_eq!(by_second(0.5, &coarse), coarse);
    }

    /// Beside UDP the limit is what the UDP's delivered frames leave of the link's mean rate
    /// over the span: its dropped datagrams leave their share to TCP (which made a run read
    /// 116 % of a limit that assumed every datagram delivered), and a rate step halves what
    /// the link has besides.
    /// The wait for iperf3 after its run grows with what the senders may hold over the
    /// slowest rate: a T1 with Linux's 4 MiB send buffers needs 21.7 s a flow more.
    #[test]
    fn the_wait_for_iperf3_counts_the_send_buffers_over_the_link() {
        let cell = |extra: &str| {
            let sc = crate::scenario::spec::Scenario::parse(
                &format!("name = \"t\"\nlink = {{ both = {{ rate = \"1.544Mbit\" }} }}\n{extra}"),
                false,
            )
            .unwrap();
            sc.cells[0].spec.clone()
        };
        let t = |c: &CellSpec| c.traffic.bulk().unwrap().clone();
        let one = cell("");
        let d = drain_s(&t(&one), &one);
        assert!((d - 4_194_304.0 * 8.0 / 1.544e6).abs() < 0.01, "{d}");
        let two = cell("[traffic]\nflows = 2\n[hosts.server]\nwmem_max = \"64KB\"\n");
        let d = drain_s(&t(&two), &two);
        assert!((d - 2.0 * 64e3 * 8.0 / 1.544e6).abs() < 0.01, "{d}");
        let bridged = cell("bridge = true\n");
        assert_eq!(drain_s(&t(&bridged), &bridged), 0.0);
    }

    #[test]
    fn the_limit_beside_udp_counts_what_the_udp_delivered() {
        let spec: satpep_link::config::LinkSpec = toml::from_str(
            "[both]\nrate='10Mbit'\n[forward]\nrate_schedule='0 10Mbit; 10 5Mbit'\n",
        )
        .unwrap();
        let d = spec.resolve().unwrap().forward;
        let t: Bulk = toml::from_str("cross_udp = '2Mbit'").unwrap();
        let full = 9.0e6;
        let udp = cross_frame_bps(2e6);
        let all = limit_over(&t, &d, full, Some((0.0, 10.0)), Some(0.0));
        assert!((all - full * (1.0 - udp / 10e6)).abs() < 1.0, "{all}");
        let half_lost = limit_over(&t, &d, full, Some((0.0, 10.0)), Some(0.5));
        assert!((half_lost - full * (1.0 - 0.5 * udp / 10e6)).abs() < 1.0, "{half_lost}");
        // Over 10-20 s the link runs at 5 Mbit/s: the UDP takes twice the share.
        let slow = limit_over(&t, &d, full, Some((10.0, 20.0)), Some(0.0));
        assert!((slow - full * 0.5 * (1.0 - udp / 5e6)).abs() < 1.0, "{slow}");
    }

    fn flow(start_s: f64, series: &[(f64, u64)]) -> FlowRecord {
        FlowRecord {
            start_s,
            cc: String::new(),
            bytes: 0,
            goodput_bps: 0.0,
            retransmits: 0,
            series: series.to_vec(),
        }
    }

    /// Two flows share a 1000 B/s link; the second's data came 0.1 s late, so the first ran
    /// alone for 0.1 s. Summing each flow's own first two seconds over two seconds would read
    /// 1025 B/s, more than the link carries.
    #[test]
    fn flows_that_start_apart_are_summed_on_one_clock() {
        let a = flow(0.0, &[(1.0, 550), (2.0, 500), (3.0, 500), (3.1, 50)]);
        let b = flow(0.1, &[(1.1, 500), (2.1, 500), (3.1, 500), (3.2, 50)]);
        let (bytes, to) = all_between(&[a, b], 0.0).unwrap();
        // Up to the end of the first flow's last whole interval (3.0); b's third interval
        // counts for 0.9 of its second.
        assert!((to - 3.0).abs() < 1e-9, "{to}");
        let rate = bytes / to;
        assert!(rate <= 1000.0 + 1e-6, "{rate} B/s on a 1000 B/s link");
        assert!(rate > 990.0, "{rate}");
    }

    #[test]
    fn nothing_measured_after_the_warm_up_is_no_span() {
        let a = flow(0.0, &[(1.0, 500), (2.0, 500)]);
        assert!(all_between(std::slice::from_ref(&a), 1.0).is_none());
        assert!(all_between(&[flow(0.0, &[(1.0, 5)])], 0.0).is_none());
        let (bytes, to) = all_between(&[a], 0.5).unwrap();
        assert_eq!((bytes, to), (250.0, 1.0));
    }
}
