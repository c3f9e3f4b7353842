//! The satellite hop's controller. It knows what a PEP at either end of a satellite link
//! knows: the link's rate and round-trip time. It starts at one bandwidth-delay product,
//! holds the window at rate × minimum RTT plus a small headroom, and reacts to a loss only
//! when the RTT says a queue built up (Tarang's and Westwood+'s idea, 004 §4): a loss with no
//! queue behind it is the channel's noise, and is repaired without slowing down. After a
//! congestion loss the window becomes the measured delivery rate × minimum RTT (Westwood+).
//! Without a configured rate it grows like Hybla from a small window and is capped by what
//! it measured.
//!
//! Outages: while nothing is acknowledged for over a second, one small probe per second may
//! leave even with a full window, so the first packet after the link returns is acknowledged
//! at once and repair starts, instead of waiting out QUIC's backed-off probe timer (which
//! after a 60 s outage would add up to another minute). Persistent congestion with no queue
//! behind it (an outage) keeps the window.

use super::HopInfo;
use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;
use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Queueing the window allows above rate × minimum RTT, as time at the link rate.
const HEADROOM: Duration = Duration::from_millis(20);
/// Silence after which the hop is taken to be out, and probes may go.
const SILENCE: Duration = Duration::from_secs(1);
/// At most one probe per this while the hop is out.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Bytes a datagram takes on the link beyond its QUIC payload: UDP 8, IPv4 20, Ethernet
/// header 14 (IPv6 adds 20, link framing more; the headroom absorbs them).
const FRAME_OVERHEAD: u64 = 42;
/// Hybla's reference RTT.
const RTT0: Duration = Duration::from_millis(25);

/// Configuration: the hop as the operator described it.
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
    /// Loss events with a queue behind them: the window was reduced.
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
}

/// Delivery rate, sampled over intervals of a quarter minimum RTT and smoothed (each sample
/// weighs one half), so it follows the last RTT or so, as Westwood+'s estimate does.
#[derive(Debug, Clone)]
struct DeliveryRate {
    start: Instant,
    bytes: u64,
    /// Bytes per second.
    recent: u64,
}

impl DeliveryRate {
    fn on_ack(&mut self, now: Instant, bytes: u64, min_rtt: Duration, app_limited: bool) {
        self.bytes += bytes;
        let span = now.saturating_duration_since(self.start);
        if span >= (min_rtt / 4).max(Duration::from_millis(10)) {
            let rate = (self.bytes as u128 * 1_000_000_000 / span.as_nanos().max(1)) as u64;
            // An application-limited interval shows less than the path can carry.
            if !app_limited || rate > self.recent {
                self.recent = if self.recent == 0 {
                    rate
                } else {
                    (self.recent + rate) / 2
                };
            }
            self.start = now;
            self.bytes = 0;
        }
    }
}

/// The controller's state and logic, independent of quinn's types.
#[derive(Debug, Clone)]
pub struct Core {
    hop: HopInfo,
    mtu: u64,
    window: u64,
    min_rtt: Duration,
    smoothed: Duration,
    latest: Duration,
    rate: DeliveryRate,
    /// Losses of packets sent before this were part of the last reaction.
    recovery_start: Option<Instant>,
    last_ack: Instant,
    last_probe: Option<Instant>,
    in_flight: u64,
    /// Growing from a small window (no configured rate, no congestion seen yet).
    slow_start: bool,
    losses: LossCounts,
}

impl Core {
    /// A fresh controller at `now`.
    pub fn new(hop: HopInfo, mtu: u64, now: Instant) -> Core {
        let window = hop.bdp().map_or(10 * mtu, |b| b.max(4 * mtu));
        Core {
            hop,
            mtu,
            window,
            min_rtt: hop.rtt,
            smoothed: hop.rtt,
            latest: hop.rtt,
            rate: DeliveryRate {
                start: now,
                bytes: 0,
                recent: 0,
            },
            recovery_start: None,
            last_ack: now,
            last_probe: None,
            in_flight: 0,
            slow_start: hop.rate.is_none(),
            losses: LossCounts::default(),
        }
    }

