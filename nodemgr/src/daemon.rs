//! `dilu nodemgr`: the node manager daemon, and the handle the demo and
//! tests use to run one in-process.
//!
//! Threads: the socket server (one thread per connection), the control
//! loop (every period: sample telemetry, run the controller, write budgets),
//! housekeeping (every 100 ms: re-adoption grace, tenants' ledgers, the
//! state file when it changed; every second: GPU refresh, memory audit) and the metrics endpoint.
//! The registry lock is only ever held for memory work: file, socket and
//! NVML I/O happen outside it, so the control loop never waits for I/O. Budgets (SM share and memory) live in sealed memfds
//! the tenants hold mapped read-only, so when the daemon dies they keep their
//! last values (fail static); the state file lets the next daemon re-adopt
//! them.
//!
//! Scale signals: a latency tenant at its SM limit, saturated and over its
//! SLO for `scale_out_after` (with a [`SCALE_OUT_HOLD`] of grace for a quiet
//! spell) gets a scale-out recommendation; a tenant without a launch for
//! `scale_in_after` a scale-in one. They are published on `/api/signals`,
//! `/metrics` and in `dilu status`/`top`.

use crate::audit::{self, AuditAction, UsageSource};
use crate::config::Config;
use crate::control::per_gpu::PerGpu;
use crate::error::{self, Error};
use crate::registry::Registry;
use crate::shared_state::Shared;
use crate::state_file::StateFile;
use crate::{metrics, nvml, server};
use dilu_abi::node_wire::{ScaleAdvice, ScaleSignal, WorkClass};
use dilu_abi::seqpacket;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::state_file::STATE_FILE;

/// A running daemon.
pub struct Daemon {
    pub shared: Arc<Shared>,
    listener: Arc<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    /// Where the metrics endpoint actually listens (port 0 picks one).
    pub metrics_addr: Option<String>,
}

/// A start-up error, with the way out where it is a permission error (a
/// user who is not root cannot write the default `/run/dilu`).
fn with_hint(message: String, error: &std::io::Error) -> String {
    if error.kind() == std::io::ErrorKind::PermissionDenied {
        format!(
            "{message}: run it as root, or give --socket and --run-dir in a directory you own \
             (e.g. --socket $XDG_RUNTIME_DIR/dilu.sock --run-dir $XDG_RUNTIME_DIR/dilu) and \
             point tenants at it with DILU_NODEMGR_SOCKET"
        )
    } else {
        message
    }
}

