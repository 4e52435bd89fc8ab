use super::*;
use std::sync::Arc;

use crate::model::{GpuState, HostState, InstanceDemand, PodNeeds, WorkClass};

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
    // The power-aware ones are the simulator's: a front end that scores a
    // node at a time (the extender) cannot rank nodes as `pwr-fgd` does.
    for name in POWER_POLICY_NAMES {
        assert!(policy_by_name(name).is_none(), "{name}");
    }
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

/// How many copies of `work` `policy` places on a cluster of one GPU.
fn copies_one_gpu_takes(policy: &dyn PlacementPolicy, work: &InstanceDemand) -> usize {
    let mut cluster = ClusterState::uniform(1, 1, 80 * GIB);
    let mut placed = 0;
    while let Some(placement) = place(policy, &cluster, work) {
        cluster.apply(work, &placement.gpus);
        placed += 1;
    }
    placed
}

#[test]
fn limit_bounds_differ_between_infless_variants_and_dilu_paper() {
    let work = demand(WorkClass::Latency, 0.3, 0.6, 5, 1);
    for (policy, expected_per_gpu) in [
        (&InflessLimits as &dyn PlacementPolicy, 1),
        (&DiluPaper, 2),
        (&InflessRequests, 3),
    ] {
        assert_eq!(
            copies_one_gpu_takes(policy, &work),
            expected_per_gpu,
            "{}",
            policy.name()
        );
    }
}

#[test]
fn dilu_oversubscribes_limits_less_than_dilu_paper() {
    // Replicas with request 0.25 and limit 0.49: three on a GPU make
    // Σlimits 1.47, within dilu-paper's bound of 1.5 but not dilu's 1.35.
    let work = demand(WorkClass::Latency, 0.25, 0.49, 5, 1);
    let mut paper = ClusterState::uniform(1, 2, 80 * GIB);
    let mut ours = paper.clone();
    for _ in 0..4 {
        let placement = place(&DiluPaper, &paper, &work).unwrap();
        paper.apply(&work, &placement.gpus);
        let placement = place(&Complementary::default(), &ours, &work).unwrap();
        ours.apply(&work, &placement.gpus);
    }
    // Four replicas on two GPUs: dilu-paper stacks three on one, dilu two each.
    assert_eq!(paper.active_gpus(), 2);
    assert!(paper.gpus.iter().any(|gpu| gpu.instances() == 3));
    assert!(ours.gpus.iter().all(|gpu| gpu.instances() == 2));
    // The bound is soft: on one GPU dilu takes the third rather than leave
    // it waiting, as dilu-paper does, but no more than dilu-paper.
    assert_eq!(copies_one_gpu_takes(&Complementary::default(), &work), 3);
    let hard = Complementary {
        soft_limit_bound: None,
        ..Complementary::default()
    };
    assert_eq!(copies_one_gpu_takes(&hard, &work), 2);
    assert_eq!(copies_one_gpu_takes(&DiluPaper, &work), 3);
    // For a known workload (a real cluster's pods) it places every replica
    // whose request fits, as infless-r does, rather than leave the fourth
    // (Σlimits 1.96) waiting or dropped for its limit alone.
    let known = Complementary::for_workload(whole_and_fifth_gpu_mix());
    assert_eq!(copies_one_gpu_takes(&known, &work), 4);
    assert_eq!(copies_one_gpu_takes(&InflessRequests, &work), 4);
}

/// A workload of whole-GPU tasks needing 8 cores and fifth-of-a-GPU tasks
/// needing 1, in equal numbers.
fn whole_and_fifth_gpu_mix() -> Arc<WorkloadMix> {
    let task = |cpu_milli, share| TaskType {
        cpu_milli,
        share,
        gpus: 1,
        models: Vec::new(),
        weight: 0.5,
    };
    Arc::new(WorkloadMix {
        types: vec![task(8000, 1.0), task(1000, 0.2)],
    })
}

