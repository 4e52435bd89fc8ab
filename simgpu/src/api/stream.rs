//! Streams, events, copies and memsets.

use super::{out, read};
use crate::Res;
use crate::driver::{CTXS, current, drv};
use crate::exec::{
    CUDA_ERROR_ILLEGAL_STATE_OR_INVALID, EVENTS, Event, GRAPHS, Graph, HostFn, Op, STREAMS, Stream,
    StreamCallback, resolve,
};
use dilu_abi::cuda::*;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Arc, Mutex};

type CUstream = sys::CUstream;
type CUevent = sys::CUevent;
type CUdeviceptr = sys::CUdeviceptr;

export! {
    fn cuStreamCreate(s: *mut CUstream, flags: c_uint) => stream_create;
    fn cuStreamCreateWithPriority(s: *mut CUstream, flags: c_uint, prio: c_int) => stream_create_prio;
    fn cuStreamDestroy_v2(s: CUstream) => stream_destroy;
    fn cuStreamSynchronize(s: CUstream) | cuStreamSynchronize_ptsz => stream_synchronize;
    fn cuStreamQuery(s: CUstream) | cuStreamQuery_ptsz => stream_query;
    fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint) | cuStreamWaitEvent_ptsz => stream_wait_event;
    fn cuStreamGetPriority(s: CUstream, p: *mut c_int) | cuStreamGetPriority_ptsz => stream_priority;
    fn cuStreamGetFlags(s: CUstream, f: *mut c_uint) | cuStreamGetFlags_ptsz => stream_flags;
    fn cuStreamGetId(s: CUstream, id: *mut c_ulonglong) | cuStreamGetId_ptsz => stream_id;
    fn cuStreamGetCtx(s: CUstream, c: *mut sys::CUcontext) | cuStreamGetCtx_ptsz => stream_ctx;
    fn cuStreamAddCallback(s: CUstream, cb: Option<StreamCallback>, data: *mut c_void, flags: c_uint) | cuStreamAddCallback_ptsz => stream_add_callback;
    fn cuLaunchHostFunc(s: CUstream, f: Option<HostFn>, data: *mut c_void) | cuLaunchHostFunc_ptsz => launch_host_func;
    fn cuLaunchHostFunc_v2(s: CUstream, f: Option<HostFn>, data: *mut c_void, sync_mode: c_uint) | cuLaunchHostFunc_v2_ptsz => launch_host_func_v2;
    fn cuEventCreate(e: *mut CUevent, flags: c_uint) => event_create;
    fn cuEventRecord(e: CUevent, s: CUstream) | cuEventRecord_ptsz => event_record;
    fn cuEventRecordWithFlags(e: CUevent, s: CUstream, flags: c_uint) | cuEventRecordWithFlags_ptsz => event_record_flags;
    fn cuEventQuery(e: CUevent) => event_query;
    fn cuEventSynchronize(e: CUevent) => event_synchronize;
    fn cuEventDestroy_v2(e: CUevent) => event_destroy;
    fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) => event_elapsed;
    fn cuEventElapsedTime_v2(ms: *mut f32, a: CUevent, b: CUevent) => event_elapsed;
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) | cuMemcpy_ptds => memcpy;
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) | cuMemcpyHtoD_v2_ptds => memcpy_htod;
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) | cuMemcpyDtoH_v2_ptds => memcpy_dtoh;
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) | cuMemcpyDtoD_v2_ptds => memcpy_dtod;
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) | cuMemcpyAsync_ptsz => memcpy_async;
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) | cuMemcpyHtoDAsync_v2_ptsz => memcpy_htod_async;
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) | cuMemcpyDtoHAsync_v2_ptsz => memcpy_dtoh_async;
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) | cuMemcpyDtoDAsync_v2_ptsz => memcpy_dtod_async;
    fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) | cuMemsetD8_v2_ptds => memset_d8;
    fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) | cuMemsetD16_v2_ptds => memset_d16;
    fn cuMemsetD32_v2(dst: CUdeviceptr, v: c_uint, n: usize) | cuMemsetD32_v2_ptds => memset_d32;
    fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: CUstream) | cuMemsetD8Async_ptsz => memset_d8_async;
    fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, s: CUstream) | cuMemsetD16Async_ptsz => memset_d16_async;
    fn cuMemsetD32Async(dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) | cuMemsetD32Async_ptsz => memset_d32_async;
    fn cuStreamBeginCapture(s: CUstream) | cuStreamBeginCapture_ptsz => begin_capture_v1;
    fn cuStreamBeginCapture_v2(s: CUstream, mode: c_int) | cuStreamBeginCapture_v2_ptsz => begin_capture;
    fn cuStreamEndCapture(s: CUstream, g: *mut sys::CUgraph) | cuStreamEndCapture_ptsz => end_capture;
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) => exchange_capture_mode;
    fn cuStreamIsCapturing(s: CUstream, st: *mut c_int) | cuStreamIsCapturing_ptsz => is_capturing;
    fn cuStreamGetCaptureInfo(s: CUstream, st: *mut c_int, id: *mut u64) | cuStreamGetCaptureInfo_ptsz => capture_info_v1;
    fn cuStreamGetCaptureInfo_v2(s: CUstream, st: *mut c_int, id: *mut u64, g: *mut sys::CUgraph, deps: *mut *const c_void, n: *mut usize) | cuStreamGetCaptureInfo_v2_ptsz => capture_info_v2;
    fn cuStreamGetCaptureInfo_v3(s: CUstream, st: *mut c_int, id: *mut u64, g: *mut sys::CUgraph, deps: *mut *const c_void, edges: *mut *const c_void, n: *mut usize) | cuStreamGetCaptureInfo_v3_ptsz => capture_info_v3;
}

