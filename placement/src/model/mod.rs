//! The cluster model every policy reasons about: nodes own GPUs, each GPU
//! carries the running sums of what its instances request (SM request, SM
//! limit, memory) and how many latency / batch instances it hosts.
//!
//! Nodes may also carry host resources (CPU, host memory) and a GPU model,
//! as in a real cluster's node list; pods then say what they need of those
//! (`PodNeeds`). A node without host limits (`HostState::unlimited`) admits
//! any pod, which is what the extender and the node manager use.
//!
//! `ClusterState` is the only mutable view; it knows nothing about policies,
//! networking or time. [`power`] says what a state draws in watts.

mod classes;
mod cost_index;
mod node;
pub mod power;
mod workload;

use std::ops::Range;
use std::sync::Arc;

use classes::{IDLE_ROW, MemoryRow, NodeClasses};
use cost_index::{ClassLog, CostIndexes};

pub use cost_index::{Standing, UPKEEP_LOOKS, shape_key};
pub use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};
pub use node::{GpuModel, GpuState, HostState, PodNeeds, SHARE_EPSILON};
pub use workload::{TaskType, WorkloadMix};

/// All GPUs of the cluster, grouped by node (a node's GPUs are contiguous).
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub gpus: Vec<GpuState>,
    pub nodes: Vec<Range<usize>>,
    /// Host resources per node (same indices as `nodes`).
    pub hosts: Vec<HostState>,
    /// GPU model names; `HostState::model` indexes it (empty: one unnamed model).
    pub models: Vec<String>,
    /// GPUs with work on them, kept by [`apply`](Self::apply) and
    /// [`release`](Self::release) (see [`busy_share`](Self::busy_share)).
    busy: usize,
    /// The same per node (same indices as `nodes`): a node with none is
    /// idle (its GPUs pristine: a GPU's last release zeroes it).
    busy_per_node: Vec<u32>,
    /// Nodes grouped into classes of identical state as a search sees it:
    /// every GPU's state but its node index, in order, and the host's CPU
    /// (capacity and use), memory capacity and GPU model. Host memory in
    /// use is left out, so that nodes which differ only there share a
    /// class: it decides only whether a pod fits the host, which the search
    /// checks per member. Members of a class score alike under every policy
    /// (a policy sees a node only through these), so a search scores the
    /// first fitting member of each class instead of every node. The
    /// classes are also filed by the cells of their GPUs ([`GpuCell`]), so
    /// that a search can score first the classes whose GPUs may cost least
    /// and stop where no other can beat what it found. Kept by every method
    /// that changes a node ([`apply`](ClusterState::apply),
    /// [`release`](ClusterState::release), the host and draining ones); a
    /// change made to `gpus` or `hosts` by hand must be followed by
    /// [`refresh_node`](ClusterState::refresh_node).
    classes: NodeClasses,
    /// The classes each refresh touched, and the standing indexes of each
    /// class's best cost per pod shape that replay it (see `cost_index`).
    class_log: ClassLog,
    cost_indexes: CostIndexes,
    /// The workload the cluster expects, when told
    /// ([`expect_workload`](Self::expect_workload)): the grid's columns are
    /// then its GPUs' fragment weights instead of their Σ SM limits.
    workload: Option<Arc<WorkloadMix>>,
    /// Its total weight (what the fragment-weight columns span).
    workload_weight: f64,
    /// The most GPUs on one node.
    largest_node: usize,
}

/// What the grid's columns span in Σ SM limits (the last holds all above).
const LIMIT_SPAN: f64 = 1.6;

/// A cell of the grid by which the cluster files its classes of identical
/// nodes: every GPU in it is idle (its sums all 0), or busy with Σ SM
/// requests and (when the cluster expects no workload) Σ SM limits, or
/// (when it does) fragment weights, in `[low, high)` (high may be
/// infinite: the top row and column hold all above), with memory in use
/// counted by GPU memory size. A policy prices a cell with
/// [`PlacementPolicy::cost_floor`](crate::policy::PlacementPolicy::cost_floor).
#[derive(Debug, Clone, Copy)]
pub struct GpuCell<'a> {
    pub idle: bool,
    pub sm_request_sum: [f64; 2],
    /// Σ SM limits of its GPUs, unless the columns are fragment weights.
    pub sm_limit_sum: Option<[f64; 2]>,
    /// Its GPUs' fragment weights under the workload the cluster expects
    /// ([`WorkloadMix::fragment_weights`]), with that workload.
    pub fragment_weight: Option<([f64; 2], &'a Arc<WorkloadMix>)>,
    /// The most GPUs on one node of the cluster.
    pub largest_node: usize,
    memory: &'a [MemoryRow],
}

