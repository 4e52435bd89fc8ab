//! Devices, primary contexts and contexts.

use super::out;
use crate::Res;
use crate::driver::{CTXS, Ctx, Driver, ctx_stack, current, drv};
use crate::identity;
use dilu_abi::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering::*;

type CUdevice = sys::CUdevice;
type CUcontext = sys::CUcontext;

export! {
    fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) => device_get;
    fn cuDeviceGetCount(n: *mut c_int) => device_count;
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) => device_name;
    fn cuDeviceGetUuid(uuid: *mut sys::CUuuid, dev: CUdevice) => device_uuid;
    fn cuDeviceGetUuid_v2(uuid: *mut sys::CUuuid, dev: CUdevice) => device_uuid;
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) => device_total_mem;
    fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: CUdevice) => device_attribute;
    fn cuDeviceGetPCIBusId(id: *mut c_char, len: c_int, dev: CUdevice) => device_pci_bus_id;
    fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) => device_cc;
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) => primary_retain;
    fn cuDevicePrimaryCtxRelease(dev: CUdevice) => primary_release;
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) => primary_release;
    fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: c_uint) => primary_set_flags;
    fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) => primary_set_flags;
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) => primary_state;
    fn cuDevicePrimaryCtxReset(dev: CUdevice) => primary_reset;
    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) => primary_reset;
    fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) => ctx_create;
    fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut c_void, n: c_int, flags: c_uint, dev: CUdevice) => ctx_create_v3;
    fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut c_void, flags: c_uint, dev: CUdevice) => ctx_create_v4;
    fn cuCtxDestroy_v2(ctx: CUcontext) => ctx_destroy;
    fn cuCtxSetCurrent(ctx: CUcontext) => ctx_set_current;
    fn cuCtxGetCurrent(ctx: *mut CUcontext) => ctx_get_current;
    fn cuCtxPushCurrent_v2(ctx: CUcontext) => ctx_push;
    fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) => ctx_pop;
    fn cuCtxGetDevice(dev: *mut CUdevice) => ctx_get_device;
    fn cuCtxSynchronize() => ctx_synchronize;
    fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) => ctx_get_device_v2;
    fn cuCtxSynchronize_v2(ctx: CUcontext) => ctx_synchronize_v2;
    fn cuCtxGetId(ctx: CUcontext, id: *mut u64) => ctx_get_id;
    fn cuCtxGetApiVersion(ctx: CUcontext, v: *mut c_uint) => ctx_api_version;
    fn cuCtxGetFlags(flags: *mut c_uint) => ctx_get_flags;
    fn cuCtxSetLimit(limit: c_int, value: usize) => ctx_set_limit;
    fn cuCtxGetLimit(value: *mut usize, limit: c_int) => ctx_get_limit;
    fn cuCtxGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) => ctx_priority_range;
}

fn dev_index(dev: CUdevice) -> Res<usize> {
    drv()?.check_dev(dev)
}

fn device_get(_: bool, d: *mut CUdevice, ordinal: c_int) -> Res {
    let i = dev_index(ordinal)?;
    out(d, i as CUdevice)
}

fn device_count(_: bool, n: *mut c_int) -> Res {
    out(n, drv()?.ndev() as c_int)
}

/// Copies `text` NUL-terminated into a caller buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_int, text: &str) -> Res {
    if buf.is_null() || len <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len as usize - 1);
    // SAFETY: the caller provides `len` writable bytes at `buf`; we write
    // n + 1 <= len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

fn device_name(_: bool, name: *mut c_char, len: c_int, dev: CUdevice) -> Res {
    dev_index(dev)?;
    put_str(name, len, identity::DEVICE_NAME)
}

/// A device's UUID: stable for an instance and device (cudart's integrity
/// check hashes it; NVML reports the same, see `identity`).
pub(crate) fn uuid_bytes(d: &Driver, i: usize) -> [u8; 16] {
    identity::uuid_bytes(&d.cfg.instance, d.phys(i))
}

