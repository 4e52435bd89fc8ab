//! The real NVML, as the interposer reaches it: a handle of
//! `libnvidia-ml.so.1` opened lazily on first use (glibc returns the library
//! the program already loaded), its functions found with the real `dlsym`
//! on that handle, and the NVML device at a CUDA device's PCI location.
//! Used by the NVML memory answers ([`crate::memory::nvml`]) and by usage
//! feedback ([`crate::sm_time::usage_feedback`]).

use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
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
    nvml_index_and_device_at(location).map(|(_, device)| device)
}

/// NVML's index (the node's number for a GPU) of CUDA device `ordinal`,
/// found by its PCI location: exact whatever `CUDA_VISIBLE_DEVICES` and
/// `CUDA_DEVICE_ORDER` say. Needs the initialised driver.
pub(crate) fn nvml_index_of_cuda_device(ordinal: CUdevice) -> Option<u32> {
    nvml_index_and_device_at(cuda_pci_location(ordinal)?).map(|(index, _)| index)
}

fn nvml_index_and_device_at(location: (u32, u32, u32)) -> Option<(u32, NvmlDevice)> {
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
                .then_some((i, device))
        })
    }
}

/// NVML's GPUs that the program's CUDA can see, in CUDA's order, found
/// without the CUDA driver (which must not be initialised on the program's
/// behalf: a process forked after that cannot use CUDA). NVML numbers GPUs
/// in PCI bus order; CUDA does too with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and
/// by default (fastest first) on a node of identical GPUs; GPUs named by
/// UUID are found by NVML's. `None` when NVML cannot answer or
/// `CUDA_VISIBLE_DEVICES` names a MIG instance: then only the initialised
/// driver can tell.
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
    let device_at = |index: usize| {
        let mut device: NvmlDevice = core::ptr::null_mut();
        // SAFETY: the real NVML's function; `device` is a live local.
        (unsafe { handle(index as c_uint, &mut device) } == NVML_SUCCESS).then_some(device)
    };
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let named_by_uuid = visible
        .as_deref()
        .is_some_and(|list| list.split(',').any(|e| e.trim().starts_with("GPU-")));
    // UUIDs are asked for only where the list names GPUs by them.
    let uuids: Vec<Option<String>> = (0..n as usize)
        .map(|index| {
            named_by_uuid
                .then(|| device_at(index).and_then(nvml_uuid))
                .flatten()
        })
        .collect();
    visible_indices(visible.as_deref(), &uuids)?
        .into_iter()
        .map(device_at)
        .collect()
}

/// The indices of the GPUs (NVML's, whose UUIDs are `uuids`) that
/// `CUDA_VISIBLE_DEVICES` (`list`) selects, in its order. As CUDA reads it,
/// an entry is an index or a UUID (`GPU-…`, whole or a prefix only one
/// GPU's UUID starts with), and the list ends at its first entry that
/// names no GPU (out of range, repeated, unknown or ambiguous UUID, not a
/// number). `None` when an entry names a MIG instance (`MIG-…`), or a UUID
/// where NVML gave none to match it with.
fn visible_indices(list: Option<&str>, uuids: &[Option<String>]) -> Option<Vec<usize>> {
    let count = uuids.len();
    let Some(list) = list else {
        return Some((0..count).collect());
    };
    let mut chosen = Vec::new();
    for entry in list.split(',').map(str::trim) {
        if entry.starts_with("MIG-") {
            return None;
        }
        let named = match entry.strip_prefix("GPU-") {
            Some(digits) => {
                if uuids.iter().any(Option::is_none) {
                    return None;
                }
                gpu_by_uuid_prefix(digits, uuids)
            }
            None => entry.parse::<usize>().ok().filter(|&index| index < count),
        };
        match named {
            Some(index) if !chosen.contains(&index) => chosen.push(index),
            _ => break,
        }
    }
    Some(chosen)
}

