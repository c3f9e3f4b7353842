//! `satpep lab run`: the named experiments. `demo` is the README's main job: TCP downloads
//! with cubic and bbr, end-to-end and split by satpep, and through satpep's tunnel, over the
//! `geo` link, loss-free and at BER 1e-6, in one table.

use crate::iperf::tcp_download;
use crate::progress::Progress;
use crate::topology::{Lab, Pep, UpOptions};
use clap::Args;
use satpep_link::config::RateSource;
use satpep_link::loss::per_from_ber;
use satpep_link::units::fmt_rate;

/// Arguments of `satpep lab run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Experiment: `demo` (cubic and bbr end-to-end and split, and the tunnel, over geo,
    /// ~3 min),
    /// `link-accuracy` (the emulator's accuracy and CPU benchmark, ~11 min), `relay-overhead`
    /// (the split proxy's throughput and CPU against plain forwarding, ~2 min) or `cc-sweep`
    /// (congestion controls over 100 Mbit/s, 600 ms, BER 0 to 1e-5; ~40 min, --quick ~9 min)
    /// or `tunnel` (distributed mode against end-to-end and split: BER sweep, T1, 100 KB
    /// fetch, outage; ~25 min, --quick ~8 min).
    pub experiment: String,
    /// Seconds per transfer [default: demo 12, link-accuracy 10].
    #[arg(long, value_name = "S")]
    pub duration: Option<u32>,
    /// Shorter, smaller version (fewer cells, shorter transfers).
    #[arg(long)]
    pub quick: bool,
    /// Print results as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Run only this part of an experiment made of parts (tunnel: sweep, t1, fetch,
    /// overhead, outage).
    #[arg(long, value_name = "PART")]
    pub only: Option<String>,
}

/// Runs the experiment `args.experiment`.
pub fn run(args: RunArgs) -> Result<(), String> {
    crate::sys::require_root()?;
    crate::catch_interrupts();
    match args.experiment.as_str() {
        "demo" => demo(&args),
        "link-accuracy" => crate::accuracy::run(&args),
        "relay-overhead" => crate::relay_bench::run(&args),
        "cc-sweep" => crate::cc_sweep::run(&args),
        "tunnel" => crate::tunnel_bench::run(&args),
        other => Err(format!(
            "unknown experiment '{other}' (available: demo, link-accuracy, relay-overhead, cc-sweep, tunnel)"
        )),
    }
}

/// One row of the demo table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoRow {
    /// "end-to-end" or "split".
    pub mode: String,
    /// Sender's congestion control.
    pub cc: String,
    /// Forward bit error rate.
    pub ber: f64,
    /// Goodput, bit/s.
    pub goodput_bps: f64,
    /// Goodput as a share of the physical limit (rate × payload/frame × (1 − PER)).
    pub utilization: f64,
    /// Sender retransmissions.
    pub retransmits: u64,
    /// Mean smoothed RTT, ms.
    pub mean_rtt_ms: f64,
}

/// Highest TCP goodput a link allows: rate × MSS/frame × (1 − PER) with 1448-byte segments
/// (1500 MTU, timestamps on) in 1514-byte frames.
pub fn tcp_limit_bps(rate_bps: f64, overhead: u32, ber: f64) -> f64 {
    let frame = 1514 + overhead;
    rate_bps * 1448.0 / frame as f64 * (1.0 - per_from_ber(ber, frame))
}

/// A BER for tables: `0` or `1e-6`.
pub fn fmt_ber(ber: f64) -> String {
    if ber == 0.0 {
        "0".into()
    } else {
        format!("{ber:e}")
    }
}

fn lab_name(kind: &str) -> String {
    format!("{kind}-{}", std::process::id())
}

