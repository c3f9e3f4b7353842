//! `kind = "http"`: downloads of one file from nginx with curl, one after another, each on a
//! new connection; seconds from connect to last byte per download.

use super::{check_count, one, Kind};
use crate::scenario::spec::{CellSpec, Metric, Size};
use crate::scenario::traffic::{fetch_checked, serve_one, RunRecord};
use crate::topology::Lab;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Downloads of one file, one after another, each on a new connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Http {
    /// File size, e.g. "100KB".
    pub size: Size,
    /// Downloads per repetition.
    #[serde(default = "one")]
    pub count: u32,
}

impl Kind for Http {
    fn metric(&self) -> Metric {
        Metric::Time
    }

    fn check(&self, _cell: &CellSpec) -> Result<(), String> {
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
        for _ in 0..t.count {
            let f = fetch_checked(lab, &url, size, max, start, tick)?;
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
        drop(server);
        Ok(())
    }
}
