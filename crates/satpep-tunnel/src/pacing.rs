//! Pacing at the rate the satellite model asks for, under quinn.
//!
//! quinn paces each connection itself, at 1.25 × window ÷ RTT, but in bursts of at least ten
//! datagrams: it waits until ten are due, then sends them back to back. Across a thin link
//! with a shallow buffer (a 1 Mbit/s return link holding five frames) every such burst
//! overflows the buffer, and the model reads the losses as congestion. The kernel host paces
//! packet by packet at the model's rate (`sk_pacing_rate`); this module gives the quinn host
//! the same: [`PacedSocket`] wraps the endpoint's UDP socket and holds each peer's datagrams
//! to the rate its connection's controller sets in a [`Pace`], with bursts of about
//! [`BURST`] at that rate (two datagrams at least) and GSO batches no larger than a burst.
//! quinn's own pacer still applies; a datagram leaves when both allow it.
//!
//! A held datagram is one quinn has built: `try_send` answers `WouldBlock` and the
//! connection's poller sleeps until the peer's bucket has room again (the deadline passes
//! from `try_send` to the poller of the same task through a thread-local, as quinn calls
//! one right after the other on one thread). quinn timed its packets when it built them, so
//! the time they were held would read as queueing in every RTT sample (a GEO tunnel's start,
//! paced at 140 kB/s, left its start after two rounds on 17 ms of it): the socket reports
//! each hold in the [`Pace`] ([`Pace::take_hold`]), and the controller moves those packets'
//! send times to when they left, as the kernel times a paced packet when it leaves.

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicU8, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A peer's bucket holds this long at its rate (the kernel sends about a millisecond per
/// TSO burst; userspace timers wake a millisecond late, so twice that is kept).
pub const BURST: Duration = Duration::from_millis(2);
/// A bucket holds at least this much, so two full datagrams can always leave together.
const MIN_BURST: u64 = 2 * 1500;
/// Datagram size assumed when sizing GSO batches.
const SEGMENT: u64 = 1200;
/// Datagrams smaller than this leave unpaced: acknowledgements, mostly. A connection that
/// only receives sets the rate of its own start (twice 32 packets a round): held to it, a
/// terminal's acknowledgements of a 391 Mbit/s download left at 1 Mbit/s, and so did the
/// download. The kernel does not pace pure ACKs either.
pub const MIN_PACED: usize = 600;

/// Bytes of data datagrams that left outside a shared carrier's shares (to a peer with no
/// live pace, or none made for its address), every paced socket of the process together.
static UNSHARED: AtomicU64 = AtomicU64::new(0);

/// Bytes of data datagrams that left outside a shared carrier's shares, every paced socket
/// of the process together.
pub fn unshared_bytes_total() -> u64 {
    UNSHARED.load(Relaxed)
}

