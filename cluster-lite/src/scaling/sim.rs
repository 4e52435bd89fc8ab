//! The simulation loop (see the module docs of `scaling`): steps of
//! `step_s`; in each, Poisson arrivals per function, vertical scaling per
//! GPU, a fluid queue per function; once a second, the scaler.
//!
//! Vertical scaling: each ready instance of a function takes an even part
//! of its load (arrivals plus draining the backlog within the step) and
//! wants the smallest share in [request, limit] that serves it. On each
//! GPU requests are guaranteed and what instances want above them is
//! scaled down together when the GPU would go over 1 (the node manager
//! lends idle share up to the limits). A request's latency is its wait
//! behind the backlog (and behind the step's arrivals beyond what the step
//! serves) at the function's serving rate, plus one batch at the
//! instances' mean share; a step with no ready instance misses the SLO for
//! all its requests. A client gives up after `MAX_WAIT_S` (the queue is
//! bounded, as a router's is).
//!
//! Start times: a new instance serves after its runtime starts (container,
//! CUDA context, framework) and its weights load from storage. With warm
//! starts ([`Setup::warm_starts`], SMore's idea of preloading by
//! prediction), a function also keeps *warm* instances: processes whose
//! weights sit in a node's host memory and that hold no GPU. An instance
//! scaled in is offloaded to one (its weights go back to host memory), and
//! the function's predicted need (the load [`DiluRule`] expects within one
//! cold start) is pre-warmed ahead of load; one started on a node holding a
//! ready warm instance of its function serves after the warm start (CUDA
//! context, weights from host memory) instead of the cold one. Warm
//! instances cost host memory (reported as GiB-hours), not GPU-hours.

use crate::model::{ClusterState, InstanceDemand, WorkClass};
use crate::policy::{PlacementPolicy, Replica, place, place_on_node, policy_by_name};
use crate::rng::SeededRng;

use super::pattern::Pattern;
use super::scalers::{DiluRule, Scaler, Signals, scaler_by_name};
use super::service::Service;

/// Longest a request waits before its client gives up, seconds.
pub const MAX_WAIT_S: f64 = 2.0;
/// With warm starts: how long a warm copy beyond the prediction is kept
/// after it was last used (the keep-alive serverless platforms give idle
/// instances). The prediction remembers rises as long as the scaler does.
pub const KEEP_WARM_S: f64 = 600.0;

/// The cluster and the clock.
#[derive(Debug, Clone)]
pub struct Setup {
    pub gpus: usize,
    pub gpus_per_node: usize,
    pub gpu_memory: u64,
    /// Seconds from an instance's start until its weights begin to load:
    /// container, CUDA context, framework.
    pub runtime_start_s: f64,
    /// Bytes per second weights load from storage (a cold start).
    pub storage_bytes_per_s: f64,
    /// Seconds a warm instance takes to serve again apart from its
    /// weights (a CUDA context), and the bytes per second its weights load
    /// from host memory.
    pub warm_runtime_s: f64,
    pub host_bytes_per_s: f64,
    /// Keep warm instances: offload the ones scaled in, pre-warm the
    /// predicted need.
    pub warm_starts: bool,
    pub step_s: f64,
    pub seed: u64,
    /// Placement policy for new instances.
    pub policy: String,
    /// The scaler's target (`None`: its default; see
    /// [`super::scalers::default_target`]).
    pub target: Option<f64>,
    /// Seconds played before the counted run, the pattern's preceding
    /// seconds (it wraps): scalers start with the history a running
    /// service has, and nothing of the warm-up is counted.
    pub warmup_s: usize,
}

/// One function: its serving model and its load.
#[derive(Debug, Clone)]
pub struct Function {
    pub service: Service,
    pub pattern: Pattern,
    /// Seconds into the pattern this function starts.
    pub offset_s: usize,
    /// Requests per second at the pattern's peak.
    pub peak_rps: f64,
    pub memory_bytes: u64,
    /// Bytes of weights an instance loads before it serves.
    pub weight_bytes: u64,
}

impl Function {
    fn rate(&self, second: usize) -> f64 {
        self.pattern.rate(second, self.offset_s) / self.pattern.peak() * self.peak_rps
    }

    /// Seconds from a cold start until the instance serves.
    pub fn cold_start_s(&self, setup: &Setup) -> f64 {
        setup.runtime_start_s + self.weight_bytes as f64 / setup.storage_bytes_per_s
    }

