//! The tenant's SM-time state as this process sees it: its share of each
//! device ([`TenantBudget`], one writer) and the activity region all its
//! processes write ([`TenantActivity`]): the token buckets ([`TokenBucket`],
//! enforcement) and, apart from them, the telemetry counters (advisory).
//!
//! Where they live (standalone mode, no node manager):
//! - `DILU_TENANT=NAME`: `/dev/shm/dilu-<uid>/<NAME>.sm` and `.telemetry` (the activity region),
//!   mode 0600. The process that creates `.sm`, or finds its writer gone,
//!   writes its configured shares and becomes the writer; a process joining
//!   a running tenant uses the shares already there. Any process of the same
//!   user can change them (`dilu_layout::budget::TenantBudget::set_share_ppm`); they
//!   take effect at the next launch of every member.
//! - no tenant name: anonymous memory shared with forked children.
//!
//! Under the node manager (its socket exists, see [`crate::node`]), a named
//! tenant registers instead: the daemon hands it a read-only, sealed budget
//! it writes itself and the activity region it reads; `DILU_SM_LIMIT` then
//! becomes the spec's request and limit (the daemon decides the shares). A
//! refused registration stops the process with the daemon's reason.
//!
//! Without a tenant, an SM limit or a co-location role (`DILU_COLO`, which
//! acts on launches under SM-time control) this process has no SM state and
//! every launch passes straight through.

use crate::config;
use crate::driver::devices::{self, CurrentDevice};
use dilu_abi::node_client::Attached;
use dilu_layout::activity::{DeviceTelemetry, TenantActivity};
use dilu_layout::bucket::TokenBucket;
use dilu_layout::budget::{DEFAULT_DEPTH_NS, TenantBudget, UNLIMITED_SHARE};
use dilu_layout::ledger;
use dilu_layout::shm::Region;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Where the budget and activity regions live.
enum Regions {
    Standalone {
        budget: Region<TenantBudget>,
        activity: Region<TenantActivity>,
    },
    /// Owned by the node manager (the budget may be swapped when a
    /// restarted daemon re-adopts the tenant).
    Managed(&'static Attached),
}

pub struct TenantSm {
    regions: Regions,
    /// Resolved at the first launch, when the driver is initialised.
    current_device: OnceLock<CurrentDevice>,
    /// Set once [`Self::current_device`] found one device: from then on a
    /// launch reads this flag alone (most processes use one device).
    one_device: AtomicBool,
}

static STATE: OnceLock<Option<TenantSm>> = OnceLock::new();

/// The SM state, or `None` when this process has neither a tenant nor an SM
/// limit.
#[inline]
pub fn get() -> Option<&'static TenantSm> {
    match STATE.get() {
        Some(state) => state.as_ref(),
        None => STATE.get_or_init(init).as_ref(),
    }
}

fn write_shares(budget: &TenantBudget) {
    let config = config::get();
    for (device, share) in config.sm.per_device.iter().enumerate() {
        budget.set_share_ppm(device, share.unwrap_or(UNLIMITED_SHARE));
    }
    budget.set_depth_ns(config.ablate.depth_ns.unwrap_or(DEFAULT_DEPTH_NS));
}

/// [`TenantSm::publish_node_gpus`] once per process, at its first launch
/// (the driver is initialised then), on a thread of its own: NVML's first
/// initialisation in a process can take tens of milliseconds on a real
/// driver, which the launch must not wait for.
#[cold]
fn publish_node_gpus_apart(count: usize) {
    let spawned = std::thread::Builder::new()
        .name("dilu-gpus".into())
        .spawn(move || {
            if let Some(sm) = get() {
                sm.publish_node_gpus(count);
            }
        });
    // Without the thread the node manager only knows the device by its
    // use, on no named GPU, as before.
    drop(spawned);
}

/// Whether (pid, low 32 bits of its start time) is a running process.
fn writer_alive(pid: i32, start_low: u64) -> bool {
    ledger::process_start_time(pid).is_some_and(|start| start & 0xffff_ffff == start_low)
}

fn fail(what: &str, error: impl std::fmt::Display) -> ! {
    // Fail closed: a share we cannot keep must not become "no limit".
    eprintln!("dilu-interposer: cannot open the tenant's {what} ({error}); stopping");
    std::process::exit(2)
}

