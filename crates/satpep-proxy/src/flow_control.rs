//! Flow control between a split connection's legs, after Bharadwaj 1999 (001): how a
//! direction holds back a sender that is faster than the leg it feeds, so that the proxy
//! does not buffer what it cannot send.
//!
//! Each direction reads from its upstream socket (C1 in 001's Figure 6.1) and writes to its
//! downstream one (C2). Three mechanisms, each a `[proxy]` option:
//! - **Improved back-pressure** (§4.3, the default): the downstream socket holds at most [`LOWAT`]
//!   unsent beyond what its windows let it send (`TCP_NOTSENT_LOWAT`), and the relay's
//!   pipe no more, so the excess stays in C1's receive queue, whose advertised window
//!   shrinks at once. Plain back-pressure lets it fill the downstream send buffer (which
//!   the kernel grows to two to four windows) and the pipe first; the upstream socket's
//!   receive buffer then autotunes to match, and an upload held 20-200 MB per connection
//!   where improved held 10 MB (docs/proxy.md).
//! - **Drop-based flow control** (§4.2): when what the direction holds (Q1 plus the unsent
//!   bytes downstream) exceeds max(½ C1's receive window, 2 × C2's congestion window), one
//!   segment arriving on C1 is dropped unacknowledged, and no other until its
//!   retransmission has arrived (`satpep_cc::flow_drop`): the sender halves its window
//!   instead of running into a zero window.
//! - **Buffer sizing** (ch. 6): every two upstream round trips, C1's receive buffer B1 (its
//!   window with nothing queued) is set from C2's state by the four cases of §6.3
//!   ([`Sizing`]).

use crate::config::FlowControl;
use crate::sockets::{buffer_size, set_buffer, Buffer};
use crate::tcpinfo::{self, FlowInfo};
use satpep_cc::flow_drop::{DropFilter, DropSlot};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The low-water mark of improved back-pressure: unsent bytes a socket may hold, and the
/// pipe's size (`proxy.buffer`'s default, so only the socket's unsent bytes change). At
/// 64 KiB the relay woke every 0.5 ms at 1 Gbit/s and split lost 13 % there (829 against 950
/// Mbit/s on this 2-core machine, `lab run throughput --only emulated`); at 256 KiB, 943
/// against 952.
pub const LOWAT: u32 = 256 << 10;

/// Smallest window buffer sizing sets: a few segments always flow.
const MIN_B1: u64 = 32 << 10;
/// Largest: the receive buffers the kernel autotunes to at most here.
const MAX_B1: u64 = 32 << 20;
/// How often a direction reads its sockets for flow control (the drop rule and sizing).
const LOOK_EVERY: Duration = Duration::from_millis(1);
/// A drop whose retransmission was not seen in this long stops holding the filter.
const DROP_EXPIRY: Duration = Duration::from_secs(2);

/// Segments dropped by drop-based flow control in this process, as the relay has seen them.
static DROPS: AtomicU64 = AtomicU64::new(0);

/// The drop filter, loaded at start when `proxy.drop_flow_control` is on.
static FILTER: OnceLock<Arc<DropFilter>> = OnceLock::new();

/// Segments drop-based flow control has dropped so far.
pub fn drops_total() -> u64 {
    DROPS.load(Relaxed)
}

/// Loads the drop filter for `connections` connections (two sockets each); needs privilege,
/// so it is called before the proxy drops its own. Idempotent.
pub fn load_filter(connections: u32) -> Result<(), String> {
    if FILTER.get().is_none() {
        let f = DropFilter::load(2 * connections as usize)
            .map_err(|e| format!("proxy.drop_flow_control: {e}"))?;
        let _ = FILTER.set(f);
    }
    Ok(())
}

/// One direction's two sockets as flow control reads them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readings {
    /// Q1: bytes acknowledged on C1 and not yet handed to C2 (C1's receive queue plus the
    /// relay's pipe).
    pub q1: u64,
    /// The window C1 offers now.
    pub rcv_wnd: u64,
    /// C1's RTT as its receiving side measured it, µs (None: not yet).
    pub up_rtt_us: Option<u64>,
    /// C1's receive buffer as the kernel counts it (twice what was set).
    pub up_rcvbuf: u64,
    /// Q'2: bytes sent or queued on C2 (SIOCOUTQ).
    pub q2: u64,
    /// C2's state.
    pub down: FlowInfo,
}

