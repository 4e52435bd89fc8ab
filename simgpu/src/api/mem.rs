//! Device memory: allocation and accounting, stream-ordered allocation and
//! pools, host memory, virtual memory management and arrays.

use super::{out, read};
use crate::Res;
use crate::driver::{Registry, current, drv};
use crate::exec::{Op, resolve};
use crate::memory::charged;
use dilu_abi::cuda::*;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};

type CUdeviceptr = sys::CUdeviceptr;
type CUstream = sys::CUstream;
type Pool = sys::CUmemoryPool;

export! {
    fn cuMemAlloc_v2(p: *mut CUdeviceptr, size: usize) => mem_alloc;
    fn cuMemFree_v2(p: CUdeviceptr) => mem_free;
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) => mem_get_info;
    fn cuMemAllocPitch_v2(p: *mut CUdeviceptr, pitch: *mut usize, w: usize, h: usize, elem: c_uint) => mem_alloc_pitch;
    fn cuMemAllocManaged(p: *mut CUdeviceptr, size: usize, flags: c_uint) => mem_alloc_managed;
    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, p: CUdeviceptr) => mem_address_range;
    fn cuMemAllocHost_v2(p: *mut *mut c_void, size: usize) => mem_alloc_host;
    fn cuMemHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) => mem_host_alloc;
    fn cuMemFreeHost(p: *mut c_void) => mem_free_host;
    fn cuMemHostRegister_v2(p: *mut c_void, size: usize, flags: c_uint) => mem_host_register;
    fn cuMemHostUnregister(p: *mut c_void) => mem_host_unregister;
    fn cuMemHostGetDevicePointer_v2(d: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) => mem_host_device_pointer;
    fn cuMemAllocAsync(p: *mut CUdeviceptr, size: usize, s: CUstream) | cuMemAllocAsync_ptsz => mem_alloc_async;
    fn cuMemFreeAsync(p: CUdeviceptr, s: CUstream) | cuMemFreeAsync_ptsz => mem_free_async;
    fn cuMemAllocFromPoolAsync(p: *mut CUdeviceptr, size: usize, pool: Pool, s: CUstream) | cuMemAllocFromPoolAsync_ptsz => mem_alloc_from_pool;
    fn cuDeviceGetDefaultMemPool(pool: *mut Pool, dev: sys::CUdevice) => default_pool;
    fn cuDeviceGetMemPool(pool: *mut Pool, dev: sys::CUdevice) => default_pool;
    fn cuMemGetDefaultMemPool(pool: *mut Pool, location: *const [c_int; 2], kind: c_int) => default_pool_at;
    fn cuMemGetMemPool(pool: *mut Pool, location: *const [c_int; 2], kind: c_int) => default_pool_at;
    fn cuMemPoolCreate(pool: *mut Pool, props: *const c_void) => pool_create;
    fn cuMemPoolDestroy(pool: Pool) => pool_destroy;
    fn cuMemPoolSetAttribute(pool: Pool, attr: c_int, v: *mut c_void) => pool_set_attr;
    fn cuMemPoolGetAttribute(pool: Pool, attr: c_int, v: *mut c_void) => pool_get_attr;
    fn cuMemPoolTrimTo(pool: Pool, keep: usize) => pool_trim;
    fn cuArrayCreate_v2(a: *mut sys::CUarray, d: *const ArrayDesc) => array_create;
    fn cuArray3DCreate_v2(a: *mut sys::CUarray, d: *const Array3DDesc) => array3d_create;
    fn cuArrayDestroy(a: sys::CUarray) => array_destroy;
    fn cuMipmappedArrayCreate(a: *mut sys::CUmipmappedArray, d: *const Array3DDesc, levels: c_uint) => mipmapped_create;
    fn cuMipmappedArrayDestroy(a: sys::CUmipmappedArray) => mipmapped_destroy;
}

fn mem_alloc(_: bool, p: *mut CUdeviceptr, size: usize) -> Res {
    out(p, alloc_on_current(p, size)?)
}