/// A device's PCI bus number (domain and device number are 0).
pub(crate) fn pci_bus(d: &Driver, i: usize) -> c_int {
    identity::pci_bus(d.phys(i)) as c_int
}

fn device_uuid(_: bool, uuid: *mut sys::CUuuid, dev: CUdevice) -> Res {
    let d = drv()?;
    let i = d.check_dev(dev)?;
    let mut u = sys::CUuuid { bytes: [0; 16] };
    for (o, b) in u.bytes.iter_mut().zip(uuid_bytes(d, i)) {
        *o = b as c_char;
    }
    out(uuid, u)
}

fn device_total_mem(_: bool, bytes: *mut usize, dev: CUdevice) -> Res {
    let d = drv()?;
    let i = d.check_dev(dev)?;
    out(bytes, d.capacity[i] as usize)
}

/// Hopper (H100 SXM) values; MULTIPROCESSOR_COUNT follows SIMGPU_SMS.
fn attribute(attr: c_int, sms: c_int, bus: c_int) -> c_int {
    match attr {
        1 => 1024,                       // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                   // MAX_BLOCK_DIM_X/Y
        4 => 64,                         // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                   // MAX_GRID_DIM_X
        6 | 7 => 65535,                  // MAX_GRID_DIM_Y/Z
        8 => 49152,                      // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 65536,                      // TOTAL_CONSTANT_MEMORY
        10 => 32,                        // WARP_SIZE
        11 => i32::MAX,                  // MAX_PITCH
        12 => 65536,                     // MAX_REGISTERS_PER_BLOCK
        13 => 1_980_000,                 // CLOCK_RATE (kHz)
        14 => 512,                       // TEXTURE_ALIGNMENT
        15 => 1,                         // GPU_OVERLAP
        16 => sms,                       // MULTIPROCESSOR_COUNT
        19 => 1,                         // CAN_MAP_HOST_MEMORY
        21 => 131072,                    // MAXIMUM_TEXTURE1D_WIDTH
        22 | 23 => 131072,               // MAXIMUM_TEXTURE2D_WIDTH/HEIGHT
        24..=26 => 16384,                // MAXIMUM_TEXTURE3D_*
        30 => 512,                       // SURFACE_ALIGNMENT
        31 => 1,                         // CONCURRENT_KERNELS
        32 => 1,                         // ECC_ENABLED
        33 => bus,                       // PCI_BUS_ID
        36 => 2_619_000,                 // MEMORY_CLOCK_RATE (kHz)
        37 => 5120,                      // GLOBAL_MEMORY_BUS_WIDTH
        38 => 50 << 20,                  // L2_CACHE_SIZE
        39 => 2048,                      // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 3,                         // ASYNC_ENGINE_COUNT
        41 => 1,                         // UNIFIED_ADDRESSING
        51 => 32,                        // TEXTURE_PITCH_ALIGNMENT
        75 => 9,                         // COMPUTE_CAPABILITY_MAJOR
        76 => 0,                         // COMPUTE_CAPABILITY_MINOR
        78..=80 => 1,                    // STREAM_PRIORITIES / GLOBAL_L1 / LOCAL_L1
        81 => 233472,                    // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        82 => 65536,                     // MAX_REGISTERS_PER_MULTIPROCESSOR
        83 => 1,                         // MANAGED_MEMORY
        87 => 2,                         // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
        89 => 1,                         // CONCURRENT_MANAGED_ACCESS
        90 => 1,                         // COMPUTE_PREEMPTION_SUPPORTED
        91..=93 => 1,                    // host pointer / stream mem ops
        95 | 96 => 1,                    // COOPERATIVE_LAUNCH (+multi device)
        97 => 232448,                    // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        99 => 1,                         // HOST_REGISTER_SUPPORTED
        102 | 103 => 1,                  // VMM supported, POSIX fd handles
        106 => 32,                       // MAX_BLOCKS_PER_MULTIPROCESSOR
        108 => 30 << 20,                 // MAX_PERSISTING_L2_CACHE_SIZE
        109 => 128 << 20,                // MAX_ACCESS_POLICY_WINDOW_SIZE
        111 => 1024,                     // RESERVED_SHARED_MEMORY_PER_BLOCK
        112 | 113 => 1,                  // sparse arrays, read-only host register
        115 => 1,                        // MEMORY_POOLS_SUPPORTED
        119 => 1,                        // MEMPOOL_SUPPORTED_HANDLE_TYPES (posix fd)
        120..=123 => 1,                  // cluster launch, deferred mapping, mem ops
        126 => 4,                        // MEM_SYNC_DOMAIN_COUNT
        127 => 1,                        // TENSOR_MAP_ACCESS_SUPPORTED
        129 => 1,                        // UNIFIED_FUNCTION_POINTERS
        131 | 134 => -1,                 // NUMA ids
        139 => 0x2330_10DE_u32 as c_int, // GPU_PCI_DEVICE_ID: H100 SXM5, NVIDIA
        _ => 0,
    }
}

