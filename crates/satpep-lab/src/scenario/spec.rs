//! Scenario files: what a user writes, and the list of cells it expands into.
//!
//! A scenario is one TOML document. Its top level holds the settings shared by every cell (link,
//! PEP, hosts, traffic, duration, repetitions …); `[[config]]` tables name the configurations
//! being compared, each a partial document laid over the base; `[[sweep]]` axes each set one
//! dotted key (`link.both.ber`, `traffic.size`, `hosts.gateway.initcwnd`, …) to each of its
//! values. A cell is base ⊕ config ⊕ one point of the sweep, checked like a whole file, so any
//! setting can be swept and a bad one is reported with the config and point it came from.
//! `[quick]` is laid over the whole document when `--quick` is given.

pub use super::kinds::bulk::Direction;
pub use super::kinds::Traffic;
pub use crate::topology::PepMode;
use satpep_link::config::LinkSpec;
use satpep_link::units::parse_duration_ns;
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

/// Keys of the document that are not part of a cell.
const META_KEYS: [&str; 12] = [
    "name",
    "statistics",
    "targets",
    "title",
    "reproduces",
    "notes",
    "config",
    "sweep",
    "reference",
    "quick",
    "part",
    "draw",
];

/// A whole scenario, parsed and expanded.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// Short name (results directory, report title).
    pub name: String,
    /// One-line description.
    pub title: String,
    /// The document section this reproduces, if any.
    pub reproduces: Option<String>,
    /// Free text for the report.
    pub notes: Option<String>,
    /// Its parts (one when the file has no `[[part]]`), each a sweep with its own table.
    pub parts: Vec<Part>,
    /// Every cell of every part, in run order.
    pub cells: Vec<Cell>,
    /// Targets the report checks, if the scenario sets them.
    pub targets: Option<Targets>,
    /// Laid over every cell last.
    #[serde(skip)]
    overrides: Table,
}

/// The real-links targets a report checks per cell of satpep's configurations: goodput
/// ≥ `goodput` of the physical limit and ≥ the best of the `end_to_end` configurations at the
/// same point; the probe's queueing delay p95 ≤ max(`queue_ms`, `queue_share` × base RTT);
/// beside a competing flow, a share within `share_pct`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    /// satpep's configurations (the ones checked).
    pub satpep: Vec<String>,
    /// The end-to-end configurations to beat.
    pub end_to_end: Vec<String>,
    /// Least share of the physical limit.
    #[serde(default = "goodput_target")]
    pub goodput: f64,
    /// Queueing delay bound, ms …
    #[serde(default = "queue_target")]
    pub queue_ms: f64,
    /// … or this share of the base RTT, whichever is larger.
    #[serde(default = "queue_share_target")]
    pub queue_share: f64,
    /// Beside a competing end-to-end TCP flow, the transfer's share of the two goodputs (%)
    /// lies in this range; such cells are judged by it alone (the limit counts the whole link,
    /// and the queue is the competitor's).
    #[serde(default = "share_target")]
    pub share_pct: (f64, f64),
}

fn share_target() -> (f64, f64) {
    (40.0, 60.0)
}

fn goodput_target() -> f64 {
    0.95
}
fn queue_target() -> f64 {
    50.0
}
fn queue_share_target() -> f64 {
    0.1
}

/// One experiment of a scenario: configurations × a sweep, reported as one table and plot.
#[derive(Debug, Clone, Serialize)]
pub struct Part {
    /// Short name (file names of its plots).
    pub name: String,
    /// Heading in the report.
    pub title: String,
    /// Sweep axes in file order; the first is the x axis of plots and the row of tables.
    pub axes: Vec<Axis>,
    /// Configuration names in file order (one "default" when none are given).
    pub configs: Vec<String>,
    /// The documents' figures to show beside ours.
    pub references: Vec<Reference>,
    /// With `[part.draw]`: the links drawn (its first axis, named by their `name`s).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drawn: Vec<super::corpus::DrawnLink>,
    /// With `[part.statistics]`: the analysis of variance over its configurations at each
    /// sweep point (Lawson 2006's procedure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<super::significance::Statistics>,
}

/// One sweep axis.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Axis {
    /// Dotted key set by this axis, e.g. `link.both.ber`; "." lays each value (a table)
    /// over the whole cell, setting several keys at once (a drawn link's `link` and
    /// `traffic`).
    pub param: String,
    /// Short label for tables and plots (default: the key's last part).
    #[serde(default)]
    pub label: Option<String>,
    /// The values, in order.
    pub values: Vec<Value>,
    /// Plot this axis on a log scale.
    #[serde(default)]
    pub log: bool,
    /// Display names of the values (needed when values are tables, e.g. whole `traffic`
    /// settings); references then name a value by its display name.
    #[serde(default)]
    pub names: Vec<String>,
}

impl Axis {
    /// Display text of this axis's value `v`.
    pub fn show(&self, v: &Value) -> String {
        match self.values.iter().position(|w| w == v) {
            Some(i) if i < self.names.len() => self.names[i].clone(),
            _ => fmt_value(v),
        }
    }

    /// Label for tables and plots.
    pub fn label(&self) -> String {
        self.label
            .clone()
            .unwrap_or_else(|| self.param.rsplit('.').next().unwrap_or("").to_string())
    }
}