/// `cuMemAlloc`'s work: `size` bytes on the current context's device.
fn alloc_on_current(p: *mut CUdeviceptr, size: usize) -> Res<CUdeviceptr> {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::MemAlloc);
    let c = current()?;
    if p.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    drv()?.alloc(c.dev, size as u64)
}

/// Frees a device pointer, updating pool statistics for stream-ordered
/// allocations; a graph allocation is ended, its address kept.
pub(crate) fn free_device(ptr: u64) -> Res {
    if let Some(result) = super::graph_mem::free(ptr) {
        return result;
    }
    if let Some((pool, n)) = async_owners().remove(&ptr)
        && let Some(pool) = POOLS.get(pool)
    {
        pool.used.fetch_sub(n, AcqRel);
    }
    // Forgotten before the arena frees it, so an allocation that reuses the
    // address is never taken for managed memory.
    managed_set().remove(&ptr);
    drv()?.free(ptr)
}

fn mem_free(_: bool, p: CUdeviceptr) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::MemFree);
    drv()?;
    // Like the real driver, cuMemFree waits for the work already queued
    // (so memory still in use by a kernel is never handed out again).
    if let Ok(c) = current() {
        let _ = c.synchronize();
    }
    free_device(p)
}

fn mem_get_info(_: bool, free: *mut usize, total: *mut usize) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::MemGetInfo);
    let c = current()?;
    let (f, t) = drv()?.mem_info(c.dev);
    out(free, f as usize)?;
    out(total, t as usize)
}

fn mem_alloc_pitch(
    _: bool,
    p: *mut CUdeviceptr,
    pitch: *mut usize,
    w: usize,
    h: usize,
    elem: c_uint,
) -> Res {
    if ![4, 8, 16].contains(&elem) || w == 0 || h == 0 || pitch.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pt = w.div_ceil(512) * 512;
    let bytes = pt.checked_mul(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    mem_alloc(false, p, bytes)?;
    out(pitch, pt)
}

fn mem_alloc_managed(_: bool, p: *mut CUdeviceptr, size: usize, flags: c_uint) -> Res {
    if flags != 1 && flags != 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = alloc_on_current(p, size)?;
    managed_set().insert(ptr, size);
    out(p, ptr)
}

/// Allocations made by `cuMemAllocManaged`: base -> requested length. They
/// are device memory like any other here (the arena is host-accessible);
/// only the calls that the driver allows on managed memory alone
/// (`cuMemAdvise`, `cuMemPrefetchAsync`) ask for this set.
fn managed_set() -> std::sync::MutexGuard<'static, BTreeMap<u64, usize>> {
    static M: Mutex<BTreeMap<u64, usize>> = Mutex::new(BTreeMap::new());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `[p, p+n)` lies inside one `cuMemAllocManaged` allocation.
pub(crate) fn is_managed(p: u64, n: usize) -> bool {
    let set = managed_set();
    let Some((&base, &len)) = set.range(..=p).next_back() else {
        return false;
    };
    n > 0
        && p.checked_add(n as u64)
            .is_some_and(|end| end <= base + len as u64)
}

fn mem_address_range(_: bool, base: *mut CUdeviceptr, size: *mut usize, p: CUdeviceptr) -> Res {
    let d = drv()?;
    let (b, l) = d
        .arenas
        .iter()
        .find_map(|a| a.range_of(p as usize))
        .ok_or(CUDA_ERROR_NOT_FOUND)?;
    if !base.is_null() {
        out(base, b as u64)?;
    }
    if !size.is_null() {
        out(size, l)?;
    }
    Ok(())
}

/// Page-locked host allocations: base -> length.
fn host_set() -> std::sync::MutexGuard<'static, BTreeMap<usize, usize>> {
    static H: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    H.lock().unwrap_or_else(|e| e.into_inner())
}

/// Host ranges the program page-locked with `cuMemHostRegister`: base ->
/// length. The memory is the program's; unregistering never frees it.
fn registered_set() -> std::sync::MutexGuard<'static, BTreeMap<usize, usize>> {
    static R: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    R.lock().unwrap_or_else(|e| e.into_inner())
}

