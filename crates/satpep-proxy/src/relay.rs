//! Moving bytes between the two legs of one split connection.
//!
//! Each direction is relayed on its own: end of stream on one side becomes a FIN on the other
//! once every byte read has been written (half-closed connections keep flowing the other
//! way); a reset on one side becomes a reset on the other. Each direction holds at most one
//! buffer of data: the next read waits for room, so when the downstream side is slow the
//! excess stays in the upstream socket's receive buffer and its advertised window shrinks.
//! How much the pipe and the downstream socket may hold first is the back-pressure of
//! [`crate::flow_control`] (by default Bharadwaj 1999's improved back-pressure: a low-water
//! mark of unsent bytes; `proxy.back_pressure = "plain"` lets the downstream send buffer,
//! which the kernel sizes, fill), beside drop-based flow control and buffer sizing; each
//! direction calls its [`Regulator`] as data arrives.
//!
//! The buffer is a kernel pipe and bytes move with splice(2), so payload is never copied into
//! user space. If the kernel will not give a pipe, the direction falls back to copying
//! through a user-space buffer of the same size. Either is held only while bytes are in
//! flight: an idle connection costs its two sockets and no buffer.

use crate::config::FlowControl;
use crate::flow_control::{self, Regulator};
use crate::sockets::{close_cleanly, reset_on_close};
use socket2::SockRef;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::io::{AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

/// Bytes held in relay pipes by all connections of this process: the part of the proxy's
/// buffering the kernel's TCP memory accounting does not see.
static PIPED: AtomicU64 = AtomicU64::new(0);

/// Bytes held in relay pipes right now.
pub fn piped_bytes() -> u64 {
    PIPED.load(Relaxed)
}

/// How one direction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// End of stream, relayed as FIN.
    Fin,
    /// The reading side was reset (or failed).
    ResetIn,
    /// The writing side was reset (or failed).
    ResetOut,
}

/// How a connection's bytes move between its legs.
#[derive(Clone, Copy, Default)]
pub struct RelayOptions {
    /// The buffer per direction, bytes.
    pub buf_len: usize,
    /// Splice through kernel pipes (else copy through user space).
    pub zero_copy: bool,
    /// Flow control (`crate::flow_control`).
    pub flow: FlowControl,
}

/// Bytes relayed each way and how the connection ended.
#[derive(Debug, Clone, Copy)]
pub struct Relayed {
    /// Client → server bytes.
    pub up: u64,
    /// Server → client bytes.
    pub down: u64,
    /// How the client → server direction ended.
    pub up_end: End,
    /// How the server → client direction ended.
    pub down_end: End,
    /// The bytes were copied through user space, not spliced.
    pub copied: bool,
}

/// Copies one direction from a TCP socket through a user-space buffer; returns how it ended
/// and the bytes written. The buffer (`buf_len` bytes, never zeroed) is held only while the
/// socket has bytes to give: an idle direction, most of a gateway's, holds none.
pub(crate) async fn copy<W>(r: &TcpStream, mut w: W, buf_len: usize, live: &AtomicU64) -> (End, u64)
where
    W: AsyncWrite + Unpin,
{
    let mut buf: Vec<u8> = Vec::new();
    let mut count = 0u64;
    loop {
        if buf.capacity() == 0 {
            if r.readable().await.is_err() {
                return (End::ResetIn, count);
            }
            buf = Vec::with_capacity(buf_len);
        }
        buf.clear();
        let n = match r.try_read_buf(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Drained: give the buffer back until the socket has bytes again.
                buf = Vec::new();
                continue;
            }
            Err(_) => return (End::ResetIn, count),
        };
        if w.write_all(&buf[..n]).await.is_err() {
            return (End::ResetOut, count);
        }
        count += n as u64;
        live.fetch_add(n as u64, Relaxed);
    }
    // Every byte read has been handed to the kernel; now the FIN.
    match w.shutdown().await {
        Ok(()) => (End::Fin, count),
        Err(_) => (End::ResetOut, count),
    }
}