thread_local! {
    /// When the datagram `try_send` just held back may leave (see the module's comment).
    static HELD_UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Nothing was in flight at the last ACK frame (0, the default: the controller does not
/// say).
const FLIGHT_EMPTY: u8 = 1;
/// Data was in flight at the last ACK frame.
const FLIGHT_DATA: u8 = 2;

/// The rate one connection's datagrams leave at, set by its controller: bytes per second of
/// UDP payload, 0 for none (quinn's own pacing only).
#[derive(Debug, Default)]
pub struct Pace {
    rate: AtomicU64,
    /// The connection's share of a hub's carrier while it is busy, bytes/s (0: none).
    share: AtomicU64,
    /// How many times the hub had freed carrier (a terminal went quiet, its settings were
    /// reloaded) when the share was last set: a share that grew with this count grew because
    /// carrier was freed, not because others sent less for a moment.
    epoch: AtomicU64,
    /// Whether the connection had data in flight at its last ACK frame, as its controller
    /// says (0 where it does not): a terminal sending nothing with data in flight waits for
    /// its acknowledgements (a drain over a long queue) or for the peer's flow-control
    /// credit, which come with them; it is not quiet.
    flight: AtomicU8,
    /// Transmits held so far: read on every acknowledgement, without the lock.
    holds: AtomicU64,
    /// The last transmit held: how long, its length.
    hold: Mutex<(Duration, usize)>,
}

impl Pace {
    /// A pace with no rate yet.
    pub fn new() -> Arc<Pace> {
        Arc::default()
    }

    /// Datagrams to this connection's peer leave at `bytes_per_s` from now (0: unpaced).
    pub fn set(&self, bytes_per_s: u64) {
        self.rate.store(bytes_per_s, Relaxed);
    }

    /// The rate set, bytes per second (0: unpaced).
    pub fn rate(&self) -> u64 {
        self.rate.load(Relaxed)
    }

    /// The connection's share of a hub's carrier while it is busy, bytes/s; 0 otherwise.
    pub fn share(&self) -> u64 {
        self.share.load(Relaxed)
    }

    /// Whether data was in flight at the connection's last ACK frame: its controller tells
    /// (a hub reads it to tell a quiet terminal from one that waits for its peer).
    pub fn set_in_flight(&self, any: bool) {
        self.flight
            .store(if any { FLIGHT_DATA } else { FLIGHT_EMPTY }, Relaxed);
    }

    /// Whether the controller said data was in flight at the last ACK frame.
    pub(crate) fn holds_data(&self) -> bool {
        self.flight.load(Relaxed) == FLIGHT_DATA
    }

    /// How many times the hub had freed carrier when the share was last set (see the
    /// field's comment).
    pub fn share_epoch(&self) -> u64 {
        self.epoch.load(Relaxed)
    }

    /// The last transmit (a datagram or a GSO batch), `len` bytes, left after waiting
    /// `held`.
    pub(crate) fn held(&self, held: Duration, len: usize) {
        *self.hold.lock().unwrap_or_else(|e| e.into_inner()) = (held, len);
        self.holds.fetch_add(1, Release);
    }

    /// How long the last transmit held waited and its length, if it left since the one
    /// `seen` counts (which it then counts). It is the last one the connection built:
    /// quinn builds nothing more while one waits, and tells its controller of each
    /// transmit once, except its path MTU probes (the length tells them apart).
    pub fn take_hold(&self, seen: &mut u64) -> Option<(Duration, usize)> {
        let holds = self.holds.load(Acquire);
        if holds == *seen {
            return None;
        }
        *seen = holds;
        Some(*self.hold.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A peer's key: its address with an IPv4-mapped IPv6 address as plain IPv4 (quinn sends to
/// `::ffff:a.b.c.d` from a dual-stack socket, where the proxy names `a.b.c.d`).
fn key(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// When a bucket that owes `owed` bytes at `now` is back at zero at `rate` bytes/s.
fn refilled(now: Instant, owed: i64, rate: u64) -> Instant {
    let wait = owed.max(0) as u128 * 1_000_000_000 / rate.max(1) as u128;
    now + Duration::from_nanos(wait.min(u64::MAX as u128) as u64)
}

/// How far the carrier may be owed (what terminals within their own shares sent past an
/// empty bucket): a borrower waits for that to be repaid, this long at most.
const OWED_MOST: Duration = Duration::from_millis(10);

/// What `span` holds at `rate` bytes/s, bytes, [`MIN_BURST`] at least.
fn bytes_in(rate: u64, span: Duration) -> u64 {
    ((rate as u128 * span.as_nanos() / 1_000_000_000) as u64).max(MIN_BURST)
}

/// [`OWED_MOST`] at `rate` bytes/s, bytes.
fn owed_most(rate: u64) -> i64 {
    bytes_in(rate, OWED_MOST) as i64
}

fn burst(rate: u64) -> u64 {
    bytes_in(rate, BURST)
}

/// `bucket` (bytes) refilled at `rate` bytes/s for `dt_ns`, a burst of that rate at most:
/// a peer's pace, its own share and the carrier's time are all such buckets.
fn fill(bucket: i64, rate: u64, dt_ns: u128) -> i64 {
    let add = (rate as u128 * dt_ns / 1_000_000_000).min(i64::MAX as u128) as i64;
    bucket.saturating_add(add).min(burst(rate) as i64)
}

/// One paced peer: its connection's pace and its token bucket (bytes; negative after a
/// batch larger than what was in it).
#[derive(Debug)]
struct Peer {
    pace: Weak<Pace>,
    /// The pace it had before `pace`, while that connection lives: a second configuration
    /// made for the same peer (an incoming handshake that was then dropped) must not leave
    /// the live connection unpaced and outside its share.
    older: Weak<Pace>,
    tokens: i64,
    at: Instant,
    /// Since when the datagram waiting to leave has been held.
    held_since: Option<Instant>,
    /// Its share of a hub's carrier, bytes/s (0: no carrier is shared).
    cap: u64,
    /// Its settings on the carrier (its terminal's, once named).
    share: crate::hub::TerminalShare,
    /// Its terminal's name, once known (a carrier set again takes its settings anew).
    name: Option<String>,
    /// Bytes of paced datagrams sent since the shares were last computed.
    sent: u64,
    /// What it sent lately, bytes/s (smoothed over about 100 ms).
    sending: f64,
    /// When it last sent a paced datagram.
    last_data: Option<Instant>,
    /// When its share, or the carrier it borrowed beyond that share, last held a datagram
    /// back.
    capped: Option<Instant>,
    /// Its share were every busy terminal held back by its share: what it may always
    /// send, whatever the others borrowed (0: not busy).
    fair: u64,
    /// A bucket at `fair`: a datagram it pays for is the terminal's own; one sent beyond it
    /// is carrier borrowed from the others (bytes; negative: owed).
    own: i64,
    /// Whether a datagram to it left outside the carrier's sharing (said once).
    said_unshared: bool,
    /// The flows its connection carries now, if its owner counts them.
    flows: Option<Arc<AtomicU64>>,
}

impl Peer {
    fn new(pace: &Arc<Pace>, share: crate::hub::TerminalShare) -> Peer {
        Peer {
            pace: Arc::downgrade(pace),
            older: Weak::new(),
            tokens: 0,
            at: Instant::now(),
            held_since: None,
            cap: 0,
            share,
            name: None,
            sent: 0,
            sending: 0.0,
            last_data: None,
            capped: None,
            fair: 0,
            own: 0,
            said_unshared: false,
            flows: None,
        }
    }

    /// Its connection's pace: the newest one made for it, else the one before while it
    /// lives; None when both are gone.
    fn live(&self) -> Option<Arc<Pace>> {
        self.pace.upgrade().or_else(|| self.older.upgrade())
    }

    /// The rate its datagrams leave at: its controller's, within its share of the carrier.
    fn rate(&self, pace: Option<&Arc<Pace>>) -> u64 {
        match (pace.map_or(0, |p| p.rate()), self.cap) {
            (0, cap) => cap,
            (rate, 0) => rate,
            (rate, cap) => rate.min(cap),
        }
    }

    /// Whether a datagram sent now would be carrier borrowed from the others (beyond its
    /// own share, or before it has one), which they take back through the carrier's bucket
    /// (see [`Hub`]).
    fn borrows(&self) -> bool {
        self.own < 0 || self.fair == 0
    }

    /// The carrier time a datagram of `len` bytes in `segments` frames to it (at `to`)
    /// takes ([`crate::hub::carrier_cost`]), in bytes at the carrier's `rate` (its link may
    /// run slower: a faded terminal's bits take longer).
    fn carrier_time(&self, len: i64, segments: u64, to: SocketAddr, rate: u64) -> i64 {
        let frame = crate::hub::carrier_cost(len as u64, segments, !to.is_ipv4()) as i64;
        match self.share.rate {
            0 => frame,
            own => (frame as f64 * rate as f64 / own as f64).min(i64::MAX as f64 / 2.0) as i64,
        }
    }

    /// Whether its share, not its controller, sets its rate.
    fn share_binds(&self, pace: &Pace) -> bool {
        self.cap > 0 && (pace.rate() == 0 || pace.rate() >= self.cap)
    }

    /// Refills the bucket to `now`; the peer's pace and rate, if it is paced.
    fn refill(&mut self, now: Instant) -> Option<(Arc<Pace>, u64)> {
        let pace = self.live();
        let rate = self.rate(pace.as_ref());
        let dt = now.saturating_duration_since(self.at).as_nanos();
        self.at = now;
        self.own = fill(self.own, self.fair, dt);
        if rate == 0 {
            self.tokens = self.tokens.max(0);
            return None;
        }
        self.tokens = fill(self.tokens, rate, dt);
        pace.map(|p| (p, rate))
    }
}

/// The carrier a gateway shares among its peers, when the shares were last computed, and
/// the carrier's own bucket.
///
/// Shares are work-conserving: what a light terminal leaves, the busy ones borrow, and the
/// light one may still send its whole share at once (a window-limited start sends in bursts
/// an average does not show). The shares therefore sum to more than the carrier, and until
/// the next computation sees the light one send, the loan and its owner's share both leave
/// (two terminals, simulated: 17 % more than the carrier for 100 ms). The carrier's bucket
/// bounds the sum: every paced datagram takes its carrier time from it, and while it is
/// empty a terminal sending beyond its own share (a borrower) waits, so the others take
/// their shares back at once; one within its share never waits on it.
#[derive(Debug)]
struct Hub {
    carrier: crate::hub::Carrier,
    at: Instant,
    /// Carrier time in hand, bytes at the carrier's rate (negative: owed).
    tokens: i64,
    /// When `tokens` was last refilled.
    filled: Instant,
}

impl Hub {
    fn new(carrier: crate::hub::Carrier) -> Hub {
        let now = Instant::now();
        Hub {
            carrier,
            at: now,
            tokens: 0,
            filled: now,
        }
    }

    /// Refills the carrier's bucket to `now`, a burst at most.
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.filled).as_nanos();
        self.filled = now;
        self.tokens = fill(self.tokens, self.carrier.rate, dt);
    }
}

/// The paced peers and the carrier they share, under one lock: a datagram's send reads
/// both.
#[derive(Debug, Default)]
struct Peers {
    by_addr: HashMap<SocketAddr, Peer>,
    hub: Option<Hub>,
    /// Times carrier was freed: a busy terminal went quiet, or the settings changed.
    epoch: u64,
}

impl Peers {
    /// Recomputes the peers' shares if [`crate::hub::EVERY`] has passed (see [`crate::hub`]).
    fn reshare(&mut self, now: Instant) {
        use crate::hub::{allocate, Demand, QUIET, QUIET_HOLDING};
        let Peers {
            by_addr: peers,
            hub,
            epoch,
        } = self;
        let Some(h) = hub.as_mut() else {
            return;
        };
        let dt = now.saturating_duration_since(h.at);
        if dt < crate::hub::EVERY {
            return;
        }
        h.at = now;
        // Smoothed over about 100 ms.
        let gain = (dt.as_secs_f64() / 0.1).min(1.0);
        let mut busy = Vec::new();
        let mut freed = false;
        for (a, p) in peers.iter_mut() {
            let Some(pace) = p.live() else {
                continue;
            };
            let now_rate = p.sent as f64 / dt.as_secs_f64();
            p.sent = 0;
            p.sending += (now_rate - p.sending) * gain;
            // A terminal whose flows all ended has nothing to send but repairs.
            let done = p.flows.as_ref().is_some_and(|f| f.load(Relaxed) == 0);
            // One with a datagram waiting to leave (held by its share or the carrier's
            // bucket) is not quiet, however long since its last (a wait longer than
            // QUIET_HOLDING: its connection is gone).
            let waiting = p
                .held_since
                .is_some_and(|t| now.saturating_duration_since(t) < QUIET_HOLDING);
            let quiet = !waiting
                && p.last_data.is_none_or(|t| {
                    let silent = now.saturating_duration_since(t);
                    silent > QUIET && (done || !pace.holds_data() || silent > QUIET_HOLDING)
                });
            if quiet {
                p.fair = 0;
                if p.cap > 0 {
                    tracing::debug!(peer = %a, "hub: peer quiet, its share goes to the others");
                    freed = true;
                }
                // Quiet: no share; its first datagrams leave at the controller's rate.
                p.cap = 0;
                pace.share.store(0, Relaxed);
                continue;
            }
            let held = p
                .capped
                .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_millis(100));
            busy.push((
                *a,
                pace,
                Demand {
                    share: p.share,
                    sending: p.sending as u64,
                    held,
                },
            ));
        }
        if freed {
            *epoch += 1;
        }
        let d: Vec<Demand> = busy.iter().map(|(.., d)| *d).collect();
        // What each would get were all held back by their shares: a terminal sending less
        // than its share may always send that much (a window-limited start sends in bursts
        // an average of 100 ms does not show); what it leaves goes to the others until the
        // next computation.
        let all_held: Vec<Demand> = d.iter().map(|d| Demand { held: true, ..*d }).collect();
        let fair = allocate(h.carrier.rate, h.carrier.by, &all_held);
        let shares = allocate(h.carrier.rate, h.carrier.by, &d);
        for (((a, pace, _), share), fair) in busy.iter().zip(shares).zip(fair) {
            if let Some(p) = peers.get_mut(a) {
                let cap = share.max(fair).max(1);
                p.fair = fair;
                if cap.abs_diff(p.cap) > p.cap / 4 {
                    tracing::debug!(peer = %a, from = p.cap, to = cap, sending = p.sending as u64, "hub: share changed");
                }
                p.cap = cap;
                // Its controller is told its share, so it runs at a share that grew at
                // once instead of finding it by probing.
                pace.share.store(p.cap, Relaxed);
                pace.epoch.store(*epoch, Relaxed);
            }
        }
    }
}

/// What [`PacedSocket::admit`] decides for a datagram.
enum Admit {
    /// It must wait until then.
    Hold(Instant),
    /// It may leave: if paced, its peer's pace, since when it waited (if it did) and
    /// whether its own share's bucket was charged (a refusal by the socket gives it back).
    Send(Option<(Arc<Pace>, Option<Instant>, bool)>),
}

/// The endpoint's UDP socket, pacing the peers given a [`Pace`] (see the module's comment).
pub struct PacedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    peers: Mutex<Peers>,
    /// Whether a data datagram left for a peer with no pace made for its address while a
    /// carrier was shared (said once: no peer to keep the mark on).
    said_no_peer: AtomicBool,
}

impl fmt::Debug for PacedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedSocket")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl PacedSocket {
    /// Wraps `inner`; no peer is paced until [`PacedSocket::pace`] names it.
    pub fn new(inner: Arc<dyn AsyncUdpSocket>) -> Arc<PacedSocket> {
        Arc::new(PacedSocket {
            inner,
            peers: Mutex::default(),
            said_no_peer: AtomicBool::new(false),
        })
    }

    /// Shares `carrier` among the peers from now on (None: each peer at its controller's
    /// rate only; see [`crate::hub`]). A peer has the default settings until it is named.
    pub fn share_carrier(&self, carrier: Option<crate::hub::Carrier>) {
        let mut peers = self.peers();
        for p in peers.by_addr.values_mut() {
            match &carrier {
                None => {
                    p.cap = 0;
                    if let Some(pace) = p.live() {
                        pace.share.store(0, Relaxed);
                    }
                }
                Some(c) => p.share = p.name.as_deref().map(|n| c.terminal(n)).unwrap_or_default(),
            }
        }
        peers.epoch += 1;
        peers.hub = carrier.map(Hub::new);
    }

    /// `peer` is terminal `name`: it takes that terminal's settings on a shared carrier.
    pub fn name(&self, peer: SocketAddr, name: &str) {
        let mut peers = self.peers();
        let share = peers.hub.as_ref().map(|h| h.carrier.terminal(name));
        if let Some(p) = peers.by_addr.get_mut(&key(peer)) {
            p.name = Some(name.to_string());
            if let Some(share) = share {
                p.share = share;
            }
        }
    }

    /// `peer`'s connection carries `flows` flows (its owner keeps the count): with none, it
    /// is quiet [`crate::hub::QUIET`] after its last datagram, whatever it has in flight.
    pub fn count_flows(&self, peer: SocketAddr, flows: Arc<AtomicU64>) {
        if let Some(p) = self.peers().by_addr.get_mut(&key(peer)) {
            p.flows = Some(flows);
        }
    }

    /// `peer`'s share of the carrier now, bytes/s (0: none: no carrier, or quiet).
    pub fn share_of(&self, peer: SocketAddr) -> u64 {
        self.peers().by_addr.get(&key(peer)).map_or(0, |p| p.cap)
    }

    /// Whether a carrier is shared.
    pub fn shares_carrier(&self) -> bool {
        self.peers().hub.is_some()
    }

    /// Datagrams to `peer` leave at the rate the returned pace is set to, for as long as it
    /// is held (a connection's controller holds it); a later call for the same peer (a new
    /// connection) replaces it.
    pub fn pace(&self, peer: SocketAddr) -> Arc<Pace> {
        let pace = Pace::new();
        let mut peers = self.peers();
        let peers = &mut peers.by_addr;
        // Peers whose connections are gone go too.
        peers.retain(|_, p| p.live().is_some());
        // A new connection from a named terminal keeps the name's settings until named
        // again (the same address: a reconnection).
        let (share, name, older) = peers
            .get(&key(peer))
            .map(|p| (p.share, p.name.clone(), p.live()))
            .unwrap_or_default();
        let mut p = Peer::new(&pace, share);
        p.name = name;
        if let Some(o) = older {
            p.older = Arc::downgrade(&o);
        }
        peers.insert(key(peer), p);
        pace
    }

    /// Whether a data datagram of `len` bytes to `to` may leave at `now` (its peer's pace,
    /// its share and the carrier's bucket; taken from them if so), or when to try again.
    fn admit(&self, to: SocketAddr, len: i64, segments: u64, now: Instant) -> Admit {
        let mut peers = self.peers();
        peers.reshare(now);
        let hub = peers.hub.is_some();
        let Peers {
            by_addr,
            hub: carrier,
            ..
        } = &mut *peers;
        // Paced: the pace, and since when this datagram waited (if it did).
        Admit::Send(match by_addr.get_mut(&to) {
            Some(p) => match p.refill(now) {
                Some((pace, rate)) if p.tokens < 0 => {
                    let until = refilled(now, -p.tokens, rate);
                    p.held_since.get_or_insert(now);
                    if p.share_binds(&pace) {
                        p.capped = Some(now);
                    }
                    return Admit::Hold(until);
                }
                Some((pace, _)) => {
                    let mut own = false;
                    if let Some(h) = carrier.as_mut() {
                        h.refill(now);
                        // A borrower (beyond its own share, or a terminal that was quiet
                        // and starts again at its controller's rate, before it has one)
                        // waits for carrier time in hand. One within its own share never
                        // waits on the carrier (the own shares sum to it): a second gate
                        // on every datagram, with timers that wake a millisecond late,
                        // left the carrier idle (three weighted terminals: 91 % of the
                        // limit against 97). What it sends past an empty bucket is owed
                        // for `OWED_MOST` at most, so a borrower waits that long at most
                        // once the others send less.
                        if p.borrows() {
                            if h.tokens < 0 {
                                let until = refilled(now, -h.tokens, h.carrier.rate);
                                p.held_since.get_or_insert(now);
                                p.capped = Some(now);
                                return Admit::Hold(until);
                            }
                        } else {
                            p.own -= len;
                            own = true;
                        }
                        h.tokens -= p.carrier_time(len, segments, to, h.carrier.rate);
                        h.tokens = h.tokens.max(-owed_most(h.carrier.rate));
                    }
                    p.tokens -= len;
                    p.sent += len as u64;
                    p.last_data = Some(now);
                    Some((pace, p.held_since.take(), own))
                }
                None => {
                    p.held_since = None;
                    if hub && p.live().is_none() {
                        UNSHARED.fetch_add(len as u64, Relaxed);
                        if !p.said_unshared {
                            p.said_unshared = true;
                            tracing::warn!(peer = %to, "hub: datagrams to a peer whose connection's pace is gone leave unshared");
                        }
                    }
                    None
                }
            },
            None => {
                if hub {
                    UNSHARED.fetch_add(len as u64, Relaxed);
                    if !self.said_no_peer.swap(true, Relaxed) {
                        tracing::warn!(peer = %to, "hub: datagrams to a peer with no pace leave unshared");
                    }
                }
                None
            }
        })
    }

    /// Gives back what [`PacedSocket::admit`] charged for a datagram the socket then
    /// refused: the peer's pace, its own share (if charged) and the carrier's time; the
    /// datagram is held again since it was.
    fn refund(&self, to: SocketAddr, len: i64, segments: u64, since: Option<Instant>, own: bool) {
        let mut peers = self.peers();
        let Peers {
            by_addr,
            hub: carrier,
            ..
        } = &mut *peers;
        if let Some(p) = by_addr.get_mut(&to) {
            if let Some(h) = carrier.as_mut() {
                h.tokens += p.carrier_time(len, segments, to, h.carrier.rate);
            }
            if own {
                p.own += len;
            }
            p.tokens += len;
            p.sent = p.sent.saturating_sub(len as u64);
            p.held_since = since;
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, Peers> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl AsyncUdpSocket for PacedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(PacedPoller {
            inner: self.inner.clone().create_io_poller(),
            wait: None,
        })
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        if t.segment_size.unwrap_or(t.contents.len()) < MIN_PACED {
            return self.inner.try_send(t);
        }
        let len = t.contents.len() as i64;
        let to = key(t.destination);
        let segments = t
            .segment_size
            .map_or(1, |s| t.contents.len().div_ceil(s.max(1))) as u64;
        let paced = match self.admit(to, len, segments, Instant::now()) {
            Admit::Hold(until) => {
                HELD_UNTIL.set(Some(until));
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Admit::Send(paced) => paced,
        };
        let r = self.inner.try_send(t);
        match (&r, paced) {
            (Ok(()), Some((pace, Some(since), _))) => {
                pace.held(
                    Instant::now().saturating_duration_since(since),
                    len as usize,
                );
            }
            (Err(_), Some((_, since, own))) => self.refund(to, len, segments, since, own),
            _ => {}
        }
        r
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// A GSO batch is at most one burst of the fastest paced peer (at most what the socket
    /// takes; all of it while a peer is unpaced).
    fn max_transmit_segments(&self) -> usize {
        let most = self.inner.max_transmit_segments();
        let peers = self.peers();
        let mut segments = None::<usize>;
        for p in peers.by_addr.values() {
            let rate = p.rate(p.live().as_ref());
            if rate == 0 {
                return most;
            }
            let n = (burst(rate) / SEGMENT).max(1) as usize;
            segments = Some(segments.map_or(n, |s| s.max(n)));
        }
        segments.map_or(most, |s| s.min(most))
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// A connection's poller: sleeps while its peer's datagram is held, then asks the socket.
struct PacedPoller {
    inner: Pin<Box<dyn UdpPoller>>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl fmt::Debug for PacedPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedPoller")
            .field("waiting", &self.wait.is_some())
            .finish_non_exhaustive()
    }
}

impl UdpPoller for PacedPoller {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(until) = HELD_UNTIL.take() {
            let until = tokio::time::Instant::from_std(until);
            this.wait = Some(Box::pin(tokio::time::sleep_until(until)));
        }
        if let Some(w) = &mut this.wait {
            if w.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.wait = None;
        }
        this.inner.as_mut().poll_writable(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket() -> (Arc<PacedSocket>, std::net::UdpSocket) {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let inner = quinn::TokioRuntime.wrap_udp_socket(tx).unwrap();
        (PacedSocket::new(inner), rx)
    }

    /// A socket whose one peer (the receiver returned) is paced at `rate` bytes/s.
    fn paced(rate: u64) -> (Arc<PacedSocket>, SocketAddr, Arc<Pace>, std::net::UdpSocket) {
        let (s, rx) = socket();
        let to = rx.local_addr().unwrap();
        let pace = s.pace(to);
        pace.set(rate);
        (s, to, pace, rx)
    }

    use quinn::Runtime;

    /// Sends `n` datagrams of `size` to `to` through quinn's order of calls (poll_writable,
    /// try_send, poll_writable again after WouldBlock); the time it took.
    async fn send(s: &Arc<PacedSocket>, to: SocketAddr, n: usize, size: usize) -> Duration {
        let mut poller = s.clone().create_io_poller();
        let buf = vec![7u8; size];
        let t0 = Instant::now();
        for _ in 0..n {
            loop {
                std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx))
                    .await
                    .unwrap();
                let t = Transmit {
                    destination: to,
                    ecn: None,
                    contents: &buf,
                    segment_size: None,
                    src_ip: None,
                };
                match s.try_send(&t) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        t0.elapsed()
    }

    #[tokio::test]
    async fn a_paced_peer_gets_its_rate_and_others_are_not_held() {
        let (s, rx) = socket();
        let to = rx.local_addr().unwrap();
        rx.set_nonblocking(true).unwrap();
        // What arrived so far (read between the sends: the receiver's buffer is small).
        let drain = || {
            let mut b = [0u8; 2000];
            std::iter::from_fn(|| rx.recv(&mut b).ok()).count()
        };
        // Unpaced: 60 datagrams at once (what the receiver's buffer holds).
        let fast = send(&s, to, 60, 1200).await;
        assert!(fast < Duration::from_millis(50), "unpaced took {fast:?}");
        let mut got = drain();
        // Paced at 300 kB/s: 60 kB take about 200 ms (the first burst leaves at once).
        let pace = s.pace(to);
        pace.set(300_000);
        let paced = send(&s, to, 100, 600).await;
        got += drain();
        assert!(
            paced >= Duration::from_millis(180) && paced < Duration::from_millis(400),
            "60 kB at 300 kB/s took {paced:?}"
        );
        // Small bursts: GSO batches of a burst (2 ms at 300 kB/s is under two datagrams).
        assert_eq!(
            s.max_transmit_segments(),
            2.min(s.inner.max_transmit_segments())
        );
        // The connection gone (its pace dropped), the peer is not held any more.
        drop(pace);
        let after = send(&s, to, 60, 1200).await;
        assert!(
            after < Duration::from_millis(50),
            "after the pace went: {after:?}"
        );
        got += drain();
        assert_eq!(got, 220, "datagrams arrived");
    }

    /// A second pace made for a peer and dropped (a handshake's configuration that was not
    /// used) leaves the peer paced by the pace before it, which its connection still holds.
    #[tokio::test]
    async fn a_dropped_second_pace_leaves_the_live_one_pacing() {
        let (s, to, first, rx) = paced(300_000);
        rx.set_nonblocking(true).unwrap();
        let second = s.pace(to);
        drop(second);
        // 60 kB at 300 kB/s: about 200 ms (unpaced it took under 50).
        let t = send(&s, to, 100, 600).await;
        assert!(t >= Duration::from_millis(150), "not paced: {t:?}");
        drop(first);
        let after = send(&s, to, 40, 600).await;
        assert!(after < Duration::from_millis(50), "both gone: {after:?}");
    }

    #[tokio::test]
    async fn a_peer_named_in_ipv4_is_paced_when_sent_to_as_mapped_ipv6() {
        let rx = std::net::UdpSocket::bind("[::]:0").unwrap();
        let tx = std::net::UdpSocket::bind("[::]:0").unwrap();
        let s = PacedSocket::new(quinn::TokioRuntime.wrap_udp_socket(tx).unwrap());
        let port = rx.local_addr().unwrap().port();
        let pace = s.pace(SocketAddr::from(([127, 0, 0, 1], port)));
        pace.set(100_000);
        let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{port}").parse().unwrap();
        // 20 kB at 100 kB/s: about 200 ms.
        let t = send(&s, mapped, 20, 1000).await;
        assert!(
            t >= Duration::from_millis(150),
            "mapped address not paced: {t:?}"
        );
    }

    #[tokio::test]
    async fn a_held_datagram_reports_how_long_it_waited() {
        let (s, to, pace, _rx) = paced(100_000);
        let mut seen = 0;
        // The bucket starts empty: the first datagram leaves, the second waits 10 ms.
        send(&s, to, 1, 1000).await;
        assert_eq!(pace.take_hold(&mut seen), None, "the first left at once");
        send(&s, to, 1, 1000).await;
        let (held, len) = pace.take_hold(&mut seen).expect("the second was held");
        assert_eq!(len, 1000);
        assert!(
            held >= Duration::from_millis(8) && held < Duration::from_millis(40),
            "1000 bytes at 100 kB/s waited {held:?}"
        );
        assert_eq!(pace.take_hold(&mut seen), None, "reported once");
    }

    #[tokio::test]
    async fn small_datagrams_acknowledgements_mostly_are_not_paced() {
        let (s, to, _pace, _rx) = paced(10_000);
        // 100 datagrams of 100 bytes at 10 kB/s would take a second.
        let t = send(&s, to, 100, 100).await;
        assert!(t < Duration::from_millis(50), "small datagrams held: {t:?}");
        let t = send(&s, to, 3, MIN_PACED).await;
        assert!(
            t >= Duration::from_millis(50),
            "full datagrams not paced: {t:?}"
        );
    }

    #[tokio::test]
    async fn a_rate_of_zero_does_not_pace() {
        let (s, to, _pace, _rx) = paced(0);
        let t = send(&s, to, 100, 1200).await;
        assert!(
            t < Duration::from_millis(50),
            "unset pace held datagrams: {t:?}"
        );
        assert_eq!(s.max_transmit_segments(), s.inner.max_transmit_segments());
    }

    /// Peers sending to `peers` (address, from when, s) on a clock of their own, every
    /// 50 us each as much as it is let, until 1.4 s (who asks first alternates, as two
    /// connections' tasks would); at each of `changes` (s, pace, rate) a controller sets
    /// its rate. Bytes sent per peer per 10 ms.
    fn drive(
        s: &PacedSocket,
        peers: &[(SocketAddr, f64)],
        changes: &[(f64, &Pace, u64)],
    ) -> Vec<[u64; 140]> {
        let t0 = Instant::now();
        let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let mut bins = vec![[0u64; 140]; peers.len()];
        let mut next: Vec<Instant> = peers.iter().map(|p| at(p.1)).collect();
        for step in 0..28_000usize {
            let secs = step as f64 * 50e-6;
            let now = at(secs);
            for (when, pace, rate) in changes {
                if (secs - when).abs() < 25e-6 {
                    pace.set(*rate);
                }
            }
            for i in 0..peers.len() {
                let k = (i + step) % peers.len();
                let mut sent_now = 0;
                while next[k] <= now {
                    sent_now += 1;
                    assert!(sent_now < 1000, "peer {k} is not paced at {secs} s");
                    match s.admit(peers[k].0, 1200, 1, now) {
                        Admit::Hold(until) => next[k] = until,
                        Admit::Send(_) => bins[k][step / 200] += 1200,
                    }
                }
            }
        }
        bins
    }

    /// A carrier of `rate` bytes/s shared by two peers whose controllers would send far
    /// faster (the shares bind).
    fn hub_of_two(rate: u64) -> (Arc<PacedSocket>, [SocketAddr; 2], [Arc<Pace>; 2]) {
        let (s, _rx) = socket();
        let peer = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let (a, b) = (peer(9), peer(10));
        s.share_carrier(Some(crate::hub::Carrier {
            rate,
            ..Default::default()
        }));
        let (pa, pb) = (s.pace(a), s.pace(b));
        pa.set(10_000_000);
        pb.set(10_000_000);
        (s, [a, b], [pa, pb])
    }

    /// A datagram the socket refuses costs nothing: its peer's pace, its own share and the
    /// carrier's time are as they were before it was admitted.
    #[tokio::test]
    async fn a_datagram_the_socket_refuses_is_given_back_in_full() {
        let (s, [a, b], _paces) = hub_of_two(4_000_000);
        drive(&s, &[(a, 0.0), (b, 0.0)], &[]);
        // After the driven 1.4 s.
        let now = Instant::now() + Duration::from_secs(2);
        let state = |s: &PacedSocket| {
            let peers = s.peers();
            let p = &peers.by_addr[&a];
            (p.tokens, p.own, p.sent, peers.hub.as_ref().unwrap().tokens)
        };
        // Admitted and refused twice at one moment: if anything were kept back, the second
        // refusal would leave less than the first (the first admission also refills).
        let mut after = Vec::new();
        for _ in 0..2 {
            match s.admit(a, 1200, 1, now) {
                Admit::Send(Some((_, since, own))) => {
                    assert!(own, "A, within its share, was not charged its own bucket");
                    s.refund(a, 1200, 1, since, own);
                }
                Admit::Send(None) => panic!("a paced peer sent unpaced"),
                Admit::Hold(_) => panic!("A was held after a refusal"),
            }
            after.push(state(&s));
        }
        assert_eq!(
            after[0], after[1],
            "(pace, own share, sent, carrier) after one refusal and after two"
        );
    }

    /// Bytes/s sent in 10 ms bins `from..to`.
    fn rate_in(bins: &[u64; 140], from: usize, to: usize) -> f64 {
        bins[from..to].iter().sum::<u64>() as f64 / ((to - from) as f64 * 0.01)
    }

    /// A terminal that starts beside one that had the whole carrier gets half of it at once.
    #[tokio::test]
    async fn a_terminal_that_starts_beside_a_busy_one_gets_its_share() {
        const CARRIER: u64 = 400_000;
        let (s, [a, b], _paces) = hub_of_two(CARRIER);
        let bins = drive(&s, &[(a, 0.0), (b, 0.4)], &[]);
        let alone = rate_in(&bins[0], 10, 40);
        // From 100 ms after B joined: its share is computed from what it sends.
        let (ra, rb) = (rate_in(&bins[0], 50, 140), rate_in(&bins[1], 50, 140));
        println!("A alone {alone:.0} B/s; together A {ra:.0}, B {rb:.0} B/s");
        assert!(alone >= CARRIER as f64 * 0.9, "A alone got {alone:.0} B/s");
        assert!(
            ra + rb <= CARRIER as f64 * 1.05,
            "together {:.0} B/s on a carrier of {CARRIER}",
            ra + rb
        );
        assert!(
            rb >= CARRIER as f64 * 0.45 && ra >= CARRIER as f64 * 0.45,
            "A {ra:.0}, B {rb:.0} B/s: not half each"
        );
    }

    /// A terminal whose controller sends less than its share lends the rest to a busy one,
    /// and keeps the right to send its whole share at once; when its controller asks for
    /// more (still within its share, so that no share holds it back), the two never send
    /// more than the carrier: the loan is taken back through the carrier's bucket. Without
    /// it the busy one kept its loan until what the other sent, averaged over 100 ms,
    /// caught up, and the two together sent a third more than the carrier.
    #[tokio::test]
    async fn a_loan_of_carrier_is_taken_back_and_the_carrier_is_not_oversent() {
        const CARRIER: u64 = 4_000_000;
        let (s, [a, b], [_pa, pb]) = hub_of_two(CARRIER);
        // B's controller: 500 kB/s from 0.4 s, 1.9 MB/s (its share is 2) from 0.9 s.
        let bins = drive(
            &s,
            &[(a, 0.0), (b, 0.4)],
            &[(0.0, &pb, 500_000), (0.9, &pb, 1_900_000)],
        );
        let lent = rate_in(&bins[0], 50, 90);
        // What both sent in each 100 ms from B's rise, against what the carrier carries
        // then and what its bucket may hold and owe.
        let depth = (burst(CARRIER) as i64 + owed_most(CARRIER) + 2400) as f64;
        let most = (90..130)
            .map(|i| (i..i + 10).map(|k| bins[0][k] + bins[1][k]).sum::<u64>())
            .max()
            .unwrap() as f64;
        let (ra, rb) = (rate_in(&bins[0], 100, 140), rate_in(&bins[1], 100, 140));
        println!(
            "A beside B at 500 kB/s: {lent:.0} B/s; from B's rise, at most {most:.0} B in 100 ms (carrier {} and depth {depth}); then A {ra:.0}, B {rb:.0} B/s",
            CARRIER / 10
        );
        assert!(
            lent >= 0.85 * (CARRIER - 500_000) as f64,
            "A borrowed {lent:.0} B/s"
        );
        assert!(
            most <= (CARRIER / 10) as f64 + depth,
            "{most:.0} B in 100 ms on a carrier of {CARRIER} B/s"
        );
        assert!(
            rb >= 1_800_000.0,
            "B got {rb:.0} B/s of the 1 900 000 it asked for"
        );
        assert!(ra + rb >= CARRIER as f64 * 0.95, "A {ra:.0}, B {rb:.0} B/s");
    }
}
