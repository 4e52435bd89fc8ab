//! The tenant side of the node manager: what the interposer calls once at
//! start to get its budgets from the daemon.
//!
//! # Wiring it into the interposer
//!
//! ```ignore
//! use dilu_abi::node_client::{self, Attached};
//! use dilu_abi::node_wire::TenantSpec;
//!
//! // Once, at init (not on the hot path), before the standalone regions:
//! let spec = TenantSpec::from_env()?;              // Err: stop with that line
//! match node_client::attach(tenant_name, spec) {
//!     Ok(Some(attached)) => {
//!         // Under the node manager: every launch reads
//!         //   attached.budget().share_ppm(dev)   (one extra relaxed load)
//!         // and charges attached.activity().buckets[dev].admit(...);
//!         // every allocation is held to attached.budget().mem_budget(dev).
//!     }
//!     Ok(None) => { /* no daemon socket: standalone mode, as today */ }
//!     Err(reason) => { /* refused by admission: print it and exit(2) */ }
//! }
//! ```
//!
//! `attach` returns `&'static Attached`: the budget (SM share and memory
//! budget per device) is a sealed memfd the daemon writes and this process
//! maps read-only (it cannot raise either), the
//! activity region (buckets and telemetry) is shared with the daemon and the
//! tenant's other processes.
//! A background thread keeps the connection; when the daemon dies the
//! tenant keeps running on its last budget, and when it comes back the
//! thread re-registers, handing back its old regions so the daemon
//! re-adopts the tenant with the same budget and counters; the budget
//! pointer is swapped atomically (old mappings are never unmapped, so a
//! launch racing the swap reads valid memory).

use crate::node_wire::{self, FromDaemon, PROTOCOL_VERSION, SOCKET_ENV, TenantSpec, ToDaemon};
use crate::seqpacket;
use dilu_layout::activity::TenantActivity;
use dilu_layout::budget::TenantBudget;
use dilu_layout::shm::Region;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

/// How long registration may take before the tenant gives up on the daemon.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a tenant whose daemon went away tries to reconnect.
pub const RECONNECT_PERIOD: Duration = Duration::from_millis(50);

/// A tenant process's view of its node-manager regions.
pub struct Attached {
    tenant: String,
    spec: TenantSpec,
    budget: AtomicPtr<Region<TenantBudget>>,
    activity: Region<TenantActivity>,
    /// Descriptors handed back on re-registration: (budget, activity).
    fds: Mutex<(OwnedFd, OwnedFd)>,
    reattached: AtomicU64,
}

impl Attached {
    /// The budgets the daemon sets, SM share and memory (read-only mapping).
    #[inline]
    pub fn budget(&self) -> &TenantBudget {
        // SAFETY: the pointer always comes from Box::leak of a live Region
        // and is never freed (old budgets stay mapped), so it is valid for
        // 'static; Acquire pairs with the Release of the swap.
        unsafe { &*self.budget.load(Ordering::Acquire) }
    }

    /// The tenant's activity region: buckets and telemetry (shared with the
    /// daemon).
    #[inline]
    pub fn activity(&self) -> &TenantActivity {
        &self.activity
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The spec the daemon admitted (may differ from the one asked for when
    /// the operator's configuration names the tenant).
    pub fn spec(&self) -> &TenantSpec {
        &self.spec
    }

    /// How many times the tenant re-registered with a restarted daemon.
    pub fn reattached(&self) -> u64 {
        self.reattached.load(Ordering::Relaxed)
    }
}

/// The daemon's socket: `$DILU_NODEMGR_SOCKET`, else the default path.
pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(node_wire::DEFAULT_SOCKET))
}

/// Registers this process as a member of `tenant` with the node manager.
///
/// - `Ok(None)`: no daemon (its socket does not exist or nobody listens):
///   the caller runs standalone.
/// - `Ok(Some(_))`: admitted; budgets now come from the daemon.
/// - `Err(reason)`: the daemon refused the spec, or answered garbage.
pub fn attach(tenant: &str, spec: Option<TenantSpec>) -> Result<Option<&'static Attached>, String> {
    attach_at(&socket_path(), tenant, spec)
}

