//! Sharing one forward carrier among a hub's terminals, at the gateway.
//!
//! A gateway's terminals share one carrier (a DVB-S2 TDM stream): each terminal's
//! controller alone would measure the path as if it were alone on it, and the carrier would
//! go to whoever pushes hardest. The gateway therefore caps each terminal's datagrams at a
//! share of the carrier ([`crate::pacing::PacedSocket`] applies the cap beside the
//! controller's own pace), recomputed every few milliseconds from what each terminal is
//! doing:
//!
//! - **What is shared.** The carrier's *time*: a terminal sending `b` bit/s over a link of
//!   `r` bit/s (its modulation and coding) holds `b / r` of it. With `share = "time"` each
//!   busy terminal gets time in proportion to its weight (a terminal in a fade gets fewer
//!   bits, the others keep theirs); with `share = "bits"` bits in proportion to its weight
//!   (a faded terminal's bits cost the others time). A terminal's rate is what the operator
//!   configured for it, else the carrier's own: without per-terminal rates both policies
//!   split the carrier's bits by weight.
//! - **Committed and maximum rates** (CIR, MIR) bound a busy terminal's share from below
//!   and above; committed rates that together exceed the carrier are scaled down alike.
//! - **Work-conserving.** A terminal that sent nothing for [`QUIET`] (with data in flight
//!   and flows open, [`QUIET_HOLDING`]) has no share; one that sends less than its share without
//!   being held back by it is given what it sends and a quarter more (room to grow), and
//!   the rest goes to the others.
//! - **Loans taken back at once.** A light terminal keeps the right to its whole share (its
//!   controller may ask for it before the next computation sees it), so the shares sum to
//!   more than the carrier; a bucket of carrier time bounds what leaves: a terminal sending
//!   beyond its own share (what it would get were all held) waits while the carrier is
//!   owed, one within it does not (see `pacing`'s `Hub`).
//!
//! [`allocate`] is the arithmetic, free of I/O and tested exactly.

use std::time::Duration;

/// A terminal quiet this long gives its share to the others …
pub const QUIET: Duration = Duration::from_millis(200);
/// … or this long if its controller says it still had data in flight and its flows are
/// open: a connection that waits for acknowledgements over a long queue (a drain at 1.2 s
/// RTT sent nothing for more than 200 ms), or for its peer's flow-control credit, is no
/// quiet terminal, and taking its share lifted the others into a full carrier every few
/// seconds (the `hub` preset's fade: queueing delay p95 350 ms against 90 without sharing;
/// again 338 ms when "its window had room" stood for "nothing to send", which a
/// flow-control stall also shows). A terminal whose flows all ended is quiet after
/// [`QUIET`] with data in flight. An outage still frees its share after this long.
pub const QUIET_HOLDING: Duration = Duration::from_secs(2);
/// How often the shares are recomputed.
pub const EVERY: Duration = Duration::from_millis(10);
/// Bytes of headers around a datagram's UDP payload in its frame on the carrier (Ethernet,
/// IPv4 and UDP; IPv6 adds [`IPV6_MORE`]).
pub const FRAME_HEADERS: u64 = 14 + 20 + 8;
/// What an IPv6 header adds to [`FRAME_HEADERS`].
pub const IPV6_MORE: u64 = 20;
/// The UDP payload of a full datagram (a 1500-byte IPv4 packet).
const FULL_PAYLOAD: u64 = 1472;

/// A carrier of `bps` bit/s in bytes of UDP payload per second, the unit of every rate here:
/// full datagrams, 1472 bytes of payload in 1514 of frame.
pub fn payload_bytes_per_s(bps: f64) -> u64 {
    (bps / 8.0 * FULL_PAYLOAD as f64 / (FULL_PAYLOAD + FRAME_HEADERS) as f64).round() as u64
}

/// [`payload_bytes_per_s`] back: bytes/s of full datagrams' payload as bit/s of carrier.
pub fn carrier_bps(payload_bytes_per_s: f64) -> f64 {
    payload_bytes_per_s * 8.0 * (FULL_PAYLOAD + FRAME_HEADERS) as f64 / FULL_PAYLOAD as f64
}

/// The carrier a datagram of `len` bytes of payload takes in `segments` frames, in the
/// payload bytes of [`payload_bytes_per_s`]: a smaller datagram's headers take a larger
/// share (quinn's 1200-byte datagrams take 0.6 % more than their payload says: a carrier
/// kept full by its shares at that rate would gain 6 ms of queue a second).
pub fn carrier_cost(len: u64, segments: u64, ipv6: bool) -> u64 {
    let headers = FRAME_HEADERS + if ipv6 { IPV6_MORE } else { 0 };
    let frame = len + segments * headers;
    (frame as u128 * FULL_PAYLOAD as u128 / (FULL_PAYLOAD + FRAME_HEADERS) as u128) as u64
}