/// Node 0 (16 cores, 2 GPUs) runs a half-GPU pod on 4 cores; node 1 (64
/// cores, 2 GPUs) a 0.35-GPU pod on 4 cores; then `idle_nodes` nodes of 2
/// idle GPUs. A half-GPU pod on 6 cores fills GPU 0 exactly but leaves node
/// 0 too few cores for a whole-GPU task; on GPU 2 it leaves 0.15 free.
fn cores_against_fill(idle_nodes: usize) -> (ClusterState, InstanceDemand, PodNeeds) {
    let mut cluster = ClusterState::default();
    for cpu_milli in [16_000, 64_000] {
        cluster.add_host(
            2,
            80 * GIB,
            HostState {
                cpu_milli,
                cpu_used: 4000,
                memory_mib: 1 << 20,
                memory_used: 0,
                model: 0,
            },
        );
    }
    for _ in 0..idle_nodes {
        cluster.add_node(2, 80 * GIB);
    }
    cluster.apply(&demand(WorkClass::Batch, 0.5, 0.5, 1, 1), &[0]);
    cluster.apply(&demand(WorkClass::Batch, 0.35, 0.35, 1, 1), &[2]);
    let needs = PodNeeds {
        cpu_milli: 6000,
        ..PodNeeds::default()
    };
    (cluster, demand(WorkClass::Batch, 0.5, 0.5, 1, 1), needs)
}

#[test]
fn with_idle_gpus_plentiful_dilu_fills_a_gpu_where_fgd_spares_a_nodes_cores() {
    let mix = whole_and_fifth_gpu_mix();
    let (cluster, pod, needs) = cores_against_fill(30);
    let fgd = FragmentationGradient::new(mix.clone());
    let dilu = Complementary::for_workload(mix.clone());
    let node_wide = Complementary {
        fragmentation_scope: FragmentationScope::Node,
        ..Complementary::for_workload(mix.clone())
    };
    // FGD (and dilu with FGD's node-wide measure) spares node 0's cores for
    // whole-GPU tasks that 60 idle GPUs could run anyway; dilu fills GPU 0,
    // so that when the other pods end one GPU is in use, not two.
    assert_eq!(
        place_pod(&fgd, &cluster, &pod, &needs).unwrap().gpus,
        vec![2]
    );
    assert_eq!(
        place_pod(&node_wide, &cluster, &pod, &needs).unwrap().gpus,
        vec![2]
    );
    assert_eq!(
        place_pod(&dilu, &cluster, &pod, &needs).unwrap().gpus,
        vec![0]
    );
    // With no idle node to spare, half the GPUs are in use and dilu weighs
    // the node's cores as FGD does.
    let (scarce, pod, needs) = cores_against_fill(0);
    assert_eq!(
        place_pod(&dilu, &scarce, &pod, &needs).unwrap().gpus,
        vec![2]
    );
}

#[test]
fn dilu_pairs_bursty_latency_work_with_batch_work_where_dilu_paper_does_not() {
    let mut cluster = ClusterState::uniform(1, 2, 80 * GIB);
    // GPU 0 runs batch work with little limit headroom, GPU 1 latency work
    // with a lot; the next latency instance also bursts well above its request.
    cluster.apply(&demand(WorkClass::Batch, 0.45, 0.5, 30, 1), &[0]);
    cluster.apply(&demand(WorkClass::Latency, 0.5, 0.9, 40, 1), &[1]);
    let bursty = demand(WorkClass::Latency, 0.3, 0.55, 5, 1);
    let ours = place(&Complementary::default(), &cluster, &bursty).expect("fits");
    assert_eq!(ours.gpus, vec![0], "dilu pairs latency with batch work");
    let paper = place(&DiluPaper, &cluster, &bursty).expect("fits");
    assert_eq!(paper.gpus, vec![1], "dilu-paper fills the fuller GPU");
    // dilu's choice leaves less limit excess on the cluster.
    let excess_after = |gpu: usize| {
        let mut after = cluster.clone();
        after.apply(&bursty, &[gpu]);
        after.gpus.iter().map(GpuState::limit_excess).sum::<f64>()
    };
    assert!(excess_after(0) + 0.3 < excess_after(1));
}

#[test]
fn dilu_fits_each_instance_where_its_dominant_resource_binds() {
    let mut cluster = ClusterState::uniform(1, 3, 80 * GIB);
    // GPU 0 is memory-bound, GPU 1 SM-bound, GPU 2 idle.
    cluster.apply(&demand(WorkClass::Batch, 0.2, 0.3, 60, 1), &[0]);
    cluster.apply(&demand(WorkClass::Latency, 0.6, 0.6, 5, 1), &[1]);
    let policy = Complementary::default();
    let memory_heavy = demand(WorkClass::Batch, 0.1, 0.1, 15, 1);
    let placement = place(&policy, &cluster, &memory_heavy).expect("fits");
    assert_eq!(placement.gpus, vec![0], "memory-heavy work fills memory");
    let sm_heavy = demand(WorkClass::Latency, 0.3, 0.3, 5, 1);
    let placement = place(&policy, &cluster, &sm_heavy).expect("fits");
    assert_eq!(placement.gpus, vec![1], "SM-heavy work fills SM");
    // Nothing busy admits it (memory on GPU 0, SM on GPU 1): wake GPU 2.
    let big = demand(WorkClass::Latency, 0.5, 0.5, 30, 1);
    let placement = place(&policy, &cluster, &big).expect("fits");
    assert_eq!(placement.gpus, vec![2]);
}

