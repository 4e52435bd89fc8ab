//! Telemetry that needs no measurement: the intervals between a thread's
//! successive synchronisations (for a program that reports nothing, the
//! time from one `synchronize` to the next is the best proxy for a request
//! or an iteration), and the latencies a program reports itself through
//! [`dilu_report_latency`].

use crate::sm_time::tenant_sm;
use dilu_layout::monotonic_ns;
use std::cell::Cell;

thread_local! {
    static LAST_SYNC_NS: Cell<u64> = const { Cell::new(0) };
}

/// A thread inside a synchronising call, counted in the tenant's activity
/// region while it waits (the node manager counts a tenant waiting on its
/// own queued work as wanting the device, however long since it launched).
/// Sync entry and exit only: nothing here is on the launch path.
pub struct InSync(Option<&'static tenant_sm::TenantSm>);

/// Called as a synchronisation call begins; the count drops when the guard
/// does (also if the call unwinds).
#[inline]
pub fn in_sync() -> InSync {
    let sm = tenant_sm::get();
    if let Some(sm) = sm {
        sm.activity().sync_began();
    }
    InSync(sm)
}

impl Drop for InSync {
    fn drop(&mut self) {
        if let Some(sm) = self.0 {
            sm.activity().sync_ended();
        }
    }
}

/// Called after every synchronisation call returns.
#[inline]
pub fn synchronised() {
    let Some(sm) = tenant_sm::get() else { return };
    let now = monotonic_ns();
    let previous = LAST_SYNC_NS.with(|last| last.replace(now));
    if previous != 0 {
        sm.activity().sync_intervals.record(now - previous);
    }
}

/// Reports the latency of one request, in nanoseconds, to the node manager
/// (servers that know their request latency call this; from Python, see
/// `interposer/python/dilu_latency.py`). A no-op when the process has no
/// tenant and no SM limit.
#[unsafe(no_mangle)]
pub extern "C" fn dilu_report_latency(latency_ns: u64) {
    let _ = std::panic::catch_unwind(|| {
        if let Some(sm) = tenant_sm::get() {
            sm.activity().report_latency(latency_ns);
        }
        crate::sm_time::colocation::latency_reported(latency_ns);
    });
}
