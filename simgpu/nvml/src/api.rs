//! The implemented NVML entry points (names and struct layouts from
//! `nvml.h`, CUDA 12.9). Each body runs under [`crate::guard`].

use crate::identity;
use crate::state::{self, State, handle, index, state};
use crate::*;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};

type NvmlDevice = *mut c_void;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}
/// `nvmlMemory_v2` (NVML_STRUCT_VERSION(Memory, 2)).
const MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | 2 << 24;

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
pub struct NvmlProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// `nvmlProcessInfo_v2_t` (= `nvmlProcessInfo_t`, used by `_v2` and `_v3`).
#[repr(C)]
pub struct NvmlProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlPciInfo_t` (the v2/v3 layout; v1 ends after `pci_sub_system_id`
/// with four reserved words instead of `bus_id`).
#[repr(C)]
pub struct NvmlPciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// Not a MIG device: NVML reports these ids as "not available".
const NO_INSTANCE: c_uint = c_uint::MAX;
const DRIVER_VERSION: &str = "575.57.08";
const NVML_VERSION: &str = "12.575.57.08";
const CUDA_DRIVER_VERSION: c_int = 12090;
/// `NVML_DEVICE_ARCH_HOPPER`.
const ARCH_HOPPER: c_uint = 9;

fn out<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: NVML's contract makes a non-null output pointer valid and
    // writable for a T.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Copies `text` NUL-terminated into a caller buffer of `len` bytes;
/// too small is NVML_ERROR_INSUFFICIENT_SIZE, as with NVIDIA's NVML.
fn put_str(buf: *mut c_char, len: c_uint, text: &str) -> Res {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < text.len() + 1 {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller provides `len` writable bytes; we write text + NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

fn fixed<const N: usize>(text: &str) -> [c_char; N] {
    let mut a = [0 as c_char; N];
    for (o, b) in a.iter_mut().zip(text.bytes().take(N - 1)) {
        *o = b as c_char;
    }
    a
}

fn arg_str<'a>(p: *const c_char) -> Res<&'a str> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: a non-null string argument is NUL-terminated (NVML contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

fn device(dev: NvmlDevice) -> Res<(&'static State, usize)> {
    let s = state()?;
    Ok((s, index(s, dev)?))
}

fn uuid_of(s: &State, i: usize) -> String {
    identity::uuid_text(&identity::uuid_bytes(&s.instance, i))
}

/// "00000000:18:00.0" (NVML's form) and "0000:18:00.0" (the legacy and CUDA form).
fn bus_ids(i: usize) -> (String, String) {
    let bus = identity::pci_bus(i);
    (
        format!("00000000:{bus:02X}:00.0"),
        format!("0000:{bus:02X}:00.0"),
    )
}

/// Parses "[domain:]bus:device.function" in hex.
fn parse_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let parts: Vec<&str> = text.trim().split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (u32::from_str_radix(d, 16).ok()?, *b, *df),
        [b, df] => (0, *b, *df),
        _ => return None,
    };
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(devfn.split('.').next()?, 16).ok()?;
    Some((domain, bus, dev))
}

/// Writes `items` into a caller array of `*count` entries: too small (or
/// null) sets `*count` to the number needed and is
/// NVML_ERROR_INSUFFICIENT_SIZE, as NVIDIA's NVML does.
fn fill<T>(count: *mut c_uint, array: *mut T, items: Vec<T>) -> Res {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: count is non-null and, by contract, a valid c_uint.
    let room = unsafe { count.read_unaligned() } as usize;
    let n = items.len();
    out(count, n as c_uint)?;
    if n == 0 {
        return Ok(());
    }
    if array.is_null() || room < n {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, item) in items.into_iter().enumerate() {
        // SAFETY: the caller's array holds `room` >= n entries.
        unsafe { array.add(k).write_unaligned(item) };
    }
    Ok(())
}

macro_rules! nvml {
    ($( fn $name:ident ( $($a:ident : $t:ty),* $(,)? ) $body:block )*) => {
        $(
            // C callers pass raw pointers by NVML's contract; each
            // dereference below has its own SAFETY note.
            #[unsafe(no_mangle)]
            #[allow(non_snake_case, clippy::not_unsafe_ptr_arg_deref)]
            pub extern "C" fn $name($($a: $t),*) -> NvmlReturn {
                guard(|| $body)
            }
        )*
    };
}

nvml! {
    fn nvmlInit() { state::init() }
    fn nvmlInit_v2() { state::init() }
    fn nvmlInitWithFlags(_flags: c_uint) { state::init() }
    fn nvmlShutdown() { state::shutdown() }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) {
        state()?;
        put_str(version, len, DRIVER_VERSION)
    }
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, len: c_uint) {
        put_str(version, len, NVML_VERSION)
    }
    fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) { out(v, CUDA_DRIVER_VERSION) }
    fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) { out(v, CUDA_DRIVER_VERSION) }

    fn nvmlDeviceGetCount(count: *mut c_uint) { out(count, state()?.ndev() as c_uint) }
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) { out(count, state()?.ndev() as c_uint) }
    fn nvmlDeviceGetHandleByIndex(i: c_uint, dev: *mut NvmlDevice) { handle_by_index(i, dev) }
    fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, dev: *mut NvmlDevice) { handle_by_index(i, dev) }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, dev: *mut NvmlDevice) {
        let s = state()?;
        let wanted = arg_str(uuid)?;
        let i = (0..s.ndev())
            .find(|&i| uuid_of(s, i).eq_ignore_ascii_case(wanted))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        out(dev, handle(i))
    }
    fn nvmlDeviceGetHandleByPciBusId(id: *const c_char, dev: *mut NvmlDevice) { handle_by_bus_id(id, dev) }
    fn nvmlDeviceGetHandleByPciBusId_v2(id: *const c_char, dev: *mut NvmlDevice) { handle_by_bus_id(id, dev) }
    fn nvmlDeviceGetIndex(dev: NvmlDevice, i: *mut c_uint) {
        let (_, d) = device(dev)?;
        out(i, d as c_uint)
    }
    fn nvmlDeviceGetMinorNumber(dev: NvmlDevice, minor: *mut c_uint) {
        let (_, d) = device(dev)?;
        out(minor, d as c_uint)
    }
    fn nvmlDeviceGetName(dev: NvmlDevice, name: *mut c_char, len: c_uint) {
        device(dev)?;
        put_str(name, len, identity::DEVICE_NAME)
    }
    fn nvmlDeviceGetUUID(dev: NvmlDevice, uuid: *mut c_char, len: c_uint) {
        let (s, d) = device(dev)?;
        put_str(uuid, len, &uuid_of(s, d))
    }
    fn nvmlDeviceGetArchitecture(dev: NvmlDevice, arch: *mut c_uint) {
        device(dev)?;
        out(arch, ARCH_HOPPER)
    }
    fn nvmlDeviceGetCudaComputeCapability(dev: NvmlDevice, major: *mut c_int, minor: *mut c_int) {
        device(dev)?;
        out(major, 9)?;
        out(minor, 0)
    }
    fn nvmlDeviceGetPciInfo(dev: NvmlDevice, pci: *mut NvmlPciInfo) { pci_info(dev, pci, false) }
    fn nvmlDeviceGetPciInfo_v2(dev: NvmlDevice, pci: *mut NvmlPciInfo) { pci_info(dev, pci, true) }
    fn nvmlDeviceGetPciInfo_v3(dev: NvmlDevice, pci: *mut NvmlPciInfo) { pci_info(dev, pci, true) }

    fn nvmlDeviceGetMemoryInfo(dev: NvmlDevice, mem: *mut NvmlMemory) {
        let (s, d) = device(dev)?;
        let (used, total) = s.shm.used_and_capacity(d);
        out(mem, NvmlMemory { total, free: total - used, used })
    }
    fn nvmlDeviceGetMemoryInfo_v2(dev: NvmlDevice, mem: *mut NvmlMemoryV2) {
        let (s, d) = device(dev)?;
        if mem.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller fills in `version` before the call.
        let version = unsafe { std::ptr::addr_of!((*mem).version).read_unaligned() };
        if version != MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (used, total) = s.shm.used_and_capacity(d);
        out(mem, NvmlMemoryV2 { version, total, reserved: 0, free: total - used, used })
    }

    fn nvmlDeviceGetComputeRunningProcesses(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV1) {
        let items = processes(dev)?
            .into_iter()
            .map(|(pid, used)| NvmlProcessInfoV1 { pid, used_gpu_memory: used })
            .collect();
        fill(count, infos, items)
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        fill(count, infos, processes_v2(dev)?)
    }
    fn nvmlDeviceGetComputeRunningProcesses_v3(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        fill(count, infos, processes_v2(dev)?)
    }
    // simgpu has no graphics or MPS clients: empty lists.
    fn nvmlDeviceGetGraphicsRunningProcesses(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV1) {
        device(dev)?;
        fill(count, infos, Vec::new())
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        device(dev)?;
        fill(count, infos, Vec::new())
    }
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        device(dev)?;
        fill(count, infos, Vec::new())
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV1) {
        device(dev)?;
        fill(count, infos, Vec::new())
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v2(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        device(dev)?;
        fill(count, infos, Vec::new())
    }
    fn nvmlDeviceGetMPSComputeRunningProcesses_v3(dev: NvmlDevice, count: *mut c_uint, infos: *mut NvmlProcessInfoV2) {
        device(dev)?;
        fill(count, infos, Vec::new())
    }

    fn nvmlDeviceGetUtilizationRates(dev: NvmlDevice, util: *mut NvmlUtilization) {
        let (s, d) = device(dev)?;
        let gpu = s.sampler.device_percent(&s.shm, d);
        // simgpu models no memory bandwidth: memory utilisation is 0.
        out(util, NvmlUtilization { gpu, memory: 0 })
    }
    fn nvmlDeviceGetProcessUtilization(dev: NvmlDevice, samples: *mut NvmlProcessUtilizationSample, count: *mut c_uint, last_seen: c_ulonglong) {
        let (s, d) = device(dev)?;
        let items: Vec<NvmlProcessUtilizationSample> = s
            .sampler
            .process_samples(&s.shm, d, last_seen)
            .into_iter()
            .map(|p| NvmlProcessUtilizationSample {
                pid: p.pid,
                time_stamp: p.time_stamp_us,
                sm_util: p.sm_percent,
                mem_util: 0,
                enc_util: 0,
                dec_util: 0,
            })
            .collect();
        if items.is_empty() {
            return Err(NVML_ERROR_NOT_FOUND);
        }
        fill(count, samples, items)
    }
}

fn handle_by_index(i: c_uint, dev: *mut NvmlDevice) -> Res {
    let s = state()?;
    if i as usize >= s.ndev() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    out(dev, handle(i as usize))
}

fn handle_by_bus_id(id: *const c_char, dev: *mut NvmlDevice) -> Res {
    let s = state()?;
    let (domain, bus, device) = parse_bus_id(arg_str(id)?).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let i = (0..s.ndev())
        .find(|&i| domain == 0 && device == 0 && bus == identity::pci_bus(i))
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    out(dev, handle(i))
}

fn pci_info(dev: NvmlDevice, pci: *mut NvmlPciInfo, with_bus_id: bool) -> Res {
    let (_, d) = device(dev)?;
    if pci.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let (bus_id, legacy) = bus_ids(d);
    let head = |p: *mut NvmlPciInfo| {
        // SAFETY: non-null; every version of the struct starts with these
        // fields at these offsets.
        unsafe {
            std::ptr::addr_of_mut!((*p).bus_id_legacy).write_unaligned(fixed(&legacy));
            std::ptr::addr_of_mut!((*p).domain).write_unaligned(0);
            std::ptr::addr_of_mut!((*p).bus).write_unaligned(identity::pci_bus(d));
            std::ptr::addr_of_mut!((*p).device).write_unaligned(0);
            std::ptr::addr_of_mut!((*p).pci_device_id).write_unaligned(identity::PCI_DEVICE_ID);
            std::ptr::addr_of_mut!((*p).pci_sub_system_id)
                .write_unaligned(identity::PCI_SUBSYSTEM_ID);
        }
    };
    head(pci);
    if with_bus_id {
        // SAFETY: the v2/v3 struct the caller passed has `bus_id`.
        unsafe { std::ptr::addr_of_mut!((*pci).bus_id).write_unaligned(fixed(&bus_id)) };
    } else {
        // v1: the 16-byte busId field holds the 16-character form, then
        // four reserved words.
        // SAFETY: the v1 struct has 16 reserved bytes after pci_sub_system_id.
        unsafe {
            std::ptr::addr_of_mut!((*pci).bus_id)
                .cast::<[u8; 16]>()
                .write_unaligned([0; 16])
        };
    }
    Ok(())
}

/// (pid, used bytes) of every process with a context on the device.
fn processes(dev: NvmlDevice) -> Res<Vec<(c_uint, c_ulonglong)>> {
    let (s, d) = device(dev)?;
    Ok(s.shm
        .processes(d)
        .into_iter()
        .map(|p| (p.pid, p.used_bytes))
        .collect())
}

fn processes_v2(dev: NvmlDevice) -> Res<Vec<NvmlProcessInfoV2>> {
    Ok(processes(dev)?
        .into_iter()
        .map(|(pid, used)| NvmlProcessInfoV2 {
            pid,
            used_gpu_memory: used,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
        })
        .collect())
}

/// `nvmlErrorString`: the message NVIDIA's NVML gives for each status.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let text: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}
