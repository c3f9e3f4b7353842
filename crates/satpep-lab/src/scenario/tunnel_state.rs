//! The tunnel's sending end, sampled every half second through its proxy's `/metrics`
//! endpoint. `ss` sees TCP only, so in tunnel mode the sockets it samples are the server's,
//! on the terrestrial leg; this is the satellite hop's own controller: its window, RTT, rate
//! model and phase.

use super::traffic::Poll;
use crate::topology::{Host, Lab};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One sample of the tunnel's sending end.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TunnelSample {
    /// Seconds since the traffic started.
    pub t: f64,
    /// Congestion window, bytes.
    pub window_bytes: u64,
    /// Smoothed RTT, ms.
    pub rtt_ms: f64,
    /// The satellite controller's rate model, bit/s (None with other controllers).
    pub model_rate_bps: Option<f64>,
    /// The satellite controller's base RTT, ms.
    pub model_base_rtt_ms: Option<f64>,
    /// The satellite controller's phase: startup, drain, cruise, probe or compete (empty
    /// with other controllers).
    pub phase: String,
    /// Packets sent on the tunnel connection since it came up (a counter).
    #[serde(default)]
    pub sent_packets: Option<u64>,
    /// Packets the tunnel's sender declared lost since it came up (a counter).
    #[serde(default)]
    pub lost_packets: Option<u64>,
    /// UDP bytes the tunnel's sender put on the link since it came up (a counter): with the
    /// next sample, the rate it sent at, repairs and overhead included.
    #[serde(default)]
    pub udp_tx_bytes: Option<u64>,
    /// The share of packets the satellite controller measured the hop losing to noise
    /// (None before its first drain, and with other controllers).
    #[serde(default)]
    pub channel_loss: Option<f64>,
    /// The noise's mean burst, packets, as the controller measured it.
    #[serde(default)]
    pub loss_burst: Option<f64>,
    /// A buffer shallower than the controller's slack, ms, once it found one.
    #[serde(default)]
    pub shallow_buffer_ms: Option<f64>,
}

/// Where the lab's proxies serve `/metrics`: the proxy's default (the lab does not move it).
pub fn metrics_addr() -> SocketAddr {
    satpep_proxy::config::ProxyFile::default()
        .proxy
        .metrics
        .parse()
        .expect("the proxy's default metrics address parses")
}

/// Samples the tunnel of the proxy in `host` every half second, from its `/metrics`.
pub(crate) fn sample_tunnel(lab: &Lab, host: Host) -> Poll<Vec<TunnelSample>> {
    let addr = metrics_addr();
    Poll::start(
        lab,
        host,
        Duration::from_millis(500),
        Duration::MAX,
        move || fetch(addr),
        move |out: &mut Vec<TunnelSample>, text, t| {
            out.extend(parse(text, t, host));
            false
        },
    )
}

/// Waits until the tunnel of the proxy in `host` is up (its `/metrics` report
/// `satpep_tunnel_connected` 1 or more), for at most `limit`. A deployed terminal keeps its
/// tunnel up for months; a run that started its traffic during the handshake would count
/// the handshake's repairs (seconds on a lossy T1: a lost Initial waits out QUIC's probe
/// timer) against the tunnel's goodput.
pub(crate) fn wait_connected(lab: &Lab, host: Host, limit: Duration) -> Result<(), String> {
    let addr = metrics_addr();
    let up = Poll::start(
        lab,
        host,
        Duration::from_millis(100),
        limit,
        move || fetch(addr),
        |up: &mut bool, text, _| {
            *up = connected(text);
            *up
        },
    )
    .join()
    .map_err(|e| format!("waiting for the {} proxy's tunnel: {e}", host.name()))?;
    match up {
        true => Ok(()),
        false => Err(format!(
            "the {} proxy's tunnel was not up {} s after it started (its log says why)",
            host.name(),
            limit.as_secs()
        )),
    }
}

