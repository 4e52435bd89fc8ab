//! Judged as the field judges GPU sharing: the latency-critical tenant's
//! latency against its own run alone (p50 and p99 ratios; iterations/s for
//! a training primary) and how much of the time it leaves the device idle
//! best-effort work *harvests*, over shapes drawn from the co-location
//! class, with the field's systems run beside dilu on the same simulated
//! GPU: the device's own time slicing, dilu's static shares, HAMi-core,
//! XSched (Level 1) and TGS, then dilu at its defaults with and without a
//! declared SLO. Where a peer is ahead of dilu in a shape, on the primary's
//! figure or on harvest, the report says why as far as the same run tells
//! (`field/where_behind.rs`).
//!
//! Peers are built from their public sources outside this repository and
//! found through `DILU_PEER_HAMI`, `DILU_PEER_XSCHED` and `DILU_PEER_TGS`
//! (see `bench/src/peers/`); a peer that is not given, or fails, gets a row
//! that says why.
//!
//! Run: `scripts/bench.sh field` (8 inference and 4 training shapes, 8 s
//! per run). `-- --seconds S`, `--inference N`, `--training M`, `--seed N`
//! (shapes drawn from another seed), `--only NAMES` (comma-separated rows
//! besides `alone`, e.g. `--only "dilu without SLO,XSched"`: prints, writes no
//! file), `--shape K` (only the Kth shape: prints, writes no file),
//! `--steal-gate PERCENT` and `--steal-tries N` (a row run while the host
//! took more of the CPU than that is run again, up to N tries in all; see
//! `dilu_bench::steal_gate`).
//! Writes `bench/results/field.md`.

#[allow(dead_code)]
#[path = "colocation.rs"]
mod colocation;
#[path = "field/where_behind.rs"]
mod where_behind;

use colocation::{
    DEFAULTS, DEFAULTS_NO_SLO, DEFAULTS_NO_SLO_NO_REPORTS, Run, Shape, TIME_SLICING, harvest,
    ratio, serve_args, words,
};
use dilu_bench::latency_split;
use dilu_bench::peers::{self, PEERS, Peer};
use dilu_bench::report::{Table, machine, write_result};
use dilu_bench::stats::Draws;
use dilu_bench::steal_gate::{Noise, StealGate};
use dilu_harness::workspace::Scratch;

/// The rows of every shape after `alone`, as tables name them: dilu's
/// configurations (the colocation benchmark's names) and the peers.
const DILU_SLO: &str = "dilu with SLO";
const DILU_NO_SLO: &str = "dilu without SLO";
const DILU_NO_REPORTS: &str = "dilu without SLO or reports";
const DILU_TRAINING: &str = "dilu";
const STATIC: &str = "static shares";
/// The primary by itself once more, after every other row of its shape:
/// what the ratios read where nothing is shared (the measurement's own
/// spread on this host).
const ALONE_AGAIN: &str = "alone again";

/// The field's yardstick for a primary without an SLO: its p99 within
/// this factor of its p99 alone (training: iterations/s within 2%).
const AS_IF_ALONE_P99: f64 = 1.10;
const AS_IF_ALONE_RATE: f64 = 0.98;

/// The class's fixed seed for this benchmark.
const FIELD_SEED: u64 = 0x6669_656c_6421_0001;
/// simgpu's default model: 1320 blocks take 100 µs.
const BLOCKS_PER_MS: f64 = 13_200.0;

fn blocks(ms: f64) -> String {
    ((ms * BLOCKS_PER_MS).round() as u64).to_string()
}

/// One to three deep-queue fillers with kernels of 0.05-3 ms
/// (log-uniform); their names for the shape's title.
fn draw_fillers(draws: &mut Draws) -> (Vec<String>, String) {
    let count = draws.uniform(1.0, 4.0).floor() as usize;
    let ms: Vec<f64> = (0..count).map(|_| draws.log_uniform(0.05, 3.0)).collect();
    let names: Vec<String> = ms.iter().map(|m| format!("{m:.2} ms")).collect();
    (ms.iter().map(|&m| blocks(m)).collect(), names.join(" + "))
}

