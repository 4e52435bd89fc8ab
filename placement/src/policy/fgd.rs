//! `fgd`: fragmentation gradient descent, the placement of "Beware of
//! Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
//! Gradient Descent" (ATC'23), written here from the paper's definitions and
//! the behaviour of its public simulator.
//!
//! The scheduler is given the *workload*: the task types it expects (CPU,
//! GPU share per GPU, GPU count, allowed GPU models) and how often each
//! occurs. A node's **fragmentation for one task type** is the free GPU
//! share on it that this task type could not use:
//!
//! * if the task cannot run on the node at all (it needs no GPU, its GPU
//!   model is not there, the node lacks the CPU, or fewer GPUs than it asks
//!   for each have its share free), every free share on the node counts;
//! * otherwise only the free shares of GPUs with less free than the task's
//!   per-GPU share count.
//!
//! The node's fragmentation is the popularity-weighted sum over task types.
//! A pod goes to the node and GPU where placing it *increases* that sum the
//! least (the steepest descent of the measure). Whole-GPU pods take idle
//! GPUs. Admission reserves requests only (Σ requests ≤ 1, memory fits);
//! FGD knows nothing of SM limits.
//!
//! Differences from the simulator, on purpose: scores are compared exactly
//! (it quantises them through a sigmoid to an integer 0–100 and breaks ties
//! at random; here ties go to the lower GPU index), and host memory is
//! checked on admission as every policy here does.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::fast_hash::FastMap;

use super::rule::PlacementPolicy;
use crate::model::{
    ClusterState, GpuCell, GpuModel, GpuState, InstanceDemand, PodNeeds, SHARE_EPSILON, TaskType,
    WorkloadMix,
};

/// Node states already measured: a node's fragmentation depends only on
/// its GPU model, free CPU and the multiset of its GPUs' free shares, and
/// most nodes of a large cluster are in a few such states (idle, full).
/// Keyed by those exactly (`memo_key`), and measured on the shares in the
/// key's order, so that a state's value does not depend on which node
/// was measured first (two searches visiting nodes in different orders
/// decide alike).
type Memo = Mutex<FastMap<MemoKey, f64>>;

/// Model and free CPU, then each GPU's free share (its bits), sorted,
/// unused slots `u64::MAX` (no share has those bits).
type MemoKey = [u64; 2 + MEMO_GPUS];

/// Nodes of up to this many GPUs are memoised.
const MEMO_GPUS: usize = 8;

/// The memo's key for a node state and its free shares in the key's
/// order; `None` (measure without the memo) for nodes of more than
/// `MEMO_GPUS` GPUs.
fn memo_key(free: &[f64], cpu_free: u64, model: GpuModel) -> Option<(MemoKey, [f64; MEMO_GPUS])> {
    if free.len() > MEMO_GPUS {
        return None;
    }
    let mut sorted = [0.0f64; MEMO_GPUS];
    sorted[..free.len()].copy_from_slice(free);
    sorted[..free.len()].sort_unstable_by(f64::total_cmp);
    let mut key = [u64::MAX; 2 + MEMO_GPUS];
    key[0] = u64::from(model);
    key[1] = cpu_free;
    for (slot, share) in key[2..].iter_mut().zip(&sorted[..free.len()]) {
        *slot = share.to_bits();
    }
    Some((key, sorted))
}

/// Which GPUs' free shares a fragmentation measure counts.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// Every GPU of the node (FGD's measure).
    Node,
    /// GPUs in use only.
    Busy,
}

/// Nodes of up to this many GPUs are scored without allocating.
const STACK_GPUS: usize = 16;

/// Measured states kept before the memo starts over.
const MEMO_LIMIT: usize = 200_000;

/// The `fgd` policy.
#[derive(Debug, Clone, Default)]
pub struct FragmentationGradient {
    mix: Arc<WorkloadMix>,
    /// The mix's total weight (a bound's factor, asked per cell).
    mix_weight: f64,
    memo: Arc<Memo>,
    /// The mix, word by word (its part of `cost_context`).
    fingerprint: u64,
}

