//! satpep's transparent split-TCP proxy (RFC 3135): TPROXY interception, a transparent
//! upstream leg, and a relay that keeps half-close and reset semantics. See `docs/proxy.md`.

/// The log target of per-connection events (split, closed, a server that failed): logged
/// at debug, so a busy gateway's log holds the periodic summary instead of a line per
/// connection (`RUST_LOG=info,satpep::connection=debug` shows them; the lab does).
pub const CONNECTION_LOG: &str = "satpep::connection";

pub mod adaptive;
pub mod config;
pub mod control;
pub mod flow_control;
pub mod hold;
pub mod lifecycle;
pub mod netfilter;
pub mod notify;
pub mod preflight;
pub mod privileges;
pub mod reference;
pub mod registry;
pub mod relay;
pub mod routes;
pub mod server;
pub mod share;
pub mod sockets;
pub mod tcpinfo;
pub mod tunnel;
pub mod workers;