    fn min_window(&self) -> u64 {
        4 * self.mtu
    }

    /// The headroom above rate × minimum RTT, bytes.
    fn headroom(&self) -> u64 {
        match self.hop.rate {
            Some(r) => ((r as u128 * HEADROOM.as_nanos() / 1_000_000_000) as u64).max(4 * self.mtu),
            None => 0,
        }
    }

    /// The largest window: what the configured rate carries in one minimum RTT, plus
    /// headroom, or unbounded. The rate is the link's, counted over whole frames, while the
    /// window counts QUIC payload: each datagram also carries [`FRAME_OVERHEAD`] bytes.
    pub fn cap(&self) -> u64 {
        match self.hop.rate {
            Some(r) => {
                let wire = r as u128 * self.min_rtt.as_nanos() / 1_000_000_000;
                (wire * self.mtu as u128 / (self.mtu + FRAME_OVERHEAD) as u128) as u64
                    + self.headroom()
            }
            None => u64::MAX,
        }
    }

    /// Queueing delay above which a loss counts as congestion: the headroom's own queue
    /// plus a margin for delayed acknowledgements and jitter.
    fn queue_threshold(&self) -> Duration {
        let own = match self.hop.rate {
            Some(r) => Duration::from_nanos(
                (self.headroom() as u128 * 1_000_000_000 / r.max(1) as u128) as u64,
            ),
            None => Duration::ZERO,
        };
        own + (self.min_rtt / 8).max(Duration::from_millis(10))
    }

    /// Hybla's ρ: RTT over the 25 ms reference, at least 1.
    fn rho(&self) -> f64 {
        (self.min_rtt.as_secs_f64() / RTT0.as_secs_f64()).max(1.0)
    }

