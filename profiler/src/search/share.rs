//! At one batch size, the smallest SM share whose throughput is within 2% of
//! the throughput at the largest share: a training function's share (it
//! gains almost nothing above it) and every function's SM limit.
//!
//! Known shape: throughput rises with the share with diminishing returns, so
//! "within 2% of full" holds on one contiguous top range of shares, and
//! [`lower_bound`] binary-searches its start: one trial at the top share,
//! then about log2(shares) more. Where it can be fooled: a throughput dip
//! inside the top range (noise) can make it stop above the true answer; a
//! spike below it can make it stop below (then the share it returns still
//! measured within 2%, but a neighbour above it did not).
//!
//! [`paper`] is the binary search of Dilu's published training profiler as
//! its code runs; [`exhaustive`] measures every share.

use super::{Method, NEAR_FULL};
use crate::measure::Trials;
use crate::{Config, Grid};

/// Runs `method` at `batch` over the grid's shares no smaller than `floor`
/// (the SM request, when looking for a limit). Returns the share.
pub fn search(
    method: Method,
    trials: &mut Trials,
    grid: &Grid,
    batch: u32,
    floor: u32,
) -> Result<u32, String> {
    let shares: Vec<u32> = grid.sms.iter().copied().filter(|s| *s >= floor).collect();
    if shares.is_empty() {
        return Err(format!("no SM share of the grid is at or above {floor}%"));
    }
    match method {
        Method::Dilu => lower_bound(trials, &shares, batch),
        Method::Paper => paper(trials, &shares, batch),
        Method::Exhaustive => exhaustive(trials, &shares, batch),
    }
}

fn target(trials: &mut Trials, shares: &[u32], batch: u32) -> Result<f64, String> {
    let full = trials.throughput(Config {
        batch,
        sm: shares[shares.len() - 1],
    })?;
    if full <= 0.0 {
        return Err(format!(
            "batch {batch} cannot run at {}% (no throughput measured there)",
            shares[shares.len() - 1]
        ));
    }
    Ok(full * NEAR_FULL)
}

/// dilu's search: the first share of the top range, by binary search.
pub fn lower_bound(trials: &mut Trials, shares: &[u32], batch: u32) -> Result<u32, String> {
    let goal = target(trials, shares, batch)?;
    let (mut low, mut high) = (0, shares.len() - 1);
    while low < high {
        let mid = (low + high) / 2;
        if trials.throughput(Config {
            batch,
            sm: shares[mid],
        })? >= goal
        {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    Ok(shares[low])
}

/// Dilu's training search as its code runs: low = 0, high = 100; measure
/// the midpoint (rounded down to the grid); accept it at once if it reaches
/// 98% of full, else move `low` up to it. It returns the first midpoint that
/// passes, which need not be the smallest share that would (its `high`
/// never moves). Where the rounding makes no progress the code loops for
/// ever; here that returns the top share.
pub fn paper(trials: &mut Trials, shares: &[u32], batch: u32) -> Result<u32, String> {
    let goal = target(trials, shares, batch)?;
    let top = shares[shares.len() - 1];
    let mut low = 0;
    loop {
        let middle = (low + top) / 2;
        let Some(mid) = shares
            .iter()
            .rev()
            .copied()
            .find(|s| *s <= middle && *s > low)
            .or_else(|| shares.iter().copied().find(|s| *s > low && *s < top))
        else {
            return Ok(top);
        };
        if trials.throughput(Config { batch, sm: mid })? >= goal {
            return Ok(mid);
        }
        low = mid;
    }
}

/// Measures every share; the smallest that reaches 98% of full.
pub fn exhaustive(trials: &mut Trials, shares: &[u32], batch: u32) -> Result<u32, String> {
    let goal = target(trials, shares, batch)?;
    let mut found = None;
    for &sm in shares {
        if trials.throughput(Config { batch, sm })? >= goal && found.is_none() {
            found = Some(sm);
        }
    }
    Ok(found.unwrap_or(shares[shares.len() - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ProfileTable;

    fn table(throughputs: &[(u32, f64)]) -> ProfileTable {
        let csv: String = throughputs
            .iter()
            .map(|(sm, t)| format!("1,{sm},0.01,{t}\n"))
            .collect();
        ProfileTable::parse(&csv).unwrap()
    }

    fn run(method: Method, table: &mut ProfileTable) -> (u32, usize) {
        let grid = table.grid();
        let mut trials = Trials::new(table);
        (
            search(method, &mut trials, &grid, 1, 0).unwrap(),
            trials.count(),
        )
    }

    #[test]
    fn the_smallest_share_near_full_throughput_is_found_in_log_trials() {
        // Saturates at 40%.
        let curve: Vec<(u32, f64)> = (1..=10)
            .map(|k| (k * 10, (f64::from(k) * 25.0).min(100.0)))
            .collect();
        let mut t = table(&curve);
        assert_eq!(run(Method::Exhaustive, &mut t), (40, 10));
        let (share, used) = run(Method::Dilu, &mut t);
        assert_eq!(share, 40);
        assert!(used <= 5, "{used} trials");
    }

    #[test]
    fn dilus_published_search_accepts_the_first_midpoint_that_passes() {
        // Full speed from 20%: the published search measures 50%, which
        // passes, and stops there.
        let curve: Vec<(u32, f64)> = (1..=10)
            .map(|k| (k * 10, if k >= 2 { 100.0 } else { 50.0 }))
            .collect();
        let mut t = table(&curve);
        assert_eq!(run(Method::Paper, &mut t).0, 50);
        assert_eq!(run(Method::Dilu, &mut t).0, 20);
    }

    #[test]
    fn a_share_needing_everything_ends_at_the_top_without_looping() {
        let curve: Vec<(u32, f64)> = (1..=10).map(|k| (k * 10, f64::from(k) * 10.0)).collect();
        let mut t = table(&curve);
        for method in super::super::Method::ALL {
            assert_eq!(run(method, &mut t).0, 100, "{}", method.name());
        }
    }
}
