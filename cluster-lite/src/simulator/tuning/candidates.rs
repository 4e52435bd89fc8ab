//! The candidates the tuning harness tries: `dilu-paper` and `fgd` as
//! references, and `dilu` over a grid of limit bounds, prices on new limit
//! excess and scarcity points under the fragmentation fit.

use std::sync::Arc;

use crate::policy::{
    Complementary, DiluPaper, FragmentationGradient, FragmentationScope, PlacementPolicy,
    WorkloadMix,
};

/// Limit bounds the harness tries under the fragmentation fit.
pub const BOUNDS: [f64; 3] = [1.35, 1.4, 1.5];
/// Prices on new limit excess it tries (units of fragmentation, before
/// the price fades as idle GPUs run out); the report shows openb
/// at each too. 1 and 2 because on the heterogeneous family, where a fit's
/// fragmentation terms are larger, `dilu`'s risk only falls to
/// `dilu-paper`'s at prices near 1; 0.6 and 0.8 because once the price
/// fades as idle GPUs run out, the generated time replays (a fifth of the
/// GPUs in use at the peak) see less of it, and 0.4 no longer meets the
/// risk gate on both families while 1 meets it by a wide margin; 4 because
/// with idle GPUs counted as run out at a quarter of the cluster in use
/// the price fades that much sooner, and 2 was then the grid's edge.
pub const PRICES: [f64; 9] = [0.0, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0];
/// Shares of GPUs in use at which idle GPUs count as run out
/// (`Complementary::scarcity_full`): the whole cluster in use (the price
/// and the node-wide measure move with the share in use, as first built),
/// half, a quarter. Under FGD's protocol, stranding weighs on later pods
/// well before the cluster is full; in a time replay with a few GPUs in use
/// all three leave the fit nearly the busy GPUs' and the price nearly whole.
pub const FADES: [f64; 3] = [1.0, 0.5, 0.25];

/// A policy the harness scores: a reference, or `dilu` at one setting.
#[derive(Debug, Clone, PartialEq)]
pub enum Candidate {
    DiluPaper,
    Fgd,
    Dilu {
        limit_bound: f64,
        risk_weight: f64,
        scarcity_full: f64,
        scope: FragmentationScope,
        /// The wake-last cost fades as idle GPUs run out (the default).
        open_cost_fades: bool,
    },
}

/// A `dilu` candidate's settings: limit bound, price on new limit excess,
/// share of GPUs in use at which idle GPUs count as run out.
pub type Setting = (f64, f64, f64);

impl Candidate {
    pub fn label(&self) -> String {
        match self {
            Self::DiluPaper => "dilu-paper".into(),
            Self::Fgd => "fgd".into(),
            Self::Dilu {
                limit_bound,
                risk_weight,
                scarcity_full,
                scope,
                open_cost_fades,
            } => {
                let whole = if *open_cost_fades {
                    ""
                } else {
                    ", wake-last cost whole"
                };
                let scope = match scope {
                    FragmentationScope::ByScarcity => "",
                    FragmentationScope::Node => ", scope node",
                    FragmentationScope::Busy => ", scope busy",
                };
                format!(
                    "dilu, bound {limit_bound}, price {risk_weight}, scarce at {}% in use{scope}{whole}",
                    scarcity_full * 100.0
                )
            }
        }
    }

    pub fn policy(&self, mix: &Arc<WorkloadMix>) -> Box<dyn PlacementPolicy> {
        match *self {
            Self::DiluPaper => Box::new(DiluPaper),
            Self::Fgd => Box::new(FragmentationGradient::new(mix.clone())),
            Self::Dilu {
                limit_bound,
                risk_weight,
                scarcity_full,
                scope,
                open_cost_fades,
            } => Box::new(Complementary {
                fragmentation_scope: scope,
                open_cost_fades,
                fragmentation_risk_weight: risk_weight,
                scarcity_full,
                limit_bound,
                ..Complementary::for_workload(mix.clone())
            }),
        }
    }

    pub fn setting(&self) -> Option<Setting> {
        match *self {
            Self::Dilu {
                limit_bound,
                risk_weight,
                scarcity_full,
                ..
            } => Some((limit_bound, risk_weight, scarcity_full)),
            _ => None,
        }
    }
}
