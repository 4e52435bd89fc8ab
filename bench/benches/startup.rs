//! The interposer's start-up cost per process, and whether it grows with
//! the number of processes of the tenant already running.
//!
//! For 0, 16 and 64 other processes of one tenant (each holding memory, so
//! each has a slot in the tenant's ledger), a small CUDA client
//! (`bench-client startup`: dlopen the driver, `cuInit`, primary context,
//! one `cuMemAlloc_v2`) is started many times, alternately directly and
//! under `LD_PRELOAD=libdilu_interposer.so` with a memory budget in the
//! same tenant. The parent reads `CLOCK_MONOTONIC` just before spawning;
//! the client reports the same clock when its first allocation returned.
//! Process creation, exec and the driver's own start-up are in both
//! columns, so their difference is what the interposer costs a process at
//! start (loading the library, its constructor, resolving the driver's
//! symbols, opening the ledger, joining it, starting its watcher thread).
//!
//! Writes `bench/results/startup.md` and `startup-cdf.svg`. Run with
//! `scripts/bench.sh startup`, or `cargo bench -p dilu-bench --bench startup
//! -- [--runs N] [--others 0,16,64]` after a release build of simgpu and
//! the interposer.

use dilu_bench::driver::{self, monotonic_ns};
use dilu_bench::report::{self, Table};
use dilu_bench::svg::CdfPlot;
use dilu_bench::{median, percentile};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const CLIENT: &str = env!("CARGO_BIN_EXE_bench-client");

struct Options {
    runs: usize,
    others: Vec<usize>,
    /// `cargo bench` passes `--bench`; without it (`cargo test --benches`)
    /// this is a smoke run that writes nothing.
    bench: bool,
}

fn parse_options() -> Options {
    let mut options = Options {
        runs: 500,
        others: vec![0, 16, 64],
        bench: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bench" => options.bench = true,
            "--runs" => {
                options.runs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--runs needs a count")
            }
            "--others" => {
                options.others = args
                    .next()
                    .expect("--others needs a list")
                    .split(',')
                    .map(|n| n.trim().parse().expect("--others: counts such as 0,16,64"))
                    .collect()
            }
            _ => {} // criterion-style flags from cargo; nothing else to take
        }
    }
    if !options.bench {
        options.runs = 3;
        options.others = vec![0, 2];
    }
    options
}

/// The processes of one tenant kept running while the client is measured.
struct Holders {
    children: Vec<Child>,
}

