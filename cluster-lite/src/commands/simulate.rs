//! `dilu-cluster simulate`: generate or read a trace, replay it under one or
//! every policy, print the markdown table, optionally write md + SVG.

use std::io::{IsTerminal, Write};
use std::ops::RangeInclusive;
use std::path::PathBuf;

use clap::Args;
use dilu_abi::units::parse_size;
use std::sync::Arc;

use dilu_cluster::policy::{
    Complementary, POLICY_NAMES, POWER_POLICY_NAMES, POWER_WEIGHT, PWR_FGD_WEIGHTS,
    PlacementPolicy, PowerAware, PwrFgd, WorkloadMix, policy_for_workload,
};
use dilu_cluster::simulator::trace::{
    ArrivalPattern, TraceRecord, TraceSpec, count_without_gpus, generate, read_json_lines,
};
use dilu_cluster::simulator::{ClusterShape, SimulationResult, report, simulate};
use dilu_cluster::simulator::{inflation, openb};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Policies to replay: dilu, dilu-paper, fgd, infless-r, infless-l, exclusive, a
    /// comma-separated list of them (e.g. dilu,fgd), or all; besides them,
    /// the power-aware dilu-power and pwr-fgd (PWR+FGD), named only.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// dilu-power's price per 100 W a placement adds, in dilu's cost units
    /// (waking a GPU costs 10); only with --policy dilu-power.
    #[arg(long, value_name = "COST", value_parser = parse_power_weight)]
    pub power_weight: Option<f64>,
    /// pwr-fgd's plugin weights, PWR,FGD (default 200,800); only with
    /// --policy pwr-fgd.
    #[arg(long, value_name = "PWR,FGD", value_parser = parse_plugin_weights)]
    pub pwr_fgd_weights: Option<(u32, u32)>,
    /// Number of instances in the generated trace (each arrives and departs).
    #[arg(long, default_value_t = 1600)]
    pub events: usize,
    /// GPUs in the simulated cluster.
    #[arg(long, default_value_t = 4000)]
    pub gpus: usize,
    /// GPUs per node (gangs of dilu-paper and dilu may span nodes; the other
    /// policies keep a gang on one node).
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    /// Memory per GPU, e.g. 80GiB.
    #[arg(long, default_value = "80GiB", value_parser = parse_size)]
    pub gpu_memory: u64,
    /// Arrival pattern of the generated trace: poisson or bursty.
    #[arg(long, default_value = "poisson")]
    pub arrival: ArrivalPattern,
    /// Seed of the generated trace.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Read the trace from this JSON-lines file instead of generating one.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Profiles written by `dilu profile`, one per function as
    /// `DIR/<function>.toml`: each instance of a function that has one takes
    /// its class, SM request and SM limit from it.
    #[arg(long, value_name = "DIR")]
    pub profiles: Option<PathBuf>,
    /// Write cluster-sim.md and cluster-sim-active-gpus.svg into this folder.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the generated trace as JSON lines to this file.
    #[arg(long)]
    pub save_trace: Option<PathBuf>,
    /// Node list CSV of a real cluster (Alibaba openb format:
    /// sn,cpu_milli,memory_mib,gpu,model); replaces --gpus/--gpus-per-node.
    #[arg(long, value_name = "CSV")]
    pub nodes: Option<PathBuf>,
    /// Pod list CSV of a real cluster (Alibaba openb format), replayed by
    /// creation and deletion time; pods without GPUs take cores and host
    /// memory on the node the policy chooses.
    #[arg(long, value_name = "CSV", conflicts_with = "trace")]
    pub pods: Option<PathBuf>,
    /// SM limit of a pod read with --pods, as factors of its request for
    /// latency-sensitive (LS) pods and for the rest: LS,REST.
    #[arg(long, value_name = "LS,REST", default_value = "1.5,1.2", value_parser = parse_factors)]
    pub limit_factors: (f64, f64),
    /// `replay` (arrivals and departures in time) or `fgd` (FGD's protocol:
    /// pods drawn at random from the trace until --inflate-to of the GPU
    /// capacity is requested, arriving one by one, never leaving; prints the
    /// share of GPU capacity allocated at each 10% of requests from 50%).
    #[arg(long, default_value = "replay", value_parser = ["replay", "fgd"])]
    pub protocol: String,
    /// Requested share of the GPU capacity the fgd protocol stops at.
    #[arg(long, default_value_t = 1.3)]
    pub inflate_to: f64,
    /// Replay one generated trace per seed in FIRST..LAST (inclusive) and
    /// print how each policy compares with dilu-paper across them.
    #[arg(long, value_name = "FIRST..LAST", value_parser = parse_seed_range,
          conflicts_with_all = ["trace", "seed", "out", "save_trace"])]
    pub seeds: Option<RangeInclusive<u64>>,
}

