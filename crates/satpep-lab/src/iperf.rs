//! Real traffic across a lab: iperf3 (TCP and UDP) and ping, with their outputs parsed.

use crate::topology::{Host, Lab, CLIENT_V4, SERVER_V4, SERVER_V6};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Outcome of one iperf3 TCP transfer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TcpResult {
    /// Application bytes per second at the receiver, in bit/s.
    pub goodput_bps: f64,
    /// Bytes received.
    pub bytes: u64,
    /// Segments retransmitted by the sender.
    pub retransmits: u64,
    /// Sender's mean smoothed RTT, ms.
    pub mean_rtt_ms: f64,
    /// (end of interval in seconds, bytes received in it), one per second.
    pub intervals: Vec<(f64, u64)>,
}

impl TcpResult {
    /// Goodput from `from_s` seconds on, bit/s, leaving out the last second (see
    /// [`goodput_after`]); the whole run's if it is shorter.
    pub fn goodput_after(&self, from_s: f64) -> f64 {
        goodput_after(&self.intervals, from_s).unwrap_or(self.goodput_bps)
    }
}

/// Goodput of receiver `intervals` (end s, bytes) from `from_s` seconds on, bit/s, leaving
/// out the last interval (it also holds what was queued when the sender stopped); None when
/// nothing is left.
pub fn goodput_after(intervals: &[(f64, u64)], from_s: f64) -> Option<f64> {
    let mut prev = 0.0;
    let (mut bytes, mut secs) = (0u64, 0.0);
    let last = intervals.len().saturating_sub(1);
    for (k, &(end, b)) in intervals.iter().enumerate() {
        if prev >= from_s - 1e-6 && k < last {
            bytes += b;
            secs += end - prev;
        }
        prev = end;
    }
    (secs > 0.0).then(|| bytes as f64 * 8.0 / secs)
}

/// Bytes of receiver `intervals` (end s, bytes) lying within `from..to` s (with 50 ms to
/// spare either side: iperf3's intervals end a few ms after each boundary), and the seconds
/// they span.
pub fn bytes_within(intervals: &[(f64, u64)], from: f64, to: f64) -> (u64, f64) {
    let (mut prev, mut bytes, mut secs) = (0.0, 0u64, 0.0);
    for &(end, b) in intervals {
        if prev >= from - 0.05 && end <= to + 0.05 {
            bytes += b;
            secs += end - prev;
        }
        prev = end;
    }
    (bytes, secs)
}

/// The (end s, bytes) of each interval of an iperf3 JSON report.
pub fn intervals(v: &Value) -> Vec<(f64, u64)> {
    v["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| Some((i["sum"]["end"].as_f64()?, i["sum"]["bytes"].as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Outcome of one iperf3 UDP stream, as seen by the receiver.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UdpResult {
    /// (seconds, bytes) per receiver interval.
    pub intervals: Vec<(f64, u64)>,
    /// Datagrams sent.
    pub packets: u64,
    /// Datagrams lost.
    pub lost: u64,
}

/// Ethernet + IPv4 + UDP header bytes around an iperf3 datagram.
pub const UDP_FRAME_OVERHEAD: u32 = 14 + 20 + 8;

impl UdpResult {
    /// Frame rate (bit/s) of `len`-byte datagrams over the receiver's steady-state intervals
    /// (the first and last are start-up and partial), each datagram charged its headers.
    pub fn frame_rate(&self, len: u32) -> f64 {
        let iv = &self.intervals;
        let mid = if iv.len() > 2 {
            &iv[1..iv.len() - 1]
        } else {
            &iv[..]
        };
        let (secs, bytes) = mid
            .iter()
            .fold((0.0, 0u64), |(s, b), (is, ib)| (s + is, b + ib));
        if secs == 0.0 {
            return 0.0;
        }
        bytes as f64 * 8.0 / secs * (len + UDP_FRAME_OVERHEAD) as f64 / len as f64
    }
}

/// An iperf3 client whose JSON is read on a thread as it runs: with 0.1 s intervals a 30 s
/// test writes more JSON than a pipe holds, and a client whose output nobody read blocked
/// at its end and never finished.
pub(crate) struct Client {
    /// The iperf3 process.
    pub(crate) child: Child,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
}

/// Reads `out` to its end on a thread of its own (a child's pipe, which a long run would
/// otherwise fill).
fn read_on_thread(
    mut out: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    })
}

