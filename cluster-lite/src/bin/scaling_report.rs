//! `scaling-report`: writes `bench/results/scaling.md` and its figures
//! (run by `scripts/bench.sh scaling`): the request-level 2D scaling
//! simulation (`dilu_cluster::scaling`) on Dilu's three arrival patterns,
//! every scaler side by side, then again at other cold starts.
//!
//! Functions: four models with Dilu's measured profile tables
//! (`bench/data/dilu-profiles*/`), each profiled by `dilu profile`'s search
//! for a batch-latency SLO; a request's SLO is twice that. Every function
//! follows the pattern, started a quarter of the pattern apart, scaled so
//! that the pattern's busiest second asks for `PEAK_INSTANCES` instances'
//! throughput at their request share.
//!
//! usage: scaling-report [--out DIR] [--data DIR] [--seeds N]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use dilu_cluster::scaling::pattern::Pattern;
use dilu_cluster::scaling::scalers::SCALER_NAMES;
use dilu_cluster::scaling::service::Service;
use dilu_cluster::scaling::sim::{Function, Outcome, Setup, run};
use dilu_cluster::simulator::plot::{Series, line_chart_svg};
use dilu_profile::table::ProfileTable;

const GIB: u64 = 1 << 30;
/// Instances' throughput (at their requests) the busiest second asks for.
const PEAK_INSTANCES: f64 = 6.0;
/// A request's SLO over the batch-latency SLO its profile was searched for.
const SLO_FACTOR: f64 = 2.0;
/// Seconds from an instance's start until it serves, by default: an image
/// already on the node still pays CUDA context set-up (5–15 s), framework
/// start-up (3–10 s) and weight loading (2–10 s) (stage ranges measured on
/// Alibaba's serverless platform, HydraServe, NSDI'26); 15 s is near the
/// low end of their sum. Other values are swept below.
const COLD_START_S: f64 = 15.0;
const OTHER_COLD_STARTS_S: [f64; 2] = [5.0, 45.0];
const PATTERNS: [&str; 3] = ["bursty", "periodic", "sporadic"];
/// Model tables and the batch-latency SLO each is profiled for (seconds).
const MODELS: [(&str, &str, f64); 4] = [
    ("resnet152", "dilu-profiles/bs_sm_resnet152.csv", 0.030),
    ("bert-base", "dilu-profiles/bs_sm_bert_base.csv", 0.060),
    (
        "roberta-large",
        "dilu-profiles-heldout/bs_sm_roberta_large.csv",
        0.070,
    ),
    (
        "gpt2-large",
        "dilu-profiles-heldout/bs_sm_gpt2_large.csv",
        0.090,
    ),
];

