//! `satpep lab run tunnel`: the distributed mode's evidence, side by side with end-to-end TCP
//! and split mode in one run:
//! 1. 100 Mbit/s, RTT 600 ms, a BER sweep: goodput as a share of the physical limit, over the
//!    whole transfer and from 10 s on; and link bytes per payload byte of one download;
//! 2. T1 (1.544 Mbit/s), 285 ms one way, BER 1e-5 (Lawson 2006's link, 000);
//! 3. a fresh connection fetching 100 KB over `geo`: time to last byte;
//! 4. an outage in the middle of 20 downloads: every one completes, checksums match.

use crate::experiment::{fmt_ber, tcp_limit_bps, RunArgs};
use crate::http::{fetch, finish_fetch, spawn_fetch, HttpServer};
use crate::iperf::tcp_download;
use crate::progress::Progress;
use crate::topology::{ensure_cc, state_dir, Host, Lab, Pep, UpOptions};
use satpep_link::config::LinkSpec;
use satpep_link::units::fmt_rate;
use serde::Serialize;

/// A PEP configuration: mode and controller.
#[derive(Debug, Clone, Copy)]
struct Config {
    mode: &'static str,
    cc: &'static str,
}

const fn c(mode: &'static str, cc: &'static str) -> Config {
    Config { mode, cc }
}

/// One bulk-transfer cell.
#[derive(Debug, Clone, Serialize)]
pub struct BulkRow {
    /// Which part: "100M/600ms" or "T1".
    pub link: String,
    /// "end-to-end", "split" or "tunnel".
    pub mode: String,
    /// Controller: the server's end to end, the satellite leg's split, the tunnel's.
    pub cc: String,
    /// Forward bit error rate.
    pub ber: f64,
    /// Goodput over the whole transfer, bit/s.
    pub goodput_bps: f64,
    /// Goodput / physical limit.
    pub utilization: f64,
    /// Goodput from 10 s on / physical limit.
    pub utilization_after_10s: f64,
}

/// Protocol overhead of one mode: what the link delivered per payload byte of a download.
#[derive(Debug, Clone, Serialize)]
pub struct OverheadRow {
    /// PEP mode.
    pub mode: String,
    /// Payload bytes downloaded (the file's size).
    pub payload: u64,
    /// Link bytes delivered gateway → terminal (whole frames) per payload byte.
    pub forward_per_byte: f64,
    /// Link bytes delivered terminal → gateway (acknowledgements) per payload byte.
    pub return_per_byte: f64,
}

/// One fetch-time cell.
#[derive(Debug, Clone, Serialize)]
pub struct FetchRow {
    /// PEP mode.
    pub mode: String,
    /// Median time to last byte over the repetitions, s.
    pub median_s: f64,
    /// Every repetition, s.
    pub times_s: Vec<f64>,
    /// One RTT plus serialization of the file at the forward rate, s.
    pub physical_s: f64,
}

/// The outage part's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct OutageRow {
    /// Downloads started.
    pub transfers: usize,
    /// Downloads complete with the right checksum.
    pub intact: usize,
    /// Outage length, s.
    pub outage_s: u32,
    /// Time until the last download finished, s.
    pub last_done_s: f64,
    /// Frames the link dropped during the outage.
    pub dropped_outage: u64,
    /// curl's exit codes of the downloads that failed (18: cut short).
    pub failures: Vec<i32>,
}

/// Everything the experiment measured.
#[derive(Debug, Clone, Serialize)]
pub struct TunnelReport {
    /// Parts 1 and 2.
    pub bulk: Vec<BulkRow>,
    /// Part 3.
    pub fetch: Vec<FetchRow>,
    /// Part 4.
    pub outage: Option<OutageRow>,
    /// Bytes on the link per payload byte.
    pub overhead: Vec<OverheadRow>,
}

fn spec(text: &str) -> Result<LinkSpec, String> {
    let s: LinkSpec = toml::from_str(text).map_err(|e| e.to_string())?;
    LinkSpec::layered(&[&s])
}

fn start_pep(lab: &mut Lab, spec: &LinkSpec, cfg: Config) -> Result<&'static str, String> {
    lab.stop_proxies();
    Ok(match cfg.mode {
        "split" => {
            lab.start_proxies(
                spec,
                &Pep {
                    cc: Some(cfg.cc.into()),
                    ..Default::default()
                },
            )?;
            "cubic"
        }
        "tunnel" => {
            lab.start_proxies(
                spec,
                &Pep {
                    tunnel: Some(cfg.cc.into()),
                    ..Default::default()
                },
            )?;
            "cubic"
        }
        _ => cfg.cc,
    })
}