    /// An acknowledgement of `bytes` sent at `sent`. `min_rtt` and `smoothed` are the
    /// connection's estimates.
    pub fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        min_rtt: Duration,
        smoothed: Duration,
    ) {
        self.last_ack = now;
        self.last_probe = None;
        self.min_rtt = min_rtt;
        self.smoothed = smoothed;
        self.latest = now.saturating_duration_since(sent);
        self.in_flight = self.in_flight.saturating_sub(bytes);
        self.rate.on_ack(now, bytes, min_rtt, app_limited);
        if app_limited {
            return;
        }
        let cap = self.cap();
        if self.window < cap {
            let rho = self.rho();
            let add = if self.slow_start {
                // Hybla's slow start, 2^ρ − 1 per acknowledged byte, held to ×9 per RTT.
                (bytes as f64 * (rho.exp2() - 1.0).min(8.0)) as u64
            } else {
                // Hybla's avoidance: ρ² segments per RTT.
                ((rho * rho * self.mtu as f64 * bytes as f64) / self.window as f64) as u64
            };
            self.window = (self.window + add.max(1)).min(cap);
        } else {
            // The minimum RTT can fall after the start (the configured RTT was high).
            self.window = cap;
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
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        let queue = self.latest.min(self.smoothed).saturating_sub(self.min_rtt);
        if queue <= self.queue_threshold() {
            // The channel's noise, or an outage: repaired without slowing down.
            self.losses.random += 1;
            return;
        }
        self.losses.congestion += 1;
        self.recovery_start = Some(now);
        self.slow_start = false;
        let measured = (self.rate.recent as u128 * self.min_rtt.as_nanos() / 1_000_000_000) as u64;
        self.window = if persistent {
            self.min_window()
        } else if measured > 0 {
            measured.min(self.window)
        } else {
            self.window / 2
        }
        .max(self.min_window());
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
        self.core
            .on_ack(now, sent, bytes, app_limited, rtt.min(), rtt.get());
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
        self.core.hop.bdp().unwrap_or(10 * self.core.mtu)
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u64 = 1200;
    const RTT: Duration = Duration::from_millis(600);

    fn hop(rate: Option<u64>) -> HopInfo {
        HopInfo { rate, rtt: RTT }
    }

    /// Acks one window's worth in MTU packets over one RTT at `rtt`; returns the new time.
    fn ack_round(c: &mut Core, t: Instant, rtt: Duration) -> Instant {
        let n = (c.window() / MTU).max(1);
        let step = rtt / n as u32;
        let mut now = t;
        for _ in 0..n {
            now += step;
            c.on_sent(now, MTU);
            c.on_ack(now + rtt, now, MTU, false, RTT, rtt);
        }
        now + rtt
    }

    #[test]
    fn starts_at_one_bdp_and_holds_it_with_headroom() {
        let t = Instant::now();
        let mut c = Core::new(hop(Some(12_500_000)), MTU, t);
        assert_eq!(c.window(), 7_500_000);
        let mut now = t;
        for _ in 0..5 {
            now = ack_round(&mut c, now, RTT);
        }
        // 100 Mbit/s × 600 ms in 1200-byte payloads of 1242-byte frames, + 20 ms headroom.
        assert_eq!(c.window(), 7_500_000 * 1200 / 1242 + 250_000);
    }

    #[test]
    fn random_loss_keeps_the_window_and_congestion_cuts_to_the_delivery_rate() {
        let t = Instant::now();
        let mut c = Core::new(hop(Some(12_500_000)), MTU, t);
        let mut now = t;
        for _ in 0..4 {
            now = ack_round(&mut c, now, RTT);
        }
        let w = c.window();
        // A loss with the RTT at its minimum: noise.
        c.on_loss(now, now - RTT, false, MTU);
        assert_eq!(c.window(), w);
        assert_eq!(
            c.losses(),
            LossCounts {
                congestion: 0,
                random: 1
            }
        );
        // The RTT grows by 200 ms (a queue), acks come at half the rate: congestion.
        let mut now2 = now;
        for i in 0..4000u32 {
            now2 = now + Duration::from_micros(192) * i;
            c.on_ack(
                now2,
                now2 - RTT - Duration::from_millis(200),
                MTU,
                false,
                RTT,
                RTT + Duration::from_millis(200),
            );
        }
        c.on_loss(now2, now2 - RTT, false, MTU);
        assert_eq!(c.losses().congestion, 1);
        let expect = 6_250_000u64 * 6 / 10; // 6.25 MB/s × 0.6 s
        let got = c.window();
        assert!(
            got > expect * 9 / 10 && got < expect * 11 / 10 + 250_000,
            "{got} vs {expect}"
        );
        // Further losses of packets sent before the reaction are the same episode.
        c.on_loss(now2, now2 - RTT, false, MTU);
        assert_eq!(c.losses().congestion, 1);
    }

    #[test]
    fn an_outage_keeps_the_window_and_lets_one_probe_a_second_through() {
        let t = Instant::now();
        let mut c = Core::new(hop(Some(12_500_000)), MTU, t);
        let now = ack_round(&mut c, t, RTT);
        let w = c.window();
        c.on_end_acks(w);
        // Full window, link silent for 0.5 s: no probe.
        assert_eq!(c.window_at(now + Duration::from_millis(500)), w);
        // Silent for 1.5 s: room for one probe.
        let out = now + Duration::from_millis(1500);
        assert!(c.window_at(out) > c.in_flight);
        c.on_sent(out, MTU);
        assert_eq!(c.window_at(out + Duration::from_millis(10)), w);
        assert!(c.window_at(out + Duration::from_millis(1000)) > c.in_flight);
        // Persistent congestion with no queue (the outage) keeps the window.
        c.on_loss(out + Duration::from_secs(5), now, true, w);
        assert_eq!(c.window(), w);
    }

    #[test]
    fn without_a_rate_it_grows_fast_from_ten_packets() {
        let t = Instant::now();
        let mut c = Core::new(hop(None), MTU, t);
        assert_eq!(c.window(), 10 * MTU);
        let mut now = t;
        for _ in 0..4 {
            now = ack_round(&mut c, now, RTT);
        }
        // ×9 per RTT for four RTTs.
        assert_eq!(c.window(), 10 * MTU * 9 * 9 * 9 * 9);
    }
}
