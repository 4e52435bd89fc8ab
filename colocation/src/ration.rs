//! The risk ration of a primary kept as if alone (no latency target): how
//! much filler work beyond its tolerance its tail can afford.
//!
//! A filler kernel that a request finds on the device delays it by what is
//! left of the kernel and the hand-off back, and a kernel that opens a run
//! of its filler's kernels also by the hand-off to it: a request that
//! arrives while the kernel is *exposed* (`e`: the kernel `k` and that
//! hand-off, `k + h`, or where it follows its filler's own queued kernel,
//! `k` alone) waits `d` in `[h, h + e]`, one moment as likely as another
//! (`h` a hand-off). It is pushed over the primary's bound `B` (10% over
//! its p99 alone) if its latency alone `L` was within `B` and `L + d` is
//! not. From the primary's latencies alone (a window of them) the expected
//! number of requests one kernel exposed for `e` pushes over is `λ · G(e)`,
//! with `G(e) = mean over the window of |{d ∈ [h, h+e] : B − d < L ≤ B}|`
//! (`λ` the request rate). At most [`DELAY_BUDGET_PPM`] of
//! the requests may be pushed over, `λ · β` per second; `λ` cancels: the
//! kernels' `G(e)` may add up to `β` per second of wall time, whatever the
//! request rate. So a kernel costs `G(e) / β` of wall time from a
//! ration that fills at one ns per ns, up to [`RATION_DEPTH_NS`]. (Priced
//! by kernel length, a kernel following its own and shorter than a
//! hand-off was priced at the first length's cost scaled by `k / h`: over
//! delays reaching 48 µs past its own, 1.25 times what its delays risk for
//! a filler of 0.12 ms kernels beside a Poisson primary at 229 req/s on
//! simgpu.)
//!
//! A kernel short enough that no request within the bound is near it costs
//! nothing; one that would push every request it meets costs `e / β`,
//! 200 times its exposure: such fillers get half a percent of
//! the device, and a kernel that costs more than the ration holds goes
//! only on what the full ration overflowed while nobody spent it (the
//! fillers' gate says why). Kept only by the
//! tolerance (one length, the same for every filler), fillers harvested
//! 10.6-31.2% of the idle time beside five of the six Poisson primaries of
//! the field's shapes on simgpu.
//!
//! A kernel that opens a run of a filler's kernels pays the hand-off to
//! the filler, those following it do not: it goes only once the ration
//! also affords [`RATION_RUN_KERNELS`](crate::filler::RATION_RUN_KERNELS)
//! of them after it, so that a filler the ration paces pays that hand-off
//! once a run.
//!
//! The primary computes the table ([`ration_costs`]) at its reports and
//! publishes it ([`Board::publish_ration`]); a filler looks its kernel up
//! ([`Board::ration_cost`]), scales it by how likely the primary is to
//! return while it runs at this moment of the gap rather than at a random
//! one ([`Board::risk_scale`]), and spends from the ration the fillers
//! share.

use crate::board::Board;
use crate::primary::DELAY_BUDGET_PPM;
use crate::timing::HANDOFF_NS;
use dilu_layout::colocation::{RATION_FIRST_NS, RATION_POINTS};
use std::sync::atomic::Ordering::*;

/// How much unspent ration fillers may save up: a burst of risky kernels
/// after a quiet stretch is risk at the same long-run rate, but a long save
/// would let a run of them meet one burst of requests.
pub const RATION_DEPTH_NS: u64 = 20_000_000;

/// The exposure (kernel time, with the hand-off to it where it opens a
/// run) of the table's point `j`.
pub fn ration_point_ns(j: usize) -> u64 {
    RATION_FIRST_NS << j
}

