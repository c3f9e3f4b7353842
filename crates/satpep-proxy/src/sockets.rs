//! Sockets with the options a transparent proxy needs, and per-leg TCP tuning.

use crate::config::Leg;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

/// Reads an integer socket option; None if the socket has no such option.
pub fn getopt_int(fd: i32, level: i32, opt: i32) -> Option<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most len bytes into v.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            opt,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

/// Sets an integer socket option.
pub fn setopt_int(fd: i32, level: i32, opt: i32, v: i32) -> io::Result<()> {
    // SAFETY: pointer to a live c_int with its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Lets a socket accept connections for, or bind to, addresses that are not local
/// (IP_TRANSPARENT / IPV6_TRANSPARENT). Needs CAP_NET_ADMIN.
fn set_transparent(s: &Socket, v6: bool) -> io::Result<()> {
    let fd = s.as_raw_fd();
    if v6 {
        setopt_int(fd, libc::SOL_IPV6, libc::IPV6_TRANSPARENT, 1)?;
    }
    // Also on IPv6 sockets: IPv4 connections reach a dual-stack listener as mapped addresses.
    setopt_int(fd, libc::SOL_IP, libc::IP_TRANSPARENT, 1)
        .or_else(|e| if v6 { Ok(()) } else { Err(e) })
}

/// Selects congestion control `name` on socket `fd` (TCP_CONGESTION); works on connected
/// sockets too.
pub fn set_congestion(fd: std::os::fd::RawFd, name: &str) -> io::Result<()> {
    // SAFETY: the name is passed with its length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr() as *const libc::c_void,
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One of a socket's two buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// SO_SNDBUF.
    Send,
    /// SO_RCVBUF.
    Receive,
}

impl Buffer {
    /// The option, and the one that may pass the sysctl limit.
    fn options(self) -> (libc::c_int, libc::c_int) {
        match self {
            Buffer::Send => (libc::SO_SNDBUF, libc::SO_SNDBUFFORCE),
            Buffer::Receive => (libc::SO_RCVBUF, libc::SO_RCVBUFFORCE),
        }
    }
}

/// Sets a socket buffer to `bytes` (the kernel doubles it for its overhead, and stops
/// autotuning it). FORCE first: it lifts net.core.{r,w}mem_max, which would otherwise cap a
/// GEO-sized buffer, where the process may (CAP_NET_ADMIN); else the plain option, capped.
pub fn set_buffer(fd: RawFd, which: Buffer, bytes: usize) -> io::Result<()> {
    let (plain, force) = which.options();
    let b = bytes.min(i32::MAX as usize) as i32;
    setopt_int(fd, libc::SOL_SOCKET, force, b)
        .or_else(|_| setopt_int(fd, libc::SOL_SOCKET, plain, b))
}

/// A socket buffer's size as the kernel counts it (twice what was set), bytes; 0 if it
/// cannot be read.
pub fn buffer_size(fd: RawFd, which: Buffer) -> u64 {
    getopt_int(fd, libc::SOL_SOCKET, which.options().0).map_or(0, |v| v.max(0) as u64)
}

/// Applies a leg's tuning to a socket. An unknown congestion control is an error naming it.
pub fn tune(s: SockRef<'_>, leg: &Leg) -> io::Result<()> {
    let fd = s.as_raw_fd();
    if let Some(cc) = &leg.congestion {
        if let Err(e) = set_congestion(fd, cc) {
            return Err(io::Error::new(
                e.kind(),
                format!("congestion control '{cc}' is not available: {e}"),
            ));
        }
    }
    if let Some(b) = leg.buffer {
        set_buffer(fd, Buffer::Send, b)?;
        set_buffer(fd, Buffer::Receive, b)?;
    }
    if leg.nodelay {
        s.set_nodelay(true)?;
    }
    if let Some(l) = leg.notsent_lowat {
        setopt_int(fd, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, l as i32)?;
    }
    if let Some(m) = leg.mss {
        // Takes effect before the handshake: on listeners (inherited by accepted sockets)
        // and on sockets about to connect.
        setopt_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, m as i32)?;
    }
    Ok(())
}