impl Readings {
    /// Reads a direction: `r` its C1, `w` its C2, `piped` what the relay holds between.
    pub fn read(r: RawFd, w: RawFd, piped: u64) -> Option<Readings> {
        let up = tcpinfo::flow(r)?;
        let down = tcpinfo::flow(w)?;
        Some(Readings {
            q1: tcpinfo::queue(r, libc::FIONREAD) + piped,
            rcv_wnd: up.rcv_wnd.unwrap_or(up.rcv_space),
            up_rtt_us: up.rcv_rtt_us,
            up_rcvbuf: buffer_size(r, Buffer::Receive),
            q2: tcpinfo::queue(w, libc::TIOCOUTQ),
            down,
        })
    }

    /// What the direction holds for its downstream leg beyond what that leg has sent.
    pub fn backlog(&self) -> u64 {
        self.q1 + self.down.notsent
    }

    /// 001 §4.2's threshold: the larger of half C1's receive window (as offered with
    /// nothing queued) and twice C2's congestion window.
    pub fn drop_threshold(&self) -> u64 {
        ((self.rcv_wnd + self.q1) / 2).max(2 * self.down.cwnd_bytes)
    }
}

/// 001 ch. 6's buffer sizing of one direction's C1. Its four state variables: `since` (τ),
/// `q1`, `t1_us` (the bound on C1's RTT), `q2`; the text's step 3 reads "q2 = 0" both as
/// "the bottleneck is upstream" and as the state after any step with a queue, which would
/// stop the algorithm after its first reduction (REFERENCE.md: "the literal text never
/// adjusts B1"). Here q2 is what case 4 left (None otherwise), and the bottleneck is upstream
/// once a raise of B1 was followed by no more data in flight downstream.
#[derive(Debug, Clone, Default)]
pub struct Sizing {
    /// B1: the window C1 may offer, bytes (None until the first step).
    pub b1: Option<u64>,
    /// The bound on τ1, µs.
    pub t1_us: u64,
    since: Option<Instant>,
    /// Q'2 when case 4 last raised B1.
    raised_at: Option<u64>,
    /// A raise did not fill C2: the bottleneck is upstream; no more raises until C1 queues.
    upstream_bound: bool,
    /// A step has set B1.
    stepped: bool,
}

/// Which of 001 §6.3's cases a step found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// No queue at the proxy, C2 uses its whole window: nothing to change.
    Balanced,
    /// A queue, C2 limited by its peer's window: B1 shrinks to what is free.
    PeerLimited,
    /// A queue, C2 limited by its congestion window: B1 to twice the threshold, scaled.
    CwndLimited,
    /// No queue, C2 below its window: B1 too small, or the bottleneck is upstream.
    Starved,
}

