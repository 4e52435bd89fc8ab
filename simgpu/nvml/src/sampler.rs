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
//! the period's end and covering that period; a query between two
//! boundaries finds nothing new (`NVML_ERROR_NOT_FOUND`), as on the real
//! driver. The counters at a boundary are interpolated between the
//! snapshots around it, so they are as exact as the caller queries often
//! (a caller polling every 50 ms, as dilu's usage feedback does, has one
//! within 50 ms of every boundary).

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
        device_busy_ns: (0..ndev).map(|d| shm.device_busy_ns(d)).collect(),
        processes: shm.processes_on_devices(ndev),
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

    /// Takes a fresh snapshot and runs `read` on it and the history before
    /// it (oldest first), under the history's lock. Nothing is copied:
    /// every process of a tenant polls its own NVML about every 50 ms, and
    /// copying up to 20 s of snapshots at each query cost a 2-core host
    /// with 24 such processes most of its time, which on simgpu is the
    /// simulated GPUs' time too.
    fn with_history<T>(
        &self,
        shm: &Shm,
        read: impl FnOnce(&Snapshot, &VecDeque<Snapshot>) -> T,
    ) -> T {
        let current = take(shm);
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let answer = read(&current, &h);
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
        answer
    }

    /// Percent of the last [`RATE_WINDOW_NS`] (or since `nvmlInit`, if
    /// shorter) in which device `phys` ran a kernel.
    pub(crate) fn device_percent(&self, shm: &Shm, phys: usize) -> u32 {
        self.with_history(shm, |cur, history| {
            let since = cur.mono_ns.saturating_sub(RATE_WINDOW_NS);
            // The newest snapshot at or before the window's start, else the oldest.
            let base = history
                .iter()
                .rev()
                .find(|s| s.mono_ns <= since)
                .or(history.front())
                .unwrap_or(cur);
            let busy = cur.device_busy_ns[phys].saturating_sub(base.device_busy_ns[phys]);
            percent(busy, cur.mono_ns - base.mono_ns)
        })
    }

    /// One sample per process that ran kernels on `phys` in the driver's
    /// newest sample period, if that period ended after `last_seen_us`
    /// (CLOCK_REALTIME µs): time-stamped at the period's end, its
    /// percentage the part of that period in which a kernel of the process
    /// ran. The driver samples on its own schedule, so the sample says
    /// nothing about the time since the caller's previous query (counting
    /// from there read a process's first sample over a period that began
    /// before its first kernel, at the boundary before it). Older periods a
    /// caller did not ask in time for are not returned: NVML documents one
    /// sample per process.
    pub(crate) fn process_samples(
        &self,
        shm: &Shm,
        phys: usize,
        last_seen_us: u64,
    ) -> Vec<ProcessSample> {
        let period_us = self.sample_period_us;
        self.with_history(shm, |cur, history| {
            let end_us = cur.real_us / period_us * period_us;
            if end_us <= last_seen_us {
                return Vec::new();
            }
            let start_us = end_us - period_us;
            // The snapshots `busy_at` reads at the period's two ends: the
            // first two (to go back before the oldest) and those around
            // each end; the rest of the history changes nothing.
            let at = |i: usize| if i < history.len() { &history[i] } else { cur };
            let used = read_at(history.len() + 1, |i| at(i).real_us, [start_us, end_us]);
            cur.processes[phys]
                .iter()
                .filter_map(|p| {
                    // The process's busy counter at each snapshot used (0
                    // before it was listed), by wall-clock time.
                    let counter: Vec<(u64, u64)> = used
                        .iter()
                        .map(|&i| {
                            let s = at(i);
                            let busy = s.processes[phys]
                                .iter()
                                .find(|b| b.slot == p.slot && b.pid == p.pid)
                                .map_or(0, |b| b.busy_ns);
                            (s.real_us, busy)
                        })
                        .collect();
                    let busy =
                        busy_at(&counter, end_us).saturating_sub(busy_at(&counter, start_us));
                    (busy > 0).then(|| ProcessSample {
                        pid: p.pid,
                        time_stamp_us: end_us,
                        sm_percent: percent(busy, period_us * 1_000),
                    })
                })
                .collect()
        })
    }
}

