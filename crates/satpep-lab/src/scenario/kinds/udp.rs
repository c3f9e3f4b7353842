//! `kind = "udp"`: the link itself, measured from outside: iperf3 sends UDP at a share of
//! the direction's configured rate, and an nftables counter on the receiving router counts
//! (and drops) each datagram the moment it leaves the emulator. The main metric is the
//! delivered frame rate from the first datagram's arrival plus the warm-up to as long before
//! the end; the record adds the loss against what
//! the link's loss model expects, and the emulator's CPU. On a 2-core machine an iperf3
//! receiver at 1 Gbit/s drops datagrams in its own socket that the link delivered: counting
//! at the router keeps the figure about the link.

use super::bulk::Direction;
use super::Kind;
use crate::iperf::{client, udp_args, Server, UDP_FRAME_OVERHEAD};
use crate::scenario::spec::{CellSpec, Metric};
use crate::scenario::traffic::RunRecord;
use crate::sink::Sink;
use crate::topology::{Host, Lab, CLIENT_V4, SERVER_V4};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Port of the measured UDP stream.
const PORT: u16 = 5202;

/// UDP at a share of the link's rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Udp {
    /// Frame rate sent, as a share of the direction's configured (peak) rate: 1.02
    /// overdrives the link by 2 % so it is never idle; 0.5 keeps its queue empty, so only
    /// the loss model drops.
    #[serde(default = "overdrive")]
    pub load: f64,
    /// Datagram payload, bytes; default 1472 (full 1514-byte frames), or 472 below 5 Mbit/s
    /// so that a run holds enough datagrams to measure finely.
    #[serde(default)]
    pub len: Option<u32>,
    /// download (server to client, the forward link) or upload.
    #[serde(default)]
    pub direction: Direction,
}

fn overdrive() -> f64 {
    1.02
}

/// What a UDP run measured beside its delivered rate.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UdpRecord {
    /// The direction's configured rate, bit/s (frames).
    pub configured_bps: f64,
    /// The frame rate sent, as a share of the configured rate.
    #[serde(default)]
    pub load: f64,
    /// Datagram payload, bytes.
    pub len: u32,
    /// Datagrams iperf3 sent.
    pub sent: u64,
    /// Datagrams the emulator delivered, counted at the receiving router.
    pub delivered: u64,
    /// Share the link's loss model is expected to drop of these frames (its long-run mean);
    /// queue drops come on top when `load` exceeds 1.
    pub expected_loss: f64,
    /// The emulator's user CPU time over the measured window / the window (1 = one core).
    pub emulator_cpu_user: f64,
    /// Its system CPU time likewise; includes the receiving namespaces' network stacks,
    /// which the kernel runs inside the emulator's send calls.
    pub emulator_cpu_sys: f64,
}

/// The 99 % binomial interval of the loss share `p` over `n` frames (normal approximation).
pub fn loss_interval99(p: f64, n: u64) -> (f64, f64) {
    let half = 2.576 * (p * (1.0 - p) / n.max(1) as f64).sqrt();
    ((p - half).max(0.0), p + half)
}

impl Kind for Udp {
    fn metric(&self) -> Metric {
        Metric::Goodput
    }

    fn check(&self, cell: &CellSpec) -> Result<(), String> {
        if !(self.load > 0.0 && self.load <= 2.0) {
            return Err(format!("load = {}: a share of the link's rate in (0, 2]", self.load));
        }
        if let Some(len) = self.len {
            if !(101..=1472).contains(&len) {
                return Err(format!(
                    "len = {len}: between 101 and 1472 bytes (a full frame, and longer than \
                     iperf3's handshake datagrams, which the counter lets pass)"
                ));
            }
        }
        if cell.bridge {
            return Err("kind = \"udp\" measures the emulated link: not with bridge = true".into());
        }
        let (d, w) = (cell.duration.secs(), cell.warmup.secs());
        if d - 2.0 * w < 1.0 {
            return Err(format!(
                "the rate is measured from the warm-up ({}) to as long before the end: the {} \
                 run leaves less than 1 s",
                cell.warmup, cell.duration
            ));
        }
        Ok(())
    }

    fn ports(&self) -> Range<u16> {
        // No TCP sender to sample: the sampler's `ss` every half second would only take CPU
        // from the emulator at 1 Gbit/s.
        PORT..PORT
    }

