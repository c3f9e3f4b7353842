//! Time-varying link parameters read from trace files: the rate (adaptive coding and modulation,
//! rain fades) and the one-way delay (LEO/MEO passes and handovers).
//!
//! A trace file is plain text, one point per line: a time in seconds since the emulator started
//! (a bare number, or with a unit such as `1500ms`) and a value with its unit:
//!
//! ```text
//! # time   one-way delay
//! 0        25ms
//! 14.999   31ms
//! 15       22ms     # a handover: two points at (almost) the same time make a step
//! repeat            # optional: start over after the last point
//! ```
//!
//! Rate traces are piecewise constant (a modem switches modulation in steps); delay traces are
//! interpolated linearly between points (a satellite's range changes continuously), with steps
//! written as two close points. Before the first point the first value holds; after the last,
//! the last value holds, unless `repeat` makes the trace periodic with period = the last time.

use crate::units::{parse_duration_ns, parse_rate, UnitError};
use std::path::Path;

/// How values between two points are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interp {
    /// The value of the latest point holds until the next one.
    Step,
    /// Straight line between neighbouring points.
    Linear,
}

/// A parsed trace: times in nanoseconds, values in the trace's unit (bit/s or ns).
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    points: Vec<(f64, f64)>,
    period: Option<f64>,
    interp: Interp,
}

impl Trace {
    /// Builds a trace from points `(time_ns, value)`; times must not decrease.
    pub fn new(points: Vec<(f64, f64)>, repeat: bool, interp: Interp) -> Result<Trace, String> {
        if points.is_empty() {
            return Err("a trace needs at least one point".into());
        }
        for w in points.windows(2) {
            if w[1].0 < w[0].0 {
                return Err(format!(
                    "time goes backwards ({} s after {} s)",
                    w[1].0 / 1e9,
                    w[0].0 / 1e9
                ));
            }
        }
        let period = if repeat {
            let last = points.last().unwrap().0;
            if last <= 0.0 {
                return Err("'repeat' needs a last point after time 0".into());
            }
            Some(last)
        } else {
            None
        };
        Ok(Trace {
            points,
            period,
            interp,
        })
    }