fn stream_create(_: bool, s: *mut CUstream, flags: c_uint) -> Res {
    stream_create_prio(false, s, flags, 0)
}

fn stream_create_prio(_: bool, s: *mut CUstream, flags: c_uint, prio: c_int) -> Res {
    let c = current()?;
    if s.is_null() || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let st = Stream::new(&c, flags, prio.clamp(-5, 0), false);
    out(s, STREAMS.insert(st) as CUstream)
}

fn stream_destroy(_: bool, s: CUstream) -> Res {
    drv()?;
    let st = STREAMS
        .remove(s as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    // Pending work still completes (as on a GPU); the worker then exits.
    st.close();
    Ok(())
}

/// Synchronises a stream; the legacy stream waits for every stream of its
/// context (legacy default-stream semantics).
fn stream_synchronize(pt: bool, s: CUstream) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Synchronize);
    let st = resolve(s, pt)?;
    if st.legacy {
        let c = CTXS.get(st.ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        return c.synchronize();
    }
    st.synchronize()?;
    drv()?.flush_trace();
    Ok(())
}

fn stream_query(pt: bool, s: CUstream) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::EventQuery);
    resolve(s, pt)?.query()
}

fn event(e: CUevent) -> Res<Arc<Event>> {
    drv()?;
    EVENTS.get(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn stream_wait_event(pt: bool, s: CUstream, e: CUevent, _flags: c_uint) -> Res {
    let st = resolve(s, pt)?;
    let ev = event(e)?;
    if ev.opened() {
        // Another process's record: waited for here (see ipc_event).
        return ev.synchronize();
    }
    if let Some((other, seq)) = ev.pending()
        && !Arc::ptr_eq(&other, &st)
    {
        st.enqueue(Op::Wait {
            stream: other,
            seq,
            ev,
        })?;
    }
    Ok(())
}

fn stream_priority(pt: bool, s: CUstream, p: *mut c_int) -> Res {
    out(p, resolve(s, pt)?.priority)
}

fn stream_flags(pt: bool, s: CUstream, f: *mut c_uint) -> Res {
    out(f, resolve(s, pt)?.flags)
}

fn stream_id(pt: bool, s: CUstream, id: *mut c_ulonglong) -> Res {
    out(id, resolve(s, pt)?.id)
}

fn stream_ctx(pt: bool, s: CUstream, c: *mut sys::CUcontext) -> Res {
    out(c, resolve(s, pt)?.ctx as sys::CUcontext)
}

fn stream_add_callback(
    pt: bool,
    s: CUstream,
    cb: Option<StreamCallback>,
    data: *mut c_void,
    flags: c_uint,
) -> Res {
    let st = resolve(s, pt)?;
    let f = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if drv()?.null() {
        // SAFETY: the client's callback with its own argument.
        unsafe { f(s, CUDA_SUCCESS, data) };
        return Ok(());
    }
    st.enqueue(Op::Callback {
        f,
        handle: s as usize,
        data: data as usize,
    })?;
    Ok(())
}

/// CUDA 13's variant; the synchronisation mode changes nothing here.
fn launch_host_func_v2(
    pt: bool,
    s: CUstream,
    f: Option<HostFn>,
    data: *mut c_void,
    _sync_mode: c_uint,
) -> Res {
    launch_host_func(pt, s, f, data)
}

fn launch_host_func(pt: bool, s: CUstream, f: Option<HostFn>, data: *mut c_void) -> Res {
    let st = resolve(s, pt)?;
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if drv()?.null() {
        // SAFETY: the client's host function with its own argument.
        unsafe { f(data) };
        return Ok(());
    }
    st.enqueue(Op::Host {
        f,
        data: data as usize,
    })?;
    Ok(())
}

fn event_create(_: bool, e: *mut CUevent, flags: c_uint) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::EventCreate);
    current()?;
    if e.is_null() || flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let event = if flags & super::ipc_event::CU_EVENT_INTERPROCESS != 0 {
        // As NVIDIA's driver: an interprocess event keeps no timestamps.
        if flags & crate::exec::CU_EVENT_DISABLE_TIMING == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Event::interprocess(flags, super::ipc_event::SharedEvent::create()?)
    } else {
        Event::new(flags)
    };
    out(e, EVENTS.insert(Arc::new(event)) as CUevent)
}