/// Waits until the gateway's proxy counts `terminals` tunnels (a star's every terminal
/// connected), up to `limit`.
pub(crate) fn wait_peers(lab: &Lab, terminals: u16, limit: Duration) -> Result<(), String> {
    let t = std::time::Instant::now();
    let mut seen = None;
    while t.elapsed() < limit {
        seen = proxy_metric(lab, Host::Gateway, "tunnel_peers");
        if seen.is_some_and(|n| n >= terminals as f64) {
            return Ok(());
        }
        if crate::interrupted() {
            return Err("interrupted".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(format!(
        "the gateway counted {} of {terminals} terminals' tunnels {} s after they started \
         (their proxies' logs say why)",
        seen.map_or("none".to_string(), |n| format!("{n:.0}")),
        limit.as_secs()
    ))
}

/// What the gateway's proxy says of each terminal's tunnel now, by terminal name: (UDP
/// bytes it sent to that terminal, connections it holds under that name), summed over the
/// connections; None if it does not answer.
pub(crate) fn gateway_per_terminal(
    lab: &Lab,
) -> Option<std::collections::BTreeMap<String, (u64, u32)>> {
    let text = metrics_text(lab, Host::Gateway)?;
    let mut by_name: std::collections::BTreeMap<String, (u64, u32)> = Default::default();
    for (n, labels, v) in samples(&text) {
        let Some(name) = label(labels, "name") else {
            continue;
        };
        let e = by_name.entry(name.to_string()).or_default();
        match n {
            "tunnel_udp_bytes_total" if label(labels, "direction") == Some("down") => {
                e.0 += v as u64
            }
            "tunnel_flows" => e.1 += 1,
            _ => {}
        }
    }
    Some(by_name)
}

/// What the proxy in `host` serves at `/metrics` now, fetched from inside its namespace;
/// None if it does not answer.
fn metrics_text(lab: &Lab, host: Host) -> Option<String> {
    let addr = metrics_addr();
    crate::checked::in_netns(&lab.ns(host), move || fetch(addr))
        .join()
        .ok()?
        .ok()?
}

/// The value of label `key` in a sample's label text (`peer="…",name="terminal2"`).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_end_matches('}').trim_matches('"'))
    })
}

