//! Measuring launches: events recorded around a sample of launches, read on
//! a background thread (never synchronising on the launch path), turned into
//! per-kind duration estimates, and the difference to what was charged
//! charged back to the tenant's bucket.
//!
//! A sample starts at the latest of its start events: one recorded on the
//! launch's stream, and one on each other stream this process launched on
//! recently on the device (see [`recent_streams`](crate::sm_time::recent_streams)),
//! so it times the launch from when our own earlier work was done.
//!
//! A timed launch also runs apart from those streams: its stream waits for
//! their start events (`cuStreamWaitEvent`), and they wait for its end
//! event before the work launched on them afterwards. Kernels of one
//! process on several streams run side by side and share the SMs, so a
//! kernel timed among its siblings lasts up to as many times its own time
//! as there are streams, and no sample says how much of that was its own:
//! timed among them, 100 µs kernels on 3 streams were estimated at 114-141
//! µs, and a 30/70 pair of such tenants, which NVML cannot correct, kept
//! 71-75% of the device busy against 92% without dilu (now 90%). Apart, the sample
//! is the kernel's own time (100-104 µs). The order added is the
//! program's own launch order, which events and synchronisations can never
//! contradict (a program that orders its streams by memory values can, so
//! there it is not added); it costs a moment of concurrency once per sample, and
//! stable kinds are timed one launch in thousands. Streams beyond the
//! [`REMEMBERED`] most recent, and a driver without `cuStreamWaitEvent`,
//! still overlap: the estimate then falls back to [`mean_without_waits`]
//! and NVML's count. So do all streams of a program that orders its streams
//! by memory values ([`program_orders_streams_itself`]), where an added
//! order could deadlock it, and with `DILU_SM_ABLATE=apart`.
//!
//! A sample can contain more than the kernel (waits for other processes,
//! host time), never much less, so the samples that hold only the kernel
//! are the low ones. Their minimum alone would be biased low, because real
//! kernel durations vary from run to run (the minimum of 16 draws lies
//! below their mean: −2.5% measured on simgpu's time-sliced model, so a
//! 70% cap would let about 72% through). The estimate of a kind is the
//! mean of its last [`WINDOW`] samples that lie within 1/8 of their
//! minimum ([`CLEAN_FRACTION_SHIFT`]): run-to-run spread is kept, samples
//! stretched by a wait are not. A kernel that really became slower is recognised after
//! [`WINDOW`] samples. A kernel longer than a time slice, though, is
//! preempted whenever another process has work, so while one is busy every
//! sample of it holds that process's slice: such kinds are timed under a
//! quiet hold ([`quiet_samples`](crate::sm_time::quiet_samples): the
//! device's other dilu processes hold their launches and let their queues
//! drain), and a sample taken without one (the drain limit passed) does
//! not move the sampling period. What no per-kernel sample can attribute
//! (kernels of several streams overlapping) is settled against the
//! driver's own count by [`usage_feedback`](crate::sm_time::usage_feedback)
//! where that count means device time.
//!
//! When the launch's stream was idle, the start event completes at once
//! and the sample also holds the host time until the kernel reaches the
//! device (a few µs): a short kernel launched one request at a time is
//! over-charged by that much, and [`usage_feedback`](crate::sm_time::usage_feedback)
//! settles it where the driver's count means device time (holding the
//! stream until the launch was queued bought nothing beyond run-to-run
//! noise: `bench/results/ablation-before-removals.md`, "sample gate off").
//!
//! Event sets belong to a context. When a context is destroyed (or may
//! be: the primary context released or reset) every set made so far is
//! retired ([`contexts_changed`]): never reused, never queried again.

