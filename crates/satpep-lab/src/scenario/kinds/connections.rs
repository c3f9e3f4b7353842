//! `kind = "connections"`: many concurrent connections from the client to the server, end
//! to end, through the split proxies or through the tunnel (the cell's `pep`):
//! 1. open `count` connections as fast as 32 threads can: new connections per second (the
//!    main metric), and failures;
//! 2. send one byte on each and have the server echo it: every connection is real and relayed;
//! 3. idle: the proxies' resident memory and descriptors per connection;
//! 4. busy: the server pushes 16 KB down every connection at once while the clients read and
//!    verify them: peak memory (the proxies' and the kernel's TCP buffers) per connection;
//! 5. close everything: the proxies' descriptors and memory afterwards, and how long they take
//!    to get back to where they started.
//!
//! Both halves run as processes of their own (`satpep lab load-server` in the server host,
//! `satpep lab load-client` in the client's), [`SHARD`] connections each at most, each pair
//! on a server port of its own: every process needs a descriptor per connection, under this
//! machine's limit of 20 000, and one client address reaches one server port through at
//! most the ephemeral ports' 28 000.

use super::{check_count, Kind};
use crate::checked::{fill, pattern_byte};
use crate::scenario::spec::{CellSpec, Metric, PepMode};
use crate::scenario::traffic::RunRecord;
use crate::topology::{Host, Lab, SERVER_V4};
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First server port; each cell has its own (see [`measure`]).
const PORT: u16 = 9700;
const BUSY_BYTES: usize = 16 << 10;
/// Connecting threads in all.
const CONNECTORS: usize = 32;
/// Most connections one client process (and one server process, one server port) holds.
pub const SHARD: usize = 15_000;
/// Server port `k` of a cell is its first plus `k` times this (cells take 200 ports).
const SHARD_PORTS: u16 = 200;

/// Many concurrent connections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Connections {
    /// Connections to open, all held at once.
    pub count: u32,
}

/// What a run of many connections measured. Memory and descriptors are the proxies'
/// together (terminal and gateway); none end to end.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectionsRecord {
    /// Connections asked for.
    pub connections: usize,
    /// Connections the client opened.
    pub connected: usize,
    /// Connection attempts that failed.
    pub failed_connects: u64,
    /// Connections the server accepted.
    pub accepted: usize,
    /// Connections whose byte came back.
    pub echoed: usize,
    /// Connections whose 16 KB arrived intact in the busy phase (within 300 s).
    pub busy_intact: usize,
    /// Connections that bypassed a proxy while opening (past its connection or descriptor
    /// budget: they run end to end past it); the larger of the two proxies' counts.
    #[serde(default)]
    pub bypassed: u64,
    /// New connections per second while opening them all: until every client's connect
    /// returned and the servers had accepted them, whichever came later (a proxy answers the
    /// client before it reaches the server).
    pub connects_per_s: f64,
    /// The proxies' resident memory before, with all connections idle, at the busy peak and
    /// after closing, bytes.
    pub rss: [u64; 4],
    /// The proxies' open descriptors at the same four moments.
    pub fds: [u64; 4],
    /// The kernel's TCP buffer memory (all sockets of the machine) at the same moments, bytes.
    pub tcp_mem: [u64; 4],
    /// Proxy resident memory per idle connection, bytes.
    pub rss_per_idle: f64,
    /// Proxy resident memory per busy connection (peak), bytes.
    pub rss_per_busy: f64,
    /// Kernel TCP memory per busy connection (peak, all sockets of both ends and proxies), bytes.
    pub tcp_mem_per_busy: f64,
    /// Seconds after the last close until the proxies' descriptors were back to the start.
    pub drain_s: Option<f64>,
}

impl Kind for Connections {
    fn metric(&self) -> Metric {
        Metric::ConnectRate
    }

    fn check(&self, _cell: &CellSpec) -> Result<(), String> {
        check_count("count", self.count, 1, 150_000)
    }

