//! Wire messages between the cluster coordinator and a node manager.
//!
//! This module owns the vocabulary of the coordinator <-> node-manager TCP
//! protocol: every frame is a [`Frame`] carrying [`PROTOCOL_VERSION`] and one
//! message, encoded with postcard and prefixed by its length (u32,
//! little-endian, at most [`MAX_FRAME_BYTES`]). The coordinator always speaks
//! first ([`CoordinatorMessage`]) and the node answers every message with
//! exactly one [`NodeMessage`], so a connection is a strict request/response
//! stream; [`CoordinatorMessage::Poll`] doubles as the heartbeat.
//!
//! New variants go at the end of each enum (postcard encodes the variant
//! index); a change that reorders or alters fields bumps the version.

use serde::{Deserialize, Serialize};

/// Version carried in every frame; a peer refuses frames of another version.
/// The coordinator's control port (`dilu-cluster deploy`/`status`) frames
/// its messages the same way, so a change there bumps it too. 2: function
/// profiles on the control port say whether the function is restartable.
pub const PROTOCOL_VERSION: u16 = 2;

/// Largest encoded frame a peer accepts (guards against garbage lengths).
pub const MAX_FRAME_BYTES: u32 = 4 << 20;

/// Envelope of every message on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame<T> {
    pub version: u16,
    pub body: T,
}

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

/// One instance as the node knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub instance_id: u64,
    pub function: String,
    pub demand: InstanceDemand,
    /// Indices of the node's GPUs the instance occupies.
    pub gpu_indices: Vec<u32>,
}

/// One GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInventory {
    pub index: u32,
    pub memory_bytes: u64,
}

/// Load a node observes for one function, summed over its instances there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionLoad {
    pub function: String,
    /// Requests per second arriving at this node's instances of the function.
    pub request_rate: f64,
    /// The node manager's vertical scaler is out of headroom and asks for
    /// another instance.
    pub wants_scale_out: bool,
}

/// Messages the coordinator sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CoordinatorMessage {
    /// First message of a connection; the node answers `Registered`.
    Hello { coordinator: String },
    /// Start tracking an instance on the given GPUs; answered by `Ack`.
    Place(InstanceRecord),
    /// Stop an instance; answered by `Ack`.
    Remove { instance_id: u64 },
    /// Heartbeat and load poll; answered by `Load`.
    Poll,
}

/// Messages the node sends, one per coordinator message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeMessage {
    /// The node's identity, GPUs and the instances it already runs.
    Registered {
        node_name: String,
        gpus: Vec<GpuInventory>,
        instances: Vec<InstanceRecord>,
    },
    /// Outcome of `Place` / `Remove`: `error` is `None` on success.
    Ack {
        instance_id: u64,
        error: Option<String>,
    },
    /// Current load per function and the instances the node runs.
    Load {
        functions: Vec<FunctionLoad>,
        instance_ids: Vec<u64>,
    },
    /// The node could not understand the request.
    Rejected { reason: String },
}
