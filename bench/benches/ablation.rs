//! What each SM-time mechanism buys: a reduced SM-time matrix (cells of
//! `sm_accuracy`'s matrix and sweep), a few co-location shapes (the
//! `colocation` bench's, at defaults) and the launch path's added ns, once
//! with every mechanism on (the defaults, twice: the second run is the
//! noise floor) and once with each mechanism off in turn, in one run on
//! simgpu's default model. With `--repeat N` every configuration runs N
//! times, in N rounds of all of them (each round in another order, so a
//! machine's drift hits every configuration alike), and each cell is the
//! median of its N runs. Writes `bench/results/ablation.md`.
//!
//! Run: `scripts/bench.sh ablation` (`-- --seconds S` per SM run, default
//! 3; `--colo-seconds S` per co-location run, default 3; `--repeat N`
//! rounds, default 1; `--output NAME` another results file; `--only TEXT`
//! the defaults and the configurations whose name contains TEXT, printed,
//! no file written). Needs the release build.

#[allow(dead_code)]
#[path = "colocation.rs"]
mod colocation;
#[allow(dead_code)]
#[path = "overhead.rs"]
mod overhead;
#[allow(dead_code)]
#[path = "sm_accuracy.rs"]
mod sm_accuracy;

use dilu_bench::driver::{self, LaunchKernel, thread_cpu_time};
use dilu_bench::median;
use dilu_bench::report::{self, Table};
use dilu_harness::workload::{KernelSize, RequestShape, SyncEvery};
use std::fmt::Write as _;
use std::hint::black_box;
use std::process::Command;

/// Every mechanism with its word in `DILU_SM_ABLATE`, the one variable
/// that turns mechanisms off (for benchmarks only).
const MECHANISMS: &[(&str, &str)] = &[
    ("runs of work", "runs"),
    ("usage feedback", "feedback"),
    ("samples apart", "apart"),
    ("quiet holds", "quiet"),
    ("fair turns and idle skips", "turns"),
    ("leases", "leases"),
];

const ABLATE: &str = "DILU_SM_ABLATE";

/// The SM-time cells: the sweep's shapes (one of each difficulty) plus the
/// matrix's kernels longer than a time slice, its shortest never-drained
/// kernels and one short kernel per synchronisation.
fn sm_shapes() -> Vec<RequestShape> {
    let mut shapes = sm_accuracy::sweep_shapes();
    shapes.extend(sm_accuracy::shapes().into_iter().filter(|shape| {
        (shape.kernel == KernelSize::Ms3 && shape.sync == SyncEvery::Launches(16))
            || (shape.kernel == KernelSize::Us20
                && shape.sync == SyncEvery::Never
                && shape.streams == 1
                && shape.graph.is_none())
            || (shape.kernel == KernelSize::Us100
                && shape.sync == SyncEvery::Launches(1)
                && shape.streams == 1
                && shape.graph.is_none())
    }));
    shapes
}

/// The co-location shapes: the tuned inference shape and the training
/// shape whose long filler is timed under the primary's hold.
const COLO_SHAPES: [usize; 2] = [0, 4];

/// What the pair uses without dilu and what each tenant uses alone
/// uncapped: measured once, they do not depend on dilu's mechanisms.
struct Reference {
    demand: f64,
    free_used: f64,
}

/// One configuration's measurements.
struct Measured {
    /// Per SM shape: cap error, split error (points), work kept (%).
    sm: Vec<(f64, f64, f64)>,
    /// Per co-location shape: device busy (%), violations (%) or primary
    /// loss vs alone (%).
    colo: Vec<(f64, f64)>,
    added_ns: f64,
}

/// Mechanisms removed after `ablation-before-removals.md` (its rows with
/// each off), and why.
const REMOVED: &[(&str, &str)] = &[(
    "sample gate",
    "a host function (`cuLaunchHostFunc`) holding a timed launch's stream until the launch was \
     queued, so a sample left out the host time before the kernel; usage feedback settles that \
     over-charge, and its row (`DILU_SM_ABLATE=gate`) differed from the defaults by no more than \
     the two defaults rows differ from each other",
)];

