//! Panic containment at the FFI edge: no panic may unwind into C.

use core::cell::Cell;
use core::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use dilu_abi::cuda::{CUDA_ERROR_UNKNOWN, CUresult};

use crate::table::{Cx, Outcome};

/// The body of a hook panicked before it called the real function: the
/// caller makes that call itself, with the C caller's arguments, through
/// [`fall_through`].
#[derive(Debug, PartialEq, Eq)]
pub struct RealNotCalled;

/// Runs a hook `body` and contains any panic.
///
/// `cx` names the hook (None for the `cuGetProcAddress` wrappers). `done` is
/// set by the body's call to the real driver (if it got that far). On panic:
/// if the real function already ran, its result is returned (the call
/// happened, the caller must see it); otherwise [`RealNotCalled`], and the
/// wrapper falls through to the real function with the caller's original
/// arguments ([`fall_through`]). The fall-through is built by the wrapper
/// only on that path: a closure made before the call, holding every
/// argument, cost a launch about 25 instructions.
#[inline(always)]
pub fn entry(
    cx: Option<Cx>,
    done: &Cell<Option<CUresult>>,
    body: impl FnOnce() -> CUresult,
) -> Result<CUresult, RealNotCalled> {
    let name = || match cx {
        Some(cx) => (cx.name(), cx.per_thread),
        None => (c"cuGetProcAddress", false),
    };
    contain(name, done, body)
}

/// [`entry`] for an entry point outside the driver's hook table (NVML),
/// named by its exported C name. Its status codes are 32-bit like
/// `CUresult`, and NVML's "unknown error" is 999 as well.
#[inline(always)]
pub fn entry_named(
    name: &'static CStr,
    done: &Cell<Option<CUresult>>,
    body: impl FnOnce() -> CUresult,
) -> Result<CUresult, RealNotCalled> {
    contain(|| (name, false), done, body)
}

#[inline(always)]
fn contain(
    name: impl FnOnce() -> (&'static CStr, bool),
    done: &Cell<Option<CUresult>>,
    body: impl FnOnce() -> CUresult,
) -> Result<CUresult, RealNotCalled> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => Ok(r),
        Err(_) => {
            let (name, per_thread) = name();
            after_panic(name, per_thread, done.get())
        }
    }
}

#[cold]
#[inline(never)]
fn after_panic(
    name: &CStr,
    per_thread: bool,
    done: Option<CUresult>,
) -> Result<CUresult, RealNotCalled> {
    tracing::error!(
        hook = ?name,
        per_thread,
        real_called = done.is_some(),
        "panic inside a dilu hook; passing the call through"
    );
    done.ok_or(RealNotCalled)
}

/// Runs the handler `body` of the hook `cx`, whose outcome is an
/// [`Outcome`], and contains any panic: logged, then `R::after_panic` with
/// the real call's result where the handler made it (`done`) and `real`,
/// the call with the C caller's arguments, where it did not (through
/// [`fall_through`]).
#[inline(always)]
pub fn guard<R: Outcome>(
    cx: Cx,
    done: &Cell<Option<CUresult>>,
    body: impl FnOnce() -> R,
    real: impl FnOnce() -> CUresult,
) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(outcome) => outcome,
        Err(_) => {
            let done = after_panic(cx.name(), cx.per_thread, done.get()).ok();
            R::after_panic(done, move || fall_through(real))
        }
    }
}

/// Calls the real function after a hook panicked before calling it; only
/// if that panics too is `CUDA_ERROR_UNKNOWN` returned.
#[cold]
#[inline(never)]
pub fn fall_through(real: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(real)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

/// [`entry`], then [`fall_through`] where the body panicked before the
/// real call: for wrappers off the launch path, where building `real`
/// before the call costs nothing that matters.
#[inline(always)]
pub fn entry_or_fall_through(
    cx: Option<Cx>,
    done: &Cell<Option<CUresult>>,
    body: impl FnOnce() -> CUresult,
    real: impl FnOnce() -> CUresult,
) -> CUresult {
    entry(cx, done, body).unwrap_or_else(|RealNotCalled| fall_through(real))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};

    fn quiet<R>(f: impl FnOnce() -> R) -> R {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = f();
        std::panic::set_hook(hook);
        r
    }

    #[test]
    fn no_panic_returns_the_body_result() {
        let done = Cell::new(None);
        assert_eq!(
            entry_or_fall_through(None, &done, || 7, || unreachable!()),
            7
        );
    }

    fn launch_cx() -> Cx {
        Cx {
            hook: crate::table::HookId::cuLaunchKernel,
            per_thread: false,
        }
    }

    // The two guards a hook's result goes through: `entry_or_fall_through`
    // (the `cuGetProcAddress` wrappers) and `guard` (every hooked row).
    fn via_entry(
        done: &Cell<Option<CUresult>>,
        body: impl FnOnce() -> CUresult,
        real: impl FnOnce() -> CUresult,
    ) -> CUresult {
        entry_or_fall_through(None, done, body, real)
    }

    fn via_guard(
        done: &Cell<Option<CUresult>>,
        body: impl FnOnce() -> CUresult,
        real: impl FnOnce() -> CUresult,
    ) -> CUresult {
        guard(launch_cx(), done, body, real)
    }

    macro_rules! for_each_guard {
        ($check:ident) => {
            $check(|d, b, r| via_entry(d, b, r));
            $check(|d, b, r| via_guard(d, b, r));
        };
    }

    type Body<'a> = Box<dyn FnOnce() -> CUresult + 'a>;

    #[test]
    fn panic_before_the_real_call_falls_through_to_it() {
        fn check(run: impl Fn(&Cell<Option<CUresult>>, Body, Body) -> CUresult) {
            let done = Cell::new(None);
            let calls = Cell::new(0);
            let r = quiet(|| {
                run(
                    &done,
                    Box::new(|| panic!("bug in a hook")),
                    Box::new(|| {
                        calls.set(calls.get() + 1);
                        CUDA_ERROR_OUT_OF_MEMORY
                    }),
                )
            });
            assert_eq!((r, calls.get()), (CUDA_ERROR_OUT_OF_MEMORY, 1));
        }
        for_each_guard!(check);
    }

    #[test]
    fn panic_after_the_real_call_keeps_its_result_and_does_not_repeat_it() {
        fn check(run: impl Fn(&Cell<Option<CUresult>>, Body, Body) -> CUresult) {
            let done = Cell::new(None);
            let r = quiet(|| {
                run(
                    &done,
                    Box::new(|| {
                        done.set(Some(CUDA_SUCCESS));
                        panic!("bug after the driver call")
                    }),
                    Box::new(|| unreachable!("the real call must not be repeated")),
                )
            });
            assert_eq!(r, CUDA_SUCCESS);
        }
        for_each_guard!(check);
    }

    #[test]
    fn a_launch_whose_admission_panicked_is_made_all_the_same() {
        use crate::table::{AfterHook, Launch, Outcome};
        let done = Cell::new(None);
        let outcome: Launch<core::convert::Infallible> = quiet(|| {
            guard(
                launch_cx(),
                &done,
                || panic!("bug in an admission"),
                || unreachable!("the wrapper makes the launch"),
            )
        });
        assert!(matches!(outcome.next_step(), AfterHook::CallReal));
    }

    #[test]
    fn panic_everywhere_is_unknown_error() {
        let done = Cell::new(None);
        let r = quiet(|| entry_or_fall_through(None, &done, || panic!("a"), || panic!("b")));
        assert_eq!(r, CUDA_ERROR_UNKNOWN);
    }
}
