//! The region every process of a tenant writes while it runs
//! ([`TenantActivity`]), in memory the node manager can read without
//! stopping them. It holds two different things:
//!
//! - the SM-time token bucket of each device ([`TenantActivity::buckets`],
//!   see [`crate::bucket`]): enforcement state, which every launch updates
//!   and a tenant that writes it can only hurt itself with;
//! - telemetry, advisory (a tenant's own claim, see `THREAT_MODEL.md`, which
//!   the node manager cross-checks where it can): per device
//!   ([`DeviceTelemetry`]) launch counters and the bubble histogram, per
//!   tenant the sync-to-sync intervals and reported request latencies.
//!
//! Its standalone file is still `<tenant>.telemetry` (the region's earlier
//! name; layout and magic did not change with the name).

use crate::MAX_DEVICES;
use crate::bucket::TokenBucket;
use crate::histogram::Log2Histogram;
use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU64, Ordering};

/// The advisory counters of one device.
#[repr(C)]
pub struct DeviceTelemetry {
    /// When the tenant's work launched so far is expected to finish on the
    /// device (for bubbles: a launch after this instant follows a gap).
    busy_until_ns: AtomicU64,
    /// GPU time charged: estimates at launch plus measured corrections.
    busy_ns: AtomicU64,
    launches: AtomicU64,
    /// Launches that had to wait for tokens, and the wall time they waited.
    throttled_launches: AtomicU64,
    throttled_ns: AtomicU64,
    /// Launches timed with events, and the correction they brought
    /// (signed, two's complement).
    sampled_launches: AtomicU64,
    correction_ns: AtomicU64,
    /// Gaps between the tenant's kernels (device idle for this tenant).
    pub bubbles: Log2Histogram,
    /// Which of the node's GPUs this device is, as the tenant's processes
    /// found it (see [`NodeGpu`]): NVML index + 1, 0 while none said,
    /// [`MIXED_GPUS`] once two processes said different GPUs.
    node_gpu: AtomicU64,
}

/// What [`DeviceTelemetry::node_gpu`] holds once two processes of a tenant
/// named different GPUs for the same device ordinal (each chose its own
/// with `CUDA_VISIBLE_DEVICES`).
pub const MIXED_GPUS: u64 = u64::MAX;

/// Which node GPU a tenant's device is, as its processes published it. A
/// tenant's claim: the node manager checks it against the GPUs it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeGpu {
    /// No process said (yet).
    Unknown,
    /// NVML index.
    Gpu(u32),
    /// Processes of the tenant use different GPUs under this ordinal.
    Mixed,
}

/// A tenant's activity region: its SM-time buckets and its telemetry (see
/// the module documentation).
#[repr(C)]
pub struct TenantActivity {
    magic: AtomicU64,
    /// Pid of the last process that reported anything (diagnostics).
    last_reporter: AtomicU64,
    /// The SM-time token bucket of each device (enforcement state, on
    /// cache lines of its own).
    pub buckets: [TokenBucket; MAX_DEVICES],
    pub devices: [DeviceTelemetry; MAX_DEVICES],
    /// Intervals between successive synchronisations of a thread (the
    /// latency proxy for programs that report nothing).
    pub sync_intervals: Log2Histogram,
    /// Request latencies reported with `dilu_report_latency`.
    pub latencies: Log2Histogram,
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
    /// Non-zero once a process of the tenant is a co-location primary (its
    /// launches are protected per launch by the gap board, so the node
    /// manager may lend its guarantee while its latency has slack). A
    /// tenant's own claim, which can only lend away its own guarantee.
    colo_primary: AtomicU64,
    /// Threads of the tenant's processes now inside a synchronising driver
    /// call (`cuCtxSynchronize`, `cuStreamSynchronize`,
    /// `cuEventSynchronize`): waiting on work they queued, so at work
    /// though launching nothing (a training step's sync can outlast the
    /// node manager's notion of a recent launch). A tenant's own claim: at
    /// most it keeps a share it can only use by launching.
    syncing: AtomicU64,
}

