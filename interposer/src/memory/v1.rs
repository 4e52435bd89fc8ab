//! The pre-3.2 memory ABIs (`cuMemAlloc`, `cuMemAllocPitch`, `cuMemFree`,
//! `cuMemGetInfo` without `_v2`: 32-bit pointers and sizes). Drivers still
//! export them and old binaries or `dlsym` clients can reach them, so they
//! are charged like their `_v2` twins: a budget no path can step around.

use core::ffi::c_uint;

use dilu_abi::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use dilu_layout::ledger::UNLIMITED;

use crate::memory::budget;
use crate::table::Cx;
use crate::table::REAL;

/// Reads an out-parameter the driver has just written (after success).
fn written(pointer: *const c_uint) -> c_uint {
    // SAFETY: only called after the driver returned CUDA_SUCCESS for a call
    // whose contract is to write a c_uint through this (non-null) pointer.
    unsafe { pointer.read() }
}

pub fn mem_alloc_v1(
    _cx: Cx,
    next: impl FnOnce(*mut c_uint, c_uint) -> CUresult,
    dptr: *mut c_uint,
    bytesize: c_uint,
) -> CUresult {
    match budget::get() {
        None => next(dptr, bytesize),
        Some(b) => b.allocate(
            u64::from(bytesize),
            || next(dptr, bytesize),
            || u64::from(written(dptr)),
        ),
    }
}

pub fn mem_alloc_pitch_v1(
    _cx: Cx,
    next: impl FnOnce(*mut c_uint, *mut c_uint, c_uint, c_uint, c_uint) -> CUresult,
    dptr: *mut c_uint,
    pitch: *mut c_uint,
    width_bytes: c_uint,
    height: c_uint,
    element_size_bytes: c_uint,
) -> CUresult {
    let Some(b) = budget::get() else {
        return next(dptr, pitch, width_bytes, height, element_size_bytes);
    };
    // As for cuMemAllocPitch_v2: the widest pitch first, then the real one.
    let widest = u64::from(width_bytes)
        .div_ceil(512)
        .saturating_mul(512)
        .saturating_mul(u64::from(height));
    let result = b.allocate(
        widest,
        || next(dptr, pitch, width_bytes, height, element_size_bytes),
        || u64::from(written(dptr)),
    );
    if result != CUDA_SUCCESS {
        return result;
    }
    let key = u64::from(written(dptr));
    let actual = u64::from(written(pitch)).saturating_mul(u64::from(height));
    if b.settle(key, actual).is_err() {
        let _ = b.free(key, || budget::real_mem_free(key));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    result
}

pub fn mem_free_v1(_cx: Cx, next: impl FnOnce(c_uint) -> CUresult, dptr: c_uint) -> CUresult {
    match budget::get() {
        None => next(dptr),
        Some(b) => b.free(u64::from(dptr), || next(dptr)),
    }
}

/// `cuMemGetInfo` (32-bit sizes): the same budget view as `_v2`, asked of
/// the `_v2` driver function (whose sizes do not wrap) and clamped to
/// 32 bits, as the old ABI reports sizes.
pub fn mem_get_info_v1(
    cx: Cx,
    next: impl FnOnce(*mut c_uint, *mut c_uint) -> CUresult,
    free: *mut c_uint,
    total: *mut c_uint,
) -> CUresult {
    let Some(b) = budget::get() else {
        return next(free, total);
    };
    if b.budget_of(b.current_device()) == UNLIMITED || free.is_null() || total.is_null() {
        return next(free, total);
    }
    let Some(real_v2) = crate::driver::resolved(&REAL.cuMemGetInfo_v2) else {
        return next(free, total);
    };
    let (mut free_v2, mut total_v2) = (0usize, 0usize);
    // Through our own _v2 handler, so both ABIs answer the same.
    let result = crate::memory::hooks::mem_get_info(
        cx,
        // SAFETY: forwards two live out-parameters to the real function.
        |f, t| unsafe { real_v2(f, t) },
        &mut free_v2,
        &mut total_v2,
    );
    if result == CUDA_SUCCESS {
        let clamp = |v: usize| c_uint::try_from(v).unwrap_or(c_uint::MAX);
        // SAFETY: both pointers were checked non-null; the caller provides
        // them as outputs.
        unsafe {
            *free = clamp(free_v2);
            *total = clamp(total_v2);
        }
    }
    result
}
