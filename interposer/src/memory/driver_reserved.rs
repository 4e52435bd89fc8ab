//! Device memory the driver sets aside on request, outside any allocation
//! call: the device-side `malloc` heap (`cuCtxSetLimit` with
//! `CU_LIMIT_MALLOC_HEAP_SIZE`) and what a memory pool keeps after
//! `cuMemFreeAsync` (its release threshold). Both count against the budget.

use core::ffi::{c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use dilu_abi::cuda::sys::CUmemoryPool;
use dilu_abi::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use dilu_layout::ledger::{MAX_DEVICES, UNLIMITED};

use crate::memory::budget;
use crate::table::Cx;

/// `CU_LIMIT_MALLOC_HEAP_SIZE` in cuda.h's `CUlimit`.
const LIMIT_MALLOC_HEAP_SIZE: c_uint = 0x02;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` in cuda.h's `CUmemPool_attribute`.
const POOL_RELEASE_THRESHOLD: c_uint = 4;

/// Heap bytes this process has been charged per device.
static HEAP_CHARGED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Serialises heap changes (slow path: a program sets its heap once or twice).
static HEAP_LOCK: Mutex<()> = Mutex::new(());

/// `cuCtxSetLimit`: a larger malloc heap is charged before the driver sets
/// it aside (refused with out-of-memory when it does not fit), a smaller
/// one gives the difference back.
pub fn ctx_set_limit(
    _cx: Cx,
    next: impl FnOnce(c_uint, usize) -> CUresult,
    limit: c_uint,
    value: usize,
) -> CUresult {
    let Some(b) = budget::get().filter(|_| limit == LIMIT_MALLOC_HEAP_SIZE) else {
        return next(limit, value);
    };
    let device = b.current_device();
    let _guard = HEAP_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = HEAP_CHARGED[device].load(Ordering::Acquire);
    let after = value as u64;
    if after > before && b.reserve(device, after - before).is_err() {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let result = next(limit, value);
    if result == CUDA_SUCCESS {
        HEAP_CHARGED[device].store(after, Ordering::Release);
        if after < before {
            b.release(device, before - after);
        }
    } else if after > before {
        b.release(device, after - before);
    }
    result
}

/// `cuMemPoolSetAttribute`: under a budget a pool keeps nothing after
/// `cuMemFreeAsync` beyond the next synchronisation (release threshold 0,
/// the driver's default), because the budget gives a stream-ordered free
/// back when it is enqueued. A higher threshold would let the pool hold
/// memory the budget no longer counts.
pub fn mem_pool_set_attribute(
    _cx: Cx,
    next: impl FnOnce(CUmemoryPool, c_uint, *mut c_void) -> CUresult,
    pool: CUmemoryPool,
    attr: c_uint,
    value: *mut c_void,
) -> CUresult {
    let budgeted = budget::get().is_some_and(|b| b.budget_of(b.current_device()) != UNLIMITED);
    if !budgeted || attr != POOL_RELEASE_THRESHOLD || value.is_null() {
        return next(pool, attr, value);
    }
    let mut held: u64 = 0;
    next(pool, attr, (&raw mut held).cast())
}

/// In a forked child: the parent's heap charge is not the child's.
pub fn forget_parent_state_in_child() {
    for charged in &HEAP_CHARGED {
        charged.store(0, Ordering::Relaxed);
    }
}