impl GpuCell<'_> {
    /// Whether some GPU here may have room for `demand`'s SM request.
    pub fn may_fit_request(&self, demand: &InstanceDemand) -> bool {
        let low = if self.idle {
            0.0
        } else {
            self.sm_request_sum[0]
        };
        low + demand.sm_request <= 1.0 + SHARE_EPSILON
    }

    /// The most Σ SM requests a GPU here that admits `demand` by its
    /// request can reach with it (at most 1).
    pub fn most_sm_after(&self, demand: &InstanceDemand) -> f64 {
        if self.idle {
            return demand.sm_request;
        }
        (self.sm_request_sum[1] + demand.sm_request).min(1.0 + SHARE_EPSILON)
    }

    /// The most memory share a GPU here that has room for `demand`'s
    /// memory can reach with it (at most 1).
    pub fn most_memory_after(&self, demand: &InstanceDemand) -> f64 {
        let mut most: f64 = 0.0;
        for row in self.memory {
            let Some(before) = row.most_share() else {
                continue;
            };
            if row.capacity == 0 {
                return 1.0;
            }
            let before = if self.idle { 0.0 } else { before };
            most = most.max(before + demand.memory_bytes as f64 / row.capacity as f64);
        }
        most.min(1.0)
    }

    /// The least and the most Σ SM limits of a GPU here (0 and infinite
    /// when the cell does not say).
    pub fn limit_range(&self) -> [f64; 2] {
        match (self.idle, self.sm_limit_sum) {
            (true, _) => [0.0; 2],
            (false, Some(range)) => range,
            (false, None) => [0.0, f64::INFINITY],
        }
    }

    /// Whether some GPU here may keep Σ SM limits within `bound` with
    /// `demand`'s limit.
    pub fn may_fit_limit(&self, demand: &InstanceDemand, bound: f64) -> bool {
        self.limit_range()[0] + demand.sm_limit <= bound + SHARE_EPSILON
    }

    /// The least limit excess (Σ SM limits above 1) that `demand` (with a
    /// limit not below 0) adds to a GPU here: it grows with the limits
    /// already there.
    pub fn least_new_excess(&self, demand: &InstanceDemand) -> f64 {
        let low = self.limit_range()[0];
        ((low + demand.sm_limit - 1.0).max(0.0) - (low - 1.0).max(0.0)).max(0.0)
    }

    /// The most fragment weight of a GPU here, if the cluster expects
    /// `workload` (the same one, not an equal copy).
    pub fn most_fragment_weight(&self, workload: &Arc<WorkloadMix>) -> Option<f64> {
        let (range, expected) = self.fragment_weight?;
        Arc::ptr_eq(expected, workload).then_some(range[1])
    }
}

impl ClusterState {
    /// A uniform cluster: `nodes` nodes of `gpus_per_node` GPUs each.
    pub fn uniform(nodes: usize, gpus_per_node: usize, gpu_memory: u64) -> Self {
        let mut cluster = Self::default();
        for _ in 0..nodes {
            cluster.add_node(gpus_per_node, gpu_memory);
        }
        cluster
    }

    /// Appends a node whose host resources never bind; returns its index.
    pub fn add_node(&mut self, gpus: usize, gpu_memory: u64) -> usize {
        self.add_host(gpus, gpu_memory, HostState::unlimited())
    }

    /// Appends a node with host resources and a GPU model; returns its index.
    pub fn add_host(&mut self, gpus: usize, gpu_memory: u64, host: HostState) -> usize {
        let node = self.nodes.len();
        let start = self.gpus.len();
        self.gpus
            .extend((0..gpus).map(|_| GpuState::new(node, gpu_memory)));
        self.nodes.push(start..self.gpus.len());
        self.hosts.push(host);
        self.busy_per_node.push(0);
        self.classes.push_node();
        self.largest_node = self.largest_node.max(gpus);
        self.refresh_node(node);
        node
    }

