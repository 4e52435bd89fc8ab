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

use core::ffi::{c_uint, c_void};

use dilu_abi::cuda::CUresult;
use dilu_abi::cuda::sys::{
    CUDA_LAUNCH_PARAMS, CUevent, CUfunction, CUgraphExec, CUlaunchConfig, CUstream,
};

use crate::table::Cx;

// ---- memory ---------------------------------------------------------------

pub use crate::memory_hooks::{
    array_create, array_destroy, array3d_create, device_total_mem, mem_alloc, mem_alloc_async,
    mem_alloc_from_pool_async, mem_alloc_managed, mem_alloc_pitch, mem_create, mem_free,
    mem_free_async, mem_get_info, mem_release, mipmapped_array_create, mipmapped_array_destroy,
};

pub use crate::graph_memory::{
    device_graph_mem_trim, graph_add_node, graph_add_node_v2, graph_destroy, graph_exec_destroy,
    graph_instantiate, graph_instantiate_with_flags, graph_instantiate_with_params,
};

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
