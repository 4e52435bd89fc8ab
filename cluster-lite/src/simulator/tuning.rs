//! The tuning harness that chose `dilu`'s fragmentation-fit settings
//! (`FragmentationScope`, `fragmentation_risk_weight` and the limit bound
//! under that fit), on the built-in generator's traces only; Alibaba's
//! openb trace is not read here: it stays held out. `cluster-sim-tune`
//! prints its table, and `cluster-sim-report` (`scripts/bench.sh cluster`)
//! writes it to `bench/results/cluster-sim-tuning.md`.
//!
//! Traces: `generate` with seeds from `first_seed` (default 101, 102, 103;
//! the report's headline traces use seed 1), poisson and bursty arrivals,
//! 3,200 instances sized for 4,000 GPUs. `dilu`'s fragmentation fit is given
//! each trace's task mix (shares rounded to 0.05 for the mix only, so that
//! training's continuous shares make a few dozen task types), as `fgd` is.
//!
//! For every candidate it measures
//! * the time replay on 4,000 GPUs (500 nodes of 8): GPU-hours against
//!   `dilu-paper` and SLO risk (mean Σ limits − 1 on active GPUs);
//! * FGD's protocol on 1,000 GPUs (125 nodes of 8): the trace's instances
//!   resampled until they request 130% of the capacity, none leaving; the
//!   share of capacity allocated at 100% and 130% requested.
//!
//! Rule (printed with the table), the goal applied to these
//! traces: among candidates with fewer time-replay GPU-hours than
//! `dilu-paper` at no more SLO risk (means over all traces), the most
//! capacity allocated under the protocol (mean of 100% and 130%); within
//! 0.1 point, fewer GPU-hours. The slack fit's settings (bound 1.35,
//! weights, move caps) were chosen earlier on the same generator (seeds
//! 11–20 and 101–200) and are not changed here.

use std::fmt::Write as _;
use std::sync::Arc;

use super::inflation;
use super::trace::{ArrivalPattern, TraceRecord, TraceSpec, generate};
use super::{ClusterShape, simulate};
use crate::policy::{
    Complementary, DiluPaper, FragmentationGradient, FragmentationScope, PlacementPolicy,
    WorkloadMix,
};

const GIB: u64 = 1 << 30;

struct Candidate {
    label: String,
    scope: Option<FragmentationScope>,
    risk_weight: f64,
    limit_bound: f64,
}

#[derive(Default, Clone, Copy)]
struct Score {
    hours_vs_paper: f64,
    risk: f64,
    at_100: f64,
    at_130: f64,
    runs: f64,
    protocol_runs: f64,
}

impl Score {
    fn allocation(&self) -> f64 {
        (self.at_100 + self.at_130) / (2.0 * self.protocol_runs.max(1.0))
    }
    fn hours(&self) -> f64 {
        self.hours_vs_paper / self.runs.max(1.0)
    }
    fn mean_risk(&self) -> f64 {
        self.risk / self.runs.max(1.0)
    }
}

/// The task mix of `trace` with shares rounded to 0.05 (see the module docs).
fn rounded_mix(trace: &[TraceRecord], shape: &ClusterShape) -> Arc<WorkloadMix> {
    let rounded: Vec<TraceRecord> = trace
        .iter()
        .map(|record| TraceRecord {
            sm_request: ((record.sm_request * 20.0).round() / 20.0).clamp(0.05, 1.0),
            ..record.clone()
        })
        .collect();
    Arc::new(inflation::workload_mix(&rounded, shape))
}

fn policy(candidate: &Candidate, mix: &Arc<WorkloadMix>) -> Box<dyn PlacementPolicy> {
    match candidate.scope {
        None if candidate.label == "fgd" => Box::new(FragmentationGradient::new(mix.clone())),
        None => Box::new(DiluPaper),
        Some(scope) => Box::new(Complementary {
            fragmentation_scope: scope,
            fragmentation_risk_weight: candidate.risk_weight,
            limit_bound: candidate.limit_bound,
            ..Complementary::for_workload(mix.clone())
        }),
    }
}

