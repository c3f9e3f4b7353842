//! The satellite hop's controller. It needs no configured rate: it measures the bottleneck's
//! rate and the path's base RTT and holds the window at their product plus a small slack, so
//! the bottleneck queue stays short whatever the link does. docs/tunnel.md says where each
//! idea comes from.
//!
//! - **Model** (BBR's): the rate is the highest per-round delivery rate of the last
//!   [`BW_ROUNDS`] rounds that filled their window; the base RTT the lowest RTT of the last
//!   [`MIN_RTT_WINDOW`] (and at least [`MIN_RTT_ROUNDS`] rounds). The window is rate × (base
//!   RTT + slack), the slack being max(15 ms, base RTT / 25): the only queue it means to keep.
//!   It rises by a quarter of each acknowledgement, never at once (a raised window would
//!   leave as a burst).
//! - **Start**: the window doubles every round until the RTT shows a queue above the budget
//!   (slack + max(15 ms, base RTT / 20); delay-based exit, as HyStart) or the rate stops
//!   growing for three full rounds (BBR's full pipe); random losses do not end it.
//! - **Rate drops** (fades, cross traffic arriving): the RTT (the lowest sample of the last
//!   base RTT / 8) rises above base RTT + budget. The rate becomes what the window delivers at
//!   that RTT, window / (base RTT + queue) (Vegas's and FAST's reading), or the
//!   acknowledgement rate if lower, and one drain round at 0.94 × rate × base RTT empties the
//!   queue. A queue left after the drain cuts the rate again the same way. After a drain the
//!   window comes back without its slack until the first packet sent after it is
//!   acknowledged: the drain's thinner flow is still in the pipe for that round.
//! - **Rate rises**: every [`CRUISE_ROUNDS`] rounds the window probes half a slack above the
//!   model; room found doubles the probe (BBRv3's probe up), and three in a row, or two
//!   rounds whose full window met no queue, restart growth at ×1.5 a round. Sooner: a
//!   quarter of a window acknowledged without any queue, all of it sent with most of the
//!   slack in flight, restarts growth at ×1.25 a round (a fade's step up, seen a round
//!   after it instead of two or three).
//! - **A queue that is not its own**: drains that leave a queue (two if the second found
//!   the buffer overflowed and holding more than twice this sender's window, and such a
//!   drain cuts the rate no lower than half the link's; three with a loss from an
//!   overflowing buffer or a queue larger than anything this sender has in flight; four
//!   otherwise) mean a loss-based sender keeps the buffer full. Then delay is no signal:
//!   the window follows CUBIC, as the hosts' own TCP does, but never below half the link's
//!   rate over the RTT now, raised by the share of its packets the full buffer drops (its
//!   fair share, [`Core::fair_share`]), for at least
//!   [`COMPETE_AT_LEAST`], after which a drain checks whether the competitor left (Copa's
//!   mode switch). A drain whose acknowledgement rate fell by more than this sender's own
//!   cut explains met a link that slowed (a fade's steps), not a competitor: the count
//!   starts again, unless the buffer overflowed and holds more than twice this sender's
//!   window (a competitor in slow start). A loss in a drain does not cut again.
//! - **Losses** with no queue above the budget are the channel's noise, repaired without
//!   slowing down (Tarang's and Westwood+'s idea, 004 §4). Counted by kind. But a round that
//!   loses far more than the noise (measured in drains) while a queue of a few ms stands
//!   met a buffer shallower than the budget: congestion, and the slack becomes half that
//!   buffer.
//! - **Outages**: while nothing is acknowledged for over a second, one small probe per second
//!   may leave even with a full window, so the first packet after the link returns is
//!   acknowledged at once and repair starts, instead of waiting out QUIC's backed-off probe
//!   timer. Persistent congestion with no queue keeps the model; RTT samples of packets sent
//!   before the silence ended are not used.
//! - **A configured rate** is a hint: with it the controller starts at rate × configured
//!   RTT instead of slow start, and from then on follows what it measures (a nominal rate
//!   is often wrong: a service plan's figure, a fade, a shared carrier).

use super::HopInfo;
use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;
use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Least slack: the queue the window allows above rate × base RTT.
const SLACK_MIN: Duration = Duration::from_millis(15);
/// The slack is at least base RTT / this.
const SLACK_SHARE: u32 = 25;
/// Least margin above the slack before a queue counts as too long.
const MARGIN_MIN: Duration = Duration::from_millis(15);
/// The margin is at least base RTT / this.
const MARGIN_SHARE: u32 = 40;
/// Rounds the rate estimate remembers (its max filter).
const BW_ROUNDS: usize = 10;
/// Least time the base RTT estimate remembers (its min filter)...
const MIN_RTT_WINDOW: Duration = Duration::from_secs(2);
/// ...and least rounds: it must outlast a cruise-probe-drain cycle, which samples it.
const MIN_RTT_ROUNDS: u32 = 16;
/// Rounds between probes for more rate.
const CRUISE_ROUNDS: u32 = 4;
/// Window in a drain round, as a share of rate × base RTT.
const DRAIN_GAIN: f64 = 0.94;
/// CUBIC's constant and multiplicative decrease (RFC 9438), for the competitive mode.
const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;
/// Most of the competitive window's loss the fair share makes up for.
const COMPETE_LOSS_MAX: f64 = 0.3;
/// Least time in the competitive mode before a drain checks whether the competitor left.
const COMPETE_AT_LEAST: Duration = Duration::from_secs(20);
/// Window before anything is known, packets (one connection carries every flow).
const INITIAL_PACKETS: u64 = 32;
/// The current queue is read from the RTT samples of the last base RTT / this (at least
/// [`RECENT_MIN`]): their minimum, so that delayed acknowledgements and pacing bursts
/// shorter than that do not count as queue.
const RECENT_SHARE: u32 = 8;
/// Least span of [`RECENT_SHARE`].
const RECENT_MIN: Duration = Duration::from_millis(10);
/// Packets the noise estimate remembers, about: each drain's counts make the older ones
/// weigh less by their share of this (by a quarter at least, by 95 % at most).
const NOISE_MEMORY: u64 = 1000;
/// Highest channel loss the rate model makes up for: beyond it the link is close to
/// unusable, and a bad reading would double the rate.
const NOISE_MAX: f64 = 0.5;
/// Highest channel loss a round's rate sample credits as noise (see
/// [`Core::loss_credit`]): BER 1e-5 loses 11 % of 1500-byte packets, and a satellite
/// channel after its coding loses far less; beyond this a bottleneck is dropping what
/// exceeds its rate.
const NOISE_CREDIT_MAX: f64 = 0.25;
/// Silence after which the hop is taken to be out, and probes may go.
const SILENCE: Duration = Duration::from_secs(1);
/// At most one probe per this while the hop is out.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes a datagram takes on the link beyond its QUIC payload: UDP 8, IPv4 20, Ethernet
/// header 14 (a configured rate counts whole frames; the window counts payload).
const FRAME_OVERHEAD: u64 = 42;

/// Configuration: the hop as the operator described it (possibly not at all).
#[derive(Debug, Clone)]
pub struct SatelliteConfig {
    hop: HopInfo,
}

impl SatelliteConfig {
    /// A controller for `hop`.
    pub fn new(hop: HopInfo) -> SatelliteConfig {
        SatelliteConfig { hop }
    }
}

impl ControllerFactory for SatelliteConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(Satellite {
            core: Core::new(self.hop, current_mtu as u64, now),
        })
    }
}

/// What the controller has seen, for status pages and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounts {
    /// Loss events with a queue behind them: the rate estimate was cut.
    pub congestion: u64,
    /// Loss events with no queue: repaired, window kept.
    pub random: u64,
}

/// The quinn-facing wrapper; the logic is in [`Core`], which tests drive directly.
#[derive(Debug, Clone)]
pub struct Satellite {
    core: Core,
}

impl Satellite {
    /// Loss events so far, by kind.
    pub fn losses(&self) -> LossCounts {
        self.core.losses
    }

    /// The controller's model: (rate estimate, bytes/s; base RTT).
    pub fn model(&self) -> (u64, Option<Duration>) {
        (self.core.bw, self.core.min_rtt)
    }

    /// Where the controller is in its cycle.
    pub fn phase(&self) -> Phase {
        self.core.phase
    }

    /// The share of packets the hop loses to noise (not to a full buffer), as measured on
    /// the packets of its drains; None until a drain measured it.
    pub fn channel_loss(&self) -> Option<f64> {
        self.core.channel_loss()
    }
}

/// Where the controller is in its cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Doubling every round until a queue shows.
    Startup,
    /// One round below the model, so the queue empties and the base RTT can be sampled.
    Drain,
    /// At the model.
    Cruise,
    /// Above the model, looking for more rate.
    Probe,
    /// Another sender keeps the queue full (drains no longer empty it): queueing delay is
    /// no signal any more, so the window grows as Hybla's does and shrinks by 0.3 on a loss
    /// with a queue, like the loss-based TCP it competes with.
    Compete,
}

impl Phase {
    /// Every phase, in the order of [`Phase::name`]'s names.
    pub const ALL: [Phase; 5] = [
        Phase::Startup,
        Phase::Drain,
        Phase::Cruise,
        Phase::Probe,
        Phase::Compete,
    ];

    /// The phase's name in metrics and logs: startup, drain, cruise, probe or compete.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Startup => "startup",
            Phase::Drain => "drain",
            Phase::Cruise => "cruise",
            Phase::Probe => "probe",
            Phase::Compete => "compete",
        }
    }
}

/// Delivery rate over short intervals (a quarter base RTT, at least 10 ms), smoothed (each
/// sample weighs one half): what the bottleneck serves right now while it is saturated.
#[derive(Debug, Clone)]
struct AckRate {
    start: Instant,
    bytes: u64,
    /// Bytes per second.
    recent: u64,
}

impl AckRate {
    fn on_ack(&mut self, now: Instant, bytes: u64, min_rtt: Duration) {
        self.bytes += bytes;
        let span = now.saturating_duration_since(self.start);
        if span >= (min_rtt / 4).max(Duration::from_millis(10)) {
            let rate = per_second(self.bytes, span);
            self.recent = if self.recent == 0 {
                rate
            } else {
                (self.recent + rate) / 2
            };
            self.start = now;
            self.bytes = 0;
        }
    }
}

/// One round trip: from the first acknowledgement of a packet sent at or after `marker` to
/// the next such acknowledgement.
#[derive(Debug, Clone)]
struct Round {
    /// Packets sent from here on end this round when acknowledged.
    marker: Instant,
    /// When the round began (acknowledgement time).
    began: Instant,
    acked: u64,
    min_rtt: Option<Duration>,
    app_limited: bool,
    /// The window when the round began.
    window: u64,
    /// Sum and count of the round's RTT samples (its mean tells a standing queue; its
    /// minimum only that the queue emptied once).
    rtt_sum: Duration,
    rtt_n: u32,
    /// Bytes declared lost during the round.
    lost: u64,
    /// Highest RTT sample of the round.
    max_rtt: Duration,
    /// When the round's first and last acknowledged packets were sent.
    sent_span: Option<(Instant, Instant)>,
}

impl Round {
    /// A round beginning at `now` with `window` bytes allowed in flight.
    fn new(now: Instant, window: u64) -> Round {
        Round {
            marker: now,
            began: now,
            acked: 0,
            min_rtt: None,
            app_limited: false,
            window,
            rtt_sum: Duration::ZERO,
            rtt_n: 0,
            lost: 0,
            max_rtt: Duration::ZERO,
            sent_span: None,
        }
    }
}

