//! The single-GPU search through the cluster's standing cost indexes
//! (`model::cost_index`): a pod's shape as the index key, and one node's
//! best (cost, GPU) as the scan would find it.

use super::{PlacementPolicy, node_costs};
use crate::model::{ClusterState, InstanceDemand, PodNeeds, WorkClass};

/// Everything about a pod that a policy's costs may read: its demand and
/// its host needs, word by word.
pub(super) fn shape_key(demand: &InstanceDemand, needs: &PodNeeds) -> Vec<u64> {
    let mut key = Vec::with_capacity(9 + needs.models.len());
    key.extend([
        u64::from(matches!(demand.class, WorkClass::Batch)),
        demand.sm_request.to_bits(),
        demand.sm_limit.to_bits(),
        demand.memory_bytes,
        u64::from(demand.gpus),
        needs.cpu_milli,
        needs.memory_mib,
        u64::from(needs.one_node),
        needs.models.len() as u64,
    ]);
    key.extend(needs.models.iter().map(|&model| u64::from(model)));
    key
}

/// The cheapest (cost, GPU) on `node` for a one-GPU pod (ties to the
/// lower index, as `cheapest` breaks them). A cost of −0 is given as 0,
/// which it equals in the scan's comparisons.
pub(super) fn best_on_node(
    on: (
        &dyn PlacementPolicy,
        &ClusterState,
        &InstanceDemand,
        &PodNeeds,
    ),
    node: usize,
    candidates: &mut Vec<usize>,
    costs: &mut Vec<(f64, usize)>,
) -> Option<(f64, usize)> {
    costs.clear();
    node_costs(on, node, candidates, costs);
    let mut best: Option<(f64, usize)> = None;
    for &(cost, index) in costs.iter() {
        if best.is_none_or(|(best_cost, best_index)| {
            cost < best_cost || (cost == best_cost && index < best_index)
        }) {
            best = Some((cost, index));
        }
    }
    best.map(|(cost, index)| (cost + 0.0, index))
}
