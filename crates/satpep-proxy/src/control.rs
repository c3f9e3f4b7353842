//! The proxy's local HTTP endpoint: `GET /metrics` (Prometheus text format) and
//! `GET /connections` (JSON, read by `satpep status`). Plain HTTP/1.0, one request per
//! connection: two read-only endpoints do not need a web framework.

use crate::registry::{ConnStatus, Mode, Registry};
use crate::tunnel::TunnelFigures;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What `/connections` returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReply {
    /// Live connections.
    pub connections: Vec<ConnStatus>,
    /// Connections accepted since start.
    pub total: u64,
    /// Connections whose server could not be reached.
    pub failed: u64,
    /// Connections forwarded unsplit because of the limit.
    pub bypassed: u64,
    /// Bytes held in relay pipes now (beside the sockets' queues each leg shows).
    #[serde(default)]
    pub piped_bytes: u64,
    /// Segments drop-based flow control has dropped since start.
    #[serde(default)]
    pub flow_drops: u64,
    /// Live tunnel connections (a gateway: one per connected terminal).
    #[serde(default)]
    pub tunnels: Vec<TunnelStatus>,
    /// A split gateway's terminals on its shared carrier (`[proxy.carrier]`), by name.
    #[serde(default)]
    pub carrier: Vec<crate::registry::CarrierTerminal>,
}

/// A live tunnel connection in `/connections`: the peer by name and address, the flows it
/// carries, and its path as this side's controller sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TunnelStatus {
    /// The peer's certificate name (a gateway's terminals by name).
    pub name: String,
    /// Its address.
    pub peer: String,
    /// Flows carried now.
    pub flows: u64,
    /// Smoothed RTT, ms.
    pub rtt_ms: f64,
    /// Lowest RTT, ms.
    pub min_rtt_ms: f64,
    /// The satellite controller's rate, bit/s (payload; none with other controllers).
    pub model_rate_bps: Option<u64>,
    /// The satellite controller's phase.
    pub phase: Option<String>,
    /// Packets sent.
    pub sent_packets: u64,
    /// Packets declared lost.
    pub lost_packets: u64,
    /// UDP bytes sent.
    pub udp_sent_bytes: u64,
    /// UDP bytes received.
    pub udp_received_bytes: u64,
}

impl TunnelStatus {
    /// `t` now.
    fn of(t: &crate::registry::Tunnel, reg: &Registry) -> TunnelStatus {
        let f = TunnelFigures::of(&t.conn, &t.readings);
        TunnelStatus {
            name: t.id.name.clone(),
            peer: std::net::SocketAddr::new(t.peer_ip(), t.conn.remote_address().port())
                .to_string(),
            flows: t.flows_now(reg),
            rtt_ms: f.rtt.as_secs_f64() * 1e3,
            min_rtt_ms: f.min_rtt.as_secs_f64() * 1e3,
            model_rate_bps: (f.model_rate > 0).then_some(f.model_rate * 8),
            phase: f.phase.map(|p| p.name().to_string()),
            sent_packets: f.sent,
            lost_packets: f.lost,
            udp_sent_bytes: f.udp_tx,
            udp_received_bytes: f.udp_rx,
        }
    }
}

/// A counter's value with one optional label (key, value; empty key: none).
type LabelledValue = (&'static str, &'static str, u64);

