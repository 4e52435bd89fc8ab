//! What a cluster draws, in watts, by the model of PWR ("Power- and
//! Fragmentation-aware Online Scheduling for GPU Datacenters", Lettich et
//! al., CCGrid'25), so that placements can be compared on power as that
//! paper compares them on Alibaba's openb cluster.
//!
//! A GPU draws its idle watts while nothing runs on it and its full (TDP)
//! watts once anything does, however little: the paper's simplification,
//! kept so that figures compare with its own. A node's processors are
//! sockets of one CPU model, chosen by the node's GPU model as the paper
//! does for openb's nodes (whose list names no CPU); a vCPU is half a
//! physical core, and a socket draws its full watts once any of its cores
//! is taken, its idle watts otherwise. Nodes with no CPU limit (generated
//! clusters, the node manager) count their GPUs only.
//!
//! The watts per part are the datasheet figures the paper's simulator
//! tables: GPUs T4 10/70 W, A10 30/150, P100 25/250, V100 30/300,
//! A100 50/400 (G2 taken as A10s and G3 as A100s, by their nodes' size);
//! CPUs Xeon 8163 20/165 W for 24 cores (T4 nodes), E5-2682 v4 15/120 W
//! for 16 (P100 nodes), 6326 20/185 W for 16 (V100 nodes) and 8369B
//! 20/270 W for 32 (A10, A100, G2, G3 nodes). A GPU of a model not named
//! there is counted as an A100 (the dearest), a node of one as an E5-2682
//! v4's (the paper's choice for nodes without a GPU model).

use super::ClusterState;

/// Idle and full watts of one part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartWatts {
    pub idle: f64,
    pub full: f64,
}

impl PartWatts {
    /// What waking the part adds.
    pub fn wake(&self) -> f64 {
        self.full - self.idle
    }
}

/// One CPU model: its watts per socket and physical cores per socket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SocketWatts {
    pub watts: PartWatts,
    pub cores: u64,
}

/// Watts of a GPU of model `name` (openb's model names).
pub fn gpu_watts(name: &str) -> PartWatts {
    let (idle, full) = match name {
        "T4" => (10.0, 70.0),
        "A10" | "G2" => (30.0, 150.0),
        "P100" => (25.0, 250.0),
        "V100M16" | "V100M32" => (30.0, 300.0),
        _ => (50.0, 400.0),
    };
    PartWatts { idle, full }
}

/// The CPU of a node whose GPUs are of model `name`.
pub fn socket_watts(name: &str) -> SocketWatts {
    let (idle, full, cores) = match name {
        "T4" => (20.0, 165.0, 24),
        "V100M16" | "V100M32" => (20.0, 185.0, 16),
        "A10" | "G2" | "A100" | "G3" => (20.0, 270.0, 32),
        _ => (15.0, 120.0, 16),
    };
    SocketWatts {
        watts: PartWatts { idle, full },
        cores,
    }
}

/// A CPU socket's state: physical cores of the node, and of them the ones
/// taken, from milli-vCPUs (two vCPUs to a core).
fn physical_cores(milli_vcpus: u64) -> u64 {
    milli_vcpus.div_ceil(2000)
}

/// The GPU model name of `node` ("" where the cluster names none).
pub fn model_name(cluster: &ClusterState, node: usize) -> &str {
    cluster
        .hosts
        .get(node)
        .and_then(|host| cluster.models.get(usize::from(host.model)))
        .map_or("", String::as_str)
}

/// Watts of `node`'s sockets with `cpu_used` milli-vCPUs taken (0 for a
/// node without a CPU limit).
fn cpu_watts(cluster: &ClusterState, node: usize, cpu_used: u64) -> f64 {
    let Some(host) = cluster.hosts.get(node) else {
        return 0.0;
    };
    if host.cpu_milli == u64::MAX {
        return 0.0;
    }
    let socket = socket_watts(model_name(cluster, node));
    let per_socket = socket.cores.max(1);
    let cores = physical_cores(host.cpu_milli);
    let sockets = cores.div_ceil(per_socket);
    // Cores wholly free are idle; one partly taken works.
    let idle_cores = host.cpu_milli.saturating_sub(cpu_used) / 2000;
    let working = cores.saturating_sub(idle_cores);
    let active = working.div_ceil(per_socket).min(sockets);
    socket.watts.idle * (sockets - active) as f64 + socket.watts.full * active as f64
}

