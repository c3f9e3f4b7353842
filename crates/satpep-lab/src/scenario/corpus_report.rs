//! The report of a drawn part (a link corpus): what each link is, the distributions of each
//! configuration's figures over the links (goodput ÷ physical limit, from the first byte and
//! in steady state; goodput ÷ the best end-to-end controller; the queueing delay's p95), the
//! scenario's every-link targets, and the ten worst links of each satpep configuration.

use super::beside::percentile;
use super::doc::Doc;
use super::plot::{Line, LinePlot};
use super::report::{queue_bound_ms, CellResult, Table};
use super::spec::Scenario;
use super::traffic::RunRecord;

/// The start-up target's initial window, segments (RFC 6928's): the slow-start bound counts
/// the doublings from it to the path's BDP.
const INITIAL_WINDOW: f64 = 10.0;

/// The segment the bound's BDP is counted in, bytes (a 1500-byte MTU with timestamps).
const SEGMENT: f64 = 1448.0;

/// The start-up target's bound (issue 39), s after the first data arrived: the slow-start
/// bound, log2(BDP ÷ initial window) round trips, plus three; plus one round trip for how
/// it is read. The time it is compared with is the start of the first second at 90 % of
/// the limit (on the receiver's 0.1 s intervals), and iperf3's receiver starts its
/// intervals at its test's start, which in an upload is a round trip before the sender's
/// first data (a download's receiver is the client, which starts it as the data leaves).
/// (Read from one-second intervals, this bound had a second more, and still no transfer
/// could meet it on a LEO path: the first interval held the start itself.)
pub fn start_bound_s(limit_bps: f64, rtt_ms: f64) -> f64 {
    let bdp = limit_bps * rtt_ms / 1e3 / 8.0 / SEGMENT;
    let rounds = (bdp / INITIAL_WINDOW).log2().max(0.0) + 3.0 + 1.0;
    rounds * rtt_ms / 1e3
}

/// A transfer that delivers nothing for this long after the warm-up, or for three base RTTs
/// if that is longer (a retransmission timeout on a lossy long path is not a stall), stalled.
const STALL_S: f64 = 2.0;

/// One configuration on one link, as the corpus judges it.
#[derive(Debug, Clone)]
pub struct LinkFigure {
    /// The link's index in the draw.
    pub link: usize,
    /// Configuration.
    pub config: String,
    /// Goodput after the warm-up ÷ the physical limit (mean over repetitions).
    pub steady: f64,
    /// Goodput over the whole run, from the first byte, ÷ the physical limit.
    pub from_start: f64,
    /// The best end-to-end configuration's steady share on this link, and its name.
    pub best_e2e: (f64, String),
    /// The queueing delay's p95 (steady where the rate steps down), ms, and its bound.
    pub q95: Option<(f64, f64)>,
    /// Beside a competing end-to-end flow: the transfer's share of the two, %.
    pub share: Option<f64>,
    /// Beside a competing end-to-end flow: what the competitor delivered beside this
    /// configuration ÷ what it delivered beside its own kind (the end-to-end configuration
    /// whose sender runs the competitor's controller). The share alone cannot tell taking
    /// what a loss-limited competitor leaves unused from starving it: this is the harm
    /// (Ware et al., "Beyond Jain's Fairness Index", HotNets 2019), as a fraction kept.
    pub competitor_keeps: Option<f64>,
    /// Runs that failed, arrived short or stalled (no byte for a second after the warm-up).
    pub troubles: Vec<String>,
    /// A lone transfer (no competing flow): when it first delivered 90 % of the limit in a
    /// second, the latest over the runs (None: a run never did), and the start-up bound
    /// ([`start_bound_s`]), s after the first byte.
    pub start: Option<(Option<f64>, f64)>,
}

impl LinkFigure {
    /// Steady goodput ÷ the best end-to-end configuration's.
    pub fn vs_best(&self) -> f64 {
        self.steady / self.best_e2e.0
    }
}

