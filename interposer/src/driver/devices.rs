//! Which device a call is about: the number of devices the real driver
//! reports, and the device of the calling thread's current context. Shared
//! by the memory budget and the SM-time control.

use crate::driver;
use dilu_abi::cuda::{CUDA_SUCCESS, CUresult, sys};
use dilu_layout::ledger::MAX_DEVICES;
use std::ffi::c_int;

/// The number of devices the real driver reports (1 when it cannot say),
/// initialising the driver first (`cuInit` is idempotent; our state may be
/// set up by the program's first memory call or launch).
pub fn real_device_count() -> usize {
    type InitFn = unsafe extern "C" fn(u32) -> CUresult;
    type CountFn = unsafe extern "C" fn(*mut c_int) -> CUresult;
    let init = driver::real_symbol(c"cuInit");
    if init != 0 {
        // SAFETY: cuInit(unsigned int) from cuda.h; flags must be 0.
        unsafe { std::mem::transmute::<usize, InitFn>(init)(0) };
    }
    let address = driver::real_symbol(c"cuDeviceGetCount");
    if address == 0 {
        return 1;
    }
    // SAFETY: cuDeviceGetCount(int*) from cuda.h, resolved from the real driver.
    let count_fn: CountFn = unsafe { std::mem::transmute::<usize, CountFn>(address) };
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
    ctx_get_device: usize,
}

impl CurrentDevice {
    pub fn new(device_count: usize) -> Self {
        CurrentDevice {
            ctx_get_device: if device_count > 1 {
                driver::real_symbol(c"cuCtxGetDevice")
            } else {
                0
            },
        }
    }

    #[inline]
    pub fn get(&self) -> usize {
        if self.ctx_get_device == 0 {
            return 0;
        }
        type Fn = unsafe extern "C" fn(*mut sys::CUdevice) -> CUresult;
        // SAFETY: the real cuCtxGetDevice, signature from cuda.h.
        let get_device: Fn = unsafe { std::mem::transmute::<usize, Fn>(self.ctx_get_device) };
        let mut device: sys::CUdevice = 0;
        // SAFETY: writes one CUdevice to a live local.
        if unsafe { get_device(&mut device) } == CUDA_SUCCESS {
            (device as usize).min(MAX_DEVICES - 1)
        } else {
            0
        }
    }
}
