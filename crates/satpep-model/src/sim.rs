//! A packet-level simulation of senders on one bottleneck, for the model's tests and for
//! hosts' tests that compare their adapter with the kernel's semantics.
//!
//! The link is a FIFO with a rate that may change over time, a drop-tail buffer (bytes), a
//! propagation delay and random loss (a frame lost on the link still used it). ACKs return
//! one per packet on an uncongested path. A [`Host`] turns what the sender sees into calls
//! of the model; [`KernelHost`] does what `satpep_sat.bpf.c` and the kernel do (the rate
//! sample of `net/ipv4/tcp_rate.c`, losses found when a later packet is acknowledged);
//! [`Cubic`] is the loss-based download that may share the bottleneck with it.

use crate::{Ack, Model};
use std::collections::VecDeque;

/// The link at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Bottleneck rate, bits/s.
    pub rate_bps: f64,
    /// Base RTT (propagation both ways), seconds.
    pub rtt: f64,
    /// Bottleneck buffer, bytes.
    pub buffer: f64,
    /// Probability that a frame is lost on the link.
    pub loss: f64,
    /// Mean length of a burst of losses, frames (Gilbert-Elliott; 1: independent losses).
    pub burst: f64,
}

impl Link {
    /// A link that stays as it is: `buffer_s` seconds of the rate, independent losses.
    pub fn steady(rate_bps: f64, rtt: f64, buffer_s: f64, loss: f64) -> Link {
        Link {
            rate_bps,
            rtt,
            buffer: rate_bps / 8.0 * buffer_s,
            loss,
            burst: 1.0,
        }
    }
}

/// One packet's fate, for the tests' measurements.
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    /// When it was sent, s.
    pub sent: f64,
    /// When its ACK arrived (None: lost).
    pub acked: Option<f64>,
    /// The queueing delay it met, s.
    pub queue: f64,
}

/// What a sender does with what it sees; the simulation asks it for a window and a pacing
/// rate before each send.
pub trait Host {
    /// A packet of `bytes` leaves at `now_us`.
    fn on_sent(&mut self, now_us: u64, bytes: u64);
    /// The packet sent at `sent_us` is acknowledged at `now_us` (ACKs come in send order).
    fn on_acked(&mut self, now_us: u64, sent_us: u64, bytes: u64);
    /// The packet sent at `sent_us` is found lost at `now_us`.
    fn on_lost(&mut self, now_us: u64, sent_us: u64, bytes: u64);
    /// All ACKs of this moment are in.
    fn on_end_acks(&mut self, now_us: u64);
    /// Bytes allowed in flight.
    fn window(&self) -> u64;
    /// Pacing rate, bytes/s (0: unpaced).
    fn pacing_rate(&self) -> u64;
    /// When it begins to send, s (a competitor that arrives later).
    fn starts_at(&self) -> f64 {
        0.0
    }
    /// The handshake's RTT, measured before the first data (the SYN's: the kernel seeds
    /// its smoothed and least RTT with it).
    fn on_handshake(&mut self, _rtt_us: u64) {}
}

struct InFlight {
    flow: usize,
    sent_us: u64,
    arrive: f64,
    lost: bool,
    index: usize,
}

/// Runs `host` for `secs` over `link(t)`, sending MTU-sized packets of `mss` payload bytes
/// whenever the window and the pacer allow; returns every packet's fate.
pub fn run(host: &mut dyn Host, link: &dyn Fn(f64) -> Link, mss: u64, secs: f64) -> Vec<Packet> {
    run_shared(&mut [host], link, mss, secs).remove(0)
}

