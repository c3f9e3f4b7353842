//! What keeps a running proxy's interception true to its configuration: the rules are
//! checked every few seconds and installed again if something removed them (Debian's
//! `nftables.service` starts from `flush ruleset`, so a reload of it drops the table), and a
//! configuration re-read on SIGHUP is applied where that is safe for live connections.

use crate::config::{Leg, ProxyConfig};
use crate::netfilter;
use crate::registry::Registry;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{error, info, warn};

/// How often the rules are checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);

/// A configuration re-read on SIGHUP, or why it could not be.
pub type Reload = Result<ProxyConfig, String>;

/// The legs new connections are given: (accepting side, connecting side). A reload replaces
/// them; connections already made keep the options they were made with.
pub type Legs = (Arc<Leg>, Arc<Leg>);

/// The keys of one leg whose change needs a restart, named `section.key`: those set on
/// routes, in the ruleset or before a listener's handshake (`interface`, `initcwnd`,
/// `initrwnd`, `mss`, `fastopen`), and with `legs_reload` false (a tunnel gateway) all of
/// them.
fn leg_restart_keys(section: &str, old: &Leg, new: &Leg, legs_reload: bool) -> Vec<String> {
    let mut keys = Vec::new();
    let mut differ = |key: &str, d: bool| {
        if d {
            keys.push(format!("{section}.{key}"));
        }
    };
    differ(
        "congestion",
        !legs_reload && old.congestion != new.congestion,
    );
    differ("buffer", !legs_reload && old.buffer != new.buffer);
    differ("nodelay", !legs_reload && old.nodelay != new.nodelay);
    differ(
        "notsent_lowat",
        !legs_reload && old.notsent_lowat != new.notsent_lowat,
    );
    differ("interface", old.interface != new.interface);
    differ("initcwnd", old.initcwnd != new.initcwnd);
    differ("initrwnd", old.initrwnd != new.initrwnd);
    differ("mss", old.mss != new.mss);
    differ("fastopen", old.fastopen != new.fastopen);
    keys
}

/// The keys whose change needs a restart (sockets, listeners, the tunnel, what is set on
/// routes and in the ruleset): compared one by one so the log names each. With
/// `legs_reload`, the legs' controller, buffers, Nagle and low-water mark are not among them:
/// they apply to new connections.
fn restart_needed(old: &ProxyConfig, new: &ProxyConfig, legs_reload: bool) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut differ = |key: &'static str, d: bool| {
        if d {
            keys.push(key.into());
        }
    };
    differ("proxy.port", old.port != new.port);
    differ("proxy.mark", old.mark != new.mark);
    differ("proxy.table", old.table != new.table);
    differ(
        "proxy.satellite_side",
        old.satellite_upstream != new.satellite_upstream,
    );
    differ("proxy.handshake", old.strict != new.strict);
    differ("proxy.queue", old.queue != new.queue);
    differ("proxy.buffer", old.buffer != new.buffer);
    differ("proxy.relay", old.splice != new.splice);
    differ(
        "proxy.back_pressure",
        old.flow.improved != new.flow.improved,
    );
    differ("proxy.drop_flow_control", old.flow.drop != new.flow.drop);
    differ("proxy.buffer_sizing", old.flow.sizing != new.flow.sizing);
    differ("proxy.metrics", old.metrics != new.metrics);
    differ("proxy.connections", old.connections != new.connections);
    differ("proxy.keepalive", old.keepalive != new.keepalive);
    differ("proxy.drain", old.drain != new.drain);
    differ("proxy.workers", old.workers != new.workers);
    differ("proxy.log_summary", old.log_summary != new.log_summary);
    differ("adaptive", old.adaptive != new.adaptive);
    // What the gateway admits and the carrier it shares are applied by a reload; the rest
    // of the tunnel is not.
    differ(
        "tunnel",
        match (&old.tunnel, &new.tunnel) {
            (Some(a), Some(b)) => !a.same_but_reloadable(b),
            (a, b) => a != b,
        },
    );
    keys.extend(leg_restart_keys(
        "satellite",
        &old.satellite,
        &new.satellite,
        legs_reload,
    ));
    keys.extend(leg_restart_keys(
        "terrestrial",
        &old.terrestrial,
        &new.terrestrial,
        legs_reload,
    ));
    keys
}