/// Runs the harness on `seeds` seeds from `first_seed`; `progress` is told
/// each trace as it starts. Returns the markdown table and the choice.
pub fn tune(seeds: u64, first_seed: u64, mut progress: impl FnMut(&str)) -> String {
    let mut candidates = vec![
        Candidate {
            label: "dilu-paper".into(),
            scope: None,
            risk_weight: 0.0,
            limit_bound: 1.5,
        },
        Candidate {
            label: "fgd".into(),
            scope: None,
            risk_weight: 0.0,
            limit_bound: 1.0,
        },
    ];
    let mut grid: Vec<(FragmentationScope, &str, f64, f64)> = Vec::new();
    for (scope, name) in [
        (FragmentationScope::Node, "node"),
        (FragmentationScope::Busy, "busy"),
        (FragmentationScope::ByScarcity, "by-scarcity"),
    ] {
        for risk_weight in [0.4, 0.0] {
            for limit_bound in [1.35, 1.5] {
                grid.push((scope, name, risk_weight, limit_bound));
            }
        }
    }
    grid.push((FragmentationScope::ByScarcity, "by-scarcity", 0.1, 1.35));
    grid.push((FragmentationScope::ByScarcity, "by-scarcity", 0.1, 1.5));
    grid.push((FragmentationScope::ByScarcity, "by-scarcity", 0.0, 1.25));
    grid.push((FragmentationScope::ByScarcity, "by-scarcity", 0.0, 1.4));
    for (scope, name, risk_weight, limit_bound) in grid {
        candidates.push(Candidate {
            label: format!("dilu, scope {name}, risk weight {risk_weight}, bound {limit_bound}"),
            scope: Some(scope),
            risk_weight,
            limit_bound,
        });
    }
    let mut scores = vec![Score::default(); candidates.len()];
    let replay_shape = ClusterShape::uniform(4000, 8, 80 * GIB);
    let protocol_shape = ClusterShape::uniform(1000, 8, 80 * GIB);
    let checkpoints = [1.0, 1.3];
    for seed in first_seed..first_seed + seeds {
        for arrival in [ArrivalPattern::Poisson, ArrivalPattern::Bursty] {
            progress(&format!("seed {seed} {arrival:?}"));
            let trace = generate(&TraceSpec {
                instances: 3200,
                cluster_gpus: 4000,
                arrival,
                seed,
            });
            let mix = rounded_mix(&trace, &replay_shape);
            let paper = simulate(&DiluPaper, &trace, &replay_shape, |_, _| {});
            let inflated = inflation::inflate(&trace, protocol_shape.gpus(), 1.3, seed);
            let inflated_mix = rounded_mix(&inflated, &protocol_shape);
            for (candidate, score) in candidates.iter().zip(&mut scores) {
                let result = simulate(
                    policy(candidate, &mix).as_ref(),
                    &trace,
                    &replay_shape,
                    |_, _| {},
                );
                score.hours_vs_paper += result.gpu_hours / paper.gpu_hours - 1.0;
                score.risk += result.mean_limit_excess;
                score.runs += 1.0;
                let protocol = inflation::simulate_inflation(
                    policy(candidate, &inflated_mix).as_ref(),
                    &inflated,
                    &protocol_shape,
                    &checkpoints,
                );
                if let [at_100, at_130] = protocol.points[..] {
                    score.at_100 += at_100.allocated;
                    score.at_130 += at_130.allocated;
                    score.protocol_runs += 1.0;
                }
            }
        }
    }
    // The goal, on these traces: fewer GPU-hours than dilu-paper
    // at no more risk; among those, the most allocated under the protocol
    // (within 0.1 point: fewer GPU-hours).
    let paper = scores[0];
    let mut chosen: Option<usize> = None;
    for (index, (candidate, score)) in candidates.iter().zip(&scores).enumerate() {
        if candidate.scope.is_none()
            || score.hours() >= paper.hours()
            || score.mean_risk() > paper.mean_risk()
        {
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
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# dilu's fragmentation-fit settings, chosen on generated traces\n\n\
         Written by the tuning harness (`cluster-lite/src/simulator/tuning.rs`, {seeds} seeds from\n\
         {first_seed}): `scripts/bench.sh cluster` writes this file, `cluster-sim-tune` prints the same;\n\
         nothing here is edited by hand. It chose `dilu`'s fragmentation-fit settings.\n\
         Traces: the built-in generator, seeds {first_seed}–{}, poisson and bursty arrivals,\n\
         3,200 instances each. Alibaba's openb trace is not read here; the candidates below were\n\
         drawn up after openb probes had been seen, so openb is held out but not blind.\n\
         Time replay on 4,000 GPUs (500 nodes of 8); FGD's protocol on 1,000 GPUs (125 nodes\n\
         of 8), the trace's instances resampled to 130% of capacity. Means over {} traces.\n",
        first_seed + seeds - 1,
        2 * seeds
    );
    let _ = writeln!(
        out,
        "| candidate | time replay GPU-hours vs dilu-paper | SLO risk (mean Σlim−1) | protocol: allocated at 100% | at 130% |\n|---|---:|---:|---:|---:|"
    );
    for (candidate, score) in candidates.iter().zip(&scores) {
        let _ = writeln!(
            out,
            "| {} | {:+.2}% | {:.4} | {:.2}% | {:.2}% |",
            candidate.label,
            100.0 * score.hours(),
            score.mean_risk(),
            100.0 * score.at_100 / score.protocol_runs.max(1.0),
            100.0 * score.at_130 / score.protocol_runs.max(1.0),
        );
    }
    let _ = writeln!(
        out,
        "\nRule (the issue's goal, on these traces): among `dilu` candidates with fewer time-replay\n\
         GPU-hours than `dilu-paper` at no more SLO risk, the most capacity allocated under FGD's\n\
         protocol (mean of 100% and 130%; within 0.1 point, fewer GPU-hours).\n\
         Chosen: {}.",
        chosen.map_or("none qualifies".to_string(), |index| candidates[index]
            .label
            .clone())
    );
    out
}
