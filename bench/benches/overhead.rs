//! What the interposer adds per driver call (criterion), measured side by
//! side in one process: the same call made directly on the driver and
//! through the interposer's exported wrapper of the same ABI name, which
//! forwards to that same driver, on simgpu's null mode (calls that cost
//! almost nothing, so the interposer's own cost shows).
//!
//! The interposer runs with a memory budget, so allocation and
//! `cuMemGetInfo` take their budgeted paths (ledger reservation, charge
//! table). Any other `DILU_*` setting in the environment (an SM-time budget,
//! say) applies too. Needs release builds of simgpu and the interposer:
//! run `scripts/bench.sh` (or `scripts/bench.sh overhead`).
//!
//! At the end it prints a table of medians (direct, through dilu, added ns,
//! ratio) taken from the same criterion samples, and writes it to
//! `bench/results/overhead.md` when every row was measured. With an SM-time
//! share in the environment (`DILU_SM_LIMIT`, as `scripts/bench.sh
//! overhead` does in its second run) only the launch rows count and the
//! table goes to `bench/results/overhead-sm-launch.md`.

use criterion::{BenchmarkId, Criterion};
use dilu_bench::driver::{
    self, GetProcAddress, LaunchKernel, Library, MemAlloc, MemFree, MemGetInfo, thread_cpu_time,
};
use dilu_bench::median;
use dilu_bench::report::{self, Table};
use std::cell::RefCell;
use std::hint::black_box;
use std::time::Duration;

const THREADS: usize = 8;
const ALLOC_BYTES: usize = 4096;

/// The two sides of every comparison.
const SIDES: [&str; 2] = ["direct", "dilu"];

/// Paired per-call times (direct ns, dilu ns) of criterion's samples, kept
/// for the summary. Criterion calls a routine for warm-up first and then
/// once per sample, so the last `sample_size` calls of a benchmark are its
/// samples.
#[derive(Default)]
struct Samples(RefCell<Vec<(String, [f64; 2])>>);

impl Samples {
    fn record(&self, benchmark: &str, iters: u64, elapsed: [Duration; 2]) {
        let per_call = elapsed.map(|d| d.as_nanos() as f64 / iters as f64);
        self.0.borrow_mut().push((benchmark.to_string(), per_call));
    }

    /// The samples of both benchmarks of `group`, if criterion took
    /// `sample_size` of each (not under `--test`, `--list` or a filter).
    fn pairs(&self, group: &str, sample_size: usize) -> Option<Vec<[f64; 2]>> {
        let all = self.0.borrow();
        let mut pairs = Vec::new();
        for side in SIDES {
            let benchmark = format!("{group}/{side}");
            let mine: Vec<[f64; 2]> = all
                .iter()
                .filter(|(b, _)| *b == benchmark)
                .map(|(_, pair)| *pair)
                .collect();
            if mine.len() < sample_size {
                return None;
            }
            pairs.extend_from_slice(&mine[mine.len() - sample_size..]);
        }
        Some(pairs)
    }
}

/// CPU time of `iters` calls of `op` on this thread.
fn timed(iters: u64, mut op: impl FnMut()) -> Duration {
    let started = thread_cpu_time();
    for _ in 0..iters {
        op();
    }
    thread_cpu_time() - started
}

/// `iters` calls of `op` on each of `threads` threads started together:
/// the mean CPU time per thread.
fn timed_threads(threads: usize, iters: u64, op: impl Fn() + Sync) -> Duration {
    let start = std::sync::Barrier::new(threads);
    let total: Duration = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    timed(iters, &op)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).sum()
    });
    total / threads as u32
}

pub(crate) struct Paths {
    pub(crate) libraries: [Library; 2],
    pub(crate) function: usize,
}