struct Args {
    out: PathBuf,
    data: PathBuf,
    seeds: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        out: PathBuf::from("bench/results"),
        data: PathBuf::from("bench/data"),
        seeds: 3,
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
                    .ok()
                    .filter(|seeds| *seeds >= 1)
                    .ok_or("--seeds: expected a whole number >= 1")?
            }
            "-h" | "--help" => {
                println!("usage: scaling-report [--out DIR] [--data DIR] [--seeds N]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))
}

fn functions(services: &[Service], pattern: &Pattern) -> Vec<Function> {
    services
        .iter()
        .enumerate()
        .map(|(index, service)| Function {
            service: service.clone(),
            pattern: pattern.clone(),
            offset_s: index * pattern.seconds() / services.len(),
            peak_rps: PEAK_INSTANCES * service.throughput(service.request),
            memory_bytes: 8 * GIB,
        })
        .collect()
}

/// Mean of one scaler's outcomes over the seeds (the first seed's series).
fn mean(outcomes: &[Outcome]) -> Outcome {
    let count = outcomes.len().max(1) as f64;
    let mut out = outcomes[0].clone();
    out.requests = outcomes.iter().map(|o| o.requests).sum::<f64>() / count;
    out.within_slo = outcomes.iter().map(|o| o.within_slo).sum::<f64>() / count;
    out.gpu_hours = outcomes.iter().map(|o| o.gpu_hours).sum::<f64>() / count;
    out.starts = (outcomes.iter().map(|o| o.starts).sum::<usize>() as f64 / count).round() as usize;
    out.refused = outcomes.iter().map(|o| o.refused).sum();
    out
}

fn setup(seed: u64, cold_start_s: f64) -> Setup {
    Setup {
        gpus: 64,
        gpus_per_node: 8,
        gpu_memory: 80 * GIB,
        cold_start_s,
        step_s: 0.1,
        seed,
        policy: "dilu".into(),
    }
}

fn run_all(
    functions: &[Function],
    seconds: usize,
    seeds: u64,
    cold_start_s: f64,
) -> Result<Vec<Outcome>, String> {
    SCALER_NAMES
        .iter()
        .map(|scaler| {
            let runs = (1..=seeds)
                .map(|seed| run(&setup(seed, cold_start_s), functions, scaler, seconds))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(mean(&runs))
        })
        .collect()
}

/// The verdict the issue asks for: dilu against the baseline of best SLO
/// attainment (ties: fewer GPU-hours).
fn verdict(outcomes: &[Outcome]) -> String {
    let dilu = &outcomes[0];
    let best = outcomes[1..]
        .iter()
        .max_by(|a, b| {
            a.attainment()
                .total_cmp(&b.attainment())
                .then(b.gpu_hours.total_cmp(&a.gpu_hours))
        })
        .expect("three baselines");
    let matches = dilu.attainment() + 1e-4 >= best.attainment();
    let cheaper = dilu.gpu_hours < best.gpu_hours;
    format!(
        "Best baseline by SLO attainment: `{}` ({:.2}%, {:.2} GPU-h). `dilu`: {:.2}%, {:.2} GPU-h ({:+.1}%): {}.",
        best.scaler,
        100.0 * best.attainment(),
        best.gpu_hours,
        100.0 * dilu.attainment(),
        dilu.gpu_hours,
        100.0 * (dilu.gpu_hours / best.gpu_hours - 1.0),
        match (matches, cheaper) {
            (true, true) => "matches its attainment with fewer GPU-hours",
            (true, false) => "matches its attainment, but not with fewer GPU-hours",
            (false, true) => "fewer GPU-hours, but lower attainment",
            (false, false) => "neither",
        }
    )
}

/// `dilu`'s SLO attainment minus the best baseline's (negative: below it).
fn attainment_gap(outcomes: &[Outcome]) -> f64 {
    let best = outcomes[1..]
        .iter()
        .map(Outcome::attainment)
        .fold(f64::MIN, f64::max);
    outcomes[0].attainment() - best
}

/// A line for a pattern where `dilu` stays below the best baseline's
/// attainment: by how much at each cold start, and how many instances it
/// ran beside that baseline; empty where it matches.
fn shortfall(name: &str, outcomes: &[Outcome], gaps: &[(f64, f64)]) -> String {
    if attainment_gap(outcomes) + 1e-4 >= 0.0 {
        return String::new();
    }
    let best = outcomes[1..]
        .iter()
        .max_by(|a, b| a.attainment().total_cmp(&b.attainment()))
        .expect("three baselines");
    let by_cold_start: Vec<String> = gaps
        .iter()
        .map(|(cold, gap)| format!("{:+.2} points at {cold} s", 100.0 * gap))
        .collect();
    format!(
        "- **{name}**: `dilu`'s attainment minus the best baseline's (`{}` at the default cold \
         start), by cold start: {}; `dilu` ran {:.1} instances on average, `{}` {:.1}.\n",
        best.scaler,
        by_cold_start.join(", "),
        outcomes[0].mean_instances(),
        best.scaler,
        best.mean_instances()
    )
}

/// The honest summary the issue asks for.
fn where_not(shortfalls: &str) -> String {
    let mut text = String::from("\n## Where `dilu` does not match the best baseline, and why\n\n");
    if shortfalls.is_empty() {
        text.push_str("It matches it on every pattern.\n");
    } else {
        text.push_str(shortfalls);
        text.push_str(
            "\nWhere it falls short it runs fewer instances: it counts an instance at its SM limit, \
             so the headroom it keeps is the limits' alone, and load beyond them waits for a cold \
             start; the baselines cover such rises with standing instances, which their GPU-hours \
             show. Where a shorter cold start narrows the gap above, the misses are those waits. \
             No run here gives `dilu` the baselines' GPU-hours to see whether it would then \
             match.\n",
        );
    }
    text.push_str(
        "\nIn-sample: `dilu`'s thresholds (out at 70% of its instances' throughput at their limits, \
         to 50%; in below 50%) were chosen after a first run on these same three patterns, and \
         there is no held-out pattern, so even where it matches, that is not evidence it would on \
         other load.\n",
    );
    text
}

fn table(outcomes: &[Outcome]) -> String {
    let mut text = String::from(
        "| scaler | SLO attainment | GPU-hours | vs dilu-paper | instance starts | mean instances | starts refused |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let paper = outcomes
        .iter()
        .find(|o| o.scaler == "dilu-paper")
        .map_or(1.0, |o| o.gpu_hours);
    for outcome in outcomes {
        let _ = writeln!(
            text,
            "| {} | {:.2}% | {:.2} | {:+.1}% | {} | {:.1} | {} |",
            outcome.scaler,
            100.0 * outcome.attainment(),
            outcome.gpu_hours,
            100.0 * (outcome.gpu_hours / paper - 1.0),
            outcome.starts,
            outcome.mean_instances(),
            outcome.refused
        );
    }
    text
}

fn run_report() -> Result<(), String> {
    let args = parse_args()?;
    let started = std::time::Instant::now();
    let services = MODELS
        .iter()
        .map(|(name, file, slo)| {
            let table = ProfileTable::parse(&read(&args.data.join(file))?)?;
            Service::profiled(name, &table, *slo, SLO_FACTOR)
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# 2D scaling: dilu's scaler beside Dilu's published rule, KPA and HPA\n\n\
         Written by `scripts/bench.sh scaling` (`scaling-report --seeds {seeds}`,\n\
         `cluster-lite/src/bin/scaling_report.rs`); nothing here is edited by hand. The model and the\n\
         scalers: [docs/scaling.md](../../docs/scaling.md) and `cluster-lite/src/scaling/`.\n\n\
         Four functions share a cluster of 64 GPUs (8 per node, placed by `dilu`); each follows one of\n\
         Dilu's arrival patterns (`bench/data/dilu-workloads/`, a quarter of the pattern apart), scaled so\n\
         that its busiest second asks for {PEAK_INSTANCES} instances' throughput at their request share.\n\
         Every instance is scaled vertically by the node manager (share from request up to limit under\n\
         load, shared on its GPU); the scalers differ only in how many instances they run. Cold start\n\
         {COLD_START_S} s (see the source). Means of seeds 1–{seeds} (Poisson arrivals).\n\n\
         | function | batch | request SLO ms | SM request | SM limit | req/s at request | req/s at limit |\n\
         |---|---:|---:|---:|---:|---:|---:|",
        seeds = args.seeds,
    );
    for service in &services {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} |",
            service.name,
            service.batch,
            service.slo_s * 1000.0,
            service.request,
            service.limit,
            service.throughput(service.request),
            service.throughput(service.limit)
        );
    }
    let mut sensitivity = String::from(
        "\n## Other cold starts\n\nSLO attainment / GPU-hours per scaler.\n\n\
         | pattern | cold start s | dilu | dilu-paper | kpa | hpa |\n|---|---:|---|---|---|---|\n",
    );
    let mut shortfalls = String::new();
    for name in PATTERNS {
        let path = args.data.join("dilu-workloads").join(format!("{name}.txt"));
        let pattern = Pattern::parse(name, &read(&path)?)?;
        let functions = functions(&services, &pattern);
        let seconds = pattern.seconds();
        eprintln!("{name}: {seconds} s");
        let outcomes = run_all(&functions, seconds, args.seeds, COLD_START_S)?;
        let _ = write!(
            md,
            "\n## {name} ({seconds} s)\n\n{}\n{}\n\n![{name}](scaling-{name}.svg)\n",
            table(&outcomes),
            verdict(&outcomes)
        );
        let load: Vec<(f64, f64)> = (0..seconds)
            .map(|second| {
                let instances: f64 = functions
                    .iter()
                    .map(|f| f.pattern.rate(second, f.offset_s) / f.pattern.peak() * PEAK_INSTANCES)
                    .sum();
                (second as f64, instances)
            })
            .collect();
        let mut series = vec![Series {
            name: "load (instances at request)".into(),
            points: load,
            markers: false,
        }];
        series.extend(outcomes.iter().map(|outcome| Series {
            name: outcome.scaler.clone(),
            points: outcome.instances.clone(),
            markers: false,
        }));
        let svg = line_chart_svg(
            &format!("{name}: instances of the four functions (seed 1)"),
            "second",
            "instances",
            &series,
        );
        let svg_path = args.out.join(format!("scaling-{name}.svg"));
        std::fs::create_dir_all(&args.out)
            .map_err(|error| format!("cannot create {}: {error}", args.out.display()))?;
        std::fs::write(&svg_path, svg)
            .map_err(|error| format!("cannot write {}: {error}", svg_path.display()))?;
        let mut gaps = vec![(COLD_START_S, attainment_gap(&outcomes))];
        for cold_start_s in OTHER_COLD_STARTS_S {
            let outcomes = run_all(&functions, seconds, args.seeds, cold_start_s)?;
            gaps.push((cold_start_s, attainment_gap(&outcomes)));
            let cells: Vec<String> = outcomes
                .iter()
                .map(|o| format!("{:.2}% / {:.2}", 100.0 * o.attainment(), o.gpu_hours))
                .collect();
            let _ = writeln!(
                sensitivity,
                "| {name} | {cold_start_s} | {} |",
                cells.join(" | ")
            );
        }
        gaps.sort_by(|a, b| a.0.total_cmp(&b.0));
        shortfalls.push_str(&shortfall(name, &outcomes, &gaps));
    }
    md.push_str(&where_not(&shortfalls));
    md.push_str(&sensitivity);
    let _ = writeln!(
        md,
        "\n{:.1} s in all (release build).",
        started.elapsed().as_secs_f64()
    );
    let path = args.out.join("scaling.md");
    std::fs::write(&path, md)
        .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn main() {
    if let Err(error) = run_report() {
        eprintln!("scaling-report: {error}");
        std::process::exit(1);
    }
}
