//! Plots of a scenario's results with plotters, each as SVG (embedded in the HTML report) and
//! PNG. Text needs a TrueType font; DejaVu Sans (Debian's fonts-dejavu-core) is used.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// Font files tried, in order.
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a font for plot text once; an error names the package to install.
pub fn init_font() -> Result<(), String> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        for f in FONTS {
            if let Ok(b) = std::fs::read(f) {
                let b: &'static [u8] = Box::leak(b.into_boxed_slice());
                return plotters::style::register_font("sans-serif", FontStyle::Normal, b)
                    .map_err(|_| format!("{f} is not a usable font"));
            }
        }
        Err("plots need a TrueType font: apt-get install fonts-dejavu-core".into())
    })
    .clone()
}

/// One line of a plot: points (x, y, ± error) and hollow reference points.
#[derive(Debug, Clone, Default)]
pub struct Line {
    /// Legend text.
    pub name: String,
    /// (x, y, half-width of the error bar).
    pub points: Vec<(f64, f64, f64)>,
    /// Reference figures (x, y), drawn hollow.
    pub reference: Vec<(f64, f64)>,
}

/// A line plot.
#[derive(Debug, Clone, Default)]
pub struct LinePlot {
    /// Caption.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Lines.
    pub lines: Vec<Line>,
    /// X values are log10 of the real ones (labels print 10^x).
    pub log_x: bool,
    /// Y values are log10 of the real ones.
    pub log_y: bool,
    /// Category names at x = 0, 1, … instead of numbers.
    pub categories: Vec<String>,
    /// Grouped bars instead of lines: one group per category, one bar per line (its error
    /// bar on top, its reference as a cross at the bar's centre). For comparisons of cells,
    /// where a line between two categories would mean nothing.
    pub bars: bool,
    /// With `bars`, (line, x, y): the physical limit of that line's bar at x, dashed across
    /// the bar (cells of one category can have different limits: a rate trace's mean over
    /// each run's span).
    pub limits: Vec<(usize, f64, f64)>,
}

/// Where line `i` of `n` sits in its category's group of bars, as an offset from the
/// category's centre, and the bar's width.
fn bar_slot(i: usize, n: usize) -> (f64, f64) {
    let w = 0.8 / n.max(1) as f64;
    (-0.4 + w * (i as f64 + 0.5), w)
}

fn pow_label(v: f64, log: bool) -> String {
    if !log {
        return if v.abs() >= 1e4 || (v != 0.0 && v.abs() < 1e-2) {
            format!("{v:.1e}")
        } else {
            let s = format!("{v:.3}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        };
    }
    let x = 10f64.powf(v);
    if !(1e-3..1e5).contains(&x) {
        return format!("{x:.2e}");
    }
    // Three significant digits, no trailing zeros.
    let digits = (2 - x.log10().floor() as i32).max(0) as usize;
    let s = format!("{x:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn range(vals: impl Iterator<Item = f64>, pad_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in vals.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if pad_zero && lo > 0.0 {
        lo = 0.0;
    }
    if (hi - lo).abs() < 1e-12 {
        return (lo - 0.5, hi + 0.5);
    }
    let pad = (hi - lo) * 0.06;
    (lo - if pad_zero && lo == 0.0 { 0.0 } else { pad }, hi + pad)
}

fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p: &LinePlot,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let xs = p.lines.iter().flat_map(|l| {
        l.points
            .iter()
            .map(|q| q.0)
            .chain(l.reference.iter().map(|q| q.0))
    });
    let (x0, x1) = if p.categories.is_empty() {
        range(xs, false)
    } else {
        (-0.5, p.categories.len() as f64 - 0.5)
    };
    let ys = p
        .lines
        .iter()
        .flat_map(|l| {
            l.points
                .iter()
                .flat_map(|q| [q.1 - q.2, q.1 + q.2])
                .chain(l.reference.iter().map(|q| q.1))
        })
        .chain(p.limits.iter().map(|q| q.2));
    let (y0, mut y1) = range(ys, !p.log_y);
    // Headroom for the legend in the upper right corner.
    let entries = p.lines.len() + usize::from(!p.limits.is_empty());
    y1 += (y1 - y0) * 0.04 * (entries.min(9) as f64 + 1.0);
    let cats = p.categories.clone();
    let (log_x, log_y) = (p.log_x, p.log_y);
    let x_fmt = move |v: &f64| -> String {
        if cats.is_empty() {
            pow_label(*v, log_x)
        } else {
            let r = v.round();
            if (v - r).abs() < 1e-6 && r >= 0.0 && (r as usize) < cats.len() {
                cats[r as usize].clone()
            } else {
                String::new()
            }
        }
    };
    let y_fmt = move |v: &f64| pow_label(*v, log_y);
    let mut chart = ChartBuilder::on(root)
        .caption(&p.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(&p.x_label)
        .y_desc(&p.y_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 13));
    if !p.categories.is_empty() {
        mesh.x_labels(p.categories.len() * 2 + 1);
    }
    mesh.draw().map_err(e)?;
    let lines = if p.bars {
        draw_bars(&mut chart, p, y0).map_err(e)?;
        &[][..]
    } else {
        &p.lines[..]
    };
    for (i, l) in lines.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = l.points.iter().map(|q| (q.0, q.1)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(&l.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled())))
            .map_err(e)?;
        chart
            .draw_series(
                l.points
                    .iter()
                    .filter(|q| q.2 > 0.0)
                    .map(|&(x, y, d)| ErrorBar::new_vertical(x, y - d, y, y + d, c, 8)),
            )
            .map_err(e)?;
        chart
            .draw_series(
                l.reference
                    .iter()
                    .map(|&(x, y)| Cross::new((x, y), 6, c.stroke_width(2))),
            )
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    Ok(())
}

