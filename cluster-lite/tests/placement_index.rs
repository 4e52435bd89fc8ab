//! The indexed search (`place_pod`, which scores one node of each class of
//! identical nodes) decides exactly as the scan of every node on Alibaba's
//! openb nodes and pods, with pods arriving and departing, at every step
//! (the list's pods without GPUs take cores on the node their policy
//! chooses, so GPU pods meet nodes short of cores).

use std::path::PathBuf;
use std::sync::Arc;

use dilu_cluster::model::{ClusterState, InstanceDemand, PodNeeds};
use dilu_cluster::policy::{
    place_host_only, place_pod, place_pod_scanning_every_node, policy_for_workload,
};
use dilu_cluster::rng::SeededRng;
use dilu_cluster::simulator::inflation;
use dilu_cluster::simulator::openb::{self, LimitRule};
use dilu_cluster::simulator::trace::TraceRecord;
use dilu_cluster::simulator::{ClusterShape, NodeSpec};

const GIB: u64 = 1 << 30;

fn openb_file(name: &str) -> std::io::BufReader<std::fs::File> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../bench/data/alibaba-openb")
        .join(name);
    std::io::BufReader::new(std::fs::File::open(&path).expect("openb data in bench/data"))
}

/// openb's GPU nodes and its default pod list.
fn openb_nodes_and_pods() -> (Vec<NodeSpec>, Vec<TraceRecord>) {
    let nodes = openb::read_nodes(openb_file("openb_node_list_gpu_node.csv"), 80 * GIB).unwrap();
    let pods = openb::read_pods(
        openb_file("openb_pod_list_default.csv"),
        LimitRule::default(),
        80 * GIB,
    )
    .unwrap()
    .records;
    (nodes, pods)
}

#[test]
fn indexed_search_matches_the_scan_on_openb_with_departures() {
    let (nodes, pods) = openb_nodes_and_pods();
    let shape = ClusterShape::tiled(&nodes, 400);
    let drawn = inflation::inflate(&pods, shape.gpus(), 3.0, 11);
    let mix = Arc::new(inflation::workload_mix(&drawn, &shape));
    for name in ["dilu", "fgd"] {
        // Separate policies, so neither search gets the other's memo.
        let indexed_policy = policy_for_workload(name, mix.clone()).unwrap();
        let scan_policy = policy_for_workload(name, mix.clone()).unwrap();
        let mut cluster: ClusterState = shape.build();
        // The cluster knows the workload too: the indexed search then
        // stops early by the fragmentation's floors.
        cluster.expect_workload(mix.clone());
        // Each running pod: its demand, needs, GPUs and node.
        let mut running: Vec<(InstanceDemand, PodNeeds, Vec<usize>, usize)> = Vec::new();
        let mut random = SeededRng::new(3);
        let (mut placed, mut refused, mut departed, mut without_gpus) = (0, 0, 0, 0);
        let mut requested = 0.0;
        // Whether nodes shared classes while the cluster was full (so the
        // index, not only a scan of classes of one, was compared).
        let mut shared_at_the_full_point = false;
        for (step, pod) in drawn.iter().enumerate() {
            // Fill towards 90% of the capacity requested, then hover there:
            // a departure before an arrival when above it, now and then below.
            let goal = 0.9 * shape.gpus() as f64;
            let depart = !running.is_empty() && (requested > goal || random.below(4) == 0);
            if depart {
                let (demand, needs, gpus, node) =
                    running.swap_remove(random.below(running.len() as u64) as usize);
                cluster.release(&demand, &gpus);
                cluster.release_host(node, &needs);
                requested -= demand.sm_request * f64::from(demand.gpus);
                departed += 1;
            }
            let demand = pod.demand();
            let mut needs = pod.needs(&cluster);
            if !pod.takes_gpus() {
                if let Some(node) = place_host_only(indexed_policy.as_ref(), &cluster, &needs) {
                    cluster.apply_host(node, &needs);
                    running.push((demand, needs, Vec::new(), node));
                    without_gpus += 1;
                }
                continue;
            }
            // Some gangs may span nodes, to exercise that search too.
            if demand.gpus > 1 && random.below(3) == 0 {
                needs.one_node = false;
            }
            let indexed = place_pod(indexed_policy.as_ref(), &cluster, &demand, &needs);
            let scanned =
                place_pod_scanning_every_node(scan_policy.as_ref(), &cluster, &demand, &needs);
            assert_eq!(
                indexed, scanned,
                "{name}, step {step}: {demand:?} {needs:?}"
            );
            match indexed {
                Some(placement) => {
                    cluster.apply(&demand, &placement.gpus);
                    let node = cluster.gpus[placement.gpus[0]].node;
                    cluster.apply_host(node, &needs);
                    requested += demand.sm_request * f64::from(demand.gpus);
                    running.push((demand, needs, placement.gpus, node));
                    placed += 1;
                }
                None => refused += 1,
            }
            if requested > goal && !shared_at_the_full_point {
                shared_at_the_full_point = cluster.node_classes() < cluster.nodes.len();
            }
            if step == 2_500 {
                break;
            }
        }
        // The sequence went through a full cluster and back: many pods
        // placed and departed, some refused, and nodes in shared states.
        assert!(
            placed > 1_000 && departed > 500,
            "{name}: {placed} placed, {departed} departed"
        );
        assert!(refused > 0, "{name}: the cluster never filled");
        assert!(
            without_gpus > 100,
            "{name}: {without_gpus} pods without GPUs"
        );
        assert!(
            shared_at_the_full_point,
            "{name}: every node in a state of its own once the cluster was full"
        );
    }
}

