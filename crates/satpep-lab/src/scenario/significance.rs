//! Lawson 2006's statistics (002 §3.4, ch. 4) over a part's configurations at one sweep
//! point: a one-way analysis of variance with the three checks of its residuals the thesis
//! made (Shapiro–Wilk for normality, Breusch–Pagan for constant variance, Durbin–Watson for
//! independence in run order), Tukey's HSD groups where the checks hold, the Kruskal–Wallis
//! rank test with Dunn's pairwise groups where they fail, and each configuration's
//! % improvement over a baseline with its 95 % interval.
//!
//! The tests are `anofox-statistics`' (each checked against R by its authors); what is here
//! is the thesis's procedure around them and the connecting-letters display of its tables.

use anofox_statistics::{
    dunn_test, durbin_watson_test, kruskal_wallis, one_way_anova, shapiro_wilk, tukey_hsd,
    Alternative, AnovaKind, PAdjustMethod,
};
use serde::{Deserialize, Serialize};
use statrs::distribution::{ChiSquared, ContinuousCDF};

/// A part's `[part.statistics]`: the analysis is made at each of its sweep points.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Statistics {
    /// The configuration improvements are measured from (the thesis's unmodified TCP);
    /// default: the part's first configuration.
    #[serde(default)]
    pub baseline: Option<String>,
    /// Significance level of every test and of the groups (default 0.05, the thesis's).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
}

fn default_alpha() -> f64 {
    0.05
}

impl Statistics {
    /// Checks the settings against the part's configuration names.
    pub fn check(&self, configs: &[String]) -> Result<(), String> {
        if !(self.alpha > 0.0 && self.alpha < 0.5) {
            return Err(format!(
                "statistics.alpha: {} is not a significance level (0 < alpha < 0.5)",
                self.alpha
            ));
        }
        if configs.len() < 2 {
            return Err("statistics: needs at least two configurations to compare".into());
        }
        match &self.baseline {
            Some(b) if !configs.contains(b) => Err(format!(
                "statistics.baseline: no configuration named '{b}' (there are: {})",
                configs.join(", ")
            )),
            _ => Ok(()),
        }
    }

    /// Index of the baseline among `configs`.
    pub fn baseline_index(&self, configs: &[String]) -> usize {
        self.baseline
            .as_ref()
            .and_then(|b| configs.iter().position(|c| c == b))
            .unwrap_or(0)
    }
}

/// The one-way analysis of variance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Anova {
    /// F statistic.
    pub f: f64,
    /// Degrees of freedom between groups (k − 1) and within them (N − k).
    pub df: (f64, f64),
    /// P-value of F.
    pub p: f64,
    /// Adjusted R² of the model (the share of the variance the configuration explains).
    pub r2_adj: f64,
}

/// A configuration's % improvement over the baseline's mean, with a 95 % interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Improvement {
    /// (mean ÷ baseline mean − 1) × 100.
    pub pct: f64,
    /// Lower and upper ends of the 95 % interval (delta method, Student's t).
    pub ci: (f64, f64),
}

/// Everything the analysis found at one point.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// Observations per configuration.
    pub n: Vec<usize>,
    /// Mean per configuration.
    pub means: Vec<f64>,
    /// None where a configuration has fewer than two observations or all are equal.
    pub anova: Option<Anova>,
    /// Shapiro–Wilk p-value of the residuals (normality).
    pub shapiro_p: Option<f64>,
    /// Breusch–Pagan p-value (Koenker's form: the squared residuals regressed on the
    /// configuration; constant variance).
    pub breusch_pagan_p: Option<f64>,
    /// Durbin–Watson statistic and p-value of the residuals in run order (positive
    /// autocorrelation; independence).
    pub durbin_watson: Option<(f64, f64)>,
    /// Kruskal–Wallis H, its degrees of freedom and p-value.
    pub kruskal: Option<(f64, f64, f64)>,
    /// Whether the residual checks all held at `alpha` (then the ANOVA and Tukey groups
    /// stand; else the rank test and Dunn's groups do).
    pub residuals_hold: bool,
    /// Connecting letters per configuration: configurations sharing no letter differ at
    /// `alpha` (Tukey's HSD where the residuals hold, Dunn's test with Holm's adjustment
    /// where they fail); empty when no test could run.
    pub letters: Vec<String>,
    /// % improvement over the baseline (None for the baseline itself and where a mean is
    /// missing or zero).
    pub improvement: Vec<Option<Improvement>>,
}

