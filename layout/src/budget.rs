//! A tenant's budget region ([`TenantBudget`]): the share of each device's
//! time its processes may use, in parts per million, the depth of its token
//! bucket, and (under the node manager) its memory budget per device. Its
//! file keeps the suffix `.sm` and its magic "diluSM" from when it held
//! shares only.
//!
//! One writer changes it (the node manager, or in standalone mode the
//! tenant's first process from its configuration, or an operator's tool);
//! tenants read it at every launch and every allocation, so a change takes
//! effect at the next one. Under the node manager tenants map it read-only
//! (a sealed memfd, see [`crate::memfd`]): neither the SM share nor the
//! memory budget can be raised by the tenant. In standalone mode the memory
//! budget lives in the tenant's ledger instead and
//! [`TenantBudget::mem_budget`] stays unused.

use crate::MAX_DEVICES;
use crate::ledger::UNLIMITED;
use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Parts per million of a device's time: the whole device.
pub const FULL_SHARE_PPM: u32 = 1_000_000;
/// Share value meaning "not limited".
pub const UNLIMITED_SHARE: u32 = u32::MAX;
/// Default bucket depth: how far (in wall-clock time) a tenant may run
/// ahead of its share after being idle. It bounds a burst to
/// `share × depth` of GPU time and the error of any window to
/// `depth / window`.
pub const DEFAULT_DEPTH_NS: u64 = 5_000_000;

#[repr(C)]
pub struct TenantBudget {
    magic: AtomicU64,
    /// Bumped on every change, so readers can tell that something moved.
    generation: AtomicU64,
    share_ppm: [AtomicU32; MAX_DEVICES],
    depth_ns: AtomicU64,
    /// The process that wrote the budget from its configuration (standalone
    /// mode) or the node manager; 0 when nobody has claimed it.
    /// One word: pid << 32 | low 32 bits of its start time.
    writer: AtomicU64,
    /// Memory budget per device in bytes ([`UNLIMITED`]: none), written by
    /// the node manager (v2). Standalone tenants keep theirs in the ledger.
    mem_budget: [AtomicU64; MAX_DEVICES],
    /// Most device time the tenant may have queued ahead of a launch on
    /// each device (ns; 0: no bound), written by the node manager for a
    /// batch tenant sharing its GPU with a latency tenant (v3): see
    /// [`TenantBudget::queue_bound_ns`].
    queue_bound_ns: [AtomicU64; MAX_DEVICES],
}

// SAFETY: repr(C), atomics and padding only; all-zero is "share 0 and no
// memory on every device", which the creator overwrites before publishing
// the magic.
unsafe impl SharedLayout for TenantBudget {
    const MAGIC: u64 = 0x6469_6c75_534d_0003; // "diluSM" v3 (v2: memory budget; v3: queue bound)
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

impl TenantBudget {
    /// The share of `device` in ppm, or [`UNLIMITED_SHARE`].
    #[inline]
    pub fn share_ppm(&self, device: usize) -> u32 {
        self.share_ppm[device].load(Ordering::Relaxed)
    }

