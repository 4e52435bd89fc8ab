//! The indexed search (`place_pod`, which scores one node of each class of
//! identical nodes) decides exactly as the scan of every node on Alibaba's
//! openb nodes and pods, with pods arriving and departing, at every step.

use std::path::PathBuf;
use std::sync::Arc;

use dilu_cluster::model::{ClusterState, InstanceDemand, PodNeeds};
use dilu_cluster::policy::{place_pod, place_pod_scanning_every_node, policy_for_workload};
use dilu_cluster::rng::SeededRng;
use dilu_cluster::simulator::ClusterShape;
use dilu_cluster::simulator::inflation;
use dilu_cluster::simulator::openb::{self, LimitRule};

const GIB: u64 = 1 << 30;

fn openb_file(name: &str) -> std::io::BufReader<std::fs::File> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../bench/data/alibaba-openb")
        .join(name);
    std::io::BufReader::new(std::fs::File::open(&path).expect("openb data in bench/data"))
}

#[test]
fn indexed_search_matches_the_scan_on_openb_with_departures() {
    let nodes = openb::read_nodes(openb_file("openb_node_list_gpu_node.csv"), 80 * GIB).unwrap();
    let pods = openb::read_pods(
        openb_file("openb_pod_list_default.csv"),
        LimitRule::default(),
        80 * GIB,
    )
    .unwrap()
    .records;
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
        let mut running: Vec<(InstanceDemand, PodNeeds, Vec<usize>)> = Vec::new();
        let mut random = SeededRng::new(3);
        let (mut placed, mut refused, mut departed) = (0, 0, 0);
        let mut requested = 0.0;
        for (step, pod) in drawn.iter().enumerate() {
            // Fill towards 90% of the capacity requested, then hover there:
            // a departure before an arrival when above it, now and then below.
            let goal = 0.9 * shape.gpus() as f64;
            let depart = !running.is_empty() && (requested > goal || random.below(4) == 0);
            if depart {
                let (demand, needs, gpus) =
                    running.swap_remove(random.below(running.len() as u64) as usize);
                cluster.release(&demand, &gpus);
                cluster.release_host(cluster.gpus[gpus[0]].node, &needs);
                requested -= demand.sm_request * f64::from(demand.gpus.max(1));
                departed += 1;
            }
            let demand = pod.demand();
            let mut needs = pod.needs(&cluster);
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
                    requested += demand.sm_request * f64::from(demand.gpus.max(1));
                    running.push((demand, needs, placement.gpus));
                    placed += 1;
                }
                None => refused += 1,
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
            cluster.node_classes() < cluster.nodes.len(),
            "{name}: every node in a state of its own"
        );
    }
}
