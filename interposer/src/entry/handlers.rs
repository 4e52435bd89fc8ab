//! Hook bodies, one per table row in `table/rows.rs` (shared by a row's
//! per-thread-stream variant; `cx.per_thread` tells them apart).
//!
//! Contract: a handler receives the call context, `next` (which calls the
//! real driver function) and the C arguments. It must stay on the hot-path
//! budget: atomics only, no lock, no syscall, no allocation, no `getenv`, no
//! logging unless enabled (a launch that must wait for SM-time tokens sleeps:
//! that is the throttling itself).
//!
//! Raw pointers received here come straight from the C caller: only
//! dereference them (in an `unsafe` block with a `// SAFETY:` comment) after
//! `next` reported success, as the driver contract then guarantees them.

#![allow(clippy::too_many_arguments)]

use core::ffi::{c_uint, c_void};

use dilu_abi::cuda::sys::{
    CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, CUDA_LAUNCH_PARAMS, CUcontext, CUdevice, CUdeviceptr,
    CUevent, CUexternalSemaphore, CUfunction, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode,
    CUlaunchConfig, CUstream, CUstreamBatchMemOpParams,
};
use dilu_abi::cuda::{CUDA_SUCCESS, CUresult};

use crate::sm_time::kernel_estimates::LaunchKey;
use crate::sm_time::{
    colocation, fair_turns, launch_control, recent_streams, sampler, stream_capture,
};
use crate::table::Cx;
use crate::telemetry::sync;

// ---- memory ---------------------------------------------------------------

pub use crate::memory::hooks::{
    array_create, array_destroy, array3d_create, device_total_mem, ipc_close_mem_handle,
    ipc_get_mem_handle, ipc_open_mem_handle, mem_alloc, mem_alloc_async, mem_alloc_from_pool_async,
    mem_alloc_managed, mem_alloc_pitch, mem_create, mem_export_to_shareable_handle, mem_free,
    mem_free_async, mem_get_info, mem_import_from_shareable_handle, mem_release,
    mipmapped_array_create, mipmapped_array_destroy,
};

pub use crate::memory::driver_reserved::{ctx_set_limit, mem_pool_set_attribute};
pub use crate::memory::v1::{mem_alloc_pitch_v1, mem_alloc_v1, mem_free_v1, mem_get_info_v1};

pub use crate::memory::graph_memory::{
    device_graph_mem_trim, graph_add_node, graph_add_node_v2, graph_destroy, graph_exec_destroy,
    graph_instantiate, graph_instantiate_with_flags, graph_instantiate_with_params,
};

// ---- launches -------------------------------------------------------------
//
// Every launch is admitted by `launch_control::admit_launch` (charged to the
// tenant's SM-time bucket, delayed while it is in debt, sometimes chosen for
// timing). The launch itself is left to the exported wrapper, which makes
// it from its own arguments: at once (`Launch::Now`), as its last act, or
// between the sampler's events (`Launch::Around` a `TimedLaunch`). A
// handler that held the arguments in a closure for the timed case had them
// copied on every launch. The launch handlers are inlined into their
// exported wrappers: called, an 11-argument handler had its arguments
// copied again and cost a launch about 30 instructions.

fn grid_blocks(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    x as u64 * y as u64 * z as u64
}

/// What the wrapper does with a launch admitted by `admit_launch`.
type Launch = crate::table::Launch<launch_control::TimedLaunch>;

#[inline(always)]
fn admitted(admission: launch_control::Admitted) -> Launch {
    match admission {
        launch_control::Admitted::Now => Launch::Now,
        launch_control::Admitted::Timed(timed) => Launch::Around(timed),
    }
}

