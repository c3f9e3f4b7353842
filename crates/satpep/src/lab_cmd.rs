//! `satpep lab`: build, use and remove testbeds, and run experiments on them.

use clap::{Args, Subcommand};
use satpep_lab::topology::{self, Lab, PepMode, UpOptions};
use satpep_link::cli::LinkArgs;
use std::os::unix::process::CommandExt;

/// Build testbeds of network namespaces and run experiments on them.
#[derive(Args, Debug)]
#[command(
    long_about = "Build testbeds of network namespaces and run experiments on them.

A testbed is five namespaces in a line, named sp-NAME-HOST:

  client --- terminal ===[ link ]=== gateway --- server
  198.18.1.2  .1.1 .2.1    emulator   .2.2 .3.1    198.18.3.2
  (IPv6: 2001:2:0:1::2 ... 2001:2:0:3::2)

The link namespace runs `satpep link` between terminal and gateway; forward is gateway -> \
terminal (downloads), return is terminal -> gateway. Several labs coexist; each keeps its state \
in /run/satpep/lab/NAME so `satpep lab down NAME` removes it even after a crash. Needs root."
)]
pub struct LabCmd {
    #[command(subcommand)]
    sub: LabSub,
}

#[derive(Subcommand, Debug)]
enum LabSub {
    /// Build a testbed and start its link emulator; it stays up until `lab down`.
    Up {
        /// Lab name (1-24 of a-z 0-9 - _).
        name: String,
        /// Print each host's namespace and addresses as JSON.
        #[arg(long)]
        json: bool,
        /// Skip the client-to-server ping check.
        #[arg(long)]
        no_check: bool,
        /// PEP mode: none (terminal and gateway are plain routers), split (satpep proxy on
        /// both, each sending over the satellite with its own congestion control), adaptive
        /// (split, the controller chosen per connection) or tunnel (the terminal carries every
        /// flow to the gateway in one encrypted QUIC connection).
        #[arg(long, value_name = "MODE", value_enum, default_value_t = PepMode::None)]
        pep: PepMode,
        /// Congestion control of the PEPs' satellite legs: a kernel one (cubic, bbr, reno),
        /// one of satpep's (satpep_hybla, satpep_tarang, …; loaded and pinned if needed), or
        /// `adaptive` (chosen per connection from the path's class). With --pep tunnel: the
        /// tunnel's controller (satellite, hybla, cubic, bbr, newreno; default satellite).
        #[arg(long, value_name = "CC", requires = "pep")]
        cc: Option<String>,
        /// With --pep split: run the proxy only in the terminal (the single-PEP setup of
        /// PEPsal); the gateway stays a plain router.
        #[arg(long)]
        terminal_only: bool,
        /// With --pep split: when the client's handshake completes. fast: at once (a refused
        /// server then resets the client); strict: only after the server's did.
        #[arg(long, value_name = "MODE", value_parser = ["fast", "strict"])]
        handshake: Option<String>,
        /// What the PEPs are told about the link. nothing (default): no rate and no RTT, as
        /// an operator who does not know them exactly would configure satpep; exact: the
        /// emulator's own rates and RTT (to reproduce a set-up that assumed them); or a
        /// nominal forward rate such as 25Mbit, as on a service plan (the return direction
        /// gets the emulator's return rate scaled the same way).
        #[arg(long, value_name = "WHAT", default_value = "nothing", requires = "pep")]
        tell_pep: String,
        /// Terminals sharing the link (1 to 240), a star: terminal K (2 to N) has its own
        /// client on 198.19.K.0/24 and 2001:2:0:1KK::/64 (K in hex; namespaces sp-NAME-clientK and sp-NAME-terminalK) and the
        /// address 198.18.2.(10+K) on the satellite segment, and runs its own proxy in the
        /// PEP mode given. All share the emulated carrier; a link file's [[forward.path]]
        /// entries give one terminal its own rate, loss or delay (docs/lab.md, "A star").
        #[arg(long, value_name = "N", default_value_t = 1)]
        terminals: u16,
        /// With --pep: a proxy configuration (proxy.toml's format) every proxy starts from;
        /// the lab then sets interception, the satellite side, the tunnel's peer and keys, and
        /// what --tell-pep says. The gateway's [tunnel.carrier] shares a star's carrier.
        #[arg(long, value_name = "FILE", requires = "pep")]
        proxy_config: Option<std::path::PathBuf>,
        #[command(flatten)]
        link: Box<LinkArgs>,
    },
    /// Remove a testbed: emulator, namespaces and state (also after a crash).
    Down {
        /// Lab name.
        name: String,
    },
    /// Run a command inside one host of a testbed.
    Exec {
        /// Lab name.
        name: String,
        /// client, terminal, link, gateway or server (a star's clientK, terminalK too).
        host: String,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// List testbeds.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the link emulator's counters of a testbed.
    Stats {
        /// Lab name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a scenario (a TOML file or a preset such as `demo`); `--list`
    /// names them.
    #[command(
        long_about = "Run a scenario (a TOML file or a preset such as `demo`): every experiment, the \
documents' and satpep's own benchmarks, is one.

A scenario builds one lab (namespaces named sp-sc-PID-HOST), runs each cell's traffic with real \
tools (iperf3, nginx, curl), saves every run as it ends and writes its report to the results \
directory: report.md, report.html (self-contained), CSV, JSON and plots. Ctrl-C stops the \
traffic and removes the lab; the same command later runs only what is missing. The file format \
and the presets are described in docs/scenarios.md. Needs root.

Examples:
  satpep lab run demo
  satpep lab run lawson2006 --quick
  satpep lab run my.toml --out results/my --only http --json"
    )]
    Run(satpep_lab::experiment::RunArgs),
    /// Compare two results directories of `lab run` (before and after a change, two seeds):
    /// each cell's figures side by side, the change, and whether the 95 % intervals overlap.
    #[command(
        long_about = "Compare two results directories of `satpep lab run` side by side: before and \
after a change, two seeds, two machines. Cells are matched by part, configuration and sweep \
point. For each, the main metric (goodput in Mbit/s, or seconds), the share of the physical \
limit, the queueing delay's p95 and the share beside a competing flow are shown in A and in B \
with the change (B against A) and whether their 95 % intervals overlap: if they do, the \
difference is not shown to be real. Cells found in only one are listed. Writes compare.md, \
compare.html, compare.json and one bar plot per part (A against B, intervals as error bars) \
into the output directory, and prints the table.

Example:
  satpep lab run demo --out before ; (change something) ; satpep lab run demo --out after
  satpep lab compare before after"
    )]
    Compare {
        /// The first results directory (A).
        a: std::path::PathBuf,
        /// The second results directory (B).
        b: std::path::PathBuf,
        /// Where the comparison goes [default: lab-results/compare-A-B, by the directories'
        /// names].
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
        /// Print compare.json on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// The fault matrix's crash server (internal): accepts one connection on PORT and sends
    /// a checked pattern until it is killed, never reading.
    #[command(hide = true)]
    FaultServer {
        /// TCP port to listen on (all addresses).
        #[arg(long)]
        port: u16,
        /// Seed of the pattern.
        #[arg(long, default_value_t = 2)]
        seed: u64,
    },
    /// One end of the lab's ESP tunnel (internal; `ipsec = true` in a scenario): creates TUN
    /// device TUN, prints "ready", then carries what the host routes into it to REMOTE as
    /// ESP (AES-256-GCM) and back, until killed.
    #[command(hide = true)]
    Esp {
        /// TUN device to create.
        #[arg(long)]
        tun: String,
        /// This host's IPv4 address.
        #[arg(long)]
        local: std::net::Ipv4Addr,
        /// The far end's IPv4 address.
        #[arg(long)]
        remote: std::net::Ipv4Addr,
        /// SPI of the packets this end sends (the far end sends SPI xor 1).
        #[arg(long)]
        spi: u32,
        /// 72 hex digits: a 32-byte key and a 4-byte salt, the same at both ends.
        #[arg(long)]
        key: String,
    },
    /// The hub's bulk sender (internal): sends to every connection on PORT whose client
    /// sent its start byte, until the client goes; ends when stdin closes.
    #[command(hide = true)]
    FlowsServer {
        /// TCP port to listen on (all addresses).
        #[arg(long)]
        port: u16,
    },
    /// The load benchmark's server half (internal): accepts up to COUNT connections on PORT
    /// and runs the commands read from stdin (accepted, echo, busy, close).
    #[command(hide = true)]
    LoadServer {
        /// TCP port to listen on (all addresses).
        #[arg(long)]
        port: u16,
        /// Connections to accept.
        #[arg(long)]
        count: usize,
    },
    /// The load benchmark's client half (internal): opens COUNT connections to ADDR on
    /// THREADS threads and runs the commands read from stdin (connect, send, echoed, busy,
    /// close).
    #[command(hide = true)]
    LoadClient {
        /// Server address and port.
        #[arg(long)]
        addr: std::net::SocketAddr,
        /// Connections to open.
        #[arg(long)]
        count: usize,
        /// Threads that open them.
        #[arg(long, default_value_t = 32)]
        threads: usize,
    },
}

