//! Link configuration: the mergeable [`LinkSpec`] users write (preset, then TOML file, then
//! flags, each overriding the previous), and the validated [`LinkConfig`] the emulator runs.
//!
//! Directions use satellite terms: **forward** is gateway → terminal (towards the user, the
//! download direction), **return** is terminal → gateway.

use crate::loss::{LossConfig, LossSpec};
use crate::presets;
use crate::trace::Trace;
use crate::units::{fmt_ms, fmt_rate, parse_duration_ns, parse_queue, parse_rate, QueueSpec};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Lowest accepted rate: below this a 1500-byte frame takes over 10 s.
pub const MIN_RATE: f64 = 1e3;
/// Highest accepted rate: far above what a userspace bridge can carry.
pub const MAX_RATE: f64 = 100e9;
/// Longest accepted one-way delay (a Mars link is out of scope).
pub const MAX_DELAY_NS: u64 = 30_000_000_000;
/// The smallest queue: one full-size Ethernet frame, so a tiny BDP cannot drop everything.
pub const MIN_QUEUE_BYTES: u64 = 1514;
/// Default queue floor when the queue is left at its default of 100 % BDP.
pub const DEFAULT_QUEUE_FLOOR: u64 = 64 * 1024;

/// One direction as written by a user; every field optional so layers can be merged.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DirectionSpec {
    /// Fixed rate with unit, e.g. "50Mbit".
    pub rate: Option<String>,
    /// Rate trace file (replaces `rate`).
    pub rate_trace: Option<PathBuf>,
    /// A rate trace written inline, in a trace file's format with `;` or newlines between
    /// points, e.g. "0 50Mbit; 8 12Mbit; 16 50Mbit; 30 50Mbit; repeat" (replaces `rate`): a
    /// scenario or a generated link carries its schedule without a file beside it.
    pub rate_schedule: Option<String>,
    /// Extra bytes per frame on the channel (framing, encapsulation).
    pub overhead: Option<u32>,
    /// Fixed one-way propagation delay, e.g. "280ms".
    pub delay: Option<String>,
    /// Delay trace file (replaces `delay`).
    pub delay_trace: Option<PathBuf>,
    /// A delay trace written inline (as `rate_schedule`; replaces `delay`).
    pub delay_schedule: Option<String>,
    /// Uniform jitter ± this much around the propagation delay.
    pub jitter: Option<String>,
    /// Let jitter reorder frames (default false: frames leave in arrival order).
    pub reorder: Option<bool>,
    /// Queue limit: "33KB", "100p" or "150%" of the bandwidth-delay product.
    pub queue: Option<String>,
    /// Other paths through the same queue: frames to or from these hosts take their own
    /// propagation delay after the shared bottleneck (a dumbbell: hosts near the bottleneck
    /// sharing it with the satellite's users). Replaced as a whole by a later layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<Vec<PathSpec>>,
    /// Loss processes, one key each (`ber`, `per`, `gilbert`, …: see [`crate::loss`]).
    #[serde(flatten)]
    pub loss: LossSpec,
    /// A built-in delay trace (presets such as `leo`); not settable from files.
    #[serde(skip)]
    pub builtin_delay_trace: Option<Trace>,
    /// A built-in rate trace (presets such as `geo-fade`); not settable from files.
    #[serde(skip)]
    pub builtin_rate_trace: Option<Trace>,
}

/// One other path through a direction's queue, as written by a user: a dumbbell's nearby
/// hosts, or one terminal of a star sharing the gateway's carrier.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PathSpec {
    /// Addresses or prefixes ("198.18.3.16/28", "2001:2:0:3::10"): a frame whose source or
    /// destination is in one takes this path.
    pub hosts: Vec<String>,
    /// Its one-way propagation delay, e.g. "12ms" (default: the direction's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// The rate the shared channel sends this path's frames at, e.g. "20Mbit" (default: the
    /// direction's rate). The channel is shared in time, as a DVB-S2 carrier under ACM: each
    /// terminal has its own modulation and coding, so a faded terminal's frames hold the
    /// carrier longer and everyone behind them waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// The path's rate as an inline trace (as a direction's `rate_schedule`; replaces `rate`):
    /// one terminal's fade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_schedule: Option<String>,
    /// The path's own loss processes (`ber`, `per`, `gilbert`), drawn from a random stream of
    /// its own (default: the direction's).
    #[serde(flatten)]
    pub loss: LossSpec,
}

