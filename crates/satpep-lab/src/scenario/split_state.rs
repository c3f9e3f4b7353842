//! Split mode's proxies, sampled every half second through their `/connections`: what each
//! holds for its connections (sockets' queues and relay pipes), and the satellite-leg
//! controller of the sending one, the model `satpep_sat` keeps per socket in the kernel
//! (phase, rate, base RTT, queue, noise, shallow buffer), which `ss` cannot show. The
//! tunnel's counterpart is [`super::tunnel_state`].

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

/// What a split proxy's `/connections` showed over a run.
#[derive(Debug, Default)]
pub(crate) struct ProxySamples {
    /// What it held, each time.
    pub held: Vec<HeldSample>,
    /// Its connections' satellite models, when asked for.
    pub models: Vec<SplitSample>,
}

/// Reads the split proxy in `host` every half second, one `/connections` fetch serving both
/// readings: what it holds and, with `models` (the satellite leg's sender: the gateway for
/// downloads, the terminal for uploads), its connections' satellite models.
pub(crate) fn sample_proxy(lab: &Lab, host: Host, models: bool) -> Poll<ProxySamples> {
    let addr = metrics_addr();
    Poll::start(
        lab,
        host,
        Duration::from_millis(500),
        Duration::MAX,
        move || fetch_page(addr, "/connections"),
        move |out: &mut ProxySamples, text, t| {
            if let Ok(reply) = serde_json::from_str::<StatusReply>(text) {
                out.held.push(held_of(&reply, t));
                if models {
                    out.models.extend(models_of(reply, t));
                }
            }
            false
        },
    )
}

/// The connections of a `/connections` reply whose satellite leg runs the satellite model.
pub fn parse(text: &str, t: f64) -> Vec<SplitSample> {
    serde_json::from_str::<StatusReply>(text).map_or_else(|_| Vec::new(), |r| models_of(r, t))
}

fn models_of(reply: StatusReply, t: f64) -> Vec<SplitSample> {
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

/// What a split proxy holds for its connections at one moment (`/connections`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct HeldSample {
    /// Seconds since the traffic started.
    pub t: f64,
    /// Bytes in its sockets' receive and send queues (both legs of every connection) and
    /// its relay pipes.
    pub bytes: u64,
    /// Segments its flow control has dropped since it started.
    pub drops: u64,
}

/// What a split run's proxies held, both together.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HeldRecord {
    /// Median over the run's samples, bytes.
    pub p50_bytes: f64,
    /// Most, bytes.
    pub max_bytes: f64,
    /// Segments flow control dropped during the run.
    pub drops: u64,
    /// Each proxy's median, bytes: the terminal's, then the gateway's (where it sits).
    #[serde(default)]
    pub p50_by_proxy: Vec<f64>,
}

/// The bytes a `/connections` reply says its proxy holds.
pub fn held(text: &str, t: f64) -> Option<HeldSample> {
    let reply = serde_json::from_str::<StatusReply>(text).ok()?;
    Some(held_of(&reply, t))
}

fn held_of(reply: &StatusReply, t: f64) -> HeldSample {
    let legs = reply
        .connections
        .iter()
        .flat_map(|c| [&c.satellite, &c.terrestrial])
        .flatten();
    HeldSample {
        t,
        bytes: reply.piped_bytes + legs.map(|l| l.recv_queue + l.send_queue).sum::<u64>(),
        drops: reply.flow_drops,
    }
}

/// Both proxies' samples summed sample by sample (they are taken on the same half-second
/// clock), then their median and most; the drops during the run.
pub fn held_record(proxies: &[Vec<HeldSample>]) -> Option<HeldRecord> {
    let n = proxies.iter().map(Vec::len).min()?;
    if n == 0 {
        return None;
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let p50_by_proxy = proxies
        .iter()
        .map(|p| median(p.iter().map(|s| s.bytes as f64).collect()))
        .collect();
    let mut total: Vec<f64> = (0..n)
        .map(|i| proxies.iter().map(|p| p[i].bytes as f64).sum())
        .collect();
    total.sort_by(f64::total_cmp);
    let drops = proxies
        .iter()
        .map(|p| p[p.len() - 1].drops - p[0].drops)
        .sum();
    Some(HeldRecord {
        p50_bytes: total[n / 2],
        max_bytes: total[n - 1],
        drops,
        p50_by_proxy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use satpep_proxy::registry::ConnStatus;

    #[test]
    fn held_bytes_sum_both_legs_pipes_and_proxies() {
        let leg = |rq, sq| LegInfo {
            recv_queue: rq,
            send_queue: sq,
            ..LegInfo::default()
        };
        let reply = |piped, drops, legs: Vec<(u64, u64)>| {
            let connections = legs
                .chunks(2)
                .enumerate()
                .map(|(i, l)| ConnStatus {
                    id: i as u64,
                    src: "198.18.1.2:40000".into(),
                    dst: "198.18.3.2:80".into(),
                    age_s: 1.0,
                    bytes_up: 0,
                    bytes_down: 0,
                    satellite: Some(leg(l[0].0, l[0].1)),
                    terrestrial: Some(leg(l[1].0, l[1].1)),
                    adaptive: None,
                })
                .collect();
            serde_json::to_string(&StatusReply {
                connections,
                total: 1,
                failed: 0,
                bypassed: 0,
                piped_bytes: piped,
                flow_drops: drops,
                tunnels: Vec::new(),
                carrier: Vec::new(),
            })
            .unwrap()
        };
        let s = held(&reply(1000, 3, vec![(10, 20), (30, 40)]), 0.5).unwrap();
        assert_eq!((s.t, s.bytes, s.drops), (0.5, 1100, 3));
        assert!(held("not json", 0.5).is_none());
        let a = vec![
            held(&reply(0, 3, vec![(100, 0), (0, 0)]), 0.5).unwrap(),
            held(&reply(0, 5, vec![(300, 0), (0, 0)]), 1.0).unwrap(),
            held(&reply(0, 9, vec![(200, 0), (0, 0)]), 1.5).unwrap(),
        ];
        let b = vec![
            held(&reply(50, 0, vec![]), 0.5).unwrap(),
            held(&reply(50, 1, vec![]), 1.0).unwrap(),
        ];
        // Two samples in common: 150 and 350 bytes; drops 6 + 1.
        let r = held_record(&[a, b]).unwrap();
        assert_eq!((r.p50_bytes, r.max_bytes, r.drops), (350.0, 350.0, 7));
        assert_eq!(r.p50_by_proxy, vec![200.0, 50.0]);
        assert!(held_record(&[]).is_none());
    }

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
            piped_bytes: 0,
            flow_drops: 0,
            tunnels: Vec::new(),
            carrier: Vec::new(),
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