use crate::driver;
use crate::sm_time::kernel_estimates::Entry;
use crate::sm_time::quiet_samples::{self, QuietHold};
use crate::sm_time::recent_streams::{self, REMEMBERED};
use crate::sm_time::tenant_sm;
use crate::table::{
    PFN_cuCtxGetCurrent, PFN_cuCtxSetCurrent, PFN_cuEventCreate, PFN_cuEventElapsedTime,
    PFN_cuEventQuery, PFN_cuEventRecord, PFN_cuEventRecord_ptsz, PFN_cuStreamWaitEvent,
    PFN_cuStreamWaitEvent_ptsz, REAL,
};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use dilu_abi::cuda::{CUDA_SUCCESS, sys};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Samples of one kind the estimate is made of.
pub const WINDOW: usize = 16;
/// Samples more than this fraction (1/8) above the window's smallest hold
/// something besides the kernel and are left out of the estimate.
/// Duration spread on hardware is a few percent; a wait for another
/// process or for the host is at least several µs, which is more than
/// 1/8 of the short kernels where it matters.
const CLEAN_FRACTION_SHIFT: u32 = 3;

/// Samples a kind's first estimate rests on. A sample holds whatever the
/// launch waited for besides the kernel (another process's time slice, the
/// host), and only a second sample can show that a first one did: settled
/// alone, a first sample stretched by a wait was charged to every launch
/// of the kind made before it (each charged only [`FIRST_GUESS_NS`] so
/// far) and to the next ones. On an 8-GPU simgpu node where 24 tenants
/// start at once on 2 cores, servers of 0.5 ms kernels had first samples
/// of 15-50 ms: the settlement put 30-100 ms of GPU time (60-200 ms of
/// wall-clock time at a 50% share) into their buckets, and their first
/// requests took 100-800 ms against 5-40 ms for the same servers without
/// dilu (`scripts/bench.sh multigpu`'s p99 under dilu was this transient).
/// Until the second sample the kind is charged the first guess, and its
/// launches are timed one after another (a kind without an estimate is
/// timed whenever no sample of it is in flight), so a kind waits for its
/// estimate about one launch longer, and the second sample settles every
/// launch made so far exactly.
///
/// [`FIRST_GUESS_NS`]: crate::sm_time::kernel_estimates::FIRST_GUESS_NS
pub const FIRST_ESTIMATE_SAMPLES: usize = 2;

/// Event sets a process keeps at most (= samples in flight).
const MAX_SETS: usize = 64;

struct EventFns {
    create: PFN_cuEventCreate,
    record: PFN_cuEventRecord,
    record_ptsz: Option<PFN_cuEventRecord_ptsz>,
    query: PFN_cuEventQuery,
    elapsed: PFN_cuEventElapsedTime,
    get_current: PFN_cuCtxGetCurrent,
    set_current: PFN_cuCtxSetCurrent,
    /// Plain and per-thread-stream `cuStreamWaitEvent`, to run a timed
    /// launch apart from our other streams' work.
    wait: Option<PFN_cuStreamWaitEvent>,
    wait_ptsz: Option<PFN_cuStreamWaitEvent_ptsz>,
}

fn fns() -> Option<&'static EventFns> {
    static FNS: OnceLock<Option<EventFns>> = OnceLock::new();
    FNS.get_or_init(|| {
        Some(EventFns {
            create: driver::resolved(&REAL.cuEventCreate)?,
            record: driver::resolved(&REAL.cuEventRecord)?,
            record_ptsz: driver::resolved(&REAL.cuEventRecord_ptsz),
            query: driver::resolved(&REAL.cuEventQuery)?,
            elapsed: driver::resolved(&REAL.cuEventElapsedTime)?,
            get_current: driver::resolved(&REAL.cuCtxGetCurrent)?,
            set_current: driver::resolved(&REAL.cuCtxSetCurrent)?,
            wait: driver::resolved(&REAL.cuStreamWaitEvent),
            wait_ptsz: driver::resolved(&REAL.cuStreamWaitEvent_ptsz),
        })
    })
    .as_ref()
}

/// The timing events of one sample, of one context (handles kept as
/// integers: they are plain driver handles, usable from any thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct EventSet {
    /// Recorded on the launch's stream before the launch.
    start: usize,
    /// Recorded on other streams launched on recently.
    after_others: [usize; REMEMBERED],
    /// Recorded on the launch's stream after the launch.
    end: usize,
    ctx: usize,
    /// The pool's epoch when the set was made.
    epoch: u64,
}

