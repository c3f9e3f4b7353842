//! Adaptive choice of the satellite leg's congestion control, per connection (ADYTIA,
//! Vanzara 2017 ch. 4): classify the path from the leg's TCP_INFO, look the class up in a policy
//! table, and switch with TCP_CONGESTION while the connection runs.
//!
//! Classes (the thesis's Table 4.2): RTT up to 100, 200 or above 200 ms (from the minimum RTT:
//! the thesis's Algorithm 7 compares it the wrong way round and so tracks the maximum); the
//! path's rate (the highest delivery rate seen) against 10 and 100 Mbit/s; whether a queue
//! builds (sRTT − min RTT); and whether losses happen with no queue, which means the link's
//! errors rather than congestion. Unlike the thesis:
//! - every boundary has hysteresis (a value must cross it by 20 % to change class), so a path
//!   at a threshold does not flap;
//! - a connection keeps a controller at least `dwell` (default 10 s) before another switch;
//! - the "with losses" classes stay for 10 s after the last link-error loss;
//! - the first choice waits until the connection is 2 s and 4 minimum RTTs old, so it rests
//!   on some data (a lossy link has shown losses by then).

use serde::Serialize;
use std::time::{Duration, Instant};

/// A connection type of the thesis's Table 4.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// RTT ≤ 100 ms, ≤ 100 Mbit/s.
    LowSpeedVeryLowDelay,
    /// RTT ≤ 200 ms, ≤ 100 Mbit/s.
    LowSpeedLowDelay,
    /// As above, with link-error losses.
    LowSpeedLowDelayLossy,
    /// RTT ≤ 200 ms, > 100 Mbit/s.
    HighSpeed,
    /// As above, with link-error losses.
    HighSpeedLossy,
    /// RTT ≤ 200 ms, > 100 Mbit/s, with a standing queue.
    HighSpeedQueue,
    /// RTT > 200 ms, ≥ 10 Mbit/s.
    LongFat,
    /// As above, with link-error losses.
    LongFatLossy,
    /// RTT > 200 ms, < 10 Mbit/s.
    LongThin,
    /// As above, with link-error losses.
    LongThinLossy,
}

impl Class {
    /// Every class, in table order.
    pub const ALL: [Class; 10] = [
        Class::LowSpeedVeryLowDelay,
        Class::LowSpeedLowDelay,
        Class::LowSpeedLowDelayLossy,
        Class::HighSpeed,
        Class::HighSpeedLossy,
        Class::HighSpeedQueue,
        Class::LongFat,
        Class::LongFatLossy,
        Class::LongThin,
        Class::LongThinLossy,
    ];

    /// The name used in configuration files and logs.
    pub fn name(self) -> &'static str {
        match self {
            Class::LowSpeedVeryLowDelay => "low_speed_very_low_delay",
            Class::LowSpeedLowDelay => "low_speed_low_delay",
            Class::LowSpeedLowDelayLossy => "low_speed_low_delay_lossy",
            Class::HighSpeed => "high_speed",
            Class::HighSpeedLossy => "high_speed_lossy",
            Class::HighSpeedQueue => "high_speed_queue",
            Class::LongFat => "long_fat",
            Class::LongFatLossy => "long_fat_lossy",
            Class::LongThin => "long_thin",
            Class::LongThinLossy => "long_thin_lossy",
        }
    }

    /// The shipped policy. Long paths follow the thesis's Table 4.3 (Hybla when clean,
    /// Tarang when lossy, as the thesis plugs it in; "thin" is the flow's own best rate, which
    /// a young flow on a lossy fat path also shows, so thin and fat choose alike). Short
    /// paths (LEO, MEO, terrestrial) take the kernel's BBR: on a lossy LEO link Westwood+ and
    /// Tarang reached about half of end-to-end BBR (docs/cc.md).
    pub fn default_cc(self) -> &'static str {
        match self {
            Class::LowSpeedVeryLowDelay
            | Class::LowSpeedLowDelay
            | Class::LowSpeedLowDelayLossy
            | Class::HighSpeed
            | Class::HighSpeedLossy
            | Class::HighSpeedQueue => "bbr",
            Class::LongFat | Class::LongThin => "satpep_hybla",
            Class::LongFatLossy | Class::LongThinLossy => "satpep_tarang",
        }
    }
}

