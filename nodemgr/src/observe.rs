//! Turning a tenant's telemetry counters into per-period observations for
//! the controller and per-second figures for operators.
//!
//! Each period the sampler reads the counters once, keeps the differences
//! in a ring covering the last second, and derives: busy time, launches and
//! throttling of the period, time since the last launch, and latency
//! quantiles over a recent window (reported latencies when the program
//! reports any, else the intervals between its synchronisations).
//!
//! A tenant whose launch, wait and latency counters have not moved since
//! the last period is idle: its histograms are not read and nothing is
//! added to its windows, so a node of many idle tenants costs a period
//! little more than its active ones. (Synchronisations without a launch
//! are counted at the tenant's next launch.)
//!
//! The counters are in memory the tenant writes: any value is possible, so
//! every difference and sum here saturates (a tenant writing garbage gets
//! garbage figures, never a panic in the daemon's control loop).

use crate::control::{CONTROL_WINDOW_NS, Latency, Observation};
use dilu_abi::node_wire::TenantSpec;
use dilu_layout::activity::{DeviceSnapshot, TenantActivity};
use dilu_layout::histogram::{BUCKETS, HistogramSnapshot, bucket_upper_ns};
use std::collections::VecDeque;

/// How recently a tenant at share 0 must have waited to show as waiting.
pub const WAITING_WINDOW_NS: u64 = 100_000_000;
/// Window of the operator figures (status, metrics).
pub const STATUS_WINDOW_NS: u64 = 1_000_000_000;
/// Periods within this long of each other share a slice of the ring (the
/// windows above move by this much at a time).
pub const SLICE_NS: u64 = 20_000_000;

type Hist = [u64; BUCKETS];

/// The periods of one slice of the ring.
struct Slice {
    /// Its first period's end, and its last's.
    started_ns: u64,
    at_ns: u64,
    wall_ns: u64,
    busy_ns: u64,
    launches: u64,
    latencies: Hist,
}

/// Totals read at one instant.
#[derive(Clone, Copy)]
struct Reading {
    device: DeviceSnapshot,
    /// The latencies the program reports once it has reported any, else
    /// its intervals between synchronisations (only the one the sampler
    /// uses is read: a period's cost grows with every tenant on the node).
    latencies: Hist,
    reported: bool,
    latency_count: u64,
    latency_sum_ns: u64,
}

fn read(telemetry: &TenantActivity, device: usize, reports_latency: bool) -> Reading {
    let (latency_count, latency_sum_ns) = telemetry.latency_totals();
    let reported = reports_latency || latency_count > 0;
    Reading {
        device: telemetry.devices[device].snapshot(),
        latencies: if reported {
            telemetry.latencies.snapshot()
        } else {
            telemetry.sync_intervals.snapshot()
        },
        reported,
        latency_count,
        latency_sum_ns,
    }
}

/// The counters that move whenever the tenant does something the sampler
/// counts (its device's GPU time, launches and waits; reported latencies).
fn pulse(telemetry: &TenantActivity, device: usize) -> [u64; 4] {
    let [busy, launches, waited] = telemetry.devices[device].pulse();
    [busy, launches, waited, telemetry.latency_totals().0]
}

/// A period's differences (`latencies`: `None` when the period was idle).
#[derive(Default)]
struct Counts {
    wall_ns: u64,
    busy_ns: u64,
    launches: u64,
    throttled_ns: u64,
    latencies: Option<Hist>,
    period_mean_ns: Option<u64>,
}

