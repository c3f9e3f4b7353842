//! The proxy's main loop: listen, install interception, accept and split connections, and
//! remove interception on exit.

use crate::config::{Leg, ProxyConfig, Role, TunnelConfig};
use crate::netfilter;
use crate::registry::{Counters, Registry};
use crate::relay::{relay, End};
use crate::sockets::{canonical, fastopen_connect, listener, reset_on_close, tune, upstream};
use crate::tunnel::Terminal;
use crate::workers::{Process, Publisher, Workers};
use socket2::SockRef;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// How long a Fast Open leg waits for the client's first bytes before connecting without them.
const FASTOPEN_WAIT: Duration = Duration::from_millis(5);

/// How long an upstream connection attempt may take before the client is reset.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The satellite leg's controller when the default ([`satpep_cc::SPLIT_DEFAULT`]) cannot
/// load: the kernel's `bbr`, never slower than end-to-end TCP on the field benchmark, where
/// the kernel's usual default, cubic, collapses at the first random losses of a long link;
/// without it the kernel's default stays, with a warning.
pub const FALLBACK_SATELLITE_CONGESTION: &str = "bbr";

/// Selects `cc` on a throwaway socket: whether this kernel has it (a kernel controller not
/// loaded yet, such as bbr, is loaded by selecting it once).
pub(crate) fn try_congestion(cc: &str) -> std::io::Result<()> {
    let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    crate::sockets::set_congestion(probe.as_raw_fd(), cc)
}

fn default_satellite_congestion(cfg: &mut ProxyConfig) -> Option<satpep_cc::Loaded> {
    // With adaptive selection this is the controller a connection starts on. With a
    // tunnel no TCP connection crosses the satellite.
    if cfg.satellite.congestion.is_some() || cfg.tunnel.is_some() {
        return None;
    }
    // Adaptive selection starts connections on bbr, as its classifier was built and tested
    // with: satpep_sat's start keeps a queue of up to its budget, and losses met with a
    // queue are not read as the link's, so a lossy path was classified clean.
    if cfg.adaptive.is_some() {
        fallback_satellite_congestion(cfg, "adaptive selection starts connections on it");
        return None;
    }
    let cc = satpep_cc::SPLIT_DEFAULT;
    // Pinned, so that it outlives this process: another proxy on this host (a lab's terminal
    // and gateway share one kernel) may select it after this one exits or crashes. Held by
    // this process only if bpffs is unavailable.
    let loaded = satpep_cc::load(cc, &satpep_cc::Options::default()).map(|mut l| match l.pin() {
        Ok(_) => None,
        Err(e) => {
            warn!("satellite leg: {cc} stays registered only while this proxy runs: {e}");
            Some(l)
        }
    });
    // load refuses a name already registered (satpep cc load --pin, another satpep on this
    // host, or one starting beside this one): then it is there to use.
    let loaded = loaded.or_else(|e| {
        if satpep_cc::available().iter().any(|a| a == cc) {
            Ok(None)
        } else {
            Err(e)
        }
    });
    match loaded {
        Ok(l) => {
            info!(congestion = %cc, "satellite leg: no controller configured, using the default");
            cfg.satellite.congestion = Some(cc.into());
            return l;
        }
        Err(e) => warn!("satellite leg: the default controller '{cc}' cannot load ({e})"),
    }
    fallback_satellite_congestion(cfg, "the default cannot load");
    None
}

/// Selects [`FALLBACK_SATELLITE_CONGESTION`] for the satellite leg (`why`, for the log), if
/// this kernel has it.
fn fallback_satellite_congestion(cfg: &mut ProxyConfig, why: &str) {
    let cc = FALLBACK_SATELLITE_CONGESTION;
    match try_congestion(cc) {
        Ok(()) => {
            info!(congestion = %cc, "satellite leg: {why}");
            cfg.satellite.congestion = Some(cc.into());
        }
        Err(e) => warn!(
            "satellite leg: the fallback controller '{cc}' is not available either ({e}); the kernel's default is used"
        ),
    }
}

/// Runs the proxy until it is told to stop: a message on `stop` (a SIGTERM or SIGINT) starts
/// the drain (`proxy.drain`: new connections bypass, live ones may finish), a second one or
/// a closed channel ends it at once. Interception is removed on every exit path.
/// `process` says whether it is the only process, the leader of worker processes
/// (`proxy.workers`, which it starts) or one of them.
pub async fn run(
    cfg: ProxyConfig,
    stop: tokio::sync::mpsc::UnboundedReceiver<()>,
    reload: tokio::sync::mpsc::UnboundedReceiver<crate::lifecycle::Reload>,
    process: Process,
) -> Result<Arc<Registry>, String> {
    let mut cfg = cfg;
    // satpep's own congestion controls stay loaded while the proxy runs (sockets still using
    // them keep them registered until they close). A worker uses what its leader loaded:
    // it does not replace the pinned ones under the leader's connections.
    let bundled = check_and_load(&mut cfg, !matches!(process, Process::Worker { .. }))?;
    let r = match cfg.tunnel.clone().filter(|t| t.role == Role::Gateway) {
        Some(t) => {
            // Toward the servers is the terrestrial leg, whatever satellite_side says.
            let server_leg = cfg.terrestrial.clone();
            gateway(cfg, t, server_leg, stop, reload).await
        }
        None => intercept(cfg, stop, reload, process).await,
    };
    drop(bundled);
    r
}

/// The legs toward the clients (down) and toward the servers (up).
fn legs_of(cfg: &ProxyConfig) -> (Leg, Leg) {
    if cfg.satellite_upstream {
        (cfg.terrestrial.clone(), cfg.satellite.clone())
    } else {
        (cfg.satellite.clone(), cfg.terrestrial.clone())
    }
}

