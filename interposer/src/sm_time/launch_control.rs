//! The launch path of SM-time control: charge the launch to the tenant's
//! token bucket, wait if the bucket is in debt, count it, and time a sample.
//!
//! Within budget a launch costs an estimate look-up, one add on its kind's
//! count and either a subtraction from its process's lease (a short launch
//! already paid for, see [`crate::sm_time::launch_lease`]) or one `clock_gettime`, one
//! CAS on the bucket and a few counter adds: no lock, no system call, no
//! allocation. A sampled
//! launch (the first of a kind, then one in
//! [`sampling_period`](crate::sm_time::kernel_estimates::sampling_period)) additionally
//! records events (see [`sampler`]); a throttled one sleeps until its tokens exist
//! (`clock_nanosleep` to an absolute deadline, not a polling tick).

use crate::driver;
use crate::sm_time::kernel_estimates::{EstimateTable, FIRST_GUESS_NS, LaunchKey};
use crate::sm_time::launch_lease;
use crate::sm_time::precise_sleep::sleep_until;
use crate::sm_time::quiet_samples;
use crate::sm_time::recent_streams::{self, StreamRef};
use crate::sm_time::sampler;
use crate::sm_time::stream_capture::{captured, capturing_anywhere};
use crate::sm_time::tenant_sm::{self, TenantSm};
use crate::table::REAL;
use dilu_abi::cuda::{CUDA_SUCCESS, CUresult, sys};
use dilu_layout::bucket::Admission;
use dilu_layout::budget::is_limited;
use dilu_layout::monotonic_ns;

/// Launches of a kind never measured that may be in flight before its first
/// measurement arrives: each is charged only a guess, so without this bound
/// a program could queue seconds of unaccounted work (the charge-back
/// would come too late to keep the share in any short window). A first
/// estimate rests on two samples ([`FIRST_ESTIMATE_SAMPLES`]), so a new kind
/// may run about twice this many launches before it has one.
///
/// [`FIRST_ESTIMATE_SAMPLES`]: crate::sm_time::sampler::FIRST_ESTIMATE_SAMPLES
pub const MAX_UNMEASURED_LAUNCHES: u64 = 4;
/// Longest wait for a first measurement (a lost sample must not stall).
const FIRST_MEASUREMENT_WAIT_NS: u64 = 50_000_000;

static ESTIMATES: EstimateTable = EstimateTable::new();

/// Charges one launch of `key` on `device`, waiting while the tenant's
/// bucket is in debt. Returns the kind's entry and whether to time it.
///
/// The common case of a short launch, a measured kind already paid for by
/// the process's lease, is the only one inlined: after a real driver call
/// every cache line of code or data the launch path touches is likely cold,
/// so it touches few (the estimate entry and the lease). Whether a lease
/// may exist at all (a limited share, no co-location gate) is decided where
/// it is renewed, in [`admit_through_bucket`], not again at each spend.
#[inline(always)]
fn admit(
    sm: &TenantSm,
    key: LaunchKey,
    device: usize,
    stream: Option<StreamRef>,
) -> (&'static crate::sm_time::kernel_estimates::Entry, bool) {
    if let Some(entry) = ESTIMATES.found_at_start(key)
        && let Some(admitted) = admit_from_lease(entry, device)
    {
        return admitted;
    }
    admit_through_bucket(sm, key, device, stream)
}

/// Admits a launch of a measured kind, `entry`, that the process's lease
/// on `device` covers; `None` when it must go to the bucket.
#[inline(always)]
fn admit_from_lease(
    entry: &'static crate::sm_time::kernel_estimates::Entry,
    device: usize,
) -> Option<(&'static crate::sm_time::kernel_estimates::Entry, bool)> {
    let cost = entry.estimate_ns()?;
    if launch_lease::spend(device, cost) {
        let launches_before = entry.charge();
        let sample = entry.due_for_sample(launches_before) && entry.start_sampling();
        return Some((entry, sample));
    }
    None
}

