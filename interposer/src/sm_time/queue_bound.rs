//! The queue bound: a batch tenant sharing its GPU with a latency tenant
//! keeps at most the bound the node manager wrote in its budget
//! ([`dilu_layout::budget::TenantBudget::queue_bound_ns`]) of device time
//! queued ahead of each launch, by its launches' estimates.
//!
//! Why: the device time-slices between processes, so a latency tenant that
//! launches while a batch tenant has work queued waits for that work slice
//! by slice, kernel after kernel of its request. Its share cannot help:
//! the node manager cuts the batch tenant's share within a period of the
//! latency tenant waking, but what was queued before is on the device. In
//! `dilu demo` a training step queues 8 ms of kernels at once, and the
//! first request of each burst of an inference tenant ran 5-8 ms of them
//! inside its 4.4 ms of work (11-13 ms against an SLO of 15 ms).
//!
//! A launch that finds more than the bound queued waits until only the
//! bound is left (a launch of a kind not measured yet counts as a time
//! slice): the device never runs dry of the batch tenant's work
//! while the host reacts within the bound, so a batch tenant alone loses
//! nothing but a few µs per launch.

use crate::sm_time::precise_sleep::sleep_until;
use crate::sm_time::tenant_sm::TenantSm;
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::monotonic_ns;
use std::sync::atomic::{AtomicU64, Ordering};

/// Longest wait of one launch for the queue: the estimates behind the
/// queue are the tenant's own, and a garbled or stale one must not stall
/// it for long.
pub const MAX_WAIT_NS: u64 = 20_000_000;

/// How long a launch of a kind not measured yet is taken to keep the
/// device busy: a time slice (about 2 ms on an H100), the most a latency
/// tenant waits for it. Charged its first guess (100 us) instead, a
/// training step's first kernels of 1 ms went eight at a time, and the
/// first request beside them waited 5-8 ms.
pub const UNMEASURED_NS: u64 = 2_000_000;

/// Per device: until when this process's last launch of an unmeasured kind
/// may keep the device busy.
static UNMEASURED_UNTIL: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// Waits, before a launch at `now` on `device`, while the tenant has more
/// than its bound queued; returns how long it waited (ns). `measured`:
/// whether the launch's kind has an estimate.
#[inline]
pub fn before_launch(sm: &TenantSm, device: usize, now: u64, measured: bool) -> u64 {
    let bound = sm.budget().queue_bound_ns(device);
    if bound == 0 {
        return 0;
    }
    let Some(unmeasured_until) = UNMEASURED_UNTIL.get(device) else {
        return 0;
    };
    let queued = sm
        .device(device)
        .queued_ns(now)
        .max(unmeasured_until.load(Ordering::Relaxed).saturating_sub(now));
    let excess = queued.saturating_sub(bound);
    let waited = if excess == 0 { 0 } else { wait(now, excess) };
    if !measured {
        unmeasured_until.fetch_max(now + waited + UNMEASURED_NS, Ordering::Relaxed);
    }
    waited
}

#[cold]
fn wait(now: u64, excess: u64) -> u64 {
    sleep_until(now + excess.min(MAX_WAIT_NS));
    monotonic_ns().saturating_sub(now)
}