/// Every cell of drawn part `pi` judged, in cell order.
pub fn figures(
    sc: &Scenario,
    pi: usize,
    res: &[CellResult],
    runs: &[RunRecord],
) -> Vec<LinkFigure> {
    let part = &sc.parts[pi];
    let e2e: Vec<&String> = sc
        .targets
        .as_ref()
        .map(|t| t.end_to_end.iter().collect())
        .unwrap_or_default();
    let link_of = |r: &CellResult| -> Option<usize> {
        let name = r.point.first()?;
        part.drawn.iter().position(|l| &l.name == name)
    };
    // The competing flow's sender is the server (a download), running its controller.
    let sender_cc = |cell: usize| {
        let h = &sc.cells[cell].spec.hosts;
        h.both.overlaid(&h.server).cc
    };
    let competing = |cell: usize| {
        let v: Vec<f64> = runs
            .iter()
            .filter(|x| x.cell == cell)
            .filter_map(|x| x.beside.as_ref()?.competing_bps)
            .collect();
        (!v.is_empty()).then(|| mean(&v))
    };
    let mut out = Vec::new();
    for r in res.iter().filter(|r| r.part == pi && r.utilization.n > 0) {
        let Some(link) = link_of(r) else { continue };
        let best = res
            .iter()
            .filter(|o| o.part == pi && o.point == r.point && e2e.contains(&&o.config))
            .filter(|o| o.utilization.n > 0)
            .map(|o| (o.utilization.mean, o.config.clone()))
            .fold((f64::NAN, String::new()), |a, b| {
                if b.0 > a.0 || a.0.is_nan() {
                    b
                } else {
                    a
                }
            });
        let own_kind = res
            .iter()
            .filter(|o| o.part == pi && o.point == r.point && e2e.contains(&&o.config))
            .find(|o| sender_cc(o.cell).is_some() && sender_cc(o.cell) == sender_cc(r.cell));
        let competitor_keeps = match (competing(r.cell), own_kind.and_then(|o| competing(o.cell))) {
            (Some(c), Some(k)) if k > 0.0 => Some(c / k),
            _ => None,
        };
        let cell_runs: Vec<&RunRecord> = runs.iter().filter(|x| x.cell == r.cell).collect();
        let spec = &sc.cells[r.cell].spec;
        let (dur, warm) = (spec.duration.secs(), spec.warmup_s());
        let from_start: Vec<f64> = cell_runs
            .iter()
            .filter_map(|x| {
                let bytes: u64 = x.flows.iter().map(|f| f.bytes).sum();
                Some(bytes as f64 * 8.0 / dur / x.limit_bps?)
            })
            .collect();
        let rtt_ms = super::report::base_rtt_ms(sc, r.cell);
        let stall_s = STALL_S.max(3.0 * rtt_ms / 1e3);
        let mut troubles = Vec::new();
        for x in &cell_runs {
            troubles.extend(x.errors.iter().cloned());
            if let Some(gap) = longest_gap(x, warm) {
                if gap >= stall_s {
                    troubles.push(format!(
                        "repetition {}: no byte for {gap:.1} s after the warm-up",
                        x.repetition
                    ));
                }
            }
        }
        let starts: Vec<Option<f64>> = cell_runs
            .iter()
            .filter_map(|x| x.start.as_ref().map(|s| s.reached_90_s))
            .collect();
        let limits: Vec<f64> = cell_runs.iter().filter_map(|x| x.limit_bps).collect();
        let start = (!starts.is_empty() && !limits.is_empty()).then(|| {
            let latest = starts.iter().try_fold(0.0f64, |a, s| s.map(|s| a.max(s)));
            (latest, start_bound_s(mean(&limits), rtt_ms))
        });
        let q = if r.queue_p95_steady.n > 0 {
            &r.queue_p95_steady
        } else {
            &r.queue_p95
        };
        out.push(LinkFigure {
            link,
            config: r.config.clone(),
            steady: r.utilization.mean,
            from_start: mean(&from_start),
            best_e2e: best,
            q95: (q.n > 0).then(|| (q.mean, queue_bound_ms(sc, r.cell).unwrap_or(f64::NAN))),
            share: (r.share.n > 0).then_some(r.share.mean),
            competitor_keeps,
            troubles,
            start,
        });
    }
    out
}

