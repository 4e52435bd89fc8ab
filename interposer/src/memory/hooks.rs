//! Hook bodies of the memory rows: every allocation path is charged to the
//! tenant's budget before the driver runs, every free gives back exactly
//! what its allocation was charged, and memory queries report the budget.
//! With no budget configured each hook is one atomic load plus the call.

#![allow(clippy::too_many_arguments)]

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};

use dilu_abi::cuda::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUarray, CUdevice, CUdeviceptr, CUipcMemHandle,
    CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemoryPool, CUmipmappedArray, CUstream,
};
use dilu_abi::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use dilu_layout::ledger::UNLIMITED;

use crate::memory::budget::{self, TAG_ARRAY, TAG_HANDLE, TAG_MIPMAPPED};
use crate::memory::{ipc_sharing, vmm_sharing};
use crate::table::Cx;

/// Reads an out-parameter the driver has just written (after success).
fn written<T: Copy>(pointer: *const T) -> T {
    // SAFETY: only called after the driver returned CUDA_SUCCESS for a call
    // whose contract is to write a T through this (non-null) pointer.
    unsafe { pointer.read() }
}

pub fn mem_alloc(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    match budget::get() {
        None => next(dptr, bytesize),
        Some(b) => b.allocate(bytesize as u64, || next(dptr, bytesize), || written(dptr)),
    }
}

pub fn mem_alloc_managed(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    match budget::get() {
        None => next(dptr, bytesize, flags),
        Some(b) => b.allocate(
            bytesize as u64,
            || next(dptr, bytesize, flags),
            || written(dptr),
        ),
    }
}

/// Rows allocated with pitch `p` are at most this much wider than asked:
/// drivers align pitches to at most 512 bytes.
const MAX_PITCH_ALIGN: usize = 512;

pub fn mem_alloc_pitch(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    let Some(b) = budget::get() else {
        return next(dptr, pitch, width_bytes, height, element_size_bytes);
    };
    // Reserve the widest pitch the driver may choose, then settle on the
    // pitch × height it really allocated.
    let widest = width_bytes
        .div_ceil(MAX_PITCH_ALIGN)
        .saturating_mul(MAX_PITCH_ALIGN)
        .saturating_mul(height);
    let result = b.allocate(
        widest as u64,
        || next(dptr, pitch, width_bytes, height, element_size_bytes),
        || written(dptr),
    );
    if result != CUDA_SUCCESS {
        return result;
    }
    let actual = (written(pitch) as u64).saturating_mul(height as u64);
    if b.settle(written(dptr), actual).is_err() {
        // The driver chose a wider pitch than any known one and the
        // difference does not fit: undo the allocation.
        let _ = b.free(written(dptr), || budget::real_mem_free(written(dptr)));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result
}

pub fn mem_free(
    _cx: Cx,
    next: impl FnOnce(CUdeviceptr) -> CUresult,
    dptr: CUdeviceptr,
) -> CUresult {
    match budget::get() {
        None => next(dptr),
        Some(b) => ipc_sharing::free(b, dptr, || next(dptr)),
    }
}

pub fn ipc_get_mem_handle(
    _cx: Cx,
    next: impl FnOnce(*mut CUipcMemHandle, CUdeviceptr) -> CUresult,
    handle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
) -> CUresult {
    let result = next(handle, dptr);
    if result == CUDA_SUCCESS && budget::get().is_some() {
        ipc_sharing::exported(dptr, &handle_bytes(&written(handle)));
    }
    result
}

pub fn ipc_open_mem_handle(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    flags: c_uint,
) -> CUresult {
    let result = next(dptr, handle, flags);
    if result == CUDA_SUCCESS {
        ipc_sharing::opened(written(dptr), &handle_bytes(&handle));
    }
    result
}

pub fn ipc_close_mem_handle(
    _cx: Cx,
    next: impl FnOnce(CUdeviceptr) -> CUresult,
    dptr: CUdeviceptr,
) -> CUresult {
    let result = next(dptr);
    if result == CUDA_SUCCESS {
        ipc_sharing::closed(dptr);
    }
    result
}

fn handle_bytes(handle: &CUipcMemHandle) -> [u8; 64] {
    handle.reserved.map(|c| c as u8)
}

/// Stream-ordered allocations are charged when enqueued, like the pool
/// reserves them.
pub fn mem_alloc_async(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize, CUstream) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    match budget::get() {
        None => next(dptr, bytesize, stream),
        Some(b) => b.allocate(
            bytesize as u64,
            || next(dptr, bytesize, stream),
            || written(dptr),
        ),
    }
}

