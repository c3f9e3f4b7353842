//! The satellite hop's controller: satpep's one satellite model (crates/satpep-model, the C
//! source split mode's BPF controller `satpep_sat` also runs), hosted in quinn.
//!
//! The model speaks the kernel's language: ACKs with a rate sample, counted in segments.
//! This host makes those from quinn's callbacks the way the kernel's `tcp_rate.c` does (each
//! packet remembers how much had been delivered when it left; its acknowledgement yields a
//! delivery rate over the longer of its send and ACK spans), with one segment standing for
//! the MTU quinn started with, and turns the model's window back into bytes and its pacing
//! rate into the connection's [`Pace`], which the endpoint's socket applies datagram by
//! datagram (quinn's own pacer sends bursts of ten: see [`crate::pacing`]).
//!
//! What only a QUIC host needs stays here:
//! - **Outages**: while nothing is acknowledged for over a second, one small probe per
//!   second may leave even with a full window, so the first packet after the link returns
//!   is acknowledged at once and repair starts, instead of waiting out QUIC's backed-off
//!   probe timer.
//! - **A configured rate** is a hint: the model starts at rate × configured RTT (as a warm
//!   start) instead of doubling from 32 packets, and follows what it measures from then on.
//! - **Across idle periods** the connection, and so the model, lives on: a new flow through
//!   a tunnel that carried traffic starts at the path's rate.

use super::{HopInfo, Shared};
use crate::pacing::Pace;
use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};
use quinn_proto::RttEstimator;
use satpep_model::{Ack, Model, Path};
use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use satpep_model::Phase;

/// Quiet for this long (or two RTTs, if longer), the hop may be in an outage: probes may pass.
const SILENCE: Duration = Duration::from_secs(1);
/// At most one outage probe per this interval.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes a packet takes on the wire beyond its QUIC payload (UDP, IP, Ethernet).
const FRAME_OVERHEAD: u64 = 42;
/// Records kept of packets passed by acknowledgements, until quinn declares them lost.
const UNACKED_KEPT: usize = 1 << 16;
/// How far back (segments) a lost packet whose record is gone is put: before any drain.
const LONG_AGO: u32 = 1 << 30;
/// The gap guard never holds the window below this many packets.
const INITIAL_PACKETS: u64 = 32;
/// The window's ceiling, packets (quinn's pacing arithmetic needs a finite window).
const CLAMP: u32 = 1 << 24;

/// Packets a round may lose, at most, at the loss rate last measured (see [`GapGuard`]).
const MAX_LOST_PER_ROUND: f64 = 768.0;
/// A round's loss rate counts once it learnt the fate of this many packets.
const GUARD_MIN_KNOWN: u64 = 200;
/// Rounds in a row whose loss rates the gap guard takes the least of.
const GUARD_ROUNDS: usize = 3;

/// How long a remembered path stays valid for a new connection.
const PATH_MAX_AGE: Duration = Duration::from_secs(300);

/// The last path a connection measured, and when (see [`SatelliteConfig::new`]).
pub type PathMemory = Arc<Mutex<Option<(Path, Instant)>>>;

/// Builds a [`Satellite`] per connection.
#[derive(Debug)]
pub struct SatelliteConfig {
    hop: HopInfo,
    shared: Shared,
}

impl SatelliteConfig {
    /// Controllers for a hop described by `hop`, sharing `shared` with the endpoint: with
    /// a memory, each starts from the path the last one measured there (a warm start when
    /// the tunnel reconnects: after a gateway's restart, an outage longer than the idle
    /// timeout); with a pace, each sets the rate its datagrams leave at.
    pub fn new(hop: HopInfo, shared: Shared) -> SatelliteConfig {
        SatelliteConfig { hop, shared }
    }
}

impl ControllerFactory for SatelliteConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let mut host = Host::new(self.hop, current_mtu as u64, now);
        if let Some(mem) = &self.shared.memory {
            let last = *mem.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = last.filter(|(_, at)| now.saturating_duration_since(*at) < PATH_MAX_AGE);
            if let Some((path, _)) = fresh {
                host.resume(now, &path);
            }
        }
        host.memory = self.shared.memory.clone();
        host.pace = self.shared.pace.clone();
        host.readings = self.shared.readings.clone().map(|r| (r, now));
        host.set_pace(now);
        host.publish(now, true);
        Box::new(Satellite { host })
    }
}

/// What a connection's satellite controller measured, published for the proxy's status,
/// metrics and logs: quinn's `Controller::metrics()` carries only the window and the pacing
/// rate. The factory hands one to each controller it builds (see [`Shared`]); the controller
/// updates it at most every [`PUBLISH_EVERY`] and at each phase change.
#[derive(Debug)]
pub struct Readings {
    rate: AtomicU64,
    base_rtt_us: AtomicU64,
    /// Index into [`Phase::ALL`]; `u8::MAX` before the first reading.
    phase: AtomicU8,
    /// Parts per million; `u64::MAX` until a drain measured it.
    noise_ppm: AtomicU64,
    /// The noise's mean burst, packets; 0 until a drain measured it.
    burst: AtomicU64,
    /// A shallow buffer's depth, µs; 0 while none was found.
    buffer_us: AtomicU64,
    congestion: AtomicU64,
    random: AtomicU64,
}

/// How often a controller publishes its [`Readings`].
pub const PUBLISH_EVERY: Duration = Duration::from_millis(50);