fn parse_factors(text: &str) -> Result<(f64, f64), String> {
    let (latency, rest) = text
        .split_once(',')
        .ok_or_else(|| format!("expected LS,REST, got {text:?}"))?;
    let parse = |part: &str| match part.trim().parse::<f64>() {
        Ok(value) if value >= 1.0 && value.is_finite() => Ok(value),
        _ => Err(format!("limit factor {part:?}: expected a number >= 1")),
    };
    Ok((parse(latency)?, parse(rest)?))
}

fn parse_power_weight(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(weight) if weight >= 0.0 && weight.is_finite() => Ok(weight),
        _ => Err(format!("power weight {text:?}: expected a number >= 0")),
    }
}

fn parse_plugin_weights(text: &str) -> Result<(u32, u32), String> {
    let (pwr, fgd) = text
        .split_once(',')
        .ok_or_else(|| format!("expected PWR,FGD, got {text:?}"))?;
    let parse = |part: &str| {
        part.trim()
            .parse::<u32>()
            .map_err(|error| format!("plugin weight {part:?}: {error}"))
    };
    let weights = (parse(pwr)?, parse(fgd)?);
    if weights == (0, 0) {
        return Err("plugin weights 0,0 rank nothing".into());
    }
    Ok(weights)
}

/// Builds the policy `name` for `mix`, power-aware ones with `args`'
/// settings.
fn build_policy(
    name: &str,
    mix: Arc<WorkloadMix>,
    args: &SimulateArgs,
) -> Result<Box<dyn PlacementPolicy>, String> {
    Ok(match name {
        "dilu-power" => Box::new(PowerAware::new(
            Box::new(Complementary::for_workload(mix)),
            args.power_weight.unwrap_or(POWER_WEIGHT),
        )),
        "pwr-fgd" => Box::new(PwrFgd::new(
            mix,
            args.pwr_fgd_weights.unwrap_or(PWR_FGD_WEIGHTS),
        )),
        _ => policy_for_workload(name, mix).ok_or_else(|| format!("unknown policy {name}"))?,
    })
}

fn parse_seed_range(text: &str) -> Result<RangeInclusive<u64>, String> {
    let (first, last) = text
        .split_once("..")
        .ok_or_else(|| format!("expected FIRST..LAST, got {text:?}"))?;
    let parse = |part: &str| {
        part.trim()
            .parse::<u64>()
            .map_err(|error| format!("seed {part:?}: {error}"))
    };
    let (first, last) = (parse(first)?, parse(last)?);
    if first > last {
        return Err(format!("empty seed range {text:?}"));
    }
    Ok(first..=last)
}

/// Gives every instance of a function with a profile in `dir` the profile's
/// class, SM request and limit. Reports how many functions had one.
fn apply_profiles(trace: &mut [TraceRecord], dir: &std::path::Path) -> Result<(), String> {
    use dilu_profile::profile::{Class, Profile};
    if !dir.is_dir() {
        return Err(format!("--profiles {}: not a directory", dir.display()));
    }
    let mut found = std::collections::BTreeMap::<String, Option<Profile>>::new();
    for record in trace.iter_mut() {
        if !found.contains_key(&record.function) {
            let path = dir.join(format!("{}.toml", record.function));
            let profile = path.is_file().then(|| Profile::load(&path)).transpose()?;
            found.insert(record.function.clone(), profile);
        }
        if let Some(profile) = &found[&record.function] {
            record.class = match profile.class {
                Class::Latency => dilu_cluster::model::WorkClass::Latency,
                Class::Batch => dilu_cluster::model::WorkClass::Batch,
            };
            record.sm_request = f64::from(profile.sm_request) / 100.0;
            record.sm_limit = f64::from(profile.sm_limit) / 100.0;
        }
    }
    let with = found.values().filter(|p| p.is_some()).count();
    eprintln!(
        "dilu-cluster: profiles from {} for {with} of {} functions",
        dir.display(),
        found.len()
    );
    Ok(())
}

