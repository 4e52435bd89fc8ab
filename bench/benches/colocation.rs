//! Work-conserving co-location, side by side: a primary (an inference
//! server with an SLO, or a training loop with data-loading gaps) shares one
//! simulated GPU with two batch fillers with deep queues, under no limiter,
//! the node manager's `static`, `dilu-rckm` and `dilu` controllers, and the
//! new mode (`dilu-colo`: per-launch gap filling through the gap board plus
//! the controller lending the primary's guarantee). The primary alone gives
//! the reference for training loss.
//!
//! Device time comes from simgpu's kernel trace (the ground truth), over
//! the primary's run; request latency from the inference program itself.
//!
//! Run: `scripts/bench.sh colocation` (8 s per configuration, the fillers
//! started 1 s before the primary; `-- --seconds 4` for a quicker, noisier
//! run); needs the
//! release build (`cargo build --release --workspace`).
//! `--class-rounds N` runs the class section's shapes N times each (alone,
//! then beside the fillers, per round) and reports the medians: on a shared
//! VM one round's violations move by a point or two with the host. A round
//! run while the host took more than 2% of the CPU for others is run again
//! (`--steal-gate PERCENT`, `--steal-tries N`: `dilu_bench::steal_gate`).
//! Writes `bench/results/colocation.md`. To look into one case (prints, writes
//! no result): `-- --shape N` (the Nth shape, from 0), `--config NAME` (that
//! configuration and `alone`), `--class-only` (only the shapes drawn from
//! the class, `--class-shapes N` of them, default 10; `--class-shape K`: only
//! the Kth of them, from 0; `--class-seed N`: drawn from seed N instead
//! of the fixed one, for shapes no tuning saw), `--keep-traces DIR`
//! (copies each run's simgpu trace there, named by shape, configuration and
//! the primary's pid).

use dilu_abi::simtrace::{KernelRecord, busy_ns_by_pid};
use dilu_bench::latency_split;
use dilu_bench::report::{Table, machine, write_result};
use dilu_bench::stats::{Draws, median};
use dilu_bench::steal_gate::StealGate;
use dilu_harness::workspace::{
    Scratch, artifact, dilu, read_trace, unique_name, wait_until_serving,
};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const CONFIGS: [&str; 8] = [
    "alone",
    DEFAULTS,
    "no limiter",
    "static",
    "dilu-rckm",
    "dilu",
    "dilu-colo",
    LOW_GUARANTEE,
];
/// What a user gets with the documented flags and nothing else: the node
/// manager's default controller, `--colo primary` (and `--slo-ms` for an
/// inference primary) and `--colo filler`, no SM request and no `DILU_*`
/// tuning variable.
pub(crate) const DEFAULTS: &str = "defaults, with roles";
/// [`DEFAULTS`] without `--slo-ms` for the primary: a primary that states
/// no latency target, kept as if alone (the regime the field judges
/// priority schedulers in).
pub(crate) const DEFAULTS_NO_SLO: &str = "defaults, no SLO";
/// [`DEFAULTS_NO_SLO`] with a primary that reports no request latencies
/// (`demo-tenant serve --report-latency no`), as most servers do not.
pub(crate) const DEFAULTS_NO_SLO_NO_REPORTS: &str = "defaults, no SLO, no reports";
/// simgpu alone, no interposer: the device's own time slicing.
pub(crate) const TIME_SLICING: &str = "time slicing";
/// `dilu-colo` with the guarantee of a filler whose kernels fit no gap
/// lowered to 5% (`DILU_COLO_GUARANTEE=5`): what a primary loses to that
/// guarantee. Only in shapes with such a filler.
const LOW_GUARANTEE: &str = "dilu-colo, long filler at 5%";

/// One shape: the primary's program and spec, the fillers' kernel lengths.
pub(crate) struct Shape {
    pub(crate) name: String,
    pub(crate) tuned: bool,
    /// demo-tenant arguments (serve or train).
    pub(crate) primary: Vec<String>,
    pub(crate) slo_ms: Option<f64>,
    pub(crate) primary_request: f64,
    /// A filler kernel the primary's requests absorb (inference only), for
    /// the tuned rows.
    pub(crate) tolerance: &'static str,
    /// Each filler's kernel, in blocks (one to three fillers).
    pub(crate) filler_blocks: Vec<String>,
    /// The filler whose kernels are longer than every gap, if one is.
    pub(crate) long_filler: Option<usize>,
    /// The primary launches on a stream of its own and the fillers
    /// allocate on the default stream (what XSched needs to schedule them).
    pub(crate) own_streams: bool,
}

pub(crate) fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|w| w.to_string()).collect()
}