/// The value of the metric `name` (without the `satpep_` prefix, summed over its labels)
/// that the proxy in `host` serves now; None if it does not answer or has no such metric.
pub(crate) fn proxy_metric(lab: &Lab, host: Host, name: &str) -> Option<f64> {
    let text = metrics_text(lab, host)?;
    let mut found = None;
    for (n, _, v) in samples(&text) {
        if n == name {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Whether a Prometheus exposition reports a tunnel up.
fn connected(text: &str) -> bool {
    samples(text).any(|(name, _, v)| name == "tunnel_connected" && v >= 1.0)
}

/// The samples of a Prometheus exposition: (name without the `satpep_` prefix, labels,
/// value), comments and unreadable lines left out.
fn samples(text: &str) -> impl Iterator<Item = (&str, &str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            let v = value.trim().parse::<f64>().ok()?;
            let (name, labels) = key.split_once('{').unwrap_or((key, ""));
            Some((name.strip_prefix("satpep_").unwrap_or(name), labels, v))
        })
}

/// The body of `GET /metrics` at `addr`, or None (the proxy not up yet, a slow reply).
fn fetch(addr: SocketAddr) -> Option<String> {
    fetch_page(addr, "/metrics")
}

/// The body of `GET path` from the proxy's endpoint at `addr`, or None (the proxy not up
/// yet, a slow reply).
pub(crate) fn fetch_page(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: satpep\r\n\r\n").as_bytes())
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200").then(|| body.to_string())
}

/// The first tunnel's figures in a Prometheus exposition of the proxy in `host`, at `t` s;
/// None when no tunnel is up (no window reported).
pub fn parse(text: &str, t: f64, host: Host) -> Option<TunnelSample> {
    // The proxy's `direction` is towards the servers (up) or the clients (down) at both
    // ends: what a terminal sends goes up, what a gateway sends down.
    let sent = match host {
        Host::Gateway | Host::Server => "direction=\"down\"",
        _ => "direction=\"up\"",
    };
    let mut s = TunnelSample {
        t,
        window_bytes: 0,
        rtt_ms: 0.0,
        model_rate_bps: None,
        model_base_rtt_ms: None,
        phase: String::new(),
        sent_packets: None,
        lost_packets: None,
        udp_tx_bytes: None,
        channel_loss: None,
        loss_burst: None,
        shallow_buffer_ms: None,
    };
    let mut window = None;
    for (name, labels, v) in samples(text) {
        match name {
            "tunnel_window_bytes" if window.is_none() => window = Some(v as u64),
            "tunnel_rtt_seconds" if s.rtt_ms == 0.0 => s.rtt_ms = v * 1e3,
            "tunnel_model_rate_bytes_per_second" if s.model_rate_bps.is_none() => {
                s.model_rate_bps = Some(v * 8.0)
            }
            "tunnel_model_base_rtt_seconds" if s.model_base_rtt_ms.is_none() => {
                s.model_base_rtt_ms = Some(v * 1e3)
            }
            "tunnel_channel_loss_ratio" if s.channel_loss.is_none() => s.channel_loss = Some(v),
            "tunnel_loss_burst_packets" if s.loss_burst.is_none() => s.loss_burst = Some(v),
            "tunnel_shallow_buffer_seconds" if s.shallow_buffer_ms.is_none() => {
                s.shallow_buffer_ms = Some(v * 1e3)
            }
            "tunnel_sent_packets_total" if s.sent_packets.is_none() => {
                s.sent_packets = Some(v as u64)
            }
            "tunnel_lost_packets_total" if s.lost_packets.is_none() => {
                s.lost_packets = Some(v as u64)
            }
            "tunnel_udp_bytes_total" if s.udp_tx_bytes.is_none() && labels.contains(sent) => {
                s.udp_tx_bytes = Some(v as u64)
            }
            "tunnel_controller_phase" if v == 1.0 && s.phase.is_empty() => {
                s.phase = labels
                    .split_once("phase=\"")
                    .and_then(|(_, rest)| rest.split_once('"'))
                    .map_or(String::new(), |(p, _)| p.to_string());
            }
            _ => {}
        }
    }
    s.window_bytes = window?;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_tunnel_of_an_exposition() {
        // As the proxy writes it (its registry's prefix; the phase a state set).
        let text = "# HELP satpep_tunnel_window_bytes Congestion window\n\
            # TYPE satpep_tunnel_window_bytes gauge\n\
            satpep_tunnel_window_bytes{peer=\"198.18.2.1:7701\"} 3541376.0\n\
            satpep_tunnel_rtt_seconds{peer=\"198.18.2.1:7701\"} 0.5832\n\
            satpep_tunnel_model_rate_bytes_per_second{peer=\"198.18.2.1\"} 5830107.0\n\
            satpep_tunnel_model_base_rtt_seconds{peer=\"198.18.2.1:7701\"} 0.5604\n\
            satpep_tunnel_controller_phase{peer=\"198.18.2.1:7701\",phase=\"startup\"} 0.0\n\
            satpep_tunnel_controller_phase{peer=\"198.18.2.1:7701\",phase=\"drain\"} 1.0\n\
            satpep_tunnel_channel_loss_ratio{peer=\"198.18.2.1:7701\"} 0.0125\n\
            satpep_tunnel_loss_burst_packets{peer=\"198.18.2.1:7701\"} 25\n\
            satpep_tunnel_shallow_buffer_seconds{peer=\"198.18.2.1:7701\"} 0.003\n\
            satpep_tunnel_sent_packets_total{peer=\"198.18.2.1:7701\"} 120\n\
            satpep_tunnel_lost_packets_total{peer=\"198.18.2.1:7701\"} 7\n\
            satpep_tunnel_udp_bytes_total{peer=\"198.18.2.1:7701\",direction=\"up\"} 900\n\
            satpep_tunnel_udp_bytes_total{peer=\"198.18.2.1:7701\",direction=\"down\"} 150000\n\
            satpep_tunnel_window_bytes{peer=\"198.18.2.9:7701\"} 5.0\n";
        // A gateway's exposition: it sends down.
        let s = parse(text, 1.5, Host::Gateway).unwrap();
        assert_eq!(s.t, 1.5);
        assert_eq!(s.window_bytes, 3_541_376);
        assert!((s.rtt_ms - 583.2).abs() < 1e-9);
        assert_eq!(s.model_rate_bps, Some(46_640_856.0));
        assert!((s.model_base_rtt_ms.unwrap() - 560.4).abs() < 1e-9);
        assert_eq!(s.phase, "drain");
        assert_eq!(s.sent_packets, Some(120));
        assert_eq!(
            label("peer=\"198.18.2.1:7701\",name=\"terminal2\"}", "name"),
            Some("terminal2")
        );
        assert_eq!(label("peer=\"a\"", "name"), None);
        assert_eq!(s.lost_packets, Some(7));
        assert_eq!(s.udp_tx_bytes, Some(150_000));
        assert_eq!(s.channel_loss, Some(0.0125));
        assert_eq!(s.loss_burst, Some(25.0));
        assert_eq!(s.shallow_buffer_ms, Some(3.0));
        // A terminal sends up.
        assert_eq!(
            parse(text, 1.5, Host::Terminal).unwrap().udp_tx_bytes,
            Some(900)
        );
        // No tunnel up: no sample.
        assert_eq!(
            parse("satpep_tunnel_connected 0\n", 0.0, Host::Terminal),
            None
        );
        assert!(!connected("satpep_tunnel_connected 0\n"));
        assert!(connected(
            "# TYPE satpep_tunnel_connected gauge\nsatpep_tunnel_connected 1\n"
        ));
        assert!(!connected("satpep_tunnel_connected_total 3\n"));
    }
}