/// Parses "198.18.3.16/28" or a bare address (a host prefix), naming what is wrong.
pub fn parse_prefix(s: &str) -> Result<IpNet, String> {
    let (a, l) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: std::net::IpAddr = a
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not an address or prefix"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = match l {
        None => max,
        Some(l) => match l.trim().parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => return Err(format!("'{s}': the prefix length must be 0 to {max}")),
        },
    };
    Ok(IpNet::new(addr, len).expect("a length checked against the family"))
}

/// One other path through a direction's queue, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPath {
    /// Frames to or from these take the path.
    pub hosts: Vec<IpNet>,
    /// Its one-way propagation delay, ns (None: the direction's).
    pub delay_ns: Option<u64>,
    /// The rate its frames are serialized at (None: the direction's).
    pub rate: Option<RateSource>,
    /// Its own loss processes (None: the direction's).
    pub loss: Option<LossConfig>,
}

/// Scheduled link outages as written by a user (both directions go down together).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutageSpec {
    /// Period of recurring outages, e.g. "60s".
    pub every: Option<String>,
    /// Length of each recurring outage, e.g. "5s".
    pub duration: Option<String>,
    /// Start of the first recurring outage (default: one period after start).
    pub start: Option<String>,
    /// One-off outages "FROM..TO", e.g. "10s..15s".
    #[serde(default)]
    pub down: Vec<String>,
}

/// A whole link as written by a user.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Name of a preset to start from.
    pub preset: Option<String>,
    /// Seed of the loss and jitter processes.
    pub seed: Option<u64>,
    /// Settings for both directions (overridden by `forward` / `return`).
    #[serde(default)]
    pub both: DirectionSpec,
    /// Gateway → terminal.
    #[serde(default)]
    pub forward: DirectionSpec,
    /// Terminal → gateway.
    #[serde(default, rename = "return")]
    pub ret: DirectionSpec,
    /// Outages.
    #[serde(default)]
    pub outage: OutageSpec,
}

impl DirectionSpec {
    /// Overlays `o` on `self`: every field `o` sets wins; a rate (delay) replaces a rate (delay)
    /// trace and vice versa.
    pub fn overlay(&mut self, o: &DirectionSpec) {
        // A rate (delay) of one form replaces one of every other form.
        if o.rate.is_some() || o.rate_trace.is_some() || o.rate_schedule.is_some() {
            self.builtin_rate_trace = None;
            self.rate = None;
            self.rate_trace = None;
            self.rate_schedule = None;
        }
        if o.delay.is_some() || o.delay_trace.is_some() || o.delay_schedule.is_some() {
            self.builtin_delay_trace = None;
            self.delay = None;
            self.delay_trace = None;
            self.delay_schedule = None;
        }
        macro_rules! take {
            ($($f:ident),*) => { $( if o.$f.is_some() { self.$f = o.$f.clone(); } )* };
        }
        take!(
            rate,
            rate_trace,
            rate_schedule,
            overhead,
            delay,
            delay_trace,
            delay_schedule,
            jitter,
            reorder,
            queue,
            path,
            builtin_delay_trace,
            builtin_rate_trace
        );
        self.loss.overlay(&o.loss);
    }
}

impl OutageSpec {
    fn overlay(&mut self, o: &OutageSpec) {
        if o.every.is_some() {
            self.every = o.every.clone();
        }
        if o.duration.is_some() {
            self.duration = o.duration.clone();
        }
        if o.start.is_some() {
            self.start = o.start.clone();
        }
        self.down.extend(o.down.iter().cloned());
    }
}

