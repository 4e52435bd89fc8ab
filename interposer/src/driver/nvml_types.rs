//! NVML's C types that the interposer passes to and from the real NVML
//! (nvml.h), apart from the functions that use them (`nvml.rs`) so that the
//! generated function types (`nvml_api.rs`) can name them.

use core::ffi::{c_char, c_uint, c_void};

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;
/// `nvmlDevice_t` (opaque handle).
pub type NvmlDevice = *mut c_void;

/// `nvmlPciInfo_t` (nvml.h; the numeric fields sit at the same offsets in
/// every version of the struct, and this is the largest).
#[repr(C)]
pub struct NvmlPciInfo {
    pub(super) bus_id_legacy: [c_char; 16],
    pub(super) domain: c_uint,
    pub(super) bus: c_uint,
    pub(super) device: c_uint,
    pub(super) pci_device_id: c_uint,
    pub(super) pci_subsystem_id: c_uint,
    pub(super) bus_id: [c_char; 32],
}

/// `nvmlMemory_t` (nvml.h).
#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t` (nvml.h): `version` is `nvmlMemory_v2`
/// (`sizeof | 2 << 24`).
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessUtilizationSample_t` (nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessUtilizationSample {
    pub pid: u32,
    pub time_stamp_us: u64,
    pub sm_util: u32,
    pub mem_util: u32,
    pub enc_util: u32,
    pub dec_util: u32,
}
