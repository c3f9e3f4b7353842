//! Congestion controllers for the satellite hop, as quinn `Controller`s (one file each, like
//! Linux's `tcp_*.c`): `satellite` (ours: knows the link rate, tells random loss from
//! congestion) and `hybla`, plus quinn's own CUBIC, BBR and NewReno for comparison.

pub mod hybla;
pub mod satellite;
pub mod stop;

use quinn::congestion::{BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};
use std::sync::Arc;
use std::time::Duration;

/// A controller for the hop, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// [`satellite::Satellite`]: rate-aware, loss-tolerant (the default).
    Satellite,
    /// [`hybla::Hybla`]: RTT-compensated Reno.
    Hybla,
    /// quinn's CUBIC (RFC 9438).
    Cubic,
    /// quinn's BBR (v1).
    Bbr,
    /// quinn's NewReno (RFC 9002's default).
    NewReno,
}

impl Algorithm {
    /// Every controller, in the order `--help` lists them.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Satellite,
        Algorithm::Hybla,
        Algorithm::Cubic,
        Algorithm::Bbr,
        Algorithm::NewReno,
    ];

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Satellite => "satellite",
            Algorithm::Hybla => "hybla",
            Algorithm::Cubic => "cubic",
            Algorithm::Bbr => "bbr",
            Algorithm::NewReno => "newreno",
        }
    }

    /// The controller called `name`; the error lists the valid names.
    pub fn parse(name: &str) -> Result<Algorithm, String> {
        Algorithm::ALL
            .iter()
            .copied()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                format!(
                    "'{name}' is not a tunnel congestion control ({})",
                    names.join(", ")
                )
            })
    }
}

/// What a controller may know about the hop.
#[derive(Debug, Clone, Copy)]
pub struct HopInfo {
    /// This side's sending rate on the hop, bytes per second, if configured.
    pub rate: Option<u64>,
    /// The hop's round-trip time as configured (used until one is measured).
    pub rtt: Duration,
}

impl HopInfo {
    /// Rate × RTT, bytes, if the rate is known.
    pub fn bdp(&self) -> Option<u64> {
        self.rate
            .map(|r| (r as u128 * self.rtt.as_nanos() / 1_000_000_000) as u64)
    }
}

/// What one connection's controller shares with the endpoint around it (used by the
/// satellite controller; the others ignore it).
#[derive(Debug, Clone, Default)]
pub struct Shared {
    /// Where the connection leaves the path it measured, and the next one starts from (a
    /// terminal's connections all cross one hop; see [`satellite::PathMemory`]).
    pub memory: Option<satellite::PathMemory>,
    /// The rate the connection's datagrams leave at, set by the controller and applied by
    /// the endpoint's [`crate::pacing::PacedSocket`].
    pub pace: Option<Arc<crate::pacing::Pace>>,
    /// Where the controller publishes what it measured, for the proxy's status and metrics.
    pub readings: Option<Arc<satellite::Readings>>,
}

/// The factory quinn builds a connection's controller from; `switch` opens the controllers'
/// windows when the endpoint stops (see [`stop`]).
pub fn factory(
    alg: Algorithm,
    hop: HopInfo,
    switch: &stop::StopSwitch,
    shared: Shared,
) -> Arc<dyn ControllerFactory + Send + Sync> {
    let inner: Arc<dyn ControllerFactory + Send + Sync> = match alg {
        Algorithm::Satellite => Arc::new(satellite::SatelliteConfig::new(hop, shared)),
        Algorithm::Hybla => Arc::new(hybla::HyblaConfig::new(hop)),
        Algorithm::Cubic => Arc::new(CubicConfig::default()),
        Algorithm::Bbr => Arc::new(BbrConfig::default()),
        Algorithm::NewReno => Arc::new(NewRenoConfig::default()),
    };
    Arc::new(stop::Stoppable::new(inner, switch.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_list_the_good_ones() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Ok(a));
        }
        let e = Algorithm::parse("vegas").unwrap_err();
        assert!(
            e.contains("'vegas'") && e.contains("satellite, hybla"),
            "{e}"
        );
    }

    #[test]
    fn bdp_is_rate_times_rtt() {
        let h = HopInfo {
            rate: Some(12_500_000),
            rtt: Duration::from_millis(600),
        };
        assert_eq!(h.bdp(), Some(7_500_000));
    }
}