impl FragmentationGradient {
    /// FGD for the workload `mix`; with an empty mix each pod is measured
    /// against pods like itself.
    pub fn new(mix: Arc<WorkloadMix>) -> Self {
        let fingerprint = crate::fast_hash::fingerprint(mix.types.iter().flat_map(|task| {
            [task.cpu_milli, task.share.to_bits(), u64::from(task.gpus)]
                .into_iter()
                .chain([task.models.len() as u64, task.weight.to_bits()])
                .chain(task.models.iter().map(|&model| u64::from(model)))
        }));
        Self {
            mix_weight: mix.total_weight(),
            mix,
            memo: Arc::default(),
            fingerprint,
        }
    }

    /// A floor under the change in a node's fragmentation (on every GPU or
    /// on busy ones only) that placing `demand` on a GPU of `cell` makes,
    /// or `None` when the cluster does not expect this policy's workload
    /// (`ClusterState::expect_workload`): one share `s` (at most 1) lowers
    /// it by at most `s` times a busy GPU's fragment weight, or an idle
    /// GPU's weight (see `WorkloadMix::fragment_weights`). This is what
    /// lets a search stop early. A gang's later GPUs see its earlier ones
    /// placed: there no floor is finer than the node's whole free share,
    /// every type counting it.
    pub fn increase_floor(&self, cell: &GpuCell, demand: &InstanceDemand) -> Option<f64> {
        let weight = cell.most_fragment_weight(&self.mix)?;
        let share = demand.sm_request;
        if share.is_nan() || share < 0.0 {
            return None;
        }
        if demand.gpus > 1 {
            return Some(-self.mix_weight * cell.largest_node as f64);
        }
        Some(if cell.idle {
            -weight * share.max(1.0)
        } else {
            -share * weight
        })
    }

    /// The workload, word by word: what a policy built on this measure
    /// puts in its [`PlacementPolicy::cost_context`].
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether a workload was given (else each pod is its own workload).
    pub fn knows_workload(&self) -> bool {
        !self.mix.types.is_empty()
    }

    /// The fragmentation of a node state, from the memo when it was
    /// measured before (`memo`: the locked memo, held for one node's
    /// lookups; `None` when the workload is unknown).
    fn memoised(
        &self,
        memo: &mut Option<MutexGuard<'_, FastMap<MemoKey, f64>>>,
        free: &[f64],
        cpu_free: u64,
        model: GpuModel,
        fallback: &TaskType,
    ) -> f64 {
        let (Some(memo), Some((key, sorted))) = (memo.as_mut(), memo_key(free, cpu_free, model))
        else {
            return self.node_fragmentation(free, cpu_free, model, fallback);
        };
        if let Some(&value) = memo.get(&key) {
            return value;
        }
        let value = self.node_fragmentation(&sorted[..free.len()], cpu_free, model, fallback);
        if memo.len() >= MEMO_LIMIT {
            memo.clear();
        }
        memo.insert(key, value);
        value
    }

    /// The memo, locked, if the workload is known (else states are
    /// measured against each pod and not kept).
    fn lock_memo(&self) -> Option<MutexGuard<'_, FastMap<MemoKey, f64>>> {
        if !self.knows_workload() {
            return None;
        }
        Some(
            self.memo
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }

    /// How much placing one share of `demand` on each of `candidates`
    /// (GPUs of `node`) raises the node's fragmentation, pushed as
    /// (increase, GPU). A gang is scored as taking the first `gpus`
    /// candidates, every candidate getting that score.
    pub fn increases(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) {
        let mut memo = self.lock_memo();
        self.increases_in(
            &mut memo,
            (cluster, node, demand, needs),
            candidates,
            out,
            Scope::Node,
        );
    }

    /// Like [`increases`](Self::increases), but only the free shares of
    /// GPUs in use count (an idle GPU is no capacity anyone pays for until
    /// work lands on it): the fragmentation a placement leaves on the GPUs
    /// that cost GPU-hours.
    pub fn busy_increases(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) {
        let mut memo = self.lock_memo();
        self.increases_in(
            &mut memo,
            (cluster, node, demand, needs),
            candidates,
            out,
            Scope::Busy,
        );
    }