struct Sample {
    events: EventSet,
    /// Which of `after_others` were recorded.
    chained: [bool; REMEMBERED],
    entry: &'static Entry,
    device: usize,
    /// The hold this sample was taken under, released once it is read.
    quiet: Option<QuietHold>,
}

impl Sample {
    /// The sample was read (or never will be): the kind may be timed
    /// again, and the device's other processes may launch.
    fn done(&self) {
        self.entry.stop_sampling();
        if let Some(hold) = self.quiet {
            quiet_samples::release(hold);
        }
    }
}

/// A context is being destroyed (or the primary context released or
/// reset): retire every event set made so far.
pub fn contexts_changed() {
    pool().contexts_changed();
}

/// The event sets of this process: at most `max` exist, idle ones wait in
/// the free queue.
struct SetPool {
    free_tx: Sender<EventSet>,
    free_rx: Receiver<EventSet>,
    created: AtomicUsize,
    max: usize,
    /// Bumped whenever a context of this process is (or may be) destroyed:
    /// sets made before belong to contexts that may be gone.
    epoch: AtomicU64,
}

impl SetPool {
    fn new(max: usize) -> Self {
        let (free_tx, free_rx) = crossbeam_channel::bounded(max);
        SetPool {
            free_tx,
            free_rx,
            created: AtomicUsize::new(0),
            max,
            epoch: AtomicU64::new(0),
        }
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn contexts_changed(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// An idle set of `ctx`, else a new one from `create` while fewer than
    /// `max` exist. Sets of an older epoch are retired on the way (their
    /// context may be gone: using or re-queuing them would keep dead sets
    /// circulating and, once all `max` were dead, stop sampling for good).
    /// A set of another live context goes back for that context.
    fn take(&self, ctx: usize, create: impl FnOnce(u64) -> Option<EventSet>) -> Option<EventSet> {
        let epoch = self.epoch();
        for _ in 0..self.max {
            match self.free_rx.try_recv() {
                Ok(set) if set.epoch != epoch => self.retire(),
                Ok(set) if set.ctx == ctx => return Some(set),
                Ok(other) => {
                    self.give_back(other);
                    break;
                }
                Err(_) => break,
            }
        }
        if self.created.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.created.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let set = create(epoch);
        if set.is_none() {
            self.created.fetch_sub(1, Ordering::AcqRel);
        }
        set
    }

    /// Puts an idle set back (retired instead if its epoch is over).
    fn give_back(&self, set: EventSet) {
        if set.epoch != self.epoch() || self.free_tx.try_send(set).is_err() {
            self.retire();
        }
    }

    /// Forgets a set for good (its events are not destroyed: their context
    /// may be gone, and destroying an event of a dead context is not safe).
    fn retire(&self) {
        self.created.fetch_sub(1, Ordering::AcqRel);
    }
}

fn pool() -> &'static SetPool {
    static POOL: OnceLock<SetPool> = OnceLock::new();
    POOL.get_or_init(|| SetPool::new(MAX_SETS))
}

struct Channels {
    sample_tx: Sender<Sample>,
    sample_rx: Receiver<Sample>,
}

fn channels() -> &'static Channels {
    static CHANNELS: OnceLock<Channels> = OnceLock::new();
    CHANNELS.get_or_init(|| {
        let (sample_tx, sample_rx) = crossbeam_channel::bounded(MAX_SETS);
        Channels {
            sample_tx,
            sample_rx,
        }
    })
}

static HARVESTER_RUNNING: AtomicBool = AtomicBool::new(false);

fn record(fns: &EventFns, event: usize, stream: sys::CUstream, per_thread: bool) -> bool {
    let record = match (per_thread, fns.record_ptsz) {
        (true, Some(ptsz)) => ptsz,
        _ => fns.record,
    };
    // SAFETY: a live event of ours and the stream the program launches on.
    unsafe { record(event as sys::CUevent, stream) == CUDA_SUCCESS }
}

