//! `satpep lab compare A B`: two results directories side by side (say, the same scenario
//! before and after a change, or on two seeds). Cells are matched by part, configuration and
//! sweep point; each figure is shown in both with the change and whether the two 95 %
//! intervals overlap (if they do, the difference is not shown to be real). One plot per part
//! overlays the main metric of both.

use super::doc::Doc;
use super::plot::{init_font, write_line_plot, Line, LinePlot};
use super::report::Table;
use serde_json::Value;
use std::path::Path;

/// The figures compared, as (results.json key, heading, scale for display).
const FIGURES: [(&str, &str, f64); 4] = [
    ("metric", "main metric", 1.0),
    ("utilization", "% of the limit", 100.0),
    ("queue_p95", "queue p95 (ms)", 1.0),
    ("share", "share beside a competitor (%)", 1.0),
];

/// One results directory, as its results.json has it.
struct Results {
    name: String,
    /// Part titles by index.
    parts: Vec<String>,
    /// The main metric of each part ("Goodput", "Time", …).
    metrics: Vec<String>,
    cells: Vec<Value>,
}

fn load(dir: &Path) -> Result<Results, String> {
    let path = dir.join("results.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (a results directory of `satpep lab run` holds results.json)",
            path.display()
        )
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let sc = &v["scenario"];
    let strings = |x: &Value, key: &str| -> Vec<String> {
        x.as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                if key.is_empty() {
                    p.as_str().unwrap_or("").to_string()
                } else {
                    p[key].as_str().unwrap_or("").to_string()
                }
            })
            .collect()
    };
    Ok(Results {
        name: sc["name"].as_str().unwrap_or("?").to_string(),
        parts: strings(&sc["parts"], "title"),
        metrics: strings(&sc["metrics"], ""),
        cells: v["cells"]
            .as_array()
            .cloned()
            .ok_or_else(|| format!("{}: no cells", path.display()))?,
    })
}

/// A cell's key: part title, configuration, point.
fn key(r: &Results, c: &Value) -> (String, String, String) {
    let part = c["part"].as_u64().unwrap_or(0) as usize;
    let point: Vec<String> = c["point"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p.as_str().unwrap_or("").to_string())
        .collect();
    (
        r.parts.get(part).cloned().unwrap_or_default(),
        c["config"].as_str().unwrap_or("").to_string(),
        point.join(", "),
    )
}

/// (mean, 95 % half-width) of summary `key` of a cell; None without samples.
fn figure(c: &Value, key: &str) -> Option<(f64, f64)> {
    let s = &c[key];
    let n = s["n"].as_u64()?;
    let mean = s["mean"].as_f64()?;
    (n > 0 && mean.is_finite()).then(|| (mean, s["ci95"].as_f64().unwrap_or(0.0)))
}

/// Whether [a ± da] and [b ± db] overlap.
pub fn overlap(a: (f64, f64), b: (f64, f64)) -> bool {
    (a.0 - a.1) <= (b.0 + b.1) && (b.0 - b.1) <= (a.0 + a.1)
}

/// A figure with its interval, in the unit of the main metric (bit/s shown in Mbit/s,
/// seconds as they are).
fn show(v: (f64, f64), scale: f64) -> String {
    let (m, h) = (v.0 * scale, v.1 * scale);
    if h > 0.0 {
        format!("{} ± {}", num(m), num(h))
    } else {
        num(m)
    }
}