/// Per-tenant sampling state.
pub struct Sampler {
    previous: Option<(u64, Reading)>,
    /// [`pulse`] at the last reading.
    pulse: Option<[u64; 4]>,
    /// The p99 of `window`, until the window changes.
    window_p99: Option<Option<u64>>,
    /// Periods whose counters were read in full (the others were idle).
    full_reads: u64,
    last_launch_ns: Option<u64>,
    /// When a period last saw a thread of the tenant inside a synchronising
    /// call (read every period, idle or not: one load).
    last_sync_ns: Option<u64>,
    /// When a period last saw the tenant's launches wait for tokens.
    last_wait_ns: Option<u64>,
    ring: VecDeque<Slice>,
    /// Latencies of the newest `window_len` slices of the ring: those of
    /// the last [`CONTROL_WINDOW_NS`], kept as a running sum so a period
    /// costs the same however many slices the window holds.
    window: Hist,
    window_len: usize,
    reports_latency: bool,
    /// The device (in-process ordinal) whose counters it reads: 0, or
    /// another of a tenant given several GPUs.
    device: usize,
}

impl Sampler {
    /// A sampler of device `device` (in-process ordinal, below
    /// [`dilu_layout::ledger::MAX_DEVICES`]) of a tenant given several
    /// GPUs; [`Sampler::default`] samples device 0.
    pub fn for_device(device: usize) -> Self {
        Sampler {
            device: device.min(dilu_layout::ledger::MAX_DEVICES - 1),
            ..Sampler::default()
        }
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            previous: None,
            pulse: None,
            window_p99: None,
            full_reads: 0,
            last_launch_ns: None,
            last_sync_ns: None,
            last_wait_ns: None,
            ring: VecDeque::new(),
            window: [0; BUCKETS],
            window_len: 0,
            reports_latency: false,
            device: 0,
        }
    }
}

/// Operator figures over the last second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Recent {
    pub achieved: f64,
    pub bubble_ratio: f64,
    pub p99_ns: Option<u64>,
    pub busy_total_ns: u64,
    pub launches_total: u64,
    pub throttled_total_ns: u64,
    /// Request latencies the program reported, and their sum.
    pub latency_reports_total: u64,
    pub latency_sum_total_ns: u64,
}

/// The value below which a fraction `q` of a histogram's samples lie,
/// interpolated linearly inside the log₂ bucket.
pub fn quantile_ns(hist: &Hist, q: f64) -> Option<u64> {
    let total = hist.total();
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
    let mut seen = 0.0;
    for (i, &count) in hist.iter().enumerate() {
        if count == 0 {
            continue;
        }
        if seen + count as f64 >= rank {
            let low = if i == 0 {
                0
            } else {
                bucket_upper_ns(i - 1) + 1
            };
            let high = bucket_upper_ns(i);
            let within = (rank - seen) / count as f64;
            return Some(low + ((high - low) as f64 * within) as u64);
        }
        seen += count as f64;
    }
    Some(bucket_upper_ns(BUCKETS - 1))
}

fn mean_ns(hist: &Hist) -> Option<u64> {
    let total = hist.total();
    (total > 0).then(|| {
        let sum: f64 = hist
            .iter()
            .enumerate()
            .map(|(i, &c)| c as f64 * (bucket_upper_ns(i) as f64 * 0.75))
            .sum();
        (sum / total as f64) as u64
    })
}

fn add(into: &mut Hist, from: &Hist) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = a.saturating_add(*b);
    }
}

fn subtract(from: &mut Hist, what: &Hist) {
    for (a, b) in from.iter_mut().zip(what) {
        *a = a.saturating_sub(*b);
    }
}