// SAFETY: repr(C), atomics only; all-zero is "nothing recorded".
unsafe impl SharedLayout for TenantActivity {
    const MAGIC: u64 = 0x6469_6c75_5445_4c06; // "diluTEL" v6 (v2: buckets apart; v3: skips, tenant key; v4: co-location primary; v5: threads in a sync; v6: node GPU per device)
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

impl DeviceTelemetry {
    /// Counts a correction of GPU time charged earlier (positive: the
    /// launches cost more than charged), as a measurement settles it.
    pub fn record_correction(&self, delta_gpu_ns: i64) {
        self.busy_ns
            .fetch_add(delta_gpu_ns as u64, Ordering::Relaxed);
        self.correction_ns
            .fetch_add(delta_gpu_ns as u64, Ordering::Relaxed);
    }

    /// Records a launch expected to take `cost_ns` of GPU time, issued at
    /// `now`: counts it and, if the tenant's previous work was expected to
    /// be done by then, records the gap as a bubble.
    #[inline]
    pub fn record_launch(&self, now: u64, cost_ns: u64) {
        self.record_launches(now, cost_ns, 1);
    }

    /// [`record_launch`](Self::record_launch) for a launch that also counts
    /// `launches - 1` launches charged ahead (the process's lease, see the
    /// interposer's `launch_lease`, counted when a launch next visits the
    /// bucket): one add on the count for all of them.
    #[inline]
    pub fn record_launches(&self, now: u64, cost_ns: u64, launches: u64) {
        self.launches.fetch_add(launches, Ordering::Relaxed);
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

    /// Device time the tenant's launches so far are expected to keep the
    /// device busy after `now` (by their estimates; 0 when none is left).
    #[inline]
    pub fn queued_ns(&self, now: u64) -> u64 {
        self.busy_until_ns
            .load(Ordering::Relaxed)
            .saturating_sub(now)
    }

    pub fn record_throttle(&self, waited_ns: u64) {
        self.throttled_launches.fetch_add(1, Ordering::Relaxed);
        self.throttled_ns.fetch_add(waited_ns, Ordering::Relaxed);
    }

    /// Adds time a launch has waited so far, while it still waits (its
    /// [`record_throttle`](Self::record_throttle) comes when it goes): the
    /// node manager sees the demand of a launch that may wait long.
    pub fn record_waiting(&self, waited_ns: u64) {
        self.throttled_ns.fetch_add(waited_ns, Ordering::Relaxed);
    }

    pub fn record_sample(&self) {
        self.sampled_launches.fetch_add(1, Ordering::Relaxed);
    }

    /// GPU time charged, launches and wall time waited: three counters one
    /// of which moves whenever the tenant launches or waits (cheap to read
    /// every period, unlike a [`snapshot`](Self::snapshot)).
    pub fn pulse(&self) -> [u64; 3] {
        [
            self.busy_ns.load(Ordering::Relaxed),
            self.launches.load(Ordering::Relaxed),
            self.throttled_ns.load(Ordering::Relaxed),
        ]
    }

    /// Publishes that this device is the node's GPU `nvml_index` (once per
    /// process, when it first launches). A second process naming another
    /// GPU makes it [`NodeGpu::Mixed`] for good.
    pub fn publish_node_gpu(&self, nvml_index: u32) {
        let mine = u64::from(nvml_index) + 1;
        if let Err(seen) =
            self.node_gpu
                .compare_exchange(0, mine, Ordering::Relaxed, Ordering::Relaxed)
            && seen != mine
        {
            self.node_gpu.store(MIXED_GPUS, Ordering::Relaxed);
        }
    }

    /// Which node GPU the tenant's processes said this device is.
    pub fn node_gpu(&self) -> NodeGpu {
        match self.node_gpu.load(Ordering::Relaxed) {
            0 => NodeGpu::Unknown,
            MIXED_GPUS => NodeGpu::Mixed,
            plus_one => u32::try_from(plus_one - 1).map_or(NodeGpu::Mixed, NodeGpu::Gpu),
        }
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

impl TenantActivity {
    /// Records one request latency reported by the program.
    pub fn report_latency(&self, ns: u64) {
        self.latencies.record(ns);
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.last_reporter
            .store(std::process::id() as u64, Ordering::Relaxed);
    }

    /// A process of the tenant is its GPU's co-location primary.
    pub fn mark_colo_primary(&self) {
        self.colo_primary.store(1, Ordering::Relaxed);
    }

    pub fn is_colo_primary(&self) -> bool {
        self.colo_primary.load(Ordering::Relaxed) != 0
    }

    /// A thread enters a synchronising call (pair with
    /// [`sync_ended`](Self::sync_ended)).
    pub fn sync_began(&self) {
        self.syncing.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread left the synchronising call it entered.
    pub fn sync_ended(&self) {
        // Never below zero: a count left high by a process that died in a
        // sync is not undone by another's exit going under it.
        let _ = self
            .syncing
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Whether a thread of the tenant is inside a synchronising call now.
    pub fn in_sync(&self) -> bool {
        self.syncing.load(Ordering::Relaxed) != 0
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

    fn activity() -> Region<TenantActivity> {
        Region::<TenantActivity>::anonymous(|_| {}).unwrap()
    }

    #[test]
    fn corrections_count_into_busy_time() {
        let t = activity();
        let dev = &t.devices[2];
        dev.record_launch(1_000, 100_000);
        dev.record_correction(300_000);
        dev.record_correction(-150_000);
        let snap = dev.snapshot();
        assert_eq!(snap.correction_ns, 150_000);
        assert_eq!(snap.busy_ns, 250_000);
    }

    #[test]
    fn launches_after_the_work_ran_out_are_bubbles() {
        let t = activity();
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

    #[test]
    fn launches_a_lease_paid_for_are_counted_with_the_next_visit() {
        let t = activity();
        let dev = &t.devices[1];
        // A lease of 20 µs, then five launches it paid for, counted with
        // the launch that takes the next one.
        dev.record_launch(1_000, 20_000);
        dev.record_launches(30_000, 20_000, 1 + 5);
        let snap = dev.snapshot();
        assert_eq!(snap.launches, 7);
        assert_eq!(snap.busy_ns, 40_000);
        use crate::histogram::HistogramSnapshot;
        assert_eq!(snap.bubbles.total(), 1, "the lease's work ran out at 21 µs");
    }

    #[test]
    fn a_device_is_the_gpu_its_processes_name_unless_they_disagree() {
        let t = activity();
        let dev = &t.devices[1];
        assert_eq!(dev.node_gpu(), NodeGpu::Unknown);
        dev.publish_node_gpu(0);
        assert_eq!(dev.node_gpu(), NodeGpu::Gpu(0), "index 0 is a GPU");
        dev.publish_node_gpu(0);
        assert_eq!(dev.node_gpu(), NodeGpu::Gpu(0), "the same again");
        dev.publish_node_gpu(3);
        assert_eq!(dev.node_gpu(), NodeGpu::Mixed);
        dev.publish_node_gpu(0);
        assert_eq!(dev.node_gpu(), NodeGpu::Mixed, "for good");
        assert_eq!(t.devices[0].node_gpu(), NodeGpu::Unknown, "per device");
    }

    #[test]
    fn a_tenant_is_in_a_sync_while_any_thread_is() {
        let t = activity();
        assert!(!t.in_sync());
        t.sync_began();
        t.sync_began();
        t.sync_ended();
        assert!(t.in_sync(), "one thread still waits");
        t.sync_ended();
        assert!(!t.in_sync());
        t.sync_ended(); // an unmatched exit does not wrap the count
        assert!(!t.in_sync());
        t.sync_began();
        assert!(t.in_sync());
    }
}
