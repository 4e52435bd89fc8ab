//! `bench-client`: a minimal CUDA driver client for the process-level
//! benchmarks. It opens the driver by path the way cudart opens
//! `libcuda.so.1` and takes every entry point with `dlsym`, so run under
//! `LD_PRELOAD=libdilu_interposer.so` its calls go through the interposer.
//!
//! Modes (all print one line on stdout):
//! - `startup`: `cuInit`, primary context, one `cuMemAlloc_v2`; prints the
//!   `CLOCK_MONOTONIC` time (ns) at `main`, after `cuInit` and after the
//!   first allocation returned, for `benches/startup.rs`.
//! - `hold`: as `startup`, then prints `ready` and keeps the allocation (and
//!   its place in the tenant's ledger) until stdin closes.
//! - `launches N`: loads a no-op kernel, allocates (joining the ledger),
//!   then launches it N times on the null stream between two marker calls
//!   `write(-1, "dilu-launch-loop-start"/"-end")` that fail with EBADF, so a
//!   syscall trace can isolate the loop (`scripts/syscalls.sh`).

use dilu_bench::driver::{self, Library, MemAlloc, MemFree};
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str =
    "usage: bench-client (startup | hold | launches N) --driver PATH [--bytes B] [--warm-up W]
  startup      print main_ns=.. init_ns=.. alloc_ns=.. (CLOCK_MONOTONIC) and exit
  hold         allocate, print ready, keep the allocation until stdin closes
  launches N   launch a no-op kernel N times between two marker syscalls
  --driver     the CUDA driver library to dlopen (libcuda.so.1, libsimgpu.so)
  --bytes      size of the allocation (default 1048576)
  --warm-up    launches before the first marker (default 1): lazy set-up, and under an
               SM-time share the first measurements and sampling backing off";

const START_MARKER: &[u8] = b"dilu-launch-loop-start";
const END_MARKER: &[u8] = b"dilu-launch-loop-end";

enum Mode {
    Startup,
    Hold,
    Launches(u64),
}

struct Options {
    mode: Mode,
    driver: PathBuf,
    bytes: usize,
    warm_up: u64,
}

fn parse_options() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mode = match args.next().as_deref() {
        Some("startup") => Mode::Startup,
        Some("hold") => Mode::Hold,
        Some("launches") => {
            let n = args.next().ok_or("launches needs a count")?;
            Mode::Launches(n.parse().map_err(|_| format!("bad launch count {n:?}"))?)
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            std::process::exit(0);
        }
        Some(other) => return Err(format!("unknown mode {other:?}")),
        None => return Err("a mode is required".into()),
    };
    let (mut driver, mut bytes, mut warm_up) = (None, 1 << 20, 1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--driver" => driver = Some(PathBuf::from(value)),
            "--bytes" => {
                bytes = value
                    .parse()
                    .map_err(|_| format!("bad --bytes {value:?}"))?
            }
            "--warm-up" => {
                warm_up = value
                    .parse()
                    .map_err(|_| format!("bad --warm-up {value:?}"))?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(Options {
        mode,
        driver: driver.ok_or("--driver is required")?,
        bytes,
        warm_up,
    })
}

/// A marker syscall: `write` on fd -1 fails with EBADF and does nothing.
fn marker(text: &[u8]) {
    // SAFETY: write(2) with an invalid descriptor only reads nothing and fails.
    unsafe { libc::write(-1, text.as_ptr().cast(), text.len()) };
}

fn allocate(driver: &Library, bytes: usize) -> Result<u64, String> {
    let mut pointer = 0u64;
    // SAFETY: cuMemAlloc_v2 with a live out-parameter.
    let result = unsafe { driver.get::<MemAlloc>("cuMemAlloc_v2")(&mut pointer, bytes) };
    if result != 0 {
        return Err(format!(
            "cuMemAlloc_v2({bytes}) failed with CUresult {result}"
        ));
    }
    Ok(pointer)
}

fn free(driver: &Library, pointer: u64) {
    // SAFETY: frees the pointer this program allocated.
    unsafe { driver.get::<MemFree>("cuMemFree_v2")(pointer) };
}

fn run(options: &Options) -> Result<String, String> {
    let main_ns = driver::monotonic_ns();
    let cuda = Library::open(&options.driver)?;
    match options.mode {
        Mode::Startup | Mode::Hold => {
            driver::init_context(&cuda)?;
            let init_ns = driver::monotonic_ns();
            let pointer = allocate(&cuda, options.bytes)?;
            let alloc_ns = driver::monotonic_ns();
            if let Mode::Hold = options.mode {
                println!("ready");
                let mut sink = Vec::new();
                let _ = std::io::stdin().read_to_end(&mut sink);
            }
            free(&cuda, pointer);
            Ok(format!(
                "main_ns={main_ns} init_ns={init_ns} alloc_ns={alloc_ns}"
            ))
        }
        Mode::Launches(count) => {
            driver::init_context(&cuda)?;
            let function = driver::load_noop(&cuda)?;
            let launch = cuda.get("cuLaunchKernel");
            let pointer = allocate(&cuda, options.bytes)?;
            // Launches first, so any lazy set-up happens before the loop.
            for _ in 0..options.warm_up.max(1) {
                let first = driver::launch_noop(launch, function);
                if first != 0 {
                    return Err(format!("cuLaunchKernel failed with CUresult {first}"));
                }
            }
            let mut failed = 0u64;
            marker(START_MARKER);
            for _ in 0..count {
                failed += u64::from(driver::launch_noop(launch, function) != 0);
            }
            marker(END_MARKER);
            free(&cuda, pointer);
            if failed > 0 {
                return Err(format!("{failed} of {count} launches failed"));
            }
            Ok(format!("launched {count}"))
        }
    }
}

fn main() -> ExitCode {
    dilu_bench::cli::main("bench-client", USAGE, parse_options, |options| {
        run(&options)
    })
}
