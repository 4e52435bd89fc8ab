//! Hook bodies, one per table row in `hooks.rs` (shared by a row's
//! per-thread-stream variant; `cx.per_thread` tells them apart).
//!
//! Contract: a handler receives the call context, `next` (which calls the
//! real driver function) and the C arguments. It must stay on the hot-path
//! budget: atomics only, no lock, no syscall, no allocation, no `getenv`, no
//! logging unless enabled. Today every handler passes the call through; memory
//! budgets, SM-time token buckets and telemetry fill these bodies in later.
//!
//! Raw pointers received here come straight from the C caller: only
//! dereference them (in an `unsafe` block with a `// SAFETY:` comment) after
//! `next` reported success, as the driver contract then guarantees them.

#![allow(clippy::too_many_arguments)]

use core::ffi::{c_uint, c_ulonglong, c_void};

use dilu_abi::cuda::CUresult;
use dilu_abi::cuda::sys::{
    CUDA_ARRAY_DESCRIPTOR, CUDA_ARRAY3D_DESCRIPTOR, CUDA_LAUNCH_PARAMS, CUarray, CUdevice,
    CUdeviceptr, CUevent, CUfunction, CUgraphExec, CUlaunchConfig, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUmemoryPool, CUmipmappedArray, CUstream,
};

use crate::table::Cx;

// ---- memory ---------------------------------------------------------------

pub fn mem_alloc(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
) -> CUresult {
    next(dptr, bytesize)
}

pub fn mem_free(
    _cx: Cx,
    next: impl FnOnce(CUdeviceptr) -> CUresult,
    dptr: CUdeviceptr,
) -> CUresult {
    next(dptr)
}

pub fn mem_get_info(
    _cx: Cx,
    next: impl FnOnce(*mut usize, *mut usize) -> CUresult,
    free: *mut usize,
    total: *mut usize,
) -> CUresult {
    next(free, total)
}

pub fn mem_alloc_pitch(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width_bytes: usize,
    height: usize,
    element_size_bytes: c_uint,
) -> CUresult {
    next(dptr, pitch, width_bytes, height, element_size_bytes)
}

pub fn mem_alloc_managed(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize, c_uint) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    flags: c_uint,
) -> CUresult {
    next(dptr, bytesize, flags)
}

pub fn mem_alloc_async(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize, CUstream) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
) -> CUresult {
    next(dptr, bytesize, stream)
}

pub fn mem_free_async(
    _cx: Cx,
    next: impl FnOnce(CUdeviceptr, CUstream) -> CUresult,
    dptr: CUdeviceptr,
    stream: CUstream,
) -> CUresult {
    next(dptr, stream)
}

pub fn mem_alloc_from_pool_async(
    _cx: Cx,
    next: impl FnOnce(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult,
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> CUresult {
    next(dptr, bytesize, pool, stream)
}

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
    next(handle, size, prop, flags)
}

pub fn mem_release(
    _cx: Cx,
    next: impl FnOnce(CUmemGenericAllocationHandle) -> CUresult,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    next(handle)
}

pub fn array_create(
    _cx: Cx,
    next: impl FnOnce(*mut CUarray, *const CUDA_ARRAY_DESCRIPTOR) -> CUresult,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY_DESCRIPTOR,
) -> CUresult {
    next(array, desc)
}

pub fn array3d_create(
    _cx: Cx,
    next: impl FnOnce(*mut CUarray, *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult,
    array: *mut CUarray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
) -> CUresult {
    next(array, desc)
}

pub fn array_destroy(_cx: Cx, next: impl FnOnce(CUarray) -> CUresult, array: CUarray) -> CUresult {
    next(array)
}

pub fn mipmapped_array_create(
    _cx: Cx,
    next: impl FnOnce(*mut CUmipmappedArray, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint) -> CUresult,
    array: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: c_uint,
) -> CUresult {
    next(array, desc, levels)
}

pub fn mipmapped_array_destroy(
    _cx: Cx,
    next: impl FnOnce(CUmipmappedArray) -> CUresult,
    array: CUmipmappedArray,
) -> CUresult {
    next(array)
}

pub fn device_total_mem(
    _cx: Cx,
    next: impl FnOnce(*mut usize, CUdevice) -> CUresult,
    bytes: *mut usize,
    dev: CUdevice,
) -> CUresult {
    next(bytes, dev)
}

// ---- launches -------------------------------------------------------------

pub fn launch_kernel(
    _cx: Cx,
    next: impl FnOnce(
        CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CUstream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CUresult,
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    next(
        f,
        grid_x,
        grid_y,
        grid_z,
        block_x,
        block_y,
        block_z,
        shared_mem_bytes,
        stream,
        params,
        extra,
    )
}

pub fn launch_kernel_ex(
    _cx: Cx,
    next: impl FnOnce(*const CUlaunchConfig, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    next(config, f, params, extra)
}

pub fn launch_cooperative_kernel(
    _cx: Cx,
    next: impl FnOnce(
        CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        CUstream,
        *mut *mut c_void,
    ) -> CUresult,
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    next(
        f,
        grid_x,
        grid_y,
        grid_z,
        block_x,
        block_y,
        block_z,
        shared_mem_bytes,
        stream,
        params,
    )
}

pub fn launch_cooperative_kernel_multi_device(
    _cx: Cx,
    next: impl FnOnce(*mut CUDA_LAUNCH_PARAMS, c_uint, c_uint) -> CUresult,
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    flags: c_uint,
) -> CUresult {
    next(list, num_devices, flags)
}

pub fn graph_launch(
    _cx: Cx,
    next: impl FnOnce(CUgraphExec, CUstream) -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    next(exec, stream)
}

// ---- synchronisation ------------------------------------------------------

pub fn stream_synchronize(
    _cx: Cx,
    next: impl FnOnce(CUstream) -> CUresult,
    stream: CUstream,
) -> CUresult {
    next(stream)
}

pub fn ctx_synchronize(_cx: Cx, next: impl FnOnce() -> CUresult) -> CUresult {
    next()
}

pub fn event_synchronize(
    _cx: Cx,
    next: impl FnOnce(CUevent) -> CUresult,
    event: CUevent,
) -> CUresult {
    next(event)
}
