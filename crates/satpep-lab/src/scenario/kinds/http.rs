//! `kind = "http"`: downloads of one file from nginx with curl, one after another (or
//! `parallel` at a time), each on a new connection; seconds from connect to last byte per
//! download.

use super::{check_count, one, Kind};
use crate::scenario::spec::{CellSpec, Metric, Size};
use crate::scenario::traffic::{fetch_all_checked, serve_one, RunRecord};
use crate::topology::Lab;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Downloads of one file, one after another, each on a new connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Http {
    /// File size, e.g. "100KB".
    pub size: Size,
    /// Downloads per repetition (rounds of `parallel` downloads each).
    #[serde(default = "one")]
    pub count: u32,
    /// Downloads started together in each round, each on its own connection (Bharadwaj
    /// 1999 §5.2's simultaneous transfers); every download's time is a sample.
    #[serde(default = "one")]
    pub parallel: u32,
    /// The client reads at most this fast ("4Mbit"; curl's `--limit-rate`): a slow reader,
    /// whose window closes while the server and the proxies still send. Absent: as fast as
    /// data arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_rate: Option<String>,
}

impl Http {
    /// The reader's limit in bytes per second.
    fn read_bps(&self) -> Result<Option<u64>, String> {
        self.read_rate
            .as_deref()
            .map(|r| {
                let bps = satpep_link::units::parse_rate(r).map_err(|e| format!("read_rate: {e}"))?;
                if bps < 8_000.0 {
                    return Err(format!("read_rate: {r} is below 1 kB/s"));
                }
                Ok((bps / 8.0) as u64)
            })
            .transpose()
    }
}

impl Kind for Http {
    fn metric(&self) -> Metric {
        Metric::Time
    }

    fn check(&self, _cell: &CellSpec) -> Result<(), String> {
        self.read_bps()?;
        check_count("parallel", self.parallel, 1, 256)?;
        check_count("count", self.count, 1, 10_000)
    }

    fn run(
        &self,
        lab: &mut Lab,
        spec: &CellSpec,
        rec: &mut RunRecord,
        _limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        let t = self;
        let size = t.size.bytes();
        let (server, max, url) = serve_one(lab, spec, "file.bin", size)?;
        let start = Instant::now();
        let read_bps = t.read_bps()?;
        for _ in 0..t.count {
            for f in fetch_all_checked(lab, &url, size, max, read_bps, t.parallel, start, tick)? {
                match f {
                    Ok(s) => {
                        rec.samples.push(s);
                        *rec.payload_bytes.get_or_insert(0) += size;
                    }
                    Err(e) => {
                        rec.failures += 1;
                        rec.errors.push(e);
                    }
                }
            }
        }
        drop(server);
        Ok(())
    }
}
