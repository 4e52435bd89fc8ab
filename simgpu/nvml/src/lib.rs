//! simgpu-nvml: a simulated NVML (`libnvidia-ml.so.1`) that reads the same
//! shared device state as simgpu's driver (see README.md).
//!
//! It opens the instance named by `SIMGPU_INSTANCE` as an observer (no
//! process slot: an NVML client is not a CUDA process) and answers from it:
//! devices and their identity ([`identity`], shared with the driver), memory
//! and per-process usage ([`shm`]), utilisation sampled from busy-time
//! counters ([`sampler`]). Exports are in [`api`]; [`stubs`] answers
//! `NVML_ERROR_NOT_SUPPORTED` for the rest of the commonly used surface.

// The driver's own modules, included so both libraries read one layout.
#[allow(dead_code)]
#[path = "../../src/call_costs.rs"]
mod call_costs;
#[allow(dead_code)]
#[path = "../../src/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../../src/identity.rs"]
mod identity;
#[allow(dead_code)]
#[path = "../../src/shm.rs"]
mod shm;
#[allow(dead_code)]
#[path = "../../src/shm_exports.rs"]
mod shm_exports;

pub mod api;
mod sampler;
mod state;
pub mod stubs;

use std::ffi::c_uint;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Internal result: `Err` carries the NVML status to return.
pub(crate) type Res<T = ()> = Result<T, NvmlReturn>;

/// Runs an entry point's body; a panic becomes `NVML_ERROR_UNKNOWN` instead
/// of unwinding into the C caller.
pub(crate) fn guard(f: impl FnOnce() -> Res) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the clock the driver's timeline uses).
pub(crate) fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME in microseconds (NVML's sample time stamps).
pub(crate) fn realtime_us() -> u64 {
    clock_ns(libc::CLOCK_REALTIME) / 1_000
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