    /// Re-files node `node` in its class after its GPUs or host changed
    /// (every method here that changes a node calls it; a change made to
    /// `gpus` or `hosts` by hand must call it too).
    pub fn refresh_node(&mut self, node: usize) {
        let Some(range) = self.nodes.get(node).cloned() else {
            return;
        };
        let mut key = Vec::with_capacity(4 + 6 * range.len());
        match self.hosts.get(node) {
            Some(host) => key.extend([
                host.cpu_milli,
                host.cpu_used,
                host.memory_mib,
                u64::from(host.model),
            ]),
            None => key.extend([u64::MAX; 4]),
        }
        for gpu in &self.gpus[range.clone()] {
            key.extend([
                gpu.memory_capacity,
                gpu.memory_used,
                gpu.sm_request_sum.to_bits(),
                gpu.sm_limit_sum.to_bits(),
                (u64::from(gpu.latency_instances) << 32) | u64::from(gpu.batch_instances),
                u64::from(gpu.draining),
            ]);
        }
        let (gpus, host) = (&self.gpus[range], self.hosts.get(node));
        let (workload, workload_weight) = (self.workload.as_deref(), self.workload_weight);
        let points = || {
            let weights = workload.map(|mix| {
                let (cpu_free, model) =
                    host.map_or((u64::MAX, 0), |host| (host.cpu_free(), host.model));
                mix.fragment_weights(gpus, cpu_free, model)
            });
            gpus.iter()
                .enumerate()
                .filter(|(_, gpu)| gpu.draining == 0)
                .map(|(index, gpu)| {
                    let second = match &weights {
                        Some(weights) => (weights[index], workload_weight),
                        None => (gpu.sm_limit_sum, LIMIT_SPAN),
                    };
                    if !gpu.is_active() {
                        return classes::idle_point(gpu.memory_capacity, second);
                    }
                    classes::point_of(
                        gpu.sm_request_sum,
                        second,
                        gpu.memory_share_with(0),
                        gpu.memory_capacity,
                    )
                })
                .collect()
        };
        let left = self.classes.of(node);
        self.classes.file(node, key, points);
        // Logged even when the class stays: a member's host memory, which
        // decides whether it fits a pod, may have changed.
        if let Some(left) = left {
            self.class_log.touch(left, node);
        }
        if let Some(joined) = self.classes.of(node).filter(|&id| Some(id) != left) {
            self.class_log.touch(joined, node);
        }
    }

    /// The cheapest (cost, GPU) over every class of identical nodes for a
    /// pod of `shape` under a policy whose cluster-wide inputs are
    /// `context` (a fingerprint, and the figure its costs drift with),
    /// from a standing index (see `cost_index`), where one answers:
    /// `representative(class)` is the class's first member that fits the
    /// pod's host needs, `score(node)` that node's cheapest (cost, GPU)
    /// for the pod and how fast that cost moves with the figure.
    pub fn standing_best(
        &self,
        shape: &[u64],
        context: (u64, f64),
        representative: &mut dyn FnMut(u32) -> Option<usize>,
        score: &mut dyn FnMut(usize) -> Option<(f64, usize, f64)>,
    ) -> Standing {
        let mut view = View {
            cluster: self,
            representative,
            score,
        };
        self.cost_indexes.best(
            shape,
            context,
            &self.class_log,
            &mut self.classes.ids(),
            self.classes.id_bound(),
            &mut view,
        )
    }

    /// The standing index in `context` next in turn to be kept up between
    /// its own searches, with changes to look at: its shape and that
    /// shape's pod (see `CostIndexes::next_to_keep_up`).
    pub fn standing_index_to_keep_up(
        &self,
        context: u64,
    ) -> Option<(Vec<u64>, InstanceDemand, PodNeeds)> {
        let shape = self
            .cost_indexes
            .next_to_keep_up(context, &self.class_log)?;
        let (demand, needs) = cost_index::pod_of_shape(&shape)?;
        Some((shape, demand, needs))
    }