/// One figure from a source document, for one configuration at one sweep point.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    /// The configuration it compares with.
    pub config: String,
    /// Sweep point, as key = value for each axis (missing axes match any value).
    #[serde(default)]
    pub at: Table,
    /// The figure, in the unit of the scenario's main metric (bit/s or seconds).
    pub value: f64,
    /// Where it comes from, e.g. "Lawson 2006, Table 4.4".
    pub source: String,
}

/// One cell: a configuration at one sweep point, ready to run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Cell {
    /// Index in the scenario (also its results file name).
    pub index: usize,
    /// Index of its part.
    pub part: usize,
    /// Configuration name.
    pub config: String,
    /// The sweep point: one value per axis, in axis order.
    pub point: Vec<Value>,
    /// The merged, checked settings.
    pub spec: CellSpec,
}

impl Cell {
    /// "config, ber=1e-5, size=10KB" for progress lines and errors.
    pub fn describe(&self, sc: &Scenario) -> String {
        let part = &sc.parts[self.part];
        let mut s = if sc.parts.len() > 1 {
            format!("{}: {}", part.name, self.config)
        } else {
            self.config.clone()
        };
        for (a, v) in part.axes.iter().zip(&self.point) {
            s.push_str(&format!(", {}={}", a.label(), a.show(v)));
        }
        s
    }
}

/// A TOML value as a short string (no quotes around strings).
pub fn fmt_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Float(f) if *f != 0.0 && (f.abs() < 1e-3 || f.abs() >= 1e6) => format!("{f:e}"),
        Value::Float(f) => format!("{f}"),
        other => other.to_string(),
    }
}

/// `s` as a file name's part: its ASCII words in lower case, joined by '-'.
pub(crate) fn slug(s: &str) -> String {
    s.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

/// A duration as written ("30s", "500ms"), parsed once, when the scenario is read, with the
/// link crate's units; it is written back as it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    text: String,
    secs: f64,
}

impl Span {
    /// Parses `s`.
    pub fn parse(s: &str) -> Result<Span, String> {
        let ns = parse_duration_ns(s).map_err(|e| e.to_string())?;
        Ok(Span {
            text: s.to_string(),
            secs: ns as f64 / 1e9,
        })
    }

    /// Seconds.
    pub fn secs(&self) -> f64 {
        self.secs
    }
}

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A size in bytes as written ("64KB", "1.5MiB", "512B"), parsed once with the link crate's
/// units; between 1 B and 1 TB.
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    text: String,
    bytes: u64,
}

impl Size {
    /// Parses `s`.
    pub fn parse(s: &str) -> Result<Size, String> {
        let bytes = parse_size(s)?;
        Ok(Size {
            text: s.to_string(),
            bytes,
        })
    }

    /// Bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

macro_rules! text_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.text)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                <$t>::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}
text_serde!(Span);
text_serde!(Size);

/// Everything one cell runs with.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CellSpec {
    /// Length of each bulk transfer, e.g. "30s" (other kinds: their time limit).
    #[serde(default = "default_duration")]
    pub duration: Span,
    /// Start of the measured part of a bulk transfer (goodput leaves out the warm-up).
    #[serde(default = "zero")]
    pub warmup: Span,
    /// Runs per cell (mean, standard deviation and 95 % interval are over these).
    #[serde(default = "one")]
    pub repetitions: u32,
    /// Seed of the link's loss process; repetition k uses seed + k.
    #[serde(default = "one_u64")]
    pub seed: u64,
    /// Capture every run's frames on the satellite side (the terminal's link-facing
    /// interface, both directions, headers only) into `pcap/cNNNN-rNNN.pcap` of the results.
    #[serde(default)]
    pub pcap: bool,
    /// Replace the emulator by a plain kernel bridge: the link is then no bottleneck and
    /// only the CPU limits (what the proxies cost). No physical limit, loss or delay.
    #[serde(default)]
    pub bridge: bool,
    /// The client and server talk through ESP (IPsec tunnel mode, AES-256-GCM, carried by
    /// `satpep lab esp`): everything between them, the proxies included, sees only
    /// protocol 50 (Urke 2011's red/black problem, 000 §5.7). IPv4 only.
    // Left out of plans when off, so results directories made before it existed resume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ipsec: bool,
    /// With `bridge`: TSO, GSO and tx checksum offload on the routers' link-facing
    /// interfaces (the emulator needs them off).
    #[serde(default)]
    pub offloads: bool,
    /// The client's access link to the terminal: a rate, and flood pings that congest it
    /// (Bharadwaj 1999 §5.2's congested terrestrial link).
    // Left out of plans when unset, so results directories made before it existed resume.
    #[serde(default, skip_serializing_if = "super::access::Access::is_none")]
    pub access: super::access::Access,
    /// A star of terminals sharing the forward carrier (`[star]`: `terminals`, and
    /// `[[star.path]]` for terminals with a link of their own); one terminal by default.
    // Left out of plans when it is the line, so results directories made before it resume.
    #[serde(default, skip_serializing_if = "super::star::Star::is_line")]
    pub star: super::star::Star,
    /// The link (a `satpep link` configuration: preset, both, forward, return, outage).
    #[serde(default)]
    pub link: LinkSpec,
    /// The PEP.
    #[serde(default)]
    pub pep: PepSpec,
    /// End hosts' and routers' TCP settings.
    #[serde(default)]
    pub hosts: HostsSpec,
    /// What runs across the link.
    #[serde(default)]
    pub traffic: Traffic,
}