/// Relays between `client` and `server` until both directions have ended, or one side is
/// reset, in which case the other is reset too.
/// `up` and `down` count the bytes relayed each way as they go.
/// With `zero_copy` the bytes move through kernel pipes; if the kernel gives none, or without
/// it, they are copied (see [`Relayed::copied`]). `abort` resets both legs at once.
pub async fn relay(
    client: &mut TcpStream,
    server: &mut TcpStream,
    opts: &RelayOptions,
    up: &AtomicU64,
    down: &AtomicU64,
    abort: &tokio::sync::Notify,
) -> Relayed {
    let copied = std::sync::atomic::AtomicBool::new(false);
    let mut up_flow = Regulator::new(opts.flow, &*client);
    let mut down_flow = Regulator::new(opts.flow, &*server);
    if opts.flow.improved {
        flow_control::hold_unsent(client.as_raw_fd());
        flow_control::hold_unsent(server.as_raw_fd());
    }
    let (up_len, down_len) = (
        up_flow.pipe_len(opts.buf_len),
        down_flow.pipe_len(opts.buf_len),
    );
    let zero_copy = opts.zero_copy;
    let (up_end, down_end) = tokio::select! {
        r = both_ways(
            one_way(client, server, up_len, zero_copy, up, &copied, &mut up_flow),
            one_way(server, client, down_len, zero_copy, down, &copied, &mut down_flow),
        ) => r,
        // Reset both legs (the idle timeout).
        _ = abort.notified() => (Some((End::ResetIn, up.load(Relaxed))), None),
    };
    let copied = copied.load(Relaxed);
    if is_reset(&up_end) || is_reset(&down_end) {
        reset_on_close(SockRef::from(&*client));
        reset_on_close(SockRef::from(&*server));
    } else {
        // Both directions ended with a FIN: only now may a close be a clean one.
        close_cleanly(SockRef::from(&*client));
        close_cleanly(SockRef::from(&*server));
    }
    // A direction still running when the other was reset was cut off; what it relayed
    // until then is in its live count.
    let (up_end, up_bytes) = up_end.unwrap_or((End::ResetOut, up.load(Relaxed)));
    let (down_end, down_bytes) = down_end.unwrap_or((End::ResetOut, down.load(Relaxed)));
    Relayed {
        up: up_bytes,
        down: down_bytes,
        up_end,
        down_end,
        copied,
    }
}

fn is_reset(e: &Option<(End, u64)>) -> bool {
    matches!(e, Some((End::ResetIn | End::ResetOut, _)))
}

/// Runs both directions until both end, or until one is reset (the other is then abandoned).
pub(crate) async fn both_ways(
    a: impl std::future::Future<Output = (End, u64)>,
    b: impl std::future::Future<Output = (End, u64)>,
) -> (Option<(End, u64)>, Option<(End, u64)>) {
    tokio::pin!(a, b);
    let (mut up_end, mut down_end) = (None, None);
    while up_end.is_none() || down_end.is_none() {
        tokio::select! {
            e = &mut a, if up_end.is_none() => up_end = Some(e),
            e = &mut b, if down_end.is_none() => down_end = Some(e),
        }
        if is_reset(&up_end) || is_reset(&down_end) {
            break;
        }
    }
    (up_end, down_end)
}

/// A kernel pipe used as the relay buffer of one direction: bytes are moved socket → pipe →
/// socket with splice(2) and never copied into user space.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    /// Capacity in bytes, as the kernel rounded it.
    cap: usize,
}

/// Relay pipes that may still be opened; past them, directions use heap buffers. Unlimited
/// until the proxy sets it from its descriptor budget.
static PIPE_BUDGET: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(i64::MAX / 2);

/// Sets how many relay pipes may be open at once (each holds two descriptors).
pub fn set_pipe_budget(pipes: u64) {
    PIPE_BUDGET.store(pipes.min(i64::MAX as u64 / 2) as i64, Relaxed);
}

impl Drop for Pipe {
    fn drop(&mut self) {
        PIPE_BUDGET.fetch_add(1, Relaxed);
    }
}