/// The controller's state and logic, independent of quinn's types.
#[derive(Debug, Clone)]
pub struct Core {
    hop: HopInfo,
    mtu: u64,
    window: u64,
    phase: Phase,
    /// Rounds ended since the phase began.
    phase_rounds: u32,
    /// Probe: bytes above the model.
    probe_extra: u64,
    /// Probe: the rate estimate when the probe began.
    probe_base: u64,
    /// Probe: rounds in a row that found room.
    probe_wins: u32,
    /// Rounds in a row whose full window met no queue.
    idle_rounds: u32,
    /// Cruise or probe: since when the window holds three quarters of the slack above the
    /// model's bandwidth-delay product (packets sent before say nothing of an idle link).
    full_since: Option<Instant>,
    /// The current run of acknowledgements that met no queue (an eighth of the slack at
    /// most), all of packets sent with three quarters of the slack in flight: `all_acked`
    /// when it began.
    idle_run: Option<u64>,
    /// Cruise after a drain: until a packet sent from this moment on is acknowledged, the
    /// window stays at the bandwidth-delay product, without the slack.
    refill_from: Option<Instant>,
    /// Drain: packets sent from here on were sent below the model.
    drain_from: Instant,
    /// Drains so far.
    drains: u64,
    /// When the last drain ended.
    last_drain: Instant,
    /// Drain: lowest RTT of packets sent during the drain.
    drain_min: Option<Duration>,
    /// Drain: payload bytes acknowledged of packets sent during the drain.
    drain_acked: u64,
    /// Drain: payload bytes acknowledged during the drain, whenever sent.
    drain_acked_all: u64,
    /// Drains in a row that left a queue behind.
    undrained: u32,
    /// The last drain that left a queue: its acknowledgement rate and the rate it drained
    /// at (bytes/s).
    undrained_rates: Option<(u64, u64)>,
    /// A loss with a queue behind it (the buffer overflowed) since the drains began.
    overflowed_since_drain: bool,
    /// Startup grows the window by each acknowledged byte over this: ×2 a round at the
    /// start (1); ×1.5 (2) when the link turned out faster later, as rounds without a queue
    /// or probes that found room showed (on a 600 ms hop the queue shows a round late, and
    /// ×2 would then have put a whole BDP in the queue); ×1.25 (4) after the early reading
    /// of [`Core::idle_for_a_while`], which also comes when the model is only a few
    /// percent low (after a drain that cut too deep) and ×1.5 then overshot by a third of
    /// a BDP.
    growth_share: u64,
    /// Rate estimate, payload bytes per second (0: unknown).
    bw: u64,
    /// The highest rate estimate so far.
    bw_peak: u64,
    /// When the competitive mode began.
    compete_since: Instant,
    /// The link's rate when the competitive mode began (the highest this sender saw).
    compete_link: u64,
    /// In the competitive mode: the share of this sender's bytes the full buffer drops,
    /// per round, smoothed over about four rounds.
    compete_loss: f64,
    /// In the drain that checks whether the competitor left: the competitive window before
    /// it, taken up again if the queue stays.
    checking: Option<u64>,
    /// The competitive mode's CUBIC state: the window before the last cut (packets) and
    /// when that cut was.
    cubic_max: f64,
    cubic_epoch: Instant,
    bw_samples: VecDeque<u64>,
    min_rtt: Option<Duration>,
    /// (time, lowest RTT) per round, for the min filter.
    rtt_samples: VecDeque<(Instant, Duration)>,
    /// (acknowledgement time, RTT) of the latest samples.
    recent: VecDeque<(Instant, Duration)>,
    ack_rate: AckRate,
    round: Round,
    /// Startup: the rate when it last grew by a quarter, and rounds since.
    full_bw: u64,
    full_bw_rounds: u32,
    /// Packets sent before this were part of the last reaction.
    reacted_at: Option<Instant>,
    /// RTT samples of packets sent before this are stale (sent before an outage ended).
    fresh_from: Instant,
    last_ack: Instant,
    last_probe: Option<Instant>,
    in_flight: u64,
    smoothed: Duration,
    losses: LossCounts,
    /// The channel's own loss rate (fraction of packets): measured on packets sent in
    /// drains, when the window is below the path's capacity and no queue can overflow.
    noise: Option<f64>,
    /// The latest drain's packets: sent from `noise_from` until `noise_until` (open while
    /// the drain lasts), bytes acknowledged and lost; `noise_counting` until they are in
    /// the estimate (or were found to have met a queue).
    noise_from: Instant,
    noise_until: Option<Instant>,
    noise_acked: u64,
    noise_lost: u64,
    noise_counting: bool,
    /// Bytes acknowledged and lost by the drains so far, older drains' counts weighing less
    /// (see [`Core::fold_noise`]): the noise estimate is their ratio.
    noise_sums: (f64, f64),
    /// Bytes acknowledged and lost since the start (the noise estimate before a drain).
    all_acked: u64,
    all_lost: u64,
    /// The queue the bottleneck's buffer holds at most, when losses showed it is shallower
    /// than the slack and the budget.
    buffer: Option<Duration>,
    /// When a round's losses last showed a shallow buffer, not yet confirmed.
    shallow_seen: Option<Instant>,
    /// The highest queue the previous round saw.
    prev_round_queue: Duration,
    /// The last round lost more than the noise explains (see [`Core::beyond_noise`]).
    prev_round_lossy: bool,
}

/// The most losses (packets) the channel's noise explains when it explains `expected` on
/// average: three standard deviations (binomial, few losses) and two packets above.
fn noise_bound(expected: f64) -> f64 {
    expected + 3.0 * expected.sqrt() + 2.0
}

fn bytes_in(rate: u64, d: Duration) -> u64 {
    (rate as u128 * d.as_nanos() / 1_000_000_000) as u64
}

/// The rate, bytes per second, of `bytes` over `d` (a zero span counts as 1 ns).
fn per_second(bytes: u64, d: Duration) -> u64 {
    (bytes as u128 * 1_000_000_000 / d.as_nanos().max(1)) as u64
}

impl Core {
    /// A fresh controller at `now`.
    pub fn new(hop: HopInfo, mtu: u64, now: Instant) -> Core {
        let mut c = Core {
            hop,
            mtu,
            window: INITIAL_PACKETS * mtu,
            phase: Phase::Startup,
            phase_rounds: 0,
            probe_extra: 0,
            probe_base: 0,
            probe_wins: 0,
            idle_rounds: 0,
            full_since: None,
            idle_run: None,
            refill_from: None,
            drain_from: now,
            drains: 0,
            last_drain: now,
            drain_min: None,
            drain_acked: 0,
            drain_acked_all: 0,
            undrained: 0,
            undrained_rates: None,
            overflowed_since_drain: false,
            growth_share: 1,
            bw: 0,
            bw_peak: 0,
            compete_since: now,
            compete_link: 0,
            compete_loss: 0.0,
            checking: None,
            cubic_max: 0.0,
            cubic_epoch: now,
            bw_samples: VecDeque::new(),
            min_rtt: None,
            rtt_samples: VecDeque::new(),
            recent: VecDeque::new(),
            ack_rate: AckRate {
                start: now,
                bytes: 0,
                recent: 0,
            },
            round: Round::new(now, 0),
            full_bw: 0,
            full_bw_rounds: 0,
            reacted_at: None,
            fresh_from: now,
            last_ack: now,
            last_probe: None,
            in_flight: 0,
            smoothed: hop.rtt,
            losses: LossCounts::default(),
            noise: None,
            noise_from: now,
            noise_until: Some(now),
            noise_acked: 0,
            noise_lost: 0,
            noise_counting: false,
            noise_sums: (0.0, 0.0),
            all_acked: 0,
            all_lost: 0,
            buffer: None,
            prev_round_queue: Duration::ZERO,
            prev_round_lossy: false,
            shallow_seen: None,
        };
        // Told the rate and the RTT: start at that bandwidth-delay product, at the model.
        if let Some(cap) = c.hint() {
            c.bw = cap;
            c.bw_samples.push_back(cap);
            c.min_rtt = Some(hop.rtt);
            c.phase = Phase::Cruise;
            c.window = c.target();
        }
        c
    }

    /// The configured rate in payload bytes per second: the rate counts whole frames.
    fn hint(&self) -> Option<u64> {
        self.hop
            .rate
            .map(|r| (r as u128 * self.mtu as u128 / (self.mtu + FRAME_OVERHEAD) as u128) as u64)
    }

    fn min_window(&self) -> u64 {
        4 * self.mtu
    }

    fn base(&self) -> Duration {
        self.min_rtt.unwrap_or(self.hop.rtt)
    }

    /// The share of packets the hop loses to noise, as the drains measured it.
    pub fn channel_loss(&self) -> Option<f64> {
        self.noise
    }

    /// The queue the window allows above rate × base RTT.
    pub fn slack(&self) -> Duration {
        let slack = SLACK_MIN.max(self.base() / SLACK_SHARE);
        // A buffer shallower than that overflows at every round: keep half of it.
        self.buffer
            .map_or(slack, |b| slack.min(b / 2))
            .max(self.packets_time(2))
    }

    /// Queueing delay (RTT above the base) past which the queue is too long: the slack plus
    /// a margin for jitter, delayed acknowledgements and small path changes.
    pub fn budget(&self) -> Duration {
        self.slack() + self.margin()
    }

    /// Margin above the slack for jitter, delayed acknowledgements and small path changes:
    /// max(15 ms, base RTT / 40), and four packets' time on the link (on a T1 one packet
    /// takes 8 ms: a smaller margin read a packet or two of jitter as a queue that would
    /// not drain, and cut the rate again and again).
    fn margin(&self) -> Duration {
        MARGIN_MIN
            .max(self.base() / MARGIN_SHARE)
            .max(self.packets_time(4))
    }

    /// How long `n` full packets take at the estimated rate (zero while it is unknown).
    fn packets_time(&self, n: u64) -> Duration {
        if self.bw == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(
            (n * (self.mtu + FRAME_OVERHEAD) * 1_000_000_000 / self.bw).min(1_000_000_000),
        )
    }

    /// The rate that crossed the bottleneck when `delivered` bytes/s were acknowledged: the
    /// channel's noise took its share of the link's time too, so it is delivered / (1 -
    /// noise). (Without this, a link losing 3 % looks 3 % slower, the window holds no
    /// standing queue and every few rounds looks like an idle link; a T1 losing 11 % was
    /// held to 87 % of its rate.)
    fn through(&self, delivered: u64) -> u64 {
        (delivered as f64 / self.delivered_share()) as u64
    }

    /// The share of what crosses the bottleneck that the noise leaves to be acknowledged:
    /// 1 - noise, the noise taken as at most [`NOISE_MAX`].
    fn delivered_share(&self) -> f64 {
        1.0 - self.noise.unwrap_or(0.0).min(NOISE_MAX)
    }

    /// What the window delivers at the current RTT: window / (base RTT + queue), bytes per
    /// second (Vegas's and FAST TCP's reading of the rate when the queue is standing).
    fn rate_at_queue(&self) -> u64 {
        per_second(self.window, self.base() + self.queue())
    }

    /// Restarts growth from the current window, by each acknowledged byte over
    /// `growth_share` (see [`Core::growth_share`]): the link is faster than the model.
    fn regrow(&mut self, now: Instant, growth_share: u64) {
        self.growth_share = growth_share;
        self.full_bw = self.bw;
        self.full_bw_rounds = 0;
        self.enter(Phase::Startup, now);
    }

    /// The queue the latest RTT samples show (their minimum above the base RTT).
    pub fn queue(&self) -> Duration {
        match (self.recent.iter().map(|r| r.1).min(), self.min_rtt) {
            (Some(r), Some(m)) => r.saturating_sub(m),
            _ => Duration::ZERO,
        }
    }

    /// The window the model and the phase call for.
    fn target(&self) -> u64 {
        let Some(min_rtt) = self.min_rtt else {
            return self.window;
        };
        if self.bw == 0 {
            return self.window;
        }
        let bdp = bytes_in(self.bw, min_rtt);
        let slack = bytes_in(self.bw, self.slack());
        let w = match self.phase {
            Phase::Startup | Phase::Compete => return self.window,
            Phase::Drain => (bdp as f64 * DRAIN_GAIN) as u64,
            // Right after a drain the pipe still carries its thinner flow (0.94 of the
            // rate) for a round: with the slack on top, the window put that gap in the
            // queue too (22 + 34 ms on GEO), passed the budget and drained again, every
            // 1.5 s on a steady link (simulator and lab).
            Phase::Cruise if self.refill_from.is_some() => bdp,
            Phase::Cruise => bdp + slack,
            Phase::Probe => bdp + slack + self.probe_extra,
        };
        w.max(self.min_window())
    }

