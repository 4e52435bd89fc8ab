//! Trace-driven simulator: replays instance arrivals and departures against
//! one placement policy on a uniform cluster and measures what the policy
//! costs. An inference record's departure is "its function scales in by
//! one" and the policy may choose which replica stops (see `ScaleIn`).
//! While the cluster shrinks, the policy may move replicas left alone on a
//! GPU and restart restartable gangs with a share on a GPU of its own
//! (`consolidation`); a moved replica's old copy keeps its GPU for
//! `MOVE_WARM_UP_S`, and a restarted job ends `RESTART_S` later, both
//! counted in every metric.
//!
//! Metrics (time-weighted over the trace, from the first arrival to the last
//! departure):
//! * active GPUs over time and GPU-hours (∫ active GPUs dt);
//! * SM fragmentation: mean unrequested SM share on active GPUs (1 − Σrequests);
//! * memory fragmentation: mean unused memory share on active GPUs;
//! * SLO risk: mean over active GPUs of max(0, Σlimits − 1), and the share of
//!   active GPUs where Σlimits > 1;
//! * placement latency p50/p99 (wall clock of one `policy::place` call);
//! * rejected instances (nothing fitted; they are dropped);
//! * moved replicas and gang restarts (consolidation).

pub mod heterogeneous;
pub mod inflation;
mod integrals;
pub mod openb;
pub mod plot;
pub mod report;
mod scale_in;
pub mod trace;
pub mod tuning;
pub mod tuning_score;

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

use crate::consolidation::ShrinkWatch;
use crate::model::{ClusterState, HostState, InstanceDemand, PodNeeds, SHARE_EPSILON};
use crate::policy::{MoveRequest, PlacementPolicy, place_host_only, place_pod};
use integrals::Integrals;
use scale_in::{ScaleIn, is_replica};
use trace::TraceRecord;

/// How much later a restartable gang ends for each restart that moves part
/// of it (see `consolidation`): the checkpoint, the stop and the start on
/// the new GPUs, during which it holds all its GPUs and makes no progress.
/// Trace records carry no restart cost, so every restart pays this one
/// (five minutes: saving and loading tens of GB of training state and
/// re-initialising the job).
pub const RESTART_S: f64 = 300.0;

/// How long the old copy of a moved replica keeps serving (and keeps its
/// GPU) while the new copy starts: the cold start of a replica. Trace
/// records carry no cold start, so every move pays this one (two minutes,
/// about what loading a 10–30 GB model and warming it up takes).
pub const MOVE_WARM_UP_S: f64 = 120.0;

/// One node of the simulated cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub gpus: usize,
    pub gpu_memory: u64,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// GPU model name (empty: unnamed).
    pub model: String,
}

/// Cluster the trace is replayed on: its nodes, exactly.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterShape {
    pub nodes: Vec<NodeSpec>,
}

impl ClusterShape {
    /// `nodes` (those with a GPU) repeated in order until they hold at least
    /// `gpus` GPUs: a real node list scaled to a larger cluster.
    pub fn tiled(nodes: &[NodeSpec], gpus: usize) -> Self {
        let mut out = Vec::new();
        let mut total = 0;
        for node in nodes.iter().filter(|node| node.gpus > 0).cycle() {
            if total >= gpus {
                break;
            }
            total += node.gpus;
            out.push(node.clone());
        }
        ClusterShape { nodes: out }
    }

    /// `gpus` GPUs in nodes of `gpus_per_node` (the last node holds the
    /// rest, so the cluster has exactly `gpus`), host resources unbounded.
    pub fn uniform(gpus: usize, gpus_per_node: usize, gpu_memory: u64) -> Self {
        let per_node = gpus_per_node.max(1);
        let nodes = (0..gpus.div_ceil(per_node))
            .map(|node| NodeSpec {
                gpus: per_node.min(gpus - node * per_node),
                gpu_memory,
                cpu_milli: u64::MAX,
                memory_mib: u64::MAX,
                model: String::new(),
            })
            .collect();
        Self { nodes }
    }

    pub fn gpus(&self) -> usize {
        self.nodes.iter().map(|node| node.gpus).sum()
    }

    /// The empty cluster.
    pub fn build(&self) -> ClusterState {
        let mut cluster = ClusterState::default();
        for node in &self.nodes {
            let model = cluster.model_index(&node.model);
            cluster.add_host(
                node.gpus,
                node.gpu_memory,
                HostState {
                    cpu_milli: node.cpu_milli,
                    cpu_used: 0,
                    memory_mib: node.memory_mib,
                    memory_used: 0,
                    model,
                },
            );
        }
        cluster
    }

    /// One line: GPUs, nodes, and the models with their GPU counts.
    pub fn describe(&self) -> String {
        let mut models: Vec<(String, usize)> = Vec::new();
        for node in &self.nodes {
            match models.iter_mut().find(|(name, _)| *name == node.model) {
                Some(entry) => entry.1 += node.gpus,
                None => models.push((node.model.clone(), node.gpus)),
            }
        }
        let mut text = format!("{} GPUs on {} nodes", self.gpus(), self.nodes.len());
        if models.len() > 1 || models.iter().any(|(name, _)| !name.is_empty()) {
            models.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let list: Vec<String> = models
                .iter()
                .map(|(name, gpus)| format!("{gpus} {name}"))
                .collect();
            text.push_str(&format!(" ({})", list.join(", ")));
        }
        text
    }
}

