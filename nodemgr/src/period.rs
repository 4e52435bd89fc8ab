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
    /// The tenants' devices in observation order: each tenant's devices in
    /// its own order. Each with its tenant's name, the GPU it is (its
    /// controller group) and its in-process device ordinal.
    pub names: Vec<String>,
    pub gpus: Vec<GpuKey>,
    pub devices: Vec<usize>,
    /// This period's observations (same order).
    pub observations: Vec<Observation>,
    shares: Vec<u32>,
    /// This period's queue bounds (same order, see [`crate::queue_bounds`]).
    queue_bounds: Vec<u64>,
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
        state.names.clear();
        state.gpus.clear();
        state.devices.clear();
        for t in registry.tenants.values() {
            for device in &t.devices {
                state.names.push(t.name.clone());
                state.gpus.push(device.gpu);
                state.devices.push(device.ordinal);
            }
        }
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
        let activity = &tenant.regions.activity;
        for device in &mut tenant.devices {
            let share = device.share_ppm;
            let o = device
                .sampler
                .observe(activity, now_ns, &tenant.spec, share);
            state.observations.push(o);
        }
    }
    controllers.step(now_ns, &state.observations, &mut state.shares);
    state.queue_bounds.clear();
    if controllers.guards_between_periods() {
        let (observations, gpus) = (&state.observations, &state.gpus);
        crate::queue_bounds::queue_bounds(observations, gpus, &mut state.queue_bounds);
    }
    let mut shares = state.shares.iter().copied();
    let mut bounds = state.queue_bounds.iter().copied();
    for tenant in registry.tenants.values_mut() {
        for device in &mut tenant.devices {
            device.share_ppm = shares.next().unwrap_or(device.share_ppm);
        }
        crate::registry::write_shares(&tenant.regions.budget, tenant.shares());
        // No bounds at all where the law does not guard between periods.
        let own_bounds = (tenant.devices.iter()).map(|d| (d.ordinal, bounds.next().unwrap_or(0)));
        crate::registry::write_queue_bounds(&tenant.regions.budget, own_bounds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::SmShare;
    use dilu_abi::node_wire::{TenantSpec, WorkClass};
    use dilu_layout::budget::UNLIMITED_SHARE;
    use std::collections::BTreeMap;

    const PERIOD_NS: u64 = 5_000_000;

    fn batch(request: f64) -> TenantSpec {
        TenantSpec {
            class: WorkClass::Batch,
            sm_request: SmShare::percent(request),
            sm_limit: SmShare::percent(100.0),
            ..TenantSpec::default()
        }
    }

    fn add(registry: &mut Registry, name: &str, gpus: &[u32], spec: TenantSpec) {
        let pid = std::process::id() as i32;
        crate::registry::testing::register_on(registry, name, pid, gpus, spec);
    }

    /// A tenant on gpu0 and gpu1 takes part in both GPUs' control: alone on
    /// gpu0 it gets the whole of it, while on gpu1 it shares with another
    /// busy tenant, each device's share written to that device's budget.
    #[test]
    fn a_tenant_on_two_gpus_gets_each_share_from_that_gpus_tenants_only() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        add(&mut registry, "wide", &[0, 1], batch(20.0));
        add(&mut registry, "other", &[1], batch(60.0));
        let mut controllers = PerGpu::new("dilu").unwrap();
        let mut state = PeriodState::default();
        let mut now_ns = 1_000_000_000;
        for _ in 0..200 {
            now_ns += PERIOD_NS;
            // Both keep every device they have busy, and wait for tokens.
            for tenant in registry.tenants.values() {
                for device in 0..tenant.devices.len() {
                    let telemetry = &tenant.regions.activity.devices[device];
                    telemetry.record_launch(now_ns, PERIOD_NS);
                    telemetry.record_throttle(PERIOD_NS / 2);
                }
            }
            run(&mut registry, &mut controllers, &mut state, now_ns);
        }
        assert_eq!(state.gpus, [Some(1), Some(0), Some(1)], "other; wide ×2");
        let wide = &registry.tenants["wide"];
        let other = &registry.tenants["other"];
        let budget = &wide.regions.budget;
        assert_eq!(budget.share_ppm(0), UNLIMITED_SHARE, "alone on gpu0");
        let on_gpu1 = budget.share_ppm(1);
        assert_eq!(on_gpu1, wide.devices[1].share_ppm);
        assert!(
            (200_000..1_000_000).contains(&on_gpu1),
            "on gpu1 at least its request, beside the other tenant: {on_gpu1}"
        );
        assert!(
            other.devices[0].share_ppm >= 600_000
                && other.devices[0].share_ppm + on_gpu1 <= 1_000_000,
            "gpu1 is shared out between its two tenants: {} + {on_gpu1}",
            other.devices[0].share_ppm
        );
    }

    fn latency(slo_ms: f64) -> TenantSpec {
        TenantSpec {
            class: WorkClass::Latency,
            slo_ms: Some(slo_ms),
            sm_request: SmShare::percent(30.0),
            sm_limit: SmShare::percent(100.0),
            ..TenantSpec::default()
        }
    }

    /// A batch tenant on the GPU of a latency tenant with an SLO keeps a
    /// short queue; one on another GPU, and the latency tenant, none.
    #[test]
    fn a_batch_tenant_beside_a_latency_tenant_with_an_slo_has_a_queue_bound() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        add(&mut registry, "serve", &[0], latency(15.0));
        add(&mut registry, "train", &[0], batch(20.0));
        add(&mut registry, "apart", &[1], batch(20.0));
        let mut controllers = PerGpu::new("dilu").unwrap();
        let mut state = PeriodState::default();
        run(&mut registry, &mut controllers, &mut state, 1_000_000_000);
        let bound = |name: &str| registry.tenants[name].regions.budget.queue_bound_ns(0);
        assert_eq!(bound("train"), crate::queue_bounds::QUEUE_BOUND_NS);
        assert_eq!(bound("apart"), 0);
        assert_eq!(bound("serve"), 0);
    }

    /// A resting latency tenant's first launch is seen between periods.
    #[test]
    fn the_first_launch_of_a_resting_latency_tenant_wakes_the_control_loop() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        add(&mut registry, "serve", &[0], latency(15.0));
        add(&mut registry, "train", &[0], batch(20.0));
        let mut controllers = PerGpu::new("dilu").unwrap();
        let mut state = PeriodState::default();
        let mut watch = crate::wake_watch::WakeWatch::default();
        run(&mut registry, &mut controllers, &mut state, 1_000_000_000);
        watch.arm(&registry, &state.observations, &state.gpus);
        assert!(watch.watching(), "the resting latency tenant is watched");
        assert!(!watch.woke(&registry));
        let serve = &registry.tenants["serve"].regions.activity.devices[0];
        serve.record_launch(1_001_000_000, 500_000);
        assert!(watch.woke(&registry), "its launch wakes the loop");
        // Launching in the period, it is protected by the period itself.
        run(&mut registry, &mut controllers, &mut state, 1_002_000_000);
        watch.arm(&registry, &state.observations, &state.gpus);
        assert!(!watch.watching());
    }
}
