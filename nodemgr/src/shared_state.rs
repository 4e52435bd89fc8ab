//! What the daemon's threads share: the configuration, the registry, the
//! per-GPU controllers, the latest GPU readings and scale signals, and the
//! counters status reports. The socket server, the control loop,
//! housekeeping and the metrics endpoint each hold it (`Arc<Shared>`);
//! [`crate::daemon`] builds it and starts them.

use crate::config::Config;
use crate::control::per_gpu::PerGpu;
use crate::registry::Registry;
use dilu_abi::node_wire::{GpuStatus, NodeStatus, ScaleSignal};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct Shared {
    pub config: Config,
    pub registry: Mutex<Registry>,
    /// One controller per GPU ([`PerGpu`]).
    pub controller: Mutex<PerGpu>,
    pub signals: Mutex<Vec<ScaleSignal>>,
    pub gpus: Mutex<Vec<GpuStatus>>,
    pub stopping: AtomicBool,
    pub started: Instant,
    /// Control periods run so far (status shows whether the loop keeps time).
    pub periods: AtomicU64,
    /// Open connections per uid (`max_connections_per_uid`).
    pub connections: Arc<crate::peer_limits::ConnectionCounts>,
    /// CPU time the control loop spent on its periods' work, in all and at
    /// most.
    pub period_work_ns: AtomicU64,
    pub period_work_max_ns: AtomicU64,
    /// Users whose tenant processes left files to sweep.
    pub leftovers: crate::leftovers::Leftovers,
    /// What a restarted daemon re-adopts from.
    pub state_file: crate::state_file::StateFile,
}

impl Shared {
    /// Saves the registry's state if it changed (see
    /// [`crate::state_file`]).
    pub fn save_state(&self) {
        self.state_file.save(&self.registry);
    }

    pub fn status(&self) -> NodeStatus {
        let tenants = self.registry.lock().expect("registry lock").status();
        // Board files are read after the lock is released.
        let colocation = crate::colo_status::collect(&tenants);
        NodeStatus {
            controller: self
                .controller
                .lock()
                .expect("controller lock")
                .name()
                .to_string(),
            period_ms: self.config.period.as_secs_f64() * 1e3,
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            gpus: self.gpus.lock().expect("gpus lock").clone(),
            tenants,
            signals: self.signals.lock().expect("signals lock").clone(),
            control_periods: self.periods.load(Ordering::Relaxed),
            control_work_seconds_total: self.period_work_ns.load(Ordering::Relaxed) as f64 / 1e9,
            control_work_max_ms: self.period_work_max_ns.load(Ordering::Relaxed) as f64 / 1e6,
            colocation,
        }
    }
}
