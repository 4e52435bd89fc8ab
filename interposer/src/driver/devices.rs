//! Which device a call is about: how many devices the program's CUDA sees,
//! their memory, and the device of the calling thread's current context.
//! Shared by the memory budget and the SM-time control.
//!
//! None of this initialises the driver: a process that initialised CUDA
//! cannot use it in a child it forks, so a `cuInit` of ours (say while
//! answering an NVML query, before the program forks its workers) would
//! break the program's children. Before the program's own `cuInit` the
//! answers come from NVML.

use crate::driver;
use crate::driver::nvml;
use crate::table::{PFN_cuCtxGetDevice, REAL};
use dilu_abi::cuda::{CUDA_SUCCESS, sys};
use dilu_layout::ledger::MAX_DEVICES;
use std::ffi::c_int;

/// The driver's device count, or `None` while the program has not
/// initialised it (`cuDeviceGetCount` answers `CUDA_ERROR_NOT_INITIALIZED`
/// then, and initialises nothing) or there is no driver.
pub fn initialised_device_count() -> Option<usize> {
    let count_fn = driver::resolved(&REAL.cuDeviceGetCount)?;
    let mut count: c_int = 0;
    // SAFETY: writes one int to a live local.
    (unsafe { count_fn(&mut count) } == CUDA_SUCCESS).then_some(count.max(0) as usize)
}

/// How many devices the program's CUDA sees (at least 1, at most
/// [`MAX_DEVICES`]): the driver's count once the program has initialised
/// it, else NVML's GPUs that `CUDA_VISIBLE_DEVICES` selects, else
/// [`MAX_DEVICES`] (the current device is then asked of the driver).
pub fn cuda_device_count() -> usize {
    initialised_device_count()
        .or_else(|| nvml::cuda_visible_nvml_devices().map(|devices| devices.len()))
        .unwrap_or(MAX_DEVICES)
        .clamp(1, MAX_DEVICES)
}

/// Total memory of CUDA device `ordinal`: the driver's
/// (`cuDeviceTotalMem`) once the program has initialised it, else NVML's
/// for the GPU at that place among those CUDA sees.
pub fn total_memory(ordinal: usize) -> Option<u64> {
    if let Some(total_fn) = driver::resolved(&REAL.cuDeviceTotalMem_v2) {
        let mut bytes = 0usize;
        // SAFETY: the real cuDeviceTotalMem_v2; writes one size_t to a
        // live local. Before cuInit it fails and initialises nothing.
        if unsafe { total_fn(&mut bytes, ordinal as sys::CUdevice) } == CUDA_SUCCESS {
            return Some(bytes as u64);
        }
    }
    let devices = nvml::cuda_visible_nvml_devices()?;
    nvml::nvml_total_memory(*devices.get(ordinal)?)
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
