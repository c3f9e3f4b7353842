//! Runs a scenario's cells on one lab, one repetition at a time, each result saved as soon as
//! it exists, so an interrupted sweep resumes where it stopped.

use super::capture::Capture;
use super::hosts::HostTuner;
use super::report;
use super::spec::{CellSpec, Scenario};
use super::traffic::{run_once, RunRecord};
use crate::progress::Progress;
use crate::topology::{Host, Lab, Pep, UpOptions};
use satpep_link::config::{DirectionConfig, LinkSpec};
use satpep_link::units::fmt_rate;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How to run a scenario.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Results directory.
    pub out: PathBuf,
    /// Throw away earlier results in `out` instead of resuming.
    pub fresh: bool,
    /// No progress output.
    pub quiet: bool,
    /// The scenario's source text, kept in the results directory.
    pub source: String,
}

/// The hosts' MSS unless a scenario sets one: a 1500-byte MTU less 40 bytes of IP and TCP
/// headers.
pub const HOST_MSS: u32 = 1460;

/// Highest goodput TCP can have in the traffic's direction of `spec`: rate × payload/frame ×
/// (1 − loss), with the hosts' MSS and timestamps (1448-byte payloads in 1514-byte frames by
/// default); None on a bridged link, where only the CPU limits.
pub fn tcp_limit_bps(spec: &CellSpec) -> Result<Option<f64>, String> {
    if spec.bridge {
        return Ok(None);
    }
    let cfg = spec.link_spec()?.resolve()?;
    let dir = if spec.traffic.kind().downloads() {
        &cfg.forward
    } else {
        &cfg.ret
    };
    let (c, s) = (spec.host(Host::Client), spec.host(Host::Server));
    let mss = c.mss.unwrap_or(HOST_MSS).min(s.mss.unwrap_or(HOST_MSS));
    let ts = c.timestamps.unwrap_or(true) && s.timestamps.unwrap_or(true);
    let satellite = if spec.ipsec {
        // Inside ESP: the TUN device's MTU sets the segment, ESP's own bytes ride on each.
        let mss = mss.min(crate::esp::INNER_MTU - 40);
        let extra = crate::esp::overhead(mss + 40);
        tcp_limit_with(dir, mss, ts, extra)
    } else {
        tcp_limit_in(dir, mss, ts)
    };
    // A slower access link is the bottleneck (what its flood pings take is congestion, not
    // a smaller limit). It loses nothing and adds no framing of the emulator's; in half
    // duplex the ACKs coming back (one per two segments) take their time from it too.
    let ack_share = match spec.access.duplex {
        super::access::Duplex::Full => 0,
        super::access::Duplex::Half => (54 + if ts { 12 } else { 0 }) / 2,
    };
    let access = spec
        .access
        .rate_bps()?
        .map_or(f64::INFINITY, |bps| bps * payload_share(mss, ts, ack_share));
    Ok(Some(satellite.min(access)))
}

/// The share of a frame that is TCP payload, for segments of `mss` bytes (`timestamps`
/// take 12 of them) in Ethernet frames with `extra` bytes more.
fn payload_share(mss: u32, timestamps: bool, extra: u32) -> f64 {
    let payload = mss as f64 - if timestamps { 12.0 } else { 0.0 };
    payload / (mss + 54 + extra) as f64
}

/// Highest TCP goodput one direction of a link carries with segments of `mss` bytes
/// (`timestamps` take 12 of them): rate × payload/frame × (1 − the frame's mean loss).
pub fn tcp_limit_in(dir: &DirectionConfig, mss: u32, timestamps: bool) -> f64 {
    tcp_limit_with(dir, mss, timestamps, 0)
}

/// [`tcp_limit_in`] with `extra` bytes more on every frame (a tunnel's headers).
pub fn tcp_limit_with(dir: &DirectionConfig, mss: u32, timestamps: bool, extra: u32) -> f64 {
    let extra = extra + dir.overhead;
    let loss = dir.loss.mean_loss(mss + 54 + extra);
    dir.rate.max_bps() * payload_share(mss, timestamps, extra) * (1.0 - loss)
}

/// What carries the lab's link now.
#[derive(Debug, Clone, PartialEq)]
enum LinkNow {
    /// The emulator, with this link.
    Emulator(Box<LinkSpec>),
    /// A kernel bridge (no emulation), with the routers' offloads on or off.
    Bridge { offloads: bool },
}

fn pep_of(spec: &CellSpec) -> Option<Pep> {
    // Checked with the scenario, before any lab was built.
    spec.pep().ok().flatten()
}