/// The range of `set` holding `p`, as (base, length).
fn range_holding(set: &BTreeMap<usize, usize>, p: usize) -> Option<(usize, usize)> {
    let (&b, &l) = set.range(..=p).next_back()?;
    (p < b + l).then_some((b, l))
}

/// The page-locked host range (allocated or registered) holding `p`.
pub(crate) fn host_range_of(p: usize) -> Option<(usize, usize)> {
    range_holding(&host_set(), p).or_else(|| range_holding(&registered_set(), p))
}

/// Whether `[p, p+n)` lies in page-locked memory from cuMemAllocHost /
/// cuMemHostAlloc / cuMemHostRegister (async copies with pageable memory
/// behave synchronously).
pub(crate) fn is_pinned(p: usize, n: usize) -> bool {
    host_range_of(p).is_some_and(|(b, l)| p.saturating_add(n) <= b + l)
}

fn mem_alloc_host(_: bool, p: *mut *mut c_void, size: usize) -> Res {
    current()?;
    if p.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut m: *mut c_void = std::ptr::null_mut();
    // SAFETY: `m` is a valid out pointer; 4096 is a power of two.
    if unsafe { libc::posix_memalign(&mut m, 4096, size) } != 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    host_set().insert(m as usize, size);
    out(p, m)
}

fn mem_host_alloc(_: bool, p: *mut *mut c_void, size: usize, _flags: c_uint) -> Res {
    mem_alloc_host(false, p, size)
}

fn mem_free_host(_: bool, p: *mut c_void) -> Res {
    drv()?;
    if host_set().remove(&(p as usize)).is_none() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: p came from posix_memalign in mem_alloc_host and is freed once.
    unsafe { libc::free(p) };
    Ok(())
}

/// `CU_MEMHOSTREGISTER_{PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY}` (cuda.h).
const HOST_REGISTER_FLAGS: c_uint = 0x0f;
const HOST_REGISTER_IOMEMORY: c_uint = 0x04;

/// `cuMemHostRegister`: page-locks the program's `[p, p+size)`. A range
/// overlapping one already page-locked is refused, as by the driver.
fn mem_host_register(_: bool, p: *mut c_void, size: usize, flags: c_uint) -> Res {
    current()?;
    let base = p as usize;
    if p.is_null() || size == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags & HOST_REGISTER_IOMEMORY != 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED); // no device's I/O space here
    }
    let end = base.checked_add(size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let overlaps = |set: &BTreeMap<usize, usize>| {
        set.range(..end)
            .next_back()
            .is_some_and(|(&b, &l)| b + l > base)
    };
    let mut registered = registered_set();
    if overlaps(&registered) || overlaps(&host_set()) {
        return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    }
    registered.insert(base, size);
    Ok(())
}