/// The bars of a [`LinePlot`] with `bars` set, from `base` (the axis' bottom) up, and the
/// physical limits; the legend names each configuration and the limit.
fn draw_bars<DB: DrawingBackend>(
    chart: &mut ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    p: &LinePlot,
    base: f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let n = p.lines.len();
    for (i, l) in p.lines.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        let (off, w) = bar_slot(i, n);
        chart
            .draw_series(l.points.iter().map(|&(x, y, _)| {
                let x = x + off;
                Rectangle::new(
                    [(x - w * 0.45, base), (x + w * 0.45, y)],
                    c.mix(0.75).filled(),
                )
            }))?
            .label(&l.name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], c.filled()));
        chart.draw_series(
            l.points
                .iter()
                .filter(|q| q.2 > 0.0)
                .map(|&(x, y, d)| ErrorBar::new_vertical(x + off, y - d, y, y + d, BLACK, 6)),
        )?;
        chart.draw_series(
            l.reference
                .iter()
                .map(|&(x, y)| Cross::new((x + off, y), 6, BLACK.stroke_width(2))),
        )?;
    }
    if !p.limits.is_empty() {
        let dashes = |&(i, x, y): &(usize, f64, f64)| {
            // Three dashes across the bar: plotters 0.3 has no dashed style for a path.
            let (off, w) = bar_slot(i, n);
            let left = x + off - w * 0.5;
            (0..3).map(move |k| {
                let a = left + w * (0.1 + 0.3 * k as f64);
                PathElement::new(vec![(a, y), (a + w * 0.2, y)], BLACK.stroke_width(2))
            })
        };
        chart
            .draw_series(p.limits.iter().flat_map(dashes))?
            .label("physical limit")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(2)));
    }
    Ok(())
}

/// Writes `p` as `base.svg` and `base.png`.
pub fn write_line_plot(base: &Path, p: &LinePlot, size: (u32, u32)) -> Result<(), String> {
    init_font()?;
    let svg = base.with_extension("svg");
    {
        let area = SVGBackend::new(&svg, size).into_drawing_area();
        draw_lines(&area, p)?;
        area.present().map_err(|e| e.to_string())?;
    }
    let png = base.with_extension("png");
    let area = BitMapBackend::new(&png, size).into_drawing_area();
    draw_lines(&area, p)?;
    area.present().map_err(|e| e.to_string())
}

/// Writes plots stacked top to bottom, sharing the width, as `base.svg` and `base.png`.
pub fn write_stacked(base: &Path, plots: &[LinePlot], size: (u32, u32)) -> Result<(), String> {
    init_font()?;
    let svg = base.with_extension("svg");
    draw_stacked(SVGBackend::new(&svg, size).into_drawing_area(), plots)?;
    let png = base.with_extension("png");
    draw_stacked(BitMapBackend::new(&png, size).into_drawing_area(), plots)
}