/// A metric family keyed by label pairs.
type Labelled<M> = Family<Vec<(String, String)>, M>;

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The OpenMetrics content type, which is what `encode` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A split gateway's terminals on its shared carrier, one series per terminal name (none
/// where no carrier is shared).
fn carrier_metrics(r: &mut prometheus_client::registry::Registry, reg: &Registry) {
    let terminals = reg.carrier();
    if terminals.is_empty() {
        return;
    }
    type Of = fn(&crate::registry::CarrierTerminal) -> f64;
    let gauges: [(&str, &str, Of); 5] = [
        (
            "carrier_terminal_flows",
            "Live connections of the terminal on the shared carrier",
            |t| t.flows as f64,
        ),
        (
            "carrier_terminal_busy_flows",
            "Its connections that sent lately: the ones its share is divided among",
            |t| t.busy as f64,
        ),
        (
            "carrier_terminal_sending_bits_per_second",
            "What its connections send, bits/s of carrier (frames with headers), smoothed",
            |t| t.sending_bps as f64,
        ),
        (
            "carrier_terminal_share_bits_per_second",
            "Its share of the carrier now, bits/s of carrier (0 while it is quiet)",
            |t| t.share_bps as f64,
        ),
        (
            "carrier_terminal_rtt_seconds",
            "Mean smoothed RTT of its busy connections",
            |t| t.rtt_ms / 1e3,
        ),
    ];
    for (name, help, of) in gauges {
        let fam = Labelled::<Gauge<f64, AtomicU64>>::default();
        for t in &terminals {
            fam.get_or_create(&labels(&[("terminal", &t.name)]))
                .set(of(t));
        }
        r.register(name, help, fam);
    }
    type Total = fn(&crate::registry::CarrierTerminal) -> u64;
    let counters: [(&str, &str, Total); 2] = [
        (
            "carrier_terminal_acked_bytes",
            "TCP payload the terminal's clients acknowledged since the proxy started",
            |t| t.acked_bytes,
        ),
        (
            "carrier_terminal_retransmitted_segments",
            "Segments the terminal's connections retransmitted since the proxy started",
            |t| t.retransmitted,
        ),
    ];
    for (name, help, of) in counters {
        let fam = Labelled::<Counter>::default();
        for t in &terminals {
            fam.get_or_create(&labels(&[("terminal", &t.name)]))
                .inc_by(of(t));
        }
        r.register(name, help, fam);
    }
}

