//! FGD's evaluation protocol as a simulator mode: the workload is
//! "inflated" by drawing pods from a trace at random (with replacement,
//! seeded) until the GPU share they request reaches a target share of the
//! cluster's capacity; the pods arrive one at a time and never leave, and a
//! pod that fits nowhere is dropped. The measure is the share of the
//! cluster's GPU capacity allocated against the share requested so far,
//! read as the requests cross each checkpoint (e.g. 50%, 60%, … 130%).

use std::time::Instant;

use super::ClusterShape;
use super::trace::TraceRecord;
use crate::model::{InstanceDemand, PodNeeds};
use crate::policy::{PlacementPolicy, WorkloadMix, place_host_only, place_pod};
use crate::rng::SeededRng;

/// Readings of the protocol: every 10% of capacity from 50% to `last`.
pub fn checkpoints(last: f64) -> Vec<f64> {
    (5..)
        .map(|tenth| f64::from(tenth) / 10.0)
        .take_while(|share| *share <= last + 1e-9)
        .collect()
}

/// GPU share one pod requests: its per-GPU share times its GPUs (0 for a
/// pod without GPUs, which is drawn as FGD's protocol draws it but counts
/// toward no checkpoint).
pub fn requested_share(record: &TraceRecord) -> f64 {
    record.sm_request * f64::from(record.gpus)
}

/// Draws pods from `pods` (uniformly, with replacement) until they request
/// `target` × `capacity_gpus` GPUs in all; ids are renumbered in order.
/// Pods without GPUs are drawn too (their cores compete with GPU pods'),
/// and none is drawn from a list that has no pod with GPUs.
pub fn inflate(
    pods: &[TraceRecord],
    capacity_gpus: usize,
    target: f64,
    seed: u64,
) -> Vec<TraceRecord> {
    let mut rng = SeededRng::new(seed);
    let goal = target * capacity_gpus as f64;
    let mut requested = 0.0;
    let mut out = Vec::new();
    let requests_gpus = pods.iter().any(|pod| requested_share(pod) > 0.0);
    while requested < goal && requests_gpus {
        let pick = rng.below(pods.len() as u64) as usize;
        let mut pod = pods[pick].clone();
        pod.id = out.len() as u64;
        pod.arrival_s = out.len() as f64;
        requested += requested_share(&pod);
        out.push(pod);
    }
    out
}

/// The task types of `pods` and their frequencies (what `fgd` is told).
pub fn workload_mix(pods: &[TraceRecord], shape: &ClusterShape) -> WorkloadMix {
    let cluster = shape.build();
    let demands: Vec<(InstanceDemand, PodNeeds)> = pods
        .iter()
        .map(|pod| (pod.demand(), pod.needs(&cluster)))
        .collect();
    WorkloadMix::from_tasks(demands.iter().map(|(demand, needs)| (demand, needs)))
}

/// One reading: shares of the cluster's GPU capacity, and what the
/// cluster draws then (`crate::model::power`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InflationPoint {
    pub requested: f64,
    pub allocated: f64,
    pub watts: f64,
}

/// What one policy did with one inflated workload.
#[derive(Debug, Clone)]
pub struct InflationResult {
    pub policy: String,
    /// One reading per checkpoint the requests reached.
    pub points: Vec<InflationPoint>,
    pub placed: usize,
    /// Pods that fit nowhere, with or without GPUs.
    pub dropped: usize,
    /// Of them, pods without GPUs (no host had their cores and memory).
    pub dropped_without_gpus: usize,
    /// Mean Σlimits − 1 over GPUs in use at the end (limit excess; 0 when ≤ 1).
    pub final_limit_excess: f64,
    pub placement_p50_us: f64,
    pub placement_p99_us: f64,
}

