//! `TCP_INFO` for one socket: what the kernel knows about a leg (RTT, cwnd, delivery rate,
//! retransmissions). libc's `tcp_info` stops before `tcpi_delivery_rate`, so the kernel's
//! uapi layout is mirrored here.

use crate::sockets::{buffer_size, Buffer};
use serde::Serialize;
use std::os::fd::RawFd;

/// `struct tcp_info` from `linux/tcp.h`, up to `tcpi_rcv_wnd`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RawTcpInfo {
    state: u8,
    ca_state: u8,
    retransmits: u8,
    probes: u8,
    backoff: u8,
    options: u8,
    wscale: u8,
    app_limited: u8,
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    unacked: u32,
    sacked: u32,
    lost: u32,
    retrans: u32,
    fackets: u32,
    last_data_sent: u32,
    last_ack_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
    pmtu: u32,
    rcv_ssthresh: u32,
    rtt: u32,
    rttvar: u32,
    snd_ssthresh: u32,
    snd_cwnd: u32,
    advmss: u32,
    reordering: u32,
    rcv_rtt: u32,
    rcv_space: u32,
    total_retrans: u32,
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
    busy_time: u64,
    rwnd_limited: u64,
    sndbuf_limited: u64,
    delivered: u32,
    delivered_ce: u32,
    bytes_sent: u64,
    bytes_retrans: u64,
    dsack_dups: u32,
    reord_seen: u32,
    rcv_ooopack: u32,
    snd_wnd: u32,
    /// Since Linux 6.9 (0 before: the kernel writes less).
    rcv_wnd: u32,
}

/// What one leg's socket reports.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct LegInfo {
    /// Congestion control in use.
    pub congestion: String,
    /// Smoothed RTT, ms.
    pub rtt_ms: f64,
    /// Minimum RTT seen, ms.
    pub min_rtt_ms: f64,
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Slow-start threshold, segments (`None` while still infinite).
    pub ssthresh: Option<u32>,
    /// Send MSS, bytes.
    pub mss: u32,
    /// Most recent delivery rate, bit/s.
    pub delivery_rate_bps: u64,
    /// Pacing rate, bit/s.
    pub pacing_rate_bps: u64,
    /// Segments retransmitted over the connection's life.
    pub total_retrans: u32,
    /// Bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// Bytes received from the peer.
    pub bytes_received: u64,
    /// Bytes written but not yet sent.
    pub notsent_bytes: u32,
    /// Bytes received and not yet read by the relay (SIOCINQ).
    #[serde(default)]
    pub recv_queue: u64,
    /// Bytes written and not yet acknowledged, sent or not (SIOCOUTQ).
    #[serde(default)]
    pub send_queue: u64,
    /// The window this socket offers its peer, bytes (None before Linux 6.9).
    #[serde(default)]
    pub rcv_wnd: Option<u64>,
    /// Its receive buffer, bytes (SO_RCVBUF, as the kernel counts it: what autotuning grows
    /// and buffer sizing sets).
    #[serde(default)]
    pub rcvbuf: u64,
    /// Its send buffer, bytes (SO_SNDBUF, as the kernel counts it: what autotuning grows,
    /// in the kernel's worst-case cost per segment, and `satpep_sat` sizes on lossy paths).
    #[serde(default)]
    pub sndbuf: u64,
    /// Time spent sending data so far, ms (the kernel's busy time).
    #[serde(default)]
    pub busy_ms: u64,
    /// Of it, time limited by the peer's receive window, ms.
    #[serde(default)]
    pub rwnd_limited_ms: u64,
    /// Of it, time limited by this socket's send buffer, ms.
    #[serde(default)]
    pub sndbuf_limited_ms: u64,
    /// What satellite model `satpep_sat` holds for this socket (None with other controllers,
    /// and where its state cannot be read: see [`model`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelReading>,
}

/// The socket's cookie (`SO_COOKIE`): what the kernel and BPF programs name it by.
pub(crate) fn cookie(fd: RawFd) -> Option<u64> {
    let mut c = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: c is writable for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            &mut c as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(c)
}

/// The satellite model's readings for one socket, as `satpep_sat` keeps them in the kernel:
/// the same figures the tunnel's controller exports for the tunnel.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct ModelReading {
    /// startup, drain, cruise, probe or compete.
    pub phase: String,
    /// The model's rate, bit/s (0 until measured).
    pub rate_bps: u64,
    /// The base RTT, ms (None until measured).
    pub base_rtt_ms: Option<f64>,
    /// The queue the latest RTT samples show, ms.
    pub queue_ms: f64,
    /// The share of segments the channel loses to noise, as drains measured it.
    pub channel_loss: Option<f64>,
    /// The noise's mean burst, segments (1: independent losses).
    pub loss_burst: Option<u32>,
    /// A buffer shallower than the model's slack, ms, once losses showed one.
    pub shallow_buffer_ms: Option<f64>,
}

