//! The channel model of one direction, free of I/O so it can be tested exactly.
//!
//! Frames are offered in arrival order with their arrival time. The model is a FIFO server:
//! a frame waits in the bottleneck queue until the previous frame has been serialized, is
//! serialized at the channel rate (integrated across rate-trace steps), then propagates for
//! the delay in force when its last bit leaves, plus jitter. Everything is decided at arrival,
//! analytically, so the emulator's threads only have to release frames at their delivery time.
//!
//! Drop order: a full queue drops at once (the frame never uses the channel); a frame whose
//! serialization overlaps an outage is lost in the air; otherwise the loss processes decide
//! whether the receiver's FCS would discard it. Lost frames still occupy the channel, as on a
//! real link.

use crate::config::{DirectionConfig, Outages, QueueLimit, RateSource};
use crate::loss::LossState;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

/// What happens to an offered frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fate {
    /// Delivered at `at_ns` (ns since start) after waiting `queue_ns` in the queue.
    Deliver {
        /// Delivery time at the far end.
        at_ns: f64,
        /// Time spent waiting before serialization started.
        queue_ns: f64,
    },
    /// Dropped on arrival: the queue was full.
    DropQueue,
    /// Serialized but corrupted; the receiver discards it.
    DropError {
        /// Time spent waiting before serialization started.
        queue_ns: f64,
    },
    /// Serialized while the link was down.
    DropOutage {
        /// Time spent waiting before serialization started.
        queue_ns: f64,
    },
}

/// Time at which serializing `bits` at `rate`, starting at `start`, completes (ns).
fn serialized(rate: &RateSource, start: f64, bits: f64) -> f64 {
    match rate {
        RateSource::Fixed(r) => start + bits * 1e9 / r,
        RateSource::Trace(t) => {
            let (mut now, mut left) = (start, bits);
            loop {
                let (rate, until) = t.segment_at(now);
                let done = now + left * 1e9 / rate;
                if done <= until {
                    return done;
                }
                left -= rate * (until - now) / 1e9;
                now = until;
            }
        }
    }
}

/// One direction's channel state.
pub struct Channel {
    cfg: DirectionConfig,
    outages: Outages,
    loss: LossState,
    jitter: ChaCha8Rng,
    /// Admitted frames not yet fully serialized: (finish time, length).
    backlog: VecDeque<(f64, u32)>,
    backlog_bytes: u64,
    busy_until: f64,
    /// The latest delivery time so far on the link's own path and on each other path (each
    /// keeps its order; paths of different delays overtake one another, as in a dumbbell).
    last_delivery: Vec<f64>,
    /// The random state of each path with loss processes of its own.
    path_loss: Vec<Option<LossState>>,
}

impl Channel {
    /// A channel for one direction; `stream` (0 forward, 1 return) separates the random streams
    /// of the two directions under one seed.
    pub fn new(cfg: DirectionConfig, outages: Outages, seed: u64, stream: u64) -> Channel {
        let mut jitter = ChaCha8Rng::seed_from_u64(seed);
        jitter.set_stream(100 + stream);
        let last_delivery = vec![0.0; cfg.paths.len() + 1];
        // Streams 1000 + 2 × path + direction: apart from the directions' own (0 and 1).
        let path_loss = (0..cfg.paths.len() as u64)
            .map(|i| {
                cfg.paths[i as usize]
                    .loss
                    .map(|_| LossState::new(seed, 1000 + 2 * i + stream))
            })
            .collect();
        Channel {
            cfg,
            outages,
            loss: LossState::new(seed, stream),
            jitter,
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            busy_until: 0.0,
            last_delivery,
            path_loss,
        }
    }

    /// The configuration this channel runs.
    pub fn config(&self) -> &DirectionConfig {
        &self.cfg
    }

    /// Frames and bytes queued or on the wire as of the last offer.
    pub fn backlog(&self) -> (usize, u64) {
        (self.backlog.len(), self.backlog_bytes)
    }

    /// Time at which serializing `bits` starting at `start` completes (ns).
    pub fn finish_time(&self, start: f64, bits: f64) -> f64 {
        serialized(&self.cfg.rate, start, bits)
    }

