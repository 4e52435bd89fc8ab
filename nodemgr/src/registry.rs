//! The daemon's tenants: their specs, regions, member processes and
//! sampling state; admission and re-adoption.
//!
//! A tenant is identified by (name, uid): the uid is the one the kernel
//! reported for its first process (`SO_PEERCRED`), and other users cannot
//! join it. The daemon holds the only writable mapping of each tenant's
//! budget region (a sealed memfd holding its SM share and its memory budget
//! per device); members get a read-only descriptor. The tenant's memory
//! ledger (a file its processes write) only counts usage: the daemon reads
//! a copy of it for status (never a mapping the tenant could truncate), but
//! the budget the interposer enforces is the one in the sealed region, and
//! real usage is audited from NVML ([`crate::audit`]).
//!
//! Nothing here performs I/O or waits: callers hold the registry lock, which
//! the control loop needs every period. Regions are made, and descriptors a
//! tenant hands back are inspected, before the lock is taken
//! ([`create_regions`]).

use crate::observe::Sampler;
use dilu_abi::node_wire::{SpecUpdate, TenantSpec, TenantStatus};
use dilu_abi::tenant_flags::check_tenant_name;
use dilu_layout::activity::TenantActivity;
use dilu_layout::budget::{self, DEFAULT_DEPTH_NS, FULL_SHARE_PPM, TenantBudget, UNLIMITED_SHARE};
use dilu_layout::ledger::{self, TenantLedger};
use dilu_layout::memfd;
use dilu_layout::shm::Region;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::CString;
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

pub struct Regions {
    pub budget: Region<TenantBudget>,
    /// Read-only descriptor handed to members (shared so a reply can carry
    /// it after the registry lock is released).
    pub budget_ro: Arc<OwnedFd>,
    /// Tenants write it; its size is sealed so none can shrink it under the
    /// daemon's mapping.
    pub activity: Region<TenantActivity>,
    pub activity_fd: Arc<OwnedFd>,
    /// The activity region was handed back by a re-attaching process (adopted).
    pub adopted: bool,
}

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
fn is_on(first: Option<u32>, more: &[u32], gpu: Option<u32>) -> bool {
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
        let bytes = own.min(self.regions.budget.mem_budget(device));
        (bytes != ledger::UNLIMITED).then_some(bytes)
    }
}

/// What is persisted under the run directory for re-adoption.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTenant {
    pub name: String,
    pub uid: u32,
    pub spec: TenantSpec,
    pub share_ppm: u32,
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub more_gpus: Vec<u32>,
    /// The share on each of `more_gpus` (its devices 1..).
    #[serde(default)]
    pub more_shares: Vec<u32>,
    #[serde(default)]
    pub over_admitted: Option<String>,
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

pub struct Registry {
    /// Specs from the operator's configuration (win over the tenant's).
    pub configured: BTreeMap<String, TenantSpec>,
    pub gpu_memory: Option<u64>,
    pub tenants: BTreeMap<String, Tenant>,
    /// GPUs chosen for tenants not registered yet, by tenant name.
    pub held: BTreeMap<String, HeldPlacement>,
    /// Bumped when the tenant set changes (controllers reset).
    pub epoch: u64,
    next_member: u64,
    /// Tenants one uid may have registered (`max_tenants_per_uid`).
    pub max_tenants_per_uid: usize,
}

fn ppm(pct: f64) -> u32 {
    (pct * 10_000.0).round() as u32
}

/// Writes one share to every device of a budget.
pub fn write_share(budget: &TenantBudget, share_ppm: u32) {
    let value = if share_ppm >= FULL_SHARE_PPM {
        UNLIMITED_SHARE
    } else {
        share_ppm
    };
    for device in 0..dilu_layout::ledger::MAX_DEVICES {
        if budget.share_ppm(device) != value {
            budget.set_share_ppm(device, value);
        }
    }
}

/// Writes a tenant's shares device by device: `first` to device 0 (and to
/// every device past its own), `more[k]` to device `k + 1`. With no more
/// devices, the same as [`write_share`].
pub fn write_shares(budget: &TenantBudget, first: u32, more: &[DeviceControl]) {
    if more.is_empty() {
        return write_share(budget, first);
    }
    for device in 0..dilu_layout::ledger::MAX_DEVICES {
        let share = match device.checked_sub(1).and_then(|k| more.get(k)) {
            Some(d) => d.share_ppm,
            None => first,
        };
        let value = if share >= FULL_SHARE_PPM {
            UNLIMITED_SHARE
        } else {
            share
        };
        if budget.share_ppm(device) != value {
            budget.set_share_ppm(device, value);
        }
    }
}

