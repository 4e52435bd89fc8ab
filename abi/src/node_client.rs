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
//!
//! A process that finds the socket but no daemon behind it (`ECONNREFUSED`:
//! the daemon crashed, or is between a stop and a start), or a daemon that
//! does not answer within [`REGISTER_TIMEOUT`] (stalled, or overloaded), is
//! neither stopped nor left unmanaged: it starts on budgets of its own,
//! made from its own spec (its SM limit as its share, its memory budget;
//! no spec: unlimited), says so once on stderr, and the same thread
//! registers it as soon as the daemon answers, handing over its activity
//! region like a re-attaching process. Only a refusal stops it.
//! Where there is no socket at all it runs standalone.

use crate::node_wire::{
    self, Bytes, FromDaemon, PROTOCOL_VERSION, SOCKET_ENV, SmShare, TenantSpec, ToDaemon,
};
use crate::seqpacket;
use dilu_layout::activity::TenantActivity;
use dilu_layout::budget::{DEFAULT_DEPTH_NS, TenantBudget, UNLIMITED_SHARE};
use dilu_layout::memfd;
use dilu_layout::shm::Region;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::time::Duration;

/// How long registration may take before the tenant gives up on the daemon.
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a tenant whose daemon went away tries to reconnect at first
/// (doubling while it stays away, up to [`RECONNECT_MAX`]).
pub const RECONNECT_PERIOD: Duration = Duration::from_millis(50);
/// The longest wait between two reconnection attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// A tenant process's view of its node-manager regions.
pub struct Attached {
    tenant: String,
    spec: TenantSpec,
    budget: AtomicPtr<Region<TenantBudget>>,
    /// Swapped (never unmapped) when a process that started without its
    /// daemon joins a tenant whose region the daemon already has.
    activity: AtomicPtr<Region<TenantActivity>>,
    /// Descriptors handed back on re-registration: (budget, activity).
    fds: Mutex<(OwnedFd, OwnedFd)>,
    reattached: AtomicU64,
    /// Registered with the daemon now (false while it is away).
    registered: AtomicBool,
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
        // SAFETY: as for the budget: leaked, never freed, Acquire pairs
        // with the swap's Release.
        unsafe { &*self.activity.load(Ordering::Acquire) }
    }

    /// Whether the daemon has this process registered now (false while it
    /// is away: the process runs on its last, or its own, budgets).
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::Acquire)
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
/// - `Ok(None)`: no daemon (its socket does not exist): the caller runs
///   standalone.
/// - `Ok(Some(_))` unregistered: the socket exists but nobody answers; the
///   process runs on budgets made from its own spec and registers when the
///   daemon answers (see the module docs).
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
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            return attach_later(socket, tenant, spec, "does not answer").map(Some);
        }
        Err(e) if no_answer(&e) => {
            return attach_later(socket, tenant, spec, &waited_in_vain()).map(Some);
        }
        Err(e) => {
            return Err(format!(
                "cannot reach the node manager at {}: {e}",
                socket.display()
            ));
        }
    };
    let (spec, budget_fd, activity_fd) = match register(&connection, tenant, spec.clone(), None) {
        Ok(registered) => registered,
        // A stalled or overloaded daemon, or one that died mid-way: the
        // tenant is not stopped for it (it may answer later).
        Err(NotRegistered::NoAnswer(why)) => {
            drop(connection);
            return attach_later(socket, tenant, spec, &why).map(Some);
        }
        Err(NotRegistered::Refused(reason)) => return Err(reason),
    };
    let budget = map_budget(&budget_fd)?;
    let activity = Region::<TenantActivity>::from_fd(activity_fd.as_raw_fd(), true)
        .map_err(|e| format!("cannot map the activity region: {e}"))?;
    let attached = leak(
        tenant,
        spec,
        budget,
        activity,
        (budget_fd, activity_fd),
        true,
    );
    start_keeper(attached, socket, Some(connection))?;
    Ok(Some(attached))
}

fn leak(
    tenant: &str,
    spec: TenantSpec,
    budget: Region<TenantBudget>,
    activity: Region<TenantActivity>,
    fds: (OwnedFd, OwnedFd),
    registered: bool,
) -> &'static Attached {
    Box::leak(Box::new(Attached {
        tenant: tenant.to_string(),
        spec,
        budget: AtomicPtr::new(Box::into_raw(Box::new(budget))),
        activity: AtomicPtr::new(Box::into_raw(Box::new(activity))),
        fds: Mutex::new(fds),
        reattached: AtomicU64::new(0),
        registered: AtomicBool::new(registered),
    }))
}