/// The empirical CDF of `v` as a staircase: at each value the share of links ≤ it jumps.
fn step_cdf(name: &str, v: &[f64]) -> Line {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len().max(1) as f64;
    let mut points = Vec::new();
    for (i, &x) in s.iter().enumerate() {
        points.push((x, i as f64 / n, 0.0));
        points.push((x, (i + 1) as f64 / n, 0.0));
    }
    Line {
        name: name.into(),
        points,
        reference: vec![],
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The longest run of whole seconds after `from_s` in which the first flow received nothing
/// (None without a series). iperf3 reports each second; a second with no byte is a stall.
fn longest_gap(r: &RunRecord, from_s: f64) -> Option<f64> {
    let f = r.flows.first()?;
    let mut longest: f64 = 0.0;
    let mut run: f64 = 0.0;
    let mut prev_t = 0.0;
    for &(t, bytes) in &f.series {
        let len = t - prev_t;
        prev_t = t;
        if t <= from_s {
            continue;
        }
        if bytes == 0 {
            run += len;
            longest = longest.max(run);
        } else {
            run = 0.0;
        }
    }
    Some(longest)
}

/// What the corpus says of one configuration over all links.
struct Over {
    links: usize,
    steady: Vec<f64>,
    from_start: Vec<f64>,
    vs_best: Vec<f64>,
    /// Links (not beside a competing flow) with a queue figure, and those within the bound.
    queued: usize,
    within: usize,
    /// Links beside a competing flow, and those whose share is in the target's range.
    shared: usize,
    fair: usize,
    /// Beside a competing flow: what the competitor kept of its figure beside its own kind.
    keeps: Vec<f64>,
    troubles: usize,
    /// Lone transfers judged for their start, and those at 90 % of the limit in time.
    started: usize,
    prompt: usize,
}

fn over(figs: &[&LinkFigure], share_pct: (f64, f64)) -> Over {
    let mut o = Over {
        links: figs.len(),
        steady: figs.iter().map(|f| f.steady).collect(),
        from_start: figs.iter().map(|f| f.from_start).collect(),
        vs_best: figs
            .iter()
            .map(|f| f.vs_best())
            .filter(|v| v.is_finite())
            .collect(),
        queued: 0,
        within: 0,
        shared: 0,
        fair: 0,
        keeps: figs.iter().filter_map(|f| f.competitor_keeps).collect(),
        troubles: figs.iter().filter(|f| !f.troubles.is_empty()).count(),
        started: figs.iter().filter(|f| f.start.is_some()).count(),
        prompt: figs
            .iter()
            .filter(|f| matches!(f.start, Some((Some(t), b)) if t <= b))
            .count(),
    };
    for f in figs {
        match (f.share, f.q95) {
            (Some(s), _) => {
                o.shared += 1;
                o.fair += usize::from((share_pct.0..=share_pct.1).contains(&s));
            }
            (None, Some((q, bound))) => {
                o.queued += 1;
                o.within += usize::from(q <= bound);
            }
            _ => {}
        }
    }
    o
}

/// A share beside a competitor, with what the competitor kept of its own kind's figure.
fn share_cell(share: f64, keeps: Option<f64>) -> String {
    match keeps {
        Some(k) => format!("share {share:.1} %, competitor keeps {:.0} %", k * 100.0),
        None => format!("share {share:.1} %"),
    }
}

/// When a lone transfer reached 90 % of the limit, against its bound.
fn start_cell(start: Option<(Option<f64>, f64)>) -> String {
    match start {
        Some((Some(t), b)) => format!("{t:.1} / {b:.1}"),
        Some((None, b)) => format!("never / {b:.1}"),
        None => "–".into(),
    }
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}", x * 100.0)
    } else {
        "–".into()
    }
}