/// [`admit`] for every launch its lease does not already cover.
#[inline(never)]
fn admit_through_bucket(
    sm: &TenantSm,
    key: LaunchKey,
    device: usize,
    stream: Option<StreamRef>,
) -> (&'static crate::sm_time::kernel_estimates::Entry, bool) {
    let (entry, placed) = ESTIMATES.entry(key);
    // A kind placed past the slot its probe starts at (a collision) is
    // found only here: its lease as in `admit`.
    if placed && let Some(admitted) = admit_from_lease(entry, device) {
        return admitted;
    }
    let mut estimate = entry.estimate_ns();
    let share = sm.budget().share_ppm(device);
    // Only wait when a measurement is actually on its way, and only where
    // it bounds something: a limited share's charges, or a filler's
    // admission by its estimates. An unlimited process (a co-location
    // primary) that waited here stalled its own pipeline behind the
    // device: vLLM's engine, at each new kernel shape of a prefill, waited
    // up to 20 ms for the kernel to run.
    if estimate.is_none()
        && placed
        && entry.sampling()
        && entry.unmeasured_launches() >= MAX_UNMEASURED_LAUNCHES
        && (is_limited(share) || crate::sm_time::colocation::is_filler())
    {
        estimate = wait_for_first_measurement(entry);
    }
    let cost = estimate.unwrap_or(FIRST_GUESS_NS);
    let launches_before = entry.charge();
    let telemetry = sm.device(device);
    if launches_before == 0 {
        crate::sm_time::usage_feedback::first_launch(device, is_limited(share));
    }
    // When, GPU time charged and launches counted, for telemetry: a
    // lease's launches count with the one that renews it. The lease is not
    // spent from first: [`admit`] tried that where the kind had an
    // estimate, and a renewal keeps what is left of it anyway. Only a
    // limited share outside co-location takes a lease (a co-location
    // process's launches each pass its gate); a share raised to unlimited
    // ends the lease, its launches counted.
    let (now, charged_ns, launches) = if is_limited(share) {
        let (charge, uncounted) = if crate::sm_time::colocation::active() {
            (cost, 0)
        } else {
            launch_lease::renew(device, cost)
        };
        let now = charge_bucket(sm, device, stream, charge, share);
        (now, charge, 1 + uncounted)
    } else {
        (monotonic_ns(), cost, 1 + launch_lease::end(device))
    };
    let mut held = crate::sm_time::colocation::before_launch(device, cost, estimate.is_some());
    held += crate::sm_time::queue_bound::before_launch(sm, device, now + held, estimate.is_some());
    if is_limited(share) {
        held += crate::sm_time::fair_turns::before_launch(device, now, charged_ns, cost, share);
    }
    if held > 0 {
        telemetry.record_throttle(held);
    }
    telemetry.record_launches(now + held, charged_ns, launches);
    crate::sm_time::quiet_samples::launched(device, now);
    let sample = placed
        && (estimate.is_none() || entry.due_for_sample(launches_before))
        && entry.start_sampling();
    (entry, sample)
}

/// Charges `gpu_ns` to `device`'s bucket at `share` (limited), waiting while
/// the bucket is in debt or the share is 0; returns when the launch may go
/// (on `stream`, where there is one).
#[inline]
fn charge_bucket(
    sm: &TenantSm,
    device: usize,
    stream: Option<StreamRef>,
    gpu_ns: u64,
    mut share: u32,
) -> u64 {
    let telemetry = sm.device(device);
    let bucket = sm.bucket(device);
    let mut now = monotonic_ns();
    crate::sm_time::usage_feedback::charged(device, gpu_ns as i64);
    loop {
        match bucket.admit(now, gpu_ns, share, sm.budget().depth_ns()) {
            Admission::Now => break,
            Admission::At(deadline) => {
                crate::sm_time::colocation::before_token_wait(device);
                let burst_ns = if releases_in_runs(sm, device) {
                    crate::config::sm::DEFAULT_BURST_NS
                } else {
                    0
                };
                let wake_at = deadline + burst_wait_ns(burst_ns, share, sm.budget().depth_ns());
                crate::sm_time::fair_turns::bucket_wait(device, bucket, stream, wake_at, now);
                let woke = monotonic_ns();
                telemetry.record_throttle(woke - now);
                now = woke;
                break;
            }
            Admission::Paused => {
                share = wait_for_share(sm, device);
                let woke = monotonic_ns();
                telemetry.record_throttle(0); // its time was recorded as it waited
                now = woke;
                if !is_limited(share) {
                    break;
                }
            }
        }
    }
    now
}