    /// Brings the standing index of `shape` in `context` a bounded step
    /// closer to the cluster's state (`CostIndexes::keep_up`), with
    /// `representative` and `score` for that shape's pod as for
    /// [`standing_best`](Self::standing_best).
    pub fn keep_standing_index_up(
        &self,
        shape: &[u64],
        context: (u64, f64),
        representative: &mut dyn FnMut(u32) -> Option<usize>,
        score: &mut dyn FnMut(usize) -> Option<(f64, usize, f64)>,
    ) {
        let mut view = View {
            cluster: self,
            representative,
            score,
        };
        self.cost_indexes.keep_up(
            shape,
            context,
            &self.class_log,
            self.classes.id_bound(),
            &mut view,
        );
    }

    /// Whether searches should ask for standing indexes: not while the
    /// cluster has too few classes of nodes for one to pay.
    pub fn standing_indexes_may_pay(&self) -> bool {
        cost_index::may_build(self.classes.len())
    }

    /// How many standing indexes (pod shapes under a policy) are built.
    pub fn standing_indexes(&self) -> usize {
        self.cost_indexes.built()
    }

    /// How many searches standing indexes answered, of how many asked.
    pub fn standing_answers(&self) -> (u64, u64) {
        self.cost_indexes.answers()
    }

    /// Records that a search for `shape` in `context` scored `scored`
    /// classes without a standing index (a costly one builds an index for
    /// the next).
    pub fn note_search(&self, shape: &[u64], context: u64, scored: usize) {
        self.cost_indexes.note_search(shape, context, scored);
    }

    /// How many nodes of `node`'s class of identical nodes (see
    /// [`refresh_node`](Self::refresh_node)) come before it and fit the
    /// host side of `needs`, counted up to `enough`. In O(1) when `node` is
    /// the first of its class or `enough` is 1 and the first fits; else a
    /// walk of the class's earlier members.
    pub fn earlier_twins_fitting(&self, node: usize, needs: &PodNeeds, enough: usize) -> usize {
        let Some(id) = self.classes.of(node) else {
            return 0;
        };
        let Some(first) = self.classes.first(id) else {
            return 0;
        };
        if first >= node || enough == 0 {
            return 0;
        }
        if enough == 1 && self.host_fits(first, needs) {
            return 1;
        }
        self.classes
            .members_before(id, node)
            .filter(|&twin| self.host_fits(twin, needs))
            .take(enough)
            .count()
    }

