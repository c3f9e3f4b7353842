//! satpep's lab: testbeds of network namespaces around the link emulator, real traffic
//! (iperf3, ping) across them, and the experiments built from those.

pub mod experiment;
pub mod iperf;
pub mod sys;
pub mod topology;

pub use topology::{Host, Lab, UpOptions};
pub mod checked;
pub mod esp;
pub mod flows;
pub mod http;
pub mod progress;
pub mod scenario;
pub mod sink;
pub mod synflood;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

static INTERRUPTED: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Makes SIGINT/SIGTERM set a flag that long runs poll, so they stop their traffic and tear
/// their lab down instead of dying with namespaces left behind.
pub fn catch_interrupts() {
    let flag = INTERRUPTED.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, flag.clone());
    }
}

/// Whether an interrupt arrived since [`catch_interrupts`].
pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}