    /// Seconds from a warm instance's start until it serves.
    pub fn warm_start_s(&self, setup: &Setup) -> f64 {
        setup.warm_runtime_s + self.weight_bytes as f64 / setup.host_bytes_per_s
    }
}

/// What one scaler did with one set of functions.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub scaler: String,
    pub requests: f64,
    pub within_slo: f64,
    pub gpu_hours: f64,
    pub starts: usize,
    /// Starts no GPU could take.
    pub refused: usize,
    /// Instances (ready and starting) of all functions, once a second.
    pub instances: Vec<(f64, f64)>,
    /// Starts that were warm (from a warm instance).
    pub warm_starts: usize,
    /// Host memory warm instances held, GiB-hours.
    pub warm_gib_hours: f64,
    /// Requests that missed their SLO: (second, function index, requests),
    /// one entry per second and function with any.
    pub missed: Vec<(usize, usize, f64)>,
    /// Requests that arrived, by function index.
    pub requests_by_function: Vec<f64>,
}

impl Outcome {
    /// Forgets everything counted so far (at the end of a warm-up).
    fn forget_warm_up(&mut self) {
        *self = Outcome {
            scaler: std::mem::take(&mut self.scaler),
            ..Outcome::default()
        };
    }

    pub fn attainment(&self) -> f64 {
        if self.requests <= 0.0 {
            return 1.0;
        }
        self.within_slo / self.requests
    }

    /// The lowest attainment of any one function: each function's owner
    /// wants the goal for it, and a pooled figure can hide a quiet function
    /// that misses most of its requests behind a busy one that misses none.
    pub fn worst_function_attainment(&self) -> f64 {
        let mut missed = vec![0.0; self.requests_by_function.len()];
        for &(_, function, requests) in &self.missed {
            if let Some(sum) = missed.get_mut(function) {
                *sum += requests;
            }
        }
        self.requests_by_function
            .iter()
            .zip(&missed)
            .filter(|(requests, _)| **requests > 0.0)
            .map(|(requests, missed)| 1.0 - missed / requests)
            .fold(1.0, f64::min)
    }

    /// The mean of one scaler's outcomes over seeds: requests, GPU- and
    /// GiB-hours and starts averaged, refusals, misses and each function's
    /// requests summed, the first seed's instance series.
    pub fn mean_of(outcomes: &[Outcome]) -> Outcome {
        let count = outcomes.len().max(1) as f64;
        let mean = |value: fn(&Outcome) -> f64| outcomes.iter().map(value).sum::<f64>() / count;
        let mut out = outcomes.first().cloned().unwrap_or_default();
        out.requests = mean(|o| o.requests);
        out.within_slo = mean(|o| o.within_slo);
        out.gpu_hours = mean(|o| o.gpu_hours);
        out.warm_gib_hours = mean(|o| o.warm_gib_hours);
        out.starts = mean(|o| o.starts as f64).round() as usize;
        out.warm_starts = mean(|o| o.warm_starts as f64).round() as usize;
        out.refused = outcomes.iter().map(|o| o.refused).sum();
        out.missed = outcomes.iter().flat_map(|o| o.missed.clone()).collect();
        // Summed, as the misses are, so each function's share stays right.
        let functions = outcomes.iter().map(|o| o.requests_by_function.len()).max();
        out.requests_by_function = (0..functions.unwrap_or(0))
            .map(|f| {
                outcomes
                    .iter()
                    .filter_map(|o| o.requests_by_function.get(f))
                    .sum()
            })
            .collect();
        out
    }

    pub fn mean_instances(&self) -> f64 {
        self.instances.iter().map(|(_, n)| n).sum::<f64>() / self.instances.len().max(1) as f64
    }
}

struct Instance {
    gpu: usize,
    ready_at: f64,
    want: f64,
    granted: f64,
}

/// A warm instance: weights in `node`'s host memory, no GPU; usable from
/// `ready_at` (a pre-warm loads its weights from storage first).
struct Warm {
    node: usize,
    ready_at: f64,
}

struct Running {
    instances: Vec<Instance>,
    warm: Vec<Warm>,
    /// What predicts the warm instances to keep (warm starts only).
    predictor: Option<DiluRule>,
    backlog: f64,
    scaler: Box<dyn Scaler>,
    second: Signals,
    concurrency_sum: f64,
    steps_in_second: u32,
}