    /// For each class of identical nodes (see
    /// [`refresh_node`](Self::refresh_node)), its lowest member that fits
    /// the host side of `needs`, classes in no particular order: the nodes
    /// a search scores when a placement takes its GPUs from one node (the
    /// other members offer the same costs at higher GPU indices). Its cost
    /// grows with the classes, not the nodes.
    pub fn class_representatives<'a>(
        &'a self,
        needs: &'a PodNeeds,
    ) -> impl Iterator<Item = usize> + 'a {
        self.classes
            .ids()
            .filter_map(move |id| self.class_representative(id, needs))
    }

    /// The lowest member of class `id` that fits the host side of `needs`.
    fn class_representative(&self, id: u32, needs: &PodNeeds) -> Option<usize> {
        self.class_members_fitting(id, needs).next()
    }

    /// The members of class `id` (an id from
    /// [`classes_in_cell`](Self::classes_in_cell)) that fit the host side
    /// of `needs`, in node order. Where the first member lacks host memory
    /// the rest are walked; a class whose CPU, memory capacity or GPU model
    /// rules the pod out yields none at once (its members share those).
    pub fn class_members_fitting<'a>(
        &'a self,
        id: u32,
        needs: &'a PodNeeds,
    ) -> impl Iterator<Item = usize> + 'a {
        let first = self.classes.first(id);
        let ruled_out = first
            .and_then(|first| self.hosts.get(first))
            .is_some_and(|host| !host.class_may_fit(needs));
        // The first member apart: most searches stop at it, without
        // walking the member set.
        first
            .into_iter()
            .chain(self.classes.members(id).skip(1))
            .take(if ruled_out { 0 } else { usize::MAX })
            .filter(move |&member| self.host_fits(member, needs))
    }

    /// The cells of the grid that hold a GPU of some class (see
    /// [`GpuCell`]), each with a handle for
    /// [`classes_in_cell`](Self::classes_in_cell).
    pub fn occupied_cells(&self) -> impl Iterator<Item = (u16, GpuCell<'_>)> + '_ {
        self.classes.occupied().iter().map(|&cell| {
            let span = if self.workload.is_some() {
                self.workload_weight
            } else {
                LIMIT_SPAN
            };
            let (sm_request_sum, mut second) = classes::cell_ranges(cell, span);
            if self.workload.is_some() {
                // No busy GPU's fragment weight exceeds the workload's
                // total, no idle GPU's that total once per GPU of its
                // node (`WorkloadMix::fragment_weights`).
                let most = if cell >= IDLE_ROW {
                    span * self.largest_node.max(1) as f64
                } else {
                    span
                };
                second[1] = second[1].min(most);
            }
            (
                cell,
                GpuCell {
                    idle: cell >= IDLE_ROW,
                    sm_request_sum,
                    sm_limit_sum: self.workload.is_none().then_some(second),
                    fragment_weight: self.workload.as_ref().map(|mix| (second, mix)),
                    largest_node: self.largest_node,
                    memory: self.classes.memory_in(cell),
                },
            )
        })
    }

    /// The classes with a GPU in `cell` (a cell from
    /// [`occupied_cells`](Self::occupied_cells)) that `seen` (indexed by
    /// class, [`class_slots`](Self::class_slots) long) does not mark, each
    /// marked as it is yielded.
    pub fn classes_in_cell<'a>(
        &'a self,
        cell: u16,
        seen: &'a mut [bool],
    ) -> impl Iterator<Item = u32> + 'a {
        self.classes
            .in_cell(cell)
            .iter()
            .copied()
            .filter(move |&id| {
                seen.get_mut(id as usize)
                    .is_some_and(|mark| !std::mem::replace(mark, true))
            })
    }

    /// Slots a per-class mark needs (see
    /// [`classes_in_cell`](Self::classes_in_cell)).
    pub fn class_slots(&self) -> usize {
        self.classes.id_bound()
    }

    /// Tells the cluster the workload it expects (FGD's task types and their
    /// popularity): its grid then files GPUs by fragment weight under it
    /// ([`WorkloadMix::fragment_weights`]), so that policies measuring
    /// fragmentation against the same workload can bound their costs by
    /// cell (see `GpuCell::most_fragment_weight`), and forgets Σ SM limits
    /// (policies bounding by limits then bound more loosely). An empty
    /// workload, or one with a negative or non-finite weight, is no
    /// workload. Files every node again: O(nodes).
    pub fn expect_workload(&mut self, workload: Arc<WorkloadMix>) {
        let usable = !workload.types.is_empty() && workload.weights_are_sound();
        // The columns span the total weight, with room for its rounding.
        self.workload_weight = workload.total_weight() * (1.0 + 1e-9) + 1e-12;
        self.workload = usable.then_some(workload);
        self.classes.clear();
        self.class_log.restart();
        for node in 0..self.nodes.len() {
            self.refresh_node(node);
        }
    }

    /// How many classes of identical nodes the cluster has (what a search's
    /// cost grows with).
    pub fn node_classes(&self) -> usize {
        self.classes.len()
    }

    /// A number that names `node`'s state (its class's generation): two
    /// nodes with the same number, in this cluster or any other of the
    /// process, are in the same state as [`refresh_node`](Self::refresh_node)
    /// files it (every GPU's sums, counts and draining; the host's cores,
    /// memory capacity and GPU model, not its memory in use), and a node's
    /// number changes when that state does. `None` for a node not filed.
    pub fn node_state_id(&self, node: usize) -> Option<u64> {
        self.classes
            .of(node)
            .map(|class| self.classes.generation(class))
    }

    /// Whether no GPU of node `node` has work (in O(1)).
    pub fn node_is_idle(&self, node: usize) -> bool {
        self.busy_per_node.get(node).is_some_and(|&busy| busy == 0)
    }

    /// Sets how many old copies of moved work still drain from GPU `gpu`
    /// (a draining GPU admits nothing new; see `GpuState::draining`).
    pub fn set_draining(&mut self, gpu: usize, draining: u32) {
        if let Some(state) = self.gpus.get_mut(gpu) {
            state.draining = draining;
            let node = state.node;
            self.refresh_node(node);
        }
    }

    /// The index of GPU model `name`, added if new.
    pub fn model_index(&mut self, name: &str) -> GpuModel {
        if let Some(index) = self.models.iter().position(|model| model == name) {
            return index as GpuModel;
        }
        self.models.push(name.to_string());
        (self.models.len() - 1) as GpuModel
    }

    /// Whether node `node` can host a pod with `needs`.
    pub fn host_fits(&self, node: usize, needs: &PodNeeds) -> bool {
        self.hosts.get(node).is_none_or(|host| host.fits(needs))
    }

    /// Records a pod's host needs on `node`.
    pub fn apply_host(&mut self, node: usize, needs: &PodNeeds) {
        if let Some(host) = self.hosts.get_mut(node) {
            host.take(needs);
            self.refresh_node(node);
        }
    }

    /// Undoes [`apply_host`](Self::apply_host).
    pub fn release_host(&mut self, node: usize, needs: &PodNeeds) {
        if let Some(host) = self.hosts.get_mut(node) {
            host.give_back(needs);
            self.refresh_node(node);
        }
    }

    /// Records `demand` on each GPU in `gpus` (global indices).
    pub fn apply(&mut self, demand: &InstanceDemand, gpus: &[usize]) {
        self.add_to_gpus(demand, gpus);
        self.refresh_nodes_of(gpus);
    }

    /// Records a pod placed: `demand` on each GPU in `gpus` and `needs` on
    /// the host of the first, each node filed once. [`apply`](Self::apply)
    /// then [`apply_host`](Self::apply_host) would file the node in a
    /// passing state (its GPUs taken, its host not yet), a class opened
    /// and emptied at once: two more entries in the class log, which every
    /// standing index reads when it catches up.
    pub fn apply_pod(&mut self, demand: &InstanceDemand, gpus: &[usize], needs: &PodNeeds) {
        self.add_to_gpus(demand, gpus);
        if let Some(host) = self.pod_host(gpus) {
            host.take(needs);
        }
        self.refresh_nodes_of(gpus);
    }

    /// Undoes [`apply_pod`](Self::apply_pod).
    pub fn release_pod(&mut self, demand: &InstanceDemand, gpus: &[usize], needs: &PodNeeds) {
        self.remove_from_gpus(demand, gpus);
        if let Some(host) = self.pod_host(gpus) {
            host.give_back(needs);
        }
        self.refresh_nodes_of(gpus);
    }

    /// The host of the node of a placement's first GPU.
    fn pod_host(&mut self, gpus: &[usize]) -> Option<&mut HostState> {
        let node = self.gpus.get(*gpus.first()?)?.node;
        self.hosts.get_mut(node)
    }

    fn add_to_gpus(&mut self, demand: &InstanceDemand, gpus: &[usize]) {
        for &gpu in gpus {
            if let Some(state) = self.gpus.get_mut(gpu) {
                let was_active = state.is_active();
                state.add(demand);
                if !was_active && state.is_active() {
                    self.busy += 1;
                    self.busy_per_node[state.node] += 1;
                }
            }
        }
    }

    fn remove_from_gpus(&mut self, demand: &InstanceDemand, gpus: &[usize]) {
        for &gpu in gpus {
            if let Some(state) = self.gpus.get_mut(gpu) {
                let was_active = state.is_active();
                state.remove(demand);
                if was_active && !state.is_active() {
                    self.busy = self.busy.saturating_sub(1);
                    let node = &mut self.busy_per_node[state.node];
                    *node = node.saturating_sub(1);
                }
            }
        }
    }

    /// Refreshes the nodes of `gpus` (each once when they are in order, as
    /// a placement's are).
    fn refresh_nodes_of(&mut self, gpus: &[usize]) {
        let mut last = None;
        for &gpu in gpus {
            let Some(node) = self.gpus.get(gpu).map(|state| state.node) else {
                continue;
            };
            if last != Some(node) {
                self.refresh_node(node);
                last = Some(node);
            }
        }
    }

    /// Undoes [`apply`](Self::apply).
    pub fn release(&mut self, demand: &InstanceDemand, gpus: &[usize]) {
        self.remove_from_gpus(demand, gpus);
        self.refresh_nodes_of(gpus);
    }

    /// The GPU share free on `node`'s GPUs (an idle GPU's whole).
    pub fn free_gpu_share(&self, node: usize) -> f64 {
        self.nodes.get(node).map_or(0.0, |range| {
            self.gpus[range.clone()]
                .iter()
                .map(GpuState::free_share)
                .sum()
        })
    }

    pub fn active_gpus(&self) -> usize {
        self.gpus.iter().filter(|gpu| gpu.is_active()).count()
    }

    /// Share of the cluster's GPUs with work on them, in O(1): how scarce
    /// idle GPUs are. Counts what [`apply`](Self::apply) and
    /// [`release`](Self::release) did (work put on `gpus` by hand is not seen).
    pub fn busy_share(&self) -> f64 {
        self.busy.min(self.gpus.len()) as f64 / self.gpus.len().max(1) as f64
    }
}

