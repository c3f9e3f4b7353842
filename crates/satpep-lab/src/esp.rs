//! IPsec between the lab's client and server: Urke 2011's red/black problem (000 §5.7).
//!
//! A military network encrypts at its black boundary, in front of the satellite modem, so a
//! PEP there sees only ESP and cannot split what it cannot read. This kernel has no ESP
//! (`ip xfrm state add … proto esp` is refused: no `esp4`), so the lab carries ESP itself:
//! `satpep lab esp` (one per end host) reads the host's packets for the far host from a TUN
//! device and sends each as an ESP packet (RFC 4303, tunnel mode, AES-256-GCM as RFC 4106)
//! over a raw IP socket, and back. The inner packets keep the hosts' own addresses: the host
//! routes the far host's address into the TUN device, and the tunnel's own ESP packets carry
//! a firewall mark that a routing rule sends out the way they went before. Every tool
//! (iperf3, curl, ping) therefore runs unchanged, and everything between the hosts, the
//! proxies included, sees protocol 50 only.
//!
//! Security: the key is the lab's, fixed per run; there is no key exchange (IKE) and no
//! anti-replay window. It models the black side's cost on the link, not its security.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// IP protocol number of ESP.
const IPPROTO_ESP: i32 = 50;
/// Next header of an ESP payload that is a whole IPv4 packet (tunnel mode).
const NEXT_IPV4: u8 = 4;
/// SPI and sequence number.
const ESP_HEADER: usize = 8;
/// The explicit IV of RFC 4106 (the sequence number, 64 bits).
const ESP_IV: usize = 8;
/// The GCM tag.
const ESP_ICV: usize = 16;
/// Outer IPv4 header (no options).
const OUTER_IP: usize = 20;

/// MTU of the hosts' TUN devices: a 1500-byte outer packet less the ESP around the inner one
/// (the 1438 bytes Urke 2011 §6.1 saw its routers advertise through its IPsec tunnel).
pub const INNER_MTU: u32 = 1438;
/// The firewall mark of the tunnel's own ESP packets (routed the old way, not into the TUN).
pub const MARK: u32 = 0x50;
/// The routing table those marked packets look up.
pub const TABLE: u32 = 50;

/// Bytes ESP in tunnel mode adds to an inner IP packet of `inner` bytes on the link: the
/// outer IP header, SPI and sequence number, IV, padding to four bytes with its length and
/// next-header bytes, and the tag.
pub fn overhead(inner: u32) -> u32 {
    (OUTER_IP + ESP_HEADER + ESP_IV + padding(inner as usize) + 2 + ESP_ICV) as u32
}

/// Padding bytes after an inner packet of `len` bytes, so that it and the two trailer bytes
/// end on four bytes.
fn padding(len: usize) -> usize {
    (4 - (len + 2) % 4) % 4
}

/// One end's settings.
#[derive(Debug, Clone)]
pub struct EspEnd {
    /// Name of the TUN device to create.
    pub tun: String,
    /// This host's address (source of the outer packets).
    pub local: Ipv4Addr,
    /// The far host's address (their destination).
    pub remote: Ipv4Addr,
    /// SPI of the packets this end sends; the far end sends `spi_out ^ 1`.
    pub spi_out: u32,
    /// 32 bytes of key and 4 of salt (RFC 4106's keying material), both directions (each
    /// direction's SPI differs, and a nonce never repeats within one: seq is its IV).
    pub keymat: [u8; 36],
}

fn key(keymat: &[u8; 36]) -> Result<LessSafeKey, String> {
    UnboundKey::new(&AES_256_GCM, &keymat[..32])
        .map(LessSafeKey::new)
        .map_err(|_| "esp: bad key".to_string())
}