/// Makes a tenant's regions. `handed_back` is an activity-region descriptor a
/// re-attaching process gave back: adopted only if it is a memfd region whose
/// size is (or can now be) sealed, checked without waiting; otherwise the
/// tenant starts with a fresh one. Runs outside the registry lock.
pub fn create_regions(name: &str, handed_back: Option<OwnedFd>) -> Result<Regions, String> {
    let label = CString::new(format!("dilu-budget-{name}")).map_err(|e| e.to_string())?;
    let (budget, budget_fd) = memfd::create::<TenantBudget>(&label, |b| {
        b.set_depth_ns(DEFAULT_DEPTH_NS);
        write_share(b, 0);
        b.set_mem_budget_all(Some(0));
    })
    .map_err(|e| format!("cannot create the budget region: {e}"))?;
    memfd::seal_read_only(&budget_fd).map_err(|e| format!("cannot seal the budget region: {e}"))?;
    let budget_ro = memfd::reopen_read_only(&budget_fd)
        .map_err(|e| format!("cannot reopen the budget region: {e}"))?;
    let adopted = handed_back.and_then(|fd| match memfd::adopt::<TenantActivity>(&fd, true) {
        Ok(region) => Some((region, fd)),
        Err(e) => {
            tracing::warn!(
                tenant = name,
                "not adopting the activity region handed back: {e}"
            );
            None
        }
    });
    let (activity, activity_fd, adopted) = match adopted {
        Some((region, fd)) => (region, fd, true),
        None => {
            let label = CString::new(format!("dilu-tel-{name}")).map_err(|e| e.to_string())?;
            let (region, fd) = memfd::create::<TenantActivity>(&label, |_| {})
                .map_err(|e| format!("cannot create the activity region: {e}"))?;
            memfd::seal_size(&fd).map_err(|e| format!("cannot seal the activity region: {e}"))?;
            (region, fd, false)
        }
    };
    Ok(Regions {
        budget,
        budget_ro: Arc::new(budget_ro),
        activity,
        activity_fd: Arc::new(activity_fd),
        adopted,
    })
}

/// Sets a fresh budget region to a tenant's share and memory budget
/// (memory writes only: runs under the registry lock).
fn configure(regions: &Regions, share_ppm: u32, mem_bytes: Option<u64>) {
    write_share(&regions.budget, share_ppm);
    regions.budget.set_mem_budget_all(mem_bytes);
}

/// The share a tenant starts with before the controller's first period.
fn initial_share(spec: &TenantSpec) -> u32 {
    ppm(spec.sm_limit_pct)
}

impl Registry {
    pub fn new(configured: BTreeMap<String, TenantSpec>, gpu_memory: Option<u64>) -> Self {
        Registry {
            configured,
            gpu_memory,
            tenants: BTreeMap::new(),
            held: BTreeMap::new(),
            epoch: 0,
            next_member: 1,
            max_tenants_per_uid: crate::config::DEFAULT_MAX_TENANTS_PER_UID,
        }
    }

    /// Checks that `spec` fits beside the other tenants of each of the
    /// tenant's GPUs (`gpu` and `more`: those it was placed on; its spec
    /// holds on each).
    pub fn admit_each(
        &self,
        name: &str,
        spec: &TenantSpec,
        gpu: Option<u32>,
        more: &[u32],
    ) -> Result<(), String> {
        self.admit(name, spec, gpu)?;
        for &g in more {
            self.admit(name, spec, Some(g))
                .map_err(|e| format!("on gpu{g}: {e}"))?;
        }
        Ok(())
    }

