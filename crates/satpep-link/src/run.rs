//! The running emulator: one thread per direction moves frames from its ingress socket,
//! through its [`Channel`], to the egress socket at each frame's delivery time; the calling
//! thread serves the control socket until asked to stop.

use crate::config::LinkConfig;
use crate::ethtool::Offloads;
use crate::model::{Channel, Fate};
use crate::socket::{FrameBuf, PacketSocket, BATCH};
use crate::stats::{DirStats, LinkSnapshot};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run and where.
pub struct EmulatorOptions {
    /// The link.
    pub config: LinkConfig,
    /// Interface facing the satellite terminal (forward frames leave here).
    pub terminal_if: String,
    /// Interface facing the gateway (return frames leave here).
    pub gateway_if: String,
    /// Unix socket that serves counters as JSON while running.
    pub control: Option<PathBuf>,
    /// SCHED_FIFO priority of the forwarding threads (None: normal scheduling).
    pub realtime: Option<i32>,
}

/// Shortest sleep of a forwarding thread: bounds wake-ups to 20 000/s per direction.
const MIN_SLEEP_NS: f64 = 50_000.0;

struct Pending {
    at: f64,
    seq: u64,
    buf: FrameBuf,
    len: usize,
}
impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.at.total_cmp(&o.at).then(self.seq.cmp(&o.seq))
    }
}

fn set_timer_slack() {
    // Default slack is 50 µs; the delay line wants its wake-ups on time.
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Gives the calling thread real-time FIFO priority so timer wake-ups are not queued behind
/// the traffic generators sharing the CPU. Returns whether it worked (it needs root).
fn set_realtime(prio: i32) -> bool {
    let p = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 is the calling thread; p is valid.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) == 0 }
}

/// Longest a frame is taken to have waited in the socket before it was read: a stamp older
/// than this (a wall clock set back, a stamp from before the emulator ran) counts from here.
const READ_LATE_MOST_NS: f64 = 20e6;

/// The wall clock now, ns since the Unix epoch (the kernel's receive stamps' clock).
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// When a frame read at `now` (ns on the emulator's clock, the wall clock then reading
/// `wall_at_now`) reached the link: when the kernel stamped it (`stamp`, wall-clock ns; 0 for
/// none), no earlier than the frame before it and [`READ_LATE_MOST_NS`] before `now`, and
/// never after `now`. Counted from the read instead, a frame that waited while the emulator's
/// thread was not running left the link idle for that wait, as if the link were slower: at
/// 1 Gbit/s with busy proxies on two cores, most of a millisecond at a time.
fn arrived(now: f64, wall_at_now: f64, stamp: u64, last: f64) -> f64 {
    if stamp == 0 {
        return now.max(last);
    }
    let at = now - (wall_at_now - stamp as f64);
    at.max(now - READ_LATE_MOST_NS).max(last).min(now)
}