pub(crate) fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "inference: 120 req/s, 4 × 200 µs, SLO 10 ms; fillers 1 ms + 0.5 ms".into(),
            tuned: true,
            primary: words(&[
                "serve",
                "--rate",
                "120",
                "--kernels",
                "4",
                "--blocks",
                "2640",
            ]),
            slo_ms: Some(10.0),
            primary_request: 40.0,
            tolerance: "2ms",
            filler_blocks: words(&["13200", "6600"]),
            long_filler: None,
            own_streams: false,
        },
        Shape {
            name: "training: 4 ms gaps, 8 × 500 µs; fillers 1 ms + 0.5 ms".into(),
            tuned: true,
            primary: words(&[
                "train",
                "--load-ms",
                "4",
                "--kernels",
                "8",
                "--blocks",
                "6600",
            ]),
            slo_ms: None,
            primary_request: 40.0,
            tolerance: "0",
            filler_blocks: words(&["13200", "6600"]),
            long_filler: None,
            own_streams: false,
        },
        Shape {
            name: "training: 2 gaps per iteration (4 ms + 1 ms), 2 × 6 × 500 µs; fillers 1 ms + 0.5 ms".into(),
            tuned: true,
            primary: words(&[
                "train",
                "--load-ms",
                "4,1",
                "--kernels",
                "6",
                "--blocks",
                "6600",
            ]),
            slo_ms: None,
            primary_request: 40.0,
            tolerance: "0",
            filler_blocks: words(&["13200", "6600"]),
            long_filler: None,
            own_streams: false,
        },
        Shape {
            name: "inference: 60 req/s, 8 × 500 µs, SLO 15 ms; fillers 2 ms + 0.3 ms".into(),
            tuned: false,
            primary: words(&[
                "serve",
                "--rate",
                "60",
                "--kernels",
                "8",
                "--blocks",
                "6600",
            ]),
            slo_ms: Some(15.0),
            primary_request: 50.0,
            tolerance: "2ms",
            filler_blocks: words(&["26400", "3960"]),
            long_filler: None,
            own_streams: false,
        },
        Shape {
            name: "training: 2 ms gaps, 12 × 300 µs; fillers 0.7 ms + 3 ms".into(),
            tuned: false,
            primary: words(&[
                "train",
                "--load-ms",
                "2",
                "--kernels",
                "12",
                "--blocks",
                "3960",
            ]),
            slo_ms: None,
            primary_request: 40.0,
            tolerance: "0",
            filler_blocks: words(&["9240", "39600"]),
            long_filler: Some(1),
            own_streams: false,
        },
        Shape {
            name: "training: 3 gaps per iteration (1 ms + 5 ms + 2 ms), 3 × 4 × 400 µs; fillers 1.5 ms + 0.6 ms".into(),
            tuned: false,
            primary: words(&[
                "train",
                "--load-ms",
                "1,5,2",
                "--kernels",
                "4",
                "--blocks",
                "5280",
            ]),
            slo_ms: None,
            primary_request: 40.0,
            tolerance: "0",
            filler_blocks: words(&["19800", "7920"]),
            long_filler: None,
            own_streams: false,
        },
        Shape {
            name: "inference: 200 req/s, 2 × 300 µs, SLO 8 ms; fillers 0.8 ms + 1.5 ms".into(),
            tuned: false,
            primary: words(&[
                "serve",
                "--rate",
                "200",
                "--kernels",
                "2",
                "--blocks",
                "3960",
            ]),
            slo_ms: Some(8.0),
            primary_request: 40.0,
            tolerance: "2ms",
            filler_blocks: words(&["10560", "19800"]),
            long_filler: None,
            own_streams: false,
        },
        Shape {
            name: "training: 2 gaps per iteration (3 ms + 0.5 ms), 2 × 5 × 400 µs; fillers 4 ms + 1 ms".into(),
            tuned: false,
            primary: words(&[
                "train",
                "--load-ms",
                "3,0.5",
                "--kernels",
                "5",
                "--blocks",
                "5280",
            ]),
            slo_ms: None,
            primary_request: 40.0,
            tolerance: "0",
            filler_blocks: words(&["52800", "13200"]),
            long_filler: Some(0),
            own_streams: false,
        },
    ]
}

/// The class's fixed seed (xorshift64* state).
const CLASS_SEED: u64 = 0x2545_f491_4f6c_dd1d;