fn nonce(salt: &[u8], seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(salt);
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Wraps the inner packet `inner` as the ESP payload of one outer packet (without the
/// outer IP header, which the kernel adds): SPI, sequence number, IV, ciphertext, tag. The
/// sequence number's 32 low bits go on the wire; all 64 make the IV, so nonces never repeat.
pub fn seal(k: &LessSafeKey, salt: &[u8], spi: u32, seq: u64, inner: &[u8]) -> Vec<u8> {
    let pad = padding(inner.len());
    let mut out = Vec::with_capacity(ESP_HEADER + ESP_IV + inner.len() + pad + 2 + ESP_ICV);
    out.extend_from_slice(&spi.to_be_bytes());
    out.extend_from_slice(&(seq as u32).to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    let body = out.len();
    out.extend_from_slice(inner);
    // RFC 4303 §2.4: padding bytes 1, 2, 3, …
    out.extend((1..=pad as u8).collect::<Vec<_>>());
    out.push(pad as u8);
    out.push(NEXT_IPV4);
    let aad: [u8; 8] = out[..8].try_into().expect("8 bytes");
    let (_, rest) = out.split_at_mut(body);
    let tag = k
        .seal_in_place_separate_tag(nonce(salt, seq), Aad::from(aad), rest)
        .expect("a packet is far below GCM's length limit");
    out.extend_from_slice(tag.as_ref());
    out
}

/// The inner packet of ESP payload `esp` sent with `spi`, or why it was refused.
pub fn open(k: &LessSafeKey, salt: &[u8], spi: u32, esp: &mut [u8]) -> Result<Vec<u8>, String> {
    if esp.len() < ESP_HEADER + ESP_IV + 2 + ESP_ICV {
        return Err(format!("{} bytes: too short for ESP", esp.len()));
    }
    let got = u32::from_be_bytes(esp[..4].try_into().expect("4 bytes"));
    if got != spi {
        return Err(format!("SPI {got:#x}, not {spi:#x}"));
    }
    let seq = u64::from_be_bytes(esp[8..16].try_into().expect("8 bytes"));
    if seq as u32 != u32::from_be_bytes(esp[4..8].try_into().expect("4 bytes")) {
        return Err("the IV does not match the sequence number".into());
    }
    let aad: [u8; 8] = esp[..8].try_into().expect("8 bytes");
    let plain = k
        .open_in_place(
            nonce(salt, seq),
            Aad::from(aad),
            &mut esp[ESP_HEADER + ESP_IV..],
        )
        .map_err(|_| "the tag does not verify".to_string())?;
    let n = plain.len();
    let (pad, next) = (plain[n - 2] as usize, plain[n - 1]);
    if next != NEXT_IPV4 || pad + 2 > n {
        return Err(format!(
            "next header {next}, padding {pad}: not tunnel-mode IPv4"
        ));
    }
    Ok(plain[..n - 2 - pad].to_vec())
}

/// Opens TUN device `name` (no packet information: each read is one IP packet).
fn open_tun(name: &str) -> Result<std::fs::File, String> {
    #[repr(C)]
    struct IfReq {
        name: [u8; 16],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    if name.len() >= 16 {
        return Err(format!("esp: device name {name:?} is longer than 15 bytes"));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| format!("esp: cannot open /dev/net/tun: {e}"))?;
    let mut req = IfReq {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which IfReq lays out.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF, &mut req) };
    if r < 0 {
        return Err(format!(
            "esp: cannot create TUN device {name}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(f)
}

/// Runs one end until killed: creates the TUN device, prints `ready` on stdout, then moves
/// packets both ways. Malformed or unverifiable ESP is counted and dropped (the count goes to
/// stderr every thousand).
pub fn run(end: &EspEnd) -> Result<(), String> {
    let tun = open_tun(&end.tun)?;
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_ESP)))
        .map_err(|e| format!("esp: cannot open a raw ESP socket: {e}"))?;
    sock.set_mark(MARK)
        .map_err(|e| format!("esp: cannot mark the tunnel's packets: {e}"))?;
    let to = SockAddr::from(SocketAddrV4::new(end.remote, 0));
    let k_out = key(&end.keymat)?;
    let k_in = key(&end.keymat)?;
    let salt = end.keymat[32..].to_vec();
    println!("ready");
    std::io::stdout().flush().ok();
    let mut tun_w = tun
        .try_clone()
        .map_err(|e| format!("esp: cannot share the TUN device: {e}"))?;
    let sock_r = sock
        .try_clone()
        .map_err(|e| format!("esp: cannot share the raw socket: {e}"))?;
    let (spi_in, remote) = (end.spi_out ^ 1, end.remote);
    let salt_in = salt.clone();
    // A failed direction ends the process: the other would carry on half a tunnel.
    std::thread::spawn(move || {
        let e = inbound(sock_r, &mut tun_w, &k_in, &salt_in, spi_in, remote);
        eprintln!("{}", e.err().unwrap_or_default());
        std::process::exit(1);
    });
    let mut tun_r = tun;
    let mut buf = vec![0u8; 65_536];
    let mut seq: u64 = 0;
    loop {
        let n = tun_r
            .read(&mut buf)
            .map_err(|e| format!("esp: read from the TUN device: {e}"))?;
        // Only IPv4 for the far host goes in: the host routes nothing else here.
        if n < 20 || buf[0] >> 4 != 4 {
            continue;
        }
        seq += 1;
        let esp = seal(&k_out, &salt, end.spi_out, seq, &buf[..n]);
        sock.send_to(&esp, &to)
            .map_err(|e| format!("esp: send: {e}"))?;
    }
}

/// The receiving direction: ESP from `remote` into the TUN device, until an error.
fn inbound(
    sock_r: Socket,
    tun_w: &mut std::fs::File,
    k_in: &LessSafeKey,
    salt_in: &[u8],
    spi_in: u32,
    remote: Ipv4Addr,
) -> Result<(), String> {
    let mut pkt = vec![0u8; 65_536];
    let mut refused = 0u64;
    loop {
        // A raw IPv4 socket reads whole packets, the IP header included.
        let n = (&sock_r)
            .read(&mut pkt)
            .map_err(|e| format!("esp: receive: {e}"))?;
        let ihl = ((pkt[0] & 0x0f) as usize) * 4;
        if n < 20 || ihl < 20 || ihl > n || pkt[12..16] != remote.octets() {
            continue;
        }
        let mut esp = pkt[ihl..n].to_vec();
        match open(k_in, salt_in, spi_in, &mut esp) {
            // EIO: the device is not up yet (the far end started first and its host
            // already sends); the packet is lost as on a link that is down.
            Ok(inner) => match tun_w.write_all(&inner) {
                Err(e) if e.raw_os_error() == Some(libc::EIO) => refused += 1,
                r => r.map_err(|e| format!("esp: write to the TUN device: {e}"))?,
            },
            Err(e) => {
                refused += 1;
                if refused == 1 || refused % 1000 == 0 {
                    eprintln!("esp: {refused} packets refused, the last: {e}");
                }
            }
        }
    }
}

/// The two ends of an ESP tunnel between the lab's client and server, running.
pub struct EspTunnel {
    ends: Vec<std::process::Child>,
}

/// Device name of the tunnel in both end hosts.
const TUN: &str = "esp0";

impl EspTunnel {
    /// Starts `satpep lab esp` in the client and the server and routes each host's packets
    /// for the other into it (IPv4; IPv6 keeps its plain path).
    pub fn start(lab: &crate::topology::Lab) -> Result<EspTunnel, String> {
        use crate::topology::{
            Host, CLIENT_DEV, CLIENT_V4, SERVER_DEV, SERVER_V4, TERMINAL_CLIENT_V4,
        };
        use std::io::BufRead;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        // The lab's key: fixed, as the tunnel models the black side's cost, not its secrecy.
        let keymat: String = (0..36u8)
            .map(|i| format!("{:02x}", i.wrapping_mul(37) ^ 0x5a))
            .collect();
        let mut t = EspTunnel { ends: Vec::new() };
        for (host, local, remote, gw, dev, spi) in [
            (
                Host::Client,
                CLIENT_V4,
                SERVER_V4,
                TERMINAL_CLIENT_V4,
                CLIENT_DEV,
                "256",
            ),
            (
                Host::Server,
                SERVER_V4,
                CLIENT_V4,
                "198.18.3.1",
                SERVER_DEV,
                "257",
            ),
        ] {
            let mut child = lab
                .command(host, &exe)
                .args([
                    "lab", "esp", "--tun", TUN, "--local", local, "--remote", remote,
                ])
                .args(["--spi", spi, "--key", &keymat])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("esp: cannot start: {e}"))?;
            let mut line = String::new();
            let out = child.stdout.take().expect("piped");
            let _ = std::io::BufReader::new(out).read_line(&mut line);
            t.ends.push(child);
            if line.trim() != "ready" {
                return Err(format!(
                    "esp: the {host:?} end did not start (see its stderr)"
                ));
            }
            let mark = format!("{MARK:#x}");
            let table = TABLE.to_string();
            let mtu = INNER_MTU.to_string();
            let ip = |args: &[&str]| lab.run_in(host, "ip", args).map(|_| ());
            // The far host's ESP arrives on the wire interface while the route back to it
            // leads into the tunnel: reverse-path filtering would drop it.
            for k in ["all", "default", dev] {
                lab.run_in(
                    host,
                    "sysctl",
                    &["-qw", &format!("net.ipv4.conf.{k}.rp_filter=0")],
                )?;
            }
            ip(&["link", "set", TUN, "mtu", &mtu, "up"])?;
            ip(&["route", "replace", "default", "via", gw, "table", &table])?;
            ip(&[
                "rule", "add", "fwmark", &mark, "lookup", &table, "pref", "100",
            ])?;
            // The host's route attributes (initial windows, quickack) as the scenario set
            // them on its default route.
            let default = lab.run_in(host, "ip", &["-4", "route", "show", "default"])?;
            let words: Vec<&str> = default.split_whitespace().collect();
            let mut args = vec!["route", "add", remote, "dev", TUN];
            for w in words.windows(2) {
                if crate::scenario::hosts::ROUTE_ATTRS.contains(&w[0]) {
                    args.extend_from_slice(w);
                }
            }
            ip(&args)?;
        }
        Ok(t)
    }

    /// Ends both processes (their TUN devices, and the routes into them, go with them).
    fn kill(&mut self) {
        for mut c in self.ends.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops both ends and removes their routing (their TUN devices go with them).
    pub fn stop(mut self, lab: &crate::topology::Lab) {
        self.kill();
        for host in [crate::topology::Host::Client, crate::topology::Host::Server] {
            let mark = format!("{MARK:#x}");
            let table = TABLE.to_string();
            let _ = lab.run_in(
                host,
                "ip",
                &[
                    "rule", "del", "fwmark", &mark, "lookup", &table, "pref", "100",
                ],
            );
            let _ = lab.run_in(host, "ip", &["route", "flush", "table", &table]);
        }
    }
}

impl Drop for EspTunnel {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Parses `satpep lab esp --key`: 36 bytes in hex (a 32-byte key and a 4-byte salt).
pub fn parse_keymat(hex: &str) -> Result<[u8; 36], String> {
    let hex = hex.trim();
    if hex.len() != 72 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "--key: {} characters; want 72 hex digits (a 32-byte AES-256 key and a 4-byte salt)",
            hex.len()
        ));
    }
    let mut k = [0u8; 36];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keymat() -> [u8; 36] {
        std::array::from_fn(|i| i as u8 * 7 + 1)
    }

    /// An inner packet of every length comes back whole, padded to four bytes on the way.
    #[test]
    fn sealed_packets_open_to_what_went_in() {
        let k = key(&keymat()).unwrap();
        let salt = &keymat()[32..];
        for len in [20usize, 21, 22, 23, 100, 1438] {
            let inner: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
            let mut esp = seal(&k, salt, 0x100, len as u64, &inner);
            assert_eq!(
                esp.len() + OUTER_IP,
                len + overhead(len as u32) as usize,
                "{len}"
            );
            assert_eq!((esp.len() - ESP_HEADER - ESP_IV - ESP_ICV) % 4, 0);
            assert_eq!(open(&k, salt, 0x100, &mut esp).unwrap(), inner);
        }
        // The thesis's 1438-byte inner packets fill a 1500-byte outer one exactly.
        assert_eq!(INNER_MTU + overhead(INNER_MTU), 1492);
    }

    #[test]
    fn tampered_foreign_or_short_packets_are_refused() {
        let k = key(&keymat()).unwrap();
        let salt = &keymat()[32..];
        let good = seal(&k, salt, 0x100, 7, &[0x45; 40]);
        let mut flipped = good.clone();
        flipped[30] ^= 1;
        assert!(open(&k, salt, 0x100, &mut flipped)
            .unwrap_err()
            .contains("tag"));
        let mut other = good.clone();
        assert!(open(&k, salt, 0x101, &mut other)
            .unwrap_err()
            .contains("SPI"));
        let mut short = good[..20].to_vec();
        assert!(open(&k, salt, 0x100, &mut short)
            .unwrap_err()
            .contains("short"));
        assert!(parse_keymat("00ff").unwrap_err().contains("72 hex digits"));
        assert_eq!(parse_keymat(&"0a".repeat(36)).unwrap(), [10u8; 36]);
        let wrong = key(&[9; 36]).unwrap();
        let mut again = good.clone();
        assert!(open(&wrong, salt, 0x100, &mut again).is_err());
    }
}