impl Sampler {
    /// Reads the counters at `now_ns` and returns the period's observation.
    pub fn observe(
        &mut self,
        telemetry: &TenantActivity,
        now_ns: u64,
        spec: &TenantSpec,
        share_ppm: u32,
    ) -> Observation {
        if telemetry.in_sync() {
            self.last_sync_ns = Some(now_ns);
        }
        let pulse = pulse(telemetry, self.device);
        let idle = self.previous.is_some() && self.pulse == Some(pulse);
        self.pulse = Some(pulse);
        let counts = match self.previous.as_mut() {
            Some((since, _)) if idle => {
                // Nothing moved: every difference is zero.
                let wall_ns = now_ns.saturating_sub(*since);
                *since = now_ns;
                Counts {
                    wall_ns,
                    ..Counts::default()
                }
            }
            _ => self.read_in_full(telemetry, now_ns),
        };
        let Counts {
            wall_ns,
            busy_ns,
            launches,
            throttled_ns,
            latencies,
            period_mean_ns,
        } = counts;
        if let Some(latencies) = &latencies {
            add(&mut self.window, latencies);
            self.window_p99 = None;
        }
        // Periods are folded into slices of SLICE_NS: the ring, and what a
        // period writes and drops, stay small on a node of many tenants.
        match self.ring.back_mut() {
            Some(last) if last.started_ns.saturating_add(SLICE_NS) > now_ns => {
                last.at_ns = now_ns;
                last.wall_ns = last.wall_ns.saturating_add(wall_ns);
                last.busy_ns = last.busy_ns.saturating_add(busy_ns);
                last.launches = last.launches.saturating_add(launches);
                if let Some(latencies) = &latencies {
                    add(&mut last.latencies, latencies);
                }
            }
            _ => {
                self.ring.push_back(Slice {
                    started_ns: now_ns,
                    at_ns: now_ns,
                    wall_ns,
                    busy_ns,
                    launches,
                    latencies: latencies.unwrap_or([0; BUCKETS]),
                });
                self.window_len += 1;
            }
        }
        while self.window_len > 0 {
            let oldest = &self.ring[self.ring.len() - self.window_len];
            if oldest.at_ns.saturating_add(CONTROL_WINDOW_NS) >= now_ns {
                break;
            }
            subtract(&mut self.window, &oldest.latencies);
            self.window_len -= 1;
            self.window_p99 = None;
        }
        if self.window_len == 0 {
            self.window = [0; BUCKETS]; // no drift from saturated sums
        }
        let p99_ns = *self
            .window_p99
            .get_or_insert_with(|| quantile_ns(&self.window, 0.99));
        // The status window holds the control window: what leaves it was
        // subtracted above.
        while self
            .ring
            .front()
            .is_some_and(|s| s.at_ns + STATUS_WINDOW_NS < now_ns)
        {
            self.ring.pop_front();
        }
        Observation {
            class: spec.class,
            slo_ns: spec.slo_ms.map(|ms| (ms * 1e6) as u64),
            request_ppm: spec.sm_request.ppm(),
            limit_ppm: spec.sm_limit.ppm(),
            share_ppm,
            period_ns: wall_ns.max(1),
            busy_ns,
            launches,
            throttled_ns,
            idle_ns: self
                .last_launch_ns
                .map_or(u64::MAX, |t| now_ns.saturating_sub(t)),
            sync_idle_ns: self
                .last_sync_ns
                .map_or(u64::MAX, |t| now_ns.saturating_sub(t)),
            latency: Latency {
                p99_ns,
                period_mean_ns,
            },
            colo_primary: telemetry.is_colo_primary(),
        }
    }

    /// Reads the counters in full and returns the period's differences.
    fn read_in_full(&mut self, telemetry: &TenantActivity, now_ns: u64) -> Counts {
        self.full_reads += 1;
        let reading = read(telemetry, self.device, self.reports_latency);
        let (since, mut before) = self.previous.unwrap_or((now_ns, reading));
        if before.reported != reading.reported {
            // The first report: none was counted at the reading before.
            before.latencies = [0; BUCKETS];
        }
        self.previous = Some((now_ns, reading));
        let wall_ns = now_ns.saturating_sub(since);
        let busy_ns = reading
            .device
            .busy_ns
            .saturating_sub(before.device.busy_ns)
            .max(0) as u64;
        let launches = reading
            .device
            .launches
            .saturating_sub(before.device.launches);
        let throttled_ns = reading
            .device
            .throttled_ns
            .saturating_sub(before.device.throttled_ns);
        if launches > 0 {
            self.last_launch_ns = Some(now_ns);
        }
        if throttled_ns > 0 {
            self.last_wait_ns = Some(now_ns);
        }
        self.reports_latency = reading.reported;
        let latencies = reading.latencies.since(&before.latencies);
        let period_mean_ns = if self.reports_latency {
            let count = reading.latency_count.saturating_sub(before.latency_count);
            let sum = reading.latency_sum_ns.saturating_sub(before.latency_sum_ns);
            (count > 0).then(|| sum / count)
        } else {
            mean_ns(&latencies)
        };
        Counts {
            wall_ns,
            busy_ns,
            launches,
            throttled_ns,
            latencies: Some(latencies),
            period_mean_ns,
        }
    }