/// [`attach`] with an explicit socket path.
pub fn attach_at(
    socket: &Path,
    tenant: &str,
    spec: Option<TenantSpec>,
) -> Result<Option<&'static Attached>, String> {
    let connection = match seqpacket::connect(socket, Some(REGISTER_TIMEOUT)) {
        Ok(fd) => fd,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT) | Some(libc::ECONNREFUSED)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => {
            return Err(format!(
                "cannot reach the node manager at {}: {e}",
                socket.display()
            ));
        }
    };
    let (spec, budget_fd, activity_fd) = register(&connection, tenant, spec, None)?;
    let budget = map_budget(&budget_fd)?;
    let activity = Region::<TenantActivity>::from_fd(activity_fd.as_raw_fd(), true)
        .map_err(|e| format!("cannot map the activity region: {e}"))?;
    let attached: &'static Attached = Box::leak(Box::new(Attached {
        tenant: tenant.to_string(),
        spec,
        budget: AtomicPtr::new(Box::into_raw(Box::new(budget))),
        activity,
        fds: Mutex::new((budget_fd, activity_fd)),
        reattached: AtomicU64::new(0),
    }));
    let socket = socket.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("dilu-nodemgr".into())
        .spawn(move || keep_attached(attached, socket, connection));
    if let Err(e) = spawned {
        return Err(format!("cannot start the node-manager thread: {e}"));
    }
    Ok(Some(attached))
}

fn map_budget(fd: &OwnedFd) -> Result<Region<TenantBudget>, String> {
    Region::<TenantBudget>::from_fd(fd.as_raw_fd(), false)
        .map_err(|e| format!("cannot map the budget region: {e}"))
}

/// One registration exchange; `old` carries the regions to hand back.
fn register(
    connection: &OwnedFd,
    tenant: &str,
    spec: Option<TenantSpec>,
    old: Option<(&OwnedFd, &OwnedFd)>,
) -> Result<(TenantSpec, OwnedFd, OwnedFd), String> {
    let request = node_wire::encode(&ToDaemon::Register {
        version: PROTOCOL_VERSION,
        tenant: tenant.to_string(),
        spec,
        reattach: old.is_some(),
    })?;
    let fds: Vec<i32> = old
        .map(|(b, t)| vec![b.as_raw_fd(), t.as_raw_fd()])
        .unwrap_or_default();
    seqpacket::send(connection, &request, &fds)
        .map_err(|e| format!("cannot register with the node manager: {e}"))?;
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, mut received) = seqpacket::recv(connection, &mut buffer)
        .map_err(|e| format!("no answer from the node manager: {e}"))?;
    if n == 0 {
        return Err("the node manager closed the connection while registering".into());
    }
    match node_wire::decode::<FromDaemon>(&buffer[..n])? {
        FromDaemon::Registered { spec, .. } if received.len() == 2 => {
            let telemetry = received.pop().expect("two fds");
            let budget = received.pop().expect("two fds");
            Ok((spec, budget, telemetry))
        }
        FromDaemon::Refused { reason } => Err(format!(
            "the node manager refused tenant {tenant:?}: {reason}"
        )),
        other => Err(format!(
            "unexpected answer from the node manager: {other:?}"
        )),
    }
}

/// Waits for the daemon to go away, then re-registers until it is back.
/// Never panics (it runs inside the tenant's program).
fn keep_attached(attached: &'static Attached, socket: PathBuf, mut connection: OwnedFd) {
    loop {
        let _ = seqpacket::set_timeout(&connection, None);
        // The daemon never writes after registration: this returns when
        // the connection closes (daemon gone).
        seqpacket::wait_closed(&connection);
        // Fail static: the last budget stays in force while we retry.
        connection = loop {
            std::thread::sleep(RECONNECT_PERIOD);
            let Ok(fd) = seqpacket::connect(&socket, Some(REGISTER_TIMEOUT)) else {
                continue;
            };
            let Ok(mut fds) = attached.fds.lock() else {
                return;
            };
            let result = register(
                &fd,
                &attached.tenant,
                Some(attached.spec.clone()),
                Some((&fds.0, &fds.1)),
            );
            let Ok((_, budget_fd, activity_fd)) = result else {
                continue;
            };
            let Ok(budget) = map_budget(&budget_fd) else {
                continue;
            };
            attached
                .budget
                .store(Box::into_raw(Box::new(budget)), Ordering::Release);
            // The telemetry stays the mapping we have (the daemon adopted the
            // fd we handed back); keep the fds for the next restart.
            *fds = (budget_fd, activity_fd);
            attached.reattached.fetch_add(1, Ordering::Relaxed);
            break fd;
        };
    }
}