    /// [`busy_increases`](Self::busy_increases), then, if `node_wide`,
    /// [`increases`](Self::increases) after them in `out`, under one lock
    /// of the memo (`dilu` blends the two per candidate).
    #[allow(clippy::too_many_arguments)]
    pub fn busy_then_node_increases(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
        node_wide: bool,
    ) {
        let mut memo = self.lock_memo();
        let on = (cluster, node, demand, needs);
        self.increases_in(&mut memo, on, candidates, out, Scope::Busy);
        if node_wide {
            self.increases_in(&mut memo, on, candidates, out, Scope::Node);
        }
    }

    /// The increases under `scope`, with the memo already locked (`on`:
    /// the cluster, the node, the pod's demand and needs).
    fn increases_in(
        &self,
        memo: &mut Option<MutexGuard<'_, FastMap<MemoKey, f64>>>,
        on: (&ClusterState, usize, &InstanceDemand, &PodNeeds),
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
        scope: Scope,
    ) {
        let (cluster, node, demand, needs) = on;
        let range = cluster.nodes[node].clone();
        let start = range.start;
        // On the stack for nodes of up to STACK_GPUS GPUs (this runs for
        // every busy node of every search).
        let mut on_stack = [0.0f64; STACK_GPUS];
        let mut on_heap = Vec::new();
        let free: &mut [f64] = if range.len() <= STACK_GPUS {
            &mut on_stack[..range.len()]
        } else {
            on_heap.resize(range.len(), 0.0);
            &mut on_heap
        };
        for (slot, gpu) in free.iter_mut().zip(&cluster.gpus[range]) {
            *slot = match scope {
                Scope::Busy if !gpu.is_active() => 0.0,
                _ => gpu.free_share(),
            };
        }
        // What a GPU has free once work lands on it (an idle GPU all of it).
        let opened = |index: usize, free: &[f64]| {
            if matches!(scope, Scope::Busy) && !cluster.gpus[index].is_active() {
                1.0
            } else {
                free[index - start]
            }
        };
        let (cpu_free, model) = cores_and_model(cluster, node);
        let fallback = TaskType {
            cpu_milli: needs.cpu_milli,
            share: demand.sm_request,
            gpus: demand.gpus.max(1),
            // Only measured against when the workload is unknown.
            models: if self.knows_workload() {
                Vec::new()
            } else {
                needs.models.clone()
            },
            weight: 1.0,
        };
        let before = self.memoised(memo, free, cpu_free, model, &fallback);
        let cpu_after = cpu_free.saturating_sub(needs.cpu_milli);
        let wanted = demand.gpus.max(1) as usize;
        if wanted > 1 {
            if candidates.len() < wanted {
                return;
            }
            for &index in &candidates[..wanted] {
                free[index - start] = opened(index, free) - demand.sm_request;
            }
            let after = self.memoised(memo, free, cpu_after, model, &fallback);
            out.extend(candidates.iter().map(|&index| (after - before, index)));
            return;
        }
        // GPUs with the same free share give the same outcome: score each
        // distinct free share once.
        let mut scored = [(0.0f64, 0.0f64, 0.0f64); STACK_GPUS];
        let mut distinct = 0;
        for &index in candidates {
            let original = free[index - start];
            let usable = opened(index, free);
            let increase = match scored[..distinct].iter().find(|(share, was, _)| {
                (share - usable).abs() < 1e-12 && (was - original).abs() < 1e-12
            }) {
                Some(&(_, _, increase)) => increase,
                None => {
                    free[index - start] = usable - demand.sm_request;
                    let after = self.memoised(memo, free, cpu_after, model, &fallback);
                    free[index - start] = original;
                    if distinct < STACK_GPUS {
                        scored[distinct] = (usable, original, after - before);
                        distinct += 1;
                    }
                    after - before
                }
            };
            out.push((increase, index));
        }
    }