fn event_record(pt: bool, e: CUevent, s: CUstream) -> Res {
    let ev = event(e)?;
    // Recording a timestamp is what makes a timed record expensive.
    let _cost = crate::host_cost::charge(if ev.flags & crate::exec::CU_EVENT_DISABLE_TIMING != 0 {
        crate::host_cost::Call::EventRecordUntimed
    } else {
        crate::host_cost::Call::EventRecord
    });
    let st = resolve(s, pt)?;
    ev.record(&st)
}

fn event_record_flags(pt: bool, e: CUevent, s: CUstream, _flags: c_uint) -> Res {
    event_record(pt, e, s)
}

fn event_query(_: bool, e: CUevent) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::EventQuery);
    event(e)?.query()
}

fn event_synchronize(_: bool, e: CUevent) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Synchronize);
    event(e)?.synchronize()
}

fn event_destroy(_: bool, e: CUevent) -> Res {
    drv()?;
    EVENTS.remove(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}

fn event_elapsed(_: bool, ms: *mut f32, a: CUevent, b: CUevent) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::EventElapsed);
    let (a, b) = (event(a)?, event(b)?);
    out(ms, Event::elapsed_ms(&a, &b)?)
}

/// The stream a synchronous copy is ordered in: the legacy stream, or the
/// per-thread default stream in `_ptds` variants.
fn sync_stream(pt: bool) -> Res<Arc<Stream>> {
    resolve(std::ptr::null_mut(), pt)
}

