//! `dilu-abi`: what crosses process boundaries other than shared memory.
//!
//! - `cuda` (feature `cuda`): CUDA driver ABI aliases (handles, structs,
//!   result codes), from cudarc's generated bindings.
//! - [`units`]: unit parsing used by every configuration surface;
//!   [`tenant_flags`]: the rules for a tenant's name, memory budget and SM
//!   share, shared by `dilu run`, the interposer and the node manager.
//! - [`simtrace`]: simgpu's kernel-trace format.
//! - [`node_wire`]: the node manager's socket protocol (messages);
//!   [`seqpacket`] and [`node_client`]: the tenant's end of that socket
//!   (connect, register, receive the region fds); [`operator_client`]: an
//!   operator's one request and answer (`dilu set`, the DRA plugin's grants).
//! - [`cluster_wire`]: what an instance asks of a GPU; [`pod_assignment`]:
//!   the placement written on a Kubernetes pod.
//!
//! The line with `dilu-layout`: every `#[repr(C)]` structure shared through
//! memory (and the paths of the files holding them) lives there, and is
//! imported from there (`dilu_layout::...`), never through this crate. This
//! crate never calls a CUDA driver and never links the interposer; it may
//! touch `/proc`, sockets and the region fds it receives.

pub mod cluster_wire;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod node_client;
pub mod node_wire;
pub mod operator_client;
pub mod pod_assignment;
pub mod seqpacket;
pub mod simtrace;
pub mod status_parts;
pub mod tenant_flags;
pub mod units;
