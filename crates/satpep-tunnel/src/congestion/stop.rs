//! Lets a stopping endpoint's CONNECTION_CLOSE out past the congestion window.
//!
//! quinn-proto 0.11 counts a packet as ack-eliciting, and so holds it to the congestion
//! window and pacing, whenever streams still have data to send, even when the packet it is
//! about to build carries only CONNECTION_CLOSE. After `close()` no acknowledgement is
//! processed any more, so a connection closed while its window was full never sends its close.
//! The peer then waits out its idle timeout (an outage's worth) instead of resetting its flows
//! at once. A [`StopSwitch`] opens every controller's window when the endpoint stops.

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};
use quinn_proto::RttEstimator;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A window large enough for any close to pass, small enough for quinn's pacing arithmetic.
const OPEN_WINDOW: u64 = 1 << 40;

/// Shared by an endpoint's controllers; [`StopSwitch::stop`] opens their windows.
#[derive(Debug, Clone, Default)]
pub struct StopSwitch(Arc<AtomicBool>);

impl StopSwitch {
    /// Opens every controller's window: call right before closing the endpoint.
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`StopSwitch::stop`] was called.
    pub fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A factory whose controllers obey a [`StopSwitch`].
pub struct Stoppable {
    inner: Arc<dyn ControllerFactory + Send + Sync>,
    switch: StopSwitch,
}

impl Stoppable {
    /// Wraps `inner`'s controllers.
    pub fn new(inner: Arc<dyn ControllerFactory + Send + Sync>, switch: StopSwitch) -> Stoppable {
        Stoppable { inner, switch }
    }
}

impl ControllerFactory for Stoppable {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(Switched {
            inner: self.inner.clone().build(now, current_mtu),
            switch: self.switch.clone(),
        })
    }
}

/// A controller that delegates everything, except its window once stopped.
struct Switched {
    inner: Box<dyn Controller>,
    switch: StopSwitch,
}

impl Controller for Switched {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.inner.on_sent(now, bytes, last_packet_number)
    }
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.inner.on_ack(now, sent, bytes, app_limited, rtt)
    }
    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest: Option<u64>,
    ) {
        self.inner.on_end_acks(now, in_flight, app_limited, largest)
    }
    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        persistent: bool,
        lost_bytes: u64,
    ) {
        self.inner
            .on_congestion_event(now, sent, persistent, lost_bytes)
    }
    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.inner.on_mtu_update(new_mtu)
    }
    fn window(&self) -> u64 {
        if self.switch.stopped() {
            OPEN_WINDOW
        } else {
            self.inner.window()
        }
    }
    fn metrics(&self) -> ControllerMetrics {
        self.inner.metrics()
    }
    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Switched {
            inner: self.inner.clone_box(),
            switch: self.switch.clone(),
        })
    }
    fn initial_window(&self) -> u64 {
        self.inner.initial_window()
    }
    /// The wrapped controller, so callers can downcast to its own type.
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self.inner.into_any()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn::congestion::NewRenoConfig;

    #[test]
    fn the_window_opens_only_when_stopped_and_downcasts_pass_through() {
        let switch = StopSwitch::default();
        let f = Arc::new(Stoppable::new(
            Arc::new(NewRenoConfig::default()),
            switch.clone(),
        ));
        let c = f.build(Instant::now(), 1200);
        let w = c.window();
        assert!(w < OPEN_WINDOW);
        switch.stop();
        assert_eq!(c.window(), OPEN_WINDOW);
        assert!(c
            .into_any()
            .downcast::<quinn::congestion::NewReno>()
            .is_ok());
    }
}