impl Default for Readings {
    fn default() -> Readings {
        Readings {
            rate: AtomicU64::new(0),
            base_rtt_us: AtomicU64::new(0),
            phase: AtomicU8::new(u8::MAX),
            noise_ppm: AtomicU64::new(u64::MAX),
            burst: AtomicU64::new(0),
            buffer_us: AtomicU64::new(0),
            congestion: AtomicU64::new(0),
            random: AtomicU64::new(0),
        }
    }
}

impl Readings {
    /// The model's bottleneck rate, bytes/s (0 before the first reading).
    pub fn rate(&self) -> u64 {
        self.rate.load(Relaxed)
    }

    /// The model's base RTT, once measured.
    pub fn base_rtt(&self) -> Option<Duration> {
        Some(self.base_rtt_us.load(Relaxed))
            .filter(|&u| u > 0)
            .map(Duration::from_micros)
    }

    /// Where the model is in its cycle (None before the first reading: not a satellite
    /// controller, or one that has not started).
    pub fn phase(&self) -> Option<Phase> {
        Phase::ALL.get(self.phase.load(Relaxed) as usize).copied()
    }

    /// The share of packets the hop loses to noise, as the drains measured it.
    pub fn channel_loss(&self) -> Option<f64> {
        Some(self.noise_ppm.load(Relaxed))
            .filter(|&p| p != u64::MAX)
            .map(|p| p as f64 / 1e6)
    }

    /// The noise's mean burst, packets (1: independent losses), as the drains measured it.
    pub fn loss_burst(&self) -> Option<u64> {
        Some(self.burst.load(Relaxed)).filter(|&b| b > 0)
    }

    /// The depth of a buffer shallower than the model's slack, once losses showed one: the
    /// model then keeps half of it as its queue.
    pub fn shallow_buffer(&self) -> Option<Duration> {
        Some(self.buffer_us.load(Relaxed))
            .filter(|&u| u > 0)
            .map(Duration::from_micros)
    }

    /// Loss events so far, by kind.
    pub fn losses(&self) -> LossCounts {
        LossCounts {
            congestion: self.congestion.load(Relaxed),
            random: self.random.load(Relaxed),
        }
    }

    fn publish(&self, model: &Model, losses: LossCounts) {
        let model = model.snapshot();
        self.rate.store(model.bw(), Relaxed);
        self.base_rtt_us
            .store(model.base_rtt_us().unwrap_or(0) as u64, Relaxed);
        let phase = Phase::ALL.iter().position(|&p| p == model.phase());
        self.phase
            .store(phase.map_or(u8::MAX, |i| i as u8), Relaxed);
        let noise = model.channel_loss().map_or(u64::MAX, |l| (l * 1e6) as u64);
        self.noise_ppm.store(noise, Relaxed);
        self.burst
            .store(model.loss_burst().unwrap_or(0) as u64, Relaxed);
        self.buffer_us
            .store(model.shallow_buffer_us().unwrap_or(0) as u64, Relaxed);
        self.congestion.store(losses.congestion, Relaxed);
        self.random.store(losses.random, Relaxed);
    }
}

/// What the controller has seen, for status pages and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounts {
    /// Loss events the model answered by slowing down (a queue stood behind them).
    pub congestion: u64,
    /// Loss events with no queue: repaired, window kept.
    pub random: u64,
}

/// The quinn-facing controller; [`Host`] does the work with plain values, which tests drive.
#[derive(Debug, Clone)]
pub struct Satellite {
    host: Host,
}

/// A packet in flight: when quinn built it (its key), when it left, and the delivery state
/// then (`tcp_rate.c`'s per-skb record).
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    /// Later than `at` when the socket's pacer held the packet (see [`crate::pacing`]).
    left: Instant,
    /// The first transmit's length, bytes.
    len: u32,
    /// Transmits quinn timed alike (see [`Host::on_sent`]).
    transmits: u32,
    delivered: u64,
    delivered_at: Instant,
    first_tx: Instant,
}

/// Keeps the packets a round loses under quinn's limit of 1024 gaps in a stream's receive
/// buffer, past which the peer closes the whole connection (every flow with it). The gaps
/// pile up only while the peer's application does not read (a slow server leg, a CPU-bound
/// peer), but they are this side's losses: the window is held to [`MAX_LOST_PER_ROUND`] ÷
/// the loss rate of the last round (about an RTT), which only binds when a round loses
/// several hundred packets (11 % of packets lost at 7 000 packets a round). The model
/// itself need not know: split's kernel has no such limit. The rate is of the packets whose
/// fate the round learnt (acknowledged or lost), not of those it sent: a round that sent
/// little (its window just cut) learns of the losses of a fuller one.
#[derive(Debug, Clone)]
struct GapGuard {
    since: Instant,
    acked: u64,
    lost: u64,
    /// Loss rates of the last [`GUARD_ROUNDS`] rounds that learnt enough packets' fate, the
    /// newest first; 0 until they did.
    rates: [f64; GUARD_ROUNDS],
}

impl GapGuard {
    fn new(now: Instant) -> GapGuard {
        GapGuard {
            since: now,
            acked: 0,
            lost: 0,
            rates: [0.0; GUARD_ROUNDS],
        }
    }