impl Pipe {
    /// A non-blocking pipe of about `len` bytes; `None` if the kernel will not give one (out of
    /// descriptors, or past the per-user pipe page limit), in which case the caller copies.
    fn new(len: usize) -> Option<Pipe> {
        if PIPE_BUDGET.fetch_sub(1, Relaxed) <= 0 {
            PIPE_BUDGET.fetch_add(1, Relaxed);
            return None;
        }
        let Some(p) = Self::open(len) else {
            PIPE_BUDGET.fetch_add(1, Relaxed);
            return None;
        };
        Some(p)
    }

    fn open(len: usize) -> Option<Pipe> {
        let mut fds = [0i32; 2];
        // SAFETY: fds has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return None;
        }
        // SAFETY: pipe2 succeeded, so both are fresh descriptors we now own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: plain fcntl on a descriptor we own. Root may exceed fs.pipe-max-size.
        let cap = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, len as libc::c_int) };
        let cap = if cap > 0 {
            cap as usize
        } else {
            // SAFETY: as above.
            let c = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) };
            if c <= 0 {
                return None;
            }
            c as usize
        };
        Some(Pipe { r, w, cap })
    }
}

fn splice(from: i32, to: i32, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the duration of the call; null offsets are
    // required for sockets and pipes.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What one splice from the reading socket did.
enum Filled {
    Bytes(usize),
    Eof,
    /// The pipe has no free slot although the socket has data: wait for the writer, not
    /// for the socket (whose readiness must not be cleared, or the relay would stall).
    PipeFull,
}

/// Bytes one direction holds in its buffer, mirrored in [`PIPED`] for as long as it lives.
struct Held(usize);

impl Held {
    fn add(&mut self, n: usize) {
        self.0 += n;
        PIPED.fetch_add(n as u64, Relaxed);
    }
    fn sub(&mut self, n: usize) {
        self.0 -= n;
        PIPED.fetch_sub(n as u64, Relaxed);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        PIPED.fetch_sub(self.0 as u64, Relaxed);
    }
}

/// A direction's buffer, held only while bytes are in flight: a kernel pipe, or a heap
/// buffer when the kernel gives no pipe (or zero copy is off).
enum Buf {
    Pipe(Pipe),
    Heap(Vec<u8>),
}

impl Buf {
    /// Bytes that may still be read into it, with `held` bytes pending from `start` (heap).
    fn room(&self, start: usize, held: usize) -> usize {
        match self {
            Buf::Pipe(p) => p.cap - held,
            Buf::Heap(v) => v.len() - start - held,
        }
    }
}

/// Relays one direction. Same contract as [`copy`]: at most one buffer of data is in flight,
/// so a slow writer leaves the excess in the reader's receive buffer. The buffer is taken when
/// data arrives and given back once everything read has been written and the socket is
/// empty, so an idle connection holds two descriptors and no buffer memory.
async fn one_way(
    r: &TcpStream,
    w: &TcpStream,
    len: usize,
    zero_copy: bool,
    live: &AtomicU64,
    copied: &std::sync::atomic::AtomicBool,
    flow: &mut Regulator,
) -> (End, u64) {
    let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
    let (mut count, mut eof, mut pipe_full) = (0u64, false, false);
    // Bytes now buffered; counted in PIPED until written, or until this future ends.
    let mut held = Held(0);
    // Heap buffer: the pending bytes are [start, start + held).
    let mut start = 0usize;
    let mut buf: Option<Buf> = None;
    loop {
        let b = match &mut buf {
            Some(b) => b,
            None => {
                // Idle: wait for data (or the end) without holding a buffer.
                if r.readable().await.is_err() {
                    return (End::ResetIn, count);
                }
                start = 0;
                buf.insert(match zero_copy.then(|| Pipe::new(len)).flatten() {
                    Some(p) => Buf::Pipe(p),
                    None => {
                        copied.store(true, Relaxed);
                        Buf::Heap(vec![0u8; len])
                    }
                })
            }
        };
        let room = b.room(start, held.0);
        let mut socket_empty = false;
        if !eof && !pipe_full && room > 0 {
            let got = match b {
                Buf::Pipe(p) => {
                    let pw = p.w.as_raw_fd();
                    r.try_io(Interest::READABLE, || match splice(rfd, pw, room) {
                        Ok(0) => Ok(Filled::Eof),
                        Ok(n) => Ok(Filled::Bytes(n)),
                        // EAGAIN has two causes; only an empty socket may clear its readiness.
                        Err(e)
                            if e.kind() == io::ErrorKind::WouldBlock
                                && held.0 > 0
                                && crate::tcpinfo::queue(rfd, libc::FIONREAD) > 0 =>
                        {
                            Ok(Filled::PipeFull)
                        }
                        Err(e) => Err(e),
                    })
                }
                Buf::Heap(v) => r.try_read(&mut v[start + held.0..]).map(|n| {
                    if n == 0 {
                        Filled::Eof
                    } else {
                        Filled::Bytes(n)
                    }
                }),
            };
            match got {
                Ok(Filled::Bytes(n)) => {
                    held.add(n);
                    flow.on_data(rfd, wfd, held.0 as u64);
                }
                Ok(Filled::Eof) => eof = true,
                Ok(Filled::PipeFull) => pipe_full = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => socket_empty = true,
                Err(_) => return (End::ResetIn, count),
            }
        }
        if held.0 > 0 {
            let put = match b {
                Buf::Pipe(p) => {
                    let pr = p.r.as_raw_fd();
                    w.try_io(Interest::WRITABLE, || splice(pr, wfd, held.0))
                }
                Buf::Heap(v) => w.try_write(&v[start..start + held.0]),
            };
            match put {
                Ok(n) => {
                    held.sub(n);
                    start = if held.0 == 0 { 0 } else { start + n };
                    count += n as u64;
                    live.fetch_add(n as u64, Relaxed);
                    pipe_full = false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return (End::ResetOut, count),
            }
        }
        if eof && held.0 == 0 {
            // Every byte read has been handed to the kernel; now the FIN.
            return match SockRef::from(w).shutdown(std::net::Shutdown::Write) {
                Ok(()) => (End::Fin, count),
                Err(_) => (End::ResetOut, count),
            };
        }
        if held.0 == 0 && socket_empty {
            // Nothing in flight and nothing to read: give the buffer back.
            buf = None;
            continue;
        }
        let room = buf.as_ref().map_or(0, |b| b.room(start, held.0));
        let want_read = !eof && !pipe_full && room > 0;
        let want_write = held.0 > 0;
        // Readiness futures return at once while the last attempt left readiness set, and
        // take nothing from tokio's cooperative budget: on a link faster than the CPU this
        // loop never waited and held its worker, and another connection's last bytes sat
        // unread (a kernel bridge, 3 Gbit/s: iperf3's control message never reached the
        // server in two of six runs). Each pass spends budget, so the task yields in turn.
        tokio::task::coop::consume_budget().await;
        tokio::select! {
            r = r.readable(), if want_read => if r.is_err() { return (End::ResetIn, count) },
            w = w.writable(), if want_write => if w.is_err() { return (End::ResetOut, count) },
            else => return (End::ResetOut, count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// Two connected loopback sockets: (the far end, the proxy's end).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let far = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (near, _) = l.accept().await.unwrap();
        (far, near)
    }

    #[tokio::test]
    async fn a_reset_flow_reports_the_bytes_the_other_direction_relayed() {
        let (mut user, mut client) = pair().await;
        let (mut origin, mut server) = pair().await;
        let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
        let abort = tokio::sync::Notify::new();
        let opts = RelayOptions {
            buf_len: 64 << 10,
            ..Default::default()
        };
        let relayed = relay(&mut client, &mut server, &opts, &up, &down, &abort);
        let ends = async {
            let data = vec![7u8; 1 << 20];
            origin.write_all(&data).await.unwrap();
            let mut got = vec![0u8; data.len()];
            user.read_exact(&mut got).await.unwrap();
            // The client goes away with a reset while the server's direction is still open.
            SockRef::from(&user)
                .set_linger(Some(std::time::Duration::ZERO))
                .unwrap();
            drop(user);
            origin
        };
        let (r, _origin) = tokio::join!(relayed, ends);
        assert!(matches!(r.up_end, End::ResetIn), "up ended {:?}", r.up_end);
        assert_eq!(
            r.down,
            1 << 20,
            "the megabyte relayed down before the reset"
        );
    }
}
