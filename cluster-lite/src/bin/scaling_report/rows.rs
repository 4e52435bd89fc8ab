//! The rows of a case's table and how `dilu`'s rows are judged against
//! the retuned baselines: rendering and verdicts only, from outcomes the
//! report ran (`main.rs`).

use std::fmt::Write as _;

use dilu_cluster::scaling::sim::Outcome;

/// The attainment a service owner accepts, for each function.
pub const GOAL: f64 = 0.99;

/// Every function within its SLO for [`GOAL`] of its requests (so the
/// pooled attainment too: it is a weighted mean of the functions').
pub fn at_goal(outcome: &Outcome) -> bool {
    outcome.worst_function_attainment() >= GOAL
}

/// Attainment as a table cell: pooled, and the worst function's.
pub fn attainment_text(outcome: &Outcome) -> String {
    format!(
        "{:.2}% (worst {:.2}%)",
        100.0 * outcome.attainment(),
        100.0 * outcome.worst_function_attainment()
    )
}

/// One row of a case's table.
pub struct Row {
    pub label: String,
    pub setting: String,
    pub outcome: Outcome,
    /// A retuned baseline (judged against), or a published setting.
    pub retuned: bool,
    /// Run with warm starts (judged against rows run with them).
    pub warm: bool,
}

/// A case's rows as a table.
pub fn table(rows: &[Row]) -> String {
    let mut text = String::from(
        "| scaler | setting | SLO attainment | worst function | GPU-hours | instance starts | of them warm | mean instances | warm GiB-h | starts refused |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let o = &row.outcome;
        let _ = writeln!(
            text,
            "| {} | {} | {:.2}% | {:.2}% | {:.2} | {} | {} | {:.1} | {:.1} | {} |",
            row.label,
            row.setting,
            100.0 * o.attainment(),
            100.0 * o.worst_function_attainment(),
            o.gpu_hours,
            o.starts,
            o.warm_starts,
            o.mean_instances(),
            o.warm_gib_hours,
            o.refused
        );
    }
    text
}

/// How one dilu row fares against the retuned baselines that reach the
/// goal, run alike (warm starts or not): (reaches the goal, the cheapest
/// such baseline's row, fewer GPU-hours than every one of them).
pub fn judge<'a>(dilu: &Row, rows: &'a [Row]) -> (bool, Option<&'a Row>, bool) {
    let reaches = at_goal(&dilu.outcome);
    let cheapest = rows
        .iter()
        .filter(|row| row.retuned && row.warm == dilu.warm && at_goal(&row.outcome))
        .min_by(|a, b| a.outcome.gpu_hours.total_cmp(&b.outcome.gpu_hours));
    let cheaper = cheapest.is_none_or(|best| dilu.outcome.gpu_hours < best.outcome.gpu_hours);
    (reaches, cheapest, reaches && cheaper)
}

/// What each `dilu` row's [`judge`]ment says, one line each.
pub fn verdict(rows: &[Row]) -> String {
    let mut text = String::new();
    for dilu in &rows[..2] {
        let (reaches, cheapest, wins) = judge(dilu, rows);
        let baseline = match cheapest {
            Some(best) => format!(
                "the cheapest retuned baseline at {:.0}% is `{}` ({}): {} with {:.2} GPU-h",
                100.0 * GOAL,
                best.label,
                best.setting,
                attainment_text(&best.outcome),
                best.outcome.gpu_hours
            ),
            None => format!("no baseline reaches {:.0}% at any target", 100.0 * GOAL),
        };
        let _ = writeln!(
            text,
            "- `{}`: {} with {:.2} GPU-h; {baseline}. {}",
            dilu.label,
            attainment_text(&dilu.outcome),
            dilu.outcome.gpu_hours,
            match (reaches, wins) {
                (true, true) => "At the goal, with fewer GPU-hours than every baseline there.",
                (true, false) => "At the goal, but not with fewer GPU-hours.",
                (false, _) => "Below the goal.",
            }
        );
    }
    text
}

/// The share of `outcome`'s missed requests that came in its first
/// `seconds` (0 where none was missed).
pub fn missed_within(outcome: &Outcome, seconds: usize) -> f64 {
    let all: f64 = outcome.missed.iter().map(|m| m.2).sum();
    let early: f64 = outcome
        .missed
        .iter()
        .filter(|m| m.0 < seconds)
        .map(|m| m.2)
        .sum();
    if all > 0.0 { early / all } else { 0.0 }
}
