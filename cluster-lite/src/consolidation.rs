//! Consolidation while load falls: when a cluster is shrinking, work left
//! alone on a GPU is moved to a busy GPU that has room for it, so its GPU
//! goes idle instead of staying on for one instance.
//!
//! Two kinds of work move:
//!
//! * **A replica** of an inference function moves make-before-break: the
//!   new copy starts on the target GPU and the old copy keeps serving, and
//!   keeps its GPU, until the new copy has had the function's cold start to
//!   warm up. A GPU holding such an old copy is *draining*
//!   (`GpuState::draining`) and admits nothing new.
//! * **A restartable gang** (training that resumes from its checkpoint when
//!   restarted; the function says so) with a GPU to itself is restarted
//!   with that GPU's share on the target GPU and its other shares where
//!   they were. This is break-before-make: the job checkpoints, stops and
//!   starts again, losing the restart time (`simulator::RESTART_S` in the
//!   simulator) on all its GPUs. A job restarts at most once per pass, with
//!   every lone share of it moved in that restart.
//!
//! Which GPU takes the work is the policy's answer to
//! `PlacementPolicy::consolidation_target` (only `dilu` answers).
//!
//! Why only while shrinking: while instances arrive, a hole on a busy GPU is
//! filled by the next arrival anyway, and moving work into it only makes
//! that arrival wake a GPU, at the price of a cold start or a restart. When
//! the load falls nothing fills the holes, so lone instances pin GPUs.
//! "Shrinking" is read from what the cluster did, not from a forecast: over
//! the last `SHRINK_WINDOW_S` at least `SHRINK_RATIO` times as many
//! instances stopped as started. The simulator applies this rule.

use std::collections::VecDeque;

/// How far back starts and stops are counted, in seconds.
pub const SHRINK_WINDOW_S: f64 = 600.0;
/// Stops per start over the window from which the cluster counts as shrinking.
pub const SHRINK_RATIO: f64 = 2.0;

/// Sliding count of instance starts and stops (times in seconds on any
/// monotonic clock).
#[derive(Debug, Clone, Default)]
pub struct ShrinkWatch {
    starts: VecDeque<f64>,
    stops: VecDeque<f64>,
}

impl ShrinkWatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn started(&mut self, now_s: f64) {
        self.starts.push_back(now_s);
        self.forget_before(now_s - SHRINK_WINDOW_S);
    }

    pub fn stopped(&mut self, now_s: f64) {
        self.stops.push_back(now_s);
        self.forget_before(now_s - SHRINK_WINDOW_S);
    }

    /// Whether, over the window ending at `now_s`, at least one instance
    /// stopped and at least `SHRINK_RATIO` times as many stopped as started.
    pub fn is_shrinking(&mut self, now_s: f64) -> bool {
        self.forget_before(now_s - SHRINK_WINDOW_S);
        !self.stops.is_empty() && self.stops.len() as f64 >= SHRINK_RATIO * self.starts.len() as f64
    }

    fn forget_before(&mut self, cutoff_s: f64) {
        while self.starts.front().is_some_and(|&time| time < cutoff_s) {
            self.starts.pop_front();
        }
        while self.stops.front().is_some_and(|&time| time < cutoff_s) {
            self.stops.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinking_needs_twice_as_many_stops_as_starts_within_the_window() {
        let mut watch = ShrinkWatch::new();
        assert!(!watch.is_shrinking(0.0), "no activity is not shrinking");
        watch.started(0.0);
        watch.stopped(10.0);
        assert!(!watch.is_shrinking(10.0));
        watch.stopped(20.0);
        assert!(watch.is_shrinking(20.0));
        watch.started(30.0);
        assert!(!watch.is_shrinking(30.0), "2 stops against 2 starts");
        // The two starts fall out of the window before the stops do.
        assert!(watch.is_shrinking(605.0));
        assert!(!watch.is_shrinking(10_000.0), "everything forgotten");
    }
}