impl Daemon {
    /// Starts the daemon's threads. Tenants of a previous daemon (from the
    /// state file) are waited for.
    pub fn start(config: Config) -> error::Result<Daemon> {
        let controller = PerGpu::new(&config.controller)?;
        std::fs::create_dir_all(&config.run_dir).map_err(|e| {
            Error::System(with_hint(format!("{}: {e}", config.run_dir.display()), &e))
        })?;
        if let Some(dir) = config.socket.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::System(with_hint(format!("{}: {e}", dir.display()), &e)))?;
        }
        let mut registry = Registry::new(config.tenants.clone(), config.gpu_memory);
        registry.max_tenants_per_uid = config.max_tenants_per_uid;
        let gpus = nvml::probe();
        registry.node_gpus = gpus.len();
        if registry.gpu_memory.is_none() {
            registry.gpu_memory = gpus.first().and_then(|g| g.memory_total_bytes);
        }
        let state_file = StateFile::in_dir(&config.run_dir);
        let saved = state_file.load();
        if !saved.is_empty() {
            tracing::info!(
                tenants = saved.len(),
                "re-adopting tenants of the previous daemon"
            );
        }
        registry.restore(saved);
        // Tenants of any user connect; admission and SO_PEERCRED decide.
        let listener = Arc::new(seqpacket::listen(&config.socket, 0o666).map_err(|e| {
            Error::System(with_hint(
                format!("cannot listen on {}: {e}", config.socket.display()),
                &e,
            ))
        })?);
        let shared = Arc::new(Shared {
            connections: crate::peer_limits::ConnectionCounts::new(config.max_connections_per_uid),
            config,
            registry: Mutex::new(registry),
            controller: Mutex::new(controller),
            signals: Mutex::new(Vec::new()),
            gpus: Mutex::new(gpus),
            stopping: AtomicBool::new(false),
            started: Instant::now(),
            periods: AtomicU64::new(0),
            period_work_ns: AtomicU64::new(0),
            period_work_max_ns: AtomicU64::new(0),
            leftovers: Default::default(),
            state_file,
        });
        let mut threads = Vec::new();
        let mut metrics_addr = None;
        if let Some(addr) = &shared.config.metrics {
            let (server, bound) = metrics::bind(addr).map_err(Error::System)?;
            metrics_addr = Some(bound);
            let s = shared.clone();
            threads.push(spawn("dilu-metrics", move || metrics::serve(s, server))?);
        }
        let (s, l) = (shared.clone(), listener.clone());
        threads.push(spawn("dilu-server", move || server::serve(s, l))?);
        let s = shared.clone();
        threads.push(spawn("dilu-control", move || control_loop(s))?);
        let s = shared.clone();
        threads.push(spawn("dilu-housekeeping", move || housekeeping_loop(s))?);
        Ok(Daemon {
            shared,
            listener,
            threads,
            metrics_addr,
        })
    }

    /// Switches the control law (the demo compares them on one daemon).
    pub fn set_controller(&self, name: &str) -> error::Result<()> {
        *self.shared.controller.lock().expect("controller lock") = PerGpu::new(name)?;
        Ok(())
    }

    /// Stops the threads and closes every tenant connection (tenants keep
    /// their budgets and try to re-register with a later daemon).
    pub fn stop(mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        // SAFETY: shutdown on a socket we own; wakes the blocked accept.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for tenant in self
            .shared
            .registry
            .lock()
            .expect("registry lock")
            .tenants
            .values()
        {
            for member in tenant.members.values() {
                // SAFETY: shutdown on a connection we hold; wakes its thread.
                unsafe { libc::shutdown(member.connection.as_raw_fd(), libc::SHUT_RDWR) };
            }
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        // The socket file stays: a tenant that starts before the next
        // daemon finds it, is refused a connection, and registers when that
        // daemon answers (a missing socket means "no node manager here").
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> error::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| Error::System(format!("cannot start thread {name}: {e}")))
}

/// How long a latency tenant must be seen meeting its SLO (or below its
/// limit, or unsaturated) before its scale-out window starts over: one
/// period without a throttled launch is not relief (the p99 behind the
/// signal covers a second, too).
pub const SCALE_OUT_HOLD: Duration = Duration::from_secs(1);

/// Per-tenant timers behind the scale signals.
#[derive(Default)]
struct SignalState {
    missing_since: Option<Instant>,
    /// The last period in which the tenant was at its limit and over its SLO.
    last_missing: Option<Instant>,
    idle_since: Option<Instant>,
}