/// Inference primaries: Poisson or bursty (300 ms on, 300 ms off)
/// arrivals at 10-500 req/s, 1-10 kernels of 0.05-1 ms per request (rate
/// and kernel length log-uniform), busy 2-50% of the time alone, an SLO of
/// 5-20 ms that is at least three times the request's kernel time.
fn inference_shapes(count: usize, draws: &mut Draws) -> Vec<(Shape, f64)> {
    let mut shapes = Vec::new();
    while shapes.len() < count {
        let kernels = draws.uniform(1.0, 11.0).floor() as u32;
        let kernel_ms = draws.log_uniform(0.05, 1.0);
        let rate = draws.log_uniform(10.0, 500.0).round();
        let request_ms = f64::from(kernels) * kernel_ms;
        let load = rate * request_ms / 1000.0;
        let lowest_slo = (3.0 * request_ms).max(5.0);
        if !(0.02..=0.5).contains(&load) || lowest_slo > 20.0 {
            continue;
        }
        let slo_ms = draws.uniform(lowest_slo, 20.0).round();
        let bursty = draws.uniform(0.0, 1.0) < 0.5;
        let (filler_blocks, filler_names) = draw_fillers(draws);
        let primary = serve_args(rate, kernels, &blocks(kernel_ms), bursty);
        // Bursty arrivals come half the time: half the requests a second.
        let mean_rate = if bursty { rate / 2.0 } else { rate };
        let shape = Shape {
            name: format!(
                "{} {rate} req/s, {kernels} × {:.0} µs, SLO {slo_ms} ms; fillers {filler_names}",
                if bursty { "bursty" } else { "Poisson" },
                kernel_ms * 1000.0,
            ),
            tuned: false,
            primary,
            slo_ms: Some(slo_ms),
            primary_request: 50.0,
            tolerance: "0",
            filler_blocks,
            long_filler: None,
            own_streams: true,
        };
        shapes.push((shape, mean_rate));
    }
    shapes
}

/// Requests a run of an inference shape aims for: a p99 of fewer than 436
/// has no upper end to its range (1.25% a side), and of 1,000 one
/// about 10 requests wide either side of the 990th.
const REQUESTS_PER_RUN: f64 = 1000.0;
/// The longest run a low-rate shape gets (12 req/s: 480 requests).
const MAX_RUN_SECONDS: u64 = 40;

/// How long each run of a shape lasts: `seconds`, or for an inference
/// shape whose requests come too slowly for its p99 to be bounded in that
/// time, long enough for [`REQUESTS_PER_RUN`] (at most
/// [`MAX_RUN_SECONDS`]).
fn run_seconds(seconds: u64, mean_rate: Option<f64>) -> u64 {
    mean_rate.map_or(seconds, |rate| {
        let needed = (REQUESTS_PER_RUN / rate.max(1.0)).ceil() as u64;
        seconds.max(needed.min(MAX_RUN_SECONDS))
    })
}

/// Training primaries: iterations of one to three phases, each a gap of
/// 1-10 ms (data loading, an all-reduce) then 2-12 kernels of 0.05-1 ms
/// and a synchronisation.
fn training_shapes(count: usize, draws: &mut Draws) -> Vec<Shape> {
    (0..count)
        .map(|_| {
            let phases = draws.uniform(1.0, 4.0).floor() as usize;
            let gaps: Vec<String> = (0..phases)
                .map(|_| format!("{:.1}", draws.log_uniform(1.0, 10.0)))
                .collect();
            let kernels = draws.uniform(2.0, 13.0).floor() as u32;
            let kernel_ms = draws.log_uniform(0.05, 1.0);
            let (filler_blocks, filler_names) = draw_fillers(draws);
            Shape {
                name: format!(
                    "training: gaps {} ms, {phases} × {kernels} × {:.0} µs; fillers {filler_names}",
                    gaps.join(" + "),
                    kernel_ms * 1000.0
                ),
                tuned: false,
                primary: words(&[
                    "train",
                    "--load-ms",
                    &gaps.join(","),
                    "--kernels",
                    &kernels.to_string(),
                    "--blocks",
                    &blocks(kernel_ms),
                ]),
                slo_ms: None,
                primary_request: 50.0,
                tolerance: "0",
                filler_blocks,
                long_filler: None,
                own_streams: true,
            }
        })
        .collect()
}

/// The variable naming `peer`'s build.
fn peer_variable(peer: &str) -> &'static str {
    match peer {
        "HAMi-core" => "DILU_PEER_HAMI",
        "XSched" => "DILU_PEER_XSCHED",
        _ => "DILU_PEER_TGS",
    }
}

/// The flags this benchmark takes with a value, and without one
/// (`--bench` is cargo's).
const VALUE_FLAGS: [&str; 9] = [
    "--seconds",
    "--inference",
    "--training",
    "--seed",
    "--shape",
    "--only",
    "--keep-traces",
    "--steal-gate",
    "--steal-tries",
];
const BARE_FLAGS: [&str; 2] = ["--bench", "--list"];

/// Why `args` (the program's name left out) are not this benchmark's, if
/// they are not: a flag it does not know is refused, not ignored.
fn unknown_arg(args: &[String]) -> Option<String> {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if VALUE_FLAGS.contains(&arg.as_str()) {
            if rest.next().is_none() {
                return Some(format!("{arg} needs a value"));
            }
        } else if !BARE_FLAGS.contains(&arg.as_str()) {
            return Some(format!(
                "unknown argument {arg:?} (it takes {}, each with a value)",
                VALUE_FLAGS.join(", ")
            ));
        }
    }
    None
}