/// Offers `pods` in order to `policy`; reads the allocated share when the
/// requested share first reaches each of `checkpoints` (ascending).
pub fn simulate_inflation(
    policy: &dyn PlacementPolicy,
    pods: &[TraceRecord],
    shape: &ClusterShape,
    checkpoints: &[f64],
) -> InflationResult {
    let mut cluster = shape.build();
    crate::policy::tell_cluster_the_workload(policy, &mut cluster);
    let capacity = cluster.gpus.len().max(1) as f64;
    let (mut requested, mut allocated) = (0.0, 0.0);
    let (mut placed, mut dropped, mut dropped_without_gpus) = (0usize, 0usize, 0usize);
    let mut points = Vec::new();
    let mut next_checkpoint = 0;
    let mut latencies_ns = Vec::with_capacity(pods.len());
    for pod in pods {
        let demand = pod.demand();
        let needs = pod.needs(&cluster);
        let started = Instant::now();
        if !pod.takes_gpus() {
            let node = place_host_only(policy, &cluster, &needs);
            latencies_ns.push(started.elapsed().as_nanos() as u64);
            match node {
                Some(node) => {
                    cluster.apply_host(node, &needs);
                    placed += 1;
                }
                None => {
                    dropped += 1;
                    dropped_without_gpus += 1;
                }
            }
            continue;
        }
        let placement = place_pod(policy, &cluster, &demand, &needs);
        latencies_ns.push(started.elapsed().as_nanos() as u64);
        requested += requested_share(pod);
        match placement {
            Some(placement) => {
                cluster.apply_pod(&demand, &placement.gpus, &needs);
                allocated += requested_share(pod);
                placed += 1;
            }
            None => dropped += 1,
        }
        while next_checkpoint < checkpoints.len()
            && requested / capacity + 1e-12 >= checkpoints[next_checkpoint]
        {
            points.push(InflationPoint {
                requested: checkpoints[next_checkpoint],
                allocated: allocated / capacity,
                watts: crate::model::power::cluster_watts(&cluster),
            });
            next_checkpoint += 1;
        }
    }
    let active: Vec<f64> = cluster
        .gpus
        .iter()
        .filter(|gpu| gpu.is_active())
        .map(|gpu| gpu.limit_excess())
        .collect();
    latencies_ns.sort_unstable();
    InflationResult {
        policy: policy.name().to_string(),
        points,
        placed,
        dropped,
        dropped_without_gpus,
        final_limit_excess: active.iter().sum::<f64>() / active.len().max(1) as f64,
        placement_p50_us: super::percentile(&latencies_ns, 0.5) / 1000.0,
        placement_p99_us: super::percentile(&latencies_ns, 0.99) / 1000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkClass;
    use crate::policy::{Exclusive, InflessRequests};

    fn pod(share: f64, gpus: u32) -> TraceRecord {
        TraceRecord {
            id: 0,
            function: "p".into(),
            arrival_s: 0.0,
            duration_s: 1.0,
            class: WorkClass::Batch,
            sm_request: share,
            sm_limit: share,
            memory_bytes: 0,
            gpus,
            restartable: false,
            pod: Default::default(),
        }
    }

    #[test]
    fn pods_without_gpus_take_cores_that_gpu_pods_then_lack() {
        // Two nodes of one GPU and 8 cores; whole-GPU pods on 6 cores, and
        // between them a pod without GPUs on 4 cores, which fits only the
        // second node and leaves the second GPU pod too few cores there.
        let node = super::super::NodeSpec {
            gpus: 1,
            gpu_memory: 1 << 30,
            cpu_milli: 8000,
            memory_mib: 1 << 20,
            model: String::new(),
        };
        let shape = ClusterShape {
            nodes: vec![node.clone(), node],
        };
        let mut gpu_pod = pod(1.0, 1);
        gpu_pod.pod.cpu_milli = 6000;
        let mut cores = pod(0.0, 0);
        cores.pod.cpu_milli = 4000;
        assert_eq!(requested_share(&cores), 0.0);
        let checkpoints = [0.5, 1.0];
        let with = [gpu_pod.clone(), cores, gpu_pod.clone()];
        let result = simulate_inflation(&InflessRequests, &with, &shape, &checkpoints);
        assert_eq!((result.placed, result.dropped), (2, 1));
        assert_eq!(result.dropped_without_gpus, 0);
        assert_eq!(
            result.points.len(),
            2,
            "the pod without GPUs reads no checkpoint"
        );
        assert!((result.points[1].allocated - 0.5).abs() < 1e-9);
        let without = [gpu_pod.clone(), gpu_pod];
        let result = simulate_inflation(&InflessRequests, &without, &shape, &checkpoints);
        assert!((result.points[1].allocated - 1.0).abs() < 1e-9);
        // A list of pods without GPUs alone draws nothing (it requests none).
        assert!(inflate(&[pod(0.0, 0)], 2, 1.3, 1).is_empty());
    }

    #[test]
    fn inflation_requests_the_target_share_and_sharing_allocates_more() {
        let pods = vec![pod(0.25, 1), pod(0.5, 1), pod(1.0, 2)];
        let shape = ClusterShape::uniform(16, 4, 1 << 30);
        let inflated = inflate(&pods, 16, 1.3, 7);
        let total: f64 = inflated.iter().map(requested_share).sum();
        assert!((1.3 * 16.0..1.3 * 16.0 + 2.0).contains(&total), "{total}");
        assert_eq!(inflated, inflate(&pods, 16, 1.3, 7), "seeded");
        let checkpoints = [0.5, 1.0, 1.3];
        let shared = simulate_inflation(&InflessRequests, &inflated, &shape, &checkpoints);
        let exclusive = simulate_inflation(&Exclusive, &inflated, &shape, &checkpoints);
        assert_eq!(shared.points.len(), 3);
        assert_eq!(shared.placed + shared.dropped, inflated.len());
        // At half the capacity requested, best fit has placed everything.
        assert!((shared.points[0].allocated - 0.5).abs() < 0.1);
        assert!(shared.points[2].allocated > exclusive.points[2].allocated);
        assert!(shared.points[2].allocated <= 1.0 + 1e-9);
        // GPUs of no named model draw as A100s: 50 W idle, 400 W in use.
        // Sharing wakes fewer GPUs for the same requests.
        let idle = 16.0 * 50.0;
        assert!(shared.points[0].watts > idle);
        assert!(shared.points[0].watts < exclusive.points[0].watts);
        assert!(exclusive.points[2].watts <= 16.0 * 400.0);
    }
}