/// Link bytes delivered so far: (forward, return).
fn delivered(lab: &Lab) -> (u64, u64) {
    lab.link_stats()
        .map(|s| (s.forward.delivered_bytes, s.ret.delivered_bytes))
        .unwrap_or((0, 0))
}

/// Runs the bulk cells of one link.
#[allow(clippy::too_many_arguments)]
fn bulk(
    label: &str,
    link_text: &str,
    rate: f64,
    bers: &[f64],
    configs: &[Config],
    secs: u32,
    progress: &Progress,
    next: &mut usize,
    rows: &mut Vec<BulkRow>,
) -> Result<(), String> {
    let name = format!("tun-{}", std::process::id());
    let mut lab = Lab::up(&name, &spec(link_text)?, &UpOptions::default())?;
    for &ber in bers {
        let s = spec(&format!("{link_text}[forward]\nber = {ber:e}\n"))?;
        lab.start_emulator(&s)?;
        for &cfg in configs {
            if crate::interrupted() {
                return Err("interrupted".into());
            }
            let server_cc = start_pep(&mut lab, &s, cfg)?;
            let what = format!(
                "{label} {:<10} {:<15} BER {:<5}",
                cfg.mode,
                cfg.cc,
                fmt_ber(ber)
            );
            let i = *next;
            let r = tcp_download(&lab, server_cc, secs, false, &mut |t| {
                progress.tick(i, &what, t)
            })?;
            let limit = tcp_limit_bps(rate, 0, ber);
            let row = BulkRow {
                link: label.into(),
                mode: cfg.mode.into(),
                cc: cfg.cc.into(),
                ber,
                goodput_bps: r.goodput_bps,
                utilization: r.goodput_bps / limit,
                utilization_after_10s: r.goodput_after(10.0) / limit,
            };
            progress.done(
                i,
                &what,
                &format!(
                    "{} ({:.1} % of limit, {:.1} % from 10 s)",
                    fmt_rate(row.goodput_bps),
                    row.utilization * 100.0,
                    row.utilization_after_10s * 100.0
                ),
            );
            *next += 1;
            rows.push(row);
        }
    }
    lab.stop_proxies();
    Ok(())
}