/// The value after `flag` on the command line.
fn arg_after(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

fn number_arg<T: std::str::FromStr>(flag: &str, default: T) -> T {
    arg_after(flag).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{flag} {v:?}: a whole number"))
    })
}

/// A measured row, or why the row could not be measured.
type Outcome = Result<Run, String>;

/// Each peer by name: started, or why it could not be.
type StartedPeers = Vec<(&'static str, Result<Box<dyn Peer>, String>)>;

/// One row of a shape: dilu's configuration under its table name, or a
/// peer.
fn measure(
    shape: &Shape,
    index: usize,
    row: &str,
    seconds: u64,
    started: &StartedPeers,
) -> Outcome {
    let dilu_config = match row {
        "alone" | ALONE_AGAIN => Some("alone"),
        TIME_SLICING => Some(TIME_SLICING),
        STATIC => Some("static"),
        DILU_SLO | DILU_TRAINING => Some(DEFAULTS),
        DILU_NO_SLO => Some(DEFAULTS_NO_SLO),
        DILU_NO_REPORTS => Some(DEFAULTS_NO_SLO_NO_REPORTS),
        _ => None,
    };
    match dilu_config {
        Some(config) => colocation::run_with(shape, index, config, seconds, None),
        None => {
            let (_, peer) = started
                .iter()
                .find(|(name, _)| *name == row)
                .expect("a started peer");
            let peer = peer.as_ref().map_err(Clone::clone)?;
            colocation::run_with(shape, index, row, seconds, Some(peer.as_ref()))
        }
    }
}

/// What each row of one shape gave.
struct ShapeResult {
    shape: String,
    /// Seconds each of its runs lasted.
    seconds: u64,
    inference: bool,
    alone: Run,
    /// The primary's no-delay bound as a harvest: the share of its idle
    /// time fillers that never delay it could use.
    harvest_bound: f64,
    /// What fillers that cannot know the arrivals may harvest with the
    /// primary's p99 kept within [`AS_IF_ALONE_P99`] of alone
    /// (`dilu_bench::as_if_alone`; inference shapes only).
    as_if_alone_bound: Option<f64>,
    rows: Vec<(String, Outcome)>,
    /// The host's steal during `alone`'s kept run, and each row's (in the
    /// order of `rows`).
    alone_noise: Noise,
    row_noise: Vec<Noise>,
}

/// The as-if-alone bound of an inference shape from its run alone:
/// fillers of the shape's shortest kernels, the pauses of bursty arrivals
/// given whole.
fn as_if_alone_bound(shape: &Shape, alone: &Run, seconds: u64, no_delay: f64) -> Option<f64> {
    use dilu_bench::as_if_alone::{busy_ns, filler_share_bound, harvest_bound, quiet_idle_share};
    if alone.requests.is_empty() {
        return None;
    }
    let shortest_kernel_ns = shape
        .filler_blocks
        .iter()
        .filter_map(|b| b.parse::<f64>().ok())
        .map(|blocks| (blocks / BLOCKS_PER_MS * 1e6) as u64)
        .min()?;
    let share = filler_share_bound(
        &alone.requests,
        shortest_kernel_ns,
        dilu_colocation::HANDOFF_NS,
        AS_IF_ALONE_P99,
    );
    let ms_after = |flag: &str| -> u64 {
        shape
            .primary
            .iter()
            .skip_while(|a| *a != flag)
            .nth(1)
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |ms| (ms * 1e6) as u64)
    };
    let quiet = quiet_idle_share(
        seconds * 1_000_000_000,
        busy_ns(&alone.requests),
        ms_after("--on-ms"),
        ms_after("--off-ms"),
    );
    Some(harvest_bound(no_delay, share, quiet))
}

fn p(run: &Run, key: &str) -> f64 {
    run.primary[key].as_f64().unwrap_or(0.0)
}

/// The range of a p99 ratio, a row's over alone's. Each run's p99 range
/// (`p99_low_ms`, `p99_high_ms`: `dilu_harness::quantile`) misses its true
/// p99 with at most 1.25% chance a side, so this one misses the true ratio
/// with at most 5%. Its low end is 0 where alone's p99 has no upper end;
/// its high end `None` (unbounded) where the row's p99 has no upper end.
fn p99_ratio_range(run: &Run, alone: &Run) -> (f64, Option<f64>) {
    let end = |r: &Run, key: &str| r.primary[key].as_f64().filter(|&ms| ms > 0.0);
    let low = match (end(run, "p99_low_ms"), end(alone, "p99_high_ms")) {
        (Some(row), Some(alone)) => row / alone,
        _ => 0.0,
    };
    let high = match (end(run, "p99_high_ms"), end(alone, "p99_low_ms")) {
        (Some(row), Some(alone)) => Some(row / alone),
        _ => None,
    };
    (low, high)
}