/// A cluster's classes and one pod's scoring, as a standing index asks.
struct View<'a> {
    cluster: &'a ClusterState,
    representative: &'a mut dyn FnMut(u32) -> Option<usize>,
    score: &'a mut dyn FnMut(usize) -> Option<(f64, usize, f64)>,
}

impl cost_index::ClassView for View<'_> {
    fn representative(&mut self, class: u32) -> Option<usize> {
        (self.representative)(class)
    }

    fn generation(&self, class: u32) -> u64 {
        self.cluster.classes.generation(class)
    }

    fn first_gpu(&self, node: usize) -> usize {
        self.cluster.nodes[node].start
    }

    fn score(&mut self, node: usize) -> Option<(f64, usize, f64)> {
        (self.score)(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(class: WorkClass) -> InstanceDemand {
        InstanceDemand {
            class,
            sm_request: 0.3,
            sm_limit: 0.5,
            memory_bytes: 10,
            gpus: 1,
        }
    }

    #[test]
    fn apply_then_release_returns_gpu_to_idle() {
        let mut cluster = ClusterState::uniform(2, 2, 100);
        assert_eq!(cluster.nodes[1], 2..4);
        cluster.apply(&small(WorkClass::Latency), &[1]);
        cluster.apply(&small(WorkClass::Batch), &[1]);
        assert_eq!(cluster.active_gpus(), 1);
        assert!((cluster.busy_share() - 0.25).abs() < 1e-12);
        assert_eq!(cluster.gpus[1].memory_used, 20);
        assert!((cluster.gpus[1].sm_limit_sum - 1.0).abs() < 1e-12);
        cluster.release(&small(WorkClass::Latency), &[1]);
        cluster.release(&small(WorkClass::Batch), &[1]);
        assert_eq!(cluster.active_gpus(), 0);
        assert_eq!(cluster.busy_share(), 0.0);
        assert_eq!(cluster.gpus[1], GpuState::new(0, 100));
    }

    #[test]
    fn a_pod_applied_at_once_leaves_its_node_as_gpus_then_host_do() {
        let host = || HostState {
            cpu_milli: 8000,
            memory_mib: 4096,
            ..HostState::unlimited()
        };
        let mut cluster = ClusterState::default();
        for _ in 0..3 {
            cluster.add_host(2, 100, host());
        }
        let (pod, needs) = (
            small(WorkClass::Latency),
            PodNeeds {
                cpu_milli: 3000,
                memory_mib: 1024,
                ..PodNeeds::default()
            },
        );
        cluster.apply_pod(&pod, &[2, 3], &needs);
        cluster.apply(&pod, &[4, 5]);
        cluster.apply_host(2, &needs);
        assert_eq!(cluster.hosts[1], cluster.hosts[2]);
        assert_eq!(cluster.hosts[1].cpu_used, 3000);
        assert_eq!(cluster.gpus[2].sm_request_sum, 0.3);
        assert_eq!(cluster.active_gpus(), 4);
        assert_eq!(cluster.node_state_id(1), cluster.node_state_id(2));
        assert_ne!(cluster.node_state_id(1), cluster.node_state_id(0));
        cluster.release_pod(&pod, &[2, 3], &needs);
        assert_eq!(cluster.hosts[1], cluster.hosts[0]);
        assert_eq!(cluster.node_state_id(1), cluster.node_state_id(0));
        assert_eq!(cluster.active_gpus(), 2);
    }
}
