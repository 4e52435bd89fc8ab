//! What the registry holds about a tenant: its spec, regions, member
//! processes, control state per device and where it was placed; what it
//! holds for a tenant placed but not registered yet; and the units of its
//! shares.

use super::regions::Regions;
use crate::observe::Sampler;
use dilu_abi::node_wire::TenantSpec;
use dilu_layout::ledger::{self, TenantLedger};
use dilu_layout::shm::Region;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a tenant known from the persisted state may take to re-register
/// after a restart before its share is given back.
pub const READOPT_GRACE: Duration = Duration::from_secs(10);
/// How long a GPU chosen for a tenant (`dilu run` on a multi-GPU node) is
/// held for it before its first process registers (a program may take a
/// while to load its framework before its first CUDA call).
pub const PLACEMENT_GRACE: Duration = Duration::from_secs(120);
/// GPUs held for tenants that have not registered yet, at most (any local
/// user may ask; each hold expires after [`PLACEMENT_GRACE`]).
pub const MAX_HELD_PLACEMENTS: usize = 64;

pub struct Member {
    pub pid: i32,
    pub start_time: u64,
    /// The connection, so the daemon can close it on shutdown.
    pub connection: Arc<OwnedFd>,
}

pub struct Tenant {
    pub name: String,
    pub uid: u32,
    pub spec: TenantSpec,
    pub regions: Regions,
    pub members: BTreeMap<u64, Member>,
    pub ledger: Option<Region<TenantLedger>>,
    pub share_ppm: u32,
    pub sampler: Sampler,
    /// Re-adopted from the persisted state and not re-registered yet.
    pub awaiting_since: Option<Instant>,
    /// What the audit last saw its processes hold on device 0.
    pub audited_bytes: Option<u64>,
    /// The GPU the daemon placed it on (NVML index); `None`: not placed.
    /// Admission counts a tenant only against tenants of the same GPU.
    /// A tenant given several GPUs (`dilu run --gpus N`) has its first
    /// (lowest) here and the others in `more_gpus`: its device `k` is
    /// `[gpu, more_gpus..][k]`.
    pub gpu: Option<u32>,
    /// Its other GPUs, ascending (empty for a one-GPU tenant).
    pub more_gpus: Vec<u32>,
    /// The share and sampler of each of its other devices (device `k + 1`
    /// is `more_gpus[k]`): on each GPU it takes part in that GPU's control
    /// and gets its share there from that GPU's controller alone.
    /// `share_ppm` and `sampler` above are device 0's.
    pub more_devices: Vec<DeviceControl>,
    /// Why it did not fit when it registered, for a process that was
    /// already running (it started while the daemon was away): it was
    /// registered anyway, held to the room that was left.
    pub over_admitted: Option<String>,
}

/// The control state of one more device of a tenant given several GPUs.
pub struct DeviceControl {
    pub share_ppm: u32,
    pub sampler: Sampler,
}

/// Control states for devices 1..=`more` of a tenant at `share_ppm`.
pub fn more_devices(more: usize, share_ppm: u32) -> Vec<DeviceControl> {
    (1..=more)
        .map(|device| DeviceControl {
            share_ppm,
            sampler: Sampler::for_device(device),
        })
        .collect()
}

/// Whether a tenant whose GPUs are `first` and `more` is on `gpu` (its
/// group for admission and control).
pub(super) fn is_on(first: Option<u32>, more: &[u32], gpu: Option<u32>) -> bool {
    first == gpu || gpu.is_some_and(|g| more.contains(&g))
}

impl Tenant {
    /// Whether it runs on `gpu` (one of its GPUs; `None`: unplaced).
    pub fn is_on(&self, gpu: Option<u32>) -> bool {
        is_on(self.gpu, &self.more_gpus, gpu)
    }

    /// Its GPUs in device order (empty when unplaced).
    pub fn gpus(&self) -> Vec<u32> {
        self.gpu
            .into_iter()
            .chain(self.more_gpus.iter().copied())
            .collect()
    }

    /// The memory budget that binds on `device`: the daemon's, lowered by
    /// the tenant's own limit in its ledger (see the interposer's budget).
    pub fn mem_budget(&self, device: usize) -> Option<u64> {
        let own = self
            .ledger
            .as_ref()
            .map_or(ledger::UNLIMITED, |l| l.budget(device));
        let bytes = self.regions.budget.binding_mem_budget(own, device);
        (bytes != ledger::UNLIMITED).then_some(bytes)
    }
}

/// A GPU chosen for a tenant whose first process has not registered yet.
#[derive(Debug, Clone)]
pub struct HeldPlacement {
    pub uid: u32,
    pub spec: TenantSpec,
    pub gpu: u32,
    /// Its other GPUs (`dilu run --gpus N`), ascending.
    pub more_gpus: Vec<u32>,
    pub since: Instant,
}

impl HeldPlacement {
    /// Its GPUs, ascending.
    pub fn gpus(&self) -> Vec<u32> {
        std::iter::once(self.gpu)
            .chain(self.more_gpus.iter().copied())
            .collect()
    }
}

/// Where a registering process comes from.
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub connection: Arc<OwnedFd>,
}

pub(super) fn ppm(pct: f64) -> u32 {
    (pct * 10_000.0).round() as u32
}

/// The share a tenant starts with before the controller's first period.
pub(super) fn initial_share(spec: &TenantSpec) -> u32 {
    ppm(spec.sm_limit_pct)
}

/// What the cluster granted a tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub spec: TenantSpec,
    /// The GPUs allocated (ascending; empty on a one-GPU node).
    pub gpus: Vec<u32>,
}
