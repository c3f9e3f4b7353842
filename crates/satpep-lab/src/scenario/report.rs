//! A scenario's results: CSV and JSON for scripts, plots, and a report in Markdown and in one
//! self-contained HTML page (plots inlined), with the documents' figures beside ours.

use super::beside::{percentile, BesideRecord};
use super::doc::{esc, Doc};
use super::plot::{write_line_plot, write_stacked, Line, LinePlot};
use super::spec::{CellSpec, Metric, Part, PepMode, Scenario};
use super::split_state::SplitSample;
use super::stats::Summary;
use super::traffic::{RunRecord, SocketSample};
use super::tunnel_state::TunnelSample;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use toml::Value;

/// A cell's figures over its repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    /// Cell index.
    pub cell: usize,
    /// Part index.
    pub part: usize,
    /// Configuration.
    pub config: String,
    /// Sweep point, formatted, one per axis.
    pub point: Vec<String>,
    /// Runs recorded.
    pub runs: usize,
    /// The main metric (bit/s or s).
    pub metric: Summary,
    /// Bulk: share of the physical limit.
    pub utilization: Summary,
    /// Several flows: Jain's index.
    pub jain: Summary,
    /// Satellite-leg sender's retransmissions per run.
    pub leg_retransmits: Summary,
    /// Several flows: each flow's mean goodput while all ran, bit/s.
    pub flow_goodputs: Vec<f64>,
    /// Frames the emulator dropped as corrupted per run (both directions).
    pub link_errors: Summary,
    /// Frames the emulator's queues dropped per run (both directions).
    pub queue_drops: Summary,
    /// Failed transfers over all runs.
    pub failures: u32,
    /// Bulk: the physical limit, bit/s, the mean over the runs (a rate trace's mean over the
    /// measured span; beside UDP, what the UDP leaves).
    pub limit_bps: Option<f64>,
    /// The document's figure, if any.
    pub reference: Option<f64>,
    /// Where the document's figure comes from.
    pub reference_source: Option<String>,
    /// Probe beside the transfer: median queueing delay per run after the warm-up, ms.
    pub queue_p50: Summary,
    /// Probe: 95th percentile of the queueing delay per run, ms.
    pub queue_p95: Summary,
    /// Probe: 99th percentile of the queueing delay per run, ms.
    pub queue_p99: Summary,
    /// Probe, on a link whose forward rate steps down: the 95th percentile per run of the
    /// queueing delay in steady state, the warm-up and the 2 s after each step down left out
    /// (the targets' reading), ms.
    pub queue_p95_steady: Summary,
    /// Probe, on a link whose forward rate steps down, with targets: per run, the longest
    /// time after a step down until the queue, once over the targets' bound, came back under
    /// it, s.
    pub recovery_s: Summary,
    /// Cross traffic's loss per run, %.
    pub cross_loss: Summary,
    /// Competing end-to-end flow: the bulk transfer's share of the two goodputs per run, %.
    pub share: Summary,
    /// Background flows (the dumbbell's other hosts): their total goodput per run, bit/s.
    pub background_bps: Summary,
    /// Background flows: the transfer's share of all goodput per run, % (fair: 100/(N+1)).
    pub background_share: Summary,
    /// Background flows: how many.
    pub background_flows: usize,
    /// Request/responses beside the transfer: median response time per run, s.
    pub response_p50: Summary,
    /// Request/responses: 95th percentile per run, s.
    pub response_p95: Summary,
    /// Request/responses: 99th percentile per run, s.
    pub response_p99: Summary,
    /// The main metric's samples of every run pooled: 50th, 95th and 99th percentiles (the
    /// distribution of completion and response times; NaN without samples).
    pub metric_pct: [f64; 3],
    /// With proxies: the CPU they used per second of run, all together (1 = one core).
    pub proxy_cores: Summary,
    /// With proxies, bulk: CPU seconds per gigabyte delivered, per proxy.
    pub proxy_cpu_s_per_gb: Summary,
    /// Split: what the proxies held for their connections, median per run, kB.
    pub held_p50_kb: Summary,
    /// Split: the most they held per run, kB.
    pub held_max_kb: Summary,
    /// Split: segments their flow control dropped per run.
    pub flow_drops: Summary,
    /// Bulk: the whole machine's busy CPU seconds per gigabyte delivered (end hosts,
    /// emulator, proxies and the kernel's work for all of them).
    pub machine_cpu_s_per_gb: Summary,
    /// Bytes the emulator delivered forward (whole frames) per payload byte, per run.
    pub link_fwd_per_byte: Summary,
    /// Bytes the emulator delivered on the return link per payload byte, per run.
    pub link_ret_per_byte: Summary,
    /// udp and ping cells: how exact the emulated link was.
    pub link_check: LinkCheck,
    /// connections cells: the first run's figures.
    pub connections: Option<crate::scenario::kinds::connections::ConnectionsRecord>,
    /// fault cells: the first run's record.
    pub fault: Option<crate::scenario::kinds::fault::FaultRecord>,
    /// hub cells: every run's record.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hub: Vec<crate::scenario::kinds::hub::HubRecord>,
}

/// What the udp and ping kinds measured of the link itself, over a cell's runs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LinkCheck {
    /// udp with load ≥ 1: (delivered − configured) / configured frame rate per run, %.
    pub rate_error_pct: Summary,
    /// udp: datagrams lost (all causes), every run's pooled, %; NaN without udp runs.
    pub loss_pct: f64,
    /// udp: the loss model's expected loss for these frames, % (NaN without udp runs).
    pub loss_expected_pct: f64,
    /// udp: the 99 % binomial interval around the expected loss for the datagrams sent, %.
    pub loss_interval_pct: (f64, f64),
    /// udp: datagrams sent, all runs.
    pub datagrams: u64,
    /// udp: the emulator's user CPU time per second of the measured window, % of a core.
    pub cpu_user_pct: Summary,
    /// udp: its system CPU time likewise (the receiving stacks' share included), %.
    pub cpu_sys_pct: Summary,
    /// The emulator's release lateness p99 (worse direction, since it started) per run, ms.
    pub late_p99_ms: Summary,
    /// ping: smallest RTT per run (ping's summary), ms.
    pub ping_min_ms: Summary,
    /// ping: mean RTT per run, ms.
    pub ping_avg_ms: Summary,
    /// ping: largest RTT per run, ms.
    pub ping_max_ms: Summary,
    /// ping: what the link should give an echo, ms (NaN on a bridge or without ping runs).
    pub ping_expected_ms: f64,
}

impl LinkCheck {
    fn of(runs: &[&RunRecord]) -> LinkCheck {
        let udp: Vec<&crate::scenario::kinds::udp::UdpRecord> =
            runs.iter().filter_map(|r| r.udp.as_ref()).collect();
        let ping: Vec<&crate::scenario::kinds::ping::PingRecord> =
            runs.iter().filter_map(|r| r.ping.as_ref()).collect();
        let of = |v: Vec<f64>| Summary::of(&v);
        // One figure of ping's summary over the runs that had one (no reply: NaN).
        let ping_of = |f: fn(&crate::scenario::kinds::ping::PingRecord) -> f64| {
            of(ping
                .iter()
                .map(|p| f(p))
                .filter(|v| v.is_finite())
                .collect())
        };
        let sent: u64 = udp.iter().map(|u| u.sent).sum();
        let delivered: u64 = udp.iter().map(|u| u.delivered).sum();
        let expected = udp.first().map_or(f64::NAN, |u| u.expected_loss);
        let (lo, hi) = crate::scenario::kinds::udp::loss_interval99(expected, sent);
        LinkCheck {
            // Only a link kept busy delivers its configured rate.
            rate_error_pct: of(runs
                .iter()
                .filter(|r| r.udp.as_ref().is_some_and(|u| u.load >= 1.0))
                .filter_map(|r| Some((r.utilization? - 1.0) * 100.0))
                .collect()),
            loss_pct: match sent {
                0 => f64::NAN,
                n => n.saturating_sub(delivered) as f64 / n as f64 * 100.0,
            },
            loss_expected_pct: expected * 100.0,
            loss_interval_pct: (lo * 100.0, hi * 100.0),
            datagrams: sent,
            cpu_user_pct: of(udp.iter().map(|u| u.emulator_cpu_user * 100.0).collect()),
            cpu_sys_pct: of(udp.iter().map(|u| u.emulator_cpu_sys * 100.0).collect()),
            late_p99_ms: of(runs
                .iter()
                .filter(|r| r.udp.is_some() || r.ping.is_some())
                .filter_map(|r| r.late_p99_ms)
                .collect()),
            ping_min_ms: ping_of(|p| p.min_ms),
            ping_avg_ms: ping_of(|p| p.avg_ms),
            ping_max_ms: ping_of(|p| p.max_ms),
            ping_expected_ms: ping.iter().find_map(|p| p.expected_ms).unwrap_or(f64::NAN),
        }
    }
}

/// Link bytes (`link` of each run) per payload byte, over the runs that delivered payload.
fn per_payload_byte(runs: &[&RunRecord], link: impl Fn(&RunRecord) -> u64) -> Summary {
    Summary::of(
        &runs
            .iter()
            .filter_map(|r| {
                let payload = r.payload_bytes.filter(|&p| p > 0)?;
                Some(link(r) as f64 / payload as f64)
            })
            .collect::<Vec<_>>(),
    )
}

/// `cost` of each run (CPU seconds) per gigabyte its flows delivered, over the runs that
/// delivered any and have the figure.
fn per_gb_delivered(runs: &[&RunRecord], cost: impl Fn(&RunRecord) -> Option<f64>) -> Summary {
    Summary::of(
        &runs
            .iter()
            .filter_map(|r| {
                let gb = r.flows.iter().map(|f| f.bytes).sum::<u64>() as f64 / 1e9;
                Some(cost(r)? / gb).filter(|_| gb > 0.0)
            })
            .collect::<Vec<_>>(),
    )
}

/// Summarizes `runs` per cell of `sc`.
pub fn summarize(sc: &Scenario, runs: &[RunRecord]) -> Vec<CellResult> {
    sc.cells
        .iter()
        .map(|c| {
            let mine: Vec<&RunRecord> = runs.iter().filter(|r| r.cell == c.index).collect();
            let samples: Vec<f64> = mine
                .iter()
                .flat_map(|r| r.samples.iter().copied())
                .collect();
            let util: Vec<f64> = mine.iter().filter_map(|r| r.utilization).collect();
            let jain: Vec<f64> = mine.iter().filter_map(|r| r.jain).collect();
            let retr: Vec<f64> = mine.iter().map(|r| r.leg_retransmits as f64).collect();
            let reference = sc.reference(c);
            let axes = &sc.parts[c.part].axes;
            CellResult {
                cell: c.index,
                part: c.part,
                config: c.config.clone(),
                point: axes.iter().zip(&c.point).map(|(a, v)| a.show(v)).collect(),
                runs: mine.len(),
                metric: Summary::of(&samples),
                utilization: Summary::of(&util),
                jain: Summary::of(&jain),
                leg_retransmits: Summary::of(&retr),
                limit_bps: {
                    let v: Vec<f64> = mine.iter().filter_map(|r| r.limit_bps).collect();
                    (!v.is_empty()).then(|| Summary::of(&v).mean)
                },
                flow_goodputs: {
                    let n = mine.iter().map(|r| r.flows.len()).max().unwrap_or(0);
                    (0..n)
                        .map(|i| {
                            let v: Vec<f64> = mine
                                .iter()
                                .filter(|r| r.flows.len() > 1)
                                .filter_map(|r| r.flows.get(i).map(|f| f.goodput_bps))
                                .collect();
                            Summary::of(&v).mean
                        })
                        .filter(|v| v.is_finite())
                        .collect()
                },
                link_errors: Summary::of(
                    &mine
                        .iter()
                        .map(|r| (r.link.fwd_errors + r.link.ret_errors) as f64)
                        .collect::<Vec<_>>(),
                ),
                queue_drops: Summary::of(
                    &mine
                        .iter()
                        .map(|r| (r.link.fwd_queue_drops + r.link.ret_queue_drops) as f64)
                        .collect::<Vec<_>>(),
                ),
                failures: mine.iter().map(|r| r.failures).sum(),
                reference: reference.map(|r| r.value),
                reference_source: reference.map(|r| r.source.clone()),
                queue_p50: beside_summary(&mine, c.spec.warmup_s(), |q, _| percentile(q, 50.0)),
                queue_p95: beside_summary(&mine, c.spec.warmup_s(), |q, _| percentile(q, 95.0)),
                queue_p99: beside_summary(&mine, c.spec.warmup_s(), |q, _| percentile(q, 99.0)),
                queue_p95_steady: after_drops(sc, c.index, &mine, |q, drops| {
                    let w = c.spec.warmup_s();
                    let steady: Vec<f64> = q
                        .iter()
                        .filter(|(t, _)| {
                            *t >= w && !drops.iter().any(|d| (*d..d + RECOVERY_S).contains(t))
                        })
                        .map(|&(_, v)| v)
                        .collect();
                    percentile(&steady, 95.0)
                }),
                recovery_s: match queue_bound_ms(sc, c.index) {
                    Some(bound) => after_drops(sc, c.index, &mine, |q, drops| {
                        recovery(q, drops, c.spec.warmup_s(), bound)
                    }),
                    None => Summary::of(&[]),
                },
                cross_loss: beside_summary(&mine, 0.0, |_, b| {
                    b.cross_loss.map_or(f64::NAN, |l| l * 100.0)
                }),
                background_bps: Summary::of(
                    &mine
                        .iter()
                        .filter_map(|r| background_total(r))
                        .collect::<Vec<f64>>(),
                ),
                background_share: Summary::of(
                    &mine
                        .iter()
                        .filter_map(|r| {
                            let (bg, g) = (background_total(r)?, *r.samples.first()?);
                            Some(100.0 * g / (g + bg).max(1.0))
                        })
                        .collect::<Vec<f64>>(),
                ),
                background_flows: c
                    .spec
                    .traffic
                    .bulk()
                    .and_then(|t| t.background.as_ref())
                    .map_or(0, |b| b.flows as usize),
                share: Summary::of(
                    &mine
                        .iter()
                        .filter_map(|r| {
                            let b = r.beside.as_ref()?;
                            let c = b.competing_bps?;
                            let g = b
                                .transfer_beside_competing_bps
                                .or_else(|| r.samples.first().copied())?;
                            Some(100.0 * g / (g + c).max(1.0))
                        })
                        .collect::<Vec<_>>(),
                ),
                response_p50: beside_summary(&mine, 0.0, |_, b| percentile(&b.responses, 50.0)),
                response_p95: beside_summary(&mine, 0.0, |_, b| percentile(&b.responses, 95.0)),
                response_p99: beside_summary(&mine, 0.0, |_, b| percentile(&b.responses, 99.0)),
                metric_pct: [50.0, 95.0, 99.0].map(|p| percentile(&samples, p)),
                proxy_cores: Summary::of(
                    &mine
                        .iter()
                        .filter(|r| r.wall_s > 0.0)
                        .filter_map(|r| Some(r.proxy_cpu_s? / r.wall_s))
                        .collect::<Vec<_>>(),
                ),
                proxy_cpu_s_per_gb: per_gb_delivered(&mine, |r| {
                    (r.proxies > 0).then(|| Some(r.proxy_cpu_s? / r.proxies as f64))?
                }),
                machine_cpu_s_per_gb: per_gb_delivered(&mine, |r| r.machine_cpu_s),
                held_p50_kb: held_summary(&mine, |h| h.p50_bytes / 1e3),
                held_max_kb: held_summary(&mine, |h| h.max_bytes / 1e3),
                flow_drops: held_summary(&mine, |h| h.drops as f64),
                link_fwd_per_byte: per_payload_byte(&mine, |r| r.link.fwd_bytes),
                link_ret_per_byte: per_payload_byte(&mine, |r| r.link.ret_bytes),
                link_check: LinkCheck::of(&mine),
                connections: mine.iter().find_map(|r| r.connections.clone()),
                fault: mine.iter().find_map(|r| r.fault.clone()),
                hub: mine.iter().filter_map(|r| r.hub.clone()).collect(),
            }
        })
        .collect()
}