/// Analyses `groups` (one per configuration, observations in run order; the groups ran one
/// after another in this order) against `groups[baseline]` at level `alpha`.
pub fn analyse(groups: &[Vec<f64>], baseline: usize, alpha: f64) -> Analysis {
    let k = groups.len();
    let n: Vec<usize> = groups.iter().map(Vec::len).collect();
    let means: Vec<f64> = groups.iter().map(|g| mean(g)).collect();
    let improvement = (0..k)
        .map(|i| (i != baseline).then(|| improvement(&groups[i], &groups[baseline], 0.95)))
        .map(Option::flatten)
        .collect();
    let mut a = Analysis {
        n: n.clone(),
        means: means.clone(),
        anova: None,
        shapiro_p: None,
        breusch_pagan_p: None,
        durbin_watson: None,
        kruskal: None,
        residuals_hold: false,
        letters: Vec::new(),
        improvement,
    };
    // Configurations with fewer than two observations (runs that failed) take no part in
    // the tests: a variance needs two.
    let live: Vec<usize> = (0..k).filter(|&i| n[i] >= 2).collect();
    if live.len() < 2 {
        return a;
    }
    let slices: Vec<&[f64]> = live.iter().map(|&i| groups[i].as_slice()).collect();
    a.kruskal = kruskal_wallis(&slices)
        .ok()
        .map(|r| (r.statistic, r.df, r.p_value));
    if let Ok(r) = one_way_anova(&slices, AnovaKind::Fisher) {
        if let (Some(ssb), Some(ssw), Some(sst)) = (r.ss_between, r.ss_within, r.ss_total) {
            let total: usize = slices.iter().map(|s| s.len()).sum();
            let (dfb, dfw) = (r.df_between, r.df_within);
            if sst > 0.0 && r.statistic.is_finite() {
                a.anova = Some(Anova {
                    f: r.statistic,
                    df: (dfb, dfw),
                    p: r.p_value,
                    r2_adj: 1.0 - (ssw / dfw) / (sst / (total as f64 - 1.0)),
                });
            }
            let _ = ssb;
        }
    }
    // Residuals in run order, and the design they came from (intercept + dummies).
    let mut resid = Vec::new();
    let mut label = Vec::new();
    for (j, s) in slices.iter().enumerate() {
        let m = mean(s);
        for v in s.iter() {
            resid.push(v - m);
            label.push(j);
        }
    }
    if a.anova.is_some() {
        a.shapiro_p = shapiro_wilk(&resid).ok().map(|r| r.p_value);
        a.breusch_pagan_p = breusch_pagan(&resid, &label, slices.len());
        let cols: Vec<Vec<f64>> = std::iter::once(vec![1.0; resid.len()])
            .chain((1..slices.len()).map(|j| {
                label
                    .iter()
                    .map(|&l| if l == j { 1.0 } else { 0.0 })
                    .collect()
            }))
            .collect();
        let cols: Vec<&[f64]> = cols.iter().map(Vec::as_slice).collect();
        a.durbin_watson = durbin_watson_test(&resid, &cols, Alternative::Greater, None)
            .ok()
            .and_then(|r| Some((r.statistic?, r.p_value?)));
    }
    a.residuals_hold = a.anova.is_some()
        && [a.shapiro_p, a.breusch_pagan_p, a.durbin_watson.map(|d| d.1)]
            .iter()
            .all(|p| p.is_some_and(|p| p >= alpha));
    // Pairwise: Tukey where the ANOVA's assumptions hold, Dunn (Holm) where they fail.
    let values: Vec<f64> = slices.iter().flat_map(|s| s.iter().copied()).collect();
    let pairs = match a.residuals_hold {
        true => tukey_hsd(&values, &label, 1.0 - alpha).ok().map(|r| {
            r.comparisons
                .iter()
                .map(|c| (c.group1, c.group2, c.p_adj))
                .collect::<Vec<_>>()
        }),
        false => dunn_test(&values, &label, PAdjustMethod::Holm)
            .ok()
            .map(|r| {
                r.comparisons
                    .iter()
                    .map(|c| (c.group1, c.group2, c.p_adj))
                    .collect::<Vec<_>>()
            }),
    };
    if let Some(pairs) = pairs {
        let differ = |i: usize, j: usize| {
            pairs
                .iter()
                .any(|&(a, b, p)| ((a, b) == (i, j) || (a, b) == (j, i)) && p < alpha)
        };
        let live_means: Vec<f64> = live.iter().map(|&i| means[i]).collect();
        let l = letters(&live_means, &differ);
        a.letters = vec![String::new(); k];
        for (j, &i) in live.iter().enumerate() {
            a.letters[i] = l[j].clone();
        }
    }
    a
}