/// A dual-stack transparent listener on `[::]:port`; accepted sockets inherit `leg`'s buffers.
pub fn listener(port: u16, leg: &Leg, shared: bool) -> io::Result<std::net::TcpListener> {
    let s = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    s.set_only_v6(false)?;
    s.set_reuse_address(true)?;
    // Workers (proxy.workers) each listen on the port; the kernel spreads connections.
    if shared {
        s.set_reuse_port(true)?;
    }
    set_transparent(&s, true)?;
    tune_listener(SockRef::from(&s), leg)?;
    s.bind(&SocketAddr::from(([0u16; 8], port)).into())?;
    if leg.fastopen {
        // Queue of pending Fast Open requests (connections whose SYN carried data).
        setopt_int(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_FASTOPEN, 1024)?;
    }
    // A burst of clients waits here while the accept loop catches up (the kernel caps it at
    // net.core.somaxconn).
    s.listen(4096)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Sets on a listener what its accepted sockets inherit: buffers (inherited, they size the
/// window scale at the handshake) and MSS. The controller, Nagle and low-water mark are set
/// on each accepted socket ([`tune`]).
pub fn tune_listener(s: SockRef<'_>, leg: &Leg) -> io::Result<()> {
    tune(
        s,
        &Leg {
            congestion: None,
            nodelay: false,
            notsent_lowat: None,
            ..leg.clone()
        },
    )
}

/// An unconnected, non-blocking socket bound to the client's address (so the server sees the
/// client), tuned for `leg`, with firewall mark `mark` (its conntrack zone).
pub fn upstream(client: SocketAddr, leg: &Leg, mark: u32) -> io::Result<Socket> {
    let v6 = client.is_ipv6();
    let s = Socket::new(
        if v6 { Domain::IPV6 } else { Domain::IPV4 },
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    set_transparent(&s, v6)?;
    s.set_reuse_address(true)?;
    s.set_mark(mark)?;
    tune(SockRef::from(&s), leg)?;
    s.bind(&client.into())?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Starts a Fast Open connect of `s` to `dst` with `data` in the SYN. Returns how many bytes
/// went into the SYN: all that fit, or 0 when the server's cookie is not known yet (then the
/// SYN asks for one and the data must be sent after the handshake).
pub fn fastopen_connect(s: &Socket, dst: SocketAddr, data: &[u8]) -> io::Result<usize> {
    match s.send_to_with_flags(data, &dst.into(), libc::MSG_FASTOPEN) {
        Ok(n) => Ok(n),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(0),
        Err(e) => Err(e),
    }
}

/// Whether this host lets sockets use Fast Open as a client (bit 1 of
/// net.ipv4.tcp_fastopen) and as a server (bit 2); the sysctl covers IPv6 too.
pub fn fastopen_enabled() -> (bool, bool) {
    let v: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_fastopen")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    (v & 1 != 0, v & 2 != 0)
}

/// A UDP socket bound to `addr` (`[::]` takes IPv4 peers too) with send and receive buffers
/// of `buffer` bytes, forced past the sysctl limits when running as root: the tunnel's.
pub fn udp_socket(addr: SocketAddr, buffer: usize) -> io::Result<std::net::UdpSocket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        let _ = s.set_only_v6(false);
    }
    set_buffer(s.as_raw_fd(), Buffer::Receive, buffer)?;
    set_buffer(s.as_raw_fd(), Buffer::Send, buffer)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// Maps `::ffff:a.b.c.d` to `a.b.c.d` (a dual-stack listener reports IPv4 peers that way).
pub fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Makes the next close of `s` send RST instead of FIN.
pub fn reset_on_close(s: SockRef<'_>) {
    let _ = s.set_linger(Some(std::time::Duration::ZERO));
}

/// Arms a relayed socket: until [`close_cleanly`], any close, including the kernel's when the
/// proxy dies, sends RST. Without this a crashed proxy's client sockets would send their
/// queued bytes and then a FIN, and a cut transfer would look complete.
pub fn arm(s: SockRef<'_>) {
    reset_on_close(s)
}

/// Disarms a socket whose relay ended with a FIN each way: its close sends what is queued and
/// then FIN, as usual.
pub fn close_cleanly(s: SockRef<'_>) {
    let _ = s.set_linger(None);
}

/// Descriptors kept free for everything but connections: listeners, the runtime, logs.
const RESERVE_FDS: u64 = 256;

/// Descriptors kept for the connections a burst brings in while the bypass is switched on.
const BURST_FDS: u64 = 1024;

/// How many connections fit this process's descriptors, and how many relay pipes besides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FdBudget {
    /// The soft descriptor limit now in force.
    pub limit: u64,
    /// Connections that fit (never more than asked for).
    pub connections: u64,
    /// Relay pipes that fit besides (each takes two descriptors); past them, directions relay
    /// through heap buffers.
    pub pipes: u64,
}

/// Raises this process's descriptor limit so `max_connections` connections fit, each with
/// `sockets` sockets (2 for a split connection, 1 for a tunnel flow) and two relay pipes, then
/// says what fits: when the hard limit cannot be raised (no CAP_SYS_RESOURCE), fewer
/// connections, and pipes only in what is left.
pub fn fd_budget(max_connections: u32, sockets: u64) -> FdBudget {
    let n = u64::from(max_connections);
    let want = n * (sockets + 4) + RESERVE_FDS + BURST_FDS;
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit we own.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    if r.rlim_cur < want {
        // Root may raise the hard limit (up to fs.nr_open); anyone may raise the soft one to it.
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(want);
        let target = want.min(nr_open);
        let up = libc::rlimit {
            rlim_cur: target,
            rlim_max: target.max(r.rlim_max),
        };
        // SAFETY: setrlimit reads one rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &up) } != 0 {
            let soft = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            // SAFETY: as above; raising the soft limit to the hard one needs no privilege.
            unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) };
        }
        // SAFETY: as above.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    }
    let limit = r.rlim_cur;
    let usable = limit.saturating_sub(RESERVE_FDS);
    // Connections accepted while the bypass is being switched on still need descriptors.
    let connections = n.min(usable.saturating_sub(BURST_FDS) / sockets.max(1));
    // The burst margin is not for pipes: it must still be free when the limit is reached.
    let pipes = usable.saturating_sub(BURST_FDS + connections * sockets) / 2;
    FdBudget {
        limit,
        connections,
        pipes,
    }
}

/// Turns on TCP keepalive after `idle` without traffic: probes every `idle` / 4 (1 s … 15 s),
/// four unanswered ones and the kernel resets the socket, which the relay carries to the
/// other leg. So a peer that vanished without a FIN or RST (a half-open connection) does not
/// hold the connection for ever.
pub fn keepalive(s: SockRef<'_>, idle: Option<std::time::Duration>) {
    let Some(idle) = idle else {
        return;
    };
    let every = (idle / 4).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(15),
    );
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(every)
        .with_retries(4);
    let _ = s.set_tcp_keepalive(&ka);
}
