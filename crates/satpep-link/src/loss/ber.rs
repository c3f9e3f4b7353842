//! Independent bit errors: a frame of L bytes is lost with PER = 1 − (1 − BER)^(8·L), so long
//! frames are lost more often than short ones (the satellite documents' BER sweeps).

use super::{check_prob, LossModel};
use serde::Serialize;

/// Bit error rate in (0, 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Ber {
    /// Probability that any one bit is flipped.
    pub ber: f64,
}

/// PER of an `len`-byte frame under independent bit errors: 1 − (1 − BER)^(8·len).
pub fn per_from_ber(ber: f64, len: u32) -> f64 {
    // expm1/ln1p keep precision at BER 1e-12 where the naive formula rounds to 0.
    -(8.0 * len as f64 * (-ber).ln_1p()).exp_m1()
}

impl LossModel for Ber {
    type Spec = f64;
    type State = ();

    fn resolve(spec: &f64, key: &str) -> Result<Option<Ber>, String> {
        let ber = check_prob(key, *spec, false)?;
        Ok((ber > 0.0).then_some(Ber { ber }))
    }

    fn mean_loss(&self, len: u32) -> f64 {
        per_from_ber(self.ber, len)
    }

    fn frame_loss(&self, _: &mut (), _: f64, len: u32) -> f64 {
        per_from_ber(self.ber, len)
    }

    fn describe(&self) -> String {
        format!("BER {:e}", self.ber)
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
    fn zero_is_no_model_and_one_is_refused() {
        assert_eq!(Ber::resolve(&0.0, "forward ber"), Ok(None));
        let e = Ber::resolve(&1.0, "forward ber").unwrap_err();
        assert_eq!(e, "forward ber 1 is outside [0, 1)");
        assert!(Ber::resolve(&f64::NAN, "ber").is_err());
    }
}