pub fn mem_alloc_from_pool_async(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    match budget::get() {
        None => next(dptr, bytesize, pool, stream),
        Some(b) => b.allocate(
            bytesize as u64,
            || next(dptr, bytesize, pool, stream),
            || written(dptr),
        ),
    }
}

/// A stream-ordered free gives the charge back when it is enqueued: work
/// later in the same stream may reuse the memory from then on, which is what
/// the driver's pool allows too.
pub fn mem_free_async(
    _cx: Cx,
    next: impl FnOnce(CUdeviceptr, CUstream) -> CUresult,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    match budget::get() {
        None => next(dptr, stream),
        Some(b) => b.free(dptr, || next(dptr, stream)),
    }
}

/// Physical memory of the virtual memory API is charged at `cuMemCreate`;
/// mapping the handle (`cuMemMap`, any number of times) charges nothing more.
pub fn mem_create(
    _cx: Cx,
    next: impl FnOnce(
        *mut CUmemGenericAllocationHandle,
        usize,
        *const CUmemAllocationProp,
        c_ulonglong,
    ) -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    match budget::get() {
        None => next(handle, size, prop, flags),
        Some(b) => b.allocate(
            size as u64,
            || next(handle, size, prop, flags),
            || TAG_HANDLE | written(handle),
        ),
    }
}

pub fn mem_release(
    _cx: Cx,
    next: impl FnOnce(CUmemGenericAllocationHandle) -> CUresult,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    let result = match budget::get() {
        None => next(handle),
        Some(b) => ipc_sharing::free(b, TAG_HANDLE | handle, || next(handle)),
    };
    if result == CUDA_SUCCESS {
        vmm_sharing::released(handle);
    }
    result
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the one kind shared by a
/// descriptor (the others are Win32 handles and fabric handles).
const POSIX_FILE_DESCRIPTOR: u32 = 1;

pub fn mem_export_to_shareable_handle(
    _cx: Cx,
    next: impl FnOnce(*mut c_void, CUmemGenericAllocationHandle, c_uint, c_ulonglong) -> CUresult,
    shareable_handle: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: c_uint,
    flags: c_ulonglong,
) -> CUresult {
    let result = next(shareable_handle, handle, handle_type, flags);
    if result == CUDA_SUCCESS && handle_type == POSIX_FILE_DESCRIPTOR && !shareable_handle.is_null()
    {
        vmm_sharing::exported(handle, written(shareable_handle.cast::<c_int>()));
    }
    result
}

pub fn mem_import_from_shareable_handle(
    _cx: Cx,
    next: impl FnOnce(*mut CUmemGenericAllocationHandle, *mut c_void, c_uint) -> CUresult,
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: c_uint,
) -> CUresult {
    let result = next(handle, os_handle, handle_type);
    if result == CUDA_SUCCESS && handle_type == POSIX_FILE_DESCRIPTOR && !handle.is_null() {
        // The descriptor travels in the pointer's bits, as NVIDIA's API has it.
        vmm_sharing::imported(written(handle), os_handle as usize as c_int);
    }
    result
}

/// Bytes per channel element of a `CUarray_format` (cuda.h values). Formats
/// not listed are charged 4 bytes per channel.
fn element_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // UNSIGNED_INT8, SIGNED_INT8
        0x02 | 0x09 | 0x10 => 2, // UNSIGNED_INT16, SIGNED_INT16, HALF
        _ => 4,                  // UNSIGNED_INT32, SIGNED_INT32, FLOAT, others
    }
}

/// Bytes of one array (level): width × height × depth × channels × element.
fn array_bytes(width: usize, height: usize, depth: usize, format: u32, channels: u32) -> u64 {
    (width as u64)
        .saturating_mul(height.max(1) as u64)
        .saturating_mul(depth.max(1) as u64)
        .saturating_mul(u64::from(channels) * element_bytes(format))
}

/// Reads `Format` as a raw integer: a Rust enum must not hold a value the
/// bindings do not know.
fn raw_format<T>(field: *const T) -> u32 {
    // SAFETY: CUarray_format is a C enum (4 bytes) inside a descriptor the
    // caller passed us; reading its bits as u32 is always defined.
    unsafe { field.cast::<u32>().read() }
}

