//! SVG plots of the measurements (`--plot DIR`): latency CDFs per transport, throughput against caller
//! threads, and the accounting of a call as stacked bars.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::accounting::Account;

/// A named series of points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn file(dir: &Path, name: &str) -> crate::Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir.join(name))
}

fn err(e: impl std::fmt::Display) -> String {
    format!("drawing a plot: {e}")
}

/// Line chart of several series, written to `dir/name`.
pub fn lines(dir: &Path, name: &str, chart: &Chart<'_>, series: &[Series]) -> crate::Result<PathBuf> {
    let path = file(dir, name)?;
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max, mut y_min) = (0f64, 0f64, f64::MAX);
    for &(x, y) in all {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
        if y > 0.0 {
            y_min = y_min.min(y);
        }
    }
    let x = 0f64..(x_max * 1.05).max(1e-9);
    let root = SVGBackend::new(&path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    if chart.log_y {
        let y_min = if y_min == f64::MAX { 1.0 } else { y_min / 2.0 };
        draw(&root, chart, x, (y_min..(y_max * 2.0).max(y_min * 10.0)).log_scale(), series)?;
    } else {
        draw(&root, chart, x, 0f64..(y_max * 1.05).max(1e-9), series)?;
    }
    root.present().map_err(err)?;
    drop(root);
    Ok(path)
}

/// What a line chart shows.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    /// A logarithmic y axis (for series of different magnitudes).
    pub log_y: bool,
    pub legend: SeriesLabelPosition,
}

fn draw<Y>(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    c: &Chart<'_>,
    x: std::ops::Range<f64>,
    y: Y,
    series: &[Series],
) -> crate::Result<()>
where
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(c.title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart.configure_mesh().x_desc(c.x_desc).y_desc(c.y_desc).draw().map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(c.legend.clone())
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The accountings as stacked horizontal bars (one per transport, waiting and procedure), written to
/// `dir/breakdown.svg`: client before sending, wire out, server, wire back, client after arrival,
/// and what the steps leave unexplained.
pub fn breakdown(dir: &Path, accounts: &[Account]) -> crate::Result<PathBuf> {
    let path = file(dir, "breakdown.svg")?;
    let parts = [
        "client: stub to send",
        "wire and kernel, out",
        "server",
        "wire and kernel, back",
        "client: arrival to return",
        "unexplained (measured − sum)",
    ];
    let bars: Vec<(String, [f64; 6])> = accounts
        .iter()
        .map(|a| {
            let mut v = [0.0; 6];
            let mut part = 0;
            for l in a.lines.iter().filter(|l| !l.overlapped) {
                part = match (l.side, part) {
                    ("wire", 0) => 1,
                    ("server", _) => 2,
                    ("wire", _) => 3,
                    ("client", p) if p >= 2 => 4,
                    (_, p) => p,
                };
                v[part] += l.mean_us;
            }
            v[5] = a.gap_us.max(0.0);
            (format!("{} {} {}", a.transport, a.waiting, a.procedure), v)
        })
        .collect();
    // Room on the right for the legend.
    let x_max = 1.5 * bars.iter().map(|(_, v)| v.iter().sum::<f64>()).fold(0.0, f64::max).max(a_little(accounts));
    let n = bars.len().max(1);
    let root = SVGBackend::new(&path, (1000, 120 + 45 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Where the time of a call goes (tiercel explain), mean µs", ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..x_max, (0..n).into_segmented())
        .map_err(err)?;
    let labels: Vec<String> = bars.iter().map(|(l, _)| l.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("µs (bars are on one scale: spinning shared memory is the thin ones)")
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(err)?;
    for (k, part) in parts.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let rects = bars.iter().enumerate().map(|(i, (_, v))| {
            let start: f64 = v[..k].iter().sum();
            Rectangle::new(
                [(start, SegmentValue::Exact(i)), (start + v[k], SegmentValue::Exact(i + 1))],
                color.filled(),
            )
        });
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(*part)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    drop(chart);
    drop(root);
    Ok(path)
}

fn a_little(accounts: &[Account]) -> f64 {
    accounts.iter().map(|a| a.measured_us).fold(1e-3, f64::max)
}
