//! The streams this process launched on last, per device: a timed launch
//! also records a start event on each, so that its sample begins when our
//! own earlier work (on any of them) is done, not when its own stream
//! reached it. Without this, a sample on one stream also times the work of
//! other streams queued ahead of it on the device, and a busy multi-stream
//! program is charged for its kernels more than once.
//!
//! The cost: kernels of ours that really run side by side are charged the
//! time they add to our occupancy of the device, not their full duration
//! (the device-time share is about occupancy, so that is what we want).
//!
//! Streams the program destroys (or whose context goes away) are forgotten
//! before the driver frees them, so a stale handle is never used: a timed
//! launch holds a [`Pin`] from reading the streams until its events are
//! recorded on them, and forgetting waits for the pins taken before it
//! (timed launches are rare and short; destroying a stream is not hot).

use dilu_abi::cuda::sys;
use dilu_layout::ledger::MAX_DEVICES;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Timed launches between reading the recent streams and the end of their
/// event records on them.
static PINS: AtomicUsize = AtomicUsize::new(0);

/// Held by a timed launch while it may still use streams it read here.
pub struct Pin(());

impl Pin {
    pub fn new() -> Self {
        // SeqCst (with the loads in `others` and the stores in `forget`):
        // a reader that still saw a stream was counted before it was
        // forgotten.
        PINS.fetch_add(1, Ordering::SeqCst);
        Pin(())
    }
}

impl Default for Pin {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        PINS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits until no timed launch that may have read a forgotten stream
/// still uses it.
fn wait_for_readers() {
    while PINS.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
}

// An encoded stream: its handle above the two low bits (handles are
// pointers or small constants: their top two bits are always clear), so
// the launch path encodes with a shift and an or.
/// Set in every noted entry (a null stream handle is a real stream).
const NOTED: u64 = 1 << 1;
/// The launch used the per-thread default stream semantics (`_ptsz`).
const PER_THREAD: u64 = 1;
const HANDLE_SHIFT: u32 = 2;

/// `CU_STREAM_PER_THREAD` from cuda.h.
const STREAM_PER_THREAD: u64 = 0x2;

/// Streams remembered per device (the last launches, consecutive launches
/// on one stream counted once).
pub const REMEMBERED: usize = 4;

struct Recent {
    /// The latest encoded stream (0 once forgotten): what the launch path
    /// compares with, in one load.
    last: AtomicU64,
    /// Ring of encoded streams; `newest` indexes the latest.
    streams: [AtomicU64; REMEMBERED],
    newest: AtomicUsize,
}

static RECENT: [Recent; MAX_DEVICES] = [const {
    Recent {
        last: AtomicU64::new(0),
        streams: [const { AtomicU64::new(0) }; REMEMBERED],
        newest: AtomicUsize::new(0),
    }
}; MAX_DEVICES];

/// A stream a launch was made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamRef {
    pub stream: sys::CUstream,
    pub per_thread: bool,
}

fn encode(stream: sys::CUstream, per_thread: bool) -> u64 {
    (stream as u64) << HANDLE_SHIFT | NOTED | u64::from(per_thread)
}

/// The handle a word encodes (as [`encode`] kept it).
fn handle_of(word: u64) -> u64 {
    word >> HANDLE_SHIFT
}

fn decode(word: u64) -> Option<StreamRef> {
    if word & NOTED == 0 {
        return None;
    }
    let handle = handle_of(word);
    let per_thread = word & PER_THREAD != 0;
    // A per-thread default stream names a different stream on every
    // thread: it cannot be recorded on from another one.
    if handle == STREAM_PER_THREAD || (handle == 0 && per_thread) {
        return None;
    }
    Some(StreamRef {
        stream: handle as sys::CUstream,
        per_thread,
    })
}

/// Other streams launched on recently, for a timed launch to chain to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    streams: [Option<StreamRef>; REMEMBERED],
}

impl Previous {
    pub fn iter(&self) -> impl Iterator<Item = StreamRef> + '_ {
        self.streams.iter().flatten().copied()
    }
}

/// Notes a launch on `stream` of `device` (on the launch path: a load, and
/// three stores when the stream changed).
#[inline]
pub fn launching_on(device: usize, stream: sys::CUstream, per_thread: bool) {
    let recent = &RECENT[device];
    let word = encode(stream, per_thread);
    if recent.last.load(Ordering::Relaxed) != word {
        noted(recent, word);
    }
}

/// A launch on another stream than the last one: the ring moves on.
#[inline(never)]
fn noted(recent: &Recent, word: u64) {
    let next = (recent.newest.load(Ordering::Relaxed) + 1) % REMEMBERED;
    recent.streams[next].store(word, Ordering::Relaxed);
    recent.newest.store(next, Ordering::Relaxed);
    recent.last.store(word, Ordering::Relaxed);
}

