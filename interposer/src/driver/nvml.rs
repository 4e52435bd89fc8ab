//! The real NVML, as the interposer reaches it: a handle of
//! `libnvidia-ml.so.1` opened lazily on first use (glibc returns the library
//! the program already loaded), its functions found with the real `dlsym`
//! on that handle, and the NVML device at a CUDA device's PCI location.
//! Used by the NVML memory answers ([`crate::memory::nvml`]) and by usage
//! feedback ([`crate::sm_time::usage_feedback`]).

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use dilu_abi::cuda::CUDA_SUCCESS;
use dilu_abi::cuda::sys::{CUdevice, CUdevice_attribute};

use crate::driver;

/// `nvmlReturn_t`.
pub type NvmlReturn = c_uint;
/// `nvmlDevice_t` (opaque handle).
pub type NvmlDevice = *mut c_void;

pub(crate) const NVML_SUCCESS: NvmlReturn = 0;
pub(crate) const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;

/// `nvmlPciInfo_t` (nvml.h; the numeric fields sit at the same offsets in
/// every version of the struct, and this is the largest).
#[repr(C)]
struct NvmlPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    bus_id: [c_char; 32],
}

/// The `dlopen` handle of the real NVML (0 until opened).
static HANDLE: AtomicUsize = AtomicUsize::new(0);

/// The real NVML's `name`, or 0. Opens `libnvidia-ml.so.1` on first use.
pub(crate) fn real_symbol(name: &CStr) -> usize {
    let mut handle = HANDLE.load(Ordering::Acquire);
    if handle == 0 {
        // SAFETY: NUL-terminated literal; dlopen has no other preconditions.
        handle = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        } as usize;
        if handle == 0 {
            return 0;
        }
        // Racing openers got the same library (dlopen counts references).
        HANDLE.store(handle, Ordering::Release);
    }
    driver::real_dlsym(handle as *mut c_void, name.as_ptr()) as usize
}

/// PCI (domain, bus, device) of CUDA device `ordinal`, from the real driver.
pub(crate) fn cuda_pci_location(ordinal: CUdevice) -> Option<(u32, u32, u32)> {
    type Fn = unsafe extern "C" fn(*mut c_int, CUdevice_attribute, CUdevice) -> u32;
    let address = driver::real_symbol(c"cuDeviceGetAttribute");
    if address == 0 {
        return None;
    }
    // SAFETY: cuDeviceGetAttribute from cuda.h, from the real driver.
    let get: Fn = unsafe { core::mem::transmute::<usize, Fn>(address) };
    let attribute = |which| {
        let mut value: c_int = 0;
        // SAFETY: writes one int to a live local.
        (unsafe { get(&mut value, which, ordinal) } == CUDA_SUCCESS).then_some(value as u32)
    };
    use CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as BUS, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID as DEVICE,
        CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID as DOMAIN,
    };
    Some((attribute(DOMAIN)?, attribute(BUS)?, attribute(DEVICE)?))
}

/// The real NVML's handle of the GPU at PCI `location` (initialising NVML
/// for this process: `nvmlInit` counts references, so the program's own
/// use of NVML is unaffected).
pub(crate) fn nvml_device_at(location: (u32, u32, u32)) -> Option<NvmlDevice> {
    type InitFn = unsafe extern "C" fn() -> NvmlReturn;
    type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
    type HandleFn = unsafe extern "C" fn(c_uint, *mut NvmlDevice) -> NvmlReturn;
    let (init, count, handle) = (
        real_symbol(c"nvmlInit_v2"),
        real_symbol(c"nvmlDeviceGetCount_v2"),
        real_symbol(c"nvmlDeviceGetHandleByIndex_v2"),
    );
    if init == 0 || count == 0 || handle == 0 {
        return None;
    }
    // SAFETY: (all three) nvml.h's signatures, from the real NVML; the out
    // parameters are live locals.
    unsafe {
        if core::mem::transmute::<usize, InitFn>(init)() != NVML_SUCCESS {
            return None;
        }
        let mut n: c_uint = 0;
        if core::mem::transmute::<usize, CountFn>(count)(&mut n) != NVML_SUCCESS {
            return None;
        }
        (0..n).find_map(|i| {
            let mut device: NvmlDevice = core::ptr::null_mut();
            (core::mem::transmute::<usize, HandleFn>(handle)(i, &mut device) == NVML_SUCCESS
                && nvml_pci_location(device) == Some(location))
            .then_some(device)
        })
    }
}

/// PCI (domain, bus, device) of an NVML device.
pub(crate) fn nvml_pci_location(device: NvmlDevice) -> Option<(u32, u32, u32)> {
    type Fn = unsafe extern "C" fn(NvmlDevice, *mut NvmlPciInfo) -> NvmlReturn;
    static ADDRESS: OnceLock<usize> = OnceLock::new();
    let address = *ADDRESS.get_or_init(|| {
        [
            c"nvmlDeviceGetPciInfo_v3",
            c"nvmlDeviceGetPciInfo_v2",
            c"nvmlDeviceGetPciInfo",
        ]
        .into_iter()
        .map(real_symbol)
        .find(|&p| p != 0)
        .unwrap_or(0)
    });
    if address == 0 {
        return None;
    }
    // SAFETY: nvmlDeviceGetPciInfo* from nvml.h, from the real NVML; all
    // versions fill a prefix of this (largest) layout.
    let get: Fn = unsafe { core::mem::transmute::<usize, Fn>(address) };
    // SAFETY: plain integers and byte arrays; all-zero is valid.
    let mut info: NvmlPciInfo = unsafe { core::mem::zeroed() };
    // SAFETY: `device` is the handle the caller just used successfully;
    // `info` is a live, large enough out-parameter.
    (unsafe { get(device, &mut info) } == NVML_SUCCESS).then_some((
        info.domain,
        info.bus,
        info.device,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_info_layout_matches_nvml_h() {
        assert_eq!(core::mem::offset_of!(NvmlPciInfo, domain), 16);
        assert_eq!(core::mem::size_of::<NvmlPciInfo>(), 68);
    }
}
