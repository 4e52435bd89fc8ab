//! Presentation of simulator results: markdown tables and an SVG line plot
//! of active GPUs over time, one line per policy (drawn by `plot`, with
//! `plotters`).

use std::fmt::Write;

use super::SimulationResult;
use super::inflation::InflationResult;
use super::plot::{Series, line_chart_svg};

/// Markdown table, one row per policy, in the order given.
pub fn markdown_table(results: &[SimulationResult]) -> String {
    let mut table = String::from(
        "| policy | GPU-hours | vs dilu-paper | peak GPUs | SM frag | mem frag | SLO risk (mean Σlim−1) | GPUs at risk | place p50 µs | place p99 µs | waited | wait h | never placed | moved | restarts |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
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
            "| {} | {:.1} | {} | {} | {:.3} | {:.3} | {:.4} | {:.1}% | {:.1} | {:.1} | {} | {:.1} | {} | {} | {} |",
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
            result.waited,
            result.wait_hours,
            result.rejected,
            result.moved,
            result.restarts,
        );
    }
    table
}

/// Markdown table of FGD's protocol: per policy, the share of GPU capacity
/// allocated at each requested share, then pods dropped (and of them pods
/// without GPUs), the mean limit excess on used GPUs at the end, and
/// placement latency.
pub fn inflation_table(results: &[InflationResult]) -> String {
    let Some(first) = results.first() else {
        return String::new();
    };
    let mut table = String::from("| policy |");
    for point in &first.points {
        let _ = write!(table, " {:.0}% |", 100.0 * point.requested);
    }
    table.push_str(
        " dropped | of them without GPUs | end Σlim−1 | place p50 µs | place p99 µs |\n|---|",
    );
    table.push_str(&"---:|".repeat(first.points.len() + 5));
    table.push('\n');
    for result in results {
        let _ = write!(table, "| {} |", result.policy);
        for point in &result.points {
            let _ = write!(table, " {:.2}% |", 100.0 * point.allocated);
        }
        let _ = writeln!(
            table,
            " {} | {} | {:.4} | {:.1} | {:.1} |",
            result.dropped,
            result.dropped_without_gpus,
            result.final_limit_excess,
            result.placement_p50_us,
            result.placement_p99_us
        );
    }
    table
}

/// What the cluster drew over a replay, per policy (mean kW, by
/// `crate::model::power`), and against `fgd`'s where it ran.
pub fn replay_power_table(results: &[SimulationResult]) -> String {
    let fgd = results
        .iter()
        .find(|result| result.policy == "fgd")
        .map(|result| result.mean_watts);
    let mut table = String::from("| policy | mean kW drawn | vs fgd |\n|---|---:|---:|\n");
    for result in results {
        let relative = match fgd {
            Some(watts) if watts > 0.0 => {
                format!("{:+.1}%", 100.0 * (result.mean_watts / watts - 1.0))
            }
            _ => "n/a".to_string(),
        };
        let _ = writeln!(
            table,
            "| {} | {:.1} | {relative} |",
            result.policy,
            result.mean_watts / 1000.0
        );
    }
    table
}

/// What the cluster draws at each reading of FGD's protocol, per policy, in
/// kW (`crate::model::power`: PWR's model of idle and full watts per GPU
/// and CPU socket).
pub fn inflation_power_table(results: &[InflationResult]) -> String {
    let Some(first) = results.first() else {
        return String::new();
    };
    let mut table = String::from("| policy (kW drawn) |");
    for point in &first.points {
        let _ = write!(table, " {:.0}% |", 100.0 * point.requested);
    }
    table.push_str("\n|---|");
    table.push_str(&"---:|".repeat(first.points.len()));
    table.push('\n');
    for result in results {
        let _ = write!(table, "| {} |", result.policy);
        for point in &result.points {
            let _ = write!(table, " {:.1} |", point.watts / 1000.0);
        }
        table.push('\n');
    }
    table
}

/// Mean, sample standard deviation, smallest and largest of `values`.
pub fn spread(values: &[f64]) -> (f64, f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let count = values.len() as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = if values.len() > 1 {
        values
            .iter()
            .map(|value| (value - mean).powi(2))
            .sum::<f64>()
            / (count - 1.0)
    } else {
        0.0
    };
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, variance.sqrt(), low, high)
}

