//! Charges this process for the device time the driver says it used.
//!
//! Launches are charged per-kind estimates (see [`sampler`](crate::sampler)):
//! fast, and exact for a process whose kernels run one at a time. Two things
//! a per-kernel sample cannot see make them wrong by a factor, not a few
//! percent:
//! - kernels of several streams of one process run at the same time (SMs
//!   shared by blocks), so a kernel's events span time its siblings also
//!   used, and no single sample says how much of the busy time is its own
//!   (measured: a 30% tenant on 3 streams took 47% of the device);
//! - a kernel preempted at the end of a time slice has events spanning the
//!   other process's slice (a 30% tenant with kernels longer than a slice
//!   got 19%).
//!
//! The driver itself knows how long each process had kernels executing:
//! NVML's `nvmlDeviceGetProcessUtilization` reports, per sample period, the
//! percentage of time a kernel of the process ran (the union over its
//! streams, only while its context held the device). Every [`PERIOD`] this
//! thread compares the device time NVML counted for this process with what
//! the process was charged since the last look (launch estimates plus the
//! sampler's corrections) and charges (or refunds) the difference to the
//! tenant's bucket. The estimates still pace launches between looks; this
//! makes their sum right.
//!
//! Work charged at launch runs later, so at any moment the two totals
//! differ by the work in flight; the correction settles it once it ran, and
//! the error never accumulates. NVML reports whole percent: each look may
//! be off by half a percent of [`PERIOD`].
//!
//! Settling after the fact lets a process whose estimates are a factor too
//! low (several streams) queue that factor more work than its share before
//! the bill arrives, and then sit in debt while its queue drains. Scaling
//! every launch's charge by the measured ratio was tried and made it worse:
//! while a queue drains the ratio of the two counts rises, the scale with
//! it, and the process throttles itself further (a 70% tenant on 3 streams
//! learned a scale of 17.8 and used 59.5%).
//!
//! Where NVML is missing, or never lists this process (a container whose
//! pid namespace hides the host pid NVML uses), nothing is corrected and
//! the estimates alone decide, as before.

use crate::nvml::{self, NvmlDevice, NvmlReturn};
use crate::tenant_sm;
use dilu_abi::ledger::MAX_DEVICES;
use dilu_abi::sm::is_limited;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the driver's count is compared with the charges.
pub const PERIOD: Duration = Duration::from_millis(50);
/// Looks that may pass with work charged but no NVML sample of this process
/// before the process is taken to be invisible to NVML (then corrections
/// stop for good).
const UNSEEN_LOOKS_BEFORE_GIVING_UP: u32 = 40;

/// GPU time this process was charged on each device while its share was
/// limited: launch estimates, the sampler's corrections and this module's.
#[repr(C, align(64))]
struct Charged([AtomicU64; MAX_DEVICES]);