/// What one policy did with one trace.
#[derive(Debug, Clone)]
pub struct SimulationResult {
    pub policy: String,
    pub gpu_hours: f64,
    pub peak_active_gpus: usize,
    pub mean_sm_fragmentation: f64,
    pub mean_memory_fragmentation: f64,
    pub mean_limit_excess: f64,
    pub share_gpus_at_risk: f64,
    /// Mean watts the cluster drew over the trace (`crate::model::power`).
    pub mean_watts: f64,
    pub placement_p50_us: f64,
    pub placement_p99_us: f64,
    pub placed: usize,
    /// Instances still pending when the trace ended (never placed).
    pub rejected: usize,
    /// Instances that did not fit on arrival and waited in the queue.
    pub waited: usize,
    /// Total time instances spent pending, in hours (those never placed
    /// count until the trace's end).
    pub wait_hours: f64,
    /// Longest time one placed instance waited, in seconds.
    pub max_wait_s: f64,
    /// Replicas moved by consolidation (each paid `MOVE_WARM_UP_S` on two GPUs).
    pub moved: usize,
    /// Restarts of gangs by consolidation (each delayed its job's end by
    /// `RESTART_S`).
    pub restarts: usize,
    /// (time in seconds, active GPUs) after each event.
    pub timeline: Vec<(f64, usize)>,
}

/// Something due at `time`: the instance `record_index` departs
/// (`old_copy_on` is `None`), or the old copy of that moved replica on GPU
/// `old_copy_on` stops now that the new copy is warm.
struct Due {
    time: f64,
    record_index: usize,
    old_copy_on: Option<usize>,
    /// The node whose cores and memory that old copy holds until it stops,
    /// when the replica moved to another node.
    old_copy_host: Option<usize>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    // Reversed so the max-heap pops the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.record_index.cmp(&self.record_index))
            .then(other.old_copy_on.cmp(&self.old_copy_on))
    }
}

/// Work that consolidation may move, per GPU, and the moves themselves
/// (see `consolidation`).
struct Mover {
    /// Single-GPU replicas (record indices) on each GPU.
    replicas_on: Vec<Vec<usize>>,
    /// Restartable gangs (record indices) holding each GPU.
    gangs_on: Vec<Vec<usize>>,
    /// Seconds by which restarts pushed each instance's departure back,
    /// not yet applied to its queued departure.
    restart_delay_s: Vec<f64>,
    watch: ShrinkWatch,
    moved: usize,
    restarts: usize,
    /// Each instance's host needs: a move must find them on its new node.
    needs: Vec<PodNeeds>,
}

impl Mover {
    fn new(gpus: usize, needs: Vec<PodNeeds>) -> Self {
        let instances = needs.len();
        Self {
            replicas_on: vec![Vec::new(); gpus],
            gangs_on: vec![Vec::new(); gpus],
            restart_delay_s: vec![0.0; instances],
            watch: ShrinkWatch::new(),
            moved: 0,
            restarts: 0,
            needs,
        }
    }

    fn started(&mut self, now: f64, index: usize, gpus: &[usize], record: &TraceRecord) {
        self.watch.started(now);
        match gpus {
            [gpu] if is_replica(record) => self.replicas_on[*gpu].push(index),
            [_, _, ..] if record.restartable => {
                for &gpu in gpus {
                    self.gangs_on[gpu].push(index);
                }
            }
            _ => {}
        }
    }

    fn stopped(&mut self, now: f64, index: usize, gpus: &[usize]) {
        self.watch.stopped(now);
        for &gpu in gpus {
            self.replicas_on[gpu].retain(|&other| other != index);
            self.gangs_on[gpu].retain(|&other| other != index);
        }
    }

    /// The delay restarts added to `index`'s departure since it was queued
    /// (and forgets it: the caller queues the departure again).
    fn take_restart_delay(&mut self, index: usize) -> f64 {
        std::mem::take(&mut self.restart_delay_s[index])
    }

    /// While the cluster shrinks, moves every replica alone on its GPU to
    /// the GPU the policy names (the old copy stops `MOVE_WARM_UP_S`
    /// later), then restarts every restartable gang with a GPU to itself
    /// with that GPU's share on the GPU the policy names (the job ends
    /// `RESTART_S` later than it would have).
    fn consolidate(
        &mut self,
        now: f64,
        policy: &dyn PlacementPolicy,
        cluster: &mut ClusterState,
        demands: &[InstanceDemand],
        placed_gpus: &mut [Vec<usize>],
        due: &mut BinaryHeap<Due>,
    ) {
        let needs = &self.needs;
        if !self.watch.is_shrinking(now) {
            return;
        }
        let lone_replicas: Vec<(usize, usize)> = (0..cluster.gpus.len())
            .filter_map(|source| match self.replicas_on[source][..] {
                [index] if is_alone(&cluster.gpus[source]) => Some((source, index)),
                _ => None,
            })
            .collect();
        let lone_shares: Vec<(usize, usize)> = (0..cluster.gpus.len())
            .filter_map(|source| match self.gangs_on[source][..] {
                [index] if is_alone(&cluster.gpus[source]) => Some((source, index)),
                _ => None,
            })
            .collect();
        // Only busy GPUs with room for the smallest request can take a
        // move (every policy keeps Σrequests ≤ 1); listing them once keeps
        // a pass cheap when most busy GPUs are full.
        let smallest_request = lone_replicas
            .iter()
            .chain(&lone_shares)
            .map(|&(_, index)| demands[index].sm_request)
            .fold(f64::INFINITY, f64::min);
        if smallest_request.is_infinite() {
            return;
        }
        let within: Vec<usize> = (0..cluster.gpus.len())
            .filter(|&gpu| {
                let state = &cluster.gpus[gpu];
                state.is_active()
                    && state.draining == 0
                    && state.sm_request_sum + smallest_request <= 1.0 + SHARE_EPSILON
            })
            .collect();
        for (source, index) in lone_replicas {
            // An earlier move in this pass may have put work here.
            if !is_alone(&cluster.gpus[source]) {
                continue;
            }
            let allowed = within_for(cluster, &within, source, &needs[index], false);
            let request = MoveRequest {
                share: &demands[index],
                source,
                keeps: &[],
                within: &allowed,
            };
            let Some(target) = policy.consolidation_target(cluster, &request) else {
                continue;
            };
            // A replica moved to another node holds cores and memory there
            // from now on, and on its old node until its old copy stops.
            let (from, to) = (cluster.gpus[source].node, cluster.gpus[target].node);
            let old_copy_host = (from != to).then(|| {
                cluster.apply_host(to, &needs[index]);
                from
            });
            cluster.apply(&demands[index], &[target]);
            cluster.set_draining(source, cluster.gpus[source].draining + 1);
            self.replicas_on[source].clear();
            self.replicas_on[target].push(index);
            placed_gpus[index] = vec![target];
            due.push(Due {
                time: now + MOVE_WARM_UP_S,
                record_index: index,
                old_copy_on: Some(source),
                old_copy_host,
            });
            self.moved += 1;
        }
        let mut restarted: Vec<usize> = Vec::new();
        for (source, index) in lone_shares {
            // An earlier move in this pass may have put work here.
            if !is_alone(&cluster.gpus[source]) {
                continue;
            }
            let allowed = within_for(cluster, &within, source, &needs[index], true);
            let request = MoveRequest {
                share: &demands[index],
                source,
                keeps: &placed_gpus[index],
                within: &allowed,
            };
            let Some(target) = policy.consolidation_target(cluster, &request) else {
                continue;
            };
            // Break before make: the job checkpoints and stops, then starts
            // again with this share on `target` and its other shares where
            // they were. The source is free at once; the restart's time is
            // charged as a later end on every GPU the job then holds.
            cluster.release(&demands[index], &[source]);
            cluster.apply(&demands[index], &[target]);
            self.gangs_on[source].clear();
            self.gangs_on[target].push(index);
            for gpu in placed_gpus[index].iter_mut().filter(|gpu| **gpu == source) {
                *gpu = target;
            }
            if !restarted.contains(&index) {
                restarted.push(index);
            }
        }
        // A job restarts once per pass, however many of its shares moved.
        for index in restarted {
            self.restart_delay_s[index] += RESTART_S;
            self.restarts += 1;
        }
    }
}