impl LinkSpec {
    /// Overlays `o` on `self` (see [`DirectionSpec::overlay`]); a preset named in `o` is ignored
    /// here, it is applied by [`LinkSpec::layered`].
    pub fn overlay(&mut self, o: &LinkSpec) {
        if o.seed.is_some() {
            self.seed = o.seed;
        }
        self.both.overlay(&o.both);
        // A later layer's `both` speaks for both directions: it replaces what an earlier
        // layer (a preset) set per direction, or `--preset geo --delay 300ms` kept geo's
        // 280 ms each way. Within one layer a direction still beats `both`.
        self.forward.overlay(&o.both);
        self.ret.overlay(&o.both);
        self.forward.overlay(&o.forward);
        self.ret.overlay(&o.ret);
        self.outage.overlay(&o.outage);
    }

    /// Merges layers in order (e.g. config file, then flags) on top of the preset the last
    /// layer that names one names.
    pub fn layered(layers: &[&LinkSpec]) -> Result<LinkSpec, String> {
        let preset = layers.iter().rev().find_map(|l| l.preset.clone());
        let mut out = match &preset {
            Some(name) => presets::spec(name)?,
            None => LinkSpec::default(),
        };
        for l in layers {
            out.overlay(l);
        }
        out.preset = preset;
        Ok(out)
    }

    /// Validates and resolves into a runnable configuration.
    pub fn resolve(&self) -> Result<LinkConfig, String> {
        let mut fwd = self.both.clone();
        fwd.overlay(&self.forward);
        let mut ret = self.both.clone();
        ret.overlay(&self.ret);
        let f = PartialDir::resolve("forward", &fwd)?;
        let r = PartialDir::resolve("return", &ret)?;
        // Round-trip propagation delay, for BDP-relative queues.
        let rtt_ns = f.delay.max_ns() + r.delay.max_ns();
        let forward = f.finish("forward", &fwd, rtt_ns)?;
        let ret = r.finish("return", &ret, rtt_ns)?;
        Ok(LinkConfig {
            forward,
            ret,
            outages: Outages::resolve(&self.outage)?,
            seed: self.seed.unwrap_or(1),
            preset: self.preset.clone(),
        })
    }
}

/// Where a direction's rate comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum RateSource {
    /// Constant bit/s.
    Fixed(f64),
    /// Piecewise-constant trace in bit/s.
    Trace(Trace),
}

impl RateSource {
    /// Largest rate, bit/s.
    pub fn max_bps(&self) -> f64 {
        match self {
            RateSource::Fixed(r) => *r,
            RateSource::Trace(t) => t.max(),
        }
    }

    /// Smallest rate, bit/s.
    pub fn min_bps(&self) -> f64 {
        match self {
            RateSource::Fixed(r) => *r,
            RateSource::Trace(t) => t.min(),
        }
    }

    /// Rate at time `t` ns since the emulator started, bit/s.
    pub fn at(&self, t: f64) -> f64 {
        match self {
            RateSource::Fixed(r) => *r,
            RateSource::Trace(tr) => tr.value_at(t),
        }
    }

    /// Mean rate over `[from, to]` ns since the emulator started, bit/s (a rate trace's
    /// integral over the span, in 1 ms steps).
    pub fn mean_bps(&self, from: f64, to: f64) -> f64 {
        match self {
            RateSource::Fixed(r) => *r,
            RateSource::Trace(tr) if to > from => {
                let steps = (((to - from) / 1e6).ceil() as usize).max(1);
                let dt = (to - from) / steps as f64;
                (0..steps)
                    .map(|k| tr.value_at(from + (k as f64 + 0.5) * dt))
                    .sum::<f64>()
                    / steps as f64
            }
            RateSource::Trace(tr) => tr.value_at(from),
        }
    }
}

/// Where a direction's propagation delay comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum DelaySource {
    /// Constant ns.
    Fixed(u64),
    /// Linearly interpolated trace in ns.
    Trace(Trace),
}

impl DelaySource {
    /// Largest delay, ns.
    pub fn max_ns(&self) -> u64 {
        match self {
            DelaySource::Fixed(d) => *d,
            DelaySource::Trace(t) => t.max() as u64,
        }
    }
    /// Delay at time `t` ns since start.
    pub fn at(&self, t: f64) -> f64 {
        match self {
            DelaySource::Fixed(d) => *d as f64,
            DelaySource::Trace(tr) => tr.value_at(t),
        }
    }
}