/// Every controller the shipped policy may switch a connection to, each once, in class
/// order: what must be registered before a proxy with `congestion = "adaptive"` starts.
pub fn policy_controllers() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for c in Class::ALL {
        if !out.contains(&c.default_cc()) {
            out.push(c.default_cc());
        }
    }
    out
}

/// One TCP_INFO observation of the satellite leg.
#[derive(Debug, Clone, Copy)]
pub struct Observation {
    /// Minimum RTT, ms.
    pub min_rtt_ms: f64,
    /// Smoothed RTT, ms.
    pub rtt_ms: f64,
    /// Latest delivery rate, bit/s.
    pub delivery_rate_bps: f64,
    /// Retransmitted segments so far.
    pub total_retrans: u32,
}

/// Per-connection classifier state.
#[derive(Debug, Clone)]
pub struct Classifier {
    rtt_band: u8,  // 0: ≤ 100 ms, 1: ≤ 200 ms, 2: > 200 ms
    rate_band: u8, // 0: < 10 Mbit/s, 1: ≤ 100, 2: > 100
    queue: bool,
    max_rate_bps: f64,
    last_retrans: u32,
    last_link_loss: Option<Instant>,
    started: bool,
}

/// Least age of a connection before its first classification.
const FIRST_LOOK: Duration = Duration::from_secs(2);

/// Share by which a value must cross a boundary to change class.
const HYSTERESIS: f64 = 0.2;
/// How long a link-error loss keeps a "lossy" class.
const LOSSY_HOLD: Duration = Duration::from_secs(10);

fn band(value: f64, bounds: &[f64], current: u8, first: bool) -> u8 {
    let plain = bounds.iter().filter(|b| value > **b).count() as u8;
    if first {
        return plain;
    }
    // Move only when the value is past a boundary by the hysteresis margin.
    let mut b = current;
    while (b as usize) < bounds.len() && value > bounds[b as usize] * (1.0 + HYSTERESIS) {
        b += 1;
    }
    while b > 0 && value < bounds[b as usize - 1] * (1.0 - HYSTERESIS) {
        b -= 1;
    }
    b
}

impl Default for Classifier {
    fn default() -> Self {
        Classifier {
            rtt_band: 0,
            rate_band: 0,
            queue: false,
            max_rate_bps: 0.0,
            last_retrans: 0,
            last_link_loss: None,
            started: false,
        }
    }
}

impl Classifier {
    /// Folds in one observation made at `now`; returns the class and why.
    pub fn observe(&mut self, o: &Observation, now: Instant) -> (Class, String) {
        let first = !self.started;
        self.started = true;
        self.max_rate_bps = self.max_rate_bps.max(o.delivery_rate_bps);
        self.rtt_band = band(o.min_rtt_ms, &[100.0, 200.0], self.rtt_band, first);
        self.rate_band = band(self.max_rate_bps, &[10e6, 100e6], self.rate_band, first);
        // A standing queue: sRTT above min RTT by more than 5 ms and 10 % of it.
        let queue_ms = (o.rtt_ms - o.min_rtt_ms).max(0.0);
        let threshold = (o.min_rtt_ms * 0.1).max(5.0);
        self.queue = if self.queue {
            queue_ms > threshold * (1.0 - HYSTERESIS)
        } else {
            queue_ms > threshold * (1.0 + HYSTERESIS)
        };
        if o.total_retrans > self.last_retrans && !self.queue {
            // Lost with no queue to overflow: the link's errors.
            self.last_link_loss = Some(now);
        }
        self.last_retrans = o.total_retrans;
        let lossy = self
            .last_link_loss
            .is_some_and(|t| now.duration_since(t) < LOSSY_HOLD);
        let class = match (self.rtt_band, self.rate_band) {
            (2, 0) if lossy => Class::LongThinLossy,
            (2, 0) => Class::LongThin,
            (2, _) if lossy => Class::LongFatLossy,
            (2, _) => Class::LongFat,
            (_, 2) if lossy => Class::HighSpeedLossy,
            (_, 2) if self.queue => Class::HighSpeedQueue,
            (_, 2) => Class::HighSpeed,
            (1, _) if lossy => Class::LowSpeedLowDelayLossy,
            (_, _) if lossy => Class::LowSpeedLowDelayLossy,
            (1, _) => Class::LowSpeedLowDelay,
            _ => Class::LowSpeedVeryLowDelay,
        };
        let why = format!(
            "min RTT {:.0} ms, rate {:.1} Mbit/s, queue {:.0} ms, link losses {}",
            o.min_rtt_ms,
            self.max_rate_bps / 1e6,
            queue_ms,
            if lossy { "yes" } else { "no" }
        );
        (class, why)
    }
}