/// A p99 ratio with its range, `1.05× (0.93–1.21)`.
fn p99_ratio_text(run: &Run, alone: &Run) -> String {
    let (low, high) = p99_ratio_range(run, alone);
    format!(
        "{:.2}× ({low:.2}–{})",
        ratio(p(run, "p99_ms"), p(alone, "p99_ms")),
        high.map_or("∞".to_string(), |h| format!("{h:.2}"))
    )
}

/// Share of a run's requests whose time is split in the tables: those
/// that set its p99.
const SLOWEST: f64 = 0.01;

/// The mean split of a run's slowest requests (`latency_split`): the
/// primary's own kernels, only others' kernels, the device idle.
fn slowest_text(run: &Run) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    latency_split::slowest(&run.request_times, SLOWEST).map_or("—".to_string(), |t| {
        format!(
            "{:.2} / {:.2} / {:.2}",
            ms(t.own_ns),
            ms(t.others_ns),
            ms(t.idle_ns)
        )
    })
}

fn shape_table(result: &ShapeResult) -> String {
    let mut table = if result.inference {
        Table::new(&[
            "row",
            "p50 vs alone",
            "p99 vs alone (95% range)",
            "harvest",
            "device busy",
            "SLO violations",
            "slowest 1%: own kernels / others' kernels / device idle, ms",
            "host steal",
        ])
    } else {
        Table::new(&[
            "row",
            "iterations/s vs alone",
            "harvest",
            "device busy",
            "host steal",
        ])
    };
    let alone = &result.alone;
    let mut alone_row = vec![
        "alone".to_string(),
        if result.inference {
            format!("{:.2} ms", p(alone, "p50_ms"))
        } else {
            format!("{:.1}/s", p(alone, "iterations_per_second"))
        },
    ];
    if result.inference {
        // An end the run could not bound: 0 below, ∞ above.
        let end = |key: &str, unbounded: &str| {
            alone.primary[key]
                .as_f64()
                .map_or(unbounded.to_string(), |ms| format!("{ms:.2}"))
        };
        alone_row.push(format!(
            "{:.2} ms ({}–{})",
            p(alone, "p99_ms"),
            end("p99_low_ms", "0"),
            end("p99_high_ms", "∞")
        ));
    }
    alone_row.push(match result.as_if_alone_bound {
        Some(bound) => format!(
            "(no-delay bound {:.1}%; as-if-alone bound {:.1}%)",
            result.harvest_bound * 100.0,
            bound * 100.0
        ),
        None => format!("(no-delay bound {:.1}%)", result.harvest_bound * 100.0),
    });
    alone_row.push(format!("{:.1}%", alone.device_busy * 100.0));
    if result.inference {
        alone_row.push(format!("{:.2}%", 100.0 * p(alone, "slo_violation_rate")));
        alone_row.push(slowest_text(alone));
    }
    alone_row.push(result.alone_noise.cell());
    table.row(alone_row);
    for ((name, outcome), noise) in result.rows.iter().zip(&result.row_noise) {
        let cells = match outcome {
            Ok(run) if result.inference => vec![
                format!("{:.2}×", ratio(p(run, "p50_ms"), p(alone, "p50_ms"))),
                p99_ratio_text(run, alone),
                format!("{:.1}%", harvest(run, alone) * 100.0),
                format!("{:.1}%", run.device_busy * 100.0),
                format!("{:.2}%", 100.0 * p(run, "slo_violation_rate")),
                slowest_text(run),
            ],
            Ok(run) => vec![
                format!(
                    "{:.3}×",
                    ratio(
                        p(run, "iterations_per_second"),
                        p(alone, "iterations_per_second")
                    )
                ),
                format!("{:.1}%", harvest(run, alone) * 100.0),
                format!("{:.1}%", run.device_busy * 100.0),
            ],
            Err(why) => {
                let width = if result.inference { 6 } else { 3 };
                let mut cells = vec![format!("— {}", why.replace('|', "/"))];
                cells.extend((1..width).map(|_| "—".to_string()));
                cells
            }
        };
        let mut row = vec![name.clone()];
        row.extend(cells);
        row.push(noise.cell());
        table.row(row);
    }
    format!(
        "### {} ({} s runs)\n\n{}\n",
        result.shape,
        result.seconds,
        table.markdown()
    )
}