/// A resolved drop-tail queue limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueLimit {
    /// Bytes of frames not yet fully serialized.
    Bytes(u64),
    /// Frames not yet fully serialized.
    Packets(u64),
}

/// One validated direction.
#[derive(Debug, Clone, PartialEq)]
pub struct DirectionConfig {
    /// Channel rate.
    pub rate: RateSource,
    /// Extra bytes charged per frame.
    pub overhead: u32,
    /// Propagation delay.
    pub delay: DelaySource,
    /// Uniform jitter amplitude, ns.
    pub jitter_ns: u64,
    /// Whether jitter may reorder frames.
    pub reorder: bool,
    /// Bottleneck queue.
    pub queue: QueueLimit,
    /// Loss processes.
    pub loss: LossConfig,
    /// Other paths through the queue, first match wins.
    pub paths: Vec<HostPath>,
}

impl DirectionConfig {
    /// Index in `paths` of the path of a frame between `src` and `dst`, if it takes one.
    pub fn path_of(&self, src: std::net::IpAddr, dst: std::net::IpAddr) -> Option<usize> {
        self.paths
            .iter()
            .position(|p| p.hosts.iter().any(|h| h.contains(&src) || h.contains(&dst)))
    }
}

struct PartialDir {
    rate: RateSource,
    delay: DelaySource,
}

impl PartialDir {
    fn resolve(dir: &str, s: &DirectionSpec) -> Result<PartialDir, String> {
        let given = [
            s.rate.is_some(),
            s.rate_trace.is_some(),
            s.rate_schedule.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(format!(
                "{dir}: give one of rate, rate_trace and rate_schedule"
            ));
        }
        let given = [
            s.delay.is_some(),
            s.delay_trace.is_some(),
            s.delay_schedule.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(format!(
                "{dir}: give one of delay, delay_trace and delay_schedule"
            ));
        }
        let rate = match (&s.rate, &s.rate_trace) {
            (None, None) if s.rate_schedule.is_some() => {
                let t = Trace::parse_rate_inline(s.rate_schedule.as_deref().expect("checked"))
                    .map_err(|e| format!("{dir} rate_schedule: {e}"))?;
                if t.max() > MAX_RATE || t.min() < MIN_RATE {
                    return Err(format!(
                        "{dir} rate_schedule: rates must be between {} and {}",
                        fmt_rate(MIN_RATE),
                        fmt_rate(MAX_RATE)
                    ));
                }
                RateSource::Trace(t)
            }
            (None, None) if s.builtin_rate_trace.is_some() => {
                RateSource::Trace(s.builtin_rate_trace.clone().expect("checked"))
            }
            (Some(r), _) => {
                let v = parse_rate(r).map_err(|e| format!("{dir} rate: {e}"))?;
                if !(MIN_RATE..=MAX_RATE).contains(&v) {
                    return Err(format!(
                        "{dir} rate {}: must be between {} and {}",
                        fmt_rate(v),
                        fmt_rate(MIN_RATE),
                        fmt_rate(MAX_RATE)
                    ));
                }
                RateSource::Fixed(v)
            }
            (None, Some(p)) => {
                let t = Trace::load_rate(p).map_err(|e| format!("{dir} rate trace: {e}"))?;
                if t.max() > MAX_RATE {
                    return Err(format!(
                        "{dir} rate trace {}: rates must be at most {}",
                        p.display(),
                        fmt_rate(MAX_RATE)
                    ));
                }
                RateSource::Trace(t)
            }
            (None, None) => {
                return Err(format!(
                    "no {dir} rate: give --rate (or --{}-rate) or a --preset",
                    &dir[..3]
                ))
            }
        };
        let delay = match (&s.delay, &s.delay_trace, &s.builtin_delay_trace) {
            (Some(d), _, _) => {
                DelaySource::Fixed(parse_duration_ns(d).map_err(|e| format!("{dir} delay: {e}"))?)
            }
            (None, Some(p), _) => DelaySource::Trace(
                Trace::load_delay(p).map_err(|e| format!("{dir} delay trace: {e}"))?,
            ),
            (None, None, _) if s.delay_schedule.is_some() => DelaySource::Trace(
                Trace::parse_delay_inline(s.delay_schedule.as_deref().expect("checked"))
                    .map_err(|e| format!("{dir} delay_schedule: {e}"))?,
            ),
            (None, None, Some(t)) => DelaySource::Trace(t.clone()),
            (None, None, None) => DelaySource::Fixed(0),
        };
        if delay.max_ns() > MAX_DELAY_NS {
            return Err(format!(
                "{dir} delay {} exceeds the maximum of {}",
                fmt_ms(delay.max_ns()),
                fmt_ms(MAX_DELAY_NS)
            ));
        }
        Ok(PartialDir { rate, delay })
    }