#[test]
fn dilu_gangs_fill_busy_gpus_across_nodes_and_one_node_search_stays_local() {
    let mut cluster = ClusterState::uniform(2, 4, 80 * GIB);
    let filler = demand(WorkClass::Latency, 0.4, 0.5, 10, 1);
    // Two busy GPUs with room on each node; the rest idle.
    for gpu in [0, 1, 4, 5] {
        cluster.apply(&filler, &[gpu]);
    }
    let training = demand(WorkClass::Batch, 0.5, 0.6, 30, 3);
    let policy = Complementary::default();
    let placement = place(&policy, &cluster, &training).expect("fits");
    assert_eq!(placement.gpus.len(), 3);
    let woken = placement
        .gpus
        .iter()
        .filter(|&&gpu| !cluster.gpus[gpu].is_active())
        .count();
    assert_eq!(woken, 0, "three busy GPUs admit it: {:?}", placement.gpus);
    let local = place_on_one_node(&policy, &cluster, &training).expect("fits on a node");
    let node = cluster.gpus[local.gpus[0]].node;
    assert!(local.gpus.iter().all(|&gpu| cluster.gpus[gpu].node == node));
    assert_eq!(local.gpus.len(), 3);
}

#[test]
fn gang_larger_than_any_node_needs_a_spanning_policy() {
    let cluster = ClusterState::uniform(3, 2, 80 * GIB);
    let training = demand(WorkClass::Batch, 0.5, 0.5, 10, 3);
    assert!(place(&InflessRequests, &cluster, &training).is_none());
    for policy in [
        &Complementary::default() as &dyn PlacementPolicy,
        &DiluPaper,
    ] {
        assert!(
            place(policy, &cluster, &training).is_some(),
            "{}",
            policy.name()
        );
        assert!(place_on_one_node(policy, &cluster, &training).is_none());
    }
}

#[test]
fn dilu_stops_the_replica_that_empties_a_gpu_and_baselines_leave_the_choice() {
    let mut cluster = ClusterState::uniform(1, 3, 80 * GIB);
    let replica = demand(WorkClass::Latency, 0.3, 0.4, 8, 1);
    cluster.apply(&demand(WorkClass::Batch, 0.5, 0.6, 30, 1), &[0]);
    cluster.apply(&replica, &[0]);
    cluster.apply(&replica, &[1]);
    let on = |gpu: &'static [usize]| Replica {
        demand: &replica,
        gpus: gpu,
    };
    let replicas = [on(&[0]), on(&[1])];
    let policy = Complementary::default();
    assert_eq!(
        policy.choose_scale_in_victim(&cluster, &replicas),
        Some(1),
        "stopping the replica alone on GPU 1 leaves it idle"
    );
    // With a neighbour on GPU 1 too, stop where less load stays behind.
    cluster.apply(&demand(WorkClass::Latency, 0.1, 0.1, 4, 1), &[1]);
    assert_eq!(policy.choose_scale_in_victim(&cluster, &replicas), Some(1));
    cluster.apply(&demand(WorkClass::Latency, 0.5, 0.5, 4, 1), &[1]);
    assert_eq!(policy.choose_scale_in_victim(&cluster, &replicas), Some(0));
    for name in POLICY_NAMES.iter().filter(|&&name| name != "dilu") {
        let baseline = policy_by_name(name).expect("listed policy exists");
        assert_eq!(
            baseline.choose_scale_in_victim(&cluster, &replicas),
            None,
            "{name}"
        );
    }
}

/// A move of `share` off GPU `source` to any GPU of `within`.
fn move_off<'a>(
    share: &'a InstanceDemand,
    source: usize,
    keeps: &'a [usize],
    within: &'a [usize],
) -> MoveRequest<'a> {
    MoveRequest {
        share,
        source,
        keeps,
        within,
    }
}

