//! Per-tenant GPU memory budgets.
//!
//! Every allocation path reserves its bytes in the tenant's ledger
//! ([`dilu_layout::ledger`]) with one compare-and-swap before the driver is
//! called, and every free gives back exactly what its allocation was
//! charged ([`crate::memory::alloc_table`]). The hot path is atomics only.
//!
//! Where the ledger lives (standalone mode, no node manager):
//! - `DILU_TENANT=NAME`: `/dev/shm/dilu-<uid>/<NAME>.ledger`, created by the
//!   first process of the tenant with mode 0600 (only the same user can
//!   open it). Processes of one user are trusted to cooperate here; budgets
//!   a tenant cannot raise need the node manager, which hands out read-only
//!   mappings.
//! - no tenant name: anonymous shared memory, shared by this process and the
//!   children it forks (a launcher and its workers are one tenant).
//!
//! The budget is (re)written from this process's configuration when it
//! finds no other live member; a process that joins a running tenant uses
//! the budget already there.
//!
//! Under the node manager ([`crate::node`]) the budget that binds is the
//! daemon's: it sits in the sealed region the tenant maps read-only
//! ([`dilu_layout::budget::TenantBudget::mem_budget`]) and every reservation is checked
//! against it ([`TenantLedger::try_reserve_within`]), so `dilu set --mem`
//! takes effect at the next allocation and nothing the tenant writes can
//! raise it. The ledger then counts usage; its own budget word can only
//! lower the limit further: it holds `DILU_MEM_LIMIT` when the tenant did
//! not ask the daemon for a memory budget (self-restraint), and no limit
//! when it did (`dilu run --mem`, `mem` of `DILU_SPEC`: the daemon decides).
//!
//! A process that dies without cleaning up (SIGKILL) keeps its slot until a
//! member notices: one member's watcher thread (the tenant's scanner, a role
//! another member takes over within one period if its holder dies) scans
//! every [`RECLAIM_PERIOD`] and a refused reservation rescans at once, so the
//! memory of a dead process that has been reaped is back within 100 ms (200
//! ms when the dead process was the scanner; plus scheduling delay). The periodic scan asks only whether each pid exists
//! (`kill(pid, 0)`, no file read); every tenth scan (1 s) also compares start
//! times, which is when an unreaped zombie or a reused pid is noticed.
//!
//! A forked child is a new member with its own slot; it never refunds what
//! its parent charged (see [`crate::fork`]).

use crate::config;
use crate::driver;
use crate::driver::devices::{self, CurrentDevice};
use crate::memory::alloc_table::{AllocTable, Charge};
use crate::table::REAL;
use dilu_abi::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use dilu_abi::node_client::Attached;
use dilu_layout::ledger::{self, MAX_DEVICES, SlotId, TenantLedger, UNLIMITED};
use dilu_layout::shm::Region;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Watcher rounds between full liveness checks (start time from /proc).
const FULL_CHECK_EVERY: u64 = 10;

/// How often each member looks for dead members.
pub const RECLAIM_PERIOD: Duration = Duration::from_millis(100);

/// Every charge is the request rounded up to this: the driver's allocation
/// alignment, and what simgpu's own accounting uses.
pub const CHARGE_GRANULE: u64 = 512;

/// Keys of non-pointer allocations in the charge table carry a tag in the
/// top bits so they never collide with device pointers.
pub const TAG_ARRAY: u64 = 1 << 60;
pub const TAG_MIPMAPPED: u64 = 2 << 60;
pub const TAG_HANDLE: u64 = 3 << 60;

const NOT_JOINED: usize = usize::MAX;

pub struct MemoryBudget {
    ledger: Region<TenantLedger>,
    /// The ledger's file (named tenants): removed by the last process out.
    ledger_path: Option<std::path::PathBuf>,
    /// The node manager's read-only budget region, when attached.
    managed: Option<&'static Attached>,
    tenant: String,
    device_count: usize,
    current_device: CurrentDevice,
    context_memory: u64,
    pub charges: AllocTable,
}