fn poisson(rng: &mut SeededRng, mean: f64) -> f64 {
    if mean <= 0.0 {
        return 0.0;
    }
    if mean > 30.0 {
        // Normal approximation (Box-Muller) where counting would be slow.
        let (u, v) = (rng.unit().max(1e-12), rng.unit());
        let normal = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
        return (mean + mean.sqrt() * normal).round().max(0.0);
    }
    let (limit, mut product, mut count) = ((-mean).exp(), rng.unit(), 0.0);
    while product > limit {
        product *= rng.unit();
        count += 1.0;
    }
    count
}

fn demand(function: &Function) -> InstanceDemand {
    InstanceDemand {
        class: WorkClass::Latency,
        sm_request: function.service.request,
        sm_limit: function.service.limit,
        memory_bytes: function.memory_bytes,
        gpus: 1,
    }
}

/// Runs `functions` for `seconds` under the scaler named `scaler`.
pub fn run(
    setup: &Setup,
    functions: &[Function],
    scaler: &str,
    seconds: usize,
) -> Result<Outcome, String> {
    let policy = policy_by_name(&setup.policy)
        .ok_or_else(|| format!("unknown placement policy {:?}", setup.policy))?;
    let warmup = setup.warmup_s;
    // The warm-up plays the seconds before each function's offset.
    let shifted: Vec<Function> = functions
        .iter()
        .map(|function| {
            let length = function.pattern.seconds().max(1);
            Function {
                offset_s: (function.offset_s + length - warmup % length) % length,
                ..function.clone()
            }
        })
        .collect();
    let functions = &shifted[..];
    let mut cluster = ClusterState::uniform(
        setup.gpus.div_ceil(setup.gpus_per_node.max(1)),
        setup.gpus_per_node.max(1),
        setup.gpu_memory,
    );
    let mut rng = SeededRng::new(setup.seed);
    let mut outcome = Outcome {
        scaler: scaler.to_string(),
        ..Outcome::default()
    };
    let mut running = Vec::with_capacity(functions.len());
    for function in functions {
        let cold = function.cold_start_s(setup);
        // With warm instances to call on, the scaler plans for the warm
        // start; the predictor keeps enough of them for a cold one.
        let scaler_start = if setup.warm_starts {
            function.warm_start_s(setup)
        } else {
            cold
        };
        let scaler = scaler_by_name(scaler, scaler_start.ceil() as usize, setup.target)
            .ok_or_else(|| format!("unknown scaler {scaler:?} or target {:?}", setup.target))?;
        let first = (function.rate(0) / function.service.throughput(function.service.request))
            .ceil()
            .max(1.0) as usize;
        let mut state = Running {
            instances: Vec::new(),
            warm: Vec::new(),
            predictor: setup
                .warm_starts
                .then(|| DiluRule::new(cold.ceil() as usize)),
            backlog: 0.0,
            scaler,
            second: Signals::default(),
            concurrency_sum: 0.0,
            steps_in_second: 0,
        };
        for _ in 0..first {
            start(
                policy.as_ref(),
                &mut cluster,
                setup,
                function,
                &mut state,
                0.0,
                &mut outcome,
            );
        }
        running.push(state);
    }
    let steps_per_second = (1.0 / setup.step_s).round().max(1.0) as usize;
    let dt = 1.0 / steps_per_second as f64;
    let mut on_gpu: Vec<Vec<(usize, usize)>> = vec![Vec::new(); cluster.gpus.len()];
    for second in 0..warmup + seconds {
        if second == warmup && warmup > 0 {
            outcome.forget_warm_up();
        }
        for substep in 0..steps_per_second {
            let now = second as f64 + substep as f64 * dt;
            let arrivals: Vec<f64> = functions
                .iter()
                .map(|function| poisson(&mut rng, function.rate(second) * dt))
                .collect();
            for list in &mut on_gpu {
                list.clear();
            }
            for (index, (function, state)) in functions.iter().zip(&mut running).enumerate() {
                let ready = state.instances.iter().filter(|i| i.ready_at <= now).count();
                let load = (arrivals[index] + state.backlog) / dt;
                for (slot, instance) in state.instances.iter_mut().enumerate() {
                    instance.want = if instance.ready_at <= now {
                        function.service.share_for(load / ready.max(1) as f64)
                    } else {
                        0.0
                    };
                    on_gpu[instance.gpu].push((index, slot));
                }
            }
            grant(functions, &mut running, &on_gpu);
            for (index, (function, state)) in functions.iter().zip(&mut running).enumerate() {
                serve(
                    index,
                    &function.service,
                    state,
                    arrivals[index],
                    now,
                    dt,
                    &mut outcome,
                );
            }
            outcome.gpu_hours += cluster.active_gpus() as f64 * dt / 3600.0;
        }
        let mut total = 0usize;
        for (function, state) in functions.iter().zip(&mut running) {
            let now = (second + 1) as f64;
            let ready = state.instances.iter().filter(|i| i.ready_at <= now).count();
            let mut signals = state.second;
            signals.ready = ready;
            signals.starting = state.instances.len() - ready;
            signals.concurrency = state.concurrency_sum / f64::from(state.steps_in_second.max(1));
            let desired = state.scaler.desired(&signals, &function.service).max(1);
            let mut count = state.instances.len();
            while count < desired {
                start(
                    policy.as_ref(),
                    &mut cluster,
                    setup,
                    function,
                    state,
                    now,
                    &mut outcome,
                );
                if state.instances.len() == count {
                    break;
                }
                count = state.instances.len();
            }
            while state.instances.len() > desired {
                stop(policy.as_ref(), &mut cluster, setup, function, state, now);
            }
            if state.predictor.is_some() {
                keep_warm(
                    policy.as_ref(),
                    &cluster,
                    setup,
                    function,
                    state,
                    signals.requests,
                    now,
                );
            }
            outcome.warm_gib_hours +=
                state.warm.len() as f64 * function.weight_bytes as f64 / GIB / 3600.0;
            state.second = Signals::default();
            state.concurrency_sum = 0.0;
            state.steps_in_second = 0;
            total += state.instances.len();
        }
        if second >= warmup {
            outcome
                .instances
                .push(((second + 1 - warmup) as f64, total as f64));
        }
    }
    for missed in &mut outcome.missed {
        missed.0 -= warmup;
    }
    Ok(outcome)
}