/// Runs several senders through the one bottleneck (one FIFO, one buffer, one channel), each
/// with its own window, pacer and ACKs: a competing download beside the model. Returns each
/// host's packets.
pub fn run_shared(
    hosts: &mut [&mut dyn Host],
    link: &dyn Fn(f64) -> Link,
    mss: u64,
    secs: f64,
) -> Vec<Vec<Packet>> {
    let n = hosts.len();
    let mut packets: Vec<Vec<Packet>> = vec![Vec::new(); n];
    // One queue of arrivals for all: the bottleneck is a FIFO and the path is shared, so
    // packets (and drops, dated when a later packet would show them) arrive in send order.
    let mut flight: VecDeque<InFlight> = VecDeque::new();
    let mut in_flight_bytes = vec![0u64; n];
    let mut next_send = vec![0.0f64; n];
    // Which hosts the ACKs of one moment reached (kept across moments: this loop is hot).
    let mut touched = vec![false; n];
    let mut link_free = 0.0f64;
    let mut now = 0.0f64;
    // A deterministic generator: the tests must not depend on a seed's luck.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let us = |t: f64| (t * 1e6).round() as u64;
    // Gilbert-Elliott: every frame in the bad state is lost.
    let mut bad = false;
    for h in hosts.iter_mut() {
        let t = h.starts_at();
        h.on_handshake(us(link(t).rtt));
    }
    while now < secs {
        // The sender that may send first (the lowest index on a tie).
        let (flow, t_send) = (0..n)
            .map(|i| {
                let can_send = in_flight_bytes[i] + mss <= hosts[i].window();
                (
                    i,
                    if can_send {
                        next_send[i].max(now).max(hosts[i].starts_at())
                    } else {
                        f64::INFINITY
                    },
                )
            })
            .fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
        let t_ack = flight.front().map_or(f64::INFINITY, |p| p.arrive);
        if t_send.is_infinite() && t_ack.is_infinite() {
            // Nothing in flight and no window: the hosts are stuck; a test says so.
            break;
        }
        if t_ack <= t_send {
            now = t_ack;
            touched.fill(false);
            while let Some(p) = flight.front() {
                if p.arrive > now {
                    break;
                }
                let p = flight.pop_front().unwrap();
                let h = &mut hosts[p.flow];
                touched[p.flow] = true;
                in_flight_bytes[p.flow] -= mss;
                if p.lost {
                    h.on_lost(us(now), p.sent_us, mss);
                } else {
                    packets[p.flow][p.index].acked = Some(now);
                    h.on_acked(us(now), p.sent_us, mss);
                }
            }
            for (h, _) in hosts.iter_mut().zip(&touched).filter(|(_, t)| **t) {
                h.on_end_acks(us(now));
            }
        } else {
            now = t_send;
            let l = link(now);
            let service = (mss + 66) as f64 * 8.0 / l.rate_bps;
            let start = link_free.max(now);
            let queue = start - now;
            let queued_bytes = queue * l.rate_bps / 8.0;
            let h = &mut hosts[flow];
            h.on_sent(us(now), mss);
            let index = packets[flow].len();
            packets[flow].push(Packet {
                sent: now,
                acked: None,
                queue,
            });
            if queued_bytes + (mss + 66) as f64 > l.buffer {
                // Dropped at the buffer: found lost when a later packet is acknowledged,
                // about when it would have arrived.
                flight.push_back(InFlight {
                    flow,
                    sent_us: us(now),
                    arrive: start + l.rtt,
                    lost: true,
                    index,
                });
            } else {
                link_free = start + service;
                let lost = if l.burst <= 1.0 {
                    uniform() < l.loss
                } else {
                    let leave = 1.0 / l.burst;
                    let enter = l.loss * leave / (1.0 - l.loss).max(1e-9);
                    bad = if bad {
                        uniform() >= leave
                    } else {
                        uniform() < enter
                    };
                    bad
                };
                flight.push_back(InFlight {
                    flow,
                    sent_us: us(now),
                    arrive: link_free + l.rtt,
                    lost,
                    index,
                });
            }
            in_flight_bytes[flow] += mss;
            let pace = h.pacing_rate();
            next_send[flow] = if pace > 0 {
                now + mss as f64 / pace as f64
            } else {
                now
            };
        }
    }
    packets
}

/// A plain CUBIC sender as Linux runs it by default (RFC 9438: β 0.7, C 0.4, the
/// Reno-friendly region, slow start from ten segments; no HyStart, no pacing): the
/// loss-based download a satellite user runs beside the PEP.
#[derive(Debug, Clone)]
pub struct Cubic {
    mss: u64,
    /// Window, segments.
    cwnd: f64,
    ssthresh: f64,
    w_max: f64,
    /// Reno's window over the same epoch, segments (the friendly region).
    w_est: f64,
    /// The epoch began (the first ACK after a back-off), s.
    epoch: Option<f64>,
    k: f64,
    min_rtt: f64,
    /// Losses of packets sent before this belong to the back-off already made.
    recover_until_us: u64,
    last_sent_us: u64,
    start: f64,
}

impl Cubic {
    /// A new connection of `mss`-byte segments.
    pub fn new(mss: u64) -> Cubic {
        Cubic {
            mss,
            cwnd: 10.0,
            ssthresh: f64::INFINITY,
            w_max: 0.0,
            w_est: 0.0,
            epoch: None,
            k: 0.0,
            min_rtt: f64::INFINITY,
            recover_until_us: 0,
            last_sent_us: 0,
            start: 0.0,
        }
    }

    /// The same sender, starting `secs` into the run.
    pub fn starting_at(mut self, secs: f64) -> Cubic {
        self.start = secs;
        self
    }
}

impl Host for Cubic {
    fn on_sent(&mut self, now_us: u64, _bytes: u64) {
        self.last_sent_us = now_us;
    }

