//! One progress line for long lab runs: rewritten in place on a terminal, one line per step
//! otherwise (logs, CI).

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// Progress over a known number of steps of roughly known length.
pub struct Progress {
    total: usize,
    step_secs: f64,
    start: Instant,
    tty: bool,
    quiet: bool,
}

impl Progress {
    /// `total` steps of about `step_secs` each; `quiet` prints nothing.
    pub fn new(total: usize, step_secs: f64, quiet: bool) -> Progress {
        Progress {
            total,
            step_secs,
            start: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            quiet,
        }
    }

    fn eta(&self, done_steps: f64) -> String {
        let el = self.start.elapsed().as_secs_f64();
        let per = if done_steps > 0.2 {
            el / done_steps
        } else {
            self.step_secs
        };
        let left = (per * (self.total as f64 - done_steps)).max(0.0) as u64;
        format!("ETA {}:{:02}", left / 60, left % 60)
    }

    /// Reports `secs` into step `i` (0-based) named `what`.
    pub fn tick(&self, i: usize, what: &str, secs: f64) {
        if self.quiet || !self.tty {
            return;
        }
        let done = i as f64 + (secs / self.step_secs).min(0.99);
        eprint!(
            "\r\x1b[K[{}/{}] {what}  {:.0}/{:.0} s  {}",
            i + 1,
            self.total,
            secs,
            self.step_secs,
            self.eta(done)
        );
        let _ = std::io::stderr().flush();
    }

    /// Reports that step `i` finished with `result`.
    pub fn done(&self, i: usize, what: &str, result: &str) {
        if self.quiet {
            return;
        }
        if self.tty {
            eprint!("\r\x1b[K");
        }
        eprintln!(
            "[{}/{}] {what}: {result}  ({})",
            i + 1,
            self.total,
            self.eta(i as f64 + 1.0)
        );
    }
}