/// `new`'s legs as the running proxy gives them to connections: a satellite leg that names
/// no controller gets the one a start would pick (without loading anything: privileges are
/// dropped), and each named controller must be registered already. The error names the key.
/// With adaptive selection before or after, the satellite controller stays as it runs: the
/// selection's task starts with the proxy (a change of `adaptive` is named for a restart).
fn resolve_legs(cfg: &ProxyConfig, new: &ProxyConfig) -> Result<(Leg, Leg), String> {
    let (mut sat, ter) = (new.satellite.clone(), new.terrestrial.clone());
    if cfg.adaptive.is_some() || new.adaptive.is_some() {
        sat.congestion = cfg.satellite.congestion.clone();
    } else if sat.congestion.is_none() && new.tunnel.is_none() {
        let avail = satpep_cc::available();
        let cc = if avail.iter().any(|c| c == satpep_cc::SPLIT_DEFAULT) {
            satpep_cc::SPLIT_DEFAULT
        } else {
            crate::server::FALLBACK_SATELLITE_CONGESTION
        };
        sat.congestion = Some(cc.into());
    }
    for (key, leg, old) in [
        ("satellite", &sat, &cfg.satellite),
        ("terrestrial", &ter, &cfg.terrestrial),
    ] {
        let Some(cc) = leg.congestion.as_deref() else {
            continue;
        };
        if Some(cc) == old.congestion.as_deref() {
            continue;
        }
        if let Err(e) = crate::server::try_congestion(cc) {
            return Err(format!(
                "{key}.congestion: '{cc}' is not registered ({e}), and the running proxy cannot \
                 load it (it dropped that privilege after set-up): load it first (satpep cc \
                 load {cc} --pin) or restart"
            ));
        }
    }
    Ok((sat, ter))
}

/// Applies `new`'s limits, which running connections do not depend on: the connection and
/// memory limits (admission reads them at every accept and every memory sample) and the
/// idle timeout (the sweep reads it at each tick). Returns what changed, for the log.
fn apply_limits(old: &ProxyConfig, new: &ProxyConfig, reg: &Registry) -> Vec<String> {
    let k = &reg.counters;
    let mut changed = Vec::new();
    // A gateway admits whatever its terminals open: it has no connection or memory limit.
    let admits = k.max_connections.load(Relaxed) > 0;
    if admits && old.max_connections != new.max_connections {
        // The descriptor limit is raised for the new figure as at a start (the capability
        // is kept for this); what it cannot hold is left out, as at a start.
        let b = crate::preflight::fd_budget(new);
        k.max_connections.store(b.connections, Relaxed);
        if b.connections < u64::from(new.max_connections) {
            warn!(
                limit = b.limit,
                fits = b.connections,
                "proxy.max_connections: the descriptor limit holds fewer connections"
            );
        }
        changed.push(format!(
            "proxy.max_connections {} -> {}",
            old.max_connections, b.connections
        ));
    }
    if admits && old.max_memory != new.max_memory {
        k.memory_limit.store(new.max_memory, Relaxed);
        changed.push(format!(
            "proxy.max_memory {} -> {} bytes",
            old.max_memory, new.max_memory
        ));
    }
    if old.idle_timeout != new.idle_timeout {
        k.idle_timeout_ms
            .store(crate::server::idle_ms(new.idle_timeout), Relaxed);
        changed.push(format!(
            "proxy.idle_timeout {:?} -> {:?}",
            old.idle_timeout, new.idle_timeout
        ));
    }
    changed
}

/// Gives new connections `new`'s controllers, buffers, Nagle and low-water marks (what
/// [`leg_restart_keys`] names keeps running as it started), records them in `cfg`, and
/// returns what changed, for the log.
fn apply_legs(
    cfg: &mut ProxyConfig,
    new: &ProxyConfig,
    tx: &tokio::sync::watch::Sender<Legs>,
) -> Vec<String> {
    let mut changed = Vec::new();
    for (section, leg, to) in [
        ("satellite", &mut cfg.satellite, &new.satellite),
        ("terrestrial", &mut cfg.terrestrial, &new.terrestrial),
    ] {
        let mut next = leg.clone();
        next.congestion = to.congestion.clone();
        next.buffer = to.buffer;
        next.nodelay = to.nodelay;
        next.notsent_lowat = to.notsent_lowat;
        if next != *leg {
            changed.push(format!(
                "{section}: {} -> {}",
                leg_summary(leg),
                leg_summary(&next)
            ));
            *leg = next;
        }
    }
    if !changed.is_empty() {
        let (sat, ter) = (
            Arc::new(cfg.satellite.clone()),
            Arc::new(cfg.terrestrial.clone()),
        );
        tx.send_replace(if cfg.satellite_upstream {
            (ter, sat)
        } else {
            (sat, ter)
        });
    }
    changed
}

