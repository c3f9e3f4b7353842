//! `satpep lab run`: scenarios, a TOML file or a built-in preset such as `demo`, all run by
//! the one engine, [`crate::scenario`].

use crate::scenario::{self, presets, RunOptions, Scenario};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `satpep lab run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// A scenario file (FILE.toml) or a preset (demo, field, corpus, tunnel, cc-sweep, relay-overhead,
    /// throughput, link-accuracy, load, faults, lawson2006, bharadwaj1999, urke2011, shao2002,
    /// vanzara2017; `--list` describes them).
    #[arg(required_unless_present = "list")]
    pub experiment: Option<String>,
    /// List the presets and exit.
    #[arg(long)]
    pub list: bool,
    /// Seconds per transfer (scenarios: replaces every cell's duration).
    #[arg(long, value_name = "S")]
    pub duration: Option<u32>,
    /// Seed of every cell's loss and jitter processes (replaces the scenario's `seed`;
    /// repetition k uses S + k), and of a corpus's drawn links: a new seed draws new links.
    /// Results go to their own directory (NAME-seedS) unless --out says otherwise.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Runs per cell (replaces the scenario's `repetitions`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repetitions: Option<u32>,
    /// Shorter, smaller version (the scenario's [quick] settings).
    #[arg(long)]
    pub quick: bool,
    /// Print results as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Run only this part of a scenario made of parts (a part's name, such as tunnel's sweep,
    /// t1, fetch, overhead or outage, or faults' ends, outage, proxies or tunnel-peer).
    #[arg(long, value_name = "PART")]
    pub only: Option<String>,
    /// Run only these drawn links (a corpus's link names, as its report lists them: L05 or
    /// L05,L10), with the same --seed and --quick as the run that drew them: judge a
    /// controller change on the links it is about, with --repetitions.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub link: Vec<String>,
    /// Run only these configurations (names as the report's columns give them, e.g.
    /// "split" or "split,tunnel"): compare one configuration across builds without
    /// rerunning the others. Results of a reduced run go to their own directory.
    #[arg(long = "config", value_name = "NAMES", value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Results directory of a scenario [default: lab-results/NAME, or NAME-quick]. A
    /// directory holding part of the same scenario's runs is resumed.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Discard earlier results in the results directory instead of resuming.
    #[arg(long)]
    pub fresh: bool,
}

/// Runs the experiment `args.experiment`.
pub fn run(args: RunArgs) -> Result<(), String> {
    if args.list {
        println!("presets (scenarios; --quick for a short version):");
        for (name, what, _) in presets::PRESETS {
            println!("  {name:<15} {what}");
        }
        return Ok(());
    }
    let what = args.experiment.clone().unwrap_or_default();
    let source = if let Some(t) = presets::get(&what) {
        t.to_string()
    } else if what.ends_with(".toml") || std::path::Path::new(&what).is_file() {
        std::fs::read_to_string(&what).map_err(|e| format!("{what}: {e}"))?
    } else {
        return Err(format!(
            "'{what}' is neither a scenario file (.toml) nor a preset ({})",
            presets::names().join(", ")
        ));
    };
    // Check a scenario before asking for root, so a bad file is reported as such.
    let mut over = toml::Table::new();
    if let Some(d) = args.duration {
        over.insert("duration".into(), toml::Value::String(format!("{d}s")));
    }
    if let Some(seed) = args.seed {
        let s = i64::try_from(seed).map_err(|_| format!("--seed {seed}: at most {}", i64::MAX))?;
        over.insert("seed".into(), toml::Value::Integer(s));
    }
    if let Some(n) = args.repetitions {
        over.insert("repetitions".into(), toml::Value::Integer(n.into()));
    }
    let mut sc =
        Scenario::parse_with(&source, args.quick, &over).map_err(|e| format!("{what}: {e}"))?;
    if let Some(only) = &args.only {
        sc = sc.only(only)?;
    }
    if !args.link.is_empty() {
        sc = sc.only_links(&args.link)?;
    }
    if !args.configs.is_empty() {
        sc = sc.only_configs(&args.configs)?;
    }
    crate::sys::require_root()?;
    crate::catch_interrupts();
    let out = args.out.clone().unwrap_or_else(|| {
        let mut dir = sc.name.clone();
        if args.quick {
            dir.push_str("-quick");
        }
        if let Some(seed) = args.seed {
            dir.push_str(&format!("-seed{seed}"));
        }
        PathBuf::from("lab-results").join(dir)
    });
    let md = scenario::run(
        &sc,
        &RunOptions {
            out: out.clone(),
            fresh: args.fresh,
            quiet: false,
            source,
        },
    )?;
    if args.json {
        let j = std::fs::read_to_string(out.join("results.json")).map_err(|e| e.to_string())?;
        println!("{j}");
    } else {
        println!("\n{md}");
        eprintln!(
            "report: {}/report.html (and report.md, CSV, JSON, plots)",
            out.display()
        );
    }
    Ok(())
}