    fn finish(self, dir: &str, s: &DirectionSpec, rtt_ns: u64) -> Result<DirectionConfig, String> {
        let overhead = s.overhead.unwrap_or(0);
        if overhead > 1000 {
            return Err(format!(
                "{dir} overhead {overhead} bytes per frame is implausible (max 1000)"
            ));
        }
        let jitter_ns = match &s.jitter {
            Some(j) => parse_duration_ns(j).map_err(|e| format!("{dir} jitter: {e}"))?,
            None => 0,
        };
        if jitter_ns > MAX_DELAY_NS {
            return Err(format!("{dir} jitter {} is implausible", fmt_ms(jitter_ns)));
        }
        let bdp = self.rate.max_bps() * rtt_ns as f64 / 8e9;
        let queue = match &s.queue {
            None => QueueLimit::Bytes((bdp.round() as u64).max(DEFAULT_QUEUE_FLOOR)),
            Some(q) => match parse_queue(q).map_err(|e| format!("{dir} queue: {e}"))? {
                QueueSpec::Bytes(b) => QueueLimit::Bytes(b),
                QueueSpec::Packets(p) => QueueLimit::Packets(p),
                QueueSpec::BdpPercent(pct) => {
                    QueueLimit::Bytes(((bdp * pct / 100.0).round() as u64).max(MIN_QUEUE_BYTES))
                }
            },
        };
        let loss = s.loss.resolve(dir)?;
        let mut paths = Vec::new();
        for (i, p) in s.path.iter().flatten().enumerate() {
            let what = format!("{dir} path #{}", i + 1);
            if p.hosts.is_empty() {
                return Err(format!(
                    "{what}: hosts: give at least one address or prefix"
                ));
            }
            let hosts = p
                .hosts
                .iter()
                .map(|h| parse_prefix(h).map_err(|e| format!("{what}: hosts: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let delay_ns = match &p.delay {
                None => None,
                Some(d) => {
                    let ns = parse_duration_ns(d).map_err(|e| format!("{what}: delay: {e}"))?;
                    if ns > MAX_DELAY_NS {
                        return Err(format!("{what}: delay {} is implausible", fmt_ms(ns)));
                    }
                    Some(ns)
                }
            };
            let rate = path_rate(&what, p)?;
            let loss = (p.loss != LossSpec::default())
                .then(|| p.loss.resolve(&what))
                .transpose()?;
            paths.push(HostPath {
                hosts,
                delay_ns,
                rate,
                loss,
            });
        }
        Ok(DirectionConfig {
            rate: self.rate,
            overhead,
            delay: self.delay,
            jitter_ns,
            reorder: s.reorder.unwrap_or(false),
            queue,
            loss,
            paths,
        })
    }
}

/// A path's own rate (`rate` or `rate_schedule`), checked as a direction's.
fn path_rate(what: &str, p: &PathSpec) -> Result<Option<RateSource>, String> {
    let rate = match (&p.rate, &p.rate_schedule) {
        (Some(_), Some(_)) => return Err(format!("{what}: give one of rate and rate_schedule")),
        (None, None) => return Ok(None),
        (Some(r), None) => {
            RateSource::Fixed(parse_rate(r).map_err(|e| format!("{what}: rate: {e}"))?)
        }
        (None, Some(t)) => RateSource::Trace(
            Trace::parse_rate_inline(t).map_err(|e| format!("{what}: rate_schedule: {e}"))?,
        ),
    };
    if rate.max_bps() > MAX_RATE || rate.min_bps() < MIN_RATE {
        return Err(format!(
            "{what}: rates must be between {} and {}",
            fmt_rate(MIN_RATE),
            fmt_rate(MAX_RATE)
        ));
    }
    Ok(Some(rate))
}

/// Times the link is down, both directions at once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outages {
    /// Recurring outages: (first start, period, duration), ns.
    pub periodic: Option<(u64, u64, u64)>,
    /// One-off outages [from, to), ns.
    pub once: Vec<(u64, u64)>,
}

impl Outages {
    fn resolve(s: &OutageSpec) -> Result<Outages, String> {
        let dur = |k: &str, v: &Option<String>| -> Result<Option<u64>, String> {
            v.as_deref()
                .map(|x| parse_duration_ns(x).map_err(|e| format!("outage {k}: {e}")))
                .transpose()
        };
        let every = dur("every", &s.every)?;
        let duration = dur("duration", &s.duration)?;
        let start = dur("start", &s.start)?;
        let periodic = match (every, duration) {
            (None, None) if start.is_none() => None,
            (Some(e), Some(d)) => {
                if d == 0 || d >= e {
                    return Err(format!(
                        "outage duration {} must be > 0 and shorter than its period {}",
                        fmt_ms(d),
                        fmt_ms(e)
                    ));
                }
                Some((start.unwrap_or(e), e, d))
            }
            _ => {
                return Err(
                    "recurring outages need both an interval (--outage-every) and a length (--outage-duration)"
                        .into(),
                )
            }
        };
        let mut once = Vec::new();
        for d in &s.down {
            let (a, b) = d.split_once("..").ok_or_else(|| {
                format!("outage '{d}': write a one-off outage as FROM..TO, e.g. 10s..15s")
            })?;
            let a = parse_duration_ns(a).map_err(|e| format!("outage '{d}': {e}"))?;
            let b = parse_duration_ns(b).map_err(|e| format!("outage '{d}': {e}"))?;
            if b <= a {
                return Err(format!("outage '{d}': the end must come after the start"));
            }
            once.push((a, b));
        }
        Ok(Outages { periodic, once })
    }