fn default_duration() -> Span {
    Span::parse("30s").expect("a valid duration")
}
fn zero() -> Span {
    Span::parse("0s").expect("a valid duration")
}
fn one() -> u32 {
    1
}
fn one_u64() -> u64 {
    1
}

/// PEP settings of a cell.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PepSpec {
    /// none, split, tunnel or adaptive (split with per-connection choice of controller).
    #[serde(default)]
    pub mode: PepMode,
    /// Satellite-leg controller (split: a kernel or satpep BPF one; tunnel: satellite, hybla,
    /// cubic, bbr, newreno).
    #[serde(default)]
    pub cc: Option<String>,
    /// Split mode with one proxy, in the terminal only.
    #[serde(default)]
    pub terminal_only: bool,
    /// fast or strict.
    #[serde(default)]
    pub handshake: Option<String>,
    /// Split: how the proxies move bytes between the legs, splice (the default) or copy.
    #[serde(default)]
    pub relay: Option<String>,
    /// What the proxies are told about the link: "nothing" (the default: no rate, no RTT),
    /// "exact" (the emulator's own rates and RTT, for set-ups that assumed them) or a
    /// nominal forward rate such as "25Mbit" (a service plan's figure; the return direction
    /// is scaled the same way).
    #[serde(default = "nothing")]
    pub told: String,
    /// Each proxy's connection limit (`proxy.max_connections`; default the proxy's own).
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// Any key of the proxies' configuration file (`proxy.toml`'s sections: `proxy`,
    /// `satellite`, `terrestrial`, `adaptive`, `intercept`, `tunnel`), the same for both
    /// proxies, e.g. `pep.config.satellite.notsent_lowat = "128KiB"`. The lab still sets
    /// what it must (interception, the satellite side, the tunnel's ends and keys) and the
    /// keys above.
    #[serde(default, skip_serializing_if = "is_default_file")]
    pub config: satpep_proxy::config::ProxyFile,
}

fn is_default_file(f: &satpep_proxy::config::ProxyFile) -> bool {
    *f == satpep_proxy::config::ProxyFile::default()
}

fn nothing() -> String {
    "nothing".into()
}

impl Default for PepSpec {
    fn default() -> Self {
        PepSpec {
            mode: PepMode::None,
            cc: None,
            terminal_only: false,
            handshake: None,
            relay: None,
            told: nothing(),
            max_connections: None,
            config: Default::default(),
        }
    }
}

/// TCP settings of one host (its namespace's sysctls and routes).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostTcp {
    /// Selective acknowledgements (net.ipv4.tcp_sack).
    pub sack: Option<bool>,
    /// Window scaling (net.ipv4.tcp_window_scaling); off caps windows at 64 KB.
    pub window_scaling: Option<bool>,
    /// Timestamps (net.ipv4.tcp_timestamps).
    pub timestamps: Option<bool>,
    /// Initial congestion window in segments (route initcwnd).
    pub initcwnd: Option<u32>,
    /// Initial receive window in segments (route initrwnd).
    pub initrwnd: Option<u32>,
    /// Largest receive buffer, e.g. "64KB" (net.ipv4.tcp_rmem's maximum).
    pub rmem_max: Option<Size>,
    /// A new socket's receive buffer, where autotuning starts (net.ipv4.tcp_rmem's middle
    /// value), e.g. "4MiB".
    pub rmem_default: Option<Size>,
    /// Largest send buffer (net.ipv4.tcp_wmem's maximum).
    pub wmem_max: Option<Size>,
    /// A new socket's send buffer (net.ipv4.tcp_wmem's middle value).
    pub wmem_default: Option<Size>,
    /// The host's own congestion control (net.ipv4.tcp_congestion_control).
    pub cc: Option<String>,
    /// MSS advertised to peers, bytes (route advmss).
    pub mss: Option<u32>,
    /// Acknowledge every segment at once instead of delaying ACKs (route quickack).
    pub quickack: Option<bool>,
}

impl HostTcp {
    /// `self` with `o`'s settings on top.
    pub fn overlaid(&self, o: &HostTcp) -> HostTcp {
        macro_rules! pick {
            ($($f:ident),*) => { HostTcp { $($f: o.$f.clone().or_else(|| self.$f.clone()),)* } };
        }
        pick!(
            sack,
            window_scaling,
            timestamps,
            initcwnd,
            initrwnd,
            rmem_max,
            rmem_default,
            wmem_max,
            wmem_default,
            cc,
            mss,
            quickack
        )
    }
}

/// TCP settings per host; `both` applies to client and server, under their own.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostsSpec {
    /// Client and server.
    #[serde(default)]
    pub both: HostTcp,
    /// The client.
    #[serde(default)]
    pub client: HostTcp,
    /// The server.
    #[serde(default)]
    pub server: HostTcp,
    /// The terminal-side router or PEP (its routes also shape the PEP's satellite leg).
    #[serde(default)]
    pub terminal: HostTcp,
    /// The gateway-side router or PEP.
    #[serde(default)]
    pub gateway: HostTcp,
}