/// A leg's reloadable options, for the log.
fn leg_summary(l: &Leg) -> String {
    format!(
        "congestion={} buffer={} nodelay={} notsent_lowat={}",
        l.congestion.as_deref().unwrap_or("(kernel default)"),
        l.buffer.map_or("auto".into(), |b| b.to_string()),
        l.nodelay,
        l.notsent_lowat.map_or("-".into(), |b| b.to_string()),
    )
}

/// `old` with `new`'s choice of which connections are intercepted: the part of a
/// configuration that one nftables transaction changes without touching live connections.
fn with_selection(old: &ProxyConfig, new: &ProxyConfig) -> ProxyConfig {
    let mut c = old.clone();
    c.interfaces = new.interfaces.clone();
    c.sources = new.sources.clone();
    c.destinations = new.destinations.clone();
    c.ports = new.ports.clone();
    c.exclude_sources = new.exclude_sources.clone();
    c.exclude_destinations = new.exclude_destinations.clone();
    c.exclude_ports = new.exclude_ports.clone();
    c
}

/// Where a reload applies what it may change without a restart.
pub struct Reloadable {
    /// Where the accept loop reads the legs new connections get (`None`: a tunnel gateway,
    /// whose leg changes wait for a restart).
    pub legs: Option<tokio::sync::watch::Sender<Legs>>,
    /// Where a tunnel gateway reads what it admits (read again at every reload: the
    /// revocation list's file may have changed when the configuration did not).
    pub admission: Option<tokio::sync::watch::Sender<Arc<satpep_tunnel::admission::Admission>>>,
    /// A tunnel gateway's socket, which shares the carrier a reload sets.
    pub carrier: Option<Arc<satpep_tunnel::pacing::PacedSocket>>,
    /// Where a split gateway's sharing reads its carrier (`proxy.carrier`).
    pub split_carrier: Option<tokio::sync::watch::Sender<Option<Arc<crate::share::SplitCarrier>>>>,
    /// This process owns the interception rules: it checks them and a reload replaces them
    /// (a worker of `proxy.workers` leaves both to its leader).
    pub rules: bool,
}

