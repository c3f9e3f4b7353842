//! Checked transfers: both ends of a TCP connection send a position-dependent pattern and
//! verify every byte they receive, so a lost, duplicated, reordered or altered byte shows as a
//! mismatch at its offset, and a stream cut short shows as a clean end before the length the
//! sender meant. Each end records how its connection ended (FIN, reset, or nothing before a
//! deadline: a hang). The `fault` and `connections` traffic kinds use it.

use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Byte `i` of the stream seeded `seed`. Depends on the position, so a shifted stream fails too.
pub fn pattern_byte(seed: u64, i: u64) -> u8 {
    let x = (i / 8)
        .wrapping_add(seed.wrapping_mul(0x1000_0000_01b3))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> ((i % 8) * 8)) as u8
}

/// Fills `buf` with the stream seeded `seed` from offset `at`.
pub fn fill(seed: u64, at: u64, buf: &mut [u8]) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seed, at + k as u64);
    }
}

/// What one end does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Bytes to send ([`u64::MAX`]: until the connection ends).
    pub send: u64,
    /// Seed of what this end sends.
    pub seed_out: u64,
    /// Seed of what the peer sends.
    pub seed_in: u64,
    /// Read and verify what the peer sends; false: never read (a server busy elsewhere).
    pub read: bool,
    /// Start sending only once the peer's FIN has arrived (the peer half-closes first).
    pub send_after_peer_fin: bool,
    /// Send a FIN once everything is sent.
    pub fin: bool,
    /// Reset the connection (abort) once this many bytes have been received.
    pub abort_after_received: Option<u64>,
    /// Reset the connection once this many bytes have been sent.
    pub abort_after_sent: Option<u64>,
    /// Give up (and call it a hang) after this long.
    pub deadline: Duration,
}

impl Plan {
    /// Sends `send` bytes seeded `seed_out` then a FIN, and reads to the peer's FIN.
    pub fn new(send: u64, seed_out: u64, seed_in: u64) -> Plan {
        Plan {
            send,
            seed_out,
            seed_in,
            read: true,
            send_after_peer_fin: false,
            fin: true,
            abort_after_received: None,
            abort_after_sent: None,
            deadline: Duration::from_secs(60),
        }
    }
}

/// How an end's connection ended, as that end saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum End {
    /// Everything planned was done, and the peer's stream ended with a FIN (or was not read).
    Fin,
    /// The connection was reset under it (ECONNRESET, EPIPE).
    Reset,
    /// This end reset the connection, as planned.
    Aborted,
    /// Nothing ended it before the deadline.
    Hung,
    /// The process was killed (a crashed server; it saw nothing).
    Killed,
    /// It never connected.
    Refused,
}

impl End {
    /// A word for tables.
    pub fn word(self) -> &'static str {
        match self {
            End::Fin => "FIN",
            End::Reset => "reset",
            End::Aborted => "aborted",
            End::Hung => "HUNG",
            End::Killed => "killed",
            End::Refused => "refused",
        }
    }
}

/// What one end saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Bytes handed to the kernel.
    pub sent: u64,
    /// Bytes received (and verified).
    pub received: u64,
    /// Offset of the first received byte that was not the pattern's.
    pub corrupt_at: Option<u64>,
    /// Whether the peer's stream ended with a FIN.
    pub peer_fin: bool,
    /// How the connection ended.
    pub end: End,
    /// Seconds from the start to the end.
    pub secs: f64,
    /// Error text, if it ended with one.
    pub error: Option<String>,
}

