//! `kind = "hub"`: downloads to many terminals of a star at once (`[star]`), some busy, some
//! idle, some stopping part-way: how the carrier is shared. Each busy terminal's client
//! downloads from the server with `flows` TCP connections (one iperf3 test, `-P`) for the
//! cell's duration, and pings the server every 200 ms (its queueing delay). The run's goodput
//! is the whole carrier's after the warm-up, judged against the carrier's limit as the
//! operator's policy shares it (`pep.config.tunnel.carrier` or `pep.config.proxy.carrier`:
//! weights, time or bits), with
//! Jain's index across the terminals busy throughout, each one's goodput taken relative to its
//! share, and the gateway proxy's memory and CPU per terminal and per flow.

use super::{check_count, one, Kind};
use crate::iperf::bytes_within;
use crate::scenario::beside::{base_rtt_ms, parse_ping, percentile};
use crate::scenario::runner::{tcp_limit_in, HOST_MSS};
use crate::scenario::spec::{CellSpec, Metric, Span};
use crate::scenario::traffic::{jain, FlowRecord, RunRecord};
use crate::topology::{Host, Lab, Site, SERVER_V4};
use satpep_tunnel::hub::ShareBy;
use serde::{Deserialize, Serialize};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// iperf3 port base; terminal K's test uses HUB_PORT + K (clear of the other kinds' ports
/// and of the one port the lab's proxies leave alone).
pub const HUB_PORT: u16 = 6000;
/// Probe interval, s.
const PROBE_S: f64 = 0.2;
/// iperf3's report interval, s, and the span over which a quiet terminal's share is judged
/// taken.
const INTERVAL_S: f64 = 0.5;
/// The lab's own generator's report interval, s: it sees when the share was taken to a
/// tenth of a second.
const FINE_S: f64 = 0.1;

/// Downloads across a star.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hub {
    /// Terminals that download: terminals 1 to `busy` (default all); the others stay idle,
    /// their proxies running (and tunnels up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy: Option<u16>,
    /// TCP connections per busy terminal.
    #[serde(default = "one")]
    pub flows: u32,
    /// Busy terminals whose downloads end early, at `stop_after`: their share is for the
    /// others to take.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<u16>,
    /// When the `stop` terminals' downloads end, e.g. "12s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after: Option<Span>,
    /// What makes the downloads: `iperf3` (one test per terminal, the default) or
    /// `sockets` (the lab's own sender and one receiving thread for every connection of
    /// every terminal, [`crate::flows`]: thousands of connections on two cores).
    #[serde(default, skip_serializing_if = "is_default")]
    pub generator: Generator,
}

/// What makes a hub run's downloads (see [`Hub::generator`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Generator {
    /// One iperf3 test (`-P flows`) per terminal.
    #[default]
    Iperf3,
    /// The lab's own sender and receiver ([`crate::flows`]).
    Sockets,
}

fn is_default(g: &Generator) -> bool {
    *g == Generator::default()
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            busy: None,
            flows: 1,
            stop: Vec::new(),
            stop_after: None,
            generator: Generator::default(),
        }
    }
}

/// What one terminal got.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TerminalRecord {
    /// Its node name (`terminal`, `terminal2`, …): its tunnel certificate's name too.
    pub name: String,
    /// Its download ended early at this many seconds (`stop_after`).
    pub stopped_s: Option<f64>,
    /// The weight the gateway's carrier settings give it (1 without them).
    pub weight: f64,
    /// Its own link's TCP limit over the measured span, bit/s (the carrier's, or its path's
    /// rate and loss).
    pub limit_bps: f64,
    /// What the operator's policy gives it of the carrier with every busy terminal
    /// downloading, bit/s.
    pub fair_bps: f64,
    /// Goodput after the warm-up (until its stop), bit/s.
    pub goodput_bps: f64,
    /// Bytes received.
    pub bytes: u64,
    /// Its probe's queueing delay p95 after the warm-up, ms (None without replies).
    pub queue_p95_ms: Option<f64>,
    /// Probes sent and answered.
    pub probes: (u32, u32),
    /// Tunnel mode: UDP bytes the gateway sent this terminal during the run (every frame:
    /// headers, repairs), as its `/metrics` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_sent_bytes: Option<u64>,
    /// Tunnel mode: the connections the gateway held under the terminal's name at the end
    /// (more than one: a second tunnel beside the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnels: Option<u32>,
}