/// Queues `op` and, if `wait`, blocks until it has executed.
fn submit(st: &Arc<Stream>, op: Op, wait: bool) -> Res {
    let seq = st.enqueue(op)?;
    if wait && seq > 0 {
        st.wait_seq(seq)?;
    }
    Ok(())
}

fn copy(
    dst: u64,
    src: u64,
    n: usize,
    dst_dev: bool,
    src_dev: bool,
    st: &Arc<Stream>,
    wait: bool,
) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Copy);
    let d = drv()?;
    if n == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if dst_dev {
        d.check_dptr(dst, n)?;
    }
    if src_dev {
        d.check_dptr(src, n)?;
    }
    if d.null() {
        return Ok(());
    }
    let pinned = |p: u64| crate::api::mem::is_pinned(p as usize, n);
    // Like the driver: a copy into pageable host memory returns only once
    // it has completed.
    let wait = wait || (!dst_dev && d.dev_of(dst, n).is_none() && !pinned(dst));
    let op = if !src_dev && !wait && d.dev_of(src, n).is_none() && !pinned(src) {
        // Stage pageable host data now, as the driver does, so the caller
        // may reuse its buffer as soon as the call returns.
        // SAFETY: the caller provides `n` readable bytes at `src`.
        let data = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
        Op::CopyOwned {
            dst: dst as usize,
            data: Arc::new(data),
        }
    } else {
        Op::Copy {
            dst: dst as usize,
            src: src as usize,
            n,
        }
    };
    submit(st, op, wait)
}