/// Whether a throttled launch waits for a run's worth of tokens: only where
/// another process may share the device (alone there are no switches to
/// save). On several streams too, now that their samples are taken apart
/// from the process's other streams: while they were taken among them,
/// runs of overlapping work made the samples wrong both ways (a tenant
/// alone on 3 streams of 1 ms kernels took 47.8% at a cap of 30%), and
/// 3-stream tenants paced launch by launch instead; now a 3-stream 30/70
/// pair keeps 2 to 16 points more of the device busy with runs than
/// without.
/// `DILU_SM_ABLATE=runs` turns runs off (launch by launch everywhere).
fn releases_in_runs(sm: &TenantSm, device: usize) -> bool {
    !crate::config::get().ablate.runs
        && crate::sm_time::usage_feedback::may_be_shared(device)
        && sm.budget().queue_bound_ns(device) == 0
}

/// How much longer than its own tokens a throttled launch waits: until
/// the bucket also holds `burst_ns` of GPU time (wall time at the
/// share; at most the depth, which is all a bucket can hold), so the launches
/// after it go at once, as one run on the GPU (see [`crate::config::sm`]).
fn burst_wait_ns(burst_ns: u64, share_ppm: u32, depth_ns: u64) -> u64 {
    (burst_ns.saturating_mul(1_000_000) / u64::from(share_ppm.max(1))).min(depth_ns)
}

/// How often a launch held at share 0 looks at its share again.
const ZERO_SHARE_POLL_NS: u64 = 1_000_000;
/// How long a launch waits at share 0 before the process says why, once.
const ZERO_SHARE_NOTICE_NS: u64 = 2_000_000_000;

/// Waits while `device`'s share is 0 (a valid state: the node manager gives
/// a tenant without a request nothing while it shows no demand, and an
/// operator may set a limit of 0), re-reading it; returns the first
/// non-zero share seen. The wait is recorded as it goes, so the node
/// manager sees the demand of a tenant that launches nothing; a long one is
/// explained once on stderr.
#[cold]
fn wait_for_share(sm: &TenantSm, device: usize) -> u32 {
    let telemetry = sm.device(device);
    let since = monotonic_ns();
    let mut last = since;
    loop {
        let share = sm.budget().share_ppm(device);
        if share != 0 {
            return share;
        }
        sleep_until(last + ZERO_SHARE_POLL_NS);
        let now = monotonic_ns();
        telemetry.record_waiting(now - last);
        last = now;
        if now - since >= ZERO_SHARE_NOTICE_NS {
            zero_share_notice(device);
        }
    }
}

/// Says once per process why its launches wait at share 0, and how to
/// release them.
#[cold]
fn zero_share_notice(device: usize) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let tenant = crate::config::get()
            .tenant
            .as_deref()
            .unwrap_or("(this process)");
        eprintln!(
            "dilu-interposer: tenant {tenant} has an SM-time share of 0 on device {device}, \
             so its kernel launches wait until it is raised: `dilu status` says why (a limit \
             of 0: `dilu set {tenant} --sm-limit PCT`; other tenants' requests reserving the \
             whole device: lower them with `dilu set NAME --sm-request PCT`)"
        );
    });
}

#[cold]
fn wait_for_first_measurement(entry: &crate::sm_time::kernel_estimates::Entry) -> Option<u64> {
    let deadline = monotonic_ns() + FIRST_MEASUREMENT_WAIT_NS;
    loop {
        if let Some(estimate) = entry.estimate_ns() {
            return Some(estimate);
        }
        if !entry.sampling() {
            return None;
        }
        let now = monotonic_ns();
        if now >= deadline {
            return None;
        }
        sleep_until(now + 100_000);
    }
}

/// What a launch admitted by [`admit_launch`] does next.
pub enum Admitted {
    /// Launch now, untimed (the common case).
    Now,
    /// Launch now between the sampler's events.
    Timed(TimedLaunch),
}

/// A launch chosen for timing: where it runs, and its kind's estimate.
pub struct TimedLaunch {
    entry: &'static crate::sm_time::kernel_estimates::Entry,
    device: usize,
    stream: sys::CUstream,
    per_thread: bool,
}

impl crate::table::Around for TimedLaunch {
    /// Runs the launch between the sampler's events.
    #[inline]
    fn run(self, launch: impl FnOnce() -> CUresult) -> CUresult {
        timed(
            self.entry,
            self.device,
            self.stream,
            self.per_thread,
            launch,
        )
    }
}

