//! A seeded generator of heterogeneous clusters and of pods that can strand
//! GPUs: the tuning harness's second trace family (see `tuning`), so that
//! the choice of `dilu`'s settings sees what real clusters do and the
//! built-in generator's nodes cannot: a pod that leaves a node too few
//! cores or too little memory strands that node's idle GPUs, pods that
//! need a GPU model, and nodes of different sizes.
//!
//! The shape follows what public descriptions of production GPU clusters
//! say, not any one trace's numbers: FGD's paper (ATC '23) describes
//! Alibaba's GPU-sharing cluster as thousands of GPUs of several models on
//! multi-GPU nodes, most pods asking for a fraction of one GPU, some for a
//! GPU model, and a node's idle GPUs made unusable by the CPU its pods
//! take (its fragmentation measure counts them). As general facts, GPU
//! servers come with 1, 2, 4 or 8 GPUs, and common ones pair 8
//! training-class GPUs with 64–128 cores and 4 or fewer inference-class
//! GPUs with 16–64. The parameters below are ours,
//! round numbers chosen for those shapes; none is fitted to Alibaba's openb
//! node or pod list, which stays held out.
//!
//! **Nodes** (`NODE_TYPES`): six types, 1, 2, 4 or 8 GPUs of three models
//! ("large" 80 GB, "medium" 48 GB, "small" 16 GB). Half of the types give
//! 8 cores per GPU (CPU-short: a few CPU-heavy pods can leave the rest of
//! the node's GPUs without cores), the others 16; about 12 cores per GPU
//! over the cluster, against about 10 per whole GPU requested, so CPU
//! binds on some nodes, not on the cluster as a whole. Each seed
//! scales every type's share of GPUs by a factor in [0.7, 1.3] and shuffles
//! the node order.
//!
//! **Pods**: the built-in generator's trace (same function mix, arrivals
//! and durations, see `trace`), each function given host needs drawn once
//! per function, so that all replicas of a function ask the same: cores in
//! proportion to its GPU share (`cores_per_gpu` per whole GPU: 4–24 for
//! small inference, which pre- and post-processes on the CPU, 4–12 for LLM
//! inference and training), host memory likewise (8–64 GiB per whole GPU).
//! A quarter of the functions name one GPU model they must run on
//! (among the models whose memory fits them); training gangs keep all
//! their GPUs on one node.

use super::trace::{ArrivalPattern, PodSpec, TraceRecord, TraceSpec, generate as generate_pods};
use super::{ClusterShape, NodeSpec};
use crate::model::WorkClass;
use crate::rng::SeededRng;

const GIB: u64 = 1 << 30;

/// One node type: GPUs, model, GPU memory, cores, host memory, and its
/// share of the cluster's GPUs before the seed's jitter.
struct NodeType {
    gpus: usize,
    model: &'static str,
    gpu_memory_gib: u64,
    cores: u64,
    memory_gib: u64,
    gpu_share: f64,
}

/// The node types (see the module docs): cores per GPU 16, 8, 16, 8, 8, 16.
const NODE_TYPES: [NodeType; 6] = [
    NodeType {
        gpus: 8,
        model: "large",
        gpu_memory_gib: 80,
        cores: 128,
        memory_gib: 1024,
        gpu_share: 0.30,
    },
    NodeType {
        gpus: 8,
        model: "large",
        gpu_memory_gib: 80,
        cores: 64,
        memory_gib: 512,
        gpu_share: 0.20,
    },
    NodeType {
        gpus: 4,
        model: "medium",
        gpu_memory_gib: 48,
        cores: 64,
        memory_gib: 384,
        gpu_share: 0.20,
    },
    NodeType {
        gpus: 2,
        model: "medium",
        gpu_memory_gib: 48,
        cores: 16,
        memory_gib: 128,
        gpu_share: 0.10,
    },
    NodeType {
        gpus: 4,
        model: "small",
        gpu_memory_gib: 16,
        cores: 32,
        memory_gib: 256,
        gpu_share: 0.15,
    },
    NodeType {
        gpus: 1,
        model: "small",
        gpu_memory_gib: 16,
        cores: 16,
        memory_gib: 64,
        gpu_share: 0.05,
    },
];

/// Seeds the node list apart from the pods, so that the same seed's
/// cluster does not depend on how many pods are drawn.
const CLUSTER_SEED_SALT: u64 = 0x5eed_c1a5;
/// Seeds the functions' host needs apart from the trace itself.
const NEEDS_SEED_SALT: u64 = 0x5eed_0b0d;

