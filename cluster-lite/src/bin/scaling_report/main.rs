//! `scaling-report`: writes `bench/results/scaling.md` and its figures
//! (run by `scripts/bench.sh scaling`): the request-level 2D scaling
//! simulation (`dilu_cluster::scaling`), every scaler side by side on the
//! same load, judged by SLO attainment and GPU-hours.
//!
//! Functions: four models with Dilu's measured profile tables
//! (`bench/data/dilu-profiles*/`), each profiled by `dilu profile`'s search
//! for a batch-latency SLO; a request's SLO is twice that. Each one's start
//! time follows from its weights (see [`MODELS`] and [`setup`]).
//!
//! Load: in sample, Dilu's three arrival patterns with seeds 1–3 (dilu's
//! constants were chosen on these, and its rise memory on a generated day
//! with spikes too); beside them, the same patterns with seeds 11–13, two
//! more generated days, and a mix of Dilu's patterns and one of those
//! days (one per function), a real day (Alibaba's GenAI serving load,
//! `bench/data/alibaba-genai/`), and ten more days that only dilu runs (the
//! report says which choices each of them was held out from). Every
//! function's busiest second asks for `PEAK_INSTANCES` instances'
//! throughput at their request share.
//!
//! Each case runs dilu at its defaults, with and without warm starts, and
//! every baseline at its published setting and retuned, with and without
//! warm starts: its target swept over a grid on that very load, the
//! cheapest setting that reaches 99% (else its best attainment) kept.
//!
//! usage: scaling-report [--out DIR] [--data DIR] [--seeds N]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use dilu_cluster::scaling::misses::unprecedented_shares;
use dilu_cluster::scaling::pattern::Pattern;
use dilu_cluster::scaling::scalers::{
    IN_PERIODS, LEVEL_PERIODS, OUT_PERIODS, OUT_WINDOW, PEAK_TARGET, RISE_MEMORY, SCALER_NAMES,
    TARGET, default_target,
};
use dilu_cluster::scaling::service::Service;
use dilu_cluster::scaling::sim::{KEEP_WARM_S, Outcome};
use dilu_cluster::simulator::plot::{Series, line_chart_svg};
use dilu_profile::table::ProfileTable;

mod rows;
mod runs;
use rows::{GOAL, Row, at_goal, attainment_text, judge, missed_within, table, verdict};
use runs::{
    Case, HOST_BYTES_PER_S, MODELS, PEAK_INSTANCES, RUNTIME_START_S, STORAGE_BYTES_PER_S,
    WARM_RUNTIME_S, WARM_UP_S, functions, run_case, run_cold, setup,
};