/// A paired difference judged against its noise: "ahead" or "behind" when
/// the mean is more than `two_errors` (two standard errors) from zero,
/// else "tie".
pub fn verdict(mean: f64, two_errors: f64) -> &'static str {
    if mean - two_errors > 0.0 {
        "ahead"
    } else if mean + two_errors < 0.0 {
        "behind"
    } else {
        "tie"
    }
}

/// Paired differences `first − other` in points: mean, sd, smallest,
/// largest, two standard errors, and how many are ≥ 0.
pub fn paired_difference(first: &[f64], other: &[f64]) -> (f64, f64, f64, f64, f64, usize) {
    let differences: Vec<f64> = first
        .iter()
        .zip(other)
        .map(|(first, other)| 100.0 * (first - other))
        .collect();
    let (mean, sd, low, high) = spread(&differences);
    let two_errors = 2.0 * sd / (differences.len().max(1) as f64).sqrt();
    let at_least = differences.iter().filter(|value| **value >= 0.0).count();
    (mean, sd, low, high, two_errors, at_least)
}

/// Allocated share of `result` when the requests crossed `requested`.
pub fn allocated_at(result: &InflationResult, requested: f64) -> Option<f64> {
    result
        .points
        .iter()
        .find(|point| (point.requested - requested).abs() < 1e-9)
        .map(|point| point.allocated)
}

