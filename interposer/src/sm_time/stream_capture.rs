//! Stream captures in this process: counted as they begin and end, so a
//! launch asks the driver whether its stream is capturing only while some
//! capture is in progress (a captured launch does not run now: the graph's
//! launches are what we charge).

use crate::driver;
use crate::table::REAL;
use dilu_abi::cuda::{CUDA_SUCCESS, CUresult, sys};
use std::sync::atomic::{AtomicI64, Ordering};

/// Stream captures in progress in this process (begun minus ended). While
/// none is, no launch can be a capture and we never ask the driver.
static CAPTURES: AtomicI64 = AtomicI64::new(0);

/// Whether any stream of this process may be capturing now.
pub fn capturing_anywhere() -> bool {
    CAPTURES.load(Ordering::Acquire) > 0
}

pub fn capture_began() {
    CAPTURES.fetch_add(1, Ordering::AcqRel);
}

/// Ends a capture on `stream` through `end` (the real cuStreamEndCapture),
/// counting it as over only if the stream was capturing before and is not
/// after, as `is_capturing` (the driver's cuStreamIsCapturing; `None` when
/// it cannot tell) says. A failed end on a stream that was not capturing
/// (or on another thread's capture, which goes on) must not uncount a
/// capture still in progress elsewhere: launches into it would then be
/// charged, and sampling would record events on capturing streams.
pub fn end_capture(
    stream: sys::CUstream,
    is_capturing: impl Fn(sys::CUstream) -> Option<bool>,
    end: impl FnOnce() -> CUresult,
) -> CUresult {
    let before = is_capturing(stream);
    let result = end();
    let over = match (before, is_capturing(stream)) {
        (Some(before), Some(after)) => before && !after,
        // The driver cannot say: an end that succeeded ended one.
        _ => result == CUDA_SUCCESS,
    };
    if over {
        CAPTURES.fetch_sub(1, Ordering::AcqRel);
    }
    result
}

/// Whether `stream` is capturing (active or invalidated), from the real
/// driver; `None` when it cannot say.
pub fn stream_is_capturing(stream: sys::CUstream, per_thread: bool) -> Option<bool> {
    let ptsz = per_thread
        .then(|| driver::resolved(&REAL.cuStreamIsCapturing_ptsz))
        .flatten();
    let is_capturing = ptsz.or_else(|| driver::resolved(&REAL.cuStreamIsCapturing))?;
    let mut status: u32 = 0;
    // SAFETY: the real cuStreamIsCapturing[_ptsz]; the status is a C enum
    // (int-sized), written to a live local.
    let result = unsafe { is_capturing(stream, &mut status) };
    (result == CUDA_SUCCESS).then_some(status != 0)
}

/// Whether a launch on `stream` is being captured into a graph (then it
/// does not run now: the graph's launches are what we charge).
pub(crate) fn captured(stream: sys::CUstream, per_thread: bool) -> bool {
    CAPTURES.load(Ordering::Acquire) > 0 && stream_is_capturing(stream, per_thread) == Some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::cuda::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED as NOT_CAPTURING;

    // One test: the capture count is process-wide.
    #[test]
    fn only_an_ended_capture_is_uncounted() {
        let stream_a = 0xA0 as sys::CUstream;
        let stream_b = 0xB0 as sys::CUstream;
        capture_began(); // on stream A
        // cuStreamEndCapture on B, which is not capturing: it fails, and A's
        // capture goes on.
        let not_b = |s: sys::CUstream| Some(s == stream_a);
        let result = end_capture(stream_b, not_b, || NOT_CAPTURING);
        assert_eq!(result, NOT_CAPTURING);
        assert_eq!(CAPTURES.load(Ordering::Acquire), 1, "A still captures");
        // An invalidated capture on A ends with an error but is over.
        let capturing = std::cell::Cell::new(true);
        let result = end_capture(
            stream_a,
            |_| Some(capturing.get()),
            || {
                capturing.set(false);
                dilu_abi::cuda::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            },
        );
        assert_ne!(result, CUDA_SUCCESS);
        assert_eq!(CAPTURES.load(Ordering::Acquire), 0);
    }
}