/// Shares granted on each GPU: requests first, what instances want above
/// them scaled down together where the GPU would go over 1.
fn grant(functions: &[Function], running: &mut [Running], on_gpu: &[Vec<(usize, usize)>]) {
    for list in on_gpu {
        let mut requests = 0.0;
        let mut extra = 0.0;
        for &(function, slot) in list {
            let instance = &running[function].instances[slot];
            if instance.want > 0.0 {
                let request = functions[function].service.request;
                requests += request;
                extra += (instance.want - request).max(0.0);
            }
        }
        let scale = if extra > 0.0 {
            ((1.0 - requests).max(0.0) / extra).min(1.0)
        } else {
            1.0
        };
        for &(function, slot) in list {
            let request = functions[function].service.request;
            let instance = &mut running[function].instances[slot];
            instance.granted = if instance.want > 0.0 {
                request + (instance.want - request).max(0.0) * scale
            } else {
                0.0
            };
        }
    }
}

fn serve(
    function: usize,
    service: &Service,
    state: &mut Running,
    arrivals: f64,
    now: f64,
    dt: f64,
    outcome: &mut Outcome,
) {
    let serving: Vec<f64> = state
        .instances
        .iter()
        .filter(|i| i.ready_at <= now)
        .map(|i| i.granted)
        .collect();
    let rate: f64 = serving.iter().map(|&share| service.throughput(share)).sum();
    let load = (arrivals + state.backlog) / dt;
    let mean_share = serving.iter().sum::<f64>() / serving.len().max(1) as f64;
    let latency = if rate > 0.0 {
        // Fluid: the backlog, and the part of this step's arrivals beyond
        // what the step serves, wait; arrivals within the rate do not.
        let overflow = (arrivals - rate * dt).max(0.0);
        (state.backlog + overflow / 2.0) / rate + service.batch_latency(mean_share)
    } else {
        f64::INFINITY
    };
    outcome.requests += arrivals;
    if outcome.requests_by_function.len() <= function {
        outcome.requests_by_function.resize(function + 1, 0.0);
    }
    outcome.requests_by_function[function] += arrivals;
    if latency <= service.slo_s {
        outcome.within_slo += arrivals;
    } else if arrivals > 0.0 {
        state.second.over_slo = true;
        let second = now as usize;
        match outcome.missed.last_mut() {
            Some(last) if last.0 == second && last.1 == function => last.2 += arrivals,
            _ => outcome.missed.push((second, function, arrivals)),
        }
    }
    if load > rate + 1e-9 {
        state.second.saturated = true;
    }
    state.second.requests += arrivals;
    let in_batch = if rate > 0.0 {
        (arrivals / dt).min(rate) * service.batch_latency(mean_share)
    } else {
        0.0
    };
    state.concurrency_sum += state.backlog + in_batch;
    state.steps_in_second += 1;
    // A client gives up after `MAX_WAIT_S` (those requests were already
    // counted as misses); with no instance serving, requests fail at once.
    state.backlog = (state.backlog + arrivals - rate * dt).clamp(0.0, rate * MAX_WAIT_S);
}

