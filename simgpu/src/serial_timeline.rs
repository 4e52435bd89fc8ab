//! The serial sharing model (`SIMGPU_SHARING=serial`; the default is the
//! time-sliced [`crate::engine`]): every kernel of every process reserves
//! its own stretch of one device timeline.
//! The process holding the slice keeps the device for its queued kernels
//! until its slice (`SIMGPU_TIMESLICE`) runs out or it has nothing left to
//! run; other processes wait for either. Kernels are not preempted (a slice
//! ends after the kernel that crosses its end) and one process's streams
//! never overlap.

use crate::shm::{Shm, ShmDevice};
use crate::{now_ns, sleep_until};
use std::sync::atomic::Ordering::*;

/// How long after the device's last reserved kernel a slice holder with no
/// kernel queued still counts as busy: its program needs a moment to launch
/// the next one, and taking the device in that gap would switch on every
/// kernel.
const HOLDER_GRACE_NS: u64 = 20_000;
const OWNER_SHIFT: u32 = 48;

fn pack(owner: u64, start_ns: u64) -> u64 {
    owner << OWNER_SHIFT | ((start_ns / 1_000) & ((1 << OWNER_SHIFT) - 1))
}

fn unpack(word: u64) -> (u64, u64) {
    (
        word >> OWNER_SHIFT,
        (word & ((1 << OWNER_SHIFT) - 1)) * 1_000,
    )
}

/// Reserves `dur_ns` of device time for process `me` (its shared-state
/// slot plus one), starting no earlier than `ready`; returns (start, end) on
/// the device timeline. Blocks while another process holds the slice.
pub(crate) fn reserve(
    shm: &Shm,
    phys: usize,
    ready: u64,
    dur_ns: u64,
    timeslice_ns: u64,
) -> (u64, u64) {
    let dev = shm.dev(phys);
    if timeslice_ns > 0 {
        acquire(shm, phys, ready, timeslice_ns);
    }
    let mut cur = dev.busy_until.load(Acquire);
    loop {
        let start = ready.max(cur);
        let end = start + dur_ns;
        match dev
            .busy_until
            .compare_exchange_weak(cur, end, AcqRel, Acquire)
        {
            Ok(_) => return (start, end),
            Err(now) => cur = now,
        }
    }
}

/// The instant, no earlier than `ready`, from which process `me` has the
/// device: at once if it holds the slice, else once the holder's slice ran
/// out or it went idle and its last kernel ended. Work of the process that
/// takes no device time (event records) happens then: a context that is not
/// resident does not advance at all, as with real time slicing.
pub(crate) fn acquire(shm: &Shm, phys: usize, ready: u64, timeslice_ns: u64) -> u64 {
    if timeslice_ns == 0 {
        return ready;
    }
    let dev: &ShmDevice = shm.dev(phys);
    let me = shm.slot as u64 + 1;
    loop {
        let word = dev.slice.load(Acquire);
        let (owner, started) = unpack(word);
        if owner == me {
            return ready;
        }
        let busy_until = dev.busy_until.load(Acquire);
        let now = now_ns();
        let slice_end = started + timeslice_ns;
        // Idle: nothing queued (the GPU sees a context's pending work) and
        // its last kernel done a moment ago.
        let holder_idle = owner == 0
            || (shm.queued(owner as usize - 1, phys).load(Acquire) == 0
                && now >= busy_until + HOLDER_GRACE_NS);
        if owner == 0 || now >= slice_end || holder_idle {
            // Slots are reserved on the simulated timeline: a slice starts
            // when the device frees up, not when this thread woke up.
            let start = ready.max(busy_until);
            if dev
                .slice
                .compare_exchange(word, pack(me, start), AcqRel, Acquire)
                .is_ok()
            {
                if owner != 0 {
                    dev.previous_slice.store(0, Release);
                    dev.previous_slice_end.store(start, Release);
                    dev.previous_slice.store(word, Release);
                }
                return start;
            }
            continue;
        }
        sleep_until(slice_end.min(busy_until + HOLDER_GRACE_NS));
    }
}

/// When work of process `me` that takes no device time (an event record),
/// ready at `ready`, happens: at `ready` if the process held the device
/// then (its current slice, or the one before the current holder's, up to
/// and including the instant it ended: a record right behind a kernel is
/// part of finishing it), else once it has the device again.
pub(crate) fn record_time(shm: &Shm, phys: usize, ready: u64, timeslice_ns: u64) -> u64 {
    if timeslice_ns == 0 {
        return ready;
    }
    let dev: &ShmDevice = shm.dev(phys);
    let me = shm.slot as u64 + 1;
    let previous = dev.previous_slice.load(Acquire);
    let previous_end = dev.previous_slice_end.load(Acquire);
    if previous != 0 && dev.previous_slice.load(Acquire) == previous {
        let (owner, started) = unpack(previous);
        if owner == me && started <= ready && ready <= previous_end {
            return ready;
        }
    }
    acquire(shm, phys, ready, timeslice_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_word_round_trips_owner_and_microseconds() {
        let (owner, start) = unpack(pack(7, 123_456_789_000));
        assert_eq!(owner, 7);
        assert_eq!(start, 123_456_789_000);
    }
}