fn device_attribute(_: bool, v: *mut c_int, attr: c_int, dev: CUdevice) -> Res {
    let d = drv()?;
    let i = d.check_dev(dev)?;
    let max = sys::CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MAX as c_int;
    if attr < 1 || attr >= max {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let sms = d.cfg.sms.min(i32::MAX as u64) as c_int;
    out(v, attribute(attr, sms, pci_bus(d, i)))
}

fn device_pci_bus_id(_: bool, id: *mut c_char, len: c_int, dev: CUdevice) -> Res {
    let d = drv()?;
    let i = d.check_dev(dev)?;
    put_str(id, len, &format!("0000:{:02x}:00.0", pci_bus(d, i)))
}

fn device_cc(_: bool, major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> Res {
    dev_index(dev)?;
    out(major, 9)?;
    out(minor, 0)
}

fn primary(dev: CUdevice) -> Res<Arc<Ctx>> {
    let d = drv()?;
    let i = d.check_dev(dev)?;
    Ok(d.primary[i].clone())
}

fn primary_retain(_: bool, ctx: *mut CUcontext, dev: CUdevice) -> Res {
    let c = primary(dev)?;
    out(ctx, c.handle() as CUcontext)?;
    c.retains.fetch_add(1, AcqRel);
    drv()?.mark_active(c.dev);
    Ok(())
}

fn primary_release(_: bool, dev: CUdevice) -> Res {
    let c = primary(dev)?;
    c.retains
        .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)
}

fn primary_set_flags(_: bool, dev: CUdevice, flags: c_uint) -> Res {
    primary(dev)?.flags.store(flags, Release);
    Ok(())
}

fn primary_state(_: bool, dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> Res {
    let c = primary(dev)?;
    out(flags, c.flags.load(Acquire))?;
    out(active, (c.retains.load(Acquire) > 0) as c_int)
}

fn primary_reset(_: bool, dev: CUdevice) -> Res {
    let c = primary(dev)?;
    c.synchronize()?;
    c.flags.store(0, Release);
    c.drop_local_storage();
    Ok(())
}

fn ctx_create(_: bool, ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res {
    let d = drv()?;
    let i = d.check_dev(dev)?;
    if ctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let c = Arc::new(Ctx::new(i, flags, false));
    d.mark_active(i);
    let h = CTXS.insert(c);
    ctx_stack(|s| s.push(h));
    out(ctx, h as CUcontext)
}

fn ctx_create_v3(
    pt: bool,
    ctx: *mut CUcontext,
    _params: *mut c_void,
    _n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> Res {
    ctx_create(pt, ctx, flags, dev)
}

fn ctx_create_v4(
    pt: bool,
    ctx: *mut CUcontext,
    _p: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> Res {
    ctx_create(pt, ctx, flags, dev)
}

fn ctx_destroy(_: bool, ctx: CUcontext) -> Res {
    drv()?;
    let h = ctx as usize;
    let c = CTXS.get(h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if c.primary {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    c.synchronize()?;
    for s in c.all_streams() {
        s.close();
    }
    c.drop_local_storage();
    CTXS.remove(h);
    ctx_stack(|s| s.retain(|&x| x != h));
    Ok(())
}

fn ctx_set_current(_: bool, ctx: CUcontext) -> Res {
    drv()?;
    let h = ctx as usize;
    if h != 0 && CTXS.get(h).is_none() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    ctx_stack(|s| {
        s.pop();
        if h != 0 {
            s.push(h);
        }
    });
    Ok(())
}

fn ctx_get_current(_: bool, ctx: *mut CUcontext) -> Res {
    drv()?;
    let h = ctx_stack(|s| s.last().copied()).unwrap_or(0);
    out(ctx, h as CUcontext)
}

fn ctx_push(_: bool, ctx: CUcontext) -> Res {
    drv()?;
    let h = ctx as usize;
    CTXS.get(h).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    ctx_stack(|s| s.push(h));
    Ok(())
}

fn ctx_pop(_: bool, ctx: *mut CUcontext) -> Res {
    drv()?;
    let h = ctx_stack(|s| s.pop()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !ctx.is_null() {
        out(ctx, h as CUcontext)?;
    }
    Ok(())
}

fn ctx_get_device(_: bool, dev: *mut CUdevice) -> Res {
    out(dev, current()?.dev as CUdevice)
}

fn ctx_synchronize(_: bool) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Synchronize);
    current()?.synchronize()
}

/// A context argument of the CUDA 13 `_v2` calls (NULL: the current one).
pub(crate) fn ctx_or_current(ctx: CUcontext) -> Res<Arc<Ctx>> {
    if ctx.is_null() {
        return current();
    }
    drv()?;
    CTXS.get(ctx as usize).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

fn ctx_get_device_v2(_: bool, dev: *mut CUdevice, ctx: CUcontext) -> Res {
    out(dev, ctx_or_current(ctx)?.dev as CUdevice)
}

/// A context's unique id (NULL: the current context's).
fn ctx_get_id(_: bool, ctx: CUcontext, id: *mut u64) -> Res {
    out(id, ctx_or_current(ctx)?.id)
}

fn ctx_synchronize_v2(_: bool, ctx: CUcontext) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Synchronize);
    ctx_or_current(ctx)?.synchronize()
}

fn ctx_api_version(_: bool, ctx: CUcontext, v: *mut c_uint) -> Res {
    drv()?;
    if !ctx.is_null() {
        CTXS.get(ctx as usize).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    } else {
        current()?;
    }
    out(v, 12090)
}

fn ctx_get_flags(_: bool, flags: *mut c_uint) -> Res {
    out(flags, current()?.flags.load(Acquire))
}

const LIMIT_SHMEM_SIZE: c_int = 7;
const LIMIT_CIG_ENABLED: c_int = 8;

fn ctx_set_limit(_: bool, limit: c_int, value: usize) -> Res {
    let c = current()?;
    let max = sys::CUlimit_enum::CU_LIMIT_MAX as c_int;
    if limit < 0 || limit >= max || limit as usize >= 16 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Shared memory size and CIG state can only be queried.
    if limit == LIMIT_SHMEM_SIZE || limit == LIMIT_CIG_ENABLED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    c.limits.lock().unwrap_or_else(|e| e.into_inner())[limit as usize] = value as u64;
    Ok(())
}

fn ctx_get_limit(_: bool, value: *mut usize, limit: c_int) -> Res {
    let c = current()?;
    let max = sys::CUlimit_enum::CU_LIMIT_MAX as c_int;
    if limit < 0 || limit >= max || limit as usize >= 16 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let v = c.limits.lock().unwrap_or_else(|e| e.into_inner())[limit as usize];
    out(value, v as usize)
}

fn ctx_priority_range(_: bool, least: *mut c_int, greatest: *mut c_int) -> Res {
    current()?;
    if !least.is_null() {
        out(least, 0)?;
    }
    if !greatest.is_null() {
        out(greatest, -5)?;
    }
    Ok(())
}