/// `cuMemHostUnregister`: `p` must be the base of a registered range.
fn mem_host_unregister(_: bool, p: *mut c_void) -> Res {
    drv()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    registered_set()
        .remove(&(p as usize))
        .map(|_| ())
        .ok_or(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
}

/// `cuMemHostGetDevicePointer_v2`: under unified addressing page-locked
/// host memory is reached from the device at its host address (and
/// simgpu's device memory is host memory too).
fn mem_host_device_pointer(_: bool, d: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) -> Res {
    current()?;
    if flags != 0 || host_range_of(p as usize).is_none() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(d, p as CUdeviceptr)
}

pub(crate) struct PoolObj {
    pub dev: usize,
    pub threshold: AtomicU64,
    pub used: AtomicU64,
    pub high: AtomicU64,
}

static POOLS: Registry<PoolObj> = Registry::new();

fn async_owners() -> std::sync::MutexGuard<'static, HashMap<u64, (usize, u64)>> {
    static A: OnceLock<Mutex<HashMap<u64, (usize, u64)>>> = OnceLock::new();
    A.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn default_pool_of(dev: usize) -> Res<usize> {
    static DEFAULTS: OnceLock<Vec<usize>> = OnceLock::new();
    let d = drv()?;
    let v = DEFAULTS.get_or_init(|| {
        (0..d.ndev())
            .map(|dev| {
                POOLS.insert(Arc::new(PoolObj {
                    dev,
                    threshold: AtomicU64::new(0),
                    used: AtomicU64::new(0),
                    high: AtomicU64::new(0),
                }))
            })
            .collect()
    });
    v.get(dev).copied().ok_or(CUDA_ERROR_INVALID_DEVICE)
}

fn alloc_in_pool(p: *mut CUdeviceptr, size: usize, pool_h: usize, s: CUstream, pt: bool) -> Res {
    let stream = resolve(s, pt)?;
    if p.is_null() || size == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pool = POOLS.get(pool_h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let d = drv()?;
    let ptr = d.alloc(pool.dev, size as u64)?;
    let n = charged(size as u64);
    let used = pool.used.fetch_add(n, AcqRel) + n;
    pool.high.fetch_max(used, AcqRel);
    if !d.null() {
        async_owners().insert(ptr, (pool_h, n));
    }
    let _ = stream;
    out(p, ptr)
}

fn mem_alloc_async(pt: bool, p: *mut CUdeviceptr, size: usize, s: CUstream) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::StreamOrderedMem);
    let stream = resolve(s, pt)?;
    let pool = default_pool_of(stream.dev)?;
    alloc_in_pool(p, size, pool, s, pt)
}

fn mem_alloc_from_pool(pt: bool, p: *mut CUdeviceptr, size: usize, pool: Pool, s: CUstream) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::StreamOrderedMem);
    alloc_in_pool(p, size, pool as usize, s, pt)
}

fn mem_free_async(pt: bool, p: CUdeviceptr, s: CUstream) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::StreamOrderedMem);
    let stream = resolve(s, pt)?;
    let d = drv()?;
    if d.null() {
        return Ok(());
    }
    if p == 0 || !d.arenas.iter().any(|a| a.contains(p as usize, 1)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    stream.enqueue(Op::Free { ptr: p })?;
    Ok(())
}

fn default_pool(_: bool, pool: *mut Pool, dev: sys::CUdevice) -> Res {
    let i = drv()?.check_dev(dev)?;
    out(pool, default_pool_of(i)? as Pool)
}

