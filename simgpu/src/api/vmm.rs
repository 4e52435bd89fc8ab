//! Virtual memory management: physical allocations (`cuMemCreate`),
//! reserved address ranges, mapping one onto the other, and which device a
//! mapped range is on.

use super::mem::location_id;
use super::out;
use crate::Res;
use crate::driver::{Registry, drv};
use crate::memory::{Phys, Reservation, VMM_GRANULE, protect_none};
use dilu_abi::cuda::*;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

type CUdeviceptr = sys::CUdeviceptr;

export! {
    fn cuMemGetAllocationGranularity(g: *mut usize, prop: *const c_void, option: c_int) => granularity;
    fn cuMemCreate(h: *mut u64, size: usize, prop: *const c_void, flags: u64) => vmm_create;
    fn cuMemRelease(h: u64) => vmm_release;
    fn cuMemAddressReserve(p: *mut CUdeviceptr, size: usize, align: usize, addr: CUdeviceptr, flags: u64) => vmm_reserve;
    fn cuMemAddressFree(p: CUdeviceptr, size: usize) => vmm_address_free;
    fn cuMemMap(p: CUdeviceptr, size: usize, offset: usize, h: u64, flags: u64) => vmm_map;
    fn cuMemUnmap(p: CUdeviceptr, size: usize) => vmm_unmap;
    fn cuMemSetAccess(p: CUdeviceptr, size: usize, desc: *const c_void, count: usize) => vmm_set_access;
}

fn granularity(_: bool, g: *mut usize, prop: *const c_void, _option: c_int) -> Res {
    let d = drv()?;
    d.check_dev(location_id(prop)?)?;
    out(g, VMM_GRANULE)
}

static PHYS: Registry<Phys> = Registry::new();

/// The physical allocation behind handle `h`.
pub(crate) fn phys_of(h: u64) -> Option<Arc<Phys>> {
    PHYS.get(h as usize)
}

/// Registers a physical allocation; its handle.
pub(crate) fn insert_phys(p: Arc<Phys>) -> u64 {
    PHYS.insert(p) as u64
}

fn reservations() -> std::sync::MutexGuard<'static, BTreeMap<usize, Reservation>> {
    static R: Mutex<BTreeMap<usize, Reservation>> = Mutex::new(BTreeMap::new());
    R.lock().unwrap_or_else(|e| e.into_inner())
}

/// Device of a mapped VMM range, if `[ptr, ptr+len)` lies in mappings of
/// one reservation that follow each other without a hole, all of one
/// device. (PyTorch's expandable segments map one handle per segment and
/// set access, copy and launch across several.)
pub(crate) fn vmm_dev(ptr: usize, len: usize) -> Option<usize> {
    let r = reservations();
    let (&start, res) = r.range(..=ptr).next_back()?;
    let off = ptr - start;
    let end = off.checked_add(len)?;
    if end > res.size {
        return None;
    }
    let (&first, (first_len, phys)) = res.maps.range(..=off).next_back()?;
    let dev = phys.dev;
    let mut covered = first + first_len;
    if covered <= off {
        return None;
    }
    for (&mo, (ml, phys)) in res.maps.range(covered..) {
        if covered >= end {
            break;
        }
        if mo != covered || phys.dev != dev {
            return None;
        }
        covered = mo + ml;
    }
    (covered >= end).then_some(dev)
}

fn vmm_create(_: bool, h: *mut u64, size: usize, prop: *const c_void, _flags: u64) -> Res {
    let d = drv()?;
    let dev = d.check_dev(location_id(prop)?)?;
    if h.is_null() || size == 0 || !size.is_multiple_of(VMM_GRANULE) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if d.null() {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    d.charge(dev, size as u64)?;
    let Some(p) = Phys::new(size, dev, size as u64) else {
        d.uncharge(dev, size as u64);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    };
    let handle = PHYS.insert(Arc::new(p));
    out(h, handle as u64)
}

fn vmm_release(_: bool, h: u64) -> Res {
    drv()?;
    PHYS.remove(h as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}

fn vmm_reserve(
    _: bool,
    p: *mut CUdeviceptr,
    size: usize,
    align: usize,
    _addr: CUdeviceptr,
    _f: u64,
) -> Res {
    drv()?;
    if p.is_null()
        || size == 0
        || !size.is_multiple_of(VMM_GRANULE)
        || (align != 0 && !align.is_power_of_two())
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let align = align.max(VMM_GRANULE);
    let total = size.checked_add(align).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: an inaccessible anonymous mapping at a kernel-chosen address.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let m = m as usize;
    let start = m.div_ceil(align) * align;
    // SAFETY: trimming the unaligned head and the tail of the mapping we just
    // created; [start, start+size) stays mapped.
    unsafe {
        if start > m {
            libc::munmap(m as *mut c_void, start - m);
        }
        let end = start + size;
        if m + total > end {
            libc::munmap(end as *mut c_void, m + total - end);
        }
    }
    reservations().insert(
        start,
        Reservation {
            size,
            maps: BTreeMap::new(),
        },
    );
    out(p, start as u64)
}

fn vmm_address_free(_: bool, p: CUdeviceptr, size: usize) -> Res {
    drv()?;
    let mut r = reservations();
    match r.get(&(p as usize)) {
        Some(res) if res.size == size => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    r.remove(&(p as usize));
    // SAFETY: the whole reservation is ours and no longer registered.
    unsafe { libc::munmap(p as *mut c_void, size) };
    Ok(())
}

fn vmm_map(_: bool, p: CUdeviceptr, size: usize, offset: usize, h: u64, _flags: u64) -> Res {
    drv()?;
    let phys = PHYS.get(h as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let ptr = p as usize;
    if size == 0 || offset.checked_add(size).is_none_or(|e| e > phys.size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut r = reservations();
    let (&start, res) = r
        .range_mut(..=ptr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let off = ptr - start;
    if off + size > res.size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let overlaps = res
        .maps
        .range(..off + size)
        .next_back()
        .is_some_and(|(&mo, (ml, _))| mo + ml > off);
    if overlaps {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: [ptr, ptr+size) lies inside a reservation we own and is not
    // mapped; MAP_FIXED replaces only that inaccessible range with a shared
    // view of the handle's memfd, so every mapping aliases the same bytes.
    let m = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            phys.fd,
            offset as libc::off_t,
        )
    };
    if m == libc::MAP_FAILED {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    res.maps.insert(off, (size, phys));
    Ok(())
}

fn vmm_unmap(_: bool, p: CUdeviceptr, size: usize) -> Res {
    drv()?;
    let ptr = p as usize;
    let mut r = reservations();
    let (&start, res) = r
        .range_mut(..=ptr)
        .next_back()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let off = ptr - start;
    if off + size > res.size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let gone: Vec<usize> = res
        .maps
        .range(off..off + size)
        .filter(|(mo, (ml, _))| *mo + ml <= off + size)
        .map(|(mo, _)| *mo)
        .collect();
    if gone.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for mo in gone {
        res.maps.remove(&mo);
    }
    if !protect_none(ptr, size) {
        return Err(CUDA_ERROR_UNKNOWN);
    }
    Ok(())
}

fn vmm_set_access(_: bool, p: CUdeviceptr, size: usize, desc: *const c_void, count: usize) -> Res {
    drv()?;
    if desc.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    vmm_dev(p as usize, size).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}
