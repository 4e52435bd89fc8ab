//! Who gets the device next: time slices between processes, like a GPU
//! without MPS. The process holding the slice keeps the device for its
//! queued kernels until its slice (`SIMGPU_TIMESLICE`) runs out or it has
//! nothing left to run; other processes wait for either. Kernels are not
//! preempted: a slice ends after the kernel that crosses its end.

use crate::shm::ShmDevice;
use crate::{now_ns, sleep_until};
use std::sync::atomic::Ordering::*;

/// How long after the device's last reserved kernel the slice holder still
/// counts as busy: its stream worker needs a moment to queue its next
/// kernel, and taking the device in that gap would switch on every kernel.
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

/// Reserves `dur_ns` of device time for process `me` (its shared-state slot
/// + 1), starting no earlier than `ready`; returns (start, end) on the
/// device timeline. Blocks while another process holds the slice.
pub(crate) fn reserve(
    dev: &ShmDevice,
    me: u64,
    ready: u64,
    dur_ns: u64,
    timeslice_ns: u64,
) -> (u64, u64) {
    if timeslice_ns > 0 {
        take_slice(dev, me, ready, timeslice_ns);
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

/// Waits until `me` holds the slice (or may take it) and records it.
fn take_slice(dev: &ShmDevice, me: u64, ready: u64, timeslice_ns: u64) {
    loop {
        let word = dev.slice.load(Acquire);
        let (owner, started) = unpack(word);
        if owner == me {
            return;
        }
        let busy_until = dev.busy_until.load(Acquire);
        let now = now_ns();
        let slice_end = started + timeslice_ns;
        let holder_idle = now >= busy_until + HOLDER_GRACE_NS;
        if owner == 0 || now >= slice_end || holder_idle {
            // Slots are reserved on the simulated timeline: a slice starts
            // when the device frees up, not when this thread woke up.
            let start = ready.max(busy_until);
            if dev
                .slice
                .compare_exchange(word, pack(me, start), AcqRel, Acquire)
                .is_ok()
            {
                return;
            }
            continue;
        }
        sleep_until(slice_end.min(busy_until + HOLDER_GRACE_NS));
    }
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