pub fn run(args: SimulateArgs) -> Result<(), String> {
    let mut names: Vec<&str> = Vec::new();
    for name in args.policy.split(',').map(str::trim) {
        let known = POLICY_NAMES.iter().chain(&POWER_POLICY_NAMES);
        let found: &[&str] = match known.clone().find(|known| **known == name) {
            Some(known) => std::slice::from_ref(known),
            None if name == "all" => &POLICY_NAMES,
            None => {
                return Err(format!(
                    "unknown policy {name:?}: expected one of {}, a comma-separated list of \
                     them, or all",
                    known.copied().collect::<Vec<_>>().join(", ")
                ));
            }
        };
        for known in found {
            if !names.contains(known) {
                names.push(known);
            }
        }
    }
    for (flag, set, policy) in [
        ("--power-weight", args.power_weight.is_some(), "dilu-power"),
        (
            "--pwr-fgd-weights",
            args.pwr_fgd_weights.is_some(),
            "pwr-fgd",
        ),
    ] {
        if set && !names.contains(&policy) {
            return Err(format!("{flag} applies to --policy {policy} only"));
        }
    }
    if args.gpus == 0 || args.gpus_per_node == 0 {
        return Err("--gpus and --gpus-per-node must be at least 1".into());
    }
    let shape = match &args.nodes {
        Some(path) => {
            let file = open(path)?;
            let nodes = openb::read_nodes(file, args.gpu_memory)
                .map_err(|error| format!("node list {}: {error}", path.display()))?;
            ClusterShape { nodes }
        }
        None => ClusterShape::uniform(args.gpus, args.gpus_per_node, args.gpu_memory),
    };
    if shape.gpus() == 0 {
        return Err("the cluster has no GPU".into());
    }
    let interactive = std::io::stderr().is_terminal();
    if let Some(seeds) = &args.seeds {
        if !names.contains(&"dilu-paper") {
            names.push("dilu-paper");
        }
        let mut runs = Vec::new();
        for seed in seeds.clone() {
            let mut trace = generate(&TraceSpec {
                instances: args.events,
                cluster_gpus: args.gpus,
                arrival: args.arrival,
                seed,
            });
            if let Some(dir) = &args.profiles {
                apply_profiles(&mut trace, dir)?;
            }
            runs.push(replay(&names, &trace, &shape, interactive, &args)?);
        }
        println!(
            "{} instances, {:?} arrivals, seeds {}..{}; cluster of {}, {} per GPU\n\n{}",
            args.events,
            args.arrival,
            seeds.start(),
            seeds.end(),
            shape.describe(),
            dilu_abi::units::format_size(args.gpu_memory),
            report::sweep_table(&runs)
        );
        return Ok(());
    }
    let limits = openb::LimitRule {
        latency_factor: args.limit_factors.0,
        batch_factor: args.limit_factors.1,
    };
    let mut trace = match (&args.trace, &args.pods) {
        (_, Some(path)) => {
            let list = openb::read_pods(open(path)?, limits, args.gpu_memory)
                .map_err(|error| format!("pod list {}: {error}", path.display()))?;
            if let Some(note) = list.absent_note() {
                eprintln!("dilu-cluster: pod list {}: {note}", path.display());
            }
            if args.protocol != "fgd" {
                list.replayable().map_err(|error| {
                    format!("pod list {} cannot be replayed: {error}", path.display())
                })?;
            }
            list.records
        }
        (Some(path), None) => {
            let file = std::fs::File::open(path)
                .map_err(|error| format!("cannot open trace {}: {error}", path.display()))?;
            read_json_lines(std::io::BufReader::new(file))
                .map_err(|error| format!("trace {}: {error}", path.display()))?
        }
        (None, None) => generate(&TraceSpec {
            instances: args.events,
            cluster_gpus: args.gpus,
            arrival: args.arrival,
            seed: args.seed,
        }),
    };
    if let Some(dir) = &args.profiles {
        apply_profiles(&mut trace, dir)?;
    }
    if let Some(path) = &args.save_trace {
        let file = std::fs::File::create(path)
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
        dilu_cluster::simulator::trace::write_json_lines(&trace, std::io::BufWriter::new(file))
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    }
    if args.protocol == "fgd" {
        let pods = inflation::inflate(&trace, shape.gpus(), args.inflate_to, args.seed);
        let mix = Arc::new(inflation::workload_mix(&pods, &shape));
        let checkpoints = inflation::checkpoints(args.inflate_to);
        let mut results = Vec::new();
        for name in &names {
            let policy = build_policy(name, mix.clone(), &args)?;
            eprintln!("{name}: {} pods", pods.len());
            results.push(inflation::simulate_inflation(
                policy.as_ref(),
                &pods,
                &shape,
                &checkpoints,
            ));
        }
        let without_gpus = count_without_gpus(&pods);
        println!(
            "FGD protocol: {} pods drawn ({without_gpus} without GPUs) from {} records (seed {}); \
             cluster of {}\n\n{}\n{}",
            pods.len(),
            trace.len(),
            args.seed,
            shape.describe(),
            report::inflation_table(&results),
            report::inflation_power_table(&results)
        );
        return Ok(());
    }
    let results = replay(&names, &trace, &shape, interactive, &args)?;
    let source = match (&args.trace, &args.pods) {
        (_, Some(path)) => format!(
            "pod list {} ({} pods, {} without GPUs)",
            path.display(),
            trace.len(),
            count_without_gpus(&trace)
        ),
        (Some(path), None) => format!("trace file {}", path.display()),
        (None, None) => format!(
            "{} instances, {:?} arrivals, seed {}",
            trace.len(),
            args.arrival,
            args.seed
        ),
    };
    let heading = format!(
        "{source}; cluster of {}, {} per GPU",
        shape.describe(),
        dilu_abi::units::format_size(args.gpu_memory)
    );
    let table = report::markdown_table(&results);
    println!("{heading}\n\n{table}");
    // Watts need the nodes' GPU and CPU models: a node list names them.
    if args.nodes.is_some() {
        println!("{}", report::replay_power_table(&results));
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
        let markdown = format!("# dilu-cluster simulation\n\n{heading}\n\n{table}");
        let md_path = dir.join("cluster-sim.md");
        std::fs::write(&md_path, markdown)
            .map_err(|error| format!("cannot write {}: {error}", md_path.display()))?;
        let svg_path = dir.join("cluster-sim-active-gpus.svg");
        std::fs::write(&svg_path, report::active_gpus_svg(&heading, &results))
            .map_err(|error| format!("cannot write {}: {error}", svg_path.display()))?;
        eprintln!("wrote {} and {}", md_path.display(), svg_path.display());
    }
    Ok(())
}