/// Replaces the pinned congestion controls of another satpep build that this configuration
/// uses by this build's, so that an upgraded proxy runs its own (a name already registered
/// is used as it is). Controllers it does not use are left as they are: an operator may have
/// pinned them with options of their own.
fn refresh_pinned(cfg: &ProxyConfig) {
    for name in bundled_in_use(cfg) {
        match satpep_cc::refresh(name, &satpep_cc::Options::default()) {
            Ok(satpep_cc::Refresh::Replaced) => warn!(
                congestion = name,
                "replaced the pinned controller of another satpep build by this build's \
                 (load options back to their defaults: satpep cc load --pin sets them)"
            ),
            Ok(_) => {}
            Err(e) => {
                warn!(congestion = name, error = %e, "pinned controller of another build kept")
            }
        }
    }
}

/// satpep's own controllers this configuration may select: the legs', the adaptive
/// policy's, and the split default when the satellite leg names none.
fn bundled_in_use(cfg: &ProxyConfig) -> Vec<&'static str> {
    let mut used: Vec<String> = crate::preflight::wanted_congestion(cfg)
        .into_iter()
        .map(|(cc, _)| cc)
        .collect();
    if cfg.satellite.congestion.is_none() && cfg.tunnel.is_none() {
        used.push(satpep_cc::SPLIT_DEFAULT.into());
    }
    satpep_cc::BUNDLED
        .iter()
        .map(|b| b.name)
        .filter(|n| used.iter().any(|u| u == n))
        .collect()
}

/// What can fail before anything is installed: what [`crate::preflight::start_refusals`]
/// names (Fast Open, interfaces, strict handshakes' iptables), the congestion controls the
/// configuration names (satpep's own are loaded here, for as long as the returned handles
/// live, unless something else such as `satpep cc load --pin` already registered them) and
/// the adaptive policy's. Each error names the config key that asked.
fn check_and_load(cfg: &mut ProxyConfig, refresh: bool) -> Result<Vec<satpep_cc::Loaded>, String> {
    if refresh {
        refresh_pinned(cfg);
    }
    let default_cc = default_satellite_congestion(cfg);
    let refused = crate::preflight::start_refusals(cfg);
    if !refused.is_empty() {
        return Err(refused.join("; "));
    }
    let mut bundled: Vec<satpep_cc::Loaded> = default_cc.into_iter().collect();
    for (cc, key) in crate::preflight::wanted_congestion(cfg) {
        let ours = satpep_cc::BUNDLED.iter().any(|b| b.name == cc);
        let loaded = bundled.iter().any(|l| l.name == cc);
        if ours && !loaded && !satpep_cc::available().contains(&cc) {
            let l = satpep_cc::load(&cc, &satpep_cc::Options::default())
                .map_err(|e| format!("{key}: {e}"))?;
            info!(congestion = %cc, "loaded");
            bundled.push(l);
        }
    }
    if let Some(a) = &cfg.adaptive {
        let avail = satpep_cc::available();
        let usable = |cc: &str| avail.iter().any(|x| x == cc) || try_congestion(cc).is_ok();
        if let Some((class, cc)) = a
            .policy
            .iter()
            .find(|(_, cc)| !cc.is_empty() && !usable(cc))
        {
            return Err(format!(
                "adaptive.policy.{}: congestion control '{cc}' is not available ({})",
                class.name(),
                avail.join(" ")
            ));
        }
    }
    if cfg.flow.drop && cfg.tunnel.is_none() {
        crate::flow_control::load_filter(cfg.max_connections)?;
    }
    for leg in [&cfg.satellite, &cfg.terrestrial] {
        let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .map_err(|e| e.to_string())?;
        tune(SockRef::from(&probe), leg).map_err(|e| e.to_string())?;
    }
    Ok(bundled)
}

