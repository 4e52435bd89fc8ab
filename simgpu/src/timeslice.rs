//! Who holds the device: time slices between processes, like a GPU without
//! MPS. One word per device in shared memory says either "process P holds a
//! slice that started at S" or "free since S, last held by P"; every change
//! is a CAS on it, followed by a futex wake of the waiters.
//!
//! The holder's engine (`engine.rs`) decides at the end of its slice: when
//! another process has kernels waiting it releases the device (preempting
//! its own running kernels), otherwise it starts another slice. It also
//! frees the device as soon as it has no kernel left (no idle grace: the
//! hardware switches at once when a context runs out of work). A waiter
//! takes a free device and starts `SIMGPU_SWITCH_COST` after it was freed
//! when the previous holder was another process.

use crate::now_ns;
use crate::shm::Shm;
use std::sync::atomic::Ordering::*;

const BUSY_BIT: u64 = 1 << 63;
const OWNER_SHIFT: u32 = 53;
const OWNER_MASK: u64 = (1 << 10) - 1;
/// Times are stored in units of 100 ns (53 bits: 28 years of uptime).
const TIME_UNIT_NS: u64 = 100;
const TIME_MASK: u64 = (1 << OWNER_SHIFT) - 1;
/// A process that stays the last holder of a free device while another has
/// work gives way to it; after this long it takes the device anyway (the
/// other may have died with kernels counted as queued).
const GIVE_WAY_NS: u64 = 5_000_000;
/// How long after a slice's end a waiter checks whether its holder died.
const DEAD_HOLDER_CHECK_NS: u64 = 100_000_000;

/// The device-holder word, decoded. Owners are process slot + 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    Busy { owner: u64, start_ns: u64 },
    Free { last: u64, since_ns: u64 },
}

impl Holder {
    fn encode(self) -> u64 {
        let (busy, owner, t) = match self {
            Holder::Busy { owner, start_ns } => (BUSY_BIT, owner, start_ns),
            Holder::Free { last, since_ns } => (0, last, since_ns),
        };
        busy | (owner & OWNER_MASK) << OWNER_SHIFT | (t.div_ceil(TIME_UNIT_NS) & TIME_MASK)
    }

    fn decode(word: u64) -> Holder {
        let owner = (word >> OWNER_SHIFT) & OWNER_MASK;
        let t = (word & TIME_MASK) * TIME_UNIT_NS;
        if word & BUSY_BIT != 0 {
            Holder::Busy { owner, start_ns: t }
        } else {
            Holder::Free {
                last: owner,
                since_ns: t,
            }
        }
    }
}

/// This process's owner id on the device word.
pub(crate) fn me(shm: &Shm) -> u64 {
    shm.slot as u64 + 1
}

pub(crate) fn holder(shm: &Shm, phys: usize) -> Holder {
    Holder::decode(shm.dev(phys).slice.load(Acquire))
}

/// Whether any process but this one has kernels queued or running on the
/// device.
pub(crate) fn others_have_work(shm: &Shm, phys: usize) -> bool {
    shm.slots_with_work(phys).any(|slot| slot != shm.slot)
}

fn changed(shm: &Shm, phys: usize) {
    let seq = &shm.dev(phys).slice_changes;
    seq.fetch_add(1, Release);
    futex_wake(seq);
}