    /// Reads a rate trace (values in bit/s, all > 0).
    pub fn load_rate(path: &Path) -> Result<Trace, String> {
        Self::load(path, Interp::Step, parse_rate)?
            .positive()
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses a rate trace written inline (`;` or newlines between points).
    pub fn parse_rate_inline(text: &str) -> Result<Trace, String> {
        Self::parse(&text.replace(';', "\n"), Interp::Step, parse_rate)?.positive()
    }

    /// The trace, if every rate in it is positive.
    fn positive(self) -> Result<Trace, String> {
        match self.points.iter().find(|p| p.1 <= 0.0) {
            Some(p) => Err(format!(
                "rate at {} s is not positive (use an outage for a dead link)",
                p.0 / 1e9
            )),
            None => Ok(self),
        }
    }

    /// Parses a delay trace written inline (`;` or newlines between points).
    pub fn parse_delay_inline(text: &str) -> Result<Trace, String> {
        Self::parse(&text.replace(';', "\n"), Interp::Linear, |s| {
            parse_duration_ns(s).map(|v| v as f64)
        })
    }

    /// Reads a delay trace (values in ns).
    pub fn load_delay(path: &Path) -> Result<Trace, String> {
        Self::load(path, Interp::Linear, |s| {
            parse_duration_ns(s).map(|v| v as f64)
        })
    }

    fn load(
        path: &Path,
        interp: Interp,
        parse_value: impl Fn(&str) -> Result<f64, UnitError>,
    ) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
        Self::parse(&text, interp, parse_value).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses trace text; errors name the line.
    pub fn parse(
        text: &str,
        interp: Interp,
        parse_value: impl Fn(&str) -> Result<f64, UnitError>,
    ) -> Result<Trace, String> {
        let mut points = Vec::new();
        let mut repeat = false;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap().trim();
            if line.is_empty() {
                continue;
            }
            let n = i + 1;
            if repeat {
                return Err(format!("line {n}: nothing may follow 'repeat'"));
            }
            if line == "repeat" {
                repeat = true;
                continue;
            }
            let mut f = line.split_whitespace();
            let (Some(ts), Some(vs), None) = (f.next(), f.next(), f.next()) else {
                return Err(format!(
                    "line {n}: expected '<time> <value>', found '{line}'"
                ));
            };
            let t = match ts.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => v * 1e9,
                Ok(_) => return Err(format!("line {n}: time '{ts}' must be ≥ 0")),
                Err(_) => parse_duration_ns(ts).map_err(|e| format!("line {n}: {e}"))? as f64,
            };
            let v = parse_value(vs).map_err(|e| format!("line {n}: {e}"))?;
            points.push((t, v));
        }
        Trace::new(points, repeat, interp)
    }

    fn local_time(&self, t: f64) -> (f64, f64) {
        match self.period {
            Some(p) => {
                let k = (t / p).floor();
                (t - k * p, k * p)
            }
            None => (t, 0.0),
        }
    }

    /// The value at time `t` (ns since start).
    pub fn value_at(&self, t: f64) -> f64 {
        let (lt, _) = self.local_time(t);
        let pts = &self.points;
        let idx = pts.partition_point(|p| p.0 <= lt);
        if idx == 0 {
            return pts[0].1;
        }
        if idx == pts.len() {
            return pts[idx - 1].1;
        }
        let (t0, v0) = pts[idx - 1];
        let (t1, v1) = pts[idx];
        match self.interp {
            Interp::Step => v0,
            Interp::Linear if t1 > t0 => v0 + (v1 - v0) * (lt - t0) / (t1 - t0),
            Interp::Linear => v1,
        }
    }

    /// For step traces: the value at `t` and the absolute time of the next change (∞ if none).
    pub fn segment_at(&self, t: f64) -> (f64, f64) {
        let (lt, base) = self.local_time(t);
        let pts = &self.points;
        let idx = pts.partition_point(|p| p.0 <= lt);
        let v = if idx == 0 { pts[0].1 } else { pts[idx - 1].1 };
        let next = if idx < pts.len() {
            base + pts[idx].0
        } else if let Some(p) = self.period {
            base + p
        } else {
            f64::INFINITY
        };
        (v, next.max(t))
    }

    /// For step traces: the times in `[from, to]` (ns since start) at which the value falls
    /// (a rain fade's steps down), in order.
    pub fn drops(&self, from: f64, to: f64) -> Vec<f64> {
        let mut out = Vec::new();
        let (mut t, mut v) = (from, self.value_at(from));
        loop {
            let (_, next) = self.segment_at(t);
            if !next.is_finite() || next > to || next <= t {
                return out;
            }
            let nv = self.value_at(next);
            if nv < v {
                out.push(next);
            }
            (t, v) = (next, nv);
        }
    }

    /// The largest value anywhere in the trace.
    pub fn max(&self) -> f64 {
        self.points.iter().map(|p| p.1).fold(f64::MIN, f64::max)
    }

    /// The smallest value anywhere in the trace.
    pub fn min(&self) -> f64 {
        self.points.iter().map(|p| p.1).fold(f64::MAX, f64::min)
    }

    /// Whether the trace repeats.
    pub fn repeats(&self) -> bool {
        self.period.is_some()
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Always false: a trace has at least one point.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delay(text: &str) -> Result<Trace, String> {
        Trace::parse(text, Interp::Linear, |s| {
            parse_duration_ns(s).map(|v| v as f64)
        })
    }

    #[test]
    fn linear_and_repeat() {
        let t = delay("0 20ms\n10 30ms\n10 20ms # handover\nrepeat\n").unwrap();
        assert_eq!(t.value_at(0.0), 20e6);
        assert!((t.value_at(5e9) - 25e6).abs() < 1.0);
        // Period 10 s: t=15 s is t=5 s again.
        assert!((t.value_at(15e9) - 25e6).abs() < 1.0);
    }

    #[test]
    fn step_segments() {
        let t = Trace::parse("0 10Mbit\n2 5Mbit\n", Interp::Step, parse_rate).unwrap();
        assert_eq!(t.segment_at(1e9), (10e6, 2e9));
        assert_eq!(t.segment_at(3e9), (5e6, f64::INFINITY));
        assert_eq!(t.value_at(1.999e9), 10e6);
    }

    #[test]
    fn drops_are_the_steps_down_across_repeats() {
        let t = Trace::parse(
            "0 50Mbit\n3 25Mbit\n5 12Mbit\n7 50Mbit\n10 50Mbit\nrepeat\n",
            Interp::Step,
            parse_rate,
        )
        .unwrap();
        assert_eq!(t.drops(0.0, 16e9), vec![3e9, 5e9, 13e9, 15e9]);
        assert_eq!(t.drops(4e9, 14e9), vec![5e9, 13e9]);
        let flat = Trace::parse("0 10Mbit\n", Interp::Step, parse_rate).unwrap();
        assert!(flat.drops(0.0, 1e12).is_empty());
    }

    #[test]
    fn errors_name_the_line() {
        assert!(delay("0 20ms\n1 zz\n").unwrap_err().contains("line 2"));
        assert!(delay("5 20ms\n1 20ms\n").unwrap_err().contains("backwards"));
        assert!(delay("0 20ms 3\n").unwrap_err().contains("line 1"));
        assert!(delay("# nothing\n").unwrap_err().contains("at least one"));
        assert!(delay("0 1ms\nrepeat\n2 1ms")
            .unwrap_err()
            .contains("follow"));
    }
}

#[cfg(test)]
mod shipped_examples {
    use super::*;

    /// The example traces in docs/traces parse, so the documentation cannot drift.
    #[test]
    fn docs_traces_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/traces");
        let fade = Trace::load_rate(&dir.join("rain-fade.trace")).unwrap();
        assert!(fade.repeats());
        assert_eq!(fade.value_at(40e9), 12e6);
        let leo = Trace::load_delay(&dir.join("leo-handover.trace")).unwrap();
        assert!((leo.value_at(7.5e9) - 16e6).abs() < 1.0);
        assert!((leo.value_at(37.5e9) - 16e6).abs() < 1.0);
    }
}