/// Split mode, or a tunnel's terminal: intercepts clients until `stop`, then removes the
/// interception.
async fn intercept(
    cfg: ProxyConfig,
    stop: tokio::sync::mpsc::UnboundedReceiver<()>,
    reload: tokio::sync::mpsc::UnboundedReceiver<crate::lifecycle::Reload>,
    process: Process,
) -> Result<Arc<Registry>, String> {
    let (down_leg, up_leg) = legs_of(&cfg);
    let budget = descriptor_budget(&cfg);
    let worker = match &process {
        Process::Worker { index, shared } => Some(Arc::new(Publisher::open(*index, shared)?)),
        _ => None,
    };
    if worker.is_none() {
        for w in crate::preflight::host_shortfall(&cfg) {
            warn!("{w}");
        }
    }
    let registry = Arc::new(Registry::new(match cfg.tunnel {
        Some(_) => crate::registry::Mode::Terminal,
        None => crate::registry::Mode::Split,
    }));
    let terminal = match &cfg.tunnel {
        Some(t) => {
            let term = Terminal::start(t, registry.clone())?;
            let warm = term.clone();
            tokio::spawn(async move { warm.warm().await });
            Some(term)
        }
        None => None,
    };
    // With workers the leader accepts nothing itself: at 100 000 connections it took a
    // third of its part while each worker took all of its own, and the clients the kernel
    // queued for it were the ones that failed (docs/reliability.md).
    let leads = matches!(process, Process::Leader { .. }) && cfg.workers > 1;
    let listener = if leads {
        None
    } else {
        let l = listener(cfg.port, &down_leg, cfg.workers > 1).map_err(|e| {
            format!(
                "cannot listen on port {} (IP_TRANSPARENT needs root): {e}",
                cfg.port
            )
        })?;
        Some(tokio::net::TcpListener::from_std(l).map_err(|e| e.to_string())?)
    };
    // The leader serves /metrics and /connections for all.
    let control = if worker.is_none() {
        start_control(&cfg, &registry).await?
    } else {
        Vec::new()
    };
    // The legs new connections get; a reload replaces them (lifecycle::keep).
    let (legs_tx, legs) = tokio::sync::watch::channel((Arc::new(down_leg), Arc::new(up_leg)));
    // The queue is read before the rules that fill it exist.
    let holder = if cfg.strict {
        Some(crate::hold::start(
            cfg.queue,
            cfg.mark,
            match &terminal {
                Some(t) => crate::hold::Upstream::Tunnel(t.clone()),
                None => crate::hold::Upstream::Tcp(legs.clone()),
            },
            CONNECT_TIMEOUT,
            registry.clone(),
            tokio::runtime::Handle::current(),
        )?)
    } else {
        None
    };
    // Workers listen before the rules divert anything to the port.
    let workers = match &process {
        Process::Leader { command } if cfg.workers > 1 => {
            let w = Workers::start(cfg.workers, command).await?;
            let _ = registry.workers.set(w.shared.clone());
            Some(Arc::new(tokio::sync::Mutex::new(w)))
        }
        _ => None,
    };
    let watchdog = if worker.is_none() {
        install_interception(&cfg, holder.as_deref())?;
        crate::notify::ready("intercepting");
        crate::notify::watchdog()
    } else {
        drop_privileges()?;
        None
    };
    let k = &registry.counters;
    // A leader of workers holds none itself: the limit is theirs.
    k.max_connections
        .store(if leads { 0 } else { budget.connections }, Relaxed);
    k.memory_limit.store(cfg.max_memory, Relaxed);
    let admission = Arc::new(Admission {
        memory: AtomicU64::new(0),
        bypassing: std::sync::Mutex::new(None),
        stopping: std::sync::atomic::AtomicBool::new(false),
        link: match (&worker, registry.workers.get()) {
            (Some(p), _) => Link::Worker(p.clone()),
            (None, Some(s)) => Link::Leader(s.clone()),
            (None, None) => Link::Alone,
        },
    });
    let sampler = sample_memory(admission.clone(), registry.clone());
    // Between the processes of one proxy: a worker publishes its figures, the leader reads
    // them and reaps workers that died.
    let linker = (worker.is_some() || workers.is_some())
        .then(|| link_processes(admission.clone(), registry.clone(), workers.clone()));
    if let Some(p) = &worker {
        p.slot().limit.store(budget.connections, Relaxed);
        // Listening, privileges dropped: the leader may go on.
        p.slot().pid.store(u64::from(std::process::id()), Relaxed);
    }
    // The leader passes its signals on: a stop (each one: the second resets at once) and a
    // reload, which each worker applies from the file itself.
    let (stop, forwarding) = match &workers {
        Some(ws) => {
            let (s, f) = forward_signals(stop, ws.clone())?;
            (s, Some(f))
        }
        None => (stop, None),
    };
    // A split gateway shares its carrier when configured to (a reload may start or stop it).
    let (carrier_tx, sharing) = if cfg.tunnel.is_none() && !cfg.satellite_upstream {
        if cfg.carrier.is_some() {
            crate::share::check_kernel();
            info!("split gateway shares one carrier among its terminals");
        }
        let (tx, rx) = tokio::sync::watch::channel(cfg.carrier.clone());
        (Some(tx), Some(crate::share::spawn(registry.clone(), rx)))
    } else {
        (None, None)
    };
    let keeper = tokio::spawn(crate::lifecycle::keep(
        cfg.clone(),
        registry.clone(),
        reload,
        crate::lifecycle::Reloadable {
            legs: Some(legs_tx),
            admission: None,
            carrier: None,
            split_carrier: carrier_tx,
            rules: worker.is_none(),
        },
    ));
    let cfg = Arc::new(cfg);
    let adaptive = cfg
        .adaptive
        .clone()
        .map(|a| tokio::spawn(crate::adaptive::run(a, registry.clone())));
    let idle = sweep_idle(registry.clone(), cfg.idle_timeout);
    let summaries = log_summaries(registry.clone(), cfg.log_summary);
    // Clients whose SYN was diverted before the bypass are still accepted while draining.
    let shutdown = {
        let (adm, reg) = (admission.clone(), registry.clone());
        let (reg2, ws) = (registry.clone(), registry.workers.get().cloned());
        let live = move || {
            reg2.counters.active.load(Relaxed) + ws.as_ref().map_or(0, |s| s.totals().active)
        };
        stopped(stop, cfg.drain, live, move || {
            adm.stopping.store(true, Relaxed);
            adm.update(&reg.counters);
        })
    };
    let accepting = Accepting {
        cfg: cfg.clone(),
        registry: registry.clone(),
        admission,
        holder: holder.clone(),
        terminal: terminal.clone(),
    };
    accepting.until(shutdown, listener, legs).await;
    // Live connections end with a reset on both legs, not a FIN that would let a cut
    // transfer look complete: their sockets are armed (sockets::arm) until a clean end, so
    // they reset when the process exits.
    let live = registry.live().len();
    if live > 0 {
        warn!(live, "stopping: resetting live connections");
    }
    // The rules stay until every worker has drained and exited: its live connections need
    // them.
    if let Some(ws) = &workers {
        Workers::wait(ws).await;
    }
    for t in linker.into_iter().chain(forwarding) {
        t.abort();
    }
    sampler.abort();
    keeper.abort();
    if let Some(s) = sharing {
        s.abort();
    }
    if let Some(w) = watchdog {
        w.abort();
    }
    idle.abort();
    if let Some(s) = summaries {
        s.abort();
    }
    if let Some(a) = adaptive {
        a.abort();
    }
    if let Some(h) = &holder {
        h.stop();
    }
    if let Some(t) = &terminal {
        t.close().await;
    }
    if worker.is_some() {
        // The leader's rules: it removes them.
        for c in control {
            c.abort();
        }
        return Ok(registry);
    }
    netfilter::cleanup(cfg.mark, cfg.table);
    for c in control {
        c.abort();
    }
    info!("interception removed");
    Ok(registry)
}

