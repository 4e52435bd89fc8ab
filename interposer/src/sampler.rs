//! Measuring launches: events recorded around a sample of launches, read on
//! a background thread (never synchronising on the launch path), turned into
//! per-kind duration estimates, and the difference to what was charged
//! charged back to the tenant's bucket.
//!
//! A sample starts at the latest of its start events: one recorded on the
//! launch's stream, and one on each other stream this process launched on
//! recently on the device (see [`recent_streams`](crate::recent_streams)),
//! so it times the launch from when our own earlier work was done.
//!
//! When the streams were idle, the start events complete as soon as they
//! are recorded, before the kernel is even submitted; the host time between
//! recording them and the launch returning is then taken out of the sample.
//!
//! The estimate of a kind is the smallest of its last [`WINDOW`] samples:
//! a sample also contains any time the kernel waited for another process's
//! work (time slicing), which only ever adds, so the minimum is the closest
//! to the kernel's own duration. A kernel that really became slower is
//! recognised after [`WINDOW`] samples.

use crate::driver;
use crate::kernel_estimates::Entry;
use crate::recent_streams::{self, REMEMBERED};
use crate::tenant_sm;
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use dilu_abi::cuda::{CUDA_SUCCESS, CUresult, sys};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Samples of one kind the estimate is the minimum of.
pub const WINDOW: usize = 16;
/// Event sets a process keeps at most (= samples in flight).
const MAX_SETS: usize = 64;

type CreateFn = unsafe extern "C" fn(*mut sys::CUevent, u32) -> CUresult;
type RecordFn = unsafe extern "C" fn(sys::CUevent, sys::CUstream) -> CUresult;
type QueryFn = unsafe extern "C" fn(sys::CUevent) -> CUresult;
type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> CUresult;
type GetCurrentFn = unsafe extern "C" fn(*mut sys::CUcontext) -> CUresult;
type SetCurrentFn = unsafe extern "C" fn(sys::CUcontext) -> CUresult;

struct EventFns {
    create: CreateFn,
    record: RecordFn,
    record_ptsz: Option<RecordFn>,
    query: QueryFn,
    elapsed: ElapsedFn,
    get_current: GetCurrentFn,
    set_current: SetCurrentFn,
}

fn resolve(name: &std::ffi::CStr) -> Option<usize> {
    Some(driver::real_symbol(name)).filter(|&p| p != 0)
}

fn fns() -> Option<&'static EventFns> {
    static FNS: OnceLock<Option<EventFns>> = OnceLock::new();
    FNS.get_or_init(|| {
        // SAFETY: (all transmutes below) each address is the real driver's
        // function of that name, whose C signature from cuda.h is the
        // target type.
        unsafe {
            Some(EventFns {
                create: std::mem::transmute::<usize, CreateFn>(resolve(c"cuEventCreate")?),
                record: std::mem::transmute::<usize, RecordFn>(resolve(c"cuEventRecord")?),
                record_ptsz: resolve(c"cuEventRecord_ptsz")
                    .map(|p| std::mem::transmute::<usize, RecordFn>(p)),
                query: std::mem::transmute::<usize, QueryFn>(resolve(c"cuEventQuery")?),
                elapsed: std::mem::transmute::<usize, ElapsedFn>(resolve(c"cuEventElapsedTime")?),
                get_current: std::mem::transmute::<usize, GetCurrentFn>(resolve(
                    c"cuCtxGetCurrent",
                )?),
                set_current: std::mem::transmute::<usize, SetCurrentFn>(resolve(
                    c"cuCtxSetCurrent",
                )?),
            })
        }
    })
    .as_ref()
}

/// The timing events of one sample, of one context (handles kept as
/// integers: they are plain driver handles, usable from any thread).
#[derive(Clone, Copy)]
struct EventSet {
    /// Recorded on the launch's stream before the launch.
    start: usize,
    /// Recorded on other streams launched on recently.
    after_others: [usize; REMEMBERED],
    /// Recorded on the launch's stream after the launch.
    end: usize,
    ctx: usize,
}

struct Sample {
    events: EventSet,
    /// Which of `after_others` were recorded.
    chained: [bool; REMEMBERED],
    entry: &'static Entry,
    device: usize,
    /// Host time from the start events' records to the launch's return when
    /// they had already completed by then (the streams were idle: the
    /// events also timed the launch's own submission); else 0.
    submission_ns: u64,
}

struct Channels {
    free_tx: Sender<EventSet>,
    free_rx: Receiver<EventSet>,
    sample_tx: Sender<Sample>,
    sample_rx: Receiver<Sample>,
}

fn channels() -> &'static Channels {
    static CHANNELS: OnceLock<Channels> = OnceLock::new();
    CHANNELS.get_or_init(|| {
        let (free_tx, free_rx) = crossbeam_channel::bounded(MAX_SETS);
        let (sample_tx, sample_rx) = crossbeam_channel::bounded(MAX_SETS);
        Channels {
            free_tx,
            free_rx,
            sample_tx,
            sample_rx,
        }
    })
}