/// Process-local state, reset in a forked child (which is a new member).
static SLOT: AtomicUsize = AtomicUsize::new(NOT_JOINED);
static JOIN_LOCK: Mutex<()> = Mutex::new(());
static CONTEXT_CHARGED: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];
static REFUSAL_LOGGED: AtomicBool = AtomicBool::new(false);
static WATCHER_RUNNING: AtomicBool = AtomicBool::new(false);

static BUDGET: OnceLock<Option<MemoryBudget>> = OnceLock::new();

/// What else may give charges back before a reservation is refused: set by
/// the owners of such charges when they first hold one (graph memory the
/// driver has released, see [`crate::memory::graph_memory`]; memory other
/// processes stopped mapping, see [`crate::memory::ipc_sharing`]).
static RECLAIM_ALSO: std::sync::Mutex<Vec<fn() -> bool>> = std::sync::Mutex::new(Vec::new());

/// The memory budget, or `None` when this process has neither a limit nor a
/// tenant (then every memory hook passes straight through).
#[inline]
pub fn get() -> Option<&'static MemoryBudget> {
    match BUDGET.get() {
        Some(budget) => budget.as_ref(),
        None => BUDGET.get_or_init(init).as_ref(),
    }
}

/// Whether this process's configuration gives it a budget (a memory limit
/// or a tenant): the budget starts on first use exactly then.
pub fn configured() -> bool {
    let cfg = config::get();
    cfg.memory.per_device.iter().any(Option::is_some) || cfg.tenant.is_some()
}

/// Has `reclaim` run before any reservation is refused; it returns whether
/// it gave anything back. Each function is kept once.
pub fn reclaim_before_refusing(reclaim: fn() -> bool) {
    let mut all = RECLAIM_ALSO.lock().unwrap_or_else(|p| p.into_inner());
    if !all
        .iter()
        .any(|&known| std::ptr::fn_addr_eq(known, reclaim))
    {
        all.push(reclaim);
    }
}

/// Runs every function registered with [`reclaim_before_refusing`];
/// whether any gave something back.
fn reclaim_also() -> bool {
    let all = RECLAIM_ALSO
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    all.iter().fold(false, |any, reclaim| reclaim() | any)
}

/// Rounds a request up to what it is charged.
pub fn charged(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(CHARGE_GRANULE) * CHARGE_GRANULE
}

fn init() -> Option<MemoryBudget> {
    let cfg = config::get();
    let limited = cfg.memory.per_device.iter().any(Option::is_some);
    if !configured() {
        return None;
    }
    let device_count = devices::cuda_device_count();
    let managed = crate::node::attached();
    // The daemon's budget binds; this process's own limit goes in the ledger
    // only when the tenant did not ask the daemon for one.
    let daemon_decides = managed.is_some_and(|a| a.spec().mem.is_some());
    let budgets: Vec<u64> = (0..MAX_DEVICES)
        .map(|device| match cfg.memory.per_device[device] {
            Some(limit) if device < device_count && !daemon_decides => {
                limit.resolve(devices::total_memory(device).unwrap_or(u64::MAX))
            }
            _ => UNLIMITED,
        })
        .collect();
    let write_budgets = |l: &TenantLedger| {
        for (device, &bytes) in budgets.iter().enumerate() {
            l.set_budget(device, bytes);
        }
    };
    let ledger_path = cfg.tenant.as_ref().map(|name| {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        // Files that crashed processes left behind go now (nobody holds them).
        dilu_layout::sweep::sweep_unused(&dilu_layout::user_region_dir(uid));
        dilu_layout::tenant_region_path(uid, name, "ledger")
    });
    let opened = match &ledger_path {
        Some(path) => Region::<TenantLedger>::open_or_create(path, 0o600, write_budgets)
            .map_err(|e| e.to_string()),
        None => Region::<TenantLedger>::anonymous(write_budgets).map_err(|e| e.to_string()),
    };
    let ledger = match opened {
        Ok(ledger) => ledger,
        Err(error) => {
            // Fail closed: a budget we cannot keep must not become "no budget".
            eprintln!("dilu-interposer: cannot open the tenant memory ledger ({error}); stopping");
            std::process::exit(2);
        }
    };
    if !ledger.created() {
        // Dead members are left to the watcher (and to any refusal), so a
        // process joining a large tenant checks one member, not all.
        if !ledger.any_member_alive(ledger::process_alive) {
            write_budgets(&ledger);
        } else if limited && (0..device_count).any(|d| ledger.budget(d) != budgets[d]) {
            tracing::warn!(
                tenant = cfg.tenant.as_deref().unwrap_or(""),
                "joining a running tenant: its budget stays as set by its first process"
            );
        }
    }
    let budget = MemoryBudget {
        ledger,
        ledger_path,
        managed,
        tenant: cfg
            .tenant
            .clone()
            .unwrap_or_else(|| format!("pid-{}", std::process::id())),
        device_count,
        current_device: CurrentDevice::new(device_count),
        context_memory: cfg.context_memory,
        charges: AllocTable::new(),
    };
    register_process_hooks();
    tracing::debug!(
        tenant = budget.tenant,
        devices = device_count,
        ?budgets,
        managed = managed.is_some(),
        "memory budget active"
    );
    Some(budget)
}