/// Of `len` snapshots at wall-clock `times(i)` (ascending), those
/// [`busy_at`] reads for each of `instants`: the first two (to go back
/// before the oldest) and the two around each instant, ascending.
fn read_at(len: usize, times: impl Fn(usize) -> u64, instants: [u64; 2]) -> Vec<usize> {
    let after = |t_us: u64| {
        // The first snapshot later than `t_us` (binary search).
        let (mut low, mut high) = (0, len);
        while low < high {
            let middle = (low + high) / 2;
            if times(middle) <= t_us {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    };
    let mut used: Vec<usize> = [0, 1]
        .into_iter()
        .chain(instants.into_iter().flat_map(|t| {
            let i = after(t);
            [i.wrapping_sub(1), i]
        }))
        .filter(|&i| i < len)
        .collect();
    used.sort_unstable();
    used.dedup();
    used
}

fn busy_at(counter: &[(u64, u64)], at_us: u64) -> u64 {
    let after = counter.partition_point(|&(t, _)| t <= at_us);
    match (after.checked_sub(1).map(|i| counter[i]), counter.get(after)) {
        (None, None) => 0,
        (None, Some(&(t0, b0))) => match counter.get(1) {
            Some(&(t1, b1)) if t1 > t0 => {
                let rise = b1.saturating_sub(b0) as u128;
                let back = rise * u128::from(t0 - at_us) / u128::from(t1 - t0);
                b0.saturating_sub(back.min(u128::from(u64::MAX)) as u64)
            }
            _ => b0,
        },
        (Some(before), None) => before.1,
        (Some((t0, b0)), Some(&(t1, b1))) => {
            let rise = b1.saturating_sub(b0) as u128;
            b0 + (rise * u128::from(at_us - t0) / u128::from(t1 - t0)) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{busy_at, read_at};

    /// Reading only the snapshots `read_at` picks gives what reading all
    /// of them gives, at every instant: before, between and after them.
    #[test]
    fn the_snapshots_read_give_what_all_of_them_give() {
        let mut state = 12345u64;
        let mut next = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
        for _ in 0..500 {
            let len = 1 + next(40) as usize;
            let mut counter = Vec::with_capacity(len);
            let (mut t, mut busy) = (1_000 + next(1_000), 0);
            for _ in 0..len {
                t += 1 + next(50_000);
                busy += next(50_000_000);
                counter.push((t, busy));
            }
            let instants = [next(t + 100_000), next(t + 100_000)];
            let used = read_at(len, |i| counter[i].0, instants);
            let some: Vec<(u64, u64)> = used.iter().map(|&i| counter[i]).collect();
            for at in instants {
                assert_eq!(
                    busy_at(&some, at),
                    busy_at(&counter, at),
                    "{counter:?} at {at}"
                );
            }
        }
    }

    const MS: u64 = 1_000;

    #[test]
    fn a_counter_between_snapshots_is_interpolated() {
        // Busy 0 until 100 ms, then busy all the time up to 300 ms.
        let counter = [(0, 0), (100 * MS, 0), (300 * MS, 200 * MS * 1_000)];
        assert_eq!(busy_at(&counter, 50 * MS), 0);
        assert_eq!(busy_at(&counter, 200 * MS), 100 * MS * 1_000);
        // The period [200, 400] ms after the last snapshot is counted up to it.
        assert_eq!(busy_at(&counter, 400 * MS), 200 * MS * 1_000);
    }

    #[test]
    fn before_the_first_snapshot_the_counter_goes_back_at_its_first_rate() {
        // Busy half the time from 100 ms on; NVML first looked at 200 ms.
        let counter = [(200 * MS, 50 * MS * 1_000), (300 * MS, 100 * MS * 1_000)];
        assert_eq!(busy_at(&counter, 150 * MS), 25 * MS * 1_000);
        assert_eq!(busy_at(&counter, 0), 0);
        assert_eq!(busy_at(&counter[..1], 0), 50 * MS * 1_000);
        assert_eq!(busy_at(&[], 0), 0);
    }
}