/// Set once the program waits on a memory value or an external semaphore
/// (`cuStreamWaitValue*`, `cuStreamBatchMemOp`,
/// `cuWaitExternalSemaphoresAsync`).
static ORDERS_STREAMS_ITSELF: AtomicBool = AtomicBool::new(false);

/// The program orders its streams by values: earlier work on one stream may
/// wait for a value later work on another writes. An order a timed launch
/// added (its kernel after that earlier work, or the other stream's later
/// work after its kernel) could then deadlock a correct program, so from
/// now on timed launches run among the other streams again (their samples
/// then fall back to [`mean_without_waits`] and NVML's count).
#[cold]
pub fn program_orders_streams_itself() {
    if !ORDERS_STREAMS_ITSELF.swap(true, Ordering::Relaxed) {
        tracing::debug!("the program waits on memory values: timed launches no longer run apart");
    }
}

/// Whether a timed launch is run apart from the process's other streams
/// (see the module doc); `DILU_SM_ABLATE=apart` turns it off.
fn set_apart_from_other_streams() -> bool {
    !ORDERS_STREAMS_ITSELF.load(Ordering::Relaxed) && !crate::config::get().ablate.apart
}

/// Makes the work launched on `stream` from now on wait for `event`;
/// whether it will.
fn wait_for(fns: &EventFns, stream: sys::CUstream, per_thread: bool, event: usize) -> bool {
    let wait = match (per_thread, fns.wait_ptsz) {
        (true, Some(ptsz)) => ptsz,
        _ => match fns.wait {
            Some(plain) => plain,
            None => return false,
        },
    };
    // SAFETY: the real cuStreamWaitEvent; a live event of ours, recorded,
    // and a stream the program launched on (flags 0: the default wait).
    unsafe { wait(stream, event as sys::CUevent, 0) == CUDA_SUCCESS }
}

fn create_set(fns: &EventFns, ctx: usize, epoch: u64) -> Option<EventSet> {
    let mut events: [sys::CUevent; 2 + REMEMBERED] = [std::ptr::null_mut(); 2 + REMEMBERED];
    for event in &mut events {
        // SAFETY: create writes one event handle to a live local (flags 0:
        // timing enabled) in the calling thread's current context.
        if unsafe { (fns.create)(event, 0) } != CUDA_SUCCESS {
            return None;
        }
    }
    Some(EventSet {
        start: events[0] as usize,
        end: events[1] as usize,
        after_others: std::array::from_fn(|i| events[2 + i] as usize),
        ctx,
        epoch,
    })
}

/// A launch being timed: its start event(s) are recorded.
pub struct Timing {
    events: EventSet,
    chained: [bool; REMEMBERED],
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
    let pool = pool();
    let events = pool.take(ctx, |epoch| create_set(fns, ctx, epoch))?;
    // Recording fails harmlessly on a stream of another context; the
    // sample then does not start there.
    let mut chained = [false; REMEMBERED];
    for ((other, event), chained) in others.iter().zip(events.after_others).zip(&mut chained) {
        *chained = record(fns, event, other.stream, other.per_thread);
        // The timed kernel starts only once that stream's earlier work is
        // done (see the module doc: a sample then holds no sibling).
        if *chained && set_apart_from_other_streams() {
            wait_for(fns, stream, per_thread, event);
        }
    }
    // The own stream last, right before the launch.
    if record(fns, events.start, stream, per_thread) {
        Some(Timing { events, chained })
    } else {
        pool.give_back(events);
        None
    }
}