/// What the gateway's proxy held and used.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GatewayCost {
    /// Resident memory before the downloads, every terminal connected, kB.
    pub rss_idle_kb: u64,
    /// The most resident memory seen during the downloads, kB.
    pub rss_busy_kb: u64,
    /// CPU time it used during the run, s.
    pub cpu_s: f64,
}

/// What a hub run measured beside the main figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HubRecord {
    /// Every terminal, busy or not, in order.
    pub terminals: Vec<TerminalRecord>,
    /// Terminals that downloaded.
    pub busy: u16,
    /// TCP connections the downloads used, all terminals.
    pub flows: u32,
    /// "time" or "bits": what the fair shares are of.
    pub share: String,
    /// After the `stop` terminals stopped: from how long after the others together delivered
    /// 90 % of what the carrier holds for them over half a second, s, on the report's grid
    /// (0.5 s with iperf3, 0.1 s with the lab's own generator; None: no stop, or they never
    /// did).
    pub taken_s: Option<f64>,
    /// When the `stop` terminals' last bytes arrived, s (the end of the last report interval
    /// that brought them any): later than their stop through a PEP, which delivers what it
    /// had taken from the server.
    #[serde(default)]
    pub last_byte_s: Option<f64>,
    /// As `taken_s`, counted from `last_byte_s`: how long the carrier their flows left stayed
    /// unused, s.
    #[serde(default)]
    pub taken_after_last_byte_s: Option<f64>,
    /// The gateway's proxy, if one ran.
    pub gateway: Option<GatewayCost>,
}

/// A reader of a child's whole output on a thread of its own (a long test with many
/// connections writes more JSON than a pipe holds), with the child's process id.
type Reader = (u32, std::thread::JoinHandle<std::io::Result<std::process::Output>>);

/// A hub run's processes: an iperf3 server per busy terminal in the server host, and in
/// each busy terminal's client its iperf3 client and its probe. Whatever still runs when
/// this is dropped is killed.
struct Downloads {
    servers: Vec<Child>,
    clients: Vec<Result<Reader, String>>,
    pings: Vec<Option<Reader>>,
    started: Instant,
    /// When the clients started, s since the epoch (the probes' clock).
    epoch0: f64,
}

/// Sends `sig` to process `pid`, which this run started.
fn signal(pid: u32, sig: i32) {
    // SAFETY: a signal to a process of this run's (gone: ESRCH, ignored).
    unsafe { libc::kill(pid as i32, sig) };
}

