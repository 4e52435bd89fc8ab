//! Sleeping to an absolute deadline with the thread's timer slack lowered:
//! every wait of SM-time control (a throttled launch, a filler's gap, a
//! turn, a held sample) ends when it should, not up to 50 µs later.

thread_local! {
    /// Whether this thread's timer slack was lowered (once, at its first
    /// wait: never on the within-budget path).
    static PRECISE_SLEEP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Sleeps until `deadline_ns` on the monotonic clock (absolute, so a
/// signal or a late wake-up never lengthens the wait).
pub(crate) fn sleep_until(deadline_ns: u64) {
    // Linux wakes a sleeping thread up to its timer slack (50 µs by
    // default) late. A throttled launch waits for tokens worth tens of µs,
    // so that lateness would be a large part of each wait and, on a tenant
    // near its share, GPU time it never gets back.
    if !PRECISE_SLEEP.replace(true) {
        // SAFETY: PR_SET_TIMERSLACK takes one integer (ns) and changes only
        // the calling thread's slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    }
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec; with TIMER_ABSTIME the remainder pointer may
    // be null. EINTR is retried with the same absolute deadline.
    while unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    } == libc::EINTR
    {}
}