/// The report's tables for part `pi`: the tests at each point, the connecting letters and
/// the improvements over the baseline (`div` scales the part's metric to `uname`).
pub fn tables(
    sc: &super::spec::Scenario,
    pi: usize,
    res: &[&super::report::CellResult],
    runs: &[super::traffic::RunRecord],
    (uname, div): (&str, f64),
) -> Vec<(String, super::report::Table)> {
    use super::report::Table;
    let part = &sc.parts[pi];
    let Some(st) = &part.statistics else {
        return Vec::new();
    };
    let base = st.baseline_index(&part.configs);
    let mut points: Vec<Vec<String>> = Vec::new();
    for r in res {
        if !points.contains(&r.point) {
            points.push(r.point.clone());
        }
    }
    let labels: Vec<String> = match part.axes.is_empty() {
        true => vec![String::new()],
        false => part.axes.iter().map(|a| a.label()).collect(),
    };
    let row_of = |p: &Vec<String>| match p.is_empty() {
        true => vec![String::new()],
        false => p.clone(),
    };
    let p_fmt = |p: Option<f64>| match p {
        Some(p) if p < 1e-4 => "< 0.0001".to_string(),
        Some(p) => format!("{p:.4}"),
        None => "–".into(),
    };
    let mut tests = Table {
        header: labels.clone(),
        label_cols: labels.len(),
        rows: Vec::new(),
    };
    tests.header.extend(
        [
            "runs per configuration",
            "ANOVA F (df), p",
            "adjusted R²",
            "Shapiro–Wilk p",
            "Breusch–Pagan p",
            "Durbin–Watson d, p",
            "residuals",
            "Kruskal–Wallis H (df), p",
        ]
        .map(String::from),
    );
    let mut groups_t = Table {
        header: labels.clone(),
        label_cols: labels.len(),
        rows: Vec::new(),
    };
    groups_t.header.extend(part.configs.iter().cloned());
    let mut impr_t = groups_t.clone();
    for p in &points {
        let groups: Vec<Vec<f64>> = part
            .configs
            .iter()
            .map(|c| {
                let Some(r) = res.iter().find(|r| &r.config == c && &r.point == p) else {
                    return Vec::new();
                };
                let mut mine: Vec<&super::traffic::RunRecord> =
                    runs.iter().filter(|x| x.cell == r.cell).collect();
                mine.sort_by_key(|x| x.repetition);
                mine.iter()
                    .filter(|x| !x.samples.is_empty())
                    .map(|x| mean(&x.samples))
                    .collect()
            })
            .collect();
        let a = analyse(&groups, base, st.alpha);
        let mut row = row_of(p);
        row.push(
            a.n.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
        );
        row.push(match a.anova {
            Some(v) => format!("{:.2} ({}, {}), {}", v.f, v.df.0, v.df.1, p_fmt(Some(v.p))),
            None => "–".into(),
        });
        row.push(a.anova.map_or("–".into(), |v| format!("{:.3}", v.r2_adj)));
        row.push(p_fmt(a.shapiro_p));
        row.push(p_fmt(a.breusch_pagan_p));
        row.push(match a.durbin_watson {
            Some((d, p)) => format!("{d:.2}, {}", p_fmt(Some(p))),
            None => "–".into(),
        });
        row.push(match (a.anova.is_some(), a.residuals_hold) {
            (false, _) => "too few runs".into(),
            (true, true) => "hold: ANOVA, Tukey".into(),
            (true, false) => {
                let failed: Vec<&str> = [
                    (a.shapiro_p, "normality"),
                    (a.breusch_pagan_p, "variance"),
                    (a.durbin_watson.map(|d| d.1), "independence"),
                ]
                .iter()
                .filter(|(p, _)| p.is_none_or(|p| p < st.alpha))
                .map(|&(_, n)| n)
                .collect();
                format!("fail ({}): Kruskal–Wallis, Dunn", failed.join(", "))
            }
        });
        row.push(match a.kruskal {
            Some((h, df, p)) => format!("{h:.2} ({df}), {}", p_fmt(Some(p))),
            None => "–".into(),
        });
        tests.rows.push(row);
        let mut g = row_of(p);
        let mut im = row_of(p);
        for i in 0..part.configs.len() {
            g.push(match a.n[i] {
                0 => "–".into(),
                _ => {
                    let m = format!("{:.4}", a.means[i] / div);
                    match a.letters.get(i).filter(|l| !l.is_empty()) {
                        Some(l) => format!("{m} ({l})"),
                        None => m,
                    }
                }
            });
            im.push(match (i == base, a.improvement[i]) {
                (true, _) => "baseline".into(),
                (false, None) => "–".into(),
                (false, Some(v)) if v.ci.0.is_nan() => format!("{:+.1}", v.pct),
                (false, Some(v)) => format!("{:+.1} [{:+.1}, {:+.1}]", v.pct, v.ci.0, v.ci.1),
            });
        }
        groups_t.rows.push(g);
        impr_t.rows.push(im);
    }
    let level = (1.0 - st.alpha) * 100.0;
    vec![
        (
            format!(
                "analysis of variance across the configurations at each point, α = {} (residual checks in run order; where one fails, the rank test stands)",
                st.alpha
            ),
            tests,
        ),
        (
            format!(
                "mean per configuration ({uname}) and its groups: configurations sharing no letter differ ({level:.0} % family-wise; Tukey's HSD where the residuals hold, Dunn's test with Holm's adjustment where they fail)"
            ),
            groups_t,
        ),
        (
            match sc.metric(pi) {
                super::spec::Metric::Goodput | super::spec::Metric::ConnectRate => format!(
                    "% improvement over {} (mean ratio − 1, 95 % interval)",
                    part.configs[base]
                ),
                _ => format!(
                    "% change from {} (mean ratio − 1, 95 % interval; below zero is faster)",
                    part.configs[base]
                ),
            },
            impr_t,
        ),
    ]
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

fn var(x: &[f64]) -> f64 {
    let m = mean(x);
    x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() as f64 - 1.0)
}