    fn set_bw(&mut self, bw: u64) {
        self.bw = bw;
        self.bw_samples.clear();
        self.bw_samples.push_back(bw);
    }

    fn enter(&mut self, phase: Phase, now: Instant) {
        tracing::trace!(
            from = ?self.phase,
            to = ?phase,
            rate_mbit = self.bw as f64 * 8e-6,
            base_rtt_ms = self.base().as_secs_f64() * 1e3,
            queue_ms = self.queue().as_secs_f64() * 1e3,
            window = self.window,
            noise = self.noise.unwrap_or(0.0),
            "satellite controller"
        );
        if phase != Phase::Drain {
            self.checking = None;
        }
        let ramp = matches!(phase, Phase::Cruise | Phase::Probe);
        if self.phase == Phase::Drain && self.noise_until.is_none() {
            // Packets sent from here on may fill the buffer again.
            self.noise_until = Some(now);
        }
        self.phase = phase;
        self.phase_rounds = 0;
        self.idle_rounds = 0;
        self.full_since = None;
        self.idle_run = None;
        self.refill_from = None;
        if phase == Phase::Drain {
            self.drains += 1;
            self.fold_noise();
            self.noise_from = now;
            self.noise_until = None;
            self.noise_acked = 0;
            self.noise_lost = 0;
            self.noise_counting = true;
            self.drain_from = now;
            self.drain_min = None;
            self.drain_acked = 0;
            self.drain_acked_all = 0;
        }
        let target = self.target();
        if !(ramp && target > self.window) {
            self.window = target;
        }
    }

    /// What the latest drain's packets met goes into the noise estimate: once they are all
    /// acknowledged or declared lost (see [`Core::end_round`]), or when the next drain
    /// begins. Weighted by packets, over about [`NOISE_MEMORY`] of them: a T1's drain
    /// holds some 70 packets, so one drain alone reads an 11 % loss ± 4 points, and the
    /// model would follow each reading. (The rounds' rate samples count their own losses,
    /// so they do not depend on it: see [`Core::end_round`].)
    fn fold_noise(&mut self) {
        if !std::mem::take(&mut self.noise_counting) {
            return;
        }
        let (acked, lost) = (self.noise_acked as f64, self.noise_lost as f64);
        if acked + lost == 0.0 {
            return;
        }
        // The older counts weigh less by this drain's share of NOISE_MEMORY packets.
        let keep = (1.0 - (acked + lost) / (NOISE_MEMORY * self.mtu) as f64).clamp(0.25, 0.95);
        let (a, l) = self.noise_sums;
        self.noise_sums = (a * keep + acked, l * keep + lost);
        let (a, l) = self.noise_sums;
        // Enough packets for the figure to mean something.
        if a + l < 30.0 * self.mtu as f64 {
            return;
        }
        self.noise = Some(l / (a + l));
    }

    /// The rate estimate from its samples (their max filter), and the peak with it.
    fn refresh_bw(&mut self) {
        self.bw = self.bw_samples.iter().copied().max().unwrap_or(0);
        self.bw_peak = self.bw_peak.max(self.bw);
    }

    /// Whether a packet sent at `sent` left during the latest drain.
    fn sent_in_drain(&self, sent: Instant) -> bool {
        self.noise_counting && sent >= self.noise_from && self.noise_until.is_none_or(|u| sent < u)
    }

    /// Whether this round lost far more than the channel's noise explains: more than
    /// twice the expected count plus three standard deviations (and at least four
    /// packets). Before a drain measured the noise, the loss rate since the start stands for
    /// it: a round's overflow stands out against it as well.
    fn losses_excessive(&self) -> bool {
        let lost = (self.round.lost / self.mtu) as f64;
        if lost < 4.0 {
            return false;
        }
        let expected = self.expected_losses();
        lost > expected + noise_bound(expected)
    }

    /// The losses, in packets, the channel's noise explains in this round (see
    /// [`Core::losses_excessive`] for the packets they are judged against).
    fn expected_losses(&self) -> f64 {
        let lost = (self.round.lost / self.mtu) as f64;
        // Judged against the packets whose fate it tells, a round's window of them, once a
        // drain measured the noise: the acknowledgements so far are fewer early in a round
        // (and in the short round after a phase change), and four random losses against 27
        // of them read as a shallow buffer on a LEO hop whose buffer is 36 ms (simulator:
        // the slack down to 8 ms for good). Before that, against what came back: the start
        // overflows a shallow buffer in its first rounds, and the loss rate since the
        // start, which stands for the noise then, already holds those losses.
        let n = lost + (self.round.acked / self.mtu) as f64;
        let n = if self.noise.is_some() {
            n.max((self.round.window / self.mtu) as f64)
        } else {
            n
        };
        n * self.loss_rate().min(NOISE_CREDIT_MAX)
    }

    /// The channel's loss rate: the noise estimate, or before a drain measured it, the
    /// loss rate since the start.
    fn loss_rate(&self) -> f64 {
        self.noise.unwrap_or_else(|| {
            self.all_lost as f64 / (self.all_acked + self.all_lost).max(1) as f64
        })
    }

    /// The lost bytes a round's rate sample counts as having crossed the bottleneck: at
    /// most what the noise explains beside the `acked` bytes (its expected count, three
    /// standard deviations and two packets), the noise taken as at most
    /// [`NOISE_CREDIT_MAX`]. Reckoned from what was acknowledged, not from what was sent:
    /// losses beyond the link's rate then raise neither the credit nor the loss rate it
    /// is reckoned with for long.
    fn loss_credit(&self, acked: u64) -> u64 {
        let p = self.loss_rate().min(NOISE_CREDIT_MAX);
        let expected = (acked / self.mtu) as f64 * p / (1.0 - p);
        (noise_bound(expected) * self.mtu as f64) as u64
    }

    /// The highest queue this round or the last one saw.
    fn round_queue(&self) -> Duration {
        let now = self
            .min_rtt
            .map_or(Duration::ZERO, |m| self.round.max_rtt.saturating_sub(m));
        now.max(self.prev_round_queue)
    }

    /// The queue is too long (or a loss came with one): the rate is what the bottleneck
    /// serves now; drain what is queued.
    fn react(&mut self, now: Instant) {
        self.reacted_at = Some(now);
        match self.phase {
            Phase::Compete => {
                // A loss with a queue: back off as the loss-based competitor (CUBIC, every
                // Linux host's default) does, and grow back as it does.
                self.cubic_from(now);
                self.window = (self.window as f64 * CUBIC_BETA) as u64;
                self.window = self.window.max(self.fair_share());
                return;
            }
            Phase::Startup => {
                // The pipe is full: the rate is the best delivery seen so far.
                self.set_bw(self.bw.max(self.through(self.ack_rate.recent)));
            }
            // A probe's extra queue (half a slack) stays under the budget: a queue above it
            // in a probe means the link got slower too.
            Phase::Cruise | Phase::Drain | Phase::Probe => {
                // The link got slower: with a queue q the window delivers window / (base
                // RTT + q) (FAST TCP's and Vegas's reading), and the acks show the rate too.
                let by_rtt = self.rate_at_queue();
                let measured = self.through(self.ack_rate.recent).max(1);
                self.set_bw(self.bw.min(by_rtt).min(measured.max(by_rtt / 2)));
            }
        }
        if self.bw == 0 {
            // Nothing measured yet (a loss in the first round): halve.
            self.window = (self.window / 2).max(self.min_window());
            return;
        }
        self.enter(Phase::Drain, now);
    }

    /// Follows the run of queue-free acknowledgements (see [`Core::idle_run`]); whether it
    /// now holds a quarter of the window: enough that pacing gaps and the odd ACK held
    /// back are not all it saw.
    fn idle_for_a_while(&mut self, now: Instant, sent: Instant) -> bool {
        let full =
            self.bw > 0 && self.window >= bytes_in(self.bw, self.base() + self.slack() * 3 / 4);
        if !full {
            self.full_since = None;
        } else if self.full_since.is_none() {
            self.full_since = Some(now);
        }
        let counts = self.full_since.is_some_and(|f| sent >= f)
            && self.recent.len() >= 3
            && self.queue() < self.slack() / 8
            && !self.prev_round_lossy
            && !self.beyond_noise();
        if !counts {
            self.idle_run = None;
            return false;
        }
        let from = *self.idle_run.get_or_insert(self.all_acked);
        self.all_acked - from >= self.window / 4
    }

    /// Whether this round lost more than the noise explains beside what it delivered
    /// (see [`Core::loss_credit`]). Such a round found no room even if it met no queue: a
    /// bottleneck that drops without queueing (a policer) never shows one, and taking
    /// its silence for an idle link regrew the window into its losses again and again
    /// (simulator: 40-55 % of the packets lost).
    fn beyond_noise(&self) -> bool {
        self.round.lost > self.loss_credit(self.round.acked)
    }

    fn reacted_this_round(&self) -> bool {
        self.reacted_at.is_some_and(|r| r >= self.round.marker)
    }

