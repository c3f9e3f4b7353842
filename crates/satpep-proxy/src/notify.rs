//! Readiness, reload, stop and watchdog notifications for systemd (`Type=notify`,
//! `WatchdogSec=`), through the sd-notify crate: pure Rust, no libsystemd, and every call
//! does nothing when the service manager did not ask for them (no `NOTIFY_SOCKET`).

use sd_notify::NotifyState;
use std::time::Duration;
use tracing::warn;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        warn!(error = %e, "cannot notify the service manager");
    }
}

/// Set-up is done (interception installed, privileges dropped): systemd's start ends here,
/// so units ordered after satpep start once it intercepts.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A SIGHUP reload begins; [`ready`] ends it.
pub fn reloading() {
    send(&[NotifyState::Reloading]);
}

/// The proxy is stopping (draining live connections).
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// If systemd runs a watchdog for this service, pings it at half its interval from a task
/// of the proxy's runtime: a runtime that stops running tasks stops the pings, and systemd
/// restarts the service.
pub fn watchdog() -> Option<tokio::task::JoinHandle<()>> {
    std::env::var_os("NOTIFY_SOCKET")?;
    let mut usec = 0u64;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return None;
    }
    let every = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            send(&[NotifyState::Watchdog]);
        }
    }))
}