/// The distinct streams other than `stream` launched on recently on
/// `device`; they stay usable while `_pin` is held.
pub fn others(_pin: &Pin, device: usize, stream: sys::CUstream, per_thread: bool) -> Previous {
    let own = encode(stream, per_thread);
    let mut seen = [own; REMEMBERED];
    let mut previous = Previous::default();
    let mut count = 0;
    for slot in &RECENT[device].streams {
        let word = slot.load(Ordering::SeqCst);
        if word != own && !seen[..count].contains(&word) {
            seen[count] = word;
            previous.streams[count] = decode(word);
            count += 1;
        }
    }
    previous
}

/// Forgets `stream` (it is about to be destroyed); returns once no timed
/// launch can still record on it.
pub fn forget(stream: sys::CUstream) {
    let handle = handle_of(encode(stream, false));
    for slot in RECENT
        .iter()
        .flat_map(|recent| std::iter::once(&recent.last).chain(&recent.streams))
    {
        let word = slot.load(Ordering::SeqCst);
        if word & NOTED != 0 && handle_of(word) == handle {
            let _ = slot.compare_exchange(word, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    wait_for_readers();
}

/// Forgets every stream (a context is about to be destroyed or reset);
/// returns once no timed launch can still record on one.
pub fn forget_all() {
    for slot in RECENT
        .iter()
        .flat_map(|recent| std::iter::once(&recent.last).chain(&recent.streams))
    {
        slot.store(0, Ordering::SeqCst);
    }
    wait_for_readers();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(n: usize) -> sys::CUstream {
        n as sys::CUstream
    }

    /// The remembered streams are process-wide and `forget_all` clears
    /// every device: tests that rely on them run one at a time.
    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn others_of(device: usize, stream: usize) -> Vec<usize> {
        let mut v: Vec<usize> = others(&Pin::new(), device, handle(stream), false)
            .iter()
            .map(|r| r.stream as usize)
            .collect();
        v.sort();
        v
    }

    // One test: the slots are process-wide and tests run in parallel.
    #[test]
    fn recent_other_streams_are_returned_while_they_are_usable() {
        let _serial = one_at_a_time();
        forget_all();
        for s in [0x1000, 0x1000, 0x2000, 0x3000] {
            launching_on(3, handle(s), false);
        }
        assert_eq!(others_of(3, 0x1000), [0x2000, 0x3000]);
        assert_eq!(others_of(3, 0x4000), [0x1000, 0x2000, 0x3000]);
        // Only the last few streams are remembered; the legacy null stream
        // is one stream for every thread.
        for s in [0x4000, 0x5000, 0x0] {
            launching_on(3, handle(s), false);
        }
        assert_eq!(others_of(3, 0x1000), [0x0, 0x3000, 0x4000, 0x5000]);

        // Destroyed streams and per-thread default streams are never returned.
        forget(handle(0x4000));
        assert_eq!(others_of(3, 0x1000), [0x0, 0x3000, 0x5000]);
        launching_on(3, handle(0), true);
        launching_on(3, handle(STREAM_PER_THREAD as usize), false);
        assert_eq!(others_of(3, 0x1000), [0x0, 0x5000]);
        forget_all();
        assert_eq!(others_of(3, 0x1000), Vec::<usize>::new());

        // A handle destroyed and made again (the driver reuses them) is
        // noted at its next launch, even right after its last one.
        launching_on(3, handle(0x6000), false);
        forget(handle(0x6000));
        launching_on(3, handle(0x6000), false);
        assert_eq!(others_of(3, 0x1000), [0x6000]);
        forget_all();
    }

    // A launch that read a stream records on it after a destroying thread
    // forgot it: the destroyer must not free it before that record.
    #[test]
    fn a_stream_is_not_destroyed_under_a_launch_that_read_it() {
        use std::sync::atomic::AtomicBool;
        use std::sync::mpsc;
        use std::time::Duration;
        let _serial = one_at_a_time();
        const DEVICE: usize = 11; // no other test uses it
        const STREAM: usize = 0x7700;
        launching_on(DEVICE, handle(STREAM), false);
        let destroyed = AtomicBool::new(false);
        let (read_tx, read_rx) = mpsc::channel();
        std::thread::scope(|scope| {
            // The sender moves into the thread: if it fails before sending,
            // the receive below fails too instead of waiting for ever.
            let destroyed = &destroyed;
            let launch = scope.spawn(move || {
                let pin = Pin::new();
                let previous = others(&pin, DEVICE, handle(0x1), false);
                assert!(previous.iter().any(|s| s.stream as usize == STREAM));
                read_tx.send(()).unwrap();
                // Recording takes a while (a loaded machine, a slow driver).
                std::thread::sleep(Duration::from_millis(200));
                let recorded_on_live_stream = !destroyed.load(Ordering::SeqCst);
                drop(pin);
                recorded_on_live_stream
            });
            read_rx
                .recv()
                .expect("the launching thread failed before reading the stream");
            // cuStreamDestroy: forget, then the real destroy.
            forget(handle(STREAM));
            destroyed.store(true, Ordering::SeqCst);
            assert!(
                launch.join().unwrap(),
                "an event was recorded on a destroyed stream"
            );
        });
    }
}