    /// How much a pod that takes no GPU but `needs`' cores raises `node`'s
    /// fragmentation (FGD scores such pods as any other: the cores it takes
    /// may leave task types unable to run there, so every free share of the
    /// node becomes their fragment). `None` when the workload is unknown
    /// (measured against the pod alone, which uses no GPU, it is 0
    /// everywhere).
    pub fn host_only_increase(
        &self,
        cluster: &ClusterState,
        node: usize,
        needs: &PodNeeds,
    ) -> Option<f64> {
        let mut memo = self.lock_memo();
        memo.as_ref()?;
        let free: Vec<f64> = cluster.gpus[cluster.nodes[node].clone()]
            .iter()
            .map(GpuState::free_share)
            .collect();
        let (cpu_free, model) = cores_and_model(cluster, node);
        // Not measured against: the workload is known.
        let unused = TaskType {
            cpu_milli: needs.cpu_milli,
            share: 0.0,
            gpus: 0,
            models: Vec::new(),
            weight: 1.0,
        };
        let before = self.memoised(&mut memo, &free, cpu_free, model, &unused);
        let cpu_after = cpu_free.saturating_sub(needs.cpu_milli);
        let after = self.memoised(&mut memo, &free, cpu_after, model, &unused);
        Some(after - before)
    }

    /// Fragmentation of a node with per-GPU free shares `free`, `cpu_free`
    /// milli-cores free and GPUs of `model`, for the workload (or for
    /// `fallback` alone when the workload is empty).
    pub fn node_fragmentation(
        &self,
        free: &[f64],
        cpu_free: u64,
        model: GpuModel,
        fallback: &TaskType,
    ) -> f64 {
        let total: f64 = free.iter().sum();
        if total <= SHARE_EPSILON {
            return 0.0;
        }
        let types = if self.mix.types.is_empty() {
            std::slice::from_ref(fallback)
        } else {
            &self.mix.types
        };
        types
            .iter()
            .map(|task| task.weight * unusable_share(task, free, total, cpu_free, model))
            .sum()
    }
}

/// `node`'s free cores and GPU model (unbounded cores on a node without
/// host limits).
fn cores_and_model(cluster: &ClusterState, node: usize) -> (u64, GpuModel) {
    cluster
        .hosts
        .get(node)
        .map_or((u64::MAX, 0), |host| (host.cpu_free(), host.model))
}

/// Free GPU share of a node that `task` could not use (see the module docs).
fn unusable_share(
    task: &TaskType,
    free: &[f64],
    total: f64,
    cpu_free: u64,
    model: GpuModel,
) -> f64 {
    let runnable = task.gpus > 0
        && cpu_free >= task.cpu_milli
        && (task.models.is_empty() || task.models.contains(&model));
    if !runnable {
        return total;
    }
    let mut fitting = 0u32;
    let mut unusable = 0.0;
    for &share in free {
        if task.fits_in(share) {
            fitting += 1;
        } else {
            unusable += share;
        }
    }
    if fitting >= task.gpus {
        unusable
    } else {
        total
    }
}