/// Takes the device for this process; blocks while another holds it.
/// Returns the start of the slice on the device timeline: no earlier than
/// `ready`, and `switch_ns` after the device was freed by another process.
pub(crate) fn acquire(
    shm: &Shm,
    phys: usize,
    ready: u64,
    timeslice_ns: u64,
    switch_ns: u64,
) -> u64 {
    let dev = shm.dev(phys);
    let me = me(shm);
    let mut giving_way_since = None;
    loop {
        let seq = dev.slice_changes.load(Acquire);
        let word = dev.slice.load(Acquire);
        let now = now_ns();
        let wait_until = match Holder::decode(word) {
            // The caller holds no slice, so the word is a dead process's
            // that had this slot: take it over with a start of our own, or
            // the caller's renewals (a CAS on the start) would never match.
            Holder::Busy { owner, start_ns } if owner == me => {
                match take(shm, phys, word, ready.max(start_ns)) {
                    Some(start) => return start,
                    None => continue,
                }
            }
            Holder::Free { last, since_ns } => {
                let wait = if last == me && others_have_work(shm, phys) {
                    let since = *giving_way_since.get_or_insert(now);
                    (now < since + GIVE_WAY_NS).then_some(now + 1_000_000)
                } else {
                    None
                };
                match wait {
                    Some(t) => t,
                    None => {
                        let switch = if last != me && last != 0 {
                            switch_ns
                        } else {
                            0
                        };
                        match take(shm, phys, word, ready.max(since_ns + switch)) {
                            Some(start) => return start,
                            None => continue,
                        }
                    }
                }
            }
            Holder::Busy { owner, start_ns } => {
                let end = start_ns + timeslice_ns;
                if now > end + DEAD_HOLDER_CHECK_NS && !shm.slot_alive(owner as usize - 1) {
                    let freed = Holder::Free {
                        last: owner,
                        since_ns: end,
                    };
                    if dev
                        .slice
                        .compare_exchange(word, freed.encode(), AcqRel, Acquire)
                        .is_ok()
                    {
                        changed(shm, phys);
                    }
                    continue;
                }
                // The holder decides at its slice end; wake a little after
                // it at the latest, or when the word changes.
                if now < end {
                    end + 200_000
                } else {
                    now + 1_000_000
                }
            }
        };
        futex_wait(
            &dev.slice_changes,
            seq,
            wait_until.saturating_sub(now_ns()).max(1_000),
        );
    }
}

/// Replaces the device word `word` with a slice of this process starting
/// at `start`; returns the start as the word keeps it (100 ns units), or
/// None when the word changed meanwhile.
fn take(shm: &Shm, phys: usize, word: u64, start: u64) -> Option<u64> {
    let next = Holder::Busy {
        owner: me(shm),
        start_ns: start,
    }
    .encode();
    shm.dev(phys)
        .slice
        .compare_exchange(word, next, AcqRel, Acquire)
        .ok()?;
    changed(shm, phys);
    match Holder::decode(next) {
        Holder::Busy { start_ns, .. } => Some(start_ns),
        Holder::Free { .. } => Some(start),
    }
}

/// The holder starts another slice at `next_start` (nobody else waited).
/// False when the device is no longer this process's.
pub(crate) fn renew(shm: &Shm, phys: usize, start_ns: u64, next_start: u64) -> bool {
    let me = me(shm);
    let cur = Holder::Busy {
        owner: me,
        start_ns,
    };
    let next = Holder::Busy {
        owner: me,
        start_ns: next_start,
    };
    shm.dev(phys)
        .slice
        .compare_exchange(cur.encode(), next.encode(), AcqRel, Acquire)
        .is_ok()
}

/// The holder frees the device at `at` (its slice ended with others
/// waiting, or it ran out of work).
pub(crate) fn release(shm: &Shm, phys: usize, start_ns: u64, at: u64) {
    let me = me(shm);
    let cur = Holder::Busy {
        owner: me,
        start_ns,
    };
    let next = Holder::Free {
        last: me,
        since_ns: at,
    };
    if shm
        .dev(phys)
        .slice
        .compare_exchange(cur.encode(), next.encode(), AcqRel, Acquire)
        .is_ok()
    {
        changed(shm, phys);
    }
}

fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `word` is a live u32 in a MAP_SHARED mapping (a shared futex,
    // so no FUTEX_PRIVATE_FLAG); `ts` is a valid relative timeout. The call
    // returns at once if the value already differs from `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a live u32 in shared memory; waking has no other
    // preconditions.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_word_round_trips_owner_and_time() {
        let busy = Holder::Busy {
            owner: 257,
            start_ns: 123_456_789_000,
        };
        assert_eq!(Holder::decode(busy.encode()), busy);
        let free = Holder::Free {
            last: 3,
            since_ns: 987_654_321_100,
        };
        assert_eq!(Holder::decode(free.encode()), free);
        assert_eq!(
            Holder::decode(0),
            Holder::Free {
                last: 0,
                since_ns: 0
            }
        );
    }

    #[test]
    fn times_round_up_to_the_unit() {
        let busy = Holder::Busy {
            owner: 1,
            start_ns: 1_001,
        };
        assert_eq!(
            Holder::decode(busy.encode()),
            Holder::Busy {
                owner: 1,
                start_ns: 1_100
            }
        );
    }
}