fn open(path: &std::path::Path) -> Result<std::io::BufReader<std::fs::File>, String> {
    std::fs::File::open(path)
        .map(std::io::BufReader::new)
        .map_err(|error| format!("cannot open {}: {error}", path.display()))
}

/// Replays `trace` under each named policy, in order.
fn replay(
    names: &[&str],
    trace: &[TraceRecord],
    shape: &ClusterShape,
    interactive: bool,
    args: &SimulateArgs,
) -> Result<Vec<SimulationResult>, String> {
    let mut results = Vec::with_capacity(names.len());
    // A real cluster's pod list is the workload `fgd` and `dilu` are told
    // of; generated traces carry none (each pod is measured on its own).
    let mix = Arc::new(if trace.iter().any(|record| record.pod.one_node) {
        inflation::workload_mix(trace, shape)
    } else {
        Default::default()
    });
    for name in names {
        let policy = build_policy(name, mix.clone(), args)?;
        results.push(simulate(policy.as_ref(), trace, shape, |done, total| {
            show_progress(name, done, total, interactive)
        }));
    }
    Ok(results)
}

fn show_progress(policy: &str, done: usize, total: usize, interactive: bool) {
    let percent = 100 * done / total.max(1);
    let mut stderr = std::io::stderr();
    if interactive {
        let filled = percent / 5;
        let _ = write!(
            stderr,
            "\r{policy:>10} [{}{}] {done}/{total} events",
            "#".repeat(filled),
            " ".repeat(20 - filled)
        );
        if done >= total {
            let _ = writeln!(stderr);
        }
    } else if percent.is_multiple_of(25) || done >= total {
        let _ = writeln!(stderr, "{policy}: {done}/{total} events ({percent}%)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_cluster::model::WorkClass;

    #[test]
    fn a_functions_profile_sets_the_share_of_each_of_its_instances() {
        let dir = std::env::temp_dir().join(format!("dilu-sim-profiles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("llm-0.toml"),
            "class = \"latency\"\nslo_ms = 50.0\nbatch = 8\nsm_request = 35\nsm_limit = 60\n\
             throughput_at_request = 80.0\nthroughput_at_limit = 95.0\ntrials = 12\nmethod = \"dilu\"\n",
        )
        .unwrap();
        let mut trace = generate(&TraceSpec {
            instances: 200,
            cluster_gpus: 64,
            arrival: ArrivalPattern::Poisson,
            seed: 3,
        });
        let before: Vec<TraceRecord> = trace.clone();
        apply_profiles(&mut trace, &dir).unwrap();
        let mut profiled = 0;
        for (old, new) in before.iter().zip(&trace) {
            if new.function == "llm-0" {
                profiled += 1;
                assert_eq!(
                    (new.sm_request, new.sm_limit, new.class),
                    (0.35, 0.6, WorkClass::Latency)
                );
            } else {
                assert_eq!(old, new);
            }
        }
        assert!(profiled > 0, "the generated trace has llm-0 instances");
        assert!(apply_profiles(&mut trace, &dir.join("missing")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