/// Inference primaries drawn from the class co-location must work for at
/// its defaults: Poisson or bursty (300 ms on, 300 ms off) arrivals, 1 to 8
/// kernels of 0.1 to 1 ms per request, an SLO of 5 to 20 ms that the request
/// meets alone with room (at least three times its kernel time), the
/// primary busy 5 to 50% of the time, and one to three deep-queue fillers
/// with kernels of 0.1 to 3 ms. Drawn from a fixed seed, so every run
/// measures the same shapes (`seed`: another one's).
fn class_shapes(count: usize, seed: Option<u64>) -> Vec<Shape> {
    const BLOCKS_PER_MS: f64 = 13_200.0; // simgpu's default model: 1320 blocks = 100 µs
    let mut draws = seed.map_or(Draws::from_state(CLASS_SEED), |s| {
        Draws::from_seed(s, CLASS_SEED)
    });
    let mut uniform = move |low: f64, high: f64| draws.uniform(low, high);
    let mut shapes = Vec::new();
    while shapes.len() < count {
        let kernels = uniform(1.0, 9.0).floor() as u32;
        let kernel_ms = uniform(0.1, 1.0);
        let request_ms = f64::from(kernels) * kernel_ms;
        let lowest_slo = (3.0 * request_ms).max(5.0);
        if lowest_slo > 20.0 {
            continue;
        }
        let slo_ms = uniform(lowest_slo, 20.0).round();
        let load = uniform(0.05, 0.5);
        let rate = (load * 1000.0 / request_ms).round().max(1.0);
        let bursty = uniform(0.0, 1.0) < 0.5;
        let fillers: Vec<f64> = (0..uniform(1.0, 4.0).floor() as usize)
            .map(|_| uniform(0.1, 3.0))
            .collect();
        let blocks = |ms: f64| ((ms * BLOCKS_PER_MS).round() as u64).to_string();
        let primary = serve_args(rate, kernels, &blocks(kernel_ms), bursty);
        let filler_names: Vec<String> = fillers.iter().map(|ms| format!("{ms:.1} ms")).collect();
        shapes.push(Shape {
            name: format!(
                "{} {rate} req/s, {kernels} × {:.0} µs, SLO {slo_ms} ms; fillers {}",
                if bursty { "bursty" } else { "Poisson" },
                kernel_ms * 1000.0,
                filler_names.join(" + ")
            ),
            tuned: false,
            primary,
            slo_ms: Some(slo_ms),
            primary_request: 0.0,
            tolerance: "0",
            filler_blocks: fillers.iter().map(|&ms| blocks(ms)).collect(),
            long_filler: None,
            own_streams: false,
        });
    }
    shapes
}

/// demo-tenant's arguments for an inference primary: `rate` requests a
/// second of `kernels` kernels of `blocks`, Poisson, or `bursty` (300 ms
/// on, 300 ms off).
pub(crate) fn serve_args(rate: f64, kernels: u32, blocks: &str, bursty: bool) -> Vec<String> {
    let mut primary = words(&[
        "serve",
        "--rate",
        &rate.to_string(),
        "--kernels",
        &kernels.to_string(),
        "--blocks",
        blocks,
    ]);
    if bursty {
        primary.extend(words(&["--on-ms", "300", "--off-ms", "300"]));
    }
    primary
}

