//! `real-overhead`: what the interposer adds to kernel launches and to
//! allocations on the real NVIDIA driver, measured through the `cudarc`
//! crate (which loads `libcuda` dynamically and `dlsym`s exact ABI names,
//! so under `LD_PRELOAD` it calls the interposer's wrappers).
//!
//! - `real-overhead measure`: one process; prints the median ns per
//!   `cuLaunchKernel` (no-op kernel, 1×1, null stream, timed in batches with
//!   a synchronise between batches, outside the timing) and per
//!   `cuMemAlloc_v2` + `cuMemFree_v2` pair (4 KiB).
//! - `real-overhead compare --interposer PATH`: runs `measure` in several
//!   processes, alternately directly and with `LD_PRELOAD=PATH` and a memory
//!   budget, and prints a markdown table (medians over processes; the added
//!   ns is the median of each dilu process's figure less the direct one run
//!   next to it, with the middle half of those differences; ratio). Every
//!   process runs on one CPU (`--cpu`, default the last this process may
//!   use). That removes one cause of the spread between processes, not all:
//!   on an H100 VM a launch's cost still differed by a few hundred ns from
//!   one process to the next, more than the interposer adds (`inprocess`
//!   is the measurement to read there). The interposer's own threads start
//!   on the same CPU, so their time counts against the dilu side here.
//!   `scripts/gpu-check.sh` runs it on hosts with a GPU.
//! - `real-overhead inprocess --interposer PATH`: the launch through the
//!   interposer and the driver's own `cuLaunchKernel` in one process, batch
//!   by batch in turn: the interposer's `dlsym` answers with its wrapper,
//!   the C library's own `dlsym` with the driver's function. Differences
//!   between processes (a few hundred ns on a real driver, more than the
//!   wrapper costs) then cancel; what is left is the wrapper's cost with
//!   its code and data as warm as a launch loop keeps them.
//!
//! Both sides inherit the environment, so on a host without a GPU
//! `LD_LIBRARY_PATH=<dir with libcuda.so → libsimgpu.so> SIMGPU_NULL=1`
//! runs the same comparison on simgpu (a smoke test of this program).

use cudarc::driver::{result, sys};
use dilu_bench::driver::{
    CtxSynchronize, LaunchKernel, Library, NOOP_PTX, launch_noop, monotonic_ns,
};
use dilu_bench::median;
use dilu_bench::report::{self, Table};
use std::ffi::{CString, c_void};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: real-overhead measure [--rounds R] [--batch B] [--cpu N]
       real-overhead compare --interposer PATH [--processes P] [--mem SIZE] [--sm PCT] [--rounds R] [--batch B] [--cpu N]
       real-overhead inprocess --interposer PATH [--processes P] [--mem SIZE] [--sm PCT] [--rounds R] [--batch B] [--cpu N]
  measure     time cuLaunchKernel and cuMemAlloc_v2+cuMemFree_v2 in this process
  compare     run `measure` P times (default 10) per side, alternately directly and with
              LD_PRELOAD=PATH DILU_MEM_LIMIT=SIZE (default 8GiB); print a markdown table
  inprocess   in each of P processes (default 3) under LD_PRELOAD=PATH, time batches of
              launches through the interposer and straight to the driver in turn
  --sm PCT    also give the dilu side an SM share (DILU_SM_LIMIT=PCT) and a bucket of the
              deepest depth (DILU_SM_ABLATE=depth=1s): the launch path with its budget check and
              sampling, never waiting for tokens (the cost of control, not of throttling)
  --cpu N     run on CPU N only (compare: every process; default the last CPU allowed)
  --rounds R  timed batches per measurement (default 200)
  --batch B   calls per timed batch (default 100)";

struct Measured {
    launch_ns: f64,
    alloc_free_ns: f64,
    interposed: bool,
    device: String,
}

fn interposer_loaded() -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|maps| maps.contains("libdilu_interposer"))
}

/// Restricts the calling thread, and threads it starts later, to `cpu`.
fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it
    // (cpu is checked against its size), and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            return Err(format!("CPU {cpu} is beyond the CPU set"));
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            return Err(format!(
                "cannot run on CPU {cpu}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    Ok(())
}

/// The highest-numbered CPU this process may run on.
fn last_allowed_cpu() -> Option<usize> {
    // SAFETY: sched_getaffinity fills the zeroed set; CPU_ISSET reads it
    // within its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) != 0 {
            return None;
        }
        (0..8 * std::mem::size_of::<libc::cpu_set_t>())
            .rev()
            .find(|&cpu| libc::CPU_ISSET(cpu, &set))
    }
}