/// Runs `plan` on a connected stream. `received` counts bytes as they arrive, for a caller
/// that waits for a transfer to be under way.
pub fn run(stream: TcpStream, plan: &Plan, received: &AtomicU64) -> Outcome {
    let t0 = Instant::now();
    let mut o = Outcome {
        sent: 0,
        received: 0,
        corrupt_at: None,
        peer_fin: false,
        end: End::Fin,
        secs: 0.0,
        error: None,
    };
    let mut s = stream;
    if let Err(e) = s.set_nonblocking(true) {
        o.error = Some(e.to_string());
        o.end = End::Reset;
        return o;
    }
    let mut inbuf = vec![0u8; 64 * 1024];
    let mut outbuf = vec![0u8; 64 * 1024];
    let mut fin_sent = false;
    let finish = |mut o: Outcome, end: End, err: Option<String>| {
        o.end = end;
        o.error = err;
        o.secs = t0.elapsed().as_secs_f64();
        o
    };
    loop {
        let reading = plan.read && !o.peer_fin;
        let may_send = !plan.send_after_peer_fin || o.peer_fin;
        let sending = o.sent < plan.send && may_send;
        if o.sent >= plan.send && plan.fin && !fin_sent {
            let _ = s.shutdown(std::net::Shutdown::Write);
            fin_sent = true;
        }
        if !reading && o.sent >= plan.send {
            return finish(o, End::Fin, None);
        }
        if plan.abort_after_received.is_some_and(|n| o.received >= n)
            || plan.abort_after_sent.is_some_and(|n| o.sent >= n)
        {
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            drop(s);
            return finish(o, End::Aborted, None);
        }
        let left = plan.deadline.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return finish(o, End::Hung, None);
        }
        let mut pfd = libc::pollfd {
            fd: s.as_raw_fd(),
            events: (if reading { libc::POLLIN } else { 0 })
                | (if sending { libc::POLLOUT } else { 0 }),
            revents: 0,
        };
        let ms = left.as_millis().min(200) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            continue;
        }
        if pfd.revents & libc::POLLERR != 0 {
            let e = s.take_error().ok().flatten();
            return finish(o, End::Reset, e.map(|e| e.to_string()));
        }
        if reading && pfd.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
            match s.read(&mut inbuf) {
                Ok(0) => o.peer_fin = true,
                Ok(k) => {
                    if o.corrupt_at.is_none() {
                        if let Some(i) = (0..k).find(|&i| {
                            inbuf[i] != pattern_byte(plan.seed_in, o.received + i as u64)
                        }) {
                            o.corrupt_at = Some(o.received + i as u64);
                        }
                    }
                    o.received += k as u64;
                    received.fetch_add(k as u64, Relaxed);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return finish(o, End::Reset, Some(e.to_string())),
            }
        }
        if sending && pfd.revents & libc::POLLOUT != 0 {
            let mut k = (plan.send - o.sent).min(outbuf.len() as u64) as usize;
            if let Some(n) = plan.abort_after_sent {
                k = k.min(n.saturating_sub(o.sent).max(1) as usize);
            }
            fill(plan.seed_out, o.sent, &mut outbuf[..k]);
            match s.write(&outbuf[..k]) {
                Ok(w) => o.sent += w as u64,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return finish(o, End::Reset, Some(e.to_string())),
            }
        }
    }
}

/// Accepts one connection on `listener` within `wait` and runs `plan` on it.
pub fn serve_one(
    listener: &std::net::TcpListener,
    wait: Duration,
    plan: &Plan,
    received: &AtomicU64,
) -> Outcome {
    let t0 = Instant::now();
    let _ = listener.set_nonblocking(true);
    loop {
        match listener.accept() {
            Ok((s, _)) => return run(s, plan, received),
            Err(e) if e.kind() == ErrorKind::WouldBlock && t0.elapsed() < wait => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => {
                return Outcome {
                    sent: 0,
                    received: 0,
                    corrupt_at: None,
                    peer_fin: false,
                    end: End::Refused,
                    secs: t0.elapsed().as_secs_f64(),
                    error: Some(format!("no connection: {e}")),
                }
            }
        }
    }
}

/// Connects to `addr` within `wait` and runs `plan`.
pub fn connect_and_run(
    addr: std::net::SocketAddr,
    wait: Duration,
    plan: &Plan,
    received: &AtomicU64,
) -> Outcome {
    match TcpStream::connect_timeout(&addr, wait) {
        Ok(s) => run(s, plan, received),
        Err(e) => Outcome {
            sent: 0,
            received: 0,
            corrupt_at: None,
            peer_fin: false,
            end: End::Refused,
            secs: 0.0,
            error: Some(e.to_string()),
        },
    }
}

