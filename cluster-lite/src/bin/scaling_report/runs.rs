//! The simulated cluster, the functions on it and one load's runs: what
//! every table of the report shares.

use dilu_cluster::scaling::pattern::Pattern;
use dilu_cluster::scaling::scalers::RISE_MEMORY;
use dilu_cluster::scaling::service::Service;
use dilu_cluster::scaling::sim::{Function, KEEP_WARM_S, Outcome, Setup, run};

const GIB: u64 = 1 << 30;
/// Instances' throughput (at their requests) the busiest second asks for.
pub const PEAK_INSTANCES: f64 = 6.0;
/// Seconds from an instance's start until its weights begin to load: the
/// low ends of CUDA context set-up (5 s) and framework start-up (3 s)
/// measured on Alibaba's serverless platform (HydraServe, NSDI'26), plus
/// 2 s for the container. Other values are swept below.
pub const RUNTIME_START_S: f64 = 10.0;
/// Weights from a remote model store at 4 Gbit/s.
pub const STORAGE_BYTES_PER_S: f64 = 0.5e9;
/// A warm instance's framework already runs: it creates a CUDA context
/// and copies its weights from host memory (pageable copies over PCIe 4).
pub const WARM_RUNTIME_S: f64 = 1.0;
pub const HOST_BYTES_PER_S: f64 = 10e9;
/// Model tables, the batch-latency SLO each is profiled for (seconds), and
/// the bytes of its weights (fp32, from the models' parameter counts:
/// 60.2 M, 110 M, 355 M, 774 M).
pub const MODELS: [(&str, &str, f64, u64); 4] = [
    (
        "resnet152",
        "dilu-profiles/bs_sm_resnet152.csv",
        0.030,
        241_000_000,
    ),
    (
        "bert-base",
        "dilu-profiles/bs_sm_bert_base.csv",
        0.060,
        440_000_000,
    ),
    (
        "roberta-large",
        "dilu-profiles-heldout/bs_sm_roberta_large.csv",
        0.070,
        1_420_000_000,
    ),
    (
        "gpt2-large",
        "dilu-profiles-heldout/bs_sm_gpt2_large.csv",
        0.090,
        3_096_000_000,
    ),
];
/// Seconds of each load played before it is counted (the pattern's
/// preceding seconds; it wraps): the longest memory among the scalers and
/// the warm-start predictor (dilu's rises, [`RISE_MEMORY`], the
/// predictor's too; [`KEEP_WARM_S`]; the HPA's stabilisation 300 s), so
/// that every one of them starts as a running service does, with its
/// memory full. Counted from a cold start, most of `dilu`'s missed
/// requests fell in the first five minutes, before it had seen any burst
/// of the function.
pub const WARM_UP_S: usize = max(KEEP_WARM_S as usize, RISE_MEMORY);

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

/// One load the scalers are run on: functions, length, seeds.
pub struct Case {
    pub name: String,
    pub held_out: bool,
    pub functions: Vec<Function>,
    pub seconds: usize,
    pub seeds: Vec<u64>,
}

/// The functions of `services`: the `i`-th follows `patterns[i % n]`,
/// starting `i × offset` of that pattern's length into it.
pub fn functions(services: &[Service], patterns: &[&Pattern], offset: f64) -> Vec<Function> {
    services
        .iter()
        .enumerate()
        .map(|(index, service)| {
            let pattern = patterns[index % patterns.len()];
            Function {
                service: service.clone(),
                pattern: pattern.clone(),
                offset_s: (index as f64 * offset * pattern.seconds() as f64) as usize,
                peak_rps: PEAK_INSTANCES * service.throughput(service.request),
                memory_bytes: 8 * GIB,
                weight_bytes: MODELS[index % MODELS.len()].3,
            }
        })
        .collect()
}

pub fn setup(seed: u64, runtime_start_s: f64, warm_starts: bool, target: Option<f64>) -> Setup {
    Setup {
        warmup_s: WARM_UP_S,
        ..setup_from(seed, runtime_start_s, warm_starts, target, 0)
    }
}

/// [`setup`] with `warmup_s` seconds played first.
pub fn setup_from(
    seed: u64,
    runtime_start_s: f64,
    warm_starts: bool,
    target: Option<f64>,
    warmup_s: usize,
) -> Setup {
    Setup {
        gpus: 64,
        gpus_per_node: 8,
        gpu_memory: 80 * GIB,
        runtime_start_s,
        storage_bytes_per_s: STORAGE_BYTES_PER_S,
        warm_runtime_s: WARM_RUNTIME_S,
        host_bytes_per_s: HOST_BYTES_PER_S,
        warm_starts,
        step_s: 0.1,
        seed,
        policy: "dilu".into(),
        target,
        warmup_s,
    }
}

pub fn run_case(
    case: &Case,
    scaler: &str,
    runtime_start_s: f64,
    warm: bool,
    target: Option<f64>,
) -> Result<Outcome, String> {
    let runs = case
        .seeds
        .iter()
        .map(|&seed| {
            run(
                &setup(seed, runtime_start_s, warm, target),
                &case.functions,
                scaler,
                case.seconds,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Outcome::mean_of(&runs))
}

/// `dilu` on `case` from a cold start: no warm-up, every scaler's memory
/// empty and the first seconds counted.
pub fn run_cold(case: &Case, warm: bool) -> Result<Outcome, String> {
    let runs = case
        .seeds
        .iter()
        .map(|&seed| {
            run(
                &setup_from(seed, RUNTIME_START_S, warm, None, 0),
                &case.functions,
                "dilu",
                case.seconds,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Outcome::mean_of(&runs))
}