/// The class at defaults, beside the primary alone: one table row per
/// drawn shape.
fn class_section(count: usize, seconds: u64, rounds: usize) -> String {
    let seed: Option<u64> =
        arg_after("--class-seed").map(|v| v.parse().expect("--class-seed: a whole number"));
    let mut table = Table::new(&[
        "primary and fillers",
        "alone p99 (ms) / violations",
        "no-delay bound",
        "device busy",
        "harvest",
        "p50 / p99 vs alone",
        "SLO violations",
        "points over alone",
        "host steal (rounds' median)",
    ]);
    let gate = steal_gate();
    let (mut busy_sum, mut worst_busy, mut worst_extra) = (0.0, f64::MAX, 0.0_f64);
    let mut measured = 0usize;
    let shapes = class_shapes(count, seed);
    let only: Option<usize> =
        arg_after("--class-shape").map(|v| v.parse().expect("--class-shape: a whole number"));
    for (index, shape) in shapes.iter().enumerate() {
        if only.is_some_and(|o| o != index) {
            continue;
        }
        eprintln!("colocation, class {index}: {}", shape.name);
        let violations = |r: &Run| 100.0 * r.primary["slo_violation_rate"].as_f64().unwrap_or(1.0);
        let p99 = |r: &Run| r.primary["p99_ms"].as_f64().unwrap_or(0.0);
        let p50 = |r: &Run| r.primary["p50_ms"].as_f64().unwrap_or(0.0);
        // Per round: alone and shared, one after the other, so that each
        // difference is taken under the same host conditions; each cell is
        // the median over the rounds.
        let mut cells: [Vec<f64>; 9] = Default::default();
        let mut steals = Vec::new();
        let mut again = 0;
        for round in 0..rounds {
            let gated = gate.run(&format!("round {}/{rounds}", round + 1), || {
                let alone = run(shape, 100 + index, "alone", seconds);
                let shared = run(shape, 100 + index, DEFAULTS, seconds);
                (alone, shared)
            });
            let noise = gated.noise();
            let (alone, shared) = gated.value;
            steals.extend(noise.steal);
            again += usize::from(noise.tries > 1);
            eprintln!(
                "  round {}/{rounds}: busy {:.1}% violations {:.2}% (alone {:.2}%), host steal {}",
                round + 1,
                shared.device_busy * 100.0,
                violations(&shared),
                violations(&alone),
                noise.cell()
            );
            for (cell, value) in cells.iter_mut().zip([
                p99(&alone),
                violations(&alone),
                alone.no_delay_bound,
                shared.device_busy,
                harvest(&shared, &alone),
                ratio(p50(&shared), p50(&alone)),
                ratio(p99(&shared), p99(&alone)),
                violations(&shared),
                violations(&shared) - violations(&alone),
            ]) {
                cell.push(value);
            }
        }
        let [
            alone_p99,
            alone_violations,
            bound,
            busy,
            harvested,
            p50_ratio,
            p99_ratio,
            shared_violations,
            extra,
        ] = cells.map(|mut c| median(&mut c));
        busy_sum += busy;
        measured += 1;
        worst_busy = f64::min(worst_busy, busy);
        worst_extra = worst_extra.max(extra);
        table.row(vec![
            shape.name.clone(),
            format!("{alone_p99:.1} / {alone_violations:.2}%"),
            format!("{:.1}%", bound * 100.0),
            format!("{:.1}%", busy * 100.0),
            format!("{:.1}%", harvested * 100.0),
            format!("{p50_ratio:.2}× / {p99_ratio:.2}×"),
            format!("{shared_violations:.2}%"),
            format!("{extra:+.2}"),
            match (steals.is_empty(), again) {
                (true, _) => "unknown".to_string(),
                (false, 0) => format!("{:.1}%", median(&mut steals)),
                (false, again) => format!("{:.1}% ({again} run again)", median(&mut steals)),
            },
        ]);
    }
    format!(
        "## The class at defaults ({count} shapes drawn from {})\n\n\
         Inference primaries with Poisson or bursty (300 ms on, 300 ms off) arrivals, 1-8 kernels of\n\
         0.1-1 ms per request, SLOs of 5-20 ms (at least three times the request's kernel time), busy\n\
         5-50% of the time alone, beside one to three deep-queue fillers with kernels of 0.1-3 ms; each\n\
         run with the documented flags only (`{DEFAULTS}`), beside the primary alone. {}\n\
         No-delay bound: from the primary's run alone, its kernel time and every idle stretch of at\n\
         least the hold-off less the two hand-offs filling it costs, per wall time: how busy fillers\n\
         that never delay the primary could keep the device (within its tolerance they may go beyond).\n\
         Harvest: the fillers' device time over the time the primary leaves the device idle alone.\n\
         p50 / p99 vs alone: the primary's latency percentiles beside its fillers over the same\n\
         percentiles in its run alone. Host steal: the share of the machine's CPU time the host took\n\
         for other machines during a round; a round run at more than {}% is run again, at most {}\n\
         times in all, and its quietest try kept (`bench/src/steal_gate.rs`).\n\
         Mean device busy {:.1}%, lowest {:.1}%; most SLO violations above alone: {:.2} points.\n\n{}\n",
        seed.map_or("a fixed seed".to_string(), |s| format!("seed {s}")),
        if rounds > 1 {
            format!(
                "Each cell is the median of {rounds} rounds, a round running the primary alone and \
                 then beside its fillers (points over alone: the median of the rounds' differences)."
            )
        } else {
            "One round: the primary alone, then beside its fillers.".to_string()
        },
        gate.percent,
        gate.tries,
        100.0 * busy_sum / measured.max(1) as f64,
        100.0 * worst_busy,
        worst_extra,
        table.markdown()
    )
}

pub(crate) struct Run {
    pub(crate) device_busy: f64,
    /// The primary's kernel time and what of its idle time fillers could
    /// use without delaying it ([`no_delay_bound`]), per wall time.
    pub(crate) no_delay_bound: f64,
    pub(crate) filler_share: f64,
    /// Each filler's share, in the shape's order.
    pub(crate) filler_shares: Vec<f64>,
    pub(crate) primary: serde_json::Value,
    /// A serving primary's requests: the field benchmark's as-if-alone
    /// bound replays alone's.
    #[allow(
        dead_code,
        reason = "read by the field benchmark, which includes this file"
    )]
    pub(crate) requests: Vec<dilu_bench::as_if_alone::Request>,
    /// Each of those requests' time split by what the device ran.
    #[allow(
        dead_code,
        reason = "read by the field benchmark, which includes this file"
    )]
    pub(crate) request_times: Vec<latency_split::RequestTime>,
}

/// The last JSON line `child` printed, or why there is none (it failed,
/// or printed none: the last line of its error output).
fn summary(child: Child, what: &str) -> Result<serde_json::Value, String> {
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last_error = || {
        stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .chars()
            .take(300)
            .collect::<String>()
    };
    if !output.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            output.status,
            last_error()
        ));
    }
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("{what} printed no JSON: {}", last_error()))
}

/// `--class-rounds N` (default 1): rounds of the class section, each cell
/// their median.
fn class_rounds_arg() -> usize {
    arg_after("--class-rounds")
        .map(|v| v.parse().expect("--class-rounds: a whole number"))
        .unwrap_or(1usize)
        .max(1)
}

/// The class rounds' steal gate, from `--steal-gate` and `--steal-tries`
/// (a bad value stops the benchmark).
fn steal_gate() -> StealGate {
    let args: Vec<String> = std::env::args().skip(1).collect();
    StealGate::from_args(&args).unwrap_or_else(|why| {
        eprintln!("colocation: {why}");
        std::process::exit(2)
    })
}

