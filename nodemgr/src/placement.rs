//! Which of the node's GPUs a tenant started by `dilu run` goes to.
//!
//! The rule is the cluster layer's (`dilu-placement`, the code the
//! Kubernetes extender places pods with): the node is a one-node cluster
//! whose GPUs carry the specs of the tenants already placed on them, and
//! the tenant is one instance asking as many GPUs as it was started with
//! (`dilu run --gpus N`: its spec holds on each). This module only translates
//! between the daemon's specs and that model; it owns no rule of its own.

use dilu_abi::node_wire::{Bytes, TenantSpec};
use dilu_placement::model::{ClusterState, InstanceDemand};
use dilu_placement::policy::{PlacementPolicy, place_on_node};

/// What a tenant holds on each of its `gpus` GPUs, in the model's units
/// (shares 0–1).
pub fn demand(spec: &TenantSpec, gpus: usize) -> InstanceDemand {
    InstanceDemand {
        class: spec.class,
        sm_request: spec.sm_request.as_fraction(),
        sm_limit: spec.sm_limit.as_fraction(),
        memory_bytes: spec.mem.map_or(0, Bytes::get),
        gpus: gpus.max(1) as u32,
    }
}

/// Chooses `count` GPUs (indices into `capacities`, each GPU's memory in
/// bytes) for `spec`, given the specs already held (`held`: the GPUs of
/// each and its spec). The GPUs come back in ascending order (PCI bus
/// order, as `CUDA_VISIBLE_DEVICES` lists them). `None` when fewer than
/// `count` GPUs admit it under `policy`.
pub fn choose<'a>(
    policy: &dyn PlacementPolicy,
    capacities: &[u64],
    held: impl IntoIterator<Item = (&'a [u32], &'a TenantSpec)>,
    spec: &TenantSpec,
    count: usize,
) -> Option<Vec<u32>> {
    let mut node = ClusterState::default();
    node.add_node(capacities.len(), 0);
    for (gpu, &capacity) in node.gpus.iter_mut().zip(capacities) {
        gpu.memory_capacity = capacity;
    }
    // Changed by hand: the node's class (its state, which policies key
    // what they measured by) is filed again.
    node.refresh_node(0);
    for (gpus, spec) in held {
        let gpus: Vec<usize> = gpus.iter().map(|&g| g as usize).collect();
        node.apply(&demand(spec, gpus.len()), &gpus);
    }
    let placement = place_on_node(policy, &node, &demand(spec, count), 0)?;
    let mut gpus: Vec<u32> = placement.gpus.iter().map(|&gpu| gpu as u32).collect();
    if gpus.len() != count.max(1) {
        return None;
    }
    gpus.sort_unstable();
    Some(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::SmShare;
    use dilu_abi::node_wire::WorkClass;
    use dilu_placement::policy::policy_by_name;

    fn spec(request: f64, limit: f64, mem_gib: u64) -> TenantSpec {
        TenantSpec {
            class: WorkClass::Batch,
            slo_ms: None,
            sm_request: SmShare::percent(request),
            sm_limit: SmShare::percent(limit),
            mem: Some(Bytes::gib(mem_gib)),
        }
    }

    #[test]
    fn tenants_that_cannot_share_a_gpu_go_to_different_ones_and_the_last_is_refused() {
        let dilu = policy_by_name("dilu").unwrap();
        let capacities = [80u64 << 30; 2];
        let big = spec(60.0, 60.0, 10);
        let first = choose(dilu.as_ref(), &capacities, [], &big, 1).unwrap();
        let second = choose(dilu.as_ref(), &capacities, [(&first[..], &big)], &big, 1).unwrap();
        assert_ne!(first, second, "60% + 60% does not fit one GPU");
        let held = [(&first[..], &big), (&second[..], &big)];
        assert_eq!(choose(dilu.as_ref(), &capacities, held, &big, 1), None);
        // Memory binds as well as SM time.
        let roomy = spec(10.0, 10.0, 50);
        let third = choose(dilu.as_ref(), &capacities, [(&[0][..], &roomy)], &roomy, 1).unwrap();
        assert_eq!(third, [1], "50 GiB + 50 GiB does not fit an 80 GiB GPU");
    }

    #[test]
    fn complementary_tenants_share_a_busy_gpu_rather_than_wake_an_idle_one() {
        let dilu = policy_by_name("dilu").unwrap();
        let capacities = [80u64 << 30; 4];
        let busy = spec(30.0, 30.0, 10);
        let gpu = choose(dilu.as_ref(), &capacities, [(&[2][..], &busy)], &busy, 1).unwrap();
        assert_eq!(
            gpu,
            [2],
            "the policy packs small tenants (an idle GPU costs more)"
        );
    }

    #[test]
    fn a_tenant_asking_several_gpus_gets_that_many_with_room_in_bus_order_or_none() {
        let dilu = policy_by_name("dilu").unwrap();
        let capacities = [80u64 << 30; 4];
        let big = spec(60.0, 60.0, 10);
        // gpu1 and gpu2 are too full for another 60%.
        let held = [(&[1u32][..], &big), (&[2u32][..], &big)];
        let two = choose(dilu.as_ref(), &capacities, held, &big, 2).unwrap();
        assert_eq!(two, [0, 3], "the two GPUs with room, ascending");
        // A two-GPU tenant holds its spec on both of its GPUs.
        let held = [(&[0u32, 3][..], &big), (&[1u32][..], &big)];
        assert_eq!(
            choose(dilu.as_ref(), &capacities, held, &big, 1),
            Some(vec![2])
        );
        assert_eq!(
            choose(dilu.as_ref(), &capacities, held, &big, 2),
            None,
            "one GPU has room, two are asked"
        );
    }
}
