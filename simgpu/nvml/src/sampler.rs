//! Utilisation, sampled from the driver's busy-time counters.
//!
//! simgpu counts, per device and per process, the device time reserved for
//! kernels. Utilisation over a window is the growth of such a counter
//! divided by the window's length, which is what NVML reports: the share of
//! a sample period in which a kernel was executing. NVIDIA's driver keeps
//! samples itself; here every query takes a snapshot of the counters and
//! keeps it (at most one per [`MIN_SPACING_NS`], for [`KEEP_NS`]), so a
//! window reaching back to an earlier query or to `nvmlInit` is exact.
//!
//! Per-process samples come on the driver's schedule, not the caller's: a
//! new one only once per sample period (`SIMGPU_NVML_SAMPLE_PERIOD`, default
//! 200 ms: the median spacing of `nvmlDeviceGetProcessUtilization` samples
//! on an H100 with driver 580, `bench/results/gpu-sm.md`), time-stamped at
//! the period's boundary; a query between two boundaries finds nothing new
//! (`NVML_ERROR_NOT_FOUND`), as on the real driver.

use crate::config::MAX_DEVICES;
use crate::shm::{ProcessUsage, Shm};
use crate::{now_ns, realtime_us};
use std::collections::VecDeque;
use std::sync::Mutex;

const MIN_SPACING_NS: u64 = 10_000_000;
/// Default spacing of per-process samples (see the module doc).
const DEFAULT_SAMPLE_PERIOD_US: u64 = 200_000;
const KEEP_NS: u64 = 20_000_000_000;
/// `nvmlDeviceGetUtilizationRates` looks back this far (NVML: "between 1
/// second and 1/6 second" depending on the product).
pub(crate) const RATE_WINDOW_NS: u64 = 1_000_000_000;

#[derive(Clone)]
struct Snapshot {
    mono_ns: u64,
    real_us: u64,
    /// The time stamp a caller knows this snapshot by: `real_us`, or the
    /// sample-period boundary a process sample taken from it reported.
    stamp_us: u64,
    device_busy_ns: Vec<u64>,
    processes: Vec<Vec<ProcessUsage>>,
}

pub(crate) struct Sampler {
    history: Mutex<VecDeque<Snapshot>>,
    sample_period_us: u64,
}

/// `SIMGPU_NVML_SAMPLE_PERIOD` (a duration, at least 1 ms), else the default.
fn sample_period_us() -> u64 {
    match std::env::var("SIMGPU_NVML_SAMPLE_PERIOD") {
        Err(_) => DEFAULT_SAMPLE_PERIOD_US,
        Ok(v) => match dilu_abi::units::parse_duration_ns(&v) {
            Ok(ns) if ns >= 1_000_000 => ns / 1_000,
            _ => {
                eprintln!(
                    "simgpu-nvml: SIMGPU_NVML_SAMPLE_PERIOD={v:?} is invalid: expected a duration of at least 1ms ({}); using 200ms",
                    dilu_abi::units::DURATION_FORMS
                );
                DEFAULT_SAMPLE_PERIOD_US
            }
        },
    }
}

/// One process's share of the device over a window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcessSample {
    pub pid: u32,
    pub time_stamp_us: u64,
    pub sm_percent: u32,
}

fn take(shm: &Shm) -> Snapshot {
    let ndev = shm.ndev().min(MAX_DEVICES);
    let real_us = realtime_us();
    Snapshot {
        mono_ns: now_ns(),
        real_us,
        stamp_us: real_us,
        device_busy_ns: (0..ndev).map(|d| shm.device_busy_ns(d)).collect(),
        processes: (0..ndev).map(|d| shm.processes(d)).collect(),
    }
}

fn percent(busy_ns: u64, window_ns: u64) -> u32 {
    if window_ns == 0 {
        return 0;
    }
    ((busy_ns as f64 * 100.0 / window_ns as f64).round() as u32).min(100)
}

impl Sampler {
    pub(crate) fn new(shm: &Shm) -> Sampler {
        Sampler {
            history: Mutex::new(VecDeque::from([take(shm)])),
            sample_period_us: sample_period_us(),
        }
    }

    /// A fresh snapshot and the history before it.
    fn now(&self, shm: &Shm) -> (Snapshot, Vec<Snapshot>) {
        let current = take(shm);
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let history: Vec<Snapshot> = h.iter().cloned().collect();
        if h.back()
            .is_none_or(|b| current.mono_ns >= b.mono_ns + MIN_SPACING_NS)
        {
            h.push_back(current.clone());
        }
        while h.len() > 1
            && h.front()
                .is_some_and(|f| f.mono_ns + KEEP_NS < current.mono_ns)
        {
            h.pop_front();
        }
        (current, history)
    }

    /// Percent of the last [`RATE_WINDOW_NS`] (or since `nvmlInit`, if
    /// shorter) in which device `phys` ran a kernel.
    pub(crate) fn device_percent(&self, shm: &Shm, phys: usize) -> u32 {
        let (cur, history) = self.now(shm);
        let since = cur.mono_ns.saturating_sub(RATE_WINDOW_NS);
        // The newest snapshot at or before the window's start, else the oldest.
        let base = history
            .iter()
            .rev()
            .find(|s| s.mono_ns <= since)
            .or(history.first())
            .unwrap_or(&cur);
        let busy = cur.device_busy_ns[phys].saturating_sub(base.device_busy_ns[phys]);
        percent(busy, cur.mono_ns - base.mono_ns)
    }

    /// One sample per process that ran kernels on `phys` since
    /// `last_seen_us` (CLOCK_REALTIME µs; 0 = since the oldest snapshot),
    /// time-stamped at the newest sample-period boundary; none until a
    /// boundary newer than `last_seen_us` has passed.
    pub(crate) fn process_samples(
        &self,
        shm: &Shm,
        phys: usize,
        last_seen_us: u64,
    ) -> Vec<ProcessSample> {
        let (cur, history) = self.now(shm);
        let boundary_us = cur.real_us / self.sample_period_us * self.sample_period_us;
        if boundary_us <= last_seen_us {
            return Vec::new();
        }
        // The snapshot the caller's time stamp names (the one a previous
        // sample was taken from), else the newest before it, else the oldest.
        let base = history
            .iter()
            .filter(|s| s.stamp_us <= last_seen_us)
            .max_by_key(|s| (s.stamp_us, s.mono_ns))
            .or(history.first())
            .unwrap_or(&cur);
        let window = cur.mono_ns - base.mono_ns;
        let samples: Vec<ProcessSample> = cur.processes[phys]
            .iter()
            .filter_map(|p| {
                let before = base.processes[phys]
                    .iter()
                    .find(|b| b.slot == p.slot && b.pid == p.pid)
                    .map_or(0, |b| b.busy_ns);
                let busy = p.busy_ns.saturating_sub(before);
                (busy > 0).then(|| ProcessSample {
                    pid: p.pid,
                    time_stamp_us: boundary_us,
                    sm_percent: percent(busy, window),
                })
            })
            .collect();
        // A caller that asks again from this boundary starts where this
        // sample ended, so no stretch is counted twice.
        let mut kept = self.history.lock().unwrap_or_else(|e| e.into_inner());
        kept.push_back(Snapshot {
            stamp_us: boundary_us,
            ..cur
        });
        samples
    }
}