/// What `node` draws now.
pub fn node_watts(cluster: &ClusterState, node: usize) -> f64 {
    let gpus = &cluster.gpus[cluster.nodes[node].clone()];
    let active = gpus.iter().filter(|gpu| gpu.is_active()).count();
    let watts = gpu_watts(model_name(cluster, node));
    let cpu_used = cluster.hosts.get(node).map_or(0, |host| host.cpu_used);
    watts.idle * (gpus.len() - active) as f64
        + watts.full * active as f64
        + cpu_watts(cluster, node, cpu_used)
}

/// What the whole cluster draws now.
pub fn cluster_watts(cluster: &ClusterState) -> f64 {
    (0..cluster.nodes.len())
        .map(|node| node_watts(cluster, node))
        .sum()
}

/// What `node` would draw more with work on `gpus` (GPUs of it) and
/// `cpu_milli` more of its vCPUs taken.
pub fn watts_added(cluster: &ClusterState, node: usize, gpus: &[usize], cpu_milli: u64) -> f64 {
    let woken = gpus
        .iter()
        .filter(|&&gpu| !cluster.gpus[gpu].is_active())
        .count();
    gpu_watts(model_name(cluster, node)).wake() * woken as f64
        + cpu_watts_added(cluster, node, cpu_milli)
}

/// What `node`'s sockets would draw more with `cpu_milli` more of its
/// vCPUs taken.
pub fn cpu_watts_added(cluster: &ClusterState, node: usize, cpu_milli: u64) -> f64 {
    if cpu_milli == 0 {
        return 0.0;
    }
    let cpu_used = cluster.hosts.get(node).map_or(0, |host| host.cpu_used);
    cpu_watts(cluster, node, cpu_used.saturating_add(cpu_milli))
        - cpu_watts(cluster, node, cpu_used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HostState, InstanceDemand, PodNeeds, WorkClass};

    /// One node of `gpus` GPUs of `model` with `cpu_milli` vCPUs.
    fn node(model: &str, gpus: usize, cpu_milli: u64) -> ClusterState {
        let mut cluster = ClusterState::default();
        let model = cluster.model_index(model);
        cluster.add_host(
            gpus,
            1 << 30,
            HostState {
                cpu_milli,
                cpu_used: 0,
                memory_mib: 1 << 20,
                memory_used: 0,
                model,
            },
        );
        cluster
    }

    fn share(sm: f64) -> InstanceDemand {
        InstanceDemand {
            class: WorkClass::Batch,
            sm_request: sm,
            sm_limit: sm,
            memory_bytes: 0,
            gpus: 1,
        }
    }

    #[test]
    fn a_gpu_draws_full_watts_once_anything_runs_and_a_socket_once_a_core_is_taken() {
        // A G2 node: 8 GPUs (A10s, 30/150 W), 96 vCPUs = 48 cores on two
        // sockets of 32 (8369B, 20/270 W).
        let mut cluster = node("G2", 8, 96_000);
        assert_eq!(cluster_watts(&cluster), 8.0 * 30.0 + 2.0 * 20.0);
        // A tenth of one GPU and four vCPUs: one GPU and one socket wake.
        assert_eq!(
            watts_added(&cluster, 0, &[3], 4_000),
            120.0 + 250.0,
            "a GPU and a socket woken"
        );
        cluster.apply(&share(0.1), &[3]);
        cluster.apply_host(
            0,
            &PodNeeds {
                cpu_milli: 4_000,
                ..Default::default()
            },
        );
        assert_eq!(cluster_watts(&cluster), 7.0 * 30.0 + 150.0 + 270.0 + 20.0);
        // Another share on the same GPU and cores within the first socket's
        // 32 cores add nothing; cores past them wake the second socket.
        assert_eq!(watts_added(&cluster, 0, &[3], 56_000), 0.0);
        assert_eq!(watts_added(&cluster, 0, &[3], 62_000), 250.0);
        assert_eq!(watts_added(&cluster, 0, &[3, 4], 0), 120.0);
    }

    #[test]
    fn models_differ_in_what_waking_a_gpu_costs_and_unknown_ones_count_as_the_dearest() {
        let watts = |model: &str| {
            let cluster = node(model, 1, 16_000);
            watts_added(&cluster, 0, &[0], 0)
        };
        assert_eq!(watts("T4"), 60.0);
        assert_eq!(watts("V100M32"), 270.0);
        assert_eq!(watts("G3"), 350.0);
        assert_eq!(watts("H100-unknown"), 350.0);
        // A node without a CPU limit counts its GPUs only.
        let mut cluster = ClusterState::default();
        cluster.add_node(2, 1 << 30);
        let _ = cluster.model_index("T4");
        assert_eq!(cluster_watts(&cluster), 2.0 * 10.0);
        assert_eq!(watts_added(&cluster, 0, &[0], 8_000), 60.0);
    }
}
