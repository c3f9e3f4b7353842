//! A split gateway sharing one forward carrier among a hub's terminals (`[proxy.carrier]`).
//!
//! The policy is the tunnel gateway's (`satpep_tunnel::hub`: carrier time or bits by weight,
//! committed and maximum rates, a quiet terminal's share to the others, room to grow for
//! one that sends less than its share). Here each terminal's connections are kernel TCP
//! sockets, so its share is applied as their pacing ceilings (`SO_MAX_PACING_RATE`, which
//! the kernel's pacing and the `satpep_sat` controller both respect): every [`EVERY`] the
//! gateway reads what each satellite leg delivered (`TCP_INFO`), computes the terminals'
//! shares, divides each among that terminal's busy connections the same way (equal weights),
//! and sets the ceilings. What would queue at the satellite waits in the gateway's sockets,
//! and the servers' legs back off through the relay's back-pressure.
//!
//! A terminal is known by its clients' addresses: the subnets `[proxy.carrier.terminal.NAME]`
//! lists, else each client /24 (IPv4) or /64 (IPv6) is a terminal of weight 1.

use crate::registry::{CarrierTerminal, Registry};
use crate::tcpinfo;
use ipnet::IpNet;
use satpep_tunnel::hub::{self, Carrier, Demand, ShareBy, TerminalShare};
use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, warn};

/// How often the shares are recomputed: each time every live connection's `TCP_INFO` is
/// read, so coarser than the tunnel's 10 ms (whose counters are its own).
pub const EVERY: Duration = Duration::from_millis(50);

/// A split gateway's shared carrier: the policy and which clients are whose.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SplitCarrier {
    /// The shared carrier (rates in the tunnel's unit: bytes of a full UDP datagram's
    /// payload per second, [`hub::payload_bytes_per_s`]).
    pub carrier: Carrier,
    /// Client subnets of the named terminals.
    pub subnets: Vec<(IpNet, String)>,
}

impl SplitCarrier {
    /// The terminal whose client is `ip`: the longest listed subnet holding it, else its /24
    /// (IPv4) or /64 (IPv6), named as that prefix.
    pub fn terminal_of(&self, ip: IpAddr) -> String {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        if let Some((_, name)) = self
            .subnets
            .iter()
            .filter(|(n, _)| n.contains(&ip))
            .max_by_key(|(n, _)| n.prefix_len())
        {
            return name.clone();
        }
        let len = if ip.is_ipv4() { 24 } else { 64 };
        IpNet::new(ip, len)
            .map(|n| n.trunc().to_string())
            .unwrap_or_else(|_| ip.to_string())
    }
}

/// Bytes around a TCP segment's payload in its frame on the carrier: Ethernet, IPv4 and TCP
/// with timestamps (IPv6 adds [`hub::IPV6_MORE`]).
const TCP_FRAME_HEADERS: u64 = 14 + 20 + 32;

/// TCP payload bytes/s of one leg (segments of `mss`) as carrier, in the hub's unit (a full
/// UDP datagram's payload in its frame).
fn to_carrier(payload_per_s: f64, mss: u32, ipv6: bool) -> f64 {
    let headers = TCP_FRAME_HEADERS + if ipv6 { hub::IPV6_MORE } else { 0 };
    let frame = payload_per_s * (mss as u64 + headers) as f64 / mss as f64;
    // Frame bytes to the hub's unit, to nine digits.
    frame * hub::payload_bytes_per_s(8e9) as f64 / 1e9
}

/// The pacing ceiling (TCP payload bytes/s: the kernel paces a segment by its payload) that
/// makes a leg's frames take `carrier` of the carrier (the hub's unit).
fn to_pacing(carrier: f64, mss: u32, ipv6: bool) -> u64 {
    let one = to_carrier(1.0, mss, ipv6);
    (carrier / one).max(1.0) as u64
}

/// What the gateway knows of one connection between two computations.
struct Flow {
    acked: u64,
    /// Segments retransmitted at the last reading.
    retransmitted: u32,
    /// Smoothed RTT at the last reading, µs.
    rtt_us: u32,
    /// Its delivery, the hub's unit, smoothed over about four computations.
    rate: f64,
    /// The last computation's sample of it, unsmoothed.
    sample: f64,
    /// The ceiling set, TCP payload bytes/s (0: none).
    cap: u64,
    /// The count of freed carrier its ceiling carries (see [`with_freed`]).
    freed: u64,
    /// When it last had something acknowledged.
    active: Instant,
    /// Its client's address, and the terminal that makes it (`SplitCarrier::terminal_of`,
    /// found again when a reload changes the carrier).
    ip: IpAddr,
    terminal: String,
    mss: u32,
    ipv6: bool,
    in_flight: bool,
}