static SETS_CREATED: AtomicUsize = AtomicUsize::new(0);
static HARVESTER_RUNNING: AtomicBool = AtomicBool::new(false);

fn record(fns: &EventFns, event: usize, stream: sys::CUstream, per_thread: bool) -> bool {
    let record = match (per_thread, fns.record_ptsz) {
        (true, Some(ptsz)) => ptsz,
        _ => fns.record,
    };
    // SAFETY: a live event of ours and the stream the program launches on.
    unsafe { record(event as sys::CUevent, stream) == CUDA_SUCCESS }
}

fn create_set(fns: &EventFns, ctx: usize) -> Option<EventSet> {
    if SETS_CREATED.fetch_add(1, Ordering::AcqRel) >= MAX_SETS {
        SETS_CREATED.fetch_sub(1, Ordering::AcqRel);
        return None;
    }
    let mut events: [sys::CUevent; 2 + REMEMBERED] = [std::ptr::null_mut(); 2 + REMEMBERED];
    for event in &mut events {
        // SAFETY: create writes one event handle to a live local (flags 0:
        // timing enabled) in the calling thread's current context.
        if unsafe { (fns.create)(event, 0) } != CUDA_SUCCESS {
            SETS_CREATED.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
    }
    Some(EventSet {
        start: events[0] as usize,
        end: events[1] as usize,
        after_others: std::array::from_fn(|i| events[2 + i] as usize),
        ctx,
    })
}

/// A launch being timed: its start event(s) are recorded.
pub struct Timing {
    events: EventSet,
    chained: [bool; REMEMBERED],
    recorded_at_ns: u64,
}

/// Records the start events of a sampled launch on `stream` (called just
/// before the launch), and on `others`, the other streams this process
/// launched on recently on the device. `None` if no event set is available.
pub fn begin(
    stream: sys::CUstream,
    per_thread: bool,
    others: &recent_streams::Previous,
) -> Option<Timing> {
    let fns = fns()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle to a live local.
    if unsafe { (fns.get_current)(&mut ctx) } != CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let ctx = ctx as usize;
    let channels = channels();
    let events = match channels.free_rx.try_recv() {
        Ok(set) if set.ctx == ctx => set,
        Ok(other) => {
            // Another context's set: keep it for that context.
            let _ = channels.free_tx.try_send(other);
            create_set(fns, ctx)?
        }
        Err(_) => create_set(fns, ctx)?,
    };
    // Recording fails harmlessly on a stream of another context; the
    // sample then does not start there.
    let mut chained = [false; REMEMBERED];
    for ((other, event), chained) in others.iter().zip(events.after_others).zip(&mut chained) {
        *chained = record(fns, event, other.stream, other.per_thread);
    }
    // Recorded last, the own stream's start event is the latest when all
    // streams are idle: the submission time is counted from it.
    let recorded_at_ns = dilu_abi::monotonic_ns();
    if record(fns, events.start, stream, per_thread) {
        Some(Timing {
            events,
            chained,
            recorded_at_ns,
        })
    } else {
        let _ = channels.free_tx.try_send(events);
        None
    }
}

fn completed(fns: &EventFns, event: usize) -> bool {
    // SAFETY: a live, recorded event of ours; querying never blocks.
    unsafe { (fns.query)(event as sys::CUevent) == CUDA_SUCCESS }
}

/// Completes a sample after the launch: records the end event and hands the
/// events to the harvester. Always releases the kind's sampling claim when
/// the sample cannot be taken.
pub fn finish(
    timing: Option<Timing>,
    launched: bool,
    stream: sys::CUstream,
    per_thread: bool,
    entry: &'static Entry,
    device: usize,
) {
    let launched_at_ns = dilu_abi::monotonic_ns();
    let Some(Timing {
        events,
        chained,
        recorded_at_ns,
    }) = timing
    else {
        entry.stop_sampling();
        return;
    };
    let channels = channels();
    let Some(fns) = fns() else { return };
    if !launched || !record(fns, events.end, stream, per_thread) {
        let _ = channels.free_tx.try_send(events);
        entry.stop_sampling();
        return;
    }
    let streams_were_idle = completed(fns, events.start)
        && (events.after_others.iter().zip(chained))
            .all(|(&event, chained)| !chained || completed(fns, event));
    let submission_ns = if streams_were_idle {
        launched_at_ns.saturating_sub(recorded_at_ns)
    } else {
        0
    };
    if let Err(error) = channels.sample_tx.try_send(Sample {
        events,
        chained,
        entry,
        device,
        submission_ns,
    }) {
        let _ = channels.free_tx.try_send(error.into_inner().events);
        entry.stop_sampling();
        return;
    }
    if !HARVESTER_RUNNING.load(Ordering::Acquire) {
        start_harvester();
    }
}

#[cold]
fn start_harvester() {
    if HARVESTER_RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("dilu-sampler".into())
        .spawn(harvest);
    if spawned.is_err() {
        HARVESTER_RUNNING.store(false, Ordering::Release);
    }
}

/// A forked child has no harvester thread (and its parent's events belong
/// to the parent's contexts).
pub fn forget_parent_state_in_child() {
    HARVESTER_RUNNING.store(false, Ordering::Relaxed);
}

/// The last [`WINDOW`] samples of one kind.
#[derive(Default)]
struct Window {
    samples: [u64; WINDOW],
    filled: usize,
    next: usize,
}

impl Window {
    fn add(&mut self, ns: u64) -> u64 {
        self.samples[self.next] = ns;
        self.next = (self.next + 1) % WINDOW;
        self.filled = (self.filled + 1).min(WINDOW);
        self.samples[..self.filled]
            .iter()
            .copied()
            .min()
            .unwrap_or(ns)
    }
}

fn harvest() {
    let Some(fns) = fns() else { return };
    let channels = channels();
    let mut pending: Vec<Sample> = Vec::new();
    let mut windows: HashMap<usize, Window> = HashMap::new();
    let mut current_ctx = 0usize;
    loop {
        if pending.is_empty() {
            match channels.sample_rx.recv() {
                Ok(sample) => pending.push(sample),
                Err(_) => return,
            }
        }
        loop {
            match channels.sample_rx.try_recv() {
                Ok(sample) => pending.push(sample),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        pending.retain(|sample| {
            if sample.events.ctx != current_ctx {
                // SAFETY: a context handle this process obtained from the driver.
                unsafe { (fns.set_current)(sample.events.ctx as sys::CUcontext) };
                current_ctx = sample.events.ctx;
            }
            // SAFETY: a live event of ours.
            match unsafe { (fns.query)(sample.events.end as sys::CUevent) } {
                CUDA_SUCCESS => {}
                dilu_abi::cuda::CUDA_ERROR_NOT_READY => return true,
                _ => {
                    // Unusable events (their context is gone): dropped, so
                    // a new set may be created in their place.
                    SETS_CREATED.fetch_sub(1, Ordering::AcqRel);
                    sample.entry.stop_sampling();
                    return false;
                }
            }
            // Timed from the latest start event; another stream counts only
            // if its work was done before this launch's end (else it did not
            // run ahead of it).
            let end = sample.events.end;
            let elapsed = (sample.events.after_others.iter().zip(sample.chained))
                .filter(|&(_, chained)| chained)
                .map(|(&event, _)| event)
                .chain([sample.events.start])
                .filter_map(|start| elapsed_ns(fns, start, end))
                .min();
            if let Some(elapsed) = elapsed {
                // On idle streams the start events completed at once and the
                // kernel began only when its launch was submitted: take the
                // submission time out (never more than 3/4 of the sample).
                let measured = elapsed
                    .saturating_sub(sample.submission_ns)
                    .max(elapsed / 4);
                let window = windows
                    .entry(sample.entry as *const Entry as usize)
                    .or_default();
                let estimate = window.add(measured);
                tracing::trace!(
                    kind = sample.entry as *const Entry as usize,
                    measured,
                    estimate,
                    "launch sample"
                );
                settle(sample, estimate);
            }
            sample.entry.stop_sampling();
            let _ = channels.free_tx.try_send(sample.events);
            false
        });
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Time from `from` to `to` in ns; `None` unless both completed with `to`
/// no earlier than `from`.
fn elapsed_ns(fns: &EventFns, from: usize, to: usize) -> Option<u64> {
    let mut ms: f32 = 0.0;
    // SAFETY: writes one float; both are live events of ours.
    let result = unsafe { (fns.elapsed)(&mut ms, from as sys::CUevent, to as sys::CUevent) };
    (result == CUDA_SUCCESS && ms >= 0.0).then_some((ms as f64 * 1e6) as u64)
}

fn settle(sample: &Sample, estimate_ns: u64) {
    let delta = sample.entry.settle(estimate_ns);
    tracing::trace!(delta, estimate_ns, "settled");
    let Some(sm) = tenant_sm::get() else { return };
    let device = sm.device(sample.device);
    device.record_sample();
    if delta != 0 {
        let share = sm.budget().share_ppm(sample.device);
        device.charge_back(delta, share, dilu_abi::monotonic_ns());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_the_smallest_recent_sample() {
        let mut window = Window::default();
        assert_eq!(window.add(300), 300);
        assert_eq!(window.add(100), 100);
        assert_eq!(window.add(250), 100);
        for _ in 0..WINDOW - 1 {
            window.add(400);
        }
        // The 100 fell out of the window: the kernel really got slower.
        assert_eq!(window.add(400), 400);
    }
}
