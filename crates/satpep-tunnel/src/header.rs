//! The tunnel's wire format above QUIC: the header that opens each flow's stream, and the
//! gateway's one-byte answer. Network byte order throughout; documented in `docs/tunnel.md`.
//!
//! ```text
//! flow header (terminal → gateway, first bytes of each bidirectional stream)
//!  0        1        2        3        4                 6                 8
//! +--------+--------+--------+--------+--------+--------+--------+--------+
//! | version| family | flags  |   0    |  client port    |  server port    |
//! +--------+--------+--------+--------+--------+--------+--------+--------+
//! | client address (4 or 16 bytes)    | server address (4 or 16 bytes)    |
//! +-----------------------------------+-----------------------------------+
//! version = 1; family = 4 or 6; flags: bit 0 = strict open (the gateway answers only once
//! the server has); other bits and the reserved byte must be 0.
//!
//! answer (gateway → terminal, first byte of the stream's other direction)
//! +--------+
//! | status |  0 connected, 1 refused, 2 unreachable, 3 no answer, 4 not allowed
//! +--------+
//! ```
//! The flow's bytes follow the header and the answer.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The only header version this build speaks.
pub const VERSION: u8 = 1;

/// Flag: the terminal holds the client's handshake until the gateway's answer.
pub const FLAG_STRICT: u8 = 1;

/// Longest header (IPv6).
pub const MAX_LEN: usize = 8 + 32;

/// What opens a flow: who the client is and which server it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowHeader {
    /// The client's address and port, used as the source toward the server.
    pub client: SocketAddr,
    /// The server the client connected to.
    pub server: SocketAddr,
    /// The terminal opened the flow in strict mode.
    pub strict: bool,
}

/// Why bytes are not a valid header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// Fewer bytes than the header needs (the stream ended early).
    Truncated { need: usize, have: usize },
    /// A version this build does not speak.
    Version(u8),
    /// An address family other than 4 or 6.
    Family(u8),
    /// Unknown flag bits or a non-zero reserved byte.
    Reserved,
    /// A port 0, or two IPv4 addresses sent in IPv4-mapped IPv6 form.
    Addresses,
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::Truncated { need, have } => {
                write!(f, "flow header truncated: {have} of {need} bytes")
            }
            HeaderError::Version(v) => {
                write!(
                    f,
                    "flow header version {v} is not supported (this is {VERSION})"
                )
            }
            HeaderError::Family(x) => write!(f, "flow header address family {x} is not 4 or 6"),
            HeaderError::Reserved => write!(f, "flow header has unknown flags set"),
            HeaderError::Addresses => write!(
                f,
                "flow header has a zero port or IPv4 addresses in IPv6 form"
            ),
        }
    }
}

impl std::error::Error for HeaderError {}

impl FlowHeader {
    /// Encoded length.
    pub fn len(&self) -> usize {
        if self.client.is_ipv4() {
            16
        } else {
            40
        }
    }

    /// Always false: a header has addresses. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The header's bytes. IPv4-mapped IPv6 addresses are sent as IPv4; a mix of families is
    /// sent as IPv6 (mapped).
    pub fn encode(&self) -> Vec<u8> {
        let (c, s) = (
            self.client.ip().to_canonical(),
            self.server.ip().to_canonical(),
        );
        let (family, c, s): (u8, Vec<u8>, Vec<u8>) = match (c, s) {
            (IpAddr::V4(c), IpAddr::V4(s)) => (4, c.octets().to_vec(), s.octets().to_vec()),
            _ => (6, v6(c).octets().to_vec(), v6(s).octets().to_vec()),
        };
        let mut b = Vec::with_capacity(MAX_LEN);
        b.push(VERSION);
        b.push(family);
        b.push(if self.strict { FLAG_STRICT } else { 0 });
        b.push(0);
        b.extend_from_slice(&self.client.port().to_be_bytes());
        b.extend_from_slice(&self.server.port().to_be_bytes());
        b.extend_from_slice(&c);
        b.extend_from_slice(&s);
        b
    }

    /// Parses a header from the start of `b`; returns it and its length. `Truncated` means
    /// more bytes are needed.
    pub fn decode(b: &[u8]) -> Result<(FlowHeader, usize), HeaderError> {
        if b.len() < 8 {
            // Check what can be checked already, so garbage fails fast.
            if let Some(&v) = b.first() {
                if v != VERSION {
                    return Err(HeaderError::Version(v));
                }
            }
            return Err(HeaderError::Truncated {
                need: 8,
                have: b.len(),
            });
        }
        if b[0] != VERSION {
            return Err(HeaderError::Version(b[0]));
        }
        let alen = match b[1] {
            4 => 4,
            6 => 16,
            x => return Err(HeaderError::Family(x)),
        };
        if b[2] & !FLAG_STRICT != 0 || b[3] != 0 {
            return Err(HeaderError::Reserved);
        }
        let need = 8 + 2 * alen;
        if b.len() < need {
            return Err(HeaderError::Truncated {
                need,
                have: b.len(),
            });
        }
        let cport = u16::from_be_bytes([b[4], b[5]]);
        let sport = u16::from_be_bytes([b[6], b[7]]);
        if cport == 0 || sport == 0 {
            return Err(HeaderError::Addresses);
        }
        let ip = |o: &[u8]| -> IpAddr {
            if alen == 4 {
                IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3]))
            } else {
                let a: [u8; 16] = o.try_into().expect("16 bytes");
                IpAddr::V6(Ipv6Addr::from(a))
            }
        };
        let (client, server) = (ip(&b[8..8 + alen]), ip(&b[8 + alen..need]));
        // Two IPv4 addresses travel as family 4; the same flow in IPv4-mapped form is a second
        // encoding no satpep sends, refused so that each flow has one (found by fuzzing).
        if client.to_canonical().is_ipv4() && server.to_canonical().is_ipv4() && alen == 16 {
            return Err(HeaderError::Addresses);
        }
        Ok((
            FlowHeader {
                client: SocketAddr::new(client, cport),
                server: SocketAddr::new(server, sport),
                strict: b[2] & FLAG_STRICT != 0,
            },
            need,
        ))
    }
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The gateway's answer to a flow header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The server accepted the connection; the flow's bytes follow.
    Connected = 0,
    /// The server refused (TCP reset).
    Refused = 1,
    /// No route to the server, or an ICMP error.
    Unreachable = 2,
    /// The server did not answer within the connect timeout.
    NoAnswer = 3,
    /// The gateway does not carry flows to this server.
    NotAllowed = 4,
}