fn num(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Compares results directories `a` and `b`, writes compare.md, compare.html, compare.json
/// and plots into `out`, and returns the Markdown.
pub fn compare(a: &Path, b: &Path, out: &Path) -> Result<String, String> {
    let (ra, rb) = (load(a)?, load(b)?);
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut doc = Doc::new(&format!(
        "{} ({}) against {} ({})",
        a.display(),
        ra.name,
        b.display(),
        rb.name
    ));
    doc.para(&format!(
        "A = {}, B = {}. Cells are matched by part, configuration and sweep point; \
         \"overlap\" says whether the two 95 % intervals overlap (yes: the difference is \
         not shown to be real; a cell with one run has no interval). Change is B against A.",
        a.display(),
        b.display()
    ));
    let mut rows = Vec::new();
    let mut json = Vec::new();
    let mut only_a = Vec::new();
    for ca in &ra.cells {
        let k = key(&ra, ca);
        let Some(cb) = rb.cells.iter().find(|cb| key(&rb, cb) == k) else {
            only_a.push(format!("{} / {} / {}", k.0, k.1, k.2));
            continue;
        };
        let part = ca["part"].as_u64().unwrap_or(0) as usize;
        let goodput = ra.metrics.get(part).map(String::as_str) == Some("Goodput");
        for (f, heading, scale) in FIGURES {
            let (Some(x), Some(y)) = (figure(ca, f), figure(cb, f)) else {
                continue;
            };
            let scale = if f == "metric" && goodput {
                1e-6
            } else {
                scale
            };
            let heading = if f == "metric" && goodput {
                "goodput (Mbit/s)"
            } else {
                heading
            };
            let change = if x.0 != 0.0 {
                format!("{:+.1} %", (y.0 / x.0 - 1.0) * 100.0)
            } else {
                "–".into()
            };
            let ov = overlap(x, y);
            rows.push(vec![
                k.0.clone(),
                k.1.clone(),
                k.2.clone(),
                heading.to_string(),
                show(x, scale),
                show(y, scale),
                change,
                if ov { "yes" } else { "no" }.to_string(),
            ]);
            json.push(serde_json::json!({
                "part": k.0, "config": k.1, "point": k.2, "figure": f,
                "a": {"mean": x.0, "ci95": x.1}, "b": {"mean": y.0, "ci95": y.1},
                "overlap": ov,
            }));
        }
    }
    let only_b: Vec<String> = rb
        .cells
        .iter()
        .map(|cb| key(&rb, cb))
        .filter(|k| !ra.cells.iter().any(|ca| &key(&ra, ca) == k))
        .map(|k| format!("{} / {} / {}", k.0, k.1, k.2))
        .collect();
    if rows.is_empty() {
        return Err(format!(
            "no cell of {} matches one of {} (compare results of the same scenario: same parts, configurations and sweep points)",
            a.display(),
            b.display()
        ));
    }
    doc.table(
        2,
        "figures side by side",
        &Table {
            header: [
                "part",
                "configuration",
                "point",
                "figure",
                "A",
                "B",
                "change",
                "overlap",
            ]
            .map(String::from)
            .to_vec(),
            label_cols: 4,
            rows,
        },
    );
    if !only_a.is_empty() || !only_b.is_empty() {
        let mut items: Vec<String> = only_a.iter().map(|c| format!("only in A: {c}")).collect();
        items.extend(only_b.iter().map(|c| format!("only in B: {c}")));
        doc.list(&items);
    }
    // One plot per part: A's and B's main metric per cell, as grouped bars.
    if init_font().is_ok() {
        for (pi, title) in ra.parts.iter().enumerate() {
            let cells: Vec<&Value> = ra
                .cells
                .iter()
                .filter(|c| c["part"].as_u64() == Some(pi as u64))
                .collect();
            let goodput = ra.metrics.get(pi).map(String::as_str) == Some("Goodput");
            let scale = if goodput { 1e-6 } else { 1.0 };
            let mut categories = Vec::new();
            let mut la = Line {
                name: "A".into(),
                ..Default::default()
            };
            let mut lb = Line {
                name: "B".into(),
                ..Default::default()
            };
            for ca in cells {
                let k = key(&ra, ca);
                let Some(cb) = rb.cells.iter().find(|cb| key(&rb, cb) == k) else {
                    continue;
                };
                let (Some(x), Some(y)) = (figure(ca, "metric"), figure(cb, "metric")) else {
                    continue;
                };
                let i = categories.len() as f64;
                categories.push(if k.2.is_empty() {
                    k.1.clone()
                } else {
                    format!("{} {}", k.1, k.2)
                });
                la.points.push((i, x.0 * scale, x.1 * scale));
                lb.points.push((i, y.0 * scale, y.1 * scale));
            }
            if categories.is_empty() {
                continue;
            }
            let p = LinePlot {
                title: format!("{title}: A against B (95 % intervals as error bars)"),
                x_label: "cell".into(),
                y_label: if goodput {
                    "goodput (Mbit/s)".into()
                } else {
                    "main metric".into()
                },
                lines: vec![la, lb],
                categories,
                bars: true,
                ..Default::default()
            };
            let file = format!("compare-{pi}");
            if write_line_plot(&out.join(&file), &p, (1100, 520)).is_ok() {
                let svg =
                    std::fs::read_to_string(out.join(format!("{file}.svg"))).unwrap_or_default();
                doc.figure(&format!("{file}.svg"), &p.title, &svg);
            }
        }
    }
    let w = |name: &str, text: &str| {
        std::fs::write(out.join(name), text).map_err(|e| format!("cannot write {name}: {e}"))
    };
    w(
        "compare.json",
        &serde_json::to_string_pretty(&serde_json::json!({
            "a": a.display().to_string(), "b": b.display().to_string(), "figures": json,
            "only_in_a": only_a, "only_in_b": only_b,
        }))
        .unwrap_or_default(),
    )?;
    let (md, html) = doc.finish();
    w("compare.md", &md)?;
    w("compare.html", &html)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_overlap_or_not() {
        assert!(overlap((10.0, 1.0), (11.5, 1.0)));
        assert!(!overlap((10.0, 1.0), (12.5, 1.0)));
        // One run each: no interval, equal values only.
        assert!(!overlap((10.0, 0.0), (10.5, 0.0)));
        assert!(overlap((10.0, 0.0), (10.0, 0.0)));
    }
}
