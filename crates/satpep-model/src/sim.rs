//! A packet-level simulation of one sender on one bottleneck, for the model's tests and for
//! hosts' tests that compare their adapter with the kernel's semantics.
//!
//! The link is a FIFO with a rate that may change over time, a drop-tail buffer (bytes), a
//! propagation delay and random loss (a frame lost on the link still used it). ACKs return
//! one per packet on an uncongested path. A [`Host`] turns what the sender sees into calls
//! of the model; [`KernelHost`] does what `satpep_sat.bpf.c` and the kernel do (the rate
//! sample of `net/ipv4/tcp_rate.c`, losses found when a later packet is acknowledged).

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
}

struct InFlight {
    sent_us: u64,
    arrive: f64,
    lost: bool,
    index: usize,
}

/// Runs `host` for `secs` over `link(t)`, sending MTU-sized packets of `mss` payload bytes
/// whenever the window and the pacer allow; returns every packet's fate.
pub fn run(host: &mut dyn Host, link: &dyn Fn(f64) -> Link, mss: u64, secs: f64) -> Vec<Packet> {
    let mut packets = Vec::new();
    let mut flight: VecDeque<InFlight> = VecDeque::new();
    let mut in_flight_bytes = 0u64;
    let mut link_free = 0.0f64;
    let mut next_send = 0.0f64;
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
    while now < secs {
        let can_send = in_flight_bytes + mss <= host.window();
        let t_send = if can_send {
            next_send.max(now)
        } else {
            f64::INFINITY
        };
        let t_ack = flight.front().map_or(f64::INFINITY, |p| p.arrive);
        if t_send.is_infinite() && t_ack.is_infinite() {
            // Nothing in flight and no window: the host is stuck; a test says so.
            break;
        }
        if t_ack <= t_send {
            now = t_ack;
            while let Some(p) = flight.front() {
                if p.arrive > now {
                    break;
                }
                let p = flight.pop_front().unwrap();
                in_flight_bytes -= mss;
                if p.lost {
                    host.on_lost(us(now), p.sent_us, mss);
                } else {
                    packets[p.index] = Packet {
                        acked: Some(now),
                        ..packets[p.index]
                    };
                    host.on_acked(us(now), p.sent_us, mss);
                }
            }
            host.on_end_acks(us(now));
        } else {
            now = t_send;
            let l = link(now);
            let service = (mss + 66) as f64 * 8.0 / l.rate_bps;
            let start = link_free.max(now);
            let queue = start - now;
            let queued_bytes = queue * l.rate_bps / 8.0;
            host.on_sent(us(now), mss);
            let index = packets.len();
            packets.push(Packet {
                sent: now,
                acked: None,
                queue,
            });
            if queued_bytes + (mss + 66) as f64 > l.buffer {
                // Dropped at the buffer: found lost when a later packet is acknowledged,
                // about when it would have arrived.
                flight.push_back(InFlight {
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
                    sent_us: us(now),
                    arrive: link_free + l.rtt,
                    lost,
                    index,
                });
            }
            in_flight_bytes += mss;
            let pace = host.pacing_rate();
            next_send = if pace > 0 {
                now + mss as f64 / pace as f64
            } else {
                now
            };
        }
    }
    packets
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
        }
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
        };
        self.model.on_ack(&a);
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

    fn pacing_rate(&self) -> u64 {
        self.model.pacing_rate(&self.ack_now(0))
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