/// CUDA 13's pool query by location: device locations with pinned
/// allocations only (simgpu has no host or managed pools).
fn default_pool_at(_: bool, pool: *mut Pool, location: *const [c_int; 2], kind: c_int) -> Res {
    let [loc_type, id] = super::read(location)?;
    const LOCATION_DEVICE: c_int = 1;
    const ALLOCATION_PINNED: c_int = 1;
    if loc_type != LOCATION_DEVICE || kind != ALLOCATION_PINNED {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    default_pool(false, pool, id)
}

/// `location.id` of a CUmemPoolProps / CUmemAllocationProp: both start with
/// two 4-byte enums followed by CUmemLocation { type, id }.
pub(super) fn location_id(props: *const c_void) -> Res<c_int> {
    if props.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    read(props.cast::<u8>().wrapping_add(12).cast::<c_int>())
}

fn pool_create(_: bool, pool: *mut Pool, props: *const c_void) -> Res {
    let d = drv()?;
    let dev = d.check_dev(location_id(props)?)?;
    let h = POOLS.insert(Arc::new(PoolObj {
        dev,
        threshold: AtomicU64::new(0),
        used: AtomicU64::new(0),
        high: AtomicU64::new(0),
    }));
    out(pool, h as Pool)
}

fn pool_destroy(_: bool, pool: Pool) -> Res {
    drv()?;
    POOLS
        .remove(pool as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}

fn pool_set_attr(_: bool, pool: Pool, attr: c_int, v: *mut c_void) -> Res {
    drv()?;
    let p = POOLS.get(pool as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attr {
        1..=3 => {
            read(v.cast::<c_int>())?;
        }
        4 => p.threshold.store(read(v.cast::<u64>())?, Release),
        6 | 8 => {
            if read(v.cast::<u64>())? != 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            p.high.store(p.used.load(Acquire), Release);
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

fn pool_get_attr(_: bool, pool: Pool, attr: c_int, v: *mut c_void) -> Res {
    drv()?;
    let p = POOLS.get(pool as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match attr {
        1..=3 => out(v.cast::<c_int>(), 1),
        4 => out(v.cast::<u64>(), p.threshold.load(Acquire)),
        // No caching: reserved memory is exactly the memory in use.
        5 | 7 => out(v.cast::<u64>(), p.used.load(Acquire)),
        6 | 8 => out(v.cast::<u64>(), p.high.load(Acquire)),
        9 | 12 => out(v.cast::<c_int>(), 1),
        10 => out(v.cast::<c_int>(), 0),
        11 => out(v.cast::<c_int>(), p.dev as c_int),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn pool_trim(_: bool, pool: Pool, _keep: usize) -> Res {
    drv()?;
    POOLS.get(pool as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}

/// `CUDA_ARRAY_DESCRIPTOR` with the format read as a plain integer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: u32,
    pub channels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` with the format read as a plain integer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3DDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

struct ArrayObj {
    dev: usize,
    charge: u64,
}

impl Drop for ArrayObj {
    fn drop(&mut self) {
        if let Ok(d) = drv() {
            d.uncharge(self.dev, self.charge);
        }
    }
}

static ARRAYS: Registry<ArrayObj> = Registry::new();
static MIPMAPPED: Registry<ArrayObj> = Registry::new();

fn element_size(format: u32) -> Res<u64> {
    match format {
        1 | 8 => Ok(1),
        2 | 9 | 16 => Ok(2),
        3 | 10 | 32 => Ok(4),
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

/// Bytes of one array level: width × height × depth × channels × element.
fn array_bytes(w: usize, h: usize, dp: usize, format: u32, channels: u32) -> Res<u64> {
    if w == 0 || ![1, 2, 4].contains(&channels) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let e = element_size(format)?;
    (w as u64)
        .checked_mul(h.max(1) as u64)
        .and_then(|x| x.checked_mul(dp.max(1) as u64))
        .and_then(|x| x.checked_mul(channels as u64 * e))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn make_array(reg: &Registry<ArrayObj>, bytes: u64) -> Res<usize> {
    let c = current()?;
    let d = drv()?;
    let charge = charged(bytes);
    d.charge(c.dev, charge)?;
    Ok(reg.insert(Arc::new(ArrayObj { dev: c.dev, charge })))
}

fn array_create(_: bool, a: *mut sys::CUarray, desc: *const ArrayDesc) -> Res {
    let ds = read(desc)?;
    if a.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = array_bytes(ds.width, ds.height, 1, ds.format, ds.channels)?;
    out(a, make_array(&ARRAYS, bytes)? as sys::CUarray)
}

fn array3d_create(_: bool, a: *mut sys::CUarray, desc: *const Array3DDesc) -> Res {
    let ds = read(desc)?;
    if a.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = array_bytes(ds.width, ds.height, ds.depth, ds.format, ds.channels)?;
    out(a, make_array(&ARRAYS, bytes)? as sys::CUarray)
}

fn array_destroy(_: bool, a: sys::CUarray) -> Res {
    drv()?;
    ARRAYS.remove(a as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}

fn mipmapped_create(
    _: bool,
    a: *mut sys::CUmipmappedArray,
    desc: *const Array3DDesc,
    levels: c_uint,
) -> Res {
    let ds = read(desc)?;
    if a.is_null() || levels == 0 || levels > 32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut total = 0u64;
    for l in 0..levels {
        let lvl = |x: usize| if x == 0 { 0 } else { (x >> l).max(1) };
        total = total
            .checked_add(array_bytes(
                lvl(ds.width),
                lvl(ds.height),
                lvl(ds.depth),
                ds.format,
                ds.channels,
            )?)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    }
    out(a, make_array(&MIPMAPPED, total)? as sys::CUmipmappedArray)
}

fn mipmapped_destroy(_: bool, a: sys::CUmipmappedArray) -> Res {
    drv()?;
    MIPMAPPED
        .remove(a as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}
