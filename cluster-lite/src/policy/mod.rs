//! Placement policies behind one interface.
//!
//! A policy says two things about a GPU and an instance: whether the GPU
//! *admits* one more share of the instance, and how much it *costs* to put it
//! there (lower is better). The search in this module turns that into a
//! placement: the cheapest admitting GPU for single-GPU instances, and for
//! multi-GPU (gang) instances the cheapest set of GPUs, on one node unless the
//! policy says otherwise. The same search answers "can this node take it, and
//! how well?" for the Kubernetes extender, and [`place_on_one_node`] keeps
//! gangs on one node for the embedded coordinator. A policy may also choose
//! which replica of a function stops when it scales in
//! ([`PlacementPolicy::choose_scale_in_victim`]), and where a replica or a
//! restartable gang's share left alone on its GPU moves while the cluster
//! shrinks ([`PlacementPolicy::consolidation_target`]). GPUs that are
//! draining (see `consolidation`) take nothing new under any policy.

mod baselines;
mod dilu;

use crate::model::{ClusterState, GpuState, InstanceDemand};

pub use baselines::{DiluPaper, Exclusive, InflessLimits, InflessRequests};
pub use dilu::Complementary;

/// Cost added when a policy would rather not wake an idle GPU.
pub const OPEN_GPU_COST: f64 = 10.0;

/// One placement rule.
pub trait PlacementPolicy: Send + Sync {
    /// The name used on the command line.
    fn name(&self) -> &'static str;
    /// Whether `gpu` can take one more per-GPU share of `demand`.
    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool;
    /// Preference for `gpu` (lower is better); only asked when it admits.
    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64;
    /// Whether a multi-GPU instance must sit on GPUs of one node.
    fn gang_on_one_node(&self) -> bool {
        true
    }
    /// Which replica to stop when a function scales in by one: an index into
    /// `replicas` (running instances of one function, interchangeable for
    /// its clients: in the simulator its single-GPU inference replicas, in
    /// the embedded coordinator its instances on connected nodes), or `None`
    /// to stop the caller's default one (in the simulator the instance the
    /// trace lets depart, in the embedded coordinator the newest). Only
    /// `dilu` chooses.
    fn choose_scale_in_victim(
        &self,
        _cluster: &ClusterState,
        _replicas: &[Replica<'_>],
    ) -> Option<usize> {
        None
    }
    /// Where one GPU's share of an instance, alone on GPU `request.source`,
    /// should move so that the source goes idle (see `consolidation`): one
    /// of `request.within`, busy, not draining and not among the GPUs the
    /// instance keeps; `None` leaves it where it is. Only `dilu` moves work.
    fn consolidation_target(
        &self,
        _cluster: &ClusterState,
        _request: &MoveRequest<'_>,
    ) -> Option<usize> {
        None
    }
}

/// A consolidation move the caller considers: a replica (its whole demand)
/// or one GPU's share of a restartable gang.
#[derive(Debug, Clone, Copy)]
pub struct MoveRequest<'a> {
    /// What the moving work needs on one GPU (`gpus` is the instance's
    /// count; the share is per GPU).
    pub share: &'a InstanceDemand,
    /// The GPU it leaves; it is the only work there.
    pub source: usize,
    /// GPUs the instance keeps holding (a gang's other GPUs).
    pub keeps: &'a [usize],
    /// GPUs the caller can put it on (the simulator: every GPU; the
    /// embedded coordinator: the GPUs of the instance's node).
    pub within: &'a [usize],
}

/// A running replica of a function, as the scale-in choice sees it.
#[derive(Debug, Clone, Copy)]
pub struct Replica<'a> {
    pub demand: &'a InstanceDemand,
    pub gpus: &'a [usize],
}

/// Where an instance goes: global GPU indices and the mean cost per GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub gpus: Vec<usize>,
    pub cost: f64,
}

/// Every policy name, in the order reports list them.
pub const POLICY_NAMES: [&str; 5] = ["dilu", "dilu-paper", "infless-r", "infless-l", "exclusive"];

/// Builds a policy from its command-line name.
pub fn policy_by_name(name: &str) -> Option<Box<dyn PlacementPolicy>> {
    Some(match name {
        "dilu" => Box::new(Complementary::default()),
        "dilu-paper" => Box::new(DiluPaper),
        "infless-r" => Box::new(InflessRequests),
        "infless-l" => Box::new(InflessLimits),
        "exclusive" => Box::new(Exclusive),
        _ => return None,
    })
}

/// Chooses GPUs for `demand` anywhere in the cluster, or `None` if nothing fits.
pub fn place(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
) -> Option<Placement> {
    let wanted = demand.gpus.max(1) as usize;
    if wanted == 1 || !policy.gang_on_one_node() {
        return cheapest_gpus(policy, cluster, demand, 0..cluster.gpus.len(), wanted);
    }
    place_on_one_node(policy, cluster, demand)
}

/// Like [`place`], but every GPU of the placement is on one node, whatever
/// the policy's gang preference (for front ends whose nodes host an instance
/// only on their own GPUs).
pub fn place_on_one_node(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
) -> Option<Placement> {
    let mut best: Option<Placement> = None;
    for node in 0..cluster.nodes.len() {
        if let Some(candidate) = place_on_node(policy, cluster, demand, node)
            && best
                .as_ref()
                .is_none_or(|current| candidate.cost < current.cost)
        {
            best = Some(candidate);
        }
    }
    best
}

/// Chooses GPUs for `demand` among the GPUs of one node.
pub fn place_on_node(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    node: usize,
) -> Option<Placement> {
    let range = cluster.nodes.get(node)?.clone();
    cheapest_gpus(policy, cluster, demand, range, demand.gpus.max(1) as usize)
}

fn cheapest_gpus(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    range: std::ops::Range<usize>,
    wanted: usize,
) -> Option<Placement> {
    if wanted == 1 {
        let mut best: Option<(f64, usize)> = None;
        for index in range {
            let gpu = &cluster.gpus[index];
            if gpu.draining > 0 || !policy.admits(gpu, demand) {
                continue;
            }
            let cost = policy.cost(gpu, demand);
            if best.is_none_or(|(best_cost, _)| cost < best_cost) {
                best = Some((cost, index));
            }
        }
        return best.map(|(cost, index)| Placement {
            gpus: vec![index],
            cost,
        });
    }
    let mut admitted: Vec<(f64, usize)> = range
        .filter(|&index| {
            let gpu = &cluster.gpus[index];
            gpu.draining == 0 && policy.admits(gpu, demand)
        })
        .map(|index| (policy.cost(&cluster.gpus[index], demand), index))
        .collect();
    if admitted.len() < wanted {
        return None;
    }
    admitted.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    admitted.truncate(wanted);
    let cost = admitted.iter().map(|(cost, _)| cost).sum::<f64>() / wanted as f64;
    let mut gpus: Vec<usize> = admitted.into_iter().map(|(_, index)| index).collect();
    gpus.sort_unstable();
    Some(Placement { gpus, cost })
}

#[cfg(test)]
mod tests;