/// Runs until aborted: checks the rules every [`CHECK_EVERY`] and applies reloads. `cfg` is
/// the configuration the rules were installed from (with the satellite controller it
/// resolved); `to`, where what a reload changes is applied.
pub async fn keep(
    mut cfg: ProxyConfig,
    reg: Arc<Registry>,
    mut reload: UnboundedReceiver<Reload>,
    to: Reloadable,
) {
    let Reloadable {
        legs,
        admission,
        carrier,
        split_carrier,
        rules,
    } = to;
    let k = &reg.counters;
    k.interception_installed.store(1, Relaxed);
    let mut tick = tokio::time::interval(CHECK_EVERY);
    let mut reloads_open = true;
    loop {
        tokio::select! {
            _ = tick.tick(), if rules => {
                let present = tokio::task::spawn_blocking(netfilter::installed).await.unwrap_or(true);
                if present {
                    k.interception_installed.store(1, Relaxed);
                    continue;
                }
                k.interception_installed.store(0, Relaxed);
                warn!("the interception rules were removed (an nftables reload?): installing them again");
                let c = cfg.clone();
                match blocking(move || netfilter::install(&c)).await {
                    Ok(()) => {
                        k.interception_installed.store(1, Relaxed);
                        k.interception_reinstalls.fetch_add(1, Relaxed);
                        info!("interception installed again");
                    }
                    Err(e) => error!(error = %e, "cannot install the interception rules again; retrying"),
                }
            }
            r = reload.recv(), if reloads_open => match r {
                None => reloads_open = false,
                Some(Err(e)) => {
                    k.reload_failures.fetch_add(1, Relaxed);
                    error!(error = %e, "reload refused: the running configuration stays");
                }
                Some(Ok(mut new)) => {
                    // As a start would: an interface that is not there intercepts nothing.
                    let missing =
                        crate::preflight::interface_refusals(&new, crate::preflight::interface_exists);
                    if !missing.is_empty() {
                        k.reload_failures.fetch_add(1, Relaxed);
                        error!(error = %missing.join("; "), "reload refused: the running configuration stays");
                        continue;
                    }
                    crate::notify::reloading();
                    let admits = match (&admission, &new.tunnel) {
                        (Some(_), Some(t)) => match t.admission() {
                            Ok(a) => Some(a),
                            Err(e) => {
                                k.reload_failures.fetch_add(1, Relaxed);
                                error!(error = %e, "reload refused: the running configuration stays");
                                crate::notify::ready("intercepting");
                                continue;
                            }
                        },
                        _ => None,
                    };
                    if legs.is_some() {
                        match resolve_legs(&cfg, &new) {
                            Ok((sat, ter)) => (new.satellite, new.terrestrial) = (sat, ter),
                            Err(e) => {
                                k.reload_failures.fetch_add(1, Relaxed);
                                error!(error = %e, "reload refused: the running configuration stays");
                                crate::notify::ready("intercepting");
                                continue;
                            }
                        }
                    } else if new.satellite.congestion.is_none() {
                        // As resolved at the start: no change.
                        new.satellite.congestion = cfg.satellite.congestion.clone();
                    }
                    let later = restart_needed(&cfg, &new, legs.is_some());
                    let next = with_selection(&cfg, &new);
                    let changed = next != cfg;
                    let applied = if changed && rules {
                        let n = next.clone();
                        blocking(move || netfilter::replace_ruleset(&n)).await
                    } else {
                        Ok(())
                    };
                    // Done either way: the proxy runs on, with the new or the old rules.
                    crate::notify::ready("intercepting");
                    match applied {
                        Ok(()) => {
                            k.reloads.fetch_add(1, Relaxed);
                            let mut changes = apply_limits(&cfg, &new, &reg);
                            cfg = next;
                            cfg.max_connections = new.max_connections;
                            cfg.max_memory = new.max_memory;
                            cfg.idle_timeout = new.idle_timeout;
                            if let Some(tx) = &legs {
                                changes.extend(apply_legs(&mut cfg, &new, tx));
                            }
                            if let (Some(tx), Some(a)) = (&admission, admits) {
                                if **tx.borrow() != a {
                                    changes.push("tunnel admission (terminals, crl)".into());
                                    tx.send_replace(Arc::new(a));
                                }
                                if let (Some(old), Some(t)) = (&mut cfg.tunnel, &new.tunnel) {
                                    if old.same_but_reloadable(t) {
                                        (old.terminals, old.crl) = (t.terminals.clone(), t.crl.clone());
                                    }
                                }
                            }
                            if let (Some(sock), Some(old), Some(t)) = (&carrier, &mut cfg.tunnel, &new.tunnel) {
                                if old.same_but_reloadable(t) && old.carrier != t.carrier {
                                    changes.push("tunnel carrier".into());
                                    sock.share_carrier(t.carrier.clone());
                                    old.carrier = t.carrier.clone();
                                }
                            }
                            if let Some(tx) = &split_carrier {
                                if cfg.carrier != new.carrier {
                                    changes.push("proxy carrier".into());
                                    tx.send_replace(new.carrier.clone());
                                    cfg.carrier = new.carrier.clone();
                                }
                            }
                            info!(interception_changed = changed, changes = %changes.join(", "), "configuration reloaded");
                            if !later.is_empty() {
                                warn!(keys = %later.join(", "), "changed keys that take effect at the next start (live connections depend on them)");
                            }
                        }
                        Err(e) => {
                            k.reload_failures.fetch_add(1, Relaxed);
                            error!(error = %e, "reload refused: the new rules did not install; the running ones stay");
                        }
                    }
                }
            }
        }
    }
}