/// The main metric of a traffic kind: what tables show and plots draw.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Metric {
    /// Goodput, bit/s (bulk).
    Goodput,
    /// Seconds to complete (http, page).
    Time,
    /// Seconds per request/response (interactive).
    Latency,
    /// Seconds per echo (ping).
    Rtt,
    /// New connections opened per second (connections).
    ConnectRate,
}

impl Metric {
    /// Whether a run gives many samples whose spread matters (times): they get percentiles
    /// and CDFs.
    pub fn is_distribution(self) -> bool {
        matches!(self, Metric::Time | Metric::Latency | Metric::Rtt)
    }

    /// Column heading.
    pub fn heading(self) -> &'static str {
        match self {
            Metric::Goodput => "goodput",
            Metric::Time => "completion time",
            Metric::Latency => "response time",
            Metric::Rtt => "round-trip time",
            Metric::ConnectRate => "connections opened per second",
        }
    }
}

/// A size in bytes ("64KB", "1MB", "100B", "1.5MiB", or a bare number) with the link
/// crate's units, between 1 B and 1 TB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let v = satpep_link::units::parse_size(s).map_err(|e| e.to_string())?;
    if !(1..=1_000_000_000_000).contains(&v) {
        return Err(format!("'{s}': a size must be between 1 B and 1 TB"));
    }
    Ok(v)
}

/// A drawn link's bulk transfer reaches steady state once its start could have ended: the
/// warm-up is raised to the link's start-up bound (`corpus_report::start_bound_s`, whole
/// seconds, at most half the run) where that is later. Seed 39's L02 (an upload at 50
/// Mbit/s over 621 ms, bound 7.5 s) read every configuration's start from 5 s as steady
/// state: both PEPs measured 87.8 % of the limit while they delivered 96-97 % from 8 s on.
/// The start has its own figures (from the first byte, and the start-up target).
fn start_before_steady(drawn: &[super::corpus::DrawnLink], cell: &mut Cell) {
    // Bulk transfers only: other kinds read no steady goodput (a fault's timing counts
    // from its own start).
    if cell.spec.traffic.bulk().is_none() {
        return;
    }
    let Some(Value::Table(first)) = cell.point.first() else {
        return;
    };
    let Some(l) = drawn.iter().find(|l| &l.overlay == first) else {
        return;
    };
    let bps = if cell.spec.traffic.kind().downloads() {
        l.forward_bps
    } else {
        l.return_bps
    };
    let bound = super::corpus_report::start_bound_s(bps, 2.0 * l.one_way_ms).ceil();
    let warmup = bound.min((cell.spec.duration.secs() / 2.0).floor());
    if warmup > cell.spec.warmup.secs() {
        cell.spec.warmup = Span::parse(&format!("{warmup}s")).expect("whole seconds parse");
    }
}

/// Seconds in a duration string.
pub fn secs(s: &str) -> Result<f64, String> {
    parse_duration_ns(s)
        .map(|ns| ns as f64 / 1e9)
        .map_err(|e| e.to_string())
}

impl CellSpec {
    /// The main metric of this cell's traffic.
    pub fn metric(&self) -> Metric {
        self.traffic.kind().metric()
    }

    /// Settings of `host` (client and server include `both`).
    pub fn host(&self, host: crate::Host) -> HostTcp {
        use crate::Host::*;
        match host {
            Client => self.hosts.both.overlaid(&self.hosts.client),
            Server => self.hosts.both.overlaid(&self.hosts.server),
            Terminal => self.hosts.terminal.clone(),
            Gateway => self.hosts.gateway.clone(),
            Link => HostTcp::default(),
        }
    }

    /// The link with its preset applied.
    /// The warm-up, seconds.
    pub fn warmup_s(&self) -> f64 {
        self.warmup.secs()
    }

    /// What the proxies are told about the link, from `pep.told`.
    pub fn told(&self) -> Result<crate::topology::Told, String> {
        crate::topology::Told::parse(&self.pep.told, || self.link_spec()?.resolve())
            .map_err(|e| format!("pep.told: {e}"))
    }

    /// The lab's PEP for this cell (None: end to end), or what in `pep` does not fit.
    pub fn pep(&self) -> Result<Option<crate::topology::Pep>, String> {
        let p = &self.pep;
        let pep = p
            .mode
            .pep(
                p.cc.clone(),
                p.terminal_only,
                p.handshake.clone(),
                p.relay.clone(),
                self.told()?,
            )
            .map_err(|e| format!("pep.{}: {}", e.key, e.why))?;
        if pep.is_none() && !is_default_file(&p.config) {
            return Err("pep.config: there is no proxy to configure (mode none)".into());
        }
        if pep.is_some() {
            // What the proxy would refuse, refused when the scenario is read (a [tunnel]
            // section's keys when the lab has set the tunnel's ends, at start).
            let mut c = p.config.clone();
            c.tunnel = None;
            if c.proxy.carrier.is_some() {
                if pep.as_ref().is_some_and(|p| p.tunnel.is_some()) {
                    return Err("pep.config: proxy.carrier: a split gateway's; a tunnel gateway shares its carrier with tunnel.carrier".into());
                }
                // As the gateway reads it: the lab puts its satellite downstream, and keeps
                // the carrier off the terminals.
                c.proxy.satellite_side = "downstream".into();
            }
            let text = toml::to_string(&c).map_err(|e| format!("pep.config: {e}"))?;
            satpep_proxy::config::ProxyFile::parse(&text)
                .and_then(|f| f.resolve())
                .map_err(|e| format!("pep.config: {e}"))?;
        }
        match (pep, p.max_connections) {
            (None, Some(_)) => {
                Err("pep.max_connections: there is no proxy to limit (mode none)".into())
            }
            (Some(_), Some(0)) => Err("pep.max_connections = 0: at least 1".into()),
            (pep, n) => Ok(pep.map(|pep| crate::topology::Pep {
                max_connections: n.or(pep.max_connections),
                file: p.config.clone(),
                ..pep
            })),
        }
    }