impl Sizing {
    /// Called as data arrives on C1 (001 §6.4 step 5); returns the new B1 when a step
    /// changed it.
    pub fn on_data(&mut self, now: Instant, r: &Readings) -> Option<(Case, u64)> {
        // Step 2: nothing until the proxy first queues.
        if self.since.is_none() && r.q1 == 0 {
            return None;
        }
        if let Some(t) = self.since {
            if now < t + Duration::from_micros(2 * self.t1_us) {
                return None;
            }
        }
        self.since = Some(now);
        // Until a step sets it, B1 is the buffer the kernel gives C1, read afresh (its
        // autotuning may grow it): half of it, since the kernel doubles what it is told, is
        // about the window it offers with nothing queued.
        let set = self.stepped;
        if !set {
            self.b1 = Some((r.rcv_wnd + r.q1).max(r.up_rcvbuf / 2));
        }
        let b1 = self.b1.unwrap_or_default();
        if r.q1 > 0 {
            self.upstream_bound = false;
        }
        let d = &r.down;
        let tau2 = d.srtt_us.max(1);
        let r1 = b1.saturating_sub(r.q1);
        // Step 3: an idle leg, a reduction not yet felt (a window closed before the first
        // step is a full buffer, not one), or a bottleneck upstream.
        if r.q2 == 0 || (r1 == 0 && set) || (r.q1 == 0 && self.upstream_bound) {
            return None;
        }
        let window = d.snd_wnd.min(d.cwnd_bytes).max(1);
        let full = r.q2 + 2 * d.mss >= window;
        let (case, b, t1) = if r.q1 == 0 && full {
            // Case 1: nothing to change.
            self.raised_at = None;
            return None;
        } else if r.q1 > 0 && d.snd_wnd < d.cwnd_bytes {
            // Case 2: at most R1 left in the last τ1; τ1 <= R1 / S2 x τ2.
            let t1 = r1 * tau2 / d.snd_wnd.max(1);
            (Case::PeerLimited, r1, t1)
        } else if r.q1 > 0 {
            // Case 3: R1 >= (W2 - l τ1 / 2τ2) τ1 / τ2, with the last bound for τ1 in the
            // negative term; then b / τ1 = 2T / τ2 with T the last slow-start threshold.
            let slope = d.mss * self.t1_us.max(1) / (2 * tau2);
            let t1 = r1 * tau2 / d.cwnd_bytes.saturating_sub(slope).max(d.mss);
            // b from the final τ1, below.
            (Case::CwndLimited, 0, t1)
        } else {
            // Case 4: τ1 <= B1 / Q'2 x τ2; b = B1 x S2 / Q'2 (at most x4 a step).
            if self.raised_at.is_some_and(|q| r.q2 <= q) {
                self.upstream_bound = true;
                self.raised_at = None;
                return None;
            }
            self.raised_at = Some(r.q2);
            let t1 = b1 * tau2 / r.q2;
            (Case::Starved, (b1 * window / r.q2).min(4 * b1), t1)
        };
        if case != Case::Starved {
            self.raised_at = None;
        }
        // 1999's receivers had no estimate of τ1, hence the bounds; Linux's receiver measures
        // one (tcpi_rcv_rtt). A bound far above it leaves B1 large: at a gateway fed over a
        // 1 ms LAN toward a 500 ms hop, case 3's bound from R1 kept B1 at twice what was free
        // and the proxy held 4.5 MB. So τ1 is the smaller of the two.
        let t1 = r.up_rtt_us.map_or(t1, |m| t1.min(m.max(1)));
        let b = if case == Case::CwndLimited {
            let t = d.ssthresh_bytes.unwrap_or(d.cwnd_bytes);
            2 * t * t1 / tau2
        } else {
            b
        };
        self.t1_us = t1.clamp(1_000, 10_000_000);
        let b = b.clamp(MIN_B1, MAX_B1);
        self.b1 = Some(b);
        self.stepped = true;
        Some((case, b))
    }
}

/// What a relay direction does for flow control: its settings, its socket's drop slot and
/// its buffer sizing.
pub struct Regulator {
    cfg: FlowControl,
    slot: Option<DropSlot>,
    sizing: Sizing,
    next_look: Instant,
    /// Drops counted into [`DROPS`] so far.
    counted: u64,
    /// B1 as last set on C1.
    pub b1: Option<u64>,
    /// B1 as the algorithm last set it, while C1's buffer is not there yet.
    want: Option<u64>,
}

impl Regulator {
    /// A direction reading from `r`: attaches the drop filter ([`load_filter`]) to it when
    /// drop-based flow control is on (no slot, no drops: the filter is full or could not
    /// attach).
    pub fn new(cfg: FlowControl, r: &impl AsFd) -> Regulator {
        let slot = FILTER.get().filter(|_| cfg.drop).and_then(|f| {
            f.attach(r.as_fd()).ok()?;
            f.claim(tcpinfo::cookie(r.as_fd().as_raw_fd())?)
        });
        Regulator {
            cfg,
            slot,
            sizing: Sizing::default(),
            next_look: Instant::now(),
            counted: 0,
            b1: None,
            want: None,
        }
    }

    /// The pipe a direction may hold: [`LOWAT`] with improved back-pressure.
    pub fn pipe_len(&self, configured: usize) -> usize {
        if self.cfg.improved {
            configured.min(LOWAT as usize)
        } else {
            configured
        }
    }