    /// An acknowledgement of `bytes` sent at `sent`; `smoothed` is the connection's RTT.
    pub fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        smoothed: Duration,
    ) {
        if now.saturating_duration_since(self.last_ack) > self.silence() {
            // The hop was out: what was sent before now says nothing about the queue.
            self.fresh_from = now;
            self.recent.clear();
            self.ack_rate.start = now;
            self.ack_rate.bytes = 0;
            self.round = Round::new(now, self.window);
        }
        self.last_ack = now;
        self.last_probe = None;
        self.smoothed = smoothed;
        self.in_flight = self.in_flight.saturating_sub(bytes);
        let fresh = sent >= self.fresh_from;
        if fresh {
            let rtt = now.saturating_duration_since(sent);
            let span = RECENT_MIN.max(self.base() / RECENT_SHARE);
            while self
                .recent
                .front()
                .is_some_and(|r| now.saturating_duration_since(r.0) > span)
            {
                self.recent.pop_front();
            }
            // One sample per acknowledgement (its packets are reported together): their
            // lowest RTT, the latest packet's. The earlier ones waited for it: after a lost
            // ACK at the end of a transfer, the probe's acknowledgement also covers packets
            // sent 1 s before, and three of those read as a 1 s queue (lab, T1: the rate cut
            // from 1.5 to 0.58 Mbit/s at each transfer's start, and 20 s to climb back).
            match self.recent.back_mut() {
                Some(last) if last.0 == now => last.1 = last.1.min(rtt),
                _ => self.recent.push_back((now, rtt)),
            }
            // The base RTT is a full packet's (the first sample aside): a full packet's
            // RTT holds its own time on the link, 6.4 ms on a T1, and the tunnel's small
            // packets (a stream's opening, a request) set a base that every full one read
            // 6-7 ms above (13 with the delayed acknowledgement of a pair): over an eighth
            // of the slack, so an idle link was never seen and a start that read the rate
            // 7-16 % low climbed back only by probes, for 6-14 s (lab, T1).
            let full = bytes * 4 >= self.mtu * 3;
            if full {
                self.round.min_rtt = Some(self.round.min_rtt.map_or(rtt, |m| m.min(rtt)));
            }
            self.round.rtt_sum += rtt;
            self.round.rtt_n += 1;
            self.round.max_rtt = self.round.max_rtt.max(rtt);
            if self.min_rtt.is_none_or(|m| full && rtt < m) {
                self.min_rtt = Some(rtt);
            }
            if self.phase == Phase::Drain {
                self.drain_acked_all += bytes;
            }
            if self.phase == Phase::Drain && sent >= self.drain_from {
                self.drain_min = Some(self.drain_min.map_or(rtt, |m| m.min(rtt)));
                self.drain_acked += bytes;
            }
        }
        self.ack_rate.on_ack(now, bytes, self.base());
        self.round.acked += bytes;
        self.round.sent_span = Some(
            self.round
                .sent_span
                .map_or((sent, sent), |(a, b)| (a.min(sent), b.max(sent))),
        );
        self.all_acked += bytes;
        if self.refill_from.is_some_and(|r| sent >= r) {
            self.refill_from = None;
        }
        if self.sent_in_drain(sent) {
            self.noise_acked += bytes;
        }
        self.round.app_limited |= app_limited;
        if fresh && sent >= self.round.marker {
            self.end_round(now);
        }
        // One late sample is no queue (a handshake packet, a delayed acknowledgement): it
        // takes a few acknowledgements in the span.
        let too_long = fresh && self.recent.len() >= 3 && self.queue() > self.budget();
        match self.phase {
            Phase::Startup => {
                if !app_limited {
                    self.window += bytes / self.growth_share;
                }
                if too_long {
                    self.react(now);
                }
            }
            Phase::Compete => {
                if !app_limited {
                    // Up to the fair share ×1.25 a round, then as CUBIC.
                    self.window += if self.window < self.fair_share() {
                        bytes / 4
                    } else {
                        self.cubic_growth(now, bytes)
                    };
                }
            }
            Phase::Cruise | Phase::Probe => {
                if too_long && !self.reacted_this_round() {
                    self.react(now);
                } else if fresh && self.idle_for_a_while(now, sent) {
                    // The window, its slack included, crosses the bottleneck without
                    // meeting a queue: the link is faster than the model by more than the
                    // slack (a fade's step up, or a drain that cut too deep). Known a
                    // round after the window filled, not at the second round's end (lab,
                    // rain fade: 1.5-2 s at the old rate after each step up).
                    self.regrow(now, 4);
                }
            }
            Phase::Drain => {
                // A round's worth of packets sent during the drain is back: the queue they
                // met is the queue that is not ours.
                if self.drain_acked >= self.window / 2 {
                    self.end_drain(now);
                }
            }
        }
        if self.phase != Phase::Startup {
            // Down at once; up by a quarter of what is acknowledged. A window raised at
            // once (after a drain, for a probe) leaves as a burst at the pacer's 1.25 × the
            // rate, and queues even though the path is not full: the drain's gaps are still
            // on their way to the bottleneck.
            let target = self.target();
            self.window = if target > self.window {
                (self.window + (bytes / 4).max(1)).min(target)
            } else {
                target
            };
        }
    }

    /// The competitive mode's least window: half of the link's rate (as measured before the
    /// competitor came) over the RTT now. With a buffer kept full, the bottleneck serves
    /// each sender in proportion to what it has in flight, so this window gets half the
    /// link whatever the competitor holds. Without it, as CUBIC alone, the tunnel kept a
    /// quarter to a third: its paced packets meet the full buffer at every overflow while
    /// a window-clocked competitor's mostly do not, so it cut far more often (the known
    /// unfairness of pacing against drop-tail), and CUBIC's fairness converges over tens of
    /// seconds on a GEO path anyway.
    ///
    /// What the buffer drops of that window never arrives: with 15-25 % of its packets lost
    /// at the full buffer, the tunnel delivered 37-41 % of the link against a cubic download
    /// (lab, GEO). So the window is raised by the share lost (up to [`COMPETE_LOSS_MAX`]):
    /// what it delivers is then half the link.
    fn fair_share(&self) -> u64 {
        let floor = bytes_in(self.compete_link / 2, self.smoothed) as f64;
        let delivered = 1.0 - self.compete_loss.min(COMPETE_LOSS_MAX);
        ((floor / delivered) as u64).max(self.min_window())
    }

    /// Starts a CUBIC epoch at `now` from the window as it is (before a cut, if one follows).
    fn cubic_from(&mut self, now: Instant) {
        self.cubic_max = self.window as f64 / self.mtu as f64;
        self.cubic_epoch = now;
    }

    /// What the competitive mode adds for `bytes` acknowledged: CUBIC's window (RFC 9438:
    /// C = 0.4, β = 0.7, the TCP-friendly region included), reached over a round as CUBIC
    /// does. As aggressive as the hosts' own TCP on the same path, so the two share it;
    /// Hybla's ρ² packets a round, used before, overflowed a GEO buffer by hundreds of
    /// packets every few rounds and stalled the tunnel's streams on the repairs.
    fn cubic_growth(&self, now: Instant, bytes: u64) -> u64 {
        let mtu = self.mtu as f64;
        let w = self.window as f64 / mtu;
        let rtt = self.base().as_secs_f64().max(0.001);
        let t = now
            .saturating_duration_since(self.cubic_epoch)
            .as_secs_f64()
            + rtt;
        let k = (self.cubic_max * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
        let cubic = CUBIC_C * (t - k).powi(3) + self.cubic_max;
        let reno =
            self.cubic_max * CUBIC_BETA + 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA) * t / rtt;
        // At most ×1.5 a round, as CUBIC caps its target.
        let target = cubic.max(reno).min(1.5 * w);
        if target <= w {
            // CUBIC still creeps up on its plateau: one packet per 100 windows acked.
            return (bytes as f64 / 100.0) as u64;
        }
        ((target - w) / w * bytes as f64) as u64
    }

    /// A probe found no more rate: back to the model, through a drain when the base RTT
    /// was last sampled half its filter's span ago (the drain samples it; a probe's queue
    /// also empties without one, as the window falls back by the probe's extra).
    fn end_probe(&mut self, now: Instant) {
        let due = now.saturating_duration_since(self.last_drain) > self.min_rtt_span() / 2;
        self.enter(if due { Phase::Drain } else { Phase::Cruise }, now);
    }

    /// How long the base RTT filter remembers.
    fn min_rtt_span(&self) -> Duration {
        MIN_RTT_WINDOW.max(self.base() * MIN_RTT_ROUNDS)
    }

    fn end_drain(&mut self, now: Instant) {
        self.last_drain = now;
        let left = match (self.drain_min, self.min_rtt) {
            (Some(d), Some(m)) => d > m + self.margin(),
            _ => false,
        };
        if !left {
            self.undrained = 0;
            self.undrained_rates = None;
            self.overflowed_since_drain = false;
            self.enter(Phase::Cruise, now);
            self.refill_from = Some(now);
            return;
        }
        if let Some(window) = self.checking.take() {
            // The check found the queue still there: the competitor stays. Back to the
            // window the check gave up, at once; counting failed drains from two again (as
            // before) cut the rate at each, while a loss-based competitor took what the
            // drains left (simulator: 0.505 of the link from 30 to 90 s, 0.581 since).
            self.window = window.max(self.fair_share());
            self.cubic_from(now);
            self.compete_since = now;
            self.enter(Phase::Compete, now);
            return;
        }
        self.undrained += 1;
        // The bottleneck never idled in the drain (a queue stood throughout): what came
        // back is what the link gave this sender. Against a competitor that share falls at
        // most as fast as this sender's own cuts (the competitor's window does not grow
        // that fast); a link that slows step by step (a rain fade's coding steps) takes
        // more than the cut away. Then the queue is this sender's own, left by the step:
        // the count starts again.
        let acked = per_second(
            self.drain_acked_all,
            now.saturating_duration_since(self.drain_from),
        );
        // More bytes queued (at the fastest rate this hop ever delivered) than this sender
        // has in flight at all: the queue is someone else's.
        let foreign = bytes_in(self.bw_peak, self.queue()) > 2 * self.window;
        // A buffer that overflowed while holding more than this sender has in flight twice
        // over is no fade's doing: alone, a fade's queue is at most this sender's window,
        // which reads as twice it (at the peak rate) only in a fade to under half the rate,
        // and a buffer of a bandwidth-delay product or more does not overflow from that. A
        // competitor in slow start also takes ground faster than the cuts, so the fade rule
        // below restarted the count at every drain (lab, cubic arriving on GEO: ten drains
        // in 10 s, 46 down to 0.44 Mbit/s, the buffer full throughout).
        let crowded = foreign && self.overflowed_since_drain;
        if let Some((prev_acked, prev_bw)) = self.undrained_rates.filter(|_| !crowded) {
            let cut = self.bw as f64 / prev_bw.max(1) as f64;
            if (acked as f64) < 0.9 * cut * prev_acked as f64 {
                self.undrained = 1;
            }
        }
        self.undrained_rates = Some((acked, self.bw));
        // The drain's packets met a queue: their losses may be the buffer's, not noise.
        self.noise_counting = false;
        self.noise_until = Some(now);
        if (self.undrained >= 2 && crowded)
            || (self.undrained >= 3 && (self.overflowed_since_drain || foreign))
            || self.undrained >= 4
        {
            // Drains and the queue stays: another sender fills the buffer. Two if this
            // drain found the buffer crowded (no fade's doing, see above); three if the
            // buffer overflowed or the queue is more than this sender has in flight; four
            // otherwise (a CUBIC competitor after its cut keeps a standing queue for
            // seconds without overflowing, and each drain cut this sender's rate by a
            // sixth or more). A link that slows step by step also leaves a queue after a
            // drain, but seldom three times in a row: each cut follows the queue's reading.
            // The drains cut the rate toward nothing while the competitor held its queue:
            // start from half of what the link carried (a fair share), not from there.
            let share = bytes_in(self.bw_peak, self.base() + self.queue()) / 2;
            self.window = bytes_in(self.bw, self.base() + self.queue())
                .max(share)
                .max(self.min_window());
            self.cubic_from(now);
            self.compete_link = self.bw_peak;
            self.compete_loss = 0.0;
            self.compete_since = now;
            self.enter(Phase::Compete, now);
            return;
        }
        // A queue is left: the rate estimate is still too high (the link slowed more than
        // the first reading showed). Cut by what the queue says (window / (base RTT +
        // queue)), by 15 % at least and by half at most, and drain again. (What the drain
        // itself delivered is no measure: the sender paused in it.)
        let by_rtt = self.rate_at_queue();
        let mut bw = (self.bw - self.bw / 7).min(by_rtt.max(self.bw / 2));
        if crowded {
            // Not a fade (see above): a competitor's, so half the link is this sender's
            // share. Cutting below it while counting drains gave the competitor the link
            // for seconds (lab, cubic arriving on GEO: 46 down to 9 Mbit/s over four
            // drains, 7-10 s, before the competitive mode began).
            bw = bw.max(self.bw_peak / 2).min(self.bw);
        }
        self.set_bw(bw);
        self.enter(Phase::Drain, now);
    }

    fn end_round(&mut self, now: Instant) {
        // The latest drain's packets are all in 1.5 smoothed RTTs after the last of them
        // left: acknowledged, or declared lost (quinn's time threshold is 9/8 of an RTT).
        if self
            .noise_until
            .is_some_and(|u| now.saturating_duration_since(u) > self.smoothed * 3 / 2)
        {
            self.fold_noise();
        }
        // Over the longer of the round's acknowledgement and sending spans (BBR's delivery
        // rate): acknowledgements held back by the receiver (up to 25 ms) or bunched on
        // the way shorten the first, and a round read too fast by 3 % would leave the
        // window's slack as a queue that never drains.
        let sent = self
            .round
            .sent_span
            .map_or(Duration::ZERO, |(a, b)| b.saturating_duration_since(a));
        let span = now.saturating_duration_since(self.round.began).max(sent);
        // What crossed the bottleneck, the noise's share included: the round's own losses
        // when they are the channel's noise (the bottleneck served those packets too).
        // Acknowledged / (1 - the mean loss) instead read a T1 losing one packet in nine
        // ±3.5 % per round (some 80 packets, binomial), and the max filter kept the high
        // ones: the model crept 2-5 % above the link and its excess stood in the queue
        // (lab: the window's slack 23 ms, the probe's queue p95 59-77 ms).
        // But only as many losses as the noise explains (its expected count and three
        // standard deviations): losses beyond it are a bottleneck dropping what exceeds
        // its rate without queueing it first (a policer, a busy host), and credited they
        // made each round's sample the rate sent, whatever the link carried. (Lab, 200
        // Mbit/s: the start read its own overflow as noise, grew on it for a second to a
        // model of 1.9 Gbit/s with 80 % of the packets lost, and quinn gave up the
        // connection with too many gaps in a stream.)
        let crossed = if self.losses_excessive() {
            self.through(self.round.acked)
        } else {
            self.round.acked + self.round.lost.min(self.loss_credit(self.round.acked))
        };
        let sample = if span.is_zero() {
            0
        } else {
            per_second(crossed, span)
        };
        let limited = self.round.app_limited || self.round.acked < self.round.window / 2;
        if sample > 0 && (!limited || sample > self.bw) {
            if self.bw_samples.len() == BW_ROUNDS {
                self.bw_samples.pop_front();
            }
            self.bw_samples.push_back(sample);
            self.refresh_bw();
        }
        if let Some(r) = self.round.min_rtt.filter(|_| self.phase != Phase::Compete) {
            self.rtt_samples.push_back((now, r));
        }
        // Forget old minima, keeping at least MIN_RTT_ROUNDS rounds and MIN_RTT_WINDOW; not
        // against a competitor, whose queue never empties: the base RTT would become the
        // full buffer's, and the drain that checks whether it left would find no queue.
        let keep = self.min_rtt_span();
        while self.phase != Phase::Compete
            && self.rtt_samples.len() > 1
            && now.saturating_duration_since(self.rtt_samples[0].0) > keep
        {
            self.rtt_samples.pop_front();
        }
        if let Some(m) = self.rtt_samples.iter().map(|s| s.1).min() {
            self.min_rtt = Some(m);
        }
        // A round that did not fill its window says nothing of the link's rate: the
        // sender had too little to send (quinn's flag misses a sender that just started).
        // (Lost bytes count: a round that overflowed a buffer did fill its window.)
        let filled =
            !self.round.app_limited && self.round.acked + self.round.lost >= self.round.window / 2;
        // The round's mean RTT above the base (None without samples or base).
        let mean_queue = self
            .min_rtt
            .filter(|_| self.round.rtt_n > 0)
            .map(|m| (self.round.rtt_sum / self.round.rtt_n).saturating_sub(m));
        // A full window met no queue at all: the model's rate is too low (the link got
        // faster, or a drain cut it too deep).
        let lossy = self.beyond_noise();
        let idle_link = filled
            && !lossy
            && !self.prev_round_lossy
            && matches!(self.phase, Phase::Cruise | Phase::Probe)
            // (with at least the model's bandwidth-delay product in flight: below it, as
            // while the window ramps back up after a drain, no queue is expected)
            && self.round.window >= bytes_in(self.bw, self.base())
            && mean_queue.is_some_and(|q| q < self.slack() / 4);
        tracing::trace!(
            phase = ?self.phase,
            sample_mbit = sample as f64 * 8e-6,
            rate_mbit = self.bw as f64 * 8e-6,
            base_ms = self.base().as_secs_f64() * 1e3,
            mean_queue_ms = mean_queue.map_or(0.0, |q| q.as_secs_f64() * 1e3),
            min_queue_ms = self.min_rtt.zip(self.round.min_rtt).map_or(0.0, |(m, r)| {
                r.saturating_sub(m).as_secs_f64() * 1e3
            }),
            acked = self.round.acked,
            lost = self.round.lost,
            window = self.round.window,
            idle_link,
            "satellite controller round"
        );
        if self.phase == Phase::Compete && self.round.acked + self.round.lost > 0 {
            let p = self.round.lost as f64 / (self.round.acked + self.round.lost) as f64;
            self.compete_loss += (p - self.compete_loss) / 4.0;
        }
        self.prev_round_lossy = lossy;
        self.prev_round_queue = self
            .min_rtt
            .map_or(Duration::ZERO, |m| self.round.max_rtt.saturating_sub(m));
        self.round = Round::new(now, self.window);
        self.phase_rounds += 1;
        self.idle_rounds = if idle_link { self.idle_rounds + 1 } else { 0 };
        match self.phase {
            Phase::Startup if filled => {
                if self.bw >= self.full_bw + self.full_bw / 4 {
                    self.full_bw = self.bw;
                    self.full_bw_rounds = 0;
                } else {
                    self.full_bw_rounds += 1;
                    if self.full_bw_rounds >= 3 {
                        self.enter(Phase::Drain, now);
                    }
                }
            }
            // Two full windows in a row met no queue: the link is faster than the model
            // (a fade ended, cross traffic left, a drain cut too deep). Look for its rate as
            // at the start, at ×1.5 a round.
            Phase::Cruise | Phase::Probe if self.idle_rounds >= 2 => self.regrow(now, 2),
            Phase::Cruise if self.phase_rounds >= CRUISE_ROUNDS => {
                self.probe_base = self.bw;
                self.probe_wins = 0;
                self.probe_extra = (bytes_in(self.bw, self.slack()) / 2).max(2 * self.mtu);
                self.enter(Phase::Probe, now);
            }
            Phase::Probe if self.phase_rounds >= 2 => {
                // The window went up a round ago; its acknowledgements are in.
                // The extra could add extra / base RTT to the rate; half of that (and 1 % at
                // least, above the rounds' noise) says there was room.
                let share = (self.probe_extra as f64
                    / bytes_in(self.probe_base, self.base()).max(1) as f64
                    / 2.0)
                    .max(0.01);
                let grew = self.bw as f64 > self.probe_base as f64 * (1.0 + share);
                if grew && self.probe_wins < 2 {
                    // There was room: probe again with twice the extra (BBRv3's probe up).
                    self.probe_wins += 1;
                    self.probe_base = self.bw;
                    self.probe_extra *= 2;
                    // Judged two rounds on, as the first: the next round's packets left
                    // before the window rose. (Judged after one, the second probe read
                    // the first one's rate again and ended the chain.)
                    self.phase_rounds = 0;
                } else if grew {
                    // Three in a row: the link is much faster (a fade ended). Look for its
                    // rate as at the start, at ×1.5 a round.
                    self.window = self.target();
                    self.regrow(now, 2);
                } else {
                    self.end_probe(now);
                }
            }
            Phase::Compete
                if self.phase_rounds >= CRUISE_ROUNDS
                    && now.saturating_duration_since(self.compete_since) >= COMPETE_AT_LEAST =>
            {
                // Has the competitor left? A drain at our share tells. (Not sooner: a
                // loss-based competitor's queue empties for seconds after each of its
                // losses, and that is no sign it left.)
                let share = self.rate_at_queue();
                let window = self.window;
                self.set_bw(share);
                self.undrained = 2;
                self.undrained_rates = None;
                // The base RTT from before the competitor is what the drain compares with:
                // time spent competing does not age it.
                for sample in &mut self.rtt_samples {
                    sample.0 = now;
                }
                self.enter(Phase::Drain, now);
                self.checking = Some(window);
            }
            _ => {}
        }
    }

    /// The connection's bytes in flight after a batch of acknowledgements.
    pub fn on_end_acks(&mut self, in_flight: u64) {
        self.in_flight = in_flight;
    }

    /// A packet of `bytes` left at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        self.in_flight += bytes;
        if now.saturating_duration_since(self.last_ack) > self.silence() {
            self.last_probe = Some(now);
        }
    }

    fn silence(&self) -> Duration {
        SILENCE.max(self.smoothed * 2)
    }

    /// Packets sent at `sent` were declared lost at `now`.
    pub fn on_loss(&mut self, now: Instant, sent: Instant, persistent: bool, lost: u64) {
        self.in_flight = self.in_flight.saturating_sub(lost);
        self.round.lost += lost;
        self.all_lost += lost;
        if self.sent_in_drain(sent) {
            self.noise_lost += lost;
        }
        let queued = self.queue() > self.budget();
        // Persistent congestion with no queue is an outage: the model stays.
        if queued {
            self.overflowed_since_drain = true;
        }
        if self.reacted_at.is_some_and(|r| sent <= r) {
            return;
        }
        // A buffer shallower than the budget overflows before the queue shows: then the
        // round loses far more than the noise, and a queue (the buffer's depth) stands.
        let seen = self.round_queue();
        // (Not in a drain, which already reacts, nor against a loss-based competitor.)
        let shallow = !queued
            && !persistent
            && matches!(self.phase, Phase::Startup | Phase::Cruise | Phase::Probe)
            && seen < self.budget()
            && self.losses_excessive()
            // Without a queue of a few ms to show a buffer, only losses beyond any channel's
            // noise say there is none (a policer): a burst of noise (a fade's, a handover's)
            // also loses far more than the mean in a round, but seldom a quarter.
            && (seen >= Duration::from_millis(2).max(self.packets_time(4))
                || self.round.lost as f64
                    > NOISE_CREDIT_MAX * (self.round.lost + self.round.acked) as f64);
        if !queued && !shallow {
            // The channel's noise, or an outage: repaired without slowing down.
            self.losses.random += 1;
            return;
        }
        if shallow {
            tracing::debug!(
                buffer_ms = seen.as_secs_f64() * 1e3,
                lost = self.round.lost / self.mtu,
                acked = self.round.acked / self.mtu,
                noise = self.noise.unwrap_or(0.0),
                "satellite controller: losses show a buffer shallower than the budget"
            );
            // Taken for the buffer's depth only when a second round shows it within 16
            // rounds: a shallow buffer overflows at every round the slack is in it, while
            // one round of excess random losses comes every few thousand rounds (a LEO
            // hop has 30 a second) and halved the slack for good (lab, LEO at BER 1e-6: one
            // run in three at 92 % with a probe queue p50 of 3 ms).
            let within = self.smoothed.max(Duration::from_millis(10)) * 16;
            if self
                .shallow_seen
                .is_some_and(|t| now.saturating_duration_since(t) <= within)
            {
                self.buffer = Some(seen);
                self.shallow_seen = None;
            } else {
                self.shallow_seen = Some(now);
            }
        }
        self.losses.congestion += 1;
        if self.phase == Phase::Drain {
            // The drain is the reaction already; its end judges the queue. Reacting again
            // halved the rate at each overflow of a competitor's slow start, every few
            // hundred ms, and restarted the drain before its end could count it (lab, cubic
            // arriving on GEO: 46 down to 0.65 Mbit/s in 8 s, never competing).
            return;
        }
        self.react(now);
    }

    /// The window at `now`; while the hop is silent, room for one probe per interval.
    pub fn window_at(&self, now: Instant) -> u64 {
        let silent = now.saturating_duration_since(self.last_ack) > self.silence();
        let may_probe = self
            .last_probe
            .is_none_or(|p| now.saturating_duration_since(p) >= PROBE_INTERVAL);
        if silent && may_probe {
            self.window.max(self.in_flight + 2 * self.mtu)
        } else {
            self.window
        }
    }

    /// The window as last computed (no probe allowance).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Where the controller is in its cycle.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The rate estimate, payload bytes per second.
    pub fn bw(&self) -> u64 {
        self.bw
    }

    /// The base RTT estimate.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// Loss events by kind.
    pub fn losses(&self) -> LossCounts {
        self.losses
    }
}