    /// The link as the emulator runs it.
    pub fn link_spec(&self) -> Result<LinkSpec, String> {
        let mut l = LinkSpec::layered(&[&self.link])?;
        // The dumbbell's other hosts: their own path after the shared queue, both ways.
        if let Some(b) = self.traffic.bulk().and_then(|t| t.background.as_ref()) {
            use super::kinds::bulk::{BACKGROUND_CLIENTS, BACKGROUND_SERVERS};
            let path = satpep_link::config::PathSpec {
                hosts: vec![BACKGROUND_CLIENTS.into(), BACKGROUND_SERVERS.into()],
                delay: Some(format!("{}us", (b.rtt.secs() * 1e6 / 2.0).round() as u64)),
                ..Default::default()
            };
            // A direction's own list replaces both's: the path goes into every list in use.
            l.both.path.get_or_insert_with(Vec::new).push(path.clone());
            for d in [&mut l.forward, &mut l.ret] {
                if let Some(p) = &mut d.path {
                    p.push(path.clone());
                }
            }
        }
        // A star's terminals with a forward link of their own: the forward list, which
        // replaces both's, so it starts from both's.
        let star = self.star.paths()?;
        if !star.is_empty() {
            let both = l.both.path.clone().unwrap_or_default();
            l.forward.path.get_or_insert(both).extend(star);
        }
        Ok(l)
    }

    /// Checks everything that can be checked before a lab exists.
    pub fn check(&self) -> Result<(), String> {
        let d = self.duration.secs();
        if !(1.0..=86_400.0).contains(&d) {
            return Err(format!(
                "duration '{}': must be between 1 s and 24 h",
                self.duration
            ));
        }
        if self.warmup.secs() >= d {
            return Err(format!(
                "warmup '{}' must be shorter than duration '{}'",
                self.warmup, self.duration
            ));
        }
        if !(1..=1000).contains(&self.repetitions) {
            return Err(format!(
                "repetitions = {}: must be between 1 and 1000",
                self.repetitions
            ));
        }
        self.link_spec()
            .and_then(|l| l.resolve())
            .map_err(|e| format!("link: {e}"))?;
        self.pep()?;
        if self.offloads && !self.bridge {
            return Err("offloads: only with bridge = true (the emulator needs them off)".into());
        }
        self.access.check()?;
        self.star.check()?;
        for host in crate::Host::ALL {
            let h = self.host(host);
            let n = host.name();
            for (k, v) in [
                ("rmem_max", &h.rmem_max),
                ("wmem_max", &h.wmem_max),
                ("rmem_default", &h.rmem_default),
                ("wmem_default", &h.wmem_default),
            ] {
                if let Some(v) = v {
                    if !(4096..=1 << 31).contains(&v.bytes()) {
                        return Err(format!("hosts.{n}.{k} '{v}': between 4 KB and 2 GB"));
                    }
                }
            }
            for (k, v, lo, hi) in [
                ("initcwnd", h.initcwnd, 1, 1000),
                ("initrwnd", h.initrwnd, 1, 1000),
                ("mss", h.mss, 88, 65495),
            ] {
                if let Some(v) = v {
                    if !(lo..=hi).contains(&v) {
                        return Err(format!("hosts.{n}.{k} = {v}: between {lo} and {hi}"));
                    }
                }
            }
            if let Some(cc) = &h.cc {
                check_cc_name(cc).map_err(|e| format!("hosts.{n}.cc: {e}"))?;
            }
        }
        self.traffic
            .kind()
            .check(self)
            .map_err(|e| format!("traffic.{e}"))
    }
}

/// A congestion control name must look like one; whether it exists is checked when it is used
/// (satpep's BPF ones are loaded then).
pub(crate) fn check_cc_name(cc: &str) -> Result<(), String> {
    if cc.is_empty() || cc.len() > 15 || !cc.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!("'{cc}' is not a congestion control name"));
    }
    Ok(())
}

/// Lays `over` on `base`: tables merge key by key, anything else replaces.
pub fn merge(base: &mut Table, over: &Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Sets the dotted key `path` in `t` to `v`, creating tables on the way.
pub fn set_path(t: &mut Table, path: &str, v: Value) -> Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("'{path}' is not a dotted key"));
    }
    let mut cur = t;
    for p in &parts[..parts.len() - 1] {
        let e = cur
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        cur = match e {
            Value::Table(t) => t,
            _ => return Err(format!("'{path}': '{p}' is a value, not a table")),
        };
    }
    cur.insert(parts[parts.len() - 1].to_string(), v);
    Ok(())
}

fn take_str(doc: &mut Table, key: &str) -> Result<Option<String>, String> {
    match doc.remove(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("{key}: expected a string, found {}", v.type_str())),
    }
}