pub fn array_create(
    _cx: Cx,
    next: impl FnOnce(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR) -> CUresult,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    let Some(b) = budget::get().filter(|_| !desc.is_null()) else {
        return next(array, desc);
    };
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let d = unsafe { &*desc };
    let bytes = array_bytes(
        d.Width,
        d.Height,
        1,
        raw_format(&raw const d.Format),
        d.NumChannels,
    );
    b.allocate(
        bytes,
        || next(array, desc),
        || TAG_ARRAY | written(array) as u64,
    )
}

pub fn array3d_create(
    _cx: Cx,
    next: impl FnOnce(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    let Some(b) = budget::get().filter(|_| !desc.is_null()) else {
        return next(array, desc);
    };
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let d = unsafe { &*desc };
    let bytes = array_bytes(
        d.Width,
        d.Height,
        d.Depth,
        raw_format(&raw const d.Format),
        d.NumChannels,
    );
    b.allocate(
        bytes,
        || next(array, desc),
        || TAG_ARRAY | written(array) as u64,
    )
}

pub fn array_destroy(_cx: Cx, next: impl FnOnce(CUarray) -> CUresult, array: CUarray) -> CUresult {
    match budget::get() {
        None => next(array),
        Some(b) => b.free(TAG_ARRAY | array as u64, || next(array)),
    }
}

pub fn mipmapped_array_create(
    _cx: Cx,
    next: impl FnOnce(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint) -> CUresult,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    let Some(b) = budget::get().filter(|_| !desc.is_null()) else {
        return next(array, desc, levels);
    };
    // SAFETY: desc is non-null and points to the caller's descriptor.
    let d = unsafe { &*desc };
    let format = raw_format(&raw const d.Format);
    let level = |extent: usize, l: u32| if extent == 0 { 0 } else { (extent >> l).max(1) };
    let bytes = (0..levels.min(32))
        .map(|l| {
            array_bytes(
                level(d.Width, l),
                level(d.Height, l),
                level(d.Depth, l),
                format,
                d.NumChannels,
            )
        })
        .fold(0u64, u64::saturating_add);
    b.allocate(
        bytes,
        || next(array, desc, levels),
        || TAG_MIPMAPPED | written(array) as u64,
    )
}

pub fn mipmapped_array_destroy(
    _cx: Cx,
    next: impl FnOnce(CUmipmappedArray) -> CUresult,
    array: CUmipmappedArray,
) -> CUresult {
    match budget::get() {
        None => next(array),
        Some(b) => b.free(TAG_MIPMAPPED | array as u64, || next(array)),
    }
}

/// `cuMemGetInfo`: total is the budget, free is what the budget has left,
/// never more than the device really has free and never below zero.
pub fn mem_get_info(
    _cx: Cx,
    next: impl FnOnce(*mut usize, *mut usize) -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    let result = next(free, total);
    let Some(b) = budget::get() else {
        return result;
    };
    if result != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return result;
    }
    let device = b.current_device();
    if b.budget_of(device) == UNLIMITED {
        return result;
    }
    // The context allowance is part of what this process occupies; graph
    // memory the driver has given back is not.
    if let Some(slot) = b.slot() {
        let _ = b.charge_context(slot, device);
    }
    crate::memory::graph_memory::reconcile_all();
    ipc_sharing::release_unmapped();
    // SAFETY: both pointers are non-null and the driver just wrote them.
    unsafe {
        if let Some((t, f)) = b.view(device, *total as u64, *free as u64) {
            (*total, *free) = (t as usize, f as usize);
        }
    }
    result
}

/// `cuDeviceTotalMem`: a budgeted device looks as large as its budget.
pub fn device_total_mem(
    _cx: Cx,
    next: impl FnOnce(*mut usize, CUdevice) -> CUresult,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    let result = next(bytes, dev);
    let Some(b) = budget::get() else {
        return result;
    };
    if result != CUDA_SUCCESS || bytes.is_null() || dev < 0 || dev as usize >= b.device_count() {
        return result;
    }
    let limit = b.budget_of(dev as usize);
    if limit != UNLIMITED {
        // SAFETY: non-null and just written by the driver.
        unsafe { *bytes = (*bytes).min(limit as usize) };
    }
    result
}