/// The share computations' state.
#[derive(Default)]
pub struct Sharing {
    flows: HashMap<u64, Flow>,
    last: Option<Instant>,
    /// Per terminal: payload bytes acknowledged and segments retransmitted since the start.
    totals: HashMap<String, (u64, u64)>,
    /// Times carrier was freed (a busy terminal went quiet, a reload regrouped): a share
    /// that grows with it is one the connection's controller may run at at once.
    freed: u64,
    /// The terminals busy at the last computation.
    was_busy: Vec<String>,
}

/// The pacing ceiling `cap` (bytes/s) with the count of freed carrier in its four low bits:
/// the `satpep_sat` controller reads both from the socket (its `follow_carrier`) and runs at
/// a share that grew with the count at once, as the tunnel's controller does (a few bytes/s
/// of ceiling are nothing).
fn with_freed(cap: u64, freed: u64) -> u64 {
    (cap & !0xf) | (freed & 0xf)
}

impl Sharing {
    /// Each connection's terminal under carrier `c` (a reload changed it).
    fn regroup(&mut self, c: &SplitCarrier) {
        for f in self.flows.values_mut() {
            f.terminal = c.terminal_of(f.ip);
        }
        self.freed += 1;
    }

    /// Reads every live connection of `reg`, computes the shares of `c`, sets each busy
    /// connection's ceiling and publishes the terminals' figures in `reg`. Returns the busy
    /// terminals' shares, the hub's unit, for the log.
    fn step(&mut self, reg: &Registry, c: &SplitCarrier, now: Instant) -> Vec<(String, u64)> {
        let dt = self
            .last
            .map_or(EVERY, |l| now.duration_since(l))
            .as_secs_f64()
            .max(1e-3);
        self.last = Some(now);
        let live = reg.live();
        let mut seen = std::collections::HashSet::with_capacity(live.len());
        for conn in &live {
            let Some(Some(info)) = conn.with_satellite(tcpinfo::sending) else {
                continue;
            };
            seen.insert(conn.id);
            let f = self.flows.entry(conn.id).or_insert_with(|| {
                let ip = conn.src.ip();
                Flow {
                    acked: info.bytes_acked,
                    retransmitted: info.retransmitted,
                    rtt_us: info.rtt_us,
                    rate: 0.0,
                    sample: 0.0,
                    cap: 0,
                    freed: 0,
                    active: now,
                    ip,
                    terminal: c.terminal_of(ip),
                    mss: info.mss,
                    ipv6: matches!(ip, IpAddr::V6(v) if v.to_ipv4_mapped().is_none()),
                    in_flight: false,
                }
            });
            let delta = info.bytes_acked.saturating_sub(f.acked);
            // The terminal's name is cloned once, when it first has a total, not per reading.
            let retransmitted = info.retransmitted.saturating_sub(f.retransmitted) as u64;
            match self.totals.get_mut(&f.terminal) {
                Some(t) => *t = (t.0 + delta, t.1 + retransmitted),
                None => {
                    self.totals
                        .insert(f.terminal.clone(), (delta, retransmitted));
                }
            }
            f.acked = info.bytes_acked;
            f.retransmitted = info.retransmitted;
            f.rtt_us = info.rtt_us;
            f.mss = info.mss;
            let sample = to_carrier(delta as f64 / dt, f.mss, f.ipv6);
            f.rate += (sample - f.rate) / 4.0;
            f.sample = sample;
            if delta > 0 {
                f.active = now;
            }
            f.in_flight = info.unacked > 0 || info.notsent > 0;
        }
        self.flows.retain(|id, _| seen.contains(id));
        // Busy connections, by terminal: sent lately, or waiting with data in flight.
        let busy = |f: &Flow| {
            let quiet = now.duration_since(f.active);
            quiet < hub::QUIET || (f.in_flight && quiet < hub::QUIET_HOLDING)
        };
        // Held by its ceiling, on the smoothed rate or the last sample: a lender that asks
        // for its share back is seen at the next computation, and the loans end then.
        let held = |f: &Flow| {
            f.cap > 0 && f.rate.max(f.sample) >= 0.85 * to_carrier(f.cap as f64, f.mss, f.ipv6)
        };
        let mut terminals: Vec<(String, Vec<u64>)> = Vec::new();
        for (id, f) in &self.flows {
            if !busy(f) {
                continue;
            }
            match terminals.iter_mut().find(|(t, _)| *t == f.terminal) {
                Some((_, ids)) => ids.push(*id),
                None => terminals.push((f.terminal.clone(), vec![*id])),
            }
        }
        terminals.sort();
        if self
            .was_busy
            .iter()
            .any(|t| !terminals.iter().any(|(b, _)| b == t))
        {
            self.freed += 1;
        }
        self.was_busy = terminals.iter().map(|(t, _)| t.clone()).collect();
        let demands: Vec<Demand> = terminals
            .iter()
            .map(|(t, ids)| Demand {
                share: c.carrier.terminal(t),
                sending: ids.iter().map(|i| self.flows[i].rate).sum::<f64>() as u64,
                held: ids.iter().any(|i| held(&self.flows[i])),
            })
            .collect();
        let shares = hub::allocate(c.carrier.rate, c.carrier.by, &demands);
        // What each would get were every one held back: a terminal (and a connection) that
        // sends less than that may always send that much (a connection starting, a lender
        // asking for its share back), as at the tunnel's gateway; the next computation
        // then sees it held and the others' shares shrink.
        let own = hub::allocate(c.carrier.rate, c.carrier.by, &all_held(&demands));
        let mut caps: HashMap<u64, u64> = HashMap::new();
        for (((_, ids), &share), &own) in terminals.iter().zip(&shares).zip(&own) {
            // The terminal's share among its connections, each weighing one.
            let per: Vec<Demand> = ids
                .iter()
                .map(|i| Demand {
                    share: TerminalShare::default(),
                    sending: self.flows[i].rate as u64,
                    held: held(&self.flows[i]),
                })
                .collect();
            let budget = share.max(own);
            let each = hub::allocate(budget, ShareBy::Bits, &per);
            let each_own = hub::allocate(budget, ShareBy::Bits, &all_held(&per));
            for ((i, s), o) in ids.iter().zip(each).zip(each_own) {
                let f = &self.flows[i];
                caps.insert(*i, to_pacing(s.max(o) as f64, f.mss, f.ipv6));
            }
        }
        for conn in &live {
            let Some(f) = self.flows.get_mut(&conn.id) else {
                continue;
            };
            // A connection not busy has no ceiling: it starts again at its controller's
            // pace, and the next computation gives it a share.
            let cap = caps.get(&conn.id).copied().unwrap_or(0);
            let close = cap > 0 && f.cap > 0 && cap.abs_diff(f.cap) * 100 < f.cap;
            let told = cap == 0 || f.freed == self.freed;
            if (cap != f.cap && !close) || !told {
                let v = if cap > 0 {
                    with_freed(cap, self.freed)
                } else {
                    0
                };
                conn.with_satellite(|fd| set_max_pacing(fd, v));
                f.cap = cap;
                f.freed = self.freed;
            }
        }
        reg.set_carrier(self.figures(&terminals, &shares));
        terminals.into_iter().map(|(t, _)| t).zip(shares).collect()
    }