/// Tunnel connections' figures, one series per peer (the gateway has one per terminal). A
/// split proxy has no tunnel and exports none of them: a `tunnel_connected` of 0 there would
/// page an operator for a tunnel that was never meant to be.
fn tunnel_metrics(r: &mut prometheus_client::registry::Registry, reg: &Registry) {
    let k = &reg.counters;
    let tunnels = reg.tunnels();
    // Each connection's figures once per scrape (quinn's stats take its lock). The peer is
    // its address without the port: a terminal's port changes at every reconnection, and a
    // label that changes starts new series on every dashboard. `name` is the peer's
    // certificate name, which stays when its address changes too.
    let figures: Vec<(String, String, TunnelFigures)> = tunnels
        .iter()
        .map(|t| {
            (
                t.peer_ip().to_string(),
                t.id.name.clone(),
                TunnelFigures::of(&t.conn, &t.readings),
            )
        })
        .collect();
    match reg.mode {
        Mode::Split => return,
        // A terminal's one tunnel is what it needs to carry anything: an alert watches it.
        Mode::Terminal => r.register(
            "tunnel_connected",
            "1 while this terminal's tunnel to its gateway is up",
            ConstGauge::new(tunnels.len().min(1) as i64),
        ),
        // A gateway with no terminal connected is idle, not broken.
        Mode::Gateway => {
            r.register(
                "tunnel_peers",
                "Terminals with a live tunnel to this gateway",
                ConstGauge::new(tunnels.len() as i64),
            );
            r.register(
                "tunnel_unshared_bytes",
                "Bytes of data datagrams that left outside a shared carrier's shares (to a peer with no pace: none should)",
                ConstCounter::new(satpep_tunnel::pacing::unshared_bytes_total()),
            );
        }
    }
    let flows = Labelled::<Gauge<f64, AtomicU64>>::default();
    for (t, (peer, name, _)) in tunnels.iter().zip(&figures) {
        flows
            .get_or_create(&labels(&[("peer", peer), ("name", name)]))
            .set(t.flows_now(reg) as f64);
    }
    r.register(
        "tunnel_flows",
        "Flows the tunnel connection carries now (a gateway: per terminal)",
        flows,
    );
    r.register(
        "tunnel_connections",
        "Tunnel connections established since start (more than one at a terminal: reconnections)",
        ConstCounter::new(k.tunnel_connections.load(Relaxed)),
    );
    r.register(
        "tunnel_handshake_failures",
        "Tunnel handshakes that failed or timed out",
        ConstCounter::new(k.tunnel_handshake_failures.load(Relaxed)),
    );
    let gauge = |name: &str,
                 help: &str,
                 r: &mut prometheus_client::registry::Registry,
                 v: &dyn Fn(&TunnelFigures) -> Option<f64>| {
        let fam = Labelled::<Gauge<f64, AtomicU64>>::default();
        for (peer, name, f) in &figures {
            if let Some(x) = v(f) {
                fam.get_or_create(&labels(&[("peer", peer), ("name", name)]))
                    .set(x);
            }
        }
        r.register(name, help, fam);
    };
    gauge(
        "tunnel_rtt_seconds",
        "Smoothed RTT of the tunnel",
        r,
        &|f| Some(f.rtt.as_secs_f64()),
    );
    gauge(
        "tunnel_min_rtt_seconds",
        "Lowest RTT of the tunnel",
        r,
        &|f| Some(f.min_rtt.as_secs_f64()),
    );
    gauge(
        "tunnel_window_bytes",
        "Congestion window of this side's sending direction",
        r,
        &|f| Some(f.cwnd as f64),
    );
    gauge(
        "tunnel_pacing_rate_bytes_per_second",
        "Rate this side's sending direction is paced at, as its controller says",
        r,
        &|f| f.pacing_rate.map(|b| b as f64 / 8.0),
    );
    gauge(
        "tunnel_model_rate_bytes_per_second",
        "Bottleneck rate the satellite controller measured (payload)",
        r,
        &|f| (f.model_rate > 0).then_some(f.model_rate as f64),
    );
    gauge(
        "tunnel_model_base_rtt_seconds",
        "Base RTT the satellite controller measured",
        r,
        &|f| f.model_rtt.map(|d| d.as_secs_f64()),
    );
    gauge(
        "tunnel_channel_loss_ratio",
        "Share of packets the hop loses to noise (not to a full buffer), as the satellite controller measured it",
        r,
        &|f| f.channel_loss,
    );
    gauge(
        "tunnel_loss_burst_packets",
        "Mean length of the hop's bursts of noise losses, packets (1: independent), as the satellite controller measured it",
        r,
        &|f| f.loss_burst.map(|b| b as f64),
    );
    gauge(
        "tunnel_shallow_buffer_seconds",
        "Depth of a bottleneck buffer shallower than the satellite controller's slack, once losses showed one (the controller then queues half of it)",
        r,
        &|f| f.shallow_buffer.map(|d| d.as_secs_f64()),
    );
    // A state set, as Prometheus writes one: 1 for the current phase, 0 for the others.
    let phases = Labelled::<Gauge<f64, AtomicU64>>::default();
    for (peer, name, f) in &figures {
        let Some(now) = f.phase else { continue };
        for p in satpep_tunnel::congestion::satellite::Phase::ALL {
            phases
                .get_or_create(&labels(&[
                    ("peer", peer),
                    ("name", name),
                    ("phase", p.name()),
                ]))
                .set(if p == now { 1.0 } else { 0.0 });
        }
    }
    r.register(
        "tunnel_controller_phase",
        "The satellite controller's phase (1 for the current one): startup, drain, cruise, probe or compete",
        phases,
    );
    let counter = |name: &str,
                   help: &str,
                   r: &mut prometheus_client::registry::Registry,
                   v: &dyn Fn(&TunnelFigures) -> Vec<LabelledValue>| {
        let fam = Labelled::<Counter>::default();
        for (peer, name, f) in &figures {
            for (key, val, x) in v(f) {
                let mut l = labels(&[("peer", peer), ("name", name)]);
                if !key.is_empty() {
                    l.push((key.into(), val.into()));
                }
                fam.get_or_create(&l).inc_by(x);
            }
        }
        r.register(name, help, fam);
    };
    counter(
        "tunnel_sent_packets",
        "Packets sent on the tunnel connection",
        r,
        &|f| vec![("", "", f.sent)],
    );
    counter(
        "tunnel_lost_packets",
        "Packets declared lost on the tunnel connection",
        r,
        &|f| vec![("", "", f.lost)],
    );
    counter(
        "tunnel_loss_events",
        "Loss events by the satellite controller's reading: the channel's noise or congestion",
        r,
        &|f| {
            vec![
                ("kind", "random", f.random),
                ("kind", "congestion", f.congestion),
            ]
        },
    );
    // `direction` means what it means in relayed_bytes (up: towards the servers) at both
    // ends, so one query reads both: a terminal sends up, a gateway down.
    let (sent, received) = match reg.mode {
        Mode::Gateway => ("down", "up"),
        _ => ("up", "down"),
    };
    counter(
        "tunnel_udp_bytes",
        "UDP bytes of the tunnel connection (up: towards the servers)",
        r,
        &|f| {
            vec![
                ("direction", sent, f.udp_tx),
                ("direction", received, f.udp_rx),
            ]
        },
    );
    counter(
        "tunnel_flow_control_blocked",
        "Times this side was blocked by the peer's flow control (windows too small)",
        r,
        &|f| vec![("", "", f.blocked)],
    );
}