/// A cluster of about `gpus` GPUs (at least one node of each type); the
/// same `(gpus, seed)` always yields the same cluster.
pub fn cluster(gpus: usize, seed: u64) -> ClusterShape {
    let mut rng = SeededRng::new(seed ^ CLUSTER_SEED_SALT);
    let weights: Vec<f64> = NODE_TYPES
        .iter()
        .map(|kind| kind.gpu_share * rng.between(0.7, 1.3))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut nodes = Vec::new();
    for (kind, weight) in NODE_TYPES.iter().zip(&weights) {
        let count = ((weight / total * gpus as f64) / kind.gpus as f64)
            .round()
            .max(1.0) as usize;
        nodes.extend((0..count).map(|_| NodeSpec {
            gpus: kind.gpus,
            gpu_memory: kind.gpu_memory_gib * GIB,
            cpu_milli: kind.cores * 1000,
            memory_mib: kind.memory_gib * 1024,
            model: kind.model.into(),
        }));
    }
    // Fisher–Yates: node order decides ties between equal nodes.
    for index in (1..nodes.len()).rev() {
        let other = rng.below(index as u64 + 1) as usize;
        nodes.swap(index, other);
    }
    ClusterShape { nodes }
}

/// A function's host needs, drawn once per function (module docs).
fn function_needs(record: &TraceRecord, rng: &mut SeededRng) -> PodSpec {
    // Small inference pre- and post-processes on the CPU: up to twice the
    // cores per GPU of LLM inference and training.
    let small_inference = record.class == WorkClass::Latency && !record.function.starts_with("llm");
    let (cores_low, cores_high) = if small_inference {
        (4.0, 24.0)
    } else {
        (4.0, 12.0)
    };
    let cores_per_gpu = rng.between(cores_low, cores_high);
    let memory_gib_per_gpu = rng.between(8.0, 64.0);
    // A training job's share is drawn per job; its pod spec is the
    // function's, sized for the middle of its range (0.6).
    let share = match record.class {
        WorkClass::Batch => 0.6,
        WorkClass::Latency => record.sm_request,
    };
    let gpus = share * f64::from(record.gpus.max(1));
    let fitting: Vec<&NodeType> = NODE_TYPES
        .iter()
        .filter(|kind| kind.gpu_memory_gib * GIB >= max_memory_bytes(record))
        .collect();
    let gpu_models = if rng.unit() < 0.25 && !fitting.is_empty() {
        let kind = fitting[rng.below(fitting.len() as u64) as usize];
        vec![kind.model.to_string()]
    } else {
        Vec::new()
    };
    PodSpec {
        cpu_milli: ((gpus * cores_per_gpu).ceil().max(1.0) as u64) * 1000,
        host_memory_mib: ((gpus * memory_gib_per_gpu).ceil().max(1.0) as u64) * 1024,
        gpu_models,
        one_node: true,
    }
}

/// The most GPU memory any instance of the record's function may ask
/// (training draws per job, up to 40 GB; see `trace`).
fn max_memory_bytes(record: &TraceRecord) -> u64 {
    match record.class {
        WorkClass::Batch => 40_000_000_000,
        WorkClass::Latency => record.memory_bytes,
    }
}

