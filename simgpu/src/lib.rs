//! simgpu: a simulated CUDA driver (see README.md).
//!
//! The exported `extern "C"` functions live in [`api`]; every one of them runs
//! its body through [`guard`], so a panic never unwinds into the caller. The
//! exported-symbol table that `cuGetProcAddress` answers from is
//! [`proc_table`], generated from one declarative list.

pub mod api;
mod call_costs;
mod config;
mod driver;
mod elf;
mod engine;
mod exec;
mod export_tables;
mod fatbin;
mod host_cost;
mod identity;
mod integrity;
mod memory;
mod proc_table;
mod serial_timeline;
mod shm;
mod shm_exports;
mod timeslice;
mod trace;

use dilu_abi::cuda::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CUresult};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Internal result type: `Err` carries the CUDA status to return.
pub(crate) type Res<T = ()> = Result<T, CUresult>;

/// Entry points that still work in a forked child (they touch no driver
/// state): versions, error strings and symbol look-ups.
const WORK_AFTER_FORK: [&str; 5] = [
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
];

/// Runs an entry point's body; maps `Err(code)` to `code` and a panic to
/// `CUDA_ERROR_UNKNOWN`. In a child forked after initialisation every other
/// call fails with `CUDA_ERROR_NOT_INITIALIZED`, as with NVIDIA's driver.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> Res) -> CUresult {
    let forked = driver::forked() && !WORK_AFTER_FORK.contains(&name);
    let result = if forked {
        Ok(Err(dilu_abi::cuda::CUDA_ERROR_NOT_INITIALIZED))
    } else {
        catch_unwind(AssertUnwindSafe(f))
    };
    let code = match result {
        Ok(Ok(())) => return CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => CUDA_ERROR_UNKNOWN,
    };
    if log_errors() {
        eprintln!("simgpu: {name} -> {code}");
    }
    code
}

/// Whether failed calls are logged (`SIMGPU_LOG_ERRORS=1`).
pub(crate) fn log_errors() -> bool {
    static LOG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOG.get_or_init(|| std::env::var_os("SIMGPU_LOG_ERRORS").is_some_and(|v| v == "1"))
}

/// CLOCK_MONOTONIC in nanoseconds: the one clock every process shares.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Makes the calling thread's timed sleeps end when asked: Linux lets a
/// normal thread's timer fire up to 50 µs late (its timer slack), which on a
/// simulated device would add up to 50 µs of idle time after every kernel
/// a synchronising program waits for. A GPU ends a kernel at its end time.
/// Only simgpu's own threads (device engines and stream workers) call this.
pub(crate) fn exact_timers_for_this_thread() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only the
    // calling thread's timer slack; failure leaves the default.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// Sleeps until the absolute CLOCK_MONOTONIC time `deadline_ns`.
pub(crate) fn sleep_until(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remaining-time pointer may be
        // null for TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}
