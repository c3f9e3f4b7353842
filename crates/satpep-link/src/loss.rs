//! Frame loss: bit errors (BER → PER per frame), a fixed packet error rate, and the
//! Gilbert–Elliott two-state burst model. A lost frame is one a receiver's FCS check would
//! discard, so it still used the channel; the caller charges its serialization time.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Gilbert–Elliott burst-loss parameters, per frame.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Gilbert {
    /// Probability of moving from the good to the bad state after a frame.
    pub p: f64,
    /// Probability of moving from the bad back to the good state after a frame.
    pub r: f64,
    /// Loss probability of a frame sent in the good state.
    pub loss_good: f64,
    /// Loss probability of a frame sent in the bad state.
    pub loss_bad: f64,
}

impl Gilbert {
    /// Long-run share of frames sent in the bad state: p / (p + r).
    pub fn bad_share(&self) -> f64 {
        self.p / (self.p + self.r)
    }
    /// Long-run loss probability of this model alone.
    pub fn mean_loss(&self) -> f64 {
        let b = self.bad_share();
        b * self.loss_bad + (1.0 - b) * self.loss_good
    }
    /// Mean number of consecutive frames spent in the bad state: 1 / r.
    pub fn mean_burst_frames(&self) -> f64 {
        1.0 / self.r
    }
}

/// All loss processes of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LossConfig {
    /// Bit error rate, applied per frame as PER = 1 − (1 − BER)^(8·L).
    pub ber: f64,
    /// Fixed packet error rate, independent of size.
    pub per: f64,
    /// Optional burst model; combined with the others (a frame is lost if any process loses it).
    pub gilbert: Option<Gilbert>,
}

/// PER of an `len`-byte frame under independent bit errors: 1 − (1 − BER)^(8·len).
pub fn per_from_ber(ber: f64, len: u32) -> f64 {
    // expm1/ln1p keep precision at BER 1e-12 where the naive formula rounds to 0.
    -(8.0 * len as f64 * (-ber).ln_1p()).exp_m1()
}

impl LossConfig {
    /// Whether any loss process is configured.
    pub fn is_lossless(&self) -> bool {
        self.ber == 0.0 && self.per == 0.0 && self.gilbert.is_none()
    }
    /// Long-run loss probability of an `len`-byte frame with every process combined.
    pub fn mean_loss(&self, len: u32) -> f64 {
        let g = self.gilbert.map_or(0.0, |g| g.mean_loss());
        1.0 - (1.0 - per_from_ber(self.ber, len)) * (1.0 - self.per) * (1.0 - g)
    }
}

/// The random state of one direction's loss processes.
///
/// Exactly two draws are made per frame offered to it, whatever is configured, so one seed
/// gives one loss pattern for a given frame sequence.
pub struct LossState {
    rng: ChaCha8Rng,
    bad: bool,
}

impl LossState {
    /// A loss state seeded by `seed`; `stream` separates directions.
    pub fn new(seed: u64, stream: u64) -> LossState {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        LossState { rng, bad: false }
    }

    /// Whether the Gilbert–Elliott chain is in its bad state.
    pub fn in_bad_state(&self) -> bool {
        self.bad
    }

    /// Decides whether a frame of `len` bytes (on the wire) is corrupted.
    pub fn lost(&mut self, cfg: &LossConfig, len: u32) -> bool {
        let u_err: f64 = self.rng.gen();
        let u_state: f64 = self.rng.gen();
        let p_ge = match cfg.gilbert {
            Some(g) => {
                let p = if self.bad { g.loss_bad } else { g.loss_good };
                // State for the next frame.
                self.bad = if self.bad {
                    u_state >= g.r
                } else {
                    u_state < g.p
                };
                p
            }
            None => 0.0,
        };
        let keep = (1.0 - per_from_ber(cfg.ber, len)) * (1.0 - cfg.per) * (1.0 - p_ge);
        u_err >= keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_formula() {
        // 1500-byte frame at BER 1e-6: 1 - (1-1e-6)^12000 ≈ 0.011928
        let p = per_from_ber(1e-6, 1500);
        assert!((p - 0.011928).abs() < 1e-5, "{p}");
        assert_eq!(per_from_ber(0.0, 1500), 0.0);
        // Tiny BER keeps precision.
        assert!((per_from_ber(1e-12, 1000) - 8e-9).abs() < 1e-15);
    }

    #[test]
    fn same_seed_same_pattern() {
        let cfg = LossConfig {
            per: 0.1,
            ..Default::default()
        };
        let run = |seed| {
            let mut s = LossState::new(seed, 0);
            (0..1000).map(|_| s.lost(&cfg, 1000)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn fixed_per_rate() {
        let cfg = LossConfig {
            per: 0.05,
            ..Default::default()
        };
        let mut s = LossState::new(1, 0);
        let n = 200_000;
        let lost = (0..n).filter(|_| s.lost(&cfg, 100)).count() as f64;
        // 99.9 % binomial bound: 3.3 sigma.
        let sigma = (0.05f64 * 0.95 / n as f64).sqrt();
        assert!((lost / n as f64 - 0.05).abs() < 3.3 * sigma, "{lost}");
    }

    #[test]
    fn gilbert_bursts() {
        let g = Gilbert {
            p: 0.01,
            r: 0.2,
            loss_good: 0.0,
            loss_bad: 1.0,
        };
        let cfg = LossConfig {
            gilbert: Some(g),
            ..Default::default()
        };
        let mut s = LossState::new(3, 0);
        let n = 400_000;
        let pattern: Vec<bool> = (0..n).map(|_| s.lost(&cfg, 100)).collect();
        let lost = pattern.iter().filter(|&&l| l).count() as f64;
        let bursts = pattern.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
        let mean_burst = lost / bursts;
        assert!(
            (lost / n as f64 - g.mean_loss()).abs() < 0.004,
            "{}",
            lost / n as f64
        );
        assert!(
            (mean_burst - g.mean_burst_frames()).abs() < 0.3,
            "{mean_burst}"
        );
    }
}