    #[inline]
    pub fn depth_ns(&self) -> u64 {
        self.depth_ns.load(Ordering::Relaxed)
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Writer side: sets the share of `device` (ppm, or [`UNLIMITED_SHARE`];
    /// values at or above [`FULL_SHARE_PPM`] mean the whole device).
    pub fn set_share_ppm(&self, device: usize, ppm: u32) {
        self.share_ppm[device].store(ppm, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Writer side: sets the share of `device` as a percentage (0–100).
    pub fn set_share_percent(&self, device: usize, percent: f64) {
        let ppm = (percent.clamp(0.0, 100.0) * 10_000.0).round() as u32;
        self.set_share_ppm(device, ppm);
    }

    /// Writer side: sets the bucket depth (wall-clock ns).
    pub fn set_depth_ns(&self, depth_ns: u64) {
        self.depth_ns.store(depth_ns, Ordering::Relaxed);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// How much device time the tenant may have queued on `device` ahead of
    /// a launch (ns; 0: no bound). A GPU time-slices between processes, so
    /// a latency tenant that wakes up beside a batch tenant waits for the
    /// batch tenant's queue, however small the batch tenant's share
    /// becomes a period later: its queued kernels are on the device
    /// already. Bounded, the wait is at most the bound and one kernel.
    #[inline]
    pub fn queue_bound_ns(&self, device: usize) -> u64 {
        self.queue_bound_ns[device].load(Ordering::Relaxed)
    }

    /// Writer side: sets the queue bound of `device` (ns; 0: none).
    /// Written every period: a store (and a generation) only on a change.
    pub fn set_queue_bound_ns(&self, device: usize, bound_ns: u64) {
        if self.queue_bound_ns[device].load(Ordering::Relaxed) != bound_ns {
            self.queue_bound_ns[device].store(bound_ns, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// The memory budget of `device` in bytes, or [`UNLIMITED`].
    #[inline]
    pub fn mem_budget(&self, device: usize) -> u64 {
        self.mem_budget[device].load(Ordering::Acquire)
    }

    /// The memory budget that binds a tenant on `device`: `own`, its limit
    /// in its ledger ([`UNLIMITED`] where none), lowered by this one, the
    /// node manager's. The interposer refuses allocations past it and the
    /// node manager reports and audits against it: one rule for both.
    #[inline]
    pub fn binding_mem_budget(&self, own: u64, device: usize) -> u64 {
        own.min(self.mem_budget(device))
    }

    /// Writer side: sets the memory budget of `device` (bytes, or
    /// [`UNLIMITED`]). Reservations already granted stay; later ones are
    /// held to the new value.
    pub fn set_mem_budget(&self, device: usize, bytes: u64) {
        self.mem_budget[device].store(bytes, Ordering::Release);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Writer side: sets every device's memory budget (`None`: unlimited).
    pub fn set_mem_budget_all(&self, bytes: Option<u64>) {
        let bytes = bytes.unwrap_or(UNLIMITED);
        for device in 0..MAX_DEVICES {
            if self.mem_budget(device) != bytes {
                self.set_mem_budget(device, bytes);
            }
        }
    }

    /// Who wrote the budget: (pid, low 32 bits of its start time), if
    /// anyone claimed it.
    pub fn writer(&self) -> Option<(i32, u64)> {
        let word = self.writer.load(Ordering::Acquire);
        (word != 0).then_some(((word >> 32) as i32, word & 0xffff_ffff))
    }

    /// Claims the writer role for (pid, start time) if it is free or its
    /// holder is gone (`alive(pid, start_time_low32)` says). Returns whether
    /// this caller holds it.
    pub fn claim_writer(
        &self,
        pid: i32,
        start_time: u64,
        alive: impl Fn(i32, u64) -> bool,
    ) -> bool {
        let mine = (pid as u32 as u64) << 32 | (start_time & 0xffff_ffff);
        let current = self.writer.load(Ordering::Acquire);
        if current == mine {
            return true;
        }
        if current != 0 && alive((current >> 32) as i32, current & 0xffff_ffff) {
            return false;
        }
        self.writer
            .compare_exchange(current, mine, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// GPU time worth `cost_ns` of device time at `share_ppm`, in wall-clock
/// time of the tenant's bucket: `cost / share`. A zero share has no such
/// time (the bucket pauses instead, see [`crate::bucket`]); the huge value
/// returned for it is only a guard.
#[inline]
pub fn wall_cost_ns(cost_ns: u64, share_ppm: u32) -> u64 {
    if share_ppm == 0 {
        return u64::MAX / 4;
    }
    mul_div(cost_ns, u64::from(FULL_SHARE_PPM), u64::from(share_ppm)).min(u64::MAX as u128 / 4)
        as u64
}

/// `a * b / c` (`c` > 0) without overflow: in 64 bits where the product
/// fits (one hardware division, not a call to the 128-bit one; the
/// launch path's charges), in 128 bits otherwise. The same quotient either
/// way.
#[inline]
pub(crate) fn mul_div(a: u64, b: u64, c: u64) -> u128 {
    match a.checked_mul(b) {
        Some(product) => u128::from(product / c),
        None => mul_div_wide(a, b, c),
    }
}

/// [`mul_div`] in 128 bits, out of line: inlined, a division by a constant
/// is free of side effects to the compiler, which then made the call to
/// the 128-bit division on every bucket visit and kept one quotient of the
/// two (about 20 instructions a visit more, `scripts/launch-instructions.sh`
/// with leases off).
#[cold]
#[inline(never)]
fn mul_div_wide(a: u64, b: u64, c: u64) -> u128 {
    u128::from(a) * u128::from(b) / u128::from(c)
}

/// Whether a share limits anything.
#[inline]
pub fn is_limited(share_ppm: u32) -> bool {
    share_ppm < FULL_SHARE_PPM
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Region;

    #[test]
    fn charges_are_the_same_in_64_and_128_bits() {
        let exact = |a: u64, b: u64, c: u64| u128::from(a) * u128::from(b) / u128::from(c);
        for (a, b, c) in [
            (3_800, 1_000_000, 990_000),
            (20_000, 1_000_000, 1),
            (u64::MAX / 1_000_000, 1_000_000, 7),
            (u64::MAX / 1_000_000 + 1, 1_000_000, 7),
            (u64::MAX, u64::MAX, 3),
            (0, u64::MAX, 1),
        ] {
            assert_eq!(mul_div(a, b, c), exact(a, b, c), "{a} * {b} / {c}");
        }
        // A launch of 3 ms at 30% costs 10 ms of the bucket; beyond
        // u64 the cost stays at the guard.
        assert_eq!(wall_cost_ns(3_000_000, 300_000), 10_000_000);
        assert_eq!(wall_cost_ns(u64::MAX, 1), u64::MAX / 4);
    }

    #[test]
    fn the_lower_of_the_tenants_limit_and_the_node_managers_binds() {
        const GIB: u64 = 1 << 30;
        let budget = Region::<TenantBudget>::anonymous(|b| {
            for d in 0..MAX_DEVICES {
                b.set_mem_budget(d, UNLIMITED);
            }
        })
        .unwrap();
        assert_eq!(budget.binding_mem_budget(UNLIMITED, 0), UNLIMITED);
        assert_eq!(budget.binding_mem_budget(4 * GIB, 0), 4 * GIB);
        budget.set_mem_budget(0, 2 * GIB);
        assert_eq!(budget.binding_mem_budget(4 * GIB, 0), 2 * GIB);
        assert_eq!(budget.binding_mem_budget(UNLIMITED, 0), 2 * GIB);
        assert_eq!(budget.binding_mem_budget(GIB, 0), GIB);
        assert_eq!(budget.binding_mem_budget(4 * GIB, 1), 4 * GIB, "per device");
    }

    #[test]
    fn shares_and_writer_claims() {
        let budget = Region::<TenantBudget>::anonymous(|b| {
            for d in 0..MAX_DEVICES {
                b.set_share_ppm(d, UNLIMITED_SHARE);
            }
        })
        .unwrap();
        assert!(!is_limited(budget.share_ppm(3)));
        let before = budget.generation();
        budget.set_share_percent(0, 30.0);
        assert_eq!(budget.share_ppm(0), 300_000);
        assert!(is_limited(budget.share_ppm(0)));
        assert!(budget.generation() > before);
        assert_eq!(wall_cost_ns(100_000, 300_000), 333_333);
        assert_eq!(wall_cost_ns(100_000, FULL_SHARE_PPM), 100_000);

        let dead = |_pid: i32, _start: u64| false;
        let alive = |_pid: i32, _start: u64| true;
        assert!(budget.claim_writer(10, 1, alive));
        assert!(!budget.claim_writer(11, 1, alive), "held by a live writer");
        assert!(
            budget.claim_writer(11, 2, dead),
            "taken over from a dead one"
        );
        assert_eq!(budget.writer(), Some((11, 2)));

        let before = budget.generation();
        budget.set_mem_budget_all(Some(64 << 20));
        assert_eq!(budget.mem_budget(MAX_DEVICES - 1), 64 << 20);
        assert!(budget.generation() > before);
        budget.set_mem_budget_all(None);
        assert_eq!(budget.mem_budget(0), UNLIMITED);
    }
}