fn draw_stacked<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    plots: &[LinePlot],
) -> Result<(), String> {
    let panels = area.split_evenly((plots.len().max(1), 1));
    for (a, p) in panels.iter().zip(plots) {
        draw_lines(a, p)?;
    }
    // Written once, when everything is drawn.
    area.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixels of `rgb` within 3 of `c` blended at `alpha` over white.
    fn count(rgb: &[u8], c: (u8, u8, u8), alpha: f64) -> usize {
        let want = [c.0, c.1, c.2].map(|v| alpha * v as f64 + (1.0 - alpha) * 255.0);
        rgb.chunks(3)
            .filter(|p| (0..3).all(|i| (p[i] as f64 - want[i]).abs() <= 3.0))
            .count()
    }

    #[test]
    fn bars_are_as_tall_as_their_values_with_the_limit_across_each_bar() {
        let bars = |n: &str, v: [f64; 3]| Line {
            name: n.into(),
            points: v
                .iter()
                .enumerate()
                .map(|(i, &y)| (i as f64, y, 0.5))
                .collect(),
            reference: vec![],
        };
        let p = LinePlot {
            title: "bars".into(),
            categories: vec!["GEO".into(), "LEO".into(), "T1".into()],
            lines: vec![bars("a", [2.0, 4.0, 6.0]), bars("b", [8.0, 8.0, 8.0])],
            bars: true,
            limits: (0..2)
                .flat_map(|i| (0..3).map(move |x| (i, x as f64, 10.0)))
                .collect(),
            ..Default::default()
        };
        init_font().unwrap();
        let (w, h) = (600u32, 400u32);
        let render = |p: &LinePlot| {
            let mut rgb = vec![0u8; (w * h * 3) as usize];
            {
                let area = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
                draw_lines(&area, p).unwrap();
                area.present().unwrap();
            }
            rgb
        };
        let rgb = render(&p);
        let (a, b) = (
            count(&rgb, Palette99::pick(0).to_rgba().rgb(), 0.75),
            count(&rgb, Palette99::pick(1).to_rgba().rgb(), 0.75),
        );
        // Equal widths: the areas go as the heights, 12 against 24 (less the legend).
        assert!(a > 1000 && b > 1000, "{a} {b}");
        let ratio = b as f64 / a as f64;
        assert!((1.6..2.4).contains(&ratio), "bar areas {a} and {b}");
        // The limit's dashes: black in the plot's left part (the legend is on the right),
        // beyond what the same plot without limits has there (axes, labels).
        let black_left = |rgb: &[u8]| {
            rgb.chunks(3 * w as usize)
                .flat_map(|row| row.chunks(3).take(w as usize * 6 / 10))
                .filter(|p| p.iter().all(|&v| v < 40))
                .count()
        };
        let without = LinePlot {
            limits: vec![],
            ..p.clone()
        };
        let extra = black_left(&rgb) as i64 - black_left(&render(&without)) as i64;
        assert!(
            extra > 100,
            "no dashed limit drawn ({extra} black pixels more)"
        );
        // And both kinds of file are written.
        let base = std::env::temp_dir().join(format!("satpep-bars-{}", std::process::id()));
        write_line_plot(&base, &p, (w, h)).unwrap();
        let png = std::fs::read(base.with_extension("png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let svg = std::fs::read_to_string(base.with_extension("svg")).unwrap();
        assert!(
            svg.contains("physical limit") && svg.contains("<rect"),
            "{svg}"
        );
        let _ = std::fs::remove_file(base.with_extension("png"));
        let _ = std::fs::remove_file(base.with_extension("svg"));
    }

    #[test]
    fn every_plot_kind_draws_its_lines_in_their_colours() {
        init_font().unwrap();
        let (w, h) = (600u32, 400u32);
        let ramp = |n: &str, k: f64| Line {
            name: n.into(),
            points: (1..40).map(|i| (i as f64, k * i as f64, 0.0)).collect(),
            reference: vec![(10.0, k * 12.0)],
        };
        let lines = LinePlot {
            title: "lines".into(),
            lines: vec![ramp("a", 1.0), ramp("b", 2.0)],
            ..Default::default()
        };
        let log = LinePlot {
            title: "log axes".into(),
            log_x: true,
            log_y: true,
            lines: vec![Line {
                name: "a".into(),
                points: (0..8)
                    .map(|i| (i as f64 * 0.5 - 2.0, i as f64 * 0.3, 0.0))
                    .collect(),
                reference: vec![],
            }],
            ..Default::default()
        };
        let samples: Vec<f64> = (0..500).map(|i| ((i * 37) % 101) as f64).collect();
        let cdf = LinePlot {
            title: "cdf".into(),
            y_label: "share of samples ≤ x".into(),
            lines: vec![
                crate::scenario::report::cdf_line("a", &samples),
                crate::scenario::report::cdf_line("b", &samples[..100]),
            ],
            ..Default::default()
        };
        for p in [&lines, &log, &cdf] {
            let mut rgb = vec![0u8; (w * h * 3) as usize];
            {
                let area = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
                draw_lines(&area, p).unwrap();
                area.present().unwrap();
            }
            for (i, l) in p.lines.iter().enumerate() {
                let c = Palette99::pick(i).to_rgba().rgb();
                let n = count(&rgb, c, 1.0);
                assert!(n > 150, "{}: line {} has {n} pixels", p.title, l.name);
            }
        }
        // The CDF's last point is at 1 whatever the count, and it climbs.
        let c = &cdf.lines[1].points;
        assert_eq!(c.last().unwrap().1, 1.0);
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn stacked_panels_are_all_drawn() {
        let line = |n: &str, k: f64| Line {
            name: n.into(),
            points: (0..20).map(|i| (i as f64, k * i as f64, 0.0)).collect(),
            reference: vec![],
        };
        let a = LinePlot {
            title: "top".into(),
            lines: vec![line("a", 1.0)],
            ..Default::default()
        };
        let b = LinePlot {
            title: "bottom panel".into(),
            lines: vec![line("b", 300.0)],
            ..Default::default()
        };
        let base = std::env::temp_dir().join(format!("satpep-plot-{}", std::process::id()));
        write_stacked(&base, &[a, b], (600, 600)).unwrap();
        let svg = std::fs::read_to_string(base.with_extension("svg")).unwrap();
        assert!(svg.contains("top") && svg.contains("bottom panel"), "{svg}");
        let png = std::fs::read(base.with_extension("png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let _ = std::fs::remove_file(base.with_extension("svg"));
        let _ = std::fs::remove_file(base.with_extension("png"));
    }
}