impl Holders {
    fn start(count: usize, dilu_env: &[(String, String)], simgpu: &Path) -> Holders {
        let mut holders = Holders {
            children: Vec::with_capacity(count),
        };
        for _ in 0..count {
            let child = Command::new(CLIENT)
                .args(["hold", "--driver"])
                .arg(simgpu)
                .envs(dilu_env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a holder");
            holders.children.push(child);
        }
        for child in &mut holders.children {
            let mut line = String::new();
            let stdout = child.stdout.as_mut().expect("piped stdout");
            BufReader::new(stdout)
                .read_line(&mut line)
                .expect("read a holder's ready line");
            assert_eq!(line.trim(), "ready", "a holder did not get its memory");
        }
        holders
    }

    /// CPU time (seconds) the holders have used so far, from each one's
    /// process CPU clock (`/proc/<pid>/stat` counts whole ticks, and misses
    /// the short wake-ups of idle processes).
    fn cpu_seconds(&self) -> f64 {
        self.children
            .iter()
            .filter_map(|child| {
                let mut clock: libc::clockid_t = 0;
                let mut now = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: both calls write one value to a live local; the pid
                // is our child, not yet reaped.
                let ok = unsafe {
                    libc::clock_getcpuclockid(child.id() as libc::pid_t, &mut clock) == 0
                        && libc::clock_gettime(clock, &mut now) == 0
                };
                ok.then_some(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
            })
            .sum()
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        // Closing stdin lets each holder free its memory and leave the ledger.
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        for child in &mut self.children {
            if child.wait().is_err() {
                let _ = child.kill();
            }
        }
    }
}

/// One start of the client: ns from just before spawn to `main`, and to the
/// first allocation returning.
struct Start {
    to_main: f64,
    to_alloc: f64,
}

fn start_once(env: &[(String, String)], simgpu: &Path) -> Start {
    let mut command = Command::new(CLIENT);
    command
        .args(["startup", "--driver"])
        .arg(simgpu)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    let spawned = monotonic_ns();
    let output = command.output().expect("run bench-client");
    assert!(
        output.status.success(),
        "bench-client startup failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| -> u64 {
        text.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text:?}"))
    };
    Start {
        to_main: (field("main_ns") - spawned) as f64,
        to_alloc: (field("alloc_ns") - spawned) as f64,
    }
}

struct Setting {
    others: usize,
    direct: Vec<Start>,
    dilu: Vec<Start>,
    holders_cpu_share: f64,
}

fn measure(others: usize, runs: usize, simgpu: &Path, interposer: &Path) -> Setting {
    let tenant = format!("bench-startup-{}-{others}", std::process::id());
    let common = vec![
        ("SIMGPU_NULL".to_string(), "1".to_string()),
        ("SIMGPU_INSTANCE".to_string(), tenant.clone()),
    ];
    let mut dilu_env = common.clone();
    dilu_env.extend([
        ("LD_PRELOAD".to_string(), interposer.display().to_string()),
        (
            "DILU_REAL_LIBCUDA".to_string(),
            simgpu.display().to_string(),
        ),
        ("DILU_TENANT".to_string(), tenant.clone()),
        ("DILU_MEM_LIMIT".to_string(), "64GiB".to_string()),
    ]);
    let holders = Holders::start(others, &dilu_env, simgpu);
    for _ in 0..5 {
        start_once(&common, simgpu);
        start_once(&dilu_env, simgpu);
    }
    let (mut direct, mut dilu) = (Vec::new(), Vec::new());
    let cpu_before = holders.cpu_seconds();
    let started = std::time::Instant::now();
    for run in 0..runs {
        // Alternate which side goes first, so drift hits both alike.
        if run % 2 == 0 {
            direct.push(start_once(&common, simgpu));
            dilu.push(start_once(&dilu_env, simgpu));
        } else {
            dilu.push(start_once(&dilu_env, simgpu));
            direct.push(start_once(&common, simgpu));
        }
    }
    let holders_cpu_share = (holders.cpu_seconds() - cpu_before) / started.elapsed().as_secs_f64();
    drop(holders);
    let uid = {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    };
    let _ = std::fs::remove_file(dilu_layout::tenant_region_path(uid, &tenant, "ledger"));
    Setting {
        others,
        direct,
        dilu,
        holders_cpu_share,
    }
}

fn us(ns: f64) -> String {
    format!("{:.0}", ns / 1000.0)
}

/// Target: at most this much added per process start (p50).
const TARGET_ADDED_NS: f64 = 1_000_000.0;

fn column(starts: &[Start], of: impl Fn(&Start) -> f64) -> Vec<f64> {
    starts.iter().map(of).collect()
}

fn main() {
    let options = parse_options();
    let simgpu = driver::artifact("libsimgpu.so");
    let interposer = driver::artifact("libdilu_interposer.so");
    let machine = report::machine();
    let settings: Vec<Setting> = options
        .others
        .iter()
        .map(|&others| {
            eprintln!(
                "startup: {others} other processes, {} runs per side",
                options.runs
            );
            measure(others, options.runs, &simgpu, &interposer)
        })
        .collect();

    let mut table = Table::new(&[
        "other processes of the tenant",
        "direct p50 µs",
        "dilu p50 µs",
        "added p50 µs",
        "direct p99 µs",
        "dilu p99 µs",
        "added p99 µs",
        "added before main, p50 µs",
        "idle holders' CPU, % of a core",
        "target (added p50 ≤ 1 ms)",
    ]);
    let mut plot = CdfPlot::new(
        "Process start to first cuMemAlloc_v2 returned (simgpu null driver)",
        "µs from spawn",
    )
    .log_x();
    for setting in &settings {
        let mut direct = column(&setting.direct, |s| s.to_alloc);
        let mut dilu = column(&setting.dilu, |s| s.to_alloc);
        let mut direct_main = column(&setting.direct, |s| s.to_main);
        let mut dilu_main = column(&setting.dilu, |s| s.to_main);
        let to_us = |v: &[f64]| v.iter().map(|ns| ns / 1000.0).collect::<Vec<f64>>();
        plot = plot
            .series(
                &format!("direct, {} others", setting.others),
                &to_us(&direct),
            )
            .series(&format!("dilu, {} others", setting.others), &to_us(&dilu));
        let (d50, i50) = (percentile(&mut direct, 50.0), percentile(&mut dilu, 50.0));
        let (d99, i99) = (percentile(&mut direct, 99.0), percentile(&mut dilu, 99.0));
        table.row(vec![
            setting.others.to_string(),
            us(d50),
            us(i50),
            us(i50 - d50),
            us(d99),
            us(i99),
            us(i99 - d99),
            us(median(&mut dilu_main) - median(&mut direct_main)),
            format!("{:.1}", setting.holders_cpu_share * 100.0),
            if i50 - d50 <= TARGET_ADDED_NS {
                "met".into()
            } else {
                "**missed**".into()
            },
        ]);
    }
    let markdown = table.markdown();
    println!("\ninterposer start-up cost (spawn → first cuMemAlloc_v2 returned)");
    print!("{markdown}");
    if !options.bench {
        eprintln!("startup: smoke run (no --bench): nothing written");
        return;
    }
    let text = format!(
        "# Interposer start-up time per process\n\n\
Command: `scripts/bench.sh startup` (release build; `cargo bench -p dilu-bench --bench startup\n\
-- --runs {runs} --others {others}`).\n\n\
Machine: {machine}. A loaded VM: the cores are shared with other engineers' builds.\n\
No GPU: the driver is simgpu in null mode (`SIMGPU_NULL=1`), so the driver's own start-up\n\
is small and the interposer's shows.\n\n\
What is measured: `bench-client startup` (dlopen the driver by path, `cuInit`, primary\n\
context, one 1 MiB `cuMemAlloc_v2`) is started {runs} times per side and setting,\n\
alternately directly (\"direct\") and with `LD_PRELOAD=libdilu_interposer.so`,\n\
`DILU_TENANT` (one shared tenant) and `DILU_MEM_LIMIT=64GiB` (\"dilu\"). Each time is\n\
`CLOCK_MONOTONIC` from just before the parent spawns the client to the client's first\n\
allocation returning, so process creation, exec and the driver's start-up are in both\n\
columns; \"added\" is the difference (of the p50s, of the p99s). For the dilu side that\n\
span holds all of the interposer's start-up: loading it and its constructor, resolving\n\
the driver's symbols, opening the tenant's ledger (with a scan of its members), joining\n\
it and starting the reclaim watcher thread. \"added before main\" is the part before the\n\
client's `main` (library loading and constructor). The other processes are\n\
`bench-client hold` under the interposer in the same tenant, each holding 1 MiB (so a\n\
slot in the ledger) until the run ends. The last column is the CPU time they used\n\
(summed process CPU clocks) per second of the measurement, while doing nothing but\n\
waiting: the interposer's reclaim watcher in each of them. They load the machine for\n\
both columns alike.\n\n\
HAMi-core for comparison (its start-up serialises on a global lock): 0.25 ms for 1\n\
process, 5.6 ms p50 for 64. Target here: ≤ 1 ms added per process, not growing with\n\
the number of processes running.\n\n\
{markdown}\n\
Distribution of every run: `startup-cdf.svg` (log x axis).\n",
        runs = options.runs,
        others = options
            .others
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
    );
    report::write_result("startup.md", &text);
    let svg_path: PathBuf = report::results_path("startup-cdf.svg");
    plot.write(&svg_path)
        .unwrap_or_else(|e| panic!("write {}: {e}", svg_path.display()));
    eprintln!("plot written to {}", svg_path.display());
}