#[test]
fn dilu_moves_a_lone_replica_only_where_little_limit_excess_follows() {
    let mut cluster = ClusterState::uniform(1, 4, 80 * GIB);
    let everywhere = [0, 1, 2, 3];
    let replica = demand(WorkClass::Latency, 0.3, 0.45, 8, 1);
    cluster.apply(&replica, &[0]); // the lone replica
    cluster.apply(&demand(WorkClass::Batch, 0.6, 0.8, 30, 1), &[1]); // Σlimits 1.25 with it
    cluster.apply(&demand(WorkClass::Batch, 0.5, 0.7, 30, 1), &[2]); // 1.15 with it
    let policy = Complementary::default();
    let off_gpu_0 = move_off(&replica, 0, &[], &everywhere);
    assert_eq!(
        policy.consolidation_target(&cluster, &off_gpu_0),
        Some(2),
        "GPU 1 would reach Σlimits 1.25 (> 1.2); GPU 3 is idle"
    );
    assert_eq!(
        policy.consolidation_target(&cluster, &move_off(&replica, 0, &[], &[0, 1, 3])),
        None,
        "GPU 2 is not among the GPUs the caller can use"
    );
    cluster.set_draining(2, 1);
    assert_eq!(
        policy.consolidation_target(&cluster, &off_gpu_0),
        None,
        "a draining GPU takes nothing"
    );
    cluster.set_draining(2, 0);
    cluster.apply(&replica, &[3]);
    // Two lone replicas: each may move to the other's GPU or to GPU 2, never
    // to its own.
    let off_gpu_3 = move_off(&replica, 3, &[], &everywhere);
    assert_ne!(policy.consolidation_target(&cluster, &off_gpu_3), Some(3));
    for name in POLICY_NAMES.iter().filter(|&&name| name != "dilu") {
        let baseline = policy_by_name(name).expect("listed policy exists");
        assert_eq!(
            baseline.consolidation_target(&cluster, &off_gpu_0),
            None,
            "{name}"
        );
    }
}

#[test]
fn dilu_moves_a_gang_share_off_its_own_gpus_within_a_tighter_cap() {
    let mut cluster = ClusterState::uniform(1, 4, 80 * GIB);
    let everywhere = [0, 1, 2, 3];
    // A two-GPU training job on GPUs 0 and 1; GPU 0 holds it alone.
    let gang = demand(WorkClass::Batch, 0.45, 0.5, 30, 2);
    cluster.apply(&gang, &[0, 1]);
    cluster.apply(&demand(WorkClass::Latency, 0.3, 0.4, 8, 1), &[1]);
    // GPU 2: Σlimits 1.15 with the share (over the 1.1 cap); GPU 3: 1.05.
    cluster.apply(&demand(WorkClass::Latency, 0.4, 0.65, 8, 1), &[2]);
    cluster.apply(&demand(WorkClass::Latency, 0.35, 0.55, 8, 1), &[3]);
    let policy = Complementary::default();
    assert_eq!(
        policy.consolidation_target(&cluster, &move_off(&gang, 0, &[0, 1], &everywhere)),
        Some(3),
        "GPU 2 would pass Σlimits 1.1 with it; GPU 1 is the job's own"
    );
    assert_eq!(
        policy.consolidation_target(&cluster, &move_off(&gang, 0, &[0, 1, 3], &everywhere)),
        None,
        "GPUs the gang keeps never take a second share"
    );
    // A replica with the same share may go where the gang may not: its cap is 1.2.
    let replica = InstanceDemand {
        gpus: 1,
        ..gang.clone()
    };
    assert_eq!(
        policy.consolidation_target(&cluster, &move_off(&replica, 0, &[], &[0, 2])),
        Some(2)
    );
}

/// A workload of half-GPU pods and nothing else.
fn half_gpu_mix() -> Arc<WorkloadMix> {
    Arc::new(WorkloadMix {
        types: vec![TaskType {
            cpu_milli: 0,
            share: 0.5,
            gpus: 1,
            models: Vec::new(),
            weight: 1.0,
        }],
    })
}