/// Runs that a stalled machine spoiled (the device almost idle while
/// tenants that keep it busy ran) and were run again.
static RERUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const ATTEMPTS: usize = 3;

/// Runs `measure` until `spoiled` says its result is not, [`ATTEMPTS`] times
/// at most.
fn unspoiled<T>(mut measure: impl FnMut() -> T, spoiled: impl Fn(&T) -> bool) -> T {
    let mut result = measure();
    for _ in 1..ATTEMPTS {
        if !spoiled(&result) {
            break;
        }
        eprintln!("ablation: the device stayed almost idle (a stalled machine?): run again");
        RERUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        result = measure();
    }
    result
}

fn sm_cells(
    shape: &RequestShape,
    reference: &Reference,
    seconds: f64,
    env: &[(&str, &str)],
) -> (f64, f64, f64) {
    let cap = sm_accuracy::CAPS[0];
    let floor = 0.25 * reference.demand.min(cap / 100.0);
    let (alone, _) = unspoiled(
        || sm_accuracy::run_with(shape, seconds, &[Some(cap)], env),
        |(shares, _)| shares[0] < floor,
    );
    let got = alone[0] * 100.0;
    let cap_error = if reference.demand * 100.0 >= cap {
        (got - cap).abs()
    } else {
        (got - cap).max(0.0)
    };
    let caps = [Some(sm_accuracy::CAPS[0]), Some(sm_accuracy::CAPS[1])];
    let (pair, _) = unspoiled(
        || sm_accuracy::run_with(shape, seconds, &caps, env),
        |(shares, _)| shares.iter().sum::<f64>() < 0.5 * reference.free_used,
    );
    let used: f64 = pair.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let split_error = (pair[0] / used * 100.0 - cap).abs();
    let kept = 100.0 * used / reference.free_used.max(f64::MIN_POSITIVE);
    (cap_error, split_error, kept)
}

/// Sets (or clears) `DILU_SM_ABLATE` in this process's environment, which
/// the co-location run's node manager and tenants inherit.
fn set_switches(env: &[(&str, &str)]) {
    // SAFETY: the benchmark's main thread is its only thread here.
    unsafe { std::env::remove_var(ABLATE) };
    for (name, value) in env {
        // SAFETY: as above.
        unsafe { std::env::set_var(name, value) };
    }
}

fn colo_cells(shapes: &[colocation::Shape], alone_rate: &[f64], seconds: u64) -> Vec<(f64, f64)> {
    COLO_SHAPES
        .iter()
        .zip(alone_rate)
        .map(|(&index, &alone)| {
            let shape = &shapes[index];
            // The fillers keep the device busy: a third of it is far below.
            let run = unspoiled(
                || colocation::run(shape, index, colocation::DEFAULTS, seconds),
                |run| run.device_busy < 0.33,
            );
            let second = if shape.slo_ms.is_some() {
                100.0 * run.primary["slo_violation_rate"].as_f64().unwrap_or(1.0)
            } else {
                let rate = run.primary["iterations_per_second"].as_f64().unwrap_or(0.0);
                100.0 * (1.0 - rate / alone.max(f64::MIN_POSITIVE))
            };
            (100.0 * run.device_busy, second)
        })
        .collect()
}