    fn downloads(&self) -> bool {
        self.direction == Direction::Download
    }

    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        _limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        match self.measure(lab, cell, rec, tick) {
            Err(e) => super::failed_unless_interrupted(rec, e),
            Ok(()) => Ok(()),
        }
    }
}

impl Udp {
    fn measure(
        &self,
        lab: &Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        let cfg = cell.link_spec()?.resolve()?;
        let download = self.downloads();
        let d = if download { &cfg.forward } else { &cfg.ret };
        let rate = d.rate.max_bps();
        let len = self
            .len
            .unwrap_or(if rate < 5e6 { 472 } else { 1472 });
        let frame = len + UDP_FRAME_OVERHEAD;
        let payload = rate * self.load * len as f64 / frame as f64;
        let (from, to, dst, router) = if download {
            (Host::Server, Host::Client, CLIENT_V4, Host::Terminal)
        } else {
            (Host::Client, Host::Server, SERVER_V4, Host::Gateway)
        };
        let sink = Sink::install(lab, router, PORT)?;
        let _server = Server::start(lab, to, PORT)?;
        let pid = lab.emulator_pid().ok_or("the emulator is not running")?;
        let (dur, warm) = (cell.duration.secs(), cell.warmup.secs());
        let args = udp_args(dst, PORT, payload, len, dur.ceil() as u32);
        let sample = || -> Result<(u64, u64, Instant, (f64, f64)), String> {
            let t0 = Instant::now();
            let (packets, bytes) = sink.read()?;
            let at = t0 + (Instant::now() - t0) / 2;
            Ok((packets, bytes, at, crate::sys::cpu_user_system(pid)))
        };
        let (a, b, sent) = std::thread::scope(|sc| -> Result<_, String> {
            let tx = sc.spawn(|| client(lab, from, &args, &mut |_| {}));
            // The window counts from the first datagram out of the link: iperf3's control
            // exchange takes several round trips first (3 s and more on a GEO path).
            let spawned = Instant::now();
            while sink.read()?.0 == 0 {
                if crate::interrupted() {
                    return Err("interrupted".into());
                }
                if tx.is_finished() || spawned.elapsed() > Duration::from_secs(30) {
                    let why = match tx.join() {
                        Ok(Err(e)) => e,
                        _ => "no datagram came out of the link".into(),
                    };
                    return Err(why);
                }
                tick(spawned.elapsed().as_secs_f64());
                std::thread::sleep(Duration::from_millis(20));
            }
            let start = Instant::now();
            let wait_until = |s: f64, tick: &mut dyn FnMut(f64)| -> Result<(), String> {
                while start.elapsed().as_secs_f64() < s {
                    if crate::interrupted() {
                        return Err("interrupted".into());
                    }
                    tick(start.elapsed().as_secs_f64());
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(())
            };
            wait_until(warm, tick)?;
            let a = sample()?;
            wait_until(dur - warm, tick)?;
            let b = sample()?;
            let v = tx.join().map_err(|_| "iperf3 thread panicked")??;
            let sent = v["end"]["sum"]["packets"].as_u64().unwrap_or(0);
            Ok((a, b, sent))
        })?;
        // What was queued or in flight when the sender stopped still arrives: wait until
        // the counter holds still.
        let mut delivered = sink.read()?.0;
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = sink.read()?.0;
            if now == delivered || Instant::now() > until {
                delivered = now;
                break;
            }
            delivered = now;
        }
        let dt = (b.2 - a.2).as_secs_f64();
        let (dp, db) = (b.0 - a.0, b.1 - a.1);
        // The counter's bytes start at the IP header; the link carries the Ethernet header too.
        let measured = (db + 14 * dp) as f64 * 8.0 / dt;
        rec.samples.push(measured);
        rec.limit_bps = Some(rate);
        rec.utilization = Some(measured / rate);
        rec.udp = Some(UdpRecord {
            configured_bps: rate,
            load: self.load,
            len,
            sent,
            delivered,
            expected_loss: d.loss.mean_loss(frame + d.overhead),
            emulator_cpu_user: (b.3 .0 - a.3 .0) / dt,
            emulator_cpu_sys: (b.3 .1 - a.3 .1) / dt,
        });
        if sent == 0 {
            return Err("iperf3 reported no datagrams sent".into());
        }
        Ok(())
    }
}
