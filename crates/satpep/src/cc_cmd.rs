//! `satpep cc`: list, load and unload satpep's BPF congestion controls.

use clap::{Args, Subcommand};
use satpep_cc::{Options, BUNDLED};

/// Load satpep's congestion controls into the kernel (BPF struct_ops).
#[derive(Args, Debug)]
#[command(
    long_about = "List, load and unload satpep's congestion controls for long, lossy links.

They are BPF struct_ops programs: they load into any kernel with BTF and BPF congestion \
control support (5.13 or later; struct_ops links need 6.4), without kernel modules. Once \
loaded, every socket on the host can select them by name, like a built-in one:

    satpep cc load satpep_hybla           # holds them until Ctrl-C
    iperf3 -c SERVER -C satpep_hybla      # in another shell

With --pin they stay registered after satpep exits, until `satpep cc unload`. \
`satpep proxy` loads the ones its configuration names by itself. Needs root."
)]
pub struct CcCmd {
    #[command(subcommand)]
    sub: CcSub,
}

#[derive(Subcommand, Debug)]
enum CcSub {
    /// List the kernel's congestion controls and satpep's bundled ones, and which are loaded.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Load bundled congestion controls (default: all) and hold them until interrupted, or
    /// pin them and exit.
    Load {
        /// Names (see `satpep cc list`).
        names: Vec<String>,
        /// Keep them registered after exit (pinned under /sys/fs/bpf/satpep).
        #[arg(long)]
        pin: bool,
        /// Hybla's and Tarang's reference RTT.
        #[arg(long, value_name = "DURATION", default_value = "25ms")]
        rtt0: String,
        /// Tarang's channel capacity (e.g. 100Mbit); default: estimated per connection.
        #[arg(long, value_name = "RATE")]
        capacity: Option<String>,
    },
    /// Unload pinned congestion controls (default: all of satpep's).
    Unload {
        /// Names.
        names: Vec<String>,
    },
    /// Forget the paths satpep_sat remembers (each destination's rate and base RTT, kept five
    /// minutes so that new connections start at that rate): after a change of beam, terminal
    /// or link, new connections start cold again.
    Forget,
}

fn names_or_all(names: Vec<String>) -> Vec<String> {
    if names.is_empty() {
        BUNDLED.iter().map(|b| b.name.to_string()).collect()
    } else {
        names
    }
}

pub fn main(cmd: CcCmd) -> Result<(), String> {
    // A controller that loads without its state iterator says so as a warning.
    crate::logging::init(crate::logging::LogFormat::Auto);
    match cmd.sub {
        CcSub::List { json } => {
            let avail = satpep_cc::available();
            let pinned = satpep_cc::pinned();
            let bundled: Vec<serde_json::Value> = BUNDLED
                .iter()
                .map(|b| {
                    serde_json::json!({
                        "name": b.name,
                        "about": b.about,
                        "loaded": avail.iter().any(|a| a == b.name),
                        "pinned": pinned.iter().any(|p| p == b.name),
                    })
                })
                .collect();
            let kernel: Vec<&String> = avail
                .iter()
                .filter(|a| !BUNDLED.iter().any(|b| b.name == a.as_str()))
                .collect();
            if json {
                let v = serde_json::json!({ "kernel": kernel, "bundled": bundled });
                println!("{}", serde_json::to_string_pretty(&v).unwrap());
                return Ok(());
            }
            println!(
                "kernel: {}",
                kernel
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            println!("bundled (BPF):");
            for b in &bundled {
                let state = match (b["loaded"].as_bool(), b["pinned"].as_bool()) {
                    (Some(true), Some(true)) => "loaded, pinned",
                    (Some(true), _) => "loaded",
                    _ => "-",
                };
                println!(
                    "  {:<18} {:<15} {}",
                    b["name"].as_str().unwrap(),
                    state,
                    b["about"].as_str().unwrap()
                );
            }
            if let Err(e) = satpep_cc::check_support() {
                println!("note: {e}");
            }
            Ok(())
        }
        CcSub::Load {
            names,
            pin,
            rtt0,
            capacity,
        } => {
            let rtt0 =
                satpep_link::units::parse_duration_ns(&rtt0).map_err(|e| format!("--rtt0: {e}"))?;
            if !(1_000_000..=10_000_000_000).contains(&rtt0) {
                return Err("--rtt0: must be between 1 ms and 10 s".into());
            }
            let capacity_kbps = match capacity {
                Some(c) => {
                    let bps = satpep_link::units::parse_rate(&c)
                        .map_err(|e| format!("--capacity: {e}"))?;
                    if !(1e3..=4e12).contains(&bps) {
                        return Err("--capacity: must be between 1 kbit/s and 4 Tbit/s".into());
                    }
                    (bps / 1000.0).round() as u32
                }
                None => 0,
            };
            let opts = Options {
                rtt0_us: (rtt0 / 1000) as u32,
                capacity_kbps,
            };
            let mut loaded = Vec::new();
            for n in names_or_all(names) {
                // Pinned by another satpep build: this build's takes its place.
                if satpep_cc::refresh(&n, &opts)? == satpep_cc::Refresh::Replaced {
                    eprintln!("{n}: the pinned one was another satpep build's; replaced by this build's, pinned");
                    continue;
                }
                // Already registered (pinned by an earlier `load --pin`, or held by a running
                // proxy): the goal is met, so say so and go on with the rest.
                if satpep_cc::available().contains(&n) {
                    eprintln!("{n}: already registered, kept as it is");
                    continue;
                }
                let mut l = satpep_cc::load(&n, &opts)?;
                if pin {
                    let p = l.pin()?;
                    eprintln!("{n}: loaded, pinned at {}", p.display());
                } else {
                    eprintln!("{n}: loaded");
                }
                loaded.push(l);
            }
            if pin || loaded.is_empty() {
                return Ok(());
            }
            eprintln!("holding them; Ctrl-C unloads");
            let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for s in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(s, term.clone()).map_err(|e| e.to_string())?;
            }
            while !term.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            drop(loaded);
            eprintln!("unloaded");
            Ok(())
        }
        CcSub::Unload { names } => {
            let explicit = !names.is_empty();
            let mut any = false;
            for n in names_or_all(names) {
                if satpep_cc::unpin(&n)? {
                    eprintln!("{n}: unloaded");
                    any = true;
                } else if explicit {
                    return Err(format!("{n} is not pinned (satpep cc list)"));
                }
            }
            if !any {
                eprintln!("nothing pinned");
            }
            Ok(())
        }
        CcSub::Forget => {
            let n = satpep_cc::forget_paths()?;
            eprintln!("forgot {n} path(s)");
            Ok(())
        }
    }
}
