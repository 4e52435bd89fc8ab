//! How long the primary's recent gaps lasted, and what that says of the
//! moment a filler looks: how likely the primary is to come back while a
//! kernel runs, given how long the gap it is in has lasted already.
//!
//! The risk ration ([`crate::ration`]) prices a filler kernel as if the
//! primary's requests came at a steady random rate: the chance that one
//! meets the kernel is the same whenever it starts. Where the arrivals come
//! in bursts (an on/off pattern, a diurnal rise), a gap that has lasted
//! longer than the gaps inside a burst is a pause between bursts, and the
//! primary seldom returns in the next few milliseconds; just after a
//! request ends, mid-burst, it returns soon more often than the average
//! says. [`Board::risk_scale`] is that moment's chance of a return during
//! the kernel over the chance at a moment taken at random in the idle time
//! (which is what the ration's price assumes), from the primary's recent
//! gap lengths: 1 where the gaps are exponential (arrivals at a steady
//! random rate), near 0 deep in a pause, above 1 mid-burst. A filler
//! kernel's price is scaled by it, but never below 1 outside a pause: the
//! ration spends less than its steady-rate price only where the gaps say
//! a return is rare.

use crate::board::Board;
use dilu_layout::colocation::{
    GAP_CLASS_FIRST_NS, GAP_CLASSES, GAP_LENGTHS_REMEMBERED, GAP_WEIGHT,
};
use std::sync::atomic::Ordering::*;

/// Gaps (in all) the lengths must hold before they say anything.
const KNOWN_GAPS: u64 = 32;

/// Gaps that must have lasted at least as long as the current one: fewer,
/// and how this gap goes on is a guess (the ration's steady-rate price
/// holds then).
const OUTLASTED_GAPS: f64 = 2.0;

/// The largest scale: a moment can be much riskier than the average, but a
/// scale from few gaps should not shut the fillers out.
const MOST_SCALE: f64 = 8.0;

/// A moment is priced below the average only once the gap has outlasted
/// all but this share of the gaps, and only where it is at most
/// [`DISCOUNT_AT_MOST`] of the average: deep in a pause between bursts.
/// A scale a little under 1 is as likely the classes' coarseness as the
/// arrivals. (Taken as it came, beside Poisson primaries on simgpu moments
/// 1-20 ms into a gap were priced at 0.86-0.90 of the average, fillers
/// harvested 12 points more of the idle time over the field's eight
/// inference shapes, and the primaries' p99 was within 1.10× alone in
/// five or six of them, against five and eight unscaled.)
const DISCOUNT_BEYOND_SHARE: f64 = 0.1;

/// The highest scale taken below 1 (see [`DISCOUNT_BEYOND_SHARE`]).
const DISCOUNT_AT_MOST: f64 = 0.5;

/// Where class `j` ends (class `j` holds gaps from where class `j - 1`
/// ends): the first at [`GAP_CLASS_FIRST_NS`], each next √2 longer.
fn class_ends() -> [f64; GAP_CLASSES] {
    let mut ends = [0.0; GAP_CLASSES];
    let mut end = GAP_CLASS_FIRST_NS as f64;
    for e in &mut ends {
        *e = end;
        end *= std::f64::consts::SQRT_2;
    }
    ends
}

/// The class of a gap of `length_ns`.
pub(crate) fn class_of(length_ns: u64) -> usize {
    let length = length_ns as f64;
    class_ends()
        .iter()
        .position(|&end| length < end)
        .unwrap_or(GAP_CLASSES - 1)
}

/// The share of gaps lasting at least `t`, at the class ends: point 0 is
/// `t = 0` (every gap), point `j + 1` the end of class `j`. Within a class
/// gaps are taken as spread evenly.
struct Survival {
    at: [f64; GAP_CLASSES + 1],
    share: [f64; GAP_CLASSES + 1],
    total: f64,
}

