//! Pointer attributes (`cuPointerGetAttribute`, `cuPointerGetAttributes`):
//! what PyTorch asks to tell pinned from pageable host memory
//! (`is_pinned`, `pin_memory`) and device memory's device.
//!
//! Device memory is an allocation in a device's arena (or a mapped VMM
//! range), page-locked host memory an allocation of `cuMemAllocHost` /
//! `cuMemHostAlloc` or a `cuMemHostRegister`ed range; both are reached at
//! the same address from host and device (unified addressing). Managed
//! memory is device memory here (`IS_MANAGED` is 0). Attributes simgpu has
//! no answer for (`P2P_TOKENS`, `BUFFER_ID`, access flags, handle types,
//! VMM mapping details) are `CUDA_ERROR_NOT_SUPPORTED`.

use super::mem::host_range_of;
use super::vmm::vmm_dev;
use crate::Res;
use crate::driver::{current, drv};
use dilu_abi::cuda::*;
use std::ffi::{c_int, c_uint, c_void};

type CUdeviceptr = sys::CUdeviceptr;

export! {
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, p: CUdeviceptr) => get_attribute;
    fn cuPointerGetAttributes(n: c_uint, attributes: *const c_int, data: *mut *mut c_void, p: CUdeviceptr) => get_attributes;
}

/// `CUpointer_attribute` values (cuda.h) answered here.
const CONTEXT: c_int = 1;
const MEMORY_TYPE: c_int = 2;
const DEVICE_POINTER: c_int = 3;
const HOST_POINTER: c_int = 4;
const SYNC_MEMOPS: c_int = 6;
const IS_MANAGED: c_int = 8;
const DEVICE_ORDINAL: c_int = 9;
const IS_LEGACY_CUDA_IPC_CAPABLE: c_int = 10;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;
const MAPPED: c_int = 13;
const IS_GPU_DIRECT_RDMA_CAPABLE: c_int = 15;
const MEMPOOL_HANDLE: c_int = 17;

/// `CUmemorytype` (cuda.h).
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;

/// What simgpu knows of the memory at an address.
#[derive(Clone, Copy)]
struct Found {
    device_memory: bool,
    /// Device ordinal (of the calling thread's context for host memory).
    device: usize,
    /// The allocation or registered range holding the address.
    start: usize,
    size: usize,
}

fn find(p: usize) -> Option<Found> {
    let d = drv().ok()?;
    if let Some((device, (start, size))) = d
        .arenas
        .iter()
        .enumerate()
        .find_map(|(i, a)| Some((i, a.range_of(p)?)))
    {
        return Some(Found {
            device_memory: true,
            device,
            start,
            size,
        });
    }
    if let Some(device) = vmm_dev(p, 1) {
        // The range asked for is all that is known to be mapped.
        return Some(Found {
            device_memory: true,
            device,
            start: p,
            size: 1,
        });
    }
    let (start, size) = host_range_of(p)?;
    Some(Found {
        device_memory: false,
        device: current().map_or(0, |c| c.dev),
        start,
        size,
    })
}

/// Writes `v` to `data` (non-null, checked by the callers).
fn put<T>(data: *mut c_void, v: T) {
    // SAFETY: the caller of the CUDA function promises `data` points to
    // memory of the attribute's type, which is T.
    unsafe { data.cast::<T>().write_unaligned(v) };
}

/// Writes attribute `attribute` of `found` (None: not a CUDA pointer, the
/// attribute's zero, as `cuPointerGetAttributes` reports it).
fn write(data: *mut c_void, attribute: c_int, p: usize, found: Option<Found>) -> Res {
    let f = found.unwrap_or(Found {
        device_memory: false,
        device: 0,
        start: 0,
        size: 0,
    });
    let known = found.is_some();
    match attribute {
        CONTEXT => {
            let ctx = match found {
                Some(f) => drv()?.primary.get(f.device).map_or(0, |c| c.handle()),
                None => 0,
            };
            put(data, ctx as sys::CUcontext)
        }
        MEMORY_TYPE => put(
            data,
            match found {
                Some(f) if f.device_memory => MEMORYTYPE_DEVICE,
                Some(_) => MEMORYTYPE_HOST,
                None => 0,
            },
        ),
        DEVICE_POINTER => put(data, if known { p as CUdeviceptr } else { 0 }),
        HOST_POINTER => put(data, if known { p } else { 0 } as *mut c_void),
        SYNC_MEMOPS | IS_MANAGED | IS_LEGACY_CUDA_IPC_CAPABLE | IS_GPU_DIRECT_RDMA_CAPABLE => {
            put(data, 0 as c_int)
        }
        MAPPED => put(data, known as c_int),
        DEVICE_ORDINAL => put(data, f.device as c_int),
        RANGE_START_ADDR => put(data, f.start as CUdeviceptr),
        RANGE_SIZE => put(data, f.size),
        MEMPOOL_HANDLE => put(data, std::ptr::null_mut::<c_void>()),
        _ => return Err(CUDA_ERROR_NOT_SUPPORTED),
    }
    Ok(())
}

/// `cuPointerGetAttribute`: an address simgpu did not hand out (or page-lock)
/// is `CUDA_ERROR_INVALID_VALUE`.
fn get_attribute(_: bool, data: *mut c_void, attribute: c_int, p: CUdeviceptr) -> Res {
    drv()?;
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let found = find(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    write(data, attribute, p as usize, Some(found))
}

/// `cuPointerGetAttributes`: every attribute at once; an address that is
/// not a CUDA pointer gets each attribute's empty value and success.
fn get_attributes(
    _: bool,
    n: c_uint,
    attributes: *const c_int,
    data: *mut *mut c_void,
    p: CUdeviceptr,
) -> Res {
    drv()?;
    if n == 0 || attributes.is_null() || data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passes `n` attributes and `n` data pointers.
    let (attributes, data) = unsafe {
        (
            std::slice::from_raw_parts(attributes, n as usize),
            std::slice::from_raw_parts(data, n as usize),
        )
    };
    if data.iter().any(|d| d.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let found = find(p as usize);
    for (&attribute, &slot) in attributes.iter().zip(data) {
        write(slot, attribute, p as usize, found)?;
    }
    Ok(())
}