/// What one filler kernel of each table exposure costs a primary whose
/// latencies alone are `latencies` (in any order) and whose bound is `bound_ns`:
/// `G(e) / β` in ns (see the module's notes). Empty windows cost nothing
/// to compute and say nothing: the caller publishes no table then.
pub fn ration_costs(latencies: &[u64], bound_ns: u64) -> [u64; RATION_POINTS] {
    let mut costs = [0u64; RATION_POINTS];
    if latencies.is_empty() {
        return costs;
    }
    let n = latencies.len() as u128;
    // Only requests within the bound can be pushed over it; the nearer
    // the bound, the smaller the delay that does.
    for (j, cost) in costs.iter_mut().enumerate() {
        let longest_delay = HANDOFF_NS + ration_point_ns(j);
        let overlap: u128 = latencies
            .iter()
            .filter(|&&l| l <= bound_ns)
            .map(|&l| {
                let pushes_from = (bound_ns - l).max(HANDOFF_NS);
                u128::from(longest_delay.saturating_sub(pushes_from))
            })
            .sum();
        *cost =
            (overlap * 1_000_000 / (n * DELAY_BUDGET_PPM as u128)).min(u128::from(u64::MAX)) as u64;
    }
    costs
}

/// A kernel exposed for `exposure_ns` in the table `costs`: interpolated
/// between its points (below the first, on the line from nothing to it),
/// beyond the last one every further ns pushes every request it meets (the
/// most it can).
pub fn cost_in(costs: &[u64; RATION_POINTS], exposure_ns: u64) -> u64 {
    if exposure_ns <= ration_point_ns(0) {
        // Nothing exposed costs nothing; the risk grows faster than the
        // exposure, so the straight line to the first point is an upper
        // bound.
        return (u128::from(costs[0]) * u128::from(exposure_ns) / u128::from(ration_point_ns(0)))
            as u64;
    }
    for j in 1..RATION_POINTS {
        let (k0, k1) = (ration_point_ns(j - 1), ration_point_ns(j));
        if exposure_ns <= k1 {
            let (c0, c1) = (costs[j - 1], costs[j].max(costs[j - 1]));
            return c0
                + ((c1 - c0) as u128 * u128::from(exposure_ns - k0) / u128::from(k1 - k0)) as u64;
        }
    }
    let last = ration_point_ns(RATION_POINTS - 1);
    costs[RATION_POINTS - 1]
        .saturating_add((exposure_ns - last).saturating_mul(1_000_000 / DELAY_BUDGET_PPM as u64))
}