/// Added ns per launch with an SM share, sampling included: a child of
/// this benchmark (the interposer reads its switches once, at load) times
/// launches directly on simgpu's null driver (its per-call host costs on)
/// and through the interposer, paired, and prints the median difference.
fn launch_cost(env: &[(&str, &str)], index: usize) -> f64 {
    let tenant = format!("ablation-launch-{}-{index}", std::process::id());
    let output = Command::new(std::env::current_exe().expect("own path"))
        .arg("--launch-cost")
        .env("DILU_SM_LIMIT", "99")
        .env("DILU_TENANT", &tenant)
        .envs(env.iter().copied())
        .output()
        .expect("start the launch-cost child");
    dilu_harness::sm_scenario::remove_tenant_files(&tenant);
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("added_ns "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "launch-cost child: {}\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

/// The child's side of [`launch_cost`].
fn launch_cost_child() {
    const ROUNDS: usize = 150;
    const LAUNCHES: u64 = 1000;
    let paths = overhead::open_paths();
    overhead::deepen_the_bucket();
    let sides: [LaunchKernel; 2] = [
        paths.libraries[0].get("cuLaunchKernel"),
        paths.libraries[1].get("cuLaunchKernel"),
    ];
    let time = |launch: LaunchKernel| {
        let started = thread_cpu_time();
        for _ in 0..LAUNCHES {
            black_box(driver::launch_noop(launch, paths.function));
        }
        (thread_cpu_time() - started).as_nanos() as f64 / LAUNCHES as f64
    };
    // Warm both paths (the interposer's first samples of the kind).
    for _ in 0..20 {
        time(sides[0]);
        time(sides[1]);
    }
    let mut added = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        let (direct, dilu) = if round % 2 == 0 {
            let d = time(sides[0]);
            (d, time(sides[1]))
        } else {
            let t = time(sides[1]);
            (time(sides[0]), t)
        };
        added.push(dilu - direct);
    }
    println!("added_ns {:.1}", median(&mut added));
}

fn value_of(flag: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != flag).nth(1)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::args().any(|a| a == "--launch-cost") {
        launch_cost_child();
        return;
    }
    let seconds: f64 = value_of("--seconds").map_or(3.0, |v| v.parse().expect("--seconds S"));
    let colo_seconds: u64 =
        value_of("--colo-seconds").map_or(3, |v| v.parse().expect("--colo-seconds S"));
    let repeat: usize = value_of("--repeat")
        .map_or(1, |v| v.parse().expect("--repeat N"))
        .max(1);
    let started = std::time::Instant::now();
    let machine_before = report::machine();
    set_switches(&[]);

    let shapes = sm_shapes();
    let references: Vec<Reference> = shapes
        .iter()
        .map(|shape| {
            eprintln!("ablation: reference, {}", shape.name());
            let (alone, _) = sm_accuracy::run_with(shape, seconds, &[None], &[]);
            let (free, _) = sm_accuracy::run_with(shape, seconds, &[None, None], &[]);
            Reference {
                demand: alone[0],
                free_used: free.iter().sum(),
            }
        })
        .collect();
    let colo_shapes = colocation::shapes();
    let alone_rate: Vec<f64> = COLO_SHAPES
        .iter()
        .map(|&index| {
            let shape = &colo_shapes[index];
            if shape.slo_ms.is_some() {
                return 0.0;
            }
            eprintln!("ablation: reference, {}", shape.name);
            let run = colocation::run(shape, index, "alone", colo_seconds);
            run.primary["iterations_per_second"].as_f64().unwrap_or(0.0)
        })
        .collect();

    let mut configs: Vec<(String, Vec<(&str, &str)>)> = vec![
        ("everything on (defaults)".into(), vec![]),
        ("everything on, again (noise)".into(), vec![]),
    ];
    for (name, word) in MECHANISMS {
        configs.push((
            format!("{name} off (`{ABLATE}={word}`)"),
            vec![(ABLATE, *word)],
        ));
    }
    let only = value_of("--only");
    configs.retain(|(name, _)| {
        name.starts_with("everything on (") || only.as_deref().is_none_or(|o| name.contains(o))
    });
    let output = value_of("--output").unwrap_or_else(|| "ablation.md".into());
    let mut runs: Vec<Vec<Measured>> = configs.iter().map(|_| Vec::new()).collect();
    let rounds_started = std::time::Instant::now();
    let total = repeat * configs.len();
    for round in 0..repeat {
        // Each round starts one configuration later: no configuration is
        // always first (or last) after the references.
        for step in 0..configs.len() {
            let index = (round + step) % configs.len();
            let (name, env) = &configs[index];
            let done = round * configs.len() + step;
            let remaining = (done > 0).then(|| {
                rounds_started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64
            });
            eprintln!(
                "ablation: round {}/{repeat}, run {}/{total}: {name} ({:.0} s so far{})",
                round + 1,
                done + 1,
                started.elapsed().as_secs_f64(),
                remaining.map_or(String::new(), |r| format!(", about {r:.0} s to go"))
            );
            let sm = shapes
                .iter()
                .zip(&references)
                .map(|(shape, reference)| sm_cells(shape, reference, seconds, env))
                .collect();
            set_switches(env);
            let colo = colo_cells(&colo_shapes, &alone_rate, colo_seconds);
            set_switches(&[]);
            let added_ns = launch_cost(env, index);
            let m = Measured { sm, colo, added_ns };
            eprintln!("  {}", summary_line(&m));
            runs[index].push(m);
        }
    }
    let measured: Vec<Measured> = runs.iter().map(|r| median_of(r)).collect();
    let doc = document(
        &output,
        &shapes,
        &colo_shapes,
        &configs,
        &measured,
        seconds,
        colo_seconds,
        repeat,
        &machine_before,
        started.elapsed().as_secs_f64(),
    );
    print!("{doc}");
    if only.is_some() {
        eprintln!("ablation: --only given; results file not written");
        return;
    }
    report::write_result(&output, &doc);
}