/// Part 3: median time to last byte of a 100 KB fetch on a fresh connection.
fn fetch_times(
    reps: usize,
    progress: &Progress,
    next: &mut usize,
) -> Result<Vec<FetchRow>, String> {
    let base = satpep_link::presets::spec("geo")?;
    let cfg = base.resolve()?;
    let rtt = (cfg.forward.delay.max_ns() + cfg.ret.delay.max_ns()) as f64 / 1e9;
    let physical = rtt + 100_000.0 * 8.0 / cfg.forward.rate.max_bps();
    let name = format!("tunf-{}", std::process::id());
    let mut lab = Lab::up(&name, &base, &UpOptions::default())?;
    let _www = HttpServer::start(&lab, Host::Server, &[("100k.bin", 100_000)])?;
    let mut rows = Vec::new();
    for cfg in [
        c("end-to-end", "cubic"),
        c("split", "cubic"),
        c("tunnel", "satellite"),
    ] {
        start_pep(&mut lab, &base, cfg)?;
        let i = *next;
        let what = format!("geo 100 KB fetch {:<10}", cfg.mode);
        let mut times = Vec::new();
        // A first fetch warms what a real path has warm (ARP, the tunnel's connection).
        let _ = fetch(&lab, Host::Client, "http://198.18.3.2/100k.bin", 30);
        for k in 0..reps {
            let f = fetch(&lab, Host::Client, "http://198.18.3.2/100k.bin", 30);
            if f.exit != 0 || f.bytes != 100_000 {
                return Err(format!(
                    "{}: fetch {k} failed (curl exit {}, {} bytes)",
                    cfg.mode, f.exit, f.bytes
                ));
            }
            times.push(f.total_s);
            progress.tick(i, &what, k as f64);
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        progress.done(
            i,
            &what,
            &format!("median {:.3} s (physical {:.3} s)", median, physical),
        );
        *next += 1;
        rows.push(FetchRow {
            mode: cfg.mode.into(),
            median_s: median,
            times_s: times,
            physical_s: physical,
        });
    }
    lab.stop_proxies();
    Ok(rows)
}

/// The overhead part: one download of `size` bytes per mode over a clean 100 Mbit/s, 600 ms
/// link; link bytes delivered each way, per payload byte.
fn overhead(
    size: usize,
    progress: &Progress,
    next: &mut usize,
) -> Result<Vec<OverheadRow>, String> {
    let text = "[both]\nrate = '100Mbit'\ndelay = '300ms'\n";
    let s = spec(text)?;
    let name = format!("tunv-{}", std::process::id());
    let mut lab = Lab::up(&name, &s, &UpOptions::default())?;
    let _www = HttpServer::start(&lab, Host::Server, &[("big.bin", size)])?;
    let mut rows = Vec::new();
    for cfg in [
        c("end-to-end", "cubic"),
        c("split", "cubic"),
        c("tunnel", "satellite"),
    ] {
        start_pep(&mut lab, &s, cfg)?;
        let i = *next;
        let what = format!("overhead {:<10}", cfg.mode);
        // Connections and the tunnel are set up before counting.
        let _ = fetch(&lab, Host::Client, "http://198.18.3.2/", 30);
        std::thread::sleep(std::time::Duration::from_secs(2));
        let (f0, r0) = delivered(&lab);
        let f = fetch(&lab, Host::Client, "http://198.18.3.2/big.bin", 120);
        // Let the last acknowledgements cross.
        std::thread::sleep(std::time::Duration::from_secs(2));
        let (f1, r1) = delivered(&lab);
        if f.exit != 0 || f.bytes != size as u64 {
            return Err(format!(
                "{}: download failed (curl exit {})",
                cfg.mode, f.exit
            ));
        }
        let row = OverheadRow {
            mode: cfg.mode.into(),
            payload: size as u64,
            forward_per_byte: (f1 - f0) as f64 / size as f64,
            return_per_byte: (r1 - r0) as f64 / size as f64,
        };
        progress.done(
            i,
            &what,
            &format!(
                "{:.4} forward + {:.4} return link bytes per payload byte",
                row.forward_per_byte, row.return_per_byte
            ),
        );
        *next += 1;
        rows.push(row);
    }
    lab.stop_proxies();
    Ok(rows)
}

/// Part 4: `n` downloads through the tunnel over `geo`, with the link down for `outage_s`
/// from 5 s after they start.
fn outage(
    n: usize,
    size: usize,
    outage_s: u32,
    progress: &Progress,
    i: usize,
) -> Result<OutageRow, String> {
    let base = satpep_link::presets::spec("geo")?;
    let name = format!("tuno-{}", std::process::id());
    let mut lab = Lab::up(&name, &base, &UpOptions::default())?;
    let files: Vec<(String, usize)> = (0..n).map(|k| (format!("f{k}.bin"), size)).collect();
    let refs: Vec<(&str, usize)> = files.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    let www = HttpServer::start(&lab, Host::Server, &refs)?;
    start_pep(&mut lab, &base, c("tunnel", "satellite"))?;
    let mut with_outage = base.clone();
    with_outage.outage.down = vec![format!("5s..{}s", 5 + outage_s)];
    lab.start_emulator(&with_outage)?;
    let dir = state_dir(&lab.name);
    let t0 = std::time::Instant::now();
    let children: Vec<_> = (0..n)
        .map(|k| {
            let out = dir.join(format!("got{k}.bin"));
            let url = format!("http://198.18.3.2/f{k}.bin");
            (
                spawn_fetch(&lab, Host::Client, &url, Some(&out), outage_s + 300),
                out,
            )
        })
        .collect();
    let what = format!("geo {n} downloads, {outage_s} s outage");
    let mut intact = 0;
    let mut failures = Vec::new();
    let mut last = 0.0f64;
    for (k, (child, out)) in children.into_iter().enumerate() {
        let f = finish_fetch(child, Some(&out));
        progress.tick(i, &what, t0.elapsed().as_secs_f64());
        last = last.max(t0.elapsed().as_secs_f64());
        let want = www.sha256(&format!("f{k}.bin"))?;
        if f.exit == 0 && f.sha256 == Some(want) {
            intact += 1;
        } else {
            failures.push(f.exit);
        }
        let _ = std::fs::remove_file(&out);
    }
    let dropped = lab
        .link_stats()
        .map(|s| s.forward.dropped_outage + s.ret.dropped_outage)
        .unwrap_or(0);
    progress.done(
        i,
        &what,
        &format!("{intact}/{n} intact, last done at {last:.1} s"),
    );
    lab.stop_proxies();
    Ok(OutageRow {
        transfers: n,
        intact,
        outage_s,
        last_done_s: last,
        dropped_outage: dropped,
        failures,
    })
}

/// Runs the experiment and prints its tables (or JSON).
pub fn run(args: &RunArgs) -> Result<(), String> {
    let quick = args.quick;
    let secs = args.duration.unwrap_or(if quick { 20 } else { 30 });
    let bers: &[f64] = if quick {
        &[0.0, 1e-6, 1e-5]
    } else {
        &[0.0, 1e-7, 1e-6, 1e-5]
    };
    let fast_configs: &[Config] = if quick {
        &[
            c("end-to-end", "bbr"),
            c("split", "bbr"),
            c("tunnel", "satellite"),
        ]
    } else {
        &[
            c("end-to-end", "cubic"),
            c("end-to-end", "bbr"),
            c("split", "bbr"),
            c("split", "satpep_tarang"),
            c("tunnel", "satellite"),
            c("tunnel", "bbr"),
            c("tunnel", "cubic"),
        ]
    };
    let t1_configs: &[Config] = &[
        c("end-to-end", "cubic"),
        c("split", "satpep_tarang"),
        c("tunnel", "satellite"),
    ];
    for cfg in fast_configs.iter().chain(t1_configs) {
        if cfg.mode == "split" {
            ensure_cc(cfg.cc)?;
        }
    }
    let t1_secs = if quick { 30 } else { 60 };
    let reps = if quick { 3 } else { 7 };
    let (n, size, outage_s) = if quick {
        (20, 2 << 20, 20)
    } else {
        (20, 5 << 20, 60)
    };
    let parts = ["sweep", "t1", "fetch", "overhead", "outage"];
    if let Some(p) = &args.only {
        if !parts.contains(&p.as_str()) {
            return Err(format!(
                "--only: '{p}' is not a part of tunnel ({})",
                parts.join(", ")
            ));
        }
    }
    let on = |p: &str| args.only.as_deref().is_none_or(|o| o == p);
    let cells = if on("sweep") {
        bers.len() * fast_configs.len()
    } else {
        0
    } + if on("t1") { t1_configs.len() } else { 0 }
        + if on("fetch") { 3 } else { 0 }
        + if on("overhead") { 3 } else { 0 }
        + if on("outage") { 1 } else { 0 };
    let progress = Progress::new(cells, secs as f64 + 5.0, false);
    let mut next = 0;
    let mut rows = Vec::new();
    if on("sweep") {
        bulk(
            "100M/600ms",
            "[both]\nrate = '100Mbit'\ndelay = '300ms'\n",
            100e6,
            bers,
            fast_configs,
            secs,
            &progress,
            &mut next,
            &mut rows,
        )?;
    }
    if on("t1") {
        bulk(
            "T1/570ms",
            "[both]\nrate = '1.544Mbit'\ndelay = '285ms'\n",
            1.544e6,
            &[1e-5],
            t1_configs,
            t1_secs,
            &progress,
            &mut next,
            &mut rows,
        )?;
    }
    let fetch = if on("fetch") {
        fetch_times(reps, &progress, &mut next)?
    } else {
        Vec::new()
    };
    let overhead = if on("overhead") {
        overhead(50 << 20, &progress, &mut next)?
    } else {
        Vec::new()
    };
    let out = if on("outage") {
        Some(outage(n, size, outage_s, &progress, next)?)
    } else {
        None
    };
    let report = TunnelReport {
        bulk: rows,
        fetch,
        outage: out,
        overhead,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap());
    } else {
        print_report(&report, bers, secs, t1_secs);
    }
    Ok(())
}

