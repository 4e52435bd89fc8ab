//! How much of its time a process spends honouring other processes' holds
//! (a quiet sample's, a primary's sample): a limit per device, so a member
//! asked to stand aside too often goes on launching.

use dilu_layout::ledger::MAX_DEVICES;
use std::sync::atomic::{AtomicU64, Ordering};

/// Hold time honoured per device, at most `ppm` of the time and
/// `depth_ns` more at once: GCRA's theoretical arrival time. Not a
/// `dilu_layout::bucket::TokenBucket`: its `admit` charges before it
/// answers, and an ignored hold must cost nothing.
pub(crate) struct HonouredHolds {
    tat: [AtomicU64; MAX_DEVICES],
    ppm: u32,
    depth_ns: u64,
}

impl HonouredHolds {
    pub(crate) const fn new(ppm: u32, depth_ns: u64) -> Self {
        Self {
            tat: [const { AtomicU64::new(0) }; MAX_DEVICES],
            ppm,
            depth_ns,
        }
    }

    /// Whether `device`'s budget for holds has room at `now_ns`.
    pub(crate) fn may_honour(&self, device: usize, now_ns: u64) -> bool {
        self.tat[device]
            .load(Ordering::Relaxed)
            .saturating_sub(self.depth_ns)
            <= now_ns
    }

    /// Charges `idle_ns` of honoured hold, ending at `now_ns`, to
    /// `device`'s budget.
    pub(crate) fn charge(&self, device: usize, now_ns: u64, idle_ns: u64) {
        let cost = idle_ns.saturating_mul(1_000_000) / u64::from(self.ppm.max(1));
        let tat = &self.tat[device];
        let mut current = tat.load(Ordering::Relaxed);
        while let Err(actual) = tat.compare_exchange_weak(
            current,
            current.max(now_ns - idle_ns).saturating_add(cost),
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            current = actual;
        }
    }
}
