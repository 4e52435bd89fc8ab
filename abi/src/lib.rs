//! `dilu-abi`: the small crate every other dilu crate may depend on.
//!
//! It owns what crosses process boundaries: CUDA driver ABI aliases
//! (`cuda`), unit parsing used by every configuration surface (`units`),
//! simgpu's kernel-trace format (`simtrace`), what an instance asks of a GPU
//! (`cluster_wire`), the node manager's wire messages (`node_wire`), the
//! placement written on a Kubernetes pod (`pod_assignment`), and the
//! tenant's end of the node manager's
//! socket (`seqpacket`, `node_client`: connect, register, receive fds). The
//! `#[repr(C)]` shared-memory layouts live in their own crate, `dilu-layout`,
//! re-exported here. It never calls a CUDA driver and never links the
//! interposer; it may touch `/proc` and shared-memory files.

pub mod cluster_wire;
pub mod cuda;
pub mod node_client;
pub mod node_wire;
pub mod pod_assignment;
pub mod seqpacket;
pub mod simtrace;
pub mod units;

pub use dilu_layout::{
    bucket, budget, colocation, histogram, ledger, memfd, monotonic_ns, shm, telemetry,
    tenant_region_path, user_region_dir,
};