/// Per row over the shapes: the worst and median p99 ratio (iterations/s
/// for training), mean harvest, and the shapes within the as-if-alone bar
/// (by the p99 measured, and by its whole range).
fn summary_table(results: &[ShapeResult], rows: &[&str], inference: bool) -> String {
    let mut table = if inference {
        Table::new(&[
            "row",
            "p99 vs alone: median / worst",
            &format!("shapes with p99 ≤ {AS_IF_ALONE_P99:.2}× alone"),
            &format!("p99 range wholly ≤ / wholly > {AS_IF_ALONE_P99:.2}×"),
            "harvest: mean / lowest",
            "harvest over the no-delay bound: mean",
            "harvest over the as-if-alone bound: mean / shapes at ≥ 80% of it",
            "shapes with more violations than alone (+1 point)",
            "slowest 1%: share of their time behind others' kernels / device idle (mean)",
        ])
    } else {
        Table::new(&[
            "row",
            "iterations/s vs alone: median / worst",
            &format!("shapes at ≥ {AS_IF_ALONE_RATE:.2}× alone"),
            "harvest: mean / lowest",
            "harvest over the no-delay bound: mean",
        ])
    };
    let shapes: Vec<&ShapeResult> = results
        .iter()
        .filter(|r| r.inference == inference)
        .collect();
    for row in rows {
        let mut ratios = Vec::new();
        let mut harvests = Vec::new();
        let mut over_bound = Vec::new();
        let mut over_as_if_alone = Vec::new();
        let mut within = 0;
        // Shapes whose p99 ratio's range is wholly within the bar / over it.
        let (mut surely_within, mut surely_over) = (0, 0);
        let mut worse_violations = 0;
        // The slowest requests' shares behind others' kernels and idle.
        let mut slowest_shares: Vec<(f64, f64)> = Vec::new();
        let mut failed = 0;
        for result in &shapes {
            let Some((_, outcome)) = result.rows.iter().find(|(n, _)| n == row) else {
                continue;
            };
            let Ok(run) = outcome else {
                failed += 1;
                continue;
            };
            let alone = &result.alone;
            let r = if inference {
                ratio(p(run, "p99_ms"), p(alone, "p99_ms"))
            } else {
                ratio(
                    p(run, "iterations_per_second"),
                    p(alone, "iterations_per_second"),
                )
            };
            if (inference && r <= AS_IF_ALONE_P99) || (!inference && r >= AS_IF_ALONE_RATE) {
                within += 1;
            }
            if inference {
                let (low, high) = p99_ratio_range(run, alone);
                surely_within += usize::from(high.is_some_and(|h| h <= AS_IF_ALONE_P99));
                surely_over += usize::from(low > AS_IF_ALONE_P99);
            }
            if inference
                && 100.0 * (p(run, "slo_violation_rate") - p(alone, "slo_violation_rate")) > 1.0
            {
                worse_violations += 1;
            }
            if let Some(t) = latency_split::slowest(&run.request_times, SLOWEST) {
                let latency = t.latency_ns.max(1) as f64;
                slowest_shares.push((t.others_ns as f64 / latency, t.idle_ns as f64 / latency));
            }
            ratios.push(r);
            let h = harvest(run, alone);
            harvests.push(h);
            if result.harvest_bound > 0.0 {
                over_bound.push(h / result.harvest_bound);
            }
            if let Some(bound) = result.as_if_alone_bound.filter(|&b| b > 0.0) {
                over_as_if_alone.push(h / bound);
            }
        }
        if ratios.is_empty() && failed == 0 {
            continue;
        }
        if ratios.is_empty() {
            let mut cells = vec![row.to_string(), format!("not run in {failed} shapes")];
            cells.extend((0..if inference { 7 } else { 3 }).map(|_| "—".to_string()));
            table.row(cells);
            continue;
        }
        let n = ratios.len();
        let worst = if inference {
            ratios.iter().copied().fold(f64::MIN, f64::max)
        } else {
            ratios.iter().copied().fold(f64::MAX, f64::min)
        };
        let median = dilu_bench::stats::median(&mut ratios.clone());
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let mut cells = vec![
            row.to_string(),
            format!("{median:.2}× / {worst:.2}×"),
            format!("{within} of {n}"),
        ];
        if inference {
            cells.push(format!("{surely_within} / {surely_over} of {n}"));
        }
        cells.extend([
            format!(
                "{:.1}% / {:.1}%",
                mean(&harvests) * 100.0,
                harvests.iter().copied().fold(f64::MAX, f64::min) * 100.0
            ),
            format!("{:.0}%", mean(&over_bound) * 100.0),
        ]);
        if inference {
            cells.push(format!(
                "{:.0}% / {} of {}",
                mean(&over_as_if_alone) * 100.0,
                over_as_if_alone.iter().filter(|&&r| r >= 0.8).count(),
                over_as_if_alone.len()
            ));
            cells.push(format!("{worse_violations} of {n}"));
            cells.push(if slowest_shares.is_empty() {
                "—".to_string()
            } else {
                let count = slowest_shares.len() as f64;
                let (others, idle) = slowest_shares
                    .iter()
                    .fold((0.0, 0.0), |(o, i), (so, si)| (o + so, i + si));
                format!(
                    "{:.0}% / {:.0}%",
                    100.0 * others / count,
                    100.0 * idle / count
                )
            });
        }
        if *row == ALONE_AGAIN {
            // No fillers: nothing to harvest.
            let harvest_columns = if inference { 4..7 } else { 3..5 };
            for cell in &mut cells[harvest_columns] {
                *cell = "— (no fillers)".to_string();
            }
        }
        table.row(cells);
    }
    table.markdown()
}