    fn ports(&self) -> std::ops::Range<u16> {
        // Thousands of sockets: `ss` every half second would cost more than it tells.
        PORT..PORT
    }

    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        _limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String> {
        let n = self.count as usize;
        let port = PORT + (rec.cell % 200) as u16;
        let r = match measure(lab, n, port, tick) {
            Ok(r) => r,
            Err(e) => return super::failed_unless_interrupted(rec, e),
        };
        rec.samples.push(r.connects_per_s);
        // End to end is the baseline: n TCP flows bursting into one link leave some in long
        // retransmission back-off past the deadline, which is TCP's, not the proxies', doing.
        let proxied = cell.pep.mode != PepMode::None;
        let mut short = Vec::new();
        if r.echoed < n {
            short.push(format!("{} of {n} echoed", r.echoed));
        }
        if r.busy_intact < n {
            short.push(format!(
                "{} of {n} got their 16 KB intact ({} bypassed the proxies)",
                r.busy_intact, r.bypassed
            ));
        }
        if r.drain_s.is_none() {
            short.push("the proxies' descriptors not back to the start within 60 s".into());
        }
        if !short.is_empty() {
            rec.errors.push(short.join("; "));
            // What the proxies held must all arrive; a connection that bypassed them runs end
            // to end, like the baseline's.
            let held_short = r.busy_intact + (r.bypassed as usize) < n;
            if r.echoed < n || (proxied && (held_short || r.drain_s.is_none())) {
                rec.failures += 1;
            }
        }
        rec.connections = Some(r);
        Ok(())
    }
}