/// % improvement of `x`'s mean over `base`'s, with a `level` interval from the delta method
/// (the ratio's variance ≈ r² (s²ₓ/(nₓ x̄²) + s²_b/(n_b b̄²))) and Student's t on
/// nₓ + n_b − 2 degrees of freedom; a point estimate alone with one observation a side.
fn improvement(x: &[f64], base: &[f64], level: f64) -> Option<Improvement> {
    if x.is_empty() || base.is_empty() {
        return None;
    }
    let (mx, mb) = (mean(x), mean(base));
    if mb == 0.0 || !mx.is_finite() || !mb.is_finite() {
        return None;
    }
    let r = mx / mb;
    let pct = (r - 1.0) * 100.0;
    if x.len() < 2 || base.len() < 2 {
        return Some(Improvement {
            pct,
            ci: (f64::NAN, f64::NAN),
        });
    }
    let rel = |v: &[f64], m: f64| var(v) / (v.len() as f64 * m * m);
    let se = r * (rel(x, mx) + rel(base, mb)).sqrt();
    let df = (x.len() + base.len() - 2) as f64;
    let t = statrs::distribution::StudentsT::new(0.0, 1.0, df)
        .map(|d| d.inverse_cdf(0.5 + level / 2.0))
        .unwrap_or(f64::NAN);
    Some(Improvement {
        pct,
        ci: ((r - t * se - 1.0) * 100.0, (r + t * se - 1.0) * 100.0),
    })
}

