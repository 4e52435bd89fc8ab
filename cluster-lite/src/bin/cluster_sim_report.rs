//! `cluster-sim-report`: rebuilds `bench/results/cluster-sim.md` and its
//! figures from scratch (run by `scripts/bench.sh cluster`). Nothing in
//! the results file is written by hand.
//!
//! It replays, with every policy:
//! 1. Alibaba's openb trace in time (pods by creation and deletion time on
//!    the trace's own nodes), with limits 1.5×/1.2× the request (LS/rest)
//!    and again with limits equal to requests;
//! 2. the GPU-hours/SLO-risk trade-off on that replay: `dilu` at every
//!    limit bound from 1.0 to 1.5, with both of its fit terms, beside every
//!    other policy;
//! 3. FGD's protocol on the same trace (workload inflated by seeded
//!    resampling to 130% of capacity, pods never leave), mean of the seeds,
//!    and seed by seed for `dilu`, `fgd` and `dilu-paper` with the paired
//!    differences, so that a difference is judged against the draws' noise;
//! 4. the built-in generator's two headline traces.
//!
//! 5. the tuning harness (`dilu_cluster::simulator::tuning`) on generated
//!    traces, written to `cluster-sim-tuning.md`.
//!
//! `dilu`'s settings (bound 1.35, weights, caps; under the fragmentation
//! fit its bound and price) were chosen on generated traces only; the
//! fragmentation fit's scope is fixed by mechanism (`dilu.rs`); the openb
//! trace is held out (nothing here tunes on it).
//!
//! usage: cluster-sim-report [--out DIR] [--data DIR] [--seeds N] [--tune-seeds N]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dilu_cluster::policy::{
    Complementary, FRAGMENTATION_LIMIT_BOUND, FRAGMENTATION_RISK_WEIGHT,
    FRAGMENTATION_SCARCITY_FULL, FragmentationScope, POLICY_NAMES, PlacementPolicy, WorkloadMix,
    policy_for_workload,
};
use dilu_cluster::simulator::inflation::{self, InflationResult};
use dilu_cluster::simulator::openb::{self, LimitRule};
use dilu_cluster::simulator::plot::{Series, line_chart_svg};
use dilu_cluster::simulator::trace::{
    ArrivalPattern, TraceRecord, TraceSpec, count_without_gpus, generate,
};
use dilu_cluster::simulator::{ClusterShape, SimulationResult, report, simulate, tuning};

const GIB: u64 = 1 << 30;
/// GPU memory the openb node list lacks; shares become bytes with it.
const OPENB_GPU_MEMORY: u64 = 80 * GIB;
/// FGD's published shares allocated on openb at 100% and 130% requested
/// (its simulator, 10 seeds; `bench/data/alibaba-openb/SOURCE.md`).
const PUBLISHED: [(&str, f64, f64); 2] = [("FGD", 95.23, 95.39), ("BestFit", 92.86, 93.08)];