    /// Closes the round at `now` once it is `round` old.
    fn roll(&mut self, now: Instant, round: Duration) {
        if now.saturating_duration_since(self.since) < round {
            return;
        }
        let known = self.acked + self.lost;
        let rate = if known >= GUARD_MIN_KNOWN {
            Some(self.lost as f64 / known as f64)
        } else {
            (self.acked > 0 && self.lost == 0).then_some(0.0)
        };
        if let Some(r) = rate {
            self.rates.rotate_right(1);
            self.rates[0] = r;
        }
        (self.since, self.acked, self.lost) = (now, 0, 0);
    }

    /// The most packets the window may hold, at the least loss rate of the last
    /// [`GUARD_ROUNDS`] rounds: a loss rate that lasts (the channel's) binds, a round's
    /// overflow does not (the model has cut for it already). Bound by each round's own
    /// rate, every probe and regrowth over a shallow buffer held the window for the rounds
    /// after it: a 470 Mbit/s GEO hop over a 6 ms buffer ran at 282 Mbit/s where the
    /// kernel's host of the same model ran at 378, simulated (seed 46's L02 in the lab:
    /// 50 % of the limit, 63-75 % unbounded).
    fn cap(&self) -> Option<u64> {
        let rate = self.rates.iter().copied().fold(f64::INFINITY, f64::min);
        (rate > 0.0).then(|| (MAX_LOST_PER_ROUND / rate) as u64)
    }
}

/// The newest packet an ACK frame acknowledged, for its rate sample.
#[derive(Debug, Clone, Copy)]
struct Newest {
    sent: Sent,
    rtt: Duration,
}

/// The model's host: quinn's events in, the model's window out.
#[derive(Debug, Clone)]
pub struct Host {
    model: Model,
    /// Bytes a model segment stands for (the MTU at the start: fixed, so counts stay whole).
    unit: u64,
    mtu: u64,
    epoch: Instant,
    /// Payload bytes acknowledged and lost so far.
    delivered: u64,
    lost: u64,
    delivered_at: Instant,
    first_tx: Instant,
    in_flight: u64,
    sent: VecDeque<Sent>,
    /// Packets passed by the acknowledgements, not acknowledged: lost, mostly.
    unacked: VecDeque<Sent>,
    /// This ACK frame's: bytes acknowledged, newest packet, whether application limited.
    batch_acked: u64,
    batch_newest: Option<Newest>,
    /// The send time and delivered count of the newest packet the last loss covered.
    last_loss: Option<(Instant, u64)>,
    /// The record the last fresh acknowledgement took, and the RTT it measured.
    last_acked: Option<Newest>,
    batch_app_limited: bool,
    /// Delivered segments before this frame's acknowledgements.
    batch_from: u64,
    srtt: Duration,
    min_rtt: Duration,
    last_ack: Instant,
    last_probe: Option<Instant>,
    losses: LossCounts,
    /// Where a drain's confirmed model goes for the next connection, if anywhere.
    memory: Option<PathMemory>,
    /// Where the model's pacing rate goes, if anywhere (the endpoint's socket applies it).
    pace: Option<Arc<Pace>>,
    /// The pacer's holds taken so far (see [`Pace::take_hold`]).
    holds_seen: u64,
    /// Where the model's figures go for the proxy, if anywhere, and when they last went.
    readings: Option<(Arc<Readings>, Instant)>,
    guard: GapGuard,
}

impl Host {
    /// A connection starting at `now` with packets of `mtu` bytes.
    pub fn new(hop: HopInfo, mtu: u64, now: Instant) -> Host {
        let mtu = mtu.max(1200);
        let first = Ack {
            mss: mtu as u32,
            ..Ack::default()
        };
        let mut model = Model::new(&first, 0, CLAMP);
        // Told the rate and the RTT: start at that bandwidth-delay product, at the model.
        if let Some(rate) = hop.rate {
            let bw = (rate as u128 * mtu as u128 / (mtu + FRAME_OVERHEAD) as u128) as u64;
            model.resume(
                &first,
                &Path {
                    bw: bw.min(u32::MAX as u64) as u32,
                    base_us: hop.rtt.as_micros().clamp(1, u32::MAX as u128) as u32,
                },
            );
        }
        Host {
            model,
            unit: mtu,
            mtu,
            epoch: now,
            delivered: 0,
            lost: 0,
            delivered_at: now,
            first_tx: now,
            in_flight: 0,
            sent: VecDeque::new(),
            unacked: VecDeque::new(),
            last_loss: None,
            last_acked: None,
            batch_acked: 0,
            batch_newest: None,
            batch_app_limited: false,
            batch_from: 0,
            srtt: Duration::ZERO,
            min_rtt: Duration::MAX,
            last_ack: now,
            last_probe: None,
            losses: LossCounts::default(),
            memory: None,
            pace: None,
            holds_seen: 0,
            readings: None,
            guard: GapGuard::new(now),
        }
    }

    /// Starts from `path`, measured by an earlier connection (warm start).
    pub fn resume(&mut self, now: Instant, path: &Path) {
        let a = self.ack(now);
        self.model.resume(&a, path);
    }