    /// Offers a frame of `len` bytes arriving at `now` (ns since start).
    pub fn offer(&mut self, now: f64, len: u32) -> Fate {
        self.offer_on(now, len, None)
    }

    /// The path (an index in the configuration's `paths`) of an Ethernet frame, from its
    /// IPv4 or IPv6 addresses; None for the link's own path.
    pub fn path_of(&self, frame: &[u8]) -> Option<usize> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        if self.cfg.paths.is_empty() || frame.len() < 14 {
            return None;
        }
        let ip = &frame[14..];
        let (src, dst) = match u16::from_be_bytes([frame[12], frame[13]]) {
            0x0800 if ip.len() >= 20 => {
                let a =
                    |o: usize| IpAddr::V4(Ipv4Addr::new(ip[o], ip[o + 1], ip[o + 2], ip[o + 3]));
                (a(12), a(16))
            }
            0x86dd if ip.len() >= 40 => {
                let a = |o: usize| {
                    let b: [u8; 16] = ip[o..o + 16].try_into().expect("16 bytes");
                    IpAddr::V6(Ipv6Addr::from(b))
                };
                (a(8), a(24))
            }
            _ => return None,
        };
        self.cfg.path_of(src, dst)
    }

    /// [`Channel::offer`] for a frame on `path` (None: the link's own path): it waits in the
    /// shared queue, is sent at the path's rate (the carrier's time is what is shared), meets
    /// the path's loss processes and takes the path's delay after the queue (the direction's,
    /// for what the path does not set).
    pub fn offer_on(&mut self, now: f64, len: u32, path: Option<usize>) -> Fate {
        while let Some(&(fin, l)) = self.backlog.front() {
            if fin > now {
                break;
            }
            self.backlog.pop_front();
            self.backlog_bytes -= l as u64;
        }
        let full = match self.cfg.queue {
            QueueLimit::Bytes(b) => self.backlog_bytes + len as u64 > b,
            QueueLimit::Packets(p) => self.backlog.len() as u64 + 1 > p,
        };
        if full {
            return Fate::DropQueue;
        }
        let wire = len + self.cfg.overhead;
        let start = self.busy_until.max(now);
        let on = path.and_then(|p| self.cfg.paths.get(p));
        let rate = on.and_then(|p| p.rate.as_ref()).unwrap_or(&self.cfg.rate);
        let finish = serialized(rate, start, wire as f64 * 8.0);
        self.busy_until = finish;
        self.backlog.push_back((finish, len));
        self.backlog_bytes += len as u64;
        let queue_ns = start - now;
        // Draw for every admitted frame so the loss pattern depends only on the seed and
        // the frame sequence, not on outages.
        let corrupted = match path.and_then(|p| Some((self.path_loss.get_mut(p)?.as_mut()?, p))) {
            Some((state, p)) => state.lost(
                self.cfg.paths[p]
                    .loss
                    .as_ref()
                    .expect("a state only with a config"),
                wire,
            ),
            None => self.loss.lost(&self.cfg.loss, wire),
        };
        if self.outages.overlaps(start, finish) {
            return Fate::DropOutage { queue_ns };
        }
        if corrupted {
            return Fate::DropError { queue_ns };
        }
        let delay = match path.and_then(|p| self.cfg.paths.get(p)?.delay_ns) {
            Some(d) => d as f64,
            None => self.cfg.delay.at(finish),
        };
        let mut at = finish + delay;
        if self.cfg.jitter_ns > 0 {
            let j = self.cfg.jitter_ns as f64;
            at = (at + self.jitter.gen_range(-j..=j)).max(finish);
        }
        let lane = path.map_or(0, |p| (p + 1).min(self.last_delivery.len() - 1));
        if !self.cfg.reorder {
            at = at.max(self.last_delivery[lane]);
        }
        self.last_delivery[lane] = self.last_delivery[lane].max(at);
        Fate::Deliver {
            at_ns: at,
            queue_ns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DelaySource, LinkSpec};
    use crate::trace::{Interp, Trace};

    fn channel(toml_text: &str) -> Channel {
        let spec: LinkSpec = toml::from_str(toml_text).unwrap();
        let c = spec.resolve().unwrap();
        Channel::new(c.forward, c.outages, c.seed, 0)
    }

    fn at(f: Fate) -> f64 {
        match f {
            Fate::Deliver { at_ns, .. } => at_ns,
            other => panic!("not delivered: {other:?}"),
        }
    }

    /// A dumbbell: hosts on another path share the queue (and wait their turn in it) but
    /// take their own delay after it, so their frames may arrive before frames queued ahead
    /// of them on the long path; each path keeps its own order.
    #[test]
    fn other_paths_share_the_queue_and_take_their_own_delay() {
        let mut ch = channel(
            "[both]\nrate='8Mbit'\ndelay='300ms'\nqueue='100p'\n\
             [[both.path]]\nhosts=['198.18.3.16/28', '2001:2:0:3::10']\ndelay='12ms'\n",
        );
        let long = at(ch.offer_on(0.0, 1000, None));
        let short = at(ch.offer_on(0.0, 1000, Some(0)));
        let short2 = at(ch.offer_on(0.0, 1000, Some(0)));
        assert!((long - 301e6).abs() < 1e-3, "{long}");
        // Serialized second and third (2 and 3 ms), then 12 ms.
        assert!((short - 14e6).abs() < 1e-3, "{short}");
        assert!((short2 - 15e6).abs() < 1e-3, "{short2}");
        // Frames find their path by either address.
        let frame = |src: [u8; 4], dst: [u8; 4]| {
            let mut f = vec![0u8; 34];
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[26..30].copy_from_slice(&src);
            f[30..34].copy_from_slice(&dst);
            f
        };
        assert_eq!(
            ch.path_of(&frame([198, 18, 1, 16], [198, 18, 3, 17])),
            Some(0)
        );
        assert_eq!(
            ch.path_of(&frame([198, 18, 3, 31], [198, 18, 1, 2])),
            Some(0)
        );
        assert_eq!(ch.path_of(&frame([198, 18, 3, 32], [198, 18, 1, 2])), None);
        assert_eq!(ch.path_of(&frame([198, 18, 1, 2], [198, 18, 3, 2])), None);
        let mut v6 = vec![0u8; 54];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[38..54].copy_from_slice(
            &"2001:2:0:3::10"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        assert_eq!(ch.path_of(&v6), Some(0));
        assert_eq!(ch.path_of(&v6[..30]), None, "a truncated frame");
    }

    /// A star: terminals share the carrier's time, each at its own modulation and coding. A
    /// frame for a terminal faded to a quarter of the rate holds the carrier four times as
    /// long, and the frames behind it wait; a path's own loss hits only its frames.
    #[test]
    fn terminals_share_the_carriers_time_at_their_own_rates() {
        let mut ch = channel(
            "[both]\nrate='8Mbit'\ndelay='100ms'\nqueue='100p'\n\
             [[both.path]]\nhosts=['198.19.2.0/24']\nrate='2Mbit'\n\
             [[both.path]]\nhosts=['198.19.3.0/24']\nrate_schedule='0 8Mbit; 0.002 4Mbit'\nber=1e-2\n",
        );
        // 1000 bytes: 1 ms at 8 Mbit/s, 4 ms at 2 Mbit/s.
        let clear = at(ch.offer_on(0.0, 1000, None));
        let faded = at(ch.offer_on(0.0, 1000, Some(0)));
        let behind = at(ch.offer_on(0.0, 1000, None));
        assert!((clear - 101e6).abs() < 1e-3, "{clear}");
        assert!((faded - 105e6).abs() < 1e-3, "{faded}");
        assert!((behind - 106e6).abs() < 1e-3, "{behind}");
        // The third path's schedule is read at the carrier's clock (4 Mbit/s from 2 ms: 2 ms
        // a frame), and its own loss process loses every one of its frames, only its.
        for _ in 0..3 {
            assert!(matches!(
                ch.offer_on(0.0, 1000, Some(1)),
                Fate::DropError { .. }
            ));
        }
        let after = at(ch.offer_on(0.0, 1000, None));
        assert!((after - (106e6 + 3.0 * 2e6 + 1e6)).abs() < 1e-3, "{after}");
        let d = ch.config().clone();
        assert_eq!(d.paths[0].delay_ns, None, "the direction's delay");
        assert!(d.paths[0].loss.is_none());
        assert!(
            d.describe().contains("198.19.2.0/24 via 2 Mbit/s"),
            "{}",
            d.describe()
        );
    }

    #[test]
    fn bad_paths_are_refused_with_what_is_wrong() {
        let unknown = toml::from_str::<LinkSpec>("[[both.path]]\nhosts=['198.18.3.1']\nspeed=1\n");
        assert!(unknown
            .unwrap_err()
            .to_string()
            .contains("unknown field `speed`"));
        for (text, want) in [
            (
                "hosts=[]\ndelay='1ms'",
                "forward path #1: hosts: give at least one",
            ),
            (
                "hosts=['198.18.3.0/33']\ndelay='1ms'",
                "prefix length must be 0 to 32",
            ),
            (
                "hosts=['nowhere']\ndelay='1ms'",
                "'nowhere' is not an address",
            ),
            (
                "hosts=['198.18.3.1']\ndelay='soon'",
                "forward path #1: delay",
            ),
            ("hosts=['198.18.3.1']\nrate='fast'", "forward path #1: rate"),
            (
                "hosts=['198.18.3.1']\nrate='1Mbit'\nrate_schedule='0 1Mbit'",
                "give one of rate and rate_schedule",
            ),
            (
                "hosts=['198.18.3.1']\nrate='1bit'",
                "forward path #1: rates must be between",
            ),
            ("hosts=['198.18.3.1']\nper=2.0", "forward path #1 per"),
        ] {
            let spec: LinkSpec =
                toml::from_str(&format!("[both]\nrate='8Mbit'\n[[both.path]]\n{text}\n")).unwrap();
            let e = spec.resolve().unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn serialization_then_delay() {
        // 1000-byte frames at 8 Mbit/s take 1 ms each.
        let mut ch = channel("[both]\nrate='8Mbit'\ndelay='10ms'\nqueue='100p'\n");
        let t: Vec<f64> = (0..5).map(|_| at(ch.offer(0.0, 1000))).collect();
        for (i, x) in t.iter().enumerate() {
            assert!((x - ((i + 1) as f64 * 1e6 + 10e6)).abs() < 1e-3, "{i}: {x}");
        }
        assert_eq!(ch.backlog(), (5, 5000));
        // A frame arriving after the queue drained is not delayed by it.
        assert!((at(ch.offer(100e6, 1000)) - 111e6).abs() < 1e-3);
        assert_eq!(ch.backlog(), (1, 1000));
    }

    #[test]
    fn overhead_counts_toward_rate() {
        let mut ch = channel("[both]\nrate='8Mbit'\noverhead=24\n");
        assert!((at(ch.offer(0.0, 976)) - 1e6).abs() < 1e-3);
    }

    #[test]
    fn saturated_rate_is_exact() {
        let mut ch = channel("[both]\nrate='1Gbit'\nqueue='10000p'\n");
        let (mut last, mut admitted) = (0.0, 0u64);
        for i in 0..100_000 {
            // Offered at 1.2 Gbit/s, so the queue never empties.
            let now = i as f64 * 1514.0 * 8.0 / 1.2;
            match ch.offer(now, 1514) {
                Fate::Deliver { at_ns, .. } => {
                    last = at_ns;
                    admitted += 1;
                }
                Fate::DropQueue => {}
                f => panic!("{f:?}"),
            }
        }
        assert!(ch.backlog().0 > 9000, "queue should be near full");
        assert!(
            admitted < 100_000,
            "some frames must be dropped by the queue"
        );
        // Back to back from t=0: the last admitted frame leaves exactly when all admitted bits
        // have been sent at 1 Gbit/s.
        assert!((last - admitted as f64 * 1514.0 * 8.0).abs() < 1.0);
    }

    #[test]
    fn drop_tail_by_packets_and_bytes() {
        let mut ch = channel("[both]\nrate='1Mbit'\nqueue='3p'\n");
        let fates: Vec<_> = (0..5).map(|_| ch.offer(0.0, 100)).collect();
        assert_eq!(
            fates
                .iter()
                .filter(|f| matches!(f, Fate::DropQueue))
                .count(),
            2
        );
        let mut ch = channel("[both]\nrate='1Mbit'\nqueue='2500B'\n");
        let fates: Vec<_> = (0..4).map(|_| ch.offer(0.0, 1000)).collect();
        assert!(matches!(fates[2], Fate::DropQueue) && matches!(fates[3], Fate::DropQueue));
        assert!(matches!(fates[1], Fate::Deliver { queue_ns, .. } if (queue_ns - 8e6).abs() < 1.0));
    }

    #[test]
    fn rate_trace_integrates_across_steps() {
        let mut ch = channel("[both]\nrate='8Mbit'\n");
        ch.cfg.rate = RateSource::Trace(
            Trace::parse(
                "0 8Mbit\n0.0005 4Mbit\n",
                Interp::Step,
                crate::units::parse_rate,
            )
            .unwrap(),
        );
        // 1000 bytes: 0.5 ms at 8 Mbit/s carries 4000 bits, the other 4000 at 4 Mbit/s take 1 ms.
        assert!((at(ch.offer(0.0, 1000)) - 1.5e6).abs() < 1e-3);
    }

    #[test]
    fn delay_trace_applies_at_departure() {
        let mut ch = channel("[both]\nrate='1Gbit'\n");
        ch.cfg.delay = DelaySource::Trace(
            Trace::parse("0 10ms\n1 20ms\n", Interp::Linear, |s| {
                crate::units::parse_duration_ns(s).map(|v| v as f64)
            })
            .unwrap(),
        );
        let d = at(ch.offer(0.5e9, 125)) - 0.5e9 - 1000.0;
        // Delay is read when the last bit leaves (t = 0.5 s + 1 µs): 15 ms + 10 ns.
        assert!((d - 15.00001e6).abs() < 1.0, "{d}");
    }

    #[test]
    fn outage_drops_frames_in_the_air() {
        let mut ch = channel("[both]\nrate='8Mbit'\n[outage]\ndown=['1s..2s']\n");
        assert!(matches!(ch.offer(0.5e9, 1000), Fate::Deliver { .. }));
        assert!(matches!(ch.offer(1.5e9, 1000), Fate::DropOutage { .. }));
        // Straddling the start of the outage is lost too.
        assert!(matches!(ch.offer(0.9995e9, 1000), Fate::DropOutage { .. }));
        assert!(matches!(ch.offer(2.0e9, 1000), Fate::Deliver { .. }));
    }

    #[test]
    fn jitter_never_reorders_unless_asked() {
        let run = |reorder: bool| {
            let mut ch = channel(&format!(
                "[both]\nrate='100Mbit'\ndelay='50ms'\njitter='5ms'\nreorder={reorder}\n"
            ));
            let ats: Vec<f64> = (0..2000)
                .map(|i| at(ch.offer(i as f64 * 1e5, 500)))
                .collect();
            let inversions = ats.windows(2).filter(|w| w[1] < w[0]).count();
            let (lo, hi) = ats
                .iter()
                .enumerate()
                .map(|(i, a)| a - i as f64 * 1e5)
                .fold((f64::MAX, f64::MIN), |(l, h), d| (l.min(d), h.max(d)));
            (inversions, lo, hi)
        };
        let (inv, lo, hi) = run(false);
        assert_eq!(inv, 0);
        assert!(lo >= 45e6 && hi <= 55.1e6, "{lo} {hi}");
        let (inv, lo, _) = run(true);
        assert!(inv > 100, "{inv}");
        assert!(lo < 45.5e6);
    }

    #[test]
    fn ber_loss_is_seeded() {
        let pattern = |seed: u64| {
            let mut ch = channel(&format!("seed={seed}\n[both]\nrate='1Gbit'\nber=1e-5\n"));
            (0..5000)
                .map(|i| matches!(ch.offer(i as f64 * 2e4, 1500), Fate::DropError { .. }))
                .collect::<Vec<_>>()
        };
        let a = pattern(5);
        assert_eq!(a, pattern(5));
        assert_ne!(a, pattern(6));
        let lost = a.iter().filter(|&&x| x).count() as f64 / 5000.0;
        // PER = 1-(1-1e-5)^12000 ≈ 0.113.
        assert!((lost - 0.113).abs() < 0.02, "{lost}");
    }
}