struct Args {
    out: PathBuf,
    data: PathBuf,
    seeds: u64,
    tune_seeds: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        out: PathBuf::from("bench/results"),
        data: PathBuf::from("bench/data/alibaba-openb"),
        seeds: 5,
        tune_seeds: 8,
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(format!("{word} needs a value"));
        match word.as_str() {
            "--out" => args.out = value()?.into(),
            "--data" => args.data = value()?.into(),
            "--seeds" => {
                args.seeds = value()?
                    .parse()
                    .map_err(|error| format!("--seeds: {error}"))?
            }
            "--tune-seeds" => {
                args.tune_seeds = value()?
                    .parse()
                    .map_err(|error| format!("--tune-seeds: {error}"))?
            }
            "-h" | "--help" => {
                println!(
                    "usage: cluster-sim-report [--out DIR] [--data DIR] [--seeds N] [--tune-seeds N]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

fn read_openb(args: &Args, limits: LimitRule) -> Result<(ClusterShape, Vec<TraceRecord>), String> {
    let open = |name: &str| {
        let path = args.data.join(name);
        std::fs::File::open(&path)
            .map(std::io::BufReader::new)
            .map_err(|error| format!("cannot open {}: {error}", path.display()))
    };
    let nodes = openb::read_nodes(open("openb_node_list_gpu_node.csv")?, OPENB_GPU_MEMORY)?;
    let pods = openb::read_pods(
        open("openb_pod_list_default.csv")?,
        limits,
        OPENB_GPU_MEMORY,
    )?;
    let pods = pods.replayable()?.to_vec();
    Ok((ClusterShape { nodes }, pods))
}

fn every_policy(mix: &Arc<WorkloadMix>) -> Vec<Box<dyn PlacementPolicy>> {
    POLICY_NAMES
        .iter()
        .filter_map(|name| policy_for_workload(name, mix.clone()))
        .collect()
}

fn replay_all(
    trace: &[TraceRecord],
    shape: &ClusterShape,
    mix: &Arc<WorkloadMix>,
) -> Vec<SimulationResult> {
    every_policy(mix)
        .iter()
        .map(|policy| {
            eprintln!("  {}", policy.name());
            simulate(policy.as_ref(), trace, shape, |_, _| {})
        })
        .collect()
}

fn write(path: &std::path::Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|error| format!("cannot write {}: {error}", path.display()))
}

fn main() {
    if let Err(error) = run() {
        eprintln!("cluster-sim-report: {error}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    std::fs::create_dir_all(&args.out)
        .map_err(|error| format!("cannot create {}: {error}", args.out.display()))?;
    let started = Instant::now();
    let load_before = load_average();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# dilu-cluster: placement policies on a real cluster trace and on generated ones\n\n\
         Written by `scripts/bench.sh cluster` (which runs `cluster-sim-report --seeds {} --tune-seeds {}`,\n\
         `cluster-lite/src/bin/cluster_sim_report.rs`); nothing here is edited by hand.\n\
         Release build, no GPU. Load average (1, 5, 15 min) when it started: {load_before}.\n\n\
         `dilu`'s settings were chosen on generated traces only (two families: the built-in\n\
         generator on uniform nodes, and a heterogeneous generator whose pods can strand a node's\n\
         idle GPUs by its cores, memory or GPU model): the tuning harness never reads Alibaba's\n\
         openb trace below. It is not blind, though: the harness's candidates\n\
         were drawn up after openb probes had been seen. Without a known workload (the generated traces) `dilu` fits by a\n\
         GPU's slack (limit bound 1.35, weights 0.4 and 1.25, move caps 1.2 and 1.1, chosen by\n\
         earlier sessions). When the workload is known (a real cluster's pod list) it fits by FGD's\n\
         fragmentation, counted on the GPUs in use and, weighted by how scarce idle GPUs are, on\n\
         whole nodes (scope \"by-scarcity\"; fixed by mechanism, not tuned: see \"Why FGD's measure\n\
         costs GPU-hours\" below, and the harness's check of it on the heterogeneous family), with limit bound {} and a price of {} on new limit excess,\n\
         idle GPUs counting as run out once {}% of the GPUs are in use: chosen by the tuning harness\n\
         on generated traces ([cluster-sim-tuning.md](cluster-sim-tuning.md)). Scarcity is the share\n\
         of GPUs in use over that point, at most 1; the price is weighted by one less it (by mechanism,\n\
         like the scope: while idle GPUs are plentiful, steering a pod off a dense GPU costs GPU-hours;\n\
         as they run out it costs room a later pod needs). An ablation on openb under FGD's protocol\n\
         found the price to be the term that cost allocation against `fgd`, so that rule, and the\n\
         harness's scarcity points below 100%, were added after openb was seen.\n\
         With a known workload, a pod that no GPU admits within the bound goes where its requests fit\n\
         (least cost, limit excess priced) rather than wait or be dropped for its limit alone; without\n\
         one it may go over the bound up to 1.5 (`dilu-paper`'s).",
        args.seeds,
        args.tune_seeds,
        FRAGMENTATION_LIMIT_BOUND,
        FRAGMENTATION_RISK_WEIGHT,
        FRAGMENTATION_SCARCITY_FULL * 100.0
    );

    // The summary goes here once the numbers are in.
    let summary_at = md.len();

    // 1. openb in time.
    eprintln!("openb time replay, limits 1.5x/1.2x");
    let (shape, pods) = read_openb(&args, LimitRule::default())?;
    let mix = Arc::new(inflation::workload_mix(&pods, &shape));
    let replay = replay_all(&pods, &shape, &mix);
    let _ = writeln!(
        md,
        "\n## openb, replayed in time\n\n\
         The {} pods of `openb_pod_list_default.csv`, each arriving at its creation and leaving at\n\
         its deletion, on the trace's cluster: {}. {} of them take no GPU: they take cores and\n\
         memory on the node each policy chooses for them, which GPU pods then lack.\n\
         SM request = gpu_milli/1000 per GPU, memory share = SM share, limit = 1.5 × request for\n\
         LS pods and 1.2 × for the rest (the trace has no limits; capped at 1). A pod's GPUs are on\n\
         one node with its CPU and memory; `gpu_spec` restricts its GPU models. A pod that fits\n\
         nowhere waits (\"waited\", \"wait h\"); \"never placed\" were still waiting at the end.\n\n{}",
        pods.len(),
        shape.describe(),
        count_without_gpus(&pods),
        report::markdown_table(&replay)
    );
    write(
        &args.out.join("cluster-sim-openb-active.svg"),
        &report::active_gpus_svg("openb replayed in time: active GPUs", &replay),
    )?;
    let _ = writeln!(md, "![active GPUs](cluster-sim-openb-active.svg)");

    eprintln!("openb time replay, limits = requests");
    let (_, equal) = read_openb(
        &args,
        LimitRule {
            latency_factor: 1.0,
            batch_factor: 1.0,
        },
    )?;
    let equal_results = replay_all(&equal, &shape, &mix);
    let _ = writeln!(
        md,
        "\n### The same with limits equal to requests\n\n{}",
        report::markdown_table(&equal_results)
    );

    // 2. The trade-off curve.
    eprintln!("trade-off curve");
    let bounds = [1.0, 1.1, 1.2, 1.3, 1.35, 1.4, 1.5];
    let mut curve_rows = String::from(
        "| variant | limit bound | GPU-hours | vs dilu-paper | SLO risk (mean Σlim−1) | GPUs at risk |\n|---|---:|---:|---:|---:|---:|\n",
    );
    let paper_hours = replay
        .iter()
        .find(|result| result.policy == "dilu-paper")
        .map_or(1.0, |result| result.gpu_hours);
    let mut series = Vec::new();
    for (label, base) in [
        (
            "dilu (fragmentation fit)",
            Complementary::for_workload(mix.clone()),
        ),
        ("dilu (slack fit)", Complementary::default()),
    ] {
        let mut points = Vec::new();
        for bound in bounds {
            let policy = Complementary {
                limit_bound: bound,
                ..base.clone()
            };
            let result = simulate(&policy, &pods, &shape, |_, _| {});
            let _ = writeln!(
                curve_rows,
                "| {label} | {bound:.2} | {:.1} | {:+.1}% | {:.4} | {:.1}% |",
                result.gpu_hours,
                100.0 * (result.gpu_hours / paper_hours - 1.0),
                result.mean_limit_excess,
                100.0 * result.share_gpus_at_risk
            );
            points.push((result.mean_limit_excess, result.gpu_hours));
        }
        series.push(Series {
            name: label.into(),
            points,
            markers: true,
        });
    }
    for result in replay.iter().filter(|result| result.policy != "dilu") {
        series.push(Series {
            name: result.policy.clone(),
            points: vec![(result.mean_limit_excess, result.gpu_hours)],
            markers: true,
        });
        let _ = writeln!(
            curve_rows,
            "| {} | n/a | {:.1} | {:+.1}% | {:.4} | {:.1}% |",
            result.policy,
            result.gpu_hours,
            100.0 * (result.gpu_hours / paper_hours - 1.0),
            result.mean_limit_excess,
            100.0 * result.share_gpus_at_risk
        );
    }
    write(
        &args.out.join("cluster-sim-openb-tradeoff.svg"),
        &line_chart_svg(
            "openb in time: GPU-hours against SLO risk",
            "SLO risk (mean limit excess on active GPUs)",
            "GPU-hours",
            &series,
        ),
    )?;
    let _ = writeln!(
        md,
        "\n## The trade-off on openb: GPU-hours against SLO risk\n\n\
         Denser GPUs cost fewer GPU-hours and carry more limit excess. `dilu` at each limit bound\n\
         (above it only when no GPU admits a pod within it), with either fit term and otherwise its\n\
         settings, beside the other policies (one point each: they have no such setting). The\n\
         fragmentation fit's bound is 1.5 by default, the slack fit's 1.35.\n\n{curve_rows}\n\
         ![trade-off](cluster-sim-openb-tradeoff.svg)"
    );

    // 2b. Why FGD's measure costs GPU-hours here: the scope of the fit.
    eprintln!("fragmentation scopes");
    let mut scope_rows = String::from(
        "| fragmentation counted on | GPU-hours | vs dilu-paper | SLO risk (mean Σlim−1) | SM frag |\n|---|---:|---:|---:|---:|\n",
    );
    for (label, scope) in [
        (
            "every GPU of the node (FGD's measure)",
            FragmentationScope::Node,
        ),
        ("GPUs in use only", FragmentationScope::Busy),
        (
            "GPUs in use, whole nodes as idle GPUs run out (default)",
            FragmentationScope::ByScarcity,
        ),
    ] {
        let policy = Complementary {
            fragmentation_scope: scope,
            ..Complementary::for_workload(mix.clone())
        };
        let result = simulate(&policy, &pods, &shape, |_, _| {});
        let _ = writeln!(
            scope_rows,
            "| {label} | {:.1} | {:+.1}% | {:.4} | {:.3} |",
            result.gpu_hours,
            100.0 * (result.gpu_hours / paper_hours - 1.0),
            result.mean_limit_excess,
            result.mean_sm_fragmentation
        );
    }
    let _ = writeln!(
        md,
        "\n### Why FGD's measure costs GPU-hours in the time replay\n\n\
         In the replay about 70 of the 6,212 GPUs are in use at once. FGD counts the free share of\n\
         every GPU of a node, idle ones included, and on openb's nodes CPU binds (a G2 node has 96\n\
         cores for 8 GPUs; the commonest whole-GPU LS pods ask 11.3–12): a pod that leaves a node too few cores\n\
         turns all of that node's idle GPUs into \"fragments\". That node-wide term outweighs how\n\
         full the GPU itself gets, so pods go to half-used GPUs on nodes with cores to spare instead\n\
         of filling a GPU, more GPUs stay in use, and GPU-hours rise; `fgd` itself is the extreme.\n\
         The rule `dilu` follows instead, from two things the cluster says rather than from tuning:\n\
         an idle GPU that a node's cores, memory or GPU model strand costs capacity only if some pod\n\
         later finds no idle GPU elsewhere, and it costs no GPU-hours. So the node-wide term (FGD's\n\
         measure, idle GPUs included) is weighted by how scarce idle GPUs are (the share of the\n\
         cluster's GPUs in use, over the point where they count as run out), and the rest of the\n\
         weight goes to the fragmentation of the GPUs in use, which is what costs GPU-hours. Here\n\
         about 1% of GPUs are in use and the fit is nearly the busy GPUs' alone; under FGD's\n\
         protocol the measure becomes FGD's once that point is passed. The tuning harness\n\
         does not choose the scope (it chooses the point); it checks this argument on its heterogeneous family, where pods\n\
         strand GPUs (last table of [cluster-sim-tuning.md](cluster-sim-tuning.md)). `dilu` at its\n\
         settings with each scope (the other two for comparison; they were not candidates):\n\n{scope_rows}"
    );

    // 3. FGD's protocol.
    eprintln!("FGD protocol, {} seeds", args.seeds);
    let checkpoints = inflation::checkpoints(1.3);
    let mut per_seed: Vec<Vec<InflationResult>> = Vec::new();
    // `dilu` at each price the harness tried, seed by seed: the seeds of
    // the harness disagree on the price, so the held-out result is shown
    // at each (the constant is not moved on it).
    let mut price_runs: Vec<Vec<InflationResult>> = vec![Vec::new(); tuning::PRICES.len()];
    for seed in 1..=args.seeds.max(1) {
        let inflated = inflation::inflate(&pods, shape.gpus(), 1.3, seed);
        let seed_mix = Arc::new(inflation::workload_mix(&inflated, &shape));
        let results = every_policy(&seed_mix)
            .iter()
            .map(|policy| {
                eprintln!("  seed {seed} {}", policy.name());
                inflation::simulate_inflation(policy.as_ref(), &inflated, &shape, &checkpoints)
            })
            .collect();
        per_seed.push(results);
        for (runs, price) in price_runs.iter_mut().zip(tuning::PRICES) {
            // dilu's own price ran above.
            if let Some(own) = per_seed.last().and_then(|run| {
                run.iter()
                    .find(|result| result.policy == "dilu" && is_dilus_price(price))
            }) {
                runs.push(own.clone());
                continue;
            }
            eprintln!("  seed {seed} dilu, price {price}");
            let policy = Complementary {
                fragmentation_risk_weight: price,
                ..Complementary::for_workload(seed_mix.clone())
            };
            runs.push(inflation::simulate_inflation(
                &policy,
                &inflated,
                &shape,
                &checkpoints,
            ));
        }
    }
    let allocated = |runs: &[InflationResult], share: f64| -> Vec<f64> {
        runs.iter()
            .filter_map(|result| report::allocated_at(result, share))
            .collect()
    };
    let fgd_runs: Vec<InflationResult> = per_seed
        .iter()
        .filter_map(|run| run.iter().find(|result| result.policy == "fgd").cloned())
        .collect();
    let dilu_runs: Vec<InflationResult> = per_seed
        .iter()
        .filter_map(|run| run.iter().find(|result| result.policy == "dilu").cloned())
        .collect();
    let against_fgd = |runs: &[InflationResult], share: f64| {
        let (mean, _, _, _, two_errors, at_least) =
            report::paired_difference(&allocated(runs, share), &allocated(&fgd_runs, share));
        (mean, two_errors, at_least)
    };
    let mean = mean_inflation(&per_seed);
    let seed_table =
        report::protocol_seed_table(&per_seed, 1, &["dilu", "fgd", "dilu-paper"], &[1.0, 1.3]);
    let mut protocol_series: Vec<Series> = mean
        .iter()
        .map(|result| Series {
            name: result.policy.clone(),
            points: result
                .points
                .iter()
                .map(|point| (100.0 * point.requested, 100.0 * point.allocated))
                .collect(),
            markers: true,
        })
        .collect();
    for (name, at_100, at_130) in PUBLISHED {
        protocol_series.push(Series {
            name: format!("{name} (published)"),
            points: vec![(100.0, at_100), (130.0, at_130)],
            markers: true,
        });
    }
    write(
        &args.out.join("cluster-sim-fgd-protocol.svg"),
        &line_chart_svg(
            "openb under FGD's protocol: GPU capacity allocated",
            "GPU capacity requested (%)",
            "GPU capacity allocated (%)",
            &protocol_series,
        ),
    )?;
    let published: Vec<String> = PUBLISHED
        .iter()
        .map(|(name, at_100, at_130)| format!("{name} {at_100}% at 100% and {at_130}% at 130%"))
        .collect();
    let _ = writeln!(
        md,
        "\n## openb under FGD's protocol\n\n\
         Pods drawn at random (with replacement, seeds 1–{}) from the same {} pods (with those\n\
         without GPUs, whose cores compete with GPU pods', as in FGD's simulator) until their GPU\n\
         requests reach 130% of the cluster's GPU capacity; they arrive one by one, never leave, and\n\
         one that fits nowhere is dropped. Share of GPU capacity allocated as the requests cross each\n\
         share, mean of the seeds. `fgd` and `dilu` are given the drawn pods' task mix. Published\n\
         (FGD's simulator, 10 seeds): {}.\n\n{}\n\
         ![FGD protocol](cluster-sim-fgd-protocol.svg)\n\n\
         ### Seed by seed\n\n\
         Each seed draws other pods; the policies see the same draw, so differences are paired by\n\
         seed. A mean difference inside ± 2 standard errors is a tie at this many seeds.\n\n{seed_table}",
        args.seeds.max(1),
        pods.len(),
        published.join("; "),
        report::inflation_table(&mean)
    );

    // 3b. The held-out result at each price the harness tried.
    eprintln!("prices on openb");
    let paper_risk = replay
        .iter()
        .find(|result| result.policy == "dilu-paper")
        .map_or(0.0, |result| result.mean_limit_excess);
    let mut price_rows = String::from(
        "| price | in time: GPU-hours vs dilu-paper | SLO risk (mean Σlim−1) | risk − dilu-paper's | protocol: at 100% | at 130% | − fgd at 100% (points, ± 2 s.e.) | − fgd at 130% |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (price, runs) in tuning::PRICES.iter().zip(&price_runs) {
        let policy = Complementary {
            fragmentation_risk_weight: *price,
            ..Complementary::for_workload(mix.clone())
        };
        let result = match replay.iter().find(|result| result.policy == "dilu") {
            Some(own) if is_dilus_price(*price) => own.clone(),
            _ => simulate(&policy, &pods, &shape, |_, _| {}),
        };
        let mean_of = |values: Vec<f64>| report::spread(&values).0;
        let (d100, e100, _) = against_fgd(runs, 1.0);
        let (d130, e130, _) = against_fgd(runs, 1.3);
        let _ = writeln!(
            price_rows,
            "| {price}{} | {:+.2}% | {:.4} | {:+.4} | {:.2}% | {:.2}% | {d100:+.3} ± {e100:.3} ({}) | {d130:+.3} ± {e130:.3} ({}) |",
            if is_dilus_price(*price) {
                " (dilu's)"
            } else {
                ""
            },
            100.0 * (result.gpu_hours / paper_hours - 1.0),
            result.mean_limit_excess,
            result.mean_limit_excess - paper_risk,
            100.0 * mean_of(allocated(runs, 1.0)),
            100.0 * mean_of(allocated(runs, 1.3)),
            report::verdict(d100, e100),
            report::verdict(d130, e130),
        );
    }
    let _ = writeln!(
        md,
        "\n### The held-out result at each price the harness tried\n\n\
         How much the price matters on held-out data: `dilu` (bound {FRAGMENTATION_LIMIT_BOUND}) on openb at each\n\
         price the harness tried ([cluster-sim-tuning.md](cluster-sim-tuning.md)): in time, and under FGD's protocol (the same {} draws, paired with `fgd`).\n\
         Shown, not used: the price stays the harness's choice.\n\n{price_rows}",
        args.seeds.max(1)
    );

    // 4. Generated traces.
    for (arrival, name) in [
        (ArrivalPattern::Poisson, "poisson"),
        (ArrivalPattern::Bursty, "bursty"),
    ] {
        eprintln!("generated {name}");
        let trace = generate(&TraceSpec {
            instances: 3200,
            cluster_gpus: 4000,
            arrival,
            seed: 1,
        });
        let gen_shape = ClusterShape::uniform(4000, 8, 80 * GIB);
        // Generated traces carry no pod list: every policy measures fit on
        // its own terms (`fgd` against each pod alone).
        let results = replay_all(&trace, &gen_shape, &Arc::new(WorkloadMix::default()));
        let figure = format!("cluster-sim-{name}.svg");
        write(
            &args.out.join(&figure),
            &report::active_gpus_svg(
                &format!("generated, {name} arrivals: active GPUs"),
                &results,
            ),
        )?;
        let _ = writeln!(
            md,
            "\n## Generated trace, {name} arrivals (seed 1, 3,200 instances, {})\n\n\
             The built-in generator (`cluster-lite/src/simulator/trace.rs`: 20% LLM inference, 20%\n\
             restartable training on 2–4 GPUs, 60% small inference; replicas of a function share\n\
             one demand). dilu's settings were chosen on such traces (other seeds).\n\n{}\n![active GPUs]({figure})",
            gen_shape.describe(),
            report::markdown_table(&results)
        );
    }

    // 5. The tuning harness (generated traces only).
    eprintln!("tuning harness, {} seeds", args.tune_seeds);
    let tuning_md = tuning::tune(args.tune_seeds.max(1), 101, |trace| eprintln!("  {trace}"));
    write(&args.out.join("cluster-sim-tuning.md"), &tuning_md)?;

    let _ = writeln!(
        md,
        "\n---\nPlacement latency is the wall clock of each placement search inside the simulator,\n\
         on a machine shared with other jobs: load average {load_before} at the start, {} at the end;\n\
         the whole report took {:.0} s.",
        load_average(),
        started.elapsed().as_secs_f64()
    );
    let dilu_replay = replay.iter().find(|result| result.policy == "dilu");
    let mut summary = String::from("\n## Issue 18's goal on openb (held out), in short\n\n");
    if let Some(dilu) = dilu_replay {
        let fewer = dilu.gpu_hours < paper_hours && dilu.mean_limit_excess <= paper_risk;
        let _ = writeln!(
            summary,
            "- In time: `dilu` uses {:+.2}% GPU-hours against `dilu-paper` at SLO risk {:.4} against\n  \
             {:.4}: {}. One replay, no draws to average.",
            100.0 * (dilu.gpu_hours / paper_hours - 1.0),
            dilu.mean_limit_excess,
            paper_risk,
            if fewer {
                "fewer GPU-hours at no more risk"
            } else {
                "NOT fewer GPU-hours at no more risk"
            }
        );
    }
    let (d100, e100, n100) = against_fgd(&dilu_runs, 1.0);
    let (d130, e130, n130) = against_fgd(&dilu_runs, 1.3);
    let (verdict100, verdict130) = (report::verdict(d100, e100), report::verdict(d130, e130));
    let reading = if verdict100 == "ahead" && verdict130 == "ahead" {
        "`dilu` allocates more than `fgd` beyond the draws' noise"
    } else if verdict100 == "behind" || verdict130 == "behind" {
        "`dilu` allocates LESS than `fgd` beyond the draws' noise"
    } else if d100 >= 0.0 && d130 >= 0.0 {
        "\"at least as much as FGD\" holds on the mean, not beyond the draws' noise"
    } else {
        "`dilu` allocates less than `fgd` on the mean, within the draws' noise"
    };
    let _ = writeln!(
        summary,
        "- Under FGD's protocol ({draws} draws): `dilu` − `fgd` = {d100:+.3} points at 100% requested\n  \
         (± {e100:.3}, two standard errors; at least as much on {n100} of the {draws}) and {d130:+.3}\n  \
         at 130% (± {e130:.3}; on {n130} of the {draws}). Verdict at 100%: {verdict100}; at 130%: {verdict130}:\n  \
         {reading}.",
        draws = dilu_runs.len(),
    );
    md.insert_str(summary_at, &summary);
    write(&args.out.join("cluster-sim.md"), &md)?;
    eprintln!("wrote {}", args.out.join("cluster-sim.md").display());
    Ok(())
}

/// Whether `price` is `dilu`'s own price on new limit excess.
fn is_dilus_price(price: f64) -> bool {
    (price - FRAGMENTATION_RISK_WEIGHT).abs() < 1e-9
}

/// Mean allocated share per checkpoint, dropped pods and latencies over
/// seeds (same policies in the same order in each).
fn mean_inflation(per_seed: &[Vec<InflationResult>]) -> Vec<InflationResult> {
    let Some(first) = per_seed.first() else {
        return Vec::new();
    };
    let runs = per_seed.len() as f64;
    first
        .iter()
        .enumerate()
        .map(|(column, template)| {
            let mut mean = template.clone();
            for (index, point) in mean.points.iter_mut().enumerate() {
                point.allocated = per_seed
                    .iter()
                    .filter_map(|run| run.get(column)?.points.get(index))
                    .map(|point| point.allocated)
                    .sum::<f64>()
                    / runs;
            }
            let sum = |read: fn(&InflationResult) -> f64| {
                per_seed
                    .iter()
                    .filter_map(|run| run.get(column))
                    .map(read)
                    .sum::<f64>()
                    / runs
            };
            mean.dropped = sum(|result| result.dropped as f64).round() as usize;
            mean.dropped_without_gpus =
                sum(|result| result.dropped_without_gpus as f64).round() as usize;
            mean.final_limit_excess = sum(|result| result.final_limit_excess);
            mean.placement_p50_us = sum(|result| result.placement_p50_us);
            mean.placement_p99_us = sum(|result| result.placement_p99_us);
            mean
        })
        .collect()
}