    /// Every terminal with a live connection or a total, by name: `busy` the busy terminals
    /// with their busy connections, `shares` their shares (the hub's unit).
    fn figures(&self, busy: &[(String, Vec<u64>)], shares: &[u64]) -> Vec<CarrierTerminal> {
        let mut out: std::collections::BTreeMap<&str, CarrierTerminal> = self
            .totals
            .iter()
            .map(|(name, &(acked, retr))| {
                let t = CarrierTerminal {
                    name: name.clone(),
                    acked_bytes: acked,
                    retransmitted: retr,
                    ..CarrierTerminal::default()
                };
                (name.as_str(), t)
            })
            .collect();
        for f in self.flows.values() {
            if let Some(t) = out.get_mut(f.terminal.as_str()) {
                t.flows += 1;
            }
        }
        for ((name, ids), share) in busy.iter().zip(shares) {
            let Some(t) = out.get_mut(name.as_str()) else {
                continue;
            };
            let flows = ids.iter().map(|i| &self.flows[i]);
            t.busy = ids.len() as u64;
            t.sending_bps = flows.clone().map(|f| hub::carrier_bps(f.rate) as u64).sum();
            t.rtt_ms = flows.map(|f| f.rtt_us as f64 / 1e3).sum::<f64>() / ids.len() as f64;
            t.share_bps = hub::carrier_bps(*share as f64) as u64;
        }
        out.into_values().collect()
    }
}

/// `demands` as if each were held back by its share.
fn all_held(demands: &[Demand]) -> Vec<Demand> {
    demands
        .iter()
        .map(|d| Demand { held: true, ..*d })
        .collect()
}

