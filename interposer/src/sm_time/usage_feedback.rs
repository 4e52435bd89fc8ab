//! Charges this process for the device time the driver says it used.
//!
//! Launches are charged per-kind estimates (see [`sampler`](crate::sm_time::sampler)):
//! fast, and exact for a process whose kernels run one at a time. Two things
//! a per-kernel sample cannot see make them wrong by a factor, not a few
//! percent:
//! - kernels of several streams of one process run at the same time (SMs
//!   shared by blocks), so a kernel's events span time its siblings also
//!   used (timed launches run apart from the process's other streams, but
//!   only from the few it used last, and only where the driver has
//!   `cuStreamWaitEvent`);
//! - a kernel preempted at the end of a time slice has events spanning the
//!   other process's slice (a 30% tenant with kernels longer than a slice
//!   got 19%; such kernels are now timed under quiet holds, see
//!   [`quiet_samples`](crate::sm_time::quiet_samples), where the other
//!   process is under dilu too).
//!
//! The driver itself counts how long each process had kernels executing:
//! NVML's `nvmlDeviceGetProcessUtilization` reports, per sample period
//! (about 200 ms on NVIDIA's driver), the percentage of time a kernel of the
//! process ran (the union over its streams). Every [`PERIOD`] this thread
//! asks for new samples; when one of this process has come, it compares the
//! device time NVML counted with what the process was charged in that
//! sample's period (launch estimates plus the sampler's corrections; the
//! charged total is kept at every look, by wall-clock time) and
//! charges the difference to the tenant's bucket (a debt in
//! [`INSTALLMENTS`] over the following looks, a refund at once). A look with
//! no new sample settles nothing: the charges wait for the next sample. The
//! estimates still pace launches between samples; this makes their sum
//! right.
//!
//! Work charged at launch runs later, so at any moment the two totals
//! differ by the work in flight; the correction settles it once it ran, and
//! the error never accumulates. NVML reports whole percent: each sample may
//! be off by half a percent of its period.
//!
//! Settling after the fact lets a process whose estimates are a factor too
//! low (several streams) queue that factor more work than its share before
//! the bill arrives, and then sit in debt while its queue drains. Scaling
//! every launch's charge by the measured ratio was tried and made it worse:
//! while a queue drains the ratio of the two counts rises, the scale with
//! it, and the process throttles itself further (a 70% tenant on 3 streams
//! learned a scale of 17.8 and used 59.5%).
//!
//! NVML's per-process number only means device time while the process is
//! alone on the device. Under time slicing the driver reports about 99% for
//! every process that has work queued, whether or not its context holds the
//! device (measured on an H100: two processes running the same request
//! loop each listed at 99% while each did 38% of its rate alone;
//! `bench/results/gpu-nvml.md`). So a look settles only when no
//! other process was listed with any use in the last [`CONTENDED_FOR_US`](crate::sm_time::nvml_sample_clock::CONTENDED_FOR_US) of
//! samples; while others were, the estimates alone decide (their charges
//! are taken as they are, not carried to a later settlement).
//!
//! Nor does NVML say how busy a shared device is: the device's own rate
//! (`nvmlDeviceGetUtilizationRates`) read 100% while two request loops
//! shared an H100 that ran kernels about 74% of the time (2026-11-23, ad
//! hoc). So nothing here may depend on how full a shared device is: a
//! switch charge on "full" devices, which helped on simgpu (whose samples
//! are exact), applied to every shared device on an H100 and cost a 70%
//! tenant up to 7 points of its rate there without moving the split.
//!
//! The same looks say whether another process used the device lately
//! ([`may_be_shared`]): a throttled launch releases its tenant's work in
//! runs only then (see [`crate::config::sm`]); alone on the device, pacing
//! launch by launch costs no switches and keeps the cap closer.
//!
//! `DILU_SM_ABLATE=feedback` turns this off (estimates alone decide).
//! Where NVML is missing, or never lists this process (a container whose
//! pid namespace hides the host pid NVML uses), nothing is corrected and
//! the estimates alone decide, as before.

use crate::driver::nvml::{
    self, NvmlDevice, NvmlReturn, PFN_nvmlDeviceGetProcessUtilization, ProcessUtilizationSample,
};
use crate::sm_time::nvml_sample_clock::{Look, SampleClock};
use crate::sm_time::tenant_sm;
use dilu_layout::budget::is_limited;
use dilu_layout::ledger::MAX_DEVICES;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