#[inline(always)]
pub fn launch_kernel(
    cx: Cx,
    _next: impl FnOnce(
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
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> Launch {
    let key = move || LaunchKey::kernel(f as usize, grid_blocks(grid_x, grid_y, grid_z));
    admitted(launch_control::admit_launch(key, stream, cx.per_thread))
}

#[inline(always)]
pub fn launch_kernel_ex(
    cx: Cx,
    _next: impl FnOnce(
        *const CUlaunchConfig,
        CUfunction,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CUresult,
    config: *const CUlaunchConfig,
    f: CUfunction,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> Launch {
    if config.is_null() {
        return Launch::Now;
    }
    // SAFETY: a non-null config is, by cuLaunchKernelEx's contract, a valid
    // CUlaunchConfig for the duration of the call; we read three grid
    // dimensions and the stream.
    let (blocks, stream) = unsafe {
        let c = &*config;
        (grid_blocks(c.gridDimX, c.gridDimY, c.gridDimZ), c.hStream)
    };
    admitted(launch_control::admit_launch(
        move || LaunchKey::kernel(f as usize, blocks),
        stream,
        cx.per_thread,
    ))
}

#[inline(always)]
pub fn launch_cooperative_kernel(
    cx: Cx,
    _next: impl FnOnce(
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
    _block_x: c_uint,
    _block_y: c_uint,
    _block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    _params: *mut *mut c_void,
) -> Launch {
    let key = move || LaunchKey::kernel(f as usize, grid_blocks(grid_x, grid_y, grid_z));
    admitted(launch_control::admit_launch(key, stream, cx.per_thread))
}

pub fn launch_cooperative_kernel_multi_device(
    _cx: Cx,
    _next: impl FnOnce(*mut CUDA_LAUNCH_PARAMS, c_uint, c_uint) -> CUresult,
    list: *mut CUDA_LAUNCH_PARAMS,
    num_devices: c_uint,
    _flags: c_uint,
) -> Launch {
    if !list.is_null() {
        // SAFETY: by the API's contract `list` holds `num_devices` launch
        // parameter structs; we read the function, grid and stream of each.
        let launches = unsafe { std::slice::from_raw_parts(list, num_devices as usize) };
        for launch in launches {
            let blocks = grid_blocks(launch.gridDimX, launch.gridDimY, launch.gridDimZ);
            let device = launch_control::device_of_stream(launch.hStream);
            launch_control::charge_untimed(
                LaunchKey::kernel(launch.function as usize, blocks),
                device,
            );
        }
    }
    Launch::Now
}

#[inline(always)]
pub fn graph_launch(
    cx: Cx,
    _next: impl FnOnce(CUgraphExec, CUstream) -> CUresult,
    exec: CUgraphExec,
    stream: CUstream,
) -> Launch {
    admitted(launch_control::admit_launch(
        move || LaunchKey::graph(exec as usize),
        stream,
        cx.per_thread,
    ))
}

// ---- stream capture ---------------------------------------------------------
//
// Launches into a capturing stream do not run; they are charged when the
// graph is launched. Counting captures lets the launch path skip asking the
// driver whenever no capture is in progress.

pub fn stream_begin_capture(
    _cx: Cx,
    next: impl FnOnce(CUstream) -> CUresult,
    stream: CUstream,
) -> CUresult {
    counted_capture(next(stream))
}

pub fn stream_begin_capture_v2(
    _cx: Cx,
    next: impl FnOnce(CUstream, c_uint) -> CUresult,
    stream: CUstream,
    mode: c_uint,
) -> CUresult {
    counted_capture(next(stream, mode))
}

pub fn stream_begin_capture_to_graph(
    _cx: Cx,
    next: impl FnOnce(
        CUstream,
        CUgraph,
        *const CUgraphNode,
        *const CUgraphEdgeData,
        usize,
        c_uint,
    ) -> CUresult,
    stream: CUstream,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    dependency_data: *const CUgraphEdgeData,
    num_dependencies: usize,
    mode: c_uint,
) -> CUresult {
    counted_capture(next(
        stream,
        graph,
        dependencies,
        dependency_data,
        num_dependencies,
        mode,
    ))
}

fn counted_capture(result: CUresult) -> CUresult {
    if result == CUDA_SUCCESS {
        stream_capture::capture_began();
    }
    result
}

pub fn stream_end_capture(
    cx: Cx,
    next: impl FnOnce(CUstream, *mut CUgraph) -> CUresult,
    stream: CUstream,
    graph: *mut CUgraph,
) -> CUresult {
    // An invalidated capture ends with an error but is over all the same; a
    // stream that was not capturing ends nothing.
    stream_capture::end_capture(
        stream,
        |s| stream_capture::stream_is_capturing(s, cx.per_thread),
        || next(stream, graph),
    )
}

// ---- synchronisation ------------------------------------------------------

pub fn stream_destroy(
    _cx: Cx,
    next: impl FnOnce(CUstream) -> CUresult,
    stream: CUstream,
) -> CUresult {
    recent_streams::forget(stream);
    next(stream)
}

pub fn ctx_destroy(_cx: Cx, next: impl FnOnce(CUcontext) -> CUresult, ctx: CUcontext) -> CUresult {
    recent_streams::forget_all();
    sampler::contexts_changed();
    next(ctx)
}

/// Releasing the primary context may destroy it (the last reference).
pub fn primary_ctx_end(
    _cx: Cx,
    next: impl FnOnce(CUdevice) -> CUresult,
    dev: CUdevice,
) -> CUresult {
    recent_streams::forget_all();
    sampler::contexts_changed();
    next(dev)
}

// Waits on memory values or external semaphores: the program may order
// its streams by values that later work writes, which an order added by a
// timed launch could turn into a deadlock; from the first one on, timed
// launches add none (see `sampler::set_apart_from_other_streams`).

pub fn stream_wait_value32(
    _cx: Cx,
    next: impl FnOnce(CUstream, CUdeviceptr, u32, c_uint) -> CUresult,
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> CUresult {
    sampler::program_orders_streams_itself();
    next(stream, addr, value, flags)
}

pub fn stream_wait_value64(
    _cx: Cx,
    next: impl FnOnce(CUstream, CUdeviceptr, u64, c_uint) -> CUresult,
    stream: CUstream,
    addr: CUdeviceptr,
    value: u64,
    flags: c_uint,
) -> CUresult {
    sampler::program_orders_streams_itself();
    next(stream, addr, value, flags)
}

pub fn stream_batch_mem_op(
    _cx: Cx,
    next: impl FnOnce(CUstream, c_uint, *mut CUstreamBatchMemOpParams, c_uint) -> CUresult,
    stream: CUstream,
    count: c_uint,
    params: *mut CUstreamBatchMemOpParams,
    flags: c_uint,
) -> CUresult {
    sampler::program_orders_streams_itself();
    next(stream, count, params, flags)
}

pub fn wait_external_semaphores(
    _cx: Cx,
    next: impl FnOnce(
        *const CUexternalSemaphore,
        *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
        c_uint,
        CUstream,
    ) -> CUresult,
    semaphores: *const CUexternalSemaphore,
    params: *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    count: c_uint,
    stream: CUstream,
) -> CUresult {
    sampler::program_orders_streams_itself();
    next(semaphores, params, count, stream)
}

pub fn stream_synchronize(
    _cx: Cx,
    next: impl FnOnce(CUstream) -> CUresult,
    stream: CUstream,
) -> CUresult {
    colocation::sync_begin();
    fair_turns::sync_begin();
    let waiting = sync::in_sync();
    let result = next(stream);
    drop(waiting);
    colocation::sync_end();
    fair_turns::sync_end();
    sync::synchronised();
    result
}

pub fn ctx_synchronize(_cx: Cx, next: impl FnOnce() -> CUresult) -> CUresult {
    colocation::sync_begin();
    fair_turns::sync_begin();
    let waiting = sync::in_sync();
    let result = next();
    drop(waiting);
    colocation::sync_end();
    fair_turns::sync_end();
    sync::synchronised();
    result
}

pub fn event_synchronize(
    _cx: Cx,
    next: impl FnOnce(CUevent) -> CUresult,
    event: CUevent,
) -> CUresult {
    colocation::sync_begin();
    fair_turns::sync_begin();
    let waiting = sync::in_sync();
    let result = next(event);
    drop(waiting);
    colocation::sync_end();
    fair_turns::sync_end();
    sync::synchronised();
    result
}