/// Starts the thread that keeps the registration (`connection`: the one
/// just made; None: not registered yet).
fn start_keeper(
    attached: &'static Attached,
    socket: &Path,
    connection: Option<OwnedFd>,
) -> Result<(), String> {
    let socket = socket.to_path_buf();
    std::thread::Builder::new()
        .name("dilu-nodemgr".into())
        .spawn(move || keep_attached(attached, socket, connection))
        .map(|_| ())
        .map_err(|e| format!("cannot start the node-manager thread: {e}"))
}

/// The budget a process runs on until its daemon answers: its own spec's
/// SM limit as its share on every device and its memory budget (no spec:
/// unlimited, as standalone).
pub fn own_budget(budget: &TenantBudget, spec: Option<&TenantSpec>) {
    budget.set_depth_ns(DEFAULT_DEPTH_NS);
    let share = spec
        .map(|s| s.sm_limit)
        .filter(|&limit| limit < SmShare::FULL)
        .map_or(UNLIMITED_SHARE, SmShare::ppm);
    for device in 0..dilu_layout::ledger::MAX_DEVICES {
        budget.set_share_ppm(device, share);
    }
    budget.set_mem_budget_all(spec.and_then(|s| s.mem).map(Bytes::get));
}

/// Whether a failed connect or exchange means nobody answered in time
/// (rather than a refusal or a broken socket).
fn no_answer(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

fn waited_in_vain() -> String {
    format!("did not answer in {} s", REGISTER_TIMEOUT.as_secs())
}

/// The socket is there but no daemon answers (`why`: how it did not): run
/// on budgets of our own and register in the background when it answers.
fn attach_later(
    socket: &Path,
    tenant: &str,
    spec: Option<TenantSpec>,
    why: &str,
) -> Result<&'static Attached, String> {
    let (budget, budget_fd) =
        memfd::create::<TenantBudget>(c"dilu-own-budget", |b| own_budget(b, spec.as_ref()))
            .map_err(|e| format!("cannot create the tenant's own budget: {e}"))?;
    let (activity, activity_fd) = memfd::create::<TenantActivity>(c"dilu-own-activity", |_| {})
        .map_err(|e| format!("cannot create the tenant's activity region: {e}"))?;
    // The daemon adopts only a size-sealed region.
    memfd::seal_size(&activity_fd)
        .map_err(|e| format!("cannot seal the tenant's activity region: {e}"))?;
    eprintln!(
        "dilu-interposer: the node manager at {} {why}; tenant {tenant} runs on its own limits \
         ({}) and registers when the node manager answers",
        socket.display(),
        describe_own(spec.as_ref())
    );
    let spec = spec.unwrap_or_default();
    let attached = leak(
        tenant,
        spec,
        budget,
        activity,
        (budget_fd, activity_fd),
        false,
    );
    start_keeper(attached, socket, None)?;
    Ok(attached)
}

fn describe_own(spec: Option<&TenantSpec>) -> String {
    let Some(spec) = spec else {
        return "no SM or memory budget from the node manager; DILU_SM_LIMIT and \
                DILU_MEM_LIMIT still apply"
            .into();
    };
    let memory = spec.mem.map_or("no memory budget".to_string(), |b| {
        format!("memory budget {b}")
    });
    format!("SM share {}, {memory}", spec.sm_limit)
}

fn map_budget(fd: &OwnedFd) -> Result<Region<TenantBudget>, String> {
    Region::<TenantBudget>::from_fd(fd.as_raw_fd(), false)
        .map_err(|e| format!("cannot map the budget region: {e}"))
}

/// Why a registration did not go through.
enum NotRegistered {
    /// Nobody answered in time, or the daemon went away mid-way: the
    /// process may run on its own limits until it answers.
    NoAnswer(String),
    /// The daemon refused the tenant, or answered what this process cannot
    /// use: the process must not run as if admitted.
    Refused(String),
}

