//! Utilisation, sampled from the driver's busy-time counters.
//!
//! simgpu counts, per device and per process, the device time reserved for
//! kernels. Utilisation over a window is the growth of such a counter
//! divided by the window's length, which is what NVML reports: the share of
//! a sample period in which a kernel was executing. NVIDIA's driver keeps
//! samples itself; here every query takes a snapshot of the counters and
//! keeps it (at most one per [`MIN_SPACING_NS`], for [`KEEP_NS`]), so a
//! window reaching back to an earlier query or to `nvmlInit` is exact.

use crate::config::MAX_DEVICES;
use crate::shm::{ProcessUsage, Shm};
use crate::{now_ns, realtime_us};
use std::collections::VecDeque;
use std::sync::Mutex;

const MIN_SPACING_NS: u64 = 10_000_000;
const KEEP_NS: u64 = 20_000_000_000;
/// `nvmlDeviceGetUtilizationRates` looks back this far (NVML: "between 1
/// second and 1/6 second" depending on the product).
pub(crate) const RATE_WINDOW_NS: u64 = 1_000_000_000;

#[derive(Clone)]
struct Snapshot {
    mono_ns: u64,
    real_us: u64,
    device_busy_ns: Vec<u64>,
    processes: Vec<Vec<ProcessUsage>>,
}

pub(crate) struct Sampler {
    history: Mutex<VecDeque<Snapshot>>,
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
    Snapshot {
        mono_ns: now_ns(),
        real_us: realtime_us(),
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
    /// `last_seen_us` (CLOCK_REALTIME µs; 0 = since the oldest snapshot).
    pub(crate) fn process_samples(
        &self,
        shm: &Shm,
        phys: usize,
        last_seen_us: u64,
    ) -> Vec<ProcessSample> {
        let (cur, history) = self.now(shm);
        if last_seen_us >= cur.real_us {
            return Vec::new();
        }
        // The newest snapshot at or before `last_seen_us`, else the oldest.
        let base = history
            .iter()
            .rev()
            .find(|s| s.real_us <= last_seen_us)
            .or(history.first())
            .unwrap_or(&cur);
        let window = cur.mono_ns - base.mono_ns;
        cur.processes[phys]
            .iter()
            .filter_map(|p| {
                let before = base.processes[phys]
                    .iter()
                    .find(|b| b.slot == p.slot && b.pid == p.pid)
                    .map_or(0, |b| b.busy_ns);
                let busy = p.busy_ns.saturating_sub(before);
                (busy > 0).then(|| ProcessSample {
                    pid: p.pid,
                    time_stamp_us: cur.real_us,
                    sm_percent: percent(busy, window),
                })
            })
            .collect()
    }
}
