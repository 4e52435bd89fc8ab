//! Dependency-free SVG plots for benchmark reports: line plots (several
//! series, legend, axes with ticks, labels and a title) and CDF plots.
//!
//! ```no_run
//! use dilu_bench::svg::{CdfPlot, LinePlot};
//! // Device-time share over time, one series per tenant.
//! LinePlot::new("Device-time share", "time (s)", "share of device time")
//!     .series("tenant A", &[(0.0, 0.3), (1.0, 0.32), (2.0, 0.29)])
//!     .series("tenant B", &[(0.0, 0.7), (1.0, 0.68), (2.0, 0.71)])
//!     .y_range(0.0, 1.0)
//!     .write("bench/results/share.svg")
//!     .unwrap();
//! // Latency CDF, one series per controller.
//! CdfPlot::new("Sync-to-sync latency", "latency (ms)")
//!     .series("dilu", &[1.2, 1.4, 1.3, 2.0])
//!     .series("static", &[1.1, 3.5, 2.2, 4.0])
//!     .write("bench/results/latency-cdf.svg")
//!     .unwrap();
//! ```
//!
//! Non-finite points are dropped (and non-positive x on a log axis). Lines
//! are clipped to the plot area, so a fixed range may cut a series.

use std::fmt::Write as _;
use std::path::Path;

/// Tableau 10: distinguishable, and readable on white.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
const FONT_PX: f64 = 12.0;
/// Rough advance of one character at `FONT_PX` (sans-serif), for layout.
const CHAR_PX: f64 = 7.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 56.0;
const MARGIN_LEFT: f64 = 78.0;
/// Points kept per CDF series (evenly spaced in rank, ends kept).
pub const CDF_MAX_POINTS: usize = 2000;

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// A line plot. Build it with [`LinePlot::new`] and [`LinePlot::series`],
/// then [`LinePlot::write`] it (or take the text with [`LinePlot::to_svg`]).
pub struct LinePlot {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Series>,
    width: f64,
    height: f64,
    x_range: Option<(f64, f64)>,
    y_range: Option<(f64, f64)>,
    log_x: bool,
    steps: bool,
}

impl LinePlot {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> LinePlot {
        LinePlot {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: Vec::new(),
            width: 760.0,
            height: 440.0,
            x_range: None,
            y_range: None,
            log_x: false,
            steps: false,
        }
    }

    /// Adds a series drawn through `points` in the order given.
    pub fn series(mut self, name: &str, points: &[(f64, f64)]) -> LinePlot {
        self.series.push(Series {
            name: name.into(),
            points: points.to_vec(),
        });
        self
    }

    /// Fixes the x axis to `[min, max]` instead of fitting the data.
    pub fn x_range(mut self, min: f64, max: f64) -> LinePlot {
        assert!(min < max, "x range {min}..{max} is empty");
        self.x_range = Some((min, max));
        self
    }

    /// Fixes the y axis to `[min, max]` instead of fitting the data.
    pub fn y_range(mut self, min: f64, max: f64) -> LinePlot {
        assert!(min < max, "y range {min}..{max} is empty");
        self.y_range = Some((min, max));
        self
    }

    /// A logarithmic x axis (decade ticks); points with x ≤ 0 are dropped.
    pub fn log_x(mut self) -> LinePlot {
        self.log_x = true;
        self
    }

    /// Draws each series as a step function: the value holds until the
    /// next point (CDFs, shares sampled per interval).
    pub fn steps(mut self) -> LinePlot {
        self.steps = true;
        self
    }

    /// Canvas size in pixels (default 760×440).
    pub fn size(mut self, width: u32, height: u32) -> LinePlot {
        self.width = f64::from(width.max(200));
        self.height = f64::from(height.max(150));
        self
    }

    fn kept(&self, &(x, y): &(f64, f64)) -> bool {
        x.is_finite() && y.is_finite() && (!self.log_x || x > 0.0)
    }