    /// Data arrived on `r` (C1) for `w` (C2), with `piped` bytes held between.
    pub fn on_data(&mut self, r: RawFd, w: RawFd, piped: u64) {
        if self.slot.is_none() && !self.cfg.sizing {
            return;
        }
        let now = Instant::now();
        if now < self.next_look {
            return;
        }
        self.next_look = now + LOOK_EVERY;
        let Some(readings) = Readings::read(r, w, piped) else {
            return;
        };
        if let Some(slot) = &self.slot {
            let drops = slot.drops();
            DROPS.fetch_add(drops - self.counted, Relaxed);
            self.counted = drops;
            slot.expire(DROP_EXPIRY);
            if readings.backlog() > readings.drop_threshold() {
                slot.arm();
            } else {
                slot.disarm();
            }
        }
        if self.cfg.sizing {
            let step = self.sizing.on_data(now, &readings);
            if let Some((_, b)) = step {
                self.want = Some(b);
            }
            // B1 as the algorithm set it, applied as far as it safely can be now, and again
            // at each look until it is: never below what is queued plus what may still be
            // on its way, since a kernel socket cannot take back a window it offered and
            // drops what arrives past its buffer (a terminal's satellite leg cut from 7 MB
            // to 64 KB under a slow reader made the gateway retransmit 343 segments of
            // 2 200). A closed window has nothing on its way: then the buffer may go below
            // what is queued, and the window stays closed until the queue is under it
            // (applied once at a moment the window was open, a LAN sender kept it full and
            // B1 never came down).
            if let Some(want) = self.want {
                // What may still be on its way: at most the window last offered (an
                // estimate from C1's inflow rate and RTT fell short when a window opened
                // on a long path: 705 retransmissions in a 16 MB transfer).
                let floor = if readings.rcv_wnd > 0 {
                    readings.q1 + readings.rcv_wnd
                } else {
                    0
                };
                // Raised at once; lowered only as far as is safe, and never raised by the
                // floor (that would let the queue grow into what it freed).
                let current = self.b1.unwrap_or(readings.up_rcvbuf / 2);
                let b = if want >= current {
                    want
                } else {
                    want.max(floor)
                };
                if (b < current || want > current) && set_receive_buffer(r, b).is_ok() {
                    self.b1 = Some(b);
                }
                if self.b1 == Some(want) {
                    self.want = None;
                }
            }
        }
    }
}

/// Sets C1's receive buffer to offer about `b` with nothing queued, less what is queued (001's
/// B1, R1 = B1 - Q1). The kernel doubles SO_RCVBUF for its overhead and offers about half to
/// three quarters of its buffer as window. A window clamp (TCP_WINDOW_CLAMP) would not do:
/// it caps the window beyond what is queued, so a LAN sender kept 4 MB queued at a gateway
/// under a 32 KB clamp. Setting it stops the kernel's autotuning of this socket's buffer,
/// which sizing replaces. Forced past net.core.rmem_max (the proxy keeps CAP_NET_ADMIN).
fn set_receive_buffer(fd: RawFd, b: u64) -> std::io::Result<()> {
    set_buffer(fd, Buffer::Receive, b.min(i32::MAX as u64 / 2) as usize)
}