/// Breusch–Pagan in Koenker's studentized form for a one-way design: N·R² of the squared
/// residuals regressed on the group dummies, χ² with k − 1 degrees of freedom.
fn breusch_pagan(resid: &[f64], label: &[usize], k: usize) -> Option<f64> {
    let n = resid.len();
    if k < 2 || n <= k {
        return None;
    }
    let e2: Vec<f64> = resid.iter().map(|e| e * e).collect();
    let grand = mean(&e2);
    let sst: f64 = e2.iter().map(|v| (v - grand).powi(2)).sum();
    if sst <= 0.0 {
        // Every squared residual equal: no sign of changing variance.
        return Some(1.0);
    }
    let mut ssb = 0.0;
    for j in 0..k {
        let g: Vec<f64> = (0..n).filter(|&i| label[i] == j).map(|i| e2[i]).collect();
        if !g.is_empty() {
            ssb += g.len() as f64 * (mean(&g) - grand).powi(2);
        }
    }
    let lm = n as f64 * ssb / sst;
    let chi = ChiSquared::new((k - 1) as f64).ok()?;
    Some(1.0 - chi.cdf(lm))
}

/// Connecting letters (the thesis's Table 10): groups that share a letter do not differ;
/// groups that share none do. 'a' marks the set holding the highest mean. Each set grows
/// from one group by every group (in order of mean) that differs from none already in it;
/// sets inside others are dropped; a pair that does not differ yet shares no set gets a set
/// of its own, so both rules hold.
pub fn letters(means: &[f64], differ: &dyn Fn(usize, usize) -> bool) -> Vec<String> {
    let k = means.len();
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| means[b].total_cmp(&means[a]));
    let mut sets: Vec<Vec<usize>> = Vec::new();
    for &start in &order {
        let mut s = vec![start];
        for &j in &order {
            if !s.contains(&j) && s.iter().all(|&i| !differ(i, j)) {
                s.push(j);
            }
        }
        s.sort_by_key(|g| order.iter().position(|o| o == g));
        sets.push(s);
    }
    for i in 0..k {
        for j in i + 1..k {
            if !differ(order[i], order[j])
                && !sets
                    .iter()
                    .any(|s| s.contains(&order[i]) && s.contains(&order[j]))
            {
                sets.push(vec![order[i], order[j]]);
            }
        }
    }
    let mut kept: Vec<Vec<usize>> = Vec::new();
    for s in &sets {
        let inside = |t: &Vec<usize>| s.iter().all(|g| t.contains(g));
        if !kept.iter().any(inside) {
            kept.retain(|t| !t.iter().all(|g| s.contains(g)));
            kept.push(s.clone());
        }
    }
    // Letters in the order of each set's best mean.
    kept.sort_by_key(|s| {
        s.iter()
            .map(|g| order.iter().position(|o| o == g).unwrap())
            .min()
    });
    let mut out = vec![String::new(); k];
    for (li, s) in kept.iter().enumerate() {
        let c = letter(li);
        for &g in s {
            out[g].push_str(&c);
        }
    }
    out
}