#[test]
fn dilus_price_on_limit_excess_fades_as_idle_gpus_run_out() {
    // Node 0: GPU 0 runs a half-GPU latency pod (limit 0.6), GPU 1 a batch
    // pod of 0.45 (limit 0.45). A half-GPU pod with limit 0.55 fills GPU 0
    // exactly (no fragment left) but adds 0.15 of limit excess there; on
    // GPU 1 it adds no excess but leaves 0.05 that no half-GPU task can use.
    let mix = half_gpu_mix();
    let build = |idle_nodes: usize| {
        let mut cluster = ClusterState::uniform(1 + idle_nodes, 2, 80 * GIB);
        cluster.apply(&demand(WorkClass::Latency, 0.5, 0.6, 1, 1), &[0]);
        cluster.apply(&demand(WorkClass::Batch, 0.45, 0.45, 1, 1), &[1]);
        cluster
    };
    let pod = demand(WorkClass::Latency, 0.5, 0.55, 1, 1);
    let dilu = Complementary::for_workload(mix.clone());
    // Idle GPUs plentiful (2 of 64 in use): the price on 0.15 of excess
    // (most of it left, far above the 0.05 of fragment) keeps the excess
    // off GPU 0.
    let plentiful = build(31);
    assert!(plentiful.busy_share() < 0.05);
    assert_eq!(place(&dilu, &plentiful, &pod).unwrap().gpus, vec![1]);
    // No idle GPU left: steering off GPU 0 would strand 0.05 that a later
    // pod needs, and the pod fills GPU 0 as FGD's measure says.
    let full = build(0);
    assert!((full.busy_share() - 1.0).abs() < 1e-12);
    assert_eq!(place(&dilu, &full, &pod).unwrap().gpus, vec![0]);
    // Idle GPUs count as run out from `scarcity_full` on: with a quarter of
    // the GPUs in use, a policy for which that is the point places as on
    // the full cluster; one for which it is the whole cluster still pays
    // most of the price.
    let quarter = build(3);
    assert!((quarter.busy_share() - 0.25).abs() < 1e-12);
    let early = Complementary {
        scarcity_full: 0.25,
        ..dilu.clone()
    };
    assert_eq!(place(&early, &quarter, &pod).unwrap().gpus, vec![0]);
    let late = Complementary {
        scarcity_full: 1.0,
        ..dilu.clone()
    };
    assert_eq!(place(&late, &quarter, &pod).unwrap().gpus, vec![1]);
    let fgd = FragmentationGradient::new(mix);
    assert_eq!(place(&fgd, &full, &pod).unwrap().gpus, vec![0]);
}

#[test]
fn dilus_wake_last_cost_fades_as_idle_gpus_run_out() {
    // GPU 0 runs a 0.4-GPU pod, GPU 1 is idle; the workload is half-GPU
    // pods. Another half-GPU pod on GPU 0 leaves 0.1 there that no such
    // pod can use; on GPU 1 it leaves a half that one can.
    let mix = half_gpu_mix();
    let build = |idle_nodes: usize| {
        let mut cluster = ClusterState::uniform(1 + idle_nodes, 2, 80 * GIB);
        cluster.apply(&demand(WorkClass::Batch, 0.4, 0.4, 1, 1), &[0]);
        cluster
    };
    let pod = demand(WorkClass::Batch, 0.5, 0.5, 1, 1);
    let dilu = Complementary::for_workload(mix.clone());
    let fgd = FragmentationGradient::new(mix);
    // Idle GPUs plentiful (1 of 64 in use): waking GPU 1 would cost
    // GPU-hours that the 0.1 left on GPU 0 does not, and dilu fills GPU 0.
    let plentiful = build(31);
    assert_eq!(place(&dilu, &plentiful, &pod).unwrap().gpus, vec![0]);
    // Idle GPUs run out (half of them in use): keeping GPU 1 idle buys no
    // GPU-hours, only the stranded 0.1, and dilu opens it as FGD does.
    let scarce = build(0);
    assert!(dilu.scarcity(&scarce) >= 1.0);
    assert_eq!(place(&dilu, &scarce, &pod).unwrap().gpus, vec![1]);
    assert_eq!(place(&fgd, &scarce, &pod).unwrap().gpus, vec![1]);
    // Without a known workload (the slack fit) the cost stays whole.
    let slack_fit = Complementary::default();
    assert_eq!(place(&slack_fit, &scarce, &pod).unwrap().gpus, vec![0]);
}

/// A small deterministic generator for the agreement test.
struct Lcg(u64);

/// A running pod: its demand, host needs and GPUs.
type Running = (InstanceDemand, PodNeeds, Vec<usize>);

/// Releases one of `running`, drawn at random, from `cluster`.
fn release_one(cluster: &mut ClusterState, running: &mut Vec<Running>, random: &mut Lcg) {
    let (pod, needs, gpus) = running.swap_remove(random.next(running.len() as u64) as usize);
    cluster.release(&pod, &gpus);
    cluster.release_host(cluster.gpus[gpus[0]].node, &needs);
}

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

