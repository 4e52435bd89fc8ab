//! Which device a call is about: the number of devices the real driver
//! reports, and the device of the calling thread's current context. Shared
//! by the memory budget and the SM-time control.

use crate::driver;
use crate::table::{PFN_cuCtxGetDevice, REAL};
use dilu_abi::cuda::{CUDA_SUCCESS, sys};
use dilu_layout::ledger::MAX_DEVICES;
use std::ffi::c_int;

/// The number of devices the real driver reports (1 when it cannot say),
/// initialising the driver first (`cuInit` is idempotent; our state may be
/// set up by the program's first memory call or launch).
pub fn real_device_count() -> usize {
    if let Some(init) = driver::resolved(&REAL.cuInit) {
        // SAFETY: the real cuInit; flags must be 0.
        unsafe { init(0) };
    }
    let Some(count_fn) = driver::resolved(&REAL.cuDeviceGetCount) else {
        return 1;
    };
    let mut count: c_int = 0;
    // SAFETY: writes one int to a live local.
    if unsafe { count_fn(&mut count) } == CUDA_SUCCESS && count > 0 {
        (count as usize).min(MAX_DEVICES)
    } else {
        1
    }
}

/// Finds the device of the current context. On a process with one device
/// it never asks the driver.
pub struct CurrentDevice {
    ctx_get_device: Option<PFN_cuCtxGetDevice>,
}

impl CurrentDevice {
    pub fn new(device_count: usize) -> Self {
        CurrentDevice {
            ctx_get_device: if device_count > 1 {
                driver::resolved(&REAL.cuCtxGetDevice)
            } else {
                None
            },
        }
    }

    #[inline]
    pub fn get(&self) -> usize {
        let Some(get_device) = self.ctx_get_device else {
            return 0;
        };
        let mut device: sys::CUdevice = 0;
        // SAFETY: writes one CUdevice to a live local.
        if unsafe { get_device(&mut device) } == CUDA_SUCCESS {
            (device as usize).min(MAX_DEVICES - 1)
        } else {
            0
        }
    }
}
