//! Placement policies behind one interface ([`rule`]: what a policy says,
//! [`search`]: how a placement follows from it, then the policies).
//!
//! A policy says two things about a GPU and an instance: whether the GPU
//! *admits* one more share of the instance, and how much it *costs* to put it
//! there (lower is better). The search turns that into a
//! placement: the cheapest admitting GPU for single-GPU instances, and for
//! multi-GPU (gang) instances the cheapest set of GPUs, on one node unless the
//! policy says otherwise. The same search answers "can this node take it, and
//! how well?" for the Kubernetes extender and the node manager, and
//! [`place_on_one_node`] keeps gangs on one node whatever the policy
//! prefers. A policy may also choose
//! which replica of a function stops when it scales in
//! ([`PlacementPolicy::choose_scale_in_victim`]), and where a replica or a
//! restartable gang's share left alone on its GPU moves while the cluster
//! shrinks ([`PlacementPolicy::consolidation_target`]). GPUs that are
//! draining (see `consolidation`) take nothing new under any policy.

mod baselines;
mod dilu;
mod fgd;
mod fragmentation_memo;
mod power;
pub mod rule;
pub mod search;

use std::sync::Arc;

use crate::model::ClusterState;

pub use crate::model::{TaskType, WorkloadMix};
pub use baselines::{DiluPaper, Exclusive, InflessLimits, InflessRequests};
pub use dilu::{
    Complementary, FRAGMENTATION_LIMIT_BOUND, FRAGMENTATION_RISK_WEIGHT,
    FRAGMENTATION_SCARCITY_FULL, FragmentationScope,
};
pub use fgd::FragmentationGradient;
pub use power::{POWER_WEIGHT, PWR_FGD_WEIGHTS, PowerAware, PwrFgd};
pub use rule::{
    MoveRequest, OPEN_GPU_COST, Placement, PlacementPolicy, Replica, strands_least_gpu,
};
pub use search::{
    place, place_host_only, place_on_node, place_on_one_node, place_pod, place_pod_by_classes,
    place_pod_scanning_every_node,
};

/// Every policy name, in the order reports list them.
pub const POLICY_NAMES: [&str; 6] = [
    "dilu",
    "dilu-paper",
    "fgd",
    "infless-r",
    "infless-l",
    "exclusive",
];

/// Policies that weigh power (`crate::model::power`), for the simulator
/// (which builds them with its settings: [`PowerAware`], [`PwrFgd`]): not
/// among `all`, nor known to [`policy_by_name`], since the extender scores
/// a node at a time and `pwr-fgd` ranks nodes against each other.
pub const POWER_POLICY_NAMES: [&str; 2] = ["dilu-power", "pwr-fgd"];

/// Builds a policy from its command-line name (`fgd` measures fragmentation
/// against each arriving pod alone; see [`policy_for_workload`]).
pub fn policy_by_name(name: &str) -> Option<Box<dyn PlacementPolicy>> {
    policy_for_workload(name, Arc::new(WorkloadMix::default()))
}

/// Builds a policy that knows the workload it will see: `fgd` measures
/// fragmentation against `mix` (the task types and their popularity, as
/// FGD's scheduler is given them); the other policies ignore it.
pub fn policy_for_workload(name: &str, mix: Arc<WorkloadMix>) -> Option<Box<dyn PlacementPolicy>> {
    Some(match name {
        "dilu" => Box::new(Complementary::for_workload(mix.clone())),
        "dilu-paper" => Box::new(DiluPaper),
        "fgd" => Box::new(FragmentationGradient::new(mix)),
        "infless-r" => Box::new(InflessRequests),
        "infless-l" => Box::new(InflessLimits),
        "exclusive" => Box::new(Exclusive),
        _ => return None,
    })
}

/// Tells `cluster` the workload `policy` measures fragmentation against
/// (`fgd`, and `dilu` for a known workload), if any, so that searches on
/// it can stop early by that policy's cost floors
/// (`ClusterState::expect_workload`); without it those searches score
/// every class of nodes. Front ends call it once, after building the
/// cluster.
pub fn tell_cluster_the_workload(policy: &dyn PlacementPolicy, cluster: &mut ClusterState) {
    if let Some(workload) = policy.workload() {
        cluster.expect_workload(workload.clone());
    }
}

#[cfg(test)]
mod tests;