#[test]
fn the_node_index_places_exactly_as_scanning_every_node() {
    // Nodes of three kinds (8 GPUs of model 0, 4 of model 1 with few
    // cores and half the memory, 2 of model 0), interleaved one by one and
    // in runs of four, filled by every policy with single pods and gangs
    // of a few sizes (so that busy nodes share states) and memory that
    // binds now and then, pods departing and GPUs draining now and then
    // (sums that went up and down); after each step both searches (and,
    // for policies with cost floors, the search by floors) must agree.
    let mut random = Lcg(7);
    let workload = Arc::new(WorkloadMix {
        types: vec![
            TaskType {
                cpu_milli: 4000,
                share: 0.5,
                gpus: 1,
                models: Vec::new(),
                weight: 0.7,
            },
            TaskType {
                cpu_milli: 16000,
                share: 1.0,
                gpus: 4,
                models: Vec::new(),
                weight: 0.3,
            },
        ],
    });
    for (name, run) in POLICY_NAMES
        .into_iter()
        .flat_map(|name| [(name, 1), (name, 4)])
    {
        // The workload known to the policy only, and to the cluster too
        // (whose grid then lets fragmentation-measuring policies stop early).
        let mixes = [
            (Arc::new(WorkloadMix::default()), false),
            (workload.clone(), false),
            (workload.clone(), true),
        ];
        for (mix, cluster_expects) in mixes {
            let policy = policy_for_workload(name, mix.clone()).unwrap();
            let mut cluster = ClusterState::default();
            for node in 0..24 {
                let (gpus, cpu, model, memory_gib) =
                    [(8, 96_000, 0, 80), (4, 8_000, 1, 40), (2, 32_000, 0, 80)][node / run % 3];
                let host = HostState {
                    cpu_milli: cpu,
                    cpu_used: 0,
                    memory_mib: 5 << 10,
                    memory_used: 0,
                    model,
                };
                cluster.add_host(gpus, memory_gib * GIB, host);
                if cluster_expects && node == 11 {
                    // Told halfway: the nodes so far are filed again.
                    cluster.expect_workload(mix.clone());
                }
            }
            let mut running: Vec<Running> = Vec::new();
            for _ in 0..120 {
                if !running.is_empty() && random.next(3) == 0 {
                    release_one(&mut cluster, &mut running, &mut random);
                }
                if random.next(10) == 0 {
                    let gpu = random.next(cluster.gpus.len() as u64) as usize;
                    let draining = if cluster.gpus[gpu].is_active() {
                        random.next(2) as u32
                    } else {
                        0
                    };
                    cluster.set_draining(gpu, draining);
                }
                let gpus = [1, 1, 1, 2, 4][random.next(5) as usize];
                let request = [0.25, 0.5, 1.0][random.next(3) as usize];
                let pod = demand(
                    WorkClass::Latency,
                    request,
                    (request * 1.4).min(1.0),
                    [8, 20, 30][random.next(3) as usize],
                    gpus,
                );
                let needs = PodNeeds {
                    cpu_milli: 4000 * random.next(3),
                    memory_mib: 1024 * random.next(3),
                    models: if random.next(4) == 0 {
                        vec![1]
                    } else {
                        Vec::new()
                    },
                    one_node: random.next(2) == 0,
                };
                let indexed = place_pod(policy.as_ref(), &cluster, &pod, &needs);
                let scanned =
                    place_pod_scanning_every_node(policy.as_ref(), &cluster, &pod, &needs);
                assert_eq!(indexed, scanned, "{name}: {pod:?} {needs:?}");
                if let Some(placement) = indexed {
                    cluster.apply(&pod, &placement.gpus);
                    cluster.apply_host(cluster.gpus[placement.gpus[0]].node, &needs);
                    running.push((pod, needs, placement.gpus));
                }
            }
            // Policies that fingerprint their costs answered from standing
            // indexes (this crate's tests build one after any search that
            // scored a class): the agreement above covered them.
            let fingerprints = policy.cost_context(&cluster).is_some();
            assert_eq!(cluster.standing_indexes() > 0, fingerprints, "{name}");
        }
    }
}