fn memcpy(pt: bool, dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> Res {
    // Unified addressing: either side may be host memory.
    copy(dst, src, n, false, false, &sync_stream(pt)?, true)
}

fn memcpy_htod(pt: bool, dst: CUdeviceptr, src: *const c_void, n: usize) -> Res {
    copy(dst, src as u64, n, true, false, &sync_stream(pt)?, true)
}

fn memcpy_dtoh(pt: bool, dst: *mut c_void, src: CUdeviceptr, n: usize) -> Res {
    copy(dst as u64, src, n, false, true, &sync_stream(pt)?, true)
}

fn memcpy_dtod(pt: bool, dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> Res {
    copy(dst, src, n, true, true, &sync_stream(pt)?, true)
}

fn memcpy_async(pt: bool, dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> Res {
    let st = resolve(s, pt)?;
    let src_dev = drv()?.dev_of(src, n.max(1)).is_some();
    copy(dst, src, n, false, src_dev, &st, false)
}

fn memcpy_htod_async(pt: bool, dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream) -> Res {
    copy(dst, src as u64, n, true, false, &resolve(s, pt)?, false)
}

fn memcpy_dtoh_async(pt: bool, dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream) -> Res {
    copy(dst as u64, src, n, false, true, &resolve(s, pt)?, false)
}

fn memcpy_dtod_async(pt: bool, dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream) -> Res {
    copy(dst, src, n, true, true, &resolve(s, pt)?, false)
}

fn memset(dst: u64, val: u32, elem: usize, count: usize, st: &Arc<Stream>, wait: bool) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Copy);
    let d = drv()?;
    if count == 0 {
        return Ok(());
    }
    if !dst.is_multiple_of(elem as u64) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = count.checked_mul(elem).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    d.check_dptr(dst, bytes)?;
    submit(
        st,
        Op::Memset {
            dst: dst as usize,
            val,
            elem,
            count,
        },
        wait,
    )
}

fn memset_d8(pt: bool, dst: CUdeviceptr, v: u8, n: usize) -> Res {
    memset(dst, v as u32, 1, n, &sync_stream(pt)?, true)
}

fn memset_d16(pt: bool, dst: CUdeviceptr, v: u16, n: usize) -> Res {
    memset(dst, v as u32, 2, n, &sync_stream(pt)?, true)
}

fn memset_d32(pt: bool, dst: CUdeviceptr, v: c_uint, n: usize) -> Res {
    memset(dst, v, 4, n, &sync_stream(pt)?, true)
}

fn memset_d8_async(pt: bool, dst: CUdeviceptr, v: u8, n: usize, s: CUstream) -> Res {
    memset(dst, v as u32, 1, n, &resolve(s, pt)?, false)
}

fn memset_d16_async(pt: bool, dst: CUdeviceptr, v: u16, n: usize, s: CUstream) -> Res {
    memset(dst, v as u32, 2, n, &resolve(s, pt)?, false)
}

fn memset_d32_async(pt: bool, dst: CUdeviceptr, v: c_uint, n: usize, s: CUstream) -> Res {
    memset(dst, v, 4, n, &resolve(s, pt)?, false)
}

fn begin_capture_v1(pt: bool, s: CUstream) -> Res {
    begin_capture(pt, s, 0)
}

fn begin_capture(pt: bool, s: CUstream, mode: c_int) -> Res {
    let st = resolve(s, pt)?;
    if st.legacy || !(0..=2).contains(&mode) {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    st.begin_capture()
}

thread_local! {
    /// The calling thread's `CUstreamCaptureMode` (GLOBAL = 0 by default).
    static CAPTURE_MODE: std::cell::Cell<c_int> = const { std::cell::Cell::new(0) };
}

/// `cuThreadExchangeStreamCaptureMode`: sets the thread's capture mode
/// (GLOBAL 0, THREAD_LOCAL 1, RELAXED 2) and returns the one it replaces.
/// simgpu refuses no call during a capture, so the mode changes nothing
/// else.
fn exchange_capture_mode(_: bool, mode: *mut c_int) -> Res {
    drv()?;
    let new = read(mode)?;
    if !(0..=2).contains(&new) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(mode, CAPTURE_MODE.with(|m| m.replace(new)))
}

fn end_capture(pt: bool, s: CUstream, g: *mut sys::CUgraph) -> Res {
    let st = resolve(s, pt)?;
    if g.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ops = st
        .end_capture()
        .map_err(|_| CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)?;
    let h = GRAPHS.insert(Arc::new(Graph {
        ops: Mutex::new(ops),
    }));
    out(g, h as sys::CUgraph)
}

/// CU_STREAM_CAPTURE_STATUS_NONE = 0, ACTIVE = 1.
fn is_capturing(pt: bool, s: CUstream, status: *mut c_int) -> Res {
    let st = resolve(s, pt)?;
    out(status, st.capture_id().is_some() as c_int)
}

fn capture_info_v1(pt: bool, s: CUstream, status: *mut c_int, id: *mut u64) -> Res {
    let st = resolve(s, pt)?;
    let cid = st.capture_id();
    out(status, cid.is_some() as c_int)?;
    if !id.is_null()
        && let Some(cid) = cid
    {
        out(id, cid)?;
    }
    Ok(())
}

fn capture_info_v2(
    pt: bool,
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    g: *mut sys::CUgraph,
    deps: *mut *const c_void,
    n: *mut usize,
) -> Res {
    capture_info_v1(pt, s, status, id)?;
    if !g.is_null() {
        out(g, std::ptr::null_mut())?;
    }
    if !deps.is_null() {
        out(deps, std::ptr::null())?;
    }
    if !n.is_null() {
        out(n, 0)?;
    }
    let _ = CUDA_ERROR_ILLEGAL_STATE_OR_INVALID;
    Ok(())
}

/// As `_v2`, with no edge data (simgpu records no dependency edges).
#[allow(clippy::too_many_arguments)]
fn capture_info_v3(
    pt: bool,
    s: CUstream,
    status: *mut c_int,
    id: *mut u64,
    g: *mut sys::CUgraph,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    n: *mut usize,
) -> Res {
    capture_info_v2(pt, s, status, id, g, deps, n)?;
    if !edges.is_null() {
        out(edges, std::ptr::null())?;
    }
    Ok(())
}