/// The descriptor budget: a split connection holds two sockets here, a tunnel flow one. Past
/// what fits, new connections bypass (as at proxy.max_connections) instead of failing to be
/// accepted.
fn descriptor_budget(cfg: &ProxyConfig) -> crate::sockets::FdBudget {
    let budget = crate::preflight::fd_budget(cfg);
    crate::relay::set_pipe_budget(budget.pipes);
    let short = crate::preflight::budget_shortfall(cfg, &budget);
    for w in &short {
        warn!(limit = budget.limit, "{w}");
    }
    if short.is_empty() {
        tracing::debug!(
            limit = budget.limit,
            pipes = budget.pipes,
            "descriptor budget"
        );
    }
    budget
}

/// Installs the nftables rules and drops privileges; on failure nothing stays installed.
fn install_interception(
    cfg: &ProxyConfig,
    holder: Option<&crate::hold::Holder>,
) -> Result<(), String> {
    if let Err(e) = netfilter::install(cfg) {
        if let Some(h) = holder {
            h.stop();
        }
        return Err(e);
    }
    info!(
        port = cfg.port,
        mark = cfg.mark,
        table = cfg.table,
        "intercepting"
    );
    if let Err(e) = drop_privileges() {
        if let Some(h) = holder {
            h.stop();
        }
        netfilter::cleanup(cfg.mark, cfg.table);
        return Err(e);
    }
    Ok(())
}

/// Samples the memory connections buffer, every [`MEMORY_SAMPLE`], and admits or bypasses by
/// it. Sampled, not tracked per byte: the kernel's count is one file read.
fn sample_memory(adm: Arc<Admission>, reg: Arc<Registry>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(MEMORY_SAMPLE);
        let mut trim = Trim::default();
        loop {
            tick.tick().await;
            let (adm, reg) = (adm.clone(), reg.clone());
            trim = tokio::task::spawn_blocking(move || {
                adm.memory.store(buffered_memory(), Relaxed);
                adm.update(&reg.counters);
                trim.after(reg.counters.active.load(Relaxed));
                trim
            })
            .await
            .unwrap_or_default();
        }
    })
}

/// What each accepted client's task needs.
struct Accepting {
    cfg: Arc<ProxyConfig>,
    registry: Arc<Registry>,
    admission: Arc<Admission>,
    holder: Option<Arc<crate::hold::Holder>>,
    terminal: Option<Arc<Terminal>>,
}

impl Accepting {
    /// Accepts clients on `listener`, each handled on a task of its own with the legs `legs`
    /// holds at the time, until `shutdown` resolves (a leader of workers has no listener: it
    /// only waits).
    async fn until(
        &self,
        shutdown: impl std::future::Future<Output = ()>,
        listener: Option<tokio::net::TcpListener>,
        mut legs: tokio::sync::watch::Receiver<(Arc<Leg>, Arc<Leg>)>,
    ) {
        let Some(listener) = listener else {
            return shutdown.await;
        };
        tokio::pin!(shutdown);
        // One descriptor held back for the moment the others run out (see below).
        let mut spare = std::fs::File::open("/dev/null").ok();
        let mut out_of_fds = std::time::Instant::now() - Duration::from_secs(2);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                Ok(()) = legs.changed() => {
                    // Buffers set on the listener size the window scale of the handshakes to
                    // come.
                    let dl = legs.borrow_and_update().0.clone();
                    if let Err(e) = crate::sockets::tune_listener(SockRef::from(&listener), &dl) {
                        warn!(error = %e, "reload: the listener keeps its buffers");
                    }
                }
                r = listener.accept() => match r {
                    Ok((client, peer)) => {
                        let (dl, ul) = legs.borrow().clone();
                        self.spawn(client, peer, dl, ul);
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        // Out of descriptors (a burst outran the bypass): a client left in the
                        // accept queue would hang, so give up the spare descriptor, take the
                        // client and reset it, then take the spare back.
                        drop(spare.take());
                        if let Ok((c, _)) = listener.accept().await {
                            reset_on_close(SockRef::from(&c));
                            self.registry.counters.failed.fetch_add(1, Relaxed);
                        }
                        spare = std::fs::File::open("/dev/null").ok();
                        if out_of_fds.elapsed() > Duration::from_secs(1) {
                            warn!(error = %e, "out of descriptors: resetting new clients");
                            out_of_fds = std::time::Instant::now();
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
    }

    /// Handles `client` on a task of its own: split, or carried by the tunnel.
    fn spawn(
        &self,
        client: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        dl: Arc<Leg>,
        ul: Arc<Leg>,
    ) {
        let (cfg, reg) = (self.cfg.clone(), self.registry.clone());
        let adm = self.admission.clone();
        let held = self.holder.clone();
        let term = self.terminal.clone();
        // Counted from accept, so the limit holds while upstream connects are pending.
        reg.counters.active.fetch_add(1, Relaxed);
        adm.update(&reg.counters);
        tokio::spawn(async move {
            match term {
                Some(t) => {
                    handle_tunnel(client, peer, reg.clone(), dl, t, held, cfg.keepalive).await
                }
                None => handle(client, peer, cfg, reg.clone(), dl, ul, held).await,
            }
            reg.counters.active.fetch_sub(1, Relaxed);
            tokio::task::spawn_blocking(move || adm.update(&reg.counters));
        });
    }
}

/// How often the processes of one proxy exchange their figures: what a worker may accept
/// past its limit before the leader bypasses is what arrives in this time.
const LINK_EVERY: Duration = Duration::from_millis(20);

/// A worker publishes its figures for the leader's `/metrics` and admission; the leader
/// re-decides the bypass from its workers' and reaps those that died.
fn link_processes(
    adm: Arc<Admission>,
    reg: Arc<Registry>,
    workers: Option<Arc<tokio::sync::Mutex<Workers>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(LINK_EVERY);
        loop {
            tick.tick().await;
            let k = &reg.counters;
            if let Link::Worker(p) = &adm.link {
                let s = p.slot();
                let (up, down) = reg.relayed();
                s.limit.store(k.max_connections.load(Relaxed), Relaxed);
                s.accepted.store(k.total.load(Relaxed), Relaxed);
                s.failed.store(k.failed.load(Relaxed), Relaxed);
                s.copied.store(k.copied.load(Relaxed), Relaxed);
                s.bytes_up.store(up, Relaxed);
                s.bytes_down.store(down, Relaxed);
            }
            adm.update(k);
            if let Some(w) = &workers {
                if let Ok(mut w) = w.try_lock() {
                    w.reap();
                }
            }
        }
    })
}

/// The leader's signals for its workers: each stop message is passed on as a SIGTERM (a
/// second one resets their connections too) before it reaches the leader's own stop, and
/// every SIGHUP as a SIGHUP (each worker reloads the file itself). Only workers still
/// running are signalled (a worker that died and was reaped left its PID free for reuse).
fn forward_signals(
    mut stop: tokio::sync::mpsc::UnboundedReceiver<()>,
    workers: Arc<tokio::sync::Mutex<crate::workers::Workers>>,
) -> Result<
    (
        tokio::sync::mpsc::UnboundedReceiver<()>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                m = stop.recv() => {
                    workers.lock().await.signal(libc::SIGTERM);
                    if m.is_none() || tx.send(()).is_err() {
                        return;
                    }
                }
                Some(()) = hup.recv() => workers.lock().await.signal(libc::SIGHUP),
            }
        }
    });
    Ok((rx, task))
}