fn print_report(r: &TunnelReport, bers: &[f64], secs: u32, t1_secs: u32) {
    if r.bulk.iter().any(|x| x.link == "100M/600ms") {
        print_sweep(r, bers, secs);
    }
    if !r.overhead.is_empty() {
        print_overhead(r);
    }
    if r.bulk.iter().any(|x| x.link == "T1/570ms") {
        print_t1(r, t1_secs);
    }
    if !r.fetch.is_empty() {
        print_fetch(r);
    }
    if let Some(o) = &r.outage {
        println!(
            "\nOutage: {} downloads over geo through the tunnel, link down {} s from 5 s: {}/{} complete with matching SHA-256, last at {:.1} s ({} frames dropped by the outage).",
            o.transfers, o.outage_s, o.intact, o.transfers, o.last_done_s, o.dropped_outage
        );
        if !o.failures.is_empty() {
            println!("curl exit codes of the failed downloads: {:?}", o.failures);
        }
    }
}

fn print_sweep(r: &TunnelReport, bers: &[f64], secs: u32) {
    println!("\nsatpep tunnel: 100 Mbit/s each way, RTT 600 ms, {secs} s bulk downloads; % of the physical limit (whole transfer / from 10 s on)\n");
    let mut head = format!("| {:<10} | {:<15} |", "mode", "cc");
    let mut rule = format!("|{:-<12}|{:-<17}|", "", "");
    for b in bers {
        head += &format!(" {:>17} |", format!("BER {}", fmt_ber(*b)));
        rule += &format!("{:->19}|", "");
    }
    println!("{head}\n{rule}");
    let mut seen: Vec<(String, String)> = Vec::new();
    for row in r.bulk.iter().filter(|x| x.link == "100M/600ms") {
        let k = (row.mode.clone(), row.cc.clone());
        if seen.contains(&k) {
            continue;
        }
        seen.push(k);
        let mut line = format!("| {:<10} | {:<15} |", row.mode, row.cc);
        for b in bers {
            let cell = r.bulk.iter().find(|x| {
                x.link == row.link && x.mode == row.mode && x.cc == row.cc && x.ber == *b
            });
            line += &match cell {
                Some(x) => format!(
                    " {:>7.1} / {:>5.1} % |",
                    x.utilization * 100.0,
                    x.utilization_after_10s * 100.0
                ),
                None => format!(" {:>17} |", "-"),
            };
        }
        println!("{line}");
    }
    println!("\nfrom 10 s on: the receiver's one-second intervals from 10 s to the last but one; above 100 % when");
    println!(
        "data held back earlier (a queue, or bytes waiting behind a repaired loss) arrives then."
    );
}

