//! One control period's work on the registry: sample every tenant, let each
//! GPU's controller decide its tenants' shares ([`PerGpu`]), write them.
//!
//! Memory only (telemetry in size-sealed memfds, budgets in sealed memfds
//! the daemon writes): the caller holds the registry lock. Kept apart from
//! the daemon's thread so that its cost can be measured on a made-up full
//! node (`dilu-nodemgr`'s `control-period` benchmark).

use crate::control::Observation;
use crate::control::per_gpu::{GpuKey, PerGpu};
use crate::registry::Registry;

/// What the control loop keeps between periods.
#[derive(Default)]
pub struct PeriodState {
    /// The registry epoch the controllers were last assigned at.
    epoch: Option<u64>,
    /// The tenants in observation order, and each one's GPU.
    pub names: Vec<String>,
    pub gpus: Vec<GpuKey>,
    /// This period's observations (same order).
    pub observations: Vec<Observation>,
    shares: Vec<u32>,
}

/// Runs one period at `now_ns`.
pub fn run(
    registry: &mut Registry,
    controllers: &mut PerGpu,
    state: &mut PeriodState,
    now_ns: u64,
) {
    if state.epoch != Some(registry.epoch) {
        state.epoch = Some(registry.epoch);
        state.names = registry.tenants.keys().cloned().collect();
        state.gpus = registry.tenants.values().map(|t| t.gpu).collect();
    }
    // A new tenant set, or controllers just replaced (`dilu demo`).
    if controllers.assigned() != Some(registry.epoch) {
        let tenants = state.gpus.iter().copied();
        controllers.assign(
            registry.epoch,
            tenants.zip(state.names.iter().map(String::as_str)),
        );
    }
    state.observations.clear();
    for tenant in registry.tenants.values_mut() {
        let share = tenant.share_ppm;
        let o = tenant
            .sampler
            .observe(&tenant.regions.activity, now_ns, &tenant.spec, share);
        state.observations.push(o);
    }
    controllers.step(now_ns, &state.observations, &mut state.shares);
    for (tenant, &share) in registry.tenants.values_mut().zip(&state.shares) {
        tenant.share_ppm = share;
        crate::registry::write_share(&tenant.regions.budget, share);
    }
}