/// One registration exchange; `old` carries the regions to hand back.
fn register(
    connection: &OwnedFd,
    tenant: &str,
    spec: Option<TenantSpec>,
    old: Option<(&OwnedFd, &OwnedFd)>,
) -> Result<(TenantSpec, OwnedFd, OwnedFd), NotRegistered> {
    let request = node_wire::encode(&ToDaemon::Register {
        version: PROTOCOL_VERSION,
        tenant: tenant.to_string(),
        spec,
        reattach: old.is_some(),
    })
    .map_err(NotRegistered::Refused)?;
    let fds: Vec<i32> = old
        .map(|(b, t)| vec![b.as_raw_fd(), t.as_raw_fd()])
        .unwrap_or_default();
    // Any failure to send or hear back is the daemon not answering: timed
    // out, or gone (closed, reset) while we registered.
    let unanswered = |e: std::io::Error| {
        NotRegistered::NoAnswer(if no_answer(&e) {
            waited_in_vain()
        } else {
            format!("did not answer ({e})")
        })
    };
    seqpacket::send(connection, &request, &fds).map_err(unanswered)?;
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, mut received) = seqpacket::recv(connection, &mut buffer).map_err(unanswered)?;
    if n == 0 {
        return Err(NotRegistered::NoAnswer(
            "closed the connection while the tenant registered".into(),
        ));
    }
    match node_wire::decode::<FromDaemon>(&buffer[..n]).map_err(NotRegistered::Refused)? {
        FromDaemon::Registered { spec, .. } if received.len() == 2 => {
            let telemetry = received.pop().expect("two fds");
            let budget = received.pop().expect("two fds");
            Ok((spec, budget, telemetry))
        }
        FromDaemon::Refused { reason } => Err(NotRegistered::Refused(format!(
            "the node manager refused tenant {tenant:?}: {reason}"
        ))),
        other => Err(NotRegistered::Refused(format!(
            "unexpected answer from the node manager: {other:?}"
        ))),
    }
}

/// Waits for the daemon to go away, then re-registers until it is back
/// (`connection` None: not registered yet, register first).
/// Never panics (it runs inside the tenant's program).
fn keep_attached(attached: &'static Attached, socket: PathBuf, connection: Option<OwnedFd>) {
    let mut connection = connection;
    loop {
        if let Some(connection) = &connection {
            let _ = seqpacket::set_timeout(connection, None);
            // The daemon never writes after registration: this returns when
            // the connection closes (daemon gone).
            seqpacket::wait_closed(connection);
            attached.registered.store(false, Ordering::Release);
        }
        // Fail static: the last budget stays in force while we retry.
        let mut wait = RECONNECT_PERIOD;
        connection = Some(loop {
            std::thread::sleep(wait);
            wait = (wait * 2).min(RECONNECT_MAX);
            if let Some(fd) = reregister(attached, &socket) {
                break fd;
            }
        });
    }
}

/// One attempt to register again, handing back our regions; the budget
/// (and, where the daemon kept another region for the tenant, the activity
/// region) is swapped in on success.
fn reregister(attached: &'static Attached, socket: &Path) -> Option<OwnedFd> {
    let fd = seqpacket::connect(socket, Some(REGISTER_TIMEOUT)).ok()?;
    let mut fds = attached.fds.lock().ok()?;
    let (_, budget_fd, activity_fd) = register(
        &fd,
        &attached.tenant,
        Some(attached.spec.clone()),
        Some((&fds.0, &fds.1)),
    )
    .ok()?;
    let budget = map_budget(&budget_fd).ok()?;
    if !same_file(&activity_fd, &fds.1) {
        // The daemon has this tenant's region from another process.
        let activity = Region::<TenantActivity>::from_fd(activity_fd.as_raw_fd(), true).ok()?;
        attached
            .activity
            .store(Box::into_raw(Box::new(activity)), Ordering::Release);
    }
    attached
        .budget
        .store(Box::into_raw(Box::new(budget)), Ordering::Release);
    // Keep the fds for the next restart.
    *fds = (budget_fd, activity_fd);
    attached.reattached.fetch_add(1, Ordering::Relaxed);
    attached.registered.store(true, Ordering::Release);
    Some(fd)
}

/// Whether two descriptors name the same file.
fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
    let id = |fd: &OwnedFd| {
        // SAFETY: stat is plain data; fstat fills it for a descriptor we own.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } == 0)
            .then_some((stat.st_dev, stat.st_ino))
    };
    id(a).is_some_and(|a| Some(a) == id(b))
}
