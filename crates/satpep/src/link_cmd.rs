//! `satpep link`: run the emulator between two interfaces, or query a running one.

use clap::{Args, Subcommand};
use satpep_link::cli::LinkArgs;
use satpep_link::presets::PRESETS;
use satpep_link::run::{query, run, EmulatorOptions};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Emulate a satellite link between two interfaces.
#[derive(Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    long_about = "Emulate a satellite link between two interfaces.

Bridges Ethernet frames between --terminal and --gateway at layer 2 (like Dummynet's bridge or \
MITRE's Spanner), applying per direction: serialization at a fixed or traced rate, a drop-tail \
bottleneck queue, propagation delay (fixed or traced) with optional jitter, bit/packet errors, \
Gilbert-Elliott bursts and scheduled outages. Forward = gateway -> terminal, return = terminal -> \
gateway.

GRO, LRO, TSO and GSO are turned off on both interfaces while it runs (and restored on exit) so \
each frame read is one wire frame. Counters are printed on exit (SIGINT/SIGTERM) and served as \
JSON on --control while running (`satpep link stats SOCKET`).

Examples:
  satpep link --terminal veth0 --gateway veth1 --preset geo
  satpep link --terminal veth0 --gateway veth1 --rate 10Mbit --delay 250ms --ber 1e-6
  satpep link --terminal veth0 --gateway veth1 --preset leo --outage-every 60s --outage-duration 5s
  satpep link --check --preset urke2011 --ret-rate 2Mbit"
)]
pub struct LinkCmd {
    #[command(subcommand)]
    sub: Option<LinkSub>,
    #[command(flatten)]
    run: LinkRun,
}

#[derive(Subcommand, Debug)]
enum LinkSub {
    /// Print the counters of a running emulator.
    Stats {
        /// The emulator's control socket (its --control).
        socket: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
struct LinkRun {
    /// Interface facing the satellite terminal; forward frames leave here.
    #[arg(long, value_name = "IF", required_unless_present_any = ["check", "list_presets"])]
    terminal: Option<String>,
    /// Interface facing the gateway; return frames leave here.
    #[arg(long, value_name = "IF", required_unless_present_any = ["check", "list_presets"])]
    gateway: Option<String>,
    /// Serve counters as JSON on this Unix socket while running.
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Print the final counters as JSON on stdout instead of a table on stderr.
    #[arg(long)]
    json: bool,
    /// Validate the link settings, print them and exit without touching any interface.
    #[arg(long)]
    check: bool,
    /// Run the forwarding threads with normal instead of real-time (SCHED_FIFO) priority.
    /// Real-time priority keeps release times within tens of microseconds on a busy host;
    /// the threads sleep between frames, so it costs nothing when idle.
    #[arg(long)]
    no_realtime: bool,
    /// List the presets and exit.
    #[arg(long)]
    list_presets: bool,
    #[command(flatten)]
    link: LinkArgs,
}

pub fn main(cmd: LinkCmd) -> Result<(), String> {
    if let Some(LinkSub::Stats { socket, json }) = cmd.sub {
        let s = query(&socket)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&s).unwrap());
        } else {
            print!("{}", s.table());
        }
        return Ok(());
    }
    let r = cmd.run;
    if r.list_presets {
        for p in PRESETS {
            println!("{:<15} {}", p.name, p.about);
        }
        return Ok(());
    }
    let config = r.link.resolve()?;
    let describe = format!(
        "forward: {}\nreturn:  {}{}",
        config.forward.describe(),
        config.ret.describe(),
        if config.outages.is_empty() {
            String::new()
        } else {
            format!("\noutages: {:?}", config.outages)
        }
    );
    if r.check {
        println!("{describe}");
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| e.to_string())?;
    }
    let opts = EmulatorOptions {
        config,
        terminal_if: r.terminal.unwrap(),
        gateway_if: r.gateway.unwrap(),
        control: r.control,
        realtime: (!r.no_realtime).then_some(50),
    };
    let (t, g) = (opts.terminal_if.clone(), opts.gateway_if.clone());
    let snap = run(opts, stop, || {
        eprintln!("satpep link: bridging {t} (terminal) <-> {g} (gateway)\n{describe}");
    })?;
    if r.json {
        println!("{}", serde_json::to_string_pretty(&snap).unwrap());
    } else {
        eprint!("{}", snap.table());
    }
    Ok(())
}
