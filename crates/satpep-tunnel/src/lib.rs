//! satpep's distributed mode, the parts that do not touch TCP: the flow header and answer
//! spoken on each QUIC stream, the credentials (a private CA, mutual TLS 1.3), the congestion
//! controllers for the satellite hop, and the QUIC transport sized for a long fat link.
//! The proxy (`satpep-proxy`) joins these to intercepted TCP connections. See
//! `docs/tunnel.md`.

pub mod admission;
pub mod authority;
pub mod congestion;
pub mod header;
pub mod hub;
pub mod keys;
pub mod pacing;
pub mod reorder;
pub mod transport;