#[test]
fn standing_indexes_decide_as_the_scan_on_a_busy_openb_cluster() {
    // Enough openb nodes (10,000 GPUs) for several hundred classes, so that
    // the searches the floors cannot cut short build standing indexes at
    // their default threshold (most searches here are cut short, so only
    // some are answered by an index); once half the capacity is requested,
    // a stream of arrivals and departures, each decision compared with the
    // scan of every node.
    let (nodes, pods) = openb_nodes_and_pods();
    let shape = ClusterShape::tiled(&nodes, 10_000);
    let drawn: Vec<_> = inflation::inflate(&pods, shape.gpus(), 1.0, 5)
        .into_iter()
        .filter(|pod| pod.takes_gpus())
        .collect();
    let mix = Arc::new(inflation::workload_mix(&drawn, &shape));
    let policy = policy_for_workload("dilu", mix.clone()).unwrap();
    let mut cluster: ClusterState = shape.build();
    cluster.expect_workload(mix);
    let mut running: Vec<(InstanceDemand, PodNeeds, Vec<usize>)> = Vec::new();
    let mut random = SeededRng::new(9);
    let (mut requested, mut compared) = (0.0, 0);
    for pod in &drawn {
        let busy = requested > 0.5 * shape.gpus() as f64;
        if busy && random.below(2) == 0 {
            let (demand, needs, gpus) =
                running.swap_remove(random.below(running.len() as u64) as usize);
            cluster.release(&demand, &gpus);
            cluster.release_host(cluster.gpus[gpus[0]].node, &needs);
            requested -= demand.sm_request * f64::from(demand.gpus);
        }
        let (demand, needs) = (pod.demand(), pod.needs(&cluster));
        let placed = place_pod(policy.as_ref(), &cluster, &demand, &needs);
        if busy {
            let scanned = place_pod_scanning_every_node(policy.as_ref(), &cluster, &demand, &needs);
            assert_eq!(placed, scanned, "{demand:?} {needs:?}");
            compared += 1;
        }
        if let Some(placement) = placed {
            cluster.apply(&demand, &placement.gpus);
            cluster.apply_host(cluster.gpus[placement.gpus[0]].node, &needs);
            requested += demand.sm_request * f64::from(demand.gpus);
            running.push((demand, needs, placement.gpus));
        }
        if compared == 600 {
            break;
        }
    }
    let (answered, asked) = cluster.standing_answers();
    assert!(
        compared == 600 && cluster.node_classes() >= 256,
        "{compared} compared, {} classes",
        cluster.node_classes()
    );
    assert!(
        answered >= 20 && cluster.standing_indexes() > 0,
        "indexes answered {answered} of {asked} searches"
    );
}