/// The GPUs of `within` that work on `source` with host `needs` may move
/// to: any, when it needs nothing of its node; else GPUs of its own node,
/// and for a replica (not a gang's share, which `one_node` keeps where its
/// other GPUs are) GPUs of nodes with its cores, memory and GPU model free.
fn within_for<'a>(
    cluster: &ClusterState,
    within: &'a [usize],
    source: usize,
    needs: &PodNeeds,
    gang_share: bool,
) -> std::borrow::Cow<'a, [usize]> {
    if *needs == PodNeeds::default() {
        return within.into();
    }
    let home = cluster.gpus[source].node;
    within
        .iter()
        .copied()
        .filter(|&gpu| {
            let node = cluster.gpus[gpu].node;
            node == home || (!(gang_share && needs.one_node) && cluster.host_fits(node, needs))
        })
        .collect::<Vec<usize>>()
        .into()
}

/// Whether a GPU holds exactly one instance and is not draining: moving
/// that instance away leaves it idle.
fn is_alone(gpu: &crate::model::GpuState) -> bool {
    gpu.instances() == 1 && gpu.draining == 0
}

/// How many pending instances one event may try before it gives up: the
/// queue is retried in arrival order after every departure, and a long
/// queue on a full cluster would otherwise cost a placement search per
/// waiting pod per event.
pub const PENDING_RETRIES_PER_EVENT: usize = 64;