/// Whether this process's configuration gives it SM-time state (a tenant,
/// an SM limit or a co-location role): the state starts on first use
/// exactly then.
pub fn configured() -> bool {
    let cfg = config::get();
    cfg.tenant.is_some() || cfg.sm.any() || std::env::var_os("DILU_COLO").is_some()
}

fn init() -> Option<TenantSm> {
    let cfg = config::get();
    if let Some(attached) = crate::node::attached() {
        return Some(TenantSm {
            regions: Regions::Managed(attached),
            current_device: OnceLock::new(),
            one_device: AtomicBool::new(false),
        });
    }
    if !configured() {
        return None;
    }
    let (budget, activity) = match &cfg.tenant {
        None => (
            Region::<TenantBudget>::anonymous(write_shares)
                .unwrap_or_else(|e| fail("SM budget", e)),
            Region::<TenantActivity>::anonymous(|_| {})
                .unwrap_or_else(|e| fail("activity region", e)),
        ),
        Some(name) => {
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            let path = dilu_layout::tenant_region_path(uid, name, "sm");
            let budget = Region::<TenantBudget>::open_or_create(&path, 0o600, write_shares)
                .unwrap_or_else(|e| fail("SM budget", format!("{}: {e}", path.display())));
            let pid = std::process::id() as i32;
            let start = ledger::process_start_time(pid).unwrap_or(0);
            if budget.claim_writer(pid, start, writer_alive) {
                if !budget.created() {
                    write_shares(&budget);
                }
            } else if cfg.sm.any() {
                tracing::warn!(
                    tenant = name,
                    "joining a running tenant: its SM shares stay as its writer set them"
                );
            }
            let path = dilu_layout::tenant_region_path(uid, name, "telemetry");
            let activity = Region::<TenantActivity>::open_or_create(&path, 0o600, |_| {})
                .unwrap_or_else(|e| fail("activity region", format!("{}: {e}", path.display())));
            (budget, activity)
        }
    };
    tracing::debug!(
        tenant = cfg.tenant.as_deref().unwrap_or(""),
        share_ppm_device0 = budget.share_ppm(0),
        "SM-time control active"
    );
    Some(TenantSm {
        regions: Regions::Standalone { budget, activity },
        current_device: OnceLock::new(),
        one_device: AtomicBool::new(false),
    })
}

impl TenantSm {
    #[inline]
    pub fn budget(&self) -> &TenantBudget {
        match &self.regions {
            Regions::Standalone { budget, .. } => budget,
            Regions::Managed(attached) => attached.budget(),
        }
    }

    #[inline]
    pub fn activity(&self) -> &TenantActivity {
        match &self.regions {
            Regions::Standalone { activity, .. } => activity,
            Regions::Managed(attached) => attached.activity(),
        }
    }

    /// The device of the calling thread's current context (0 on a process
    /// with one device, without asking the driver).
    #[inline]
    pub fn current_device(&self) -> usize {
        if self.one_device.load(Ordering::Relaxed) {
            return 0;
        }
        self.current_device
            .get_or_init(|| {
                let count = devices::cuda_device_count();
                if matches!(self.regions, Regions::Managed(_)) {
                    publish_node_gpus_apart(count);
                }
                self.one_device.store(count <= 1, Ordering::Relaxed);
                CurrentDevice::new(count)
            })
            .get()
    }

    /// Says, in the activity region, which of the node's GPUs each of this
    /// process's devices is: the node manager controls a tenant it did not
    /// place (whose processes chose their GPUs) on each GPU it uses, beside
    /// that GPU's other tenants.
    fn publish_node_gpus(&self, count: usize) {
        for ordinal in 0..count.min(ledger::MAX_DEVICES) {
            if let Some(index) = crate::driver::nvml::nvml_index_of_cuda_device(ordinal as i32) {
                self.activity().devices[ordinal].publish_node_gpu(index);
            }
        }
    }

    #[inline]
    pub fn device(&self, device: usize) -> &DeviceTelemetry {
        &self.activity().devices[device]
    }

    /// The token bucket of `device` (enforcement state).
    #[inline]
    pub fn bucket(&self, device: usize) -> &TokenBucket {
        &self.activity().buckets[device]
    }
}