impl PlacementPolicy for FragmentationGradient {
    fn name(&self) -> &'static str {
        "fgd"
    }

    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        gpu.sm_request_sum + demand.sm_request <= 1.0 + SHARE_EPSILON && gpu.memory_fits(demand)
    }

    /// Without a node view (a caller that scores GPUs one by one): best fit.
    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        1.0 - (gpu.sm_request_sum + demand.sm_request)
    }

    fn workload(&self) -> Option<&Arc<WorkloadMix>> {
        self.knows_workload().then_some(&self.mix)
    }

    fn host_only_cost(&self, cluster: &ClusterState, node: usize, needs: &PodNeeds) -> f64 {
        self.host_only_increase(cluster, node, needs)
            .unwrap_or_else(|| super::rule::strands_least_gpu(cluster, node, needs))
    }

    fn cost_floor(&self, cell: &GpuCell, demand: &InstanceDemand) -> Option<f64> {
        let floor = self.increase_floor(cell, demand)?;
        Some(if cell.may_fit_request(demand) {
            floor
        } else {
            f64::INFINITY
        })
    }

    /// Costs read the node and the workload alone.
    fn cost_context(&self, _cluster: &ClusterState) -> Option<u64> {
        Some(self.fingerprint)
    }

    fn costs_on_node(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) {
        self.increases(cluster, node, demand, needs, candidates, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(share: f64, gpus: u32, weight: f64) -> TaskType {
        TaskType {
            cpu_milli: 0,
            share,
            gpus,
            models: Vec::new(),
            weight,
        }
    }

    #[test]
    fn fragmentation_counts_free_shares_a_task_cannot_use() {
        let policy = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![task(0.5, 1, 1.0)],
        }));
        let any = task(0.5, 1, 1.0);
        // 0.3 free on GPU 0 is too small for a half-GPU task; GPU 1 fits it.
        let frag = policy.node_fragmentation(&[0.3, 1.0], 0, 0, &any);
        assert!((frag - 0.3).abs() < 1e-9);
        // Nothing fits: every free share is a fragment.
        let frag = policy.node_fragmentation(&[0.3, 0.2], 0, 0, &any);
        assert!((frag - 0.5).abs() < 1e-9);
        // A whole-GPU pair task on a node with one idle GPU: all of it.
        let pairs = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![task(1.0, 2, 1.0)],
        }));
        assert!((pairs.node_fragmentation(&[1.0, 0.4], 0, 0, &any) - 1.4).abs() < 1e-9);
        assert!((pairs.node_fragmentation(&[1.0, 1.0, 0.4], 0, 0, &any) - 0.4).abs() < 1e-9);
    }

    #[test]
    fn a_missing_model_or_cpu_makes_the_whole_node_a_fragment() {
        let mut picky = task(0.5, 1, 1.0);
        picky.models = vec![1];
        let policy = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![picky.clone()],
        }));
        assert!((policy.node_fragmentation(&[1.0], 0, 0, &picky) - 1.0).abs() < 1e-9);
        assert!(policy.node_fragmentation(&[1.0], 0, 1, &picky).abs() < 1e-9);
        let mut hungry = task(0.5, 1, 1.0);
        hungry.cpu_milli = 8000;
        let policy = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![hungry.clone()],
        }));
        assert!((policy.node_fragmentation(&[1.0], 4000, 0, &hungry) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_pod_goes_where_it_leaves_room_for_the_workload() {
        use crate::model::WorkClass;
        use crate::policy::place;
        // One node: GPU 0 half used, GPU 1 idle. The workload is whole-GPU
        // pods, so a half-GPU pod belongs on GPU 0 (GPU 1 stays whole).
        let mut cluster = ClusterState::uniform(1, 2, 100);
        let half = InstanceDemand {
            class: WorkClass::Batch,
            sm_request: 0.5,
            sm_limit: 0.5,
            memory_bytes: 1,
            gpus: 1,
        };
        cluster.apply(&half, &[0]);
        let whole_gpu_workload = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![task(1.0, 1, 1.0)],
        }));
        let placement = place(&whole_gpu_workload, &cluster, &half).unwrap();
        assert_eq!(placement.gpus, vec![0]);
        // GPU 1 a quarter used, workload of 0.75 pods: a half pod on GPU 0
        // leaves 0.5 there that no 0.75 pod can use, on GPU 1 only 0.25.
        let mut other = ClusterState::uniform(1, 2, 100);
        let quarter = InstanceDemand {
            sm_request: 0.25,
            ..half.clone()
        };
        other.apply(&quarter, &[1]);
        let policy = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![task(0.75, 1, 1.0)],
        }));
        let placement = place(&policy, &other, &half).unwrap();
        assert_eq!(placement.gpus, vec![1]);
        // Where FGD and best fit part: GPUs with 0.6 and 0.75 free and a
        // workload of quarter-GPU pods. Best fit fills GPU 0 (leaving 0.1,
        // which no quarter pod can use); FGD takes GPU 1 (0.6 and 0.25 left,
        // both usable).
        let mut split = ClusterState::uniform(1, 2, 100);
        split.apply(
            &InstanceDemand {
                sm_request: 0.4,
                ..half.clone()
            },
            &[0],
        );
        split.apply(&quarter, &[1]);
        let quarters = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![task(0.25, 1, 1.0)],
        }));
        assert_eq!(place(&quarters, &split, &half).unwrap().gpus, vec![1]);
        let best_fit = place(&crate::policy::InflessRequests, &split, &half).unwrap();
        assert_eq!(best_fit.gpus, vec![0]);
    }
}