const GIB: f64 = (1u64 << 30) as f64;

/// Starts one instance of `function`: warm where the placement can use a
/// ready warm instance's node, else cold; at time 0 every instance is warm
/// (the run starts in a steady state).
fn start(
    policy: &dyn PlacementPolicy,
    cluster: &mut ClusterState,
    setup: &Setup,
    function: &Function,
    state: &mut Running,
    now: f64,
    outcome: &mut Outcome,
) {
    let demand = demand(function);
    let warm_at = state.warm.iter().enumerate().find_map(|(index, warm)| {
        if warm.ready_at > now {
            return None;
        }
        place_on_node(policy, cluster, &demand, warm.node).map(|placement| (index, placement))
    });
    let (placement, warm) = match warm_at {
        Some((index, placement)) => {
            state.warm.swap_remove(index);
            (placement, true)
        }
        None => match place(policy, cluster, &demand) {
            Some(placement) => (placement, false),
            None => {
                outcome.refused += 1;
                return;
            }
        },
    };
    cluster.apply(&demand, &placement.gpus);
    let ready_at = if now == 0.0 {
        0.0
    } else if warm {
        now + function.warm_start_s(setup)
    } else {
        now + function.cold_start_s(setup)
    };
    state.instances.push(Instance {
        gpu: placement.gpus[0],
        ready_at,
        want: 0.0,
        granted: 0.0,
    });
    outcome.starts += usize::from(now > 0.0);
    outcome.warm_starts += usize::from(now > 0.0 && warm);
}

/// Stops the newest starting instance, else the ready one the policy
/// chooses (`dilu` drains lightly loaded GPUs), else the last. With warm
/// starts a ready one is offloaded: it stays warm on its node.
fn stop(
    policy: &dyn PlacementPolicy,
    cluster: &mut ClusterState,
    setup: &Setup,
    function: &Function,
    state: &mut Running,
    now: f64,
) {
    let demand = demand(function);
    let victim = match state.instances.iter().rposition(|i| i.ready_at > now) {
        Some(starting) => starting,
        None => {
            let gpus: Vec<[usize; 1]> = state.instances.iter().map(|i| [i.gpu]).collect();
            let replicas: Vec<Replica<'_>> = gpus
                .iter()
                .map(|gpu| Replica {
                    demand: &demand,
                    gpus: gpu,
                })
                .collect();
            policy
                .choose_scale_in_victim(cluster, &replicas)
                .unwrap_or(state.instances.len() - 1)
        }
    };
    let instance = state.instances.remove(victim);
    cluster.release(&demand, &[instance.gpu]);
    if setup.warm_starts && instance.ready_at <= now {
        state.warm.push(Warm {
            node: cluster.gpus[instance.gpu].node,
            ready_at: now,
        });
    }
}