static CHARGED: Charged = Charged([const { AtomicU64::new(0) }; MAX_DEVICES]);
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Counts GPU time charged to this process on `device` (signed: a
/// correction may refund).
#[inline]
pub fn charged(device: usize, gpu_ns: i64) {
    if let Some(counter) = CHARGED.0.get(device) {
        counter.fetch_add(gpu_ns as u64, Ordering::Relaxed);
    }
}

fn charged_total(device: usize) -> u64 {
    CHARGED.0[device].load(Ordering::Relaxed)
}

/// Starts the comparing thread once (called off the launch path, when the
/// first sample is handed over).
#[cold]
pub fn ensure_running() {
    if RUNNING.swap(true, Ordering::AcqRel) {
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
    for counter in &CHARGED.0 {
        counter.store(0, Ordering::Relaxed);
    }
}

/// `nvmlProcessUtilizationSample_t` (nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessUtilizationSample {
    pid: u32,
    time_stamp_us: u64,
    sm_util: u32,
    mem_util: u32,
    enc_util: u32,
    dec_util: u32,
}

type ProcessUtilizationFn =
    unsafe extern "C" fn(NvmlDevice, *mut ProcessUtilizationSample, *mut u32, u64) -> NvmlReturn;

const NVML_SUCCESS: NvmlReturn = 0;
/// `NVML_ERROR_NOT_FOUND`: no sample newer than the one asked from.
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const MAX_SAMPLES: usize = 256;

/// The driver's busy-time count of one process on one device.
struct DriverCount {
    device: NvmlDevice,
    query: ProcessUtilizationFn,
    pid: u32,
    /// Newest sample time seen (CLOCK_REALTIME µs).
    last_seen_us: u64,
}

impl DriverCount {
    fn open(cuda_ordinal: usize) -> Option<DriverCount> {
        let location = nvml::cuda_pci_location(cuda_ordinal as i32)?;
        let device = nvml::nvml_device_at(location)?;
        let address = nvml::real_symbol(c"nvmlDeviceGetProcessUtilization");
        if address == 0 {
            return None;
        }
        // SAFETY: nvmlDeviceGetProcessUtilization from nvml.h, from the real
        // NVML.
        let query = unsafe { std::mem::transmute::<usize, ProcessUtilizationFn>(address) };
        let mut count = DriverCount {
            device,
            query,
            pid: std::process::id(),
            last_seen_us: 0,
        };
        // Everything before now is the baseline, not this module's to charge.
        count.busy_since_last_look()?;
        Some(count)
    }

    /// Device time (ns) the process had kernels running since the previous
    /// call, with whether NVML listed it; `None` if NVML failed.
    fn busy_since_last_look(&mut self) -> Option<(u64, bool)> {
        let mut samples = [ProcessUtilizationSample::default(); MAX_SAMPLES];
        let mut count = MAX_SAMPLES as u32;
        // SAFETY: `samples` holds `count` writable entries of nvml.h's
        // layout; the handle came from the real NVML.
        let result = unsafe {
            (self.query)(
                self.device,
                samples.as_mut_ptr(),
                &mut count,
                self.last_seen_us,
            )
        };
        match result {
            NVML_SUCCESS => {}
            NVML_ERROR_NOT_FOUND => return Some((0, false)),
            _ => return None,
        }
        let mut ours: Vec<ProcessUtilizationSample> = samples[..(count as usize).min(MAX_SAMPLES)]
            .iter()
            .filter(|s| s.pid == self.pid && s.time_stamp_us > self.last_seen_us)
            .copied()
            .collect();
        ours.sort_by_key(|s| s.time_stamp_us);
        let mut busy_ns = 0u64;
        let mut from = self.last_seen_us;
        for sample in &ours {
            // Each sample covers the time since the one before it.
            if from != 0 {
                let period_ns = (sample.time_stamp_us - from) * 1_000;
                busy_ns += period_ns * u64::from(sample.sm_util.min(100)) / 100;
            }
            from = sample.time_stamp_us;
        }
        // Samples of other processes move the clock too: a later look
        // must not count this stretch again.
        let newest = samples[..(count as usize).min(MAX_SAMPLES)]
            .iter()
            .map(|s| s.time_stamp_us)
            .max()
            .unwrap_or(0);
        if self.last_seen_us == 0 {
            // The first answer only sets where counting starts.
            self.last_seen_us = newest;
            return Some((0, !ours.is_empty()));
        }
        self.last_seen_us = self.last_seen_us.max(newest);
        Some((busy_ns, !ours.is_empty()))
    }
}

/// One device's comparison state.
struct Tracked {
    count: DriverCount,
    /// [`CHARGED`] at the previous look.
    charged_before: u64,
    /// NVML listed this process at least once.
    seen: bool,
    unseen_looks: u32,
}

fn run() {
    let Some(sm) = tenant_sm::get() else { return };
    let mut tracked: Vec<Option<Tracked>> = (0..MAX_DEVICES).map(|_| None).collect();
    let mut opened = [false; MAX_DEVICES];
    loop {
        std::thread::sleep(PERIOD);
        for device in 0..MAX_DEVICES {
            let charged_now = charged_total(device);
            if !opened[device] {
                // A device is looked up once the process was charged on it.
                if charged_now == 0 {
                    continue;
                }
                opened[device] = true;
                tracked[device] = DriverCount::open(device).map(|count| Tracked {
                    count,
                    charged_before: charged_total(device),
                    seen: false,
                    unseen_looks: 0,
                });
                if tracked[device].is_none() {
                    tracing::debug!(device, "no NVML process accounting: estimates only");
                }
                continue;
            }
            let Some(t) = tracked[device].as_mut() else {
                continue;
            };
            let Some((busy_ns, listed)) = t.count.busy_since_last_look() else {
                continue;
            };
            let charged_ns = charged_now.wrapping_sub(t.charged_before) as i64;
            t.charged_before = charged_now;
            if !t.seen {
                // Until NVML lists this process once, its silence may mean
                // it cannot see us (not that nothing ran): never refund on it.
                t.seen = listed;
                if charged_ns > 0 && !listed {
                    t.unseen_looks += 1;
                    if t.unseen_looks >= UNSEEN_LOOKS_BEFORE_GIVING_UP {
                        tracing::debug!(device, "NVML never lists this process: estimates only");
                        tracked[device] = None;
                    }
                }
                continue;
            }
            let share = sm.budget().share_ppm(device);
            if !is_limited(share) {
                continue;
            }
            let delta = busy_ns as i64 - charged_ns;
            if delta == 0 {
                continue;
            }
            tracing::trace!(device, busy_ns, charged_ns, delta, "device time settled");
            charged(device, delta);
            t.charged_before = charged_total(device);
            sm.device(device).record_correction(delta);
            sm.bucket(device)
                .charge_back(delta, share, dilu_abi::monotonic_ns());
        }
    }
}