/// A terminal's demand when it is not held back by its share: what it sends, and this much
/// more to grow into.
const HEADROOM: f64 = 1.25;

/// What the carrier's shares are made of (see the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShareBy {
    /// Carrier time in proportion to weight.
    #[default]
    Time,
    /// Bits in proportion to weight.
    Bits,
}

impl ShareBy {
    /// `time` or `bits`.
    pub fn parse(s: &str) -> Result<ShareBy, String> {
        match s {
            "time" => Ok(ShareBy::Time),
            "bits" => Ok(ShareBy::Bits),
            other => Err(format!("'{other}': time or bits")),
        }
    }

    /// `time` or `bits`, as [`ShareBy::parse`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            ShareBy::Time => "time",
            ShareBy::Bits => "bits",
        }
    }
}

/// The carrier a gateway shares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Carrier {
    /// Its rate for the tunnel's datagrams, bytes of UDP payload per second.
    pub rate: u64,
    /// What is shared.
    pub by: ShareBy,
    /// Settings of named terminals (a terminal not named has weight 1 and no bounds).
    pub terminals: Vec<(String, TerminalShare)>,
}

impl Carrier {
    /// The settings of terminal `name`.
    pub fn terminal(&self, name: &str) -> TerminalShare {
        self.terminals
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
            .unwrap_or_default()
    }
}

/// One terminal's settings, bytes of UDP payload per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TerminalShare {
    /// Its weight (1 by default).
    pub weight: f64,
    /// Committed rate: a busy terminal gets at least this (0: none).
    pub cir: u64,
    /// Maximum rate (0: the carrier's).
    pub mir: u64,
    /// Its link's rate, its modulation and coding (0: the carrier's).
    pub rate: u64,
}

impl Default for TerminalShare {
    fn default() -> Self {
        TerminalShare {
            weight: 1.0,
            cir: 0,
            mir: 0,
            rate: 0,
        }
    }
}

/// What one busy terminal is doing when the shares are computed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Its settings.
    pub share: TerminalShare,
    /// What it sent lately, bytes/s.
    pub sending: u64,
    /// Whether its share held it back lately (it would send more).
    pub held: bool,
}