/// Frees device memory with the real driver, bypassing our hooks (used to
/// undo an allocation the budget cannot settle).
pub fn real_mem_free(pointer: u64) -> CUresult {
    let Some(free) = driver::resolved(&REAL.cuMemFree_v2) else {
        return dilu_abi::cuda::CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: the real cuMemFree_v2, on a pointer the driver handed out.
    unsafe { free(pointer) }
}

extern "C" fn leave_at_exit() {
    if let Some(Some(budget)) = BUDGET.get() {
        let slot = SLOT.swap(NOT_JOINED, Ordering::AcqRel);
        if slot != NOT_JOINED {
            budget.ledger.leave(SlotId::from_index(slot));
        }
        budget.ledger.drop_scanner_role(std::process::id() as i32);
        if let Some(path) = &budget.ledger_path
            && budget.ledger.remove_if_unused(path)
        {
            // The tenant's last process: its other standalone regions go
            // too. The ledger stays locked (exclusively) until we are gone,
            // so a process starting now waits for it and starts afresh.
            for kind in ["sm", "telemetry"] {
                let _ = std::fs::remove_file(path.with_extension(kind));
            }
        }
    }
}

/// In a forked child (see [`crate::fork`]): the child is a new process that
/// joins the tenant with its own slot on first use, has no watcher thread,
/// has charged no context, and owns none of the allocations in the charge
/// table it inherited (freeing one must not refund the parent's charge).
pub fn forget_parent_state_in_child() {
    SLOT.store(NOT_JOINED, Ordering::Relaxed);
    WATCHER_RUNNING.store(false, Ordering::Relaxed);
    for charged in &CONTEXT_CHARGED {
        charged.store(false, Ordering::Relaxed);
    }
    if let Some(budget) = existing() {
        budget.charges.forget_all();
        if let Some(path) = &budget.ledger_path {
            budget.ledger.hold_again(path);
        }
    }
}

/// The budget if it has been set up, without setting it up.
pub fn existing() -> Option<&'static MemoryBudget> {
    BUDGET.get().and_then(Option::as_ref)
}

/// Locks the join lock for `fork` (see [`crate::memory::at_fork`]).
pub fn lock_join_for_fork() -> std::sync::MutexGuard<'static, ()> {
    JOIN_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn register_process_hooks() {
    // SAFETY: registering a plain extern "C" function that never unwinds.
    unsafe { libc::atexit(leave_at_exit) };
}