fn take_array<T: serde::de::DeserializeOwned>(
    doc: &mut Table,
    key: &str,
) -> Result<Vec<T>, String> {
    match doc.remove(key) {
        None => Ok(Vec::new()),
        Some(v @ Value::Array(_)) => v
            .try_into()
            .map_err(|e: toml::de::Error| format!("{key}: {}", e.message().trim())),
        Some(v) => Err(format!(
            "{key}: expected [[{key}]] tables, found {}",
            v.type_str()
        )),
    }
}

fn apply_quick(doc: &mut Table, quick: bool, what: &str) -> Result<(), String> {
    match doc.remove("quick") {
        None => Ok(()),
        Some(Value::Table(q)) => {
            if quick {
                merge(doc, &q);
            }
            Ok(())
        }
        Some(v) => Err(format!(
            "{what}quick: expected a table, found {}",
            v.type_str()
        )),
    }
}

impl Scenario {
    /// Parses a scenario from TOML text; `quick` applies the `[quick]` tables. Every cell is
    /// checked, so a bad setting anywhere fails here, before any lab is built.
    pub fn parse(text: &str, quick: bool) -> Result<Scenario, String> {
        Scenario::parse_with(text, quick, &Table::new())
    }

    /// [`Scenario::parse`], with `overrides` laid over every cell last (e.g. a duration given
    /// on the command line).
    pub fn parse_with(text: &str, quick: bool, overrides: &Table) -> Result<Scenario, String> {
        let mut doc: Table = toml::from_str(text).map_err(|e| e.to_string())?;
        apply_quick(&mut doc, quick, "")?;
        let name = take_str(&mut doc, "name")?.ok_or("name: a scenario needs a name")?;
        crate::topology::check_name(&name).map_err(|e| format!("name: {e}"))?;
        let title = take_str(&mut doc, "title")?.unwrap_or_else(|| name.clone());
        let reproduces = take_str(&mut doc, "reproduces")?;
        let notes = take_str(&mut doc, "notes")?;
        let mut part_tables: Vec<Table> = take_array(&mut doc, "part")?;
        // A scenario-wide [statistics] is each part's unless the part has its own.
        if let Some(st) = doc.remove("statistics") {
            match part_tables.is_empty() {
                true => {
                    doc.insert("statistics".into(), st);
                }
                false => {
                    for p in &mut part_tables {
                        p.entry("statistics").or_insert_with(|| st.clone());
                    }
                }
            }
        }
        let targets = match doc.remove("targets") {
            None => None,
            Some(v) => {
                Some(Targets::deserialize(v).map_err(|e| format!("targets: {}", e.message()))?)
            }
        };
        let mut sc = Scenario {
            targets,
            overrides: overrides.clone(),
            name: name.clone(),
            title: title.clone(),
            reproduces,
            notes,
            parts: Vec::new(),
            cells: Vec::new(),
        };
        if part_tables.is_empty() {
            sc.add_part(&Table::new(), doc, name, title)?;
        } else {
            for k in ["sweep", "config", "reference"] {
                if doc.contains_key(k) {
                    return Err(format!(
                        "{k}: goes inside each [[part]] when parts are used"
                    ));
                }
            }
            for (i, mut p) in part_tables.into_iter().enumerate() {
                let pname = take_str(&mut p, "name")
                    .map_err(|e| format!("part #{}: {e}", i + 1))?
                    .ok_or(format!("part #{}: needs a name", i + 1))?;
                if sc.parts.iter().any(|q| q.name == pname) {
                    return Err(format!("part '{pname}': the name is used twice"));
                }
                apply_quick(&mut p, quick, &format!("part '{pname}': "))?;
                let ptitle = take_str(&mut p, "title")
                    .map_err(|e| format!("part '{pname}': {e}"))?
                    .unwrap_or_else(|| pname.clone());
                sc.add_part(&doc, p, pname.clone(), ptitle).map_err(|e| {
                    if e.starts_with(&pname) {
                        e
                    } else {
                        format!("part '{pname}': {e}")
                    }
                })?;
            }
        }
        Ok(sc)
    }