/// The corpus section of drawn part `pi`: links, summary, targets, CDFs, the worst ten.
pub fn section(
    doc: &mut Doc,
    sc: &Scenario,
    pi: usize,
    res: &[CellResult],
    runs: &[RunRecord],
    plot: &mut dyn FnMut(&str, &LinePlot) -> Option<String>,
) {
    let part = &sc.parts[pi];
    let figs = figures(sc, pi, res, runs);
    let share_pct = sc.targets.as_ref().map_or((40.0, 60.0), |t| t.share_pct);
    doc.table(
        3,
        &format!("the {} links drawn", part.drawn.len()),
        &Table {
            header: vec!["link".into(), "what it is".into()],
            label_cols: 2,
            rows: part
                .drawn
                .iter()
                .map(|l| vec![l.name.clone(), l.about()])
                .collect(),
        },
    );
    let mut rows = Vec::new();
    for c in &part.configs {
        let mine: Vec<&LinkFigure> = figs.iter().filter(|f| &f.config == c).collect();
        if mine.is_empty() {
            continue;
        }
        let o = over(&mine, share_pct);
        let q = |v: &[f64], p: f64| pct(percentile(v, p));
        rows.push(vec![
            c.clone(),
            o.links.to_string(),
            q(&o.steady, 50.0),
            q(&o.steady, 10.0),
            q(&o.steady, 0.0),
            q(&o.from_start, 50.0),
            q(&o.from_start, 10.0),
            format!(
                "{:.0} %",
                100.0 * o.vs_best.iter().filter(|&&v| v >= 1.0).count() as f64
                    / o.vs_best.len().max(1) as f64
            ),
            q(&o.vs_best, 0.0),
            format!("{} of {}", o.within, o.queued),
            format!("{} of {}", o.fair, o.shared),
            q(&o.keeps, 0.0),
            format!("{} of {}", o.prompt, o.started),
            o.troubles.to_string(),
        ]);
    }
    doc.table(
        3,
        "each configuration over the links: goodput % of the physical limit (steady: after the warm-up, or after the link's start-up bound where that is later; from the first byte: the whole run), against the best end-to-end configuration on the same link, queueing delay p95 within the bound, share beside a competing flow and what the competitor keeps of what it delivers beside its own kind (end-to-end, its controller on both flows), lone transfers at 90 % of the limit within the start-up bound (log2(BDP ÷ 10 segments) + 3 round trips; + 1 round trip: iperf3's start), read as the start of the first second at 90 % of the limit on the receiver's 0.1 s intervals",
        &Table {
            header: [
                "configuration",
                "links",
                "steady p50 %",
                "steady p10 %",
                "steady min %",
                "first byte p50 %",
                "first byte p10 %",
                "links ≥ best e2e",
                "worst ÷ best e2e %",
                "q95 ≤ bound",
                "share in range",
                "competitor keeps, least %",
                "start ≤ bound",
                "links with trouble",
            ]
            .map(String::from)
            .to_vec(),
            label_cols: 1,
            rows,
        },
    );
    if let Some(t) = &sc.targets {
        let mut rows = Vec::new();
        let mark = |ok: bool| if ok { "✓" } else { "✗" };
        for c in &t.satpep {
            let mine: Vec<&LinkFigure> = figs.iter().filter(|f| &f.config == c).collect();
            if mine.is_empty() {
                continue;
            }
            let o = over(&mine, share_pct);
            let beat = o.vs_best.iter().filter(|&&v| v >= 1.0).count() as f64
                / o.vs_best.len().max(1) as f64;
            let worst = percentile(&o.vs_best, 0.0);
            let med = percentile(&o.steady, 50.0);
            let p10 = percentile(&o.steady, 10.0);
            let qshare = o.within as f64 / o.queued.max(1) as f64;
            rows.push(vec![
                c.clone(),
                format!("{} {:.0} % ≥ 95 %", mark(beat >= 0.95), beat * 100.0),
                format!("{} {} % ≥ 90 %", mark(worst >= 0.9), pct(worst)),
                format!("{} {} % ≥ 95 %", mark(med >= 0.95), pct(med)),
                format!("{} {} % ≥ 85 %", mark(p10 >= 0.85), pct(p10)),
                format!("{} {:.0} % ≥ 90 %", mark(qshare >= 0.9), qshare * 100.0),
                format!("{} {} of {}", mark(o.fair == o.shared), o.fair, o.shared),
                format!(
                    "{} {} of {}",
                    mark(o.prompt == o.started),
                    o.prompt,
                    o.started
                ),
                format!("{} {}", mark(o.troubles == 0), o.troubles),
            ]);
        }
        doc.table(
            3,
            "targets over the links",
            &Table {
                header: [
                    "configuration",
                    "links with goodput ≥ best e2e",
                    "worst link ÷ best e2e",
                    "median link % of limit",
                    "10th percentile % of limit",
                    "links with steady q95 ≤ max(50 ms, 10 % RTT)",
                    "beside a competitor: share in range",
                    "alone: 90 % of the limit within the start-up bound",
                    "links stalled, reset or short",
                ]
                .map(String::from)
                .to_vec(),
                label_cols: 1,
                rows,
            },
        );
        for c in &t.satpep {
            let mut mine: Vec<&LinkFigure> = figs
                .iter()
                .filter(|f| &f.config == c && f.vs_best().is_finite())
                .collect();
            mine.sort_by(|a, b| a.vs_best().total_cmp(&b.vs_best()));
            let rows: Vec<Vec<String>> = mine
                .iter()
                .take(10)
                .map(|f| {
                    vec![
                        part.drawn[f.link].name.clone(),
                        part.drawn[f.link].about(),
                        pct(f.vs_best()),
                        pct(f.steady),
                        format!("{} ({})", pct(f.best_e2e.0), f.best_e2e.1),
                        pct(f.from_start),
                        match (f.share, f.q95) {
                            (Some(s), _) => share_cell(s, f.competitor_keeps),
                            (None, Some((q, b))) => format!("{q:.0} / {b:.0}"),
                            _ => "–".into(),
                        },
                        start_cell(f.start),
                        f.troubles.join("; "),
                    ]
                })
                .collect();
            doc.table(
                3,
                &format!("{c}: the ten worst links (by goodput ÷ the best end-to-end)"),
                &Table {
                    header: [
                        "link",
                        "what it is",
                        "÷ best e2e %",
                        "steady % of limit",
                        "best e2e %",
                        "first byte % of limit",
                        "q95 / bound ms",
                        "90 % at / bound s",
                        "trouble",
                    ]
                    .map(String::from)
                    .to_vec(),
                    label_cols: 2,
                    rows,
                },
            );
        }
    }
    // CDFs over the links, one line per configuration.
    let cdf = |title: &str, x_label: &str, log_x: bool, v: &dyn Fn(&LinkFigure) -> Option<f64>| {
        let lines: Vec<Line> = part
            .configs
            .iter()
            .map(|c| {
                let xs: Vec<f64> = figs
                    .iter()
                    .filter(|f| &f.config == c)
                    .filter_map(v)
                    .collect();
                step_cdf(c, &xs)
            })
            .filter(|l| !l.points.is_empty())
            .collect();
        LinePlot {
            title: title.into(),
            x_label: x_label.into(),
            y_label: "share of links ≤ x".into(),
            lines,
            log_x,
            ..Default::default()
        }
    };
    let plots = [
        (
            "steady",
            cdf(
                "goodput after the warm-up ÷ physical limit, over the links",
                "goodput ÷ physical limit (%)",
                false,
                &|f| Some(f.steady * 100.0),
            ),
        ),
        (
            "first-byte",
            cdf(
                "goodput from the first byte ÷ physical limit, over the links",
                "goodput from the first byte ÷ physical limit (%)",
                false,
                &|f| Some(f.from_start * 100.0),
            ),
        ),
        (
            "vs-best",
            cdf(
                "goodput ÷ the best end-to-end configuration on the same link",
                "goodput ÷ best end-to-end (%)",
                false,
                &|f| Some(f.vs_best() * 100.0),
            ),
        ),
        (
            "queue",
            cdf(
                "queueing delay p95 (steady where the rate steps down), over the links",
                "queueing delay p95 (ms)",
                true,
                &|f| f.q95.map(|q| q.0.max(0.1)),
            ),
        ),
    ];
    let mut items = Vec::new();
    for (what, p) in plots {
        let file = format!("corpus-{}-{what}", part.name);
        if let Some(svg) = plot(&file, &p) {
            items.push((format!("{file}.svg"), p.title.clone(), svg));
        }
    }
    for (file, caption, svg) in &items {
        doc.figure(file, caption, svg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::traffic::FlowRecord;

    fn run_with(series: Vec<(f64, u64)>) -> RunRecord {
        let mut r: RunRecord = serde_json::from_value(serde_json::json!({
            "cell": 0, "repetition": 0, "seed": 1, "samples": [], "utilization": null,
            "jain": null, "flows": [], "sockets": [], "leg_retransmits": 0, "failures": 0,
            "errors": [], "link": {"fwd_frames": 0, "fwd_errors": 0, "fwd_queue_drops": 0,
            "fwd_bytes": 0, "ret_frames": 0, "ret_errors": 0, "ret_queue_drops": 0,
            "ret_bytes": 0}
        }))
        .unwrap();
        r.flows.push(FlowRecord {
            start_s: 0.0,
            cc: String::new(),
            bytes: series.iter().map(|s| s.1).sum(),
            goodput_bps: 0.0,
            retransmits: 0,
            series,
        });
        r
    }

    #[test]
    fn the_competitor_keeps_is_read_against_its_own_kind() {
        let sc = Scenario::parse(
            r#"
name = "k"
duration = "10s"
warmup = "2s"
targets = { satpep = ["split"], end_to_end = ["end-to-end cubic", "end-to-end bbr"] }
[[part]]
name = "links"
draw = { links = 4 }
[[part.config]]
name = "end-to-end cubic"
hosts.both.cc = "cubic"
[[part.config]]
name = "end-to-end bbr"
hosts.both.cc = "bbr"
[[part.config]]
name = "split"
pep = { mode = "split" }
hosts.both.cc = "cubic"
"#,
            false,
        )
        .unwrap();
        // The competitor (each configuration's own end hosts' controller) delivered this.
        let competing = |c: &str| match c {
            "end-to-end cubic" => 4e6,
            "end-to-end bbr" => 9e6,
            _ => 1e6,
        };
        let runs: Vec<RunRecord> = sc
            .cells
            .iter()
            .map(|c| {
                let mut r = run_with(vec![(1.0, 1000)]);
                r.cell = c.index;
                r.utilization = Some(0.5);
                r.samples = vec![5e6];
                r.beside = Some(
                    serde_json::from_value(serde_json::json!({
                        "competing_bps": competing(&c.config)
                    }))
                    .unwrap(),
                );
                r
            })
            .collect();
        let res = crate::scenario::report::summarize(&sc, &runs);
        let figs = figures(&sc, 0, &res, &runs);
        let keeps = |c: &str| {
            figs.iter()
                .find(|f| f.config == c)
                .unwrap()
                .competitor_keeps
        };
        // Beside split the cubic competitor kept a quarter of what it had beside cubic.
        assert_eq!(keeps("split"), Some(0.25));
        assert_eq!(keeps("end-to-end cubic"), Some(1.0));
        // BBR's competitor is BBR: its own kind is that configuration itself.
        assert_eq!(keeps("end-to-end bbr"), Some(1.0));
        assert_eq!(
            share_cell(80.0, keeps("split")),
            "share 80.0 %, competitor keeps 25 %"
        );
    }

    /// Issue 5's link: 100 Mbit/s at 600 ms is about 4 900 segments, nine doublings from
    /// ten, so 12 round trips (7.2 s) and the test's start; a LEO link's bound is a few
    /// round trips; a path below ten segments has three round trips and the test's start.
    #[test]
    fn the_start_up_bound_counts_doublings_from_ten_segments() {
        let b = start_bound_s(94.9e6, 600.0);
        assert!((b - (8.94 + 3.0 + 1.0) * 0.6).abs() < 0.01, "{b}");
        // 259 segments: 4.7 doublings.
        assert!((start_bound_s(100e6, 30.0) - 0.261).abs() < 0.001);
        assert!((start_bound_s(100e3, 100.0) - 0.4).abs() < 1e-9);
        assert_eq!(start_cell(Some((None, 8.2))), "never / 8.2");
        assert_eq!(start_cell(Some((Some(6.0), 8.24))), "6.0 / 8.2");
    }

    #[test]
    fn a_second_without_bytes_after_the_warm_up_is_a_stall() {
        let r = run_with(vec![
            (1.0, 0),
            (2.0, 0),
            (3.0, 10),
            (4.0, 0),
            (5.0, 0),
            (6.0, 5),
        ]);
        // The slow start's empty seconds are before the warm-up.
        assert_eq!(longest_gap(&r, 3.0), Some(2.0));
        assert_eq!(longest_gap(&r, 5.0), Some(0.0));
        let r = run_with(vec![(1.0, 5), (2.0, 5), (3.0, 5)]);
        assert_eq!(longest_gap(&r, 0.0), Some(0.0));
    }
}
