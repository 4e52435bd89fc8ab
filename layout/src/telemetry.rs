//! What the processes of a tenant record while they run, in memory the node
//! manager can read without stopping them: per device, the SM-time token
//! bucket they share and their launch counters and histograms; per tenant,
//! the sync-to-sync intervals and reported request latencies.
//!
//! Tenants write this region, so a node manager treats it as advisory
//! (DESIGN principle 5) and cross-checks it where it can.

use crate::MAX_DEVICES;
use crate::histogram::Log2Histogram;
use crate::shm::SharedLayout;
use crate::sm::wall_cost_ns;
use std::sync::atomic::{AtomicU64, Ordering};

#[repr(C)]
pub struct DeviceTelemetry {
    /// The token bucket, as GCRA's theoretical arrival time: the wall-clock
    /// instant (CLOCK_MONOTONIC ns) at which everything charged so far has
    /// been paid for at the tenant's share. A launch may start once
    /// `tat − depth ≤ now`.
    tat_ns: AtomicU64,
    /// When the tenant's work launched so far is expected to finish on the
    /// device (for bubbles: a launch after this instant follows a gap).
    busy_until_ns: AtomicU64,
    /// GPU time charged: estimates at launch plus measured corrections.
    busy_ns: AtomicU64,
    launches: AtomicU64,
    /// Launches that had to wait for tokens, and the wall time they waited.
    throttled_launches: AtomicU64,
    throttled_ns: AtomicU64,
    /// GPU time charged too much earlier and not yet given back: later
    /// launches are charged that much less. (Giving it back by moving the
    /// bucket would be lost whenever the bucket is full, or become a burst.)
    refund_ns: AtomicU64,
    /// Launches timed with events, and the correction they brought
    /// (signed, two's complement).
    sampled_launches: AtomicU64,
    correction_ns: AtomicU64,
    /// Gaps between the tenant's kernels (device idle for this tenant).
    pub bubbles: Log2Histogram,
}

#[repr(C)]
pub struct TenantTelemetry {
    magic: AtomicU64,
    /// Pid of the last process that reported anything (diagnostics).
    last_reporter: AtomicU64,
    pub devices: [DeviceTelemetry; MAX_DEVICES],
    /// Intervals between successive synchronisations of a thread (the
    /// latency proxy for programs that report nothing).
    pub sync_intervals: Log2Histogram,
    /// Request latencies reported with `dilu_report_latency`.
    pub latencies: Log2Histogram,
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
}

// SAFETY: repr(C), atomics only; all-zero is "nothing recorded".
unsafe impl SharedLayout for TenantTelemetry {
    const MAGIC: u64 = 0x6469_6c75_5445_4c01; // "diluTEL" v1
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

/// When a launch may go, as decided by [`DeviceTelemetry::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Now,
    /// Wait until this CLOCK_MONOTONIC instant (ns).
    At(u64),
}

impl DeviceTelemetry {
    /// Charges a launch of `cost_ns` GPU time at `share_ppm` to the bucket
    /// (one CAS) and says when it may go. Never refuses: a launch in debt
    /// waits, and the debt is what it waits for.
    #[inline]
    pub fn admit(&self, now: u64, cost_ns: u64, share_ppm: u32, depth_ns: u64) -> Admission {
        let cost = wall_cost_ns(cost_ns - self.take_refund(cost_ns), share_ppm);
        let mut tat = self.tat_ns.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now).saturating_add(cost);
            match self
                .tat_ns
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    let go = tat.saturating_sub(depth_ns);
                    return if go > now {
                        Admission::At(go)
                    } else {
                        Admission::Now
                    };
                }
                Err(actual) => tat = actual,
            }
        }
    }

    /// Takes up to `cost_ns` from the refund owed to the tenant.
    #[inline]
    fn take_refund(&self, cost_ns: u64) -> u64 {
        let mut owed = self.refund_ns.load(Ordering::Relaxed);
        while owed > 0 {
            let take = owed.min(cost_ns);
            match self.refund_ns.compare_exchange_weak(
                owed,
                owed - take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(actual) => owed = actual,
            }
        }
        0
    }

    /// Charges (positive) or refunds (negative) GPU time after the fact, when
    /// a measurement shows that earlier launches cost more or less than they
    /// were charged. A charge moves the bucket at once; a refund is taken
    /// off the next launches' charges.
    pub fn charge_back(&self, delta_gpu_ns: i64, share_ppm: u32, now: u64) {
        self.busy_ns
            .fetch_add(delta_gpu_ns as u64, Ordering::Relaxed);
        self.correction_ns
            .fetch_add(delta_gpu_ns as u64, Ordering::Relaxed);
        if delta_gpu_ns < 0 {
            self.refund_ns
                .fetch_add(delta_gpu_ns.unsigned_abs(), Ordering::Relaxed);
            return;
        }
        let wall = wall_cost_ns(delta_gpu_ns as u64, share_ppm);
        let mut tat = self.tat_ns.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now).saturating_add(wall);
            match self
                .tat_ns
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => tat = actual,
            }
        }
    }

    /// Records a launch expected to take `cost_ns` of GPU time, issued at
    /// `now`: counts it and, if the tenant's previous work was expected to
    /// be done by then, records the gap as a bubble.
    #[inline]
    pub fn record_launch(&self, now: u64, cost_ns: u64) {
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.busy_ns.fetch_add(cost_ns, Ordering::Relaxed);
        let previous = self.busy_until_ns.load(Ordering::Relaxed);
        if now > previous {
            if previous != 0 {
                self.bubbles.record(now - previous);
            }
            self.busy_until_ns
                .fetch_max(now + cost_ns, Ordering::Relaxed);
        } else {
            self.busy_until_ns.fetch_add(cost_ns, Ordering::Relaxed);
        }
    }

    pub fn record_throttle(&self, waited_ns: u64) {
        self.throttled_launches.fetch_add(1, Ordering::Relaxed);
        self.throttled_ns.fetch_add(waited_ns, Ordering::Relaxed);
    }

    pub fn record_sample(&self) {
        self.sampled_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// A consistent-enough copy for readers (each counter read once).
    pub fn snapshot(&self) -> DeviceSnapshot {
        DeviceSnapshot {
            busy_ns: self.busy_ns.load(Ordering::Relaxed) as i64,
            launches: self.launches.load(Ordering::Relaxed),
            throttled_launches: self.throttled_launches.load(Ordering::Relaxed),
            throttled_ns: self.throttled_ns.load(Ordering::Relaxed),
            sampled_launches: self.sampled_launches.load(Ordering::Relaxed),
            correction_ns: self.correction_ns.load(Ordering::Relaxed) as i64,
            bubbles: self.bubbles.snapshot(),
        }
    }
}