/// A trace of `instances` pods for a cluster of `cluster_gpus` GPUs: the
/// built-in generator's, with host needs per function (module docs). The
/// same arguments always yield the same trace.
pub fn generate(
    instances: usize,
    cluster_gpus: usize,
    arrival: ArrivalPattern,
    seed: u64,
) -> Vec<TraceRecord> {
    let mut trace = generate_pods(&TraceSpec {
        instances,
        cluster_gpus,
        arrival,
        seed,
    });
    let mut functions: Vec<&str> = trace.iter().map(|r| r.function.as_str()).collect();
    functions.sort_unstable();
    functions.dedup();
    let mut rng = SeededRng::new(seed ^ NEEDS_SEED_SALT);
    let needs: Vec<(String, PodSpec)> = functions
        .iter()
        .map(|name| {
            let first = trace
                .iter()
                .find(|record| record.function == *name)
                .expect("a listed function has a record");
            (name.to_string(), function_needs(first, &mut rng))
        })
        .collect();
    for record in &mut trace {
        if let Some((_, spec)) = needs.iter().find(|(name, _)| *name == record.function) {
            record.pod = spec.clone();
        }
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{InflessRequests, place_pod};

    #[test]
    fn same_seed_same_cluster_and_trace_different_seed_different() {
        let first = (
            cluster(1000, 7),
            generate(500, 1000, ArrivalPattern::Bursty, 7),
        );
        let again = (
            cluster(1000, 7),
            generate(500, 1000, ArrivalPattern::Bursty, 7),
        );
        assert_eq!(first, again);
        assert_ne!(first.0, cluster(1000, 8));
        assert_ne!(first.1, generate(500, 1000, ArrivalPattern::Bursty, 8));
    }

    #[test]
    fn clusters_mix_node_sizes_models_and_cpu_short_nodes() {
        let shape = cluster(1000, 3);
        let gpus = shape.gpus();
        assert!((900..=1100).contains(&gpus), "{gpus} GPUs");
        for size in [1, 2, 4, 8] {
            assert!(shape.nodes.iter().any(|node| node.gpus == size), "{size}");
        }
        for model in ["large", "medium", "small"] {
            assert!(
                shape.nodes.iter().any(|node| node.model == model),
                "{model}"
            );
        }
        let cpu_short = shape
            .nodes
            .iter()
            .filter(|node| node.cpu_milli / node.gpus as u64 <= 8000)
            .count();
        assert!(cpu_short > 0 && cpu_short < shape.nodes.len());
    }

    #[test]
    fn pods_ask_host_resources_models_and_one_node_gangs() {
        let trace = generate(2000, 1000, ArrivalPattern::Poisson, 5);
        assert!(trace.iter().all(|r| r.pod.cpu_milli >= 1000));
        assert!(trace.iter().all(|r| r.pod.one_node));
        let constrained = trace.iter().filter(|r| !r.pod.gpu_models.is_empty());
        assert!(constrained.count() > 0);
        // Replicas of one function ask the same of their node.
        for record in &trace {
            let other = trace
                .iter()
                .find(|r| r.function == record.function)
                .expect("itself");
            assert_eq!(record.pod, other.pod);
        }
        // Some pods ask many cores per GPU share: they can strand GPUs.
        assert!(
            trace.iter().any(|r| {
                r.pod.cpu_milli as f64 / (r.sm_request * f64::from(r.gpus)) > 16_000.0
            })
        );
    }

    #[test]
    fn a_cpu_heavy_pod_strands_the_idle_gpus_of_a_cpu_short_node() {
        // A CPU-short node (4 small GPUs, 32 cores) and a one-GPU node.
        let shape = ClusterShape {
            nodes: vec![
                NodeSpec {
                    gpus: 4,
                    gpu_memory: 16 * GIB,
                    cpu_milli: 32_000,
                    memory_mib: 256 * 1024,
                    model: "small".into(),
                },
                NodeSpec {
                    gpus: 1,
                    gpu_memory: 16 * GIB,
                    cpu_milli: 6_000,
                    memory_mib: 64 * 1024,
                    model: "small".into(),
                },
            ],
        };
        let mut state = shape.build();
        let pod = |cores: u64| {
            let mut record = generate(1, 8, ArrivalPattern::Poisson, 1).remove(0);
            record.sm_request = 0.3;
            record.sm_limit = 0.3;
            record.memory_bytes = GIB;
            record.gpus = 1;
            record.pod = PodSpec {
                cpu_milli: cores * 1000,
                host_memory_mib: 1024,
                gpu_models: Vec::new(),
                one_node: true,
            };
            record
        };
        // A 0.3-GPU pod asking 30 cores takes node 0 (the only node with
        // 30 cores) and leaves it 2 cores and 3.7 idle GPUs.
        let heavy = pod(30);
        let placement = place_pod(
            &InflessRequests,
            &state,
            &heavy.demand(),
            &heavy.needs(&state),
        )
        .expect("node 0 has the cores");
        assert_eq!(state.gpus[placement.gpus[0]].node, 0);
        state.apply(&heavy.demand(), &placement.gpus);
        state.apply_host(0, &heavy.needs(&state));
        // A 4-core pod fits node 0's idle GPUs but not its cores: it goes
        // to node 1, and a second one finds no node at all, though node 0
        // has three idle GPUs.
        let light = pod(4);
        let placement = place_pod(
            &InflessRequests,
            &state,
            &light.demand(),
            &light.needs(&state),
        )
        .expect("node 1 has the cores");
        assert_eq!(state.gpus[placement.gpus[0]].node, 1);
        state.apply(&light.demand(), &placement.gpus);
        state.apply_host(1, &light.needs(&state));
        let idle_on_node_0 = state
            .gpus
            .iter()
            .filter(|gpu| gpu.node == 0 && !gpu.is_active())
            .count();
        assert_eq!(idle_on_node_0, 3);
        assert!(
            place_pod(
                &InflessRequests,
                &state,
                &light.demand(),
                &light.needs(&state)
            )
            .is_none(),
            "the idle GPUs of node 0 are stranded by its cores"
        );
    }
}
