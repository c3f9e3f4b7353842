//! In-order delivery of a stream read out of order.
//!
//! quinn keeps a stream's received data in its assembler until the application reads it in
//! order, and gives up the whole connection past 1024 separate pieces. On a lossy hop every
//! lost packet leaves a hole that takes an RTT to repair, and the data behind it piles up:
//! at 100 Mbit/s, 600 ms and BER 1e-5 (about 11 % of packets lost) that is over a thousand
//! holes at once. So the tunnel reads its streams unordered (quinn hands each piece over as
//! it arrives and counts it as consumed) and puts the pieces back in order here. Only the data
//! behind the oldest hole is held; it is bounded by `limit`, past which the flow fails
//! instead of growing without end.

use bytes::Bytes;
use std::collections::BTreeMap;

/// Pieces of one stream, put back in order.
#[derive(Debug)]
pub struct Reorder {
    next: u64,
    held: BTreeMap<u64, Bytes>,
    held_bytes: usize,
    limit: usize,
}

/// More than `limit` bytes waited behind a hole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overflow {
    /// Bytes that were held.
    pub held: usize,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes waited behind a hole in the stream (too many)",
            self.held
        )
    }
}

impl Reorder {
    /// Expects offset 0 first; holds at most `limit` bytes out of order.
    pub fn new(limit: usize) -> Reorder {
        Reorder {
            next: 0,
            held: BTreeMap::new(),
            held_bytes: 0,
            limit,
        }
    }

    /// The offset of the next byte to deliver.
    pub fn offset(&self) -> u64 {
        self.next
    }

    /// Bytes waiting behind a hole.
    pub fn held(&self) -> usize {
        self.held_bytes
    }

    /// Takes a piece at `offset`. Parts already delivered or already held are dropped, so
    /// the bytes held are distinct and never exceed the span they cover.
    pub fn insert(&mut self, offset: u64, mut b: Bytes) -> Result<(), Overflow> {
        let end = offset + b.len() as u64;
        if end <= self.next {
            return Ok(());
        }
        let offset = if offset < self.next {
            b = b.slice((self.next - offset) as usize..);
            self.next
        } else {
            offset
        };
        // The part of [offset, end) not covered by held pieces, as gaps between them.
        let mut cur = offset;
        if let Some((&po, pb)) = self.held.range(..=offset).next_back() {
            cur = cur.max(po + pb.len() as u64);
        }
        let mut gaps = Vec::new();
        for (&ko, kb) in self.held.range(offset..end) {
            if ko > cur {
                gaps.push((cur, ko));
            }
            cur = cur.max(ko + kb.len() as u64);
            if cur >= end {
                break;
            }
        }
        if cur < end {
            gaps.push((cur, end));
        }
        for (a, z) in gaps {
            let piece = b.slice((a - offset) as usize..(z - offset) as usize);
            self.held_bytes += piece.len();
            self.held.insert(a, piece);
        }
        if self.held_bytes > self.limit {
            return Err(Overflow {
                held: self.held_bytes,
            });
        }
        Ok(())
    }

    /// The next in-order bytes, if they have arrived.
    pub fn pop(&mut self) -> Option<Bytes> {
        // `insert` keeps held pieces disjoint and at or after `next`, so the first one either
        // starts exactly at `next` or there is still a hole.
        let (&off, _) = self.held.first_key_value()?;
        debug_assert!(off >= self.next, "held piece below the delivered offset");
        if off != self.next {
            return None;
        }
        let b = self.held.pop_first().expect("present").1;
        self.held_bytes -= b.len();
        self.next += b.len() as u64;
        Some(b)
    }

    /// True when nothing waits behind a hole.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// A stream read in order through a [`Reorder`].
pub struct InOrder {
    buf: Reorder,
    chunk: usize,
    /// Bytes handed back with [`InOrder::unread`], delivered first.
    back: Option<Bytes>,
    /// The stream's end (`Ok`) or failure, met by [`InOrder::read_batch`] while it gathered
    /// what had arrived; the next read reports it (quinn reports an end only once).
    ended: Option<Result<(), String>>,
}

impl InOrder {
    /// Reads up to `chunk` bytes at a time, holding at most `limit` behind a hole.
    pub fn new(chunk: usize, limit: usize) -> InOrder {
        InOrder {
            buf: Reorder::new(limit),
            chunk,
            back: None,
            ended: None,
        }
    }

    /// Puts bytes taken by the last read back in front of the stream.
    pub fn unread(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.back = Some(b);
        }
    }

    /// One byte; `None` if the stream ended or failed first.
    pub async fn read_byte(&mut self, r: &mut quinn::RecvStream) -> Option<u8> {
        let mut b = self.read(r).await.ok()??;
        let first = b[0];
        self.unread(b.split_off(1));
        Some(first)
    }

    /// The next bytes in order; `Ok(None)` at the stream's end. Errors: the stream was
    /// reset or its connection lost, or too much waited behind a hole.
    pub async fn read(&mut self, r: &mut quinn::RecvStream) -> Result<Option<Bytes>, String> {
        if let Some(b) = self.back.take() {
            return Ok(Some(b));
        }
        loop {
            if let Some(b) = self.buf.pop() {
                return Ok(Some(b));
            }
            match self.ended.take() {
                Some(Ok(())) if self.buf.is_empty() => return Ok(None),
                // quinn reports the end only once every byte arrived; this cannot happen
                // unless the peer misbehaves.
                Some(Ok(())) => return Err("stream ended with bytes missing".into()),
                Some(Err(e)) => return Err(e),
                None => {}
            }
            let got = r.read_chunk(self.chunk, false).await;
            self.take(got)?;
        }
    }