/// How often the driver's count is compared with the charges.
pub const PERIOD: Duration = Duration::from_millis(50);
/// Answers with new samples (of any process) but none of this one, while
/// it had work charged, before the process is taken to be invisible to
/// NVML (then corrections stop for good): 2 s of the driver's 200 ms
/// samples.
const UNSEEN_ANSWERS_BEFORE_GIVING_UP: u32 = 10;

/// GPU time this process was charged on each device while its share was
/// limited: launch estimates and the sampler's corrections.
#[repr(C, align(64))]
struct Charged([AtomicU64; MAX_DEVICES]);

static CHARGED: Charged = Charged([const { AtomicU64::new(0) }; MAX_DEVICES]);
/// This process's first launch on each device: when (CLOCK_REALTIME µs,
/// shifted left by one) and whether its share was limited then (the low
/// bit); 0 until then. No kernel of it ran there before, so where it was
/// limited from then on, NVML's samples are all its own to settle, the
/// first one included.
static FIRST_LAUNCH: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static RUNNING: AtomicBool = AtomicBool::new(false);

/// What the last look at each device's samples said about other processes.
static SHARING: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(UNKNOWN) }; MAX_DEVICES];
const UNKNOWN: u8 = 0;
const ALONE: u8 = 1;
const SHARED: u8 = 2;

/// Whether another process may be running kernels on `device`: false only
/// once NVML's samples showed none lately (unknown counts as shared).
#[inline]
pub fn may_be_shared(device: usize) -> bool {
    SHARING
        .get(device)
        .is_none_or(|state| state.load(Ordering::Relaxed) != ALONE)
}

fn note_sharing(device: usize, state: u8) {
    SHARING[device].store(state, Ordering::Relaxed);
}

/// Counts GPU time charged to this process on `device` (signed: a
/// correction may refund).
#[inline]
pub fn charged(device: usize, gpu_ns: i64) {
    if let Some(counter) = CHARGED.0.get(device) {
        counter.fetch_add(gpu_ns as u64, Ordering::Relaxed);
    }
}

