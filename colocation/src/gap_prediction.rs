//! The next fillable gap of a primary, predicted from its recent ones.

use dilu_layout::colocation::{HISTORY, MAX_PERIOD, PERIOD_ITERATIONS, RING};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Two gaps agree when they differ by at most 1/this of the longer: sleep
/// and scheduling noise on a loaded host stays within it, the phases of a
/// training iteration (e.g. 4 ms loading, 1 ms all-reduce) do not.
const AGREE_DIVISOR: u64 = 4;

/// The next gap of a primary, predicted from its recent gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapPrediction {
    /// 0: no prediction (fewer than two gaps).
    pub length_ns: u64,
    /// Gaps per iteration, when the gaps repeat (0: no period found).
    pub period: usize,
    /// The longest gap predicted at any position of the next period (the
    /// next gap's prediction where there is no period): a kernel longer
    /// than it fits no gap that is coming.
    pub longest_vouched_ns: u64,
}

/// Records a gap of `length_ns` in `ring` (`recorded`: how many it has
/// taken so far) and returns the gaps it holds, oldest first, with their
/// number: on the stack, no allocation on the launch path.
pub fn record_in_ring(
    ring: &[AtomicU64; HISTORY],
    recorded: &AtomicU64,
    length_ns: u64,
) -> ([u64; HISTORY], usize) {
    let count = recorded.fetch_add(1, Relaxed) + 1;
    ring[((count - 1) % HISTORY as u64) as usize].store(length_ns, Relaxed);
    let known = count.min(HISTORY as u64) as usize;
    let mut recent = [0u64; HISTORY];
    for (i, gap) in recent[..known].iter_mut().enumerate() {
        let at = (count - known as u64 + i as u64) % HISTORY as u64;
        *gap = ring[at as usize].load(Relaxed);
    }
    (recent, known)
}

pub(crate) fn agree(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= a.max(b) / AGREE_DIVISOR
}

/// Predicts the gap after `recent` (fillable gaps, oldest first).
///
/// The smallest period `p` (1 to [`MAX_PERIOD`]) is taken for which the
/// last `max(p × PERIOD_ITERATIONS, RING)` gaps each agree with the gap `p`
/// before it, all but a quarter of them (one outlier spoils two
/// comparisons); the prediction is then the shortest of those gaps at the
/// next gap's position. Without a period it is the shortest of the last
/// [`RING`] gaps. Either way a cautious value: the gap it predicts was
/// seen at least that long every time.
pub fn predict_gap(recent: &[u64]) -> GapPrediction {
    let n = recent.len();
    if n < 2 {
        return GapPrediction {
            length_ns: 0,
            period: 0,
            longest_vouched_ns: 0,
        };
    }
    for period in 1..=MAX_PERIOD {
        let window = (period * PERIOD_ITERATIONS).max(RING);
        if n < window + period {
            break;
        }
        let mismatches = (n - window..n)
            .filter(|&i| !agree(recent[i], recent[i - period]))
            .count();
        if mismatches <= window / 4 {
            // The gap `ahead` positions after the next (at position
            // n + ahead): the same position one, two, ... periods back,
            // within the window.
            let at = |ahead: usize| {
                (1..)
                    .map(|k| k * period)
                    .take_while(|&back| back <= window + ahead)
                    .filter(|&back| back > ahead)
                    .map(|back| recent[n + ahead - back])
                    .min()
                    .unwrap_or(0)
            };
            let longest_vouched_ns = (0..period).map(at).max().unwrap_or(0);
            return GapPrediction {
                length_ns: at(0),
                period,
                longest_vouched_ns,
            };
        }
    }
    let length_ns = recent[n.saturating_sub(RING)..]
        .iter()
        .copied()
        .min()
        .unwrap_or(0);
    GapPrediction {
        length_ns,
        period: 0,
        longest_vouched_ns: length_ns,
    }
}