    fn us(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// The ACK's common part: clock, segment size, smoothed RTT, deliveries.
    fn ack(&self, now: Instant) -> Ack {
        Ack {
            now_us: self.us(now),
            mss: self.unit as u32,
            srtt_us: self.srtt.as_micros().min(u32::MAX as u128) as u32,
            delivered: (self.delivered / self.unit) as u32,
            rs_delivered: -1,
            interval_us: -1,
            rtt_us: -1,
            // Its loss reports carry when the newest lost packet left (on_loss).
            losses_dated: 1,
            ..Ack::default()
        }
    }

    /// The transmit the socket's pacer held, if one left since the last call, left later
    /// than quinn timed it: its record (the newest: quinn reports each transmit, a GSO batch
    /// too, once, and builds no other while one waits) takes the time it left.
    fn take_hold(&mut self) {
        let Some(pace) = &self.pace else { return };
        if let Some((held, len)) = pace.take_hold(&mut self.holds_seen) {
            // Only a record of the held transmit alone: one of several timed alike takes its
            // first's (unheld) time; a path MTU probe, which quinn does not report, none.
            let alone = |r: &&mut Sent| r.transmits == 1 && r.len as usize == len;
            if let Some(r) = self.sent.back_mut().filter(alone) {
                r.left = r.at + held;
            }
        }
    }

    /// A packet of `bytes` left at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        self.take_hold();
        if self.in_flight == 0 {
            self.first_tx = now;
            self.delivered_at = now;
        }
        if now.saturating_duration_since(self.last_ack) > self.silence() {
            self.last_probe = Some(now);
        }
        // quinn reports each transmit once, ACK-only ones too, a GSO batch with its whole
        // length: an estimate until the next ACK frame says (quinn counts ACK-only packets
        // out of flight).
        self.in_flight += bytes;
        // quinn times every transmit of one pass of its driver alone, so acknowledgements
        // cannot tell them apart: one record stands for them all (its first transmit's).
        if let Some(r) = self.sent.back_mut().filter(|r| r.at == now) {
            r.transmits = r.transmits.saturating_add(1);
            return;
        }
        self.sent.push_back(Sent {
            at: now,
            left: now,
            len: bytes.min(u32::MAX as u64) as u32,
            transmits: 1,
            delivered: self.delivered,
            delivered_at: self.delivered_at,
            first_tx: self.first_tx,
        });
    }