    /// Whether the link is down at any instant of [a, b] (ns since start).
    pub fn overlaps(&self, a: f64, b: f64) -> bool {
        if self
            .once
            .iter()
            .any(|&(x, y)| a < y as f64 && b >= x as f64)
        {
            return true;
        }
        if let Some((start, every, dur)) = self.periodic {
            let (start, every, dur) = (start as f64, every as f64, dur as f64);
            if b < start {
                return false;
            }
            // The latest outage starting at or before b.
            let k = ((b - start) / every).floor();
            let s = start + k * every;
            return a < s + dur;
        }
        false
    }

    /// Whether any outage is configured.
    pub fn is_empty(&self) -> bool {
        self.periodic.is_none() && self.once.is_empty()
    }
}

/// A validated link, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Gateway → terminal.
    pub forward: DirectionConfig,
    /// Terminal → gateway.
    pub ret: DirectionConfig,
    /// Both directions' outages.
    pub outages: Outages,
    /// Seed of the random processes.
    pub seed: u64,
    /// Preset it started from, if any.
    pub preset: Option<String>,
}

impl LinkConfig {
    /// Whether a rate or delay trace changes the link over time (what it does then counts
    /// from the emulator's start).
    pub fn varies(&self) -> bool {
        [&self.forward, &self.ret].iter().any(|d| {
            matches!(d.rate, RateSource::Trace(_))
                || matches!(d.delay, DelaySource::Trace(_))
                || d.paths
                    .iter()
                    .any(|p| matches!(p.rate, Some(RateSource::Trace(_))))
        })
    }
}