/// A request's SLO over the batch-latency SLO its profile was searched for.
const SLO_FACTOR: f64 = 2.0;
const OTHER_RUNTIME_STARTS_S: [f64; 2] = [2.0, 40.0];
/// Dilu's patterns, in sample.
const PATTERNS: [&str; 3] = ["bursty", "periodic", "sporadic"];
/// Length and seeds of the generated days: `DAY_SEED`'s was held out
/// until the rise memory was first chosen on it; `NEW_DAY_SEED`'s was
/// held out until the rise's margin and memory were chosen with it in
/// view; `THIRD_DAY_SEED`'s was added after that, and seen when the
/// peak's share was chosen.
const DAY_SECONDS: usize = 1200;
const DAY_SEED: u64 = 7;
const NEW_DAY_SEED: u64 = 23;
const THIRD_DAY_SEED: u64 = 41;
/// Seeds of ten more generated days on which only `dilu` runs: how often
/// its defaults reach the goal on a day none of its constants was chosen
/// on (days 50–59 were seen when the peak's share was chosen; these were
/// added after).
const MORE_DAY_SEEDS: std::ops::RangeInclusive<u64> = 60..=69;
const HELD_OUT_FIRST_SEED: u64 = 11;
/// A real day's load, a minute per line: Alibaba's GenAI serving trace
/// (its `SOURCE.md` says how it was derived), played a minute per second.
const GENAI_DAY: &str = "alibaba-genai/generative-qps-by-minute.txt";
/// Targets each baseline is retuned over (its share of an instance's
/// throughput or in-flight requests); the published one is among them.
const BASELINE_TARGETS: [f64; 12] = [
    1.0, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05,
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
                    .filter(|seeds| (1..HELD_OUT_FIRST_SEED).contains(seeds))
                    .ok_or(format!(
                        "--seeds: expected a whole number from 1 to {}",
                        HELD_OUT_FIRST_SEED - 1
                    ))?
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

/// `baseline` retuned on `case` (with warm starts or not): the cheapest
/// target of the grid that reaches the goal, else the one of best
/// attainment.
fn retune(case: &Case, baseline: &str, warm: bool) -> Result<(f64, Outcome), String> {
    let mut tried = Vec::new();
    for target in BASELINE_TARGETS {
        if baseline != "dilu-paper" && target > 0.8 {
            continue;
        }
        tried.push((
            target,
            run_case(case, baseline, RUNTIME_START_S, warm, Some(target))?,
        ));
    }
    let reaching = tried
        .iter()
        .filter(|(_, o)| at_goal(o))
        .min_by(|a, b| a.1.gpu_hours.total_cmp(&b.1.gpu_hours));
    let chosen = reaching.or_else(|| {
        tried.iter().max_by(|a, b| {
            a.1.worst_function_attainment()
                .total_cmp(&b.1.worst_function_attainment())
                .then(b.1.gpu_hours.total_cmp(&a.1.gpu_hours))
        })
    });
    chosen
        .cloned()
        .ok_or_else(|| format!("{baseline}: no target tried"))
}

fn rows(case: &Case) -> Result<Vec<Row>, String> {
    let mut rows = vec![
        Row {
            label: "dilu".into(),
            setting: "defaults".into(),
            outcome: run_case(case, "dilu", RUNTIME_START_S, false, None)?,
            retuned: false,
            warm: false,
        },
        Row {
            label: "dilu, warm starts".into(),
            setting: "defaults".into(),
            outcome: run_case(case, "dilu", RUNTIME_START_S, true, None)?,
            retuned: false,
            warm: true,
        },
    ];
    for baseline in &SCALER_NAMES[1..] {
        rows.push(Row {
            label: (*baseline).into(),
            setting: format!(
                "published, target {}",
                default_target(baseline).unwrap_or(1.0)
            ),
            outcome: run_case(case, baseline, RUNTIME_START_S, false, None)?,
            retuned: false,
            warm: false,
        });
    }
    for warm in [false, true] {
        for baseline in &SCALER_NAMES[1..] {
            let (target, outcome) = retune(case, baseline, warm)?;
            rows.push(Row {
                label: format!(
                    "{baseline} retuned{}",
                    if warm { ", warm starts" } else { "" }
                ),
                setting: format!("target {target}"),
                outcome,
                retuned: true,
                warm,
            });
        }
    }
    Ok(rows)
}

fn figure(args: &Args, case: &Case, rows: &[Row]) -> Result<String, String> {
    let load: Vec<(f64, f64)> = (0..case.seconds)
        .map(|second| {
            let instances: f64 = case
                .functions
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
    series.extend(rows.iter().filter(|row| !row.retuned).map(|row| Series {
        name: row.label.clone(),
        points: row.outcome.instances.clone(),
        markers: false,
    }));
    let svg = line_chart_svg(
        &format!(
            "{}: instances of the four functions (seed {})",
            case.name, case.seeds[0]
        ),
        "second",
        "instances",
        &series,
    );
    let file = format!("scaling-{}.svg", case.name);
    let path = args.out.join(&file);
    std::fs::write(&path, svg)
        .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    Ok(file)
}

fn seeds_text(seeds: &[u64]) -> String {
    format!("seeds {}–{}", seeds[0], seeds[seeds.len() - 1])
}

fn cases(args: &Args, services: &[Service]) -> Result<Vec<Case>, String> {
    let mut patterns = Vec::new();
    for name in PATTERNS {
        let path = args.data.join("dilu-workloads").join(format!("{name}.txt"));
        patterns.push(Pattern::parse(name, &read(&path)?)?);
    }
    let day = Pattern::diurnal_with_spikes(DAY_SECONDS, DAY_SEED);
    let new_day = Pattern::diurnal_with_spikes(DAY_SECONDS, NEW_DAY_SEED);
    let in_sample: Vec<u64> = (1..=args.seeds).collect();
    let held_out: Vec<u64> = (HELD_OUT_FIRST_SEED..HELD_OUT_FIRST_SEED + args.seeds).collect();
    let mut cases = Vec::new();
    for pattern in &patterns {
        cases.push(Case {
            name: pattern.name.clone(),
            held_out: false,
            functions: functions(services, &[pattern], 0.25),
            seconds: pattern.seconds(),
            seeds: in_sample.clone(),
        });
    }
    for pattern in &patterns {
        cases.push(Case {
            name: format!("{}-new-seeds", pattern.name),
            held_out: true,
            functions: functions(services, &[pattern], 0.25),
            seconds: pattern.seconds(),
            seeds: held_out.clone(),
        });
    }
    cases.push(Case {
        name: "diurnal-spikes".into(),
        held_out: false,
        functions: functions(services, &[&day], 0.25),
        seconds: day.seconds(),
        seeds: held_out.clone(),
    });
    cases.push(Case {
        name: "diurnal-spikes-new-day".into(),
        held_out: true,
        functions: functions(services, &[&new_day], 0.25),
        seconds: new_day.seconds(),
        seeds: held_out.clone(),
    });
    let third_day = Pattern::diurnal_with_spikes(DAY_SECONDS, THIRD_DAY_SEED);
    cases.push(Case {
        name: "diurnal-spikes-third-day".into(),
        held_out: true,
        functions: functions(services, &[&third_day], 0.25),
        seconds: third_day.seconds(),
        seeds: held_out.clone(),
    });
    let mix: Vec<&Pattern> = patterns.iter().chain([&new_day]).collect();
    cases.push(Case {
        name: "mix".into(),
        held_out: true,
        functions: functions(services, &mix, 0.0),
        seconds: mix.iter().map(|p| p.seconds()).max().unwrap_or(1),
        seeds: held_out.clone(),
    });
    let genai_day = Pattern::parse("alibaba-genai-day", &read(&args.data.join(GENAI_DAY))?)?;
    cases.push(Case {
        name: genai_day.name.clone(),
        held_out: true,
        functions: functions(services, &[&genai_day], 0.25),
        seconds: genai_day.seconds(),
        seeds: held_out,
    });
    Ok(cases)
}

fn run_report() -> Result<(), String> {
    let args = parse_args()?;
    let started = std::time::Instant::now();
    let services = MODELS
        .iter()
        .map(|(name, file, slo, _)| {
            let table = ProfileTable::parse(&read(&args.data.join(file))?)?;
            Service::profiled(name, &table, *slo, SLO_FACTOR)
        })
        .collect::<Result<Vec<_>, String>>()?;
    std::fs::create_dir_all(&args.out)
        .map_err(|error| format!("cannot create {}: {error}", args.out.display()))?;
    let cases = cases(&args, &services)?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# 2D scaling: dilu's scaler beside Dilu's published rule, KPA and HPA, each retuned\n\n\
         Written by `scripts/bench.sh scaling` (`scaling-report --seeds {seeds}`,\n\
         `cluster-lite/src/bin/scaling_report/`); nothing here is edited by hand. The model and the\n\
         scalers: [docs/scaling.md](../../docs/scaling.md) and `cluster-lite/src/scaling/`.\n\n\
         Four functions share a cluster of 64 GPUs (8 per node, placed by `dilu`). Every instance is\n\
         scaled vertically by the node manager (share from request up to limit under load, shared on\n\
         its GPU); the scalers differ only in how many instances they run. Each function's busiest\n\
         second asks for {PEAK_INSTANCES} instances' throughput at their request share. A new instance\n\
         serves after its runtime starts ({RUNTIME_START_S} s) and its weights load from storage\n\
         ({:.1} GB/s); with warm starts, one started where a warm copy waits serves after\n\
         {WARM_RUNTIME_S} s and a copy from host memory ({:.0} GB/s). Goal: {:.0}% of each function's\n\
         requests within its SLO (a pooled figure would let a quiet function miss most of its requests\n\
         behind a busy one that misses none). Every load is played for {WARM_UP_S} s before it is counted (its preceding seconds,\n\
         the pattern wrapping), the longest memory among the scalers and the warm-start predictor, so\n\
         each starts as a running service does; `dilu` counted from a cold start is in its own table.\n\n\
         | function | batch | request SLO ms | SM request | SM limit | req/s at request | req/s at limit | weights GB | cold start s | warm start s |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        STORAGE_BYTES_PER_S / 1e9,
        HOST_BYTES_PER_S / 1e9,
        100.0 * GOAL,
        seeds = args.seeds,
    );
    let timing = setup(1, RUNTIME_START_S, true, None);
    for function in &cases[0].functions {
        let service = &function.service;
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} | {:.1} | {:.2} |",
            service.name,
            service.batch,
            service.slo_s * 1000.0,
            service.request,
            service.limit,
            service.throughput(service.request),
            service.throughput(service.limit),
            function.weight_bytes as f64 / 1e9,
            function.cold_start_s(&timing),
            function.warm_start_s(&timing),
        );
    }
    let _ = writeln!(
        md,
        "\nRows: `dilu` at its defaults, with and without warm starts (pre-warmed by prediction,\n\
         instances scaled in kept warm); each baseline at its published setting, and **retuned**: its\n\
         target swept over {:?} on that very load (seeds and all), keeping the cheapest target that\n\
         reaches {:.0}% for every function, else its best worst-function attainment; retuned twice, without warm starts and with the same\n\
         warm starts `dilu` gets (offload on scale-in, pre-warming by the same prediction), each\n\
         `dilu` row judged against the baselines run alike. `dilu` is not retuned per case.\n\
         GPU-hours count GPUs holding any instance; warm copies hold host memory only (warm GiB-h).",
        BASELINE_TARGETS,
        100.0 * GOAL
    );
    let mut summary = String::from(
        "\n## Summary\n\n\
         | load | held out | dilu | cheapest retuned baseline at the goal | dilu at the goal and cheaper | dilu, warm starts | cheapest retuned baseline at the goal, warm starts | dilu at the goal and cheaper, warm starts |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    let mut sections = String::new();
    let mut shortfalls = String::new();
    let mut cold = format!(
        "\n## From a cold start\n\n\
         `dilu` at its defaults with no warm-up: every memory empty, its instances those the first\n\
         second's load asks for at their requests, and every second counted. Beside it, the share of\n\
         its missed requests that came in the first {RISE_MEMORY} s.\n\n\
         | load | dilu | from a cold start | its misses in the first {RISE_MEMORY} s | dilu, warm starts | from a cold start | its misses in the first {RISE_MEMORY} s |\n\
         |---|---|---|---:|---|---|---:|\n"
    );
    for case in &cases {
        eprintln!(
            "{}: {} s, {}",
            case.name,
            case.seconds,
            seeds_text(&case.seeds)
        );
        let rows = rows(case)?;
        let _ = write!(
            sections,
            "\n## {} ({} s, {}{})\n\n{}\n{}",
            case.name,
            case.seconds,
            seeds_text(&case.seeds),
            if case.held_out { ", held out" } else { "" },
            table(&rows),
            verdict(&rows)
        );
        if matches!(
            case.name.as_str(),
            "bursty" | "periodic" | "sporadic" | "mix" | "diurnal-spikes" | "alibaba-genai-day"
        ) {
            let file = figure(&args, case, &rows)?;
            let _ = writeln!(sections, "\n![{}]({file})", case.name);
        }
        let cell = |row: &Row| {
            format!(
                "{} / {:.2}",
                attainment_text(&row.outcome),
                row.outcome.gpu_hours
            )
        };
        let mut cold_cells = Vec::new();
        for (row, warm) in rows[..2].iter().zip([false, true]) {
            let from_cold = run_cold(case, warm)?;
            cold_cells.push(cell(row));
            cold_cells.push(format!(
                "{} / {:.2}",
                attainment_text(&from_cold),
                from_cold.gpu_hours
            ));
            cold_cells.push(format!(
                "{:.0}%",
                100.0 * missed_within(&from_cold, RISE_MEMORY)
            ));
        }
        let _ = writeln!(cold, "| {} | {} |", case.name, cold_cells.join(" | "));
        let verdicts = [judge(&rows[0], &rows), judge(&rows[1], &rows)];
        for (row, &(_, cheapest, won)) in rows[..2].iter().zip(&verdicts) {
            if won {
                continue;
            }
            let o = &row.outcome;
            let timing = setup(1, RUNTIME_START_S, false, None);
            let shares = unprecedented_shares(&case.functions, case.seconds, &timing, o);
            let _ = writeln!(
                shortfalls,
                "- **{}**, `{}`: {} with {:.2} GPU-h against {}. {:.0}% of its missed requests \
                 came within one cold start of a load higher than any in the {RISE_MEMORY} s before \
                 (such seconds carry {:.0}% of all requests).",
                case.name,
                row.label,
                attainment_text(o),
                o.gpu_hours,
                cheapest.map_or("no baseline at the goal".to_string(), |best| format!(
                    "`{}` ({}) at {} with {:.2} GPU-h",
                    best.label,
                    best.setting,
                    attainment_text(&best.outcome),
                    best.outcome.gpu_hours
                )),
                100.0 * shares.0,
                100.0 * shares.1
            );
        }
        let baseline = |cheapest: Option<&Row>| {
            cheapest.map_or("none".to_string(), |row| {
                format!("`{}` ({}): {}", row.label, row.setting, cell(row))
            })
        };
        let yes = |won: bool| if won { "yes" } else { "no" };
        let _ = writeln!(
            summary,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            case.name,
            if case.held_out { "yes" } else { "no" },
            cell(&rows[0]),
            baseline(verdicts[0].1),
            yes(verdicts[0].2),
            cell(&rows[1]),
            baseline(verdicts[1].1),
            yes(verdicts[1].2),
        );
    }
    let _ = writeln!(
        summary,
        "\nCells: SLO attainment (pooled, and the worst function's) / GPU-hours (means over the seeds)."
    );
    md.push_str(&summary);
    md.push_str("\n## Where `dilu` is below the goal or not the cheapest there\n\n");
    if shortfalls.is_empty() {
        md.push_str("Nowhere.\n");
    } else {
        md.push_str(&shortfalls);
    }
    md.push_str(&sections);
    md.push_str(&cold);
    md.push_str(&start_times(&cases[..PATTERNS.len()])?);
    md.push_str(&more_days(&services, args.seeds)?);
    let _ = writeln!(
        md,
        "\n## In sample and held out\n\n\
         `dilu`'s constants (a target of {TARGET} of its instances' throughput at their limits for the\n\
         load's level, a scale-in after {IN_PERIODS} s of fewer being enough, exhaustion in {OUT_PERIODS} of\n\
         {OUT_WINDOW} s) were chosen by sweeping them on the three in-sample loads (Dilu's patterns, seeds\n\
         1–{seeds}). The load's level (its highest in the last {LEVEL_PERIODS} s, which rises are measured\n\
         from), the share of the limits' throughput the level plus the largest remembered rise may use\n\
         ({PEAK_TARGET}) and the rise memory ({RISE_MEMORY} s, the scaler's and the warm-start prediction's\n\
         alike) were chosen in sweeps that printed every load of the summary: for them none of those\n\
         loads is fully held out. The memory and a share of 1 were chosen first, with `diurnal-spikes-third-day` (day seed\n\
         {THIRD_DAY_SEED}) added afterwards, unseen: it fell below the goal, as did `periodic` with 40 s\n\
         starts, and {PEAK_TARGET} was then chosen with that day, the start times and ten more days\n\
         (seeds 50–59) in view. The ten days of \"Ten more days\" (seeds {}–{}) were added after that\n\
         and are held out from every choice of a constant. How far a scale-in goes (to the most\n\
         instances the {IN_PERIODS} s asked for; it had been one instance) was changed last, in a run\n\
         that printed every table here, the ten days too; it has no constant to choose. The scale-in's\n\
         window was then swept again (8 to 15 s) on the in-sample loads at every start time of \"Other\n\
         start times\": {IN_PERIODS} s is the shortest that kept them all at the goal; those runs printed\n\
         every table too. The warm starts' keep-alive ({KEEP_WARM_S} s) was chosen in a sweep that\n\
         printed the held-out loads too. The warm-up was added after counting from a cold start had put\n\
         most of `dilu`'s missed requests in the first five minutes; its length is not one of `dilu`'s\n\
         constants but the longest memory of any scaler or predictor here. `alibaba-genai-day`, a\n\
         production service's day (Alibaba's GenAI serving trace, `bench/data/alibaba-genai/`, a minute\n\
         per second), was added after all of that and is held out from every choice. The baselines are\n\
         retuned on every load, held out or not, which favours them.",
        MORE_DAY_SEEDS.start(),
        MORE_DAY_SEEDS.end(),
        seeds = args.seeds,
    );
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

/// `dilu` at its defaults on [`MORE_DAY_SEEDS`]' days, with and without
/// warm starts.
fn more_days(services: &[Service], seeds: u64) -> Result<String, String> {
    let mut text = format!(
        "\n## Ten more days\n\n\
         `dilu` alone, at its defaults, on generated days of seeds {}–{} (arrival seeds as the held-out\n\
         loads'): SLO attainment (pooled, and the worst function's) / GPU-hours. No baseline is run here: the table says\n\
         how often the defaults reach the goal on days none of `dilu`'s constants was chosen on, and\n\
         what share of `dilu`'s missed requests came within one cold start of a load higher than any\n\
         in the {RISE_MEMORY} s before (a rise it could not have remembered).\n\n\
         | day seed | dilu | its misses after such a load | dilu, warm starts |\n\
         |---:|---|---:|---|\n",
        MORE_DAY_SEEDS.start(),
        MORE_DAY_SEEDS.end()
    );
    let mut at_the_goal = [0, 0];
    for day_seed in MORE_DAY_SEEDS {
        let day = Pattern::diurnal_with_spikes(DAY_SECONDS, day_seed);
        let case = Case {
            name: format!("day {day_seed}"),
            held_out: true,
            functions: functions(services, &[&day], 0.25),
            seconds: day.seconds(),
            seeds: (HELD_OUT_FIRST_SEED..HELD_OUT_FIRST_SEED + seeds).collect(),
        };
        eprintln!("{}", case.name);
        let mut cells = Vec::new();
        for (count, warm) in at_the_goal.iter_mut().zip([false, true]) {
            let outcome = run_case(&case, "dilu", RUNTIME_START_S, warm, None)?;
            *count += usize::from(at_goal(&outcome));
            cells.push(format!(
                "{} / {:.2}",
                attainment_text(&outcome),
                outcome.gpu_hours
            ));
            if !warm {
                let timing = setup(1, RUNTIME_START_S, false, None);
                cells.push(if outcome.missed.is_empty() {
                    "none missed".into()
                } else {
                    let (share, _) =
                        unprecedented_shares(&case.functions, case.seconds, &timing, &outcome);
                    format!("{:.0}%", 100.0 * share)
                });
            }
        }
        let _ = writeln!(text, "| {day_seed} | {} |", cells.join(" | "));
    }
    let days = MORE_DAY_SEEDS.count();
    let _ = writeln!(
        text,
        "\nAt the goal for every function: {} of {days} days, {} of {days} with warm starts.",
        at_the_goal[0], at_the_goal[1]
    );
    Ok(text)
}

/// Every scaler at its default setting on the in-sample loads, at other
/// runtime start times.
fn start_times(cases: &[Case]) -> Result<String, String> {
    let mut text = String::from(
        "\n## Other start times\n\nSLO attainment (pooled, and the worst function's) / GPU-hours at the default settings, with the runtime start \
         (before weights load) changed.\n\n\
         | load | runtime start s | dilu | dilu, warm starts | dilu-paper | kpa | hpa |\n\
         |---|---:|---|---|---|---|---|\n",
    );
    for case in cases {
        for runtime_start_s in OTHER_RUNTIME_STARTS_S {
            let mut cells = vec![
                run_case(case, "dilu", runtime_start_s, false, None)?,
                run_case(case, "dilu", runtime_start_s, true, None)?,
            ];
            for baseline in &SCALER_NAMES[1..] {
                cells.push(run_case(case, baseline, runtime_start_s, false, None)?);
            }
            let cells: Vec<String> = cells
                .iter()
                .map(|o| format!("{} / {:.2}", attainment_text(o), o.gpu_hours))
                .collect();
            let _ = writeln!(
                text,
                "| {} | {runtime_start_s} | {} |",
                case.name,
                cells.join(" | ")
            );
        }
    }
    Ok(text)
}

fn main() {
    if let Err(error) = run_report() {
        eprintln!("scaling-report: {error}");
        std::process::exit(1);
    }
}