/// Resolves when the proxy is to stop: at the first message on `stop` if there is no drain
/// or nothing is live; otherwise `begin` runs (new connections bypass from then on) and it
/// resolves once no connection is live, `drain` has passed, or a second message comes (a
/// closed channel counts as one). Connections still live then are reset.
async fn stopped(
    mut stop: tokio::sync::mpsc::UnboundedReceiver<()>,
    drain: Option<Duration>,
    live: impl Fn() -> u64,
    begin: impl FnOnce(),
) {
    let _ = stop.recv().await;
    let Some(drain) = drain.filter(|_| live() > 0) else {
        crate::notify::stopping("stopping");
        return;
    };
    crate::notify::stopping("draining live connections");
    begin();
    info!(
        live = live(),
        drain = ?drain,
        "stopping: new connections bypass the proxy, live ones may finish (a second signal resets them now)"
    );
    let deadline = tokio::time::sleep(drain);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = &mut deadline => {
                warn!(live = live(), "drain time over");
                return;
            }
            _ = stop.recv() => {
                warn!(live = live(), "second stop signal: not waiting for live connections");
                return;
            }
            _ = tick.tick() => if live() == 0 {
                info!("drained: no live connections");
                return;
            }
        }
    }
}

/// Resets connections idle for `proxy.idle_timeout`, checking four times a second. It starts
/// at `configured`; the registry keeps the live value, which a reload changes.
fn sweep_idle(reg: Arc<Registry>, configured: Option<Duration>) -> tokio::task::JoinHandle<()> {
    reg.counters
        .idle_timeout_ms
        .store(idle_ms(configured), Relaxed);
    tokio::spawn(async move {
        // The limit may change on a reload: read at each tick.
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tick.tick().await;
            let ms = reg.counters.idle_timeout_ms.load(Relaxed);
            if ms == 0 {
                continue;
            }
            let limit = Duration::from_millis(ms);
            let n = reg.reset_idle(limit);
            if n > 0 {
                info!(connections = n, idle = ?limit, "resetting idle connections");
            }
        }
    })
}

/// `proxy.idle_timeout` as the registry keeps it: milliseconds, 0 for off.
pub fn idle_ms(t: Option<Duration>) -> u64 {
    t.map_or(0, |d| (d.as_millis() as u64).max(1))
}

/// Logs one info line every `every` summing up the interval, when anything happened or
/// connections are live: the per-connection lines are at debug ([`crate::CONNECTION_LOG`]).
fn log_summaries(
    reg: Arc<Registry>,
    every: Option<Duration>,
) -> Option<tokio::task::JoinHandle<()>> {
    let every = every?;
    // In the caller's span: a worker's summary says which worker it is.
    use tracing::Instrument;
    Some(tokio::spawn(
        async move {
            let k = &reg.counters;
            let totals = || {
                let (up, down) = reg.relayed();
                (
                    k.total.load(Relaxed),
                    k.failed.load(Relaxed),
                    reg.bypassed(),
                    up,
                    down,
                    reg.live().len(),
                )
            };
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            let mut before = tokio::task::block_in_place(totals);
            loop {
                tick.tick().await;
                // Asks nft for the bypass counter (a process).
                let now = tokio::task::block_in_place(totals);
                let (accepted, failed, bypassed) = (
                    now.0 - before.0,
                    now.1 - before.1,
                    now.2.saturating_sub(before.2),
                );
                let (up, down) = (
                    now.3.saturating_sub(before.3),
                    now.4.saturating_sub(before.4),
                );
                if accepted + failed + bypassed + up + down > 0 || now.5 > 0 {
                    info!(
                        live = now.5,
                        accepted,
                        failed,
                        bypassed,
                        up_bytes = up,
                        down_bytes = down,
                        interval = ?every,
                        "summary"
                    );
                }
                before = now;
            }
        }
        .in_current_span(),
    ))
}

