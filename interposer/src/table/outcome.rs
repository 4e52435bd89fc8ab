//! What a handler hands back to its exported wrapper: a result, or (a launch
//! handler) the request to call the real function with the C caller's
//! arguments, at once or around something of the handler's (a timed
//! launch, between the sampler's events). The wrapper makes that call
//! itself, from its own arguments, outside the handler's panic guard: a
//! launch handler that held the arguments in a closure, for the rare timed
//! launch, had every launch copy them (about 17 instructions of 11-argument
//! `cuLaunchKernel`, `bench/results/launch-instructions.md`).

use core::convert::Infallible;

use dilu_abi::cuda::CUresult;

/// A handler's return type: a plain `CUresult` (every row but the
/// launches), or [`Launch`].
pub trait Outcome: Sized {
    /// What a call "around" runs (`Infallible` where there is none).
    type Around: Around;
    /// What the panic guard (`ffi::guard`) makes of a handler that
    /// panicked: `done` is the real call's result where the handler made
    /// that call; `real` makes it, with the C caller's arguments (itself
    /// guarded).
    fn after_panic(done: Option<CUresult>, real: impl FnOnce() -> CUresult) -> Self;
    /// What the wrapper does next.
    fn next_step(self) -> AfterHook<Self::Around>;
}

/// What a wrapper does after its handler.
pub enum AfterHook<A> {
    /// The handler made the call (or refused it): return this.
    Return(CUresult),
    /// Call the real function now, with the caller's arguments unchanged.
    CallReal,
    /// Call it, with the caller's arguments unchanged, inside `A::run`.
    CallRealAround(A),
}

/// Something run around the real call (which it must call at most once).
pub trait Around {
    fn run(self, real: impl FnOnce() -> CUresult) -> CUresult;
}

impl Around for Infallible {
    fn run(self, _real: impl FnOnce() -> CUresult) -> CUresult {
        match self {}
    }
}

impl Outcome for CUresult {
    type Around = Infallible;

    /// The real call's result, or the call made now.
    #[inline(always)]
    fn after_panic(done: Option<CUresult>, real: impl FnOnce() -> CUresult) -> Self {
        done.unwrap_or_else(real)
    }

    #[inline(always)]
    fn next_step(self) -> AfterHook<Infallible> {
        AfterHook::Return(self)
    }
}

/// A launch handler's outcome: the launch is always made by the wrapper.
pub enum Launch<A> {
    /// Launch now.
    Now,
    /// Launch inside `A::run`.
    Around(A),
}

impl<A: Around> Outcome for Launch<A> {
    type Around = A;

    /// The launch is made all the same, as if admitted (a launch handler
    /// never calls the real function itself).
    #[inline(always)]
    fn after_panic(_done: Option<CUresult>, _real: impl FnOnce() -> CUresult) -> Self {
        Launch::Now
    }

    #[inline(always)]
    fn next_step(self) -> AfterHook<A> {
        match self {
            Launch::Now => AfterHook::CallReal,
            Launch::Around(around) => AfterHook::CallRealAround(around),
        }
    }
}
