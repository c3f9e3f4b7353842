//! `kind = "ping"`: echo requests from the client to the server across an idle link; each
//! reply's round-trip time, against what the link should give (both delays plus the
//! frames' serialization). ping prints whole milliseconds above 100 ms, so the record also
//! keeps ping's own summary (min/avg/max to the microsecond).

use super::Kind;
use crate::iperf::ping;
use crate::scenario::spec::{CellSpec, Metric, Span};
use crate::scenario::traffic::RunRecord;
use crate::topology::{Lab, SERVER_V4};
use serde::{Deserialize, Serialize};

/// Echo requests across the link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ping {
    /// Echo requests.
    #[serde(default = "two_hundred")]
    pub count: u32,
    /// Time between requests, e.g. "50ms".
    #[serde(default = "fifty_ms")]
    pub interval: Span,
    /// Data bytes per request (ping -s); the frame adds 42.
    #[serde(default = "fifty_six")]
    pub size: u32,
}

fn two_hundred() -> u32 {
    200
}

fn fifty_ms() -> Span {
    Span::parse("50ms").expect("a valid duration")
}

fn fifty_six() -> u32 {
    56
}

/// What ping itself said of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PingRecord {
    /// Requests sent.
    pub sent: u32,
    /// Replies received.
    pub received: u32,
    /// Smallest RTT, ms (ping's summary, µs resolution).
    pub min_ms: f64,
    /// Mean RTT, ms.
    pub avg_ms: f64,
    /// Largest RTT, ms.
    pub max_ms: f64,
    /// What the link should give an echo: both delays plus each frame's serialization, ms
    /// (None on a kernel bridge).
    pub expected_ms: Option<f64>,
}

impl Kind for Ping {
    fn metric(&self) -> Metric {
        Metric::Rtt
    }

    fn ports(&self) -> std::ops::Range<u16> {
        // No TCP to sample.
        0..0
    }

    fn check(&self, _cell: &CellSpec) -> Result<(), String> {
        super::check_count("count", self.count, 1, 100_000)?;
        if self.interval.secs() < 0.002 {
            return Err(format!(
                "interval '{}': at least 2 ms (ping's floor)",
                self.interval
            ));
        }
        if !(16..=1472).contains(&self.size) {
            return Err(format!(
                "size = {}: between 16 (ping's timestamp) and 1472 bytes (one frame)",
                self.size
            ));
        }
        Ok(())
    }

    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        _limit_bps: Option<f64>,
        _tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        let r = match ping(lab, SERVER_V4, self.count, self.interval.secs(), self.size) {
            Ok(r) => r,
            Err(e) => return super::failed_unless_interrupted(rec, e),
        };
        if crate::interrupted() {
            return Err("interrupted".into());
        }
        rec.samples = r.rtts.iter().map(|ms| ms / 1e3).collect();
        let expected_ms = match cell.bridge {
            true => None,
            false => {
                let cfg = cell.link_spec().and_then(|l| l.resolve());
                let frame = (self.size + crate::scenario::beside::ECHO_HEADERS) as f64;
                cfg.ok()
                    .map(|c| crate::scenario::beside::echo_rtt_ms(&c, 0.0, frame))
            }
        };
        if r.received < self.count as usize {
            rec.errors.push(format!(
                "{} of {} echo requests answered",
                r.received, self.count
            ));
        }
        if r.received == 0 {
            rec.failures += 1;
        }
        rec.ping = Some(PingRecord {
            sent: self.count,
            received: r.received as u32,
            min_ms: r.min,
            avg_ms: r.avg,
            max_ms: r.max,
            expected_ms,
        });
        Ok(())
    }
}