/// Replays `trace` under `policy`; `progress` is called with
/// (events done, events total) about every 5% of the events.
///
/// An instance that fits nowhere when it arrives waits in a first-come
/// queue; after each departure the queue is retried in order (at most
/// `PENDING_RETRIES_PER_EVENT` failed tries per event), and an instance
/// placed late runs its full duration from then on. Consolidation runs
/// once per instant, after every event due then, so work is never moved
/// onto a GPU whose instances leave at that same instant.
pub fn simulate(
    policy: &dyn PlacementPolicy,
    trace: &[TraceRecord],
    shape: &ClusterShape,
    mut progress: impl FnMut(usize, usize),
) -> SimulationResult {
    let mut cluster = shape.build();
    crate::policy::tell_cluster_the_workload(policy, &mut cluster);
    let demands: Vec<InstanceDemand> = trace.iter().map(TraceRecord::demand).collect();
    let needs: Vec<PodNeeds> = trace.iter().map(|record| record.needs(&cluster)).collect();
    let mut placed_gpus: Vec<Vec<usize>> = vec![Vec::new(); trace.len()];
    // The node of each running pod that takes no GPU.
    let mut placed_host: Vec<Option<usize>> = vec![None; trace.len()];
    let mut due: BinaryHeap<Due> = BinaryHeap::new();
    let mut scale_in = ScaleIn::new(trace);
    let mut mover = Mover::new(cluster.gpus.len(), needs.clone());
    let mut latencies_ns = Vec::with_capacity(trace.len());
    let mut integrals = Integrals::default();
    if let Some(first) = trace.first() {
        integrals.last_time = first.arrival_s;
    }
    let mut timeline = Vec::with_capacity(trace.len() * 2);
    let total_events = trace.len() * 2;
    let report_every = (total_events / 20).max(1);
    let (mut done, mut peak) = (0usize, 0usize);
    let mut pending: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let (mut waited, mut wait_seconds, mut max_wait_s) = (0usize, 0.0f64, 0.0f64);
    let mut next_arrival = 0usize;
    let mut try_place = |index: usize,
                         now: f64,
                         cluster: &mut ClusterState,
                         scale_in: &mut ScaleIn,
                         mover: &mut Mover,
                         placed_gpus: &mut [Vec<usize>],
                         placed_host: &mut [Option<usize>],
                         due: &mut BinaryHeap<Due>|
     -> bool {
        let started = Instant::now();
        if trace[index].takes_gpus() {
            let placement = place_pod(policy, cluster, &demands[index], &needs[index]);
            latencies_ns.push(started.elapsed().as_nanos() as u64);
            let Some(placement) = placement else {
                return false;
            };
            cluster.apply_pod(&demands[index], &placement.gpus, &needs[index]);
            placed_gpus[index] = placement.gpus;
        } else {
            let node = place_host_only(policy, cluster, &needs[index]);
            latencies_ns.push(started.elapsed().as_nanos() as u64);
            let Some(node) = node else { return false };
            cluster.apply_host(node, &needs[index]);
            placed_host[index] = Some(node);
        }
        scale_in.started(index);
        mover.started(now, index, &placed_gpus[index], &trace[index]);
        due.push(Due {
            time: now + trace[index].duration_s,
            record_index: index,
            old_copy_on: None,
            old_copy_host: None,
        });
        true
    };
    loop {
        let arrival_time = trace.get(next_arrival).map(|record| record.arrival_s);
        let due_time = due.peek().map(|event| event.time);
        let (now, is_arrival) = match (arrival_time, due_time) {
            (None, None) => break,
            (Some(arrival), Some(time)) if time <= arrival => (time, false),
            (Some(arrival), _) => (arrival, true),
            (None, Some(time)) => (time, false),
        };
        integrals.advance(now, &cluster);
        wait_seconds += pending.len() as f64 * integrals.last_span;
        if is_arrival {
            let index = next_arrival;
            next_arrival += 1;
            // Later arrivals do not overtake the queue.
            let queued = !pending.is_empty();
            if queued
                || !try_place(
                    index,
                    now,
                    &mut cluster,
                    &mut scale_in,
                    &mut mover,
                    &mut placed_gpus,
                    &mut placed_host,
                    &mut due,
                )
            {
                pending.push_back(index);
                waited += 1;
            }
        } else if let Some(event) = due.pop() {
            if let Some(gpu) = event.old_copy_on {
                cluster.release(&demands[event.record_index], &[gpu]);
                if let Some(node) = event.old_copy_host {
                    cluster.release_host(node, &needs[event.record_index]);
                }
                cluster.set_draining(gpu, cluster.gpus[gpu].draining.saturating_sub(1));
            } else {
                let delay = mover.take_restart_delay(event.record_index);
                if delay > 0.0 {
                    // Restarted since this departure was queued: it ends later.
                    due.push(Due {
                        time: now + delay,
                        ..event
                    });
                    continue;
                }
                let stopped =
                    scale_in.stop(event.record_index, policy, &cluster, &demands, &placed_gpus);
                let gpus = std::mem::take(&mut placed_gpus[stopped]);
                if gpus.is_empty() {
                    if let Some(node) = placed_host[stopped].take() {
                        cluster.release_host(node, &needs[stopped]);
                    }
                } else {
                    cluster.release_pod(&demands[stopped], &gpus, &needs[stopped]);
                }
                mover.stopped(now, stopped, &gpus);
                done += 1;
            }
            // Only after the last event of this instant: GPUs emptying now
            // are empty by then and take nothing.
            let instant_over = due.peek().is_none_or(|next| next.time > now)
                && trace
                    .get(next_arrival)
                    .is_none_or(|record| record.arrival_s > now);
            if instant_over {
                let mut failures = 0;
                let mut position = 0;
                while position < pending.len() && failures < PENDING_RETRIES_PER_EVENT {
                    let index = pending[position];
                    if try_place(
                        index,
                        now,
                        &mut cluster,
                        &mut scale_in,
                        &mut mover,
                        &mut placed_gpus,
                        &mut placed_host,
                        &mut due,
                    ) {
                        let wait = now - trace[index].arrival_s;
                        max_wait_s = max_wait_s.max(wait);
                        pending.remove(position);
                    } else {
                        failures += 1;
                        position += 1;
                    }
                }
                mover.consolidate(
                    now,
                    policy,
                    &mut cluster,
                    &demands,
                    &mut placed_gpus,
                    &mut due,
                );
            }
            let active = cluster.active_gpus();
            peak = peak.max(active);
            timeline.push((now, active));
            if event.old_copy_on.is_some() {
                continue; // not one of the trace's events
            }
            if done.is_multiple_of(report_every) {
                progress(done, total_events);
            }
            continue;
        }
        done += 1;
        let active = cluster.active_gpus();
        peak = peak.max(active);
        timeline.push((now, active));
        if done.is_multiple_of(report_every) {
            progress(done, total_events);
        }
    }
    progress(total_events, total_events);
    latencies_ns.sort_unstable();
    let rejected = pending.len();
    SimulationResult {
        policy: policy.name().to_string(),
        gpu_hours: integrals.active_seconds / 3600.0,
        peak_active_gpus: peak,
        mean_sm_fragmentation: integrals.per_active(integrals.sm_free_seconds),
        mean_memory_fragmentation: integrals.per_active(integrals.memory_free_seconds),
        mean_limit_excess: integrals.per_active(integrals.excess_seconds),
        share_gpus_at_risk: integrals.per_active(integrals.at_risk_seconds),
        mean_watts: integrals.mean_watts(),
        placement_p50_us: percentile(&latencies_ns, 0.50) / 1000.0,
        placement_p99_us: percentile(&latencies_ns, 0.99) / 1000.0,
        placed: trace.len() - rejected,
        rejected,
        waited,
        wait_hours: wait_seconds / 3600.0,
        max_wait_s,
        moved: mover.moved,
        restarts: mover.restarts,
        timeline,
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], quantile: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

#[cfg(test)]
mod tests {
    use super::trace::{ArrivalPattern, TraceSpec, generate};
    use super::*;
    use crate::model::ClusterState;
    use crate::policy::{Complementary, DiluPaper, Exclusive, InflessRequests, place};

    const GIB: u64 = 1 << 30;

    /// The placement rule on its own (no simulator loop): on a generated
    /// trace it never breaks its own bounds.
    #[test]
    fn dilu_never_exceeds_requests_limits_or_memory_on_a_generated_trace() {
        let trace = generate(&TraceSpec {
            instances: 600,
            cluster_gpus: 160,
            arrival: ArrivalPattern::Bursty,
            seed: 11,
        });
        // Arrivals and departures in time order (departures first on ties).
        let mut events: Vec<(f64, bool, usize)> = trace
            .iter()
            .enumerate()
            .flat_map(|(index, record)| {
                [
                    (record.arrival_s, true, index),
                    (record.arrival_s + record.duration_s, false, index),
                ]
            })
            .collect();
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let policy = Complementary::default();
        let hard = Complementary {
            soft_limit_bound: None,
            ..Complementary::default()
        };
        // A quarter of the GPUs the trace was sized for, so the cluster fills up.
        let mut cluster = ClusterState::uniform(5, 8, 80 * GIB);
        let mut placed: Vec<Vec<usize>> = vec![Vec::new(); trace.len()];
        let (mut placements, mut refusals, mut over_bound) = (0, 0, 0);
        for (_, arrival, index) in events {
            let work = trace[index].demand();
            if !arrival {
                cluster.release(&work, &std::mem::take(&mut placed[index]));
                continue;
            }
            let within_bound = place(&hard, &cluster, &work).is_some();
            let Some(placement) = place(&policy, &cluster, &work) else {
                refusals += 1;
                continue;
            };
            let mut distinct = placement.gpus.clone();
            distinct.dedup();
            assert_eq!(distinct.len(), work.gpus as usize);
            cluster.apply(&work, &placement.gpus);
            // Over the limit bound only where no GPU admitted it within.
            if placement
                .gpus
                .iter()
                .any(|&gpu| cluster.gpus[gpu].sm_limit_sum > policy.limit_bound + 1e-9)
            {
                assert!(!within_bound, "{work:?} went over the bound needlessly");
                over_bound += 1;
            }
            placed[index] = placement.gpus;
            placements += 1;
            for gpu in &cluster.gpus {
                assert!(gpu.sm_request_sum <= 1.0 + 1e-9, "{gpu:?}");
                assert!(gpu.memory_used <= gpu.memory_capacity, "{gpu:?}");
            }
        }
        // Some instances fit nowhere even by requests; some only over the bound.
        assert!(
            placements > 300 && refusals > 0 && over_bound > 0,
            "{placements} {refusals} {over_bound}"
        );
    }

    fn shape(gpus: usize) -> ClusterShape {
        ClusterShape::uniform(gpus, 8, 80 * GIB)
    }

    fn generated(
        instances: usize,
        cluster_gpus: usize,
        arrival: ArrivalPattern,
        seed: u64,
    ) -> Vec<TraceRecord> {
        generate(&TraceSpec {
            instances,
            cluster_gpus,
            arrival,
            seed,
        })
    }

    #[test]
    fn two_instances_sharing_a_gpu_cost_one_gpu_hour_per_hour() {
        let record = |id, arrival_s| TraceRecord {
            id,
            function: "f".into(),
            arrival_s,
            duration_s: 3600.0,
            class: crate::model::WorkClass::Latency,
            sm_request: 0.3,
            sm_limit: 0.4,
            memory_bytes: 10 * GIB,
            gpus: 1,
            restartable: false,
            pod: Default::default(),
        };
        let trace = vec![record(0, 0.0), record(1, 0.0)];
        let shared = simulate(&Complementary::default(), &trace, &shape(8), |_, _| {});
        assert!(
            (shared.gpu_hours - 1.0).abs() < 1e-9,
            "{}",
            shared.gpu_hours
        );
        assert_eq!(shared.peak_active_gpus, 1);
        assert!((shared.mean_sm_fragmentation - 0.4).abs() < 1e-9);
        assert_eq!(shared.mean_limit_excess, 0.0);
        let exclusive = simulate(&Exclusive, &trace, &shape(8), |_, _| {});
        assert!((exclusive.gpu_hours - 2.0).abs() < 1e-9);
        assert_eq!(exclusive.timeline.last().map(|point| point.1), Some(0));
    }

    /// A function `f` with two replicas: the one the trace lets depart
    /// first shares GPU 0 with a long job, the other sits alone on GPU 1.
    fn scale_in_trace(class: crate::model::WorkClass) -> Vec<TraceRecord> {
        let record = |id, function: &str, arrival_s, hours: f64, sm_request| TraceRecord {
            id,
            function: function.into(),
            arrival_s,
            duration_s: hours * 3600.0,
            class,
            sm_request,
            sm_limit: sm_request,
            memory_bytes: 4 * GIB,
            gpus: 1,
            restartable: false,
            pod: Default::default(),
        };
        vec![
            record(0, "long", 0.0, 10.0, 0.7),
            record(1, "f", 1.0, 1.0, 0.3),
            record(2, "f", 2.0, 10.0, 0.3),
        ]
    }

    #[test]
    fn dilu_scales_in_the_replica_that_empties_a_gpu() {
        let trace = scale_in_trace(crate::model::WorkClass::Latency);
        let paper = simulate(&DiluPaper, &trace, &shape(8), |_, _| {});
        let ours = simulate(&Complementary::default(), &trace, &shape(8), |_, _| {});
        // dilu-paper stops the trace's instance on GPU 0, so GPU 1 runs on
        // for ten hours; dilu stops the lone replica on GPU 1 and the other
        // replica inherits its departure, so `f` runs as many replicas as
        // the trace says at every moment and the cluster still ends empty.
        assert!((paper.gpu_hours - 20.0).abs() < 0.01, "{}", paper.gpu_hours);
        assert!((ours.gpu_hours - 11.0).abs() < 0.01, "{}", ours.gpu_hours);
        assert_eq!(ours.timeline.last().map(|point| point.1), Some(0));
        assert_eq!(ours.timeline.len(), paper.timeline.len());
    }

    #[test]
    fn batch_work_is_never_swapped_on_scale_in() {
        let trace = scale_in_trace(crate::model::WorkClass::Batch);
        let paper = simulate(&DiluPaper, &trace, &shape(8), |_, _| {});
        let ours = simulate(&Complementary::default(), &trace, &shape(8), |_, _| {});
        assert!((ours.gpu_hours - paper.gpu_hours).abs() < 1e-9);
    }

    /// A long job `a` (GPU 0), short jobs `b` (GPU 0) and `c` (GPU 1), and a
    /// long replica of `f` placed on GPU 1 because GPU 0 was full. When `b`
    /// and `c` end `short_s` after the start, `f` is alone on GPU 1 and GPU 0
    /// has room for it.
    fn lone_replica_trace(short_s: f64) -> Vec<TraceRecord> {
        let record =
            |id, function: &str, class, arrival_s, duration_s, sm_request: f64| TraceRecord {
                id,
                function: function.into(),
                arrival_s,
                duration_s,
                class,
                sm_request,
                sm_limit: sm_request * 1.1,
                memory_bytes: 4 * GIB,
                gpus: 1,
                restartable: false,
                pod: Default::default(),
            };
        use crate::model::WorkClass::{Batch, Latency};
        vec![
            record(0, "a", Batch, 0.0, 36_000.0, 0.5),
            record(1, "b", Batch, 1.0, short_s, 0.4),
            record(2, "f", Latency, 2.0, 36_000.0, 0.3),
            record(3, "c", Batch, 3.0, short_s, 0.5),
        ]
    }

    #[test]
    fn dilu_moves_a_lone_replica_to_a_busy_gpu_when_the_cluster_shrinks() {
        let trace = lone_replica_trace(3600.0);
        let paper = simulate(&DiluPaper, &trace, &shape(8), |_, _| {});
        let ours = simulate(&Complementary::default(), &trace, &shape(8), |_, _| {});
        // dilu-paper keeps GPU 1 on for `f` for ten hours. For dilu, the two
        // stops an hour in (and no start for ten minutes) mean shrinking: `f`
        // moves to GPU 0, and GPU 1 goes idle once the new copy is warm.
        assert_eq!((paper.moved, ours.moved), (0, 1));
        assert!((paper.gpu_hours - 20.0).abs() < 0.01, "{}", paper.gpu_hours);
        let expected = 10.0 + (3603.0 - 2.0 + MOVE_WARM_UP_S) / 3600.0;
        assert!(
            (ours.gpu_hours - expected).abs() < 0.01,
            "{} vs {expected}",
            ours.gpu_hours
        );
        assert_eq!(ours.timeline.last().map(|point| point.1), Some(0));
        // During the warm-up both copies count: GPU 1 is still active.
        let during = ours
            .timeline
            .iter()
            .rev()
            .find(|(time, _)| *time <= 3603.0 + MOVE_WARM_UP_S / 2.0)
            .map(|point| point.1);
        assert_eq!(during, Some(2));
    }

    #[test]
    fn nothing_moves_while_instances_are_still_arriving() {
        // The short jobs end five minutes after four starts: not shrinking,
        // so `f` stays on GPU 1 (and later no busy GPU is left to take it).
        let trace = lone_replica_trace(300.0);
        let ours = simulate(&Complementary::default(), &trace, &shape(8), |_, _| {});
        assert_eq!(ours.moved, 0);
        assert!((ours.gpu_hours - 20.0).abs() < 0.01, "{}", ours.gpu_hours);
    }

    /// A long single-GPU job `anchor` (0.5 SM) shares GPU 0 with a short
    /// one `b` (0.3 SM), so the two-GPU training job `train` (0.45 SM per
    /// GPU, ten hours) opens GPUs 1 and 2. When `b` ends 1,000 s in (and
    /// nothing started for ten minutes), GPU 0 has room for one share.
    fn lone_gang_share_trace(restartable: bool) -> Vec<TraceRecord> {
        use crate::model::WorkClass::Batch;
        let record =
            |id, function: &str, arrival_s, duration_s, sm_request: f64, gpus| TraceRecord {
                id,
                function: function.into(),
                arrival_s,
                duration_s,
                class: Batch,
                sm_request,
                sm_limit: sm_request * 1.1,
                memory_bytes: 20 * GIB,
                gpus,
                restartable: restartable && gpus > 1,
                pod: Default::default(),
            };
        vec![
            record(0, "anchor", 0.0, 36_000.0, 0.5, 1),
            record(1, "b", 1.0, 999.0, 0.3, 1),
            record(2, "train", 2.0, 36_000.0, 0.45, 2),
        ]
    }

    #[test]
    fn dilu_restarts_a_restartable_gang_to_empty_a_gpu_when_the_cluster_shrinks() {
        let ours = simulate(
            &Complementary::default(),
            &lone_gang_share_trace(true),
            &shape(8),
            |_, _| {},
        );
        // GPU 1's share joins `anchor` on GPU 0 at 1,000 s; `train` pays
        // one restart, so GPUs 0 and 2 stay on `RESTART_S` longer.
        assert_eq!((ours.moved, ours.restarts), (0, 1));
        let expected =
            (36_002.0 + RESTART_S + (1000.0 - 2.0) + (36_002.0 + RESTART_S - 2.0)) / 3600.0;
        assert!(
            (ours.gpu_hours - expected).abs() < 0.01,
            "{} vs {expected}",
            ours.gpu_hours
        );
        assert_eq!(ours.timeline.last().map(|point| point.1), Some(0));
        // Without the trace's consent, and under dilu-paper, all three GPUs
        // run for ten hours.
        let stayed = simulate(
            &Complementary::default(),
            &lone_gang_share_trace(false),
            &shape(8),
            |_, _| {},
        );
        let paper = simulate(
            &DiluPaper,
            &lone_gang_share_trace(true),
            &shape(8),
            |_, _| {},
        );
        for result in [&stayed, &paper] {
            assert_eq!(result.restarts, 0, "{}", result.policy);
            assert!(
                (result.gpu_hours - 30.0).abs() < 0.01,
                "{}",
                result.gpu_hours
            );
        }
    }

    #[test]
    fn a_full_cluster_queues_instances_and_progress_reaches_the_end() {
        let trace = generated(200, 400, ArrivalPattern::Poisson, 3);
        let mut last_progress = (0, 0);
        let tiny = simulate(&Exclusive, &trace, &shape(8), |done, total| {
            last_progress = (done, total)
        });
        assert!(tiny.waited > 0 && tiny.wait_hours > 0.0);
        // Every instance runs in the end: the queue drains as GPUs free up.
        assert_eq!((tiny.placed, tiny.rejected), (200, 0));
        assert_eq!(last_progress, (400, 400));
        assert_eq!(tiny.timeline.last().map(|point| point.1), Some(0));
    }

    fn pod(id: u64, arrival_s: f64, duration_s: f64, sm_request: f64) -> TraceRecord {
        TraceRecord {
            id,
            function: format!("p{id}"),
            arrival_s,
            duration_s,
            class: crate::model::WorkClass::Batch,
            sm_request,
            sm_limit: sm_request,
            memory_bytes: GIB,
            gpus: 1,
            restartable: false,
            pod: Default::default(),
        }
    }

    #[test]
    fn an_instance_that_does_not_fit_waits_and_then_runs_its_whole_duration() {
        // One GPU: `b` cannot join `a` until `a` leaves at 100 s; it then
        // runs its full 50 s, so the GPU is busy until 150 s.
        let trace = vec![pod(0, 0.0, 100.0, 0.7), pod(1, 10.0, 50.0, 0.5)];
        let result = simulate(&InflessRequests, &trace, &shape(1), |_, _| {});
        assert_eq!((result.placed, result.waited, result.rejected), (2, 1, 0));
        assert!(
            (result.max_wait_s - 90.0).abs() < 1e-9,
            "{}",
            result.max_wait_s
        );
        assert!((result.wait_hours - 90.0 / 3600.0).abs() < 1e-9);
        assert!(
            (result.gpu_hours - 150.0 / 3600.0).abs() < 1e-9,
            "{}",
            result.gpu_hours
        );
        // A pod that can never fit stays pending and is reported, not lost.
        let trace = vec![pod(0, 0.0, 100.0, 0.5), {
            let mut big = pod(1, 1.0, 10.0, 1.0);
            big.gpus = 2;
            big
        }];
        let result = simulate(&InflessRequests, &trace, &shape(1), |_, _| {});
        assert_eq!((result.placed, result.rejected), (1, 1));
    }

    #[test]
    fn the_cluster_has_exactly_the_gpus_asked_for() {
        let odd = ClusterShape::uniform(9, 8, GIB);
        assert_eq!(odd.gpus(), 9);
        assert_eq!(odd.nodes.len(), 2);
        assert_eq!(odd.build().gpus.len(), 9);
        assert!(
            odd.describe().starts_with("9 GPUs on 2 nodes"),
            "{}",
            odd.describe()
        );
        // Ten whole-GPU pods at once on 9 GPUs: one waits.
        let trace: Vec<TraceRecord> = (0..10).map(|id| pod(id, 0.0, 3600.0, 1.0)).collect();
        let result = simulate(&Exclusive, &trace, &odd, |_, _| {});
        assert_eq!((result.peak_active_gpus, result.waited), (9, 1));
    }

    fn node(gpus: usize, cpu_milli: u64, model: &str) -> NodeSpec {
        NodeSpec {
            gpus,
            gpu_memory: 16 * GIB,
            cpu_milli,
            memory_mib: 1 << 20,
            model: model.into(),
        }
    }

    #[test]
    fn heterogeneous_nodes_bound_pods_by_cpu_and_gpu_count() {
        // Node 0: 8 GPUs but 8 cores; node 1: 2 GPUs and 64 cores.
        let shape = ClusterShape {
            nodes: vec![node(8, 8000, "T4"), node(2, 64_000, "T4")],
        };
        assert!(shape.describe().contains("10 T4"), "{}", shape.describe());
        let mut trace: Vec<TraceRecord> = (0..4)
            .map(|id| {
                let mut record = pod(id, id as f64, 3600.0, 1.0);
                record.pod.cpu_milli = 6000;
                record.pod.one_node = true;
                record
            })
            .collect();
        // A pod of four whole GPUs fits only node 0 (node 1 has two GPUs).
        trace[3].gpus = 4;
        trace[3].pod.cpu_milli = 1000;
        let result = simulate(&InflessRequests, &trace, &shape, |_, _| {});
        // Node 0 takes one 6-core pod, node 1 two; the third 6-core pod
        // would need 12 cores on node 0, so the big pod goes to node 0 and
        // no pod waits: 1 + 2 + 4 GPUs.
        assert_eq!((result.waited, result.peak_active_gpus), (0, 7));
        // With one more 6-core pod nothing has cores left: it waits.
        let mut more = trace.clone();
        let mut extra = pod(4, 10.0, 3600.0, 0.2);
        extra.pod.cpu_milli = 6000;
        more.push(extra);
        let result = simulate(&InflessRequests, &more, &shape, |_, _| {});
        assert_eq!(result.waited, 1);
    }

    #[test]
    fn a_pod_without_gpus_holds_its_cores_until_it_leaves() {
        // One node of 2 GPUs and 8 cores. A pod without GPUs takes 6 cores
        // from 0 s to 100 s; a GPU pod asking 4 cores arrives at 10 s and
        // waits for them, with both GPUs idle, until 100 s.
        let shape = ClusterShape {
            nodes: vec![node(2, 8000, "T4")],
        };
        let mut cores = pod(0, 0.0, 100.0, 0.0);
        (cores.gpus, cores.memory_bytes, cores.pod.cpu_milli) = (0, 0, 6000);
        let mut gpu_pod = pod(1, 10.0, 50.0, 0.5);
        gpu_pod.pod.cpu_milli = 4000;
        for policy in [
            Box::new(InflessRequests) as Box<dyn PlacementPolicy>,
            Box::new(Complementary::default()),
        ] {
            let result = simulate(
                policy.as_ref(),
                &[cores.clone(), gpu_pod.clone()],
                &shape,
                |_, _| {},
            );
            assert_eq!(result.waited, 1, "{}", policy.name());
            assert_eq!(
                result.rejected,
                0,
                "{}: cores were given back",
                policy.name()
            );
            assert!(
                (result.max_wait_s - 90.0).abs() < 1e-9,
                "{}",
                result.max_wait_s
            );
            // The GPU pod alone holds a GPU, for its 50 s.
            assert!((result.gpu_hours * 3600.0 - 50.0).abs() < 1e-6);
        }
    }

    #[test]
    fn moves_go_only_where_the_node_has_room_for_the_pod() {
        // Node 0 (GPUs 0-1) has the replica; node 1 (GPUs 2-3) has 2 cores,
        // node 2 (GPU 4) has 64 cores but another GPU model.
        let shape = ClusterShape {
            nodes: vec![
                node(2, 64_000, "T4"),
                node(2, 2_000, "T4"),
                node(1, 64_000, "V100M32"),
            ],
        };
        let mut cluster = shape.build();
        let t4 = cluster.model_index("T4");
        let replica = PodNeeds {
            cpu_milli: 4_000,
            memory_mib: 1024,
            models: vec![t4],
            one_node: true,
        };
        let within = [1, 2, 3, 4];
        assert_eq!(
            within_for(&cluster, &within, 0, &PodNeeds::default(), false)[..],
            within
        );
        assert_eq!(within_for(&cluster, &within, 0, &replica, false)[..], [1]);
        cluster.hosts[1].cpu_milli = 64_000;
        cluster.refresh_node(1);
        assert_eq!(
            within_for(&cluster, &within, 0, &replica, false)[..],
            [1, 2, 3]
        );
        // A one-node gang's share stays on its node.
        assert_eq!(within_for(&cluster, &within, 0, &replica, true)[..], [1]);
    }

    #[test]
    fn pods_run_only_on_the_gpu_models_they_allow() {
        let shape = ClusterShape {
            nodes: vec![node(4, 64_000, "T4"), node(1, 64_000, "V100M32")],
        };
        let mut trace: Vec<TraceRecord> = (0..2)
            .map(|id| {
                let mut record = pod(id, id as f64, 3600.0, 1.0);
                record.pod.gpu_models = vec!["V100M32".into()];
                record
            })
            .collect();
        // A model no node has: never placed.
        let mut nowhere = pod(2, 2.0, 10.0, 0.1);
        nowhere.pod.gpu_models = vec!["A100".into()];
        trace.push(nowhere);
        for policy in crate::policy::POLICY_NAMES {
            let policy = crate::policy::policy_by_name(policy).unwrap();
            let result = simulate(policy.as_ref(), &trace, &shape, |_, _| {});
            // The V100 takes one; the other waits for it despite four idle T4s.
            assert_eq!(result.peak_active_gpus, 1, "{}", result.policy);
            assert_eq!(
                (result.waited, result.rejected),
                (2, 1),
                "{}",
                result.policy
            );
        }
    }

    #[test]
    fn nothing_moves_onto_gpus_that_empty_at_the_same_instant() {
        // Twenty GPUs, each with a replica of `f` and a job; every one of
        // them ends at the same instant, two hours in. Handled one at a
        // time, the first stops would leave replicas alone and move them
        // onto GPUs that empty a moment later; handled as one instant,
        // nothing is left to move.
        let mut trace = Vec::new();
        for gpu in 0..20u64 {
            let start = gpu as f64;
            let mut replica = pod(2 * gpu, start, 7200.0 - start, 0.3);
            replica.class = crate::model::WorkClass::Latency;
            replica.function = "f".into();
            trace.push(replica);
            trace.push(pod(2 * gpu + 1, start + 0.5, 7200.0 - start - 0.5, 0.7));
        }
        let ours = simulate(&Complementary::default(), &trace, &shape(20), |_, _| {});
        assert_eq!(ours.moved, 0);
        assert!(
            (ours.gpu_hours - 20.0 * 2.0).abs() < 0.1,
            "{}",
            ours.gpu_hours
        );
    }

    #[test]
    fn dilu_uses_fewer_gpu_hours_than_dilu_paper_at_no_more_risk_on_seeded_traces() {
        // The two seed-1 headline traces of bench/results/cluster-sim.md.
        for arrival in [ArrivalPattern::Poisson, ArrivalPattern::Bursty] {
            let trace = generated(3200, 4000, arrival, 1);
            let paper = simulate(&DiluPaper, &trace, &shape(4000), |_, _| {});
            let ours = simulate(&Complementary::default(), &trace, &shape(4000), |_, _| {});
            assert_eq!(paper.rejected + ours.rejected, 0);
            assert!(
                ours.gpu_hours < paper.gpu_hours,
                "{arrival:?}: dilu {} vs dilu-paper {} GPU-hours",
                ours.gpu_hours,
                paper.gpu_hours
            );
            assert!(
                ours.mean_limit_excess <= paper.mean_limit_excess,
                "{arrival:?}: dilu risk {} vs dilu-paper {}",
                ours.mean_limit_excess,
                paper.mean_limit_excess
            );
        }
    }

    #[test]
    fn sharing_policies_use_fewer_gpu_hours_than_exclusive() {
        let trace = generated(400, 256, ArrivalPattern::Poisson, 9);
        let exclusive = simulate(&Exclusive, &trace, &shape(256), |_, _| {});
        let paper = simulate(&DiluPaper, &trace, &shape(256), |_, _| {});
        let ours = simulate(&Complementary::default(), &trace, &shape(256), |_, _| {});
        assert_eq!(exclusive.rejected + paper.rejected + ours.rejected, 0);
        assert!(paper.gpu_hours < exclusive.gpu_hours);
        assert!(ours.gpu_hours < exclusive.gpu_hours);
    }
}
