//! Presentation of simulator results: a markdown table and a hand-written SVG
//! line plot of active GPUs over time, one line per policy.

use std::fmt::Write;

use super::SimulationResult;

/// Markdown table, one row per policy, in the order given.
pub fn markdown_table(results: &[SimulationResult]) -> String {
    let mut table = String::from(
        "| policy | GPU-hours | vs dilu-paper | peak GPUs | SM frag | mem frag | SLO risk (mean Σlim−1) | GPUs at risk | place p50 µs | place p99 µs | rejected | moved | restarts |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let paper_hours = results
        .iter()
        .find(|result| result.policy == "dilu-paper")
        .map(|result| result.gpu_hours);
    for result in results {
        let relative = match paper_hours {
            Some(hours) if hours > 0.0 => {
                format!("{:+.1}%", 100.0 * (result.gpu_hours / hours - 1.0))
            }
            _ => "n/a".to_string(),
        };
        let _ = writeln!(
            table,
            "| {} | {:.1} | {} | {} | {:.3} | {:.3} | {:.4} | {:.1}% | {:.1} | {:.1} | {} | {} | {} |",
            result.policy,
            result.gpu_hours,
            relative,
            result.peak_active_gpus,
            result.mean_sm_fragmentation,
            result.mean_memory_fragmentation,
            result.mean_limit_excess,
            100.0 * result.share_gpus_at_risk,
            result.placement_p50_us,
            result.placement_p99_us,
            result.rejected,
            result.moved,
            result.restarts,
        );
    }
    table
}

/// Markdown summary of one policy set replayed on several traces: each inner
/// slice holds the results of one trace (same policies in the same order).
/// Every policy is compared with `dilu-paper` on the same trace; a trace
/// counts as a win when the policy uses fewer GPU-hours at no more SLO risk.
/// Means carry ± half the width of a normal 95% confidence interval
/// (1.96 standard errors over the traces); the last column is the
/// correlation of the two per-trace differences (near −1 when traces only
/// move the policy along the GPU-hours/risk trade-off).
pub fn sweep_table(runs: &[Vec<SimulationResult>]) -> String {
    let mut table = String::from(
        "| policy | traces | mean GPU-hours vs dilu-paper (±95%) | worst | mean SLO risk − dilu-paper's (±95%) | fewer GPU-hours | fewer GPU-hours at ≤ risk | moved per trace | restarts per trace | corr(ΔGPU-hours, Δrisk) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let Some(first) = runs.first() else {
        return table;
    };
    for (column, result) in first.iter().enumerate() {
        let mut relative = Vec::new();
        let mut risk_deltas = Vec::new();
        let (mut fewer, mut wins, mut moved, mut restarts) = (0, 0, 0, 0);
        for run in runs {
            let Some(paper) = run.iter().find(|result| result.policy == "dilu-paper") else {
                continue;
            };
            let Some(ours) = run.get(column).filter(|ours| ours.policy == result.policy) else {
                continue;
            };
            let change = 100.0 * (ours.gpu_hours / paper.gpu_hours.max(f64::MIN_POSITIVE) - 1.0);
            let risk = ours.mean_limit_excess - paper.mean_limit_excess;
            relative.push(change);
            risk_deltas.push(risk);
            moved += ours.moved;
            restarts += ours.restarts;
            if ours.gpu_hours < paper.gpu_hours {
                fewer += 1;
                if risk <= 0.0 {
                    wins += 1;
                }
            }
        }
        let traces = relative.len();
        let (mean, mean_error) = mean_and_ci95(&relative);
        let (risk_mean, risk_error) = mean_and_ci95(&risk_deltas);
        let correlation = correlation(&relative, &risk_deltas)
            .map_or_else(|| "n/a".to_string(), |value| format!("{value:+.2}"));
        let worst = relative.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            table,
            "| {} | {traces} | {mean:+.2}% ± {mean_error:.2} | {worst:+.2}% | {risk_mean:+.4} ± {risk_error:.4} | {fewer}/{traces} | {wins}/{traces} | {:.1} | {:.1} | {correlation} |",
            result.policy,
            moved as f64 / traces.max(1) as f64,
            restarts as f64 / traces.max(1) as f64,
        );
    }
    table
}

/// Mean of `values` and 1.96 standard errors (0 with fewer than two).
fn mean_and_ci95(values: &[f64]) -> (f64, f64) {
    let count = values.len() as f64;
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / count;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let variance = values
        .iter()
        .map(|value| (value - mean).powi(2))
        .sum::<f64>()
        / (count - 1.0);
    (mean, 1.96 * (variance / count).sqrt())
}

