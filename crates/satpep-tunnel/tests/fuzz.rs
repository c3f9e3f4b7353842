//! Bounded fuzzing of what a tunnel peer sends that satpep parses: the flow header, the
//! answer byte, and the pieces of a stream put back in order. Stable Rust has no libFuzzer
//! (cargo-fuzz needs a nightly toolchain), so this is a seeded generator plus mutation of
//! valid inputs; every input checks properties, not only "does not panic".
//!
//! CI runs a bounded number of cases. A long run:
//! `SATPEP_FUZZ_CASES=20000000 cargo test --release -p satpep-tunnel --test fuzz`.

use bytes::Bytes;
use satpep_tunnel::header::{Answer, FlowHeader, HeaderError, MAX_LEN};
use satpep_tunnel::reorder::Reorder;
use std::net::{IpAddr, SocketAddr};

/// xorshift64*: deterministic, so a failure names its case and replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn cases(default: u64) -> u64 {
    std::env::var("SATPEP_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn canonical(a: SocketAddr) -> (IpAddr, u16) {
    (a.ip().to_canonical(), a.port())
}

fn valid_header(r: &mut Rng) -> Vec<u8> {
    let v6 = r.below(2) == 0;
    let ip = |r: &mut Rng| -> IpAddr {
        if v6 {
            let b: [u8; 16] = r.bytes(16).try_into().unwrap();
            IpAddr::from(b)
        } else {
            let b: [u8; 4] = r.bytes(4).try_into().unwrap();
            IpAddr::from(b)
        }
    };
    let port = |r: &mut Rng| 1 + r.below(65535) as u16;
    FlowHeader {
        client: SocketAddr::new(ip(r), port(r)),
        server: SocketAddr::new(ip(r), port(r)),
        strict: r.below(2) == 0,
    }
    .encode()
}

/// What must hold for any input.
fn check_header(input: &[u8]) {
    match FlowHeader::decode(input) {
        Ok((h, n)) => {
            assert!(n <= input.len() && n <= MAX_LEN, "{input:?}");
            assert!(h.client.port() != 0 && h.server.port() != 0);
            // What was accepted re-encodes to an equivalent header of the same or shorter
            // length (IPv4-mapped addresses travel as IPv4).
            let again = h.encode();
            let (h2, n2) = FlowHeader::decode(&again).expect("re-encoded header parses");
            assert_eq!(n2, again.len());
            assert!(n2 <= n);
            assert_eq!(canonical(h2.client), canonical(h.client));
            assert_eq!(canonical(h2.server), canonical(h.server));
            assert_eq!(h2.strict, h.strict);
        }
        Err(HeaderError::Truncated { need, have }) => {
            assert_eq!(have, input.len());
            assert!(need > have && need <= MAX_LEN, "{need} {have}");
        }
        Err(e) => {
            // Every rejection explains itself.
            assert!(!e.to_string().is_empty());
        }
    }
}

#[test]
fn flow_headers_from_random_bytes() {
    let mut r = Rng(0x5350_0001);
    for _ in 0..cases(1_000_000) {
        let n = r.below(MAX_LEN as u64 + 8) as usize;
        let mut b = r.bytes(n);
        // Bias toward the parser's deeper paths: a valid version and family half the time.
        if n >= 2 && r.below(2) == 0 {
            b[0] = 1;
            b[1] = if r.below(2) == 0 { 4 } else { 6 };
        }
        check_header(&b);
    }
}

#[test]
fn flow_headers_mutated_from_valid_ones() {
    let mut r = Rng(0x5350_0002);
    for _ in 0..cases(1_000_000) {
        let mut b = valid_header(&mut r);
        match r.below(4) {
            // Flip bits.
            0 => {
                for _ in 0..=r.below(3) {
                    let i = r.below(b.len() as u64) as usize;
                    b[i] ^= 1 << r.below(8);
                }
            }
            // Truncate.
            1 => b.truncate(r.below(b.len() as u64) as usize),
            // Extend with flow bytes, which must be left alone.
            2 => {
                let len = b.len();
                let k = r.below(64) as usize;
                let extra = r.bytes(k);
                b.extend_from_slice(&extra);
                let (_, n) = FlowHeader::decode(&b).expect("a valid header with data after it");
                assert_eq!(n, len);
            }
            // Overwrite one byte.
            _ => {
                let i = r.below(b.len() as u64) as usize;
                b[i] = r.next() as u8;
            }
        }
        check_header(&b);
    }
}

#[test]
fn answer_bytes() {
    for b in 0..=255u8 {
        match Answer::from_byte(b) {
            Some(a) => assert_eq!(a as u8, b),
            None => assert!(b > 4),
        }
    }
}

#[test]
fn stream_pieces_in_any_order_reassemble_exactly() {
    let mut r = Rng(0x5350_0003);
    for case in 0..cases(20_000) {
        let len = 1 + r.below(20_000) as usize;
        let data = r.bytes(len);
        // Random cuts, then some pieces repeated, some overlapping neighbours.
        let mut pieces: Vec<(usize, usize)> = Vec::new();
        let mut off = 0;
        while off < len {
            let l = (1 + r.below(3000) as usize).min(len - off);
            pieces.push((off, l));
            off += l;
        }
        let n = pieces.len();
        for _ in 0..r.below(n as u64 + 1) {
            let (o, l) = pieces[r.below(n as u64) as usize];
            let extra = r.below(500) as usize;
            pieces.push((o, (l + extra).min(len - o)));
        }
        // Shuffle (Fisher–Yates).
        for i in (1..pieces.len()).rev() {
            let j = r.below(i as u64 + 1) as usize;
            pieces.swap(i, j);
        }
        let mut re = Reorder::new(len);
        let mut out = Vec::with_capacity(len);
        for (o, l) in pieces {
            re.insert(o as u64, Bytes::copy_from_slice(&data[o..o + l]))
                .unwrap_or_else(|e| panic!("case {case}: {e}"));
            while let Some(b) = re.pop() {
                out.extend_from_slice(&b);
            }
            assert!(re.held() <= len, "case {case}");
        }
        assert_eq!(out.len(), len, "case {case}: length");
        assert!(out == data, "case {case}: bytes differ");
        assert!(re.is_empty());
    }
}

#[test]
fn a_peer_that_never_fills_a_hole_is_cut_off_at_the_limit() {
    let mut r = Rng(0x5350_0004);
    for _ in 0..cases(2_000) {
        let limit = 1 + r.below(100_000) as usize;
        let mut re = Reorder::new(limit);
        // Byte 0 never comes; everything else does, in random pieces.
        let mut off = 1u64;
        let err = loop {
            let l = 1 + r.below(5_000);
            match re.insert(off, Bytes::from(r.bytes(l as usize))) {
                Ok(()) => assert!(re.held() <= limit),
                Err(e) => break e,
            }
            assert!(re.pop().is_none(), "nothing passes the hole");
            off += l;
        };
        assert!(err.held > limit && err.held <= limit + 5_000);
    }
}
