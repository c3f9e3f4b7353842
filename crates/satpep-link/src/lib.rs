//! satpep's satellite link emulator: a userspace layer-2 channel between two interfaces with
//! per-direction rate, delay, queue, loss, bursts and outages. See `docs/link.md`.
//!
//! The model ([`model::Channel`]) is pure and deterministic; [`run`] drives it with real
//! frames through AF_PACKET sockets.

pub mod cli;
pub mod config;
pub mod ethtool;
pub mod loss;
pub mod model;
pub mod presets;
pub mod run;
pub mod socket;
pub mod stats;
pub mod trace;
pub mod units;