    /// Adds a part: `own` (its sweep, configs, references and settings) over `base`.
    fn add_part(
        &mut self,
        base: &Table,
        mut own: Table,
        name: String,
        title: String,
    ) -> Result<(), String> {
        let mut axes: Vec<Axis> = take_array(&mut own, "sweep")?;
        let drawn = match own.remove("draw") {
            None => Vec::new(),
            Some(v) => {
                let d = super::corpus::Draw::deserialize(v)
                    .map_err(|e| format!("draw: {}", e.message()))?;
                // `lab run --seed` draws new links as well as new loss patterns.
                let int = |t: &Table| t.get("seed").and_then(Value::as_integer);
                let seed = int(&self.overrides)
                    .map(|s| s as u64)
                    .or(d.seed)
                    .or(int(&own).map(|s| s as u64))
                    .or(int(base).map(|s| s as u64))
                    .unwrap_or(1);
                let mut drawn = super::corpus::draw(seed, d.links)?;
                if !d.traffic {
                    for l in &mut drawn {
                        l.overlay.remove("traffic");
                        l.traffic_drawn = false;
                    }
                }
                axes.insert(
                    0,
                    Axis {
                        param: ".".into(),
                        label: Some("link".into()),
                        values: drawn
                            .iter()
                            .map(|l| Value::Table(l.overlay.clone()))
                            .collect(),
                        log: false,
                        names: drawn.iter().map(|l| l.name.clone()).collect(),
                    },
                );
                drawn
            }
        };
        let configs: Vec<Table> = take_array(&mut own, "config")?;
        let references: Vec<Reference> = take_array(&mut own, "reference")?;
        let statistics = match own.remove("statistics") {
            None => None,
            Some(v) => Some(
                super::significance::Statistics::deserialize(v)
                    .map_err(|e| format!("statistics: {}", e.message()))?,
            ),
        };
        let mut doc = base.clone();
        merge(&mut doc, &own);
        for a in &axes {
            if a.values.is_empty() {
                return Err(format!("sweep '{}': no values", a.param));
            }
            if a.param != "." && META_KEYS.contains(&a.param.split('.').next().unwrap_or("")) {
                return Err(format!("sweep '{}': cannot sweep over that key", a.param));
            }
            if !a.names.is_empty() && a.names.len() != a.values.len() {
                return Err(format!(
                    "sweep '{}': {} names for {} values",
                    a.param,
                    a.names.len(),
                    a.values.len()
                ));
            }
        }
        let mut named = Vec::new();
        for (i, mut c) in configs.into_iter().enumerate() {
            let n = take_str(&mut c, "name")
                .map_err(|e| format!("config #{}: {e}", i + 1))?
                .ok_or(format!("config #{}: needs a name", i + 1))?;
            if named.iter().any(|(m, _)| m == &n) {
                return Err(format!("config '{n}': the name is used twice"));
            }
            named.push((n, c));
        }
        if named.is_empty() {
            named.push(("default".to_string(), Table::new()));
        }
        for r in &references {
            if !named.iter().any(|(n, _)| n == &r.config) {
                return Err(format!(
                    "reference from '{}': no config named '{}'",
                    r.source, r.config
                ));
            }
            for k in r.at.keys() {
                if !axes.iter().any(|a| &a.param == k) {
                    return Err(format!(
                        "reference from '{}': '{k}' is not a sweep axis",
                        r.source
                    ));
                }
            }
        }
        let part = Part {
            name,
            title,
            axes,
            configs: named.iter().map(|(n, _)| n.clone()).collect(),
            references,
            drawn,
            statistics,
        };
        if let Some(st) = &part.statistics {
            st.check(&part.configs)?;
        }
        // Sweep points, first axis slowest, so a table's rows come in file order.
        let mut points: Vec<Vec<Value>> = vec![Vec::new()];
        for a in &part.axes {
            points = points
                .into_iter()
                .flat_map(|p| {
                    a.values.iter().map(move |v| {
                        let mut q = p.clone();
                        q.push(v.clone());
                        q
                    })
                })
                .collect();
        }
        let pi = self.parts.len();
        self.parts.push(part);
        for point in &points {
            for (cname, overlay) in &named {
                let mut t = doc.clone();
                merge(&mut t, overlay);
                for (a, v) in self.parts[pi].axes.iter().zip(point) {
                    match (a.param.as_str(), v) {
                        (".", Value::Table(over)) => merge(&mut t, over),
                        (".", _) => {
                            return Err(format!(
                                "sweep '.': each value must be a table of settings, found {}",
                                v.type_str()
                            ))
                        }
                        _ => set_path(&mut t, &a.param, v.clone())
                            .map_err(|e| format!("sweep: {e}"))?,
                    }
                }
                merge(&mut t, &self.overrides);
                let mut cell = Cell {
                    index: self.cells.len(),
                    part: pi,
                    config: cname.clone(),
                    point: point.clone(),
                    spec: CellSpec::default_for_errors(),
                };
                let where_ = cell.describe(self);
                cell.spec = serde_path_to_error::deserialize(Value::Table(t)).map_err(
                    |e: serde_path_to_error::Error<toml::de::Error>| {
                        format!("{where_}: {}: {}", e.path(), e.inner().message().trim())
                    },
                )?;
                cell.spec.check().map_err(|e| format!("{where_}: {e}"))?;
                start_before_steady(&self.parts[pi].drawn, &mut cell);
                self.cells.push(cell);
            }
        }
        Ok(())
    }