/// The flags a results file's command line names (those not at their
/// defaults).
fn command_flags(seconds: u64, gate: &StealGate) -> String {
    let mut flags = Vec::new();
    if seconds != 8 {
        flags.push(format!("--seconds {seconds}"));
    }
    flags.extend(gate.flags());
    if flags.is_empty() {
        String::new()
    } else {
        format!(" -- {}", flags.join(" "))
    }
}

/// How noisy the host was over the run's rows: how many were run again,
/// and how many were kept above the gate all the same.
fn noise_summary(results: &[ShapeResult], gate: &StealGate) -> String {
    let all: Vec<Noise> = results
        .iter()
        .flat_map(|r| std::iter::once(r.alone_noise).chain(r.row_noise.iter().copied()))
        .collect();
    let again = all.iter().filter(|n| n.tries > 1).count();
    let over: Vec<f64> = all
        .iter()
        .filter_map(|n| n.steal)
        .filter(|&s| s > gate.percent)
        .collect();
    let highest = all.iter().filter_map(|n| n.steal).fold(0.0, f64::max);
    let kept_over = if over.is_empty() {
        "none was kept above the gate".to_string()
    } else {
        format!(
            "{} kept above the gate, their quietest try still over it",
            over.len()
        )
    };
    format!(
        "In this run {again} of {} rows were run again and {kept_over}; the highest steal kept was \
         {highest:.1}%.",
        all.len()
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    dilu_bench::report::start_counting_steal();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(why) = unknown_arg(&args) {
        eprintln!("field: {why}");
        std::process::exit(2)
    }
    let gate = StealGate::from_args(&args).unwrap_or_else(|why| {
        eprintln!("field: {why}");
        std::process::exit(2)
    });
    let seconds: u64 = number_arg("--seconds", 8);
    let inference_count: usize = number_arg("--inference", 8);
    let training_count: usize = number_arg("--training", 4);
    let seed: Option<u64> = arg_after("--seed").map(|v| v.parse().expect("--seed: a whole number"));
    let only_shape: Option<usize> = arg_after("--shape").map(|v| v.parse().expect("--shape: K"));
    let only_rows: Option<Vec<String>> =
        arg_after("--only").map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let mut draws = seed.map_or(Draws::from_state(FIELD_SEED), |s| {
        Draws::from_seed(s, FIELD_SEED)
    });
    // (shape, whether it serves requests, seconds per run)
    let mut shapes: Vec<(Shape, bool, u64)> = inference_shapes(inference_count, &mut draws)
        .into_iter()
        .map(|(s, rate)| (s, true, run_seconds(seconds, Some(rate))))
        .collect();
    shapes.extend(
        training_shapes(training_count, &mut draws)
            .into_iter()
            .map(|s| (s, false, run_seconds(seconds, None))),
    );
    let scratch = Scratch::new("field-peers");
    let started: StartedPeers = PEERS
        .iter()
        .map(|&name| {
            let peer = peers::start(name, &scratch.path(name));
            if let Err(why) = &peer {
                eprintln!("field: {name}: {why}");
            }
            (name, peer)
        })
        .collect();
    let wanted = |row: &str| {
        only_rows
            .as_ref()
            .is_none_or(|o| o.iter().any(|r| r == row))
    };
    let mut results = Vec::new();
    for (index, (shape, inference, seconds)) in shapes.iter().enumerate() {
        let seconds = *seconds;
        if only_shape.is_some_and(|k| k != index) {
            continue;
        }
        eprintln!("field, shape {index}: {} ({seconds} s a run)", shape.name);
        let mut rows: Vec<&str> = vec![TIME_SLICING, STATIC];
        rows.extend(PEERS);
        rows.extend(if *inference {
            vec![DILU_SLO, DILU_NO_SLO, DILU_NO_REPORTS]
        } else {
            vec![DILU_TRAINING]
        });
        rows.push(ALONE_AGAIN);
        let alone = gate.run("alone", || {
            colocation::run_with(shape, 200 + index, "alone", seconds, None)
        });
        let alone_noise = alone.noise();
        let alone = alone
            .value
            .unwrap_or_else(|e| panic!("the primary alone: {e}"));
        eprintln!(
            "  {:>20}: host steal {}, requests over {AS_IF_ALONE_P99:.2}× its p99: {:.2}%",
            "alone",
            alone_noise.cell(),
            100.0 * dilu_bench::as_if_alone::over_bound_alone(&alone.requests, AS_IF_ALONE_P99)
        );
        let harvest_bound = ((alone.no_delay_bound - alone.device_busy)
            / (1.0 - alone.device_busy).max(f64::MIN_POSITIVE))
        .max(0.0);
        let as_if_alone_bound = as_if_alone_bound(shape, &alone, seconds, harvest_bound);
        let mut measured = Vec::new();
        let mut row_noise = Vec::new();
        for row in rows.into_iter().filter(|r| wanted(r)) {
            let gated = gate.run(row, || measure(shape, 200 + index, row, seconds, &started));
            let noise = gated.noise();
            row_noise.push(noise);
            let outcome = gated.value;
            match &outcome {
                Ok(run) => eprintln!(
                    "  {row:>20}: {} {:.2}× alone, harvest {:.1}%, busy {:.1}%, host steal {}",
                    if *inference { "p99" } else { "iterations/s" },
                    if *inference {
                        ratio(p(run, "p99_ms"), p(&alone, "p99_ms"))
                    } else {
                        ratio(
                            p(run, "iterations_per_second"),
                            p(&alone, "iterations_per_second"),
                        )
                    },
                    harvest(run, &alone) * 100.0,
                    run.device_busy * 100.0,
                    noise.cell()
                ),
                Err(why) => eprintln!("  {row:>20}: {why}"),
            }
            measured.push((row.to_string(), outcome));
        }
        results.push(ShapeResult {
            shape: shape.name.clone(),
            seconds,
            inference: *inference,
            alone,
            harvest_bound,
            as_if_alone_bound,
            rows: measured,
            alone_noise,
            row_noise,
        });
    }
    let mut inference_rows: Vec<&str> = vec![ALONE_AGAIN, TIME_SLICING, STATIC];
    inference_rows.extend(PEERS);
    let mut training_rows = inference_rows.clone();
    inference_rows.extend([DILU_SLO, DILU_NO_SLO, DILU_NO_REPORTS]);
    training_rows.push(DILU_TRAINING);
    let peer_lines: Vec<String> = started
        .iter()
        .map(|(name, peer)| match peer {
            Ok(_) => format!(
                "- {name}: {}",
                std::env::var(peer_variable(name)).unwrap_or_default()
            ),
            Err(why) => format!("- {name}: {why}"),
        })
        .collect();
    let mut doc = format!(
        "# Judged as the field judges: latency against alone, harvest, peers side by side\n\n\
         Command: `scripts/bench.sh field{}`.\n\n\
         Shapes drawn from the co-location class ({}): inference primaries with Poisson or bursty\n\
         (300 ms on, 300 ms off) arrivals at 10-500 req/s, 1-10 kernels of 0.05-1 ms per request,\n\
         busy 2-50% of the time alone, an SLO of 5-20 ms (at least three times the request's kernel\n\
         time); training primaries of one to three phases per iteration, each a 1-10 ms gap then\n\
         2-12 kernels of 0.05-1 ms; beside one to three deep-queue fillers (cudarc-loop, 32 launches\n\
         per synchronisation) with kernels of 0.05-3 ms. Rates and lengths are log-uniform. The\n\
         fillers start 1 s before the primary; {seconds} s per run, longer where a shape's requests\n\
         come too slowly for that: time for {REQUESTS_PER_RUN} requests, at most {MAX_RUN_SECONDS} s (each shape\n\
         names its length); every row of a shape one after the other in one run on one simulated GPU (simgpu, its default timing: a time slice of\n\
         2 ms, a hand-off between processes of 140 µs as measured on an H100).\n\n\
         Rows: `alone`, the primary by itself (its p50 and p99, the reference); `{ALONE_AGAIN}`:\n\
         the same once more, after the shape's other rows, read against `alone` like them: what a\n\
         ratio reads where nothing is shared (the spread of the measurement itself on this host);\n\
         `{TIME_SLICING}`:\n\
         no limiter, the device's own time slicing; `{STATIC}`: dilu's node manager with its\n\
         `static` controller (SM requests: primary 50%, the fillers 20% each or 16% of three, limits 100%); `HAMi-core`:\n\
         its `libvgpu.so` with `CUDA_DEVICE_SM_LIMIT` 50% for the primary and the rest split among\n\
         the fillers; `XSched`: Level 1, the primary at priority 1 and fillers at 0 under its `HPF`\n\
         server, its default thresholds; `TGS`: the primary on its high-priority library, fillers on\n\
         the low one; `{DILU_SLO}`: `dilu nodemgr` at defaults, `dilu run --colo primary --slo-ms`\n\
         and `--colo filler`; `{DILU_NO_SLO}`: the same without `--slo-ms` (the primary is kept as\n\
         if alone); `{DILU_NO_REPORTS}`: the same with a primary that does not report its\n\
         requests' latencies to dilu (`demo-tenant serve --report-latency no`), as most servers\n\
         do not; `{DILU_TRAINING}` (training): `--colo primary` and `--colo filler`.\n\n\
         Columns: the primary's p50 and p99 over its own in `alone` (training: iterations/s over\n\
         alone's). A p99 is one order statistic (of 200 requests, the second largest), so beside\n\
         each p99 ratio is its 95% range: each run's p99 range holds its true p99 but with at most\n\
         1.25% chance a side, whatever the latencies' distribution (order statistics, binomial\n\
         ranks: `harness/src/quantile.rs`); ∞ where a run has too few requests to bound its p99\n\
         from above. A shape counts as surely within the bar only where the whole range is, and\n\
         surely over it where the whole range is above. Harvest: the fillers' device time over the time the primary leaves the device\n\
         idle alone; device busy: all tenants' device time per wall time, from simgpu's trace over\n\
         the primary's run; SLO violations: requests over the shape's SLO (counted by the program\n\
         in every row, also where dilu was not told the SLO). Slowest 1%: the requests that set\n\
         a row's p99 (its slowest 1%, at least one), their time split by simgpu's trace into the\n\
         primary's own kernels running (its earlier requests' too, where it queued behind them),\n\
         only other processes' kernels running, and the device idle: the primary's program between\n\
         its launches, its threads waiting for one of this machine's CPUs, or its launches held back\n\
         on the host by the sharing system (`bench/src/latency_split.rs`). Where a row's slowest\n\
         requests spent much longer with the device idle than alone's, they did not wait for the\n\
         device but for the host. The no-delay bound (in `alone`'s\n\
         harvest cell) is the harvest of fillers that knew every arrival in advance and never\n\
         delayed the primary: each idle stretch of at least the 150 µs hold-off, less two hand-offs.\n\
         A filler kernel on a device without preemption delays a request that arrives while it\n\
         runs, so where filler kernels are long beside random arrivals no scheduler that does not\n\
         know the arrivals comes near it without delaying requests. The as-if-alone bound (beside\n\
         it) is what fillers that cannot know the arrivals may harvest with the primary's p99 kept\n\
         within {AS_IF_ALONE_P99:.2}× alone, from its requests alone: a request arriving while the primary is idle\n\
         meets filler work as often as fillers keep the idle time, then waits the rest of the\n\
         shortest filler kernel and a hand-off back, which carries over to the requests queued\n\
         behind it; fillers may keep as much of the idle time as leaves the requests pushed over\n\
         the bound within what the p99's rank allows, and the pauses of bursty arrivals whole\n\
         (`bench/src/as_if_alone.rs`; generous: a request meeting the hand-off to a filler waits\n\
         longer). Harvest above 100% (training) means the fillers also took device time the\n\
         primary would have used.\n\n\
         Every row runs the same programs with the primary on a stream of its own (`demo-tenant\n\
         --stream new`) and the fillers allocating on the default stream (`cudarc-loop\n\
         --alloc-on-default-stream`): XSched Level 1 does not schedule work on the legacy default\n\
         stream, and queues a `cuMemAllocAsync` on a stream it schedules, returning before the\n\
         pointer is written (the program then fails). TGS pairs one high- and one low-priority\n\
         process per GPU (the low one listens on one socket per GPU, so beside several fillers\n\
         only the last started is throttled; they start 200 ms apart, as two starting together\n\
         race for that socket and one exits), and its low-priority side runs at a trickle until\n\
         its 5 s rate profile settles, longer than these runs.\n\n\
         Host steal (each shape's last column): the share of the machine's CPU time the host took\n\
         for other machines while the row ran (`/proc/stat`), which on a shared VM moves a run's\n\
         latencies more than any setting does. A row (`alone` too) run at more than {:.0}% steal is run\n\
         again, at most {} times in all, and its quietest try is kept (`bench/src/steal_gate.rs`). {}\n\n\
         Peers in this run (the builds the variables named):\n{}\n\n## Summary over the inference shapes\n\n{}\n\
         ## Summary over the training shapes\n\n{}\n",
        command_flags(seconds, &gate),
        seed.map_or("a fixed seed".to_string(), |s| format!("seed {s}")),
        gate.percent,
        gate.tries,
        noise_summary(&results, &gate),
        peer_lines.join("\n"),
        summary_table(&results, &inference_rows, true),
        summary_table(&results, &training_rows, false),
    );
    let mut peer_rows: Vec<&str> = vec![TIME_SLICING, STATIC];
    peer_rows.extend(PEERS);
    doc.push_str(&where_behind::section(&results, &peer_rows));
    doc.push_str("## Each shape\n\n");
    for result in &results {
        doc.push_str(&shape_table(result));
    }
    doc.push_str(&format!(
        "Machine: {}. A shared 2-core VM without a GPU: every process, and every peer's server, \
         competes for the CPU.\n",
        machine()
    ));
    print!("{doc}");
    if only_shape.is_none() && only_rows.is_none() && seed.is_none() {
        write_result("field.md", &doc);
    } else {
        eprintln!("field: a partial run (--shape, --only or --seed): printed, no file written");
    }
}
