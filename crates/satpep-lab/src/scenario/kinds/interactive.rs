//! `kind = "interactive"`: small request/responses on one keep-alive connection with curl;
//! seconds per request/response, the first (which also connects) left out.

use super::{check_count, one, Kind};
use crate::scenario::spec::{CellSpec, Metric, Size};
use crate::scenario::traffic::{run_curl, serve_one, RunRecord};
use crate::topology::{Host, Lab};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Small request/responses on one keep-alive connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interactive {
    /// Response size, e.g. "100B".
    pub size: Size,
    /// Requests (after a first one that also connects).
    #[serde(default = "one")]
    pub count: u32,
}

impl Kind for Interactive {
    fn metric(&self) -> Metric {
        Metric::Latency
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
        let (server, max, url) = serve_one(lab, spec, "r.bin", size)?;
        // count + 1 requests on one keep-alive connection; the first also opens it.
        let mut c = lab.command(Host::Client, "curl");
        c.args([
            "-s",
            "--max-time",
            &max.to_string(),
            "-w",
            "%{time_total} %{size_download} %{http_code} %{num_connects}\n",
        ]);
        for _ in 0..=t.count {
            c.args(["-o", "/dev/null", &url]);
        }
        let start = Instant::now();
        let (ok, out) = run_curl(c, max, start, tick)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut reconnects = 0;
        for (k, l) in text.lines().enumerate() {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (Some(ts), Some(b), Some(code), Some(conn)) = (w.first(), w.get(1), w.get(2), w.get(3))
            else {
                continue;
            };
            if *code != "200" || b.parse::<u64>().ok() != Some(size) {
                rec.failures += 1;
                rec.errors
                    .push(format!("request {k}: HTTP {code}, {b} of {size} bytes"));
                continue;
            }
            if k > 0 {
                if *conn != "0" {
                    reconnects += 1;
                }
                rec.samples.push(ts.parse().unwrap_or(0.0));
            }
        }
        if !ok || rec.samples.len() < t.count as usize {
            rec.failures += 1;
            rec.errors.push(format!(
                "{} of {} responses arrived",
                rec.samples.len(),
                t.count
            ));
        }
        if reconnects > 0 {
            rec.errors
                .push(format!("{reconnects} requests needed a new connection"));
        }
        drop(server);
        Ok(())
    }
}