impl Survival {
    fn from_weights(weights: &[u64; GAP_CLASSES]) -> Self {
        let total: u64 = weights.iter().sum();
        let mut at = [0.0; GAP_CLASSES + 1];
        let mut share = [0.0; GAP_CLASSES + 1];
        at[1..].copy_from_slice(&class_ends());
        let mut left = total;
        share[0] = 1.0;
        for (j, &w) in weights.iter().enumerate() {
            left -= w;
            share[j + 1] = left as f64 / total.max(1) as f64;
        }
        Survival {
            at,
            share,
            total: total as f64 / GAP_WEIGHT as f64,
        }
    }

    /// The share of gaps lasting at least `t` ns.
    fn share_at(&self, t: f64) -> f64 {
        let Some(j) = self.at.iter().position(|&a| t < a) else {
            return 0.0;
        };
        // t lies in [at[j-1], at[j]); j >= 1 since at[0] = 0 <= t.
        let (a0, a1) = (self.at[j - 1], self.at[j]);
        let (s0, s1) = (self.share[j - 1], self.share[j]);
        s0 + (s1 - s0) * (t - a0) / (a1 - a0)
    }

    /// The integral of the share from 0 to `x` ns: the mean of
    /// `min(gap, x)`.
    fn integral_to(&self, x: f64) -> f64 {
        let mut sum = 0.0;
        for j in 1..self.at.len() {
            let (a0, a1) = (self.at[j - 1], self.at[j]);
            if x <= a0 {
                break;
            }
            let (end, s_end) = if x < a1 {
                (x, self.share_at(x))
            } else {
                (a1, self.share[j])
            };
            sum += (self.share[j - 1] + s_end) / 2.0 * (end - a0);
        }
        sum
    }
}