/// The value after `flag` on the command line.
fn arg_after(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

/// `shared`'s fillers' device time over the idle time the primary leaves
/// in its run `alone`: what of the idle device best-effort work harvested.
pub(crate) fn harvest(shared: &Run, alone: &Run) -> f64 {
    shared.filler_share / (1.0 - alone.device_busy).max(f64::MIN_POSITIVE)
}

/// `value / reference`, 0 when there is no reference.
pub(crate) fn ratio(value: f64, reference: f64) -> f64 {
    if reference > 0.0 {
        value / reference
    } else {
        0.0
    }
}

/// The SM share a peer with static shares (HAMi-core) gives the primary;
/// the fillers split the rest.
const PEER_PRIMARY_SHARE: u32 = 50;

/// How long the fillers run before the primary starts.
const FILLER_LEAD: Duration = Duration::from_secs(1);

pub(crate) fn run(shape: &Shape, shape_index: usize, config: &str, seconds: u64) -> Run {
    run_with(shape, shape_index, config, seconds, None).unwrap_or_else(|e| panic!("{e}"))
}

/// One configuration of `shape`: `config` names dilu's (one of
/// [`CONFIGS`], [`DEFAULTS_NO_SLO`], [`DEFAULTS_NO_SLO_NO_REPORTS`] or
/// [`TIME_SLICING`]), or with `peer`
/// the programs run under that peer instead, without dilu.
pub(crate) fn run_with(
    shape: &Shape,
    shape_index: usize,
    config: &str,
    seconds: u64,
    peer: Option<&dyn dilu_bench::peers::Peer>,
) -> Result<Run, String> {
    let scratch = Scratch::new("colo-bench");
    let instance = unique_name("colo-bench");
    let trace = scratch.path("trace.jsonl");
    let socket = scratch.path("nodemgr.sock");
    // Programs started without dilu: under a peer, or on the bare device.
    let bare = peer.is_some() || config == TIME_SLICING;
    let managed = !bare && !matches!(config, "alone" | "no limiter");
    let no_slo = matches!(config, DEFAULTS_NO_SLO | DEFAULTS_NO_SLO_NO_REPORTS);
    let defaults = config == DEFAULTS || no_slo;
    let colo = defaults || matches!(config, "dilu-colo" | LOW_GUARANTEE);
    let controller = match config {
        _ if defaults => None,
        "dilu-colo" | LOW_GUARANTEE => Some("dilu-colo"),
        other => Some(other),
    };
    let mut daemon = managed.then(|| {
        std::fs::write(scratch.path("none.toml"), "").expect("write an empty configuration");
        let mut daemon = Command::new(dilu())
            .args(["nodemgr", "--config"])
            .arg(scratch.path("none.toml"))
            .arg("--socket")
            .arg(&socket)
            .arg("--run-dir")
            .arg(scratch.path("run"))
            .args(["--metrics", ""])
            .args(controller.map(|c| ["--controller", c]).iter().flatten())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the node manager");
        wait_until_serving(&mut daemon, &socket, Duration::from_secs(30));
        daemon
    });
    let simgpu_dir = bare.then(dilu_bench::peers::simgpu_lib_dir);
    let tenant = |name: &str, spec: &[String], colo_role: Option<&str>, program: &str| {
        if bare {
            // No dilu: the program itself, under the peer or on simgpu
            // answering as the driver.
            let mut command = Command::new(artifact(program));
            let index = name
                .strip_prefix("filler")
                .map_or(0, |i| i.parse::<usize>().expect("filler index") + 1);
            match peer {
                Some(peer) => {
                    let (role, share) = if index == 0 {
                        (dilu_bench::peers::Role::Primary, PEER_PRIMARY_SHARE)
                    } else {
                        let fillers = shape.filler_blocks.len() as u32;
                        (
                            dilu_bench::peers::Role::Filler,
                            (100 - PEER_PRIMARY_SHARE) / fillers,
                        )
                    };
                    peer.configure(&mut command, role, index, share);
                }
                None => {
                    command.env("LD_LIBRARY_PATH", simgpu_dir.as_ref().expect("bare"));
                }
            }
            command
                .env("SIMGPU_INSTANCE", &instance)
                .env("SIMGPU_TRACE", &trace)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            return command;
        }
        let mut command = Command::new(dilu());
        // What the caller's environment sets is not the shape's: cleared
        // first, so the shape's own tuning (below) stays.
        command
            .env_remove("DILU_COLO_TOLERANCE")
            .env_remove("DILU_SM_LIMIT");
        command.args(["run", "--sim"]);
        if managed {
            command
                .args(["--tenant", &format!("{instance}-{name}")])
                .args(spec);
        }
        if let (true, Some(role)) = (colo, colo_role) {
            command.args(["--colo", role]);
        }
        if colo && !defaults {
            command.env("DILU_COLO_TOLERANCE", shape.tolerance);
        }
        command
            .arg("--")
            .arg(artifact(program))
            .env(dilu_abi::node_wire::SOCKET_ENV, &socket)
            .env("SIMGPU_INSTANCE", &instance)
            .env("SIMGPU_TRACE", &trace)
            // The board's group and simgpu's instance keep runs apart.
            .env("DILU_COLO_GROUP", &instance)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    };
    let s = words;
    let mut primary_spec = if defaults {
        Vec::new()
    } else {
        s(&[
            "--sm-request",
            &shape.primary_request.to_string(),
            "--sm-limit",
            "100",
            "--class",
            "latency",
        ])
    };
    if let Some(slo) = shape.slo_ms.filter(|_| !no_slo) {
        primary_spec.extend(s(&["--slo-ms", &slo.to_string()]));
    }
    let seconds_arg = seconds.to_string();
    let mut primary_args = shape.primary.clone();
    primary_args.extend(s(&["--seconds", &seconds_arg]));
    if shape.own_streams {
        primary_args.extend(s(&["--stream", "new"]));
    }
    if !primary_args.iter().any(|a| a == "--on-ms") {
        primary_args.extend(s(&["--on-ms", "1000", "--off-ms", "0"]));
    }
    let slo_arg = shape.slo_ms.unwrap_or(1000.0).to_string();
    primary_args.extend(s(&["--slo-ms", &slo_arg]));
    if config == DEFAULTS_NO_SLO_NO_REPORTS && primary_args.first().is_some_and(|m| m == "serve") {
        primary_args.extend(s(&["--report-latency", "no"]));
    }
    let mut fillers = Vec::new();
    if config != "alone" {
        // 20% each, or what the primary's request leaves them.
        let filler_request = (100.0 - shape.primary_request) / shape.filler_blocks.len() as f64;
        let filler_request = filler_request.min(20.0).floor().to_string();
        let filler_spec = if defaults {
            Vec::new()
        } else {
            s(&[
                "--class",
                "batch",
                "--sm-request",
                &filler_request,
                "--sm-limit",
                "100",
            ])
        };
        for (i, blocks) in shape.filler_blocks.iter().enumerate() {
            if i > 0
                && let Some(peer) = peer.filter(|_| bare)
            {
                std::thread::sleep(peer.filler_spacing());
            }
            let filler_seconds = (seconds + 1 + FILLER_LEAD.as_secs()).to_string();
            let mut filler = tenant(
                &format!("filler{i}"),
                &filler_spec,
                Some("filler"),
                "cudarc-loop",
            );
            if config == LOW_GUARANTEE && shape.long_filler == Some(i) {
                filler.env("DILU_COLO_GUARANTEE", "5");
            }
            if shape.own_streams {
                filler.arg("--alloc-on-default-stream");
            }
            fillers.push(
                filler
                    .args([
                        "--seconds",
                        &filler_seconds,
                        "--blocks",
                        blocks,
                        "--depth",
                        "32",
                        "--json",
                    ])
                    .spawn()
                    .expect("start a filler"),
            );
        }
    }
    // The fillers run before the primary starts: a server joins a GPU whose
    // batch work is running, and the primary's requests are measured beside
    // fillers at work, not beside their process start-up, which on this
    // 2-core machine took the CPU from the primary's first requests (their
    // first kernels, of kinds not measured yet, are the interposer's own
    // concern: `UNMEASURED_FILLER_KERNEL_NS`).
    if !fillers.is_empty() {
        std::thread::sleep(FILLER_LEAD);
    }
    let requests_file = scratch.path("requests.txt");
    let mut primary = tenant("primary", &primary_spec, Some("primary"), "demo-tenant");
    primary.args(&primary_args);
    // Every serving primary's requests: alone's are replayed by the field
    // benchmark's as-if-alone bound, every row's split by the trace.
    let keep_requests = primary_args.first().is_some_and(|m| m == "serve");
    if keep_requests {
        primary.arg("--requests").arg(&requests_file);
    }
    let primary = primary.spawn().expect("start the primary");
    let primary_pid = primary.id();
    let filler_pids: Vec<u32> = fillers.iter().map(Child::id).collect();
    let primary = summary(primary, "the primary");
    let fillers_done: Result<Vec<_>, String> = fillers
        .into_iter()
        .map(|filler| summary(filler, "a filler"))
        .collect();
    if let Some(daemon) = daemon.as_mut() {
        let _ = daemon.kill();
        let _ = daemon.wait();
    }
    let primary = primary?;
    fillers_done?;
    if let Some(dir) = arg_after("--keep-traces") {
        let kept = std::path::Path::new(&dir).join(format!(
            "shape{}-{}-primary{primary_pid}.jsonl",
            shape_index,
            config.replace(' ', "-")
        ));
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::copy(&trace, &kept))
            .unwrap_or_else(|e| panic!("cannot keep the trace as {}: {e}", kept.display()));
    }
    let records: Vec<KernelRecord> = read_trace(&trace);
    let mine: Vec<&KernelRecord> = records.iter().filter(|r| r.pid == primary_pid).collect();
    let from = mine.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let to = mine.iter().map(|r| r.end_ns).max().unwrap_or(0);
    let no_delay_bound = no_delay_bound(&mine, from, to);
    let busy = busy_ns_by_pid(&records, from, to);
    let span = to.saturating_sub(from).max(1) as f64;
    let total: u64 = busy.values().sum();
    let filler: u64 = busy
        .iter()
        .filter(|(pid, _)| **pid != primary_pid)
        .map(|(_, b)| b)
        .sum();
    let board = dilu_layout::colocation::board_path(
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() },
        &instance,
    );
    let _ = std::fs::remove_file(board);
    let (requests, request_times) = if keep_requests {
        let text = std::fs::read_to_string(&requests_file)
            .map_err(|e| format!("the primary's requests: {e}"))?;
        let requests = dilu_bench::as_if_alone::parse_requests(&text)?;
        let start_ns = dilu_bench::as_if_alone::requests_start_ns(&text)
            .ok_or("the primary's requests do not say when it started")?;
        let times = latency_split::split(&requests, start_ns, &records, primary_pid);
        (requests, times)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(Run {
        device_busy: total as f64 / span,
        no_delay_bound,
        filler_share: filler as f64 / span,
        filler_shares: filler_pids
            .iter()
            .map(|pid| busy.get(pid).copied().unwrap_or(0) as f64 / span)
            .collect(),
        primary,
        requests,
        request_times,
    })
}