    /// Takes what quinn's `read_chunk` gave: a piece into the reorder buffer, the stream's
    /// end or failure into `ended` for the next read to report.
    fn take(&mut self, got: Result<Option<quinn::Chunk>, quinn::ReadError>) -> Result<(), String> {
        match got {
            Ok(Some(c)) => self
                .buf
                .insert(c.offset, c.bytes)
                .map_err(|e| e.to_string())?,
            Ok(None) => self.ended = Some(Ok(())),
            Err(e) => self.ended = Some(Err(e.to_string())),
        }
        Ok(())
    }

    /// The next bytes in order, as [`InOrder::read`] gives them, and behind them whatever
    /// else has arrived in order, up to `most` bytes, in `out` (cleared first): one write of
    /// all of it costs the socket one system call and a few large packets instead of one per
    /// QUIC packet's piece. `Ok(false)` at the stream's end; errors as [`InOrder::read`].
    pub async fn read_batch(
        &mut self,
        r: &mut quinn::RecvStream,
        most: usize,
        out: &mut Vec<Bytes>,
    ) -> Result<bool, String> {
        out.clear();
        let Some(first) = self.read(r).await? else {
            return Ok(false);
        };
        let mut n = first.len();
        out.push(first);
        while n < most && out.len() < BATCH_PIECES {
            if let Some(b) = self.buf.pop() {
                n += b.len();
                out.push(b);
                continue;
            }
            if self.ended.is_some() {
                break;
            }
            // What quinn holds already; nothing is waited for (read_chunk is cancel-safe).
            match ready_now(r.read_chunk(self.chunk, false)).await {
                Some(got) => self.take(got)?,
                None => break,
            }
        }
        Ok(true)
    }
}

/// Most pieces one batch gathers (a write takes at most 1 024 buffers).
const BATCH_PIECES: usize = 512;

/// `f`'s output if it is ready at its first poll; `None` (and `f` dropped) if not.
async fn ready_now<F: std::future::Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match f.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn drain(r: &mut Reorder) -> String {
        let mut out = String::new();
        while let Some(x) = r.pop() {
            out += std::str::from_utf8(&x).unwrap();
        }
        out
    }

    #[test]
    fn out_of_order_pieces_come_out_in_order() {
        let mut r = Reorder::new(100);
        r.insert(5, b("fgh")).unwrap();
        r.insert(3, b("de")).unwrap();
        assert_eq!(drain(&mut r), "");
        assert_eq!(r.held(), 5);
        r.insert(0, b("abc")).unwrap();
        assert_eq!(drain(&mut r), "abcdefgh");
        assert!(r.is_empty() && r.held() == 0);
        assert_eq!(r.offset(), 8);
    }

    #[test]
    fn duplicates_and_overlaps_are_trimmed() {
        let mut r = Reorder::new(100);
        r.insert(0, b("abcd")).unwrap();
        assert_eq!(drain(&mut r), "abcd");
        // Entirely old, partly old, and a repeat of a held piece.
        r.insert(1, b("bc")).unwrap();
        r.insert(2, b("cdef")).unwrap();
        r.insert(8, b("ij")).unwrap();
        r.insert(8, b("i")).unwrap();
        assert_eq!(r.held(), 4, "held bytes are distinct: ef and ij");
        assert_eq!(drain(&mut r), "ef");
        // Overlapping the held "ij" on both sides: only the gaps are kept.
        r.insert(6, b("ghijkl")).unwrap();
        assert_eq!(r.held(), 6);
        assert_eq!(drain(&mut r), "ghijkl");
    }

    #[test]
    fn too_much_behind_a_hole_is_an_error() {
        let mut r = Reorder::new(10);
        r.insert(1, b("0123456789")).unwrap();
        let e = r.insert(11, b("x")).unwrap_err();
        assert_eq!(e.held, 11);
        assert!(e.to_string().contains("behind a hole"));
    }

    #[test]
    fn a_random_permutation_reassembles() {
        // 2000 pieces of varied size, delivered in a scrambled order with repeats.
        let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut pieces = Vec::new();
        let (mut off, mut k) = (0usize, 1usize);
        while off < data.len() {
            let len = (k * 37 % 61 + 1).min(data.len() - off);
            pieces.push((off, len));
            off += len;
            k += 1;
        }
        let n = pieces.len();
        let mut order: Vec<usize> = (0..n).map(|i| (i * 7919) % n).collect();
        order.extend((0..n).step_by(13));
        let mut r = Reorder::new(data.len());
        let mut out = Vec::new();
        for i in order {
            let (o, l) = pieces[i];
            r.insert(o as u64, Bytes::copy_from_slice(&data[o..o + l]))
                .unwrap();
            while let Some(x) = r.pop() {
                out.extend_from_slice(&x);
            }
        }
        assert_eq!(out, data);
    }
}