/// Sets socket `fd`'s pacing ceiling, bytes/s (`u64::MAX`: none).
fn max_pacing(fd: RawFd, v: u64) -> std::io::Result<()> {
    // SAFETY: SO_MAX_PACING_RATE reads a u64 (an unsigned long) from a valid pointer.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            &v as *const u64 as *const libc::c_void,
            std::mem::size_of::<u64>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets socket `fd`'s pacing ceiling, bytes/s (0: none).
fn set_max_pacing(fd: RawFd, rate: u64) {
    if let Err(e) = max_pacing(fd, if rate == 0 { u64::MAX } else { rate }) {
        debug!(error = %e, "SO_MAX_PACING_RATE");
    }
}

/// Shares the carrier `carrier` holds (None: nothing shared; a reload sends another) among
/// `reg`'s connections until aborted.
pub fn spawn(
    reg: Arc<Registry>,
    mut carrier: watch::Receiver<Option<Arc<SplitCarrier>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut sharing = Sharing::default();
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut logged = Instant::now();
        loop {
            let current = carrier.borrow_and_update().clone();
            let Some(c) = current else {
                // Nothing shared (any more): lift every ceiling set, then wait for a reload.
                for conn in reg.live() {
                    if sharing.flows.get(&conn.id).is_some_and(|f| f.cap > 0) {
                        conn.with_satellite(|fd| set_max_pacing(fd, 0));
                    }
                }
                sharing = Sharing::default();
                reg.set_carrier(Vec::new());
                if carrier.changed().await.is_err() {
                    return;
                }
                continue;
            };
            tokio::select! {
                _ = tick.tick() => {}
                r = carrier.changed() => {
                    if r.is_err() {
                        return;
                    }
                    // Subnets may have moved: live connections find their terminals again.
                    if let Some(n) = carrier.borrow().clone() {
                        sharing.regroup(&n);
                    }
                    continue;
                }
            }
            let shares = sharing.step(&reg, &c, Instant::now());
            if logged.elapsed() >= Duration::from_secs(10) && !shares.is_empty() {
                logged = Instant::now();
                debug!(?shares, "carrier shares, bytes/s");
            }
        }
    })
}

/// Warns if the kernel refuses pacing ceilings (tried on a fresh socket).
pub fn check_kernel() {
    use std::os::fd::AsRawFd;
    let Ok(s) = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None) else {
        return;
    };
    if let Err(e) = max_pacing(s.as_raw_fd(), 1_000_000) {
        warn!(error = %e, "the kernel refuses SO_MAX_PACING_RATE: the carrier cannot be shared");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_belongs_to_its_listed_terminal_or_its_own_prefix() {
        let c = SplitCarrier {
            carrier: Carrier::default(),
            subnets: vec![
                ("198.18.0.0/16".parse().unwrap(), "wide".into()),
                ("198.18.1.0/24".parse().unwrap(), "t1".into()),
                ("2001:2:0:1::/64".parse().unwrap(), "t1".into()),
            ],
        };
        let of = |s: &str| c.terminal_of(s.parse().unwrap());
        assert_eq!(of("198.18.1.2"), "t1");
        assert_eq!(of("::ffff:198.18.1.2"), "t1");
        assert_eq!(of("198.18.7.2"), "wide");
        assert_eq!(of("2001:2:0:1::2"), "t1");
        assert_eq!(of("198.19.5.2"), "198.19.5.0/24");
        assert_eq!(of("2001:2:0:9::2"), "2001:2:0:9::/64");
    }

    #[test]
    fn a_ceiling_carries_the_count_of_freed_carrier_in_its_low_bits() {
        assert_eq!(with_freed(1_000_000, 0), 1_000_000 & !0xf);
        assert_eq!(with_freed(1_000_000, 5) & 0xf, 5);
        // The count wraps; the rate moves by less than 16 bytes/s.
        assert_eq!(with_freed(1_000_000, 21) & 0xf, 5);
        assert!(with_freed(1_000_000, 21).abs_diff(1_000_000) < 16);
    }

    #[test]
    fn a_pacing_ceiling_puts_its_frames_at_the_share_of_the_carrier() {
        // 1448 bytes of payload in a 1514-byte frame; the hub counts 1472 in 1514.
        let share = hub::payload_bytes_per_s(10e6) as f64;
        let pace = to_pacing(share, 1448, false);
        let frames_bps = pace as f64 / 1448.0 * 1514.0 * 8.0;
        assert!((frames_bps - 10e6).abs() < 10e6 * 0.001, "{frames_bps}");
        // IPv6 frames carry 20 bytes more.
        assert!(to_pacing(share, 1428, true) < pace);
        assert!((to_carrier(pace as f64, 1448, false) - share).abs() < share * 0.001);
    }
}
