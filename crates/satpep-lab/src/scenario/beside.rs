//! What runs beside a bulk transfer, to see what it does to everything else on the link: a
//! ping probe (queueing delay), constant-rate UDP cross traffic (its loss), a competing
//! end-to-end TCP flow (the share each gets) and small request/responses through the PEP
//! (their response time).

use super::kinds::bulk::Bulk;
use crate::http::HttpServer;
use crate::iperf::{spawn_client, spawn_client_after, spawn_client_to, Server, UDP_FRAME_OVERHEAD};
use crate::topology::{Host, Lab, CLIENT_DEV, SERVER_DEV, SERVER_V4};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::process::{Child, Stdio};

/// Port of the cross traffic's iperf3 (UDP).
pub const CROSS_PORT: u16 = 5301;
/// Port of the competing end-to-end TCP flow's iperf3; the lab's proxies never intercept it.
pub const COMPETING_PORT: u16 = crate::topology::END_TO_END_PORT;
/// Port of the first background flow's iperf3 (one port each).
pub const BACKGROUND_PORT: u16 = 5410;
/// Payload bytes of each cross-traffic datagram.
const CROSS_DATAGRAM: u32 = 1200;

/// What constant-rate cross traffic of `bps` (iperf3's rate: UDP payload) takes of the link,
/// in frame bits per second.
pub fn cross_frame_bps(bps: f64) -> f64 {
    bps * (CROSS_DATAGRAM + UDP_FRAME_OVERHEAD) as f64 / CROSS_DATAGRAM as f64
}
/// Ping probe interval, seconds.
const PROBE_INTERVAL_S: f64 = 0.1;
/// ICMP, IPv4 and Ethernet headers around ping's data on the link.
pub(crate) const ECHO_HEADERS: u32 = 8 + 20 + 14;
/// Size of a probe's echo request and reply frame on the link (ping's default 56 data
/// bytes and the headers).
const PROBE_FRAME: f64 = (56 + ECHO_HEADERS) as f64;

/// What the traffic beside a bulk run saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BesideRecord {
    /// Probe: (seconds since the bulk start when the echo request left, queueing delay ms =
    /// RTT above the path's base RTT at that moment).
    #[serde(default)]
    pub queue: Vec<(f64, f64)>,
    /// Probe: echo requests sent and answered.
    #[serde(default)]
    pub probes: (u32, u32),
    /// Cross traffic: share of its datagrams lost (0–1).
    #[serde(default)]
    pub cross_loss: Option<f64>,
    /// Competing end-to-end TCP flow: goodput after the warm-up, bit/s.
    #[serde(default)]
    pub competing_bps: Option<f64>,
    /// The transfer's goodput over the competing flow's measured span (from its arrival
    /// plus the warm-up), bit/s, when it arrived later (`competing_after`); otherwise the
    /// transfer's own goodput is compared with it.
    #[serde(default)]
    pub transfer_beside_competing_bps: Option<f64>,
    /// Request/responses: seconds each, the first (which also connects) left out.
    #[serde(default)]
    pub responses: Vec<f64>,
    /// Background flows: each one's goodput after the warm-up, bit/s (NaN where one gave
    /// no result).
    #[serde(default)]
    pub background_bps: Vec<f64>,
    /// The emulator's uptime when the transfer started, s: the clock of the link's rate and
    /// delay traces (a probe sample at t happened at trace time uptime + t).
    #[serde(default)]
    pub link_uptime_s: Option<f64>,
}

impl BesideRecord {
    /// The probe's queueing delays from `from_s` on, ms.
    pub fn queue_after(&self, from_s: f64) -> Vec<f64> {
        self.queue
            .iter()
            .filter(|(t, _)| *t >= from_s)
            .map(|&(_, q)| q)
            .collect()
    }
}

/// The `p`-th percentile (0–100) of `v`, nearest rank; NaN when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// Processes started beside the bulk flows; [`Beside::finish`] collects them.
pub struct Beside {
    ping: Option<Child>,
    cross: Option<(Server, Child)>,
    competing: Option<(Server, Child)>,
    requests: Option<(HttpServer, Child, u64)>,
    background: Vec<(Server, Child)>,
    /// The link's clock, read when this started (just before the bulk transfer's client).
    clock: LinkClock,
    errors: Vec<String>,
}

/// The emulator's uptime (the clock of the link's rate and delay traces) against the wall
/// clock, both read at one moment.
#[derive(Clone, Copy, Debug)]
pub struct LinkClock {
    /// The emulator's uptime then, s, if it answered.
    uptime0: Option<f64>,
    /// Wall clock then, s since the epoch.
    epoch0: f64,
}

