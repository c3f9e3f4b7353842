//! Mean, standard deviation and 95 % confidence interval of a cell's samples.

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Summary of samples.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one sample).
    pub sd: f64,
    /// Half-width of the 95 % confidence interval of the mean (Student's t; 0 for one sample).
    pub ci95: f64,
}

/// Two-sided 95 % quantile of Student's t with `df` degrees of freedom (statrs: exact for
/// every `df`, where a typed-in table rounds between its rows). NaN for `df` = 0.
pub fn t95(df: usize) -> f64 {
    StudentsT::new(0.0, 1.0, df as f64)
        .map(|t| t.inverse_cdf(0.975))
        .unwrap_or(f64::NAN)
}

impl Summary {
    /// Summarizes `x` (empty gives n = 0 and NaN figures).
    pub fn of(x: &[f64]) -> Summary {
        let n = x.len();
        if n == 0 {
            return Summary {
                n,
                mean: f64::NAN,
                sd: f64::NAN,
                ci95: f64::NAN,
            };
        }
        let mean = x.iter().sum::<f64>() / n as f64;
        if n == 1 {
            return Summary {
                n,
                mean,
                sd: 0.0,
                ci95: 0.0,
            };
        }
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        let sd = var.sqrt();
        Summary {
            n,
            mean,
            sd,
            ci95: t95(n - 1) * sd / (n as f64).sqrt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary() {
        let s = Summary::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.n, 8);
        assert!((s.mean - 5.0).abs() < 1e-12);
        // Sample variance 32/7.
        assert!((s.sd - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        // t(0.975, 7) = 2.36462 (tables give 2.365).
        assert!((s.ci95 - 2.36462 * s.sd / 8f64.sqrt()).abs() < 1e-5 * s.sd);
        let one = Summary::of(&[3.0]);
        assert_eq!((one.n, one.mean, one.sd, one.ci95), (1, 3.0, 0.0, 0.0));
        assert!(Summary::of(&[]).mean.is_nan());
        for (df, t) in [
            (1, 12.7062),
            (2, 4.3027),
            (4, 2.7764),
            (30, 2.0423),
            (40, 2.0211),
        ] {
            assert!((t95(df) - t).abs() < 1e-4, "t95({df}) = {}", t95(df));
        }
        assert!((t95(100_000) - 1.95998).abs() < 1e-4);
        assert!(t95(0).is_nan());
    }
}
