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
        for tenant in self.tenants.values_mut().filter(|t| !t.placed) {
            changed |= follow(tenant, self.node_gpus);
        }
        if changed {
            self.epoch += 1;
        }
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
    use dilu_abi::node_wire::TenantSpec;
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