impl Client {
    /// Starts reading `child`'s standard output.
    pub(crate) fn reading(mut child: Child) -> Client {
        let out = child.stdout.take().map(read_on_thread);
        Client { child, out }
    }

    /// Waits for the process; its status, standard output and error.
    pub(crate) fn output(mut self) -> std::io::Result<std::process::Output> {
        let mut stderr = Vec::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_end(&mut e, &mut stderr);
        }
        let status = self.child.wait()?;
        let stdout = self
            .out
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        Ok(std::process::Output {
            status,
            stdout,
            stderr,
        })
    }
}

/// An iperf3 server in one host, serving one test. Its JSON is read on a thread so a long
/// run cannot fill the pipe and stall it.
pub(crate) struct Server(Child, Option<std::thread::JoinHandle<Vec<u8>>>);

impl Server {
    pub(crate) fn start(lab: &Lab, host: Host, port: u16) -> Result<Server, String> {
        Server::start_with(lab, host, port, &[])
    }

    /// [`Server::start`] with more of iperf3's options (`-i 0.1`: the receiver's intervals
    /// in an upload are the server's).
    pub(crate) fn start_with(
        lab: &Lab,
        host: Host,
        port: u16,
        extra: &[&str],
    ) -> Result<Server, String> {
        let mut child = lab
            .command(host, "iperf3")
            .args(["-s", "-1", "-J", "-p", &port.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start iperf3 (is it installed?): {e}"))?;
        let reader = read_on_thread(child.stdout.take().unwrap());
        // A PEP in fast mode accepts a client before the server listens and then resets it,
        // which iperf3 reports as a broken pipe, not as "refused": wait for the listener.
        let t = Instant::now();
        loop {
            let listening = lab
                .command(host, "ss")
                .args(["-Hltn", &format!("sport = :{port}")])
                .output()
                .map(|o| !o.stdout.is_empty())
                .unwrap_or(false);
            if listening || t.elapsed() > Duration::from_secs(5) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Server(child, Some(reader)))
    }
    pub(crate) fn output(mut self) -> Result<Value, String> {
        let t = Instant::now();
        while !matches!(self.0.try_wait(), Ok(Some(_))) {
            if t.elapsed() > Duration::from_secs(15) {
                return Err("iperf3 server did not finish".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self.1.take().unwrap().join().unwrap_or_default();
        serde_json::from_slice(&out).map_err(|e| format!("iperf3 server output: {e}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts an iperf3 client in the client host against the server's `port` for `run_s`
/// seconds, JSON output piped; `download`: the server sends (-R, so a PEP intercepts the
/// client's connection either way); `extra` arguments after those.
pub(crate) fn spawn_client(
    lab: &Lab,
    port: u16,
    run_s: u32,
    download: bool,
    extra: &[String],
) -> Result<Child, String> {
    spawn_client_after(lab, port, run_s, download, extra, 0.0)
}

/// [`spawn_client`], the client starting `after_s` seconds from now (a shell in the client
/// host sleeps, then becomes iperf3: the returned child is iperf3 from then on).
pub(crate) fn spawn_client_after(
    lab: &Lab,
    port: u16,
    run_s: u32,
    download: bool,
    extra: &[String],
    after_s: f64,
) -> Result<Child, String> {
    spawn_client_to(lab, SERVER_V4, port, run_s, download, extra, after_s)
}

/// [`spawn_client_after`] against the server host's address `server` (one of its
/// secondary addresses).
pub(crate) fn spawn_client_to(
    lab: &Lab,
    server: &str,
    port: u16,
    run_s: u32,
    download: bool,
    extra: &[String],
    after_s: f64,
) -> Result<Child, String> {
    let mut args: Vec<String> = vec![
        "-c".into(),
        server.into(),
        "-p".into(),
        port.to_string(),
        "-t".into(),
        run_s.to_string(),
        "-J".into(),
    ];
    if download {
        args.push("-R".into());
    }
    args.extend_from_slice(extra);
    let mut c = if after_s > 0.0 {
        let mut c = lab.command(Host::Client, "sh");
        c.args([
            "-c",
            "sleep \"$0\" && exec iperf3 \"$@\"",
            &format!("{after_s:.3}"),
        ]);
        c
    } else {
        lab.command(Host::Client, "iperf3")
    };
    c.args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start iperf3: {e}"))
}

/// Runs an iperf3 client in `host`, retrying while the server is not listening yet, and calls
/// `tick(elapsed)` about once a second while it runs.
pub(crate) fn client(
    lab: &Lab,
    host: Host,
    args: &[String],
    tick: &mut dyn FnMut(f64),
) -> Result<Value, String> {
    let start = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut child = lab
            .command(host, "iperf3")
            .args(args)
            .arg("-J")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start iperf3: {e}"))?;
        let mut last = Instant::now();
        while child.try_wait().map_err(|e| e.to_string())?.is_none() {
            if crate::interrupted() {
                let _ = child.kill();
                let _ = child.wait();
                return Err("interrupted".into());
            }
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                tick(start.elapsed().as_secs_f64());
            }
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let err = v["error"].as_str().map(String::from);
        match err {
            None if out.status.success() => return Ok(v),
            Some(e) if e.contains("refused") && attempt < 50 => {
                std::thread::sleep(Duration::from_millis(100));
            }
            e => {
                return Err(format!(
                    "iperf3 {} failed: {}",
                    args.join(" "),
                    e.unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
                ))
            }
        }
    }
}

/// A TCP bulk download: the client connects to the server (so a PEP can intercept it) and
/// the server sends for `secs` seconds (iperf3 -R) with congestion control `cc`.
pub fn tcp_download(
    lab: &Lab,
    cc: &str,
    secs: u32,
    ipv6: bool,
    tick: &mut dyn FnMut(f64),
) -> Result<TcpResult, String> {
    let server = Server::start(lab, Host::Server, 5201)?;
    let dst = if ipv6 { SERVER_V6 } else { SERVER_V4 };
    let args: Vec<String> = [
        "-c",
        dst,
        "-p",
        "5201",
        "-R",
        "-t",
        &secs.to_string(),
        "-C",
        cc,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let v = client(lab, Host::Client, &args, tick)?;
    // The sender's view (retransmissions, RTT) is in the server's own report.
    let s = server.output().unwrap_or(Value::Null);
    let end = &v["end"];
    Ok(TcpResult {
        goodput_bps: end["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0),
        bytes: end["sum_received"]["bytes"].as_u64().unwrap_or(0),
        retransmits: s["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        mean_rtt_ms: s["end"]["streams"][0]["sender"]["mean_rtt"]
            .as_f64()
            .unwrap_or(0.0)
            / 1000.0,
        intervals: intervals(&v),
    })
}

/// A UDP stream of `len`-byte datagrams at `payload_bps` (application payload rate) from the
/// server host to the client host, measured by the receiver.
pub fn udp_forward(
    lab: &Lab,
    payload_bps: f64,
    len: u32,
    secs: u32,
    tick: &mut dyn FnMut(f64),
) -> Result<UdpResult, String> {
    udp(
        lab,
        Host::Server,
        Host::Client,
        CLIENT_V4,
        payload_bps,
        len,
        secs,
        tick,
    )
}

/// A UDP stream from the client host to the server host (the return direction).
pub fn udp_return(
    lab: &Lab,
    payload_bps: f64,
    len: u32,
    secs: u32,
    tick: &mut dyn FnMut(f64),
) -> Result<UdpResult, String> {
    udp(
        lab,
        Host::Client,
        Host::Server,
        crate::topology::SERVER_V4,
        payload_bps,
        len,
        secs,
        tick,
    )
}

/// iperf3 client arguments for a UDP stream to `dst`:`port` of `len`-byte datagrams at
/// `payload_bps` (application payload) for `secs` seconds ([`client`] adds -J).
pub(crate) fn udp_args(dst: &str, port: u16, payload_bps: f64, len: u32, secs: u32) -> Vec<String> {
    [
        "-c",
        dst,
        "-p",
        &port.to_string(),
        "-u",
        "-b",
        &format!("{}", payload_bps.round() as u64),
        "-l",
        &len.to_string(),
        "-t",
        &secs.to_string(),
        // Large socket buffers on both ends (iperf3 passes -w to its server for UDP) so the
        // receiver, not the link, is never what drops at high rates.
        "-w",
        "8M",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[allow(clippy::too_many_arguments)]
fn udp(
    lab: &Lab,
    from: Host,
    to: Host,
    dst: &str,
    payload_bps: f64,
    len: u32,
    secs: u32,
    tick: &mut dyn FnMut(f64),
) -> Result<UdpResult, String> {
    let server = Server::start(lab, to, 5202)?;
    let args = udp_args(dst, 5202, payload_bps, len, secs);
    client(lab, from, &args, tick)?;
    let v = server.output()?;
    let intervals = v["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    (
                        i["sum"]["seconds"].as_f64().unwrap_or(0.0),
                        i["sum"]["bytes"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let sum = &v["end"]["sum"];
    Ok(UdpResult {
        intervals,
        packets: sum["packets"].as_u64().unwrap_or(0),
        lost: sum["lost_packets"].as_u64().unwrap_or(0),
    })
}

/// What ping saw. Per-packet times are rounded by ping to whole ms above 100 ms, so the
/// precise figures are the summary's min/avg/max (µs resolution).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PingResult {
    /// Per-reply RTTs as printed, ms.
    pub rtts: Vec<f64>,
    /// Replies received.
    pub received: usize,
    /// Minimum RTT, ms.
    pub min: f64,
    /// Mean RTT, ms.
    pub avg: f64,
    /// Maximum RTT, ms.
    pub max: f64,
}

/// Pings `dst` from the client `count` times, every `interval_s`, with `size` payload bytes.
pub fn ping(
    lab: &Lab,
    dst: &str,
    count: u32,
    interval_s: f64,
    size: u32,
) -> Result<PingResult, String> {
    let out = lab
        .command(Host::Client, "ping")
        .args([
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            &format!("{interval_s}"),
            "-s",
            &size.to_string(),
            "-W",
            "5",
            dst,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ping: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rtts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect();
    let mut r = PingResult {
        received: rtts.len(),
        rtts,
        min: f64::NAN,
        avg: f64::NAN,
        max: f64::NAN,
    };
    // "rtt min/avg/max/mdev = 560.415/560.443/560.465/0.020 ms"
    if let Some(line) = text.lines().find(|l| l.contains("min/avg/max")) {
        let v: Vec<f64> = line
            .split('=')
            .nth(1)
            .unwrap_or("")
            .trim()
            .split(['/', ' '])
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() >= 3 {
            (r.min, r.avg, r.max) = (v[0], v[1], v[2]);
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_within_a_span() {
        let iv = [(0.5, 10), (1.0, 20), (1.5, 30), (2.0, 40)];
        assert_eq!(bytes_within(&iv, 0.5, 1.5), (50, 1.0));
        assert_eq!(bytes_within(&iv, 0.0, 2.0), (100, 2.0));
    }

    #[test]
    fn goodput_after_skips_the_start_and_the_last_second() {
        let r = TcpResult {
            goodput_bps: 1.0,
            bytes: 0,
            retransmits: 0,
            mean_rtt_ms: 0.0,
            // 1 MB/s for 10 s, 2 MB/s for 4 s, then a 3 MB burst of queued data.
            intervals: (1..=10)
                .map(|s| (s as f64, 1_000_000))
                .chain((11..=14).map(|s| (s as f64, 2_000_000)))
                .chain([(15.0, 3_000_000)])
                .collect(),
        };
        assert_eq!(r.goodput_after(10.0), 16e6);
        assert_eq!(r.goodput_after(0.0), (10.0 + 8.0) * 8e6 / 14.0);
        // Nothing after the start: the whole run's figure.
        assert_eq!(r.goodput_after(20.0), 1.0);
    }
}
