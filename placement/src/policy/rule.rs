//! What a placement policy says: whether a GPU admits a share of an
//! instance and what putting it there costs ([`PlacementPolicy`]), and what
//! a placement is. The search (`super::search`) turns it into placements.

use std::sync::Arc;

use crate::model::{ClusterState, GpuCell, GpuState, InstanceDemand, PodNeeds, WorkloadMix};

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
    /// A floor under [`cost`](Self::cost) (and
    /// [`costs_on_node`](Self::costs_on_node)) on every GPU of `cell` that
    /// admits `demand` in `cluster` as it stands: `Some(f64::INFINITY)`
    /// when none can, `None` (the default) when the policy cannot say.
    /// With floors the search scores the classes of nodes cell by cell,
    /// cheapest floor first, and stops where the floor passes the best
    /// cost found (see `search`).
    fn cost_floor(
        &self,
        cluster: &ClusterState,
        cell: &GpuCell,
        demand: &InstanceDemand,
    ) -> Option<f64> {
        let _ = (cluster, cell, demand);
        None
    }
    /// A fingerprint of all that [`costs_on_node`](Self::costs_on_node)
    /// reads besides the node, the pod and [`cost_drift`](Self::cost_drift)'s
    /// figure (the policy's parameters and any other cluster-wide figure),
    /// or `None` (the default) when the policy cannot say. With one, a
    /// one-GPU search may answer from a standing index of every class's
    /// best cost for the pod's shape, kept while the fingerprint holds
    /// (`ClusterState::standing_best`).
    fn cost_context(&self, cluster: &ClusterState) -> Option<u64> {
        let _ = cluster;
        None
    }
    /// The cluster-wide figure in [0, 1] that costs move with continuously
    /// and that [`cost_context`](Self::cost_context) leaves out (`dilu`:
    /// how scarce idle GPUs are, which changes whenever a GPU opens), or
    /// `None` (the default) when the context says all. A policy that
    /// wraps another and forwards its context forwards this too.
    fn cost_drift(&self, cluster: &ClusterState) -> Option<f64> {
        let _ = cluster;
        None
    }
    /// [`costs_on_node`](Self::costs_on_node), returning a bound on how
    /// much the cheapest of those costs can move per unit change of
    /// [`cost_drift`](Self::cost_drift)'s figure, the node unchanged
    /// (`f64::INFINITY`, the default: unknown). With it a standing index
    /// keeps a class scored at another value of the figure, and scores it
    /// again only where the bound lets it compete.
    fn costs_and_drift_on_node(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) -> f64 {
        self.costs_on_node(cluster, node, demand, needs, candidates, out);
        f64::INFINITY
    }
    /// Costs of placing one share of a pod on each of `candidates` (GPUs
    /// of node `node` that admit it and are not draining), pushed to `out`
    /// as (cost, GPU). The default asks [`cost`](Self::cost) per GPU; a
    /// policy that scores a whole node (`fgd`) overrides it.
    fn costs_on_node(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) {
        let _ = (node, needs);
        out.extend(
            candidates
                .iter()
                .map(|&index| (self.cost(&cluster.gpus[index], demand), index)),
        );
    }
    /// Preference for putting a pod that takes no GPU (cores and host
    /// memory only) on `node`, whose host fits it (lower is better; see
    /// [`place_host_only`](super::place_host_only)). By default [`strands_least_gpu`].
    fn host_only_cost(&self, cluster: &ClusterState, node: usize, needs: &PodNeeds) -> f64 {
        strands_least_gpu(cluster, node, needs)
    }
    /// The workload the policy measures fragmentation against, if any
    /// (see [`tell_cluster_the_workload`](super::tell_cluster_the_workload)).
    fn workload(&self) -> Option<&Arc<WorkloadMix>> {
        None
    }
    /// A looser form of the policy to try when this one places an
    /// instance nowhere (`dilu`'s soft limit bound); `None` by default.
    fn fallback(&self) -> Option<Box<dyn PlacementPolicy>> {
        None
    }
    /// Whether a multi-GPU instance must sit on GPUs of one node.
    fn gang_on_one_node(&self) -> bool {
        true
    }
    /// A policy that ranks each node only against the other nodes that fit
    /// the pod (as Kubernetes normalises a score plugin's scores over the
    /// feasible nodes: `pwr-fgd`) places a pod itself: `Some` of its
    /// placement, or of `None` where nothing fits. `None`, the default:
    /// the search by [`cost`](Self::cost) places it.
    fn place_by_ranking(
        &self,
        _cluster: &ClusterState,
        _demand: &InstanceDemand,
        _needs: &PodNeeds,
    ) -> Option<Option<Placement>> {
        None
    }
    /// The same for a pod that takes no GPU: `Some` of its node.
    fn place_host_only_by_ranking(
        &self,
        _cluster: &ClusterState,
        _needs: &PodNeeds,
    ) -> Option<Option<usize>> {
        None
    }
    /// Which replica to stop when a function scales in by one: an index into
    /// `replicas` (running instances of one function, interchangeable for
    /// its clients: in the simulator its single-GPU inference replicas), or
    /// `None` to stop the caller's default one (in the simulator the
    /// instance the trace lets depart). Only `dilu` chooses.
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
    /// GPUs the caller can put it on (the simulator: every GPU).
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

/// The default [`PlacementPolicy::host_only_cost`], for a policy that does
/// not know the workload: the GPU share free on the node times the share
/// of its free cores the pod takes (a node whose GPUs are taken loses
/// nothing to it; one with cores to spare for its free GPUs loses least),
/// then, a thousandth as much, the share of its cores left (best fit).
pub fn strands_least_gpu(cluster: &ClusterState, node: usize, needs: &PodNeeds) -> f64 {
    let Some(host) = cluster.hosts.get(node) else {
        return 0.0;
    };
    let free = host.cpu_free();
    let taken = needs.cpu_milli.min(free) as f64 / free.max(1) as f64;
    let left = free.saturating_sub(needs.cpu_milli) as f64 / host.cpu_milli.max(1) as f64;
    cluster.free_gpu_share(node) * taken + 1e-3 * left
}
