//! `satpep lab run relay-overhead`: what the split proxy costs when the link is not the
//! bottleneck. The emulator is replaced by a kernel bridge, so the only limit is the CPU; one
//! TCP download (cubic) runs through plain forwarding, through one proxy (the terminal, as
//! PEPsal is deployed) copying or splicing, and through both proxies. Run once with the
//! routers' link-facing offloads as the emulator needs them (off) and once with them on.

use crate::experiment::RunArgs;
use crate::iperf::tcp_download;
use crate::progress::Progress;
use crate::topology::{Lab, Pep, UpOptions};
use satpep_link::units::fmt_rate;

/// One row of the relay benchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RelayRow {
    /// TSO/GSO/tx checksum offload on the routers' link-facing interfaces.
    pub offloads: bool,
    /// "forwarding", "split terminal copy", "split terminal splice" or "split both splice".
    pub setup: String,
    /// Goodput, bit/s.
    pub goodput_bps: f64,
    /// Goodput against plain forwarding with the same offloads.
    pub vs_forwarding: f64,
    /// CPU seconds used by the proxy processes per second of transfer (1.0 = one core).
    pub proxy_cores: f64,
    /// Proxy CPU seconds per gigabyte relayed (per proxy process).
    pub cpu_s_per_gb: f64,
}

/// CPU time (user + system) of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Runs the benchmark and prints its table (or JSON).
pub fn run(args: &RunArgs) -> Result<(), String> {
    let secs = args.duration.unwrap_or(if args.quick { 5 } else { 10 });
    let setups: [(&str, Option<(&str, bool)>); 4] = [
        ("forwarding", None),
        ("split terminal copy", Some(("copy", true))),
        ("split terminal splice", Some(("splice", true))),
        ("split both splice", Some(("splice", false))),
    ];
    let cells: Vec<(bool, usize)> = [false, true]
        .into_iter()
        .flat_map(|o| (0..setups.len()).map(move |i| (o, i)))
        .collect();
    let progress = Progress::new(cells.len(), secs as f64 + 2.0, false);
    let spec = satpep_link::presets::spec("geo")?;
    let name = format!("relay-{}", std::process::id());
    let mut lab = Lab::up(&name, &spec, &UpOptions::default())?;
    lab.bridge_link()?;
    let mut rows: Vec<RelayRow> = Vec::new();
    for (i, &(offloads, s)) in cells.iter().enumerate() {
        if crate::interrupted() {
            return Err("interrupted".into());
        }
        let (setup, pep) = setups[s];
        lab.set_link_offloads(offloads)?;
        lab.stop_proxies();
        if let Some((relay, terminal_only)) = pep {
            lab.start_proxies(
                &spec,
                &Pep {
                    cc: Some("cubic".into()),
                    relay: Some(relay.into()),
                    terminal_only,
                    ..Default::default()
                },
            )?;
        }
        let pids = lab.state().proxy_pids.clone();
        let cpu0: f64 = pids.iter().map(|&p| cpu_seconds(p)).sum();
        let t0 = std::time::Instant::now();
        let what = format!(
            "offloads {:<3} {setup}",
            if offloads { "on" } else { "off" }
        );
        let r = tcp_download(&lab, "cubic", secs, false, &mut |t| {
            progress.tick(i, &what, t)
        })?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = pids.iter().map(|&p| cpu_seconds(p)).sum::<f64>() - cpu0;
        let base = rows
            .iter()
            .find(|r| r.offloads == offloads && r.setup == "forwarding")
            .map(|r| r.goodput_bps)
            .unwrap_or(r.goodput_bps);
        let gb = r.bytes as f64 / 1e9;
        let row = RelayRow {
            offloads,
            setup: setup.into(),
            goodput_bps: r.goodput_bps,
            vs_forwarding: r.goodput_bps / base,
            proxy_cores: cpu / wall,
            cpu_s_per_gb: if pids.is_empty() || gb == 0.0 {
                0.0
            } else {
                cpu / pids.len() as f64 / gb
            },
        };
        progress.done(
            i,
            &what,
            &format!(
                "{} ({:.0} % of forwarding), proxy CPU {:.0} % of a core",
                fmt_rate(row.goodput_bps),
                row.vs_forwarding * 100.0,
                row.proxy_cores * 100.0
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
        "\nsatpep relay overhead: one {secs} s TCP download (cubic), no emulator (kernel bridge)\n"
    );
    println!(
        "| {:<8} | {:<21} | {:>14} | {:>13} | {:>10} | {:>13} |",
        "offloads", "setup", "goodput", "vs forwarding", "proxy CPU", "CPU s per GB"
    );
    println!(
        "|{:-<10}|{:-<23}|{:->16}|{:->15}|{:->12}|{:->15}|",
        "", "", "", "", "", ""
    );
    for r in &rows {
        println!(
            "| {:<8} | {:<21} | {:>14} | {:>12.0}% | {:>9.0}% | {:>13} |",
            if r.offloads { "on" } else { "off" },
            r.setup,
            fmt_rate(r.goodput_bps),
            r.vs_forwarding * 100.0,
            r.proxy_cores * 100.0,
            if r.cpu_s_per_gb > 0.0 {
                format!("{:.2}", r.cpu_s_per_gb)
            } else {
                "-".into()
            }
        );
    }
    println!("\nproxy CPU: user + system time of the proxy processes (all of them) over the transfer, 100 % = one core.");
    println!("CPU s per GB: per proxy process. The client, server and kernel forwarding share the same 2 cores.");
    Ok(())
}