/// How busy the device could be kept, from the primary's kernels between
/// `from` and `to`, by fillers that never delay it: its own kernel time,
/// plus each idle stretch at least the hold-off long (shorter ones are the
/// program between dependent launches) less the two hand-offs it costs to
/// fill (to a filler and back). A reference for a run of the primary
/// alone: fillers that delay it (within its tolerance) can go beyond it.
fn no_delay_bound(primary: &[&KernelRecord], from: u64, to: u64) -> f64 {
    use dilu_colocation::{DEFAULT_HOLDOFF_NS, HANDOFF_NS};
    let mut stretches: Vec<(u64, u64)> = primary.iter().map(|r| (r.start_ns, r.end_ns)).collect();
    stretches.sort_unstable();
    let mut usable = 0u64;
    let mut busy_until = from;
    for (start, end) in stretches {
        if start > busy_until {
            let idle = start - busy_until;
            if idle >= DEFAULT_HOLDOFF_NS {
                usable += idle.saturating_sub(2 * HANDOFF_NS);
            }
        }
        usable += end.saturating_sub(start.max(busy_until));
        busy_until = busy_until.max(end);
    }
    usable as f64 / to.saturating_sub(from).max(1) as f64
}

fn seconds_arg() -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("--seconds {v:?}: a whole number"))
        })
        .unwrap_or(8)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    dilu_bench::report::start_counting_steal();
    // A bad gate stops the run now, not after the sections before the class.
    let _ = steal_gate();
    let seconds = seconds_arg();
    let only: Option<String> = arg_after("--shape");
    let only_config = arg_after("--config");
    if let Some(c) = only_config.as_deref() {
        assert!(
            CONFIGS.contains(&c),
            "--config {c:?}: one of {}",
            CONFIGS.join(", ")
        );
    }
    let class_only = std::env::args().any(|a| a == "--class-only");
    let mut sections = String::new();
    for (index, shape) in shapes().iter().enumerate() {
        if class_only || only.as_deref().is_some_and(|o| o != index.to_string()) {
            continue;
        }
        eprintln!("colocation: {}", shape.name);
        let inference = shape.slo_ms.is_some();
        let mut table = Table::new(&[
            "configuration",
            "device busy",
            "filler share (each)",
            if inference {
                "primary p99 (ms)"
            } else {
                "primary iterations/s"
            },
            if inference {
                "SLO violations"
            } else {
                "primary loss vs alone"
            },
        ]);
        let mut alone_rate = 0.0;
        for config in CONFIGS {
            if only_config
                .as_deref()
                .is_some_and(|c| c != config && config != "alone")
                || (config == LOW_GUARANTEE && shape.long_filler.is_none())
            {
                continue;
            }
            let r = run(shape, index, config, seconds);
            let (third, fourth) = if inference {
                (
                    format!("{:.1}", r.primary["p99_ms"].as_f64().unwrap_or(0.0)),
                    format!(
                        "{:.2}%",
                        100.0 * r.primary["slo_violation_rate"].as_f64().unwrap_or(1.0)
                    ),
                )
            } else {
                let rate = r.primary["iterations_per_second"].as_f64().unwrap_or(0.0);
                if config == "alone" {
                    alone_rate = rate;
                }
                (
                    format!("{rate:.1}"),
                    format!(
                        "{:.1}%",
                        100.0 * (1.0 - rate / alone_rate.max(f64::MIN_POSITIVE))
                    ),
                )
            };
            eprintln!(
                "  {config:>10}: busy {:.1}% filler {:.1}% {third} {fourth}",
                r.device_busy * 100.0,
                r.filler_share * 100.0
            );
            let each: Vec<String> = r
                .filler_shares
                .iter()
                .map(|s| format!("{:.1}", s * 100.0))
                .collect();
            table.row(vec![
                config.to_string(),
                format!("{:.1}%", r.device_busy * 100.0),
                if each.is_empty() {
                    format!("{:.1}%", r.filler_share * 100.0)
                } else {
                    format!("{:.1}% ({})", r.filler_share * 100.0, each.join(" + "))
                },
                third,
                fourth,
            ]);
        }
        sections.push_str(&format!(
            "## {}{}\n\n{}\n",
            shape.name,
            if shape.tuned {
                ""
            } else {
                " (not seen in tuning)"
            },
            table.markdown()
        ));
    }
    let class_count: usize = arg_after("--class-shapes")
        .map(|v| v.parse().expect("--class-shapes: a whole number"))
        .unwrap_or(10);
    let class_rounds = class_rounds_arg();
    if only.is_none() && only_config.is_none() && class_count > 0 {
        sections.push_str(&class_section(class_count, seconds, class_rounds));
    }
    let doc = format!(
        "# Work-conserving co-location\n\n\
         Command: `scripts/bench.sh colocation -- --seconds {seconds}{}`.\n\n\
         `{DEFAULTS}` is what a user gets with the documented flags and nothing else: `dilu nodemgr`\n\
         with its default controller, the primary under `dilu run --colo primary` (and `--slo-ms` for an\n\
         inference primary), each filler under `dilu run --colo filler`, no SM request and no `DILU_*`\n\
         tuning variable (a primary's tolerance is then half its SLO; a filler's guarantee 10%).\n\
         The rows below it set requests and, for `dilu-colo`, a tolerance, as named. The last section\n\
         runs the defaults over shapes drawn from the class co-location is meant for.\n\n\
         A primary and two batch fillers with deep queues (cudarc-loop, a synchronisation every\n\
         32 launches; SM request 20%, limit 100% each) share one simulated GPU, {seconds} s per\n\
         configuration, one configuration after another in one run; the fillers start {lead} s before\n\
         the primary (a server joins a GPU whose batch work runs). The primary's SM request is\n\
         40% (50% in the 60 req/s inference shape), limit 100%. `alone`: the primary by itself (the reference\n\
         for training loss); `no limiter`: no node manager; `static`, `dilu-rckm`, `dilu`: the node\n\
         manager's controllers; `dilu-colo`: fillers launch only into the primary's gaps (gap\n\
         board, `dilu run --colo`), the inference primary tolerating one filler kernel of delay\n\
         (`DILU_COLO_TOLERANCE=2ms`, cut per request to the slack, SLO minus latency without the delay\n\
         fillers caused, of the worst of its last 8 requests), the training primary none, and the `dilu-colo` controller lends\n\
         the primary's guarantee (while all of it is lent, each busy batch tenant may use the\n\
         device but the others' requests) and takes its request back in the control period a\n\
         request nears the SLO. Fillers keep the gaps in turns of {turn_ms} ms (a hand-off between processes costs\n\
         {handoff_us} µs on simgpu, as measured on an H100), and a filler about to wait for its own SM-time\n\
         tokens ends its turn; a filler keeps its guarantee (its SM request, 20%): behind it, it goes ahead of\n\
         the turn and claims the next opening of a gap it can use, and its kernels go into gaps they do\n\
         not fit where the gaps are random or all shorter than its kernels (where they repeat or are\n\
         alike, as one of the longest opens: there a kernel overruns the gap least). A filler's kernels\n\
         longer than a time slice are timed while the primary holds its launches (one hold per {spacing}\n\
         of its kernels at most), so its guarantee is counted in device time; such a filler's guarantee\n\
         costs the primary its kernels' overrun of the gaps. `{LOW_GUARANTEE}`: `dilu-colo` with the\n\
         guarantee of the filler whose kernels fit no gap lowered to 5% (`DILU_COLO_GUARANTEE=5`), in\n\
         the shapes that have one.\n\
         Gap prediction: per phase when the primary's gaps repeat (a period of up to 8 gaps,\n\
         believed after 3 iterations agree within 25%; chosen on the unit tests and the tuned\n\
         two-gap training shape), else the shortest of the last 8 gaps; a filler kernel fits when it\n\
         ends one hand-off before the predicted end of the gap.\n\
         Device busy and filler share (together, then each in the order the shape names them): device\n\
         time from simgpu's trace over the primary's run.\n\
         Latency: each request's arrival to its last kernel's end, measured by the program.\n\n\
         {sections}\
         Machine: {}. A loaded, shared 2-core VM without a GPU: every process competes for the CPU.\n",
        if class_rounds > 1 {
            format!(" --class-rounds {class_rounds}")
        } else {
            String::new()
        },
        machine(),
        turn_ms = dilu_colocation::FILLER_TURN_NS / 1_000_000,
        handoff_us = dilu_colocation::HANDOFF_NS / 1_000,
        spacing = dilu_colocation::SAMPLE_HOLD_SPACING,
        lead = FILLER_LEAD.as_secs(),
    );
    print!("{doc}");
    let one_class_shape = arg_after("--class-shape").is_some();
    if only.is_none() && only_config.is_none() && !class_only && !one_class_shape {
        write_result("colocation.md", &doc);
    }
}