/// Setup is done: from here on every thread keeps only what running needs.
fn drop_privileges() -> Result<(), String> {
    crate::privileges::drop_all()?;
    info!(kept = crate::privileges::KEPT_NAMES, "privileges dropped");
    Ok(())
}

/// Serves `/metrics` on `proxy.metrics` and `/connections` where `proxy.connections` says.
async fn start_control(
    cfg: &ProxyConfig,
    registry: &Arc<Registry>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, String> {
    use crate::config::ConnectionsAt;
    use crate::control::Routes;
    if let Some(w) = cfg.connections_exposed() {
        warn!("{w}");
    }
    let mut listeners = Vec::new();
    if let Some(addr) = cfg.metrics {
        let routes = Routes {
            metrics: true,
            connections: cfg.connections == ConnectionsAt::WithMetrics,
        };
        listeners.push(("proxy.metrics", addr, routes));
    }
    if let ConnectionsAt::Own(addr) = cfg.connections {
        let routes = Routes {
            metrics: false,
            connections: true,
        };
        listeners.push(("proxy.connections", addr, routes));
    }
    let mut tasks = Vec::new();
    for (key, addr, routes) in listeners {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("{key}: cannot listen on {addr}: {e}"))?;
        tasks.push(tokio::spawn(crate::control::serve(
            l,
            registry.clone(),
            routes,
        )));
    }
    Ok(tasks)
}

/// Gives freed heap back to the system after many connections have closed: the allocator
/// keeps it otherwise, and a proxy that once held 10 000 connections would stay that large.
#[derive(Default, Clone, Copy)]
struct Trim {
    /// Most connections live since the last trim.
    peak: u64,
}

impl Trim {
    fn after(&mut self, active: u64) {
        self.peak = self.peak.max(active);
        if self.peak >= active + 1000 || (active == 0 && self.peak > 0) {
            // SAFETY: malloc_trim has no preconditions.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
            self.peak = active;
        }
    }
}

/// How often the memory in use is sampled.
const MEMORY_SAMPLE: Duration = Duration::from_millis(200);

/// Memory buffered for connections: the kernel's TCP memory (socket queues, all sockets of
/// the host, as `net.ipv4.tcp_mem` counts it) plus the bytes in the relay's pipes.
pub fn buffered_memory() -> u64 {
    kernel_tcp_memory() + crate::relay::piped_bytes()
}

/// The kernel's TCP memory, bytes: every TCP socket's queues on the host, all namespaces (the
/// `mem` pages of `/proc/net/sockstat`, which `net.ipv4.tcp_mem` limits).
pub fn kernel_tcp_memory() -> u64 {
    let tcp_pages = std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("TCP:"))?.to_string();
            let mut it = line.split_whitespace();
            it.find(|w| *w == "mem")?;
            it.next()?.parse::<u64>().ok()
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64;
    tcp_pages * page
}

/// Decides whether new connections bypass the proxy, from the connection count and the
/// memory in use. They bypass once either reaches its limit, and are diverted again once both
/// fall below 90 % of it, so a value hovering at a limit does not rewrite the ruleset on
/// every connection.
struct Admission {
    /// Last sampled memory in use, bytes.
    memory: AtomicU64,
    /// Why new connections bypass now, if they do.
    bypassing: std::sync::Mutex<Option<&'static str>>,
    /// The proxy is draining: every new connection bypasses it from now on.
    stopping: std::sync::atomic::AtomicBool,
    /// The other processes of this proxy, if any (`proxy.workers`).
    link: Link,
}

/// Whether `value` is past `limit`: at the limit, or, for what is `already` past it, still
/// above nine tenths of it (the bypass ends below that, so a count at the edge does not
/// switch it on and off with every connection).
fn past(value: u64, limit: u64, already: bool) -> bool {
    match already {
        true => value * 10 >= limit * 9,
        false => value >= limit,
    }
}

/// How a process's admission reaches the others'.
enum Link {
    /// The only process.
    Alone,
    /// The leader: it decides for all, from its workers' figures too.
    Leader(Arc<crate::workers::Shared>),
    /// A worker: it publishes whether it is full; the leader decides.
    Worker(Arc<Publisher>),
}

impl Admission {
    /// Re-decides from the current values, read under the lock, so racing updates from
    /// accepts, closes and the sampler always leave the bypass matching the latest values.
    fn update(&self, c: &Counters) {
        let mut b = self.bypassing.lock().unwrap();
        let mut active = c.active.load(Relaxed);
        let memory = self.memory.load(Relaxed);
        // The limits as the last reload left them.
        let (mut max, max_memory) = (
            c.max_connections.load(Relaxed),
            c.memory_limit.load(Relaxed),
        );
        let mut worker_full = false;
        match &self.link {
            Link::Alone => {}
            Link::Leader(s) => {
                let t = s.totals();
                active += t.active;
                max += t.limit;
                // The kernel still gives a full worker its share of new connections.
                worker_full = t.any_full;
            }
            Link::Worker(p) => {
                let slot = p.slot();
                let full = past(active, max, slot.full.load(Relaxed) != 0);
                slot.full.store(u64::from(full), Relaxed);
                slot.active.store(active, Relaxed);
                return;
            }
        }
        let want = if self.stopping.load(Relaxed) {
            Some("stopping")
        } else if worker_full {
            Some("a worker's connection limit")
        } else if past(active, max, b.is_some()) {
            Some("connection limit")
        } else if past(memory, max_memory, b.is_some()) {
            Some("memory limit")
        } else {
            None
        };
        if want.is_some() != b.is_some() {
            // Switched first, logged after: the log says new connections bypass once they do
            // (nft is a process and takes tens of milliseconds).
            if let Err(e) = netfilter::set_overload(want.is_some()) {
                warn!(error = %e, "cannot switch the bypass");
            }
            if let Some(why) = want.filter(|w| *w != "stopping") {
                c.overloads.fetch_add(1, Relaxed);
                warn!(
                    active,
                    max, memory, max_memory, "{why} reached: new connections bypass the proxy"
                );
            } else if want.is_none() {
                info!(
                    active,
                    memory, "below the limits again: splitting new connections"
                );
            }
        }
        *b = want;
    }
}

