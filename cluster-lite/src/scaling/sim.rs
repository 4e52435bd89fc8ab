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

use crate::model::{ClusterState, InstanceDemand, WorkClass};
use crate::policy::{PlacementPolicy, Replica, place, policy_by_name};
use crate::rng::SeededRng;

use super::pattern::Pattern;
use super::scalers::{Scaler, Signals, scaler_by_name};
use super::service::Service;

/// Longest a request waits before its client gives up, seconds.
pub const MAX_WAIT_S: f64 = 2.0;

/// The cluster and the clock.
#[derive(Debug, Clone)]
pub struct Setup {
    pub gpus: usize,
    pub gpus_per_node: usize,
    pub gpu_memory: u64,
    /// Seconds from an instance's start until it serves.
    pub cold_start_s: f64,
    pub step_s: f64,
    pub seed: u64,
    /// Placement policy for new instances.
    pub policy: String,
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
}

impl Function {
    fn rate(&self, second: usize) -> f64 {
        self.pattern.rate(second, self.offset_s) / self.pattern.peak() * self.peak_rps
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
}

impl Outcome {
    pub fn attainment(&self) -> f64 {
        if self.requests <= 0.0 {
            return 1.0;
        }
        self.within_slo / self.requests
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

struct Running {
    instances: Vec<Instance>,
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
        let scaler = scaler_by_name(scaler).ok_or_else(|| format!("unknown scaler {scaler:?}"))?;
        let first = (function.rate(0) / function.service.throughput(function.service.request))
            .ceil()
            .max(1.0) as usize;
        let mut state = Running {
            instances: Vec::new(),
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
                function,
                &mut state,
                0.0,
                setup.cold_start_s,
                &mut outcome,
            );
        }
        running.push(state);
    }
    let steps_per_second = (1.0 / setup.step_s).round().max(1.0) as usize;
    let dt = 1.0 / steps_per_second as f64;
    let mut on_gpu: Vec<Vec<(usize, usize)>> = vec![Vec::new(); cluster.gpus.len()];
    for second in 0..seconds {
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
                    function,
                    state,
                    now,
                    setup.cold_start_s,
                    &mut outcome,
                );
                if state.instances.len() == count {
                    break;
                }
                count = state.instances.len();
            }
            while state.instances.len() > desired {
                stop(policy.as_ref(), &mut cluster, function, state, now);
            }
            state.second = Signals::default();
            state.concurrency_sum = 0.0;
            state.steps_in_second = 0;
            total += state.instances.len();
        }
        outcome.instances.push(((second + 1) as f64, total as f64));
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
    if latency <= service.slo_s {
        outcome.within_slo += arrivals;
    } else if arrivals > 0.0 {
        state.second.over_slo = true;
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

fn start(
    policy: &dyn PlacementPolicy,
    cluster: &mut ClusterState,
    function: &Function,
    state: &mut Running,
    now: f64,
    cold_start_s: f64,
    outcome: &mut Outcome,
) {
    let demand = demand(function);
    let Some(placement) = place(policy, cluster, &demand) else {
        outcome.refused += 1;
        return;
    };
    cluster.apply(&demand, &placement.gpus);
    // The first instances are warm: the run starts in a steady state.
    let ready_at = if now == 0.0 { 0.0 } else { now + cold_start_s };
    state.instances.push(Instance {
        gpu: placement.gpus[0],
        ready_at,
        want: 0.0,
        granted: 0.0,
    });
    outcome.starts += usize::from(now > 0.0);
}

/// Stops the newest starting instance, else the ready one the policy
/// chooses (`dilu` drains lightly loaded GPUs), else the last.
fn stop(
    policy: &dyn PlacementPolicy,
    cluster: &mut ClusterState,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_profile::table::ProfileTable;

    /// One batch size; 100 req/s at 30% SM (the request), 180 at 60%
    /// (the limit), 182 at 100%.
    fn service() -> Service {
        let table =
            ProfileTable::parse("1,10,0.050,40\n1,30,0.020,100\n1,60,0.012,180\n1,100,0.011,182\n")
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
        }
    }

    fn setup() -> Setup {
        Setup {
            gpus: 8,
            gpus_per_node: 8,
            gpu_memory: 80 << 30,
            cold_start_s: 10.0,
            step_s: 0.1,
            seed: 3,
            policy: "dilu".into(),
        }
    }

    #[test]
    fn load_within_one_instances_limit_stays_vertical_under_dilu_only() {
        // 105 req/s (Poisson, seeded) after a quiet first second: mostly
        // more than one instance serves at its request (100), well within
        // what it serves at its limit (180). Both start with one.
        let functions = [after_a_quiet_second(105.0, 0.5)];
        let dilu = run(&setup(), &functions, "dilu", 300).unwrap();
        let paper = run(&setup(), &functions, "dilu-paper", 300).unwrap();
        assert_eq!(dilu.instances[0].1, 1.0);
        assert_eq!((dilu.starts, dilu.instances.last().unwrap().1), (0, 1.0));
        assert!(paper.starts >= 1, "Dilu's rule counts at the request");
        assert!(dilu.attainment() > 0.99, "{}", dilu.attainment());
        assert!(dilu.mean_instances() < paper.mean_instances());
    }

    #[test]
    fn load_beyond_the_limit_scales_out_under_every_scaler() {
        // 400 req/s needs three instances at their limits.
        let functions = [steady(400.0)];
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
