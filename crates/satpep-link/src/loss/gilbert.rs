//! The Gilbert–Elliott two-state burst model: a Markov chain moves between a good and a bad
//! state after each frame, each state with its own loss probability, so losses come in bursts
//! (rain, shadowing, a LEO handover) rather than one by one.

use super::{check_prob, LossModel};
use serde::{Deserialize, Serialize};

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
    /// Mean number of consecutive frames spent in the bad state: 1 / r.
    pub fn mean_burst_frames(&self) -> f64 {
        1.0 / self.r
    }
}

/// Gilbert–Elliott parameters as written by a user: `gilbert = { p = 0.01, r = 0.2 }` in a
/// file, `p=0.01,r=0.2[,loss_bad=0.8][,loss_good=0]` on the command line.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GilbertSpec {
    /// Good → bad transition probability per frame.
    pub p: f64,
    /// Bad → good transition probability per frame (mean burst = 1/r frames).
    pub r: f64,
    /// Loss probability in the good state (default 0).
    #[serde(default)]
    pub loss_good: f64,
    /// Loss probability in the bad state (default 1).
    #[serde(default = "one")]
    pub loss_bad: f64,
}

fn one() -> f64 {
    1.0
}

impl std::str::FromStr for GilbertSpec {
    type Err = String;
    /// Parses `p=0.01,r=0.2[,loss_bad=0.8][,loss_good=0]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (mut p, mut r, mut good, mut bad) = (None, None, 0.0, 1.0);
        for part in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}': expected key=value"))?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("'{part}': '{v}' is not a number"))?;
            match k.trim() {
                "p" => p = Some(v),
                "r" => r = Some(v),
                "loss_good" => good = v,
                "loss_bad" => bad = v,
                other => {
                    return Err(format!(
                        "unknown Gilbert–Elliott key '{other}' (use p, r, loss_good, loss_bad)"
                    ))
                }
            }
        }
        Ok(GilbertSpec {
            p: p.ok_or("Gilbert–Elliott needs p= (good→bad probability)")?,
            r: r.ok_or("Gilbert–Elliott needs r= (bad→good probability)")?,
            loss_good: good,
            loss_bad: bad,
        })
    }
}

impl LossModel for Gilbert {
    type Spec = GilbertSpec;
    /// Whether the chain is in its bad state.
    type State = bool;

    fn resolve(g: &GilbertSpec, key: &str) -> Result<Option<Gilbert>, String> {
        let in_unit = |x: f64| x > 0.0 && x <= 1.0;
        if !in_unit(g.p) || !in_unit(g.r) {
            return Err(format!(
                "{key}: p and r must be in (0, 1] (got p={}, r={})",
                g.p, g.r
            ));
        }
        Ok(Some(Gilbert {
            p: g.p,
            r: g.r,
            loss_good: check_prob(&format!("{key} loss_good"), g.loss_good, true)?,
            loss_bad: check_prob(&format!("{key} loss_bad"), g.loss_bad, true)?,
        }))
    }

    fn mean_loss(&self, _: u32) -> f64 {
        let b = self.bad_share();
        b * self.loss_bad + (1.0 - b) * self.loss_good
    }

    fn frame_loss(&self, bad: &mut bool, u: f64, _: u32) -> f64 {
        let p = if *bad { self.loss_bad } else { self.loss_good };
        // State for the next frame.
        *bad = if *bad { u >= self.r } else { u < self.p };
        p
    }

    fn describe(&self) -> String {
        format!(
            "Gilbert-Elliott p={} r={} loss {}/{}",
            self.p, self.r, self.loss_good, self.loss_bad
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LossConfig, LossState};
    use super::*;

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
            (lost / n as f64 - g.mean_loss(100)).abs() < 0.004,
            "{}",
            lost / n as f64
        );
        assert!(
            (mean_burst - g.mean_burst_frames()).abs() < 0.3,
            "{mean_burst}"
        );
    }

    #[test]
    fn gilbert_from_flag() {
        let g: GilbertSpec = "p=0.01, r=0.25,loss_bad=0.5".parse().unwrap();
        assert_eq!((g.p, g.r, g.loss_good, g.loss_bad), (0.01, 0.25, 0.0, 0.5));
        assert!("p=0.1".parse::<GilbertSpec>().unwrap_err().contains("r="));
        assert!("p=0.1,r=0.2,q=1"
            .parse::<GilbertSpec>()
            .unwrap_err()
            .contains("'q'"));
    }

    #[test]
    fn bad_parameters_name_the_key() {
        let spec = |p, r, bad| GilbertSpec {
            p,
            r,
            loss_good: 0.0,
            loss_bad: bad,
        };
        let e = Gilbert::resolve(&spec(0.0, 0.2, 1.0), "forward gilbert").unwrap_err();
        assert!(e.starts_with("forward gilbert: p and r"), "{e}");
        let e = Gilbert::resolve(&spec(0.1, 0.2, 1.5), "return gilbert").unwrap_err();
        assert_eq!(e, "return gilbert loss_bad 1.5 is outside [0, 1]");
    }
}
