//! A fixed packet error rate: every frame is lost with the same probability, whatever its
//! length (a link layer that drops whole frames, or a document that gives a PER).

use super::{check_prob, LossModel};
use serde::Serialize;

/// Packet error rate in (0, 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Per {
    /// Probability that a frame is lost.
    pub per: f64,
}

impl LossModel for Per {
    type Spec = f64;
    type State = ();

    fn resolve(spec: &f64, key: &str) -> Result<Option<Per>, String> {
        let per = check_prob(key, *spec, false)?;
        Ok((per > 0.0).then_some(Per { per }))
    }

    fn mean_loss(&self, _: u32) -> f64 {
        self.per
    }

    fn frame_loss(&self, _: &mut (), _: f64, _: u32) -> f64 {
        self.per
    }

    fn describe(&self) -> String {
        format!("PER {}", self.per)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LossConfig, LossState};
    use super::*;

    #[test]
    fn fixed_per_rate() {
        let cfg = LossConfig {
            per: Per::resolve(&0.05, "per").unwrap(),
            ..Default::default()
        };
        let mut s = LossState::new(1, 0);
        let n = 200_000;
        let lost = (0..n).filter(|_| s.lost(&cfg, 100)).count() as f64;
        // 99.9 % binomial bound: 3.3 sigma.
        let sigma = (0.05f64 * 0.95 / n as f64).sqrt();
        assert!((lost / n as f64 - 0.05).abs() < 3.3 * sigma, "{lost}");
    }
}