fn measure(rounds: usize, batch: usize, cpu: Option<usize>) -> Result<Measured, String> {
    if let Some(cpu) = cpu {
        pin_to(cpu)?;
    }
    let e = |what: &str| {
        let what = what.to_string();
        move |error: result::DriverError| format!("{what}: {error:?}")
    };
    // cudarc panics when it finds no driver; say so plainly instead.
    if ["libcuda.so.1", "libcuda.so"]
        .iter()
        .all(|name| Library::open(Path::new(name)).is_err())
    {
        return Err("no CUDA driver found (neither libcuda.so.1 nor libcuda.so loads)".into());
    }
    result::init().map_err(e("cuInit"))?;
    let device = result::device::get(0).map_err(e("cuDeviceGet"))?;
    let name = result::device::get_name(device).map_err(e("cuDeviceGetName"))?;
    let ptx = CString::new(NOOP_PTX).expect("no NUL");
    // SAFETY: (block) cuda.h contracts: a device from cuDeviceGet, its primary
    // context made current, a NUL-terminated PTX image, and a kernel that
    // takes no parameters launched with none.
    let function = unsafe {
        let context = result::primary_ctx::retain(device).map_err(e("cuDevicePrimaryCtxRetain"))?;
        result::ctx::set_current(context).map_err(e("cuCtxSetCurrent"))?;
        let module =
            result::module::load_data(ptx.as_ptr().cast()).map_err(e("cuModuleLoadData"))?;
        result::module::get_function(module, CString::new("noop").expect("no NUL"))
            .map_err(e("cuModuleGetFunction"))?
    };
    let launch = || {
        let mut no_params: [*mut c_void; 0] = [];
        // SAFETY: see above; the null stream.
        unsafe {
            result::launch_kernel(
                function,
                (1, 1, 1),
                (1, 1, 1),
                0,
                std::ptr::null_mut::<sys::CUstream_st>(),
                &mut no_params,
            )
        }
        .map_err(e("cuLaunchKernel"))
    };
    let alloc_free = || {
        // SAFETY: allocates 4 KiB and frees exactly that pointer.
        unsafe {
            let pointer = result::malloc_sync(4096).map_err(e("cuMemAlloc_v2"))?;
            result::free_sync(pointer).map_err(e("cuMemFree_v2"))
        }
    };
    let per_call = |op: &dyn Fn() -> Result<(), String>| -> Result<f64, String> {
        // Warm-up (module load, first-launch set-up, allocator pools).
        for _ in 0..batch {
            op()?;
        }
        result::ctx::synchronize().map_err(e("cuCtxSynchronize"))?;
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = monotonic_ns();
            for _ in 0..batch {
                op()?;
            }
            samples.push((monotonic_ns() - started) as f64 / batch as f64);
            result::ctx::synchronize().map_err(e("cuCtxSynchronize"))?;
        }
        Ok(median(&mut samples))
    };
    Ok(Measured {
        launch_ns: per_call(&launch)?,
        alloc_free_ns: per_call(&alloc_free)?,
        interposed: interposer_loaded(),
        device: name,
    })
}

/// Launch cost through the interposer and straight to the driver, in one
/// process (medians over rounds, ns per call).
struct Paired {
    direct_ns: f64,
    dilu_ns: f64,
    added_ns: f64,
    added_p25_ns: f64,
    added_p75_ns: f64,
}

fn quartiles(sorted: &[f64]) -> (f64, f64) {
    let at = |q: usize| sorted[(q * (sorted.len() - 1)).div_ceil(4)];
    (at(1), at(3))
}