/// Removes the runs of an earlier scenario in `out`, with their captures and logs.
fn discard_runs(out: &Path) {
    for d in ["runs", "pcap", "logs"] {
        let _ = std::fs::remove_dir_all(out.join(d));
    }
}

/// Where a run's capture goes.
pub fn pcap_path(out: &Path, cell: usize, rep: u32) -> PathBuf {
    out.join("pcap").join(format!("c{cell:04}-r{rep:03}.pcap"))
}

fn run_path(out: &Path, cell: usize, rep: u32) -> PathBuf {
    out.join("runs").join(format!("c{cell:04}-r{rep:03}.json"))
}

/// Reads the saved runs of `sc` in `out` (missing ones are skipped).
pub fn load_runs(sc: &Scenario, out: &Path) -> Vec<RunRecord> {
    let mut v = Vec::new();
    for c in &sc.cells {
        for r in 0..c.spec.repetitions {
            if let Ok(t) = std::fs::read_to_string(run_path(out, c.index, r)) {
                if let Ok(rec) = serde_json::from_str::<RunRecord>(&t) {
                    v.push(rec);
                }
            }
        }
    }
    v
}

fn write_atomic(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Prepares `out`: a new directory gets the plan; an existing one must hold the same plan
/// (then its runs are kept) unless `fresh`.
fn prepare(sc: &Scenario, opts: &RunOptions) -> Result<(), String> {
    let out = &opts.out;
    let plan = serde_json::to_value(&sc.cells).unwrap();
    let plan_path = out.join("plan.json");
    if let Ok(old) = std::fs::read_to_string(&plan_path) {
        // Only what runs counts: the cells (titles, notes and references may change).
        // Older directories hold [parts, cells].
        let old: serde_json::Value = serde_json::from_str(&old).unwrap_or_default();
        let old_cells = match &old {
            serde_json::Value::Array(a) if a.len() == 2 && a[1].is_array() => &a[1],
            v => v,
        };
        let same = *old_cells == plan;
        if !same && !opts.fresh {
            return Err(format!(
                "{} holds results of a different scenario or settings; give --fresh to replace \
                 them, or another --out",
                out.display()
            ));
        }
        if opts.fresh || !same {
            discard_runs(out);
        }
    } else if opts.fresh {
        discard_runs(out);
    }
    std::fs::create_dir_all(out.join("runs"))
        .map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    write_atomic(&plan_path, &serde_json::to_string_pretty(&plan).unwrap())?;
    write_atomic(&out.join("scenario.toml"), &opts.source)
}

/// Runs what is missing of `sc` into `opts.out`, then writes the reports. Returns the report's
/// Markdown table text.
pub fn run(sc: &Scenario, opts: &RunOptions) -> Result<String, String> {
    prepare(sc, opts)?;
    let todo: Vec<(usize, u32)> = sc
        .cells
        .iter()
        .flat_map(|c| (0..c.spec.repetitions).map(move |r| (c.index, r)))
        .filter(|&(c, r)| !run_path(&opts.out, c, r).exists())
        .collect();
    let total: usize = sc.cells.iter().map(|c| c.spec.repetitions as usize).sum();
    if !opts.quiet && todo.is_empty() {
        eprintln!(
            "all {total} runs are already in {}: reporting them (--fresh runs them again)",
            opts.out.display()
        );
    } else if !opts.quiet && todo.len() < total {
        eprintln!(
            "resuming: {} of {total} runs already in {}",
            total - todo.len(),
            opts.out.display()
        );
    }
    if !todo.is_empty() {
        let step_s = sc.cells[todo[0].0].spec.duration.secs() + 4.0;
        let progress = Progress::new(todo.len(), step_s, opts.quiet);
        let first = &sc.cells[todo[0].0].spec;
        let name = format!("sc-{}", std::process::id());
        let up = |spec: &CellSpec| {
            let opts = UpOptions {
                terminals: spec.star.terminals,
                ..Default::default()
            };
            Lab::up(&name, &spec.link_spec()?, &opts)
        };
        let mut lab = up(first)?;
        let mut tuner = HostTuner::default();
        let mut link_now: Option<LinkNow> = None;
        let mut pep_now: Option<Pep> = None;
        let mut pep_link: Option<LinkSpec> = None;
        // The client's access link as set on the lab (a new lab's is plain).
        let mut access_now = super::access::Access::default();
        for (i, &(ci, rep)) in todo.iter().enumerate() {
            if crate::interrupted() {
                return Err(interrupted(i, todo.len()));
            }
            let cell = &sc.cells[ci];
            let spec = &cell.spec;
            // A star of another size is another lab: the old one goes first (same names).
            if lab.state().terminals != spec.star.terminals {
                drop(lab);
                lab = up(spec)?;
                tuner = HostTuner::default();
                link_now = None;
                pep_now = None;
                pep_link = None;
                access_now = super::access::Access::default();
            }
            let mut link = spec.link_spec()?;
            link.seed = Some(spec.seed + rep as u64);
            let want = match spec.bridge {
                true => LinkNow::Bridge {
                    offloads: spec.offloads,
                },
                false => LinkNow::Emulator(Box::new(link.clone())),
            };
            // One-off outages and rate or delay traces count from the emulator's start: each
            // run gets a fresh one, so that every run (every configuration compared on the
            // link) meets them at the same point.
            let timed = link.resolve().is_ok_and(|c| c.varies());
            let outages = !spec.bridge && (!link.outage.down.is_empty() || timed);
            if link_now.as_ref() != Some(&want) || outages {
                match &want {
                    LinkNow::Bridge { offloads } => {
                        lab.bridge_link()?;
                        lab.set_link_offloads(*offloads)?;
                    }
                    LinkNow::Emulator(l) => {
                        // The emulator needs whole, checksummed frames.
                        if let Some(LinkNow::Bridge { offloads: true }) = link_now {
                            lab.set_link_offloads(false)?;
                        }
                        lab.start_emulator(l)?;
                    }
                }
                link_now = Some(want);
            }
            let pep = pep_of(spec);
            // A new link restarts the proxies too: told the link, they size themselves from
            // it; told nothing, they start from scratch, as on a real new link.
            let mut link_noseed = link.clone();
            link_noseed.seed = None;
            // A tunnel is one long-lived connection whose controller would carry what it
            // learnt (its model, its phase: competing with the last run's competitor for
            // 20 s more) into the next run; repetitions must be independent, so each run
            // gets a new one. (Split mode's connections are each the run's own.)
            let tunnel = pep.as_ref().is_some_and(|p| p.tunnel.is_some());
            if pep != pep_now
                || (pep.is_some() && pep_link.as_ref() != Some(&link_noseed))
                || tunnel
            {
                lab.stop_proxies();
                if let Some(p) = &pep {
                    lab.start_proxies(&link, p)?;
                    if tunnel {
                        super::tunnel_state::wait_connected(
                            &lab,
                            Host::Terminal,
                            Duration::from_secs(60),
                        )?;
                        if spec.star.terminals > 1 {
                            super::tunnel_state::wait_peers(
                                &lab,
                                spec.star.terminals,
                                Duration::from_secs(120),
                            )?;
                        }
                    }
                }
                pep_now = pep;
                pep_link = Some(link_noseed);
            }
            for h in [Host::Client, Host::Server, Host::Terminal, Host::Gateway] {
                tuner.apply(&lab, h, &spec.host(h))?;
            }
            // satpep_sat remembers each destination's path for new connections (a warm
            // start); the lab's runs reuse one set of addresses on different links, and
            // repetitions must be independent: every run starts with no path known.
            if let Err(e) = satpep_cc::forget_paths() {
                eprintln!("warning: cannot clear satpep_sat's path memory: {e}");
            }
            let what = format!("{} #{}", cell.describe(sc), rep + 1);
            let limit = tcp_limit_bps(spec)?;
            let capture = match spec.pcap {
                true => Some(Capture::start(&lab, &pcap_path(&opts.out, ci, rep))),
                false => None,
            };
            if !spec.access.same_link(&access_now) {
                spec.access
                    .apply(&lab)
                    .map_err(|e| format!("{what}: {e}"))?;
                access_now = spec.access.clone();
            }
            let mut pings = spec
                .access
                .start_pings(&lab)
                .map_err(|e| format!("{what}: {e}"))?;
            let esp = match spec.ipsec {
                true => {
                    Some(crate::esp::EspTunnel::start(&lab).map_err(|e| format!("{what}: {e}"))?)
                }
                false => None,
            };
            let result = run_once(&mut lab, spec, ci, rep, limit, &mut |t| {
                progress.tick(i, &what, t)
            });
            if let Some(e) = esp {
                e.stop(&lab);
            }
            let pings_ended = pings.ended();
            drop(pings);
            let capture = capture.map(|c| c.map(Capture::stop));
            let mut rec = match result {
                Ok(r) => r,
                Err(e) if e == "interrupted" => return Err(interrupted(i, todo.len())),
                Err(e) => return Err(format!("{what}: {e}")),
            };
            if let Some(Err(e)) = capture {
                rec.errors.push(format!("pcap: {e}"));
            }
            if pings_ended > 0 {
                rec.errors.push(format!(
                    "access.pings: {pings_ended} of {} flood pings ended before the run did",
                    spec.access.pings
                ));
            }
            let mut summary = match (rec.samples.first(), spec.metric()) {
                (None, _) => format!("FAILED: {}", rec.errors.join("; ")),
                (Some(&g), super::spec::Metric::Goodput) => match rec.utilization {
                    Some(u) => format!("{} ({:.1} % of limit)", fmt_rate(g), u * 100.0),
                    None => fmt_rate(g),
                },
                (Some(&r), super::spec::Metric::ConnectRate) => {
                    format!("{r:.0} connections/s")
                }
                (Some(_), super::spec::Metric::Rtt) => {
                    let s = super::stats::Summary::of(&rec.samples);
                    format!("{:.3} ms", s.mean * 1e3)
                }
                (Some(_), _) => {
                    let s = super::stats::Summary::of(&rec.samples);
                    format!("{:.3} s", s.mean)
                }
            };
            // What the satellite leg actually ran (a controller that cannot load is
            // replaced, with only a warning in the proxy's log).
            let cc = super::report::leg_cc(&cell.spec, &rec.sockets);
            if !cc.is_empty() {
                summary.push_str(&format!(", leg on {cc}"));
            }
            if !rec.errors.is_empty() {
                keep_logs(&lab, &opts.out, ci, rep);
            }
            write_atomic(
                &run_path(&opts.out, ci, rep),
                &serde_json::to_string(&rec).unwrap(),
            )?;
            progress.done(i, &what, &summary);
        }
        drop(lab);
    }
    report::write_all(sc, &opts.out, &load_runs(sc, &opts.out))
}

/// Keeps the last lines of the emulator's and proxies' logs of a run that had problems, in
/// `logs/` of the results (the lab and its logs are gone when the run ends).
fn keep_logs(lab: &Lab, out: &Path, cell: usize, rep: u32) {
    let dir = out.join("logs");
    let _ = std::fs::create_dir_all(&dir);
    let Ok(entries) = std::fs::read_dir(crate::topology::state_dir(&lab.name)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".log") {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(300)..].join("\n");
            let _ = std::fs::write(dir.join(format!("c{cell:04}-r{rep:03}-{name}")), tail);
        }
    }
}

