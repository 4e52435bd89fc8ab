//! One controller per GPU of the node.
//!
//! A tenant's share is a share of the GPU it was given, so the control law
//! runs once per GPU, over that GPU's tenants only: lending, water-filling,
//! a co-location primary's guarantee and every other rule see neither the
//! tenants nor the idle time of another GPU. Each GPU keeps its own
//! controller state, and only a GPU whose tenant set changed starts over.
//!
//! A tenant's device is on the GPU the daemon placed it on, or for a
//! tenant it did not place, the one its processes launch on
//! ([`crate::registry::devices_in_use`]). Devices on no known GPU
//! (`None`: before their first launch, or on a one-GPU node) form one
//! group of their own, as admission counts unplaced tenants
//! ([`crate::registry::Registry::admit`]); on a one-GPU node that group is
//! every tenant.

use super::by_name;
use super::policy::{Controller, Observation};
use std::collections::BTreeMap;

/// Which GPU a tenant's share is of (`None`: not placed by the daemon).
pub type GpuKey = Option<u32>;

struct Group {
    controller: Box<dyn Controller>,
    /// The tenants of this GPU, by name, in the order of `members`.
    names: Vec<String>,
    /// Their indices in the node's observation list.
    members: Vec<usize>,
    /// Scratch: this GPU's observations for one period.
    observations: Vec<Observation>,
}

/// The node's controllers, one per GPU that has tenants.
pub struct PerGpu {
    /// The law as asked for (what [`by_name`] builds each GPU's from).
    law: String,
    name: &'static str,
    /// [`Controller::guards_between_periods`] of the law.
    guards_between_periods: bool,
    groups: BTreeMap<GpuKey, Group>,
    /// The tenant-set version of the last [`PerGpu::assign`].
    assigned: Option<u64>,
}

impl PerGpu {
    /// Controllers of law `name` (one of [`super::NAMES`]).
    pub fn new(name: &str) -> crate::error::Result<Self> {
        let law = by_name(name)?;
        Ok(PerGpu {
            law: name.to_string(),
            name: law.name(),
            guards_between_periods: law.guards_between_periods(),
            groups: BTreeMap::new(),
            assigned: None,
        })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether the law guards latency tenants between periods (see
    /// [`Controller::guards_between_periods`]).
    pub fn guards_between_periods(&self) -> bool {
        self.guards_between_periods
    }

    /// The tenant-set version (the registry's epoch) the controllers were
    /// last assigned at; `None` before the first [`PerGpu::assign`].
    pub fn assigned(&self) -> Option<u64> {
        self.assigned
    }

    /// The node's tenants at version `epoch`, in the order their
    /// observations will come (each with its GPU). A GPU whose tenant list
    /// changed gets a fresh controller; the others keep theirs; GPUs left
    /// without tenants drop theirs.
    pub fn assign<'a>(&mut self, epoch: u64, tenants: impl IntoIterator<Item = (GpuKey, &'a str)>) {
        self.assigned = Some(epoch);
        let mut lists: BTreeMap<GpuKey, (Vec<String>, Vec<usize>)> = BTreeMap::new();
        for (index, (gpu, name)) in tenants.into_iter().enumerate() {
            let (names, members) = lists.entry(gpu).or_default();
            names.push(name.to_string());
            members.push(index);
        }
        self.groups.retain(|gpu, _| lists.contains_key(gpu));
        for (gpu, (names, members)) in lists {
            match self.groups.get_mut(&gpu) {
                Some(group) if group.names == names => group.members = members,
                _ => {
                    let controller = by_name(&self.law).expect("checked in PerGpu::new");
                    let observations = Vec::with_capacity(members.len());
                    self.groups.insert(
                        gpu,
                        Group {
                            controller,
                            names,
                            members,
                            observations,
                        },
                    );
                }
            }
        }
    }

    /// The GPUs that have tenants, with their indices (as assigned).
    pub fn groups(&self) -> impl Iterator<Item = (GpuKey, &[usize])> {
        self.groups
            .iter()
            .map(|(gpu, g)| (*gpu, g.members.as_slice()))
    }