/// Completes a sample after the launch: records the end event, makes the
/// work launched from now on on `others` (our other recent streams) wait
/// for it, and hands the events to the harvester. Always releases the
/// kind's sampling claim and the `quiet` hold when the sample cannot be
/// taken.
#[allow(clippy::too_many_arguments)]
pub fn finish(
    timing: Option<Timing>,
    launched: bool,
    stream: sys::CUstream,
    per_thread: bool,
    others: &recent_streams::Previous,
    entry: &'static Entry,
    device: usize,
    quiet: Option<QuietHold>,
) {
    let give_up = |events: Option<EventSet>| {
        if let Some(events) = events {
            pool().give_back(events);
        }
        entry.stop_sampling();
        if let Some(hold) = quiet {
            quiet_samples::release(hold);
        }
    };
    let Some(Timing { events, chained }) = timing else {
        return give_up(None);
    };
    let Some(fns) = fns() else {
        return give_up(None);
    };
    if !launched || !record(fns, events.end, stream, per_thread) {
        return give_up(Some(events));
    }
    if set_apart_from_other_streams() {
        for other in others.iter() {
            wait_for(fns, other.stream, other.per_thread, events.end);
        }
    }
    if let Err(error) = channels().sample_tx.try_send(Sample {
        events,
        chained,
        entry,
        device,
        quiet,
    }) {
        return give_up(Some(error.into_inner().events));
    }
    if !HARVESTER_RUNNING.load(Ordering::Acquire) {
        start_harvester();
    } else if quiet.is_some() {
        wake_harvester();
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
    match spawned {
        // Leaked: one per harvester started (once per process, and once
        // in each forked child that samples).
        Ok(handle) => HARVESTER.store(
            Box::into_raw(Box::new(handle.thread().clone())),
            Ordering::Release,
        ),
        Err(_) => HARVESTER_RUNNING.store(false, Ordering::Release),
    }
    crate::sm_time::usage_feedback::ensure_running();
}

/// The harvester thread, to wake when a sample holds other processes
/// (see [`quiet_samples`]): it may be idling for up to [`IDLE_POLL_MAX`],
/// and they wait until it reads the sample. A pointer, not a lock: a
/// forked child must be able to forget it whatever its parent's threads
/// were doing.
static HARVESTER: AtomicPtr<std::thread::Thread> = AtomicPtr::new(std::ptr::null_mut());

fn wake_harvester() {
    let thread = HARVESTER.load(Ordering::Acquire);
    if !thread.is_null() {
        // SAFETY: a leaked Box, never freed.
        unsafe { &*thread }.unpark();
    }
}

/// A forked child has no harvester thread (and its parent's events belong
/// to the parent's contexts).
pub fn forget_parent_state_in_child() {
    HARVESTER_RUNNING.store(false, Ordering::Relaxed);
    HARVESTER.store(std::ptr::null_mut(), Ordering::Relaxed);
}

/// The last [`WINDOW`] samples of one kind.
#[derive(Default)]
struct Window {
    samples: [u64; WINDOW],
    /// Whether another stream's work ended inside the sample and it was
    /// timed from there (see [`Window::add`]).
    shortened: [bool; WINDOW],
    filled: usize,
    next: usize,
}

impl Window {
    /// Adds a sample; returns the estimate: the mean of the window's
    /// samples within 1/8 of its smallest. None while the window holds
    /// fewer than [`FIRST_ESTIMATE_SAMPLES`]: a lone sample cannot be told
    /// apart from one that held a wait.
    ///
    /// Except where some samples were `shortened` (timed from another
    /// stream's completion, which happens only where the launch could not
    /// be run apart, see the module doc): kernels of the process then overlap, a sample
    /// is only the part of the busy time the kernel added after the others,
    /// anywhere from nothing to its whole duration, and only the mean of
    /// all of them says what a launch adds, less those that held another
    /// process's slice ([`mean_without_waits`]; `streams` is how many of
    /// our streams the sample was timed against). Their low ones are not
    /// the clean ones: keeping those charged a 3-stream tenant a twentieth
    /// of its kernels' time. What that mean gets wrong is settled by
    /// [`usage_feedback`](crate::sm_time::usage_feedback) where NVML can tell.
    fn add(&mut self, ns: u64, shortened: bool, streams: usize) -> Option<u64> {
        self.samples[self.next] = ns;
        self.shortened[self.next] = shortened;
        self.next = (self.next + 1) % WINDOW;
        self.filled = (self.filled + 1).min(WINDOW);
        if self.filled < FIRST_ESTIMATE_SAMPLES {
            return None;
        }
        let window = &self.samples[..self.filled];
        if self.shortened[..self.filled].contains(&true) {
            return Some(mean_without_waits(window, streams));
        }
        let smallest = window.iter().copied().min().unwrap_or(ns);
        Some(mean_up_to(
            window,
            smallest.saturating_add(smallest >> CLEAN_FRACTION_SHIFT),
        ))
    }
}

/// The mean of the samples no longer than `limit` (0 if none is).
fn mean_up_to(window: &[u64], limit: u64) -> u64 {
    let (sum, count) = window
        .iter()
        .filter(|&&sample| sample <= limit)
        .fold((0u128, 0u128), |(sum, count), &sample| {
            (sum + u128::from(sample), count + 1)
        });
    (sum / count.max(1)) as u64
}

/// The mean of overlapping kernels' samples, without those that held a
/// wait for another process.
///
/// A sample of kernels side by side on `streams` streams holds at most
/// the stretch they share, about `streams` times what one adds on average;
/// a sample longer than `streams + 1` times the mean held something else:
/// the device was another process's (a time slice is 2 ms; the kernels
/// where overlap matters are often 0.1 ms). Kept in, one such sample in a
/// window of 16 raised the estimate by half or more: a 30/70 pair on 3
/// streams left 30% of the device idle (70% used; 73-83% without them, in
/// `thirty_seventy_with_launches_on_several_streams`). Waits shorter than
/// that (another process's short slice) stay in, as does the stretch two
/// samples share when a later launch on another stream ends first: the
/// estimate stays high by about a quarter there, which is why timed
/// launches are run apart where they can be.
fn mean_without_waits(window: &[u64], streams: usize) -> u64 {
    let with_all = mean_up_to(window, u64::MAX);
    mean_up_to(window, with_all.saturating_mul(streams as u64 + 1))
}

fn harvest() {
    let Some(fns) = fns() else { return };
    let channels = channels();
    let mut pending: Vec<Sample> = Vec::new();
    let mut windows: HashMap<usize, Window> = HashMap::new();
    let mut current_ctx = 0usize;
    let mut idle_sleep = IDLE_POLL_MIN;
    loop {
        // Polled, never blocked on: a launch handing over a sample must not
        // have to wake this thread (a futex call on the launch path).
        loop {
            match channels.sample_rx.try_recv() {
                Ok(sample) => pending.push(sample),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        pending.retain(|sample| {
            if sample.events.epoch != pool().epoch() {
                // Its context may be gone: never touch these events again.
                pool().retire();
                sample.done();
                return false;
            }
            if sample.events.ctx != current_ctx {
                // SAFETY: a context handle this process obtained from the
                // driver, of the current epoch (not destroyed since).
                unsafe { (fns.set_current)(sample.events.ctx as sys::CUcontext) };
                current_ctx = sample.events.ctx;
            }
            // SAFETY: a live event of ours.
            match unsafe { (fns.query)(sample.events.end as sys::CUevent) } {
                CUDA_SUCCESS => {}
                dilu_abi::cuda::CUDA_ERROR_NOT_READY => return true,
                _ => {
                    // Unusable events: dropped, so a new set may be
                    // created in their place.
                    pool().retire();
                    sample.done();
                    return false;
                }
            }
            // Timed from the latest start event; another stream counts only
            // if its work was done before this launch's end (else it did not
            // run ahead of it).
            let events = &sample.events;
            let own = elapsed_ns(fns, events.start, events.end);
            let measured = (events.after_others.iter().zip(sample.chained))
                .filter(|&(_, chained)| chained)
                .map(|(&event, _)| event)
                .filter_map(|start| elapsed_ns(fns, start, events.end))
                .chain(own)
                .min();
            if let Some(measured) = measured.map(|ns| ns.max(1)) {
                let window = windows
                    .entry(sample.entry as *const Entry as usize)
                    .or_default();
                let shortened = own.is_none_or(|own| measured < own);
                let streams = 1 + sample.chained.iter().filter(|&&c| c).count();
                let estimate = window.add(measured, shortened, streams);
                tracing::trace!(
                    kind = sample.entry as *const Entry as usize,
                    measured,
                    estimate,
                    "launch sample"
                );
                if let Some(estimate) = estimate {
                    settle(sample, estimate, measured);
                }
            }
            sample.done();
            pool().give_back(sample.events);
            false
        });
        if pending.is_empty() {
            std::thread::park_timeout(idle_sleep);
            idle_sleep = (idle_sleep * 2).min(IDLE_POLL_MAX);
        } else {
            idle_sleep = IDLE_POLL_MIN;
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// How often the harvester looks for new samples when it has none: from
/// every millisecond after a sample, backing off to every 20 ms.
const IDLE_POLL_MIN: Duration = Duration::from_millis(1);
const IDLE_POLL_MAX: Duration = Duration::from_millis(20);

/// Time from `from` to `to` in ns; `None` unless both completed with `to`
/// no earlier than `from`.
fn elapsed_ns(fns: &EventFns, from: usize, to: usize) -> Option<u64> {
    let mut ms: f32 = 0.0;
    // SAFETY: writes one float; both are live events of ours.
    let result = unsafe { (fns.elapsed)(&mut ms, from as sys::CUevent, to as sys::CUevent) };
    (result == CUDA_SUCCESS && ms >= 0.0).then_some((ms as f64 * 1e6) as u64)
}

fn settle(sample: &Sample, estimate_ns: u64, measured_ns: u64) {
    let trusted = sample.quiet.is_none_or(|hold| hold.drained());
    let delta = sample
        .entry
        .settle_sample(estimate_ns, measured_ns, trusted);
    tracing::trace!(delta, estimate_ns, "settled");
    let Some(sm) = tenant_sm::get() else { return };
    let device = sm.device(sample.device);
    device.record_sample();
    if delta != 0 {
        crate::sm_time::usage_feedback::charged(sample.device, delta);
        device.record_correction(delta);
        let share = sm.budget().share_ppm(sample.device);
        sm.bucket(sample.device)
            .charge_back(delta, share, dilu_layout::monotonic_ns());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_leaves_out_samples_that_held_a_wait() {
        let mut window = Window::default();
        assert_eq!(window.add(300, false, 1), None, "a lone sample");
        assert_eq!(window.add(100, false, 1), Some(100));
        assert_eq!(window.add(250, false, 1), Some(100));
        for _ in 0..WINDOW - 1 {
            window.add(400, false, 1);
        }
        // The 100 fell out of the window: the kernel really got slower.
        assert_eq!(window.add(400, false, 1), Some(400));
    }

    #[test]
    fn a_first_sample_that_held_a_wait_is_never_charged() {
        // A server's 0.5 ms kernel: its first sample held 20 ms of waiting
        // (the host, on a node where many tenants start at once), by when
        // 8 launches were charged the first guess. Settled alone, it put
        // 8 × 19.9 ms into the bucket (0.32 s of wall-clock time at a 50%
        // share) and charged the next launches 20 ms each. The second
        // sample's refund did not undo it: a charge moves the bucket at
        // once, a refund is paid back a part of each later launch. The
        // second sample now settles them all at the kernel's time.
        use crate::sm_time::kernel_estimates::{EstimateTable, FIRST_GUESS_NS, LaunchKey};
        let table = Box::new(EstimateTable::new());
        let (entry, _) = table.entry(LaunchKey::kernel(3, 6600));
        let mut window = Window::default();
        let mut settlements = Vec::new();
        for measured in [20_000_000, 500_000] {
            for _ in 0..8 {
                entry.charge();
            }
            if let Some(estimate) = window.add(measured, false, 1) {
                settlements.push(entry.settle_sample(estimate, measured, true));
            }
        }
        assert_eq!(entry.estimate_ns(), Some(500_000));
        assert_eq!(
            settlements,
            vec![16 * (500_000 - FIRST_GUESS_NS as i64)],
            "charged back (ns) at each sample"
        );
    }

    #[test]
    fn the_estimate_is_unbiased_under_run_to_run_spread() {
        // Durations spread ±3% around 100 µs, as a real kernel's do, with
        // one in four samples stretched by a 1 ms wait for another process.
        let spread = [
            97_000, 103_000, 99_000, 101_000, 98_000, 102_000, 100_000, 100_000,
        ];
        let mut window = Window::default();
        let mut estimate = 0;
        for (i, &kernel) in spread.iter().cycle().take(4 * WINDOW).enumerate() {
            let sample = if i % 4 == 3 {
                kernel + 1_000_000
            } else {
                kernel
            };
            estimate = window.add(sample, false, 1).unwrap_or(estimate);
        }
        // The smallest sample (97 µs) would under-charge by 3%.
        assert!(
            (99_500..=100_500).contains(&estimate),
            "estimate {estimate} ns for a 100 µs mean"
        );
    }

    #[test]
    fn overlapping_kernels_are_charged_the_mean_of_what_they_add() {
        // Three streams' 100 µs kernels side by side: timed from the other
        // streams' completions, one sample in three holds the whole 300 µs
        // stretch they share, the others almost nothing.
        let mut window = Window::default();
        let mut estimate = 0;
        for i in 0..WINDOW {
            let (sample, shortened) = if i % 3 == 0 {
                (300_000, false)
            } else {
                (2_000, true)
            };
            estimate = window.add(sample, shortened, 3).unwrap_or(estimate);
        }
        assert!(
            (90_000..=120_000).contains(&estimate),
            "estimate {estimate} ns for 100 µs of busy time per launch"
        );
    }

    #[test]
    fn overlapping_kernels_are_not_charged_another_processs_slice() {
        // As above, with one sample in the window that also held 2.2 ms of
        // another process's time slice (and switches).
        let mut window = Window::default();
        let mut estimate = 0;
        for i in 0..WINDOW {
            let (sample, shortened) = match i % 3 {
                _ if i == 7 => (2_500_000, false),
                0 => (300_000, false),
                _ => (2_000, true),
            };
            estimate = window.add(sample, shortened, 3).unwrap_or(estimate);
        }
        // The mean of the 15 others: six 300 µs stretches, nine 2 µs.
        assert_eq!(estimate, (6 * 300_000 + 9 * 2_000) / 15);
    }

    fn set(ctx: usize, epoch: u64, n: usize) -> EventSet {
        EventSet {
            start: n,
            after_others: [n; REMEMBERED],
            end: n,
            ctx,
            epoch,
        }
    }

    #[test]
    fn sets_of_destroyed_contexts_are_retired_not_requeued() {
        // The pool is filled by a context that is then destroyed.
        let pool = SetPool::new(4);
        let mut taken = Vec::new();
        for n in 0..4 {
            taken.push(pool.take(0xA, |epoch| Some(set(0xA, epoch, n))).unwrap());
        }
        assert!(pool.take(0xA, |epoch| Some(set(0xA, epoch, 99))).is_none());
        for s in taken {
            pool.give_back(s);
        }
        pool.contexts_changed();
        // A new context still gets sets: the dead ones made room.
        for n in 0..4 {
            let got = pool.take(0xB, |epoch| Some(set(0xB, epoch, 100 + n)));
            assert_eq!(got.map(|s| s.ctx), Some(0xB), "set {n}");
        }
        assert_eq!(pool.created.load(Ordering::Acquire), 4);
    }

    #[test]
    fn a_live_contexts_set_waits_for_its_context() {
        let pool = SetPool::new(4);
        let a = pool.take(0xA, |epoch| Some(set(0xA, epoch, 1))).unwrap();
        pool.give_back(a);
        let b = pool.take(0xB, |epoch| Some(set(0xB, epoch, 2))).unwrap();
        assert_eq!(b.ctx, 0xB);
        let again = pool.take(0xA, |_| None).unwrap();
        assert_eq!(again, a, "A's set was kept for A");
    }
}