/// The standard process metrics every Prometheus client exports (what dashboards and
/// alerts for any service expect): CPU seconds, resident and virtual memory, open and
/// allowed descriptors, threads and start time, read from /proc/self. A figure that cannot
/// be read is left out.
fn process_metrics(r: &mut prometheus_client::registry::Registry) {
    use procfs::prelude::*;
    let Ok(me) = procfs::process::Process::myself() else {
        return;
    };
    if let Ok(stat) = me.stat() {
        let tps = procfs::ticks_per_second() as f64;
        r.register(
            "process_cpu_seconds",
            "User and system CPU time spent, seconds",
            ConstCounter::new((stat.utime + stat.stime) as f64 / tps),
        );
        r.register(
            "process_resident_memory_bytes",
            "Resident memory size, bytes",
            ConstGauge::new(stat.rss_bytes().get() as i64),
        );
        r.register(
            "process_virtual_memory_bytes",
            "Virtual memory size, bytes",
            ConstGauge::new(stat.vsize as i64),
        );
        r.register(
            "process_threads",
            "Threads",
            ConstGauge::new(stat.num_threads),
        );
        if let Ok(boot) = procfs::boot_time_secs() {
            r.register(
                "process_start_time_seconds",
                "Start time since the Unix epoch, seconds",
                ConstGauge::new(boot as f64 + stat.starttime as f64 / tps),
            );
        }
    }
    if let Ok(n) = me.fd_count() {
        r.register(
            "process_open_fds",
            "Open file descriptors",
            ConstGauge::new(n as i64),
        );
    }
    if let Ok(l) = me.limits() {
        if let procfs::process::LimitValue::Value(v) = l.max_open_files.soft_limit {
            r.register(
                "process_max_fds",
                "The open file descriptor limit",
                ConstGauge::new(v as i64),
            );
        }
    }
}