/// Background flows' total goodput in run `r`, bit/s (None without them, or where one gave
/// no result).
fn background_total(r: &RunRecord) -> Option<f64> {
    let b = &r.beside.as_ref()?.background_bps;
    let total: f64 = b.iter().sum();
    (!b.is_empty() && total.is_finite()).then_some(total)
}

/// A figure of split runs' held records, one per run that has one.
fn held_summary(
    runs: &[&RunRecord],
    f: impl Fn(&crate::scenario::split_state::HeldRecord) -> f64,
) -> Summary {
    Summary::of(
        &runs
            .iter()
            .filter_map(|r| r.held.as_ref().map(&f))
            .collect::<Vec<_>>(),
    )
}

/// The congestion controls the satellite-leg sender's sockets ran in a run, the most sampled
/// first, joined by `+` (empty when none was sampled); in tunnel mode the tunnel's controller.
pub fn leg_cc(spec: &CellSpec, samples: &[crate::scenario::traffic::SocketSample]) -> String {
    // The tunnel's hop is QUIC, which ss does not see: the sampled socket is the server's
    // terrestrial TCP sender, so its controller is not the satellite leg's.
    if spec.pep.mode == PepMode::Tunnel {
        return format!("tunnel {}", spec.pep.cc.as_deref().unwrap_or("satellite"));
    }
    let mut n: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in samples.iter().filter(|s| !s.cc.is_empty()) {
        *n.entry(s.cc.as_str()).or_default() += 1;
    }
    let mut v: Vec<(&str, usize)> = n.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v.iter().map(|(c, _)| *c).collect::<Vec<_>>().join("+")
}

/// A per-run figure of the traffic beside the transfer (`f` gets the probe's queueing delays
/// after `warmup` s and the record; NaN for none), summarized over the runs that have it.
fn beside_summary(
    runs: &[&RunRecord],
    warmup: f64,
    f: impl Fn(&[f64], &BesideRecord) -> f64,
) -> Summary {
    let v: Vec<f64> = runs
        .iter()
        .filter_map(|r| {
            let b = r.beside.as_ref()?;
            Some(f(&b.queue_after(warmup), b))
        })
        .filter(|v| v.is_finite())
        .collect();
    Summary::of(&v)
}

/// Seconds the targets give the queue to come back under their bound after the forward rate
/// steps down (issue 14: "back there within 2 s of a rate drop").
const RECOVERY_S: f64 = 2.0;

/// The cell's base RTT: the sum of the directions' largest one-way delays, ms.
pub(crate) fn base_rtt_ms(sc: &Scenario, cell: usize) -> f64 {
    sc.cells[cell]
        .spec
        .link_spec()
        .and_then(|l| l.resolve())
        .map(|c| (c.forward.delay.max_ns() + c.ret.delay.max_ns()) as f64 / 1e6)
        .unwrap_or(0.0)
}

/// The targets' queueing delay bound for the cell, ms, if the scenario sets targets.
pub(crate) fn queue_bound_ms(sc: &Scenario, cell: usize) -> Option<f64> {
    let t = sc.targets.as_ref()?;
    Some(t.queue_ms.max(t.queue_share * base_rtt_ms(sc, cell)))
}

/// The times (s, on the run's clock) at which the cell's forward rate stepped down during
/// the run; None without a forward rate trace or the link's clock.
fn rate_drops(sc: &Scenario, cell: usize, b: &BesideRecord) -> Option<Vec<f64>> {
    let up = b.link_uptime_s?;
    let link = sc.cells[cell].spec.link_spec().ok()?.resolve().ok()?;
    let satpep_link::config::RateSource::Trace(trace) = &link.forward.rate else {
        return None;
    };
    let end = b.queue.last()?.0;
    let drops = trace.drops((up + b.queue.first()?.0).max(0.0) * 1e9, (up + end) * 1e9);
    Some(drops.into_iter().map(|d| d / 1e9 - up).collect())
}

/// `f(probe samples, rate drops)` per run of a cell whose forward rate steps down during the
/// run, summarized; empty for other cells.
fn after_drops(
    sc: &Scenario,
    cell: usize,
    runs: &[&RunRecord],
    f: impl Fn(&[(f64, f64)], &[f64]) -> f64,
) -> Summary {
    let v: Vec<f64> = runs
        .iter()
        .filter_map(|r| {
            let b = r.beside.as_ref()?;
            let drops = rate_drops(sc, cell, b)?;
            (!drops.is_empty()).then(|| f(&b.queue, &drops))
        })
        .filter(|v| v.is_finite())
        .collect();
    Summary::of(&v)
}

/// The longest time after a rate drop past `warmup` until the probe's queueing delay, once
/// over `bound`, came back to it (a later blip is the steady state's), s: 0 for a drop the
/// queue never went over, the whole span if it did not come back before the next drop (10 s
/// at most); NaN if no drop is past the warm-up.
fn recovery(q: &[(f64, f64)], drops: &[f64], warmup: f64, bound: f64) -> f64 {
    let mut worst = f64::NAN;
    for (i, &d) in drops.iter().enumerate().filter(|(_, d)| **d >= warmup) {
        let until = drops
            .get(i + 1)
            .copied()
            .unwrap_or(f64::INFINITY)
            .min(d + 10.0);
        let span: Vec<&(f64, f64)> = q.iter().filter(|(t, _)| *t >= d && *t < until).collect();
        let first_over = span.iter().position(|(_, v)| *v > bound);
        let r = match first_over {
            None => 0.0,
            Some(k) => span[k..]
                .iter()
                .find(|(_, v)| *v <= bound)
                .or(span.last())
                .map_or(0.0, |(t, _)| t - d),
        };
        worst = if worst.is_nan() { r } else { worst.max(r) };
    }
    worst
}

