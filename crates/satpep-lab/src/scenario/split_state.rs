//! Split mode's satellite-leg controller, sampled every half second through the sending
//! proxy's `/connections`: the model `satpep_sat` keeps per socket in the kernel (phase, rate,
//! base RTT, queue, noise, shallow buffer), which `ss` cannot show. The tunnel's counterpart
//! is [`super::tunnel_state`].

use super::traffic::Poll;
use super::tunnel_state::{fetch_page, metrics_addr};
use crate::topology::{Host, Lab};
use satpep_proxy::control::StatusReply;
use satpep_proxy::tcpinfo::{LegInfo, ModelReading};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One sample of one split connection's satellite-leg sender.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SplitSample {
    /// Seconds since the traffic started.
    pub t: f64,
    /// The proxy's connection id.
    pub conn: u64,
    /// Flow number (iperf3 port − 5201 at the server end; 0 for other ports).
    pub flow: u32,
    /// The satellite leg's TCP_INFO, as `/connections` gave it (its `model` moved out).
    pub leg: LegInfo,
    /// The satellite model the kernel controller holds for it.
    pub model: ModelReading,
}

/// Samples the split connections of the proxy in `host` (the satellite leg's sender: the
/// gateway for downloads, the terminal for uploads) every half second.
pub(crate) fn sample_split(lab: &Lab, host: Host) -> Poll<Vec<SplitSample>> {
    let addr = metrics_addr();
    Poll::start(
        lab,
        host,
        Duration::from_millis(500),
        Duration::MAX,
        move || fetch_page(addr, "/connections"),
        move |out: &mut Vec<SplitSample>, text, t| {
            out.extend(parse(text, t));
            false
        },
    )
}

/// The connections of a `/connections` reply whose satellite leg runs the satellite model.
pub fn parse(text: &str, t: f64) -> Vec<SplitSample> {
    let Ok(reply) = serde_json::from_str::<StatusReply>(text) else {
        return Vec::new();
    };
    reply
        .connections
        .into_iter()
        .filter_map(|c| {
            let mut leg = c.satellite?;
            let model = leg.model.take()?;
            let port = c
                .dst
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u32>().ok());
            Some(SplitSample {
                t,
                conn: c.id,
                flow: port.and_then(|p| p.checked_sub(5201)).unwrap_or(0),
                leg,
                model,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use satpep_proxy::registry::ConnStatus;

    #[test]
    fn reads_the_connections_that_run_the_model() {
        let leg = |model| LegInfo {
            congestion: "satpep_sat".into(),
            rtt_ms: 612.5,
            cwnd: 4000,
            total_retrans: 17,
            bytes_acked: 9_000_000,
            pacing_rate_bps: 48_000_000,
            model,
            ..LegInfo::default()
        };
        let conn = |id, dst: &str, model| ConnStatus {
            id,
            src: "198.18.0.2:40000".into(),
            dst: dst.into(),
            age_s: 3.0,
            bytes_up: 0,
            bytes_down: 9_000_000,
            satellite: Some(leg(model)),
            terrestrial: None,
            adaptive: None,
        };
        let model = ModelReading {
            phase: "cruise".into(),
            rate_bps: 47_000_000,
            base_rtt_ms: Some(560.0),
            queue_ms: 12.5,
            channel_loss: Some(0.001),
            loss_burst: Some(1),
            shallow_buffer_ms: None,
        };
        let reply = StatusReply {
            connections: vec![
                conn(7, "198.18.1.2:5202", Some(model)),
                // Another controller: nothing to read.
                conn(8, "198.18.1.2:5201", None),
            ],
            total: 2,
            failed: 0,
            bypassed: 0,
        };
        let text = serde_json::to_string(&reply).unwrap();
        let s = parse(&text, 2.5);
        assert_eq!(s.len(), 1, "{s:?}");
        let s = &s[0];
        assert_eq!(
            (s.t, s.conn, s.flow, s.leg.cwnd, s.leg.total_retrans),
            (2.5, 7, 1, 4000, 17)
        );
        assert_eq!(s.leg.model, None);
        assert_eq!(s.model.phase, "cruise");
        assert_eq!(s.model.rate_bps, 47_000_000);
        assert_eq!(s.model.base_rtt_ms, Some(560.0));
        assert_eq!(s.model.queue_ms, 12.5);
        assert_eq!(s.model.channel_loss, Some(0.001));
        // Not JSON (a proxy that answered something else): no samples, no panic.
        assert!(parse("HTTP/1.0 404", 1.0).is_empty());
    }
}