fn interrupted(done: usize, total: usize) -> String {
    format!(
        "interrupted after {done} of {total} runs; run the same command again to resume \
         (finished runs are kept)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stopped run resumes only if the plan it wrote reads back equal: a corpus's drawn
    /// links hold floats (BER 3.1e-6, …) that serde_json's default parser read back a bit
    /// off, so no corpus run could be resumed (its `float_roundtrip` feature fixes that).
    #[test]
    fn a_drawn_plan_reads_back_as_written() {
        let text = super::super::presets::get("corpus").unwrap();
        for seed in [39, 40, 41] {
            let sc = Scenario::parse(&text.replace("seed = 39", &format!("seed = {seed}")), true)
                .unwrap();
            let plan = serde_json::to_value(&sc.cells).unwrap();
            let back: serde_json::Value =
                serde_json::from_str(&serde_json::to_string_pretty(&plan).unwrap()).unwrap();
            assert!(back == plan, "seed {seed}: the plan read back differs");
        }
    }

    fn forward(toml: &str) -> DirectionConfig {
        let spec: LinkSpec = toml::from_str(toml).unwrap();
        spec.resolve().unwrap().forward
    }

    #[test]
    fn tcp_limit_counts_headers_and_the_frames_lost() {
        // 50 Mbit/s × 1448/1514 with no loss.
        let clean = tcp_limit_in(&forward("[both]\nrate='50Mbit'\n"), HOST_MSS, true);
        assert!((clean - 47.820e6).abs() < 1e3, "{clean}");
        // BER 1e-6 on 1514-byte frames loses 1.204 %.
        let lossy = tcp_limit_in(
            &forward("[both]\nrate='50Mbit'\nber=1e-6\n"),
            HOST_MSS,
            true,
        );
        let l = lossy / clean;
        assert!((l - (1.0 - 0.01204)).abs() < 1e-4, "{l}");
        // Without timestamps the payload is 1460 bytes.
        let no_ts = tcp_limit_in(&forward("[both]\nrate='50Mbit'\n"), HOST_MSS, false);
        assert!((no_ts / clean - 1460.0 / 1448.0).abs() < 1e-9);
    }
}
