//! Panic containment at the FFI edge: no panic may unwind into C.

use core::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

use dilu_abi::cuda::{CUDA_ERROR_UNKNOWN, CUresult};

use crate::table::Cx;

/// Runs a hook `body` and contains any panic.
///
/// `cx` names the hook (None for the `cuGetProcAddress` wrappers). `done` is set by the body's call to the real driver (if it got that far).
/// On panic: if the real function already ran, its result is returned (the
/// call happened, the caller must see it); otherwise the call falls through to
/// `real` with the caller's original arguments. Only if that also panics is
/// `CUDA_ERROR_UNKNOWN` returned.
#[inline(always)]
pub fn entry(
    cx: Option<Cx>,
    done: &Cell<Option<CUresult>>,
    body: impl FnOnce() -> CUresult,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(_) => after_panic(cx, done.get(), real),
    }
}

#[cold]
#[inline(never)]
fn after_panic(
    cx: Option<Cx>,
    done: Option<CUresult>,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    let (name, per_thread) = match cx {
        Some(cx) => (cx.name(), cx.per_thread),
        None => (c"cuGetProcAddress", false),
    };
    tracing::error!(
        hook = ?name,
        per_thread,
        real_called = done.is_some(),
        "panic inside a dilu hook; passing the call through"
    );
    match done {
        Some(r) => r,
        None => catch_unwind(AssertUnwindSafe(real)).unwrap_or(CUDA_ERROR_UNKNOWN),
    }
}