#[test]
fn a_pod_without_gpus_takes_cores_where_they_strand_the_least_gpu() {
    // Nodes 0 and 1: 16 cores and 2 GPUs, node 1's both taken; node 2: 64
    // cores and 2 idle GPUs. A pod without GPUs on 12 cores would leave
    // node 0 too few for a whole-GPU task: it goes to node 1 (nothing to
    // strand there), under FGD's measure too (node 2 also loses nothing,
    // and ties go to the lower node).
    let mut cluster = ClusterState::default();
    for cpu_milli in [16_000, 16_000, 64_000] {
        cluster.add_host(
            2,
            80 * GIB,
            HostState {
                cpu_milli,
                cpu_used: 0,
                memory_mib: 1 << 20,
                memory_used: 0,
                model: 0,
            },
        );
    }
    let whole = demand(WorkClass::Batch, 1.0, 1.0, 1, 1);
    cluster.apply(&whole, &[2]);
    cluster.apply(&whole, &[3]);
    let needs = PodNeeds {
        cpu_milli: 12_000,
        memory_mib: 1024,
        ..PodNeeds::default()
    };
    let mix = whole_and_fifth_gpu_mix();
    let mut policies = every_policy();
    policies.push(Box::new(FragmentationGradient::new(mix.clone())));
    policies.push(Box::new(Complementary::for_workload(mix.clone())));
    let every_policy_chooses = |cluster: &ClusterState, node: usize| {
        for policy in &policies {
            assert_eq!(
                place_host_only(policy.as_ref(), cluster, &needs),
                Some(node),
                "{}",
                policy.name()
            );
        }
    };
    every_policy_chooses(&cluster, 1);
    let fgd = FragmentationGradient::new(mix);
    assert_eq!(fgd.host_only_increase(&cluster, 1, &needs), Some(0.0));
    let on_node_0 = fgd.host_only_increase(&cluster, 0, &needs).unwrap();
    assert!(
        on_node_0 > 0.0,
        "node 0's idle GPUs become fragments: {on_node_0}"
    );
    // Once node 1 has too few cores left, node 2 (not node 0) takes the next.
    cluster.apply_host(1, &needs);
    every_policy_chooses(&cluster, 2);
    let too_big = PodNeeds {
        cpu_milli: 100_000,
        ..PodNeeds::default()
    };
    assert_eq!(place_host_only(&fgd, &cluster, &too_big), None);
}

#[test]
fn standing_indexes_place_as_the_scan_while_pods_come_go_and_gpus_drain() {
    // A few pod shapes over and over (as a real pod list has), so that
    // each shape's standing index is replayed through many changes: pods
    // placed and released, host memory that decides which twin fits, GPUs
    // draining. Every placement must be the scan's, and the indexes must
    // have answered most searches.
    let mut random = Lcg(11);
    let mix = whole_and_fifth_gpu_mix();
    let policies: Vec<Box<dyn PlacementPolicy>> = vec![
        Box::new(Complementary::for_workload(mix.clone())),
        Box::new(FragmentationGradient::new(mix.clone())),
        Box::new(Complementary::default()),
    ];
    let shapes = [(0.2, 0, 0), (0.2, 4000, 3), (0.5, 8000, 1), (1.0, 12000, 2)];
    for policy in policies {
        let mut cluster = nodes_of_three_kinds(30, policy.as_ref());
        let mut running: Vec<Running> = Vec::new();
        for step in 0..600 {
            if !running.is_empty() && random.next(5) < 2 {
                release_one(&mut cluster, &mut running, &mut random);
            }
            if random.next(15) == 0 {
                let gpu = random.next(cluster.gpus.len() as u64) as usize;
                let draining = u32::from(cluster.gpus[gpu].is_active()) * random.next(2) as u32;
                cluster.set_draining(gpu, draining);
            }
            let (request, cpu_milli, memory_gib) = shapes[random.next(4) as usize];
            let pod = demand(WorkClass::Latency, request, request * 1.2, 10, 1);
            let needs = PodNeeds {
                cpu_milli,
                memory_mib: memory_gib << 10,
                ..PodNeeds::default()
            };
            let indexed = place_pod(policy.as_ref(), &cluster, &pod, &needs);
            let scanned = place_pod_scanning_every_node(policy.as_ref(), &cluster, &pod, &needs);
            assert_eq!(indexed, scanned, "{} step {step}", policy.name());
            if let Some(placement) = indexed {
                cluster.apply(&pod, &placement.gpus);
                cluster.apply_host(cluster.gpus[placement.gpus[0]].node, &needs);
                running.push((pod, needs, placement.gpus));
            }
        }
        let (answered, searches) = cluster.standing_answers();
        assert!(
            searches >= 600 && answered * 2 >= searches,
            "{}: indexes stood for {answered} of {searches} searches",
            policy.name()
        );
    }
}

