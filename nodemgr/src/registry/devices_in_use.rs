//! The devices of a tenant the daemon did not place, as its processes use
//! them.
//!
//! A program started without `dilu run` placing it (its user chose the
//! GPUs, with `CUDA_VISIBLE_DEVICES` or by default all of them) may launch
//! on several devices. Each process says, in the tenant's activity region,
//! which of the node's GPUs each of its devices is (found by PCI location,
//! exact whatever the device order); the daemon takes a device as the
//! tenant's once its processes launched on it, and controls it on that
//! GPU beside that GPU's other tenants, as it controls a placed tenant's.
//!
//! What the processes say is a tenant's claim, so it counts only where
//! NVML (a source the tenant cannot write: the daemon's memory query,
//! once a second) last showed one of its processes on that GPU; without
//! that, or for a GPU the node does not have, or two GPUs for one device
//! (processes that chose differently), the device is on no known GPU and
//! controlled with the other tenants not placed, as before. A tenant can
//! so join the control of a GPU only where its processes run. On a node
//! with one GPU nothing changes: every tenant is on it already.
//!
//! Found on a GPU it was not on, the tenant is admitted there: it was
//! admitted among the tenants not placed, not beside that GPU's. Its
//! processes run already, so where its spec does not fit it is held to the
//! room left there and named over-admitted, as a running process that
//! registers without room is, and the tenants admitted on that GPU keep
//! their guarantees.

use super::Registry;
use super::tenant::{Tenant, TenantDevice};
use dilu_layout::activity::NodeGpu;

impl Registry {
    /// Brings the devices of every tenant not placed by the daemon up to
    /// what its processes use; a change starts the controllers over (the
    /// epoch moves). Memory reads only, of every device's counters of every
    /// such tenant: run at housekeeping (every ~100 ms), so a device is
    /// controlled on its GPU within about a tenth of a second of its first
    /// launch.
    pub fn follow_devices_in_use(&mut self) {
        if self.node_gpus < 2 {
            return;
        }
        let mut changed = false;
        let mut joined: Vec<(String, Vec<u32>)> = Vec::new();
        for tenant in self.tenants.values_mut().filter(|t| !t.placed) {
            let before = tenant.gpus();
            if follow(tenant, self.node_gpus) {
                changed = true;
                let new: Vec<u32> = (tenant.gpus().into_iter())
                    .filter(|g| !before.contains(g))
                    .collect();
                if !new.is_empty() {
                    joined.push((tenant.name.clone(), new));
                }
            }
        }
        for (name, gpus) in joined {
            self.admit_where_found(&name, &gpus);
        }
        if changed {
            self.epoch += 1;
        }
    }

    /// Tenant `name`, found on `gpus` it was not on, admitted there (see
    /// the module's text).
    fn admit_where_found(&mut self, name: &str, gpus: &[u32]) {
        let Some(tenant) = self.tenants.get(name) else {
            return;
        };
        let spec = tenant.spec.clone();
        let Err(reason) = self.admit_each(name, &spec, gpus) else {
            return;
        };
        let held = self.room_left_on(name, &spec, gpus);
        let found = gpus.iter().map(|g| format!("gpu{g}")).collect::<Vec<_>>();
        let reason = format!("found on {}: {reason}", found.join(", "));
        tracing::warn!(
            tenant = name,
            "over-admitted: {reason}; held to SM request {} and memory {}",
            held.sm_request,
            held.mem.map_or("unlimited".into(), |b| b.to_string())
        );
        let tenant = self.tenants.get_mut(name).expect("looked up above");
        // Live: every process's next allocation is held to it.
        tenant
            .regions
            .budget
            .set_mem_budget_all(held.mem.map(dilu_abi::units::Bytes::get));
        tenant.spec = held;
        tenant.over_admitted.get_or_insert(reason);
    }
}