    /// Figures over the last second, and totals.
    pub fn recent(&self) -> Recent {
        let wall = self
            .ring
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.wall_ns));
        let busy = self
            .ring
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.busy_ns));
        let mut hist: Hist = [0; BUCKETS];
        for slice in &self.ring {
            add(&mut hist, &slice.latencies);
        }
        let achieved = if wall > 0 {
            (busy as f64 / wall as f64).min(1.0)
        } else {
            0.0
        };
        let totals = self.previous.map(|(_, r)| r.device);
        let reports = self
            .previous
            .map_or((0, 0), |(_, r)| (r.latency_count, r.latency_sum_ns));
        Recent {
            achieved,
            bubble_ratio: if wall > 0 { 1.0 - achieved } else { 0.0 },
            p99_ns: quantile_ns(&hist, 0.99),
            busy_total_ns: totals.map_or(0, |d| d.busy_ns.max(0) as u64),
            launches_total: totals.map_or(0, |d| d.launches),
            throttled_total_ns: totals.map_or(0, |d| d.throttled_ns),
            latency_reports_total: reports.0,
            latency_sum_total_ns: reports.1,
        }
    }

    /// Whether the tenant's launches wait at a share of 0: they waited in
    /// the last [`WAITING_WINDOW_NS`] and the share is still 0.
    pub fn waiting_at_zero(&self, share_ppm: u32) -> bool {
        let latest = self.previous.map(|(at, _)| at);
        share_ppm == 0
            && self
                .last_wait_ns
                .zip(latest)
                .is_some_and(|(wait, at)| at.saturating_sub(wait) < WAITING_WINDOW_NS)
    }

    /// Whether the tenant launched anything in the last `ns`.
    pub fn launched_within(&self, now_ns: u64, ns: u64) -> bool {
        self.last_launch_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < ns)
            || self
                .ring
                .iter()
                .any(|s| s.launches > 0 && s.at_ns + ns >= now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_layout::shm::Region;

    #[test]
    fn counters_become_rates_and_latency_quantiles() {
        let telemetry = Region::<TenantActivity>::anonymous(|_| {}).unwrap();
        let spec = TenantSpec {
            class: dilu_abi::node_wire::WorkClass::Latency,
            slo_ms: Some(50.0),
            ..TenantSpec::default()
        };
        let mut sampler = Sampler::default();
        let t0 = 1_000_000_000;
        let first = sampler.observe(&telemetry, t0, &spec, 500_000);
        assert_eq!(
            (first.busy_ns, first.launches, first.idle_ns),
            (0, 0, u64::MAX)
        );

        // 2 ms of kernels in a 5 ms period, and three requests of ~30 ms.
        telemetry.devices[0].record_launch(t0 + 1_000_000, 2_000_000);
        for _ in 0..3 {
            telemetry.report_latency(30_000_000);
        }
        let o = sampler.observe(&telemetry, t0 + 5_000_000, &spec, 500_000);
        assert_eq!((o.busy_ns, o.launches, o.idle_ns), (2_000_000, 1, 0));
        assert!((o.utilisation() - 0.4).abs() < 1e-9);
        assert_eq!(o.slo_ns, Some(50_000_000));
        assert_eq!(o.latency.period_mean_ns, Some(30_000_000));
        let p99 = o.latency.p99_ns.unwrap();
        assert!((16_777_216..33_554_432).contains(&p99), "p99 {p99}");

        let later = sampler.observe(&telemetry, t0 + 10_000_000, &spec, 500_000);
        assert_eq!(later.idle_ns, 5_000_000);
        assert_eq!(later.latency.period_mean_ns, None, "no request completed");
        let recent = sampler.recent();
        assert!((recent.achieved - 0.2).abs() < 1e-9, "{recent:?}");
        assert_eq!(recent.launches_total, 1);
    }

    /// A tenant that launched long ago and now waits in a sync on its own
    /// work is seen in it, so it keeps wanting the device; once out of the
    /// sync for `RECENT_NS` it no longer does.
    #[test]
    fn a_tenant_in_a_sync_is_seen_at_work() {
        use crate::control::RECENT_NS;
        let telemetry = Region::<TenantActivity>::anonymous(|_| {}).unwrap();
        let spec = TenantSpec::default();
        let mut sampler = Sampler::default();
        let t0 = 1_000_000_000;
        sampler.observe(&telemetry, t0 - 1_000_000, &spec, 0);
        telemetry.devices[0].record_launch(t0, 1_000_000);
        let o = sampler.observe(&telemetry, t0 + 1_000_000, &spec, 0);
        assert_eq!(o.sync_idle_ns, u64::MAX, "never synchronised");
        telemetry.sync_began();
        let during = sampler.observe(&telemetry, t0 + 120_000_000, &spec, 0);
        assert!(during.idle_ns > RECENT_NS, "{during:?}");
        assert_eq!(during.sync_idle_ns, 0);
        assert!(during.wants_device(), "{during:?}");
        telemetry.sync_ended();
        let after = sampler.observe(&telemetry, t0 + 125_000_000, &spec, 0);
        assert_eq!(after.sync_idle_ns, 5_000_000);
        assert!(after.wants_device(), "just out of the sync: launches next");
        let quiet = sampler.observe(&telemetry, t0 + 200_000_000, &spec, 0);
        assert!(!quiet.wants_device(), "{quiet:?}");
    }

    /// Overwrites every word of the region but its magic with `words`.
    fn scribble(telemetry: &TenantActivity, words: &[u64]) {
        use std::sync::atomic::{AtomicU64, Ordering};
        let count = std::mem::size_of::<TenantActivity>() / 8;
        // SAFETY: TenantActivity is repr(C), made only of AtomicU64s (its
        // SharedLayout contract), so it is `count` AtomicU64s in a row.
        let cells = unsafe {
            std::slice::from_raw_parts(
                (telemetry as *const TenantActivity).cast::<AtomicU64>(),
                count,
            )
        };
        for (cell, word) in cells.iter().zip(words.iter().cycle()).skip(1) {
            cell.store(*word, Ordering::Relaxed);
        }
    }

    fn word() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            any::<u64>(),
            Just(0),
            Just(u64::MAX),
            Just(i64::MIN as u64),
            Just(i64::MAX as u64)
        ]
    }

    proptest::proptest! {
        /// The daemon samples memory the tenant writes: whatever is in it,
        /// sampling, the operator figures and every controller return
        /// (no overflow panic, which would poison the daemon's lock).
        #[test]
        fn any_telemetry_a_tenant_writes_is_sampled_without_panic(
            first in proptest::collection::vec(word(), 1..64),
            second in proptest::collection::vec(word(), 1..64),
            slo in proptest::option::of(proptest::num::f64::ANY),
        ) {
            let telemetry = Region::<TenantActivity>::anonymous(|_| {}).unwrap();
            let spec = TenantSpec { slo_ms: slo, ..TenantSpec::default() };
            let mut sampler = Sampler::default();
            scribble(&telemetry, &first);
            let a = sampler.observe(&telemetry, 1_000_000_000, &spec, 500_000);
            scribble(&telemetry, &second);
            let b = sampler.observe(&telemetry, 1_005_000_000, &spec, 500_000);
            let _ = sampler.recent();
            let _ = sampler.launched_within(1_005_000_000, 1_000_000);
            for name in ["dilu", "dilu-rckm", "static"] {
                let mut controller = crate::control::by_name(name).unwrap();
                let _ = controller.step(1_000_000_000, &[a.clone(), b.clone()]);
                let _ = controller.step(1_005_000_000, &[b.clone(), a.clone()]);
            }
        }
    }
}