/// The one GPU whose UUID's digits start with `digits` (case aside), if
/// exactly one does.
fn gpu_by_uuid_prefix(digits: &str, uuids: &[Option<String>]) -> Option<usize> {
    if digits.is_empty() {
        return None;
    }
    let digits = digits.to_ascii_lowercase();
    let mut named = uuids.iter().enumerate().filter(|(_, uuid)| {
        uuid.as_deref()
            .and_then(|u| u.strip_prefix("GPU-"))
            .is_some_and(|u| u.to_ascii_lowercase().starts_with(&digits))
    });
    let (first, _) = named.next()?;
    named.next().is_none().then_some(first)
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
    uuid: RealFn<PFN_nvmlDeviceGetUUID>,
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
        uuid: RealFn::new(),
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
    fn nvmlDeviceGetUUID(&self) -> Option<PFN_nvmlDeviceGetUUID> {
        // SAFETY: see the accessors' comment.
        unsafe { lookup(&self.uuid, &[c"nvmlDeviceGetUUID"]) }
    }
}

/// NVML's UUID text of a device (`GPU-…`).
fn nvml_uuid(device: NvmlDevice) -> Option<String> {
    let get = real_nvml().nvmlDeviceGetUUID()?;
    // NVML_DEVICE_UUID_V2_BUFFER_SIZE of nvml.h.
    let mut text = [0 as c_char; 96];
    // SAFETY: `device` is a handle the real NVML gave; `text` is a live
    // buffer of the length passed.
    if unsafe { get(device, text.as_mut_ptr(), text.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-ended string into `text` (zeroed before, so
    // it ends within the buffer either way).
    let text = unsafe { CStr::from_ptr(text.as_ptr()) };
    text.to_str().ok().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices_selects_nvml_indices_as_cuda_reads_it() {
        let three = [const { None }; 3];
        assert_eq!(visible_indices(None, &three), Some(vec![0, 1, 2]));
        assert_eq!(visible_indices(Some("2, 0"), &three), Some(vec![2, 0]));
        // The list ends at the first entry that is not a GPU.
        assert_eq!(visible_indices(Some("1,7,0"), &three), Some(vec![1]));
        assert_eq!(visible_indices(Some("1,1,0"), &three), Some(vec![1]));
        assert_eq!(visible_indices(Some(""), &three), Some(vec![]));
        assert_eq!(visible_indices(Some("-1"), &three), Some(vec![]));
        // UUIDs NVML did not give, and MIG instances, need the driver.
        assert_eq!(visible_indices(Some("GPU-8f2a,0"), &three), None);
        assert_eq!(visible_indices(Some("0,MIG-8f2a"), &three), None);
    }

    #[test]
    fn gpus_named_by_uuid_are_found_by_nvmls_uuids() {
        let uuids = [
            Some("GPU-8f2a0c11-0000-4000-8000-000000000000".to_string()),
            Some("GPU-8f2a0c11-0000-4000-8000-000000000001".to_string()),
            Some("GPU-77c05e90-0000-4000-8000-000000000000".to_string()),
        ];
        let whole = "GPU-8f2a0c11-0000-4000-8000-000000000001";
        assert_eq!(visible_indices(Some(whole), &uuids), Some(vec![1]));
        // A prefix that one GPU's UUID starts with, in any case; mixed with
        // indices.
        assert_eq!(
            visible_indices(Some("GPU-77C0,0"), &uuids),
            Some(vec![2, 0])
        );
        // An ambiguous prefix, or one no GPU has, ends the list.
        assert_eq!(visible_indices(Some("2,GPU-8f2a,0"), &uuids), Some(vec![2]));
        assert_eq!(visible_indices(Some("GPU-0000,0"), &uuids), Some(vec![]));
        assert_eq!(visible_indices(Some("GPU-"), &uuids), Some(vec![]));
        // The same GPU twice: the second ends it.
        let twice = format!("{whole},1,0");
        assert_eq!(visible_indices(Some(&twice), &uuids), Some(vec![1]));
    }

    #[test]
    fn pci_info_layout_matches_nvml_h() {
        assert_eq!(core::mem::offset_of!(NvmlPciInfo, domain), 16);
        assert_eq!(core::mem::size_of::<NvmlPciInfo>(), 68);
    }
}
