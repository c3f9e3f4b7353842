//! Where a result came from: which satpep, built from which commit, on which kernel and how
//! many CPUs, when. Every run record carries it (a resumed scenario may mix builds and
//! machines), and every report opens with it.

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;

/// The build and the machine a run was measured with, and when it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// satpep's version.
    pub satpep: String,
    /// The git commit it was built from (12 hex digits), or "unknown" outside a checkout.
    pub commit: String,
    /// The running kernel's release (`uname -r`).
    pub kernel: String,
    /// CPUs available to the lab.
    pub cpus: usize,
    /// When the run started, RFC 3339, UTC.
    pub started: String,
}

impl Provenance {
    /// This build on this machine, now.
    pub fn here() -> Provenance {
        Provenance {
            satpep: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("SATPEP_GIT_COMMIT").to_string(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into()),
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            started: time::OffsetDateTime::now_utc()
                .replace_nanosecond(0)
                .ok()
                .and_then(|t| t.format(&Rfc3339).ok())
                .unwrap_or_default(),
        }
    }

    /// The build and machine, without the time: runs that share it are comparable.
    fn setup(&self) -> String {
        format!(
            "satpep {} (commit {}), Linux {}, {} CPUs",
            self.satpep, self.commit, self.kernel, self.cpus
        )
    }
}

/// The distinct set-ups among `runs` (in order of first appearance, with how many runs each
/// measured) and the span of their start times, for a report's opening line and
/// results.json. Records from before provenance was kept count as "not recorded".
pub fn summarize<'a>(runs: impl IntoIterator<Item = Option<&'a Provenance>>) -> Summary {
    let mut s = Summary::default();
    for p in runs {
        let setup = p.map_or_else(|| "not recorded".to_string(), Provenance::setup);
        match s.setups.iter_mut().find(|(k, _)| *k == setup) {
            Some((_, n)) => *n += 1,
            None => s.setups.push((setup, 1)),
        }
        if let Some(p) = p.filter(|p| !p.started.is_empty()) {
            // RFC 3339 in UTC with whole seconds sorts as text.
            if s.first.as_ref().is_none_or(|f| p.started < *f) {
                s.first = Some(p.started.clone());
            }
            if s.last.as_ref().is_none_or(|l| p.started > *l) {
                s.last = Some(p.started.clone());
            }
        }
    }
    s
}

/// What [`summarize`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Each set-up and the runs it measured.
    pub setups: Vec<(String, usize)>,
    /// The earliest and the latest run's start.
    pub first: Option<String>,
    /// See `first`.
    pub last: Option<String>,
}

impl Summary {
    /// One sentence for a report: "Measured with …, runs started from … to … UTC."
    pub fn sentence(&self) -> String {
        let setups = match self.setups.as_slice() {
            [] => return "No runs recorded yet.".into(),
            [(one, _)] => one.clone(),
            many => many
                .iter()
                .map(|(k, n)| format!("{k} ({n} run{})", if *n == 1 { "" } else { "s" }))
                .collect::<Vec<_>>()
                .join("; "),
        };
        let when = match (&self.first, &self.last) {
            (Some(a), Some(b)) if a == b => format!("; the run started {a}"),
            (Some(a), Some(b)) => format!("; runs started from {a} to {b}"),
            _ => String::new(),
        };
        format!("Measured with {setups}{when}.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(commit: &str, started: &str) -> Provenance {
        Provenance {
            satpep: "0.1.0".into(),
            commit: commit.into(),
            kernel: "6.1.0".into(),
            cpus: 2,
            started: started.into(),
        }
    }

    #[test]
    fn here_names_this_build_and_kernel() {
        let h = Provenance::here();
        assert_eq!(h.satpep, env!("CARGO_PKG_VERSION"));
        assert!(!h.commit.is_empty());
        assert!(!h.kernel.is_empty() && h.kernel != "unknown", "{h:?}");
        assert!(h.cpus >= 1);
        // 2026-11-25T03:10:00Z
        assert_eq!(h.started.len(), 20, "{}", h.started);
        assert!(h.started.ends_with('Z'), "{}", h.started);
    }

    #[test]
    fn one_setup_reads_as_one_and_mixed_builds_are_counted() {
        let a = p("aaaa", "2026-11-25T03:10:00Z");
        let b = p("aaaa", "2026-11-25T03:20:00Z");
        let s = summarize([Some(&b), Some(&a)]);
        assert_eq!(
            s.sentence(),
            "Measured with satpep 0.1.0 (commit aaaa), Linux 6.1.0, 2 CPUs; runs started \
             from 2026-11-25T03:10:00Z to 2026-11-25T03:20:00Z."
        );
        let c = p("bbbb", "2026-11-25T04:00:00Z");
        let s = summarize([Some(&a), Some(&c), Some(&b), None]);
        assert_eq!(s.setups.len(), 3);
        assert_eq!(s.setups[0].1, 2);
        assert!(
            s.sentence().contains("2 CPUs (2 runs); satpep"),
            "{}",
            s.sentence()
        );
        assert!(s
            .sentence()
            .contains("(commit bbbb), Linux 6.1.0, 2 CPUs (1 run)"));
        assert!(s.sentence().contains("not recorded (1 run); runs started"));
        assert_eq!(s.last.as_deref(), Some("2026-11-25T04:00:00Z"));
        assert_eq!(summarize([]).sentence(), "No runs recorded yet.");
    }
}