fn start_watcher() {
    if WATCHER_RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("dilu-reclaim".into())
        .spawn(|| {
            let me = std::process::id() as i32;
            for round in 1u64.. {
                std::thread::sleep(RECLAIM_PERIOD);
                if let Some(budget) = get() {
                    // One member scans for the whole tenant; the others only
                    // check that it is still there.
                    if !budget
                        .ledger
                        .take_scanner_role(me, |pid| ledger::process_exists(pid, 0))
                    {
                        continue;
                    }
                    // Most rounds only ask whether each pid still exists
                    // (kill 0); every FULL_CHECK_EVERY-th also reads its start
                    // time, which catches zombies and reused pids.
                    if round % FULL_CHECK_EVERY == 0 {
                        budget.ledger.reclaim_dead(ledger::process_alive);
                    } else {
                        budget.ledger.reclaim_dead(ledger::process_exists);
                    }
                }
            }
        });
    if spawned.is_err() {
        WATCHER_RUNNING.store(false, Ordering::Release);
    }
}

impl MemoryBudget {
    /// This process's slot, joining the ledger on first use (slow path,
    /// once per process).
    pub fn slot(&self) -> Option<SlotId> {
        let slot = SLOT.load(Ordering::Acquire);
        if slot != NOT_JOINED {
            return Some(SlotId::from_index(slot));
        }
        self.join()
    }

    #[cold]
    fn join(&self) -> Option<SlotId> {
        let _guard = JOIN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let slot = SLOT.load(Ordering::Acquire);
        if slot != NOT_JOINED {
            return Some(SlotId::from_index(slot));
        }
        let pid = std::process::id() as i32;
        let start_time = ledger::process_start_time(pid).unwrap_or(0);
        let mut joined = self.ledger.join(pid, start_time);
        if joined.is_none() {
            self.ledger.reclaim_dead(ledger::process_alive);
            joined = self.ledger.join(pid, start_time);
        }
        let Some(slot) = joined else {
            tracing::error!(
                tenant = self.tenant,
                "tenant ledger has no free process slot"
            );
            return None;
        };
        SLOT.store(slot.index(), Ordering::Release);
        start_watcher();
        Some(slot)
    }

    /// The device of the calling thread's current context.
    #[inline]
    pub fn current_device(&self) -> usize {
        self.current_device.get()
    }

    /// The budget that binds on `device`: the ledger's word, capped by the
    /// node manager's read-only budget when attached.
    #[inline]
    pub fn budget_of(&self, device: usize) -> u64 {
        let own = self.ledger.budget(device);
        match self.managed {
            Some(attached) => attached.budget().binding_mem_budget(own, device),
            None => own,
        }
    }

    pub fn used_on(&self, device: usize) -> u64 {
        self.ledger.used(device)
    }

    pub fn device_count(&self) -> usize {
        self.device_count
    }

    /// What a budgeted `device` reports in place of the driver's (total,
    /// free): total = min(real total, budget), free = min(real free, budget
    /// − the tenant's usage), never below 0 nor above total. `None` when the
    /// device has no budget.
    pub fn view(&self, device: usize, total: u64, free: u64) -> Option<(u64, u64)> {
        let limit = self.budget_of(device);
        if limit == UNLIMITED {
            return None;
        }
        let left = limit.saturating_sub(self.used_on(device));
        let total = total.min(limit);
        Some((total, free.min(left).min(total)))
    }

    /// Charges the context allowance the first time this process uses
    /// `device`.
    pub fn charge_context(&self, slot: SlotId, device: usize) -> Result<(), ledger::Refusal> {
        if self.context_memory == 0 || CONTEXT_CHARGED[device].load(Ordering::Acquire) {
            return Ok(());
        }
        let _guard = JOIN_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        if CONTEXT_CHARGED[device].load(Ordering::Acquire) {
            return Ok(());
        }
        self.ledger.try_reserve_within(
            slot,
            device,
            self.context_memory,
            self.budget_of(device),
        )?;
        CONTEXT_CHARGED[device].store(true, Ordering::Release);
        Ok(())
    }