/// Keeps at least as many warm instances as the prediction asks: the
/// instances the load expected within one cold start would need, less
/// those running. Missing ones are pre-warmed on the node the placement
/// would choose now (ready after a cold start, holding no GPU); beyond the
/// prediction, a copy goes [`KEEP_WARM_S`] after it was last used or became
/// ready, the oldest first.
fn keep_warm(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    setup: &Setup,
    function: &Function,
    state: &mut Running,
    requests: f64,
    now: f64,
) {
    let Some(predictor) = state.predictor.as_mut() else {
        return;
    };
    let load = requests / function.service.throughput(function.service.limit);
    let instances = state.instances.len();
    predictor.observe(load);
    let predicted = predictor.planned_instances();
    let wanted = predicted.saturating_sub(instances);
    // Beyond the prediction, copies stay for a keep-alive after they were
    // last used (host memory is cheap beside a cold start); the oldest go
    // first.
    state.warm.sort_by(|a, b| b.ready_at.total_cmp(&a.ready_at));
    let mut kept = 0;
    state.warm.retain(|warm| {
        kept += 1;
        kept <= wanted || now - warm.ready_at < KEEP_WARM_S
    });
    if state.warm.len() < wanted {
        let demand = demand(function);
        let Some(placement) = place(policy, cluster, &demand) else {
            return;
        };
        let node = cluster.gpus[placement.gpus[0]].node;
        while state.warm.len() < wanted {
            state.warm.push(Warm {
                node,
                ready_at: now + function.cold_start_s(setup),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_profile::table::ProfileTable;

    /// One batch size; 1,000 req/s at 30% SM (the request), 1,800 at 60%
    /// (the limit), 1,820 at 100%.
    fn service() -> Service {
        let table = ProfileTable::parse(
            "1,10,0.050,400\n1,30,0.020,1000\n1,60,0.012,1800\n1,100,0.011,1820\n",
        )
        .unwrap();
        let service = Service::profiled("f", &table, 0.021, 2.0).unwrap();
        assert_eq!((service.request, service.limit), (0.3, 0.6));
        service
    }

    fn steady(rate: f64) -> Function {
        after_a_quiet_second(rate, 1.0)
    }

    /// `first` × `peak` req/s in the first second, then `peak`.
    fn after_a_quiet_second(peak: f64, first: f64) -> Function {
        let text = format!("{first}\n{}", "1\n".repeat(999));
        Function {
            service: service(),
            pattern: Pattern::parse("steady", &text).unwrap(),
            offset_s: 0,
            peak_rps: peak,
            memory_bytes: 1 << 30,
            weight_bytes: 1 << 30,
        }
    }

    fn setup() -> Setup {
        Setup {
            gpus: 8,
            gpus_per_node: 8,
            gpu_memory: 80 << 30,
            runtime_start_s: 9.0,
            storage_bytes_per_s: (1u64 << 30) as f64,
            warm_runtime_s: 0.5,
            host_bytes_per_s: (2u64 << 30) as f64,
            warm_starts: false,
            step_s: 0.1,
            seed: 3,
            policy: "dilu".into(),
            target: None,
            warmup_s: 0,
        }
    }

    #[test]
    fn load_within_one_instances_limit_stays_vertical_under_dilu_only() {
        // 1,050 req/s (Poisson, seeded): more than one instance serves at
        // its request (1,000), well within what it serves at its limit
        // (1,800), noise and all. Both start with two (1,050 over 1,000),
        // Dilu's rule keeps them; dilu's gives one back.
        let functions = [steady(1050.0)];
        let dilu = run(&setup(), &functions, "dilu", 300).unwrap();
        let paper = run(&setup(), &functions, "dilu-paper", 300).unwrap();
        assert_eq!((dilu.starts, dilu.instances.last().unwrap().1), (0, 1.0));
        assert_eq!(
            paper.instances.last().unwrap().1,
            2.0,
            "Dilu's rule counts at the request"
        );
        assert!(dilu.attainment() > 0.99, "{}", dilu.attainment());
        assert!(dilu.mean_instances() < paper.mean_instances());
    }

    #[test]
    fn with_warm_starts_a_load_that_returns_finds_its_instances_warm() {
        // 4,000 req/s (three instances at their limits) for 200 s, 500 for
        // 300 s, then 4,000 again.
        let mut text = "8\n".repeat(200);
        text.push_str(&"1\n".repeat(300));
        text.push_str(&"8\n".repeat(300));
        let function = Function {
            pattern: Pattern::parse("returns", &text).unwrap(),
            ..steady(4000.0)
        };
        let functions = [function];
        let cold = run(&setup(), &functions, "dilu", 800).unwrap();
        let warm_setup = Setup {
            warm_starts: true,
            ..setup()
        };
        let warm = run(&warm_setup, &functions, "dilu", 800).unwrap();
        assert_eq!((cold.warm_starts, cold.warm_gib_hours), (0, 0.0));
        // The instances scaled in during the lull were kept warm, and the
        // return started them warm (0.5 s and 1 GiB at 2 GiB/s: 1 s, not 10).
        assert!(warm.warm_starts >= 2, "{} warm starts", warm.warm_starts);
        assert!(warm.warm_gib_hours > 0.0);
        assert!(
            warm.attainment() > cold.attainment(),
            "warm {} cold {}",
            warm.attainment(),
            cold.attainment()
        );
        // Warm copies hold host memory, not GPUs.
        assert!(warm.gpu_hours <= cold.gpu_hours * 1.05);
    }

    #[test]
    fn a_warm_up_plays_the_seconds_before_and_counts_none_of_them() {
        // 500 req/s with a burst of 4,000 (three instances at their
        // limits) for 10 s in every 100. From a cold start the scaler
        // meets the first burst unwarned; after a warm-up of the 300 s
        // before (the pattern wraps), it has seen three and keeps room.
        let mut text = String::new();
        for _ in 0..5 {
            text.push_str(&"1\n".repeat(90));
            text.push_str(&"8\n".repeat(10));
        }
        let function = Function {
            pattern: Pattern::parse("bursts", &text).unwrap(),
            ..steady(4000.0)
        };
        let functions = [function];
        let cold = run(&setup(), &functions, "dilu", 300).unwrap();
        let warmed = Setup {
            warmup_s: 300,
            ..setup()
        };
        let warm = run(&warmed, &functions, "dilu", 300).unwrap();
        // Only the counted 300 s: as many requests (Poisson around 4,000 a
        // second), as many points of the instance series, numbered alike.
        assert_eq!(warm.instances.len(), 300);
        assert_eq!(warm.instances[0].0, 1.0);
        let ratio = warm.requests / cold.requests;
        assert!((0.98..1.02).contains(&ratio), "{ratio}");
        assert!(warm.missed.iter().all(|m| m.0 < 300));
        // The cold start misses in the first burst; after the warm-up,
        // hardly any.
        assert!(cold.attainment() < 0.99, "{}", cold.attainment());
        assert!(warm.attainment() > 0.999, "{}", warm.attainment());
    }

    #[test]
    fn a_quiet_function_missing_half_its_requests_is_the_worst_though_the_pool_is_fine() {
        let busy_and_quiet = Outcome {
            requests: 1010.0,
            within_slo: 1005.0,
            requests_by_function: vec![1000.0, 10.0],
            missed: vec![(3, 1, 2.0), (4, 1, 3.0)],
            ..Outcome::default()
        };
        assert!(busy_and_quiet.attainment() > 0.99);
        assert_eq!(busy_and_quiet.worst_function_attainment(), 0.5);
        // Over seeds, each function's misses are weighed against its own
        // requests in every seed.
        let clean = Outcome {
            missed: Vec::new(),
            within_slo: 1010.0,
            ..busy_and_quiet.clone()
        };
        let mean = Outcome::mean_of(&[busy_and_quiet, clean]);
        assert_eq!(mean.worst_function_attainment(), 0.75);
        // A run counts each function's arrivals, which add up to the whole.
        let functions = [steady(1050.0), steady(40.0)];
        let outcome = run(&setup(), &functions, "dilu", 60).unwrap();
        let by_function = &outcome.requests_by_function;
        assert_eq!(by_function.len(), 2);
        assert!(by_function[0] > 20.0 * by_function[1], "{by_function:?}");
        let sum: f64 = by_function.iter().sum();
        assert!(
            (sum - outcome.requests).abs() < 1e-6,
            "{sum} {}",
            outcome.requests
        );
    }

    #[test]
    fn load_beyond_the_limit_scales_out_under_every_scaler() {
        // 4,000 req/s needs three instances at their limits.
        let functions = [steady(4000.0)];
        for scaler in crate::scaling::scalers::SCALER_NAMES {
            let outcome = run(&setup(), &functions, scaler, 400).unwrap();
            let last = outcome.instances.last().unwrap().1;
            assert!(
                last >= 3.0,
                "{scaler}: {last} instances, {} refused, {} starts",
                outcome.refused,
                outcome.starts
            );
            assert!(
                outcome.attainment() > 0.5,
                "{scaler}: {}",
                outcome.attainment()
            );
        }
    }
}