/// Pearson correlation of two equally long series; `None` when either is
/// constant or there are fewer than two values.
fn correlation(first: &[f64], second: &[f64]) -> Option<f64> {
    if first.len() != second.len() || first.len() < 2 {
        return None;
    }
    let count = first.len() as f64;
    let mean_first = first.iter().sum::<f64>() / count;
    let mean_second = second.iter().sum::<f64>() / count;
    let (mut covariance, mut spread_first, mut spread_second) = (0.0, 0.0, 0.0);
    for (a, b) in first.iter().zip(second) {
        covariance += (a - mean_first) * (b - mean_second);
        spread_first += (a - mean_first).powi(2);
        spread_second += (b - mean_second).powi(2);
    }
    let scale = (spread_first * spread_second).sqrt();
    (scale > 0.0).then(|| covariance / scale)
}

const COLOURS: [&str; 6] = [
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#7f7f7f", "#9467bd",
];
const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 400.0;
const MARGIN: f64 = 50.0;
const MAX_POINTS: usize = 800;

/// SVG plot of active GPUs (y) against hours (x), one polyline per policy.
pub fn active_gpus_svg(title: &str, results: &[SimulationResult]) -> String {
    let end_time = results
        .iter()
        .filter_map(|result| result.timeline.last().map(|point| point.0))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let start_time = results
        .iter()
        .filter_map(|result| result.timeline.first().map(|point| point.0))
        .fold(end_time, f64::min);
    let peak = results
        .iter()
        .map(|result| result.peak_active_gpus)
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let span = (end_time - start_time).max(1.0);
    let x_of = |time: f64| MARGIN + (time - start_time) / span * (WIDTH - 2.0 * MARGIN);
    let y_of = |gpus: f64| HEIGHT - MARGIN - gpus / peak * (HEIGHT - 2.0 * MARGIN);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{MARGIN}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{0}" stroke="black"/>"#,
        HEIGHT - MARGIN,
        WIDTH - MARGIN
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">hours ({:.1} h shown)</text>"#,
        WIDTH / 2.0,
        HEIGHT - 15.0,
        span / 3600.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="15" y="{}" transform="rotate(-90 15 {})" text-anchor="middle">active GPUs (peak {})</text>"#,
        HEIGHT / 2.0,
        HEIGHT / 2.0,
        peak as usize
    );
    for (index, result) in results.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let stride = result.timeline.len().div_ceil(MAX_POINTS).max(1);
        let mut points = String::new();
        for (time, active) in result.timeline.iter().step_by(stride) {
            let _ = write!(points, "{:.1},{:.1} ", x_of(*time), y_of(*active as f64));
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            points.trim_end()
        );
        let legend_y = MARGIN + 15.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{legend_y}" fill="{colour}">{}</text>"#,
            WIDTH - MARGIN - 120.0,
            escape(&result.policy)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(policy: &str, hours: f64) -> SimulationResult {
        SimulationResult {
            policy: policy.into(),
            gpu_hours: hours,
            peak_active_gpus: 4,
            mean_sm_fragmentation: 0.1,
            mean_memory_fragmentation: 0.2,
            mean_limit_excess: 0.0,
            share_gpus_at_risk: 0.0,
            placement_p50_us: 1.0,
            placement_p99_us: 2.0,
            placed: 10,
            rejected: 0,
            moved: 0,
            restarts: 0,
            timeline: vec![(0.0, 1), (3600.0, 4), (7200.0, 0)],
        }
    }

    #[test]
    fn table_compares_with_dilu_paper() {
        let table = markdown_table(&[result("dilu", 90.0), result("dilu-paper", 100.0)]);
        assert!(table.contains("| dilu | 90.0 | -10.0% |"), "{table}");
        assert!(table.contains("| dilu-paper | 100.0 | +0.0% |"), "{table}");
    }

    #[test]
    fn sweep_counts_wins_against_dilu_paper() {
        let mut cheaper_riskier = result("dilu", 90.0);
        cheaper_riskier.mean_limit_excess = 0.1;
        cheaper_riskier.moved = 6;
        cheaper_riskier.restarts = 3;
        let runs = vec![
            vec![result("dilu", 90.0), result("dilu-paper", 100.0)],
            vec![cheaper_riskier, result("dilu-paper", 100.0)],
            vec![result("dilu", 110.0), result("dilu-paper", 100.0)],
        ];
        let table = sweep_table(&runs);
        assert!(
            table.contains(
                "| dilu | 3 | -3.33% ± 13.07 | +10.00% | +0.0333 ± 0.0653 | 2/3 | 1/3 | 2.0 | 1.0 |"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "| dilu-paper | 3 | +0.00% ± 0.00 | +0.00% | +0.0000 ± 0.0000 | 0/3 | 0/3 | 0.0 | 0.0 |"
            ),
            "{table}"
        );
    }

    #[test]
    fn svg_has_one_line_per_policy_and_escapes_titles() {
        let svg = active_gpus_svg("a<b", &[result("dilu", 1.0), result("exclusive", 2.0)]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a&lt;b"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
