//! What the tuning harness scores for each candidate over its traces, and
//! the rule that picks one (see `tuning`'s module documentation).

/// Sums over traces of one candidate's measures.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Score {
    pub hours_vs_paper: f64,
    pub risk: f64,
    pub at_100: f64,
    pub at_130: f64,
    pub runs: f64,
    pub protocol_runs: f64,
}

impl Score {
    pub(crate) fn allocation(&self) -> f64 {
        (self.at_100 + self.at_130) / (2.0 * self.protocol_runs.max(1.0))
    }
    pub(crate) fn hours(&self) -> f64 {
        self.hours_vs_paper / self.runs.max(1.0)
    }
    pub(crate) fn mean_risk(&self) -> f64 {
        self.risk / self.runs.max(1.0)
    }
    pub(crate) fn add(&mut self, other: &Score) {
        self.hours_vs_paper += other.hours_vs_paper;
        self.risk += other.risk;
        self.at_100 += other.at_100;
        self.at_130 += other.at_130;
        self.runs += other.runs;
        self.protocol_runs += other.protocol_runs;
    }
}

/// The rule (module docs): `scores[paper]` is `dilu-paper`'s; only indices
/// in `eligible` may be chosen. Among those with fewer GPU-hours than
/// `dilu-paper` at no more risk, the most allocated under the protocol;
/// within 0.1 point of it, fewer GPU-hours. `None` when none qualifies.
pub fn choose(scores: &[Score], paper: usize, eligible: &[usize]) -> Option<usize> {
    let paper = scores.get(paper)?;
    let mut chosen: Option<usize> = None;
    for &index in eligible {
        let Some(score) = scores.get(index) else {
            continue;
        };
        if score.hours() >= paper.hours() || score.mean_risk() > paper.mean_risk() {
            continue;
        }
        let better = chosen.is_none_or(|best| {
            let best = &scores[best];
            let difference = score.allocation() - best.allocation();
            difference > 0.001 || (difference.abs() <= 0.001 && score.hours() < best.hours())
        });
        if better {
            chosen = Some(index);
        }
    }
    chosen
}