    /// One period: each GPU's controller steps over its own tenants'
    /// observations. `tenants` is in the order of the last
    /// [`PerGpu::assign`]; the shares come back in that order (a tenant
    /// not assigned, which a caller that keeps to the contract never
    /// passes, gets 0).
    pub fn step(&mut self, now_ns: u64, tenants: &[Observation], shares: &mut Vec<u32>) {
        shares.clear();
        shares.resize(tenants.len(), 0);
        for group in self.groups.values_mut() {
            group.observations.clear();
            group.observations.extend(
                group
                    .members
                    .iter()
                    .filter_map(|&i| tenants.get(i))
                    .cloned(),
            );
            if group.observations.len() != group.members.len() {
                continue;
            }
            let decided = group.controller.step(now_ns, &group.observations);
            for (&i, share) in group.members.iter().zip(decided) {
                shares[i] = share;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::testing::*;
    use super::*;
    use dilu_abi::node_wire::WorkClass;

    fn run(per_gpu: &mut PerGpu, tenants: &[Observation]) -> Vec<u32> {
        let mut shares = Vec::new();
        per_gpu.step(0, tenants, &mut shares);
        shares
    }

    /// The 2-GPU case: a nearly idle latency tenant with a 60%
    /// request on gpu0 does not hold a busy batch tenant on gpu1 at its
    /// own 60% request.
    #[test]
    fn a_tenant_alone_on_its_gpu_is_not_held_back_by_another_gpus_requests() {
        for name in super::super::NAMES {
            let latency = busy(tenant(WorkClass::Latency, 60, 100), 2);
            let batch = busy(tenant(WorkClass::Batch, 60, 100), 100);
            let mut per_gpu = PerGpu::new(name).unwrap();
            per_gpu.assign(0, [(Some(0), "infer"), (Some(1), "train")]);
            let mut shares = run(&mut per_gpu, &[latency.clone(), batch.clone()]);
            for _ in 0..20 {
                let mut next = [latency.clone(), batch.clone()];
                next[0].share_ppm = shares[0];
                next[1].share_ppm = shares[1];
                shares = run(&mut per_gpu, &next);
            }
            if name != "static" {
                assert_eq!(shares[1], 1_000_000, "{name}: alone on gpu1: {shares:?}");
            }
            assert!(shares[0] >= 600_000, "{name}: keeps its request {shares:?}");

            // The same two on one GPU: under the default law the request
            // binds (dilu-colo lends it, co-location protecting the
            // latency tenant per launch; dilu-rckm does not keep it).
            if !matches!(name, "dilu" | "static") {
                continue;
            }
            let mut one = PerGpu::new(name).unwrap();
            one.assign(0, [(Some(0), "infer"), (Some(0), "train")]);
            let shared = run(&mut one, &[latency.clone(), batch.clone()]);
            assert!(shared[1] < 1_000_000, "{name}: {shared:?}");
        }
    }

    #[test]
    fn only_the_gpu_whose_tenants_changed_starts_over() {
        let mut per_gpu = PerGpu::new("dilu").unwrap();
        per_gpu.assign(0, [(Some(0), "a"), (Some(1), "b")]);
        let kept = per_gpu.groups[&Some(1)].controller.as_ref() as *const dyn Controller;
        per_gpu.assign(0, [(Some(0), "a"), (Some(0), "c"), (Some(1), "b")]);
        let after = per_gpu.groups[&Some(1)].controller.as_ref() as *const dyn Controller;
        assert!(std::ptr::addr_eq(kept, after), "gpu1 keeps its state");
        assert_eq!(per_gpu.groups[&Some(1)].members, vec![2], "new index");
        per_gpu.assign(0, [(Some(0), "a")]);
        assert_eq!(per_gpu.groups().count(), 1, "gpu1 has no tenant left");
        // Unplaced tenants are a group of their own.
        per_gpu.assign(0, [(None, "x"), (Some(0), "a")]);
        let groups: Vec<_> = per_gpu.groups().map(|(g, m)| (g, m.to_vec())).collect();
        assert_eq!(groups, vec![(None, vec![0]), (Some(0), vec![1])]);
        assert_eq!(
            run(&mut per_gpu, &[]).len(),
            0,
            "a short list decides nothing"
        );
    }

    /// A co-location primary and its filler on gpu0 get, period after
    /// period, exactly the shares they get with gpu1 empty, while gpu1's
    /// tenants are saturated, under every law.
    #[test]
    fn a_gpus_shares_do_not_move_when_another_gpu_is_saturated() {
        let mut primary = busy(tenant(WorkClass::Latency, 40, 100), 30);
        primary.colo_primary = true;
        let gpu0 = [
            with_latency(primary, 45, 40),
            busy(tenant(WorkClass::Batch, 10, 100), 60),
        ];
        let mut saturated = busy(tenant(WorkClass::Batch, 50, 100), 100);
        saturated.throttled_ns = 2_000_000;
        let gpu1 = [
            saturated.clone(),
            saturated,
            busy(tenant(WorkClass::Latency, 0, 100), 90),
        ];
        for name in super::super::NAMES {
            let mut alone = PerGpu::new(name).unwrap();
            alone.assign(0, [(Some(0), "primary"), (Some(0), "filler")]);
            let mut node = PerGpu::new(name).unwrap();
            let names = ["primary", "x", "filler", "y", "z"];
            let gpus = [Some(0), Some(1), Some(0), Some(1), Some(1)];
            node.assign(0, gpus.into_iter().zip(names));
            for period in 0..50u64 {
                let now = period * 5_000_000;
                let mut mine = Vec::new();
                alone.step(now, &gpu0, &mut mine);
                let all = [
                    gpu0[0].clone(),
                    gpu1[0].clone(),
                    gpu0[1].clone(),
                    gpu1[1].clone(),
                    gpu1[2].clone(),
                ];
                let mut shares = Vec::new();
                node.step(now, &all, &mut shares);
                assert_eq!(
                    (shares[0], shares[2]),
                    (mine[0], mine[1]),
                    "{name}, period {period}"
                );
                assert!(
                    shares[0] >= 400_000,
                    "{name}: the primary keeps its request"
                );
            }
        }
    }
}
