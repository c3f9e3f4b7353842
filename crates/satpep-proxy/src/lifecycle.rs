//! What keeps a running proxy's interception true to its configuration: the rules are
//! checked every few seconds and installed again if something removed them (Debian's
//! `nftables.service` starts from `flush ruleset`, so a reload of it drops the table), and a
//! configuration re-read on SIGHUP is applied where that is safe for live connections.

use crate::config::ProxyConfig;
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

/// The keys whose change needs a restart (sockets, listeners, the tunnel, legs' options of
/// connections already made): compared one by one so the log names each.
fn restart_needed(old: &ProxyConfig, new: &ProxyConfig) -> Vec<&'static str> {
    let mut keys = Vec::new();
    let mut differ = |key: &'static str, d: bool| {
        if d {
            keys.push(key);
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
    differ("proxy.metrics", old.metrics != new.metrics);
    differ("proxy.connections", old.connections != new.connections);
    differ("proxy.keepalive", old.keepalive != new.keepalive);
    differ("proxy.drain", old.drain != new.drain);
    differ("proxy.log_summary", old.log_summary != new.log_summary);
    differ("satellite", old.satellite != new.satellite);
    differ("terrestrial", old.terrestrial != new.terrestrial);
    differ("adaptive", old.adaptive != new.adaptive);
    differ("tunnel", old.tunnel != new.tunnel);
    keys
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

/// Runs until aborted: checks the rules every [`CHECK_EVERY`] and applies reloads. `cfg` is
/// the configuration the rules were installed from.
pub async fn keep(mut cfg: ProxyConfig, reg: Arc<Registry>, mut reload: UnboundedReceiver<Reload>) {
    let k = &reg.counters;
    k.interception_installed.store(1, Relaxed);
    let mut tick = tokio::time::interval(CHECK_EVERY);
    let mut reloads_open = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {
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
                Some(Ok(new)) => {
                    crate::notify::reloading();
                    let later = restart_needed(&cfg, &new);
                    let next = with_selection(&cfg, &new);
                    let changed = next != cfg;
                    let applied = if changed {
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
                            let limits = apply_limits(&cfg, &new, &reg);
                            cfg = next;
                            cfg.max_connections = new.max_connections;
                            cfg.max_memory = new.max_memory;
                            cfg.idle_timeout = new.idle_timeout;
                            info!(interception_changed = changed, limits = %limits.join(", "), "configuration reloaded");
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
            restart_needed(&old, &new),
            vec!["proxy.port", "proxy.buffer"]
        );
        assert!(restart_needed(&old, &old).is_empty());
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
}
