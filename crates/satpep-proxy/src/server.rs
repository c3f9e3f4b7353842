//! The proxy's main loop: listen, install interception, accept and split connections, and
//! remove interception on exit.

use crate::config::ProxyConfig;
use crate::netfilter;
use crate::registry::{Counters, Registry};
use crate::relay::{relay, End};
use crate::sockets::{canonical, listener, reset_on_close, tune, upstream};
use socket2::SockRef;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// How long an upstream connection attempt may take before the client is reset.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the proxy until `shutdown` completes. Interception is removed on every exit path.
pub async fn run(
    cfg: ProxyConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Arc<Registry>, String> {
    let (down_leg, up_leg) = if cfg.satellite_upstream {
        (cfg.terrestrial.clone(), cfg.satellite.clone())
    } else {
        (cfg.satellite.clone(), cfg.terrestrial.clone())
    };
    // Check the congestion controls before intercepting anything.
    for leg in [&down_leg, &up_leg] {
        let probe = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .map_err(|e| e.to_string())?;
        tune(SockRef::from(&probe), leg).map_err(|e| e.to_string())?;
    }
    let std_listener = listener(cfg.port, &down_leg).map_err(|e| {
        format!(
            "cannot listen on port {} (IP_TRANSPARENT needs root): {e}",
            cfg.port
        )
    })?;
    let listener = tokio::net::TcpListener::from_std(std_listener).map_err(|e| e.to_string())?;
    let registry = Arc::new(Registry::default());
    let control = match cfg.metrics {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("proxy.metrics: cannot listen on {addr}: {e}"))?;
            Some(tokio::spawn(crate::control::serve(l, registry.clone())))
        }
        None => None,
    };
    netfilter::install(&cfg)?;
    info!(
        port = cfg.port,
        mark = cfg.mark,
        table = cfg.table,
        "intercepting"
    );
    let admission = Arc::new(Admission {
        max: cfg.max_connections as u64,
        bypassing: std::sync::Mutex::new(false),
    });
    let cfg = Arc::new(cfg);
    let (down_leg, up_leg) = (Arc::new(down_leg), Arc::new(up_leg));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok((client, peer)) => {
                    let (cfg, reg, dl, ul) = (cfg.clone(), registry.clone(), down_leg.clone(), up_leg.clone());
                    let adm = admission.clone();
                    // Counted from accept, so the limit holds while upstream connects are pending.
                    reg.counters.active.fetch_add(1, Relaxed);
                    adm.update(&reg.counters);
                    tokio::spawn(async move {
                        handle(client, peer, cfg, reg.clone(), dl, ul).await;
                        reg.counters.active.fetch_sub(1, Relaxed);
                        tokio::task::spawn_blocking(move || adm.update(&reg.counters));
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    // Live connections end with a reset on both legs: a FIN would let a cut transfer look
    // complete. (The registry's descriptors keep the sockets open until it is dropped.)
    let live = registry.reset_all();
    if live > 0 {
        warn!(live, "stopping: resetting live connections");
    }
    netfilter::cleanup(cfg.mark, cfg.table);
    if let Some(c) = control {
        c.abort();
    }
    info!("interception removed");
    Ok(registry)
}

/// Tracks the active count against the limit and flips the nftables bypass. New connections
/// bypass at the limit and are diverted again once the count falls below 90 % of it, so a
/// count hovering at the limit does not rewrite the ruleset on every connection.
struct Admission {
    max: u64,
    bypassing: std::sync::Mutex<bool>,
}

impl Admission {
    /// Re-decides from the current count, read under the lock, so racing updates from
    /// accepts and closes always leave the bypass matching the latest count.
    fn update(&self, c: &Counters) {
        let mut b = self.bypassing.lock().unwrap();
        let active = c.active.load(Relaxed);
        let want = if *b {
            active * 10 >= self.max * 9
        } else {
            active >= self.max
        };
        if want != *b {
            *b = want;
            if want {
                c.overloads.fetch_add(1, Relaxed);
                warn!(
                    active,
                    max = self.max,
                    "connection limit reached: new connections bypass the proxy"
                );
            } else {
                info!(active, "below the limit again: splitting new connections");
            }
            if let Err(e) = netfilter::set_overload(want) {
                warn!(error = %e, "cannot switch the bypass");
            }
        }
    }
}

async fn handle(
    client: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    cfg: Arc<ProxyConfig>,
    reg: Arc<Registry>,
    down_leg: Arc<crate::config::Leg>,
    up_leg: Arc<crate::config::Leg>,
) {
    let c = &reg.counters;
    c.total.fetch_add(1, Relaxed);
    let src = canonical(peer);
    // With TPROXY the accepted socket's local address is the server the client asked for.
    let dst = match client.local_addr() {
        Ok(a) => canonical(a),
        Err(_) => return,
    };
    if let Err(e) = tune(SockRef::from(&client), &down_leg) {
        warn!(%src, %dst, error = %e, "tuning the downstream leg failed");
    }
    let connect = async {
        let sock = upstream(src, &up_leg)?;
        sock.connect(dst).await
    };
    let server = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            c.failed.fetch_add(1, Relaxed);
            info!(%src, %dst, error = %e, "server unreachable; resetting client");
            reset_on_close(SockRef::from(&client));
            return;
        }
        Err(_) => {
            c.failed.fetch_add(1, Relaxed);
            info!(%src, %dst, "server did not answer; resetting client");
            reset_on_close(SockRef::from(&client));
            return;
        }
    };
    info!(%src, %dst, "split");
    let (sat, ter) = if cfg.satellite_upstream {
        (&server, &client)
    } else {
        (&client, &server)
    };
    let dup = |s: &tokio::net::TcpStream| {
        use std::os::fd::AsFd;
        s.as_fd().try_clone_to_owned()
    };
    let conn = match (dup(sat), dup(ter)) {
        (Ok(a), Ok(b)) => reg.add(src, dst, a, b),
        _ => {
            warn!(%src, %dst, "out of file descriptors; resetting");
            reset_on_close(SockRef::from(&client));
            reset_on_close(SockRef::from(&server));
            return;
        }
    };
    let r = relay(client, server, cfg.buffer, cfg.splice, &conn.up, &conn.down).await;
    if r.copied {
        c.copied.fetch_add(1, Relaxed);
    }
    reg.remove(&conn);
    let clean = r.up_end == End::Fin && r.down_end == End::Fin;
    info!(%src, %dst, up = r.up, down = r.down, clean, "closed");
}