/// Runs `f` on a new thread inside network namespace `ns` (a name under /run/netns).
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<Result<T, String>> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: setns on this thread only, with a namespace descriptor we hold.
        if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
        }
        Ok(f())
    })
}

/// Writes a whole buffer to a blocking stream (the crash server's simple sender).
pub fn write_pattern_forever(mut s: TcpStream, seed: u64) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0u64;
    loop {
        fill(seed, at, &mut buf);
        if s.write_all(&buf).is_err() {
            return;
        }
        at += buf.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;

    fn pair(client: Plan, server: Plan) -> (Outcome, Outcome) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            serve_one(&l, Duration::from_secs(5), &server, &AtomicU64::new(0))
        });
        let c = connect_and_run(addr, Duration::from_secs(5), &client, &AtomicU64::new(0));
        (c, srv.join().unwrap())
    }

    #[test]
    fn the_pattern_depends_on_seed_and_position() {
        let a: Vec<u8> = (0..64).map(|i| pattern_byte(1, i)).collect();
        let b: Vec<u8> = (1..65).map(|i| pattern_byte(1, i)).collect();
        let c: Vec<u8> = (0..64).map(|i| pattern_byte(2, i)).collect();
        assert_ne!(a, b);
        assert_ne!(a, c);
        let mut f = vec![0u8; 64];
        fill(1, 0, &mut f);
        assert_eq!(f, a);
    }

    #[test]
    fn a_full_exchange_ends_with_fin_both_ways_and_no_corruption() {
        let (c, s) = pair(Plan::new(300_000, 1, 2), Plan::new(2_000_000, 2, 1));
        assert_eq!((c.end, s.end), (End::Fin, End::Fin));
        assert_eq!((c.received, s.received), (2_000_000, 300_000));
        assert_eq!((c.corrupt_at, s.corrupt_at), (None, None));
        assert!(c.peer_fin && s.peer_fin);
    }

    #[test]
    fn a_wrong_byte_is_found_at_its_offset() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 10_000];
            fill(7, 0, &mut buf);
            buf[4321] ^= 1;
            s.write_all(&buf).unwrap();
        });
        let mut p = Plan::new(0, 1, 7);
        p.deadline = Duration::from_secs(5);
        let o = connect_and_run(addr, Duration::from_secs(5), &p, &AtomicU64::new(0));
        assert_eq!(o.corrupt_at, Some(4321));
        assert_eq!(o.received, 10_000);
    }

    #[test]
    fn an_abort_shows_as_a_reset_at_the_peer_and_silence_as_a_hang() {
        let mut client = Plan::new(0, 1, 2);
        client.abort_after_received = Some(100_000);
        let mut server = Plan::new(u64::MAX, 2, 1);
        server.deadline = Duration::from_secs(10);
        let (c, s) = pair(client, server);
        assert_eq!(c.end, End::Aborted);
        assert_eq!(s.end, End::Reset, "{s:?}");

        // A peer that neither sends nor closes: a hang at the deadline.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let keep = Arc::new(std::sync::Mutex::new(None::<TcpStream>));
        let k2 = keep.clone();
        std::thread::spawn(move || *k2.lock().unwrap() = Some(l.accept().unwrap().0));
        let mut p = Plan::new(0, 1, 2);
        p.deadline = Duration::from_millis(500);
        let o = connect_and_run(addr, Duration::from_secs(5), &p, &AtomicU64::new(0));
        assert_eq!(o.end, End::Hung);
    }

    #[test]
    fn half_close_first_lets_the_other_direction_finish() {
        let mut server = Plan::new(500_000, 2, 1);
        server.send_after_peer_fin = true;
        let (c, s) = pair(Plan::new(500_000, 1, 2), server);
        assert_eq!((c.end, s.end), (End::Fin, End::Fin));
        assert_eq!((c.received, s.received), (500_000, 500_000));
    }
}