fn measure_inprocess(rounds: usize, batch: usize, cpu: Option<usize>) -> Result<Paired, String> {
    if let Some(cpu) = cpu {
        pin_to(cpu)?;
    }
    let driver = Library::open(Path::new("libcuda.so.1"))?;
    dilu_bench::driver::init_context(&driver)?;
    let function = dilu_bench::driver::load_noop(&driver)?;
    let through_dilu: LaunchKernel = driver.get("cuLaunchKernel");
    let direct: LaunchKernel = driver
        .get_unwrapped("cuLaunchKernel")
        .ok_or("the C library's own dlsym was not found")?;
    if through_dilu as usize == direct as usize {
        return Err("dlsym answered with the driver's own cuLaunchKernel: no interposer".into());
    }
    let synchronize: CtxSynchronize = driver.get("cuCtxSynchronize");
    let timed = |launch: LaunchKernel| -> Result<f64, String> {
        let started = monotonic_ns();
        for _ in 0..batch {
            let result = launch_noop(launch, function);
            if result != 0 {
                return Err(format!("cuLaunchKernel failed with CUresult {result}"));
            }
        }
        let per_call = (monotonic_ns() - started) as f64 / batch as f64;
        // SAFETY: cuCtxSynchronize takes no arguments; a context is current.
        let result = unsafe { synchronize() };
        if result != 0 {
            return Err(format!("cuCtxSynchronize failed with CUresult {result}"));
        }
        Ok(per_call)
    };
    // Warm-up: first-launch set-up, the interposer's first estimates.
    for _ in 0..10 {
        timed(through_dilu)?;
        timed(direct)?;
    }
    let (mut directs, mut dilus, mut added) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so a drift within a round hits both.
        let (d, i) = if round % 2 == 0 {
            let d = timed(direct)?;
            (d, timed(through_dilu)?)
        } else {
            let i = timed(through_dilu)?;
            (timed(direct)?, i)
        };
        directs.push(d);
        dilus.push(i);
        added.push(i - d);
    }
    added.sort_by(f64::total_cmp);
    let (added_p25_ns, added_p75_ns) = quartiles(&added);
    Ok(Paired {
        direct_ns: median(&mut directs),
        dilu_ns: median(&mut dilus),
        added_ns: median(&mut added),
        added_p25_ns,
        added_p75_ns,
    })
}

fn paired_line(p: &Paired) -> String {
    format!(
        "direct_ns={:.1} dilu_ns={:.1} added_ns={:.1} added_p25_ns={:.1} added_p75_ns={:.1}",
        p.direct_ns, p.dilu_ns, p.added_ns, p.added_p25_ns, p.added_p75_ns
    )
}

fn parse_paired(line: &str) -> Result<Paired, String> {
    let value = |key: &str| -> Result<f64, String> {
        line.split_whitespace()
            .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {key} in {line:?}"))
    };
    Ok(Paired {
        direct_ns: value("direct_ns")?,
        dilu_ns: value("dilu_ns")?,
        added_ns: value("added_ns")?,
        added_p25_ns: value("added_p25_ns")?,
        added_p75_ns: value("added_p75_ns")?,
    })
}

fn inprocess(options: &CompareOptions) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut table = Table::new(&[
        "process",
        "direct ns",
        "through dilu ns",
        "added ns",
        "added, middle half",
    ]);
    let mut added = Vec::new();
    for process in 0..options.processes {
        let mut command = Command::new(&exe);
        command
            .args(["measure-inprocess", "--rounds", &options.rounds.to_string()])
            .args(["--batch", &options.batch.to_string()])
            .env("LD_PRELOAD", &options.interposer)
            .env("DILU_MEM_LIMIT", &options.mem);
        if let Some(cpu) = options.cpu {
            command.args(["--cpu", &cpu.to_string()]);
        }
        if let Some(sm) = &options.sm {
            command
                .env("DILU_SM_LIMIT", sm)
                .env("DILU_SM_ABLATE", "depth=1s");
        }
        let output = command
            .output()
            .map_err(|e| format!("run measure-inprocess: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "measure-inprocess failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let p = parse_paired(String::from_utf8_lossy(&output.stdout).trim())?;
        added.push(p.added_ns);
        table.row(vec![
            (process + 1).to_string(),
            report::ns(p.direct_ns),
            report::ns(p.dilu_ns),
            format!("{:+.1}", p.added_ns),
            format!("{:+.0} to {:+.0}", p.added_p25_ns, p.added_p75_ns),
        ]);
    }
    Ok(format!(
        "No-op launches (1×1, null stream) in one process at a time, {cpu}, under\n\
`LD_PRELOAD={interposer}` `DILU_MEM_LIMIT={mem}`{sm}: {rounds} rounds of\n\
one batch of {batch} launches through the interposer and one straight to the driver\n\
(its own `cuLaunchKernel`, from the C library's `dlsym`), in turn; per process the\n\
medians over rounds, and the added ns the median of each round's difference.\n\
Median added over processes: {median_added:+.1} ns.\n\n{table}",
        cpu = options
            .cpu
            .map_or("on any CPU".to_string(), |cpu| format!("on CPU {cpu}")),
        interposer = options.interposer.display(),
        mem = options.mem,
        sm = options.sm.as_ref().map_or(String::new(), |sm| {
            format!(" `DILU_SM_LIMIT={sm}` `DILU_SM_ABLATE=depth=1s`")
        }),
        rounds = options.rounds,
        batch = options.batch,
        median_added = median(&mut added),
        table = table.markdown()
    ))
}

fn measured_line(m: &Measured) -> String {
    format!(
        "launch_ns={:.1} alloc_free_ns={:.1} interposed={} device={}",
        m.launch_ns,
        m.alloc_free_ns,
        m.interposed,
        m.device.replace(' ', "_")
    )
}

fn parse_measured(line: &str) -> Result<Measured, String> {
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("no {name} in {line:?}"))
    };
    let number = |name: &str| -> Result<f64, String> {
        field(name)?
            .parse()
            .map_err(|_| format!("bad {name} in {line:?}"))
    };
    Ok(Measured {
        launch_ns: number("launch_ns")?,
        alloc_free_ns: number("alloc_free_ns")?,
        interposed: field("interposed")? == "true",
        device: field("device")?.replace('_', " "),
    })
}