impl Board<'_> {
    /// Primary side, once per fillable gap: it lasted `length_ns`.
    pub(crate) fn record_gap_length(&self, length_ns: u64) {
        let lengths = &self.gap_lengths;
        lengths.weight[class_of(length_ns)].fetch_add(GAP_WEIGHT, Relaxed);
        let total = lengths.total.fetch_add(GAP_WEIGHT, Relaxed) + GAP_WEIGHT;
        if total > 2 * GAP_LENGTHS_REMEMBERED * GAP_WEIGHT {
            // Older gaps fade: halve them all (the primary writes alone;
            // a filler reading meanwhile sees a mix for one look).
            let mut sum = 0;
            for w in &lengths.weight {
                let half = w.load(Relaxed) / 2;
                w.store(half, Relaxed);
                sum += half;
            }
            lengths.total.store(sum, Relaxed);
        }
    }

    /// Filler side: the mean of the primary's recent gap lengths (`None`
    /// while they are too few to say): a primary reporting its requests
    /// comes back about once per mean gap.
    pub fn mean_gap_ns(&self) -> Option<u64> {
        Some(self.known_survival()?.integral_to(f64::MAX) as u64)
    }

    /// The survival of the primary's recent gap lengths, or `None` while
    /// they are too few to say.
    fn known_survival(&self) -> Option<Survival> {
        let lengths = &self.gap_lengths;
        if lengths.total.load(Relaxed) < KNOWN_GAPS * GAP_WEIGHT {
            return None;
        }
        let mut weights = [0u64; GAP_CLASSES];
        for (w, word) in weights.iter_mut().zip(&lengths.weight) {
            *w = word.load(Relaxed);
        }
        Some(Survival::from_weights(&weights))
    }

    /// Filler side: how much likelier the primary is to come back within
    /// `exposure_ns` of a gap that has lasted `elapsed_ns` than within that
    /// long of a moment taken at random in its idle time (see the module's
    /// notes); below 1 only deep in a pause (see [`DISCOUNT_BEYOND_SHARE`]).
    /// `None` where its recent gaps say too little: too few, or too few as
    /// long as this one.
    pub fn risk_scale(&self, elapsed_ns: u64, exposure_ns: u64) -> Option<f64> {
        let survival = self.known_survival()?;
        let (e, x) = (elapsed_ns as f64, exposure_ns.max(1) as f64);
        let lasted = survival.share_at(e);
        if lasted * survival.total < OUTLASTED_GAPS {
            return None;
        }
        // The chance of a return within x, now and at a random idle moment.
        let now = 1.0 - survival.share_at(e + x) / lasted;
        let mean_gap = survival.integral_to(f64::MAX);
        let at_random = survival.integral_to(x) / mean_gap;
        if at_random <= 0.0 {
            return None;
        }
        let scale = (now / at_random).clamp(0.0, MOST_SCALE);
        let in_a_pause = lasted <= DISCOUNT_BEYOND_SHARE && scale <= DISCOUNT_AT_MOST;
        Some(if in_a_pause { scale } else { scale.max(1.0) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_layout::colocation::DeviceBoard;

    fn board_with(gaps: impl IntoIterator<Item = u64>) -> Box<DeviceBoard> {
        // SAFETY: DeviceBoard is atomics and padding: all-zero is valid.
        let device: Box<DeviceBoard> = unsafe { Box::new(std::mem::zeroed()) };
        let board = Board::new(&device);
        for gap in gaps {
            board.record_gap_length(gap);
        }
        device
    }

    /// Deterministic exponential gaps of mean `mean_ns`.
    fn exponential(count: usize, mean_ns: f64) -> impl Iterator<Item = u64> {
        (0..count).map(move |i| {
            let u = (i as f64 + 0.5) / count as f64;
            (-(1.0 - u).ln() * mean_ns) as u64
        })
    }

    #[test]
    fn classes_grow_by_root_two_and_the_last_holds_every_longer_gap() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(99_999), 0);
        assert_eq!(class_of(100_000), 1);
        assert_eq!(class_of(141_000), 1);
        assert_eq!(class_of(142_000), 2);
        assert_eq!(class_of(200_001), 3);
        assert_eq!(class_of(u64::MAX), GAP_CLASSES - 1);
    }

    #[test]
    fn steady_random_arrivals_price_every_moment_alike() {
        let device = board_with(exponential(1000, 4_000_000.0));
        let board = Board::new(&device);
        for elapsed in [0, 1_000_000, 4_000_000, 8_000_000] {
            let scale = board.risk_scale(elapsed, 700_000).unwrap();
            assert!((0.75..1.33).contains(&scale), "{elapsed}: {scale}");
        }
        // Early in a gap (most gaps last longer) a moment is never cheaper
        // than the average.
        assert!(board.risk_scale(1_000_000, 700_000).unwrap() >= 1.0);
    }

    #[test]
    fn a_pause_between_bursts_is_cheap_and_a_moment_inside_a_burst_dear() {
        // 75 gaps of a burst at 250 req/s, then a 300 ms pause, 13 times.
        let mut gaps = Vec::new();
        for _ in 0..13 {
            gaps.extend(exponential(75, 4_000_000.0));
            gaps.push(300_000_000);
        }
        let device = board_with(gaps);
        let board = Board::new(&device);
        let in_burst = board.risk_scale(200_000, 700_000).unwrap();
        assert!(in_burst > 1.5, "{in_burst}");
        let in_pause = board.risk_scale(60_000_000, 700_000).unwrap();
        assert!(in_pause < 0.1, "{in_pause}");
    }

    #[test]
    fn too_few_gaps_or_a_gap_longer_than_all_say_nothing() {
        let device = board_with(exponential(20, 4_000_000.0));
        assert_eq!(Board::new(&device).risk_scale(0, 700_000), None);
        let device = board_with(exponential(500, 4_000_000.0));
        assert_eq!(Board::new(&device).risk_scale(200_000_000, 700_000), None);
    }

    #[test]
    fn old_gaps_fade() {
        // A thousand long gaps, then three thousand of a burst: counted
        // alike, a quarter of the gaps would be long.
        let mut gaps: Vec<u64> = vec![300_000_000; 1000];
        gaps.extend(exponential(3000, 4_000_000.0));
        let device = board_with(gaps);
        let total = device.gap_lengths.total.load(Relaxed);
        assert!(
            (GAP_LENGTHS_REMEMBERED * GAP_WEIGHT..=2 * GAP_LENGTHS_REMEMBERED * GAP_WEIGHT)
                .contains(&total)
        );
        let long = device.gap_lengths.weight[class_of(300_000_000)].load(Relaxed);
        let share = long as f64 / total as f64;
        assert!(share < 0.15, "{share}");
    }
}
