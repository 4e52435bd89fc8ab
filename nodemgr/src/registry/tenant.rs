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
    /// Re-adopted from the persisted state and not re-registered yet.
    pub awaiting_since: Option<Instant>,
    /// Its devices by ordinal (its processes' numbering), never empty. A
    /// tenant the daemon placed (`dilu run` on a multi-GPU node, a
    /// cluster's grant) has one per GPU it was given, ascending, fixed. One
    /// not placed has the devices its processes launched on, each on the
    /// GPU they said it is where NVML confirms it ([`super::devices_in_use`];
    /// device 0 alone until they launch). Admission counts a tenant only
    /// against tenants of the same GPU.
    pub devices: Vec<TenantDevice>,
    /// The daemon chose its GPUs (they never change while it runs).
    pub placed: bool,
    /// The GPUs NVML last showed its processes on (the memory audit's
    /// query, a source the tenant cannot write): a device its processes
    /// say is on a GPU counts there only if NVML saw them there.
    pub seen_on_gpus: Vec<u32>,
    /// Why it did not fit when it registered, for a process that was
    /// already running (it started while the daemon was away): it was
    /// registered anyway, held to the room that was left.
    pub over_admitted: Option<String>,
}

/// One device of a tenant: where it is, the share its GPU's controller
/// gives it there and what was seen of it there. Every device of a tenant
/// is handled the same; device 0 has no rule of its own.
pub struct TenantDevice {
    /// Its number among its processes' devices (theirs as CUDA counts).
    pub ordinal: usize,
    /// The node GPU (NVML index) it is: the one the daemon placed it on,
    /// or, for a tenant not placed, the one its processes named for this
    /// device and NVML confirmed; `None`: not known (the device is then
    /// controlled with the unplaced tenants).
    pub gpu: Option<u32>,
    pub share_ppm: u32,
    pub sampler: Sampler,
    /// What the audit last saw its processes hold on this GPU.
    pub audited_bytes: Option<u64>,
}

impl TenantDevice {
    /// Device `ordinal` on node GPU `gpu`, starting at `share_ppm`.
    pub fn new(ordinal: usize, gpu: Option<u32>, share_ppm: u32) -> Self {
        TenantDevice {
            ordinal,
            gpu,
            share_ppm,
            sampler: Sampler::for_device(ordinal),
            audited_bytes: None,
        }
    }
}

/// The devices of a tenant on `gpus` (empty: not placed), each starting
/// at `share_ppm`.
pub fn devices_on(gpus: &[u32], share_ppm: u32) -> Vec<TenantDevice> {
    if gpus.is_empty() {
        return vec![TenantDevice::new(0, None, share_ppm)];
    }
    (gpus.iter().enumerate())
        .map(|(ordinal, &gpu)| TenantDevice::new(ordinal, Some(gpu), share_ppm))
        .collect()
}

/// Whether a tenant placed on `gpus` (empty: not placed) is on `gpu` (its
/// group for admission and control; `None`: the unplaced tenants' group).
pub(super) fn is_on(gpus: &[u32], gpu: Option<u32>) -> bool {
    match gpu {
        Some(g) => gpus.contains(&g),
        None => gpus.is_empty(),
    }
}

impl Tenant {
    /// Whether it runs on `gpu` (one of its GPUs; `None`: unplaced).
    pub fn is_on(&self, gpu: Option<u32>) -> bool {
        self.devices.iter().any(|d| d.gpu == gpu)
    }

    /// The GPUs it runs on in device order (empty while none is known).
    pub fn gpus(&self) -> Vec<u32> {
        self.devices.iter().filter_map(|d| d.gpu).collect()
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

    /// Each device's (ordinal, share).
    pub fn shares(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.devices.iter().map(|d| (d.ordinal, d.share_ppm))
    }
}

/// A GPU chosen for a tenant whose first process has not registered yet.
#[derive(Debug, Clone)]
pub struct HeldPlacement {
    pub uid: u32,
    pub spec: TenantSpec,
    /// Its GPUs (`dilu run --gpus N`: several), ascending, never empty.
    pub gpus: Vec<u32>,
    pub since: Instant,
}

/// Where a registering process comes from.
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub connection: Arc<OwnedFd>,
}

/// The share a tenant starts with before the controller's first period.
pub(super) fn initial_share(spec: &TenantSpec) -> u32 {
    spec.sm_limit.ppm()
}

/// What the cluster granted a tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub spec: TenantSpec,
    /// The GPUs allocated (ascending; empty on a one-GPU node).
    pub gpus: Vec<u32>,
}
