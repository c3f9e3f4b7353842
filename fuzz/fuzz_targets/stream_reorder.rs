//! Pieces of a tunnel stream arriving out of order, duplicated and overlapping, as the input
//! dictates. The reorder buffer never panics, never holds more than its limit, and what it
//! delivers is exactly the stream, in order, without gaps or repeats.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use satpep_tunnel::reorder::Reorder;

/// The stream's byte at `i`.
fn at(i: u64) -> u8 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let limit = 1 + usize::from(data[0]) * 64;
    let mut r = Reorder::new(limit);
    let mut out: Vec<u8> = Vec::new();
    for op in data[1..].chunks(4) {
        if op.len() < 4 {
            break;
        }
        // Offsets near what was delivered, lengths up to 1 KiB.
        let offset = u64::from(u16::from_le_bytes([op[0], op[1]])) % 4096;
        let len = u64::from(u16::from_le_bytes([op[2], op[3]])) % 1024;
        let piece: Vec<u8> = (offset..offset + len).map(at).collect();
        if r.insert(offset, Bytes::from(piece)).is_err() {
            // Over the limit: the stream is reset; nothing more to check.
            return;
        }
        assert!(r.held() <= limit, "held {} > limit {limit}", r.held());
        while let Some(b) = r.pop() {
            out.extend_from_slice(&b);
        }
        assert_eq!(r.offset(), out.len() as u64);
    }
    for (i, &b) in out.iter().enumerate() {
        assert_eq!(b, at(i as u64), "byte {i} delivered wrong");
    }
});