fn demo(args: &RunArgs) -> Result<(), String> {
    let secs = args.duration.unwrap_or(if args.quick { 8 } else { 12 });
    let mut cells = Vec::new();
    for ber in [0.0, 1e-6] {
        for mode in ["end-to-end", "split"] {
            for cc in ["cubic", "bbr"] {
                cells.push((ber, mode, cc));
            }
        }
        cells.push((ber, "tunnel", "satellite"));
    }
    let progress = Progress::new(cells.len(), secs as f64 + 3.0, false);
    let base = satpep_link::presets::spec("geo")?;
    let mut lab = Lab::up(&lab_name("demo"), &base, &UpOptions::default())?;
    let mut rows = Vec::new();
    let mut current_ber = None;
    for (i, &(ber, mode, cc)) in cells.iter().enumerate() {
        let mut spec = base.clone();
        spec.forward.ber = Some(ber);
        if current_ber != Some(ber) {
            lab.start_emulator(&spec)?;
            current_ber = Some(ber);
        }
        lab.stop_proxies();
        let server_cc = match mode {
            "split" => {
                lab.start_proxies(
                    &spec,
                    &Pep {
                        cc: Some(cc.into()),
                        ..Default::default()
                    },
                )?;
                cc
            }
            "tunnel" => {
                lab.start_proxies(
                    &spec,
                    &Pep {
                        tunnel: Some(cc.into()),
                        ..Default::default()
                    },
                )?;
                // The server's own leg ends at the gateway.
                "cubic"
            }
            _ => cc,
        };
        let cfg = spec.resolve()?;
        let rate = match cfg.forward.rate {
            RateSource::Fixed(r) => r,
            RateSource::Trace(ref t) => t.max(),
        };
        let what = format!("{mode:<10} {cc:<9} BER {:<5}", fmt_ber(ber));
        let r = tcp_download(&lab, server_cc, secs, false, &mut |t| {
            progress.tick(i, &what, t)
        })?;
        let limit = tcp_limit_bps(rate, cfg.forward.overhead, ber);
        let row = DemoRow {
            mode: mode.into(),
            cc: cc.into(),
            ber,
            goodput_bps: r.goodput_bps,
            utilization: r.goodput_bps / limit,
            retransmits: r.retransmits,
            mean_rtt_ms: r.mean_rtt_ms,
        };
        progress.done(
            i,
            &what,
            &format!(
                "{} ({:.1} % of limit)",
                fmt_rate(r.goodput_bps),
                row.utilization * 100.0
            ),
        );
        rows.push(row);
    }
    drop(lab);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
    } else {
        print_demo(&rows, secs);
    }
    Ok(())
}

fn print_demo(rows: &[DemoRow], secs: u32) {
    println!(
        "\nsatpep demo: {secs} s bulk TCP download over the geo link (50 Mbit/s forward, 280 ms one way)\n"
    );
    println!(
        "| {:<10} | {:<9} | {:>6} | {:>14} | {:>11} | {:>7} | {:>8} |",
        "mode", "cc", "BER", "goodput", "% of limit", "retrans", "srv RTT"
    );
    println!(
        "|{:-<12}|{:-<11}|{:->8}|{:->16}|{:->13}|{:->9}|{:->10}|",
        "", "", "", "", "", "", ""
    );
    for r in rows {
        println!(
            "| {:<10} | {:<9} | {:>6} | {:>14} | {:>10.1}% | {:>7} | {:>8.0} |",
            r.mode,
            r.cc,
            if r.ber == 0.0 {
                "0".to_string()
            } else {
                format!("{:e}", r.ber)
            },
            fmt_rate(r.goodput_bps),
            r.utilization * 100.0,
            r.retransmits,
            r.mean_rtt_ms
        );
    }
    println!(
        "\n% of limit: goodput / (rate × 1448/1514 × (1 − PER)), the most TCP can carry on this link."
    );
    println!("split: satpep proxy on terminal and gateway, the named cc on the satellite leg.");
    println!("tunnel: every flow in one QUIC connection between the two satpeps, with the named controller.");
    println!("retrans and srv RTT are the server's (end-to-end: across the satellite; split and tunnel: to");
    println!("the gateway).");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_limit() {
        // 50 Mbit/s × 1448/1514 with no loss.
        assert!((tcp_limit_bps(50e6, 0, 0.0) - 47.820e6).abs() < 1e3);
        // BER 1e-6 on 1514-byte frames loses 1.204 %.
        let l = tcp_limit_bps(50e6, 0, 1e-6) / tcp_limit_bps(50e6, 0, 0.0);
        assert!((l - (1.0 - 0.01204)).abs() < 1e-4, "{l}");
        assert_eq!(fmt_ber(0.0), "0");
        assert_eq!(fmt_ber(1e-6), "1e-6");
    }
}