/// Whether `tenant`'s devices changed.
fn follow(tenant: &mut Tenant, node_gpus: usize) -> bool {
    let activity = &tenant.regions.activity;
    let seen = &tenant.seen_on_gpus;
    let gpu_of = |ordinal: usize| match activity.devices[ordinal].node_gpu() {
        NodeGpu::Gpu(gpu) if (gpu as usize) < node_gpus && seen.contains(&gpu) => Some(gpu),
        _ => None,
    };
    let mut in_use: Vec<(usize, Option<u32>)> = (0..activity.devices.len())
        .filter(|&ordinal| activity.devices[ordinal].pulse()[1] > 0)
        .map(|ordinal| (ordinal, gpu_of(ordinal)))
        .collect();
    if in_use.is_empty() {
        in_use.push((0, gpu_of(0)));
    }
    let now = tenant.devices.iter().map(|d| (d.ordinal, d.gpu));
    if now.eq(in_use.iter().copied()) {
        return false;
    }
    // A device it keeps keeps its share and sampling state; a new one
    // starts at the share of its first.
    let share = tenant.devices[0].share_ppm;
    let mut before = std::mem::take(&mut tenant.devices);
    tenant.devices = in_use
        .into_iter()
        .map(
            |(ordinal, gpu)| match before.iter().position(|d| d.ordinal == ordinal) {
                Some(at) => {
                    let mut kept = before.swap_remove(at);
                    kept.gpu = gpu;
                    kept
                }
                None => TenantDevice::new(ordinal, gpu, share),
            },
        )
        .collect();
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::{Bytes, SmShare, TenantSpec};
    use std::collections::BTreeMap;

    /// A registry of a node of `gpus` GPUs with tenant `name`, not placed,
    /// which NVML showed on `seen`.
    fn node_with(gpus: usize, name: &str, seen: &[u32]) -> Registry {
        let mut registry = Registry::new(BTreeMap::new(), None);
        registry.node_gpus = gpus;
        let pid = std::process::id() as i32;
        crate::registry::testing::register_on(&mut registry, name, pid, &[], TenantSpec::default());
        registry.tenants.get_mut(name).unwrap().seen_on_gpus = seen.to_vec();
        registry
    }

    fn devices(registry: &Registry, name: &str) -> Vec<(usize, Option<u32>)> {
        let devices = &registry.tenants[name].devices;
        devices.iter().map(|d| (d.ordinal, d.gpu)).collect()
    }

    #[test]
    fn a_tenant_not_placed_is_on_the_gpus_its_processes_launch_on() {
        let mut registry = node_with(4, "chose", &[2, 3]);
        let activity = &registry.tenants["chose"].regions.activity;
        // Its process sees gpu2 and gpu3 as its devices 0 and 1.
        activity.devices[0].publish_node_gpu(2);
        activity.devices[1].publish_node_gpu(3);
        let epoch = registry.epoch;
        registry.follow_devices_in_use();
        assert_eq!(
            devices(&registry, "chose"),
            [(0, Some(2))],
            "before a launch"
        );
        assert!(registry.tenants["chose"].is_on(Some(2)));
        // It launches on its device 1 only.
        let activity = &registry.tenants["chose"].regions.activity;
        activity.devices[1].record_launch(1_000, 1_000);
        registry.follow_devices_in_use();
        assert_eq!(devices(&registry, "chose"), [(1, Some(3))]);
        assert!(registry.epoch > epoch, "the controllers start over");
        // Then on both: device 1 keeps its state, device 0 joins.
        registry.tenants.get_mut("chose").unwrap().devices[0].share_ppm = 123_000;
        let activity = &registry.tenants["chose"].regions.activity;
        activity.devices[0].record_launch(2_000, 1_000);
        registry.follow_devices_in_use();
        assert_eq!(devices(&registry, "chose"), [(0, Some(2)), (1, Some(3))]);
        assert_eq!(registry.tenants["chose"].devices[1].share_ppm, 123_000);
        let epoch = registry.epoch;
        registry.follow_devices_in_use();
        assert_eq!(
            registry.epoch, epoch,
            "nothing changed: the controllers go on"
        );
    }

    /// A tenant not placed, asking 50% and 6 GiB, found on gpu1 beside a
    /// tenant placed there with 70% and 4 GiB of its 8 GiB: held to the
    /// room left (30%, 4 GiB) and named over-admitted; found on gpu0,
    /// where nothing else runs, it keeps its spec.
    #[test]
    fn a_tenant_not_placed_found_on_a_full_gpu_is_held_to_the_room_left_there() {
        let gib = 1u64 << 30;
        let asks = TenantSpec {
            sm_request: SmShare::percent(50.0),
            mem: Some(Bytes::new(6 * gib)),
            ..TenantSpec::default()
        };
        for (gpu, over) in [(1, true), (0, false)] {
            let mut registry = Registry::new(BTreeMap::new(), Some(8 * gib));
            registry.node_gpus = 2;
            let pid = std::process::id() as i32;
            let placed = TenantSpec {
                sm_request: SmShare::percent(70.0),
                mem: Some(Bytes::new(4 * gib)),
                ..TenantSpec::default()
            };
            crate::registry::testing::register_on(&mut registry, "placed", pid, &[1], placed);
            crate::registry::testing::register_on(&mut registry, "chose", pid, &[], asks.clone());
            registry.tenants.get_mut("chose").unwrap().seen_on_gpus = vec![gpu];
            let activity = &registry.tenants["chose"].regions.activity;
            activity.devices[0].publish_node_gpu(gpu);
            activity.devices[0].record_launch(1_000, 1_000);
            registry.follow_devices_in_use();
            assert_eq!(devices(&registry, "chose"), [(0, Some(gpu))]);
            let chose = &registry.tenants["chose"];
            if over {
                let reason = chose.over_admitted.as_deref().unwrap_or("");
                assert!(reason.contains("found on gpu1"), "{reason:?}");
                assert_eq!(chose.spec.sm_request, SmShare::percent(30.0));
                assert_eq!(chose.spec.mem, Some(Bytes::new(4 * gib)));
                assert_eq!(chose.mem_budget(0), Some(4 * gib), "live in its budget");
                assert_eq!(
                    registry.tenants["placed"].spec.sm_request,
                    SmShare::percent(70.0)
                );
            } else {
                assert_eq!(chose.over_admitted, None);
                assert_eq!(chose.spec, asks);
            }
        }
    }

    #[test]
    fn a_gpu_the_node_lacks_or_two_gpus_for_one_device_is_no_known_gpu() {
        let mut registry = node_with(2, "odd", &[0, 1]);
        let activity = &registry.tenants["odd"].regions.activity;
        activity.devices[0].publish_node_gpu(7);
        activity.devices[0].record_launch(1_000, 1_000);
        activity.devices[1].publish_node_gpu(0);
        activity.devices[1].publish_node_gpu(1);
        activity.devices[1].record_launch(1_000, 1_000);
        registry.follow_devices_in_use();
        assert_eq!(devices(&registry, "odd"), [(0, None), (1, None)]);
    }

    /// A tenant that names a GPU its processes are not on (to join that
    /// GPU's control, where it would take other tenants' slack) is left
    /// on no known GPU until NVML shows it there.
    #[test]
    fn a_gpu_nvml_did_not_show_the_tenant_on_is_not_taken_from_its_word() {
        let mut registry = node_with(2, "liar", &[0]);
        let activity = &registry.tenants["liar"].regions.activity;
        activity.devices[0].publish_node_gpu(1);
        activity.devices[0].record_launch(1_000, 1_000);
        registry.follow_devices_in_use();
        assert_eq!(devices(&registry, "liar"), [(0, None)]);
        assert!(!registry.tenants["liar"].is_on(Some(1)));
        let held_on = BTreeMap::from([(1, 1 << 20)]);
        registry.set_audited("liar", &held_on);
        registry.follow_devices_in_use();
        assert_eq!(
            devices(&registry, "liar"),
            [(0, Some(1))],
            "NVML saw it there"
        );
    }

    #[test]
    fn on_a_one_gpu_node_nothing_moves() {
        let mut registry = node_with(1, "only", &[0]);
        let activity = &registry.tenants["only"].regions.activity;
        activity.devices[0].publish_node_gpu(0);
        activity.devices[0].record_launch(1_000, 1_000);
        registry.follow_devices_in_use();
        assert_eq!(devices(&registry, "only"), [(0, None)]);
    }
}