impl LinkClock {
    /// The emulator's uptime at wall-clock time `epoch` (s since the epoch).
    pub fn uptime_at(&self, epoch: f64) -> Option<f64> {
        self.uptime0.map(|u| u + epoch - self.epoch0)
    }

    /// The emulator's uptime when the bulk transfer's first data arrived (`data_epoch`, s
    /// since the epoch), or when the clock was read if that was not seen.
    pub fn uptime_at_data(&self, data_epoch: Option<f64>) -> Option<f64> {
        self.uptime_at(data_epoch.unwrap_or(self.epoch0))
    }
}

/// Wall clock now, s since the epoch.
pub fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Beside {
    /// Starts what `t` asks for beside its run of `dur` seconds. Failures to start are
    /// recorded, not fatal: the bulk run goes on.
    pub fn start(lab: &Lab, t: &Bulk, dur: f64) -> Beside {
        let uptime0 = lab.link_stats().ok().map(|s| s.uptime_s);
        let mut b = Beside {
            ping: None,
            cross: None,
            competing: None,
            requests: None,
            background: Vec::new(),
            clock: LinkClock {
                uptime0,
                epoch0: epoch_now(),
            },
            errors: Vec::new(),
        };
        let run_s = dur.round().max(1.0) as u32;
        if t.probe {
            let count = (dur / PROBE_INTERVAL_S).floor().max(1.0) as u32;
            match lab
                .command(Host::Client, "ping")
                .args([
                    "-n",
                    "-D",
                    "-i",
                    &PROBE_INTERVAL_S.to_string(),
                    "-c",
                    &count.to_string(),
                    "-W",
                    "10",
                    SERVER_V4,
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
            {
                Ok(c) => b.ping = Some(c),
                Err(e) => b.errors.push(format!("probe: cannot start ping: {e}")),
            }
        }
        if let Some(rate) = &t.cross_udp {
            let started = satpep_link::units::parse_rate(rate)
                .map_err(|e| e.to_string())
                .and_then(|bps| {
                    let server = Server::start(lab, Host::Server, CROSS_PORT)?;
                    let extra = [
                        "-u".into(),
                        "-b".into(),
                        (bps.round() as u64).to_string(),
                        "-l".into(),
                        CROSS_DATAGRAM.to_string(),
                    ];
                    Ok((server, spawn_client(lab, CROSS_PORT, run_s, true, &extra)?))
                });
            match started {
                Ok(x) => b.cross = Some(x),
                Err(e) => b.errors.push(format!("cross traffic: {e}")),
            }
        }
        if t.competing {
            let started = Server::start(lab, Host::Server, COMPETING_PORT).and_then(|s| {
                let after = t.competing_after.secs();
                let run_for = (dur - after).round().max(1.0) as u32;
                let c = spawn_client_after(lab, COMPETING_PORT, run_for, true, &[], after)?;
                Ok((s, c))
            });
            match started {
                Ok(x) => b.competing = Some(x),
                Err(e) => b.errors.push(format!("competing flow: {e}")),
            }
        }
        if let Some(bg) = &t.background {
            let download = t.direction == super::kinds::bulk::Direction::Download;
            for i in 0..bg.flows {
                let (c, s) = super::kinds::bulk::Background::pair(i);
                let port = BACKGROUND_PORT + i as u16;
                let started = lab
                    .run_in(
                        Host::Client,
                        "ip",
                        &["addr", "replace", &format!("{c}/24"), "dev", CLIENT_DEV],
                    )
                    .and_then(|_| {
                        lab.run_in(
                            Host::Server,
                            "ip",
                            &["addr", "replace", &format!("{s}/24"), "dev", SERVER_DEV],
                        )
                    })
                    .and_then(|_| Server::start(lab, Host::Server, port))
                    .and_then(|server| {
                        let mut extra = vec!["-B".to_string(), c.clone()];
                        if let Some(cc) = &bg.cc {
                            extra.extend(["-C".into(), cc.clone()]);
                        }
                        let run_s = dur.round().max(1.0) as u32;
                        let child = spawn_client_to(lab, &s, port, run_s, download, &extra, 0.0)?;
                        Ok((server, child))
                    });
                match started {
                    Ok(x) => b.background.push(x),
                    Err(e) => b.errors.push(format!("background flow {i}: {e}")),
                }
            }
        }
        if let Some(size) = &t.requests {
            let size = size.bytes();
            let started = (|| {
                let server = HttpServer::start(lab, Host::Server, &[("rr.bin", size as usize)])?;
                let url = format!("http://{SERVER_V4}/rr.bin");
                // One request a second on one keep-alive connection, for the whole run.
                let mut c = lab.command(Host::Client, "curl");
                c.args([
                    "-s",
                    "--rate",
                    "1/s",
                    "--max-time",
                    &(run_s + 20).to_string(),
                    "-w",
                    "%{time_total} %{size_download} %{http_code}\n",
                ]);
                for _ in 0..run_s.saturating_sub(2).max(2) {
                    c.args(["-o", "/dev/null", &url]);
                }
                let child = c
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(|e| format!("cannot start curl: {e}"))?;
                Ok::<_, String>((server, child, size))
            })();
            match started {
                Ok(x) => b.requests = Some(x),
                Err(e) => b.errors.push(format!("requests: {e}")),
            }
        }
        b
    }

    /// The link's clock, read when this started.
    pub fn clock(&self) -> LinkClock {
        self.clock
    }

    /// Waits for everything (each has its own time limit), parses what it saw; `base_rtt_ms(t)`
    /// is the path's base RTT at emulator uptime `t`; goodput counts from `warmup_s`;
    /// `data_epoch` is when the bulk transfer's first data arrived (s since the epoch; the
    /// probe's times count from it), if it was seen.
    pub fn finish(
        self,
        base_rtt_ms: &dyn Fn(f64) -> f64,
        warmup_s: f64,
        data_epoch: Option<f64>,
        errors: &mut Vec<String>,
    ) -> BesideRecord {
        let clock = self.clock;
        let t0 = data_epoch.unwrap_or(clock.epoch0);
        let mut r = BesideRecord {
            link_uptime_s: clock.uptime_at_data(data_epoch),
            ..Default::default()
        };
        errors.extend(self.errors);
        // Everything was sized to end with the transfer; the requests still running then are
        // cut (those answered are kept).
        let kill_after = std::time::Instant::now() + std::time::Duration::from_secs(15);
        // The output, and whether the process was cut (still running then).
        let wait = |mut c: Child| -> Option<(std::process::Output, bool)> {
            while std::time::Instant::now() < kill_after {
                if let Ok(Some(_)) = c.try_wait() {
                    return c.wait_with_output().ok().map(|o| (o, false));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = c.kill();
            c.wait_with_output().ok().map(|o| (o, true))
        };
        if let Some(c) = self.ping {
            if let Some((out, _)) = wait(c) {
                let text = String::from_utf8_lossy(&out.stdout);
                let (sent, got, samples) = parse_ping(&text);
                r.probes = (sent, got);
                for (recv_epoch, rtt_ms) in samples {
                    let sent_epoch = recv_epoch - rtt_ms / 1e3;
                    let base = base_rtt_ms(clock.uptime_at(sent_epoch).unwrap_or(0.0));
                    r.queue.push((sent_epoch - t0, (rtt_ms - base).max(0.0)));
                }
            }
        }
        if let Some((server, c)) = self.cross {
            if let Some((out, cut)) = wait(c) {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                let sum = &v["end"]["sum"];
                match (sum["lost_packets"].as_f64(), sum["packets"].as_f64()) {
                    (Some(l), Some(p)) if p > 0.0 => r.cross_loss = Some(l / p),
                    _ => errors.push(format!(
                        "cross traffic: no result ({})",
                        why_no_result(
                            &v,
                            cut,
                            &String::from_utf8_lossy(&out.stderr),
                            &out.status.to_string()
                        )
                    )),
                }
            }
            drop(server);
        }
        // An iperf3 TCP client's goodput after the warm-up, the last interval left out as
        // for the bulk flows; a missing result is an error naming `what` and why: iperf3's
        // own error, its cut (its end exchange had not finished 15 s after the transfer), or
        // its last line on stderr.
        let mut goodput = |(out, cut): (std::process::Output, bool), what: &str| {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let g = crate::iperf::goodput_after(&crate::iperf::intervals(&v), warmup_s);
            if g.is_none() {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let why = why_no_result(&v, cut, &stderr, &out.status.to_string());
                errors.push(format!("{what}: no result ({why})"));
            }
            g
        };
        if let Some((server, c)) = self.competing {
            r.competing_bps = wait(c).and_then(|out| goodput(out, "competing flow"));
            drop(server);
        }
        for (i, (server, c)) in self.background.into_iter().enumerate() {
            let bps = wait(c).and_then(|out| goodput(out, &format!("background flow {i}")));
            r.background_bps.push(bps.unwrap_or(f64::NAN));
            drop(server);
        }
        if let Some((server, c, size)) = self.requests {
            if let Some((out, _)) = wait(c) {
                let text = String::from_utf8_lossy(&out.stdout);
                for (k, l) in text.lines().enumerate() {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    let ok = w.get(2) == Some(&"200")
                        && w.get(1).and_then(|b| b.parse::<u64>().ok()) == Some(size);
                    if !ok {
                        errors.push(format!("request {k}: {l}"));
                    } else if k > 0 {
                        r.responses.push(w[0].parse().unwrap_or(f64::NAN));
                    }
                }
            }
            drop(server);
        }
        r
    }
}

/// Why an iperf3 client gave no result: its own error, its cut (`cut`: still running when the
/// lab stopped waiting), else the last line it wrote on `stderr`, else its exit `status`.
fn why_no_result(v: &Value, cut: bool, stderr: &str, status: &str) -> String {
    match (v["error"].as_str(), cut) {
        (Some(e), _) => e.to_string(),
        (None, true) => "iperf3 still ran 15 s after the transfer: cut".into(),
        (None, false) => match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(l) => format!("iperf3 failed: {}", l.trim()),
            None => format!("iperf3 failed, {status}"),
        },
    }
}

/// Parses `ping -D -n` output: (sent, received, [(receive time s since the epoch, RTT ms)]).
pub fn parse_ping(text: &str) -> (u32, u32, Vec<(f64, f64)>) {
    let mut samples = Vec::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix('[') else {
            continue;
        };
        let Some((ts, tail)) = rest.split_once(']') else {
            continue;
        };
        let rtt = tail
            .split("time=")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|t| t.parse::<f64>().ok());
        if let (Ok(ts), Some(rtt)) = (ts.parse::<f64>(), rtt) {
            samples.push((ts, rtt));
        }
    }
    // "50 packets transmitted, 48 received, 4% packet loss, time 4900ms"
    let sent = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(samples.len() as u32);
    (sent, samples.len() as u32, samples)
}

/// The path's base RTT at emulator uptime `t` s, ms: both directions' propagation delay at
/// that moment plus a probe frame's serialization each way.
pub fn base_rtt_ms(cfg: &satpep_link::config::LinkConfig, t: f64) -> f64 {
    echo_rtt_ms(cfg, t, PROBE_FRAME)
}

/// The RTT of an echo of `frame`-byte frames (request and reply alike) across an empty
/// link at `t` s of its clock: both delays plus each frame's serialization, ms.
pub fn echo_rtt_ms(cfg: &satpep_link::config::LinkConfig, t: f64, frame: f64) -> f64 {
    let ns = t * 1e9;
    let ser = |d: &satpep_link::config::DirectionConfig| frame * 8.0 / d.rate.max_bps() * 1e3;
    (cfg.ret.delay.at(ns) + cfg.forward.delay.at(ns)) / 1e6 + ser(&cfg.ret) + ser(&cfg.forward)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_iperf3_result_says_why() {
        let err = serde_json::json!({"error": "unable to connect to server"});
        assert_eq!(
            why_no_result(&err, true, "", "signal: 9"),
            "unable to connect to server"
        );
        assert_eq!(
            why_no_result(&Value::Null, true, "", "signal: 9 (SIGKILL)"),
            "iperf3 still ran 15 s after the transfer: cut"
        );
        assert_eq!(
            why_no_result(
                &Value::Null,
                false,
                "iperf3: error - x\n\n",
                "exit status: 1"
            ),
            "iperf3 failed: iperf3: error - x"
        );
        assert_eq!(
            why_no_result(&Value::Null, false, "", "exit status: 1"),
            "iperf3 failed, exit status: 1"
        );
    }

    #[test]
    fn ping_output_gives_receive_times_and_rtts() {
        let text = "PING 198.18.3.2 (198.18.3.2) 56(84) bytes of data.\n\
[1700000000.500000] 64 bytes from 198.18.3.2: icmp_seq=1 ttl=62 time=560 ms\n\
[1700000000.712345] 64 bytes from 198.18.3.2: icmp_seq=2 ttl=62 time=672.5 ms\n\
\n--- 198.18.3.2 ping statistics ---\n3 packets transmitted, 2 received, 33.3333% packet loss, time 200ms\n";
        let (sent, got, s) = parse_ping(text);
        assert_eq!((sent, got), (3, 2));
        assert_eq!(s[1], (1700000000.712345, 672.5));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&[7.0], 95.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