/// Moves frames of one direction until `stop` is set.
fn pump(
    mut ch: Channel,
    rx: Arc<PacketSocket>,
    tx: Arc<PacketSocket>,
    stats: Arc<DirStats>,
    start: Instant,
    stop: Arc<AtomicBool>,
    realtime: Option<i32>,
) {
    set_timer_slack();
    if let Some(prio) = realtime {
        if !set_realtime(prio) {
            eprintln!("satpep link: cannot use real-time priority (needs root); timing will be less exact");
        }
    }
    let buf_len = rx.buf_len().max(tx.buf_len());
    let mut pool: Vec<FrameBuf> = Vec::new();
    let mut batch: Vec<FrameBuf> = (0..BATCH)
        .map(|_| vec![0u8; buf_len].into_boxed_slice())
        .collect();
    let mut lens = [0usize; BATCH];
    let mut oversize = [false; BATCH];
    let mut stamps = [0u64; BATCH];
    // When the last frame reached the link (ns since `start`): frames keep their order.
    let mut last_arrival = 0.0f64;
    let mut heap: BinaryHeap<Reverse<Pending>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut queue_delays: Vec<u64> = Vec::with_capacity(BATCH);
    let mut last_kstat = Instant::now();
    let mut warned_oversize = false;
    let elapsed = || start.elapsed().as_nanos() as f64;
    while !stop.load(Relaxed) {
        // 1. Release every frame that is due.
        let mut now = elapsed();
        let mut blocked = false;
        while heap.peek().is_some_and(|p| p.0.at <= now) {
            let mut due: Vec<Pending> = Vec::with_capacity(BATCH);
            while due.len() < BATCH && heap.peek().is_some_and(|p| p.0.at <= now) {
                due.push(heap.pop().unwrap().0);
            }
            let frames: Vec<&[u8]> = due.iter().map(|p| &p.buf[..p.len]).collect();
            // Lateness is measured at release; the send itself runs the receivers' stacks.
            let sent_at = elapsed();
            let (sent, refused) = tx.send_batch(&frames);
            {
                let mut h = stats.late_us.lock().unwrap();
                for p in &due[..sent] {
                    h.saturating_record((((sent_at - p.at) / 1e3) as u64).max(1));
                }
            }
            let bytes: usize = due[..sent]
                .iter()
                .map(|p| p.len - crate::socket::VNET_HDR_LEN)
                .sum();
            // A refused frame is lost like one the far end never heard.
            let done = sent + refused as usize;
            stats.delivered.fetch_add(sent as u64, Relaxed);
            stats.delivered_bytes.fetch_add(bytes as u64, Relaxed);
            stats.tx_errors.fetch_add(refused as u64, Relaxed);
            stats.in_flight.fetch_sub(done as u64, Relaxed);
            let mut rest = due.into_iter();
            for p in rest.by_ref().take(done) {
                pool.push(p.buf);
            }
            // The rest keep their order: retried at once after a refusal, shortly if the
            // socket would block.
            let mut left = false;
            for p in rest {
                heap.push(Reverse(p));
                left = true;
            }
            if left && !refused {
                blocked = true;
                break;
            }
            now = elapsed();
        }
        // 2. Wait for input or the next delivery. A gap shorter than MIN_SLEEP_NS is slept
        // as MIN_SLEEP_NS and the frames due by then leave in one batch: arming a timer per
        // frame at high rates costs more CPU (a VM exit each here) than the frames themselves,
        // and busy-waiting would starve the hosts sharing the CPU.
        let wait_ns = match heap.peek() {
            _ if blocked => 20_000.0,
            Some(p) => (p.0.at - elapsed()).clamp(MIN_SLEEP_NS, 50e6),
            None => 50e6,
        };
        {
            let ts = libc::timespec {
                tv_sec: (wait_ns / 1e9) as libc::time_t,
                tv_nsec: (wait_ns % 1e9) as libc::c_long,
            };
            let mut pfd = libc::pollfd {
                fd: rx.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd and a valid timespec.
            unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        }
        // 3. Read what arrived and decide each frame's fate.
        loop {
            let n = match rx.recv_batch(&mut batch, &mut lens, &mut oversize, &mut stamps) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("satpep link: reading {} failed: {e}", rx.name);
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            if n == 0 {
                break;
            }
            let now = elapsed();
            // The kernel's stamps are wall-clock time; `now` is the same moment on the
            // emulator's clock.
            let wall_at_now = wall_ns() as f64;
            let mut read_late = stats.read_late_us.lock().unwrap();
            let (mut bytes_in, mut d_queue, mut d_err, mut d_out, mut d_big) = (0, 0, 0, 0, 0);
            for i in 0..n {
                let arrival = arrived(now, wall_at_now, stamps[i], last_arrival);
                last_arrival = arrival;
                read_late.saturating_record((((now - arrival) / 1e3) as u64).max(1));
                let frame_len = lens[i].saturating_sub(crate::socket::VNET_HDR_LEN);
                bytes_in += frame_len as u64;
                if oversize[i] {
                    d_big += 1;
                    if !warned_oversize {
                        warned_oversize = true;
                        eprintln!(
                            "satpep link: dropping a {frame_len}-byte frame from {} that is \
                             larger than one wire frame: turn TSO/GSO off on the peer of {} \
                             (ethtool -K PEER tso off gso off)",
                            rx.name, rx.name
                        );
                    }
                    continue;
                }
                let frame = &batch[i]
                    [crate::socket::VNET_HDR_LEN..lens[i].max(crate::socket::VNET_HDR_LEN)];
                let path = ch.path_of(frame);
                match ch.offer_on(arrival, frame_len as u32, path) {
                    Fate::Deliver { at_ns, queue_ns } => {
                        queue_delays.push((queue_ns / 1e3) as u64);
                        let fresh = pool
                            .pop()
                            .unwrap_or_else(|| vec![0u8; buf_len].into_boxed_slice());
                        let buf = std::mem::replace(&mut batch[i], fresh);
                        heap.push(Reverse(Pending {
                            at: at_ns,
                            seq,
                            buf,
                            len: lens[i],
                        }));
                        seq += 1;
                    }
                    Fate::DropQueue => d_queue += 1,
                    Fate::DropError { queue_ns } => {
                        queue_delays.push((queue_ns / 1e3) as u64);
                        d_err += 1
                    }
                    Fate::DropOutage { queue_ns } => {
                        queue_delays.push((queue_ns / 1e3) as u64);
                        d_out += 1
                    }
                }
            }
            drop(read_late);
            let delivered_now = (n - d_queue - d_err - d_out - d_big) as u64;
            stats.frames_in.fetch_add(n as u64, Relaxed);
            stats.bytes_in.fetch_add(bytes_in, Relaxed);
            stats.dropped_queue.fetch_add(d_queue as u64, Relaxed);
            stats.dropped_error.fetch_add(d_err as u64, Relaxed);
            stats.dropped_outage.fetch_add(d_out as u64, Relaxed);
            stats.dropped_oversize.fetch_add(d_big as u64, Relaxed);
            stats.in_flight.fetch_add(delivered_now, Relaxed);
            let (bf, bb) = ch.backlog();
            stats.backlog_frames.store(bf as u64, Relaxed);
            stats.backlog_bytes.store(bb, Relaxed);
            if !queue_delays.is_empty() {
                let mut h = stats.queue_delay_us.lock().unwrap();
                for &q in &queue_delays {
                    h.saturating_record(q.max(1));
                }
                queue_delays.clear();
            }
            if n < BATCH {
                break;
            }
        }
        if last_kstat.elapsed() > Duration::from_millis(100) {
            last_kstat = Instant::now();
            stats.dropped_kernel.fetch_add(rx.kernel_drops(), Relaxed);
        }
    }
    stats.dropped_kernel.fetch_add(rx.kernel_drops(), Relaxed);
}

/// A running emulator's shared state.
pub struct Running {
    start: Instant,
    fwd: Arc<DirStats>,
    ret: Arc<DirStats>,
}

impl Running {
    /// Current counters.
    pub fn snapshot(&self) -> LinkSnapshot {
        LinkSnapshot {
            uptime_s: self.start.elapsed().as_secs_f64(),
            forward: self.fwd.snapshot(),
            ret: self.ret.snapshot(),
        }
    }
}

/// Runs the emulator until `stop` is set; returns the final counters.
///
/// Everything that can fail is checked before any interface is changed, and interfaces are
/// put back as they were on every exit path.
pub fn run(
    opts: EmulatorOptions,
    stop: Arc<AtomicBool>,
    on_ready: impl FnOnce(),
) -> Result<LinkSnapshot, String> {
    if opts.terminal_if == opts.gateway_if {
        return Err(format!(
            "the terminal and gateway sides must be two interfaces, both are '{}'",
            opts.terminal_if
        ));
    }
    let open = |name: &str, side: &str| {
        PacketSocket::open(name)
            .map(Arc::new)
            .map_err(|e| format!("{side} side: {e}"))
    };
    let term = open(&opts.terminal_if, "terminal")?;
    let gw = open(&opts.gateway_if, "gateway")?;
    let listener = match &opts.control {
        Some(p) => {
            if p.exists() {
                // A socket file left by a crashed emulator; a live one would answer.
                if std::os::unix::net::UnixStream::connect(p).is_ok() {
                    return Err(format!(
                        "control socket {} is in use by another emulator",
                        p.display()
                    ));
                }
                let _ = std::fs::remove_file(p);
            }
            let l = UnixListener::bind(p)
                .map_err(|e| format!("cannot create control socket {}: {e}", p.display()))?;
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            Some(l)
        }
        None => None,
    };
    let mut offloads = Offloads::default();
    for ifname in [&opts.terminal_if, &opts.gateway_if] {
        if let Err(e) = offloads.disable(ifname) {
            offloads.restore();
            if let Some(p) = &opts.control {
                let _ = std::fs::remove_file(p);
            }
            return Err(e.to_string());
        }
    }
    let start = Instant::now();
    let running = Running {
        start,
        fwd: Arc::new(DirStats::default()),
        ret: Arc::new(DirStats::default()),
    };
    let cfg = opts.config;
    let realtime = opts.realtime;
    let fwd_ch = Channel::new(cfg.forward, cfg.outages.clone(), cfg.seed, 0);
    let ret_ch = Channel::new(cfg.ret, cfg.outages, cfg.seed, 1);
    let threads = [
        (
            fwd_ch,
            gw.clone(),
            term.clone(),
            running.fwd.clone(),
            "link-forward",
        ),
        (
            ret_ch,
            term.clone(),
            gw.clone(),
            running.ret.clone(),
            "link-return",
        ),
    ]
    .into_iter()
    .map(|(ch, rx, tx, st, name)| {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || pump(ch, rx, tx, st, start, stop, realtime))
            .expect("spawning a thread")
    })
    .collect::<Vec<_>>();
    set_timer_slack();
    on_ready();
    while !stop.load(Relaxed) {
        match listener.as_ref().map(|l| l.accept()) {
            Some(Ok((conn, _))) => serve(conn, &running),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    for t in threads {
        let _ = t.join();
    }
    offloads.restore();
    if let Some(p) = &opts.control {
        let _ = std::fs::remove_file(p);
    }
    Ok(running.snapshot())
}

fn serve(conn: std::os::unix::net::UnixStream, running: &Running) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    let mut line = String::new();
    let mut r = BufReader::new(&conn);
    let _ = r.read_line(&mut line);
    let reply = match line.trim() {
        "stats" | "" => serde_json::to_string(&running.snapshot()).unwrap(),
        other => serde_json::json!({ "error": format!("unknown request '{other}' (try 'stats')") })
            .to_string(),
    };
    let mut w = &conn;
    let _ = w.write_all(reply.as_bytes());
    let _ = w.write_all(b"\n");
}

/// Asks a running emulator for its counters over its control socket.
pub fn query(control: &std::path::Path) -> Result<LinkSnapshot, String> {
    let conn = std::os::unix::net::UnixStream::connect(control)
        .map_err(|e| format!("no emulator answers on {}: {e}", control.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    (&conn).write_all(b"stats\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&conn)
        .read_line(&mut line)
        .map_err(|e| format!("reading {}: {e}", control.display()))?;
    serde_json::from_str(&line).map_err(|e| format!("bad reply from {}: {e}", control.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator's clock reads 50 ms (in ns) when the wall clock reads 10^7 s.
    const NOW: f64 = 50e6;
    const WALL: f64 = 1e16;

    fn stamp_before(ns: f64) -> u64 {
        (WALL - ns) as u64
    }

    #[test]
    fn a_frame_reaches_the_link_when_the_kernel_stamped_it() {
        // Read 3 ms after it arrived: the link counts from its arrival.
        let at = arrived(NOW, WALL, stamp_before(3e6), 0.0);
        assert!((at - (NOW - 3e6)).abs() < 1.0, "{at}");
    }

    #[test]
    fn arrivals_keep_their_order_and_are_never_in_the_future() {
        // Stamped before the frame ahead of it: not before that one.
        assert_eq!(arrived(NOW, WALL, stamp_before(3e6), NOW - 1e6), NOW - 1e6);
        // A stamp after the read (a wall clock set forward): now.
        assert_eq!(arrived(NOW, WALL, (WALL + 5e6) as u64, 0.0), NOW);
    }

    #[test]
    fn a_stamp_far_in_the_past_or_missing_counts_from_a_bounded_wait() {
        // A wall clock set back an hour: at most READ_LATE_MOST_NS of waiting.
        assert_eq!(
            arrived(NOW, WALL, stamp_before(3.6e12), 0.0),
            NOW - READ_LATE_MOST_NS
        );
        // No stamp: when it was read.
        assert_eq!(arrived(NOW, WALL, 0, 0.0), NOW);
        assert_eq!(arrived(NOW, WALL, 0, NOW + 1.0), NOW + 1.0);
    }
}