/// Each cell's median over a configuration's runs.
fn median_of(runs: &[Measured]) -> Measured {
    let cell = |f: &dyn Fn(&Measured) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    let first = &runs[0];
    Measured {
        sm: (0..first.sm.len())
            .map(|i| {
                (
                    cell(&|m| m.sm[i].0),
                    cell(&|m| m.sm[i].1),
                    cell(&|m| m.sm[i].2),
                )
            })
            .collect(),
        colo: (0..first.colo.len())
            .map(|i| (cell(&|m| m.colo[i].0), cell(&|m| m.colo[i].1)))
            .collect(),
        added_ns: cell(&|m| m.added_ns),
    }
}

fn summary_line(m: &Measured) -> String {
    let sm: Vec<String> =
        m.sm.iter()
            .map(|(c, s, k)| format!("{c:.1}/{s:.1}/{k:.0}%"))
            .collect();
    let colo: Vec<String> = m
        .colo
        .iter()
        .map(|(b, v)| format!("{b:.1}%/{v:.2}"))
        .collect();
    format!(
        "sm {} colo {} launch {:+.1} ns",
        sm.join(" "),
        colo.join(" "),
        m.added_ns
    )
}

/// How much worse a configuration is than the defaults on its worst cell,
/// in points: cap and split errors and violations up, work kept and
/// device busy down, training loss up.
fn worst_cost(on: &Measured, off: &Measured) -> (f64, String) {
    let mut worst = (f64::MIN, String::new());
    let mut consider = |cost: f64, what: String| {
        if cost > worst.0 {
            worst = (cost, what);
        }
    };
    for (i, (a, b)) in on.sm.iter().zip(&off.sm).enumerate() {
        consider(b.0 - a.0, format!("cap error, SM cell {}", i + 1));
        consider(b.1 - a.1, format!("split error, SM cell {}", i + 1));
        consider(a.2 - b.2, format!("work kept, SM cell {}", i + 1));
    }
    for (i, (a, b)) in on.colo.iter().zip(&off.colo).enumerate() {
        consider(a.0 - b.0, format!("device busy, co-location {}", i + 1));
        consider(b.1 - a.1, format!("violations/loss, co-location {}", i + 1));
    }
    worst
}