pub(crate) fn open_paths() -> Paths {
    let simgpu = driver::artifact("libsimgpu.so");
    let interposer = driver::artifact("libdilu_interposer.so");
    // SAFETY: single-threaded at this point; the libraries read these once.
    unsafe {
        std::env::set_var("SIMGPU_NULL", "1");
        std::env::set_var("SIMGPU_INSTANCE", format!("bench-{}", std::process::id()));
        std::env::set_var("DILU_REAL_LIBCUDA", &simgpu);
        std::env::set_var("DILU_MEM_LIMIT", "64GiB");
        std::env::set_var("DILU_CONTEXT_MEMORY", "0");
    }
    let direct = Library::open(&simgpu).unwrap_or_else(|e| panic!("{e}"));
    let dilu = Library::open(&interposer).unwrap_or_else(|e| panic!("{e}"));
    driver::init_context(&direct).unwrap_or_else(|e| panic!("{e}"));
    let function = driver::load_noop(&direct).unwrap_or_else(|e| panic!("{e}"));
    // Every path works, and the interposer's lazy set-up (driver symbols,
    // ledger join) happens before anything is timed.
    for library in [&direct, &dilu] {
        assert_eq!(
            driver::alloc_free(
                library.get("cuMemAlloc_v2"),
                library.get("cuMemFree_v2"),
                ALLOC_BYTES
            ),
            0
        );
        assert_eq!(
            driver::launch_noop(library.get("cuLaunchKernel"), function),
            0
        );
    }
    Paths {
        libraries: [direct, dilu],
        function,
    }
}

/// One row of the summary: a criterion group with a "direct" and a "dilu"
/// benchmark.
struct Row {
    group: &'static str,
    label: &'static str,
    /// Target for the added ns, if the issue sets one.
    target_ns: Option<f64>,
}

const ROWS: [Row; 5] = [
    Row {
        group: "cuLaunchKernel",
        label: "cuLaunchKernel, 1 thread",
        target_ns: Some(50.0),
    },
    Row {
        group: "cuLaunchKernel-8-threads",
        label: "cuLaunchKernel, 8 threads at once",
        target_ns: Some(100.0),
    },
    Row {
        group: "cuMemAlloc_v2+cuMemFree_v2",
        label: "cuMemAlloc_v2 + cuMemFree_v2 (4 KiB, budgeted)",
        target_ns: Some(200.0),
    },
    Row {
        group: "cuMemGetInfo_v2",
        label: "cuMemGetInfo_v2 (budgeted)",
        target_ns: None,
    },
    Row {
        group: "cuGetProcAddress_v2",
        label: "cuGetProcAddress_v2(\"cuMemAlloc\", 12090, flags 0)",
        target_ns: None,
    },
];

/// Times `iters` calls of `row`'s operation through `library`.
fn run(row: &Row, library: &Library, function: usize, iters: u64) -> Duration {
    let launch: LaunchKernel = library.get("cuLaunchKernel");
    match row.group {
        "cuLaunchKernel" => timed(iters, || {
            black_box(driver::launch_noop(launch, function));
        }),
        "cuLaunchKernel-8-threads" => timed_threads(THREADS, iters, || {
            black_box(driver::launch_noop(launch, function));
        }),
        "cuMemAlloc_v2+cuMemFree_v2" => {
            let alloc: MemAlloc = library.get("cuMemAlloc_v2");
            let free: MemFree = library.get("cuMemFree_v2");
            timed(iters, || {
                black_box(driver::alloc_free(alloc, free, ALLOC_BYTES));
            })
        }
        "cuMemGetInfo_v2" => {
            let get_info: MemGetInfo = library.get("cuMemGetInfo_v2");
            timed(iters, || {
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: live out-parameters.
                black_box(unsafe { get_info(&mut free, &mut total) });
            })
        }
        "cuGetProcAddress_v2" => {
            let lookup: GetProcAddress = library.get("cuGetProcAddress_v2");
            let name = c"cuMemAlloc";
            timed(iters, || {
                let (mut pointer, mut status) = (std::ptr::null_mut(), 0);
                // SAFETY: cuGetProcAddress_v2 contract, live out-parameters.
                black_box(unsafe { lookup(name.as_ptr(), &mut pointer, 12090, 0, &mut status) });
            })
        }
        other => unreachable!("no benchmark for {other}"),
    }
}

