//! `kind = "page"`: a web page, its document first, then its objects with `curl --parallel`;
//! seconds from the first request to the last byte.

use super::{check_count, one, Kind};
use crate::http::HttpServer;
use crate::scenario::spec::{CellSpec, Metric, Size};
use crate::scenario::traffic::{fetch_checked, run_curl, RunRecord};
use crate::topology::{Host, Lab, SERVER_V4};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// A web page: its HTML document, then its objects over parallel connections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// Object sizes, the first being the HTML document fetched first.
    pub objects: Vec<Size>,
    /// Parallel connections for the objects after the first.
    #[serde(default = "one")]
    pub connections: u32,
}

impl Kind for Page {
    fn metric(&self) -> Metric {
        Metric::Time
    }

    fn check(&self, _cell: &CellSpec) -> Result<(), String> {
        if self.objects.is_empty() {
            return Err("objects: a page needs at least its HTML document's size".into());
        }
        check_count("connections", self.connections, 1, 64)
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
        let sizes: Vec<u64> = t.objects.iter().map(Size::bytes).collect();
        let names: Vec<String> = (0..sizes.len()).map(|i| format!("o{i}.bin")).collect();
        let files: Vec<(&str, usize)> = names
            .iter()
            .map(String::as_str)
            .zip(sizes.iter().map(|&s| s as usize))
            .collect();
        let server = HttpServer::start(lab, Host::Server, &files)?;
        let max = spec.duration.secs().ceil() as u32;
        let start = Instant::now();
        let base = format!("http://{SERVER_V4}/");
        // The document first, then its objects over `connections` parallel connections.
        let doc = fetch_checked(
            lab,
            &format!("{base}{}", names[0]),
            sizes[0],
            max,
            None,
            start,
            tick,
        )?;
        if let Err(e) = doc {
            rec.failures += 1;
            rec.errors.push(e);
            return Ok(());
        }
        if sizes.len() > 1 {
            let mut c = lab.command(Host::Client, "curl");
            c.args([
                "-s",
                "--parallel",
                "--parallel-max",
                &t.connections.to_string(),
                "--max-time",
                &max.to_string(),
                "-w",
                "%{size_download} %{http_code}\n",
            ]);
            for n in &names[1..] {
                c.args(["-o", "/dev/null", &format!("{base}{n}")]);
            }
            let (ok, out) = run_curl(c, max, start, tick)?;
            let text = String::from_utf8_lossy(&out.stdout);
            // Completion order is not request order: compare the multisets of sizes.
            let mut got: Vec<u64> = text
                .lines()
                .filter(|l| l.ends_with(" 200"))
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .collect();
            let mut want = sizes[1..].to_vec();
            got.sort_unstable();
            want.sort_unstable();
            if !ok || !out.status.success() || got != want {
                rec.failures += 1;
                rec.errors.push(format!(
                    "page objects: {} of {} arrived whole (curl {})",
                    got.len(),
                    want.len(),
                    out.status
                ));
                return Ok(());
            }
        }
        rec.samples.push(start.elapsed().as_secs_f64());
        rec.payload_bytes = Some(sizes.iter().sum());
        drop(server);
        Ok(())
    }
}