    fn on_acked(&mut self, now_us: u64, sent_us: u64, _bytes: u64) {
        const C: f64 = 0.4;
        const BETA: f64 = 0.7;
        let now = now_us as f64 * 1e-6;
        self.min_rtt = self.min_rtt.min((now_us - sent_us) as f64 * 1e-6);
        if self.cwnd < self.ssthresh {
            self.cwnd += 1.0;
            return;
        }
        let epoch = *self.epoch.get_or_insert_with(|| {
            self.w_est = self.cwnd;
            self.k = if self.w_max > self.cwnd {
                ((self.w_max - self.cwnd) / C).cbrt()
            } else {
                0.0
            };
            if self.w_max < self.cwnd {
                self.w_max = self.cwnd;
            }
            now
        });
        let t = now - epoch + self.min_rtt;
        let target = C * (t - self.k).powi(3) + self.w_max;
        self.w_est += 3.0 * (1.0 - BETA) / (1.0 + BETA) / self.cwnd;
        let cubic = if target > self.cwnd {
            self.cwnd + (target - self.cwnd).min(self.cwnd / 2.0) / self.cwnd
        } else {
            self.cwnd + 0.01 / self.cwnd
        };
        self.cwnd = cubic.max(self.w_est);
    }

    fn on_lost(&mut self, _now_us: u64, sent_us: u64, _bytes: u64) {
        if sent_us < self.recover_until_us {
            return;
        }
        self.recover_until_us = self.last_sent_us + 1;
        // Fast convergence: a flow whose peak fell leaves room for a newcomer.
        self.w_max = if self.cwnd < self.w_max {
            self.cwnd * (1.0 + 0.7) / 2.0
        } else {
            self.cwnd
        };
        self.cwnd = (self.cwnd * 0.7).max(2.0);
        self.ssthresh = self.cwnd;
        self.epoch = None;
    }

    fn on_end_acks(&mut self, _now_us: u64) {}

    fn window(&self) -> u64 {
        self.cwnd as u64 * self.mss
    }

    fn pacing_rate(&self) -> u64 {
        0
    }

    fn starts_at(&self) -> f64 {
        self.start
    }
}

/// The kernel's side of `satpep_sat`: per-packet delivery bookkeeping (`tcp_rate.c`), one
/// ACK per packet, losses reported with the next ACK, the window in segments.
pub struct KernelHost {
    /// The model, as the BPF controller holds it.
    pub model: Model,
    mss: u32,
    delivered: u32,
    delivered_us: u64,
    first_tx_us: u64,
    srtt_us: u32,
    min_rtt_us: u32,
    in_flight: u32,
    /// Per packet in flight: (sent, delivered at send, delivered time at send, first tx at send).
    sent: VecDeque<(u64, u32, u64, u64)>,
    losses: u32,
    /// Data segments sent so far (the kernel's `data_segs_out`).
    segs_out: u32,
    /// A split hub gateway's pacing ceilings, in time order: (from µs, share bytes/s, times
    /// it freed carrier), which the BPF controller reads from `sk_max_pacing_rate`.
    pub ceiling: Vec<(u64, u32, u8)>,
}

impl KernelHost {
    /// A new connection of `mss`-byte segments.
    pub fn new(mss: u32) -> KernelHost {
        let a = Ack {
            mss,
            ..Ack::default()
        };
        KernelHost {
            model: Model::new(&a, 10, u32::MAX / 2),
            mss,
            delivered: 0,
            delivered_us: 0,
            first_tx_us: 0,
            srtt_us: 0,
            min_rtt_us: u32::MAX,
            in_flight: 0,
            sent: VecDeque::new(),
            losses: 0,
            segs_out: 0,
            ceiling: Vec::new(),
        }
    }

    /// The pacing ceiling at `now_us`: (share bytes/s, times it freed carrier).
    fn ceiling_at(&self, now_us: u64) -> Option<(u32, u8)> {
        let c = self.ceiling.iter().take_while(|c| c.0 <= now_us).last();
        c.map(|&(_, share, freed)| (share, freed))
    }

    /// The ACK the model gets now (smoothed RTT and segment size), for pacing and tests.
    pub fn ack_now(&self, now_us: u64) -> Ack {
        Ack {
            now_us,
            mss: self.mss,
            srtt_us: self.srtt_us,
            delivered: self.delivered,
            ..Ack::default()
        }
    }
}

impl Host for KernelHost {
    fn on_sent(&mut self, now_us: u64, _bytes: u64) {
        if self.in_flight == 0 {
            self.first_tx_us = now_us;
            self.delivered_us = now_us;
        }
        self.in_flight += 1;
        self.segs_out = self.segs_out.saturating_add(1);
        self.sent
            .push_back((now_us, self.delivered, self.delivered_us, self.first_tx_us));
    }