struct CompareOptions {
    interposer: PathBuf,
    processes: usize,
    mem: String,
    sm: Option<String>,
    rounds: usize,
    batch: usize,
    cpu: Option<usize>,
}

fn run_side(options: &CompareOptions, dilu: bool) -> Result<Measured, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.args([
        "measure",
        "--rounds",
        &options.rounds.to_string(),
        "--batch",
        &options.batch.to_string(),
    ]);
    if let Some(cpu) = options.cpu {
        command.args(["--cpu", &cpu.to_string()]);
    }
    if dilu {
        command
            .env("LD_PRELOAD", &options.interposer)
            .env("DILU_MEM_LIMIT", &options.mem);
        if let Some(sm) = &options.sm {
            command
                .env("DILU_SM_LIMIT", sm)
                .env("DILU_SM_ABLATE", "depth=1s");
        }
    } else {
        command.env_remove("LD_PRELOAD");
    }
    let output = command.output().map_err(|e| format!("run measure: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "measure ({}) failed: {}",
            if dilu {
                "with the interposer"
            } else {
                "direct"
            },
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let measured = parse_measured(String::from_utf8_lossy(&output.stdout).trim())?;
    if measured.interposed != dilu {
        return Err(format!(
            "the {} side {} the interposer loaded",
            if dilu { "dilu" } else { "direct" },
            if dilu { "did not have" } else { "had" }
        ));
    }
    Ok(measured)
}

fn compare(options: &CompareOptions) -> Result<String, String> {
    let (mut direct, mut dilu) = (Vec::new(), Vec::new());
    for process in 0..options.processes {
        // Alternate which side goes first, so drift hits both alike.
        for side in [!process.is_multiple_of(2), process.is_multiple_of(2)] {
            let measured = run_side(options, side)?;
            if side { &mut dilu } else { &mut direct }.push(measured);
        }
    }
    let device = direct[0].device.clone();
    let mut table = Table::new(&[
        "call",
        "direct ns",
        "through dilu ns",
        "added ns",
        "added, middle half",
        "ratio",
    ]);
    let launch = |m: &Measured| m.launch_ns;
    let alloc_free = |m: &Measured| m.alloc_free_ns;
    let rows = [
        (
            "cuLaunchKernel (no-op, 1×1, null stream)",
            launch as fn(&Measured) -> f64,
        ),
        ("cuMemAlloc_v2 + cuMemFree_v2 (4 KiB, budgeted)", alloc_free),
    ];
    for (label, of) in rows {
        let d = median(&mut direct.iter().map(of).collect::<Vec<_>>());
        let i = median(&mut dilu.iter().map(of).collect::<Vec<_>>());
        // Each dilu process against the direct one run beside it.
        let mut added: Vec<f64> = dilu
            .iter()
            .zip(&direct)
            .map(|(i, d)| of(i) - of(d))
            .collect();
        added.sort_by(f64::total_cmp);
        let quarter = |q: usize| added[(q * (added.len() - 1)).div_ceil(4)];
        table.row(vec![
            label.into(),
            report::ns(d),
            report::ns(i),
            format!("{:+.1}", median(&mut added.clone())),
            format!("{:+.0} to {:+.0}", quarter(1), quarter(3)),
            format!("{:.3}", i / d),
        ]);
    }
    Ok(format!(
        "Device: {device}. {processes} processes per side, alternating, each on {cpu}; each\n\
process takes the median of {rounds} batches of {batch} calls (ns per call); cells are the\n\
median over processes, and the added ns the median of each dilu process's figure less the\n\
direct one's run beside it. The dilu side runs with `LD_PRELOAD={interposer}`,\n\
`DILU_MEM_LIMIT={mem}`{sm}.\n\n{table}",
        cpu = options
            .cpu
            .map_or("any CPU".to_string(), |cpu| format!("CPU {cpu}")),
        processes = options.processes,
        rounds = options.rounds,
        batch = options.batch,
        interposer = options.interposer.display(),
        mem = options.mem,
        sm = options.sm.as_ref().map_or(String::new(), |sm| {
            format!(" and `DILU_SM_LIMIT={sm}` `DILU_SM_ABLATE=depth=1s`")
        }),
        table = table.markdown()
    ))
}

enum Mode {
    Measure {
        rounds: usize,
        batch: usize,
        cpu: Option<usize>,
    },
    Compare(CompareOptions),
    MeasureInprocess {
        rounds: usize,
        batch: usize,
        cpu: Option<usize>,
    },
    Inprocess(CompareOptions),
}

fn parse_options() -> Result<Mode, String> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().ok_or("a mode is required")?;
    let (mut rounds, mut batch, mut processes) = (200, 100, 10);
    let mut cpu = None;
    let mut processes_given = None;
    let (mut interposer, mut mem, mut sm) = (None, "8GiB".to_string(), None);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let count = || {
            value
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("bad {flag} {value:?}: a positive count"))
        };
        match flag.as_str() {
            "--rounds" => rounds = count()?,
            "--batch" => batch = count()?,
            "--processes" => {
                processes = count()?;
                processes_given = Some(processes);
            }
            "--interposer" => interposer = Some(PathBuf::from(&value)),
            "--mem" => mem = value,
            "--sm" => sm = Some(value),
            "--cpu" => {
                cpu = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| format!("bad --cpu {value:?}: a CPU number"))?,
                )
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    match mode.as_str() {
        "measure" => Ok(Mode::Measure { rounds, batch, cpu }),
        "measure-inprocess" => Ok(Mode::MeasureInprocess { rounds, batch, cpu }),
        "compare" | "inprocess" => {
            let interposer = interposer.ok_or("compare needs --interposer PATH")?;
            if !interposer.exists() {
                return Err(format!("no interposer at {}", interposer.display()));
            }
            let options = CompareOptions {
                interposer,
                processes,
                mem,
                sm,
                rounds,
                batch,
                cpu: cpu.or_else(last_allowed_cpu),
            };
            Ok(if mode == "compare" {
                Mode::Compare(options)
            } else {
                Mode::Inprocess(CompareOptions {
                    processes: processes_given.unwrap_or(3),
                    ..options
                })
            })
        }
        "--help" | "-h" => {
            println!("{USAGE}");
            std::process::exit(0);
        }
        other => Err(format!("unknown mode {other:?}")),
    }
}