/// Runs `f` (an nft command) off the runtime; a task that panicked is an error too.
async fn blocking(f: impl FnOnce() -> Result<(), String> + Send + 'static) -> Result<(), String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyFile;

    fn cfg(t: &str) -> ProxyConfig {
        ProxyFile::parse(t).unwrap().resolve().unwrap()
    }

    #[test]
    fn a_reload_applies_the_selection_and_names_what_waits_for_a_restart() {
        let old = cfg("[intercept]\nports = [80]\n");
        let new = cfg("[intercept]\nports = [80, 443]\nexclude_ports = [22]\n[proxy]\nport = 7800\nbuffer = \"1MiB\"\nmax_connections = 5\n");
        let next = with_selection(&old, &new);
        assert_eq!(next.ports, vec![80, 443]);
        assert_eq!(next.exclude_ports, vec![22]);
        // What needs a restart is kept as it runs, and named.
        assert_eq!(next.port, old.port);
        assert_eq!(
            restart_needed(&old, &new, true),
            vec!["proxy.port", "proxy.buffer"]
        );
        assert!(restart_needed(&old, &old, true).is_empty());
    }

    #[test]
    fn a_reload_applies_limits_to_the_running_proxy() {
        let old = cfg("");
        let new =
            cfg("[proxy]\nmax_connections = 5\nmax_memory = \"64MiB\"\nidle_timeout = \"90s\"\n");
        let reg = Registry::default();
        let k = &reg.counters;
        k.max_connections.store(10_000, Relaxed);
        k.memory_limit.store(old.max_memory, Relaxed);
        let changed = apply_limits(&old, &new, &reg);
        assert_eq!(changed.len(), 3, "{changed:?}");
        assert_eq!(k.max_connections.load(Relaxed), 5);
        assert_eq!(k.memory_limit.load(Relaxed), 64 << 20);
        assert_eq!(k.idle_timeout_ms.load(Relaxed), 90_000);
        assert!(apply_limits(&new, &new, &reg).is_empty());
        // A gateway (no connection limit) takes the idle timeout only.
        let gw = Registry::default();
        let changed = apply_limits(&old, &new, &gw);
        assert_eq!(changed.len(), 1, "{changed:?}");
        assert_eq!(gw.counters.memory_limit.load(Relaxed), 0);
        assert_eq!(gw.counters.idle_timeout_ms.load(Relaxed), 90_000);
    }

    #[test]
    fn a_reload_gives_new_connections_new_leg_options_but_not_what_routes_hold() {
        let old = cfg("[satellite]\ncongestion = \"cubic\"\n");
        let new = cfg("[satellite]\ncongestion = \"bbr\"\nbuffer = \"8MiB\"\nnodelay = true\n[terrestrial]\nnotsent_lowat = \"64KiB\"\n");
        assert!(restart_needed(&old, &new, true).is_empty());
        // A gateway (legs not reloadable) names each key instead.
        assert_eq!(
            restart_needed(&old, &new, false),
            vec![
                "satellite.congestion",
                "satellite.buffer",
                "satellite.nodelay",
                "terrestrial.notsent_lowat"
            ]
        );
        let (tx, rx) = tokio::sync::watch::channel((
            Arc::new(old.terrestrial.clone()),
            Arc::new(old.satellite.clone()),
        ));
        let mut running = old.clone();
        let changed = apply_legs(&mut running, &new, &tx);
        assert_eq!(changed.len(), 2, "{changed:?}");
        let (down, up) = rx.borrow().clone();
        // At a terminal the satellite leg is the connecting (upstream) side.
        assert_eq!(up.congestion.as_deref(), Some("bbr"));
        assert_eq!(up.buffer, Some(8 << 20));
        assert!(up.nodelay);
        assert_eq!(down.notsent_lowat, Some(64 << 10));
        assert!(apply_legs(&mut running, &new, &tx).is_empty());
        // Route-held and listener-held keys, and a move to adaptive selection, wait.
        let routes = cfg("[satellite]\ncongestion = \"adaptive\"\nbuffer = \"8MiB\"\nnodelay = true\nmss = 1200\ninterface = \"eth0\"\ninitcwnd = 40\n[terrestrial]\nnotsent_lowat = \"64KiB\"\n");
        assert_eq!(
            restart_needed(&old, &routes, true),
            vec![
                "adaptive",
                "satellite.interface",
                "satellite.initcwnd",
                "satellite.mss"
            ]
        );
        let before = rx.borrow().clone();
        let mut routes = routes;
        (routes.satellite, routes.terrestrial) = resolve_legs(&running, &routes).unwrap();
        assert!(apply_legs(&mut running, &routes, &tx).is_empty());
        assert!(Arc::ptr_eq(&rx.borrow().1, &before.1));
    }
}