impl Controller for Satellite {
    fn on_sent(&mut self, now: Instant, bytes: u64, _last_packet_number: u64) {
        self.core.on_sent(now, bytes);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.core.on_ack(now, sent, bytes, app_limited, rtt.get());
    }

    fn on_end_acks(
        &mut self,
        _now: Instant,
        in_flight: u64,
        _app_limited: bool,
        _largest_packet_num_acked: Option<u64>,
    ) {
        self.core.on_end_acks(in_flight);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.core
            .on_loss(now, sent, is_persistent_congestion, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.core.mtu = new_mtu as u64;
    }

    fn window(&self) -> u64 {
        self.core.window_at(Instant::now())
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.core.window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u64 = 1200;

    fn hop(rate: Option<u64>) -> HopInfo {
        HopInfo {
            rate,
            rtt: Duration::from_millis(600),
        }
    }

    /// The link at a moment: `rate` payload bytes/s, propagation RTT `base`, a FIFO queue of
    /// `queue_limit` bytes, every `loss_every`-th packet lost to noise (0: none; with
    /// `random_loss`, each packet with probability 1 / `loss_every`, as a BER loses), and
    /// `cross` bytes/s of other traffic through the same queue, and from `competitor` s on a
    /// loss-based sender (CUBIC, as a fluid: its window over the RTT it meets, growing as
    /// the cubic function, cut by 30 % once a round when the buffer overflows).
    #[derive(Clone, Copy)]
    struct Link {
        rate: f64,
        base: Duration,
        queue_limit: u64,
        loss_every: u64,
        random_loss: bool,
        cross: f64,
        competitor: Option<f64>,
        /// The competitor arrives in slow start (ten packets, doubling each RTT until the
        /// buffer overflows) instead of with a BDP.
        competitor_slow_start: bool,
        /// The receiver acknowledges every second packet, or 25 ms after the first of a
        /// pair (quinn's default, as in the lab): on a thin link the first waits a whole
        /// packet's time for its acknowledgement.
        delayed_acks: bool,
        /// A small packet (100 bytes, a request's) every second beside the bulk flow.
        requests: bool,
    }

    /// What one packet met: (send time s, ack time s, queueing delay ms; None if lost).
    type Packet = (f64, f64, Option<f64>);

    /// A sender driven by `c` over `link(t)` for `secs` seconds, paced as quinn paces
    /// (1.25 windows per smoothed RTT), in 100 µs steps.
    fn simulate(c: &mut Core, link: &dyn Fn(f64) -> Link, secs: f64) -> Vec<Packet> {
        let t0 = Instant::now();
        let step = Duration::from_micros(100);
        let trace = std::env::var("SAT_TRACE").is_ok();
        let (mut now, end) = (t0, t0 + Duration::from_secs_f64(secs));
        let mut srtt = link(0.0).base;
        let mut next_send = t0;
        let mut next_print = t0;
        let mut queue = 0f64;
        // The competitor's window and window before its last cut (bytes), and when it cut (s).
        let mut cubic = (0f64, 0f64, 0f64);
        let mut competitor_starting = false;
        // (ack time, send time, bytes, lost, queueing delay ms)
        let mut acks: VecDeque<(Instant, Instant, u64, bool, f64)> = VecDeque::new();
        // Bytes that entered the bottleneck's queue and that it served, all senders; this
        // sender's packets in it: (position, send time, lost).
        let (mut enqueued, mut served_total) = (0f64, 0f64);
        let mut fifo: VecDeque<(f64, Instant, bool, u64)> = VecDeque::new();
        let mut next_request = 0.5;
        let mut n = 0u64;
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut out = Vec::new();
        // Delayed acknowledgements: the first packet of a pair, waiting for the second or
        // its deadline (its entry of `acks`, the acknowledgement time still to set).
        let mut held: Option<(Instant, Instant, f64)> = None;
        let ack_delay = Duration::from_millis(25);
        *c = Core {
            last_ack: t0,
            fresh_from: t0,
            drain_from: t0,
            last_drain: t0,
            ..c.clone()
        };
        c.round.marker = t0;
        c.round.began = t0;
        c.ack_rate.start = t0;
        while now < end {
            let t = (now - t0).as_secs_f64();
            let l = link(t);
            if trace && now >= next_print {
                next_print += Duration::from_millis(250);
                eprintln!(
                    "t={t:.2} {:?} w={} bw={} min={:?} q={:?} queue={:.0}",
                    c.phase,
                    c.window,
                    c.bw,
                    c.min_rtt,
                    c.queue(),
                    queue
                );
            }
            let dt = step.as_secs_f64();
            let mut offered = l.cross * dt;
            if let Some(from) = l.competitor.filter(|from| t >= *from) {
                let rtt = l.base.as_secs_f64() + queue / l.rate;
                let pkt = MTU as f64;
                if cubic.0 == 0.0 {
                    // It arrives with a BDP, as after its slow start on an idle link, or
                    // with ten packets in slow start.
                    let w0 = if l.competitor_slow_start {
                        10.0 * pkt
                    } else {
                        l.rate * l.base.as_secs_f64()
                    };
                    cubic = (w0, 0.0, from);
                    competitor_starting = l.competitor_slow_start;
                }
                let (w, w_max, epoch) = &mut cubic;
                let sent = *w / rtt * dt;
                offered += sent;
                if queue + sent > l.queue_limit as f64 && t - *epoch > rtt {
                    *w_max = *w;
                    *w = (*w * CUBIC_BETA).max(2.0 * pkt);
                    *epoch = t;
                    competitor_starting = false;
                }
                if competitor_starting {
                    // Slow start: each byte acknowledged adds one (×2 a round).
                    *w += sent;
                } else {
                    let k = (*w_max / pkt * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
                    *w = w.max((CUBIC_C * (t - *epoch - k).powi(3)) * pkt + *w_max);
                }
            }
            // The bottleneck serves its FIFO at the rate of the moment: a packet leaves once
            // everything queued before it has been served.
            let served = (queue + offered).min(l.rate * dt);
            let after = (queue + offered - l.rate * dt).clamp(0.0, l.queue_limit as f64);
            enqueued += after - queue + served;
            served_total += served;
            queue = after;
            while let Some(&(position, sent, lost, bytes)) = fifo.front() {
                if position > served_total {
                    break;
                }
                fifo.pop_front();
                let at = now + l.base;
                let at = acks.back().map_or(at, |b| at.max(b.0));
                let q = (now - sent).as_secs_f64() * 1e3;
                if bytes < MTU {
                    acks.push_back((at, sent, bytes, lost, q));
                    continue;
                }
                if l.delayed_acks && !lost {
                    // Arrived at the receiver at `now + base / 2`: the second of a pair is
                    // acknowledged at once, with the first; a first waits.
                    match held.take() {
                        Some((_, first_sent, first_q)) => {
                            acks.push_back((at, first_sent, MTU, false, first_q));
                            acks.push_back((at, sent, MTU, false, q));
                        }
                        None => held = Some((at, sent, q)),
                    }
                    continue;
                }
                acks.push_back((at, sent, MTU, lost, q));
            }
            if let Some((at, first_sent, first_q)) = held {
                if now + l.base >= at + ack_delay {
                    held = None;
                    let at = acks
                        .back()
                        .map_or(at + ack_delay, |b| (at + ack_delay).max(b.0));
                    acks.push_back((at, first_sent, MTU, false, first_q));
                }
            }
            while let Some(&(at, sent, bytes, lost, q)) = acks.front() {
                if at > now {
                    break;
                }
                acks.pop_front();
                let st = (sent - t0).as_secs_f64();
                if lost {
                    c.on_loss(now, sent, false, bytes);
                } else {
                    srtt = (srtt * 7 + (now - sent)) / 8;
                    c.on_ack(now, sent, bytes, false, srtt);
                }
                if bytes == MTU {
                    out.push((st, t, (!lost).then_some(q)));
                }
            }
            c.on_end_acks(c.in_flight);
            if l.requests && t >= next_request {
                next_request += 1.0;
                let small = 100;
                c.on_sent(now, small);
                if queue + small as f64 <= l.queue_limit as f64 {
                    queue += small as f64;
                    enqueued += small as f64;
                    fifo.push_back((enqueued, now, false, small));
                }
            }
            while c.in_flight + MTU <= c.window_at(now) && next_send <= now {
                let gap = MTU as f64 * srtt.as_secs_f64() / (1.25 * c.window_at(now) as f64);
                next_send = next_send.max(now - step) + Duration::from_secs_f64(gap);
                c.on_sent(now, MTU);
                n += 1;
                let dropped = queue + MTU as f64 > l.queue_limit as f64;
                let noise = l.loss_every > 0
                    && if l.random_loss {
                        // xorshift64: a fixed sequence, so every run of a test is the same.
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng % l.loss_every == 0
                    } else {
                        n % l.loss_every == 0
                    };
                if !dropped {
                    queue += MTU as f64;
                    enqueued += MTU as f64;
                }
                // (a dropped packet is declared lost when the one after it would have left)
                fifo.push_back((enqueued, now, dropped || noise, MTU));
            }
            now += step;
        }
        out
    }

    /// Payload bytes acknowledged between `a` and `b` s.
    fn delivered(p: &[Packet], a: f64, b: f64) -> f64 {
        p.iter()
            .filter(|x| x.2.is_some() && x.1 >= a && x.1 < b)
            .count() as f64
            * MTU as f64
    }

    /// Packets sent from `from` s on: (lost, sent).
    fn losses_from(p: &[Packet], from: f64) -> (f64, f64) {
        let sent: Vec<_> = p.iter().filter(|x| x.0 >= from).collect();
        let lost = sent.iter().filter(|x| x.2.is_none()).count();
        (lost as f64, sent.len() as f64)
    }

    /// 95th percentile of the queueing delay of packets sent between `a` and `b` s, ms.
    fn queue_p95(p: &[Packet], a: f64, b: f64) -> f64 {
        let mut v: Vec<f64> = p
            .iter()
            .filter(|x| x.0 >= a && x.0 < b)
            .filter_map(|x| x.2)
            .collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[(v.len() * 95 / 100).min(v.len() - 1)]
    }

    const GEO: f64 = 50e6 / 8.0;

    fn geo(_t: f64) -> Link {
        Link {
            rate: GEO,
            base: Duration::from_millis(560),
            queue_limit: 3_500_000,
            loss_every: 0,
            random_loss: false,
            cross: 0.0,
            competitor: None,
            competitor_slow_start: false,
            delayed_acks: false,
            requests: false,
        }
    }

    #[test]
    fn holds_about_half_the_link_against_a_loss_based_competitor() {
        // A loss-based flow arrives at 10 s and keeps the 1-BDP buffer full: delay is no
        // signal then, and yielding to it would leave the tunnel nothing.
        let link = |t: f64| Link {
            competitor: Some(10.0),
            ..geo(t)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let p = simulate(&mut c, &link, 60.0);
        // From 10 s after it came: found within a few drains, then about half.
        let share = delivered(&p, 20.0, 60.0) / (GEO * 40.0);
        assert!((0.4..0.6).contains(&share), "share of the link {share}");
    }

    #[test]
    fn a_competitor_arriving_in_slow_start_is_not_taken_for_a_fade() {
        // The hosts' cubic arrives in slow start, doubling each RTT: each drain's
        // acknowledgement rate falls faster than the drain's cut, as in a rain fade's steps.
        // Once the buffer overflowed and holds more than twice this sender's window, that is
        // no fade: the count goes on. Here the switch comes about 10 s after the arrival (the
        // fluid competitor grows faster than a real one; in the lab it comes after 6-7 s).
        let link = |t: f64| Link {
            competitor: Some(15.0),
            competitor_slow_start: true,
            ..geo(t)
        };
        let born = Instant::now();
        let mut c = Core::new(hop(None), MTU, born);
        let p = simulate(&mut c, &link, 60.0);
        assert_ne!(
            c.compete_since, born,
            "never switched to the competitive mode"
        );
        let share = delivered(&p, 25.0, 60.0) / (GEO * 35.0);
        assert!(share > 0.35, "share of the link {share}");
        // While the drains count, a buffer that overflowed and holds more than twice this
        // sender's window cuts the rate no lower than half the link's, and two such drains
        // suffice (three before: 0.296 of the link from 20 to 30 s; 0.375 with the rule).
        // 0.327 since a drain's refill leaves out the slack for a round: here the third
        // failed drain's acknowledgement rate fell by more than its cut, the count started
        // again (the fade rule), and the switch came on the fourth, 1.2 s later.
        let early = delivered(&p, 20.0, 30.0) / (GEO * 10.0);
        assert!(early > 0.32, "share of the link from 20 to 30 s {early}");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Told the GEO rate (so cruising at the model from the start at `t0`), after a round
    /// acknowledged with no queue: the base RTT, 600 ms.
    fn cruising_on_geo(t0: Instant) -> Core {
        let mut c = Core::new(hop(Some(GEO as u64)), MTU, t0);
        for i in 0..5 {
            c.on_ack(t0 + ms(600 + i), t0 + ms(i), MTU, false, ms(600));
        }
        c
    }

    #[test]
    fn packets_acknowledged_late_together_with_a_probe_are_no_queue() {
        let t0 = Instant::now();
        let mut c = cruising_on_geo(t0);
        // The transfer ended; the last ACK was lost. About a second later the probe timer
        // sends a probe, and its acknowledgement reports the four packets before it too,
        // 1.6 s after they were sent.
        let now = t0 + ms(1600);
        for i in 0..4 {
            c.on_ack(now, t0 + ms(10 + i), MTU, false, ms(600));
        }
        c.on_ack(now, now - ms(600), MTU, false, ms(600));
        c.on_end_acks(0);
        assert_eq!(c.phase(), Phase::Cruise);
        assert_eq!(c.queue(), Duration::ZERO);
        assert_eq!(c.bw(), GEO as u64 * 1200 / 1242);
    }

    #[test]
    fn a_loss_in_a_drain_does_not_cut_again() {
        let t0 = Instant::now();
        let mut c = cruising_on_geo(t0);
        // Acknowledgements that met 300 ms of queue: too long, a drain begins.
        for i in 0..5 {
            let now = t0 + ms(1000 + i);
            c.on_ack(now, now - ms(900), MTU, false, ms(900));
        }
        assert_eq!(c.phase(), Phase::Drain);
        let (bw, window) = (c.bw(), c.window());
        // A packet sent in the drain is lost at the full buffer (a competitor's slow start
        // overflowing it): the drain already reacts, and its end judges the queue.
        c.on_loss(t0 + ms(2000), t0 + ms(1100), false, MTU);
        assert_eq!(c.phase(), Phase::Drain);
        assert_eq!((c.bw(), c.window()), (bw, window));
        assert!(c.overflowed_since_drain);
        assert_eq!(c.losses().congestion, 1);
    }

    #[test]
    fn a_check_that_finds_the_competitor_still_there_costs_no_ground() {
        // Every 20 s of competing a drain checks whether the competitor left. Where its queue
        // stays, the tunnel takes its window up again at once: counting failed drains again
        // gave up the link for several seconds each time (here 0.505 of the link from 30 to
        // 90 s, 0.581 since; in the lab, with a competitor in slow start, three drains).
        let link = |t: f64| Link {
            competitor: Some(10.0),
            ..geo(t)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let p = simulate(&mut c, &link, 90.0);
        let share = delivered(&p, 30.0, 90.0) / (GEO * 60.0);
        assert!((0.54..0.6).contains(&share), "share of the link {share}");
        assert_eq!(c.phase(), Phase::Compete);
    }

    #[test]
    fn against_a_full_buffer_the_fair_share_makes_up_for_what_it_loses() {
        let link = |t: f64| Link {
            competitor: Some(10.0),
            ..geo(t)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        simulate(&mut c, &link, 30.0);
        assert_eq!(c.phase(), Phase::Compete);
        let lossless = Core {
            compete_loss: 0.0,
            ..c.clone()
        }
        .fair_share() as f64;
        // Rounds that lose a fifth of their bytes at the full buffer: the least window
        // rises so that what arrives is still half the link.
        let mut now = c.last_ack;
        let mut rounds = |c: &mut Core, lost_share: f64, n: u32| {
            for _ in 0..n {
                c.round.acked = ((1.0 - lost_share) * 1000.0) as u64 * MTU;
                c.round.lost = (lost_share * 1000.0) as u64 * MTU;
                now += ms(10);
                c.end_round(now);
            }
        };
        rounds(&mut c, 0.2, 20);
        assert_eq!(c.phase(), Phase::Compete);
        let raised = c.fair_share() as f64 / lossless;
        assert!((raised - 1.25).abs() < 0.01, "raised by {raised}");
        // At most by the share [`COMPETE_LOSS_MAX`]: beyond it the buffer drops more
        // because this sender sends more.
        rounds(&mut c, 0.6, 40);
        let capped = c.fair_share() as f64 / lossless;
        assert!((capped - 1.0 / 0.7).abs() < 0.01, "raised by {capped}");
    }

    #[test]
    fn finds_an_unconfigured_geo_link_and_keeps_its_queue_short() {
        let mut c = Core::new(hop(None), MTU, Instant::now());
        assert_eq!(c.window(), INITIAL_PACKETS * MTU);
        assert_eq!(c.phase(), Phase::Startup);
        let p = simulate(&mut c, &geo, 40.0);
        assert_ne!(c.phase(), Phase::Startup);
        let bw = c.bw() as f64;
        assert!((bw / GEO - 1.0).abs() < 0.05, "rate estimate {bw} vs {GEO}");
        let m = c.min_rtt().unwrap();
        assert!(
            m >= Duration::from_millis(560) && m < Duration::from_millis(570),
            "{m:?}"
        );
        // After the start: the link is full and the queue stays within max(50 ms, 10 %).
        let util = delivered(&p, 10.0, 40.0) / (GEO * 30.0);
        assert!(util > 0.95, "utilization {util}");
        let q = queue_p95(&p, 10.0, 39.0);
        assert!(q < 56.0, "queue p95 {q} ms");
        // Drains on a steady link only to sample the base RTT, about every 4.5 s (the min
        // filter's span over two), and the start's: 5 in 40 s. (About 17 before the window
        // came back without its slack for a round after each drain, one every 1.75 s.)
        assert!(c.drains <= 8, "{} drains in 40 s", c.drains);
    }

    /// A T1 (1.544 Mbit/s of frames: its payload rate) with a 570 ms RTT and a BDP of
    /// buffer, losing one packet in nine (BER 1e-5), at random or every ninth.
    fn t1(random_loss: bool) -> Link {
        Link {
            rate: 1.544e6 / 8.0 * MTU as f64 / (MTU + FRAME_OVERHEAD) as f64,
            base: Duration::from_millis(570),
            queue_limit: 110_000,
            loss_every: 9,
            random_loss,
            ..geo(0.0)
        }
    }

    #[test]
    fn a_thin_lossy_link_is_filled_once_its_first_drain_measured_the_loss() {
        // A T1 losing one packet in nine (BER 1e-5): the bottleneck serves the lost packets
        // too, so the link's rate is what is acknowledged plus what was lost. (Once scaled
        // by the noise estimate, whose first reading had to reach the model by the next
        // round, not at the next drain: lab, 10 s later, the link 12 % idle meanwhile; the
        // rounds now count their own losses.) The estimate is still measured.
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let t1 = |_t: f64| t1(false);
        let p = simulate(&mut c, &t1, 12.0);
        let noise = c.channel_loss().expect("a drain measured the loss");
        assert!((noise - 1.0 / 9.0).abs() < 0.02, "loss {noise}");
        let util = delivered(&p, 6.0, 12.0) / (t1(0.0).rate * 6.0 * (8.0 / 9.0));
        assert!(util > 0.95, "utilization {util}");
        assert!(queue_p95(&p, 6.0, 12.0) < 50.0);
    }

    #[test]
    fn a_thin_link_losing_at_random_keeps_its_model_and_queue_in_place() {
        // The same T1, its losses at random as a BER makes them: a round of some 80
        // packets loses 9 ± 3. Rate samples that took the mean loss for each round's read
        // the link ±3.5 % from round to round, the max filter kept the high ones, and the
        // excess stood in the queue (lab: p95 59-77 ms against a bound of 57).
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let rate = t1(true).rate;
        let t1 = |_t: f64| t1(true);
        let p = simulate(&mut c, &t1, 60.0);
        let bw = c.bw() as f64;
        assert!(bw < rate * 1.02, "rate model {bw} above the link's {rate}");
        let util = delivered(&p, 10.0, 60.0) / (rate * 50.0 * (8.0 / 9.0));
        assert!(util > 0.93, "utilization {util}");
        let q = queue_p95(&p, 10.0, 60.0);
        assert!(q < 57.0, "queue p95 {q} ms");
    }

    #[test]
    fn a_thin_links_base_rtt_is_a_full_packets_and_a_low_model_climbs_back() {
        // The T1 losing one packet in nine at random, acknowledged in pairs, a small
        // request every second, the model 16 % below the link (a start that read it low,
        // as in the lab). A full packet's RTT holds its own 6.4 ms on the link, and the
        // first of a pair waits as long again for its acknowledgement: against a base RTT
        // set by the small packets the link never looked idle, and only the probes, a
        // percent or two each, found the rate.
        let rate = t1(true).rate;
        let frames = |r: f64| (r * (MTU + FRAME_OVERHEAD) as f64 / MTU as f64) as u64;
        let t1 = |_t: f64| Link {
            delayed_acks: true,
            requests: true,
            ..t1(true)
        };
        let told = HopInfo {
            rate: Some(frames(rate * 0.84)),
            rtt: Duration::from_millis(570),
        };
        let mut c = Core::new(told, MTU, Instant::now());
        let p = simulate(&mut c, &t1, 30.0);
        // The base is a full packet's RTT, its own time on the link included.
        let own = Duration::from_secs_f64(MTU as f64 / rate);
        let base = c.min_rtt().unwrap();
        assert!(
            base >= Duration::from_millis(570) + own,
            "base RTT {base:?}"
        );
        let util = delivered(&p, 8.0, 30.0) / (rate * 22.0 * (8.0 / 9.0));
        assert!(util > 0.95, "utilization {util}");
        let q = queue_p95(&p, 8.0, 30.0);
        assert!(q < 57.0, "queue p95 {q} ms");
    }

    #[test]
    fn random_loss_does_not_slow_it_down() {
        let mut c = Core::new(hop(None), MTU, Instant::now());
        // One packet in 30 lost.
        let lossy = |_t: f64| Link {
            loss_every: 30,
            ..geo(0.0)
        };
        let p = simulate(&mut c, &lossy, 40.0);
        let util = delivered(&p, 10.0, 40.0) / (GEO * 30.0 * (29.0 / 30.0));
        assert!(util > 0.93, "utilization {util}");
        assert!(c.losses().random > 100);
        assert_eq!(c.losses().congestion, 0);
    }

    #[test]
    fn follows_a_rate_drop_within_two_seconds_and_finds_the_rate_again() {
        let mut c = Core::new(hop(None), MTU, Instant::now());
        // The rate halves from 20 s to 30 s (a fade).
        let fade = |t: f64| Link {
            rate: if (20.0..30.0).contains(&t) {
                GEO / 2.0
            } else {
                GEO
            },
            ..geo(0.0)
        };
        let p = simulate(&mut c, &fade, 45.0);
        // Two seconds after the drop the queue is short again.
        let q = queue_p95(&p, 22.0, 30.0);
        assert!(q < 56.0, "queue p95 from 2 s after the drop {q} ms");
        let util = delivered(&p, 22.0, 30.5) / (GEO / 2.0 * 8.5);
        assert!(util > 0.9, "utilization in the fade {util}");
        // Back at the full rate within a few seconds of the fade's end.
        let util = delivered(&p, 35.0, 45.0) / (GEO * 10.0);
        assert!(util > 0.9, "utilization after the fade {util}");
    }

    /// The `geo-fade` preset's forward rate at `t` s, Mbit/s: 50, then 38, 25 and 12 two
    /// seconds apart from 8 s, back up from 20 s, every 30 s.
    fn geo_fade_mbit(t: f64) -> f64 {
        match t % 30.0 {
            t if t < 8.0 => 50.0,
            t if t < 10.0 => 38.0,
            t if t < 12.0 => 25.0,
            t if t < 20.0 => 12.0,
            t if t < 22.0 => 25.0,
            t if t < 24.0 => 38.0,
            _ => 50.0,
        }
    }

    #[test]
    fn a_rain_fade_in_steps_is_not_taken_for_a_competitor() {
        // The `geo-fade` preset's trace, twice: 50 Mbit/s, then 38, 25 and 12 two seconds
        // apart, back up from 20 s. The link slows faster than each drain's cut follows, so
        // drains leave queues; the queue is still the tunnel's own, and the competitive mode
        // (which would hold the buffer full for 20 s) must not come.
        let step = |t: f64| Link {
            rate: geo_fade_mbit(t) * 1e6 / 8.0,
            ..geo(0.0)
        };
        let born = Instant::now();
        let mut c = Core::new(hop(None), MTU, born);
        let p = simulate(&mut c, &step, 60.0);
        assert_eq!(c.compete_since, born, "switched to the competitive mode");
        // Short again within four seconds of the last step down, in each fade. (The goal is
        // two. The cut at the 12 Mbit/s step reads the rate as the window over the RTT the
        // queue shows, which still holds some of the 25 Mbit/s: the drain then runs a little
        // above the link and queues slowly until the next reading. From two seconds after the
        // step the p95 is 79 ms in the first fade and 138 ms in the second; from three, 42
        // and 134; from four, 44 and 34.)
        for from in [16.0, 46.0] {
            let q = queue_p95(&p, from, from + 4.0);
            assert!(q < 56.0, "queue p95 at {from}..{} s: {q} ms", from + 4.0);
        }
        let util = delivered(&p, 14.0, 20.0) / (12e6 / 8.0 * 6.0);
        assert!(util > 0.9, "utilization in the fade's trough {util}");
    }

    #[test]
    fn a_step_up_is_found_within_about_a_round() {
        // A fade's coding step: 12 Mbit/s doubles to 25, held for 2 s. At four moments
        // 0.15 s apart, as where the controller is in its cycle matters.
        let mut sum = 0.0;
        for k in 0..4 {
            let at = 20.0 + 0.15 * k as f64;
            let step = move |t: f64| Link {
                rate: if t < at { 12e6 / 8.0 } else { 25e6 / 8.0 },
                ..geo(0.0)
            };
            let mut c = Core::new(hop(None), MTU, Instant::now());
            let p = simulate(&mut c, &step, at + 3.0);
            // Served at the bottleneck in those 2 s, acknowledged a base RTT later.
            sum += delivered(&p, at + 0.56, at + 2.56) / (25e6 / 8.0 * 2.0);
        }
        // 0.49 (about the old rate throughout) before the early reading and the refill
        // without slack; 0.65 with them. A delay-based sender sees a step up a round late at
        // best and then grows into it: about 0.7 is the most it could get.
        let util = sum / 4.0;
        assert!(
            util > 0.6,
            "share of the faster link in its first 2 s {util}"
        );
    }

    /// Prints the step fade's utilization and queue per second (`cargo test -p
    /// satpep-tunnel -- --ignored fade_figures --nocapture`): a figure to tune against.
    #[test]
    #[ignore]
    fn fade_figures() {
        let step = |t: f64| Link {
            rate: geo_fade_mbit(t) * 1e6 / 8.0,
            ..geo(0.0)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let p = simulate(&mut c, &step, 90.0);
        let (mut got, mut limit) = (0.0, 0.0);
        for s in 30..90 {
            let (a, b) = (s as f64, s as f64 + 1.0);
            // Acknowledged about a base RTT after the bottleneck served it.
            let d = delivered(&p, a + 0.56, b + 0.56);
            got += d;
            limit += geo_fade_mbit(a) * 1e6 / 8.0;
            eprintln!(
                "{s:>3} s link {:>4.0} got {:>5.1} Mbit/s q95 {:>5.0} ms",
                geo_fade_mbit(a),
                d * 8.0 / 1e6,
                queue_p95(&p, a, b)
            );
        }
        eprintln!(
            "30-90 s: {:.1} % of the link, queue p95 {:.0} ms",
            100.0 * got / limit,
            queue_p95(&p, 30.0, 90.0)
        );
    }

    /// The `leo` preset's path: four 15 s passes whose one-way delay is 14, 19, 16 and 21 ms
    /// plus 4 ms × ((x − 7.5 s) / 7.5 s)², both ways; RTT in ms at `t` s.
    fn leo_rtt_ms(t: f64) -> f64 {
        let base = [14.0, 19.0, 16.0, 21.0][((t % 60.0) / 15.0) as usize];
        let x = t % 15.0;
        2.0 * (base + 4.0 * ((x - 7.5) / 7.5).powi(2))
    }

    /// The `leo` preset at BER 1e-6 per second, 100 Mbit/s, over two minutes (`cargo test
    /// --release -p satpep-tunnel -- --ignored leo_figures --nocapture`).
    #[test]
    #[ignore]
    fn leo_figures() {
        let rate = 100e6 / 8.0;
        let leo = |t: f64| Link {
            rate,
            base: Duration::from_secs_f64(leo_rtt_ms(t) / 1e3),
            queue_limit: 450_000,
            loss_every: 100,
            random_loss: true,
            ..geo(0.0)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let p = simulate(&mut c, &leo, 125.0);
        let (mut got, mut limit) = (0.0, 0.0);
        for s in 5..120 {
            let (a, b) = (s as f64, s as f64 + 1.0);
            let d = delivered(&p, a + 0.04, b + 0.04);
            got += d;
            limit += rate * 0.99;
            eprintln!(
                "{s:>3} s rtt {:>4.1} got {:>5.1} Mbit/s q95 {:>5.0} ms",
                leo_rtt_ms(a),
                d * 8.0 / 1e6,
                queue_p95(&p, a, b)
            );
        }
        eprintln!(
            "5-120 s: {:.1} % of the link, queue p95 {:.0} ms, drains {}, buffer {:?}, noise {:?}, lost {} of {}",
            100.0 * got / limit,
            queue_p95(&p, 5.0, 120.0),
            c.drains,
            c.buffer,
            c.channel_loss(),
            p.iter().filter(|x| x.2.is_none()).count(),
            p.len()
        );
    }

    #[test]
    fn yields_to_cross_traffic_without_a_long_queue() {
        let mut c = Core::new(hop(None), MTU, Instant::now());
        // 20 of 50 Mbit/s taken by constant-rate traffic from 15 s on.
        let shared = |t: f64| Link {
            cross: if t >= 15.0 { 20e6 / 8.0 } else { 0.0 },
            competitor: None,
            ..geo(0.0)
        };
        let p = simulate(&mut c, &shared, 35.0);
        let q = queue_p95(&p, 18.0, 34.0);
        assert!(q < 56.0, "queue p95 with cross traffic {q} ms");
        let util = delivered(&p, 20.0, 35.0) / (30e6 / 8.0 * 15.0);
        assert!(util > 0.9, "share of what is left {util}");
    }

    #[test]
    fn a_longer_path_after_a_handover_becomes_the_base_rtt() {
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let rate = 100e6 / 8.0;
        // A handover from a 30 ms path to a 45 ms one at 5 s (the `leo` preset's largest
        // step is 10 ms).
        let leo = |t: f64| Link {
            rate,
            base: Duration::from_millis(if t < 5.0 { 30 } else { 45 }),
            queue_limit: 1_000_000,
            ..geo(0.0)
        };
        let p = simulate(&mut c, &leo, 15.0);
        let m = c.min_rtt().unwrap();
        assert!(m >= Duration::from_millis(45), "base RTT {m:?}");
        let util = delivered(&p, 5.0, 15.0) / (rate * 10.0);
        assert!(util > 0.93, "utilization {util}");
        let q = queue_p95(&p, 5.0, 14.0);
        assert!(q < 50.0, "queue p95 {q} ms");
    }

    #[test]
    fn a_configured_rate_is_where_it_starts_not_what_it_keeps() {
        // Told 100 Mbit/s (bytes/s here) on a 50 Mbit/s link, and told 25.
        for told in [12_500_000, 3_125_000] {
            let mut c = Core::new(hop(Some(told)), MTU, Instant::now());
            assert_eq!(c.phase(), Phase::Cruise);
            let payload = told * 1200 / 1242;
            // rate × (600 ms + 24 ms slack), in payload bytes.
            let start = bytes_in(payload, Duration::from_millis(624));
            assert!(c.window().abs_diff(start) <= 1, "{} vs {start}", c.window());
            let p = simulate(&mut c, &geo, 30.0);
            let bw = c.bw() as f64;
            assert!(
                (bw / GEO - 1.0).abs() < 0.05,
                "told {told}: rate estimate {bw}"
            );
            let util = delivered(&p, 15.0, 30.0) / (GEO * 15.0);
            assert!(util > 0.93, "told {told}: utilization {util}");
            let q = queue_p95(&p, 15.0, 29.0);
            assert!(q < 56.0, "told {told}: queue p95 {q} ms");
        }
    }

    #[test]
    fn an_outage_keeps_the_model_and_lets_one_probe_a_second_through() {
        let mut c = Core::new(hop(None), MTU, Instant::now());
        simulate(&mut c, &geo, 10.0);
        let (w, bw) = (c.window(), c.bw());
        let now = Instant::now();
        c.last_ack = now;
        c.on_end_acks(w);
        assert_eq!(c.window_at(now + Duration::from_millis(500)), w);
        let out = now + Duration::from_millis(1500);
        assert!(c.window_at(out) > c.in_flight);
        c.on_sent(out, MTU);
        assert_eq!(c.window_at(out + Duration::from_millis(10)), w);
        assert!(c.window_at(out + Duration::from_millis(1000)) > c.in_flight);
        // Persistent congestion with no queue (the outage) keeps the model.
        c.on_loss(out + Duration::from_secs(5), now, true, w);
        assert_eq!((c.window(), c.bw()), (w, bw));
        // The first ack after the outage, of a packet sent long before: not a queue.
        let back = out + Duration::from_secs(30);
        c.on_ack(back, now, MTU, false, Duration::from_millis(600));
        assert_eq!(c.bw(), bw);
        assert_ne!(c.phase(), Phase::Drain);
    }

    #[test]
    fn a_shallow_buffer_overflows_little_and_is_still_filled() {
        // A fast terrestrial-like hop whose buffer (10 ms) is shorter than the slack and the
        // queue budget: the queue never shows, only losses tell the link is full.
        let rate = 200e6 / 8.0;
        let shallow = |_t: f64| Link {
            rate,
            base: Duration::from_millis(10),
            queue_limit: 250_000,
            ..geo(0.0)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let p = simulate(&mut c, &shallow, 10.0);
        let (lost, sent) = losses_from(&p, 2.0);
        assert!(lost / sent < 0.01, "{lost} of {sent} packets lost");
        let util = delivered(&p, 2.0, 10.0) / (rate * 8.0);
        assert!(util > 0.9, "utilization {util}");
        assert!(c.losses().congestion > 0);
    }

    #[test]
    fn a_hop_that_drops_without_queueing_does_not_run_away() {
        // A fast hop that drops what exceeds its rate and queues nothing (a policer, or a
        // bottleneck host too busy to queue): losses never come with a queue, and a start
        // that took them all for noise credited them to its rate samples and doubled past
        // the link each round (lab, 200 Mbit/s: the model at 1.9 Gbit/s, 80 % of packets
        // lost, and quinn gave up the connection with too many gaps in a stream).
        let rate = 200e6 / 8.0;
        let policer = |_t: f64| Link {
            rate,
            base: Duration::from_millis(10),
            queue_limit: 2 * MTU,
            ..geo(0.0)
        };
        let mut c = Core::new(hop(None), MTU, Instant::now());
        let p = simulate(&mut c, &policer, 10.0);
        let (lost, sent) = losses_from(&p, 0.0);
        let bw = c.bw() as f64;
        eprintln!(
            "lost {lost} of {sent}, model {bw} vs {rate}, {:?}",
            c.phase()
        );
        // The model stays near the link; the losses stay bounded. (A third of the packets
        // are still lost: quinn paces a window out at 1.25 times window / RTT, faster than
        // a bottleneck with no buffer takes it.)
        assert!(bw < rate * 1.3, "model {bw} vs link {rate}");
        assert!(lost / sent < 0.4, "{lost} of {sent} packets lost");
        let util = delivered(&p, 2.0, 10.0) / (rate * 8.0);
        assert!(util > 0.7, "utilization {util}");
    }
}