/// Admits a launch on `stream` (of the kind `key` names): charged, possibly
/// delayed, possibly chosen for timing. Launches being captured into a
/// graph and processes without SM state are admitted at once (without even
/// working out the launch's `key`). The launch itself is the caller's: a
/// launch admitted [`Admitted::Now`] is made by the exported wrapper with
/// the C caller's arguments, not through a closure holding them all.
#[inline]
pub fn admit_launch(
    key: impl FnOnce() -> LaunchKey,
    stream: sys::CUstream,
    per_thread: bool,
) -> Admitted {
    let Some(sm) = tenant_sm::get() else {
        return Admitted::Now;
    };
    if captured(stream, per_thread) {
        return Admitted::Now;
    }
    let device = sm.current_device();
    let (entry, sample) = admit(sm, key(), device, Some(StreamRef { stream, per_thread }));
    let held = quiet_samples::before_launch(device, stream, per_thread);
    if held > 0 {
        sm.device(device).record_throttle(held);
    }
    recent_streams::launching_on(device, stream, per_thread);
    if !sample {
        return Admitted::Now;
    }
    Admitted::Timed(TimedLaunch {
        entry,
        device,
        stream,
        per_thread,
    })
}

/// Runs a launch chosen for timing between the sampler's events (out of
/// line: one launch in hundreds or thousands).
#[inline(never)]
fn timed(
    entry: &'static crate::sm_time::kernel_estimates::Entry,
    device: usize,
    stream: sys::CUstream,
    per_thread: bool,
    launch: impl FnOnce() -> CUresult,
) -> CUresult {
    let quiet =
        match quiet_samples::clear_the_device(device, entry.estimate_ns(), stream, per_thread) {
            quiet_samples::Clearing::NotNeeded => None,
            quiet_samples::Clearing::Held(hold) => Some(hold),
            // Timed now, it would hold another process's slice: left untimed.
            quiet_samples::Clearing::Busy => {
                entry.stop_sampling();
                return launch();
            }
        };
    let pin = recent_streams::Pin::new();
    let others = other_streams(&pin, device, stream, per_thread);
    let timing = sampler::begin(stream, per_thread, &others);
    drop(pin);
    let result = launch();
    // Read again: a stream may have been destroyed during the launch.
    let pin = recent_streams::Pin::new();
    let others = other_streams(&pin, device, stream, per_thread);
    sampler::finish(
        timing,
        result == CUDA_SUCCESS,
        stream,
        per_thread,
        &others,
        entry,
        device,
        quiet,
    );
    drop(pin);
    result
}

/// The other streams a timed launch on `stream` records on and orders
/// against: none while any stream captures, where recording on another
/// stream could end up in the captured graph or (on the legacy stream)
/// invalidate it.
fn other_streams(
    pin: &recent_streams::Pin,
    device: usize,
    stream: sys::CUstream,
    per_thread: bool,
) -> recent_streams::Previous {
    if capturing_anywhere() {
        recent_streams::Previous::default()
    } else {
        recent_streams::others(pin, device, stream, per_thread)
    }
}

/// Charges a launch without timing it (launch paths with no single stream
/// to record events on: multi-device cooperative launches).
pub fn charge_untimed(key: LaunchKey, device: usize) {
    if let Some(sm) = tenant_sm::get() {
        let (entry, sample) = admit(sm, key, device, None);
        if sample {
            entry.stop_sampling();
        }
    }
}

/// The device a stream belongs to (slow: for the rare multi-device launch
/// path only). Falls back to the current context's device.
pub fn device_of_stream(stream: sys::CUstream) -> usize {
    let Some(sm) = tenant_sm::get() else { return 0 };
    let (Some(get_ctx), Some(push), Some(pop)) = (
        driver::resolved(&REAL.cuStreamGetCtx),
        driver::resolved(&REAL.cuCtxPushCurrent_v2),
        driver::resolved(&REAL.cuCtxPopCurrent_v2),
    ) else {
        return sm.current_device();
    };
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: real driver functions with their cuda.h signatures; the
    // context pushed is popped again before returning.
    unsafe {
        if get_ctx(stream, &mut ctx) != CUDA_SUCCESS || push(ctx) != CUDA_SUCCESS {
            return sm.current_device();
        }
        let device = sm.current_device();
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        pop(&mut popped);
        device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_launch_waits_for_a_burst_of_gpu_time_at_most_a_depth() {
        // 2 ms of GPU time at 70% accrue in 2.857 ms of wall time.
        assert_eq!(burst_wait_ns(2_000_000, 700_000, 5_000_000), 2_857_142);
        // At 30% that would be 6.7 ms; a 5 ms bucket holds no more.
        assert_eq!(burst_wait_ns(2_000_000, 300_000, 5_000_000), 5_000_000);
        assert_eq!(burst_wait_ns(0, 300_000, 5_000_000), 0, "0 paces launches");
    }
}