/// Every row's group, with a "direct" and a "dilu" benchmark. Each sample
/// of either times the same number of calls on both sides back to back
/// (which goes first alternates), so the two are paired in time and drift
/// on a loaded machine hits both alike; criterion is given the time of the
/// benchmark's own side.
fn bench_all(c: &mut Criterion, paths: &Paths, samples: &Samples) {
    for row in &ROWS {
        let mut group = c.benchmark_group(row.group);
        for (index, side) in SIDES.iter().enumerate() {
            let benchmark = format!("{}/{side}", row.group);
            let mut calls = 0u64;
            group.bench_function(BenchmarkId::from_parameter(side), |b| {
                b.iter_custom(|iters| {
                    calls += 1;
                    let mut elapsed = [Duration::ZERO; 2];
                    let order = if calls.is_multiple_of(2) {
                        [0, 1]
                    } else {
                        [1, 0]
                    };
                    for which in order {
                        elapsed[which] = run(row, &paths.libraries[which], paths.function, iters);
                    }
                    samples.record(&benchmark, iters, elapsed);
                    elapsed[index]
                })
            });
        }
        group.finish();
    }
}

/// Gives the tenant's token bucket an hour of depth, as an operator's tool
/// may (the writer side of its budget): null mode's events time the launch
/// calls' own host time, so a tight launch loop is charged about as much
/// GPU time as it takes wall-clock time and, at any share, would soon wait
/// for tokens. With the deep bucket every launch stays within budget and
/// the rows measure the cost of control, not of waiting.
pub(crate) fn deepen_the_bucket() {
    let Some(tenant) = std::env::var("DILU_TENANT").ok().filter(|t| !t.is_empty()) else {
        panic!("the SM-time run needs DILU_TENANT (scripts/bench.sh overhead sets it)");
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let path = dilu_layout::tenant_region_path(uid, &tenant, "sm");
    let budget = dilu_layout::shm::Region::<dilu_layout::budget::TenantBudget>::open_or_create(
        &path,
        0o600,
        |_| panic!("the interposer did not create {}", path.display()),
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    budget.set_depth_ns(3_600_000_000_000);
}

/// Whether launches take the SM-time path in this run (a share is set).
fn sm_share_set() -> bool {
    std::env::var_os("DILU_SM_LIMIT").is_some_and(|v| !v.is_empty())
}

fn summary(samples: &Samples, sample_size: usize, rows: &[Row]) -> Option<String> {
    let mut table = Table::new(&[
        "call",
        "direct ns",
        "through dilu ns",
        "added ns",
        "ratio",
        "target (added)",
    ]);
    let mut complete = true;
    for row in rows {
        let Some(pairs) = samples.pairs(row.group, sample_size) else {
            complete = false;
            continue;
        };
        let direct = median(&mut pairs.iter().map(|p| p[0]).collect::<Vec<_>>());
        let dilu = median(&mut pairs.iter().map(|p| p[1]).collect::<Vec<_>>());
        let added = median(&mut pairs.iter().map(|p| p[1] - p[0]).collect::<Vec<_>>());
        let target = match row.target_ns {
            Some(t) if added <= t => format!("≤ {t:.0}: met"),
            Some(t) => format!("≤ {t:.0}: **missed**"),
            None => "—".into(),
        };
        table.row(vec![
            row.label.into(),
            report::ns(direct),
            report::ns(dilu),
            format!("{added:+.1}"),
            format!("{:.2}", dilu / direct),
            target,
        ]);
    }
    if table.is_empty() {
        return None;
    }
    let markdown = table.markdown();
    println!("\ninterposer overhead on simgpu's null driver (median ns per call, paired samples)");
    print!("{markdown}");
    complete.then_some(markdown)
}

fn main() {
    let sample_size = 60;
    let mut criterion = Criterion::default()
        .sample_size(sample_size)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let paths = open_paths();
    if sm_share_set() {
        deepen_the_bucket();
    }
    let samples = Samples::default();
    let machine_before = report::machine();
    bench_all(&mut criterion, &paths, &samples);
    criterion.final_summary();
    // The sample size may have been changed on the command line; criterion
    // does not say, so read it from the command line the same way.
    let sample_size = std::env::args()
        .skip_while(|a| a != "--sample-size")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(sample_size);
    if sm_share_set() {
        if let Some(table) = summary(&samples, sample_size, &ROWS[..2]) {
            write_sm_launch_result(&table, sample_size, &machine_before);
        }
        return;
    }
    let Some(table) = summary(&samples, sample_size, &ROWS) else {
        return;
    };
    let text = format!(
        "# Interposer overhead per driver call\n\n\
Command: `scripts/bench.sh overhead` (release build; `cargo bench -p dilu-bench --bench overhead`,\n\
criterion, {sample_size} samples per benchmark after 1 s warm-up, 2 s measurement).\n\n\
Machine: {machine_before}. A loaded VM: the cores are shared with other engineers' builds,\n\
so expect a few ns of noise in every cell. No GPU: the driver is simgpu in null mode\n\
(`SIMGPU_NULL=1`), so the driver's own work is almost nothing and the interposer's cost shows.\n\n\
Both columns come from one process and one run. \"direct\" calls simgpu's export; \"through\n\
dilu\" calls the interposer's exported wrapper of the same name (both libraries `dlopen`ed\n\
`RTLD_LOCAL`), which forwards to the same simgpu. Every criterion sample times the same\n\
number of calls on both sides back to back (alternating which goes first), so each sample\n\
is a pair measured within milliseconds; the \"direct\" and \"dilu\" benchmarks of a call\n\
give {pairs} such pairs. \"direct ns\" and \"through dilu ns\" are the medians of the mean\n\
time per call over those samples, \"added ns\" the median of the paired differences and\n\
\"ratio\" the ratio of the medians. The interposer runs with a memory budget (`DILU_MEM_LIMIT=64GiB`,\n\
`DILU_CONTEXT_MEMORY=0`), so allocation and `cuMemGetInfo` take the budgeted path (ledger\n\
CAS, charge table). Times are the CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`),\n\
not the wall clock: time spent waiting for a core while other builds ran is left out. The\n\
8-thread row is the CPU time per call of each of 8 threads launching at once (with fewer\n\
cores than threads, only as many run at any moment as there are cores, so contention\n\
between cores is only that many-way).\n\n\
{table}\n\
The launch rows here run without an SM-time share: the pass-through cost of the launch\n\
hook. The same command's second run measures them with a share set:\n\
`overhead-sm-launch.md`. Criterion's own reports: `target/criterion/`.\n",
        pairs = 2 * sample_size
    );
    report::write_result("overhead.md", &text);
}

fn write_sm_launch_result(table: &str, sample_size: usize, machine: &str) {
    let share = std::env::var("DILU_SM_LIMIT").unwrap_or_default();
    let text = format!(
        "# Launch overhead with an SM-time share set\n\n\
Command: `scripts/bench.sh overhead` (its second run: `DILU_SM_LIMIT={share} cargo bench -p dilu-bench\n\
--bench overhead -- cuLaunchKernel`), release build, same method as `overhead.md`\n\
({sample_size} criterion samples per side, paired).\n\n\
Machine: {machine}. No GPU: simgpu's null driver with its per-call host costs (a launch\n\
costs 3.8 µs, a timed event record 1.3 µs, as measured on an H100: `SIMGPU_CALL_COST`,\n\
sources in simgpu's README), so a sampled launch's extra driver calls cost what they would\n\
on a real driver.\n\n\
With a share set, every launch takes the SM-time path: estimate look-up, one add on the\n\
kind's launch count and the recent-stream note; a launch shorter than 64 µs of GPU time\n\
spends from its process's lease, and only a launch that finds the lease spent goes to the\n\
tenant's bucket (one `clock_gettime`, the bucket CAS, the telemetry counters) and takes a\n\
new one. The benchmark gives the tenant's bucket an hour of depth (null mode's\n\
events time the launch calls' host time, so a tight loop would otherwise soon wait for\n\
tokens at any share): every launch is within budget, and this is the cost of control, not\n\
of waiting. Launches of a kind are timed (`cuCtxGetCurrent` and an event recorded on the\n\
launch's stream before it, one after it; on several streams also one on each other recent\n\
stream and a `cuStreamWaitEvent`) one in 4 to 256 at first, then ever less while samples\n\
agree (down to one in 4096); those are in the samples too.\n\n\
{table}\n\
Without a share (pass-through, memory budget only) see the launch rows of `overhead.md`.\n"
    );
    report::write_result("overhead-sm-launch.md", &text);
}