/// The model `satpep_sat` holds for socket `fd`, from `states` (read once for many
/// sockets); None if the socket runs another controller or its model is another build's.
pub fn model(states: &satpep_cc::ModelStates, fd: RawFd) -> Option<ModelReading> {
    let s = satpep_model::Snapshot::of_state(states.get(cookie(fd)?)?)?;
    Some(ModelReading {
        phase: s.phase().name().to_string(),
        rate_bps: s.bw().saturating_mul(8),
        base_rtt_ms: s.base_rtt_us().map(|u| u as f64 / 1000.0),
        queue_ms: s.queue_us() as f64 / 1000.0,
        channel_loss: s.channel_loss(),
        loss_burst: s.loss_burst(),
        shallow_buffer_ms: s.shallow_buffer_us().map(|u| u as f64 / 1000.0),
    })
}

fn congestion(fd: RawFd) -> String {
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf is writable for len bytes.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(len as usize);
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `TCP_INFO` and how many bytes of it the kernel wrote (older kernels write less).
fn raw(fd: RawFd) -> Option<(RawTcpInfo, usize)> {
    let mut t = RawTcpInfo::default();
    let mut len = std::mem::size_of::<RawTcpInfo>() as libc::socklen_t;
    // SAFETY: t is a plain struct writable for len bytes; the kernel writes at most len.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut t as *mut RawTcpInfo as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some((t, len as usize))
}

/// Whether a `TCP_INFO` of `len` bytes holds `tcpi_rcv_wnd` (Linux 6.9 on).
fn has_rcv_wnd(len: usize) -> bool {
    len >= std::mem::offset_of!(RawTcpInfo, rcv_wnd) + 4
}

/// A socket's queue as an ioctl reads it (SIOCINQ, SIOCOUTQ); 0 if it cannot.
pub fn queue(fd: RawFd, which: libc::c_ulong) -> u64 {
    let mut n: libc::c_int = 0;
    // SAFETY: both ioctls write one c_int.
    if unsafe { libc::ioctl(fd, which, &mut n) } == 0 {
        n.max(0) as u64
    } else {
        0
    }
}

/// What flow control reads of one socket (`crate::flow_control`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowInfo {
    /// Congestion window, bytes.
    pub cwnd_bytes: u64,
    /// Slow-start threshold, bytes (None while infinite).
    pub ssthresh_bytes: Option<u64>,
    /// The peer's advertised window, bytes.
    pub snd_wnd: u64,
    /// The window this socket offers, bytes (None before Linux 6.9).
    pub rcv_wnd: Option<u64>,
    /// Receive space the kernel's autotuning measured, bytes (the fallback for `rcv_wnd`).
    pub rcv_space: u64,
    /// Written and not yet sent, bytes.
    pub notsent: u64,
    /// Smoothed RTT, µs.
    pub srtt_us: u64,
    /// The RTT this socket's receiving side measured (the kernel's receiver estimate,
    /// `tcpi_rcv_rtt`), µs; None until it has one.
    pub rcv_rtt_us: Option<u64>,
    /// Send MSS, bytes.
    pub mss: u64,
}

/// Reads what flow control needs from `TCP_INFO`; `None` if `fd` is not a TCP socket.
pub fn flow(fd: RawFd) -> Option<FlowInfo> {
    let (t, len) = raw(fd)?;
    let mss = t.snd_mss.max(1) as u64;
    Some(FlowInfo {
        cwnd_bytes: t.snd_cwnd as u64 * mss,
        ssthresh_bytes: (t.snd_ssthresh < 0x7fff_0000).then(|| t.snd_ssthresh as u64 * mss),
        snd_wnd: t.snd_wnd as u64,
        rcv_wnd: has_rcv_wnd(len).then_some(t.rcv_wnd as u64),
        rcv_space: t.rcv_space as u64,
        notsent: t.notsent_bytes as u64,
        srtt_us: t.rtt as u64,
        rcv_rtt_us: (t.rcv_rtt > 0).then_some(t.rcv_rtt as u64),
        mss,
    })
}

/// What a shared carrier reads of one satellite leg (`crate::share`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SendInfo {
    /// Bytes the peer acknowledged so far.
    pub bytes_acked: u64,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Written and not yet sent, bytes.
    pub notsent: u64,
    /// Send MSS, bytes.
    pub mss: u32,
    /// Smoothed RTT, µs.
    pub rtt_us: u32,
    /// Segments retransmitted so far.
    pub retransmitted: u32,
}