impl Board<'_> {
    /// Primary side: the table of [`ration_costs`] in force at `now`. The
    /// first table fills the ration from `now` on: it holds its depth, and
    /// has overflowed nothing yet.
    pub fn publish_ration(&self, now: u64, costs: &[u64; RATION_POINTS]) {
        for (word, &cost) in self.ration.cost_ns.iter().zip(costs) {
            word.store(cost, Relaxed);
        }
        if self.ration.known.swap(1, AcqRel) == 0 {
            self.ration.spent_until_ns.0.fetch_max(now, AcqRel);
        }
    }

    /// Primary side, at attach: no table yet, nothing spent.
    pub(crate) fn forget_ration(&self) {
        self.ration.known.store(0, Release);
        self.ration.spent_until_ns.0.store(0, Relaxed);
    }

    /// Filler side: what a kernel of `est_ns` costs the ration (`None`: no
    /// table is published). `following` its own kernel still queued, it
    /// costs no hand-off to it: a request meeting it waits at most the
    /// kernel and the hand-off back.
    pub fn ration_cost(&self, est_ns: u64, following: bool) -> Option<u64> {
        if self.ration.known.load(Acquire) == 0 {
            return None;
        }
        let mut costs = [0u64; RATION_POINTS];
        for (cost, word) in costs.iter_mut().zip(&self.ration.cost_ns) {
            *cost = word.load(Relaxed);
        }
        // Behind its own kernel no hand-off to it comes first: what it
        // exposes is the kernel alone.
        let exposure_ns = if following {
            est_ns
        } else {
            est_ns + HANDOFF_NS
        };
        Some(cost_in(&costs, exposure_ns))
    }

    /// Filler side: the earliest instant the ration affords `cost` (at or
    /// before now: it does now). A cost above the depth is afforded once
    /// the ration is full.
    pub fn ration_ready_at(&self, cost: u64) -> u64 {
        // `spent_until` is when the ration is full again: at an instant
        // `t` it holds the depth less `spent_until - t`.
        let spent_until = self.ration.spent_until_ns.0.load(Acquire);
        spent_until
            .saturating_add(cost.min(RATION_DEPTH_NS))
            .saturating_sub(RATION_DEPTH_NS)
    }

    /// Filler side: the earliest instant at which the ration, full, has
    /// overflowed by `excess`: what it would have thrown away while nobody
    /// spent it.
    pub fn ration_overflowed_at(&self, excess: u64) -> u64 {
        self.ration
            .spent_until_ns
            .0
            .load(Acquire)
            .saturating_add(excess)
    }

    /// Filler side: a launch of `cost` went at `now`.
    pub(crate) fn spend_ration(&self, now: u64, cost: u64) {
        let _ = self
            .ration
            .spent_until_ns
            .0
            .fetch_update(AcqRel, Acquire, |spent| {
                Some(spent.max(now).saturating_add(cost))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;
    /// What one ns of delay that pushes every request costs the ration.
    const PER_NS: u64 = 1_000_000 / DELAY_BUDGET_PPM as u64;

    #[test]
    fn a_kernel_costs_nothing_where_no_request_is_near_the_bound() {
        // Every request 1 ms, the bound 3 ms: a kernel whose longest delay
        // (its exposure and the hand-off back) is within 2 ms pushes none
        // over.
        let costs = ration_costs(&[MS; 100], 3 * MS);
        for (j, &cost) in costs.iter().enumerate() {
            let harmless = ration_point_ns(j) + HANDOFF_NS <= 2 * MS;
            assert_eq!(
                cost == 0,
                harmless,
                "{} µs: {cost}",
                ration_point_ns(j) / US
            );
        }
    }

    #[test]
    fn at_the_bound_a_kernel_costs_its_exposure_over_the_budget() {
        // Every request that arrives while it is exposed is pushed over: a
        // request arriving in the hand-off back was not delayed enough to
        // matter.
        let costs = ration_costs(&[2 * MS; 10], 2 * MS);
        for (j, &cost) in costs.iter().enumerate() {
            assert_eq!(cost, ration_point_ns(j) * PER_NS);
        }
        // Requests already over the bound alone are not the fillers' to
        // push: half of them over it, half the cost.
        let mut mixed = [2 * MS; 10];
        mixed[5..].fill(3 * MS);
        let half = ration_costs(&mixed, 2 * MS);
        assert_eq!(half[3], costs[3] / 2);
    }

    #[test]
    fn a_kernel_between_the_table_s_exposures_costs_between_their_costs() {
        let costs = ration_costs(&[2 * MS; 10], 2 * MS);
        let (k1, k2) = (ration_point_ns(2), ration_point_ns(3));
        assert_eq!(cost_in(&costs, k1), costs[2]);
        assert_eq!(cost_in(&costs, (k1 + k2) / 2), (costs[2] + costs[3]) / 2);
        let first = ration_point_ns(0);
        assert_eq!(
            cost_in(&costs, first / 2),
            costs[0] / 2,
            "below the first point, on the line from nothing to it"
        );
        assert_eq!(cost_in(&costs, 0), 0);
        // Beyond the last length every further ns pushes every request.
        let last = ration_point_ns(RATION_POINTS - 1);
        assert_eq!(
            cost_in(&costs, last + MS),
            costs[RATION_POINTS - 1] + MS * PER_NS
        );
    }

    #[test]
    fn a_kernel_shorter_than_a_hand_off_following_its_own_risks_only_its_own_delays() {
        // Requests 0.25 ms under the bound: a delay pushes them over only
        // beyond 0.25 ms. A 0.1 ms kernel following its filler's own delays
        // a request it meets by at most 0.24 ms (itself and the hand-off
        // back): it costs nothing. Opening a run (exposed 0.24 ms, delays
        // up to 0.38 ms) it does.
        let costs = ration_costs(&[2 * MS; 100], 2 * MS + 250 * US);
        let exposure_following = 100 * US;
        assert_eq!(cost_in(&costs, exposure_following), 0);
        assert!(cost_in(&costs, exposure_following + HANDOFF_NS) > 0);
    }
}