fn control_loop(shared: Arc<Shared>) {
    let period = shared.config.period;
    let mut state = crate::period::PeriodState::default();
    let mut next = Instant::now();
    let mut timers: BTreeMap<(String, Option<u32>), SignalState> = BTreeMap::new();
    let mut wake_watch = crate::wake_watch::WakeWatch::default();
    while !shared.stopping.load(Ordering::Acquire) {
        next += period;
        let now = Instant::now();
        if next > now {
            next = sleep_until_period_or_wake(&shared, &wake_watch, next);
        } else {
            next = now; // overran: do not try to catch up
        }
        let started = thread_cpu_ns();
        let now_ns = dilu_layout::monotonic_ns();
        let registry = &mut *shared.registry.lock().expect("registry lock");
        let guards = {
            let mut controllers = shared.controller.lock().expect("controller lock");
            crate::period::run(registry, &mut controllers, &mut state, now_ns);
            controllers.guards_between_periods()
        };
        if guards {
            wake_watch.arm(registry, &state.observations, &state.gpus);
        } else {
            wake_watch = crate::wake_watch::WakeWatch::default();
        }
        update_signals(&shared, registry, &state, &mut timers);
        // CPU time: on a busy node the wall time would count the time
        // other processes ran instead of this thread.
        let work = thread_cpu_ns().saturating_sub(started);
        shared.period_work_ns.fetch_add(work, Ordering::Relaxed);
        shared.period_work_max_ns.fetch_max(work, Ordering::Relaxed);
        shared.periods.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sleeps until `next`, or until a tenant `watch` watches launches (then
/// the period runs at once); returns when the period runs.
fn sleep_until_period_or_wake(
    shared: &Shared,
    watch: &crate::wake_watch::WakeWatch,
    next: Instant,
) -> Instant {
    loop {
        let now = Instant::now();
        if next <= now {
            return next;
        }
        if !watch.watching() {
            std::thread::sleep(next - now);
            return next;
        }
        std::thread::sleep((next - now).min(crate::wake_watch::POLL));
        if watch.woke(&shared.registry.lock().expect("registry lock")) {
            return Instant::now();
        }
    }
}

/// CPU time the calling thread has used (ns).
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into a valid, owned timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

/// What may touch files or devices: tenants' ledgers (read as copies, never
/// mapped: a tenant could truncate them), the state file, NVML. Each step
/// takes the registry lock only to copy data in or out.
fn housekeeping_loop(shared: Arc<Shared>) {
    let mut last_slow = Instant::now();
    let mut usage = nvml::NvmlUsage;
    let mut audit_failed = false;
    while !shared.stopping.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        shared.leftovers.sweep_due();
        let sources = {
            let mut registry = shared.registry.lock().expect("registry lock");
            registry.housekeeping();
            registry.ledger_sources()
        };
        let ledgers: Vec<_> = sources
            .into_iter()
            .map(|(name, uid)| {
                let path = dilu_layout::tenant_region_path(uid, &name, "ledger");
                let copy =
                    dilu_layout::shm::Region::<dilu_layout::ledger::TenantLedger>::copy_of_file(
                        &path, uid,
                    )
                    .ok();
                (name, uid, copy)
            })
            .collect();
        {
            let mut registry = shared.registry.lock().expect("registry lock");
            for (name, uid, copy) in ledgers {
                registry.set_ledger(&name, uid, copy);
            }
        }
        // The state a restarted daemon re-adopts from (shares included: a
        // re-attaching tenant's own word is never taken for its share).
        shared.save_state();
        if last_slow.elapsed() >= Duration::from_secs(1) {
            last_slow = Instant::now();
            let previous = shared.gpus.lock().expect("gpus lock").clone();
            let gpus = nvml::refresh(&previous);
            *shared.gpus.lock().expect("gpus lock") = gpus;
            // On a node of several GPUs the same query also says which
            // GPUs each tenant's processes are on (`devices_in_use`).
            let several_gpus = shared.registry.lock().expect("registry lock").node_gpus > 1;
            if shared.config.audit != AuditAction::Off || several_gpus {
                audit_memory(&shared, &mut usage, &mut audit_failed);
            }
        }
    }
}

/// Compares every tenant's real device memory with its budget and acts on
/// an overrun as configured (see [`crate::audit`]; `off`: only records
/// what each tenant holds where). The query runs outside the lock.
fn audit_memory(shared: &Shared, source: &mut dyn UsageSource, failed: &mut bool) {
    let tenants = shared.registry.lock().expect("registry lock").audit_view();
    if tenants.is_empty() {
        return;
    }
    let usage = match source.process_memory() {
        Ok(usage) => {
            *failed = false;
            usage
        }
        Err(e) => {
            if !*failed {
                tracing::info!("memory audit unavailable: {e}");
                *failed = true;
            }
            return;
        }
    };
    let totals = audit::usage_by_tenant(&usage, &tenants);
    {
        let mut registry = shared.registry.lock().expect("registry lock");
        for tenant in &tenants {
            let held_on: BTreeMap<u32, u64> = totals
                .get(&tenant.name)
                .into_iter()
                .flatten()
                .map(|(&gpu, (bytes, _))| (gpu, *bytes))
                .collect();
            registry.set_audited(&tenant.name, &held_on);
        }
    }
    for overrun in audit::find_overruns(&usage, &tenants, shared.config.audit_slack) {
        audit::act(&overrun, shared.config.audit);
    }
}

fn update_signals(
    shared: &Shared,
    registry: &Registry,
    state: &crate::period::PeriodState,
    timers: &mut BTreeMap<(String, Option<u32>), SignalState>,
) {
    // Per tenant and GPU: a tenant given several GPUs is judged on each.
    timers.retain(|(name, gpu), _| registry.tenants.get(name).is_some_and(|t| t.is_on(*gpu)));
    let mut signals = Vec::new();
    let tenants = state.names.iter().zip(&state.gpus);
    for ((name, &gpu), o) in tenants.zip(&state.observations) {
        let timer = timers.entry((name.clone(), gpu)).or_default();
        let at_limit = o.share_ppm >= o.limit_ppm && o.saturated();
        let missing = o.class == WorkClass::Latency && o.slo_pressure() > 1.0 && at_limit;
        let now = Instant::now();
        if missing {
            timer.missing_since = timer.missing_since.or(Some(now));
            timer.last_missing = Some(now);
        } else if timer
            .last_missing
            .is_none_or(|last| now.duration_since(last) >= SCALE_OUT_HOLD)
        {
            timer.missing_since = None;
        }
        timer.idle_since = if o.launches == 0 {
            timer.idle_since.or(Some(Instant::now()))
        } else {
            None
        };
        if let Some(since) = timer.missing_since
            && since.elapsed() >= shared.config.scale_out_after
        {
            signals.push(ScaleSignal {
                tenant: name.clone(),
                gpu,
                advice: ScaleAdvice::ScaleOut,
                for_seconds: since.elapsed().as_secs_f64(),
                reason: "at its SM limit and over its SLO".into(),
            });
        } else if let Some(since) = timer.idle_since
            && since.elapsed() >= shared.config.scale_in_after
        {
            signals.push(ScaleSignal {
                tenant: name.clone(),
                gpu,
                advice: ScaleAdvice::ScaleIn,
                for_seconds: since.elapsed().as_secs_f64(),
                reason: "no kernel launched".into(),
            });
        }
    }
    *shared.signals.lock().expect("signals lock") = signals;
}

/// Tells systemd (Type=notify) that the daemon is ready, if it asked.
pub fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = path.as_encoded_bytes();
    let address = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        SocketAddr::from_abstract_name(name)
    } else {
        SocketAddr::from_pathname(PathBuf::from(&path))
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let address = address?;
        socket.send_to_addr(b"READY=1\nSTATUS=managing GPU tenants", &address)
    });
    if let Err(e) = sent {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

/// `dilu nodemgr`: runs until SIGTERM or SIGINT, in this process (it never
/// forks). `foreground` adds a banner for a person at a terminal (see
/// [`crate::logging`]).
pub fn run(config: Config, foreground: bool) -> error::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    // Block the signals in every thread, then wait for them here.
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block()
        .map_err(|e| Error::System(format!("cannot block SIGTERM and SIGINT: {e}")))?;
    match crate::peer_limits::raise_descriptor_limit(config.open_files_limit) {
        Ok(limit) => tracing::info!(limit, "descriptor limit"),
        Err(e) => tracing::warn!("cannot raise the descriptor limit: {e}"),
    }
    let daemon = Daemon::start(config)?;
    tracing::info!(
        socket = %daemon.shared.config.socket.display(),
        metrics = daemon.metrics_addr.as_deref().unwrap_or("off"),
        controller = daemon.shared.config.controller,
        "dilu node manager ready"
    );
    if foreground {
        eprintln!(
            "dilu nodemgr: listening on {} (metrics: {}, controller: {}, period {} ms); Ctrl-C stops it, tenants keep their budgets",
            daemon.shared.config.socket.display(),
            daemon.metrics_addr.as_deref().unwrap_or("off"),
            daemon.shared.config.controller,
            daemon.shared.config.period.as_secs_f64() * 1e3
        );
    }
    notify_ready();
    let signal = set
        .wait()
        .map_err(|e| Error::System(format!("cannot wait for SIGTERM or SIGINT: {e}")))?;
    tracing::info!(?signal, "stopping; tenants keep their budgets");
    daemon.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permission_error_at_start_names_the_flags_for_a_private_daemon() {
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let message = with_hint("/run/dilu: Permission denied".into(), &denied);
        for needed in ["root", "--socket", "--run-dir", "DILU_NODEMGR_SOCKET"] {
            assert!(message.contains(needed), "{needed}: {message}");
        }
        let other = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(with_hint("x".into(), &other), "x");
    }
}
