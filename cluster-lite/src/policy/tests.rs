use super::*;
use crate::model::WorkClass;

const GIB: u64 = 1 << 30;

fn demand(
    class: WorkClass,
    request: f64,
    limit: f64,
    memory_gib: u64,
    gpus: u32,
) -> InstanceDemand {
    InstanceDemand {
        class,
        sm_request: request,
        sm_limit: limit,
        memory_bytes: memory_gib * GIB,
        gpus,
    }
}

fn every_policy() -> Vec<Box<dyn PlacementPolicy>> {
    POLICY_NAMES
        .iter()
        .map(|name| policy_by_name(name).expect("listed policy exists"))
        .collect()
}

#[test]
fn every_listed_name_builds_and_unknown_names_do_not() {
    for policy in every_policy() {
        assert!(POLICY_NAMES.contains(&policy.name()));
    }
    assert!(policy_by_name("best-effort").is_none());
}

#[test]
fn no_policy_exceeds_requests_or_memory() {
    for policy in every_policy() {
        let mut cluster = ClusterState::uniform(2, 2, 80 * GIB);
        let work = demand(WorkClass::Latency, 0.4, 0.6, 30, 1);
        let mut placed = 0;
        while let Some(placement) = place(policy.as_ref(), &cluster, &work) {
            cluster.apply(&work, &placement.gpus);
            placed += 1;
            assert!(placed <= 8, "{} placed more than fits", policy.name());
        }
        for gpu in &cluster.gpus {
            assert!(gpu.sm_request_sum <= 1.0 + 1e-9, "{}", policy.name());
            assert!(gpu.memory_used <= gpu.memory_capacity, "{}", policy.name());
        }
        assert!(placed >= 4, "{} left GPUs empty", policy.name());
    }
}

#[test]
fn exclusive_gives_each_instance_its_own_gpu() {
    let mut cluster = ClusterState::uniform(1, 4, 80 * GIB);
    let work = demand(WorkClass::Latency, 0.1, 0.1, 1, 1);
    for _ in 0..4 {
        let placement = place(&Exclusive, &cluster, &work).expect("an idle GPU is left");
        cluster.apply(&work, &placement.gpus);
    }
    assert_eq!(cluster.active_gpus(), 4);
    assert!(place(&Exclusive, &cluster, &work).is_none());
}

#[test]
fn limit_bounds_differ_between_infless_variants_and_dilu_paper() {
    let work = demand(WorkClass::Latency, 0.3, 0.6, 5, 1);
    for (policy, expected_per_gpu) in [
        (&InflessLimits as &dyn PlacementPolicy, 1),
        (&DiluPaper, 2),
        (&InflessRequests, 3),
    ] {
        let mut cluster = ClusterState::uniform(1, 1, 80 * GIB);
        let mut placed = 0;
        while let Some(placement) = place(policy, &cluster, &work) {
            cluster.apply(&work, &placement.gpus);
            placed += 1;
        }
        assert_eq!(placed, expected_per_gpu, "{}", policy.name());
    }
}

#[test]
fn dilu_prefers_a_busy_gpu_and_pairs_memory_heavy_with_sm_heavy_work() {
    let mut cluster = ClusterState::uniform(1, 3, 80 * GIB);
    let memory_heavy = demand(WorkClass::Batch, 0.2, 0.3, 60, 1);
    let sm_heavy = demand(WorkClass::Latency, 0.6, 0.6, 5, 1);
    // GPU 0 holds memory-heavy work, GPU 1 SM-heavy work.
    cluster.apply(&memory_heavy, &[0]);
    cluster.apply(&sm_heavy, &[1]);
    let policy = Complementary::default();
    let next_sm_heavy = demand(WorkClass::Latency, 0.3, 0.3, 5, 1);
    let placement = place(&policy, &cluster, &next_sm_heavy).expect("fits");
    assert_eq!(
        placement.gpus,
        vec![0],
        "SM-heavy work should join memory-heavy work"
    );
    let next_memory_heavy = demand(WorkClass::Batch, 0.1, 0.1, 50, 1);
    let placement = place(&policy, &cluster, &next_memory_heavy).expect("fits");
    assert_eq!(
        placement.gpus,
        vec![1],
        "memory-heavy work should join SM-heavy work"
    );
}

#[test]
fn dilu_gang_places_training_on_one_node() {
    let mut cluster = ClusterState::uniform(2, 4, 80 * GIB);
    let filler = demand(WorkClass::Latency, 0.9, 0.9, 10, 1);
    // Node 0 has only two GPUs with room, node 1 has four.
    cluster.apply(&filler, &[0]);
    cluster.apply(&filler, &[1]);
    let training = demand(WorkClass::Batch, 0.5, 0.7, 30, 3);
    let placement = place(&Complementary::default(), &cluster, &training).expect("node 1 fits");
    assert_eq!(placement.gpus, vec![4, 5, 6]);
    assert!(place_on_node(&Complementary::default(), &cluster, &training, 0).is_none());
}

#[test]
fn gang_larger_than_any_node_is_refused() {
    let cluster = ClusterState::uniform(3, 2, 80 * GIB);
    let training = demand(WorkClass::Batch, 0.5, 0.5, 10, 3);
    assert!(place(&Complementary::default(), &cluster, &training).is_none());
    assert!(
        place(&DiluPaper, &cluster, &training).is_some(),
        "dilu-paper spans nodes"
    );
}