    /// The packet sent at `sent`, `bytes` long, was acknowledged at `now`; `srtt` is the
    /// connection's smoothed RTT (the host keeps its own from the packets' times when the
    /// socket paces).
    pub fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        srtt: Duration,
    ) {
        self.take_hold();
        if self.batch_acked == 0 {
            self.batch_from = self.delivered / self.unit;
        }
        self.in_flight = self.in_flight.saturating_sub(bytes);
        self.guard.acked += 1;
        self.delivered += bytes;
        self.batch_acked += bytes;
        self.batch_app_limited = app_limited;
        if self.pace.is_none() {
            self.srtt = srtt;
        }
        self.last_ack = now;
        // Packets sent before this one and not acknowledged were lost (quinn reports them
        // on its own, later) or come out of order: their records wait for that.
        while self.sent.front().is_some_and(|s| s.at < sent) {
            let r = self.sent.pop_front().expect("just seen");
            if self.unacked.len() >= UNACKED_KEPT {
                self.unacked.pop_front();
            }
            self.unacked.push_back(r);
        }
        let (rec, rtt) = match self.sent.front().copied().filter(|s| s.at == sent) {
            Some(rec) => {
                self.sent.pop_front();
                // Kept for the losses among the transmits it stands for (see `on_loss`).
                if self.unacked.len() >= UNACKED_KEPT {
                    self.unacked.pop_front();
                }
                self.unacked.push_back(rec);
                self.delivered_at = now;
                self.first_tx = rec.left;
                let rtt = now.saturating_duration_since(rec.left);
                self.min_rtt = self.min_rtt.min(rtt);
                // Paced by the socket, quinn's smoothed RTT counts the holds: the model's
                // comes from the packets' own times (RFC 6298's gain of 1/8).
                if self.pace.is_some() {
                    self.srtt = match self.srtt.is_zero() {
                        true => rtt,
                        false => (self.srtt * 7 + rtt) / 8,
                    };
                }
                self.last_acked = Some(Newest { sent: rec, rtt });
                (rec, rtt)
            }
            // Another transmit its record stands for (see `on_sent`): the RTT its first
            // acknowledgement measured (the later ones left later when paced), dated by
            // the record. Undated, a drain's acknowledgements went uncounted beside its
            // losses: its noise read 4.6 % on a link losing 1 %, simulated.
            None => match self.last_acked.filter(|n| n.sent.at == sent) {
                Some(n) => (n.sent, n.rtt),
                None => return,
            },
        };
        if self.batch_newest.is_none_or(|n| n.sent.at <= rec.at) {
            self.batch_newest = Some(Newest { sent: rec, rtt });
        }
    }

    /// An ACK frame's acknowledgements are all in (quinn counts `in_flight` bytes still
    /// out): the model takes them as one ACK.
    pub fn on_end_acks(&mut self, now: Instant, in_flight: u64) {
        self.in_flight = in_flight;
        if let Some(p) = &self.pace {
            p.set_in_flight(in_flight > 0);
        }
        self.guard
            .roll(now, self.srtt.max(Duration::from_millis(10)));
        if self.batch_acked == 0 {
            return;
        }
        let mut a = self.ack(now);
        a.acked = (self.delivered / self.unit - self.batch_from) as u32;
        a.app_limited = self.batch_app_limited as u8;
        if let Some(n) = self.batch_newest.take() {
            let snd = n.sent.left.saturating_duration_since(n.sent.first_tx);
            let ack = now.saturating_duration_since(n.sent.delivered_at);
            let interval = snd.max(ack);
            a.prior_delivered = (n.sent.delivered / self.unit) as u32;
            a.rtt_us = n.rtt.as_micros().clamp(1, i32::MAX as u128) as i32;
            // As tcp_rate.c: a span shorter than the least RTT says nothing of the rate.
            if interval >= self.min_rtt {
                a.rs_delivered = a.delivered.wrapping_sub(a.prior_delivered) as i32;
                a.interval_us = interval.as_micros() as i64;
            }
        } else {
            a.prior_delivered = a.delivered;
        }
        self.batch_acked = 0;
        let phase = self.model.phase();
        self.model.on_ack(&a);
        self.follow_share(&a);
        self.log_phase(phase);
        self.set_pace(now);
        self.publish(now, self.model.phase() != phase);
    }

    /// A hub's gateway holds this connection to its share of the carrier (see
    /// [`crate::hub`]): a share that grew because the hub freed carrier is run at from now
    /// (`sat_model_follow_share`, which split's gateway uses through its pacing ceilings).
    fn follow_share(&mut self, a: &Ack) {
        let Some(pace) = self.pace.as_ref().filter(|p| p.share() > 0) else {
            return;
        };
        let share = pace.share().min(u32::MAX as u64) as u32;
        self.model.follow_share(a, share, pace.share_epoch() as u8);
    }

    /// Publishes the model's figures, if someone reads them: every [`PUBLISH_EVERY`], or
    /// `now` if the phase changed.
    fn publish(&mut self, now: Instant, changed: bool) {
        if let Some((r, at)) = &mut self.readings {
            if changed || now.saturating_duration_since(*at) >= PUBLISH_EVERY {
                r.publish(&self.model, self.losses);
                *at = now;
            }
        }
    }

    /// Hands the model's pacing rate to the socket, if it paces this connection.
    fn set_pace(&self, now: Instant) {
        if let Some(p) = &self.pace {
            p.set(self.pacing_rate(now));
        }
    }

    /// Phase changes at trace level (`RUST_LOG=satpep_tunnel=trace`); a drain that emptied
    /// the queue confirmed the model, which the path memory takes.
    fn log_phase(&self, before: Phase) {
        let m = &self.model;
        if before == Phase::Drain && m.phase() == Phase::Cruise {
            if let (Some(mem), Some(p)) = (&self.memory, m.path()) {
                *mem.lock().unwrap_or_else(|e| e.into_inner()) = Some((p, Instant::now()));
            }
        }
        if m.phase() != before {
            tracing::trace!(
                from = before.name(),
                to = m.phase().name(),
                rate_mbit = m.bw() as f64 * 8e-6,
                base_rtt_ms = m.base_rtt_us().unwrap_or(0) as f64 / 1e3,
                queue_ms = m.queue_us() as f64 / 1e3,
                window = self.window(),
                "satellite controller: phase"
            );
        }
    }

    /// Packets (the newest sent at `sent`) of `lost_bytes` in all were declared lost at `now`;
    /// `persistent`: so many that QUIC calls it persistent congestion (an outage, mostly).
    pub fn on_loss(&mut self, now: Instant, sent: Instant, persistent: bool, lost_bytes: u64) {
        self.in_flight = self.in_flight.saturating_sub(lost_bytes);
        let before = self.lost / self.unit;
        self.lost += lost_bytes;
        self.guard.lost += lost_bytes.div_ceil(self.mtu);
        if persistent {
            self.model.on_timeout();
        }
        let mut a = self.ack(now);
        // As the kernel reports a loss with the ACK of a later packet: delivered as when
        // the newest lost packet left (the model counts a drain's own losses by it, and
        // a shallow buffer's overflows counted in a drain read as the channel's noise: a
        // tunnel that took them for "now" measured 68 % noise beside a competitor and
        // paced past the link). Its record may be gone: the same transmit's losses
        // declared earlier took it, or it is older than any kept (then it is no drain's).
        let mut prior = None;
        for q in [&mut self.unacked, &mut self.sent] {
            while q.front().is_some_and(|s| s.at <= sent) {
                let r = q.pop_front().expect("just seen");
                prior = Some((r.at, r.delivered));
            }
        }
        let prior = prior.or(self.last_loss.filter(|&(at, _)| at >= sent));
        self.last_loss = prior.or(self.last_loss);
        a.prior_delivered = match prior {
            Some((_, d)) => (d / self.unit) as u32,
            None => a.delivered.wrapping_sub(LONG_AGO),
        };
        a.losses = (self.lost / self.unit - before) as u32;
        if a.losses == 0 {
            return;
        }
        let (window, phase) = (self.model.cwnd(), self.model.phase());
        self.model.on_ack(&a);
        self.log_phase(phase);
        self.set_pace(now);
        if self.model.cwnd() < window || self.model.phase() != phase {
            self.losses.congestion += 1;
        } else {
            self.losses.random += 1;
        }
        self.publish(now, self.model.phase() != phase);
    }

    fn silence(&self) -> Duration {
        SILENCE.max(self.srtt * 2)
    }

    /// The window in bytes: the model's, within the [`GapGuard`]'s bound.
    pub fn window(&self) -> u64 {
        let w = self.model.cwnd() as u64 * self.unit;
        match self.guard.cap() {
            Some(packets) => w.min(packets.max(INITIAL_PACKETS) * self.mtu),
            None => w,
        }
    }

    /// The window at `now`; while the hop is silent, room for one probe per interval.
    pub fn window_at(&self, now: Instant) -> u64 {
        let silent = now.saturating_duration_since(self.last_ack) > self.silence();
        let may_probe = self
            .last_probe
            .is_none_or(|p| now.saturating_duration_since(p) >= PROBE_INTERVAL);
        if silent && may_probe {
            self.window().max(self.in_flight + 2 * self.mtu)
        } else {
            self.window()
        }
    }

    /// The pacing rate the model asks for, bytes/s (0: none yet).
    pub fn pacing_rate(&self, now: Instant) -> u64 {
        self.model.pacing_rate(&self.ack(now))
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }
}

