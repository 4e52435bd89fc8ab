//! Horizontal scaling: how many instances a function needs, from its request
//! rate and the node managers' scale-out signals, sampled once per tick.
//!
//! Both rules vote over a sliding history of samples, with `n` the current
//! number of instances and `T` the per-instance throughput at SLO:
//! * an *out* vote is a sample with rate > `out_share`·n·T, or a node asking
//!   for another instance;
//! * an *in* vote is a sample with rate < `in_share`·(n − 1)·T.
//!
//! `dilu-paper` (the published rule): 1 s ticks, 40 samples; out by one
//! instance when ≥ 20 of the last 40 vote out; in by one when ≥ 30 of the
//! last 40 vote in; shares 1.0.
//!
//! `responsive` (ours): scale out fast — when 2 of the last 3 samples vote
//! out (out_share 0.9, i.e. 10% headroom), jump straight to the number of
//! instances the latest rate needs; scale in lazily — one instance at a time,
//! only when every one of the last `in_window` samples votes in (in_share
//! 0.8), where `in_window` = max(60 ticks, 4 × cold start): an instance is
//! kept alive at least four cold starts after load drops, so a returning
//! burst does not pay a cold start. After any change the history restarts.

use std::collections::VecDeque;

/// One observation of a function's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadSample {
    pub request_rate: f64,
    pub wants_scale_out: bool,
}

/// Windows and thresholds of a scaling rule (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingRule {
    pub out_window: usize,
    pub out_votes: usize,
    pub in_window: usize,
    pub in_votes: usize,
    pub out_share: f64,
    pub in_share: f64,
    /// Scale out to the needed count at once instead of one step.
    pub jump_to_need: bool,
}

impl ScalingRule {
    /// The rule published with Dilu (ticks of 1 s).
    pub fn dilu_paper() -> Self {
        Self {
            out_window: 40,
            out_votes: 20,
            in_window: 40,
            in_votes: 30,
            out_share: 1.0,
            in_share: 1.0,
            jump_to_need: false,
        }
    }

    /// Ours; `cold_start_ticks` is the function's cold start in ticks.
    pub fn responsive(cold_start_ticks: usize) -> Self {
        let in_window = (4 * cold_start_ticks).max(60);
        Self {
            out_window: 3,
            out_votes: 2,
            in_window,
            in_votes: in_window,
            out_share: 0.9,
            in_share: 0.8,
            jump_to_need: true,
        }
    }

    /// Builds a rule by name: `dilu-paper` or `responsive`.
    pub fn by_name(name: &str, cold_start_ticks: usize) -> Option<Self> {
        match name {
            "dilu-paper" => Some(Self::dilu_paper()),
            "responsive" => Some(Self::responsive(cold_start_ticks)),
            _ => None,
        }
    }
}

/// Per-function scaler state.
#[derive(Debug, Clone)]
pub struct Autoscaler {
    rule: ScalingRule,
    history: VecDeque<LoadSample>,
}

impl Autoscaler {
    pub fn new(rule: ScalingRule) -> Self {
        Self {
            rule,
            history: VecDeque::new(),
        }
    }

    /// Records a sample and returns the number of instances wanted now,
    /// given `current` instances of `throughput` requests/s each (≥ 1).
    pub fn observe(&mut self, sample: LoadSample, current: u32, throughput: f64) -> u32 {
        let keep = self.rule.out_window.max(self.rule.in_window).max(1);
        self.history.push_back(sample);
        while self.history.len() > keep {
            self.history.pop_front();
        }
        let current = current.max(1);
        let throughput = throughput.max(f64::MIN_POSITIVE);
        let out_limit = self.rule.out_share * current as f64 * throughput;
        let in_limit = self.rule.in_share * (current - 1) as f64 * throughput;
        let out_votes = self
            .recent(self.rule.out_window)
            .filter(|s| s.request_rate > out_limit || s.wants_scale_out)
            .count();
        let in_votes = self
            .recent(self.rule.in_window)
            .filter(|s| s.request_rate < in_limit && !s.wants_scale_out)
            .count();
        let decision = if out_votes >= self.rule.out_votes {
            let needed = if self.rule.jump_to_need {
                (sample.request_rate / (self.rule.out_share * throughput)).ceil() as u32
            } else {
                0
            };
            needed.max(current + 1)
        } else if current > 1
            && self.history.len() >= self.rule.in_window
            && in_votes >= self.rule.in_votes
        {
            current - 1
        } else {
            current
        };
        if decision != current {
            self.history.clear();
        }
        decision
    }

    fn recent(&self, window: usize) -> impl Iterator<Item = &LoadSample> {
        self.history.iter().rev().take(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rate: f64) -> LoadSample {
        LoadSample {
            request_rate: rate,
            wants_scale_out: false,
        }
    }

    fn run(rule: ScalingRule, rates: impl IntoIterator<Item = f64>, mut current: u32) -> Vec<u32> {
        let mut scaler = Autoscaler::new(rule);
        rates
            .into_iter()
            .map(|rate| {
                current = scaler.observe(sample(rate), current, 100.0);
                current
            })
            .collect()
    }

    #[test]
    fn dilu_paper_rule_scales_out_after_twenty_of_forty_seconds() {
        let counts = run(ScalingRule::dilu_paper(), std::iter::repeat_n(150.0, 25), 1);
        assert_eq!(counts[18], 1);
        assert_eq!(
            counts[19], 2,
            "the 20th overloaded second triggers scale-out"
        );
        assert_eq!(*counts.last().unwrap(), 2);
    }

    #[test]
    fn dilu_paper_rule_scales_in_after_thirty_of_forty_seconds() {
        let counts = run(ScalingRule::dilu_paper(), std::iter::repeat_n(50.0, 45), 2);
        assert_eq!(counts[38], 2, "needs a full 40-sample history");
        assert_eq!(counts[39], 1);
    }

    #[test]
    fn responsive_rule_jumps_out_fast_and_steps_in_slowly() {
        let rule = ScalingRule::responsive(5);
        assert_eq!(rule.in_window, 60);
        let counts = run(rule.clone(), [350.0, 350.0], 1);
        assert_eq!(counts, vec![1, 4], "ceil(350 / 90) = 4 after two votes");
        let counts = run(rule, std::iter::repeat_n(10.0, 130), 4);
        assert_eq!(counts[58], 4);
        assert_eq!(counts[59], 3);
        assert_eq!(counts[119], 2, "one step per full window");
    }

    #[test]
    fn node_scale_signal_counts_as_an_out_vote_and_blocks_scale_in() {
        let mut scaler = Autoscaler::new(ScalingRule::responsive(1));
        let asking = LoadSample {
            request_rate: 0.0,
            wants_scale_out: true,
        };
        assert_eq!(scaler.observe(asking, 2, 100.0), 2);
        assert_eq!(scaler.observe(asking, 2, 100.0), 3);
        assert!(ScalingRule::by_name("sometimes", 1).is_none());
    }
}