/// Classifies every live connection's satellite leg each `cfg.interval` and switches its
/// controller when the policy says so (at most once per `cfg.dwell`).
pub async fn run(
    cfg: crate::config::AdaptiveConfig,
    reg: std::sync::Arc<crate::registry::Registry>,
) {
    let mut tick = tokio::time::interval(cfg.interval);
    loop {
        tick.tick().await;
        let now = Instant::now();
        for conn in reg.live() {
            if cfg.interactive_ports.contains(&conn.dst.port()) {
                continue;
            }
            let Some(info) = conn.with_satellite(crate::tcpinfo::read).flatten() else {
                continue;
            };
            // Nothing to classify before a few RTTs of data: the first choice is made once
            // the connection is FIRST_LOOK old and 4 min RTTs.
            let settle = FIRST_LOOK.max(Duration::from_secs_f64(info.min_rtt_ms * 4e-3));
            if info.min_rtt_ms <= 0.0 || info.bytes_acked == 0 || conn.age() < settle {
                continue;
            }
            let mut slot = conn.adaptive.lock().unwrap();
            let a = slot.get_or_insert_with(|| crate::registry::Adaptive {
                classifier: Classifier::default(),
                class: None,
                initial_cc: info.congestion.clone(),
                since: now,
                switches: 0,
                reason: String::new(),
            });
            let (class, why) = a.classifier.observe(
                &Observation {
                    min_rtt_ms: info.min_rtt_ms,
                    rtt_ms: info.rtt_ms,
                    delivery_rate_bps: info.delivery_rate_bps as f64,
                    total_retrans: info.total_retrans,
                },
                now,
            );
            let want = match cfg.cc_for(class) {
                "" => a.initial_cc.clone(),
                cc => cc.to_string(),
            };
            // The first choice is made at once; later ones wait out the dwell time.
            let may = a.class.is_none() || now.duration_since(a.since) >= cfg.dwell;
            if want == info.congestion || !may {
                if a.class.is_none() {
                    a.class = Some(class);
                    a.reason = format!("{}: {why}", class.name());
                }
                continue;
            }
            let Some(set) = conn.with_satellite(|fd| crate::sockets::set_congestion(fd, &want))
            else {
                continue;
            };
            match set {
                Ok(()) => {
                    tracing::debug!(
                        target: crate::CONNECTION_LOG,
                        src = %conn.src,
                        dst = %conn.dst,
                        from = %info.congestion,
                        to = %want,
                        class = class.name(),
                        reason = %why,
                        "congestion control switched"
                    );
                    a.class = Some(class);
                    a.since = now;
                    a.switches += 1;
                    a.reason = format!("{}: {why}", class.name());
                }
                Err(e) => {
                    tracing::warn!(src = %conn.src, dst = %conn.dst, to = %want, error = %e, "cannot switch congestion control");
                    a.since = now;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(min_rtt: f64, rtt: f64, rate_mbit: f64, retrans: u32) -> Observation {
        Observation {
            min_rtt_ms: min_rtt,
            rtt_ms: rtt,
            delivery_rate_bps: rate_mbit * 1e6,
            total_retrans: retrans,
        }
    }

    #[test]
    fn classes_of_the_table() {
        let t = Instant::now();
        let c = |o: Observation| Classifier::default().observe(&o, t).0;
        assert_eq!(c(obs(600.0, 601.0, 50.0, 0)), Class::LongFat);
        assert_eq!(c(obs(600.0, 601.0, 2.0, 0)), Class::LongThin);
        assert_eq!(c(obs(50.0, 51.0, 500.0, 0)), Class::HighSpeed);
        assert_eq!(c(obs(50.0, 90.0, 500.0, 0)), Class::HighSpeedQueue);
        assert_eq!(c(obs(150.0, 151.0, 5.0, 0)), Class::LowSpeedLowDelay);
        assert_eq!(c(obs(20.0, 21.0, 5.0, 0)), Class::LowSpeedVeryLowDelay);
        // A loss with no queue: link errors.
        let mut k = Classifier::default();
        k.observe(&obs(600.0, 601.0, 50.0, 0), t);
        assert_eq!(
            k.observe(&obs(600.0, 601.0, 50.0, 3), t).0,
            Class::LongFatLossy
        );
        // A loss with a queue: congestion, not a lossy link.
        let mut k = Classifier::default();
        k.observe(&obs(600.0, 700.0, 50.0, 0), t);
        assert_eq!(k.observe(&obs(600.0, 700.0, 50.0, 3), t).0, Class::LongFat);
        // Lossy for 10 s after the last link-error loss.
        let (c1, _) = k.observe(&obs(600.0, 601.0, 50.0, 9), t);
        assert_eq!(c1, Class::LongFatLossy);
        let later = t + Duration::from_secs(11);
        assert_eq!(
            k.observe(&obs(600.0, 601.0, 50.0, 9), later).0,
            Class::LongFat
        );
    }

    #[test]
    fn short_lossy_paths_get_bbr_long_ones_keep_hybla_and_tarang() {
        let t = Instant::now();
        // A LEO path (min RTT 30 ms, 90 Mbit/s) with link-error losses.
        let mut k = Classifier::default();
        k.observe(&obs(30.0, 31.0, 90.0, 0), t);
        let (class, _) = k.observe(&obs(30.0, 31.0, 90.0, 4), t);
        assert_eq!(class, Class::LowSpeedLowDelayLossy);
        assert_eq!(class.default_cc(), "bbr");
        // A lossy T1 (1.5 Mbit/s, 570 ms).
        let mut k = Classifier::default();
        k.observe(&obs(570.0, 571.0, 1.4, 0), t);
        let (class, _) = k.observe(&obs(570.0, 571.0, 1.4, 7), t);
        assert_eq!(class, Class::LongThinLossy);
        assert_eq!(class.default_cc(), "satpep_tarang");
        assert_eq!(Class::LongFat.default_cc(), "satpep_hybla");
        assert_eq!(Class::LongFatLossy.default_cc(), "satpep_tarang");
    }

    #[test]
    fn no_flapping_at_a_threshold() {
        // The thesis's classifier flips at 100 Mbit/s; a path hovering around it must not.
        let t = Instant::now();
        let mut k = Classifier::default();
        let first = k.observe(&obs(150.0, 151.0, 98.0, 0), t).0;
        assert_eq!(first, Class::LowSpeedLowDelay);
        for rate in [101.0, 99.0, 105.0, 110.0, 95.0] {
            assert_eq!(k.observe(&obs(150.0, 151.0, rate, 0), t).0, first, "{rate}");
        }
        // Well past the boundary it does change.
        assert_eq!(
            k.observe(&obs(150.0, 151.0, 130.0, 0), t).0,
            Class::HighSpeed
        );
        // RTT around 200 ms: stays where it started.
        let mut k = Classifier::default();
        let first = k.observe(&obs(195.0, 196.0, 50.0, 0), t).0;
        for rtt in [205.0, 210.0, 190.0, 230.0] {
            assert_eq!(
                k.observe(&obs(rtt, rtt + 1.0, 50.0, 0), t).0,
                first,
                "{rtt}"
            );
        }
    }
}