    /// The SVG document.
    pub fn to_svg(&self) -> String {
        let points = || {
            self.series
                .iter()
                .flat_map(|s| s.points.iter())
                .filter(|p| self.kept(p))
        };
        let x_axis = match self.x_range {
            Some((lo, hi)) => Axis::fixed(lo, hi, self.log_x),
            None => Axis::fit(points().map(|p| p.0), self.log_x),
        };
        let y_axis = match self.y_range {
            Some((lo, hi)) => Axis::fixed(lo, hi, false),
            None => Axis::fit(points().map(|p| p.1), false),
        };
        let longest_name = self
            .series
            .iter()
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0);
        let legend_width = if self.series.is_empty() {
            0.0
        } else {
            36.0 + CHAR_PX * longest_name as f64
        };
        let area = Area {
            left: MARGIN_LEFT,
            top: MARGIN_TOP,
            right: self.width - 20.0 - legend_width,
            bottom: self.height - MARGIN_BOTTOM,
        };
        let mut svg = String::new();
        let (w, h) = (self.width, self.height);
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="{FONT_PX}">"#
        );
        let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<defs><clipPath id="plot-area"><rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}"/></clipPath></defs>"#,
            area.left,
            area.top,
            area.right - area.left,
            area.bottom - area.top
        );
        let _ = writeln!(
            svg,
            r#"<text class="title" x="{:.2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            w / 2.0,
            escape(&self.title)
        );
        self.draw_axes(&mut svg, &area, &x_axis, &y_axis);
        for (index, series) in self.series.iter().enumerate() {
            let color = PALETTE[index % PALETTE.len()];
            let mapped: Vec<(f64, f64)> = series
                .points
                .iter()
                .filter(|p| self.kept(p))
                .map(|&(x, y)| (area.x(x_axis.fraction(x)), area.y(y_axis.fraction(y))))
                .collect();
            let drawn = if self.steps {
                step_path(&mapped)
            } else {
                mapped.clone()
            };
            let coordinates: Vec<String> = drawn
                .iter()
                .map(|(x, y)| format!("{x:.2},{y:.2}"))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline class="series" data-series="{}" fill="none" stroke="{color}" stroke-width="1.8" stroke-linejoin="round" clip-path="url(#plot-area)" points="{}"/>"#,
                escape(&series.name),
                coordinates.join(" ")
            );
            if let [(x, y)] = mapped.as_slice() {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{x:.2}" cy="{y:.2}" r="3" fill="{color}" clip-path="url(#plot-area)"/>"#
                );
            }
            let legend_x = area.right + 16.0;
            let legend_y = area.top + 8.0 + 18.0 * index as f64;
            let _ = writeln!(
                svg,
                r#"<g class="legend"><line x1="{:.2}" y1="{legend_y:.2}" x2="{:.2}" y2="{legend_y:.2}" stroke="{color}" stroke-width="3"/><text x="{:.2}" y="{:.2}">{}</text></g>"#,
                legend_x,
                legend_x + 18.0,
                legend_x + 24.0,
                legend_y + 4.0,
                escape(&series.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }

    fn draw_axes(&self, svg: &mut String, area: &Area, x_axis: &Axis, y_axis: &Axis) {
        let _ = writeln!(
            svg,
            r##"<rect x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="none" stroke="#333"/>"##,
            area.left,
            area.top,
            area.right - area.left,
            area.bottom - area.top
        );
        for tick in x_axis.ticks() {
            let x = area.x(x_axis.fraction(tick.value));
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.2}" y1="{:.2}" x2="{x:.2}" y2="{:.2}" stroke="#e3e3e3"/><line x1="{x:.2}" y1="{:.2}" x2="{x:.2}" y2="{:.2}" stroke="#333"/><text class="x-tick" x="{x:.2}" y="{:.2}" text-anchor="middle">{}</text>"##,
                area.top,
                area.bottom,
                area.bottom,
                area.bottom + 5.0,
                area.bottom + 19.0,
                escape(&tick.label)
            );
        }
        for tick in y_axis.ticks() {
            let y = area.y(y_axis.fraction(tick.value));
            let _ = writeln!(
                svg,
                r##"<line x1="{:.2}" y1="{y:.2}" x2="{:.2}" y2="{y:.2}" stroke="#e3e3e3"/><line x1="{:.2}" y1="{y:.2}" x2="{:.2}" y2="{y:.2}" stroke="#333"/><text class="y-tick" x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"##,
                area.left,
                area.right,
                area.left - 5.0,
                area.left,
                area.left - 8.0,
                y + 4.0,
                escape(&tick.label)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text class="x-label" x="{:.2}" y="{:.2}" text-anchor="middle">{}</text>"#,
            (area.left + area.right) / 2.0,
            self.height - 14.0,
            escape(&self.x_label)
        );
        let (label_x, label_y) = (18.0, (area.top + area.bottom) / 2.0);
        let _ = writeln!(
            svg,
            r#"<text class="y-label" x="{label_x:.2}" y="{label_y:.2}" text-anchor="middle" transform="rotate(-90 {label_x:.2} {label_y:.2})">{}</text>"#,
            escape(&self.y_label)
        );
    }

    /// Writes the SVG document to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_svg())
    }
}

