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
    /// Draw points without joining lines.
    pub points_only: bool,
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
    let ys = p.lines.iter().flat_map(|l| {
        l.points
            .iter()
            .flat_map(|q| [q.1 - q.2, q.1 + q.2])
            .chain(l.reference.iter().map(|q| q.1))
    });
    let (y0, mut y1) = range(ys, !p.log_y);
    // Headroom for the legend in the upper right corner.
    y1 += (y1 - y0) * 0.04 * (p.lines.len().min(8) as f64 + 1.0);
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
    for (i, l) in p.lines.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = l.points.iter().map(|q| (q.0, q.1)).collect();
        let joined = if p.points_only { vec![] } else { pts.clone() };
        chart
            .draw_series(LineSeries::new(joined, c.stroke_width(2)))
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

/// Writes plots stacked top to bottom, sharing the width, as `base.svg`.
pub fn write_stacked_svg(base: &Path, plots: &[LinePlot], size: (u32, u32)) -> Result<(), String> {
    init_font()?;
    let svg = base.with_extension("svg");
    let area = SVGBackend::new(&svg, size).into_drawing_area();
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
        write_stacked_svg(&base, &[a, b], (600, 600)).unwrap();
        let svg = std::fs::read_to_string(base.with_extension("svg")).unwrap();
        assert!(svg.contains("top") && svg.contains("bottom panel"), "{svg}");
        let _ = std::fs::remove_file(base.with_extension("svg"));
    }
}
