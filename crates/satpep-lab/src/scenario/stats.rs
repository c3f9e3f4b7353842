//! Mean, standard deviation and 95 % confidence interval of a cell's samples.

use serde::{Deserialize, Serialize};

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

/// Two-sided 95 % quantile of Student's t with `df` degrees of freedom.
pub fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        31..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
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
        assert!((s.ci95 - 2.365 * s.sd / 8f64.sqrt()).abs() < 1e-12);
        let one = Summary::of(&[3.0]);
        assert_eq!((one.n, one.mean, one.sd, one.ci95), (1, 3.0, 0.0, 0.0));
        assert!(Summary::of(&[]).mean.is_nan());
        assert_eq!(t95(1000), 1.96);
    }
}