impl Downloads {
    /// Starts the servers, waits until they listen, then starts every client's download
    /// of `flows` connections for `run_s(terminal)` seconds (with `iperf3`; else the caller
    /// makes the downloads) and its probe for `dur`.
    fn start(
        lab: &Lab,
        busy: &[Site],
        flows: u32,
        run_s: &dyn Fn(u16) -> f64,
        dur: f64,
        iperf3: bool,
    ) -> Result<Downloads, String> {
        let mut d = Downloads {
            servers: Vec::new(),
            clients: Vec::new(),
            pings: Vec::new(),
            started: Instant::now(),
            epoch0: 0.0,
        };
        for st in busy.iter().filter(|_| iperf3) {
            let port = (HUB_PORT + st.index).to_string();
            let c = lab
                .command(Host::Server, "iperf3")
                .args(["-s", "-1", "-p", &port])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start iperf3: {e}"))?;
            d.servers.push(c);
        }
        let t = Instant::now();
        // Only iperf3's servers are waited for (the flows server said it was ready).
        while iperf3 && t.elapsed() <= Duration::from_secs(10) {
            let out = lab
                .command(Host::Server, "ss")
                .args(["-Hltn"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let up = busy
                .iter()
                .all(|st| out.contains(&format!(":{} ", HUB_PORT + st.index)));
            if up {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let read = |c: Child| (c.id(), std::thread::spawn(move || c.wait_with_output()));
        d.started = Instant::now();
        d.epoch0 = crate::scenario::beside::epoch_now();
        for st in busy {
            let ns = lab.node_ns(&st.client);
            if iperf3 {
                let secs = run_s(st.index).round().max(1.0) as u32;
                let port = (HUB_PORT + st.index).to_string();
                let client = crate::sys::in_ns(&ns, "iperf3")
                    .args(["-c", SERVER_V4, "-p", &port, "-R", "-J"])
                    .args(["-t", &secs.to_string(), "-P", &flows.to_string()])
                    .args(["-i", &INTERVAL_S.to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn();
                d.clients.push(
                    client
                        .map(read)
                        .map_err(|e| format!("cannot start iperf3: {e}")),
                );
            }
            let count = (dur / PROBE_S).floor().max(1.0) as u32;
            let ping = crate::sys::in_ns(&ns, "ping")
                .args(["-n", "-D", "-W", "10", "-i", &PROBE_S.to_string()])
                .args(["-c", &count.to_string(), SERVER_V4])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn();
            d.pings.push(ping.ok().map(read));
        }
        Ok(d)
    }

    /// Waits up to `limit_s` after the start for the clients and probes (calling `tick(elapsed s)` once
    /// a second), interrupts the late ones (iperf3 then reports what it measured so far) and
    /// kills those that do not end; returns each client's output and whether it was late,
    /// and each probe's output. Only an interrupt of the scenario is an `Err`.
    #[allow(clippy::type_complexity)]
    fn finish(
        mut self,
        limit_s: f64,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(Vec<(Result<std::process::Output, String>, bool)>, Vec<Option<String>>), String>
    {
        let deadline = self.started + Duration::from_secs_f64(limit_s);
        // The probes too: killed, a ping loses what it buffered for its pipe.
        let running = |d: &Downloads| {
            d.clients
                .iter()
                .any(|c| c.as_ref().is_ok_and(|(_, h)| !h.is_finished()))
                || d.pings.iter().flatten().any(|(_, h)| !h.is_finished())
        };
        let mut last = Instant::now();
        while running(&self) && Instant::now() < deadline {
            if crate::interrupted() {
                return Err("interrupted".into());
            }
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                tick(self.started.elapsed().as_secs_f64());
            }
        }
        let late: Vec<bool> = self
            .clients
            .iter()
            .map(|c| c.as_ref().is_ok_and(|(_, h)| !h.is_finished()))
            .collect();
        for (c, _) in self.clients.iter().zip(&late).filter(|(_, &l)| l) {
            if let Ok((pid, _)) = c {
                signal(*pid, libc::SIGINT);
            }
        }
        // A ping interrupted prints what it has and its summary.
        for (pid, h) in self.pings.iter().flatten() {
            if !h.is_finished() {
                signal(*pid, libc::SIGINT);
            }
        }
        let t = Instant::now();
        while running(&self) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.end_all();
        let clients = std::mem::take(&mut self.clients)
            .into_iter()
            .zip(late)
            .map(|(c, late)| {
                let out = c.and_then(|(_, h)| {
                    h.join()
                        .map_err(|_| "iperf3's reader failed".to_string())?
                        .map_err(|e| e.to_string())
                });
                (out, late)
            })
            .collect();
        let pings = std::mem::take(&mut self.pings)
            .into_iter()
            .map(|p| {
                let (_, h) = p?;
                let o = h.join().ok()?.ok()?;
                Some(String::from_utf8_lossy(&o.stdout).into_owned())
            })
            .collect();
        Ok((clients, pings))
    }

    /// Kills every process of the run that still runs.
    fn end_all(&mut self) {
        for c in self.clients.iter().flatten() {
            if !c.1.is_finished() {
                signal(c.0, libc::SIGKILL);
            }
        }
        for p in self.pings.iter().flatten() {
            if !p.1.is_finished() {
                signal(p.0, libc::SIGKILL);
            }
        }
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Downloads {
    fn drop(&mut self) {
        self.end_all();
    }
}

impl HubRecord {
    /// The terminals that downloaded.
    pub fn busy_terminals(&self) -> &[TerminalRecord] {
        &self.terminals[..self.busy as usize]
    }
}

impl Hub {
    fn busy_of(&self, cell: &CellSpec) -> u16 {
        self.busy.unwrap_or(cell.star.terminals)
    }

    /// The carrier's policy from the gateway's settings (a tunnel gateway's or a split
    /// gateway's, whose terminals the scenario names as the lab does): (what is shared, the
    /// weight of terminal `name`).
    fn policy(cell: &CellSpec) -> (ShareBy, impl Fn(&str) -> f64 + '_) {
        let carrier = cell
            .pep
            .config
            .tunnel
            .as_ref()
            .and_then(|t| t.carrier.as_ref())
            .or(cell.pep.config.proxy.carrier.as_ref());
        // Checked with the cell (the proxies' configuration is).
        let share = carrier
            .and_then(|c| c.share.as_deref())
            .and_then(|s| ShareBy::parse(s).ok())
            .unwrap_or_default();
        let weight = move |name: &str| {
            carrier
                .and_then(|c| c.terminal.get(name))
                .and_then(|t| t.weight)
                .unwrap_or(1.0)
        };
        (share, weight)
    }
}

/// Each busy terminal's fair goodput, bit/s, from its weight and its link's limit, by the
/// gateway's own arithmetic ([`satpep_tunnel::hub::allocate`], every terminal held back by
/// its share): shared in time, terminal k holds w_k/W of the carrier's time and delivers its
/// own limit in it; shared in bits, each gets b·w_k where b fills the carrier's time.
pub fn fair_shares(share: ShareBy, weights: &[f64], limits: &[f64]) -> Vec<f64> {
    use satpep_tunnel::hub::{allocate, Demand, TerminalShare};
    // allocate counts in whole units: the largest limit is made 2^50 of them, so rounding
    // moves a share by less than a part in 10^15.
    let top = limits.iter().cloned().fold(0.0, f64::max);
    if top <= 0.0 {
        return vec![0.0; limits.len()];
    }
    let scale = (1u64 << 50) as f64 / top;
    let demands: Vec<Demand> = weights
        .iter()
        .zip(limits)
        .map(|(&weight, &l)| Demand {
            share: TerminalShare {
                weight,
                rate: ((l * scale).round() as u64).max(1),
                ..Default::default()
            },
            sending: 0,
            held: true,
        })
        .collect();
    allocate(1 << 50, share, &demands)
        .into_iter()
        .map(|b| b as f64 / scale)
        .collect()
}

impl Kind for Hub {
    fn metric(&self) -> Metric {
        Metric::Goodput
    }

    fn ports(&self) -> std::ops::Range<u16> {
        // Many terminals' senders: the report keeps the terminals' goodputs, not sockets.
        0..0
    }

    fn check(&self, cell: &CellSpec) -> Result<(), String> {
        let n = cell.star.terminals;
        let busy = self.busy_of(cell);
        if !(1..=n).contains(&busy) {
            return Err(format!(
                "busy = {busy}: between 1 and star.terminals ({n})"
            ));
        }
        check_count("flows", self.flows, 1, 128)?;
        for &k in &self.stop {
            if !(1..=busy).contains(&k) {
                return Err(format!(
                    "stop: {k} is not a busy terminal (1 to {busy})"
                ));
            }
        }
        match (&self.stop_after, self.stop.is_empty()) {
            (None, false) => return Err("stop_after: needed with stop".into()),
            (Some(_), true) => return Err("stop_after: without stop, nobody stops".into()),
            (Some(s), false)
                if s.secs() <= cell.warmup.secs() + 1.0
                    || s.secs() >= cell.duration.secs() - 2.0 =>
            {
                return Err(format!(
                    "stop_after '{s}': after the warm-up and a second, 2 s before the end \
                     at least"
                ))
            }
            _ => {}
        }
        if cell.bridge {
            return Err("a hub's carrier is the emulator's (not with bridge = true)".into());
        }
        Ok(())
    }

    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        _limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        let sites: Vec<Site> = lab.sites();
        let busy = self.busy_of(cell) as usize;
        if sites.len() != cell.star.terminals as usize {
            return Err(format!(
                "the lab has {} terminals, the cell {}",
                sites.len(),
                cell.star.terminals
            ));
        }
        let dur = cell.duration.secs();
        let warm = cell.warmup.secs();
        let stop_s = self.stop_after.as_ref().map(Span::secs);
        let run_s = |k: u16| match self.stop.contains(&k) {
            true => stop_s.unwrap_or(dur),
            false => dur,
        };
        let gateway = lab.node_proxy_pid("gateway");
        let rss_idle = gateway.and_then(crate::sys::rss_kb);
        let cpu0 = gateway.map(crate::sys::cpu_seconds);
        let uptime0 = lab.link_stats().ok().map(|s| s.uptime_s);

        let tunnel = cell.pep.mode == crate::topology::PepMode::Tunnel;
        let gw0 = tunnel
            .then(|| crate::scenario::tunnel_state::gateway_per_terminal(lab))
            .flatten();
        let sockets = self.generator == Generator::Sockets;
        let _server = match sockets {
            true => Some(crate::flows::FlowServer::start(lab)?),
            false => None,
        };
        let connected = match sockets {
            true => Some(crate::flows::connect(lab, &sites[..busy], self.flows)?),
            false => None,
        };
        let downloads =
            Downloads::start(lab, &sites[..busy], self.flows, &run_s, dur, !sockets)?;
        // A loaded machine starts thousands of connections slowly (iperf3 opens a test's
        // connections one by one and starts its clock after the last): 20 s, and 10 ms a
        // connection more.
        let grace = 20.0 + 0.01 * (busy as f64 * self.flows as f64);
        let mut rss_busy = rss_idle.unwrap_or(0);
        let epoch0 = downloads.epoch0;
        let mut each_second = |t: f64| {
            tick(t);
            // The gateway's memory, once a second.
            if let Some(kb) = gateway.and_then(crate::sys::rss_kb) {
                rss_busy = rss_busy.max(kb);
            }
        };
        let stops: Vec<f64> = sites[..busy].iter().map(|st| run_s(st.index)).collect();
        let received = match connected {
            Some(c) => Some(c.run(&stops, FINE_S, &mut each_second)?),
            None => None,
        };
        let (outputs, pings) = downloads.finish(dur + grace, &mut each_second)?;
        let mut received = received.map(|r| r.into_iter());
        let gw1 = tunnel
            .then(|| crate::scenario::tunnel_state::gateway_per_terminal(lab))
            .flatten();
        // Said, so that the run keeps the proxies' logs (which name the peers).
        let unshared = tunnel
            .then(|| {
                crate::scenario::tunnel_state::proxy_metric(
                    lab,
                    Host::Gateway,
                    "tunnel_unshared_bytes_total",
                )
            })
            .flatten()
            .unwrap_or(0.0);
        if unshared > 0.0 {
            rec.errors.push(format!(
                "the gateway sent {unshared:.0} bytes outside the carrier's shares (its log names the peers)"
            ));
        }
        let mut outputs = outputs.into_iter();
        let mut probes = pings.into_iter();
        // The same error of many clients is said once, with how many.
        let mut errors: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let cpu = match (gateway, cpu0) {
            (Some(p), Some(c0)) => Some(crate::sys::cpu_seconds(p) - c0),
            _ => None,
        };

        // The link as the emulator runs it: each terminal's limit over the measured span.
        let cfg = cell.link_spec().and_then(|l| l.resolve())?;
        let (share, weight) = Hub::policy(cell);
        let c = cell.host(Host::Client);
        let mss = c.mss.unwrap_or(HOST_MSS);
        let ts = c.timestamps.unwrap_or(true);
        let server: std::net::IpAddr = SERVER_V4.parse().expect("an address");
        let limit_of = |st: &Site, to: f64| {
            let mut d = cfg.forward.clone();
            let client: std::net::IpAddr = st.client_v4.parse().expect("an address");
            if let Some(p) = d.path_of(server, client).map(|i| d.paths[i].clone()) {
                if let Some(r) = p.rate {
                    d.rate = r;
                }
                if let Some(l) = p.loss {
                    d.loss = l;
                }
            }
            let peak = tcp_limit_in(&d, mss, ts);
            match uptime0 {
                Some(u) => {
                    peak * d.rate.mean_bps((u + warm) * 1e9, (u + to) * 1e9) / d.rate.max_bps()
                }
                None => peak,
            }
        };

        let mut terminals = Vec::new();
        let mut series = Vec::new();
        for (i, st) in sites.iter().enumerate() {
            let end = run_s(st.index);
            let mut t = TerminalRecord {
                name: st.terminal.clone(),
                stopped_s: self.stop.contains(&st.index).then_some(end),
                weight: weight(&st.terminal),
                limit_bps: limit_of(st, end),
                fair_bps: 0.0,
                goodput_bps: 0.0,
                bytes: 0,
                queue_p95_ms: None,
                probes: (0, 0),
                gateway_sent_bytes: None,
                tunnels: None,
            };
            if let (Some(a), Some(b)) = (&gw0, &gw1) {
                let before = a.get(&st.terminal).map_or(0, |x| x.0);
                if let Some(&(after, n)) = b.get(&st.terminal) {
                    t.gateway_sent_bytes = Some(after.saturating_sub(before));
                    t.tunnels = Some(n);
                    // Said, so that the run keeps the proxies' logs.
                    if n > 1 {
                        errors
                            .entry(format!("the gateway held {n} tunnels under its name"))
                            .or_default()
                            .push(st.terminal.clone());
                    }
                }
            }
            let mut iv = Vec::new();
            let mut said = |e: String| errors.entry(e).or_default().push(st.client.clone());
            if let Some(r) = received.as_mut().and_then(|r| (i < busy).then(|| r.next())) {
                let r = r.unwrap_or_default();
                if r.failed > 0 {
                    rec.failures += 1;
                    said(format!(
                        "{} of {} connections failed, the first: {}",
                        r.failed,
                        self.flows,
                        r.error.unwrap_or_default()
                    ));
                }
                t.bytes = r.bytes;
                let (b, s) = bytes_within(&r.intervals, warm, end);
                if s > 0.0 {
                    t.goodput_bps = b as f64 * 8.0 / s;
                }
                iv = r.intervals;
            } else if i < busy {
                let (got, late) = outputs
                    .next()
                    .unwrap_or_else(|| (Err("no iperf3".into()), false));
                if late {
                    said(format!(
                        "iperf3 still ran {grace:.0} s after the run's end: interrupted, \
                         its figures are those it had then"
                    ));
                }
                match got {
                    Ok(o) => {
                        let v: serde_json::Value =
                            serde_json::from_slice(&o.stdout).unwrap_or_default();
                        iv = crate::iperf::intervals(&v);
                        if let Some(e) = v["error"].as_str() {
                            said(format!("iperf3: {e}"));
                        } else if !o.status.success() {
                            said(format!(
                                "iperf3 failed: {}",
                                String::from_utf8_lossy(&o.stderr).trim()
                            ));
                        }
                        if iv.is_empty() {
                            rec.failures += 1;
                        }
                        t.bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
                        // The last interval also holds what was queued when the sender
                        // stopped: left out, as bulk does.
                        let (b, s) = bytes_within(&iv, warm, end - 1.0);
                        if s > 0.0 {
                            t.goodput_bps = b as f64 * 8.0 / s;
                        }
                    }
                    Err(e) => {
                        rec.failures += 1;
                        said(e);
                    }
                }
            }
            if let Some(text) = probes.next().flatten() {
                let (sent, got, samples) = parse_ping(&text);
                t.probes = (sent, got);
                let q: Vec<f64> = samples
                    .iter()
                    .map(|&(recv, rtt)| (recv - rtt / 1e3 - epoch0, rtt))
                    .filter(|&(at, _)| at >= warm && at <= end)
                    .map(|(at, rtt)| {
                        let base = base_rtt_ms(&cfg, uptime0.unwrap_or(0.0) + at);
                        (rtt - base).max(0.0)
                    })
                    .collect();
                if !q.is_empty() {
                    t.queue_p95_ms = Some(percentile(&q, 95.0));
                }
            }
            series.push(iv);
            terminals.push(t);
        }

        for (e, who) in errors {
            rec.errors.push(match who.len() {
                1 => format!("{}: {e}", who[0]),
                n => format!("{n} clients ({}, …, {}): {e}", who[0], who[n - 1]),
            });
        }
        // Fair shares with every busy terminal downloading, and how close each came.
        let weights: Vec<f64> = terminals[..busy].iter().map(|t| t.weight).collect();
        let limits: Vec<f64> = terminals[..busy].iter().map(|t| t.limit_bps).collect();
        for (t, f) in terminals.iter_mut().zip(fair_shares(share, &weights, &limits)) {
            t.fair_bps = f;
        }
        let limit: f64 = terminals[..busy].iter().map(|t| t.fair_bps).sum();
        let throughout: Vec<f64> = terminals[..busy]
            .iter()
            .filter(|t| t.stopped_s.is_none() && t.fair_bps > 0.0)
            .map(|t| t.goodput_bps / t.fair_bps)
            .collect();
        // The whole carrier after the warm-up: every terminal's bytes over one span.
        let to = dur - 1.0;
        let (mut bits, mut span) = (0.0, 0.0_f64);
        for iv in &series {
            let (b, s) = bytes_within(iv, warm, to);
            bits += b as f64 * 8.0;
            span = span.max(s);
        }
        let aggregate = if span > 0.0 { bits / span } else { 0.0 };
        // After the stop: the first moment (on the report's grid) from which the others
        // deliver 90 % of their fair shares with the stopped ones gone, over half a second.
        let step = if sockets { FINE_S } else { INTERVAL_S };
        let others: Vec<usize> = (0..busy)
            .filter(|&i| terminals[i].stopped_s.is_none())
            .collect();
        let w: Vec<f64> = others.iter().map(|&i| terminals[i].weight).collect();
        let l: Vec<f64> = others.iter().map(|&i| terminals[i].limit_bps).collect();
        let want: f64 = fair_shares(share, &w, &l).iter().sum::<f64>() * 0.9;
        let taken_from = |stop: f64| {
            let mut at = stop;
            while at + INTERVAL_S <= to {
                let got: f64 = others
                    .iter()
                    .map(|&i| bytes_within(&series[i], at, at + INTERVAL_S).0 as f64 * 8.0)
                    .sum::<f64>()
                    / INTERVAL_S;
                if got >= want {
                    return Some(at - stop);
                }
                at += step;
            }
            None
        };
        let taken_s = stop_s.and_then(taken_from);
        // A PEP still delivers what it had taken from the server when the sender stops: the
        // share is free once the stopped terminals' last bytes arrived (the end of the last
        // interval that brought them any).
        let last_byte_s = (0..busy)
            .filter(|&i| terminals[i].stopped_s.is_some())
            .filter_map(|i| series[i].iter().rev().find(|&&(_, b)| b > 0).map(|&(e, _)| e))
            .reduce(f64::max);
        let taken_after_last_byte_s = stop_s.and(last_byte_s).and_then(taken_from);
        rec.samples = vec![aggregate];
        rec.limit_bps = Some(limit);
        rec.utilization = (limit > 0.0).then(|| aggregate / limit);
        rec.jain = (throughout.len() > 1).then(|| jain(&throughout));
        rec.flows = terminals[..busy]
            .iter()
            .zip(&series)
            .map(|(t, iv)| FlowRecord {
                start_s: 0.0,
                cc: t.name.clone(),
                bytes: t.bytes,
                goodput_bps: t.goodput_bps,
                retransmits: 0,
                series: iv.clone(),
            })
            .collect();
        rec.hub = Some(HubRecord {
            terminals,
            busy: busy as u16,
            flows: busy as u32 * self.flows,
            share: share.name().into(),
            taken_s,
            last_byte_s,
            taken_after_last_byte_s,
            gateway: match (rss_idle, cpu) {
                (Some(idle), Some(cpu_s)) => Some(GatewayCost {
                    rss_idle_kb: idle,
                    rss_busy_kb: rss_busy,
                    cpu_s,
                }),
                _ => None,
            },
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_shares_in_time_and_in_bits() {
        // Three terminals at 20, 20 and 5 Mbit/s, equal weights: in time each holds a
        // third and delivers its own rate in it; in bits each gets the same b with
        // b/20 + b/20 + b/5 = 1, b = 10/3.
        let near = |a: &[f64], b: &[f64]| {
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() < 1e-9, "{a:?} against {b:?}");
            }
        };
        let t = fair_shares(ShareBy::Time, &[1.0, 1.0, 1.0], &[20.0, 20.0, 5.0]);
        near(&t, &[20.0 / 3.0, 20.0 / 3.0, 5.0 / 3.0]);
        let b = fair_shares(ShareBy::Bits, &[1.0, 1.0, 1.0], &[20.0, 20.0, 5.0]);
        near(&b, &[10.0 / 3.0; 3]);
        // Weights 1:2 on one rate, either way.
        near(&fair_shares(ShareBy::Time, &[1.0, 2.0], &[30.0, 30.0]), &[10.0, 20.0]);
        near(&fair_shares(ShareBy::Bits, &[1.0, 2.0], &[30.0, 30.0]), &[10.0, 20.0]);
    }

}