    /// The scenario reduced to its part `name` (cells renumbered).
    pub fn only(mut self, name: &str) -> Result<Scenario, String> {
        let Some(p) = self.parts.iter().position(|q| q.name == name) else {
            return Err(format!(
                "--only {name}: no such part (parts: {})",
                self.parts
                    .iter()
                    .map(|q| q.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        self.name = format!("{}-{name}", self.name);
        self.parts = vec![self.parts.swap_remove(p)];
        self.cells.retain(|c| c.part == p);
        for (i, c) in self.cells.iter_mut().enumerate() {
            c.index = i;
            c.part = 0;
        }
        Ok(self)
    }

    /// The scenario reduced to the drawn links `names` (a corpus's `L05`, …): the parts that
    /// draw links keep those links' cells, the others are left out (cells renumbered). So a
    /// controller change is judged, with repetitions, on the links it is about.
    pub fn only_links(mut self, names: &[String]) -> Result<Scenario, String> {
        let drawn: Vec<&str> = self
            .parts
            .iter()
            .flat_map(|p| p.drawn.iter().map(|l| l.name.as_str()))
            .collect();
        if drawn.is_empty() {
            return Err("--link: this scenario draws no links".into());
        }
        if let Some(bad) = names.iter().find(|n| !drawn.contains(&n.as_str())) {
            return Err(format!(
                "--link {bad}: no such drawn link (links: {})",
                drawn.join(", ")
            ));
        }
        // A drawn part's first axis is the links, each value shown by its link's name.
        let kept = |c: &Cell, p: &Part| {
            c.point
                .first()
                .is_some_and(|v| names.contains(&p.axes[0].show(v)))
        };
        self.retain(
            |p| {
                p.drawn.retain(|l| names.contains(&l.name));
                !p.drawn.is_empty()
            },
            kept,
        );
        self.name = format!("{}-{}", self.name, names.join("-"));
        Ok(self)
    }

    /// The scenario reduced to the configurations `names` (cells renumbered; parts that keep
    /// none are left out). So one configuration is compared across builds, on the links or
    /// points a change is about, without rerunning the rest.
    ///
    /// A name may itself hold commas ("end-to-end bbr, tuned"): `--config` splits on them,
    /// so each name is the longest run of pieces that names a configuration.
    pub fn only_configs(mut self, names: &[String]) -> Result<Scenario, String> {
        let mut all: Vec<&str> = Vec::new();
        for c in self.parts.iter().flat_map(|p| p.configs.iter()) {
            if !all.contains(&c.as_str()) {
                all.push(c);
            }
        }
        let norm = |s: &str| s.split(',').map(str::trim).collect::<Vec<_>>().join(",");
        let mut joined: Vec<String> = Vec::new();
        let mut i = 0;
        while i < names.len() {
            let found = (i..names.len()).rev().find_map(|j| {
                let want = norm(&names[i..=j].join(","));
                all.iter()
                    .find(|c| norm(c) == want)
                    .map(|c| (j, c.to_string()))
            });
            let Some((j, name)) = found else {
                return Err(format!(
                    "--config {}: no such configuration (configurations: {})",
                    names[i],
                    all.join(", ")
                ));
            };
            joined.push(name);
            i = j + 1;
        }
        let names = &joined;
        self.retain(
            |p| {
                p.configs.retain(|c| names.contains(c));
                !p.configs.is_empty()
            },
            |c, _| names.contains(&c.config),
        );
        self.name = format!("{}-{}", self.name, slug(&names.join(" ")));
        Ok(self)
    }

    /// Keeps the parts `part` keeps (it may narrow them first) and, of theirs, the cells
    /// `cell` keeps (read against the narrowed part); parts and cells renumbered.
    fn retain(
        &mut self,
        mut part: impl FnMut(&mut Part) -> bool,
        cell: impl Fn(&Cell, &Part) -> bool,
    ) {
        let parts = std::mem::take(&mut self.parts);
        let mut renumber = vec![None; parts.len()];
        for (i, mut p) in parts.into_iter().enumerate() {
            if part(&mut p) {
                renumber[i] = Some(self.parts.len());
                self.parts.push(p);
            }
        }
        let cells = std::mem::take(&mut self.cells);
        for mut c in cells {
            let Some(np) = renumber[c.part] else { continue };
            if !cell(&c, &self.parts[np]) {
                continue;
            }
            c.part = np;
            c.index = self.cells.len();
            self.cells.push(c);
        }
    }

    /// The cells of part `p`.
    pub fn part_cells(&self, p: usize) -> impl Iterator<Item = &Cell> {
        self.cells.iter().filter(move |c| c.part == p)
    }

    /// The sweep points of part `p`, each once, in cell order, with that point's cells.
    pub fn part_points(&self, p: usize) -> Vec<(&[Value], Vec<&Cell>)> {
        let mut out: Vec<(&[Value], Vec<&Cell>)> = Vec::new();
        for c in self.part_cells(p) {
            match out.iter_mut().find(|(pt, _)| *pt == c.point.as_slice()) {
                Some((_, cells)) => cells.push(c),
                None => out.push((&c.point, vec![c])),
            }
        }
        out
    }

    /// The main metric of part `p` (that of its first cell).
    pub fn metric(&self, p: usize) -> Metric {
        self.part_cells(p)
            .next()
            .map(|c| c.spec.metric())
            .unwrap_or(Metric::Goodput)
    }

    /// The document's figure for `cell`, if one was given.
    pub fn reference(&self, cell: &Cell) -> Option<&Reference> {
        let part = &self.parts[cell.part];
        part.references.iter().find(|r| {
            r.config == cell.config
                && r.at.iter().all(|(k, v)| {
                    part.axes
                        .iter()
                        .position(|a| &a.param == k)
                        .is_some_and(|i| {
                            let a = &part.axes[i];
                            values_equal(&cell.point[i], v)
                                || matches!(v, Value::String(s) if *s == a.show(&cell.point[i]))
                        })
                })
        })
    }
}

/// Equality of sweep values, with integers and floats compared as numbers.
pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Integer(x), Value::Float(y)) | (Value::Float(y), Value::Integer(x)) => {
            (*x as f64 - y).abs() <= 1e-12 * y.abs()
        }
        (Value::Float(x), Value::Float(y)) => (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
        _ => a == b,
    }
}

impl CellSpec {
    fn default_for_errors() -> CellSpec {
        toml::from_str("").expect("an empty cell has defaults")
    }
}
