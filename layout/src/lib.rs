//! `dilu-layout`: every `#[repr(C)]` structure of atomics that dilu shares
//! between processes, and the helper that maps them.
//!
//! - [`shm`]: mapping a layout from a file, an fd or anonymous memory.
//! - [`ledger`]: a tenant's memory ledger (budgets, usage, member slots).
//! - [`budget`]: a tenant's budget region: its SM-time share and bucket
//!   depth per device and (under the node manager) its memory budget per
//!   device, written by one writer.
//! - [`bucket`]: a tenant's SM-time token bucket per device (enforcement
//!   state every launch updates, hot words on cache lines of their own).
//! - [`activity`]: the region a tenant's processes all write while they
//!   run ([`activity::TenantActivity`]): the SM-time buckets they share
//!   (enforcement) and, apart from them, their telemetry (GPU busy time,
//!   throttling, bubble and latency histograms; advisory).
//! - [`colocation`]: the gap board a primary tenant and its fillers share
//!   on one GPU (work-conserving co-location, decided per launch).
//! - [`quiet`]: the quiet board on which a process timing a kernel longer
//!   than a time slice holds the device's other processes' launches, and
//!   on which they take fair turns by their shares (and skip the idle time
//!   their token buckets cause together).
//! - [`histogram`]: the lock-free log₂ histogram the telemetry is made of.
//! - [`memfd`]: regions in sealed memfds (budgets only their creator writes).
//!
//! Layouts change only together with their magic number. This crate depends
//! on libc alone; it never calls a CUDA driver.

pub mod activity;
pub mod bucket;
pub mod budget;
pub mod clock;
pub mod colocation;
pub mod histogram;
pub mod ipc_mappings;
pub mod ledger;
pub mod memfd;
pub mod quiet;
pub mod shm;
pub mod sweep;
pub mod vmm_exports;

/// Devices a layout has room for.
pub const MAX_DEVICES: usize = 16;

/// The directory under `/dev/shm` holding a user's tenant regions:
/// `dilu-<uid>`, mode 0700, so no other user can create (squat) a file in
/// it. If another user made that name first, the user's processes agree on
/// `dilu-<uid>.<random>` instead (see [`shm::user_dir`]).
pub fn user_region_dir(uid: u32) -> std::path::PathBuf {
    shm::user_dir(std::path::Path::new(SHM_ROOT), uid)
}

/// Where the per-user region directories live.
pub const SHM_ROOT: &str = "/dev/shm";

/// The file holding one of a tenant's regions in standalone mode (and its
/// ledger under the node manager): `/dev/shm/dilu-<uid>/<tenant>.<kind>`,
/// e.g. `.ledger`, `.sm`, `.telemetry`.
pub fn tenant_region_path(uid: u32, tenant: &str, kind: &str) -> std::path::PathBuf {
    user_region_dir(uid).join(format!("{tenant}.{kind}"))
}

pub use clock::monotonic_ns;