fn main() -> ExitCode {
    dilu_bench::cli::main("real-overhead", USAGE, parse_options, |mode| match mode {
        Mode::Measure { rounds, batch, cpu } => {
            measure(rounds, batch, cpu).map(|m| measured_line(&m))
        }
        Mode::Compare(options) => compare(&options),
        Mode::MeasureInprocess { rounds, batch, cpu } => {
            measure_inprocess(rounds, batch, cpu).map(|p| paired_line(&p))
        }
        Mode::Inprocess(options) => inprocess(&options),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_lines_round_trip() {
        let p = Paired {
            direct_ns: 3800.5,
            dilu_ns: 3833.7,
            added_ns: 33.2,
            added_p25_ns: -216.0,
            added_p75_ns: 294.0,
        };
        let back = parse_paired(&paired_line(&p)).unwrap();
        assert_eq!(back.added_ns, 33.2);
        assert_eq!(back.added_p25_ns, -216.0);
        assert_eq!(back.dilu_ns, 3833.7);
        assert!(parse_paired("direct_ns=1 dilu_ns=2").is_err());
        assert_eq!(quartiles(&[1.0, 2.0, 3.0, 4.0, 5.0]), (2.0, 4.0));
    }

    #[test]
    fn measured_lines_round_trip() {
        let line = "launch_ns=2301.5 alloc_free_ns=5120.0 interposed=true device=NVIDIA_H200";
        let m = parse_measured(line).unwrap();
        assert_eq!(m.launch_ns, 2301.5);
        assert_eq!(m.alloc_free_ns, 5120.0);
        assert!(m.interposed);
        assert_eq!(m.device, "NVIDIA H200");
        assert!(parse_measured("launch_ns=1 interposed=false device=x").is_err());
        assert!(parse_measured("launch_ns=x alloc_free_ns=1 interposed=false device=x").is_err());
    }
}