fn letter(i: usize) -> String {
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    match i < A.len() {
        true => (A[i] as char).to_string(),
        false => format!("{}{}", letter(i / A.len() - 1), letter(i % A.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three groups, B apart: B differs from A and C, which do not differ.
    #[test]
    fn anova_and_tukey_find_the_group_apart() {
        let g = vec![
            vec![23.0, 25.0, 21.0, 24.0],
            vec![30.0, 28.0, 33.0, 31.0],
            vec![22.0, 24.0, 20.0, 23.0],
        ];
        let a = analyse(&g, 0, 0.05);
        let av = a.anova.unwrap();
        assert_eq!(av.df, (2.0, 9.0));
        // SSB = 4·((23.25−25.333)² + (30.5−25.333)² + (22.25−25.333)²) = 162.17,
        // SSW = 8.75 + 13 + 8.75 = 30.5: F = (162.17/2)/(30.5/9) = 23.93.
        assert!((av.f - 23.93).abs() < 0.01, "F = {}", av.f);
        assert!(av.p < 0.001, "p = {}", av.p);
        assert!(a.residuals_hold, "{a:?}");
        assert_eq!(a.letters, vec!["b", "a", "b"]);
        // B over A: 30.5/23.25 − 1 = 31.2 %, its interval above zero.
        let b = a.improvement[1].unwrap();
        assert!((b.pct - 31.18).abs() < 0.01, "{b:?}");
        assert!(b.ci.0 > 15.0 && b.ci.1 < 48.0, "{b:?}");
        assert!(a.improvement[0].is_none());
        let (h, df, p) = a.kruskal.unwrap();
        assert_eq!(df, 2.0);
        assert!(h > 7.0 && p < 0.05, "H = {h}, p = {p}");
    }

    /// Residuals that grow with the group (one group's spread 100 times another's) fail the
    /// constant-variance check, and the groups then come from the rank test's pairs.
    #[test]
    fn unequal_variances_fail_the_check_and_fall_back_to_ranks() {
        let g: Vec<Vec<f64>> = vec![
            (0..10).map(|i| 100.0 + (i as f64 - 4.5) * 0.1).collect(),
            (0..10).map(|i| 100.0 + (i as f64 - 4.5) * 10.0).collect(),
            (0..10).map(|i| 300.0 + (i as f64 - 4.5) * 0.1).collect(),
        ];
        let a = analyse(&g, 0, 0.05);
        assert!(a.breusch_pagan_p.unwrap() < 0.05, "{a:?}");
        assert!(!a.residuals_hold);
        // The third is above both others by ranks.
        assert_eq!(a.letters[2], "a", "{:?}", a.letters);
        assert!(!a.letters[0].contains('a') && !a.letters[1].contains('a'));
    }

    /// Residuals that drift in run order (each group's runs climb) fail independence.
    #[test]
    fn a_drift_in_run_order_fails_independence() {
        let g: Vec<Vec<f64>> = (0..3)
            .map(|j| (0..12).map(|i| 50.0 * j as f64 + i as f64).collect())
            .collect();
        let a = analyse(&g, 0, 0.05);
        let (d, p) = a.durbin_watson.unwrap();
        assert!(d < 1.0 && p < 0.05, "d = {d}, p = {p}");
        assert!(!a.residuals_hold);
    }

    #[test]
    fn configurations_with_under_two_runs_take_no_part_and_one_run_gives_no_interval() {
        let g = vec![
            vec![10.0, 11.0, 9.0],
            vec![],
            vec![20.0, 21.0, 19.0],
            vec![15.0],
        ];
        let a = analyse(&g, 0, 0.05);
        assert_eq!((a.letters[1].as_str(), a.letters[3].as_str()), ("", ""));
        assert_eq!(
            a.anova.unwrap().df,
            (1.0, 4.0),
            "only the groups of two or more"
        );
        assert!(a.improvement[1].is_none());
        assert!((a.improvement[3].unwrap().pct - 50.0).abs() < 1e-9);
        let one = analyse(&[vec![10.0], vec![12.0]], 0, 0.05);
        assert!(one.anova.is_none());
        let i = one.improvement[1].unwrap();
        assert!((i.pct - 20.0).abs() < 1e-9 && i.ci.0.is_nan());
    }

    /// a ~ b, a ~ c, b ≁ c: the pair a, c must share a letter, b and c must not.
    #[test]
    fn letters_connect_every_pair_that_does_not_differ_and_no_other() {
        let means = [3.0, 2.0, 1.0, 0.0];
        let cases: Vec<Vec<(usize, usize)>> = vec![
            vec![(1, 2)],
            vec![],
            vec![(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)],
            vec![(0, 2), (0, 3), (1, 3)],
            vec![(0, 3)],
        ];
        for d in cases {
            let differ = |i: usize, j: usize| d.contains(&(i.min(j), i.max(j)));
            let l = letters(&means, &differ);
            for i in 0..4 {
                for j in i + 1..4 {
                    let share = l[i].chars().any(|c| l[j].contains(c));
                    assert_eq!(share, !differ(i, j), "{d:?}: {l:?} at {i}, {j}");
                }
            }
            assert!(l[0].contains('a'), "{l:?}");
        }
    }

    #[test]
    fn bad_settings_name_what_is_wrong() {
        let c = vec!["TCP".to_string(), "split".to_string()];
        let s = Statistics {
            baseline: Some("tcp".into()),
            alpha: 0.05,
        };
        let e = s.check(&c).unwrap_err();
        assert!(e.contains("'tcp'") && e.contains("TCP, split"), "{e}");
        let s = Statistics {
            baseline: None,
            alpha: 1.5,
        };
        assert!(s.check(&c).unwrap_err().contains("alpha"));
        assert!(Statistics {
            baseline: None,
            alpha: 0.05
        }
        .check(&c[..1])
        .is_err());
    }
}
