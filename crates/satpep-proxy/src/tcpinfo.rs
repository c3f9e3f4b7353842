//! `TCP_INFO` for one socket: what the kernel knows about a leg (RTT, cwnd, delivery rate,
//! retransmissions). libc's `tcp_info` stops before `tcpi_delivery_rate`, so the kernel's
//! uapi layout is mirrored here.

use serde::Serialize;
use std::os::fd::RawFd;

/// `struct tcp_info` from `linux/tcp.h`, up to `tcpi_snd_wnd`.
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

/// Reads `TCP_INFO` of socket `fd`; `None` if it is not a TCP socket any more.
pub fn read(fd: RawFd) -> Option<LegInfo> {
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
    if r != 0 {
        return None;
    }
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    #[test]
    fn layout_matches_the_kernel() {
        // Up to tcpi_snd_wnd the uapi struct is 232 bytes.
        assert_eq!(std::mem::size_of::<RawTcpInfo>(), 232);
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
}
