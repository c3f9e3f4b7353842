//! Moving bytes between the two legs of one split connection.
//!
//! Each direction is relayed on its own: end of stream on one side becomes a FIN on the other
//! once every byte read has been written (half-closed connections keep flowing the other
//! way); a reset on one side becomes a reset on the other. Each direction holds at most one
//! buffer of data: the next read waits for the write, so when the downstream side is slow the
//! excess stays in the upstream socket's receive buffer and its advertised window shrinks
//! (Bharadwaj's improved back-pressure, 001 §4.3).

use crate::sockets::reset_on_close;
use socket2::SockRef;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

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
}

/// Copies one direction; returns how it ended and the bytes written.
async fn pipe<R, W>(mut r: R, mut w: W, buf_len: usize, live: &AtomicU64) -> (End, u64)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; buf_len];
    let mut count = 0u64;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
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
pub async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    buf_len: usize,
    up: &AtomicU64,
    down: &AtomicU64,
) -> Relayed {
    let is_reset = |e: &Option<(End, u64)>| matches!(e, Some((End::ResetIn | End::ResetOut, _)));
    let (up_end, down_end) = {
        // Borrowed halves: unlike owned ones they send no FIN when dropped, so a direction
        // cut short by a reset cannot look like a complete stream to the other side.
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let a = pipe(cr, sw, buf_len, up);
        let b = pipe(sr, cw, buf_len, down);
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
    };
    if is_reset(&up_end) || is_reset(&down_end) {
        reset_on_close(SockRef::from(&client));
        reset_on_close(SockRef::from(&server));
    }
    // A direction still running when the other was reset was cut off.
    let (up_end, up) = up_end.unwrap_or((End::ResetOut, 0));
    let (down_end, down) = down_end.unwrap_or((End::ResetOut, 0));
    Relayed {
        up,
        down,
        up_end,
        down_end,
    }
}