/// The empirical CDF of `samples`: one point `(value, fraction of samples
/// ≤ value)` per distinct finite value, in increasing order. The last point
/// has fraction 1. Non-finite samples are dropped.
pub fn cdf_points(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let mut points: Vec<(f64, f64)> = Vec::new();
    for (index, &value) in sorted.iter().enumerate() {
        let fraction = (index + 1) as f64 / n;
        match points.last_mut() {
            Some(last) if last.0 == value => last.1 = fraction,
            _ => points.push((value, fraction)),
        }
    }
    points
}

/// At most `max` of `points`, evenly spaced by index, first and last kept.
fn thin(points: Vec<(f64, f64)>, max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max || max < 2 {
        return points;
    }
    let last = points.len() - 1;
    (0..max)
        .map(|i| points[(i * last).div_ceil(max - 1)])
        .collect()
}

/// A CDF plot: one step line per series of raw samples, y from 0 to 1.
pub struct CdfPlot(LinePlot);

impl CdfPlot {
    pub fn new(title: &str, x_label: &str) -> CdfPlot {
        CdfPlot(
            LinePlot::new(title, x_label, "fraction of samples ≤ x")
                .y_range(0.0, 1.0)
                .steps(),
        )
    }

    /// Adds the empirical CDF of `samples` (thinned to [`CDF_MAX_POINTS`]).
    pub fn series(self, name: &str, samples: &[f64]) -> CdfPlot {
        let points = thin(cdf_points(samples), CDF_MAX_POINTS);
        CdfPlot(self.0.series(name, &points))
    }

    /// A logarithmic x axis, for latencies spanning decades.
    pub fn log_x(self) -> CdfPlot {
        CdfPlot(self.0.log_x())
    }

    /// Fixes the x axis to `[min, max]`.
    pub fn x_range(self, min: f64, max: f64) -> CdfPlot {
        CdfPlot(self.0.x_range(min, max))
    }

    pub fn size(self, width: u32, height: u32) -> CdfPlot {
        CdfPlot(self.0.size(width, height))
    }

    pub fn to_svg(&self) -> String {
        self.0.to_svg()
    }

    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        self.0.write(path)
    }
}

/// The plot area in canvas pixels (y grows downwards).
struct Area {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
}

impl Area {
    fn x(&self, fraction: f64) -> f64 {
        self.left + fraction * (self.right - self.left)
    }

    fn y(&self, fraction: f64) -> f64 {
        self.bottom - fraction * (self.bottom - self.top)
    }
}

/// Step-function corners: each point's value holds until the next x.
fn step_path(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(points.len() * 2);
    for (index, &(x, y)) in points.iter().enumerate() {
        if index > 0 {
            out.push((x, out[out.len() - 1].1));
        }
        out.push((x, y));
    }
    out
}