    fn on_acked(&mut self, now_us: u64, sent_us: u64, _bytes: u64) {
        let Some((sent, prior, prior_us, first_tx)) = self.sent.pop_front() else {
            return;
        };
        debug_assert_eq!(sent, sent_us);
        self.in_flight -= 1;
        self.delivered = self.delivered.wrapping_add(1);
        self.first_tx_us = sent;
        self.delivered_us = now_us;
        let rtt = (now_us - sent) as u32;
        self.min_rtt_us = self.min_rtt_us.min(rtt);
        self.srtt_us = if self.srtt_us == 0 {
            rtt
        } else {
            self.srtt_us - self.srtt_us / 8 + rtt / 8
        };
        let snd = sent - first_tx;
        let ack = now_us - prior_us;
        let interval = snd.max(ack) as i64;
        // tcp_rate_gen: a span shorter than the least RTT says nothing of the rate.
        let (rs_delivered, interval) = if interval < self.min_rtt_us as i64 {
            (-1, -1)
        } else {
            (self.delivered.wrapping_sub(prior) as i32, interval)
        };
        let a = Ack {
            now_us,
            mss: self.mss,
            srtt_us: self.srtt_us,
            delivered: self.delivered,
            prior_delivered: prior,
            rs_delivered,
            interval_us: interval,
            rtt_us: rtt as i32,
            acked: 1,
            losses: std::mem::take(&mut self.losses),
            app_limited: 0,
            timeout: 0,
            losses_dated: 0,
        };
        self.model.on_ack(&a);
        // satpep_sat.bpf.c's follow_carrier.
        if let Some((share, freed)) = self.ceiling_at(now_us) {
            self.model.follow_share(&a, share, freed);
        }
    }

    fn on_lost(&mut self, _now_us: u64, _sent_us: u64, _bytes: u64) {
        self.sent.pop_front();
        self.in_flight -= 1;
        self.losses += 1;
    }

    fn on_end_acks(&mut self, _now_us: u64) {}

    fn window(&self) -> u64 {
        self.model.cwnd() as u64 * self.mss as u64
    }

    fn on_handshake(&mut self, rtt_us: u64) {
        self.srtt_us = rtt_us as u32;
        self.min_rtt_us = rtt_us as u32;
    }

    fn pacing_rate(&self) -> u64 {
        // tcp_update_skb_after_send() paces only once `data_segs_out` reaches 10: a
        // connection's first ten segments leave back to back, whatever the pacing rate.
        if self.segs_out < 10 {
            return 0;
        }
        let rate = self.model.pacing_rate(&self.ack_now(0));
        match self.ceiling_at(self.delivered_us) {
            None => rate,
            Some((cap, _)) if rate == 0 => cap as u64,
            Some((cap, _)) => rate.min(cap as u64),
        }
    }
}

/// Payload bytes acknowledged per second of packets sent in `from..to` seconds.
pub fn goodput(p: &[Packet], mss: u64, from: f64, to: f64) -> f64 {
    let n = p
        .iter()
        .filter(|x| x.sent >= from && x.sent < to && x.acked.is_some())
        .count();
    n as f64 * mss as f64 / (to - from)
}

/// The 95th percentile of the queueing delay packets sent in `from..to` met, seconds.
pub fn queue_p95(p: &[Packet], from: f64, to: f64) -> f64 {
    let mut q: Vec<f64> = p
        .iter()
        .filter(|x| x.sent >= from && x.sent < to)
        .map(|x| x.queue)
        .collect();
    if q.is_empty() {
        return 0.0;
    }
    q.sort_by(f64::total_cmp);
    q[(q.len() * 95 / 100).min(q.len() - 1)]
}

/// A constant-rate UDP flow beside the model (the corpus's cross traffic): it sends at its
/// rate whatever the link does and reads no ACK.
#[derive(Debug, Clone)]
pub struct ConstantRate {
    /// Payload bytes/s (what the pacer spaces packets by).
    pace: u64,
}

impl ConstantRate {
    /// A flow of `rate_bps` bits/s on the wire, in packets of `mss` payload bytes.
    pub fn new(rate_bps: f64, mss: u64) -> ConstantRate {
        ConstantRate {
            pace: (rate_bps / 8.0 * mss as f64 / (mss + 66) as f64) as u64,
        }
    }
}

impl Host for ConstantRate {
    fn on_sent(&mut self, _now_us: u64, _bytes: u64) {}
    fn on_acked(&mut self, _now_us: u64, _sent_us: u64, _bytes: u64) {}
    fn on_lost(&mut self, _now_us: u64, _sent_us: u64, _bytes: u64) {}
    fn on_end_acks(&mut self, _now_us: u64) {}
    fn window(&self) -> u64 {
        u64::MAX / 2
    }
    fn pacing_rate(&self) -> u64 {
        self.pace
    }
}
