//! `satpep proxy`: run the transparent split-TCP proxy.

use clap::Args;
use satpep_proxy::config::ProxyFile;
use std::path::PathBuf;

/// Split TCP connections crossing this host (transparent PEP).
#[derive(Args, Debug)]
#[command(
    long_about = "Split TCP connections crossing this host (RFC 3135 split-TCP PEP).

Installs an nftables table (inet satpep) that diverts selected TCP connections to a \
transparent listener with TPROXY, plus a fwmark policy rule and local route per address family. \
Each connection is answered locally and a second connection is opened to the real server from \
the client's own address (IP_TRANSPARENT), so neither end is changed and the server sees the \
client. Each leg gets its own congestion control and buffers from the config. Everything \
installed is removed on exit, and first thing at the next start after a crash \
(or with --cleanup).

With proxy.handshake = \"fast\" (default) the client is answered at once, and a refused or \
unreachable server shows to the client as a connection that is accepted and then reset. With \
\"strict\" the client's SYN is held (NFQUEUE, via iptables) until the server has answered, so \
the client sees the server's own answer: accepted, refused or unreachable.

Distributed mode (a [tunnel] section): two satpeps, a terminal and a gateway, carry every intercepted flow across the satellite hop as one stream of a single QUIC connection, authenticated both ways with certificates from `satpep keygen` and encrypted, with a congestion control for the hop (tunnel.congestion: satellite, hybla, cubic, bbr, newreno). The terminal intercepts as above; the gateway connects to the servers from the clients' addresses. Both handshake modes apply (strict: the client's SYN is held until the server behind the gateway has answered). See docs/tunnel.md.

Example: satpep proxy --config /etc/satpep/proxy.toml    (see docs/proxy.md)"
)]
pub struct ProxyCmd {
    /// Configuration file (TOML; every key optional). Default: /etc/satpep/proxy.toml when it
    /// exists (the package installs one), else the built-in defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Check everything a start would refuse or quietly degrade, without intercepting
    /// anything: the configuration, congestion controls (satpep's own are loaded and unloaded
    /// again), the tunnel's certificate and key (readable, the key matching), the nftables
    /// ruleset (`nft --check`), Fast Open, the descriptor budget and forwarding. Prints the
    /// ruleset on stdout and each finding on stderr; exits non-zero on any error.
    #[arg(long)]
    check: bool,
    /// With --check: one JSON object on stdout instead (passed, errors, warnings, findings
    /// with severity and message, the ruleset), for scripts and configuration management.
    /// The exit status is the same.
    #[arg(long, requires = "check")]
    json: bool,
    /// Remove anything a previous run left installed, and exit.
    #[arg(long)]
    cleanup: bool,
    /// Log lines on stderr: text, journal (syslog priority prefixes, no time: what the
    /// systemd journal ranks), json (one object per line), or auto (journal when stderr is
    /// the journal, else text). RUST_LOG filters them (default info; each connection's
    /// lines are at debug under the target satpep::connection, and proxy.log_summary sums
    /// them up at info).
    #[arg(long, value_enum, value_name = "FORMAT", default_value = "auto")]
    log_format: crate::logging::LogFormat,
    /// Run as worker N of a proxy with proxy.workers > 1 (the proxy starts its workers
    /// itself).
    #[arg(long, hide = true, value_name = "N", requires = "worker_shared")]
    worker: Option<usize>,
    /// The leader's shared page, for a worker.
    #[arg(long, hide = true, value_name = "PATH", requires = "worker")]
    worker_shared: Option<PathBuf>,
}

/// Reads and validates the configuration (the defaults without a file).
fn load(path: Option<&std::path::Path>) -> Result<satpep_proxy::config::ProxyConfig, String> {
    let text = match path {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?
        }
        None => String::new(),
    };
    let name = path
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "defaults".into());
    ProxyFile::parse(&text)
        .and_then(|f| f.resolve())
        .map_err(|e| format!("{name}: {e}"))
}

/// Where the package puts the configuration; read when `--config` is not given.
const DEFAULT_CONFIG: &str = "/etc/satpep/proxy.toml";

