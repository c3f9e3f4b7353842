//! `satpep lab run cc-sweep`: the single-link study of Vanzara 2017 (004 ch. 3, Fig. 3.8):
//! 100 Mbit/s each way, RTT 600 ms, a BER sweep; one bulk download per cell, end to end with
//! cubic and bbr against split by satpep with cubic, bbr, Hybla, Westwood+, Tarang and the
//! adaptive selection on the satellite leg. Goodput as a share of the physical limit, with the thesis's figures beside.

use crate::experiment::{fmt_ber, tcp_limit_bps, RunArgs};
use crate::iperf::tcp_download;
use crate::progress::Progress;
use crate::topology::{ensure_cc, Lab, Pep, UpOptions};
use satpep_link::config::LinkSpec;
use satpep_link::units::fmt_rate;

/// One cell of the sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SweepRow {
    /// "end-to-end" or "split".
    pub mode: String,
    /// Congestion control (the server's end to end; the satellite leg's when split).
    pub cc: String,
    /// Bit error rate, forward direction.
    pub ber: f64,
    /// Goodput, bit/s.
    pub goodput_bps: f64,
    /// Goodput / (rate x 1448/1514 x (1 - PER)).
    pub utilization: f64,
    /// The server's retransmissions.
    pub retransmits: u64,
}

/// Configurations, in table order.
const CONFIGS: [(&str, &str); 8] = [
    ("end-to-end", "cubic"),
    ("end-to-end", "bbr"),
    ("split", "cubic"),
    ("split", "bbr"),
    ("split", "satpep_hybla"),
    ("split", "satpep_westwood"),
    ("split", "satpep_tarang"),
    ("split", "adaptive"),
];

/// What Vanzara 2017 reports for the same link (ns-2, 100 s and longer runs), from the text
/// around Fig. 3.8-3.10; "" where the thesis gives no figure.
fn thesis(cc: &str, ber: f64) -> &'static str {
    let b = |x: f64| (ber - x).abs() < x * 1e-6 + 1e-15;
    match cc {
        "satpep_hybla" if b(0.0) => "~96 Mbit/s",
        "satpep_hybla" if b(1e-8) => "< 50 Mbit/s",
        "satpep_hybla" if b(1e-7) => "~11 Mbit/s",
        "satpep_hybla" if b(1e-6) => "~2 Mbit/s",
        "satpep_tarang" if b(0.0) => "~96 Mbit/s",
        "satpep_tarang" if b(1e-8) || b(1e-7) => "> 90 Mbit/s",
        "satpep_tarang" if b(1e-6) => "> 80 % (after ~200 s)",
        "satpep_westwood" if b(1e-8) => "< 50 Mbit/s",
        "satpep_westwood" if b(1e-7) => "~10 Mbit/s",
        "satpep_westwood" if b(1e-6) || b(1e-5) => "< 0.5 Mbit/s",
        _ => "",
    }
}

fn link(ber: f64) -> Result<LinkSpec, String> {
    let text = format!("[both]\nrate = '100Mbit'\ndelay = '300ms'\n[forward]\nber = {ber:e}\n");
    let spec: LinkSpec = toml::from_str(&text).map_err(|e| e.to_string())?;
    LinkSpec::layered(&[&spec])
}

/// Runs the sweep and prints its table (or JSON).
pub fn run(args: &RunArgs) -> Result<(), String> {
    let secs = args.duration.unwrap_or(if args.quick { 20 } else { 60 });
    let bers: &[f64] = if args.quick {
        &[0.0, 1e-6, 1e-5]
    } else {
        &[0.0, 1e-8, 1e-7, 1e-6, 1e-5]
    };
    for (_, cc) in CONFIGS {
        if cc != "adaptive" {
            ensure_cc(cc)?;
        }
    }
    let cells: Vec<(f64, usize)> = bers
        .iter()
        .flat_map(|&b| (0..CONFIGS.len()).map(move |i| (b, i)))
        .collect();
    let progress = Progress::new(cells.len(), secs as f64 + 4.0, false);
    let name = format!("ccsw-{}", std::process::id());
    let mut lab = Lab::up(&name, &link(0.0)?, &UpOptions::default())?;
    let mut rows = Vec::new();
    let mut current = None;
    for (i, &(ber, c)) in cells.iter().enumerate() {
        if crate::interrupted() {
            return Err("interrupted".into());
        }
        let (mode, cc) = CONFIGS[c];
        let spec = link(ber)?;
        if current != Some(ber) {
            lab.start_emulator(&spec)?;
            current = Some(ber);
        }
        lab.stop_proxies();
        // Split: the satellite leg runs `cc`; the server's own (terrestrial) leg stays cubic.
        let server_cc = if mode == "split" {
            lab.start_proxies(
                &spec,
                &Pep {
                    cc: Some(cc.into()),
                    ..Default::default()
                },
            )?;
            "cubic"
        } else {
            cc
        };
        let what = format!("{mode:<10} {cc:<15} BER {:<5}", fmt_ber(ber));
        let r = tcp_download(&lab, server_cc, secs, false, &mut |t| {
            progress.tick(i, &what, t)
        })?;
        let limit = tcp_limit_bps(100e6, 0, ber);
        let row = SweepRow {
            mode: mode.into(),
            cc: cc.into(),
            ber,
            goodput_bps: r.goodput_bps,
            utilization: r.goodput_bps / limit,
            retransmits: r.retransmits,
        };
        progress.done(
            i,
            &what,
            &format!(
                "{} ({:.1} % of limit)",
                fmt_rate(row.goodput_bps),
                row.utilization * 100.0
            ),
        );
        rows.push(row);
    }
    lab.stop_proxies();
    drop(lab);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return Ok(());
    }
    println!(
        "\nsatpep cc-sweep: {secs} s bulk downloads, 100 Mbit/s each way, RTT 600 ms (Vanzara 2017 Fig. 3.8)\n"
    );
    let mut head = format!("| {:<10} | {:<15} |", "mode", "cc");
    let mut rule = format!("|{:-<12}|{:-<17}|", "", "");
    for b in bers {
        head += &format!(" {:>14} |", format!("BER {}", fmt_ber(*b)));
        rule += &format!("{:->16}|", "");
    }
    println!("{head}\n{rule}");
    for (mode, cc) in CONFIGS {
        let mut line = format!("| {mode:<10} | {cc:<15} |");
        for b in bers {
            let r = rows
                .iter()
                .find(|r| r.mode == mode && r.cc == cc && r.ber == *b);
            line += &match r {
                Some(r) => format!(" {:>13.1}% |", r.utilization * 100.0),
                None => format!(" {:>14} |", "-"),
            };
        }
        println!("{line}");
    }
    println!("\n% of the physical limit: goodput / (100 Mbit/s x 1448/1514 x (1 - PER)).");
    println!("Thesis (004, ns-2, 100 s+ runs; split here means the same controller on the satellite leg):");
    for (_, cc) in CONFIGS {
        let figs: Vec<String> = bers
            .iter()
            .filter(|b| !thesis(cc, **b).is_empty())
            .map(|b| format!("BER {}: {}", fmt_ber(*b), thesis(cc, *b)))
            .collect();
        if !figs.is_empty() {
            println!("  {cc}: {}", figs.join("; "));
        }
    }
    Ok(())
}