/// Notes a launch that may be this process's first on `device` (called for
/// the first launch of each kind; only the first call counts), and whether
/// its share was `limited` then.
#[cold]
pub fn first_launch(device: usize, limited: bool) {
    if let Some(first) = FIRST_LAUNCH.get(device) {
        let _ = first.compare_exchange(
            0,
            realtime_us() << 1 | u64::from(limited),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

/// When this process first launched on `device` (CLOCK_REALTIME µs) if its
/// share was limited then; `None` if it was not, or is not known.
fn first_limited_launch_us(device: usize) -> Option<u64> {
    let first = FIRST_LAUNCH[device].load(Ordering::Relaxed);
    (first & 1 == 1).then_some(first >> 1)
}

fn charged_total(device: usize) -> u64 {
    CHARGED.0[device].load(Ordering::Relaxed)
}

/// Starts the comparing thread once (called off the launch path, when the
/// first sample is handed over).
#[cold]
pub fn ensure_running() {
    if crate::config::get().ablate.feedback || RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("dilu-usage".into())
        .spawn(run);
    if spawned.is_err() {
        RUNNING.store(false, Ordering::Release);
    }
}

/// A forked child has no such thread (and a process of its own to count).
pub fn forget_parent_state_in_child() {
    RUNNING.store(false, Ordering::Relaxed);
    for counter in CHARGED.0.iter().chain(&FIRST_LAUNCH) {
        counter.store(0, Ordering::Relaxed);
    }
}

const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_NOT_FOUND`: no sample newer than the one asked from.
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const MAX_SAMPLES: usize = 256;

/// The driver's busy-time count of one process on one device.
struct DriverCount {
    device: NvmlDevice,
    query: PFN_nvmlDeviceGetProcessUtilization,
    pid: u32,
    samples: SampleClock,
}

impl DriverCount {
    /// The count of this process on `cuda_ordinal`, whose samples stamped
    /// after `count_from_us` are this module's to settle; earlier ones (all
    /// those of the first answer, where `None`) are the baseline.
    fn open(cuda_ordinal: usize, count_from_us: Option<u64>) -> Option<DriverCount> {
        let location = nvml::cuda_pci_location(cuda_ordinal as i32)?;
        let device = nvml::nvml_device_at(location)?;
        let query = nvml::real_nvml().nvmlDeviceGetProcessUtilization()?;
        Some(DriverCount {
            device,
            query,
            pid: std::process::id(),
            samples: SampleClock {
                count_from_us,
                ..SampleClock::default()
            },
        })
    }

    /// What NVML's samples since the previous call say (see [`Look`]);
    /// `None` if NVML failed.
    fn busy_since_last_look(&mut self) -> Option<Look> {
        let mut samples = [ProcessUtilizationSample::default(); MAX_SAMPLES];
        let mut count = MAX_SAMPLES as u32;
        // SAFETY: `samples` holds `count` writable entries of nvml.h's
        // layout; the handle came from the real NVML.
        let result = unsafe {
            (self.query)(
                self.device,
                samples.as_mut_ptr(),
                &mut count,
                self.samples.last_seen_us,
            )
        };
        match result {
            NVML_SUCCESS => {}
            NVML_ERROR_NOT_FOUND => return Some(self.samples.nothing_new()),
            _ => return None,
        }
        let answer: Vec<(u32, u64, u32)> = samples[..(count as usize).min(MAX_SAMPLES)]
            .iter()
            .map(|s| (s.pid, s.time_stamp_us, s.sm_util))
            .collect();
        tracing::trace!(?answer, pid = self.pid, "nvml answer");
        Some(self.samples.fold(self.pid, &answer))
    }
}

/// Looks whose charge totals are kept: 6.4 s of 50 ms looks, many of
/// NVML's 200 ms sample periods.
const LOOKS_KEPT: usize = 128;
/// Farther than this from the look's own clock, a sample's time stamp is
/// taken to be on another clock than CLOCK_REALTIME (NVIDIA documents it
/// only as a CPU time stamp in µs): the sample's period cannot be matched
/// with the charges, and the look-to-look charges stand in for it.
const STAMP_CLOCK_AGREES_US: u64 = 5_000_000;

/// [`CHARGED`] as it stood at each recent look, by wall-clock time, so that
/// a sample is compared with the charges made in its own period. (Comparing
/// it with those since the previous look was wrong by however far the two
/// periods were apart: a 70% tenant's first settlement compared a 200 ms
/// sample with the 100 ms of charges since NVML first listed it, found a
/// 66 ms debt that was not there, and used about half of the device for
/// the next 200 ms.)
#[derive(Default)]
struct ChargeHistory {
    /// (CLOCK_REALTIME µs, charged total), oldest first.
    looks: std::collections::VecDeque<(u64, u64)>,
}

impl ChargeHistory {
    /// A history that knows nothing was charged up to the process's first
    /// launch (`None`: unknown, then it starts at the first look), so that
    /// a sample whose period began after that launch but before the first
    /// look is settled too. (Every such period was left out: a short-kernel
    /// tenant's first 200-400 ms stayed over-charged for good, 61.9% used
    /// at a 70% cap in its first 250 ms, 70.1% after, on simgpu.)
    fn from_first_launch(first_launch_us: Option<u64>) -> ChargeHistory {
        let mut charges = ChargeHistory::default();
        if let Some(first) = first_launch_us {
            charges.record(0, 0);
            charges.record(first, 0);
        }
        charges
    }

    fn record(&mut self, now_us: u64, charged: u64) {
        if self.looks.len() == LOOKS_KEPT {
            self.looks.pop_front();
        }
        self.looks.push_back((now_us, charged));
    }

    /// The charged total at `at_us`, interpolated between the looks around
    /// it (charges are made between looks at a rate taken as even); `None`
    /// before the oldest look kept.
    fn charged_at(&self, at_us: u64) -> Option<u64> {
        let &(newest_us, newest) = self.looks.back()?;
        if at_us >= newest_us {
            return Some(newest);
        }
        let after = self.looks.iter().position(|&(t, _)| t > at_us)?;
        let (after_us, after_charged) = self.looks[after];
        let (before_us, before_charged) = *self.looks.get(after.checked_sub(1)?)?;
        let rise = after_charged.wrapping_sub(before_charged) as i64 as i128;
        let part = rise * i128::from(at_us - before_us) / i128::from(after_us - before_us);
        Some(before_charged.wrapping_add(part as i64 as u64))
    }

    /// GPU time charged (signed: corrections may refund) between two
    /// instants; `None` where the first precedes the looks kept.
    fn charged_between(&self, from_us: u64, to_us: u64) -> Option<i64> {
        Some(
            self.charged_at(to_us)?
                .wrapping_sub(self.charged_at(from_us)?) as i64,
        )
    }
}

fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// One device's comparison state.
struct Tracked {
    count: DriverCount,
    /// [`CHARGED`] at the previous look.
    charged_before: u64,
    charges: ChargeHistory,
    sighting: Sighting,
    /// Device time found owed and not yet charged to the bucket.
    owed: Installments,
    settling: Settling,
}

/// Since when (CLOCK_REALTIME µs) every look found the share limited (at
/// the earliest the process's first launch); `None` while it is not.
/// Launches are charged only while it is, so a sample period that began
/// before then holds work no charge stands for.
struct LimitedSince(Option<u64>);

impl LimitedSince {
    fn look(&mut self, limited: bool, now_us: u64) {
        self.0 = match self.0 {
            _ if !limited => None,
            None => Some(now_us),
            since => since,
        };
    }

    /// Whether the share was limited from `from_us` on, as far as the looks
    /// saw.
    fn throughout(&self, from_us: u64) -> bool {
        self.0.is_some_and(|since| from_us >= since)
    }
}

/// Which sample periods may be settled. The period in which the process
/// first launched (limited) may be, but only provisionally: its start had
/// no work in flight and its end a queue charged and not yet run, a
/// difference the next settled period gives back. Where the next look
/// finds another process listed, no period is settled any more, so the
/// refund of the first one is taken back. (Kept, it gave the 30% tenant
/// of a 3-stream 1 ms pair 16.5 ms in one ad hoc run, refunded for a queue
/// that ran once the other tenant had come: its split read 30.1–30.4 in
/// four runs against 30.0–30.1 before.)
struct Settling {
    limited: LimitedSince,
    first_launch_us: Option<u64>,
    settled_before: bool,
    /// The first period's refund while no later period was settled.
    provisional_ns: u64,
}

impl Settling {
    /// Settling of a process first launched at `first_limited_launch_us`
    /// with its share limited (`None`: not limited then, or unknown).
    fn new(first_limited_launch_us: Option<u64>) -> Settling {
        Settling {
            limited: LimitedSince(first_limited_launch_us),
            first_launch_us: first_limited_launch_us,
            settled_before: false,
            provisional_ns: 0,
        }
    }

    /// Whether a sample period from `from_us` may be settled:
    /// `Some(provisionally)`, or `None`.
    fn period(&self, from_us: u64) -> Option<bool> {
        if self.limited.throughout(from_us) {
            return Some(false);
        }
        let limited_since_first_launch =
            self.first_launch_us.is_some() && self.limited.0 == self.first_launch_us;
        (limited_since_first_launch && !self.settled_before).then_some(true)
    }

    /// Notes a settlement of `delta_ns` (negative: a refund).
    fn settled(&mut self, delta_ns: i64, provisionally: bool) {
        self.settled_before = true;
        self.provisional_ns = if provisionally {
            delta_ns.min(0).unsigned_abs()
        } else {
            0
        };
    }

    /// At a look that found another process listed: the provisional
    /// refund to take back (0 if none).
    fn contended(&mut self) -> u64 {
        std::mem::take(&mut self.provisional_ns)
    }
}

/// Whether NVML lists this process at all (a container whose pid namespace
/// hides the host pid NVML uses is never listed).
#[derive(Default)]
struct Sighting {
    /// NVML listed this process at least once.
    seen: bool,
    unseen_answers: u32,
}

impl Sighting {
    /// Notes one look (`charged`: the process had work charged since the
    /// previous one); whether to stop looking: answers with new samples
    /// kept leaving out a process that ran.
    fn gives_up(&mut self, look: &Look, charged: bool) -> bool {
        self.seen |= look.listed;
        if !self.seen && look.fresh && charged {
            self.unseen_answers += 1;
        }
        self.unseen_answers >= UNSEEN_ANSWERS_BEFORE_GIVING_UP
    }
}

/// Looks over which a debt found at one settlement is charged. NVML's
/// samples come about every 200 ms, so one settlement can find a large
/// debt; charged at once it stopped a 40% tenant for 90–144 ms (the node
/// manager's restart test); in installments the tenant keeps running
/// between shorter waits.
const INSTALLMENTS: u64 = 4;

/// A debt charged a quarter of what is left at each look: any debt is paid
/// within a few looks, and no look charges more than a quarter of it.
#[derive(Default)]
struct Installments {
    owed_ns: u64,
}

impl Installments {
    fn add(&mut self, debt_ns: u64) {
        self.owed_ns = self.owed_ns.saturating_add(debt_ns);
    }

    /// What to charge at this look.
    fn next(&mut self) -> u64 {
        let pay = self.owed_ns.div_ceil(INSTALLMENTS);
        self.owed_ns -= pay;
        pay
    }
}

fn run() {
    let Some(sm) = tenant_sm::get() else { return };
    let mut tracked: Vec<Option<Tracked>> = (0..MAX_DEVICES).map(|_| None).collect();
    let mut opened = [false; MAX_DEVICES];
    loop {
        std::thread::sleep(PERIOD);
        for device in 0..MAX_DEVICES {
            let charged_now = charged_total(device);
            let now_us = realtime_us();
            if !opened[device] {
                // A device is looked up once the process was charged on it.
                if charged_now == 0 {
                    continue;
                }
                opened[device] = true;
                let first_limited = first_limited_launch_us(device);
                tracing::trace!(device, ?first_limited, now_us, "counting NVML samples");
                tracked[device] = DriverCount::open(device, first_limited).map(|count| Tracked {
                    count,
                    charged_before: 0,
                    charges: ChargeHistory::from_first_launch(first_limited),
                    sighting: Sighting::default(),
                    owed: Installments::default(),
                    settling: Settling::new(first_limited),
                });
                if tracked[device].is_none() {
                    tracing::debug!(device, "no NVML process accounting: estimates only");
                    continue;
                }
            }
            let Some(t) = tracked[device].as_mut() else {
                continue;
            };
            t.charges.record(now_us, charged_now);
            let share = sm.budget().share_ppm(device);
            t.settling.limited.look(is_limited(share), now_us);
            let pay = t.owed.next();
            if pay > 0 && is_limited(share) {
                sm.bucket(device)
                    .charge_back(pay as i64, share, dilu_layout::monotonic_ns());
            }
            let Some(look) = t.count.busy_since_last_look() else {
                continue;
            };
            note_sharing(device, if look.contended { SHARED } else { ALONE });
            let (busy_ns, listed) = (look.busy_ns, look.listed);
            let charged_ns = charged_now.wrapping_sub(t.charged_before) as i64;
            let first_sighting = listed && !t.sighting.seen;
            if t.sighting.gives_up(&look, charged_ns > 0) {
                tracing::debug!(device, "NVML never lists this process: estimates only");
                note_sharing(device, UNKNOWN);
                tracked[device] = None;
                continue;
            }
            if look.contended {
                // Sharing the device: NVML's number is not this process's
                // device time. The launches' estimates stand.
                t.charged_before = charged_now;
                let taken_back = t.settling.contended();
                if taken_back > 0 {
                    tracing::trace!(device, taken_back, "first period's refund taken back");
                    t.owed.add(taken_back);
                }
                continue;
            }
            if t.sighting.seen && !listed {
                // No new sample of this process: NVML samples about every
                // 200 ms, and a look between two samples knows nothing of
                // the work since. Keep the charges for the next sample.
                // (Settling every 50 ms look, three of four against no
                // sample, held a 70% tenant to 52% of its uncapped rate on
                // an H100: bench/results/gpu-check-20261122T153810Z.md.)
                continue;
            }
            t.charged_before = charged_now;
            if !listed {
                // Until NVML lists this process once, its silence may mean
                // it cannot see us (not that nothing ran): never refund on
                // it.
                continue;
            }
            if !is_limited(share) {
                continue;
            }
            // The charges made in the samples' own period (the history
            // knows there were none before the first launch; a period
            // reaching back past the looks kept is not settled, nor one
            // that began before the share was limited, while launches were
            // not charged). Where the stamps are on another clock, those
            // since the last settlement; then the first sample that lists
            // the process covers a period whose charges were not counted:
            // it only starts the count.
            let mut provisionally = false;
            let charged_ns = match look.covers_us {
                Some((from, to)) if to.abs_diff(now_us) <= STAMP_CLOCK_AGREES_US => {
                    let Some(first_period) = t.settling.period(from) else {
                        continue;
                    };
                    provisionally = first_period;
                    match t.charges.charged_between(from, to) {
                        Some(charged) => charged,
                        None => continue,
                    }
                }
                _ if first_sighting => continue,
                _ => charged_ns,
            };
            let delta = busy_ns as i64 - charged_ns;
            t.settling.settled(delta, provisionally);
            if delta == 0 {
                continue;
            }
            tracing::trace!(device, busy_ns, charged_ns, delta, "device time settled");
            sm.device(device).record_correction(delta);
            if delta > 0 {
                t.owed.add(delta as u64);
            } else {
                // A refund is taken off later launches' charges anyway.
                sm.bucket(device)
                    .charge_back(delta, share, dilu_layout::monotonic_ns());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        ChargeHistory, INSTALLMENTS, Installments, LOOKS_KEPT, LimitedSince, Look, SampleClock,
        Settling, Sighting,
    };

    #[test]
    fn only_a_device_seen_alone_is_taken_for_unshared() {
        use super::{ALONE, SHARED, UNKNOWN, may_be_shared, note_sharing};
        const DEVICE: usize = 13; // no other test uses it
        assert!(may_be_shared(DEVICE), "not looked at yet");
        note_sharing(DEVICE, ALONE);
        assert!(!may_be_shared(DEVICE));
        note_sharing(DEVICE, SHARED);
        assert!(may_be_shared(DEVICE));
        note_sharing(DEVICE, UNKNOWN);
        assert!(may_be_shared(DEVICE), "NVML stopped answering");
        assert!(may_be_shared(usize::MAX), "no such device");
    }

    #[test]
    fn a_debt_is_paid_in_installments_of_at_most_a_quarter() {
        let mut owed = Installments::default();
        owed.add(90_000_000);
        let mut paid = Vec::new();
        loop {
            let pay = owed.next();
            if pay == 0 {
                break;
            }
            paid.push(pay);
        }
        assert_eq!(paid.iter().sum::<u64>(), 90_000_000, "all of it");
        assert_eq!(paid[0], 90_000_000 / INSTALLMENTS);
        assert!(paid.windows(2).all(|w| w[1] <= w[0]), "{paid:?}");
        assert!(paid.len() < 80, "paid off in {} looks", paid.len());
    }

    /// An answer with new samples.
    fn look(busy_ns: u64, listed: bool, contended: bool) -> Look {
        Look {
            busy_ns,
            covers_us: None,
            listed,
            contended,
            fresh: true,
        }
    }

    impl Look {
        fn covering(self, from_us: u64, to_us: u64) -> Look {
            Look {
                covers_us: Some((from_us, to_us)),
                ..self
            }
        }
    }

    const US: u64 = 1;
    const MS: u64 = 1_000 * US;

    #[test]
    fn the_first_answer_only_sets_the_baseline() {
        let mut clock = SampleClock::default();
        assert_eq!(clock.fold(7, &[(7, 1_000 * MS, 90)]), look(0, true, false));
        // The next sample of ours, 200 ms later at 50%: 100 ms busy.
        assert_eq!(
            clock.fold(7, &[(7, 1_200 * MS, 50)]),
            look(100 * MS * 1_000, true, false).covering(1_000 * MS, 1_200 * MS)
        );
    }

    #[test]
    fn samples_of_other_processes_are_not_ours() {
        let mut clock = SampleClock::default();
        clock.fold(7, &[(9, 1_000 * MS, 10)]);
        assert_eq!(clock.fold(7, &[(9, 1_200 * MS, 100)]), look(0, false, true));
        // An answer with nothing newer than what was seen counts nothing again.
        assert_eq!(
            clock.fold(7, &[(7, 1_200 * MS, 100)]),
            Look {
                fresh: false,
                ..look(0, false, true)
            }
        );
    }

    #[test]
    fn no_new_sample_leaves_the_device_shared_as_last_seen() {
        let mut clock = SampleClock::default();
        clock.fold(7, &[(7, 1_000 * MS, 99)]);
        assert!(!clock.nothing_new().contended);
        clock.fold(7, &[(9, 1_200 * MS, 99)]);
        let between = clock.nothing_new();
        assert!(between.contended && !between.listed && !between.fresh);
    }

    #[test]
    fn a_tenant_of_a_busy_pair_keeps_looking_between_samples() {
        // Four 50 ms looks per 200 ms sample; the driver lists the two
        // busy processes in turn; ours ran all along.
        let mut clock = SampleClock::default();
        let mut sighting = Sighting::default();
        let mut t = 1_000 * MS;
        for turn in 0..100 {
            t += 200 * MS;
            let pid = if turn % 2 == 0 { 7 } else { 9 };
            let answer = clock.fold(7, &[(pid, t, 99)]);
            assert!(!sighting.gives_up(&answer, true), "turn {turn}");
            for _ in 0..3 {
                assert!(!sighting.gives_up(&clock.nothing_new(), true));
            }
        }
        assert!(sighting.seen);
    }

    #[test]
    fn a_process_nvml_never_lists_stops_being_corrected() {
        // NVML lists a neighbour but never this process (another pid
        // namespace): ten answers with new samples, 2 s, and no more.
        let mut clock = SampleClock::default();
        let mut sighting = Sighting::default();
        let mut t = 1_000 * MS;
        let mut answers = 0;
        loop {
            t += 200 * MS;
            answers += 1;
            let answer = clock.fold(7, &[(9, t, 40)]);
            // Looks between samples say nothing.
            let gave_up = sighting.gives_up(&answer, true)
                || (0..3).any(|_| sighting.gives_up(&clock.nothing_new(), true));
            if gave_up {
                break;
            }
            assert!(answers < 100, "never gave up");
        }
        assert_eq!(answers, 10);
        // An idle process is not held against NVML.
        let mut idle = Sighting::default();
        for _ in 0..50 {
            t += 200 * MS;
            assert!(!idle.gives_up(&clock.fold(7, &[(9, t, 40)]), false));
        }
    }

    #[test]
    fn a_sample_after_an_idle_stretch_covers_one_period_not_the_stretch() {
        let mut clock = SampleClock::default();
        let mut t = 1_000 * MS;
        clock.fold(7, &[(7, t, 100), (9, t, 0)]);
        for _ in 0..10 {
            t += 200 * MS;
            clock.fold(7, &[(7, t, 100), (9, t, 0)]);
        }
        // Two seconds in which only an idle process is listed.
        for _ in 0..10 {
            t += 200 * MS;
            assert_eq!(clock.fold(7, &[(9, t, 0)]), look(0, false, false));
        }
        t += 200 * MS;
        let seen = clock.fold(7, &[(7, t, 100), (9, t, 0)]);
        assert_eq!(
            seen,
            look(200 * MS * 1_000, true, false).covering(t - 200 * MS, t),
            "one 200 ms period at 100%"
        );
    }

    #[test]
    fn another_busy_process_makes_the_numbers_untrustworthy_for_a_while() {
        let mut clock = SampleClock::default();
        let mut t = 1_000 * MS;
        clock.fold(7, &[(7, t, 99)]);
        // The driver lists the two busy processes in turn, each at 99%.
        t += 200 * MS;
        assert!(clock.fold(7, &[(9, t, 99)]).contended);
        t += 200 * MS;
        let ours = clock.fold(7, &[(7, t, 99)]);
        assert!(ours.listed && ours.contended);
        // The other stops; a second after its last sample, ours count again.
        for _ in 0..4 {
            t += 200 * MS;
            assert!(clock.fold(7, &[(7, t, 60)]).contended);
        }
        t += 200 * MS;
        assert_eq!(
            clock.fold(7, &[(7, t, 60)]),
            look(120 * MS * 1_000, true, false).covering(t - 200 * MS, t)
        );
    }

    #[test]
    fn several_samples_in_one_answer_each_count_their_own_period() {
        let mut clock = SampleClock::default();
        clock.fold(7, &[(7, 1_000 * MS, 0)]);
        let answer = [(7, 1_200 * MS, 50), (7, 1_400 * MS, 25), (9, 1_400 * MS, 0)];
        assert_eq!(
            clock.fold(7, &answer),
            look((100 + 50) * MS * 1_000, true, false).covering(1_000 * MS, 1_400 * MS)
        );
    }

    #[test]
    fn a_sample_is_compared_with_the_charges_of_its_own_period() {
        // Looks every 50 ms; the tenant is charged 35 ms per 50 ms (70%).
        let mut charges = ChargeHistory::default();
        let start = 1_000 * MS;
        for look in 0..=8 {
            charges.record(start + look * 50 * MS, look * 35 * MS * 1_000);
        }
        // A sample period from 20 ms after the first look to 220 ms after:
        // 200 ms at 70% is 140 ms, whatever the looks' phase.
        assert_eq!(
            charges.charged_between(start + 20 * MS, start + 220 * MS),
            Some((140 * MS * 1_000) as i64)
        );
        // A period that began before the first look kept is not settled
        // (its charges were never seen), rather than settled short.
        assert_eq!(
            charges.charged_between(start - 100 * MS, start + 100 * MS),
            None
        );
        // After the newest look nothing more was charged as far as is known.
        assert_eq!(
            charges.charged_between(start + 400 * MS, start + 450 * MS),
            Some(0)
        );
    }

    #[test]
    fn a_period_after_the_first_launch_is_settled_before_the_first_look() {
        // First launched at 1 050 ms; NVML first asked at 1 450 ms (its
        // thread started late), 280 ms charged by then, evenly.
        let first = 1_050 * MS;
        let mut charges = ChargeHistory::from_first_launch(Some(first));
        charges.record(1_450 * MS, 280 * MS * 1_000);
        let mut clock = SampleClock {
            count_from_us: Some(first),
            ..SampleClock::default()
        };
        // The first answer holds the period [1 200, 1 400] ms: 60% of it ran.
        let first_look = clock.fold(7, &[(7, 1_400 * MS, 60), (9, 1_200 * MS, 0)]);
        assert_eq!(
            first_look,
            look(120 * MS * 1_000, true, false).covering(1_200 * MS, 1_400 * MS)
        );
        // Its charges are known, though made before NVML was first asked.
        assert_eq!(
            charges.charged_between(1_200 * MS, 1_400 * MS),
            Some((140 * MS * 1_000) as i64)
        );
        assert_eq!(Settling::new(Some(first)).period(1_200 * MS), Some(false));
        // The period before, which began before the first launch, only
        // provisionally (its end had a queue in flight that its start had not).
        assert_eq!(Settling::new(Some(first)).period(1_000 * MS), Some(true));
        // A sample of this process stamped before its first launch is not
        // its work to settle: the first answer only starts the count there.
        let mut clock = SampleClock {
            count_from_us: Some(first),
            ..SampleClock::default()
        };
        assert_eq!(clock.fold(7, &[(7, 1_000 * MS, 30)]), look(0, true, false));
    }

    #[test]
    fn a_first_sample_is_no_busier_than_the_time_since_the_first_launch() {
        // First launched 80 ms before the stamp of its first sample, which
        // says 86% of a 200 ms period: at most the 80 ms it existed ran.
        let first = 1_320 * MS;
        let mut clock = SampleClock {
            count_from_us: Some(first),
            ..SampleClock::default()
        };
        let first_look = clock.fold(7, &[(7, 1_400 * MS, 86), (9, 1_200 * MS, 0)]);
        assert_eq!(first_look.busy_ns, 80 * MS * 1_000);
        // The next sample's period began after the launch: as NVML says.
        let next = clock.fold(7, &[(7, 1_600 * MS, 50)]);
        assert_eq!(next.busy_ns, 100 * MS * 1_000);
        // A stamp on another clock (long after the launch) is left as it is.
        let mut clock = SampleClock {
            count_from_us: Some(5 * MS),
            ..SampleClock::default()
        };
        assert_eq!(
            clock.fold(7, &[(7, 1_400 * MS, 86)]).busy_ns,
            172 * MS * 1_000
        );
    }

    #[test]
    fn the_first_periods_refund_is_taken_back_unless_a_later_period_settles() {
        let first = 1_050 * MS;
        let refund = -((16 * MS * 1_000) as i64);
        let mut settling = Settling::new(Some(first));
        assert_eq!(settling.period(1_000 * MS), Some(true));
        settling.settled(refund, true);
        // Only the first settlement may reach back before the first launch.
        assert_eq!(settling.period(1_000 * MS), None);
        // Another process is listed next: the refund comes back, once.
        assert_eq!(settling.contended(), 16 * MS * 1_000);
        assert_eq!(settling.contended(), 0);
        // A later period settled alone gives the queue's difference back
        // itself: the refund stays.
        let mut settling = Settling::new(Some(first));
        settling.settled(refund, true);
        assert_eq!(settling.period(1_200 * MS), Some(false));
        settling.settled((3 * MS * 1_000) as i64, false);
        assert_eq!(settling.contended(), 0);
        // A debt found in the first period is nothing to take back.
        let mut settling = Settling::new(Some(first));
        settling.settled((5 * MS * 1_000) as i64, true);
        assert_eq!(settling.contended(), 0);
        // Not limited at its first launch: no first period to settle.
        assert_eq!(Settling::new(None).period(1_000 * MS), None);
    }

    #[test]
    fn a_period_that_began_before_the_share_was_limited_is_not_settled() {
        // Limited from the first launch at 700 ms: periods from then on count.
        let mut limited = LimitedSince(Some(700 * MS));
        limited.look(true, 1_000 * MS);
        assert!(limited.throughout(800 * MS));
        assert!(!limited.throughout(600 * MS));
        // The share went unlimited, then limited again at a look at 2 s:
        // a period from 1.9 s holds uncharged work, one from 2 s does not.
        limited.look(false, 1_500 * MS);
        assert!(!limited.throughout(1_600 * MS));
        limited.look(true, 2_000 * MS);
        limited.look(true, 2_050 * MS);
        assert!(!limited.throughout(1_900 * MS));
        assert!(limited.throughout(2_000 * MS));
        // Unlimited from the first launch: nothing before the first limited
        // look counts.
        let mut limited = LimitedSince(None);
        limited.look(true, 3_000 * MS);
        assert!(!limited.throughout(2_900 * MS));
    }

    #[test]
    fn refunds_in_the_history_count_against_the_period() {
        let mut charges = ChargeHistory::default();
        charges.record(1_000 * MS, 5_000);
        // A refund of 3 µs between the looks: the total went down.
        charges.record(1_050 * MS, 2_000);
        assert_eq!(
            charges.charged_between(1_000 * MS, 1_050 * MS),
            Some(-3_000)
        );
    }

    #[test]
    fn the_history_keeps_a_bounded_number_of_looks() {
        let mut charges = ChargeHistory::default();
        for look in 0..(LOOKS_KEPT as u64 * 3) {
            charges.record(look * 50 * MS, look);
        }
        assert_eq!(charges.looks.len(), LOOKS_KEPT);
        assert_eq!(charges.charged_at(0), None, "the oldest looks are gone");
    }
}