/// Each busy terminal's share of a carrier of `rate` bytes/s, bytes/s, in `demands`' order.
pub fn allocate(rate: u64, by: ShareBy, demands: &[Demand]) -> Vec<u64> {
    if demands.is_empty() || rate == 0 {
        return vec![0; demands.len()];
    }
    let c = rate as f64;
    // Per terminal: its link's rate, its time per unit of the water level, and the bounds
    // of the carrier time it may hold.
    let link: Vec<f64> = demands
        .iter()
        .map(|d| {
            if d.share.rate > 0 {
                d.share.rate as f64
            } else {
                c
            }
        })
        .collect();
    let coef: Vec<f64> = demands
        .iter()
        .zip(&link)
        .map(|(d, r)| {
            let w = d.share.weight.max(1e-9);
            match by {
                ShareBy::Time => w,
                ShareBy::Bits => w / r,
            }
        })
        .collect();
    let hi: Vec<f64> = demands
        .iter()
        .zip(&link)
        .map(|(d, r)| {
            let mut most = *r;
            if d.share.mir > 0 {
                most = most.min(d.share.mir as f64);
            }
            if !d.held {
                most = most.min(d.sending as f64 * HEADROOM);
            }
            most / r
        })
        .collect();
    let mut lo: Vec<f64> = demands
        .iter()
        .zip(&link)
        .zip(&hi)
        .map(|((d, r), h)| (d.share.cir as f64 / r).min(*h))
        .collect();
    // Committed rates beyond the carrier are scaled down alike.
    let committed: f64 = lo.iter().sum();
    if committed > 1.0 {
        lo.iter_mut().for_each(|l| *l /= committed);
    }
    let time = |level: f64| -> f64 {
        (0..demands.len())
            .map(|k| (coef[k] * level).clamp(lo[k], hi[k].max(lo[k])))
            .sum()
    };
    // The water level at which the carrier's time is used up (bisection: time() grows
    // with the level); if every terminal's demand fits, each gets it.
    let level = if time(f64::MAX / 4.0) <= 1.0 {
        f64::MAX / 4.0
    } else {
        let (mut a, mut b) = (0.0, 1.0);
        while time(b) < 1.0 {
            b *= 2.0;
        }
        for _ in 0..60 {
            let m = (a + b) / 2.0;
            if time(m) < 1.0 {
                a = m;
            } else {
                b = m;
            }
        }
        a
    };
    (0..demands.len())
        .map(|k| {
            let t = (coef[k] * level).clamp(lo[k], hi[k].max(lo[k]));
            (t * link[k]).round() as u64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carrier_bits_and_payload_bytes_convert_both_ways() {
        for bps in [1e6, 3e6, 30e6, 1e9] {
            let back = carrier_bps(payload_bytes_per_s(bps) as f64);
            assert!((back / bps - 1.0).abs() < 1e-5, "{bps} -> {back}");
        }
    }

    fn busy(weight: f64, rate: u64) -> Demand {
        Demand {
            share: TerminalShare {
                weight,
                rate,
                ..Default::default()
            },
            sending: 0,
            held: true,
        }
    }

    fn close(a: &[u64], b: &[u64]) -> bool {
        a.iter().zip(b).all(|(x, y)| x.abs_diff(*y) <= 1)
    }

    #[test]
    fn busy_terminals_share_by_weight() {
        let a = allocate(1000, ShareBy::Bits, &[busy(1.0, 0), busy(3.0, 0)]);
        assert!(close(&a, &[250, 750]), "{a:?}");
        let a = allocate(
            1000,
            ShareBy::Time,
            &[busy(1.0, 0), busy(1.0, 0), busy(2.0, 0)],
        );
        assert!(close(&a, &[250, 250, 500]), "{a:?}");
    }

    /// Terminal 2 in a fade to a quarter of the carrier's rate: shared in time, it holds half
    /// the carrier and gets 125 of its 250; shared in bits, both get 200 and terminal 2's
    /// take four fifths of the time.
    #[test]
    fn a_faded_terminal_costs_itself_time_or_the_others_bits() {
        let d = [busy(1.0, 0), busy(1.0, 250)];
        let t = allocate(1000, ShareBy::Time, &d);
        assert!(close(&t, &[500, 125]), "{t:?}");
        let b = allocate(1000, ShareBy::Bits, &d);
        assert!(close(&b, &[200, 200]), "{b:?}");
        // Either way the carrier's time is used up, not more.
        for a in [t, b] {
            let time = a[0] as f64 / 1000.0 + a[1] as f64 / 250.0;
            assert!((time - 1.0).abs() < 0.01, "{a:?}");
        }
    }

    #[test]
    fn a_terminal_sending_less_than_its_share_leaves_the_rest_to_the_others() {
        let light = Demand {
            sending: 100,
            held: false,
            ..busy(1.0, 0)
        };
        let a = allocate(1000, ShareBy::Bits, &[light, busy(1.0, 0), busy(1.0, 0)]);
        // 125 (a quarter more than it sends) and the rest halved.
        assert!(close(&a, &[125, 438, 438]), "{a:?}");
        // Alone and light, it gets its demand; no busy terminal, nobody's share is used up.
        let a = allocate(1000, ShareBy::Time, &[light]);
        assert_eq!(a, [125]);
    }

    #[test]
    fn committed_and_maximum_rates_bound_the_shares() {
        let capped = Demand {
            share: TerminalShare {
                mir: 100,
                ..Default::default()
            },
            ..busy(1.0, 0)
        };
        let committed = Demand {
            share: TerminalShare {
                weight: 0.1,
                cir: 400,
                ..Default::default()
            },
            ..busy(0.1, 0)
        };
        let a = allocate(1000, ShareBy::Bits, &[capped, committed, busy(1.0, 0)]);
        assert!(close(&a, &[100, 400, 500]), "{a:?}");
        // Committed rates beyond the carrier are scaled down alike.
        let over = Demand {
            share: TerminalShare {
                cir: 800,
                ..Default::default()
            },
            ..busy(1.0, 0)
        };
        let a = allocate(1000, ShareBy::Bits, &[over, over]);
        assert!(close(&a, &[500, 500]), "{a:?}");
    }

    #[test]
    fn nothing_to_share() {
        assert!(allocate(1000, ShareBy::Time, &[]).is_empty());
        assert_eq!(allocate(0, ShareBy::Time, &[busy(1.0, 0)]), [0]);
        assert_eq!(ShareBy::parse("time"), Ok(ShareBy::Time));
        assert!(ShareBy::parse("air").unwrap_err().contains("time or bits"));
        for by in [ShareBy::Time, ShareBy::Bits] {
            assert_eq!(ShareBy::parse(by.name()), Ok(by));
        }
    }

    #[test]
    fn a_datagram_costs_its_frame() {
        // A full datagram costs its payload; two of 1200 bytes cost their headers more.
        assert_eq!(carrier_cost(1472, 1, false), 1472);
        assert_eq!(payload_bytes_per_s(1514.0 * 8.0), 1472);
        let two = carrier_cost(2400, 2, false);
        assert!(two > 2400 && two < 2420, "{two}");
        assert!(carrier_cost(1200, 1, true) > carrier_cost(1200, 1, false));
    }
}