fn rss(pid: u32) -> u64 {
    crate::sys::rss_kb(pid).unwrap_or(0) * 1024
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// Raises this process's descriptor limit to hold `n` connections' two ends.
fn raise_own_fd_limit(n: usize) {
    crate::sys::raise_fd_limit((n as u64) * 2 + 4096);
}

struct Sample {
    rss: u64,
    fds: u64,
    tcp: u64,
}

/// `pid` and its children: a proxy's worker processes (`proxy.workers`) count as its own.
fn with_children(pid: u32) -> Vec<u32> {
    let mut v = vec![pid];
    if let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        v.extend(t.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    v
}

fn sample(pids: &[u32]) -> Sample {
    let all: Vec<u32> = pids.iter().flat_map(|&p| with_children(p)).collect();
    Sample {
        rss: all.iter().map(|&p| rss(p)).sum(),
        fds: all.iter().map(|&p| fds(p)).sum(),
        // Machine-wide, as the proxy's admission control reads it.
        tcp: satpep_proxy::server::kernel_tcp_memory(),
    }
}

/// The proxies' use before the run: the fewest descriptors seen over half a second, since a
/// descriptor may be open for a moment then (a readiness probe's or a metrics scrape's; CI
/// once saw 25 at the start and 24 for good after, and called the run a leak).
fn baseline(pids: &[u32]) -> Sample {
    let mut s0 = sample(pids);
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        let s = sample(pids);
        if s.fds < s0.fds {
            s0 = s;
        }
    }
    s0
}

/// Accepts up to `n` connections, until none came for `quiet` (after the first) or `wait`
/// passed: the connections, and the time from `t0` to the last one.
fn accept_all(
    l: std::net::TcpListener,
    n: usize,
    t0: Instant,
    quiet: Duration,
    wait: Duration,
) -> (Vec<TcpStream>, Duration) {
    let _ = l.set_nonblocking(true);
    let mut v = Vec::with_capacity(n);
    let mut last = t0;
    while v.len() < n && t0.elapsed() < wait && (v.is_empty() || last.elapsed() < quiet) {
        match l.accept() {
            Ok((s, _)) => {
                v.push(s);
                last = Instant::now();
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    (v, last - t0)
}

/// Round-robin over non-blocking sockets until each has done its part or `wait` passes:
/// `step` returns Ok(true) when a socket is done. Returns how many finished without error.
fn round_robin(
    socks: &mut [TcpStream],
    wait: Duration,
    mut step: impl FnMut(usize, &mut TcpStream) -> std::io::Result<bool>,
) -> usize {
    for s in socks.iter() {
        let _ = s.set_nonblocking(true);
    }
    let mut done = vec![false; socks.len()];
    let mut left = socks.len();
    let mut ok = 0;
    let t0 = Instant::now();
    while left > 0 && t0.elapsed() < wait {
        let mut progress = false;
        for (i, s) in socks.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            match step(i, s) {
                Ok(true) => {
                    done[i] = true;
                    left -= 1;
                    ok += 1;
                    progress = true;
                }
                Ok(false) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    // Failed for good: counted as not finished.
                    done[i] = true;
                    left -= 1;
                }
            }
        }
        if !progress {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    ok
}

/// One half's process (server or client), driven one command per line on its stdin; it
/// answers each with a line whose last words are numbers.
struct Half {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    what: &'static str,
}

impl Half {
    fn start(lab: &Lab, host: Host, args: &[String], what: &'static str) -> Result<Half, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = lab
            .command(host, exe)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the {what}: {e}"))?;
        let out = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut h = Half { child, out, what };
        h.answer()?;
        Ok(h)
    }

    /// A server of `n` connections on `port`.
    fn server(lab: &Lab, n: usize, port: u16) -> Result<Half, String> {
        let args = ["lab", "load-server", "--port", &port.to_string(), "--count", &n.to_string()];
        Half::start(lab, Host::Server, &args.map(String::from), "load server")
    }

    /// A client of `n` connections to `addr`, opened on `threads` threads.
    fn client(lab: &Lab, n: usize, addr: SocketAddr, threads: usize) -> Result<Half, String> {
        let args = [
            "lab",
            "load-client",
            "--addr",
            &addr.to_string(),
            "--count",
            &n.to_string(),
            "--threads",
            &threads.to_string(),
        ];
        Half::start(lab, Host::Client, &args.map(String::from), "load client")
    }

    fn send(&mut self, cmd: &str) -> Result<(), String> {
        let stdin = self.child.stdin.as_mut().expect("piped");
        writeln!(stdin, "{cmd}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("the {} is gone: {e}", self.what))
    }

    /// The numbers of the next answer line (after its first word).
    fn answer_all(&mut self) -> Result<Vec<u64>, String> {
        use std::io::BufRead;
        let mut line = String::new();
        self.out
            .read_line(&mut line)
            .map_err(|e| format!("the {} is gone: {e}", self.what))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|w| w.parse())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("the {} said {line:?}", self.what))?;
        if v.is_empty() {
            return Err(format!("the {} said {line:?}", self.what));
        }
        Ok(v)
    }

    fn answer(&mut self) -> Result<u64, String> {
        Ok(*self.answer_all()?.last().expect("not empty"))
    }
}

impl Drop for Half {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `cmd` to every half, then adds up their answers.
fn ask_all(halves: &mut [Half], cmd: &str) -> Result<u64, String> {
    for h in halves.iter_mut() {
        h.send(cmd)?;
    }
    halves.iter_mut().map(|h| h.answer()).sum()
}

/// The hidden `satpep lab load-server`: listens on `port` and answers commands on stdin:
/// `accepted` (accept until `count`, or 30 s without a new connection, or 600 s; print the
/// number and the microseconds from its ready line to the last), `echo` (read one byte on
/// each connection and send it back), `busy` (send 16 KB of pattern 3 down each), `close`.
pub fn load_server(port: u16, count: usize) -> Result<(), String> {
    raise_own_fd_limit(count);
    let listener = crate::sys::listen_any(port)?;
    let t0 = Instant::now();
    let acceptor = std::thread::spawn(move || {
        accept_all(
            listener,
            count,
            t0,
            Duration::from_secs(30),
            Duration::from_secs(600),
        )
    });
    let mut acceptor = Some(acceptor);
    let mut socks: Vec<TcpStream> = Vec::new();
    let mut last_us = 0u64;
    serve_commands(|cmd| {
        let n = match cmd {
            "accepted" => {
                if let Some(a) = acceptor.take() {
                    let (v, last) = a.join().map_err(|_| "acceptor panicked".to_string())?;
                    socks = v;
                    last_us = last.as_micros() as u64;
                }
                return Ok((format!("accepted {} {last_us}", socks.len()), false));
            }
            "echo" => round_robin(&mut socks, Duration::from_secs(60), |_, s| {
                let mut b = [0u8; 1];
                match s.read(&mut b)? {
                    1 => {
                        s.write_all(&b)?;
                        Ok(true)
                    }
                    _ => Err(ErrorKind::UnexpectedEof.into()),
                }
            }),
            "busy" => {
                let mut buf = vec![0u8; BUSY_BYTES];
                fill(3, 0, &mut buf);
                let mut at = vec![0usize; socks.len()];
                round_robin(&mut socks, Duration::from_secs(300), |i, s| {
                    let k = s.write(&buf[at[i]..])?;
                    at[i] += k;
                    Ok(at[i] == BUSY_BYTES)
                })
            }
            "close" => {
                let k = socks.len();
                socks.clear();
                return Ok((format!("closed {k}"), true));
            }
            other => return Err(format!("load server: unknown command {other:?}")),
        };
        Ok((format!("{cmd} {n}"), false))
    })
}

/// A load half's command loop: says `ready 0`, then answers each line of stdin with the line
/// `answer` gives, until stdin closes or an answer says it was the last.
fn serve_commands(
    mut answer: impl FnMut(&str) -> Result<(String, bool), String>,
) -> Result<(), String> {
    println!("ready 0");
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        if std::io::BufRead::read_line(&mut stdin.lock(), &mut line).unwrap_or(0) == 0 {
            return Ok(());
        }
        let (said, last) = answer(line.trim())?;
        println!("{said}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        if last {
            return Ok(());
        }
    }
}

/// The hidden `satpep lab load-client`: runs the commands read from stdin on `count`
/// connections to `addr`: `connect` (opens them on `threads` threads; answers the connections
/// opened, the attempts that failed and the microseconds it took), `send` (one byte on
/// each), `echoed` (reads it back on each: the right ones), `busy` (reads and checks 16 KB of
/// pattern 3 on each: the intact ones), `close`.
pub fn load_client(addr: SocketAddr, count: usize, threads: usize) -> Result<(), String> {
    raise_own_fd_limit(count);
    let mut socks: Vec<TcpStream> = Vec::new();
    serve_commands(|cmd| {
        let said = match cmd {
            "connect" => {
                let (v, failed, secs) = connect_all(count, addr, threads.max(1))?;
                socks = v;
                format!(
                    "connect {} {failed} {}",
                    socks.len(),
                    (secs * 1e6) as u64
                )
            }
            "send" => {
                let mut sent = vec![false; socks.len()];
                let n = round_robin(&mut socks, Duration::from_secs(60), |i, s| {
                    if !sent[i] {
                        s.write_all(&[0x5a])?;
                        sent[i] = true;
                    }
                    Ok(true)
                });
                format!("send {n}")
            }
            "echoed" => {
                let n = round_robin(&mut socks, Duration::from_secs(60), |_, s| {
                    let mut b = [0u8; 1];
                    match s.read(&mut b)? {
                        1 if b[0] == 0x5a => Ok(true),
                        _ => Err(ErrorKind::InvalidData.into()),
                    }
                });
                format!("echoed {n}")
            }
            "busy" => {
                let mut got = vec![0usize; socks.len()];
                let mut bad = vec![false; socks.len()];
                let mut buf = vec![0u8; BUSY_BYTES];
                round_robin(&mut socks, Duration::from_secs(300), |i, s| {
                    let k = s.read(&mut buf[..BUSY_BYTES - got[i]])?;
                    if k == 0 {
                        return Err(ErrorKind::UnexpectedEof.into());
                    }
                    if (0..k).any(|j| buf[j] != pattern_byte(3, (got[i] + j) as u64)) {
                        bad[i] = true;
                    }
                    got[i] += k;
                    Ok(got[i] == BUSY_BYTES)
                });
                let intact = got
                    .iter()
                    .zip(&bad)
                    .filter(|(g, b)| **g == BUSY_BYTES && !**b)
                    .count();
                format!("busy {intact}")
            }
            "close" => {
                let k = socks.len();
                socks.clear();
                return Ok((format!("closed {k}"), true));
            }
            other => return Err(format!("load client: unknown command {other:?}")),
        };
        Ok((said, false))
    })
}

/// One run on `port`. Each cell gets a port of its own: the connections a cell before closed
/// wait in TIME_WAIT in the client host for a minute, and new connections to the same server
/// port must then search the ephemeral ports for a free four-tuple (split opened 1 144
/// connections/s after end to end on one port, against 4 583 in a lab of its own).
fn measure(
    lab: &Lab,
    n: usize,
    port: u16,
    tick: &mut dyn FnMut(f64),
) -> Result<ConnectionsRecord, String> {
    raise_own_fd_limit(n);
    let started = Instant::now();
    // Each phase reports progress and may be interrupted before it starts.
    let mut phase = || -> Result<(), String> {
        tick(started.elapsed().as_secs_f64());
        match crate::interrupted() {
            true => Err("interrupted".into()),
            false => Ok(()),
        }
    };
    // The server host may see a burst of n SYNs.
    for host in [Host::Server, Host::Client, Host::Terminal, Host::Gateway] {
        let _ = lab
            .command(host, "sysctl")
            .args([
                "-qw",
                "net.core.somaxconn=65535",
                "net.ipv4.tcp_max_syn_backlog=65535",
            ])
            .status();
    }
    let pids = lab.state().proxy_pids.clone();
    std::thread::sleep(Duration::from_millis(500));
    let s0 = baseline(&pids);
    // Each proxy's count: a connection past the terminal's budget may still be taken by
    // the gateway's, and one past both is counted twice.
    let bypassed = || -> Vec<u64> {
        lab.proxy_hosts()
            .into_iter()
            .map(|h| {
                crate::scenario::tunnel_state::proxy_metric(lab, h, "connections_bypassed_total")
                    .unwrap_or(0.0) as u64
            })
            .collect()
    };
    let bypassed0 = bypassed();
    phase()?; // connecting

    // Shard k: its part of the connections, between server port k and client k.
    let shards = n.div_ceil(SHARD);
    let part = |k: usize| n / shards + usize::from(k < n % shards);
    let port_of = |k: usize| port + SHARD_PORTS * k as u16;
    let mut servers = Vec::new();
    let mut servers_ready = Vec::new();
    for k in 0..shards {
        servers.push(Half::server(lab, part(k), port_of(k))?);
        servers_ready.push(Instant::now());
    }
    let mut clients = (0..shards)
        .map(|k| {
            let addr = SocketAddr::new(SERVER_V4.parse().unwrap(), port_of(k));
            Half::client(lab, part(k), addr, CONNECTORS.div_ceil(shards))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // 1. Connect: every client at once; the rate is all of them over the slowest's time.
    let connect_began = Instant::now();
    for c in clients.iter_mut() {
        c.send("connect")?;
    }
    let (mut connected, mut failures, mut connect_us) = (0u64, 0u64, 0u64);
    for c in clients.iter_mut() {
        let v = c.answer_all()?;
        let [ok, failed, us] = v[..] else {
            return Err(format!("the load client answered {v:?} to connect"));
        };
        connected += ok;
        failures += failed;
        connect_us = connect_us.max(us);
    }
    // Through a proxy the client's connect returns once the proxy answered, before its
    // own connection to the server: the rate is until the servers had them all (measured
    // from each server's ready line, which came before the connects began).
    let mut accepted = 0;
    let mut accepted_s = 0f64;
    for (s, ready) in servers.iter_mut().zip(&servers_ready) {
        s.send("accepted")?;
        let v = s.answer_all()?;
        let [n, us] = v[..] else {
            return Err(format!("the load server answered {v:?} to accepted"));
        };
        accepted += n;
        let since_connect = us as f64 * 1e-6 - connect_began.duration_since(*ready).as_secs_f64();
        accepted_s = accepted_s.max(since_connect);
    }
    let connect_s = (connect_us as f64 * 1e-6).max(accepted_s);
    // Connections that bypassed at least one proxy: at least the larger count.
    let bypassed = bypassed()
        .iter()
        .zip(&bypassed0)
        .map(|(b, b0)| b.saturating_sub(*b0))
        .max()
        .unwrap_or(0);
    phase()?; // echo

    // 2. Echo one byte on each.
    ask_all(&mut clients, "send")?;
    ask_all(&mut servers, "echo")?;
    let echoed = ask_all(&mut clients, "echoed")? as usize;
    std::thread::sleep(Duration::from_secs(1));
    let s1 = sample(&pids);
    phase()?; // busy

    // 3. Busy: 16 KB down every connection at once, read and checked by the clients.
    let (busy_intact, peak) = busy_all(&mut clients, &mut servers, &pids)?;
    phase()?; // closing

    // 4. Close everything and wait for the proxies to let go.
    let connected = connected as usize;
    ask_all(&mut clients, "close")?;
    drop(clients);
    ask_all(&mut servers, "close")?;
    let (drain_s, s3) = wait_released(&pids, s0.fds);
    for k in 0..shards {
        destroy_leftovers(lab, port_of(k));
    }
    let per = |a: u64, b: u64, k: usize| (a as f64 - b as f64) / k.max(1) as f64;
    Ok(ConnectionsRecord {
        connections: n,
        connected,
        failed_connects: failures,
        accepted: accepted as usize,
        echoed,
        busy_intact,
        bypassed,
        connects_per_s: connected as f64 / connect_s,
        rss: [s0.rss, s1.rss, peak.rss, s3.rss],
        fds: [s0.fds, s1.fds, peak.fds, s3.fds],
        tcp_mem: [s0.tcp, s1.tcp, peak.tcp, s3.tcp],
        rss_per_idle: per(s1.rss, s0.rss, connected),
        rss_per_busy: per(peak.rss, s0.rss, connected),
        tcp_mem_per_busy: per(peak.tcp, s0.tcp, connected),
        drain_s,
    })
}

/// Opens `n` connections to `addr`, `threads` at a time: the connections, how many failed,
/// and the seconds it took.
fn connect_all(
    n: usize,
    addr: SocketAddr,
    threads: usize,
) -> Result<(Vec<TcpStream>, u64, f64), String> {
    let failures = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let connectors: Vec<_> = (0..threads)
        .map(|k| {
            let count = n / threads + usize::from(k < n % threads);
            let failures = failures.clone();
            std::thread::spawn(move || {
                let mut v = Vec::with_capacity(count);
                for _ in 0..count {
                    match TcpStream::connect_timeout(&addr, Duration::from_secs(20)) {
                        Ok(s) => v.push(s),
                        Err(_) => {
                            failures.fetch_add(1, Relaxed);
                        }
                    }
                }
                v
            })
        })
        .collect();
    let mut clients: Vec<TcpStream> = Vec::with_capacity(n);
    for c in connectors {
        clients.extend(c.join().map_err(|_| "connector panicked".to_string())?);
    }
    Ok((clients, failures.load(Relaxed), t0.elapsed().as_secs_f64()))
}

/// Has the servers send 16 KB down every connection at once while the clients read and
/// check it: the connections that got all of it intact, and the proxies' peak use meanwhile.
fn busy_all(
    clients: &mut [Half],
    servers: &mut [Half],
    pids: &[u32],
) -> Result<(usize, Sample), String> {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pids) = (stop.clone(), pids.to_vec());
        std::thread::spawn(move || {
            let mut peak = Sample {
                rss: 0,
                fds: 0,
                tcp: 0,
            };
            while !stop.load(Relaxed) {
                let s = sample(&pids);
                peak.rss = peak.rss.max(s.rss);
                peak.fds = peak.fds.max(s.fds);
                peak.tcp = peak.tcp.max(s.tcp);
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        })
    };
    let mut run = || -> Result<usize, String> {
        for h in servers.iter_mut().chain(clients.iter_mut()) {
            h.send("busy")?;
        }
        let intact = clients
            .iter_mut()
            .map(|c| c.answer())
            .sum::<Result<u64, _>>()?;
        servers
            .iter_mut()
            .map(|s| s.answer())
            .sum::<Result<u64, _>>()?;
        Ok(intact as usize)
    };
    let intact = run();
    stop.store(true, Relaxed);
    let peak = sampler.join().map_err(|_| "sampler panicked".to_string())?;
    Ok((intact?, peak))
}

/// Waits up to 60 s for the proxies' descriptors to come back to `fds0` after the close: the
/// seconds it took (None if they did not), and the proxies' use once settled.
fn wait_released(pids: &[u32], fds0: u64) -> (Option<f64>, Sample) {
    let t_close = Instant::now();
    let mut drain_s = None;
    while t_close.elapsed() < Duration::from_secs(60) {
        if sample(pids).fds <= fds0 {
            drain_s = Some(t_close.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut s3 = sample(pids);
    // A descriptor or two may still open and close after the drain (the test saw five a
    // second later, in 2 of about 8 runs of the tunnel); a leak is one that stays: up to
    // 10 s more for the count to come back.
    let t_settle = Instant::now();
    while s3.fds > fds0 && t_settle.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        s3 = sample(pids);
    }
    (drain_s, s3)
}

/// Destroys what the kernel still holds of a run's connections once its figures are taken:
/// end to end, flows stuck in retransmission back-off at the close become orphans that keep
/// retransmitting (and hold kernel TCP memory) for minutes. The next cell on the same lab
/// would meet them: split's admission control counts that memory and let 460 of 10 000
/// connections bypass the proxies after an end-to-end cell (`ss -K`, sock_diag destroy).
fn destroy_leftovers(lab: &Lab, port: u16) {
    let filter = format!("( sport = :{port} or dport = :{port} )");
    for host in [Host::Client, Host::Server, Host::Terminal, Host::Gateway] {
        let _ = lab
            .command(host, "ss")
            .args(["-K", "-t", "state", "all", &filter])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