fn print_overhead(r: &TunnelReport) {
    println!("\nLink bytes delivered (whole frames) per payload byte, one download of 50 MiB over the same link at BER 0:\n");
    println!(
        "| {:<10} | {:>9} | {:>9} | {:>9} |",
        "mode", "forward", "return", "total"
    );
    println!("|{:-<12}|{:->11}|{:->11}|{:->11}|", "", "", "", "");
    for o in &r.overhead {
        println!(
            "| {:<10} | {:>9.4} | {:>9.4} | {:>9.4} |",
            o.mode,
            o.forward_per_byte,
            o.return_per_byte,
            o.forward_per_byte + o.return_per_byte
        );
    }
}

fn print_t1(r: &TunnelReport, t1_secs: u32) {
    println!("\nT1 (1.544 Mbit/s), 285 ms one way, BER 1e-5, {t1_secs} s (Lawson 2006: SCPS-TP 150.7 kbit/s, ~10 %):\n");
    println!(
        "| {:<10} | {:<15} | {:>12} | {:>11} |",
        "mode", "cc", "goodput", "% of limit"
    );
    println!("|{:-<12}|{:-<17}|{:->14}|{:->13}|", "", "", "", "");
    for x in r.bulk.iter().filter(|x| x.link == "T1/570ms") {
        println!(
            "| {:<10} | {:<15} | {:>12} | {:>10.1}% |",
            x.mode,
            x.cc,
            fmt_rate(x.goodput_bps),
            x.utilization * 100.0
        );
    }
}

fn print_fetch(r: &TunnelReport) {
    println!("\n100 KB fetch on a new connection over geo (time to last byte, median of the repetitions):\n");
    println!(
        "| {:<10} | {:>9} | {:>12} | {:>9} |",
        "mode", "median", "physical", "ratio"
    );
    println!("|{:-<12}|{:->11}|{:->14}|{:->11}|", "", "", "", "");
    for f in &r.fetch {
        println!(
            "| {:<10} | {:>7.3} s | {:>10.3} s | {:>9.2} |",
            f.mode,
            f.median_s,
            f.physical_s,
            f.median_s / f.physical_s
        );
    }
    println!("physical: one RTT plus the file's serialization at the forward rate.");
}