    /// Reserves `bytes` (already rounded) on `device`, rescanning for dead
    /// members once before refusing.
    pub fn reserve(&self, device: usize, bytes: u64) -> Result<SlotId, ledger::Refusal> {
        let Some(slot) = self.slot() else {
            if !REFUSAL_LOGGED.swap(true, Ordering::Relaxed) {
                self.say_refused(
                    bytes,
                    device,
                    format_args!("the tenant's memory ledger has no free process slot"),
                );
            }
            return Err(ledger::Refusal {
                device,
                requested: bytes,
                used: self.ledger.used(device),
                budget: self.budget_of(device),
            });
        };
        let attempt = || {
            self.charge_context(slot, device)?;
            self.ledger
                .try_reserve_within(slot, device, bytes, self.budget_of(device))
        };
        match attempt() {
            Ok(()) => Ok(slot),
            Err(refusal) => {
                // Before refusing: memory of dead members, and what else
                // can give charges back (graph memory the driver released).
                let reclaimed = self.ledger.reclaim_dead(ledger::process_alive) > 0;
                let reconciled = reclaim_also();
                if (reclaimed || reconciled) && attempt().is_ok() {
                    return Ok(slot);
                }
                self.log_refusal(&refusal);
                Err(refusal)
            }
        }
    }

    pub fn release(&self, device: usize, bytes: u64) {
        if let Some(slot) = self.slot() {
            self.ledger.release(slot, device, bytes);
        }
    }

    /// The line a refusal is said in on stderr (the caller says it once).
    #[cold]
    fn say_refused(&self, bytes: u64, device: usize, why: std::fmt::Arguments<'_>) {
        eprintln!(
            "dilu-interposer: tenant {}: an allocation of {bytes} bytes on device {device} was \
             refused as out of memory: {why} (said once per process)",
            self.tenant
        );
    }

    /// Says, once per process, that an allocation was refused: on stderr
    /// (the program itself only sees the driver's out-of-memory error,
    /// which reads as the GPU being full) and in the log.
    #[cold]
    fn log_refusal(&self, refusal: &ledger::Refusal) {
        if !REFUSAL_LOGGED.swap(true, Ordering::Relaxed) {
            self.say_refused(
                refusal.requested,
                refusal.device,
                format_args!(
                    "its memory budget is {} bytes and {} are in use",
                    refusal.budget, refusal.used
                ),
            );
            tracing::warn!(
                tenant = self.tenant,
                device = refusal.device,
                requested = refusal.requested,
                used = refusal.used,
                budget = refusal.budget,
                "allocation refused: over the tenant's memory budget (logged once per process)"
            );
        }
    }

    /// Runs an allocating driver call under the budget: reserve, call, and
    /// record the charge under `key()` on success or give it back on failure.
    #[inline]
    pub fn allocate(
        &self,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
        key: impl FnOnce() -> u64,
    ) -> CUresult {
        let device = self.current_device();
        let charge = charged(bytes);
        if self.reserve(device, charge).is_err() {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        let result = call();
        if result == CUDA_SUCCESS {
            self.charges.insert(
                key(),
                Charge {
                    device: device as u8,
                    bytes: charge,
                },
            );
        } else {
            self.release(device, charge);
        }
        result
    }

    /// Runs a freeing driver call: the charge recorded under `key` is given
    /// back when the driver accepts the free. The entry is taken out first so
    /// a concurrent allocation that reuses the address cannot be confused
    /// with it.
    #[inline]
    pub fn free(&self, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let charge = self.charges.remove(key);
        let result = call();
        if let Some(charge) = charge {
            if result == CUDA_SUCCESS {
                self.release(usize::from(charge.device), charge.bytes);
            } else {
                self.charges.insert(key, charge);
            }
        }
        result
    }

    /// Adjusts a recorded charge once the driver has told the real size
    /// (pitched allocations): reserves more or gives back the difference.
    pub fn settle(&self, key: u64, actual_bytes: u64) -> Result<(), ledger::Refusal> {
        let Some(old) = self.charges.remove(key) else {
            return Ok(());
        };
        let device = usize::from(old.device);
        let new = charged(actual_bytes);
        if new > old.bytes {
            if let Err(refusal) = self.reserve(device, new - old.bytes) {
                self.charges.insert(key, old);
                return Err(refusal);
            }
        } else if new < old.bytes {
            self.release(device, old.bytes - new);
        }
        self.charges.insert(
            key,
            Charge {
                device: old.device,
                bytes: new,
            },
        );
        Ok(())
    }
}
