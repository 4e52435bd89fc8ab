//! What an instance of a function asks of each GPU it runs on: the
//! vocabulary the placement policies (`dilu-placement`), the cluster layer
//! and the node manager's tenant specs (`node_wire` re-exports
//! [`WorkClass`]) share.

use serde::{Deserialize, Serialize};

/// Whether a function serves requests under a latency SLO or runs batch work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WorkClass {
    Latency,
    Batch,
}

/// What one instance of a function needs from each GPU it occupies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceDemand {
    pub class: WorkClass,
    /// Guaranteed SM-time share per GPU, 0..=1.
    pub sm_request: f64,
    /// Most SM-time share it may take when others idle, >= request.
    pub sm_limit: f64,
    /// Device memory per GPU, bytes.
    pub memory_bytes: u64,
    /// Number of GPUs the instance spans (gang placement on one node).
    pub gpus: u32,
}
