//! The simulator's figures, drawn with the `plotters` crate as SVG: line
//! charts with one series per policy (lines, or lines with markers for
//! curves of a few points).

use plotters::prelude::*;

/// One named series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Mark each point (for curves of few points).
    pub markers: bool,
}

/// A series is thinned to at most this many points: the figures show
/// shapes, and a trace of thousands of events would only bloat the file.
const MAX_POINTS: usize = 1500;

const COLOURS: [RGBColor; 7] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// An 820×440 SVG chart of `series` with a title and axis labels; axes
/// span the data (with a little margin).
pub fn line_chart_svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let mut svg = String::new();
    if let Err(error) = draw(&mut svg, title, x_label, y_label, series) {
        // Drawing into a string only fails on impossible ranges; say so in
        // the figure rather than panic in a report.
        svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"820\" height=\"40\"><text x=\"10\" y=\"20\">plot failed: {}</text></svg>\n",
            escape(&error)
        );
    }
    svg
}

fn draw(
    svg: &mut String,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), String> {
    let finite = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite();
    let all = series
        .iter()
        .flat_map(|s| s.points.iter().filter(|p| finite(p)));
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in all {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if !x_min.is_finite() {
        (x_min, x_max, y_min, y_max) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad = |low: f64, high: f64| {
        let span = (high - low).abs().max(1e-9);
        (low - 0.04 * span, high + 0.04 * span)
    };
    let (x_low, x_high) = pad(x_min, x_max);
    let (y_low, y_high) = pad(y_min, y_max);
    let root = SVGBackend::with_string(svg, (820, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_low..x_high, y_low..y_high)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(text)?;
    for (index, one) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let stride = one.points.len().div_ceil(MAX_POINTS).max(1);
        let points: Vec<(f64, f64)> = one
            .points
            .iter()
            .copied()
            .filter(|p| finite(p))
            .step_by(stride)
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(text)?
            .label(one.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
        if one.markers {
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|&point| Circle::new(point, 3, colour.filled())),
                )
                .map_err(text)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(emptiest_corner(series, (x_low, x_high), (y_low, y_high)))
        .draw()
        .map_err(text)?;
    root.present().map_err(text)?;
    Ok(())
}

/// The corner of the plot with the fewest points (the legend goes there).
fn emptiest_corner(series: &[Series], x: (f64, f64), y: (f64, f64)) -> SeriesLabelPosition {
    let mut counts = [0usize; 4]; // upper left, upper right, lower left, lower right
    for &(px, py) in series.iter().flat_map(|one| &one.points) {
        let fx = (px - x.0) / (x.1 - x.0).max(1e-12);
        let fy = (py - y.0) / (y.1 - y.0).max(1e-12);
        let left = fx < 0.35;
        let right = fx > 0.65;
        let upper = fy > 0.6;
        let lower = fy < 0.4;
        counts[0] += usize::from(upper && left);
        counts[1] += usize::from(upper && right);
        counts[2] += usize::from(lower && left);
        counts[3] += usize::from(lower && right);
    }
    let best = (0..4).min_by_key(|&corner| counts[corner]).unwrap_or(0);
    [
        SeriesLabelPosition::UpperLeft,
        SeriesLabelPosition::UpperRight,
        SeriesLabelPosition::LowerLeft,
        SeriesLabelPosition::LowerRight,
    ][best]
        .clone()
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_a_line_and_a_legend_entry_per_series_and_escapes_titles() {
        let series = vec![
            Series {
                name: "dilu".into(),
                points: vec![(0.0, 1.0), (1.0, 3.0), (2.0, f64::NAN)],
                markers: true,
            },
            Series {
                name: "fgd".into(),
                points: vec![(0.0, 2.0), (1.0, 2.5)],
                markers: false,
            },
        ];
        let svg = line_chart_svg("a<b", "x", "y", &series);
        assert!(svg.contains("a&lt;b"), "{svg}");
        assert!(svg.contains("\ndilu\n") && svg.contains("\nfgd\n"), "{svg}");
        assert!(svg.matches("<polyline").count() >= 2, "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
