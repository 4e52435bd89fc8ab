//! What one GPU and one host carry, and what a pod asks of a node: the
//! state the cluster model (`super`) is made of.

use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};

/// Floating-point slack when comparing sums of SM shares with a bound.
pub const SHARE_EPSILON: f64 = 1e-9;

/// Allocation state of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    pub node: usize,
    pub memory_capacity: u64,
    pub memory_used: u64,
    pub sm_request_sum: f64,
    pub sm_limit_sum: f64,
    pub latency_instances: u32,
    pub batch_instances: u32,
    /// Old copies of moved replicas still serving here until their new
    /// copies are warm (`consolidation`); a draining GPU admits nothing new.
    pub draining: u32,
}

impl GpuState {
    pub fn new(node: usize, memory_capacity: u64) -> Self {
        Self {
            node,
            memory_capacity,
            memory_used: 0,
            sm_request_sum: 0.0,
            sm_limit_sum: 0.0,
            latency_instances: 0,
            batch_instances: 0,
            draining: 0,
        }
    }

    pub fn instances(&self) -> u32 {
        self.latency_instances + self.batch_instances
    }

    pub fn is_active(&self) -> bool {
        self.instances() > 0
    }

    /// The share of its SM not yet requested (what FGD calls free).
    pub fn free_share(&self) -> f64 {
        (1.0 - self.sm_request_sum).max(0.0)
    }

    pub fn memory_fits(&self, demand: &InstanceDemand) -> bool {
        self.memory_used.saturating_add(demand.memory_bytes) <= self.memory_capacity
    }

    /// Fraction of memory in use after adding `extra` bytes.
    pub fn memory_share_with(&self, extra: u64) -> f64 {
        if self.memory_capacity == 0 {
            return 1.0;
        }
        (self.memory_used.saturating_add(extra)) as f64 / self.memory_capacity as f64
    }

    /// How much SM limit exceeds the whole GPU (0 when Σlimits ≤ 1).
    pub fn limit_excess(&self) -> f64 {
        (self.sm_limit_sum - 1.0).max(0.0)
    }

    pub(super) fn add(&mut self, demand: &InstanceDemand) {
        self.memory_used = self.memory_used.saturating_add(demand.memory_bytes);
        self.sm_request_sum += demand.sm_request;
        self.sm_limit_sum += demand.sm_limit;
        match demand.class {
            WorkClass::Latency => self.latency_instances += 1,
            WorkClass::Batch => self.batch_instances += 1,
        }
    }

    pub(super) fn remove(&mut self, demand: &InstanceDemand) {
        self.memory_used = self.memory_used.saturating_sub(demand.memory_bytes);
        self.sm_request_sum = (self.sm_request_sum - demand.sm_request).max(0.0);
        self.sm_limit_sum = (self.sm_limit_sum - demand.sm_limit).max(0.0);
        match demand.class {
            WorkClass::Latency => self.latency_instances = self.latency_instances.saturating_sub(1),
            WorkClass::Batch => self.batch_instances = self.batch_instances.saturating_sub(1),
        }
        if self.instances() == 0 {
            self.draining = 0;
            self.sm_request_sum = 0.0;
            self.sm_limit_sum = 0.0;
            self.memory_used = 0;
        }
    }
}

/// Index into `ClusterState::models`; `ANY_MODEL` is a node whose GPU model
/// is not known.
pub type GpuModel = u16;

/// Host side of one node: CPU (milli-cores) and memory (MiB), with what the
/// pods on it took, and the model of its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostState {
    pub cpu_milli: u64,
    pub cpu_used: u64,
    pub memory_mib: u64,
    pub memory_used: u64,
    pub model: GpuModel,
}

impl HostState {
    /// Records a pod's needs as taken.
    pub fn take(&mut self, needs: &PodNeeds) {
        self.cpu_used = self.cpu_used.saturating_add(needs.cpu_milli);
        self.memory_used = self.memory_used.saturating_add(needs.memory_mib);
    }

    /// Undoes [`take`](Self::take).
    pub fn give_back(&mut self, needs: &PodNeeds) {
        self.cpu_used = self.cpu_used.saturating_sub(needs.cpu_milli);
        self.memory_used = self.memory_used.saturating_sub(needs.memory_mib);
    }

    /// A node whose host resources never bind.
    pub fn unlimited() -> Self {
        Self {
            cpu_milli: u64::MAX,
            cpu_used: 0,
            memory_mib: u64::MAX,
            memory_used: 0,
            model: 0,
        }
    }

    pub fn cpu_free(&self) -> u64 {
        self.cpu_milli.saturating_sub(self.cpu_used)
    }

    /// Whether a pod with `needs` fits this host (CPU, memory, GPU model).
    pub fn fits(&self, needs: &PodNeeds) -> bool {
        self.cpu_used.saturating_add(needs.cpu_milli) <= self.cpu_milli
            && self.memory_used.saturating_add(needs.memory_mib) <= self.memory_mib
            && needs.allows(self.model)
    }

    /// Whether a host like this one (same CPU capacity and use, memory
    /// capacity and GPU model; host memory in use aside) may fit `needs`:
    /// false when every node of its class of identical nodes lacks it.
    pub(super) fn class_may_fit(&self, needs: &PodNeeds) -> bool {
        self.cpu_used.saturating_add(needs.cpu_milli) <= self.cpu_milli
            && needs.memory_mib <= self.memory_mib
            && needs.allows(self.model)
    }
}

/// What a pod needs of a node besides its GPU shares (a real cluster's pod
/// spec): CPU, host memory, the GPU models it may run on, and whether its
/// GPUs must all be on one node (a Kubernetes pod always is).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodNeeds {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Allowed GPU models; empty means any.
    pub models: Vec<GpuModel>,
    pub one_node: bool,
}

impl PodNeeds {
    pub fn allows(&self, model: GpuModel) -> bool {
        self.models.is_empty() || self.models.contains(&model)
    }
}
