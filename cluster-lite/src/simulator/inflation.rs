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
use crate::policy::{PlacementPolicy, WorkloadMix, place_pod};
use crate::rng::SeededRng;

/// Readings of the protocol: every 10% of capacity from 50% to `last`.
pub fn checkpoints(last: f64) -> Vec<f64> {
    (5..)
        .map(|tenth| f64::from(tenth) / 10.0)
        .take_while(|share| *share <= last + 1e-9)
        .collect()
}

/// GPU share one pod requests: its per-GPU share times its GPUs.
pub fn requested_share(record: &TraceRecord) -> f64 {
    record.sm_request * f64::from(record.gpus.max(1))
}

/// Draws pods from `pods` (uniformly, with replacement) until they request
/// `target` × `capacity_gpus` GPUs in all; ids are renumbered in order.
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
    while requested < goal && !pods.is_empty() {
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

/// One reading: shares of the cluster's GPU capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InflationPoint {
    pub requested: f64,
    pub allocated: f64,
}

/// What one policy did with one inflated workload.
#[derive(Debug, Clone)]
pub struct InflationResult {
    pub policy: String,
    /// One reading per checkpoint the requests reached.
    pub points: Vec<InflationPoint>,
    pub placed: usize,
    pub dropped: usize,
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
    let (mut placed, mut dropped) = (0usize, 0usize);
    let mut points = Vec::new();
    let mut next_checkpoint = 0;
    let mut latencies_ns = Vec::with_capacity(pods.len());
    for pod in pods {
        let demand = pod.demand();
        let needs = pod.needs(&cluster);
        let started = Instant::now();
        let placement = place_pod(policy, &cluster, &demand, &needs);
        latencies_ns.push(started.elapsed().as_nanos() as u64);
        requested += requested_share(pod);
        match placement {
            Some(placement) => {
                cluster.apply(&demand, &placement.gpus);
                if let Some(&first) = placement.gpus.first() {
                    cluster.apply_host(cluster.gpus[first].node, &needs);
                }
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
    }
}