pub fn main(mut cmd: ProxyCmd) -> Result<(), String> {
    if cmd.config.is_none() {
        let p = PathBuf::from(DEFAULT_CONFIG);
        cmd.config = p.exists().then_some(p);
    }
    let cfg = load(cmd.config.as_deref())?;
    if cmd.check {
        return check(&cfg, cmd.json);
    }
    if cmd.cleanup {
        let found = satpep_proxy::netfilter::cleanup(cfg.mark, cfg.table);
        if found.is_empty() {
            eprintln!("nothing to clean up");
        }
        for f in found {
            eprintln!("removed {f}");
        }
        return Ok(());
    }
    crate::logging::init(cmd.log_format);
    let process = match (cmd.worker, &cmd.worker_shared) {
        (Some(index), Some(shared)) => satpep_proxy::workers::Process::Worker {
            index,
            shared: shared.clone(),
        },
        _ if cfg.workers > 1 => satpep_proxy::workers::Process::Leader {
            command: worker_command(&cmd)?,
        },
        _ => satpep_proxy::workers::Process::Alone,
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    // Workers share the host's cores with each other and their leader: one runtime thread
    // each (the kernel does most of a split connection's work anyway).
    if matches!(process, satpep_proxy::workers::Process::Worker { .. }) {
        rt.worker_threads(1);
    }
    let rt = rt.enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        // SIGHUP re-reads the configuration; the proxy applies what is safe (lifecycle.rs).
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
        let path = cmd.config.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                if tx.send(load(path.as_deref())).is_err() {
                    break;
                }
            }
        });
        // SIGTERM and SIGINT stop the proxy: the first drains (proxy.drain), the second
        // does not wait.
        let (stop_tx, stop_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| format!("cannot handle SIGINT: {e}"))?;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                if stop_tx.send(()).is_err() {
                    break;
                }
            }
        });
        // A worker's log lines say which worker wrote them.
        let worker = match &process {
            satpep_proxy::workers::Process::Worker { index, .. } => Some(*index),
            _ => None,
        };
        let run = satpep_proxy::server::run(cfg, stop_rx, rx, process);
        match worker {
            Some(n) => {
                use tracing::Instrument;
                run.instrument(tracing::info_span!("worker", n)).await
            }
            None => run.await,
        }
        .map(|_| ())
    })
}

/// How the leader starts a worker: this program, with the same configuration file and log
/// format (the worker's index and the shared page are added).
fn worker_command(cmd: &ProxyCmd) -> Result<Vec<std::ffi::OsString>, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("proxy.workers: cannot find this program to start workers: {e}"))?;
    let mut c = vec![exe.into_os_string(), "proxy".into()];
    if let Some(p) = &cmd.config {
        // Absolute: a reload in the worker reads it again.
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        c.extend(["--config".into(), p.into_os_string()]);
    }
    let fmt = clap::ValueEnum::to_possible_value(&cmd.log_format)
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| "auto".into());
    c.extend(["--log-format".into(), fmt.into()]);
    Ok(c)
}

/// `--check`: the ruleset on stdout, findings on stderr (or all of it as one JSON object on
/// stdout), an error if any finding is one.
fn check(cfg: &satpep_proxy::config::ProxyConfig, json: bool) -> Result<(), String> {
    use satpep_proxy::preflight::{preflight, Severity};
    let ruleset = satpep_proxy::netfilter::ruleset(cfg);
    let found = preflight(cfg);
    let errors = found
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    if json {
        let out = serde_json::json!({
            "passed": errors == 0,
            "errors": errors,
            "warnings": found.len() - errors,
            "findings": found,
            "ruleset": ruleset,
        });
        println!("{out:#}");
    } else {
        print!("{ruleset}");
        for f in &found {
            let level = match f.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            eprintln!("{level}: {}", f.message);
        }
    }
    if errors > 0 {
        return Err(format!(
            "the check found {errors} error(s); satpep proxy would not start"
        ));
    }
    if !json {
        eprintln!("check passed ({} warning(s))", found.len() - errors);
    }
    Ok(())
}