/// Improved back-pressure on a socket: its low-water mark, unless its leg set one.
pub fn hold_unsent(fd: RawFd) {
    let (tcp, lowat) = (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT);
    if crate::sockets::getopt_int(fd, tcp, lowat) == Some(0) {
        let _ = crate::sockets::setopt_int(fd, tcp, lowat, LOWAT as i32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readings(q1: u64, q2: u64, snd_wnd: u64, cwnd: u64) -> Readings {
        Readings {
            q1,
            rcv_wnd: 1 << 20,
            up_rtt_us: None,
            up_rcvbuf: 0,
            q2,
            down: FlowInfo {
                cwnd_bytes: cwnd,
                ssthresh_bytes: Some(cwnd / 2),
                snd_wnd,
                rcv_wnd: None,
                rcv_space: 0,
                notsent: 0,
                srtt_us: 500_000,
                rcv_rtt_us: None,
                mss: 1448,
            },
        }
    }

    #[test]
    fn the_drop_threshold_is_the_larger_of_half_the_window_and_twice_the_cwnd() {
        let r = readings(0, 0, 1 << 30, 100 << 10);
        assert_eq!(r.drop_threshold(), 1 << 19);
        let r = readings(0, 0, 1 << 30, 1 << 20);
        assert_eq!(r.drop_threshold(), 2 << 20);
        // Q1 counts back into the window it took: the threshold does not fall as it fills.
        let mut r = readings(256 << 10, 0, 1 << 30, 100 << 10);
        r.rcv_wnd = (1 << 20) - (256 << 10);
        assert_eq!(r.drop_threshold(), 1 << 19);
    }

    #[test]
    fn buffer_sizing_follows_the_four_cases() {
        let t0 = Instant::now();
        let mut s = Sizing::default();
        // Step 2: nothing before the proxy queues.
        assert_eq!(
            s.on_data(t0, &readings(0, 100 << 10, 1 << 20, 1 << 20)),
            None
        );
        // Case 2: a queue of 256 KiB, C2 held by its peer's 512 KiB window: B1 to R1.
        let (c, b) = s
            .on_data(t0, &readings(256 << 10, 512 << 10, 512 << 10, 1 << 20))
            .unwrap();
        assert_eq!(
            (c, b),
            (Case::PeerLimited, (1 << 20) + (256 << 10) - (256 << 10))
        );
        // τ1 <= R1 / S2 x τ2 = 2 x 0.5 s; nothing again for 2 τ1.
        assert_eq!(s.t1_us, 1_000_000);
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(
            s.on_data(later, &readings(1, 512 << 10, 512 << 10, 1 << 20)),
            None
        );
        // Case 3: a queue, C2 held by its 1 MiB congestion window (threshold 512 KiB).
        let t = t0 + Duration::from_secs(3);
        let (c, b) = s
            .on_data(t, &readings(64 << 10, 1 << 20, 4 << 20, 1 << 20))
            .unwrap();
        assert_eq!(c, Case::CwndLimited);
        let t1 = s.t1_us;
        assert!(t1 > 0 && t1 < 1_000_000, "τ1 bound {t1}");
        assert_eq!(b, (2 * (512u64 << 10) * t1 / 500_000).clamp(MIN_B1, MAX_B1));
        // Case 4: no queue and C2 sends less than its window: B1 grows (x4 at most) ...
        let b_before = s.b1.unwrap();
        let t = t + Duration::from_secs(30);
        let (c, b) = s
            .on_data(t, &readings(0, 100 << 10, 4 << 20, 1 << 20))
            .unwrap();
        assert_eq!(c, Case::Starved);
        assert_eq!(b, (b_before * 4).clamp(MIN_B1, MAX_B1));
        // ... and if that brought no more data downstream, the bottleneck is upstream: no
        // further raise until the proxy queues again.
        let t = t + Duration::from_secs(60);
        assert_eq!(
            s.on_data(t, &readings(0, 100 << 10, 4 << 20, 1 << 20)),
            None
        );
        let t = t + Duration::from_secs(60);
        assert_eq!(s.on_data(t, &readings(0, 90 << 10, 4 << 20, 1 << 20)), None);
        // Case 1: no queue, C2 full: nothing to change.
        let t = t + Duration::from_secs(60);
        assert_eq!(s.on_data(t, &readings(0, 1 << 20, 4 << 20, 1 << 20)), None);
    }

    #[test]
    fn a_full_buffer_before_the_first_step_is_no_reduction_in_progress() {
        // An HTTP reply's head queues while the far leg is idle (step 3 skips), then the
        // body fills the buffer and closes the window: R1 = 0, but nothing was reduced yet.
        let t0 = Instant::now();
        let mut s = Sizing::default();
        let mut head = readings(82, 0, 2 << 20, 64 << 10);
        head.rcv_wnd = 2 << 20;
        assert_eq!(s.on_data(t0, &head), None);
        let mut full = readings(4 << 20, 500 << 10, 2 << 20, 1 << 20);
        full.rcv_wnd = 0;
        let t = t0 + Duration::from_millis(5);
        assert!(s.on_data(t, &full).is_some(), "no step with a full buffer");
    }

    #[test]
    fn a_measured_upstream_rtt_below_the_bound_sizes_the_window_by_it() {
        // A gateway fed over a 2 ms LAN toward a 500 ms hop, its satellite leg cwnd-limited:
        // B1 carries twice the threshold per 2 ms, not what the loose bound from R1 allows.
        let mut r = readings(64 << 10, 1 << 20, 4 << 20, 1 << 20);
        r.up_rtt_us = Some(2_000);
        let (c, b) = Sizing::default().on_data(Instant::now(), &r).unwrap();
        assert_eq!(c, Case::CwndLimited);
        assert_eq!(b, (2 * (512u64 << 10) * 2_000 / 500_000).max(MIN_B1));
        let unmeasured = readings(64 << 10, 1 << 20, 4 << 20, 1 << 20);
        let (_, loose) = Sizing::default()
            .on_data(Instant::now(), &unmeasured)
            .unwrap();
        assert!(loose > 10 * b, "{loose} against {b}");
    }
}