#[test]
fn standing_indexes_place_as_the_scan_while_idle_gpus_grow_scarce() {
    // `dilu`'s costs move with how scarce idle GPUs are, which changes
    // whenever a GPU opens or goes idle; the indexes keep that figure out
    // of their context and score again only the classes that may compete
    // at today's. With a tenth of the GPUs in use, hovering (pods placed
    // and released, limits above requests so that the price on excess
    // moves too), every placement must be the scan's, the indexes must
    // answer nearly every search (with the scarcity in the context, as
    // before, they answered 705 of these 800), and the scarcity must have
    // taken many values.
    // `dilu-power` forwards the drift (its price on watts reads none).
    let dilu = || Box::new(Complementary::for_workload(whole_and_fifth_gpu_mix()));
    let policies: [Box<dyn PlacementPolicy>; 2] = [
        dilu(),
        Box::new(power::PowerAware::new(dilu(), power::POWER_WEIGHT)),
    ];
    for policy in &policies {
        scarcity_drifts_as_the_scan_decides(policy.as_ref());
    }
}

/// [`standing_indexes_place_as_the_scan_while_idle_gpus_grow_scarce`] for
/// one policy built on `dilu`'s.
fn scarcity_drifts_as_the_scan_decides(policy: &dyn PlacementPolicy) {
    let mut random = Lcg(5);
    let scarcity = Complementary::for_workload(whole_and_fifth_gpu_mix());
    let mut cluster = nodes_of_three_kinds(60, policy);
    let shapes = [
        (0.2, 1000, 0),
        (0.3, 4000, 1),
        (0.5, 8000, 2),
        (1.0, 8000, 1),
    ];
    let mut running: Vec<Running> = Vec::new();
    let mut scarcities = Vec::new();
    for step in 0..800 {
        if !running.is_empty() && (cluster.busy_share() > 0.1 || random.next(4) == 0) {
            release_one(&mut cluster, &mut running, &mut random);
        }
        let (request, cpu_milli, memory_gib) = shapes[random.next(4) as usize];
        let pod = demand(WorkClass::Latency, request, (request * 1.3).min(1.0), 10, 1);
        let needs = PodNeeds {
            cpu_milli,
            memory_mib: memory_gib << 10,
            ..PodNeeds::default()
        };
        let indexed = place_pod(policy, &cluster, &pod, &needs);
        let scanned = place_pod_scanning_every_node(policy, &cluster, &pod, &needs);
        assert_eq!(indexed, scanned, "{} step {step}", policy.name());
        scarcities.push(scarcity.scarcity(&cluster).to_bits());
        if let Some(placement) = indexed {
            cluster.apply(&pod, &placement.gpus);
            cluster.apply_host(cluster.gpus[placement.gpus[0]].node, &needs);
            running.push((pod, needs, placement.gpus));
        }
    }
    let (answered, searches) = cluster.standing_answers();
    assert!(
        answered * 100 >= searches * 97,
        "{}: indexes answered {answered} of {searches} searches",
        policy.name()
    );
    let hovered = scarcities
        .iter()
        .filter(|&&bits| {
            let scarcity = f64::from_bits(bits);
            scarcity > 0.0 && scarcity < 1.0
        })
        .count();
    scarcities.sort_unstable();
    scarcities.dedup();
    assert!(
        hovered >= 700 && scarcities.len() >= 20,
        "scarcity took {} values",
        scarcities.len()
    );
}

/// `count` nodes of 8, 4 and 2 GPUs in turn (96, 24 and 32 cores; 6 GiB of
/// host memory, which binds now and then), told `policy`'s workload.
fn nodes_of_three_kinds(count: usize, policy: &dyn PlacementPolicy) -> ClusterState {
    let mut cluster = ClusterState::default();
    for node in 0..count {
        let (gpus, cpu_milli) = [(8, 96_000), (4, 24_000), (2, 32_000)][node % 3];
        let host = HostState {
            cpu_milli,
            cpu_used: 0,
            memory_mib: 6 << 10,
            memory_used: 0,
            model: 0,
        };
        cluster.add_host(gpus, 80 * GIB, host);
    }
    tell_cluster_the_workload(policy, &mut cluster);
    cluster
}
