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

use super::fragmentation_memo::{
    IncreaseKey, MEMO_GPUS, Measured, ShareSteps, memo_key, sorted_fragmentation,
};
use super::rule::PlacementPolicy;
use crate::model::{
    ClusterState, GpuCell, GpuModel, GpuState, InstanceDemand, PodNeeds, SHARE_EPSILON, TaskType,
    WorkloadMix,
};

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

/// The `fgd` policy.
#[derive(Debug, Clone, Default)]
pub struct FragmentationGradient {
    mix: Arc<WorkloadMix>,
    /// The mix's total weight (a bound's factor, asked per cell).
    mix_weight: f64,
    memo: Arc<Mutex<Measured>>,
    /// The mix, word by word (its part of `cost_context`).
    fingerprint: u64,
    /// The mix's distinct shares (the memo's measure counts by them).
    steps: Arc<ShareSteps>,
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
            steps: Arc::new(ShareSteps::new(&mix.types)),
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
        memo: &mut Option<MutexGuard<'_, Measured>>,
        free: &[f64],
        cpu_free: u64,
        model: GpuModel,
        fallback: &TaskType,
    ) -> f64 {
        let (Some(memo), Some((key, sorted))) = (memo.as_mut(), memo_key(free, cpu_free, model))
        else {
            return self.node_fragmentation(free, cpu_free, model, fallback);
        };
        if let Some(&value) = memo.states.get(&key) {
            return value;
        }
        let value = sorted_fragmentation(
            &self.mix.types,
            &self.steps,
            &sorted[..free.len()],
            cpu_free,
            model,
        );
        memo.states.insert(key, value);
        value
    }

    /// The memo, locked, if the workload is known (else states are
    /// measured against each pod and not kept).
    fn lock_memo(&self) -> Option<MutexGuard<'_, Measured>> {
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
            &[Scope::Node],
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
            &[Scope::Busy],
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
        let scopes: &[Scope] = if node_wide {
            &[Scope::Busy, Scope::Node]
        } else {
            &[Scope::Busy]
        };
        self.increases_in(&mut memo, on, candidates, out, scopes);
    }

    /// The increases under each of `scopes` in turn, with the memo already
    /// locked (`on`: the cluster, the node, the pod's demand and needs):
    /// those of a node state measured before for a pod of the same share
    /// and cores are read back (`Measured::increases`).
    fn increases_in(
        &self,
        memo: &mut Option<MutexGuard<'_, Measured>>,
        on: (&ClusterState, usize, &InstanceDemand, &PodNeeds),
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
        scopes: &[Scope],
    ) {
        let Some(key) = self.increase_key(memo, on) else {
            for &scope in scopes {
                self.measure_increases(memo, on, candidates, out, scope);
            }
            return;
        };
        let start = on.0.nodes[on.1].start;
        let place = |index: usize| index - start;
        let mut kept = memo
            .as_mut()
            .and_then(|memo| memo.increases.get(&key).copied())
            .unwrap_or_default();
        let mut changed = false;
        for &scope in scopes {
            let (values, measured) = (
                &mut kept.by_place[scope as usize],
                &mut kept.measured[scope as usize],
            );
            if candidates
                .iter()
                .all(|&index| *measured & (1 << place(index)) != 0)
            {
                out.extend(
                    candidates
                        .iter()
                        .map(|&index| (values[place(index)], index)),
                );
                continue;
            }
            let first = out.len();
            self.measure_increases(memo, on, candidates, out, scope);
            for &(increase, index) in &out[first..] {
                values[place(index)] = increase;
                *measured |= 1 << place(index);
            }
            changed = true;
        }
        if let (true, Some(memo)) = (changed, memo.as_mut()) {
            memo.increases.insert(key, kept);
        }
    }

    /// The key of a one-GPU pod's increases on `on`'s node, or `None`
    /// where they are not kept: a gang (its increase depends on which GPUs
    /// admit it), a node of more than `MEMO_GPUS` GPUs or not filed in a
    /// class, an unknown workload.
    fn increase_key(
        &self,
        memo: &Option<MutexGuard<'_, Measured>>,
        (cluster, node, demand, needs): (&ClusterState, usize, &InstanceDemand, &PodNeeds),
    ) -> Option<IncreaseKey> {
        if memo.is_none() || demand.gpus > 1 || cluster.nodes[node].len() > MEMO_GPUS {
            return None;
        }
        let state = cluster.node_state_id(node)?;
        Some([state, demand.sm_request.to_bits(), needs.cpu_milli])
    }

    /// The increases under `scope`, measured (see `increases_in`).
    fn measure_increases(
        &self,
        memo: &mut Option<MutexGuard<'_, Measured>>,
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
        // distinct free share once. Same means the same bits: a GPU's
        // increase is then what it is whichever other GPUs are candidates
        // (what `increases_in` keeps per GPU relies on it), and shares a
        // rounding apart (sums of the same requests in another order) are
        // each measured.
        let mut scored = [(0.0f64, 0.0f64, 0.0f64); STACK_GPUS];
        let mut distinct = 0;
        for &index in candidates {
            let original = free[index - start];
            let usable = opened(index, free);
            let increase = match scored[..distinct].iter().find(|(share, was, _)| {
                share.to_bits() == usable.to_bits() && was.to_bits() == original.to_bits()
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

    fn cost_floor(
        &self,
        _cluster: &ClusterState,
        cell: &GpuCell,
        demand: &InstanceDemand,
    ) -> Option<f64> {
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

    /// Deterministic draws below a bound (a linear congruential generator).
    fn draws(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |bound| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % bound
        }
    }

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
    fn fragmentation_of_sorted_shares_is_the_general_measure_bit_for_bit() {
        // Shares as sums of openb-like requests leave (several GPUs exactly
        // at a type's share, at 0, at 1), types that need more GPUs than
        // fit, cores and models that rule types out.
        let mut picky = task(0.5, 1, 0.25);
        picky.models = vec![2];
        let mut hungry = task(0.3, 2, 0.125);
        hungry.cpu_milli = 6000;
        let policy = FragmentationGradient::new(Arc::new(WorkloadMix {
            types: vec![
                task(1.0, 1, 0.5),
                task(0.25, 1, 0.75),
                task(0.5, 4, 0.3),
                picky,
                hungry,
                task(0.1, 8, 0.05),
            ],
        }));
        let fallback = task(0.5, 1, 1.0);
        let mut draw = draws(3);
        let mut differing_values = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            let gpus = 1 + draw(MEMO_GPUS as u64) as usize;
            let mut free: Vec<f64> = (0..gpus)
                .map(|_| {
                    let used: f64 = (0..draw(4))
                        .map(|_| [0.25, 0.1, 0.5, 0.3, 0.05][draw(5) as usize])
                        .sum();
                    (1.0 - used).max(0.0)
                })
                .collect();
            free.sort_unstable_by(f64::total_cmp);
            let (cpu_free, model) = (draw(10_000), draw(3) as GpuModel);
            let general = policy.node_fragmentation(&free, cpu_free, model, &fallback);
            let sorted =
                sorted_fragmentation(&policy.mix.types, &policy.steps, &free, cpu_free, model);
            assert_eq!(
                general.to_bits(),
                sorted.to_bits(),
                "{free:?} {cpu_free} {model}"
            );
            differing_values.insert(general.to_bits());
        }
        assert!(
            differing_values.len() > 100,
            "{} values",
            differing_values.len()
        );
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
    fn increases_kept_by_node_state_equal_those_measured_afresh_on_diverging_copies() {
        use crate::model::{HostState, WorkClass};
        use crate::policy::{PlacementPolicy, place_pod};
        // One policy keeps what it measured by node state while it scores
        // two copies of one cluster that part ways (their states must not
        // share numbers), pods coming and going on each. At every step
        // every node's increases must be, bit for bit, those a fresh
        // policy measures, and many must have been read back.
        let mix = Arc::new(WorkloadMix {
            types: vec![task(1.0, 1, 0.5), task(0.2, 1, 0.5)],
        });
        let kept = FragmentationGradient::new(mix.clone());
        let mut original = ClusterState::default();
        for node in 0..12 {
            let (gpus, cpu_milli) = [(8, 96_000), (4, 24_000), (2, 32_000)][node % 3];
            let host = HostState {
                cpu_milli,
                cpu_used: 0,
                memory_mib: 64 << 10,
                memory_used: 0,
                model: 0,
            };
            original.add_host(gpus, 80 << 30, host);
        }
        original.expect_workload(mix.clone());
        let mut copies = [original.clone(), original];
        let mut running: [Vec<(InstanceDemand, PodNeeds, Vec<usize>)>; 2] = Default::default();
        let mut draw = draws(7);
        // (share, cores, GiB of GPU memory): shares whose sums in another
        // order differ by a rounding, and memory that leaves a GPU out of
        // one pod's candidates but not another's of the same share.
        let shapes = [
            (0.1, 0, 1),
            (0.2, 1000, 1),
            (0.3, 4000, 60),
            (0.2, 1000, 60),
            (0.5, 4000, 1),
            (1.0, 8000, 1),
        ];
        let (mut compared, mut read_back) = (0, 0);
        for _ in 0..300 {
            for (cluster, running) in copies.iter_mut().zip(&mut running) {
                if !running.is_empty() && draw(3) == 0 {
                    let (pod, needs, gpus) =
                        running.swap_remove(draw(running.len() as u64) as usize);
                    cluster.release(&pod, &gpus);
                    cluster.release_host(cluster.gpus[gpus[0]].node, &needs);
                }
                let (share, cpu_milli, memory_gib) = shapes[draw(shapes.len() as u64) as usize];
                let pod = InstanceDemand {
                    class: WorkClass::Batch,
                    sm_request: share,
                    sm_limit: share,
                    memory_bytes: memory_gib << 30,
                    gpus: 1,
                };
                let needs = PodNeeds {
                    cpu_milli,
                    ..PodNeeds::default()
                };
                let fresh = FragmentationGradient::new(mix.clone());
                for node in 0..cluster.nodes.len() {
                    let candidates: Vec<usize> = cluster.nodes[node]
                        .clone()
                        .filter(|&gpu| kept.admits(&cluster.gpus[gpu], &pod))
                        .collect();
                    let on = (&*cluster, node, &pod, &needs);
                    let key = kept.increase_key(&kept.lock_memo(), on).expect("kept");
                    let all_kept =
                        kept.memo
                            .lock()
                            .unwrap()
                            .increases
                            .get(&key)
                            .is_some_and(|kept| {
                                candidates.iter().all(|&gpu| {
                                    kept.measured[0]
                                        & kept.measured[1]
                                        & (1 << (gpu - cluster.nodes[node].start))
                                        != 0
                                })
                            });
                    let (mut got, mut want) = (Vec::new(), Vec::new());
                    kept.busy_then_node_increases(
                        cluster,
                        node,
                        &pod,
                        &needs,
                        &candidates,
                        &mut got,
                        true,
                    );
                    fresh.busy_then_node_increases(
                        cluster,
                        node,
                        &pod,
                        &needs,
                        &candidates,
                        &mut want,
                        true,
                    );
                    let bits = |list: &[(f64, usize)]| -> Vec<(u64, usize)> {
                        list.iter()
                            .map(|&(cost, gpu)| (cost.to_bits(), gpu))
                            .collect()
                    };
                    assert_eq!(bits(&got), bits(&want), "node {node}, {pod:?}, {needs:?}");
                    if !candidates.is_empty() {
                        compared += 1;
                        read_back += usize::from(all_kept);
                    }
                }
                if let Some(placement) = place_pod(&kept, cluster, &pod, &needs) {
                    cluster.apply(&pod, &placement.gpus);
                    cluster.apply_host(cluster.gpus[placement.gpus[0]].node, &needs);
                    running.push((pod, needs, placement.gpus));
                }
            }
        }
        assert!(
            compared > 2000 && read_back * 4 > compared,
            "{read_back} of {compared} read back"
        );
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