/// How a metric is printed: unit name and divisor.
fn unit(metric: Metric, results: &[CellResult]) -> (&'static str, f64) {
    match metric {
        Metric::Goodput => {
            let max = results
                .iter()
                .map(|r| r.metric.mean)
                .chain(results.iter().filter_map(|r| r.reference))
                .filter(|v| v.is_finite())
                .fold(0.0, f64::max);
            if max >= 2e9 {
                ("Gbit/s", 1e9)
            } else if max >= 2e6 {
                ("Mbit/s", 1e6)
            } else {
                ("kbit/s", 1e3)
            }
        }
        Metric::Time => ("s", 1.0),
        Metric::Latency | Metric::Rtt => ("ms", 1e-3),
        Metric::ConnectRate => ("/s", 1.0),
    }
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn fmt_summary(s: &Summary, div: f64) -> String {
    if s.n == 0 {
        return "–".into();
    }
    if s.n == 1 {
        return fmt_num(s.mean / div);
    }
    format!("{} ± {}", fmt_num(s.mean / div), fmt_num(s.ci95 / div))
}

/// A count's mean (± CI), whole numbers.
fn fmt_count(s: &Summary) -> String {
    match s.n {
        0 => "–".into(),
        1 => format!("{:.0}", s.mean),
        _ => format!("{:.0} ± {:.0}", s.mean, s.ci95),
    }
}

/// A table: header and rows of cells. The report renders it as Markdown and HTML, and keeps
/// each as CSV (tables/) and JSON (tables.json) for scripts.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// Column headings.
    pub header: Vec<String>,
    /// How many leading columns name the row (left-aligned); the rest are figures.
    pub label_cols: usize,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// As Markdown.
    pub fn markdown(&self) -> String {
        let mut s = format!("| {} |\n|", self.header.join(" | "));
        for (i, _) in self.header.iter().enumerate() {
            s.push_str(if i < self.label_cols { "---|" } else { "---:|" });
        }
        s.push('\n');
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }

    /// As CSV: the header, then the rows, quoted where needed.
    pub fn csv(&self) -> String {
        csv_text(std::iter::once(&self.header).chain(&self.rows))
    }

    /// As an HTML table.
    pub fn html(&self) -> String {
        let mut s = String::from("<table>\n<tr>");
        for h in &self.header {
            let _ = write!(s, "<th>{}</th>", esc(h));
        }
        s.push_str("</tr>\n");
        for r in &self.rows {
            s.push_str("<tr>");
            for (i, c) in r.iter().enumerate() {
                let class = if i < self.label_cols {
                    " class=\"l\""
                } else {
                    ""
                };
                let _ = write!(s, "<td{class}>{}</td>", esc(c));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</table>\n");
        s
    }
}

/// Rows: sweep points; columns: configurations. `cell` formats one result.
fn grid(part: &Part, res: &[&CellResult], cell: &dyn Fn(&CellResult) -> String) -> Table {
    let mut header: Vec<String> = part.axes.iter().map(|a| a.label()).collect();
    if header.is_empty() {
        header.push(String::new());
    }
    header.extend(part.configs.iter().cloned());
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut points: Vec<Vec<String>> = Vec::new();
    for r in res {
        if !points.contains(&r.point) {
            points.push(r.point.clone());
        }
    }
    for p in points {
        let mut row = if p.is_empty() {
            vec!["".to_string()]
        } else {
            p.clone()
        };
        for c in &part.configs {
            row.push(
                res.iter()
                    .find(|r| &r.config == c && r.point == p)
                    .map(|r| cell(r))
                    .unwrap_or_default(),
            );
        }
        rows.push(row);
    }
    Table {
        header,
        rows,
        label_cols: part.axes.len().max(1),
    }
}

/// Numeric x of a sweep value (log10 when the axis is log), or None for text values.
fn x_of(v: &Value, log: bool) -> Option<f64> {
    let x = match v {
        Value::Integer(i) => *i as f64,
        Value::Float(f) => *f,
        Value::String(s) => super::spec::parse_size(s)
            .map(|b| b as f64)
            .or_else(|_| super::spec::secs(s))
            .or_else(|_| satpep_link::units::parse_rate(s))
            .ok()?,
        _ => return None,
    };
    if log {
        (x > 0.0).then(|| x.log10())
    } else {
        Some(x)
    }
}

/// The main plot: metric against the first axis, one line per configuration (and value of
/// the other axes); or, without axes, one point per configuration.
#[allow(clippy::too_many_arguments)]
fn metric_plot(
    sc: &Scenario,
    part: &Part,
    res: &[&CellResult],
    y: &dyn Fn(&CellResult) -> (f64, f64),
    reference: bool,
    limits: bool,
    title: &str,
    y_label: &str,
) -> LinePlot {
    let mut p = LinePlot {
        title: title.into(),
        y_label: y_label.into(),
        ..Default::default()
    };
    // `y` of a cell whose metric were `v` (a document's figure, a physical limit).
    let y_of = |r: &CellResult, v: f64| {
        y(&CellResult {
            metric: Summary {
                n: 1,
                mean: v,
                sd: 0.0,
                ci95: 0.0,
            },
            ..r.clone()
        })
        .0
    };
    // The physical limit of line `i`'s bar at x.
    let limit_at = |r: &CellResult, i: usize, x: f64| -> Option<(usize, f64, f64)> {
        let v = r.limit_bps.filter(|_| limits)?;
        Some((i, x, y_of(r, v)))
    };
    let Some(axis) = part.axes.first() else {
        p.categories = part.configs.clone();
        p.bars = true;
        p.x_label = "configuration".into();
        let mut ours = Line {
            name: "satpep lab".into(),
            ..Default::default()
        };
        for (i, c) in part.configs.iter().enumerate() {
            if let Some(r) = res.iter().find(|r| &r.config == c) {
                let (m, d) = y(r);
                ours.points.push((i as f64, m, d));
                if let (true, Some(v)) = (reference, r.reference) {
                    ours.reference.push((i as f64, y_of(r, v)));
                }
                p.limits.extend(limit_at(r, 0, i as f64));
            }
        }
        p.lines.push(ours);
        return p;
    };
    p.x_label = axis.label();
    // Named values (BER "0", "1e-6": a 0 has no place on a log axis, and on a linear one
    // the small values crowd at zero) are categories, as text values are.
    let numeric = axis.names.is_empty() && axis.values.iter().all(|v| x_of(v, axis.log).is_some());
    p.log_x = numeric && axis.log;
    if !numeric {
        // Named points (links, modes): bars, grouped by point, one per configuration.
        p.categories = axis.values.iter().map(|v| axis.show(v)).collect();
        p.bars = true;
    }
    let xpos = |cell: usize| -> f64 {
        let v = &sc.cells[cell].point[0];
        if numeric {
            x_of(v, axis.log).unwrap_or(0.0)
        } else {
            axis.values.iter().position(|w| w == v).unwrap_or(0) as f64
        }
    };
    // One line per configuration × the other axes' values.
    let mut keys: Vec<(String, Vec<String>)> = Vec::new();
    for r in res {
        let k = (r.config.clone(), r.point[1..].to_vec());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (cfg, rest) in keys {
        let mut name = cfg.clone();
        for (a, v) in part.axes[1..].iter().zip(&rest) {
            let _ = write!(name, ", {}={v}", a.label());
        }
        let mut line = Line {
            name,
            ..Default::default()
        };
        for r in res
            .iter()
            .filter(|r| r.config == cfg && r.point[1..] == rest[..])
        {
            let (m, d) = y(r);
            if m.is_finite() {
                line.points.push((xpos(r.cell), m, d));
            }
            if let (true, Some(v)) = (reference, r.reference) {
                line.reference.push((xpos(r.cell), y_of(r, v)));
            }
            if p.bars {
                p.limits.extend(limit_at(r, p.lines.len(), xpos(r.cell)));
            }
        }
        p.lines.push(line);
    }
    p
}

/// The scenario's targets checked per cell of satpep's configurations, if it sets any and
/// the part has them.
fn targets_table(sc: &Scenario, part: &Part, res: &[&CellResult]) -> Option<(String, Table)> {
    let t = sc.targets.as_ref()?;
    let mine: Vec<&CellResult> = res
        .iter()
        .copied()
        .filter(|r| t.satpep.contains(&r.config))
        .collect();
    if mine.is_empty() {
        return None;
    }
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let table = grid(part, &mine, &|r| {
        let mut parts = Vec::new();
        if r.share.n > 0 {
            let (lo, hi) = t.share_pct;
            let s = r.share.mean;
            return format!(
                "{} share {:.1} % in {:.0}–{:.0} %",
                mark((lo..=hi).contains(&s)),
                s,
                lo,
                hi
            );
        }
        if r.utilization.n > 0 {
            let g = r.utilization.mean;
            parts.push(format!("{} {:.1} %", mark(g >= t.goodput), g * 100.0));
            let best = res
                .iter()
                .filter(|o| t.end_to_end.contains(&o.config) && o.point == r.point)
                .filter(|o| o.utilization.n > 0)
                .map(|o| o.utilization.mean)
                .fold(f64::NAN, f64::max);
            if best.is_finite() {
                parts.push(format!("{} ≥ e2e {:.1} %", mark(g >= best), best * 100.0));
            }
        }
        let bound = queue_bound_ms(sc, r.cell).unwrap_or(f64::INFINITY);
        // Where the forward rate steps down, the queue is judged in steady state and by how
        // soon it comes back after each step.
        let steady = r.queue_p95_steady.n > 0;
        let q95 = if steady {
            &r.queue_p95_steady
        } else {
            &r.queue_p95
        };
        if q95.n > 0 {
            parts.push(format!(
                "{} q95{} {:.0} ≤ {:.0} ms",
                mark(q95.mean <= bound),
                if steady { " steady" } else { "" },
                q95.mean,
                bound
            ));
        }
        if steady && r.recovery_s.n > 0 {
            let b = r.recovery_s.mean;
            parts.push(format!(
                "{} back in {:.1} ≤ {:.0} s",
                mark(b <= RECOVERY_S),
                b,
                RECOVERY_S
            ));
        }
        parts.join(" · ")
    });
    Some((
        format!(
            "targets: goodput ≥ {:.0} % of the limit and ≥ the best end-to-end ({}); queueing delay p95 ≤ max({:.0} ms, {:.0} % of the base RTT), where the forward rate steps down in steady state (the {:.0} s after each step left out) and back under it within those {:.0} s (worst step per run); beside a competing end-to-end TCP flow, a share of {:.0}–{:.0} %",
            t.goodput * 100.0,
            t.end_to_end.join(", "),
            t.queue_ms,
            t.queue_share * 100.0,
            RECOVERY_S,
            RECOVERY_S,
            t.share_pct.0,
            t.share_pct.1
        ),
        table,
    ))
}

/// Tables of one part, each with a heading.
fn part_tables(
    part: &Part,
    metric: Metric,
    res: &[&CellResult],
    (uname, div): (&str, f64),
    tunnel: bool,
) -> Vec<(String, Table)> {
    let main = grid(part, res, &|r| {
        let mut s = fmt_summary(&r.metric, div);
        if let Some(v) = r.reference {
            let _ = write!(s, " (doc {})", fmt_num(v / div));
        }
        if r.failures > 0 {
            let _ = write!(s, " [{} failed]", r.failures);
        }
        s
    });
    let mut tables = vec![(
        format!("{} ({uname}), mean ± 95 % CI", metric.heading()),
        main,
    )];
    if metric.is_distribution() {
        tables.push((
            format!(
                "{} ({uname}), p50 / p95 / p99 of every sample of every run",
                metric.heading()
            ),
            grid(part, res, &|r| {
                r.metric_pct
                    .iter()
                    .map(|v| fmt_num(v / div))
                    .collect::<Vec<_>>()
                    .join(" / ")
            }),
        ));
    }
    if metric == Metric::Goodput {
        goodput_tables(part, res, (uname, div), &mut tables);
        beside_tables(part, res, &mut tables);
        cost_tables(part, res, tunnel, &mut tables);
    }
    held_tables(part, res, &mut tables);
    link_check_tables(part, res, &mut tables);
    connections_tables(part, res, &mut tables);
    fault_tables(part, res, &mut tables);
    hub_tables(part, res, &mut tables);
    if res.iter().any(|r| r.link_fwd_per_byte.n > 0) {
        tables.push((
            "link bytes delivered per payload byte, forward / return (whole frames: headers, acknowledgements, repairs)".into(),
            grid(part, res, &|r| match r.link_fwd_per_byte.n {
                0 => "–".into(),
                _ => format!(
                    "{:.4} / {:.4}",
                    r.link_fwd_per_byte.mean, r.link_ret_per_byte.mean
                ),
            }),
        ));
    }
    tables
}

/// A bulk transfer's goodput against the physical limit, and its flows' shares.
fn goodput_tables(
    part: &Part,
    res: &[&CellResult],
    (uname, div): (&str, f64),
    tables: &mut Vec<(String, Table)>,
) {
    tables.push((
        "% of the physical limit (rate × payload/frame × (1 − loss))".into(),
        grid(part, res, &|r| {
            let u = &r.utilization;
            fmt_summary(
                &Summary {
                    n: u.n,
                    mean: u.mean * 100.0,
                    sd: 0.0,
                    ci95: u.ci95 * 100.0,
                },
                1.0,
            )
        }),
    ));
    if res.iter().any(|r| r.jain.n > 0) {
        tables.push((
            format!("each flow's goodput while all ran ({uname}), flow 0 / flow 1 / …"),
            grid(part, res, &|r| {
                r.flow_goodputs
                    .iter()
                    .map(|g| fmt_num(g / div))
                    .collect::<Vec<_>>()
                    .join(" / ")
            }),
        ));
        tables.push((
            "Jain's fairness index over the flows (1 = equal shares)".into(),
            grid(part, res, &|r| fmt_summary(&r.jain, 1.0)),
        ));
    }
}

/// What the traffic beside a transfer met: the probe's queueing delay, the UDP's loss, a
/// competing flow's share, small requests' response times.
fn beside_tables(part: &Part, res: &[&CellResult], tables: &mut Vec<(String, Table)>) {
    let plain = |s: &Summary| fmt_summary(s, 1.0);
    if res.iter().any(|r| r.queue_p95.n > 0) {
        tables.push((
            "queueing delay met by a ping probe beside the transfer (RTT above the path's base RTT, ms after the warm-up), p50 / p95 / p99 (each the mean over the runs)".into(),
            grid(part, res, &|r| {
                format!(
                    "{} / {} / {}",
                    plain(&r.queue_p50),
                    plain(&r.queue_p95),
                    plain(&r.queue_p99)
                )
            }),
        ));
    }
    if res.iter().any(|r| r.cross_loss.n > 0) {
        tables.push((
            "UDP cross traffic's loss (%)".into(),
            grid(part, res, &|r| plain(&r.cross_loss)),
        ));
    }
    if res.iter().any(|r| r.share.n > 0) {
        tables.push((
            "the transfer's share against a competing end-to-end TCP flow (%, 50 = equal)".into(),
            grid(part, res, &|r| plain(&r.share)),
        ));
    }
    if res.iter().any(|r| r.background_flows > 0) {
        let n = res.iter().map(|r| r.background_flows).max().unwrap_or(0);
        tables.push((
            format!(
                "background flows (the dumbbell's {n} other host pairs, end to end on their own path through the same queue): their total goodput (Mbit/s) / the transfer's share of all goodput (%; an equal share is {:.1})",
                100.0 / (n as f64 + 1.0)
            ),
            grid(part, res, &|r| {
                format!(
                    "{} / {}",
                    fmt_summary(&r.background_bps, 1e6),
                    plain(&r.background_share)
                )
            }),
        ));
    }
    if res.iter().any(|r| r.response_p50.n > 0) {
        tables.push((
            "response time of small requests beside the transfer (s), p50 / p95 / p99 (each the mean over the runs)".into(),
            grid(part, res, &|r| {
                format!(
                    "{} / {} / {}",
                    fmt_summary(&r.response_p50, 1.0),
                    fmt_summary(&r.response_p95, 1.0),
                    fmt_summary(&r.response_p99, 1.0)
                )
            }),
        ));
    }
}

/// Split: what the proxies held for their connections, and what their flow control dropped.
fn held_tables(part: &Part, res: &[&CellResult], tables: &mut Vec<(String, Table)>) {
    let plain = |s: &Summary| fmt_summary(s, 1.0);
    if res.iter().any(|r| r.held_p50_kb.n > 0) {
        tables.push((
            "split: what the proxies held for their connections (sockets' queues and relay pipes, both proxies), kB: median / most per run; segments their flow control dropped per run".into(),
            grid(part, res, &|r| {
                if r.held_p50_kb.n == 0 {
                    return String::new();
                }
                format!(
                    "{} / {}; {}",
                    plain(&r.held_p50_kb),
                    plain(&r.held_max_kb),
                    fmt_count(&r.flow_drops)
                )
            }),
        ));
    }
}

/// What a transfer cost: the proxies' CPU, the satellite leg's retransmissions, the
/// emulator's corrupted and dropped frames.
fn cost_tables(part: &Part, res: &[&CellResult], tunnel: bool, tables: &mut Vec<(String, Table)>) {
    let plain = |s: &Summary| fmt_summary(s, 1.0);
    if res.iter().any(|r| r.proxy_cores.n > 0) {
        // The proxies' own figures leave out what the kernel does for them in another task's
        // context (a veth delivers a frame in its sender's softirq: split's TCP sends run in
        // the emulator's), so the machine's figure stands beside them; a configuration's cost
        // is its excess over plain forwarding's.
        tables.push((
            "CPU: the proxies' % of one core, all proxies together / their CPU s per GB delivered, per proxy / the whole machine's CPU s per GB delivered (end hosts, emulator, proxies and the kernel)".into(),
            grid(part, res, &|r| {
                let c = &r.proxy_cores;
                let pct = Summary {
                    mean: c.mean * 100.0,
                    ci95: c.ci95 * 100.0,
                    ..*c
                };
                format!(
                    "{} / {} / {}",
                    plain(&pct),
                    plain(&r.proxy_cpu_s_per_gb),
                    plain(&r.machine_cpu_s_per_gb)
                )
            }),
        ));
    }
    tables.push((
        if tunnel {
            // ss sees TCP, not the tunnel's QUIC: there the sender sampled is the
            // server's, on its terrestrial leg to the gateway.
            "satellite-leg sender's retransmitted segments per run (tunnel: the server's TCP, on its leg to the gateway)".into()
        } else {
            "satellite-leg sender's retransmitted segments per run".into()
        },
        grid(part, res, &|r| fmt_count(&r.leg_retransmits)),
    ));
    tables.push((
        "emulator: frames corrupted / dropped by the queue per run (both directions)".into(),
        grid(part, res, &|r| {
            format!(
                "{} / {}",
                fmt_count(&r.link_errors),
                fmt_count(&r.queue_drops)
            )
        }),
    ));
}

/// The udp and ping kinds' tables: the link measured against its configuration.
fn link_check_tables(part: &Part, res: &[&CellResult], tables: &mut Vec<(String, Table)>) {
    let fixed = |s: &Summary, decimals: usize, sign: bool| match (s.n, sign) {
        (0, _) => "–".to_string(),
        (1, true) => format!("{:+.*}", decimals, s.mean),
        (1, false) => format!("{:.*}", decimals, s.mean),
        (_, true) => format!("{:+.*} ± {:.*}", decimals, s.mean, decimals, s.ci95),
        (_, false) => format!("{:.*} ± {:.*}", decimals, s.mean, decimals, s.ci95),
    };
    if res.iter().any(|r| r.link_check.rate_error_pct.n > 0) {
        tables.push((
            "UDP: delivered frame rate against the configured rate (%), counted as frames leave \
             the emulator, from the warm-up to as long before the end"
                .into(),
            grid(part, res, &|r| fixed(&r.link_check.rate_error_pct, 3, true)),
        ));
        tables.push((
            "UDP: datagrams lost (%, all causes, runs pooled) / the loss model's expectation \
             [99 % binomial interval for the datagrams sent]"
                .into(),
            grid(part, res, &|r| {
                let c = &r.link_check;
                if c.datagrams == 0 {
                    return "–".into();
                }
                format!(
                    "{:.3} / {:.3} [{:.3}, {:.3}]",
                    c.loss_pct, c.loss_expected_pct, c.loss_interval_pct.0, c.loss_interval_pct.1
                )
            }),
        ));
        tables.push((
            "the emulator's CPU over the UDP window: user / system, % of one core (system time \
             includes the receiving namespaces' stacks, which run inside its send calls)"
                .into(),
            grid(part, res, &|r| {
                let c = &r.link_check;
                format!(
                    "{} / {}",
                    fixed(&c.cpu_user_pct, 0, false),
                    fixed(&c.cpu_sys_pct, 0, false)
                )
            }),
        ));
    }
    if res.iter().any(|r| r.link_check.ping_avg_ms.n > 0) {
        tables.push((
            "ping: RTT min / avg / max (ping's own summary, ms; the mean over the runs) / \
             expected (both delays plus each frame's serialization)"
                .into(),
            grid(part, res, &|r| {
                let c = &r.link_check;
                let e = match c.ping_expected_ms.is_finite() {
                    true => format!("{:.3}", c.ping_expected_ms),
                    false => "–".into(),
                };
                format!(
                    "{:.3} / {:.3} / {:.3} / {e}",
                    c.ping_min_ms.mean, c.ping_avg_ms.mean, c.ping_max_ms.mean
                )
            }),
        ));
    }
    if res.iter().any(|r| r.link_check.late_p99_ms.n > 0) {
        tables.push((
            "the emulator's release lateness p99 (ms after a frame's scheduled time, worse \
             direction)"
                .into(),
            grid(part, res, &|r| fixed(&r.link_check.late_p99_ms, 3, false)),
        ));
    }
}

/// The connections kind's tables, from each cell's first run (a load run is one long run).
fn connections_tables(part: &Part, res: &[&CellResult], tables: &mut Vec<(String, Table)>) {
    if !res.iter().any(|r| r.connections.is_some()) {
        return;
    }
    let mib = |b: u64| format!("{:.1}", b as f64 / (1 << 20) as f64);
    let with = |f: &dyn Fn(&crate::scenario::kinds::connections::ConnectionsRecord) -> String| {
        grid(part, res, &|r| r.connections.as_ref().map_or("–".into(), f))
    };
    let proxied = |c: &crate::scenario::kinds::connections::ConnectionsRecord| c.fds[1] > c.fds[0];
    tables.push((
        "connections opened / failed to open / accepted / echoed / 16 KB intact within 300 s / \
         bypassed the proxies (past their budget: end to end)"
            .into(),
        with(&|c| {
            format!(
                "{} / {} / {} / {} / {} / {}",
                c.connected, c.failed_connects, c.accepted, c.echoed, c.busy_intact, c.bypassed
            )
        }),
    ));
    tables.push((
        "the proxies' resident memory, MiB: start / all idle / busy peak / after closing".into(),
        with(&|c| match proxied(c) {
            true => format!(
                "{} / {} / {} / {}",
                mib(c.rss[0]),
                mib(c.rss[1]),
                mib(c.rss[2]),
                mib(c.rss[3])
            ),
            false => "(no proxy)".into(),
        }),
    ));
    tables.push((
        "the proxies' resident memory per connection, KB: idle / busy".into(),
        with(&|c| match proxied(c) {
            true => format!(
                "{:.1} / {:.1}",
                c.rss_per_idle / 1024.0,
                c.rss_per_busy / 1024.0
            ),
            false => "–".into(),
        }),
    ));
    tables.push((
        "the proxies' descriptors: start / all idle / after closing; seconds until back to the start"
            .into(),
        with(&|c| {
            let back = c
                .drain_s
                .map_or("not within 60 s".into(), |d| format!("{d:.1} s"));
            match proxied(c) {
                true => format!("{} / {} / {}; {back}", c.fds[0], c.fds[1], c.fds[3]),
                false => back,
            }
        }),
    ));
    tables.push((
        "the kernel's TCP memory (every socket of the machine), MiB: idle / busy peak / after"
            .into(),
        with(&|c| {
            format!(
                "{} / {} / {}",
                mib(c.tcp_mem[1]),
                mib(c.tcp_mem[2]),
                mib(c.tcp_mem[3])
            )
        }),
    ));
}

/// The hub kind's tables: how the carrier was shared (means over the runs), and each
/// terminal's goodput and queue at each sweep point.
fn hub_tables(part: &Part, res: &[&CellResult], tables: &mut Vec<(String, Table)>) {
    use crate::scenario::kinds::hub::HubRecord;
    if !res.iter().any(|r| !r.hub.is_empty()) {
        return;
    }
    // The mean over a cell's runs of what `f` reads from each (runs without it left out).
    let over = |r: &CellResult, f: &dyn Fn(&HubRecord) -> Option<f64>| {
        let v: Vec<f64> = r.hub.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let of_fair = |t: &crate::scenario::kinds::hub::TerminalRecord| {
        (t.stopped_s.is_none() && t.fair_bps > 0.0).then(|| 100.0 * t.goodput_bps / t.fair_bps)
    };
    let show = |v: Option<f64>, digits: usize| v.map_or("–".into(), |v| format!("{v:.digits$}"));
    tables.push((
        "hub: the carrier's goodput % of the limit its policy gives the busy terminals (time or bits, by weight) / Jain's index over their goodputs each ÷ its fair share / the least and the most % of a fair share / the worst terminal's queueing delay p95, ms (means over the runs)".into(),
        grid(part, res, &|r| {
            if r.hub.is_empty() {
                return "–".into();
            }
            let least = over(r, &|h| h.busy_terminals().iter().filter_map(of_fair).reduce(f64::min));
            let most = over(r, &|h| h.busy_terminals().iter().filter_map(of_fair).reduce(f64::max));
            let q = over(r, &|h| h.busy_terminals().iter().filter_map(|t| t.queue_p95_ms).reduce(f64::max));
            format!(
                "{} / {} / {}–{} / {}",
                show((r.utilization.n > 0).then_some(r.utilization.mean * 100.0), 1),
                show((r.jain.n > 0).then_some(r.jain.mean), 3),
                show(least, 0),
                show(most, 0),
                show(q, 0)
            )
        }),
    ));
    if res.iter().any(|r| {
        r.hub
            .iter()
            .any(|h| h.taken_s.is_some() || h.terminals.iter().any(|t| t.stopped_s.is_some()))
    }) {
        tables.push((
            "hub: after terminals stopped, seconds until the others delivered 90 % of what the carrier holds for them over the next half second, counted from the stopped downloads' end / from their last byte's arrival (steps of 0.5 s with iperf3, 0.1 s with the lab's generator; per run)".into(),
            grid(part, res, &|r| {
                let s = |t: Option<f64>| t.map_or("never".into(), |s| format!("{s:.1}"));
                r.hub
                    .iter()
                    .map(|h| format!("{} / {}", s(h.taken_s), s(h.taken_after_last_byte_s)))
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
        ));
    }
    if res
        .iter()
        .any(|r| r.hub.iter().any(|h| h.gateway.is_some()))
    {
        tables.push((
            "hub: the gateway proxy's resident memory, MiB idle (every terminal connected) / busy peak; per terminal idle KB / per flow busy KB (the busy peak less idle); CPU s per run".into(),
            grid(part, res, &|r| {
                let Some((h, g)) = r.hub.iter().find_map(|h| Some((h, h.gateway.as_ref()?))) else {
                    return "–".into();
                };
                let n = h.terminals.len().max(1) as f64;
                format!(
                    "{:.1} / {:.1}; {:.0} / {:.0}; {}",
                    g.rss_idle_kb as f64 / 1024.0,
                    g.rss_busy_kb as f64 / 1024.0,
                    g.rss_idle_kb as f64 / n,
                    g.rss_busy_kb.saturating_sub(g.rss_idle_kb) as f64 / h.flows.max(1) as f64,
                    show(over(r, &|h| h.gateway.as_ref().map(|g| g.cpu_s)), 1)
                )
            }),
        ));
    }
    // Each terminal at each point: rows are terminals, columns configurations.
    let mut points: Vec<Vec<String>> = Vec::new();
    for r in res {
        if !r.hub.is_empty() && !points.contains(&r.point) {
            points.push(r.point.clone());
        }
    }
    for p in points {
        let here: Vec<&&CellResult> = res.iter().filter(|r| r.point == p).collect();
        let Some(first) = here.iter().find_map(|r| r.hub.first()) else {
            continue;
        };
        let mut header = vec!["terminal".to_string()];
        header.extend(part.configs.iter().cloned());
        let mut rows = Vec::new();
        for (i, t) in first.terminals.iter().enumerate() {
            let mut label = format!(
                "{} (limit {:.1}{})",
                t.name,
                t.limit_bps / 1e6,
                t.stopped_s
                    .map_or(String::new(), |s| format!(", stops at {s:.0} s"))
            );
            if i >= first.busy as usize {
                label = format!("{} (idle)", t.name);
            }
            let mut row = vec![label];
            for c in &part.configs {
                let cell = here
                    .iter()
                    .find(|r| &r.config == c)
                    .map_or(String::new(), |r| {
                        let g = over(r, &|h| h.terminals.get(i).map(|t| t.goodput_bps / 1e6));
                        let f = over(r, &|h| {
                            let t = h.terminals.get(i)?;
                            (t.fair_bps > 0.0).then(|| 100.0 * t.goodput_bps / t.fair_bps)
                        });
                        let q = over(r, &|h| h.terminals.get(i)?.queue_p95_ms);
                        match i < first.busy as usize {
                            true => {
                                format!("{} ({} %) · {} ms", show(g, 2), show(f, 0), show(q, 0))
                            }
                            false => "–".into(),
                        }
                    });
                row.push(cell);
            }
            rows.push(row);
        }
        let at = match p.is_empty() {
            true => String::new(),
            false => format!(" at {}", p.join(", ")),
        };
        tables.push((
            format!("hub: each terminal's goodput after the warm-up, Mbit/s (% of its fair share by the configuration's policy) · its queueing delay p95, ms (means over the runs){at}; its link's limit, Mbit/s"),
            Table {
                header,
                rows,
                label_cols: 1,
            },
        ));
    }
}

/// The fault kind's tables, from each cell's first run.
fn fault_tables(part: &Part, res: &[&CellResult], tables: &mut Vec<(String, Table)>) {
    use crate::scenario::kinds::fault::{fmt_bytes, FaultRecord};
    if !res.iter().any(|r| r.fault.is_some()) {
        return;
    }
    let with = |f: &dyn Fn(&FaultRecord) -> String| {
        grid(part, res, &|r| r.fault.as_ref().map_or("–".into(), f))
    };
    let of = |got: u64, meant: Option<u64>| match meant {
        Some(m) => format!("{} of {}", fmt_bytes(got), fmt_bytes(m)),
        None => fmt_bytes(got),
    };
    tables.push((
        "verdict: pass, or why not (a corrupted byte, a silent truncation, a hang, an end the case does not allow)".into(),
        with(&|f| match f.problems.is_empty() {
            true => "pass".into(),
            false => format!("FAIL: {}", f.problems.join("; ")),
        }),
    ));
    tables.push((
        "how each end's connection ended: client / server".into(),
        with(&|f| format!("{} / {}", f.client.end.word(), f.server.end.word())),
    ));
    tables.push((
        "bytes each end received, of what the other meant to send: client / server".into(),
        with(&|f| {
            format!(
                "{} / {}",
                of(f.client.received, f.server_meant),
                of(f.server.received, f.client_meant)
            )
        }),
    ));
    tables.push((
        "seconds from the fault to the client's end; what was checked after it".into(),
        with(&|f| {
            let t = f
                .client_end_after_fault_s
                .map_or("–".into(), |t| format!("{t:.2} s"));
            match f.after.is_empty() {
                true => t,
                false => format!("{t}; {}", f.after),
            }
        }),
    ));
}

/// Writes every output file into `out` and returns the Markdown report.
pub fn write_all(sc: &Scenario, out: &Path, runs: &[RunRecord]) -> Result<String, String> {
    let res = summarize(sc, runs);
    let w = |name: &str, text: String| -> Result<(), String> {
        std::fs::write(out.join(name), text).map_err(|e| format!("cannot write {name}: {e}"))
    };
    for (name, text) in csv_files(sc, runs, &res) {
        w(name, text)?;
    }
    let metrics: Vec<Metric> = (0..sc.parts.len()).map(|p| sc.metric(p)).collect();
    let provenance = super::provenance::summarize(runs.iter().map(|r| r.provenance.as_ref()));
    w(
        "results.json",
        serde_json::to_string_pretty(&serde_json::json!({
            "scenario": {
                "name": sc.name, "title": sc.title, "reproduces": sc.reproduces,
                "parts": sc.parts, "metrics": metrics,
            },
            "provenance": provenance,
            "cells": res,
            "runs": runs,
        }))
        .unwrap(),
    )?;
    let mut doc = Doc::new(&sc.title);
    intro(&mut doc, sc, runs, &res, &provenance.sentence());
    let mut plot_err = super::plot::init_font().err();
    for pi in 0..sc.parts.len() {
        part_section(&mut doc, sc, out, pi, &res, runs, &mut plot_err);
    }
    if let Some(e) = &plot_err {
        doc.para(&format!("Plots skipped: {e}"));
    } else {
        series_section(&mut doc, sc, out, runs);
    }
    problems(&mut doc, sc, runs);
    doc.para(FILES);
    write_tables(out, doc.tables())?;
    let (md, html) = doc.finish();
    w("report.md", md.clone())?;
    w("report.html", html)?;
    Ok(md)
}

/// The report's tables as tables.json and tables/NN-section-title.csv (one file each, numbered
/// in the report's order; stale files from an earlier report removed).
fn write_tables(out: &Path, tables: &[super::doc::DocTable]) -> Result<(), String> {
    let dir = out.join("tables");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (i, t) in tables.iter().enumerate() {
        let slug = super::spec::slug(&format!("{} {}", t.section, t.title));
        let name = format!(
            "{:02}-{}.csv",
            i + 1,
            slug.chars().take(60).collect::<String>()
        );
        std::fs::write(dir.join(&name), t.table.csv())
            .map_err(|e| format!("cannot write tables/{name}: {e}"))?;
    }
    let json = serde_json::to_string_pretty(tables).unwrap_or_default();
    std::fs::write(out.join("tables.json"), json)
        .map_err(|e| format!("cannot write tables.json: {e}"))
}

/// What the results directory holds, as the report's last line says it.
const FILES: &str = "Files: runs.csv (one row per run), summary.csv (per cell), series.csv \
    (goodput per flow per second), sockets.csv (satellite-leg sender's cwnd, RTT and controller \
    every 0.5 s), tunnel.csv (tunnel mode: the tunnel's window, RTT, rate model, phase and \
    packet counters every 0.5 s), split.csv (split mode: each connection's satellite model, as \
    the kernel controller holds it, every 0.5 s), results.json (all of it), tables.json and tables/*.csv (the \
    report's tables), metric-*.svg/png, cdf-*.svg/png, series/*.svg, \
    report.html. Column names end in their unit (_bps, _s, _ms, _pct, _frac, _segments, _bytes).";

/// A sweep point as `label=value; …`.
fn point_of(sc: &Scenario, cell: usize) -> String {
    let c = &sc.cells[cell];
    let axes = &sc.parts[c.part].axes;
    axes.iter()
        .zip(&c.point)
        .map(|(a, v)| format!("{}={}", a.label(), a.show(v)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A CSV column: its name (ending in its unit) and how a row gives its value.
type Col<'a, T> = (&'static str, Box<dyn Fn(&T) -> String + 'a>);

/// Columns of `T` rows: `cols![T; "name" => |r| value, …]`.
macro_rules! cols {
    ($t:ty; $($name:literal => |$r:ident| $e:expr),+ $(,)?) => {
        [$(($name, Box::new(move |$r: &$t| $e) as Box<dyn Fn(&$t) -> String>)),+]
    };
}

/// `rows` as CSV (the csv crate quotes what needs quoting), the header from `cols` so that a
/// column's name and its value cannot drift apart.
fn csv_table<T>(rows: impl IntoIterator<Item = T>, cols: &[Col<'_, T>]) -> String {
    let header = cols.iter().map(|c| c.0.to_string()).collect::<Vec<_>>();
    let rows = rows
        .into_iter()
        .map(|r| cols.iter().map(|c| (c.1)(&r)).collect::<Vec<_>>());
    csv_text(std::iter::once(header).chain(rows))
}

/// Records (the header first) as CSV text, quoted where needed by the csv crate.
fn csv_text<R>(records: impl IntoIterator<Item = R>) -> String
where
    R: IntoIterator,
    R::Item: AsRef<[u8]>,
{
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in records {
        let _ = w.write_record(r);
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// The CSV files: one row per run, per cell, per flow interval, per socket sample. Every
/// figure's column names its unit; a part's main metric goes to `goodput_bps` (bulk),
/// `time_s` (completion, response or round-trip time) or `connects_per_s` (connections), the
/// others left empty.
fn csv_files(sc: &Scenario, runs: &[RunRecord], res: &[CellResult]) -> Vec<(&'static str, String)> {
    // The main metric's value `v` of `cell` if its metric is `want`, else empty.
    let main = |want: fn(Metric) -> bool, cell: usize, v: Option<f64>| {
        if want(sc.metric(sc.cells[cell].part)) {
            opt(v)
        } else {
            String::new()
        }
    };
    let bulk = |m: Metric| m == Metric::Goodput;
    let time = |m: Metric| matches!(m, Metric::Time | Metric::Latency | Metric::Rtt);
    let rate = |m: Metric| m == Metric::ConnectRate;
    let mean = |r: &RunRecord| Summary::of(&r.samples).mean;
    let runs_csv = csv_table(
        runs,
        &cols![&RunRecord;
            "cell" => |r| r.cell.to_string(),
            "part" => |r| sc.parts[sc.cells[r.cell].part].name.clone(),
            "config" => |r| sc.cells[r.cell].config.clone(),
            "point" => |r| point_of(sc, r.cell),
            "repetition" => |r| r.repetition.to_string(),
            "seed" => |r| r.seed.to_string(),
            "metric" => |r| sc.metric(sc.cells[r.cell].part).heading().to_string(),
            "goodput_bps" => |r| main(bulk, r.cell, Some(mean(r))),
            "time_s" => |r| main(time, r.cell, Some(mean(r))),
            "utilization_frac" => |r| opt(r.utilization),
            "jain_index" => |r| opt(r.jain),
            "leg_retransmits_segments" => |r| r.leg_retransmits.to_string(),
            "held_p50_kb" => |r| opt(r.held.as_ref().map(|h| h.p50_bytes / 1e3)),
            "held_max_kb" => |r| opt(r.held.as_ref().map(|h| h.max_bytes / 1e3)),
            "held_terminal_p50_kb" => |r| opt(r.held.as_ref().and_then(|h| h.p50_by_proxy.first()).map(|b| b / 1e3)),
            "held_gateway_p50_kb" => |r| opt(r.held.as_ref().and_then(|h| h.p50_by_proxy.get(1)).map(|b| b / 1e3)),
            "flow_drops" => |r| r.held.as_ref().map_or(String::new(), |h| h.drops.to_string()),
            "leg_cc" => |r| leg_cc(&sc.cells[r.cell].spec, &r.sockets),
            "failures" => |r| r.failures.to_string(),
            "errors" => |r| r.errors.join("; "),
            "connects_per_s" => |r| main(rate, r.cell, Some(mean(r))),
        ],
    );
    let m = |s: &Summary| opt(Some(s.mean));
    let pct = |r: &CellResult, i: usize| match sc.metric(r.part).is_distribution() {
        false => String::new(),
        true => opt(Some(r.metric_pct[i])),
    };
    let summary = csv_table(
        res,
        &cols![&CellResult;
            "cell" => |r| r.cell.to_string(),
            "part" => |r| sc.parts[r.part].name.clone(),
            "config" => |r| r.config.clone(),
            "point" => |r| point_of(sc, r.cell),
            "runs" => |r| r.runs.to_string(),
            "metric" => |r| sc.metric(r.part).heading().to_string(),
            "goodput_bps_mean" => |r| main(bulk, r.cell, Some(r.metric.mean)),
            "goodput_bps_sd" => |r| main(bulk, r.cell, Some(r.metric.sd)),
            "goodput_bps_ci95" => |r| main(bulk, r.cell, Some(r.metric.ci95)),
            "time_s_mean" => |r| main(time, r.cell, Some(r.metric.mean)),
            "time_s_sd" => |r| main(time, r.cell, Some(r.metric.sd)),
            "time_s_ci95" => |r| main(time, r.cell, Some(r.metric.ci95)),
            "time_s_p50" => |r| pct(r, 0),
            "time_s_p95" => |r| pct(r, 1),
            "time_s_p99" => |r| pct(r, 2),
            "utilization_frac" => |r| m(&r.utilization),
            "jain_index" => |r| m(&r.jain),
            "leg_retransmits_segments" => |r| m(&r.leg_retransmits),
            "queue_p50_ms" => |r| m(&r.queue_p50),
            "queue_p95_ms" => |r| m(&r.queue_p95),
            "queue_p99_ms" => |r| m(&r.queue_p99),
            "cross_loss_pct" => |r| m(&r.cross_loss),
            "share_pct" => |r| m(&r.share),
            "response_p50_s" => |r| m(&r.response_p50),
            "response_p95_s" => |r| m(&r.response_p95),
            "response_p99_s" => |r| m(&r.response_p99),
            "held_p50_kb" => |r| m(&r.held_p50_kb),
            "held_max_kb" => |r| m(&r.held_max_kb),
            "flow_drops" => |r| m(&r.flow_drops),
            "proxy_cpu_frac" => |r| m(&r.proxy_cores),
            "proxy_cpu_s_per_gb" => |r| m(&r.proxy_cpu_s_per_gb),
            "machine_cpu_s_per_gb" => |r| m(&r.machine_cpu_s_per_gb),
            "link_fwd_bytes_per_payload_byte" => |r| m(&r.link_fwd_per_byte),
            "link_ret_bytes_per_payload_byte" => |r| m(&r.link_ret_per_byte),
            "udp_rate_error_pct" => |r| m(&r.link_check.rate_error_pct),
            "udp_lost_pct" => |r| opt(Some(r.link_check.loss_pct)),
            "udp_lost_expected_pct" => |r| opt(Some(r.link_check.loss_expected_pct)),
            "emulator_cpu_user_pct" => |r| m(&r.link_check.cpu_user_pct),
            "emulator_cpu_sys_pct" => |r| m(&r.link_check.cpu_sys_pct),
            "emulator_late_p99_ms" => |r| m(&r.link_check.late_p99_ms),
            "ping_min_ms" => |r| m(&r.link_check.ping_min_ms),
            "ping_avg_ms" => |r| m(&r.link_check.ping_avg_ms),
            "ping_max_ms" => |r| m(&r.link_check.ping_max_ms),
            "ping_expected_ms" => |r| opt(Some(r.link_check.ping_expected_ms)),
            "failures" => |r| r.failures.to_string(),
            "reference_bps" => |r| main(bulk, r.cell, r.reference),
            "reference_s" => |r| main(time, r.cell, r.reference),
            "connects_per_s_mean" => |r| main(rate, r.cell, Some(r.metric.mean)),
        ],
    );
    let intervals = runs.iter().flat_map(|r| {
        r.flows.iter().enumerate().flat_map(move |(i, f)| {
            f.series
                .iter()
                .map(move |&(t, b)| (r, i, f.cc.as_str(), t, b))
        })
    });
    let series = csv_table(
        intervals,
        &cols![(&RunRecord, usize, &str, f64, u64);
            "cell" => |x| x.0.cell.to_string(),
            "repetition" => |x| x.0.repetition.to_string(),
            "flow" => |x| x.1.to_string(),
            "cc" => |x| x.2.to_string(),
            "t_s" => |x| format!("{:.3}", x.3),
            "bytes" => |x| x.4.to_string(),
        ],
    );
    let sockets = csv_table(
        runs.iter()
            .flat_map(|r| r.sockets.iter().map(move |s| (r, s))),
        &cols![(&RunRecord, &SocketSample);
            "cell" => |x| x.0.cell.to_string(),
            "repetition" => |x| x.0.repetition.to_string(),
            "flow" => |x| x.1.flow.to_string(),
            "t_s" => |x| format!("{:.2}", x.1.t),
            "cwnd_segments" => |x| x.1.cwnd.to_string(),
            "rtt_ms" => |x| x.1.rtt_ms.to_string(),
            "retrans_segments" => |x| x.1.retrans.to_string(),
            "cc" => |x| x.1.cc.clone(),
        ],
    );
    let o = |v: Option<f64>, digits: usize| v.map_or(String::new(), |v| format!("{v:.digits$}"));
    let n = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let tunnel = csv_table(
        runs.iter()
            .flat_map(|r| r.tunnel.iter().map(move |s| (r, s))),
        &cols![(&RunRecord, &TunnelSample);
            "cell" => |x| x.0.cell.to_string(),
            "repetition" => |x| x.0.repetition.to_string(),
            "t_s" => |x| format!("{:.2}", x.1.t),
            "window_bytes" => |x| x.1.window_bytes.to_string(),
            "rtt_ms" => |x| format!("{:.1}", x.1.rtt_ms),
            "model_rate_bps" => |x| o(x.1.model_rate_bps, 1),
            "model_base_rtt_ms" => |x| o(x.1.model_base_rtt_ms, 1),
            "phase" => |x| x.1.phase.to_string(),
            "sent_packets" => |x| n(x.1.sent_packets),
            "lost_packets" => |x| n(x.1.lost_packets),
            "udp_tx_bytes" => |x| n(x.1.udp_tx_bytes),
            "channel_loss" => |x| o(x.1.channel_loss, 4),
            "loss_burst_packets" => |x| o(x.1.loss_burst, 0),
            "shallow_buffer_ms" => |x| o(x.1.shallow_buffer_ms, 1),
        ],
    );
    let split = csv_table(
        runs.iter()
            .flat_map(|r| r.split.iter().map(move |s| (r, s))),
        &cols![(&RunRecord, &SplitSample);
            "cell" => |x| x.0.cell.to_string(),
            "repetition" => |x| x.0.repetition.to_string(),
            "conn" => |x| x.1.conn.to_string(),
            "flow" => |x| x.1.flow.to_string(),
            "t_s" => |x| format!("{:.2}", x.1.t),
            "cwnd_segments" => |x| x.1.leg.cwnd.to_string(),
            "rtt_ms" => |x| format!("{:.1}", x.1.leg.rtt_ms),
            "retrans_segments" => |x| x.1.leg.total_retrans.to_string(),
            "bytes_acked" => |x| x.1.leg.bytes_acked.to_string(),
            "pacing_bps" => |x| x.1.leg.pacing_rate_bps.to_string(),
            "busy_ms" => |x| x.1.leg.busy_ms.to_string(),
            "rwnd_limited_ms" => |x| x.1.leg.rwnd_limited_ms.to_string(),
            "sndbuf_limited_ms" => |x| x.1.leg.sndbuf_limited_ms.to_string(),
            "phase" => |x| x.1.model.phase.clone(),
            "model_rate_bps" => |x| x.1.model.rate_bps.to_string(),
            "model_base_rtt_ms" => |x| o(x.1.model.base_rtt_ms, 1),
            "queue_ms" => |x| format!("{:.1}", x.1.model.queue_ms),
            "channel_loss" => |x| o(x.1.model.channel_loss, 4),
            "loss_burst_segments" => |x| n(x.1.model.loss_burst.map(u64::from)),
            "shallow_buffer_ms" => |x| o(x.1.model.shallow_buffer_ms, 1),
        ],
    );
    vec![
        ("runs.csv", runs_csv),
        ("summary.csv", summary),
        ("series.csv", series),
        ("sockets.csv", sockets),
        ("tunnel.csv", tunnel),
        ("split.csv", split),
    ]
}

/// What was run, by which build, and the scenario's notes.
fn intro(doc: &mut Doc, sc: &Scenario, runs: &[RunRecord], res: &[CellResult], provenance: &str) {
    if let Some(r) = &sc.reproduces {
        doc.para(&format!("Reproduces: {r}."));
    }
    let runs_n: usize = sc.cells.iter().map(|c| c.spec.repetitions as usize).sum();
    let failures: u32 = res.iter().map(|r| r.failures).sum();
    doc.para(&format!(
        "Scenario `{}`: {} cells, {} of {runs_n} runs recorded{}.",
        sc.name,
        sc.cells.len(),
        runs.len(),
        if failures > 0 {
            format!(", {failures} failed transfers (marked)")
        } else {
            String::new()
        }
    ));
    doc.para(provenance);
    if let Some(n) = &sc.notes {
        doc.para(n);
    }
}

/// Writes a plot as `file`.svg/png; returns the SVG text, or records the first error.
fn plot_file(
    out: &Path,
    file: &str,
    p: &LinePlot,
    size: (u32, u32),
    err: &mut Option<String>,
) -> Option<String> {
    if err.is_some() {
        return None;
    }
    match write_line_plot(&out.join(file), p, size) {
        Ok(()) => {
            Some(std::fs::read_to_string(out.join(format!("{file}.svg"))).unwrap_or_default())
        }
        Err(e) => {
            *err = Some(e);
            None
        }
    }
}

/// One part: its tables, the main metric's plot, fairness, and the distributions of its
/// latency-like figures.
fn part_section(
    doc: &mut Doc,
    sc: &Scenario,
    out: &Path,
    pi: usize,
    res: &[CellResult],
    runs: &[RunRecord],
    plot_err: &mut Option<String>,
) {
    let part = &sc.parts[pi];
    let pres: Vec<&CellResult> = res.iter().filter(|r| r.part == pi).collect();
    let metric = sc.metric(pi);
    let owned: Vec<CellResult> = pres.iter().map(|r| (*r).clone()).collect();
    let (uname, div) = unit(metric, &owned);
    let level = if sc.parts.len() > 1 {
        doc.heading(2, &part.title);
        3
    } else {
        2
    };
    let tunnel = sc
        .cells
        .iter()
        .any(|c| c.part == pi && c.spec.pep.mode == PepMode::Tunnel);
    // A drawn part (a link corpus) is read over its links first; its per-link tables and
    // plots follow as in any part.
    if !part.drawn.is_empty() {
        super::corpus_report::section(doc, sc, pi, res, runs, &mut |file, p| {
            plot_file(out, file, p, (900, 480), plot_err)
        });
    }
    let mut tables = part_tables(part, metric, &pres, (uname, div), tunnel);
    if let Some(t) = targets_table(sc, part, &pres) {
        tables.insert(0, t);
    }
    tables.extend(super::significance::tables(
        sc,
        pi,
        &pres,
        runs,
        (uname, div),
    ));
    for (title, t) in &tables {
        doc.table(level, title, t);
    }
    let mut sources: Vec<&str> = pres
        .iter()
        .filter_map(|r| r.reference_source.as_deref())
        .collect();
    sources.sort_unstable();
    sources.dedup();
    if !sources.is_empty() {
        doc.para(&format!(
            "(doc X): the source document's figure for that cell ({}).",
            sources.join("; ")
        ));
    }
    let mp = main_plot(sc, part, metric, &pres, uname, div);
    let file = format!("metric-{}", part.name);
    if let Some(svg) = plot_file(out, &file, &mp, (960, 560), plot_err) {
        doc.figure(
            &format!("{file}.svg"),
            &format!("{} by {}", metric.heading(), mp.x_label),
            &svg,
        );
    }
    if pres.iter().any(|r| r.jain.n > 0) {
        let jp = metric_plot(
            sc,
            part,
            &pres,
            &|r| (r.jain.mean, 0.0),
            false,
            false,
            &format!("{}: Jain's fairness index", part.title),
            "Jain index",
        );
        let file = format!("fairness-{}", part.name);
        if let Some(svg) = plot_file(out, &file, &jp, (960, 480), plot_err) {
            doc.figure(
                &format!("{file}.svg"),
                "Jain's fairness index over the flows",
                &svg,
            );
        }
    }
    // A corpus's per-link CDFs would be one plot per link: its section has them over the
    // links instead.
    let cdfs = match part.drawn.is_empty() {
        true => distributions(sc, out, pi, metric, runs, plot_err),
        false => Vec::new(),
    };
    if !cdfs.is_empty() {
        doc.para(
            "Distributions (every sample of every repetition after the warm-up, one line per \
             configuration; p50 / p95 / p99 in the tables above):",
        );
        doc.folded(&cdfs);
    }
}

/// The main metric against the first axis (bars or lines; see [`metric_plot`]).
fn main_plot(
    sc: &Scenario,
    part: &Part,
    metric: Metric,
    pres: &[&CellResult],
    uname: &str,
    div: f64,
) -> LinePlot {
    let log_y = metric == Metric::Goodput && {
        let v: Vec<f64> = pres
            .iter()
            .map(|r| r.metric.mean)
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        !v.is_empty() && hi / lo > 50.0
    };
    let ylab = format!(
        "{} ({uname}{})",
        metric.heading(),
        if log_y { ", log" } else { "" }
    );
    let mut mp = metric_plot(
        sc,
        part,
        pres,
        &|r| {
            if log_y {
                ((r.metric.mean / div).log10(), 0.0)
            } else {
                let ci = if r.metric.ci95.is_finite() {
                    r.metric.ci95 / div
                } else {
                    0.0
                };
                (r.metric.mean / div, ci)
            }
        },
        true,
        metric == Metric::Goodput,
        "",
        &ylab,
    );
    mp.log_y = log_y;
    let mut notes = vec![if mp.bars { "bars" } else { "lines" }];
    // (A symmetric bar in log space would misstate the interval: the tables give it.)
    // An interval needs two runs: with one run per cell there are no error bars to draw.
    let intervals = pres.iter().any(|r| r.metric.n >= 2);
    notes.push(if log_y {
        "log axis, intervals in the tables"
    } else if intervals {
        "error bars: 95 % CI"
    } else {
        "one run per cell: no interval"
    });
    if !mp.limits.is_empty() {
        notes.push("dashes: the physical limit");
    }
    if !part.references.is_empty() {
        notes.push("×: the document's");
    }
    mp.title = format!(
        "{} by {}: ours ({})",
        metric.heading(),
        part.axes
            .first()
            .map_or("configuration".to_string(), |a| a.label()),
        notes.join("; ")
    );
    mp
}

/// The empirical CDF of `v` as a line (x sorted, y = share of samples ≤ x).
pub fn cdf_line(name: &str, v: &[f64]) -> Line {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len().max(1) as f64;
    Line {
        name: name.into(),
        points: s
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, (i + 1) as f64 / n, 0.0))
            .collect(),
        reference: vec![],
    }
}

/// CDF plots of a part, one per sweep point, one line per configuration: the probe's
/// queueing delay beside bulk transfers, and the samples themselves for completion and
/// response times. Returns (file, caption, SVG) for each.
fn distributions(
    sc: &Scenario,
    out: &Path,
    pi: usize,
    metric: Metric,
    runs: &[RunRecord],
    plot_err: &mut Option<String>,
) -> Vec<(String, String, String)> {
    let part = &sc.parts[pi];
    let mut outv = Vec::new();
    if !(metric == Metric::Goodput || metric.is_distribution()) {
        return outv;
    }
    for (k, (_, cells)) in sc.part_points(pi).into_iter().enumerate() {
        let where_ = cells
            .first()
            .map(|c| point_of(sc, c.index))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| part.title.clone());
        let pooled = |cell: usize, f: &dyn Fn(&RunRecord) -> Vec<f64>| -> Vec<f64> {
            runs.iter().filter(|r| r.cell == cell).flat_map(f).collect()
        };
        let (uname, div) = unit(metric, &[]);
        let time_label = format!("{} ({uname})", metric.heading());
        let (what, x_label, lines): (&str, &str, Vec<Line>) = if metric == Metric::Goodput {
            let lines = cells
                .iter()
                .map(|c| {
                    let w = c.spec.warmup_s();
                    let v = pooled(c.index, &|r| {
                        r.beside.as_ref().map_or(vec![], |b| b.queue_after(w))
                    });
                    cdf_line(&c.config, &v)
                })
                .filter(|l| !l.points.is_empty())
                .collect();
            ("queue", "queueing delay met by the probe (ms)", lines)
        } else {
            let lines = cells
                .iter()
                .map(|c| {
                    let v = pooled(c.index, &|r| r.samples.iter().map(|x| x / div).collect());
                    cdf_line(&c.config, &v)
                })
                .filter(|l| !l.points.is_empty())
                .collect();
            ("time", time_label.as_str(), lines)
        };
        if lines.is_empty() {
            continue;
        }
        let p = LinePlot {
            title: format!(
                "{where_}: CDF of the {}",
                x_label.split(" (").next().unwrap_or(x_label)
            ),
            x_label: x_label.into(),
            y_label: "share of samples ≤ x".into(),
            lines,
            ..Default::default()
        };
        let file = format!("cdf-{}-{what}-{k}", part.name);
        if let Some(svg) = plot_file(out, &file, &p, (900, 480), plot_err) {
            outv.push((format!("{file}.svg"), p.title, svg));
        }
    }
    outv
}

/// Time series: per sweep point, every configuration's total goodput over time on one plot
/// (first repetition); and per cell, goodput per flow, the leg's cwnd and RTT.
fn series_section(doc: &mut Doc, sc: &Scenario, out: &Path, runs: &[RunRecord]) {
    let _ = std::fs::create_dir_all(out.join("series"));
    let first = |cell: usize| {
        runs.iter()
            .filter(|r| r.cell == cell)
            .min_by_key(|r| r.repetition)
    };
    let mut overlays = Vec::new();
    for (pi, part) in sc.parts.iter().enumerate() {
        for (k, (_, cells)) in sc.part_points(pi).into_iter().enumerate() {
            let mut p = LinePlot {
                x_label: "time (s)".into(),
                y_label: "goodput, all flows (Mbit/s)".into(),
                ..Default::default()
            };
            for c in cells {
                let Some(r) = first(c.index) else { continue };
                let total = total_goodput(r);
                if total.len() > 1 {
                    p.lines.push(Line {
                        name: c.config.clone(),
                        points: total,
                        reference: vec![],
                    });
                }
                if p.title.is_empty() {
                    let at = point_of(sc, c.index);
                    p.title = if at.is_empty() {
                        part.title.clone()
                    } else {
                        format!("{}: {at}", part.name)
                    };
                }
            }
            if p.lines.len() < 2 {
                continue;
            }
            let name = format!("overlay-{}-{k}", part.name);
            if write_stacked(&out.join("series").join(&name), &[p.clone()], (900, 360)).is_ok() {
                let svg = std::fs::read_to_string(out.join("series").join(format!("{name}.svg")))
                    .unwrap_or_default();
                overlays.push((format!("series/{name}.svg"), p.title, svg));
            }
        }
    }
    if !overlays.is_empty() {
        doc.heading(
            2,
            "Goodput over time, configurations overlaid (first repetition)",
        );
        doc.folded(&overlays);
    }
    let mut cells = Vec::new();
    for c in &sc.cells {
        let Some(r) = first(c.index) else { continue };
        if r.flows.is_empty() && r.sockets.is_empty() {
            continue;
        }
        let name = format!("c{:04}", c.index);
        let panels = cell_panels(c.describe(sc), r, c.spec.pep.mode == PepMode::Tunnel);
        let h = 260 * panels.len() as u32;
        if write_stacked(&out.join("series").join(&name), &panels, (900, h)).is_ok() {
            let svg = std::fs::read_to_string(out.join("series").join(format!("{name}.svg")))
                .unwrap_or_default();
            cells.push((format!("series/{name}.svg"), c.describe(sc), svg));
        }
    }
    if !cells.is_empty() {
        doc.heading(2, "Time series (first repetition of each cell)");
        doc.folded(&cells);
    }
}

/// A run's goodput summed over its flows, per interval: (end of interval s, Mbit/s).
fn total_goodput(r: &RunRecord) -> Vec<(f64, f64, f64)> {
    // Each interval's bytes are spread over the whole seconds it spans, and a second's rate
    // is what arrived in it: iperf3's last interval of a flow can be a few milliseconds long,
    // and dividing its bytes by that showed twice the link's rate.
    let mut bins: std::collections::BTreeMap<i64, f64> = Default::default();
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    for f in &r.flows {
        first = first.min(f.start_s);
        last = last.max(spread_into_seconds(f, &mut bins));
    }
    // Seconds only partly covered (the first and the last) would read low: left out.
    bins.into_iter()
        .filter(|&(k, _)| k as f64 >= first && (k + 1) as f64 <= last + 1e-9)
        .map(|(k, bits)| (k as f64 + 1.0, bits / 1e6, 0.0))
        .collect()
}

/// Adds the bits of `f`'s intervals to `bins` (whole seconds since the first flow's start),
/// each interval's spread over the seconds it spans; returns the end of its last interval.
fn spread_into_seconds(
    f: &super::traffic::FlowRecord,
    bins: &mut std::collections::BTreeMap<i64, f64>,
) -> f64 {
    let mut prev = f.start_s;
    for &(t, b) in &f.series {
        let d = t - prev;
        let mut a = prev;
        while d > 0.0 && a < t {
            let k = a.floor();
            let end = (k + 1.0).min(t);
            *bins.entry(k as i64).or_default() += b as f64 * 8.0 * (end - a) / d;
            a = end;
        }
        prev = t;
    }
    prev
}

/// The most terminals a hub cell's goodput panel draws one line each for.
const HUB_LINES: usize = 8;

/// Per whole second, the least, the median and the most goodput of `flows` (Mbit/s), each
/// flow's bytes spread over the seconds its intervals span.
fn spread_per_second(flows: &[super::traffic::FlowRecord]) -> Vec<Line> {
    let mut bins: std::collections::BTreeMap<i64, Vec<f64>> = Default::default();
    for f in flows {
        let mut per: std::collections::BTreeMap<i64, f64> = Default::default();
        // The last second, only partly covered, would read low.
        let last = spread_into_seconds(f, &mut per).floor() as i64;
        for (k, bits) in per.into_iter().filter(|&(k, _)| k < last) {
            bins.entry(k).or_default().push(bits / 1e6);
        }
    }
    let pick = |name: &str, at: fn(&[f64]) -> f64| Line {
        name: name.into(),
        points: bins
            .iter()
            .filter(|(_, v)| v.len() == flows.len())
            .map(|(&k, v)| {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                ((k + 1) as f64, at(&v), 0.0)
            })
            .collect(),
        reference: vec![],
    };
    vec![
        pick("least", |v| v[0]),
        pick("median", |v| v[v.len() / 2]),
        pick("most", |v| v[v.len() - 1]),
    ]
}

/// A cell's panels: goodput per flow, the satellite-leg sender's cwnd and smoothed RTT.
fn cell_panels(title: String, r: &RunRecord, tunnel: bool) -> Vec<LinePlot> {
    // ss sees TCP only: in tunnel mode the sampled sender is the server's, on its
    // terrestrial leg, not the tunnel's QUIC.
    let who = if tunnel {
        "server's TCP sender (terrestrial leg)"
    } else {
        "satellite-leg sender"
    };
    let per = if r.hub.is_some() { "terminal" } else { "flow" };
    let mut p = LinePlot {
        title: format!("{title}: goodput per {per}"),
        x_label: "time (s)".into(),
        y_label: "Mbit/s".into(),
        ..Default::default()
    };
    // Past eight terminals, lines per terminal are a tangle: the least, the median and the
    // most of them each second instead.
    let spread = r.hub.is_some() && r.flows.len() > HUB_LINES;
    if spread {
        p.title = format!(
            "{title}: goodput per terminal, the least, median and most of {} each second",
            r.flows.len()
        );
        p.lines = spread_per_second(&r.flows);
    }
    for (i, f) in r.flows.iter().enumerate().filter(|_| !spread) {
        let mut prev = f.start_s;
        let pts = f.series.iter().map(|&(t, b)| {
            let d = (t - prev).max(1e-3);
            prev = t;
            (t, b as f64 * 8.0 / d / 1e6, 0.0)
        });
        let cc = if f.cc.is_empty() {
            String::new()
        } else {
            format!(" ({})", f.cc)
        };
        let name = match &r.hub {
            Some(_) => f.cc.clone(),
            None => format!("flow {i}{cc}"),
        };
        p.lines.push(Line {
            name,
            points: pts.collect(),
            reference: vec![],
        });
    }
    let flows: std::collections::BTreeSet<u32> = r.sockets.iter().map(|s| s.flow).collect();
    let per_flow =
        |f: u32, v: &dyn Fn(&super::traffic::SocketSample) -> f64| -> Vec<(f64, f64, f64)> {
            r.sockets
                .iter()
                .filter(|s| s.flow == f)
                .map(|s| (s.t, v(s), 0.0))
                .collect()
        };
    let panel = |title: &str, y: &str, v: &dyn Fn(&super::traffic::SocketSample) -> f64| LinePlot {
        title: title.into(),
        x_label: "time (s)".into(),
        y_label: y.into(),
        lines: flows
            .iter()
            .map(|&f| Line {
                name: format!("flow {f}"),
                points: per_flow(f, v),
                reference: vec![],
            })
            .collect(),
        ..Default::default()
    };
    let w = panel(&format!("{who}: congestion window"), "segments", &|s| {
        s.cwnd as f64
    });
    let rtt = panel(&format!("{who}: smoothed RTT"), "ms", &|s| s.rtt_ms);
    let mut v: Vec<LinePlot> = [p, w, rtt]
        .into_iter()
        .filter(|q| !q.lines.is_empty())
        .collect();
    v.extend(tunnel_panels(&r.tunnel));
    v.extend(split_panels(&r.split));
    v
}

/// A line of one value per sample, at the sample's time `at` (samples without one left out).
fn sampled<T>(name: &str, t: &[T], at: impl Fn(&T) -> f64, v: &dyn Fn(&T) -> Option<f64>) -> Line {
    Line {
        name: name.into(),
        points: t
            .iter()
            .filter_map(|s| v(s).map(|y| (at(s), y, 0.0)))
            .collect(),
        reference: vec![],
    }
}

/// A line of one value per interval between two samples (a counter read as a rate), at the
/// interval's end.
fn per_interval<T>(
    name: &str,
    t: &[T],
    at: impl Fn(&T) -> f64,
    v: &dyn Fn(&T, &T) -> Option<f64>,
) -> Line {
    Line {
        name: name.into(),
        points: t
            .windows(2)
            .filter_map(|w| v(&w[0], &w[1]).map(|y| (at(&w[1]), y, 0.0)))
            .collect(),
        reference: vec![],
    }
}

/// A plot over a run's time, its empty lines left out.
fn time_plot(title: &str, y: &str, lines: Vec<Line>) -> LinePlot {
    LinePlot {
        title: title.into(),
        x_label: "time (s)".into(),
        y_label: y.into(),
        lines: lines.into_iter().filter(|l| !l.points.is_empty()).collect(),
        ..Default::default()
    }
}

/// Split's busiest connection over a run, as its satellite leg's sender saw it (none
/// without samples): the model's rate beside the rate acknowledged, the share of segments
/// retransmitted, and the RTTs with the queue the model reads.
fn split_panels(t: &[SplitSample]) -> Vec<LinePlot> {
    // The connection that carried the most (an iperf3 test's data, not its control).
    let Some(conn) = t.iter().max_by_key(|s| s.leg.bytes_acked).map(|s| s.conn) else {
        return Vec::new();
    };
    let t: Vec<SplitSample> = t.iter().filter(|s| s.conn == conn).cloned().collect();
    let line = |name: &str, v: &dyn Fn(&SplitSample) -> Option<f64>| sampled(name, &t, |s| s.t, v);
    let between = |name: &str, v: &dyn Fn(&SplitSample, &SplitSample) -> Option<f64>| {
        per_interval(name, &t, |s| s.t, v)
    };
    let plot = time_plot;
    vec![
        plot(
            "split's satellite leg: the model's rate",
            "Mbit/s",
            vec![
                line("rate model (payload)", &|s| {
                    Some(s.model.rate_bps as f64 / 1e6)
                }),
                between("acknowledged", &|a, b| {
                    let bytes = b.leg.bytes_acked.checked_sub(a.leg.bytes_acked)?;
                    Some(bytes as f64 * 8.0 / 1e6 / (b.t - a.t))
                }),
            ],
        ),
        plot(
            "split's satellite leg: segments retransmitted",
            "per second",
            vec![between("retransmitted", &|a, b| {
                Some(b.leg.total_retrans.checked_sub(a.leg.total_retrans)? as f64 / (b.t - a.t))
            })],
        ),
        plot(
            "split's satellite leg: RTT",
            "ms",
            vec![
                line("smoothed RTT", &|s| Some(s.leg.rtt_ms)),
                line("base RTT (model)", &|s| s.model.base_rtt_ms),
                line("queue the model reads", &|s| Some(s.model.queue_ms)),
            ],
        ),
    ]
}

/// The tunnel's sending end over a run (none without samples): its window, its rate model
/// beside the rate it sent, the share of its packets lost and its RTTs.
fn tunnel_panels(t: &[TunnelSample]) -> Vec<LinePlot> {
    if t.is_empty() {
        return Vec::new();
    }
    let line = |name: &str, v: &dyn Fn(&TunnelSample) -> Option<f64>| sampled(name, t, |s| s.t, v);
    let plot = time_plot;
    // Counters read as rates over each interval between two samples.
    let between = |name: &str, v: &dyn Fn(&TunnelSample, &TunnelSample) -> Option<f64>| {
        per_interval(name, t, |s| s.t, v)
    };
    let diff = |a: Option<u64>, b: Option<u64>| Some(b?.checked_sub(a?)? as f64);
    vec![
        plot(
            "tunnel's sending end: congestion window",
            "MB",
            vec![line("window", &|s| Some(s.window_bytes as f64 / 1e6))],
        ),
        plot(
            "tunnel's sending end: the satellite controller's rate model",
            "Mbit/s",
            vec![
                line("rate model (payload)", &|s| {
                    s.model_rate_bps.map(|b| b / 1e6)
                }),
                between("sent on the link (UDP, repairs included)", &|a, b| {
                    Some(diff(a.udp_tx_bytes, b.udp_tx_bytes)? * 8.0 / 1e6 / (b.t - a.t))
                }),
            ],
        ),
        plot(
            "tunnel's sending end: packets declared lost",
            "% of packets sent",
            vec![between("lost", &|a, b| {
                let sent = diff(a.sent_packets, b.sent_packets)?;
                let lost = diff(a.lost_packets, b.lost_packets)?;
                (sent > 0.0).then(|| 100.0 * lost / sent)
            })],
        ),
        plot(
            "tunnel's sending end: RTT",
            "ms",
            vec![
                line("smoothed RTT", &|s| Some(s.rtt_ms)),
                line("base RTT (model)", &|s| s.model_base_rtt_ms),
            ],
        ),
    ]
}

/// Runs with errors, listed.
fn problems(doc: &mut Doc, sc: &Scenario, runs: &[RunRecord]) {
    let errors: Vec<String> = runs
        .iter()
        .filter(|r| !r.errors.is_empty())
        .map(|r| {
            format!(
                "{} #{}: {}",
                sc.cells[r.cell].describe(sc),
                r.repetition + 1,
                r.errors.join("; ")
            )
        })
        .collect();
    if !errors.is_empty() {
        doc.heading(2, "Problems");
        doc.list(&errors);
    }
}

fn opt(v: Option<f64>) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x}"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::traffic::RunRecord;

    #[test]
    fn split_panels_follow_the_busiest_connection() {
        let sample = |t: f64, conn: u64, acked: u64, retrans: u32| SplitSample {
            t,
            conn,
            flow: 0,
            leg: satpep_proxy::tcpinfo::LegInfo {
                cwnd: 100,
                rtt_ms: 600.0,
                total_retrans: retrans,
                bytes_acked: acked,
                ..Default::default()
            },
            model: satpep_proxy::tcpinfo::ModelReading {
                phase: "cruise".into(),
                rate_bps: 40_000_000,
                base_rtt_ms: Some(560.0),
                queue_ms: 20.0,
                ..Default::default()
            },
        };
        assert!(split_panels(&[]).is_empty());
        // Connection 1 is iperf3's control (a few bytes), 2 its data.
        let t = [
            sample(0.5, 1, 10, 0),
            sample(0.5, 2, 1_000_000, 0),
            sample(1.0, 1, 10, 0),
            sample(1.0, 2, 3_500_000, 5),
        ];
        let p = split_panels(&t);
        assert_eq!(p.len(), 3);
        let acked = &p[0].lines[1];
        assert_eq!(acked.name, "acknowledged");
        // 2.5 MB in 0.5 s: 40 Mbit/s.
        assert_eq!(acked.points.len(), 1);
        assert!(
            (acked.points[0].1 - 40.0).abs() < 1e-9,
            "{:?}",
            acked.points
        );
        assert_eq!(p[1].lines[0].points, vec![(1.0, 10.0, 0.0)]);
        assert_eq!(p[2].lines.len(), 3);
    }

    #[test]
    fn recovery_is_the_last_sample_over_the_bound_after_each_drop() {
        // A probe every 0.1 s; the rate drops at 6 s and 12 s; warm-up 5 s; bound 50 ms.
        let q: Vec<(f64, f64)> = (0..200)
            .map(|i| {
                let t = i as f64 / 10.0;
                let v = if (6.5..7.8).contains(&t) || (12.5..15.2).contains(&t) || t == 9.0 {
                    300.0
                } else {
                    10.0
                };
                (t, v)
            })
            .collect();
        let r = recovery(&q, &[6.0, 12.0], 5.0, 50.0);
        assert!((r - 3.2).abs() < 1e-6, "{r}");
        // Only the first drop: the queue was back 1.8 s after it; the blip at 9 s is the
        // steady state's.
        let r = recovery(&q[..100], &[6.0], 5.0, 50.0);
        assert!((r - 1.8).abs() < 1e-6, "{r}");
        // Not back before the samples end: the whole span.
        let r = recovery(&q[..140], &[12.0], 5.0, 50.0);
        assert!((r - 1.9).abs() < 1e-6, "{r}");
        // A drop before the warm-up ends is not judged; none left is no figure.
        assert!(recovery(&q, &[3.0], 5.0, 50.0).is_nan());
    }

    fn rec(cell: usize, repetition: u32, v: f64) -> RunRecord {
        RunRecord {
            cell,
            repetition,
            seed: 1,
            samples: vec![v],
            utilization: Some(v / 10e6),
            jain: None,
            flows: vec![],
            sockets: vec![],
            tunnel: vec![],
            split: vec![],
            held: None,
            leg_retransmits: 3,
            failures: 0,
            errors: vec![],
            link: Default::default(),
            beside: None,
            limit_bps: None,
            provenance: None,
            proxy_cpu_s: None,
            machine_cpu_s: None,
            proxies: 0,
            wall_s: 0.0,
            payload_bytes: None,
            udp: None,
            ping: None,
            connections: None,
            fault: None,
            hub: None,
            late_p99_ms: None,
            start: None,
        }
    }

    /// A flow's last interval of 50 ms holding 100 ms worth of a 100 Mbit/s link's bytes
    /// (the receiver read them late) must not show as 200 Mbit/s: each second's rate is what
    /// arrived in it, partly covered seconds left out.
    #[test]
    fn goodput_over_time_is_binned_by_whole_seconds() {
        let mut r = rec(0, 0, 0.0);
        let mut series: Vec<(f64, u64)> = (1..=5).map(|t| (t as f64, 12_500_000)).collect();
        series.push((5.05, 1_250_000));
        r.flows.push(crate::scenario::traffic::FlowRecord {
            start_s: 0.0,
            cc: String::new(),
            bytes: 0,
            goodput_bps: 0.0,
            retransmits: 0,
            series,
        });
        let g = total_goodput(&r);
        assert_eq!(g.len(), 5, "{g:?}");
        for (t, v, _) in &g {
            assert!((v - 100.0).abs() < 1e-9, "{t}: {v}");
        }
        // Two flows, the second from 2 s: their seconds add up.
        let mut two = r.clone();
        let mut f = two.flows[0].clone();
        f.start_s = 2.0;
        f.series = vec![(3.0, 1_250_000), (4.0, 1_250_000)];
        two.flows.push(f);
        let g = total_goodput(&two);
        assert!((g[2].1 - 110.0).abs() < 1e-9, "{g:?}");
    }

    #[test]
    fn the_leg_controller_is_what_ss_saw_except_in_the_tunnel() {
        let sc = Scenario::parse(
            r#"
name = "legs"
duration = "5s"
[link]
both = { rate = "10Mbit", delay = "10ms" }
[[config]]
name = "split"
pep = { mode = "split" }
[[config]]
name = "tunnel"
pep = { mode = "tunnel" }
[[config]]
name = "tunnel hybla"
pep = { mode = "tunnel", cc = "hybla" }
"#,
            false,
        )
        .unwrap();
        let sample = |cc: &str| crate::scenario::traffic::SocketSample {
            t: 0.0,
            flow: 0,
            cwnd: 10,
            rtt_ms: 20.0,
            retrans: 0,
            cc: cc.into(),
        };
        let seen = [sample("bbr"), sample("satpep_sat"), sample("satpep_sat")];
        assert_eq!(leg_cc(&sc.cells[0].spec, &seen), "satpep_sat+bbr");
        assert_eq!(leg_cc(&sc.cells[0].spec, &[]), "");
        // The server's terrestrial TCP is what ss sees in tunnel mode; the hop is QUIC.
        assert_eq!(leg_cc(&sc.cells[1].spec, &seen), "tunnel satellite");
        assert_eq!(leg_cc(&sc.cells[2].spec, &seen), "tunnel hybla");
    }

    #[test]
    fn tables_carry_mean_interval_and_the_documents_figure() {
        let sc = Scenario::parse(
            r#"
name = "r"
title = "report test"
duration = "5s"
repetitions = 3
[link]
both = { rate = "10Mbit", delay = "10ms" }
[[sweep]]
param = "link.both.ber"
label = "BER"
values = [1e-6, 1e-5]
log = true
[[config]]
name = "a"
[[config]]
name = "b"
[[reference]]
config = "b"
at = { "link.both.ber" = 1e-5 }
value = 2.5e6
source = "Doc 1999, Table 1"
"#,
            false,
        )
        .unwrap();
        assert_eq!(sc.cells.len(), 4);
        // Cell order: BER 1e-6 (a, b), BER 1e-5 (a, b).
        let mut runs = Vec::new();
        for (cell, base) in [(0, 8e6), (1, 9e6), (2, 1e6), (3, 3e6)] {
            for (k, d) in [-0.1e6, 0.0, 0.1e6].iter().enumerate() {
                runs.push(rec(cell, k as u32, base + d));
            }
        }
        // One run of cell 2 failed.
        runs[6].samples.clear();
        runs[6].utilization = None;
        runs[6].failures = 1;
        runs[6]
            .errors
            .push("flow 0: connection reset, \"quoted\"".into());
        let dir = std::env::temp_dir().join(format!("satpep-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let md = write_all(&sc, &dir, &runs).unwrap();
        // Mean ± t(2) · sd / √3 with sd = 0.1 Mbit/s: 4.303 × 0.1 / 1.732 = 0.248.
        assert!(
            md.contains("| 1e-6 | 8.00 ± 0.248 | 9.00 ± 0.248 |"),
            "{md}"
        );
        // Two samples left in cell 2: t(1) · 0.0707 / 1.414 = 0.635; the failure is marked.
        assert!(
            md.contains("| 1e-5 | 1.05 ± 0.635 [1 failed] | 3.00 ± 0.248 (doc 2.50) |"),
            "{md}"
        );
        assert!(md.contains("Doc 1999, Table 1"));
        assert!(md.contains("connection reset"));
        // Every table the report shows is kept as CSV, and all of them in tables.json.
        let tables: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tables.json")).unwrap())
                .unwrap();
        let n = tables.as_array().unwrap().len();
        assert!(
            n >= 1 && n == md.matches("\n|---").count(),
            "{n} tables in json\n{md}"
        );
        assert_eq!(std::fs::read_dir(dir.join("tables")).unwrap().count(), n);
        let first = &tables[0];
        let csv0 = std::fs::read_dir(dir.join("tables"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .min()
            .unwrap();
        let text = std::fs::read_to_string(&csv0).unwrap();
        assert_eq!(
            text.lines().next().unwrap().split(',').count(),
            first["header"].as_array().unwrap().len(),
            "{text}"
        );
        let summary = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
        assert_eq!(summary.lines().count(), 5);
        let mut csv = csv::Reader::from_reader(summary.as_bytes());
        let header = csv.headers().unwrap().clone();
        let col = |name: &str| header.iter().position(|h| h == name).unwrap();
        let rows: Vec<csv::StringRecord> = csv.records().map(|r| r.unwrap()).collect();
        assert_eq!(rows[3].len(), header.len(), "{summary}");
        assert_eq!(&rows[3][col("reference_bps")], "2500000", "{summary}");
        assert_eq!(&rows[3][col("reference_s")], "", "{summary}");
        // A value holding the separator and quotes comes back whole.
        let runs_csv = std::fs::read_to_string(dir.join("runs.csv")).unwrap();
        let mut csv = csv::Reader::from_reader(runs_csv.as_bytes());
        let header = csv.headers().unwrap().clone();
        let errors = header.iter().position(|h| h == "errors").unwrap();
        let rows: Vec<csv::StringRecord> = csv.records().map(|r| r.unwrap()).collect();
        assert_eq!(&rows[6][errors], "flow 0: connection reset, \"quoted\"");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
