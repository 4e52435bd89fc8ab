//! The real NVML, as the interposer reaches it: a handle of
//! `libnvidia-ml.so.1` opened lazily on first use (glibc returns the library
//! the program already loaded), its functions found with the real `dlsym`
//! on that handle, and the NVML device at a CUDA device's PCI location.
//! Used by the NVML memory answers ([`crate::memory::nvml`]) and by usage
//! feedback ([`crate::sm_time::usage_feedback`]).

use core::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use dilu_abi::cuda::CUDA_SUCCESS;
use dilu_abi::cuda::sys::{CUdevice, CUdevice_attribute};

pub use crate::driver::nvml_api::*;
pub use crate::driver::nvml_types::*;

use crate::driver;
use crate::table::{REAL, RealFn};

pub(crate) const NVML_SUCCESS: NvmlReturn = 0;
pub(crate) const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;

/// The `dlopen` handle of the real NVML (0 until opened).
static HANDLE: AtomicUsize = AtomicUsize::new(0);

/// The real NVML's `name`, or 0. Opens `libnvidia-ml.so.1` on first use.
fn real_symbol(name: &CStr) -> usize {
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
    let get = driver::resolved(&REAL.cuDeviceGetAttribute)?;
    let attribute = |which: CUdevice_attribute| {
        let mut value: c_int = 0;
        // SAFETY: the real cuDeviceGetAttribute; writes one int to a live
        // local.
        (unsafe { get(&mut value, which as c_uint, ordinal) } == CUDA_SUCCESS)
            .then_some(value as u32)
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
    let nvml = real_nvml();
    let init = nvml.nvmlInit_v2()?;
    let count = nvml.nvmlDeviceGetCount_v2()?;
    let handle = nvml.nvmlDeviceGetHandleByIndex_v2()?;
    // SAFETY: the real NVML's functions; the out parameters are live locals.
    unsafe {
        if init() != NVML_SUCCESS {
            return None;
        }
        let mut n: c_uint = 0;
        if count(&mut n) != NVML_SUCCESS {
            return None;
        }
        (0..n).find_map(|i| {
            let mut device: NvmlDevice = core::ptr::null_mut();
            (handle(i, &mut device) == NVML_SUCCESS && nvml_pci_location(device) == Some(location))
                .then_some(device)
        })
    }
}

/// NVML's GPUs that the program's CUDA can see, in CUDA's order, found
/// without the CUDA driver (which must not be initialised on the program's
/// behalf: a process forked after that cannot use CUDA). NVML numbers GPUs
/// in PCI bus order; CUDA does too with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and
/// by default (fastest first) on a node of identical GPUs. `None` when NVML
/// cannot answer or `CUDA_VISIBLE_DEVICES` names GPUs by UUID or MIG
/// instance: then only the initialised driver can tell.
pub(crate) fn cuda_visible_nvml_devices() -> Option<Vec<NvmlDevice>> {
    let nvml = real_nvml();
    let init = nvml.nvmlInit_v2()?;
    let count = nvml.nvmlDeviceGetCount_v2()?;
    let handle = nvml.nvmlDeviceGetHandleByIndex_v2()?;
    let mut n: c_uint = 0;
    // SAFETY: the real NVML's functions; the out parameter is a live local.
    if unsafe { init() } != NVML_SUCCESS || unsafe { count(&mut n) } != NVML_SUCCESS {
        return None;
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    visible_indices(visible.as_deref(), n as usize)?
        .into_iter()
        .map(|index| {
            let mut device: NvmlDevice = core::ptr::null_mut();
            // SAFETY: the real NVML's function; `device` is a live local.
            (unsafe { handle(index as c_uint, &mut device) } == NVML_SUCCESS).then_some(device)
        })
        .collect()
}

/// The indices of `count` GPUs that `CUDA_VISIBLE_DEVICES` (`list`) selects,
/// in its order. As CUDA reads it, the list ends at its first entry that is
/// not a GPU (out of range, repeated, not a number). `None` when an entry
/// names a GPU by UUID (`GPU-…`) or MIG instance (`MIG-…`).
fn visible_indices(list: Option<&str>, count: usize) -> Option<Vec<usize>> {
    let Some(list) = list else {
        return Some((0..count).collect());
    };
    let mut chosen = Vec::new();
    for entry in list.split(',').map(str::trim) {
        if entry.starts_with("GPU-") || entry.starts_with("MIG-") {
            return None;
        }
        match entry.parse::<usize>() {
            Ok(index) if index < count && !chosen.contains(&index) => chosen.push(index),
            _ => break,
        }
    }
    Some(chosen)
}

/// Total memory of an NVML device, as the real NVML reports it.
pub(crate) fn nvml_total_memory(device: NvmlDevice) -> Option<u64> {
    let get = real_nvml().nvmlDeviceGetMemoryInfo()?;
    let mut memory = NvmlMemory {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: `device` is a handle the real NVML gave; `memory` is a live
    // out-parameter of the right layout.
    (unsafe { get(device, &mut memory) } == NVML_SUCCESS).then_some(memory.total)
}

/// PCI (domain, bus, device) of an NVML device.
pub(crate) fn nvml_pci_location(device: NvmlDevice) -> Option<(u32, u32, u32)> {
    let get = real_nvml().nvmlDeviceGetPciInfo()?;
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

/// The real NVML's functions, each looked up (again) while it is absent.
/// Their types are generated from nvml.h (`nvml_api.rs`); which C names fill
/// which field is said once, by the accessors below.
#[allow(non_snake_case)]
pub(crate) struct RealNvml {
    init: RealFn<PFN_nvmlInit_v2>,
    count: RealFn<PFN_nvmlDeviceGetCount_v2>,
    handle_by_index: RealFn<PFN_nvmlDeviceGetHandleByIndex_v2>,
    pci_info: RealFn<PFN_nvmlDeviceGetPciInfo_v3>,
    process_utilization: RealFn<PFN_nvmlDeviceGetProcessUtilization>,
    memory_info: RealFn<PFN_nvmlDeviceGetMemoryInfo>,
    memory_info_v2: RealFn<PFN_nvmlDeviceGetMemoryInfo_v2>,
}

pub(crate) fn real_nvml() -> &'static RealNvml {
    static REAL_NVML: RealNvml = RealNvml {
        init: RealFn::new(),
        count: RealFn::new(),
        handle_by_index: RealFn::new(),
        pci_info: RealFn::new(),
        process_utilization: RealFn::new(),
        memory_info: RealFn::new(),
        memory_info_v2: RealFn::new(),
    };
    &REAL_NVML
}

/// `slot`'s function, found under the first of `names` NVML has.
///
/// # Safety
/// Each of `names` is an NVML function of type `F`.
unsafe fn lookup<F: Copy>(slot: &RealFn<F>, names: &[&CStr]) -> Option<F> {
    if let Some(function) = slot.get() {
        return Some(function);
    }
    let address = names
        .iter()
        .map(|name| real_symbol(name))
        .find(|&p| p != 0)?;
    // SAFETY: the caller's promise, and `real_symbol` gives NVML's function
    // of that name.
    unsafe { slot.set(address) };
    slot.get()
}

// Each accessor names the C functions of its field's type (the promise
// `lookup` asks for).
#[allow(non_snake_case)]
impl RealNvml {
    pub fn nvmlInit_v2(&self) -> Option<PFN_nvmlInit_v2> {
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.init, &[c"nvmlInit_v2"]) }
    }
    pub fn nvmlDeviceGetCount_v2(&self) -> Option<PFN_nvmlDeviceGetCount_v2> {
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.count, &[c"nvmlDeviceGetCount_v2"]) }
    }
    pub fn nvmlDeviceGetHandleByIndex_v2(&self) -> Option<PFN_nvmlDeviceGetHandleByIndex_v2> {
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.handle_by_index, &[c"nvmlDeviceGetHandleByIndex_v2"]) }
    }
    /// `_v3`, else `_v2` or the unsuffixed version: each fills a prefix of
    /// the largest layout, [`NvmlPciInfo`].
    fn nvmlDeviceGetPciInfo(&self) -> Option<PFN_nvmlDeviceGetPciInfo_v3> {
        let names = [
            c"nvmlDeviceGetPciInfo_v3",
            c"nvmlDeviceGetPciInfo_v2",
            c"nvmlDeviceGetPciInfo",
        ];
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.pci_info, &names) }
    }
    pub fn nvmlDeviceGetProcessUtilization(&self) -> Option<PFN_nvmlDeviceGetProcessUtilization> {
        // SAFETY: see the accessors' comment.
        unsafe {
            lookup(
                &self.process_utilization,
                &[c"nvmlDeviceGetProcessUtilization"],
            )
        }
    }
    pub fn nvmlDeviceGetMemoryInfo(&self) -> Option<PFN_nvmlDeviceGetMemoryInfo> {
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.memory_info, &[c"nvmlDeviceGetMemoryInfo"]) }
    }
    pub fn nvmlDeviceGetMemoryInfo_v2(&self) -> Option<PFN_nvmlDeviceGetMemoryInfo_v2> {
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.memory_info_v2, &[c"nvmlDeviceGetMemoryInfo_v2"]) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices_selects_nvml_indices_as_cuda_reads_it() {
        assert_eq!(visible_indices(None, 3), Some(vec![0, 1, 2]));
        assert_eq!(visible_indices(Some("2, 0"), 3), Some(vec![2, 0]));
        // The list ends at the first entry that is not a GPU.
        assert_eq!(visible_indices(Some("1,7,0"), 3), Some(vec![1]));
        assert_eq!(visible_indices(Some("1,1,0"), 3), Some(vec![1]));
        assert_eq!(visible_indices(Some(""), 3), Some(vec![]));
        assert_eq!(visible_indices(Some("-1"), 3), Some(vec![]));
        // UUIDs need the driver.
        assert_eq!(visible_indices(Some("GPU-8f2a,0"), 3), None);
    }

    #[test]
    fn pci_info_layout_matches_nvml_h() {
        assert_eq!(core::mem::offset_of!(NvmlPciInfo, domain), 16);
        assert_eq!(core::mem::size_of::<NvmlPciInfo>(), 68);
    }
}