impl Controller for Satellite {
    fn on_sent(&mut self, now: Instant, bytes: u64, _last_packet_number: u64) {
        self.host.on_sent(now, bytes);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.host.on_ack(now, sent, bytes, app_limited, rtt.get());
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        _app_limited: bool,
        _largest_packet_num_acked: Option<u64>,
    ) {
        self.host.on_end_acks(now, in_flight);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.host
            .on_loss(now, sent, is_persistent_congestion, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.host.mtu = new_mtu as u64;
    }

    fn window(&self) -> u64 {
        self.host.window_at(Instant::now())
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut m = ControllerMetrics::default();
        m.congestion_window = self.host.window();
        m.pacing_rate = Some(self.host.pacing_rate(Instant::now()) * 8).filter(|&r| r > 0);
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.host.window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use satpep_model::sim::{self, KernelHost, Link};

    /// The tunnel's host on the simulated link, through the same calls quinn makes.
    struct QuinnHost {
        host: Host,
        base: Instant,
        /// quinn times every transmit of one driver pass alike: packets sent within the
        /// same span of this many µs share a send time (0: each its own).
        pass_us: u64,
    }

    impl QuinnHost {
        fn new(base: Instant, pass_us: u64) -> QuinnHost {
            QuinnHost {
                host: Host::new(hop(), MSS, base),
                base,
                pass_us,
            }
        }
        fn at(&self, us: u64) -> Instant {
            self.base + Duration::from_micros(us)
        }
        /// When quinn says a packet sent at `us` was sent.
        fn sent_at(&self, us: u64) -> Instant {
            self.at(us
                .checked_div(self.pass_us)
                .map_or(us, |n| n * self.pass_us))
        }
    }

    impl sim::Host for QuinnHost {
        fn on_sent(&mut self, now_us: u64, bytes: u64) {
            let t = self.sent_at(now_us);
            self.host.on_sent(t, bytes);
        }
        fn on_acked(&mut self, now_us: u64, sent_us: u64, bytes: u64) {
            let (t, s) = (self.at(now_us), self.sent_at(sent_us));
            // quinn hands over the smoothed RTT of before this ACK, as the kernel's srtt.
            let srtt = if self.host.srtt.is_zero() {
                t - s
            } else {
                (self.host.srtt * 7 + (t - s)) / 8
            };
            self.host.on_ack(t, s, bytes, false, srtt);
            let in_flight = self.host.in_flight;
            self.host.on_end_acks(t, in_flight);
        }
        fn on_lost(&mut self, now_us: u64, sent_us: u64, bytes: u64) {
            let (t, s) = (self.at(now_us), self.sent_at(sent_us));
            self.host.on_loss(t, s, false, bytes);
        }
        fn on_end_acks(&mut self, _now_us: u64) {}
        fn on_handshake(&mut self, rtt_us: u64) {
            // quinn's controller sees the handshake's packets sent and acknowledged (their
            // RTT paces the first data), as the kernel's host sees the SYN's.
            let (ack, rtt) = (self.at(0), Duration::from_micros(rtt_us));
            let sent = ack - rtt;
            self.host.on_sent(sent, 1200);
            self.host.on_ack(ack, sent, 1200, false, rtt);
            self.host.on_end_acks(ack, 0);
        }
        fn window(&self) -> u64 {
            self.host.window()
        }
        fn pacing_rate(&self) -> u64 {
            self.host.pacing_rate(self.at(0))
        }
    }

    fn hop() -> HopInfo {
        HopInfo {
            rate: None,
            rtt: Duration::from_millis(600),
        }
    }

    const MSS: u64 = 1400;

    /// The two hosts of the one model, on the same simulated links: the kernel's (split's
    /// `satpep_sat`) and quinn's (the tunnel's) must agree, or one of them feeds the model
    /// something the other does not.
    #[test]
    fn the_tunnel_and_the_kernel_hosts_agree_on_simulated_links() {
        hosts_agree(0);
    }

    /// As above with quinn's send times: one for every transmit of a driver pass (here 1 ms
    /// of them). A group's losses once read as sent when declared, so a drain counted the
    /// overflows of the rounds before it as the channel's noise.
    #[test]
    fn the_hosts_agree_when_quinn_times_transmits_alike() {
        hosts_agree(1000);
    }

    fn hosts_agree(pass_us: u64) {
        type Trace = Box<dyn Fn(f64) -> Link>;
        let links: [(&str, Trace); 6] = [
            (
                "GEO 50 Mbit/s, 1 % loss",
                Box::new(|_| Link::steady(50e6, 0.6, 2.0, 0.01)),
            ),
            (
                "20 then 8 Mbit/s",
                Box::new(|t| Link {
                    rate_bps: if t < 8.0 { 20e6 } else { 8e6 },
                    rtt: 0.2,
                    buffer: 1e6,
                    loss: 0.0,
                    burst: 1.0,
                }),
            ),
            (
                "100 Mbit/s, 5 ms buffer",
                Box::new(|_| Link::steady(100e6, 0.1, 0.005, 0.0)),
            ),
            (
                // A LEO return link at BER 1e-5: quinn declares losses apart from its ACKs.
                "12 Mbit/s, RTT 41 ms, 11 % loss",
                Box::new(|_| Link::steady(12e6, 0.041, 0.25, 0.11)),
            ),
            (
                // A thin GEO return link whose buffer holds seven frames (seed 48's L04): the
                // first flight meets it before any RTT sample unless the handshake gave one
                // (without, quinn's host delivered 0.62 Mbit/s over 3-10 s, the kernel's 1.33).
                "1.4 Mbit/s, RTT 521 ms, 54 ms buffer",
                Box::new(|_| Link::steady(1.4e6, 0.521, 0.054, 0.0)),
            ),
            (
                // A fast GEO beam over a buffer of a few frames (seed 46's L02): each probe's
                // overflow round once set the tunnel's gap guard for the rounds after it
                // (282 Mbit/s through quinn's host, 378 through the kernel's).
                "470 Mbit/s, RTT 640 ms, 6 ms buffer",
                Box::new(|_| Link::steady(470e6, 0.64, 0.006, 0.0)),
            ),
        ];
        for (name, link) in links {
            let mut k = KernelHost::new(MSS as u32);
            let pk = sim::run(&mut k, &*link, MSS, 15.0);
            let base = Instant::now();
            let mut q = QuinnHost::new(base, pass_us);
            let pq = sim::run(&mut q, &*link, MSS, 15.0);
            let (gk, gq) = (
                sim::goodput(&pk, MSS, 3.0, 14.0),
                sim::goodput(&pq, MSS, 3.0, 14.0),
            );
            let (qk, qq) = (
                sim::queue_p95(&pk, 3.0, 14.0),
                sim::queue_p95(&pq, 3.0, 14.0),
            );
            println!(
                "{name}: kernel host {:.2} Mbit/s, queue p95 {:.1} ms, noise {:?}, {:?}; quinn host {:.2} Mbit/s, queue p95 {:.1} ms, noise {:?}, {:?}",
                gk * 8e-6,
                qk * 1e3,
                k.model.channel_loss(),
                k.model.phase(),
                gq * 8e-6,
                qq * 1e3,
                q.host.model().channel_loss(),
                q.host.model().phase()
            );
            assert!(
                (gq / gk - 1.0).abs() < 0.02,
                "{name}: goodput {gq:.0} B/s through quinn's host, {gk:.0} through the kernel's"
            );
            assert!(
                (qq - qk).abs() < 0.01 + 0.2 * qk,
                "{name}: queue p95 {qq:.4} s through quinn's host, {qk:.4} through the kernel's"
            );
            let (nk, nq) = (
                k.model.channel_loss().unwrap_or(0.0),
                q.host.model().channel_loss().unwrap_or(0.0),
            );
            // Transmits timed alike move the drains, and an estimate over a few drains
            // moves with them: 8.0 % with 1 ms passes, 11.7 % with 3 ms, on a link losing
            // 11 % (10.9 % through the kernel's host).
            let share = if pass_us > 0 { 0.35 } else { 0.2 };
            assert!(
                (nq - nk).abs() <= 0.002 + share * nk,
                "{name}: the channel's noise {nq:.4} through quinn's host, {nk:.4} through the kernel's"
            );
        }
    }

    #[test]
    fn a_configured_rate_starts_at_the_bandwidth_delay_product() {
        let now = Instant::now();
        let h = Host::new(
            HopInfo {
                rate: Some(12_500_000),
                rtt: Duration::from_millis(600),
            },
            1200,
            now,
        );
        let bdp = 12_500_000.0 * 0.6 * 1200.0 / 1242.0;
        let w = h.window() as f64;
        assert!((bdp..bdp * 1.1).contains(&w), "window {w} against {bdp}");
        assert_eq!(h.model().phase(), Phase::Cruise);
    }

    #[test]
    fn a_terminal_reconnecting_starts_from_the_path_it_measured_within_five_minutes() {
        let now = Instant::now();
        let memory = PathMemory::default();
        let shared = Shared {
            memory: Some(memory.clone()),
            ..Shared::default()
        };
        let f = Arc::new(SatelliteConfig::new(hop(), shared));
        let path = Path {
            bw: 6_250_000,
            base_us: 600_000,
        };
        *memory.lock().unwrap() = Some((path, now));
        let bdp = 6_250_000.0 * 0.6;
        let warm = f.clone().build(now + Duration::from_secs(10), 1200);
        let w = warm.window() as f64;
        assert!(
            (bdp..bdp * 1.2).contains(&w),
            "warm window {w} against {bdp}"
        );
        let stale = f.clone().build(now + Duration::from_secs(301), 1200);
        assert_eq!(
            stale.window(),
            32 * 1200,
            "a path older than five minutes is forgotten"
        );
        let gateway = Arc::new(SatelliteConfig::new(hop(), Shared::default()));
        assert_eq!(gateway.build(now, 1200).window(), 32 * 1200);
    }

    #[test]
    fn a_round_losing_hundreds_of_packets_holds_the_window_under_quinns_gap_limit() {
        let t0 = Instant::now();
        let mut h = Host::new(
            HopInfo {
                rate: Some(100_000_000),
                rtt: Duration::from_millis(100),
            },
            1200,
            t0,
        );
        let unguarded = h.window();
        assert!(
            unguarded > 8000 * 1200,
            "told 800 Mbit/s × 100 ms: {unguarded}"
        );
        // Rounds of 8000 packets losing 13 % (1040 each), acknowledged an RTT later.
        let rtt = Duration::from_millis(100);
        let mut t = t0;
        for _ in 0..5 {
            // Ten packets to a transmit: quinn reports the transmit once, acknowledges each.
            let sent_at: Vec<Instant> = (0..8000).map(|i| t + rtt * (i / 10) / 800).collect();
            for at in sent_at.iter().step_by(10) {
                h.on_sent(*at, 12_000);
            }
            t += rtt;
            for (i, at) in sent_at.iter().enumerate() {
                if i % 100 < 13 {
                    if i % 100 == 12 {
                        h.on_loss(t, *at, false, 13 * 1200);
                    }
                } else {
                    h.on_ack(t, *at, 1200, false, rtt);
                }
                if i % 10 == 9 {
                    h.on_end_acks(t, h.in_flight);
                }
            }
        }
        let cap = (MAX_LOST_PER_ROUND / 0.13) as u64 * 1200;
        let model = h.model.cwnd() as u64 * 1200;
        assert!(
            model > cap,
            "the model's own window {model} is under the bound {cap}"
        );
        assert!(
            h.window() >= cap * 9 / 10,
            "the bound {} is tighter than 13 % loss asks ({cap})",
            h.window()
        );
        assert!(
            h.window() <= cap + 1200,
            "at 13 % loss the window {} may hold {} lost packets a round",
            h.window(),
            h.window() as f64 / 1200.0 * 0.13
        );
        // A clean round lifts the bound.
        for i in 0..400u32 {
            let at = t + rtt * i / 400;
            h.on_sent(at, 1200);
            h.on_ack(at + rtt, at, 1200, false, rtt);
            h.on_end_acks(at + rtt, h.in_flight);
        }
        h.guard.roll(t + rtt * 3, rtt);
        assert_eq!(h.guard.cap(), None, "no loss, no bound");
    }

    #[test]
    fn a_packet_the_pacer_held_is_timed_from_when_it_left() {
        let t0 = Instant::now();
        let mut h = Host::new(hop(), 1200, t0);
        let pace = Pace::new();
        h.pace = Some(pace.clone());
        // Two packets built at t0; the second waited 20 ms in the socket's pacer.
        h.on_sent(t0, 1200);
        h.on_sent(t0 + Duration::from_micros(10), 1200);
        pace.held(Duration::from_millis(20), 1200);
        let rtt = Duration::from_millis(600);
        h.on_ack(t0 + rtt, t0, 1200, false, rtt);
        let second = t0 + Duration::from_micros(10);
        h.on_ack(
            t0 + rtt + Duration::from_millis(20),
            second,
            1200,
            false,
            rtt,
        );
        let newest = h.batch_newest.expect("acknowledged");
        assert_eq!(
            newest.rtt,
            rtt - Duration::from_micros(10),
            "held time in the RTT"
        );
        assert_eq!(h.min_rtt, rtt - Duration::from_micros(10));
        // `transmits` timed alike at `t`, then a hold of `len` bytes: the RTT the first
        // one's acknowledgement reads.
        let mut after_hold = |t: Instant, transmits: u32, len: usize| {
            for _ in 0..transmits {
                h.on_sent(t, 1200);
            }
            pace.held(Duration::from_millis(20), len);
            h.on_ack(t + rtt, t, 1200, false, rtt);
            h.batch_newest.unwrap().rtt
        };
        // A transmit quinn did not report (a path MTU probe) moves no record.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            after_hold(t1, 1, 1452),
            rtt,
            "a probe's hold moved a packet"
        );
        // A hold of the last of several transmits timed alike moves nothing either (the
        // record is the first's, which left at once).
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(after_hold(t2, 2, 1200), rtt, "a group took its last's hold");
    }

    #[test]
    fn an_outage_lets_one_probe_per_second_past_a_full_window() {
        let now = Instant::now();
        let mut h = Host::new(hop(), 1200, now);
        let w = h.window();
        let mut t = now;
        while h.in_flight + 1200 <= w {
            h.on_sent(t, 1200);
        }
        t += Duration::from_millis(500);
        assert_eq!(h.window_at(t), w, "no probe before a second of silence");
        t += Duration::from_millis(1000);
        assert!(
            h.window_at(t) > h.in_flight,
            "a probe may leave after 1.5 s of silence"
        );
        h.on_sent(t, 1200);
        assert_eq!(
            h.window_at(t + Duration::from_millis(100)),
            w,
            "one probe a second"
        );
        t += Duration::from_millis(1100);
        assert!(h.window_at(t) > h.in_flight, "the next second's probe");
    }

    #[test]
    fn random_losses_keep_the_window_and_are_counted_as_random() {
        let now = Instant::now();
        let mut h = Host::new(hop(), 1200, now);
        let w = h.window();
        h.on_sent(now, 1200);
        h.on_loss(now + Duration::from_millis(700), now, false, 1200);
        assert_eq!(h.window(), w);
        assert_eq!(
            h.losses,
            LossCounts {
                congestion: 0,
                random: 1
            }
        );
    }
}