    /// Checks that `spec` fits beside every other tenant on the same GPU
    /// (`gpu`: the one it was placed on; unplaced tenants count together,
    /// as on a one-GPU node); `name` is the tenant being admitted or changed.
    pub fn admit(&self, name: &str, spec: &TenantSpec, gpu: Option<u32>) -> Result<(), String> {
        spec.validate()?;
        let held = self
            .held
            .iter()
            .filter(|(_, h)| is_on(Some(h.gpu), &h.more_gpus, gpu))
            .map(|(n, h)| (n, &h.spec));
        let others: Vec<(&String, &TenantSpec)> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.is_on(gpu))
            .map(|(n, t)| (n, &t.spec))
            .chain(held)
            .filter(|(n, _)| n.as_str() != name)
            .collect();
        let requested: u32 = others
            .iter()
            .map(|(_, s)| ppm(s.sm_request_pct))
            .sum::<u32>()
            + ppm(spec.sm_request_pct);
        if requested > FULL_SHARE_PPM {
            let list: Vec<String> = others
                .iter()
                .map(|(n, s)| format!("{n} {}%", s.sm_request_pct))
                .collect();
            return Err(format!(
                "SM requests would sum to {}% of the GPU (> 100%): {name} asks {}%, admitted: {}",
                requested as f64 / 10_000.0,
                spec.sm_request_pct,
                if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                }
            ));
        }
        if let (Some(capacity), Some(mem)) = (self.gpu_memory, spec.mem_bytes) {
            let used: u64 = others.iter().filter_map(|(_, s)| s.mem_bytes).sum();
            if used.saturating_add(mem) > capacity {
                return Err(format!(
                    "memory budgets would sum to {} on a {} GPU: {name} asks {}, others hold {}",
                    dilu_abi::units::format_size(used.saturating_add(mem)),
                    dilu_abi::units::format_size(capacity),
                    dilu_abi::units::format_size(mem),
                    dilu_abi::units::format_size(used)
                ));
            }
        }
        Ok(())
    }

    /// Registers a process of tenant `name`. `fresh` are regions made for
    /// it outside the lock ([`create_regions`]; the telemetry a re-attaching
    /// process handed back, if it could be adopted): used when the tenant is
    /// new or is re-adopted after a restart, dropped otherwise. Nothing here
    /// reads a tenant's descriptor or waits: the caller holds the registry
    /// lock. The share never comes from the tenant: a re-adopted tenant gets
    /// the one the previous daemon saved, a new one its limit.
    /// Returns the member id, the spec in force and the fds to send.
    pub fn register(
        &mut self,
        name: &str,
        peer: Peer,
        start_time: u64,
        asked: Option<TenantSpec>,
        fresh: Regions,
    ) -> Result<(u64, TenantSpec, [Arc<OwnedFd>; 2]), String> {
        check_tenant_name(name)?;
        let mut fresh = Some(fresh);
        if let Some(tenant) = self.tenants.get_mut(name)
            && tenant.uid == peer.uid
            && tenant.awaiting_since.take().is_some()
            && fresh.as_ref().is_some_and(|r| r.adopted)
        {
            // Re-adopted from the state file: the first process back hands
            // over the telemetry its processes write.
            let regions = fresh.take().expect("checked above");
            configure(&regions, tenant.share_ppm, tenant.spec.mem_bytes);
            write_shares(&regions.budget, tenant.share_ppm, &tenant.more_devices);
            tenant.regions = regions;
            tenant.sampler = Sampler::default();
            for (k, device) in tenant.more_devices.iter_mut().enumerate() {
                device.sampler = Sampler::for_device(k + 1);
            }
        }
        if !self.tenants.contains_key(name) {
            let spec = self
                .configured
                .get(name)
                .cloned()
                .or(asked)
                .unwrap_or_default();
            // A GPU chosen for it by `dilu run` is its GPU from now on.
            let (gpu, more_gpus) = match self.held.get(name) {
                Some(held) if held.uid != peer.uid => {
                    return Err(format!(
                        "tenant {name:?} belongs to another user (uid {})",
                        held.uid
                    ));
                }
                Some(held) => (Some(held.gpu), held.more_gpus.clone()),
                None => (None, Vec::new()),
            };
            self.check_tenant_cap(peer.uid)?;
            // A process handing back its regions is already running (it
            // started while the daemon was away, or outlived a previous
            // one): refusing it would leave it unmanaged, so it is held to
            // the room left and named as over-admitted.
            let running = fresh.as_ref().is_some_and(|r| r.adopted);
            let (spec, over_admitted) = match self.admit_each(name, &spec, gpu, &more_gpus) {
                Ok(()) => (spec, None),
                Err(reason) if running => {
                    let mut held = self.room_left(name, &spec, gpu);
                    for &g in &more_gpus {
                        let room = self.room_left(name, &spec, Some(g));
                        held.sm_request_pct = held.sm_request_pct.min(room.sm_request_pct);
                        held.sm_limit_pct = held.sm_limit_pct.max(held.sm_request_pct);
                        if let (Some(a), Some(b)) = (held.mem_bytes, room.mem_bytes) {
                            held.mem_bytes = Some(a.min(b));
                        }
                    }
                    tracing::warn!(
                        tenant = name,
                        uid = peer.uid,
                        "over-admitted: {reason}; held to SM request {}% and memory {}",
                        held.sm_request_pct,
                        held.mem_bytes
                            .map_or("unlimited".into(), dilu_abi::units::format_size)
                    );
                    (held, Some(reason))
                }
                Err(reason) => return Err(reason),
            };
            self.held.remove(name);
            let share = initial_share(&spec);
            let regions = fresh.take().expect("not used above for a new tenant");
            configure(&regions, share, spec.mem_bytes);
            self.tenants.insert(
                name.to_string(),
                Tenant {
                    name: name.to_string(),
                    uid: peer.uid,
                    spec,
                    regions,
                    members: BTreeMap::new(),
                    ledger: None,
                    share_ppm: share,
                    sampler: Sampler::default(),
                    awaiting_since: None,
                    audited_bytes: None,
                    gpu,
                    more_devices: more_devices(more_gpus.len(), share),
                    more_gpus,
                    over_admitted,
                },
            );
            self.epoch += 1;
        }
        let tenant = self.tenants.get_mut(name).expect("inserted above");
        if tenant.uid != peer.uid {
            return Err(format!(
                "tenant {name:?} belongs to another user (uid {})",
                tenant.uid
            ));
        }
        let id = self.next_member;
        self.next_member += 1;
        tenant.members.insert(
            id,
            Member {
                pid: peer.pid,
                start_time,
                connection: peer.connection,
            },
        );
        let fds = [
            tenant.regions.budget_ro.clone(),
            tenant.regions.activity_fd.clone(),
        ];
        Ok((id, tenant.spec.clone(), fds))
    }

    /// `spec` cut down to what is left beside the other tenants of `gpu`:
    /// the SM request to the unrequested share, the memory budget to the
    /// unbudgeted memory. What an over-admitted tenant is held to, so the
    /// admitted tenants keep their guarantees.
    fn room_left(&self, name: &str, spec: &TenantSpec, gpu: Option<u32>) -> TenantSpec {
        let others = || {
            self.tenants
                .iter()
                .filter(move |(n, t)| t.is_on(gpu) && n.as_str() != name)
                .map(|(_, t)| &t.spec)
        };
        let requested: u32 = others().map(|s| ppm(s.sm_request_pct)).sum();
        let free_pct = FULL_SHARE_PPM.saturating_sub(requested) as f64 / 10_000.0;
        let mut held = spec.clone();
        held.sm_request_pct = spec.sm_request_pct.clamp(0.0, 100.0).min(free_pct);
        held.sm_limit_pct = spec.sm_limit_pct.clamp(held.sm_request_pct, 100.0);
        if let (Some(capacity), Some(mem)) = (self.gpu_memory, spec.mem_bytes) {
            let budgeted: u64 = others().filter_map(|s| s.mem_bytes).sum();
            held.mem_bytes = Some(mem.min(capacity.saturating_sub(budgeted)));
        }
        held
    }

    /// Refuses a new tenant of `uid` when that user already has
    /// `max_tenants_per_uid` (other users' tenants do not count).
    fn check_tenant_cap(&self, uid: u32) -> Result<(), String> {
        let held = self.tenants.values().filter(|t| t.uid == uid).count();
        if held >= self.max_tenants_per_uid {
            return Err(format!(
                "uid {uid} already has {held} tenants registered (max_tenants_per_uid = {})",
                self.max_tenants_per_uid
            ));
        }
        Ok(())
    }

    /// A member's connection closed. A tenant with no member left is gone:
    /// its share goes back to the others.
    pub fn leave(&mut self, member: u64) {
        let mut emptied = None;
        for (name, tenant) in &mut self.tenants {
            if tenant.members.remove(&member).is_some() && tenant.members.is_empty() {
                emptied = Some(name.clone());
            }
        }
        if let Some(name) = emptied {
            self.tenants.remove(&name);
            self.epoch += 1;
        }
    }

    /// Applies an operator's change after admission.
    pub fn update(&mut self, name: &str, update: &SpecUpdate) -> Result<TenantSpec, String> {
        let tenant = self
            .tenants
            .get(name)
            .ok_or_else(|| format!("no tenant named {name:?}"))?;
        let mut spec = tenant.spec.clone();
        if let Some(v) = update.class {
            spec.class = v;
        }
        if let Some(v) = update.slo_ms {
            spec.slo_ms = Some(v);
        }
        if let Some(v) = update.sm_request_pct {
            spec.sm_request_pct = v;
        }
        if let Some(v) = update.sm_limit_pct {
            spec.sm_limit_pct = v;
            spec.sm_request_pct = spec.sm_request_pct.min(v);
        }
        if let Some(v) = update.mem_bytes {
            spec.mem_bytes = Some(v);
        }
        self.admit_each(name, &spec, tenant.gpu, &tenant.more_gpus)?;
        let tenant = self.tenants.get_mut(name).expect("checked above");
        tenant.spec = spec.clone();
        // Live: every member's next allocation is held to the new budget.
        tenant.regions.budget.set_mem_budget_all(spec.mem_bytes);
        self.epoch += 1;
        Ok(spec)
    }

    /// Housekeeping every ~100 ms: re-adoption grace expired. Memory only
    /// (the ledgers are read outside the lock: [`Registry::ledger_sources`]).
    pub fn housekeeping(&mut self) {
        let before = self.tenants.len();
        self.tenants.retain(|_, t| {
            t.awaiting_since
                .is_none_or(|since| since.elapsed() < READOPT_GRACE)
        });
        if self.tenants.len() != before {
            self.epoch += 1;
        }
        self.held.retain(|_, h| h.since.elapsed() < PLACEMENT_GRACE);
    }

    /// Chooses `count` GPUs for tenant `name` of user `uid` (`dilu run` on
    /// a node with several GPUs, `--gpus N`) and holds them until the
    /// tenant's first process registers. `capacities` is each GPU's memory
    /// (bytes); the spec is the operator's for this name, else `asked`,
    /// else the default, as at registration, and holds on each GPU. A
    /// tenant already running keeps its GPUs (its processes share one
    /// budget). The GPUs come back ascending; empty: one GPU, one asked,
    /// nothing to choose.
    pub fn place(
        &mut self,
        name: &str,
        uid: u32,
        asked: Option<TenantSpec>,
        capacities: &[u64],
        policy: &dyn dilu_placement::policy::PlacementPolicy,
        count: usize,
    ) -> Result<Vec<u32>, String> {
        check_tenant_name(name)?;
        let count = count.max(1);
        if count > capacities.len().max(1) {
            return Err(format!(
                "{name} asks {count} GPUs; this node has {}",
                capacities.len().max(1)
            ));
        }
        if capacities.len() <= 1 {
            return Ok(Vec::new());
        }
        let spec = self
            .configured
            .get(name)
            .cloned()
            .or(asked)
            .unwrap_or_default();
        spec.validate()?;
        let running = |gpus: Vec<u32>| {
            if gpus.len() == count {
                Ok(gpus)
            } else {
                Err(format!(
                    "tenant {name:?} already runs on {} GPU(s) ({}); its processes \
                     share one placement, so start them with --gpus {}",
                    gpus.len(),
                    gpus.iter()
                        .map(|g| format!("gpu{g}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    gpus.len()
                ))
            }
        };
        if let Some(tenant) = self.tenants.get(name) {
            if tenant.uid != uid {
                return Err(format!(
                    "tenant {name:?} belongs to another user (uid {})",
                    tenant.uid
                ));
            }
            if tenant.gpu.is_some() {
                return running(tenant.gpus());
            }
        }
        if let Some(held) = self.held.get_mut(name) {
            if held.uid != uid {
                return Err(format!(
                    "tenant {name:?} belongs to another user (uid {})",
                    held.uid
                ));
            }
            held.since = Instant::now();
            return running(held.gpus());
        }
        if self.held.len() >= MAX_HELD_PLACEMENTS {
            return Err(format!(
                "{MAX_HELD_PLACEMENTS} tenants already wait for their first process; try again later"
            ));
        }
        let taken: Vec<(Vec<u32>, &TenantSpec)> = self
            .tenants
            .values()
            .filter(|t| t.gpu.is_some())
            .map(|t| (t.gpus(), &t.spec))
            .chain(self.held.values().map(|h| (h.gpus(), &h.spec)))
            .map(|(gpus, spec)| {
                let gpus = gpus
                    .into_iter()
                    .filter(|&g| (g as usize) < capacities.len())
                    .collect();
                (gpus, spec)
            })
            .collect();
        let taken = taken.iter().map(|(gpus, spec)| (gpus.as_slice(), *spec));
        let gpus = crate::placement::choose(policy, capacities, taken, &spec, count)
            .ok_or_else(|| {
                format!(
                    "{} {} room for {name} (SM request {}%, limit {}%{}{}) under the {} placement policy",
                    if count == 1 {
                        format!("no GPU of {}", capacities.len())
                    } else {
                        format!("fewer than {count} of the {} GPUs", capacities.len())
                    },
                    if count == 1 { "has" } else { "have" },
                    spec.sm_request_pct,
                    spec.sm_limit_pct,
                    spec.mem_bytes
                        .map(|m| format!(", {}", dilu_abi::units::format_size(m)))
                        .unwrap_or_default(),
                    if count == 1 { "" } else { " on each" },
                    policy.name()
                )
            })?;
        self.held.insert(
            name.to_string(),
            HeldPlacement {
                uid,
                spec,
                gpu: gpus[0],
                more_gpus: gpus[1..].to_vec(),
                since: Instant::now(),
            },
        );
        Ok(gpus)
    }

    /// Each tenant's (name, uid), to read their ledgers without the lock.
    pub fn ledger_sources(&self) -> Vec<(String, u32)> {
        self.tenants
            .values()
            .map(|t| (t.name.clone(), t.uid))
            .collect()
    }

    /// Stores a ledger copy read outside the lock.
    pub fn set_ledger(&mut self, name: &str, uid: u32, ledger: Option<Region<TenantLedger>>) {
        if let Some(tenant) = self.tenants.get_mut(name)
            && tenant.uid == uid
        {
            tenant.ledger = ledger;
        }
    }

    /// What the memory audit needs: each tenant's processes and budgets.
    /// The budget audited is the daemon's (the sealed region), never the
    /// tenant's own ledger, which the tenant can rewrite.
    pub fn audit_view(&self) -> Vec<crate::audit::AuditedTenant> {
        self.tenants
            .values()
            .map(|t| crate::audit::AuditedTenant {
                name: t.name.clone(),
                pids: t.members.values().map(|m| m.pid).collect(),
                budgets: (0..ledger::MAX_DEVICES)
                    .map(|d| {
                        let bytes = t.regions.budget.mem_budget(d);
                        (bytes != ledger::UNLIMITED).then_some(bytes)
                    })
                    .collect(),
            })
            .collect()
    }

    /// Records what the audit saw a tenant hold on device 0.
    pub fn set_audited(&mut self, name: &str, bytes: Option<u64>) {
        if let Some(t) = self.tenants.get_mut(name) {
            t.audited_bytes = bytes;
        }
    }

    /// Tenants as they are now, for `dilu status` and metrics.
    pub fn status(&self) -> Vec<TenantStatus> {
        self.tenants
            .values()
            .map(|t| {
                let recent = t.sampler.recent();
                TenantStatus {
                    name: t.name.clone(),
                    uid: t.uid,
                    spec: t.spec.clone(),
                    pids: t.members.values().map(|m| m.pid).collect(),
                    mem_used_bytes: t.ledger.as_ref().map_or(0, |l| l.used(0)),
                    mem_budget_bytes: t.mem_budget(0),
                    mem_audited_bytes: t.audited_bytes,
                    sm_current_pct: t.share_ppm as f64 / 10_000.0,
                    sm_achieved_pct: recent.achieved * 100.0,
                    busy_seconds_total: recent.busy_total_ns as f64 / 1e9,
                    launches_total: recent.launches_total,
                    throttled_seconds_total: recent.throttled_total_ns as f64 / 1e9,
                    p99_ms: recent.p99_ns.map(|ns| ns as f64 / 1e6),
                    latency_reports_total: recent.latency_reports_total,
                    latency_seconds_total: recent.latency_sum_total_ns as f64 / 1e9,
                    bubble_ratio: recent.bubble_ratio,
                    gpu: t.gpu,
                    more_gpus: t
                        .more_gpus
                        .iter()
                        .zip(&t.more_devices)
                        .map(|(&gpu, d)| dilu_abi::node_wire::GpuShare {
                            gpu,
                            sm_current_pct: d.share_ppm as f64 / 10_000.0,
                            sm_achieved_pct: d.sampler.recent().achieved * 100.0,
                        })
                        .collect(),
                    waiting: t.sampler.waiting_at_zero(t.share_ppm),
                    over_admitted: t.over_admitted.clone(),
                }
            })
            .collect()
    }

    /// The state to persist.
    pub fn saved(&self) -> Vec<SavedTenant> {
        self.tenants
            .values()
            .map(|t| SavedTenant {
                name: t.name.clone(),
                uid: t.uid,
                spec: t.spec.clone(),
                share_ppm: t.share_ppm,
                gpu: t.gpu,
                more_gpus: t.more_gpus.clone(),
                more_shares: t.more_devices.iter().map(|d| d.share_ppm).collect(),
                over_admitted: t.over_admitted.clone(),
            })
            .collect()
    }

    /// Tenants of a previous daemon, waiting for their processes to
    /// re-register: they keep their requests admitted meanwhile.
    pub fn restore(&mut self, saved: Vec<SavedTenant>) {
        for s in saved {
            if check_tenant_name(&s.name).is_err() || self.tenants.contains_key(&s.name) {
                continue;
            }
            let Ok(regions) = create_regions(&s.name, None) else {
                continue;
            };
            configure(&regions, s.share_ppm, s.spec.mem_bytes);
            let mut more = more_devices(s.more_gpus.len(), s.share_ppm);
            for (device, &share) in more.iter_mut().zip(&s.more_shares) {
                device.share_ppm = share;
            }
            write_shares(&regions.budget, s.share_ppm, &more);
            self.tenants.insert(
                s.name.clone(),
                Tenant {
                    name: s.name,
                    uid: s.uid,
                    spec: s.spec,
                    regions,
                    members: BTreeMap::new(),
                    ledger: None,
                    share_ppm: s.share_ppm,
                    sampler: Sampler::default(),
                    awaiting_since: Some(Instant::now()),
                    audited_bytes: None,
                    gpu: s.gpu,
                    more_devices: more,
                    more_gpus: s.more_gpus,
                    over_admitted: s.over_admitted,
                },
            );
            self.epoch += 1;
        }
    }

    /// Sets a tenant's share (what the controller decided).
    pub fn set_share(&mut self, name: &str, share_ppm: u32) {
        if let Some(t) = self.tenants.get_mut(name) {
            t.share_ppm = share_ppm;
            for device in &mut t.more_devices {
                device.share_ppm = share_ppm;
            }
            write_share(&t.regions.budget, share_ppm);
        }
    }
}

/// A share as the interposer reads it (for tests and tools).
pub fn effective_share(budget: &TenantBudget) -> u32 {
    let v = budget.share_ppm(0);
    if budget::is_limited(v) {
        v
    } else {
        FULL_SHARE_PPM
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(uid: u32) -> Peer {
        Peer {
            pid: std::process::id() as i32,
            uid,
            connection: Arc::new(std::fs::File::open("/dev/null").unwrap().into()),
        }
    }

    fn shares(request: f64, limit: f64) -> TenantSpec {
        TenantSpec {
            sm_request_pct: request,
            sm_limit_pct: limit,
            ..TenantSpec::default()
        }
    }

    #[test]
    fn a_placed_tenant_keeps_its_gpu_and_is_admitted_only_against_that_gpu() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let big = shares(60.0, 60.0);
        let gpus = [80u64 << 30; 2];
        let place = |registry: &mut Registry, name: &str, uid: u32| {
            registry
                .place(name, uid, Some(big.clone()), &gpus, dilu.as_ref(), 1)
                .map(|gpus| gpus.first().copied())
        };
        assert_eq!(
            registry.place("a", 1, Some(big.clone()), &gpus[..1], dilu.as_ref(), 1),
            Ok(Vec::new()),
            "one GPU: nothing to choose"
        );
        let a = place(&mut registry, "a", 1).unwrap().unwrap();
        assert_eq!(place(&mut registry, "a", 1), Ok(Some(a)), "held: same GPU");
        assert!(
            place(&mut registry, "a", 2)
                .unwrap_err()
                .contains("another user")
        );
        let b = place(&mut registry, "b", 1).unwrap().unwrap();
        assert_ne!(a, b);
        assert!(
            place(&mut registry, "c", 1)
                .unwrap_err()
                .contains("no GPU of 2")
        );
        // Registration takes the held GPU; 60% + 60% is admitted because
        // the two are on different GPUs.
        for name in ["a", "b"] {
            let fresh = create_regions("test", None).unwrap();
            registry
                .register(name, peer(1), 0, Some(big.clone()), fresh)
                .unwrap();
        }
        assert!(registry.held.is_empty());
        assert_eq!(registry.tenants["a"].gpu, Some(a));
        assert_eq!(
            place(&mut registry, "a", 1),
            Ok(Some(a)),
            "running: same GPU"
        );
        // An unplaced tenant is admitted against unplaced ones only.
        let fresh = create_regions("test", None).unwrap();
        registry
            .register("free", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        assert_eq!(
            registry.saved().iter().filter(|s| s.gpu.is_some()).count(),
            2
        );
    }

    #[test]
    fn a_tenant_given_several_gpus_holds_its_spec_on_each_of_them() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let big = shares(60.0, 60.0);
        let gpus = [80u64 << 30; 4];
        let place = |registry: &mut Registry, name: &str, count: usize| {
            registry.place(name, 1, Some(big.clone()), &gpus, dilu.as_ref(), count)
        };
        assert_eq!(
            place(&mut registry, "wide", 5).unwrap_err(),
            "wide asks 5 GPUs; this node has 4"
        );
        let wide = place(&mut registry, "wide", 2).unwrap();
        assert_eq!(wide.len(), 2);
        assert!(wide[0] < wide[1], "ascending: {wide:?}");
        assert!(
            place(&mut registry, "wide", 1)
                .unwrap_err()
                .contains("--gpus 2"),
            "its processes share one placement"
        );
        let fresh = create_regions("test", None).unwrap();
        registry
            .register("wide", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        assert_eq!(registry.tenants["wide"].gpus(), wide);
        assert_eq!(registry.saved()[0].more_gpus, wide[1..]);
        // A restarted daemon gives each device back its own share.
        registry.tenants.get_mut("wide").unwrap().more_devices[0].share_ppm = 450_000;
        let mut restarted = Registry::new(BTreeMap::new(), None);
        restarted.restore(registry.saved());
        let back = &restarted.tenants["wide"];
        assert_eq!(back.gpus(), wide);
        assert_eq!(back.more_devices[0].share_ppm, 450_000);
        assert_eq!(back.regions.budget.share_ppm(1), 450_000);
        assert_eq!(back.regions.budget.share_ppm(0), back.share_ppm);
        // Each of its GPUs is full for another 60%: the other two are left.
        let two = place(&mut registry, "other", 2).unwrap();
        assert!(two.iter().all(|g| !wide.contains(g)), "{two:?} {wide:?}");
        let refused = place(&mut registry, "third", 1).unwrap_err();
        assert!(refused.contains("no GPU of 4 has room"), "{refused}");
        // Raising its request past what its second GPU has left is refused.
        registry.held.insert(
            "small".into(),
            HeldPlacement {
                uid: 1,
                spec: shares(30.0, 30.0),
                gpu: wide[1],
                more_gpus: Vec::new(),
                since: Instant::now(),
            },
        );
        let raise = |pct| SpecUpdate {
            sm_request_pct: Some(pct),
            sm_limit_pct: Some(pct),
            ..SpecUpdate::default()
        };
        registry.update("wide", &raise(70.0)).unwrap();
        let refused = registry.update("wide", &raise(80.0)).unwrap_err();
        assert!(
            refused.starts_with(&format!("on gpu{}:", wide[1])),
            "{refused}"
        );
    }

    #[test]
    fn a_user_at_its_tenant_cap_does_not_stop_another_users_registration() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        registry.max_tenants_per_uid = 3;
        let register = |registry: &mut Registry, name: &str, uid: u32| {
            let fresh = create_regions("test", None).unwrap();
            registry
                .register(name, peer(uid), 0, None, fresh)
                .map(|_| ())
        };
        for i in 0..3 {
            register(&mut registry, &format!("hog{i}"), 1000).unwrap();
        }
        let refused = register(&mut registry, "hog3", 1000).unwrap_err();
        assert!(refused.contains("max_tenants_per_uid = 3"), "{refused}");
        // More processes of a tenant it has are not more tenants.
        register(&mut registry, "hog0", 1000).unwrap();
        // Another user registers as if the first had none.
        register(&mut registry, "victim", 1001).unwrap();
        assert_eq!(registry.tenants["victim"].uid, 1001);
        // A tenant that leaves frees its place.
        let member = *registry.tenants["hog1"].members.keys().next().unwrap();
        registry.leave(member);
        register(&mut registry, "hog3", 1000).unwrap();
    }

    #[test]
    fn a_running_process_that_does_not_fit_is_over_admitted_within_the_room_left() {
        let gib = 1u64 << 30;
        let mut registry = Registry::new(BTreeMap::new(), Some(8 * gib));
        let big = TenantSpec {
            mem_bytes: Some(6 * gib),
            ..shares(70.0, 100.0)
        };
        let fresh = create_regions("test", None).unwrap();
        registry
            .register("first", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        // A new process asking for the same is refused...
        let fresh = create_regions("test", None).unwrap();
        let refused = registry.register("second", peer(1), 0, Some(big.clone()), fresh);
        assert!(refused.is_err());
        // ...but one that hands back its activity region is already running.
        let (_, handed_back) =
            memfd::create::<TenantActivity>(c"dilu-test-activity", |_| {}).unwrap();
        memfd::seal_size(&handed_back).unwrap();
        let fresh = create_regions("test", Some(handed_back)).unwrap();
        let (_, spec, _) = registry
            .register("second", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        assert_eq!(spec.sm_request_pct, 30.0, "the unrequested share");
        assert_eq!(spec.mem_bytes, Some(2 * gib), "the unbudgeted memory");
        let reason = registry.tenants["second"].over_admitted.clone().unwrap();
        assert!(reason.contains("SM requests would sum"), "{reason}");
        let status = registry.status();
        assert!(
            status
                .iter()
                .any(|t| t.name == "second" && t.over_admitted.is_some())
        );
        assert!(
            status
                .iter()
                .any(|t| t.name == "first" && t.over_admitted.is_none())
        );
        // Admission holds with it counted: nothing more fits.
        let fresh = create_regions("test", None).unwrap();
        let small = TenantSpec {
            mem_bytes: Some(gib),
            ..shares(1.0, 100.0)
        };
        assert!(
            registry
                .register("third", peer(1), 0, Some(small), fresh)
                .is_err()
        );
    }

    #[test]
    fn held_placements_are_bounded() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let small = shares(0.0, 1.0);
        let gpus = [80u64 << 30; 8];
        for i in 0..MAX_HELD_PLACEMENTS {
            let name = format!("t{i}");
            registry
                .place(&name, 1, Some(small.clone()), &gpus, dilu.as_ref(), 1)
                .unwrap();
        }
        let refused = registry.place("more", 1, Some(small), &gpus, dilu.as_ref(), 1);
        assert!(refused.unwrap_err().contains("try again later"));
    }

    proptest::proptest! {
        /// Whatever name and spec a tenant sends, registration admits it
        /// within the GPU or refuses it with a reason; admitted requests
        /// never sum past the whole GPU.
        #[test]
        fn any_registration_is_admitted_within_the_gpu_or_refused(
            asks in proptest::collection::vec((
                "[ -~]{0,70}",
                proptest::num::f64::ANY,
                proptest::num::f64::ANY,
                proptest::option::of(proptest::num::u64::ANY),
                0u32..3,
            ), 1..6),
        ) {
            let mut registry = Registry::new(BTreeMap::new(), Some(80 << 30));
            for (name, request, limit, mem, uid) in asks {
                let spec = TenantSpec {
                    sm_request_pct: request,
                    sm_limit_pct: limit,
                    mem_bytes: mem,
                    ..TenantSpec::default()
                };
                let Ok(fresh) = create_regions("fuzz", None) else { continue };
                if let Err(reason) = registry.register(&name, peer(uid), 0, Some(spec), fresh) {
                    proptest::prop_assert!(!reason.is_empty());
                }
            }
            let requested: u32 = registry.tenants.values().map(|t| ppm(t.spec.sm_request_pct)).sum();
            proptest::prop_assert!(requested <= FULL_SHARE_PPM);
            let _ = registry.status();
        }
    }
}