/// What every accepted client goes through, split or tunnelled: counted, addressed (with
/// TPROXY the accepted socket's local address is the server the client asked for), its leg
/// tuned, and the upstream made while its SYN was held (strict mode) taken. `None` if the
/// socket is already gone.
fn accept_client(
    client: &tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    reg: &Registry,
    down_leg: &crate::config::Leg,
    holder: Option<Arc<crate::hold::Holder>>,
    keepalive: Option<Duration>,
) -> Option<(
    std::net::SocketAddr,
    std::net::SocketAddr,
    Option<crate::hold::Ready>,
)> {
    reg.counters.total.fetch_add(1, Relaxed);
    // From here until a clean end, a close of the client's socket (a crash's too) is a reset.
    crate::sockets::arm(SockRef::from(client));
    crate::sockets::keepalive(SockRef::from(client), keepalive);
    let src = canonical(peer);
    let dst = canonical(client.local_addr().ok()?);
    if let Err(e) = tune(SockRef::from(client), down_leg) {
        warn!(%src, %dst, error = %e, "tuning the client leg failed");
    }
    let held = holder.and_then(|h| h.take(&(src, dst)));
    Some((src, dst, held))
}

async fn handle(
    client: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    cfg: Arc<ProxyConfig>,
    reg: Arc<Registry>,
    down_leg: Arc<crate::config::Leg>,
    up_leg: Arc<crate::config::Leg>,
    holder: Option<Arc<crate::hold::Holder>>,
) {
    let c = &reg.counters;
    let keepalive = cfg.keepalive;
    let Some((src, dst, held)) = accept_client(&client, peer, &reg, &down_leg, holder, keepalive)
    else {
        return;
    };
    let ready = match held {
        Some(crate::hold::Ready::Tcp(s)) => Some(s),
        _ => None,
    };
    // With Fast Open, the client's first bytes ride in the server's SYN. They usually follow
    // the handshake's last ACK at once; a client that waits for the server to speak first
    // costs FASTOPEN_WAIT.
    let mut first = Vec::new();
    if up_leg.fastopen && ready.is_none() {
        let _ = tokio::time::timeout(FASTOPEN_WAIT, client.readable()).await;
        first.resize(16 * 1024, 0);
        let n = client.try_read(&mut first).unwrap_or(0);
        first.truncate(n);
    }
    let upstream_mark = netfilter::Marks::new(cfg.mark).upstream;
    let connect = async {
        if let Some(s) = ready {
            return Ok(s);
        }
        let sock = upstream(src, &up_leg, upstream_mark)?;
        if first.is_empty() {
            return tokio::net::TcpSocket::from_std_stream(sock.into())
                .connect(dst)
                .await;
        }
        let sent = fastopen_connect(&sock, dst, &first)?;
        let mut stream = tokio::net::TcpStream::from_std(sock.into())?;
        stream.writable().await?;
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
        stream.peer_addr()?;
        tokio::io::AsyncWriteExt::write_all(&mut stream, &first[sent..]).await?;
        Ok(stream)
    };
    let server = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            c.failed.fetch_add(1, Relaxed);
            debug!(target: crate::CONNECTION_LOG, %src, %dst, error = %e, "server unreachable; resetting client");
            reset_on_close(SockRef::from(&client));
            return;
        }
        Err(_) => {
            c.failed.fetch_add(1, Relaxed);
            debug!(target: crate::CONNECTION_LOG, %src, %dst, "server did not answer; resetting client");
            reset_on_close(SockRef::from(&client));
            return;
        }
    };
    crate::sockets::arm(SockRef::from(&server));
    debug!(target: crate::CONNECTION_LOG, %src, %dst, "split");
    let (sat, ter) = if cfg.satellite_upstream {
        (&server, &client)
    } else {
        (&client, &server)
    };
    use std::os::fd::AsRawFd;
    let conn = reg.add(src, dst, Some(sat.as_raw_fd()), ter.as_raw_fd());
    conn.up.fetch_add(first.len() as u64, Relaxed);
    let (mut client, mut server) = (client, server);
    crate::sockets::keepalive(SockRef::from(&server), cfg.keepalive);
    let opts = crate::relay::RelayOptions {
        buf_len: cfg.buffer,
        zero_copy: cfg.splice,
        flow: cfg.flow,
    };
    let r = relay(
        &mut client,
        &mut server,
        &opts,
        &conn.up,
        &conn.down,
        &conn.abort,
    )
    .await;
    if r.copied {
        c.copied.fetch_add(1, Relaxed);
    }
    // Before the sockets close (at the end of this function).
    reg.remove(&conn);
    let clean = r.up_end == End::Fin && r.down_end == End::Fin;
    debug!(target: crate::CONNECTION_LOG, %src, %dst, up = r.up, down = r.down, clean, "closed");
}