#[allow(clippy::too_many_arguments)]
fn document(
    output: &str,
    shapes: &[RequestShape],
    colo_shapes: &[colocation::Shape],
    configs: &[(String, Vec<(&str, &str)>)],
    measured: &[Measured],
    seconds: f64,
    colo_seconds: u64,
    repeat: usize,
    machine_before: &str,
    elapsed_s: f64,
) -> String {
    let mut doc = String::from("# Ablation: what each SM-time mechanism buys\n\n");
    let _ = writeln!(
        doc,
        "Command: `scripts/bench.sh ablation -- --seconds {seconds} --colo-seconds \
         {colo_seconds} --repeat {repeat}{}` (`cargo bench -p dilu-bench --bench ablation -- \
         ...`), release build, simgpu's default model, no GPU, {elapsed_s:.0} s in all.\n\
         Machine at the start: {machine_before}. At the end: {}.\n",
        if output == "ablation.md" {
            String::new()
        } else {
            format!(" --output {output}")
        },
        report::machine()
    );
    let _ = write!(
        doc,
        "Each configuration runs every cell below in turn: everything on (the defaults), \
         the same again (the difference between these two rows is the noise of a cell), \
         and each mechanism off alone, in {repeat} round(s) of all the configurations, each \
         round starting one configuration later; every cell is the median of its {repeat} \
         run(s).\n\n"
    );
    doc.push_str(
        "\
         - **SM cells** (the SM-time matrix's, `sm_accuracy`): a `cudarc-loop` tenant alone at \
         `--sm 30` (**cap error**: points from 30, or above it where the tenant uses less \
         than 30 uncapped), and a pair at 30/70 (**split error**: points of the 30% tenant's part \
         of the device time the two used away from 30; **work kept**: device time the pair used \
         over what the same pair used without dilu, measured once before the configurations). \
         Device time from simgpu's kernel trace.\n\
         - **co-location cells** (the `colocation` bench's shapes, its `defaults, with roles` \
         row: node manager at its default controller, `--colo primary`/`--colo filler`): \
         **device busy** over the primary's run, and the primary's **SLO violations** \
         (inference) or **loss** of iterations per second vs the primary alone (training).\n\
         - **ns per launch**: `cuLaunchKernel` through the interposer minus directly on simgpu's \
         null driver with its per-call host costs (3.8 µs a launch), one process, paired \
         rounds of 1000 launches (median of 150), a share of 99% on a bucket an hour deep \
         (the `overhead` bench's set-up), sampling included.\n\n",
    );
    doc.push_str("SM cells:\n\n");
    for (i, shape) in shapes.iter().enumerate() {
        let _ = writeln!(doc, "{}. {}", i + 1, shape.name());
    }
    doc.push_str("\nCo-location cells:\n\n");
    for (i, &index) in COLO_SHAPES.iter().enumerate() {
        let _ = writeln!(doc, "{}. {}", i + 1, colo_shapes[index].name);
    }
    doc.push('\n');
    let mut header = vec!["configuration".to_string()];
    for i in 0..shapes.len() {
        header.push(format!("SM {}: cap / split err / kept", i + 1));
    }
    for (i, &index) in COLO_SHAPES.iter().enumerate() {
        header.push(if colo_shapes[index].slo_ms.is_some() {
            format!("colo {}: busy / violations", i + 1)
        } else {
            format!("colo {}: busy / loss", i + 1)
        });
    }
    header.push("added ns / launch".into());
    header.push("worst cell vs defaults (points)".into());
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut table = Table::new(&header);
    for ((name, _), m) in configs.iter().zip(measured) {
        let mut row = vec![name.clone()];
        for (cap, split, kept) in &m.sm {
            row.push(format!("{cap:.1} / {split:.1} / {kept:.0}%"));
        }
        for (busy, second) in &m.colo {
            row.push(format!("{busy:.1}% / {second:.2}%"));
        }
        row.push(format!("{:+.1}", m.added_ns));
        let (cost, what) = worst_cost(&measured[0], m);
        row.push(if std::ptr::eq(m, &measured[0]) {
            "—".into()
        } else {
            format!("{cost:+.1} ({what})")
        });
        table.row(row);
    }
    doc.push_str(&table.markdown());
    let _ = writeln!(
        doc,
        "\nRuns spoiled by a stalled machine (the device almost idle: a pair using under half of \
         its reference, a tenant alone under a quarter of its target, co-location under 33% busy) \
         and run again, up to {ATTEMPTS} times: {}.",
        RERUNS.load(std::sync::atomic::Ordering::Relaxed)
    );
    doc.push_str(
        "\nA positive worst cell is what turning the mechanism off cost on its worst cell (a cap \
         or split error or violations up, work kept or device busy down); compare it with the \
         second defaults row, which differs from the first by noise alone.\n",
    );
    doc.push_str(
        "\n## Removed\n\nMechanisms measured off in `ablation-before-removals.md` (same command, \
         `-- --output ablation-before-removals.md`, on the build before their removal; their rows \
         there say what each removal cost) and removed with their code, tests and switch:\n\n",
    );
    for (name, what) in REMOVED {
        let _ = writeln!(doc, "- **{name}**: {what}.");
    }
    doc
}
