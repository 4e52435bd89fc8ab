//! Which of the node's GPUs a tenant started by `dilu run` goes to.
//!
//! The rule is the cluster layer's (`dilu-placement`, the code the
//! Kubernetes extender places pods with): the node is a one-node cluster
//! whose GPUs carry the specs of the tenants already placed on them, and
//! the tenant is one single-GPU instance. This module only translates
//! between the daemon's specs and that model; it owns no rule of its own.

use dilu_abi::node_wire::TenantSpec;
use dilu_placement::model::{ClusterState, InstanceDemand};
use dilu_placement::policy::{PlacementPolicy, place_on_node};

/// What a tenant holds on its GPU, in the model's units (shares 0–1).
pub fn demand(spec: &TenantSpec) -> InstanceDemand {
    InstanceDemand {
        class: spec.class,
        sm_request: spec.sm_request_pct / 100.0,
        sm_limit: spec.sm_limit_pct / 100.0,
        memory_bytes: spec.mem_bytes.unwrap_or(0),
        gpus: 1,
    }
}

/// Chooses a GPU (an index into `capacities`, each GPU's memory in bytes)
/// for `spec`, given the specs already held on each GPU (`held`: GPU index
/// and spec). `None` when no GPU admits it under `policy`.
pub fn choose<'a>(
    policy: &dyn PlacementPolicy,
    capacities: &[u64],
    held: impl IntoIterator<Item = (u32, &'a TenantSpec)>,
    spec: &TenantSpec,
) -> Option<u32> {
    let mut node = ClusterState::default();
    node.add_node(capacities.len(), 0);
    for (gpu, &capacity) in node.gpus.iter_mut().zip(capacities) {
        gpu.memory_capacity = capacity;
    }
    for (gpu, spec) in held {
        node.apply(&demand(spec), &[gpu as usize]);
    }
    let placement = place_on_node(policy, &node, &demand(spec), 0)?;
    placement.gpus.first().map(|&gpu| gpu as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::WorkClass;
    use dilu_placement::policy::policy_by_name;

    fn spec(request: f64, limit: f64, mem_gib: u64) -> TenantSpec {
        TenantSpec {
            class: WorkClass::Batch,
            slo_ms: None,
            sm_request_pct: request,
            sm_limit_pct: limit,
            mem_bytes: Some(mem_gib << 30),
        }
    }

    #[test]
    fn tenants_that_cannot_share_a_gpu_go_to_different_ones_and_the_last_is_refused() {
        let dilu = policy_by_name("dilu").unwrap();
        let capacities = [80u64 << 30; 2];
        let big = spec(60.0, 60.0, 10);
        let first = choose(dilu.as_ref(), &capacities, [], &big).unwrap();
        let second = choose(dilu.as_ref(), &capacities, [(first, &big)], &big).unwrap();
        assert_ne!(first, second, "60% + 60% does not fit one GPU");
        let held = [(first, &big), (second, &big)];
        assert_eq!(choose(dilu.as_ref(), &capacities, held, &big), None);
        // Memory binds as well as SM time.
        let roomy = spec(10.0, 10.0, 50);
        let third = choose(dilu.as_ref(), &capacities, [(0, &roomy)], &roomy).unwrap();
        assert_eq!(third, 1, "50 GiB + 50 GiB does not fit an 80 GiB GPU");
    }

    #[test]
    fn complementary_tenants_share_a_busy_gpu_rather_than_wake_an_idle_one() {
        let dilu = policy_by_name("dilu").unwrap();
        let capacities = [80u64 << 30; 4];
        let busy = spec(30.0, 30.0, 10);
        let gpu = choose(dilu.as_ref(), &capacities, [(2, &busy)], &busy).unwrap();
        assert_eq!(
            gpu, 2,
            "the policy packs small tenants (an idle GPU costs more)"
        );
    }
}
