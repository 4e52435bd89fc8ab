//! The cluster model every policy reasons about: nodes own GPUs, each GPU
//! carries the running sums of what its instances request (SM request, SM
//! limit, memory) and how many latency / batch instances it hosts.
//!
//! `ClusterState` is the only mutable view; it knows nothing about policies,
//! networking or time.

use std::ops::Range;

pub use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};

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

    fn add(&mut self, demand: &InstanceDemand) {
        self.memory_used = self.memory_used.saturating_add(demand.memory_bytes);
        self.sm_request_sum += demand.sm_request;
        self.sm_limit_sum += demand.sm_limit;
        match demand.class {
            WorkClass::Latency => self.latency_instances += 1,
            WorkClass::Batch => self.batch_instances += 1,
        }
    }

    fn remove(&mut self, demand: &InstanceDemand) {
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

/// All GPUs of the cluster, grouped by node (a node's GPUs are contiguous).
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub gpus: Vec<GpuState>,
    pub nodes: Vec<Range<usize>>,
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

    /// Appends a node and returns its index.
    pub fn add_node(&mut self, gpus: usize, gpu_memory: u64) -> usize {
        let node = self.nodes.len();
        let start = self.gpus.len();
        self.gpus
            .extend((0..gpus).map(|_| GpuState::new(node, gpu_memory)));
        self.nodes.push(start..self.gpus.len());
        node
    }

    /// Records `demand` on each GPU in `gpus` (global indices).
    pub fn apply(&mut self, demand: &InstanceDemand, gpus: &[usize]) {
        for &gpu in gpus {
            if let Some(state) = self.gpus.get_mut(gpu) {
                state.add(demand);
            }
        }
    }

    /// Undoes [`apply`](Self::apply).
    pub fn release(&mut self, demand: &InstanceDemand, gpus: &[usize]) {
        for &gpu in gpus {
            if let Some(state) = self.gpus.get_mut(gpu) {
                state.remove(demand);
            }
        }
    }

    pub fn active_gpus(&self) -> usize {
        self.gpus.iter().filter(|gpu| gpu.is_active()).count()
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
        assert_eq!(cluster.gpus[1].memory_used, 20);
        assert!((cluster.gpus[1].sm_limit_sum - 1.0).abs() < 1e-12);
        cluster.release(&small(WorkClass::Latency), &[1]);
        cluster.release(&small(WorkClass::Batch), &[1]);
        assert_eq!(cluster.active_gpus(), 0);
        assert_eq!(cluster.gpus[1], GpuState::new(0, 100));
    }
}
