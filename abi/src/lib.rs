//! `dilu-abi`: the small crate every other dilu crate may depend on.
//!
//! It owns what crosses process boundaries: CUDA driver ABI aliases
//! (`cuda`), unit parsing used by every configuration surface (`units`),
//! simgpu's kernel-trace format (`simtrace`), the `#[repr(C)]` shared-memory
//! layouts tenants and the node manager map (`ledger`) with their mapping
//! helper (`shm`), and wire messages. It never calls a CUDA driver and never
//! links the interposer; it may touch `/proc` and shared-memory files.

pub mod cluster_wire;
pub mod cuda;
pub mod ledger;
pub mod shm;
pub mod simtrace;
pub mod units;