/// Reads what a shared carrier needs from `TCP_INFO`; `None` if `fd` is not a TCP socket.
pub fn sending(fd: RawFd) -> Option<SendInfo> {
    let (t, _) = raw(fd)?;
    Some(SendInfo {
        bytes_acked: t.bytes_acked,
        unacked: t.unacked,
        notsent: t.notsent_bytes as u64,
        mss: t.snd_mss.max(1),
        rtt_us: t.rtt,
        retransmitted: t.total_retrans,
    })
}

/// Reads `TCP_INFO` of socket `fd`; `None` if it is not a TCP socket any more.
pub fn read(fd: RawFd) -> Option<LegInfo> {
    let (t, len) = raw(fd)?;
    Some(LegInfo {
        congestion: congestion(fd),
        rtt_ms: t.rtt as f64 / 1000.0,
        min_rtt_ms: if t.min_rtt == u32::MAX {
            0.0
        } else {
            t.min_rtt as f64 / 1000.0
        },
        cwnd: t.snd_cwnd,
        // The kernel reports "infinite" as a huge value.
        ssthresh: (t.snd_ssthresh < 0x7fff_0000).then_some(t.snd_ssthresh),
        mss: t.snd_mss,
        delivery_rate_bps: t.delivery_rate.saturating_mul(8),
        pacing_rate_bps: if t.pacing_rate == u64::MAX {
            0
        } else {
            t.pacing_rate.saturating_mul(8)
        },
        total_retrans: t.total_retrans,
        bytes_acked: t.bytes_acked,
        bytes_received: t.bytes_received,
        notsent_bytes: t.notsent_bytes,
        recv_queue: queue(fd, libc::FIONREAD),
        send_queue: queue(fd, libc::TIOCOUTQ),
        rcv_wnd: has_rcv_wnd(len).then_some(t.rcv_wnd as u64),
        rcvbuf: buffer_size(fd, Buffer::Receive),
        sndbuf: buffer_size(fd, Buffer::Send),
        busy_ms: t.busy_time / 1000,
        rwnd_limited_ms: t.rwnd_limited / 1000,
        sndbuf_limited_ms: t.sndbuf_limited / 1000,
        model: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn layout_matches_the_kernel() {
        // Up to tcpi_snd_wnd the uapi struct is 232 bytes; tcpi_rcv_wnd follows.
        assert_eq!(std::mem::offset_of!(RawTcpInfo, rcv_wnd), 232);
    }

    #[test]
    fn reads_a_live_loopback_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&[7u8; 10_000]).unwrap();
        let mut buf = vec![0u8; 10_000];
        s.read_exact(&mut buf).unwrap();
        let i = read(c.as_raw_fd()).unwrap();
        assert!(i.cwnd >= 1 && i.mss > 0, "{i:?}");
        assert_eq!(i.bytes_acked, 10_000 + 1, "{i:?}"); // +1: the SYN
        assert!(!i.congestion.is_empty());
        assert!(read(-1).is_none());
    }

    #[test]
    fn reads_the_model_satpep_sat_keeps_for_a_socket() {
        // Registered already (a pin, another test) or loaded here for this test's life.
        // The copy registered already (the pin a proxy leaves, made this build's), or one
        // loaded here for this test's life.
        let opts = satpep_cc::Options::default();
        let held = match satpep_cc::available().iter().any(|a| a == "satpep_sat") {
            true => {
                satpep_cc::refresh("satpep_sat", &opts).unwrap();
                None
            }
            false => Some(satpep_cc::load("satpep_sat", &opts).expect("loads (root, BTF)")),
        };
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        let name = b"satpep_sat";
        // SAFETY: name is readable for its length.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_ptr() as *const libc::c_void,
                name.len() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        let reader = std::thread::spawn(move || {
            let mut c = c;
            let mut buf = vec![0u8; 1 << 16];
            let mut n = 0;
            while n < 4_000_000 {
                n += c.read(&mut buf).unwrap();
            }
        });
        s.write_all(&vec![1u8; 4_000_000]).unwrap();
        reader.join().unwrap();
        // A kernel may refuse the iterator and take the controller (a sandbox's LSM): then
        // there is no model to read, which `satpep status` says by showing none.
        let states = match &held {
            Some(l) => l.model_states(),
            None => satpep_cc::states_pin("satpep_sat")
                .exists()
                .then(satpep_cc::ModelStates::read_pinned),
        };
        let Some(states) = states else {
            eprintln!("SKIPPED: this kernel refused satpep_sat's state iterator");
            return;
        };
        let states = states.unwrap();
        assert!(!states.is_empty(), "no socket's model read");
        let m = model(&states, s.as_raw_fd()).expect("the model of a satpep_sat socket");
        assert!(!m.phase.is_empty() && m.rate_bps > 0, "{m:?}");
        assert!(m.base_rtt_ms.is_some_and(|b| b < 50.0), "{m:?}");
        // Another controller's socket: no model.
        assert!(model(&states, l.as_raw_fd()).is_none());
    }
}