/// The Prometheus exposition of `reg`.
pub fn metrics(reg: &Registry) -> String {
    let k = &reg.counters;
    let (live, (sat, ter)) = reg.status_and_retransmitted();
    // A leader's figures include its workers' (`proxy.workers`); the per-connection
    // series (RTT, window) are its own connections'.
    let w = reg.workers.get().map(|s| s.totals()).unwrap_or_default();
    // The standard process_* families have no prefix; everything of satpep's has `satpep_`.
    let mut root = prometheus_client::registry::Registry::default();
    process_metrics(&mut root);
    let r = root.sub_registry_with_prefix("satpep");
    r.register(
        "connections_active",
        "Connections being relayed",
        ConstGauge::new((k.active.load(Relaxed) + w.active) as i64),
    );
    r.register(
        "connections",
        "Connections accepted",
        ConstCounter::new(k.total.load(Relaxed) + w.accepted),
    );
    r.register(
        "connections_failed",
        "Connections whose server could not be reached",
        ConstCounter::new(k.failed.load(Relaxed) + w.failed),
    );
    if let Some(shared) = reg.workers.get() {
        r.register(
            "workers",
            "Worker processes listening beside this one (proxy.workers)",
            ConstGauge::new(w.workers as i64),
        );
        let per = Labelled::<Gauge>::default();
        for i in 1..=crate::workers::MAX_WORKERS {
            let s = shared.slot(i);
            if s.pid.load(Relaxed) != 0 {
                per.get_or_create(&labels(&[("worker", &i.to_string())]))
                    .set(s.active.load(Relaxed) as i64);
            }
        }
        r.register(
            "worker_connections_active",
            "Connections each worker process is relaying",
            per,
        );
    }
    r.register(
        "connections_bypassed",
        "Connections forwarded unsplit because the proxy was at its limit",
        ConstCounter::new(reg.bypassed()),
    );
    r.register(
        "connections_copied",
        "Connections relayed by copying instead of splice",
        ConstCounter::new(k.copied.load(Relaxed) + w.copied),
    );
    r.register(
        "flow_control_drops",
        "Segments drop-based flow control dropped (proxy.drop_flow_control)",
        ConstCounter::new(crate::flow_control::drops_total()),
    );
    r.register(
        "memory_bytes",
        "Memory buffered for connections: kernel TCP memory (whole host) plus relay pipes",
        ConstGauge::new(crate::server::buffered_memory() as i64),
    );
    r.register(
        "memory_limit_bytes",
        "Memory past which new connections bypass the proxy",
        ConstGauge::new(k.memory_limit.load(Relaxed) as i64),
    );
    r.register(
        "connections_limit",
        "Connections past which new ones bypass the proxy (0: no limit, as at a gateway)",
        ConstGauge::new((k.max_connections.load(Relaxed) + w.limit) as i64),
    );
    r.register(
        "overloads",
        "Times the connection or memory limit was reached",
        ConstCounter::new(k.overloads.load(Relaxed)),
    );
    let bytes = Labelled::<Counter>::default();
    let (up, down) = reg.relayed();
    let (up, down) = (up + w.bytes_up, down + w.bytes_down);
    bytes
        .get_or_create(&labels(&[("direction", "up")]))
        .inc_by(up);
    bytes
        .get_or_create(&labels(&[("direction", "down")]))
        .inc_by(down);
    r.register(
        "relayed_bytes",
        "Bytes relayed (up: client to server)",
        bytes,
    );
    let rtt = Labelled::<Gauge<f64, AtomicU64>>::default();
    let cwnd = Labelled::<Gauge<f64, AtomicU64>>::default();
    let retrans = Labelled::<Counter>::default();
    for leg in ["satellite", "terrestrial"] {
        let infos: Vec<_> = live
            .iter()
            .filter_map(|c| {
                if leg == "satellite" {
                    c.satellite.clone()
                } else {
                    c.terrestrial.clone()
                }
            })
            .collect();
        let l = labels(&[("leg", leg)]);
        // A mean over no connections is no figure: the series is absent until there is one.
        if !infos.is_empty() {
            let n = infos.len() as f64;
            rtt.get_or_create(&l)
                .set(infos.iter().map(|i| i.rtt_ms / 1000.0).sum::<f64>() / n);
            cwnd.get_or_create(&l)
                .set(infos.iter().map(|i| i.cwnd as f64).sum::<f64>() / n);
        }
        retrans
            .get_or_create(&l)
            .inc_by(if leg == "satellite" { sat } else { ter });
    }
    r.register(
        "leg_rtt_seconds",
        "Mean smoothed RTT of live connections per leg",
        rtt,
    );
    r.register(
        "leg_cwnd_segments",
        "Mean congestion window of live connections per leg",
        cwnd,
    );
    r.register(
        "leg_retransmitted_segments",
        "Segments retransmitted per leg since start",
        retrans,
    );
    r.register(
        "interception_installed",
        "1 while the interception rules are installed (checked every 2 s, reinstalled if removed)",
        ConstGauge::new(k.interception_installed.load(Relaxed) as i64),
    );
    r.register(
        "interception_reinstalls",
        "Times the interception rules were found removed and installed again",
        ConstCounter::new(k.interception_reinstalls.load(Relaxed)),
    );
    r.register(
        "config_reloads",
        "Configuration reloads (SIGHUP) applied",
        ConstCounter::new(k.reloads.load(Relaxed)),
    );
    r.register(
        "config_reload_failures",
        "Configuration reloads refused (invalid file, rules that did not install)",
        ConstCounter::new(k.reload_failures.load(Relaxed)),
    );
    tunnel_metrics(r, reg);
    carrier_metrics(r, reg);
    r.register(
        "build",
        "satpep's version",
        Info::new(vec![(
            "version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        )]),
    );
    let mut out = String::new();
    let _ = encode(&mut out, &root);
    out
}

/// What one listener serves.
#[derive(Debug, Clone, Copy)]
pub struct Routes {
    /// `/metrics`.
    pub metrics: bool,
    /// `/connections`.
    pub connections: bool,
}

async fn serve_one(mut s: tokio::net::TcpStream, reg: Arc<Registry>, routes: Routes) {
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    // Read the request head: at most 8 KiB, at most 5 s.
    let head = tokio::time::timeout(Duration::from_secs(5), async {
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    if head.is_err() {
        return;
    }
    let line = String::from_utf8_lossy(&req);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (code, ctype, body) = match (line.split_whitespace().next(), path) {
        (Some("GET"), "/metrics") if routes.metrics => ("200 OK", CONTENT_TYPE, metrics(&reg)),
        (Some("GET"), "/connections") if routes.connections => {
            let k = &reg.counters;
            let workers = reg.workers.get().map(|s| s.totals()).unwrap_or_default();
            let reply = StatusReply {
                connections: reg.status(),
                total: k.total.load(Relaxed) + workers.accepted,
                failed: k.failed.load(Relaxed) + workers.failed,
                bypassed: reg.bypassed(),
                piped_bytes: crate::relay::piped_bytes(),
                flow_drops: crate::flow_control::drops_total(),
                tunnels: reg
                    .tunnels()
                    .iter()
                    .map(|t| TunnelStatus::of(t, &reg))
                    .collect(),
                carrier: reg.carrier(),
            };
            (
                "200 OK",
                "application/json",
                serde_json::to_string(&reply).unwrap(),
            )
        }
        _ => (
            "404 Not Found",
            "text/plain",
            match (routes.metrics, routes.connections) {
                (true, true) => "try /metrics or /connections\n",
                (true, false) => {
                    "try /metrics (/connections is not served here: see proxy.connections)\n"
                }
                _ => "try /connections\n",
            }
            .into(),
        ),
    };
    let resp = format!(
        "HTTP/1.0 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Serves `routes` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, reg: Arc<Registry>, routes: Routes) {
    loop {
        if let Ok((s, _)) = listener.accept().await {
            // Status reads TCP_INFO and may run nft: off the accept loop.
            tokio::spawn(serve_one(s, reg.clone(), routes));
        }
    }
}

/// Fetches `/connections` from a proxy's endpoint (for `satpep status`).
pub fn fetch_status(addr: SocketAddr) -> Result<StatusReply, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|e| format!("no satpep proxy answers on {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /connections HTTP/1.0\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .map_err(|e| format!("reading from {addr}: {e}"))?;
    let (head, body) = resp.split_once("\r\n\r\n").ok_or("malformed reply")?;
    if !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "{addr} does not serve /connections ({}): see proxy.connections in its configuration",
            head.lines().next().unwrap_or("")
        ));
    }
    serde_json::from_str(body).map_err(|e| format!("bad reply from {addr}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Mode;

    /// Which tunnel figures each kind of proxy exports: none at a split proxy, whose
    /// `tunnel_connected` 0 once paged as "tunnel down"; the terminal's one tunnel as
    /// `tunnel_connected`; a gateway's terminals as `tunnel_peers`, which reads 0 while all
    /// are quiet without meaning anything is down.
    #[test]
    fn a_shared_carrier_s_terminals_are_series_by_name_and_absent_without_one() {
        let reg = Registry::new(Mode::Split);
        assert!(!metrics(&reg).contains("carrier_terminal"));
        reg.set_carrier(vec![crate::registry::CarrierTerminal {
            name: "t2".into(),
            flows: 3,
            busy: 2,
            sending_bps: 17_900_000,
            share_bps: 18_000_000,
            acked_bytes: 5_000_000,
            retransmitted: 7,
            rtt_ms: 32.5,
        }]);
        let m = metrics(&reg);
        for line in [
            "satpep_carrier_terminal_flows{terminal=\"t2\"} 3.0",
            "satpep_carrier_terminal_busy_flows{terminal=\"t2\"} 2.0",
            "satpep_carrier_terminal_share_bits_per_second{terminal=\"t2\"} 18000000.0",
            "satpep_carrier_terminal_rtt_seconds{terminal=\"t2\"} 0.0325",
            "satpep_carrier_terminal_acked_bytes_total{terminal=\"t2\"} 5000000",
            "satpep_carrier_terminal_retransmitted_segments_total{terminal=\"t2\"} 7",
        ] {
            assert!(m.contains(line), "{line} in {m}");
        }
        reg.set_carrier(Vec::new());
        assert!(!metrics(&reg).contains("carrier_terminal"));
    }

    #[test]
    fn tunnel_figures_follow_what_the_proxy_is() {
        let split = metrics(&Registry::new(Mode::Split));
        assert!(!split.contains("satpep_tunnel_"), "{split}");
        let terminal = metrics(&Registry::new(Mode::Terminal));
        assert!(
            terminal.contains("\nsatpep_tunnel_connected 0\n"),
            "{terminal}"
        );
        assert!(!terminal.contains("satpep_tunnel_peers"), "{terminal}");
        let gateway = metrics(&Registry::new(Mode::Gateway));
        assert!(gateway.contains("\nsatpep_tunnel_peers 0\n"), "{gateway}");
        assert!(!gateway.contains("satpep_tunnel_connected"), "{gateway}");
        // The standard process families, unprefixed, as every exporter has them.
        for family in [
            "\nprocess_cpu_seconds_total ",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_open_fds ",
            "\nprocess_max_fds ",
            "\nprocess_start_time_seconds ",
        ] {
            assert!(split.contains(family), "{family} in {split}");
        }
        // The alert that pages on a lost tunnel reads only the terminal's figure.
        let rules = include_str!("../../../dist/prometheus/satpep-alerts.yml");
        assert!(rules.contains("expr: satpep_tunnel_connected == 0"));
        assert!(!rules.contains("satpep_tunnel_peers =="));
    }
}
