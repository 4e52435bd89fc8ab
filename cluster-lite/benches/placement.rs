//! One placement decision per policy on a 4,000-GPU cluster (500 nodes of 8)
//! filled to a steady state by replaying a generated trace half-way.
//! Target: p99 ≤ 1 ms per decision (criterion reports the mean; the
//! simulator reports p50/p99 over every decision of a run).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use dilu_cluster::model::{ClusterState, InstanceDemand, WorkClass};
use dilu_cluster::policy::{POLICY_NAMES, place, policy_by_name};
use dilu_cluster::simulator::trace::{ArrivalPattern, TraceSpec, generate};

const GIB: u64 = 1 << 30;
const GPUS: usize = 4000;

/// A cluster where about 1,400 instances are running, placed by `policy`.
fn busy_cluster(policy: &str) -> ClusterState {
    let policy = policy_by_name(policy).expect("known policy");
    let mut cluster = ClusterState::uniform(GPUS / 8, 8, 80 * GIB);
    let trace = generate(&TraceSpec {
        instances: 1400,
        cluster_gpus: GPUS,
        arrival: ArrivalPattern::Poisson,
        seed: 5,
    });
    for record in &trace {
        let demand = record.demand();
        if let Some(placement) = place(policy.as_ref(), &cluster, &demand) {
            cluster.apply(&demand, &placement.gpus);
        }
    }
    cluster
}

fn placement_decision(c: &mut Criterion) {
    let inference = InstanceDemand {
        class: WorkClass::Latency,
        sm_request: 0.3,
        sm_limit: 0.45,
        memory_bytes: 8 * GIB,
        gpus: 1,
    };
    let training = InstanceDemand {
        class: WorkClass::Batch,
        sm_request: 0.5,
        sm_limit: 0.6,
        memory_bytes: 30 * GIB,
        gpus: 4,
    };
    let mut group = c.benchmark_group("place_4000_gpus");
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(300));
    group.measurement_time(Duration::from_secs(1));
    for name in POLICY_NAMES {
        let policy = policy_by_name(name).expect("known policy");
        let cluster = busy_cluster(name);
        group.bench_function(format!("{name}/inference"), |b| {
            b.iter(|| place(policy.as_ref(), black_box(&cluster), black_box(&inference)))
        });
        group.bench_function(format!("{name}/training-4-gpus"), |b| {
            b.iter(|| place(policy.as_ref(), black_box(&cluster), black_box(&training)))
        });
    }
    group.finish();
}

criterion_group!(benches, placement_decision);
criterion_main!(benches);
