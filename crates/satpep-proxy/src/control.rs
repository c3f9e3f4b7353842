//! The proxy's local HTTP endpoint: `GET /metrics` (Prometheus text format) and
//! `GET /connections` (JSON, read by `satpep status`). Plain HTTP/1.0, one request per
//! connection: two read-only endpoints do not need a web framework.

use crate::netfilter;
use crate::registry::{ConnStatus, Registry};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
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
}

/// The Prometheus exposition of `reg`.
pub fn metrics(reg: &Registry) -> String {
    let k = &reg.counters;
    let live = reg.status();
    let mut r = prometheus_client::registry::Registry::with_prefix("satpep");
    r.register(
        "connections_active",
        "Connections being relayed",
        ConstGauge::new(k.active.load(Relaxed) as i64),
    );
    r.register(
        "connections",
        "Connections accepted",
        ConstCounter::new(k.total.load(Relaxed)),
    );
    r.register(
        "connections_failed",
        "Connections whose server could not be reached",
        ConstCounter::new(k.failed.load(Relaxed)),
    );
    r.register(
        "connections_bypassed",
        "Connections forwarded unsplit because the proxy was at its limit",
        ConstCounter::new(netfilter::bypassed().unwrap_or(0)),
    );
    r.register(
        "connections_copied",
        "Connections relayed by copying instead of splice",
        ConstCounter::new(k.copied.load(Relaxed)),
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
        "overloads",
        "Times the connection or memory limit was reached",
        ConstCounter::new(k.overloads.load(Relaxed)),
    );
    let bytes = Family::<Vec<(String, String)>, Gauge<u64, AtomicU64>>::default();
    let up: u64 = k.bytes_up.load(Relaxed) + live.iter().map(|c| c.bytes_up).sum::<u64>();
    let down: u64 = k.bytes_down.load(Relaxed) + live.iter().map(|c| c.bytes_down).sum::<u64>();
    bytes
        .get_or_create(&vec![("direction".into(), "up".into())])
        .set(up);
    bytes
        .get_or_create(&vec![("direction".into(), "down".into())])
        .set(down);
    r.register(
        "relayed_bytes",
        "Bytes relayed (up: client to server)",
        bytes,
    );
    let rtt = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    let cwnd = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    let retrans = Family::<Vec<(String, String)>, Gauge<u64, AtomicU64>>::default();
    for (leg, closed) in [
        ("satellite", &k.retrans_satellite),
        ("terrestrial", &k.retrans_terrestrial),
    ] {
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
        let n = infos.len().max(1) as f64;
        let l = vec![("leg".to_string(), leg.to_string())];
        rtt.get_or_create(&l)
            .set(infos.iter().map(|i| i.rtt_ms / 1000.0).sum::<f64>() / n);
        cwnd.get_or_create(&l)
            .set(infos.iter().map(|i| i.cwnd as f64).sum::<f64>() / n);
        retrans
            .get_or_create(&l)
            .set(closed.load(Relaxed) + infos.iter().map(|i| i.total_retrans as u64).sum::<u64>());
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
        "leg_retransmits",
        "Segments retransmitted per leg since start",
        retrans,
    );
    let mut out = String::new();
    let _ = encode(&mut out, &r);
    out
}

async fn serve_one(mut s: tokio::net::TcpStream, reg: Arc<Registry>) {
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
        (Some("GET"), "/metrics") => ("200 OK", "text/plain; version=0.0.4", metrics(&reg)),
        (Some("GET"), "/connections") => {
            let k = &reg.counters;
            let reply = StatusReply {
                connections: reg.status(),
                total: k.total.load(Relaxed),
                failed: k.failed.load(Relaxed),
                bypassed: netfilter::bypassed().unwrap_or(0),
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
            "try /metrics or /connections\n".into(),
        ),
    };
    let resp = format!(
        "HTTP/1.0 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Serves the endpoint on `addr` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, reg: Arc<Registry>) {
    loop {
        if let Ok((s, _)) = listener.accept().await {
            // Status reads TCP_INFO and may run nft: off the accept loop.
            tokio::spawn(serve_one(s, reg.clone()));
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
    let body = resp.split("\r\n\r\n").nth(1).ok_or("malformed reply")?;
    serde_json::from_str(body).map_err(|e| format!("bad reply from {addr}: {e}"))
}
