//! Many bulk downloads at once from one sender process and one receiver: the hub's traffic
//! at a scale iperf3 cannot hold here (200 terminals × 50 connections were 400 iperf3
//! processes, one select loop per test, which fell tens of seconds behind on two cores).
//!
//! The server (`satpep lab flows-server`, in the server's namespace) accepts connections and,
//! once a connection's client sends its start byte, writes to it until the client goes. The
//! client lives in the lab's own process: each terminal's sockets are made in its client's
//! namespace (a socket keeps the namespace it was made in) and then driven by one tokio
//! thread, which counts what each terminal received every report interval. Every
//! connection of every terminal starts at one instant, once all have connected, and each
//! terminal's stop at its own second on that clock: the terminals' series line up exactly,
//! which separately started iperf3 clients did not.

use crate::topology::{Host, Lab, Site, SERVER_V4};
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The server's port (clear of iperf3's and the other kinds').
pub const FLOWS_PORT: u16 = 5900;
/// Bytes a connection's sender writes at a time.
const CHUNK: usize = 64 * 1024;

/// The hidden `satpep lab flows-server`: listens on `port` in the namespace it runs in and
/// sends to every connection whose client sent its start byte, until that client goes.
/// Prints `ready` once listening; ends when its stdin closes.
pub fn serve(port: u16) -> Result<(), String> {
    crate::sys::raise_fd_limit(40_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    rt.block_on(async move {
        let s = crate::sys::listen_any(port)?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::from_std(s)
            .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
        println!("ready");
        // stdin's end (the lab gone or done) ends the server.
        let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            let _ = gone_tx.send(());
        });
        let chunk: Arc<[u8]> = vec![0x5a; CHUNK].into();
        loop {
            tokio::select! {
                _ = &mut gone => return Ok(()),
                a = listener.accept() => match a {
                    Ok((c, _)) => {
                        tokio::spawn(send_until_gone(c, chunk.clone()));
                    }
                    // Out of descriptors for a moment: the client's connect waits.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
            }
        }
    })
}

async fn send_until_gone(mut c: tokio::net::TcpStream, chunk: Arc<[u8]>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut start = [0u8; 1];
    if !matches!(c.read(&mut start).await, Ok(1)) {
        return;
    }
    while c.write_all(&chunk).await.is_ok() {}
}

/// The flows-server process; killed when dropped.
pub struct FlowServer {
    child: Child,
}

impl FlowServer {
    /// Starts the server in `lab`'s server host and waits until it listens.
    pub fn start(lab: &Lab) -> Result<FlowServer, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = lab.command(Host::Server, exe);
        cmd.args(["lab", "flows-server", "--port", &FLOWS_PORT.to_string()])
            .stdin(Stdio::piped());
        let child = crate::sys::spawn_ready(cmd, "flows server")?;
        Ok(FlowServer { child })
    }
}

impl Drop for FlowServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one terminal's connections received.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// (end s, bytes) of each report interval since the start: the shape of iperf3's
    /// intervals.
    pub intervals: Vec<(f64, u64)>,
    /// Bytes received in all.
    pub bytes: u64,
    /// Connections that did not connect, or failed before their stop.
    pub failed: u32,
    /// The first failure, said.
    pub error: Option<String>,
}

/// Every terminal's connections to the flows server, made and not yet started.
pub struct Connected {
    rt: tokio::runtime::Runtime,
    conns: Vec<Vec<tokio::net::TcpStream>>,
    failed: Vec<u32>,
    errors: Vec<Option<String>>,
}