/// A tunnel gateway: no interception, only the rules that deliver the servers' replies to
/// its transparent sockets, and the QUIC endpoint carrying flows to the servers.
async fn gateway(
    mut cfg: ProxyConfig,
    t: TunnelConfig,
    server_leg: crate::config::Leg,
    stop: tokio::sync::mpsc::UnboundedReceiver<()>,
    reload: tokio::sync::mpsc::UnboundedReceiver<crate::lifecycle::Reload>,
) -> Result<Arc<Registry>, String> {
    // Credentials, what it admits (a reload sends that again, read from the reloaded config)
    // and the UDP port first: nothing is installed for a gateway that cannot run.
    let (admission_tx, admission_rx) = tokio::sync::watch::channel(Arc::new(t.admission()?));
    let ep = crate::tunnel::endpoint(&t, &admission_rx.borrow())?;
    let registry = Arc::new(Registry::new(crate::registry::Mode::Gateway));
    let control = start_control(&cfg, &registry).await?;
    // Flows are held at the terminal; the gateway intercepts nothing to hold.
    cfg.strict = false;
    netfilter::install(&cfg)?;
    if let Err(e) = drop_privileges() {
        netfilter::cleanup(cfg.mark, cfg.table);
        return Err(e);
    }
    crate::notify::ready("carrying tunnel flows");
    let watchdog = crate::notify::watchdog();
    let keeper = tokio::spawn(crate::lifecycle::keep(
        cfg.clone(),
        registry.clone(),
        reload,
        crate::lifecycle::Reloadable {
            legs: None,
            admission: Some(admission_tx),
            carrier: Some(ep.paced()),
            split_carrier: None,
            rules: true,
        },
    ));
    let mark = netfilter::Marks::new(cfg.mark).upstream;
    let idle = sweep_idle(registry.clone(), cfg.idle_timeout);
    let summaries = log_summaries(registry.clone(), cfg.log_summary);
    // The gateway has no memory sampler; it still gives freed heap back.
    let trimmer = {
        let reg = registry.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut trim = Trim::default();
            loop {
                tick.tick().await;
                trim.after(reg.counters.active.load(Relaxed));
            }
        })
    };
    // The gateway intercepts nothing, so nothing bypasses it while it drains: flows the
    // terminal still opens are carried, and reset with the rest at the end of the drain.
    let reg = registry.clone();
    let shutdown = stopped(
        stop,
        cfg.drain,
        move || reg.counters.active.load(Relaxed),
        || {},
    );
    let r = crate::tunnel::run_gateway(
        ep,
        &t,
        Arc::new(server_leg),
        mark,
        cfg.keepalive,
        registry.clone(),
        admission_rx,
        shutdown,
    )
    .await;
    idle.abort();
    if let Some(s) = summaries {
        s.abort();
    }
    trimmer.abort();
    keeper.abort();
    if let Some(w) = watchdog {
        w.abort();
    }
    let live = registry.live().len();
    if live > 0 {
        warn!(live, "stopping: resetting live connections");
    }
    netfilter::cleanup(cfg.mark, cfg.table);
    for c in control {
        c.abort();
    }
    info!("gateway stopped");
    r.map(|()| registry)
}

/// A terminal flow: the client's connection is carried to the gateway in a tunnel stream.
async fn handle_tunnel(
    client: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    reg: Arc<Registry>,
    down_leg: Arc<crate::config::Leg>,
    term: Arc<Terminal>,
    holder: Option<Arc<crate::hold::Holder>>,
    keepalive: Option<Duration>,
) {
    let c = &reg.counters;
    let Some((src, dst, held)) = accept_client(&client, peer, &reg, &down_leg, holder, keepalive)
    else {
        return;
    };
    let ready = match held {
        Some(crate::hold::Ready::Flow(f)) => Some(f),
        _ => None,
    };
    let flow = match ready {
        Some(f) => f,
        None => match tokio::time::timeout(CONNECT_TIMEOUT, term.open(src, dst, false)).await {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => {
                c.failed.fetch_add(1, Relaxed);
                debug!(target: crate::CONNECTION_LOG, %src, %dst, error = %e, "tunnel unavailable; resetting client");
                reset_on_close(SockRef::from(&client));
                return;
            }
            Err(_) => {
                c.failed.fetch_add(1, Relaxed);
                debug!(target: crate::CONNECTION_LOG, %src, %dst, "tunnel did not open in time; resetting client");
                reset_on_close(SockRef::from(&client));
                return;
            }
        },
    };
    use std::os::fd::AsRawFd;
    let conn = reg.add(src, dst, None, client.as_raw_fd());
    debug!(target: crate::CONNECTION_LOG, %src, %dst, "tunnel flow");
    let mut client = client;
    crate::tunnel::relay_terminal(&mut client, flow, src, dst, &reg, &conn).await;
    // Before the socket closes (at the end of this function).
    reg.remove(&conn);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyFile;

    fn in_use(t: &str) -> Vec<&'static str> {
        bundled_in_use(&ProxyFile::parse(t).unwrap().resolve().unwrap())
    }

    /// A start refreshes only what it may select: another pinned controller may carry an
    /// operator's options, which a refresh would put back to their defaults.
    #[test]
    fn only_the_controllers_a_configuration_uses_are_refreshed() {
        assert_eq!(in_use(""), vec![satpep_cc::SPLIT_DEFAULT]);
        assert_eq!(
            in_use("[satellite]\ncongestion='satpep_hybla'\n"),
            vec!["satpep_hybla"]
        );
        assert!(in_use("[satellite]\ncongestion='cubic'\n").is_empty());
        let tunnel = "[tunnel]\nrole='terminal'\npeer='198.18.2.2:7701'\nca='ca.pem'\ncert='t.pem'\nkey='t.key'\n";
        assert!(in_use(tunnel).is_empty(), "{:?}", in_use(tunnel));
        let adaptive = in_use("[satellite]\ncongestion='adaptive'\n[adaptive]\n");
        assert!(!adaptive.is_empty());
        assert!(adaptive.len() < satpep_cc::BUNDLED.len(), "{adaptive:?}");
        assert!(!adaptive.contains(&"satpep_hstcp"), "{adaptive:?}");
    }
}
