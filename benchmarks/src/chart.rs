//! SVG charts of `compare`'s results (plotters' SVG backend: no system
//! libraries, no fonts needed at build time).

use std::path::Path;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// One named line or bar colour: `values[i]` belongs to the i-th x label;
/// `None` where the system has no result there.
#[derive(Debug, Clone)]
pub struct Series {
    /// The system's name (legend).
    pub name: String,
    /// One value per x label.
    pub values: Vec<Option<f64>>,
}

const WIDTH: u32 = 900;
const HEIGHT: u32 = 520;

fn colour(index: usize) -> RGBColor {
    const PALETTE: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    PALETTE[index % PALETTE.len()]
}

fn to_io<E: std::fmt::Debug>(err: E) -> std::io::Error {
    std::io::Error::other(format!("drawing a chart: {err:?}"))
}

/// Axis labels: `39,000`, `45`, `1.25`.
fn axis_label(value: &f64) -> String {
    let value = *value;
    if value.abs() >= 100.0 {
        crate::report::rate(value)
    } else if value.abs() >= 10.0 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.2}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn value_range(series: &[Series]) -> Option<(f64, f64)> {
    let values = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .copied()
        .filter(|v| v.is_finite() && *v > 0.0);
    let (mut low, mut high) = (f64::INFINITY, 0.0_f64);
    for value in values {
        low = low.min(value);
        high = high.max(value);
    }
    (high > 0.0).then_some((low, high))
}

/// A line chart: x is categorical (`labels`, evenly spaced), one line per
/// series. The y axis is logarithmic when the values span more than 30×.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    labels: &[String],
    series: &[Series],
) -> std::io::Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(to_io)?;
    let Some((low, high)) = value_range(series) else {
        root.present().map_err(to_io)?;
        return Ok(());
    };
    let last = labels.len().saturating_sub(1).max(1) as f64;
    let x_range = -0.15..last + 0.15;
    let label_of = |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let points = |s: &Series| -> Vec<(f64, f64)> {
        s.values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.filter(|v| *v > 0.0).map(|v| (i as f64, v)))
            .collect()
    };
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_labels(labels.len().max(2))
                .x_label_formatter(&label_of)
                .y_label_formatter(&axis_label)
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(to_io)?;
            for (index, s) in series.iter().enumerate() {
                let colour = colour(index);
                let pts = points(s);
                chart
                    .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
                    .map_err(to_io)?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
                chart
                    .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled())))
                    .map_err(to_io)?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(to_io)?;
        }};
    }
    if high / low > 30.0 {
        let chart = builder
            .build_cartesian_2d(x_range, (low * 0.7..high * 4.0).log_scale())
            .map_err(to_io)?;
        draw!(chart);
    } else {
        let chart = builder
            .build_cartesian_2d(x_range, 0.0..high * 1.5)
            .map_err(to_io)?;
        draw!(chart);
    }
    root.present().map_err(to_io)
}

/// A bar chart: one bar per (label, value), coloured in order like the
/// lines of [`line_chart`].
pub fn bar_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> std::io::Result<()> {
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(to_io)?;
    let high = bars.iter().map(|(_, v)| *v).fold(0.0_f64, f64::max);
    if bars.is_empty() || high <= 0.0 {
        root.present().map_err(to_io)?;
        return Ok(());
    }
    let count = bars.len() as u32;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d((0..count - 1).into_segmented(), 0.0..high * 1.15)
        .map_err(to_io)?;
    let name_of = |v: &SegmentValue<u32>| -> String {
        match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => bars
                .get(*i as usize)
                .map(|(n, _)| n.clone())
                .unwrap_or_default(),
            SegmentValue::Last => String::new(),
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&name_of)
        .y_label_formatter(&axis_label)
        .y_desc(y_label)
        .draw()
        .map_err(to_io)?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .margin(12)
                .style_func(|x, _| match x {
                    SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                        colour(*i as usize).filled()
                    }
                    SegmentValue::Last => BLACK.filled(),
                })
                .data(bars.iter().enumerate().map(|(i, (_, v))| (i as u32, *v))),
        )
        .map_err(to_io)?;
    root.present().map_err(to_io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg() {
        let dir = crate::temp_dir();
        let labels: Vec<String> = ["1", "4", "16"].iter().map(|s| s.to_string()).collect();
        let series = vec![
            Series {
                name: "floor".into(),
                values: vec![Some(8_000.0), Some(20_000.0), Some(39_000.0)],
            },
            Series {
                name: "slow".into(),
                values: vec![Some(100.0), None, Some(300.0)],
            },
        ];
        let line = dir.path().join("line.svg");
        line_chart(&line, "t", "threads", "commits/s", &labels, &series).unwrap();
        let text = std::fs::read_to_string(&line).unwrap();
        assert!(text.starts_with("<svg"), "{}", &text[..40.min(text.len())]);
        assert!(text.contains("floor"));
        let bar = dir.path().join("bar.svg");
        bar_chart(&bar, "t", "tx/s", &[("a".into(), 1.0), ("b".into(), 2.0)]).unwrap();
        assert!(std::fs::read_to_string(&bar).unwrap().contains("<rect"));
    }
}
