//! `dilu-abi`: the small crate every other dilu crate may depend on.
//!
//! It owns the vocabulary shared across process boundaries: CUDA driver ABI
//! aliases (`cuda`), human unit parsing used by every configuration surface
//! (`units`), and, as they are added, the `#[repr(C)]` shared-memory layouts
//! and wire messages exchanged between tenants and the node manager. It holds
//! no behaviour that touches a driver, a socket or a file.

pub mod cluster_wire;
pub mod cuda;
pub mod units;