impl Answer {
    /// Decodes an answer byte; `None` for an unknown one.
    pub fn from_byte(b: u8) -> Option<Answer> {
        Some(match b {
            0 => Answer::Connected,
            1 => Answer::Refused,
            2 => Answer::Unreachable,
            3 => Answer::NoAnswer,
            4 => Answer::NotAllowed,
            _ => return None,
        })
    }

    /// The answer for a failed connect.
    pub fn from_connect_error(e: &std::io::Error) -> Answer {
        match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Answer::Refused,
            std::io::ErrorKind::TimedOut => Answer::NoAnswer,
            _ => Answer::Unreachable,
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answer::Connected => "connected",
            Answer::Refused => "refused",
            Answer::Unreachable => "unreachable",
            Answer::NoAnswer => "no answer",
            Answer::NotAllowed => "not allowed",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(c: &str, s: &str, strict: bool) -> FlowHeader {
        FlowHeader {
            client: c.parse().unwrap(),
            server: s.parse().unwrap(),
            strict,
        }
    }

    #[test]
    fn round_trips_v4_and_v6() {
        for x in [
            h("198.18.0.2:40000", "198.19.0.2:80", false),
            h("[2001:2::2]:1", "[2001:2:0:1::2]:65535", true),
        ] {
            let b = x.encode();
            assert_eq!(b.len(), x.len());
            assert_eq!(FlowHeader::decode(&b), Ok((x, b.len())));
            // Trailing flow bytes are left alone.
            let mut more = b.clone();
            more.extend_from_slice(b"GET /");
            assert_eq!(FlowHeader::decode(&more), Ok((x, b.len())));
        }
    }

    #[test]
    fn network_byte_order_layout() {
        let b = h("198.18.0.2:258", "198.19.0.3:80", true).encode();
        assert_eq!(
            b,
            [1, 4, 1, 0, 1, 2, 0, 80, 198, 18, 0, 2, 198, 19, 0, 3].to_vec()
        );
    }

    #[test]
    fn mapped_addresses_travel_as_v4() {
        let x = h("[::ffff:198.18.0.2]:5", "[::ffff:198.19.0.2]:80", false);
        let (y, n) = FlowHeader::decode(&x.encode()).unwrap();
        assert_eq!(n, 16);
        assert_eq!(y.client, "198.18.0.2:5".parse().unwrap());
    }

    #[test]
    fn two_ipv4_addresses_in_ipv6_form_are_refused() {
        // The fuzzer's find: family 6 carrying two IPv4-mapped addresses decoded, and
        // re-encoded as family 4: two encodings of one flow.
        let mut b = vec![1, 6, 0, 0, 0, 5, 0, 80];
        b.extend_from_slice(&"::ffff:198.18.0.2".parse::<Ipv6Addr>().unwrap().octets());
        b.extend_from_slice(&"::ffff:198.19.0.2".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(FlowHeader::decode(&b), Err(HeaderError::Addresses));
        // One mapped and one real IPv6 address is how a mix of families travels.
        let x = h("[::ffff:198.18.0.2]:5", "[2001:2::3]:80", false);
        assert_eq!(FlowHeader::decode(&x.encode()).unwrap().1, 40);
    }

    #[test]
    fn every_prefix_of_a_header_is_truncated() {
        let b = h("[2001:2::2]:1", "[2001:2::3]:2", false).encode();
        for n in 0..b.len() {
            match FlowHeader::decode(&b[..n]) {
                Err(HeaderError::Truncated { have, .. }) => assert_eq!(have, n),
                other => panic!("prefix {n}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let good = h("198.18.0.2:1", "198.19.0.2:2", false).encode();
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            FlowHeader::decode(&b).unwrap_err()
        };
        assert_eq!(with(0, 2), HeaderError::Version(2));
        assert_eq!(with(1, 5), HeaderError::Family(5));
        assert_eq!(with(2, 0x80), HeaderError::Reserved);
        assert_eq!(with(3, 1), HeaderError::Reserved);
        let mut b = good.clone();
        b[4] = 0;
        b[5] = 0;
        assert_eq!(FlowHeader::decode(&b).unwrap_err(), HeaderError::Addresses);
        assert!(HeaderError::Version(9).to_string().contains("version 9"));
        assert_eq!(
            FlowHeader::decode(&[7]).unwrap_err(),
            HeaderError::Version(7)
        );
    }

    #[test]
    fn answers_round_trip() {
        for b in 0..=4u8 {
            assert_eq!(Answer::from_byte(b).unwrap() as u8, b);
        }
        assert_eq!(Answer::from_byte(5), None);
    }
}