/// Connects `flows` connections from each terminal of `sites` to the flows server (within
/// 60 s and a millisecond a connection); `Err` if none connected.
pub fn connect(lab: &Lab, sites: &[Site], flows: u32) -> Result<Connected, String> {
    let want = sites.len() as u64 * flows as u64;
    crate::sys::raise_fd_limit(want + 20_000);
    // Each terminal's sockets, made in its client's namespace.
    let mut socks = Vec::new();
    for st in sites {
        let ns = lab.node_ns(&st.client);
        let made = crate::checked::in_netns(&ns, move || {
            (0..flows)
                .map(|_| {
                    let s =
                        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                    s.set_nonblocking(true)?;
                    Ok(std::net::TcpStream::from(s))
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .join()
        .map_err(|_| "a socket maker failed".to_string())??
        .map_err(|e| format!("{}: cannot make a socket: {e}", st.client))?;
        socks.push(made);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    let server: SocketAddr = (
        SERVER_V4.parse::<std::net::Ipv4Addr>().expect("an address"),
        FLOWS_PORT,
    )
        .into();
    // Connect everything (within 60 s and a millisecond a connection), then start.
    let connect_by = Duration::from_secs(60) + Duration::from_millis(want);
    let (conns, failed, errors) = rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for (k, list) in socks.into_iter().enumerate() {
            for s in list {
                tasks.spawn(async move {
                    let r = async {
                        let sock = tokio::net::TcpSocket::from_std_stream(s);
                        tokio::time::timeout(connect_by, sock.connect(server))
                            .await
                            .map_err(|_| "connect timed out".to_string())?
                            .map_err(|e| format!("connect: {e}"))
                    }
                    .await;
                    (k, r)
                });
            }
        }
        let mut conns: Vec<Vec<tokio::net::TcpStream>> =
            (0..sites.len()).map(|_| Vec::new()).collect();
        let mut failed = vec![0u32; sites.len()];
        let mut errors: Vec<Option<String>> = vec![None; sites.len()];
        while let Some(j) = tasks.join_next().await {
            match j {
                Ok((k, Ok(c))) => conns[k].push(c),
                Ok((k, Err(e))) => {
                    failed[k] += 1;
                    errors[k].get_or_insert(e);
                }
                Err(e) => return Err(format!("a connect task failed: {e}")),
            }
        }
        Ok((conns, failed, errors))
    })?;
    if conns.iter().all(|c| c.is_empty()) {
        return Err(format!(
            "no connection to the flows server: {}",
            errors.iter().flatten().next().cloned().unwrap_or_default()
        ));
    }
    Ok(Connected {
        rt,
        conns,
        failed,
        errors,
    })
}

impl Connected {
    /// Starts every connection at once, each terminal's for `stops[k]` seconds, reporting
    /// every `interval_s`; returns when the last has stopped, each terminal's figures in
    /// the order connected. `tick(elapsed s)` is called about once a second; `Err` only if
    /// the run was interrupted.
    pub fn run(
        self,
        stops: &[f64],
        interval_s: f64,
        tick: &mut dyn FnMut(f64),
    ) -> Result<Vec<Received>, String> {
        let Connected {
            rt,
            conns,
            mut failed,
            mut errors,
        } = self;
        let n = conns.len();
        let counts: Vec<Arc<AtomicU64>> = (0..n).map(|_| Arc::default()).collect();
        let last = stops.iter().cloned().fold(0.0, f64::max);
        // The readers, on a thread of their own; this thread samples the counts.
        let start = Instant::now();
        let (cnt, stops2) = (counts.clone(), stops.to_vec());
        let reader = std::thread::spawn(move || {
            rt.block_on(async move {
                let mut tasks = tokio::task::JoinSet::new();
                for (k, list) in conns.into_iter().enumerate() {
                    let until =
                        tokio::time::Instant::from_std(start + Duration::from_secs_f64(stops2[k]));
                    for c in list {
                        tasks.spawn(read_until(c, cnt[k].clone(), until, k));
                    }
                }
                let mut failures = Vec::new();
                while let Some(j) = tasks.join_next().await {
                    match j {
                        Ok(Ok(())) => {}
                        Ok(Err((k, e))) => failures.push((k, e)),
                        Err(e) => failures.push((usize::MAX, format!("a reader failed: {e}"))),
                    }
                }
                failures
            })
        });
        let mut out: Vec<Received> = (0..n).map(|_| Received::default()).collect();
        let mut prev = vec![0u64; n];
        let mut i = 1;
        let mut next = interval_s;
        let mut said = 0.0;
        // Until every terminal's stop (its readers stop reading then).
        while next <= last + 1e-9 {
            let at = start + Duration::from_secs_f64(next);
            if crate::interrupted() {
                return Err("interrupted".into());
            }
            if let Some(d) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            for (k, c) in counts.iter().enumerate() {
                let now = c.load(Relaxed);
                if next <= stops[k] + 1e-9 {
                    out[k].intervals.push((next, now - prev[k]));
                }
                prev[k] = now;
            }
            if next - said >= 1.0 {
                said = next;
                tick(next);
            }
            i += 1;
            // Counted, not summed: the grid stays on round tenths.
            next = i as f64 * interval_s;
        }
        for (k, e) in reader
            .join()
            .map_err(|_| "the readers failed".to_string())?
        {
            if let Some(k) = (k < out.len()).then_some(k) {
                failed[k] += 1;
                errors[k].get_or_insert(e);
            }
        }
        for (k, r) in out.iter_mut().enumerate() {
            r.bytes = counts[k].load(Relaxed);
            r.failed = failed[k];
            r.error = errors[k].take();
        }
        Ok(out)
    }
}

/// Sends the start byte, then reads into `count` until `until`; an error before then is
/// the connection's failure.
async fn read_until(
    mut c: tokio::net::TcpStream,
    count: Arc<AtomicU64>,
    until: tokio::time::Instant,
    k: usize,
) -> Result<(), (usize, String)> {
    use tokio::io::AsyncWriteExt;
    c.write_all(&[1])
        .await
        .map_err(|e| (k, format!("start: {e}")))?;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return Ok(()),
            r = c.readable() => r.map_err(|e| (k, format!("read: {e}")))?,
        }
        // One buffer for every connection (the runtime has one thread): 10 000 of their
        // own would be 640 MB.
        let r = SCRATCH.with(|b| c.try_read(&mut b.borrow_mut()[..]));
        match r {
            Ok(0) => return Err((k, "the server closed the connection".into())),
            Ok(n) => {
                count.fetch_add(n as u64, Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err((k, format!("read: {e}"))),
        }
    }
}

thread_local! {
    /// The readers' one buffer (see [`read_until`]).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; CHUNK]);
}
