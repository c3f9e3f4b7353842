//! Hybla (Caini & Firrincieli, 2004) for the tunnel: Reno whose growth is scaled by
//! ρ = RTT / 25 ms, so a 600 ms connection grows as a 25 ms one would. Slow start adds
//! 2^ρ − 1 per acknowledged byte (held to ×17 per RTT: at ρ = 24 the formula is a jump, not a
//! slope), avoidance ρ² segments per RTT; a loss halves the window, once per RTT. It cannot
//! tell noise from congestion: the comparison point for [`super::satellite`].

use super::HopInfo;
use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;
use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RTT0: Duration = Duration::from_millis(25);

/// Configuration: the initial slow-start threshold is the configured BDP, if any.
#[derive(Debug, Clone)]
pub struct HyblaConfig {
    hop: HopInfo,
}

impl HyblaConfig {
    /// Hybla for `hop`.
    pub fn new(hop: HopInfo) -> HyblaConfig {
        HyblaConfig { hop }
    }
}

impl ControllerFactory for HyblaConfig {
    fn build(self: Arc<Self>, _now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let mtu = current_mtu as u64;
        Box::new(Hybla {
            mtu,
            window: 10 * mtu,
            ssthresh: self.hop.bdp().unwrap_or(u64::MAX),
            rho: (self.hop.rtt.as_secs_f64() / RTT0.as_secs_f64()).max(1.0),
            recovery_start: None,
        })
    }
}

/// Hybla's state.
#[derive(Debug, Clone)]
pub struct Hybla {
    mtu: u64,
    window: u64,
    ssthresh: u64,
    rho: f64,
    recovery_start: Option<Instant>,
}

impl Controller for Hybla {
    fn on_ack(
        &mut self,
        _now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        if app_limited || self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        self.rho = (rtt.get().as_secs_f64() / RTT0.as_secs_f64()).max(1.0);
        let add = if self.window < self.ssthresh {
            bytes as f64 * (self.rho.exp2() - 1.0).min(16.0)
        } else {
            self.rho * self.rho * self.mtu as f64 * bytes as f64 / self.window as f64
        };
        self.window = self.window.saturating_add(add.max(1.0) as u64);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        _lost_bytes: u64,
    ) {
        if self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        self.recovery_start = Some(now);
        self.window = (self.window / 2).max(2 * self.mtu);
        self.ssthresh = self.window;
        if is_persistent_congestion {
            self.window = 2 * self.mtu;
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = new_mtu as u64;
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        10 * self.mtu
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}