pub fn main(cmd: LabCmd) -> Result<(), String> {
    match cmd.sub {
        LabSub::Up {
            name,
            json,
            no_check,
            pep,
            cc,
            terminal_only,
            handshake,
            tell_pep,
            terminals,
            proxy_config,
            link,
        } => {
            let spec = link.spec()?;
            let cfg = spec.resolve()?;
            let told = satpep_lab::topology::Told::parse(&tell_pep, || Ok(cfg.clone()))
                .map_err(|e| format!("--tell-pep: {e}"))?;
            let mut pep = pep
                .pep(cc, terminal_only, handshake, None, told)
                .map_err(|e| format!("--{}: {}", e.key.replace('_', "-"), e.why))?;
            if let (Some(path), Some(pep)) = (&proxy_config, pep.as_mut()) {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--proxy-config {}: {e}", path.display()))?;
                pep.file = satpep_proxy::config::ProxyFile::parse(&text)
                    .map_err(|e| format!("--proxy-config {}: {e}", path.display()))?;
            }
            let opts = UpOptions {
                check: !no_check,
                pep,
                terminals,
                ..Default::default()
            };
            let lab = Lab::up(&name, &spec, &opts)?;
            let nodes = lab.state().nodes();
            if json {
                println!("{}", serde_json::to_string_pretty(&nodes).unwrap());
            } else {
                println!("lab '{name}' is up");
                for h in &nodes {
                    let mut addrs = h.ipv4.clone();
                    addrs.extend(h.ipv6.iter().cloned());
                    println!("  {:<11} {:<26} {}", h.host, h.netns, addrs.join(" "));
                }
                println!(
                    "  forward: {}\n  return:  {}",
                    cfg.forward.describe(),
                    cfg.ret.describe()
                );
                println!(
                    "try: satpep lab exec {name} client -- ping -c 3 {}",
                    topology::SERVER_V4
                );
            }
            lab.detach();
            Ok(())
        }
        LabSub::Down { name } => {
            let removed = topology::teardown(&name)?;
            if removed.is_empty() {
                eprintln!("lab '{name}': nothing to remove");
            } else {
                eprintln!("lab '{name}' removed ({} namespaces)", removed.len());
            }
            Ok(())
        }
        LabSub::Exec { name, host, cmd } => {
            // A name no lab has is named before the lab is looked for.
            topology::parse_node(&host, topology::MAX_TERMINALS)?;
            let lab = Lab::open(&name)?;
            let node = topology::parse_node(&host, lab.state().terminals)?;
            let mut c = satpep_lab::sys::in_ns(&lab.node_ns(&node), &cmd[0]);
            c.args(&cmd[1..]);
            // Replace this process so exit status and signals pass straight through.
            Err(format!("cannot run {}: {}", cmd[0], c.exec()))
        }
        LabSub::List { json } => {
            let labs = topology::list();
            if json {
                println!("{}", serde_json::to_string(&labs).unwrap());
            } else {
                for l in labs {
                    println!("{l}");
                }
            }
            Ok(())
        }
        LabSub::Stats { name, json } => {
            let s = Lab::open(&name)?.link_stats()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap());
            } else {
                print!("{}", s.table());
            }
            Ok(())
        }
        LabSub::Run(args) => satpep_lab::experiment::run(args),
        LabSub::Compare { a, b, out, json } => {
            let base = |p: &std::path::Path| {
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "results".into())
            };
            let out = out.unwrap_or_else(|| {
                std::path::PathBuf::from("lab-results").join(format!(
                    "compare-{}-{}",
                    base(&a),
                    base(&b)
                ))
            });
            let md = satpep_lab::scenario::compare::compare(&a, &b, &out)?;
            if json {
                let j =
                    std::fs::read_to_string(out.join("compare.json")).map_err(|e| e.to_string())?;
                println!("{j}");
            } else {
                println!("{md}");
                eprintln!(
                    "comparison: {}/compare.html (and compare.md, compare.json, plots)",
                    out.display()
                );
            }
            Ok(())
        }
        LabSub::FaultServer { port, seed } => {
            satpep_lab::scenario::kinds::fault::fault_server(port, seed)
        }
        LabSub::Esp {
            tun,
            local,
            remote,
            spi,
            key,
        } => satpep_lab::esp::run(&satpep_lab::esp::EspEnd {
            tun,
            local,
            remote,
            spi_out: spi,
            keymat: satpep_lab::esp::parse_keymat(&key)?,
        }),
        LabSub::FlowsServer { port } => satpep_lab::flows::serve(port),
        LabSub::LoadServer { port, count } => {
            satpep_lab::scenario::kinds::connections::load_server(port, count)
        }
        LabSub::LoadClient {
            addr,
            count,
            threads,
        } => satpep_lab::scenario::kinds::connections::load_client(addr, count, threads),
    }
}