/// Counters of one device at one instant; differences of two snapshots give
/// rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub busy_ns: i64,
    pub launches: u64,
    pub throttled_launches: u64,
    pub throttled_ns: u64,
    pub sampled_launches: u64,
    pub correction_ns: i64,
    pub bubbles: [u64; crate::histogram::BUCKETS],
}

impl TenantTelemetry {
    /// Records one request latency reported by the program.
    pub fn report_latency(&self, ns: u64) {
        self.latencies.record(ns);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.last_reporter
            .store(std::process::id() as u64, Ordering::Relaxed);
    }

    /// (count, sum in ns) of reported latencies.
    pub fn latency_totals(&self) -> (u64, u64) {
        (
            self.latency_count.load(Ordering::Relaxed),
            self.latency_sum_ns.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Region;
    use crate::sm::FULL_SHARE_PPM;

    fn telemetry() -> Region<TenantTelemetry> {
        Region::<TenantTelemetry>::anonymous(|_| {}).unwrap()
    }

    #[test]
    fn a_bucket_paces_launches_at_the_share_after_its_depth() {
        let t = telemetry();
        let dev = &t.devices[0];
        let (share, depth, now) = (250_000, 1_000_000, 10_000_000_000u64);
        // 100 µs launches at 25%: each costs 400 µs of the bucket; the
        // first depth's worth (1 ms) goes at once, then one every 400 µs.
        let mut admissions = Vec::new();
        for _ in 0..6 {
            admissions.push(dev.admit(now, 100_000, share, depth));
        }
        assert_eq!(&admissions[..3], &[Admission::Now; 3]);
        assert_eq!(admissions[3], Admission::At(now + 200_000));
        assert_eq!(admissions[4], Admission::At(now + 600_000));
        assert_eq!(admissions[5], Admission::At(now + 1_000_000));
    }

    #[test]
    fn idle_time_earns_no_more_than_the_depth() {
        let t = telemetry();
        let dev = &t.devices[1];
        let depth = 1_000_000;
        assert_eq!(dev.admit(0, 1_000_000, 500_000, depth), Admission::Now);
        // An hour later: the bucket starts from now, not from an hour of credit.
        let later = 3_600_000_000_000;
        let mut waited = 0;
        for _ in 0..10 {
            if let Admission::At(t) = dev.admit(later, 100_000, 500_000, depth) {
                waited += 1;
                assert!(t > later);
            }
        }
        // A launch goes while the debt before it is at most the depth: the
        // first with none, then five more (5 × 200 µs = 1 ms); four wait.
        assert_eq!(waited, 4);
    }

    #[test]
    fn charges_move_the_bucket_and_refunds_lower_later_charges() {
        let t = telemetry();
        let dev = &t.devices[2];
        let now = 1_000_000_000;
        dev.admit(now, 100_000, FULL_SHARE_PPM / 2, 0);
        dev.charge_back(300_000, FULL_SHARE_PPM / 2, now);
        // 100 µs + 300 µs of GPU time at 50% = 800 µs of debt.
        assert_eq!(
            dev.admit(now, 0, FULL_SHARE_PPM / 2, 0),
            Admission::At(now + 800_000)
        );
        // A refund of 150 µs: the next 100 µs launch is free, the one after
        // costs 50 µs (100 µs of bucket at 50%), never moving the bucket back.
        dev.charge_back(-150_000, FULL_SHARE_PPM / 2, now);
        let half = FULL_SHARE_PPM / 2;
        assert_eq!(
            dev.admit(now, 100_000, half, 0),
            Admission::At(now + 800_000)
        );
        assert_eq!(
            dev.admit(now, 100_000, half, 0),
            Admission::At(now + 800_000)
        );
        assert_eq!(dev.admit(now, 0, half, 0), Admission::At(now + 900_000));
        let snap = dev.snapshot();
        assert_eq!(snap.correction_ns, 300_000 - 150_000);
    }

    #[test]
    fn launches_after_the_work_ran_out_are_bubbles() {
        let t = telemetry();
        let dev = &t.devices[0];
        dev.record_launch(1_000, 500);
        dev.record_launch(1_200, 500); // queued behind: no bubble
        dev.record_launch(10_000, 500); // 8 µs after the work ended
        let snap = dev.snapshot();
        assert_eq!(snap.launches, 3);
        assert_eq!(snap.busy_ns, 1_500);
        use crate::histogram::HistogramSnapshot;
        assert_eq!(snap.bubbles.total(), 1);
        assert_eq!(snap.bubbles.quantile_upper_ns(1.0), Some(8191));
    }
}