struct Tick {
    value: f64,
    label: String,
}

/// One axis: its range (in data units) and scale.
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Axis {
    fn fixed(lo: f64, hi: f64, log: bool) -> Axis {
        if log {
            assert!(
                lo > 0.0,
                "a logarithmic axis needs a positive range, not {lo}..{hi}"
            );
        }
        Axis { lo, hi, log }
    }

    /// A range that holds every value, widened to round numbers (to whole
    /// decades on a log axis); 0..1 (1..10 on a log axis) when empty.
    fn fit(values: impl Iterator<Item = f64>, log: bool) -> Axis {
        let (min, max) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        if min > max {
            return if log {
                Axis::fixed(1.0, 10.0, true)
            } else {
                Axis::fixed(0.0, 1.0, false)
            };
        }
        if log {
            let lo = round_125(min, false);
            let mut hi = round_125(max, true);
            if hi <= lo {
                hi = round_125(lo * 1.5, true);
            }
            return Axis::fixed(lo, hi, true);
        }
        let (mut lo, mut hi) = (min, max);
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
            lo -= pad;
            hi += pad;
        }
        let step = nice_step(hi - lo);
        Axis::fixed((lo / step).floor() * step, (hi / step).ceil() * step, false)
    }

    /// Where `value` falls, 0 at the low end and 1 at the high end.
    fn fraction(&self, value: f64) -> f64 {
        if self.log {
            (value.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (value - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<Tick> {
        if self.log {
            return self.log_ticks();
        }
        let step = nice_step(self.hi - self.lo);
        let first = (self.lo / step - 1e-9).ceil() as i64;
        let last = (self.hi / step + 1e-9).floor() as i64;
        (first..=last)
            .map(|k| {
                let value = k as f64 * step;
                Tick {
                    value,
                    label: format_number(value, step),
                }
            })
            .collect()
    }

    fn log_ticks(&self) -> Vec<Tick> {
        let first = (self.lo.log10() - 1e-9).ceil() as i32;
        let last = (self.hi.log10() + 1e-9).floor() as i32;
        let multiples: &[f64] = if last - first < 2 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let mut ticks = Vec::new();
        for exponent in (first - 1)..=last {
            for &m in multiples {
                let value = m * 10f64.powi(exponent);
                if value >= self.lo * (1.0 - 1e-9) && value <= self.hi * (1.0 + 1e-9) {
                    ticks.push(Tick {
                        value,
                        label: format_number(value, value),
                    });
                }
            }
        }
        ticks
    }
}

/// `value` (> 0) rounded down, or up, to the nearest 1, 2 or 5 × 10ⁿ.
fn round_125(value: f64, up: bool) -> f64 {
    let magnitude = 10f64.powf(value.log10().floor());
    let mut candidates = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0].map(|m| m * magnitude);
    let tolerance = value * 1e-12;
    if up {
        candidates.into_iter().find(|&c| c >= value - tolerance)
    } else {
        candidates.reverse();
        candidates.into_iter().find(|&c| c <= value + tolerance)
    }
    .expect("the candidates bracket the value")
}

/// A 1, 2 or 5 × 10ⁿ step giving about five intervals over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = span / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let normalised = raw / magnitude;
    let nice = if normalised <= 1.0 {
        1.0
    } else if normalised <= 2.0 {
        2.0
    } else if normalised <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// A tick label: as many decimals as `resolution` needs, exponent form for
/// very large or small magnitudes.
fn format_number(value: f64, resolution: f64) -> String {
    if value == 0.0 || value.abs() < resolution.abs() * 1e-6 {
        return "0".into();
    }
    if value.abs() >= 1e6 || value.abs() < 1e-3 {
        return format!("{value:e}");
    }
    let decimals = (-resolution.abs().log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{value:.decimals$}")
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small XML well-formedness check: balanced, properly nested tags,
    /// quoted attributes, `&` only in the five predefined entities, one root.
    fn well_formed(xml: &str) -> Result<(), String> {
        const ENTITIES: [&str; 5] = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"];
        let check_text = |text: &str| -> Result<(), String> {
            if text.contains('<') {
                return Err(format!("raw < in {text:?}"));
            }
            for (i, _) in text.match_indices('&') {
                if !ENTITIES.iter().any(|e| text[i..].starts_with(e)) {
                    return Err(format!("bare & in {text:?}"));
                }
            }
            Ok(())
        };
        let mut stack: Vec<String> = Vec::new();
        let mut roots = 0;
        let mut rest = xml;
        while let Some(open) = rest.find('<') {
            let text = &rest[..open];
            if stack.is_empty() && !text.trim().is_empty() {
                return Err(format!("text outside the root: {text:?}"));
            }
            check_text(text)?;
            let close = rest[open..].find('>').ok_or("unterminated tag")? + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(top) if top == name.trim() => continue,
                    top => return Err(format!("</{name}> closes {top:?}")),
                }
            }
            let self_closing = tag.ends_with('/');
            let body = tag.trim_end_matches('/');
            let (name, mut attributes) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '-' || c == ':')
            {
                return Err(format!("bad tag name in <{tag}>"));
            }
            loop {
                attributes = attributes.trim_start();
                if attributes.is_empty() {
                    break;
                }
                let (key, after) = attributes
                    .split_once("=\"")
                    .ok_or_else(|| format!("unquoted attribute in <{tag}>"))?;
                if key.is_empty() || key.contains(char::is_whitespace) {
                    return Err(format!("bad attribute {key:?} in <{tag}>"));
                }
                let (value, after) = after
                    .split_once('"')
                    .ok_or_else(|| format!("unterminated attribute in <{tag}>"))?;
                check_text(value)?;
                attributes = after;
            }
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name.to_string());
            }
        }
        if !rest.trim().is_empty() {
            return Err(format!("trailing text {rest:?}"));
        }
        match (stack.is_empty(), roots) {
            (true, 1) => Ok(()),
            (false, _) => Err(format!("unclosed {stack:?}")),
            (_, n) => Err(format!("{n} root elements")),
        }
    }

    fn texts_of_class<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
        let marker = format!(r#"class="{class}""#);
        svg.match_indices(&marker)
            .map(|(i, _)| {
                let after = &svg[i..];
                let start = after.find('>').unwrap() + 1;
                let end = after.find("</text>").unwrap();
                &after[start..end]
            })
            .collect()
    }

    /// The `points` of every series polyline, in canvas pixels.
    fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.lines()
            .filter(|l| l.starts_with(r#"<polyline class="series""#))
            .map(|l| {
                let start = l.find(r#"points=""#).unwrap() + 8;
                l[start..]
                    .split('"')
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .map(|xy| {
                        let (x, y) = xy.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    /// The plot area rectangle (x, y, width, height) from the clip path.
    fn plot_area(svg: &str) -> (f64, f64, f64, f64) {
        let start = svg.find(r#"<clipPath id="plot-area"><rect "#).unwrap();
        let rect = &svg[start..];
        let attribute = |name: &str| -> f64 {
            let key = format!(r#" {name}=""#);
            let at = rect.find(&key).unwrap() + key.len();
            rect[at..].split('"').next().unwrap().parse().unwrap()
        };
        (
            attribute("x"),
            attribute("y"),
            attribute("width"),
            attribute("height"),
        )
    }

    #[test]
    fn the_well_formedness_check_catches_broken_documents() {
        assert!(well_formed(r#"<svg a="1"><g><line/></g></svg>"#).is_ok());
        assert!(well_formed("<svg><g></svg>").is_err());
        assert!(well_formed("<svg></svg><svg></svg>").is_err());
        assert!(well_formed("<svg><text>a & b</text></svg>").is_err());
        assert!(well_formed("<svg><text>a &lt; b</text></svg>").is_ok());
        assert!(well_formed("<svg x=1></svg>").is_err());
        assert!(well_formed(r#"<svg x="<"></svg>"#).is_err());
    }

    #[test]
    fn line_plot_is_well_formed_with_every_series_and_legend() {
        let svg = LinePlot::new("Share <per> tenant & time", "time (s)", "share")
            .series("a", &[(0.0, 0.1), (1.0, 0.4), (2.0, 0.3)])
            .series("b \"quoted\"", &[(0.0, 0.9), (1.0, 0.6)])
            .series("c", &[(0.5, 0.5)])
            .to_svg();
        well_formed(&svg).unwrap();
        assert_eq!(polylines(&svg).len(), 3);
        assert_eq!(svg.matches(r#"<g class="legend">"#).count(), 3);
        assert!(svg.contains(">b &quot;quoted&quot;</text>"));
        assert!(svg.contains("Share &lt;per&gt; tenant &amp; time"));
        assert_eq!(texts_of_class(&svg, "x-label"), ["time (s)"]);
        assert_eq!(texts_of_class(&svg, "y-label"), ["share"]);
        // Series get distinct colours; the one-point series gets a marker.
        assert!(svg.contains(PALETTE[0]) && svg.contains(PALETTE[1]) && svg.contains(PALETTE[2]));
        assert_eq!(svg.matches("<circle").count(), 1);
    }

    #[test]
    fn axes_cover_the_data_with_round_ticks() {
        let svg = LinePlot::new("t", "x", "y")
            .series("s", &[(0.0, 3.0), (7.3, 97.0), (10.0, 50.0)])
            .to_svg();
        let x_ticks = texts_of_class(&svg, "x-tick");
        let y_ticks = texts_of_class(&svg, "y-tick");
        assert_eq!(x_ticks, ["0", "2", "4", "6", "8", "10"]);
        assert_eq!(y_ticks, ["0", "20", "40", "60", "80", "100"]);
        // Every point lies in the plot area; the data's corners map to it.
        let (left, top, width, height) = plot_area(&svg);
        let line = &polylines(&svg)[0];
        for &(x, y) in line {
            assert!(x >= left - 0.01 && x <= left + width + 0.01, "x {x}");
            assert!(y >= top - 0.01 && y <= top + height + 0.01, "y {y}");
        }
        assert!((line[0].0 - left).abs() < 0.01, "x=0 at the left edge");
        assert!(
            (line[2].0 - (left + width)).abs() < 0.01,
            "x=10 at the right edge"
        );
        assert!(
            (line[1].1 - (top + height * 0.03)).abs() < 0.01,
            "y=97 near the top"
        );
    }

    #[test]
    fn fixed_ranges_are_kept_and_decimal_ticks_labelled() {
        let svg = LinePlot::new("t", "x", "y")
            .series("s", &[(0.0, 0.25), (1.0, 0.75)])
            .x_range(0.0, 2.0)
            .y_range(0.0, 1.0)
            .to_svg();
        assert_eq!(
            texts_of_class(&svg, "y-tick"),
            ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]
        );
        assert_eq!(
            texts_of_class(&svg, "x-tick"),
            ["0", "0.5", "1.0", "1.5", "2.0"]
        );
        let (left, _, width, _) = plot_area(&svg);
        let line = &polylines(&svg)[0];
        assert!(
            (line[1].0 - (left + width / 2.0)).abs() < 0.01,
            "x=1 mid-axis"
        );
    }

    #[test]
    fn log_axis_has_decade_ticks_and_drops_non_positive_x() {
        let svg = LinePlot::new("t", "latency (us)", "y")
            .series("s", &[(0.0, 0.0), (1.5, 0.1), (20.0, 0.5), (900.0, 1.0)])
            .log_x()
            .to_svg();
        well_formed(&svg).unwrap();
        assert_eq!(texts_of_class(&svg, "x-tick"), ["1", "10", "100", "1000"]);
        // A narrower span is fitted to 1-2-5 bounds, with 2 and 5 ticks.
        let narrow = LinePlot::new("t", "x", "y")
            .series("s", &[(800.0, 0.0), (10_400.0, 1.0)])
            .log_x()
            .to_svg();
        assert_eq!(
            texts_of_class(&narrow, "x-tick"),
            ["500", "1000", "2000", "5000", "10000", "20000"]
        );
        assert_eq!(
            polylines(&svg)[0].len(),
            3,
            "x=0 cannot be drawn on a log axis"
        );
    }

    #[test]
    fn degenerate_data_gives_finite_coordinates() {
        for plot in [
            LinePlot::new("empty", "x", "y"),
            LinePlot::new("flat", "x", "y").series("s", &[(1.0, 5.0), (1.0, 5.0)]),
            LinePlot::new("nan", "x", "y").series("s", &[(f64::NAN, 1.0), (2.0, f64::INFINITY)]),
            LinePlot::new("zero", "x", "y").series("s", &[(0.0, 0.0)]),
        ] {
            let svg = plot.to_svg();
            well_formed(&svg).unwrap();
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
            assert!(!texts_of_class(&svg, "x-tick").is_empty());
        }
    }

    #[test]
    fn rounding_to_1_2_5() {
        assert_eq!(round_125(800.0, false), 500.0);
        assert_eq!(round_125(800.0, true), 1000.0);
        assert_eq!(round_125(10_400.0, true), 20_000.0);
        assert_eq!(round_125(2.0, false), 2.0);
        assert_eq!(round_125(2.0, true), 2.0);
        assert_eq!(round_125(0.03, true), 0.05);
    }

    #[test]
    fn step_lines_hold_each_value_until_the_next_point() {
        assert_eq!(
            step_path(&[(0.0, 1.0), (2.0, 3.0), (5.0, 4.0)]),
            [(0.0, 1.0), (2.0, 1.0), (2.0, 3.0), (5.0, 3.0), (5.0, 4.0)]
        );
    }

    #[test]
    fn cdf_points_count_samples_at_or_below_each_value() {
        assert_eq!(
            cdf_points(&[3.0, 1.0, 2.0, 2.0, f64::NAN]),
            [(1.0, 0.25), (2.0, 0.75), (3.0, 1.0)]
        );
        assert!(cdf_points(&[]).is_empty());
    }

    #[test]
    fn cdf_plot_thins_large_samples_and_reaches_one() {
        let samples: Vec<f64> = (1..=50_000).map(|i| f64::from(i) * 0.01).collect();
        let svg = CdfPlot::new("latency", "latency (ms)")
            .series("dilu", &samples)
            .series("static", &samples[..10])
            .to_svg();
        well_formed(&svg).unwrap();
        let lines = polylines(&svg);
        assert_eq!(lines.len(), 2);
        // A step line has two corners per point but the first.
        assert_eq!(lines[0].len(), 2 * CDF_MAX_POINTS - 1);
        let (_, top, _, height) = plot_area(&svg);
        for line in &lines {
            assert!(
                (line.last().unwrap().1 - top).abs() < 0.01,
                "ends at fraction 1"
            );
            assert!(line.first().unwrap().1 < top + height, "starts above 0");
            assert!(
                line.windows(2).all(|w| w[1].1 <= w[0].1 + 1e-9),
                "non-decreasing"
            );
        }
        assert_eq!(texts_of_class(&svg, "y-label"), ["fraction of samples ≤ x"]);
    }

    #[test]
    fn thinning_keeps_both_ends() {
        let points: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), 0.0)).collect();
        let thinned = thin(points, 4);
        assert_eq!(thinned.len(), 4);
        assert_eq!(thinned[0].0, 0.0);
        assert_eq!(thinned[3].0, 9.0);
    }

    #[test]
    fn write_puts_the_document_in_the_file() {
        let path = std::env::temp_dir().join(format!("dilu-svg-test-{}.svg", std::process::id()));
        let plot = LinePlot::new("t", "x", "y").series("s", &[(0.0, 1.0), (1.0, 2.0)]);
        plot.write(&path).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(written, plot.to_svg());
    }
}