impl DirectionConfig {
    /// One-line human summary.
    pub fn describe(&self) -> String {
        let rate = match &self.rate {
            RateSource::Fixed(r) => fmt_rate(*r),
            RateSource::Trace(t) => format!(
                "trace ({} points, max {}{})",
                t.len(),
                fmt_rate(t.max()),
                if t.repeats() { ", repeating" } else { "" }
            ),
        };
        let delay = match &self.delay {
            DelaySource::Fixed(d) => fmt_ms(*d),
            DelaySource::Trace(t) => format!(
                "trace ({} points, max {}{})",
                t.len(),
                fmt_ms(t.max() as u64),
                if t.repeats() { ", repeating" } else { "" }
            ),
        };
        let queue = match self.queue {
            QueueLimit::Bytes(b) => format!("{b} B"),
            QueueLimit::Packets(p) => format!("{p} frames"),
        };
        let mut s = format!("{rate}, delay {delay}, queue {queue}");
        if self.overhead > 0 {
            s += &format!(", +{} B/frame", self.overhead);
        }
        if self.jitter_ns > 0 {
            s += &format!(
                ", jitter ±{}{}",
                fmt_ms(self.jitter_ns),
                if self.reorder { " (reordering)" } else { "" }
            );
        }
        s += &self.loss.describe();
        for p in &self.paths {
            let hosts: Vec<String> = p.hosts.iter().map(IpNet::to_string).collect();
            let mut how = Vec::new();
            if let Some(d) = p.delay_ns {
                how.push(fmt_ms(d));
            }
            match &p.rate {
                Some(RateSource::Fixed(r)) => how.push(fmt_rate(*r)),
                Some(RateSource::Trace(t)) => {
                    how.push(format!("{}..{}", fmt_rate(t.min()), fmt_rate(t.max())))
                }
                None => {}
            }
            if let Some(l) = &p.loss {
                how.push(l.describe().trim_start_matches(", ").to_string());
            }
            if how.is_empty() {
                how.push("the same".into());
            }
            s += &format!(", {} via {}", hosts.join(" "), how.join(" "));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml_text: &str) -> LinkSpec {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn preset_then_overrides() {
        let user = spec("preset = 'geo'\n[forward]\nber = 1e-6\n[return]\nrate = '5Mbit'\n");
        let cfg = LinkSpec::layered(&[&user]).unwrap().resolve().unwrap();
        assert_eq!(cfg.forward.rate, RateSource::Fixed(50e6));
        assert_eq!(cfg.ret.rate, RateSource::Fixed(5e6));
        assert_eq!(cfg.forward.loss.ber.map(|b| b.ber), Some(1e-6));
        assert_eq!(cfg.ret.loss.ber, None);
        assert_eq!(cfg.forward.delay, DelaySource::Fixed(280_000_000));
        // 100 % BDP of 50 Mbit/s × 560 ms.
        assert_eq!(cfg.forward.queue, QueueLimit::Bytes(3_500_000));
    }

    /// A user's `both` overrides what the preset set per direction (geo's 280 ms each way
    /// and its rates); the user's own direction keys still win over their `both`.
    #[test]
    fn a_users_both_overrides_the_presets_directions() {
        let user = spec("preset = 'geo'\n[both]\ndelay = '300ms'\nrate = '20Mbit'\n[forward]\nrate = '100Mbit'\n");
        let cfg = LinkSpec::layered(&[&user]).unwrap().resolve().unwrap();
        assert_eq!(cfg.forward.delay, DelaySource::Fixed(300_000_000));
        assert_eq!(cfg.ret.delay, DelaySource::Fixed(300_000_000));
        assert_eq!(cfg.forward.rate, RateSource::Fixed(100e6));
        assert_eq!(cfg.ret.rate, RateSource::Fixed(20e6));
        // Later layers (flags after a file) likewise.
        let file = spec("preset = 'geo'\n[forward]\ndelay = '250ms'\n");
        let flags = spec("[both]\ndelay = '10ms'\n");
        let cfg = LinkSpec::layered(&[&file, &flags])
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(cfg.forward.delay, DelaySource::Fixed(10_000_000));
        assert_eq!(cfg.ret.delay, DelaySource::Fixed(10_000_000));
    }

    #[test]
    fn both_applies_to_each_direction_and_direction_wins() {
        let s = spec("[both]\nrate='1Mbit'\ndelay='10ms'\nqueue='150%'\n[forward]\nrate='2Mbit'\n");
        let c = s.resolve().unwrap();
        assert_eq!(c.forward.rate, RateSource::Fixed(2e6));
        assert_eq!(c.ret.rate, RateSource::Fixed(1e6));
        // 150 % of 1 Mbit/s × 20 ms = 3750 B.
        assert_eq!(c.ret.queue, QueueLimit::Bytes(3750));
    }

    #[test]
    fn inline_schedules_are_traces_and_replace_other_forms() {
        let s = spec("preset = 'geo'\n[forward]\nrate_schedule = '0 50Mbit; 8 10Mbit; 12 50Mbit; 20 50Mbit; repeat'\ndelay_schedule = \"0 280ms\\n10 300ms\"\n");
        let c = LinkSpec::layered(&[&s]).unwrap().resolve().unwrap();
        let RateSource::Trace(t) = &c.forward.rate else {
            panic!("{:?}", c.forward.rate)
        };
        assert!(t.repeats() && t.max() == 50e6 && t.min() == 10e6);
        assert!(matches!(c.forward.delay, DelaySource::Trace(_)));
        // The return link keeps the preset's fixed rate.
        assert_eq!(c.ret.rate, RateSource::Fixed(10e6));
        // A later layer's fixed rate replaces the schedule.
        let over = spec("[forward]\nrate = '20Mbit'\n");
        let c = LinkSpec::layered(&[&s, &over]).unwrap().resolve().unwrap();
        assert_eq!(c.forward.rate, RateSource::Fixed(20e6));
        // Two forms in one layer, and a bad point, are named.
        let e = spec("[both]\nrate = '1Mbit'\nrate_schedule = '0 1Mbit'\n")
            .resolve()
            .unwrap_err();
        assert!(
            e.contains("one of rate, rate_trace and rate_schedule"),
            "{e}"
        );
        let e = spec("[both]\nrate_schedule = '0 1Mbit; 5 fast'\n")
            .resolve()
            .unwrap_err();
        assert!(e.contains("rate_schedule") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let e = spec("[both]\nrate='0'\n").resolve().unwrap_err();
        assert!(e.contains("forward rate") && e.contains("between"), "{e}");
        let e = spec("[both]\nrate='1Mbit'\nber=1.0\n")
            .resolve()
            .unwrap_err();
        assert!(e.contains("ber 1 is outside [0, 1)"), "{e}");
        let e = spec("[both]\nrate='1Mbit'\n[return]\nber=-0.1\n")
            .resolve()
            .unwrap_err();
        assert!(e.starts_with("return ber"), "{e}");
        let e = spec("[both]\nrate='1Mbit'\ndelay='5'\n")
            .resolve()
            .unwrap_err();
        assert!(e.contains("delay") && e.contains("unit"), "{e}");
        let e = spec("[both]\nrate='200Gbit'\n").resolve().unwrap_err();
        assert!(e.contains("between"), "{e}");
        let e = spec("[both]\n").resolve().unwrap_err();
        assert!(e.contains("no forward rate"), "{e}");
        let e = spec("[both]\nrate='1Mbit'\n[outage]\nevery='5s'\n")
            .resolve()
            .unwrap_err();
        assert!(e.contains("outage"), "{e}");
        let e = toml::from_str::<LinkSpec>("[both]\nrat='1Mbit'\n").unwrap_err();
        assert!(e.to_string().contains("rat"), "{e}");
        let e = LinkSpec::layered(&[&spec("preset='mars'")]).unwrap_err();
        assert!(e.contains("mars") && e.contains("geo"), "{e}");
    }

    #[test]
    fn outages() {
        let s =
            spec("[both]\nrate='1Mbit'\n[outage]\nevery='60s'\nduration='5s'\ndown=['10s..12s']\n");
        let o = s.resolve().unwrap().outages;
        let s_ = 1e9;
        assert!(!o.overlaps(1.0 * s_, 2.0 * s_));
        assert!(o.overlaps(11.0 * s_, 11.5 * s_));
        assert!(o.overlaps(9.9 * s_, 10.1 * s_));
        assert!(!o.overlaps(12.0 * s_, 13.0 * s_));
        assert!(o.overlaps(62.0 * s_, 62.1 * s_));
        assert!(!o.overlaps(65.0 * s_, 119.0 * s_));
        assert!(o.overlaps(119.0 * s_, 120.0 * s_));
    }
}