/// FGD's protocol seed by seed, for `policies` at each of `shares`
/// requested: one row per seed (`first_seed` on), then the mean and
/// standard deviation over seeds, then for every policy after the first
/// the first's difference from it, paired by seed (the same drawn pods),
/// in points: mean ± sd, range, and on how many seeds the first allocated
/// at least as much. The draws are the noise; a mean difference within
/// two standard errors of zero is a tie.
pub fn protocol_seed_table(
    per_seed: &[Vec<InflationResult>],
    first_seed: u64,
    policies: &[&str],
    shares: &[f64],
) -> String {
    let pick = |run: &[InflationResult], name: &str, share: f64| {
        run.iter()
            .find(|result| result.policy == name)
            .and_then(|result| allocated_at(result, share))
    };
    let mut table = String::from("| seed |");
    for name in policies {
        for share in shares {
            let _ = write!(table, " {name} at {:.0}% |", 100.0 * share);
        }
    }
    table.push_str("\n|---:|");
    table.push_str(&"---:|".repeat(policies.len() * shares.len()));
    table.push('\n');
    for (seed, run) in (first_seed..).zip(per_seed) {
        let _ = write!(table, "| {seed} |");
        for name in policies {
            for &share in shares {
                match pick(run, name, share) {
                    Some(value) => {
                        let _ = write!(table, " {:.2}% |", 100.0 * value);
                    }
                    None => table.push_str(" n/a |"),
                }
            }
        }
        table.push('\n');
    }
    table.push_str("| mean ± sd |");
    for name in policies {
        for &share in shares {
            let values: Vec<f64> = per_seed
                .iter()
                .filter_map(|run| pick(run, name, share))
                .collect();
            let (mean, sd, _, _) = spread(&values);
            let _ = write!(table, " {:.2}% ± {:.2} |", 100.0 * mean, 100.0 * sd);
        }
    }
    table.push('\n');
    let Some((first, others)) = policies.split_first() else {
        return table;
    };
    let _ = writeln!(
        table,
        "\n| paired by seed | at | mean difference (points) ± sd | range | ± 2 standard errors | {first} ≥ other on | verdict |\n\
         |---|---:|---:|---:|---:|---:|---|"
    );
    for other in others {
        for &share in shares {
            let (firsts, others): (Vec<f64>, Vec<f64>) = per_seed
                .iter()
                .filter_map(|run| Some((pick(run, first, share)?, pick(run, other, share)?)))
                .unzip();
            let (mean, sd, low, high, two_errors, at_least) = paired_difference(&firsts, &others);
            let _ = writeln!(
                table,
                "| {first} − {other} | {:.0}% | {mean:+.3} ± {sd:.3} | [{low:+.3}, {high:+.3}] | ±{two_errors:.3} | {at_least} of {} | {} |",
                100.0 * share,
                firsts.len(),
                verdict(mean, two_errors)
            );
        }
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

/// SVG plot of active GPUs (y) against hours since the first event (x),
/// one line per policy.
pub fn active_gpus_svg(title: &str, results: &[SimulationResult]) -> String {
    let start = results
        .iter()
        .filter_map(|result| result.timeline.first().map(|point| point.0))
        .fold(f64::INFINITY, f64::min);
    let series: Vec<Series> = results
        .iter()
        .map(|result| Series {
            name: result.policy.clone(),
            points: result
                .timeline
                .iter()
                .map(|(time, active)| ((time - start) / 3600.0, *active as f64))
                .collect(),
            markers: false,
        })
        .collect();
    line_chart_svg(title, "hours", "active GPUs", &series)
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
            mean_watts: 1000.0 * hours,
            placement_p50_us: 1.0,
            placement_p99_us: 2.0,
            placed: 10,
            rejected: 0,
            waited: 0,
            wait_hours: 0.0,
            max_wait_s: 0.0,
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
        assert!(svg.matches("<polyline").count() >= 2);
        assert!(svg.contains("a&lt;b"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    fn protocol_run(policy: &str, at_100: f64) -> InflationResult {
        InflationResult {
            policy: policy.into(),
            points: vec![super::super::inflation::InflationPoint {
                requested: 1.0,
                allocated: at_100,
                watts: 2_000.0 * at_100,
            }],
            placed: 0,
            dropped: 0,
            dropped_without_gpus: 0,
            final_limit_excess: 0.0,
            placement_p50_us: 0.0,
            placement_p99_us: 0.0,
        }
    }

    #[test]
    fn spread_is_mean_sample_sd_and_range() {
        let (mean, sd, low, high) = spread(&[1.0, 2.0, 3.0]);
        assert!((mean - 2.0).abs() < 1e-12 && (sd - 1.0).abs() < 1e-12);
        assert_eq!((low, high), (1.0, 3.0));
        assert_eq!(spread(&[]), (0.0, 0.0, 0.0, 0.0));
    }

    #[test]
    fn protocol_differences_are_paired_by_seed() {
        // dilu is ahead by 0.1 point on seed 1, behind by 0.1 on seed 2:
        // a mean of zero, at least as much on one seed of two.
        let per_seed = vec![
            vec![protocol_run("dilu", 0.951), protocol_run("fgd", 0.950)],
            vec![protocol_run("dilu", 0.939), protocol_run("fgd", 0.940)],
        ];
        let table = protocol_seed_table(&per_seed, 7, &["dilu", "fgd"], &[1.0]);
        assert!(table.contains("| 7 | 95.10% | 95.00% |"), "{table}");
        assert!(table.contains("| 8 | 93.90% | 94.00% |"), "{table}");
        assert!(
            table.contains("| dilu − fgd | 100% | +0.000 ± 0.141 |"),
            "{table}"
        );
        assert!(table.contains("| 1 of 2 | tie |"), "{table}");
        assert_eq!(verdict(0.3, 0.2), "ahead");
        assert_eq!(verdict(-0.3, 0.2), "behind");
        assert_eq!(verdict(0.1, 0.2), "tie");
    }

    #[test]
    fn power_tables_give_kw_and_each_draw_against_fgds() {
        let table = replay_power_table(&[result("dilu", 90.0), result("fgd", 100.0)]);
        assert!(table.contains("| dilu | 90.0 | -10.0% |"), "{table}");
        assert!(table.contains("| fgd | 100.0 | +0.0% |"), "{table}");
        let alone = replay_power_table(&[result("dilu", 90.0)]);
        assert!(alone.contains("| dilu | 90.0 | n/a |"), "{alone}");
        let protocol = inflation_power_table(&[protocol_run("dilu", 0.95)]);
        assert!(protocol.contains("| 100% |"), "{protocol}");
        assert!(protocol.contains("| dilu | 1.9 |"), "{protocol}");
    }
}
