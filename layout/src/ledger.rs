//! The tenant memory ledger: one per tenant, shared by all its processes.
//!
//! Every allocation of every process of a tenant reserves its bytes here
//! with one compare-and-swap on the device's `used` word, so concurrent
//! processes can never overcommit (no check-then-add window, no lock).
//! Each process also records its own usage in a slot, so that the usage of
//! a process that dies without cleaning up (SIGKILL) can be given back by
//! whoever notices first. Slots are never moved or compacted.

use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

pub use crate::MAX_DEVICES;
pub const MAX_PROCESSES: usize = 256;
/// Budget value meaning "no limit on this device".
pub const UNLIMITED: u64 = u64::MAX;

/// Slot states besides a live pid (> 0).
const SLOT_FREE: i32 = 0;
const SLOT_BUSY: i32 = -1; // being claimed or reclaimed

#[repr(C)]
pub struct ProcessSlot {
    pid: AtomicI32,
    _pad: u32,
    /// Kernel start time of the process (`/proc/<pid>/stat` field 22), so a
    /// reused pid is not mistaken for the original process.
    start_time: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
pub struct TenantLedger {
    magic: AtomicU64,
    budget: [AtomicU64; MAX_DEVICES],
    used: [AtomicU64; MAX_DEVICES],
    peak: [AtomicU64; MAX_DEVICES],
    refusals: AtomicU64,
    members: AtomicU32,
    /// The member that scans for dead members on everyone's behalf (0 =
    /// none): one scanner per tenant instead of one per process.
    scanner_pid: AtomicI32,
    slots: [ProcessSlot; MAX_PROCESSES],
}

// SAFETY: repr(C), atomics and padding only; all-zero is "no budget set yet".
unsafe impl SharedLayout for TenantLedger {
    const MAGIC: u64 = 0x6469_6c75_4c45_4402; // "diluLED" v2
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub device: usize,
    pub requested: u64,
    pub used: u64,
    pub budget: u64,
}

/// A process's claim on a slot; its index is what the process writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotId(usize);

impl SlotId {
    /// The slot's index (what a process keeps to find its slot again).
    pub fn index(self) -> usize {
        self.0
    }

    /// Rebuilds a slot id from [`SlotId::index`]. Out-of-range indices are
    /// clamped, so a corrupt value can never index outside the ledger.
    pub fn from_index(index: usize) -> Self {
        SlotId(index.min(MAX_PROCESSES - 1))
    }
}

impl TenantLedger {
    /// Sets the budget of `device` (bytes, or [`UNLIMITED`]).
    pub fn set_budget(&self, device: usize, bytes: u64) {
        self.budget[device].store(bytes, Ordering::Release);
    }

    pub fn budget(&self, device: usize) -> u64 {
        self.budget[device].load(Ordering::Acquire)
    }

    pub fn used(&self, device: usize) -> u64 {
        self.used[device].load(Ordering::Acquire)
    }

    /// Highest `used` ever reached on `device`.
    pub fn peak(&self, device: usize) -> u64 {
        self.peak[device].load(Ordering::Relaxed)
    }

    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` on `device` for the process holding `slot`, or
    /// refuses if that would take the tenant over its budget.
    pub fn try_reserve(&self, slot: SlotId, device: usize, bytes: u64) -> Result<(), Refusal> {
        self.try_reserve_within(slot, device, bytes, self.budget(device))
    }

    /// [`TenantLedger::try_reserve`] against a budget kept elsewhere (the
    /// node manager's read-only region) instead of the ledger's own word.
    pub fn try_reserve_within(
        &self,
        slot: SlotId,
        device: usize,
        bytes: u64,
        budget: u64,
    ) -> Result<(), Refusal> {
        let mut used = self.used[device].load(Ordering::Relaxed);
        loop {
            let wanted = used.checked_add(bytes).filter(|&w| w <= budget);
            let Some(wanted) = wanted else {
                self.refusals.fetch_add(1, Ordering::Relaxed);
                return Err(Refusal {
                    device,
                    requested: bytes,
                    used,
                    budget,
                });
            };
            match self.used[device].compare_exchange_weak(
                used,
                wanted,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.peak[device].fetch_max(wanted, Ordering::Relaxed);
                    // Tenant total first, then the slot: if the process dies
                    // between the two, the bytes stay charged (never over budget).
                    self.slots[slot.0].used[device].fetch_add(bytes, Ordering::Release);
                    return Ok(());
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Returns bytes reserved earlier by the same slot.
    pub fn release(&self, slot: SlotId, device: usize, bytes: u64) {
        self.slots[slot.0].used[device].fetch_sub(bytes, Ordering::Release);
        self.used[device].fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Claims a free slot for `pid`. Returns `None` when all are taken.
    pub fn join(&self, pid: i32, start_time: u64) -> Option<SlotId> {
        for (index, slot) in self.slots.iter().enumerate() {
            if slot
                .pid
                .compare_exchange(SLOT_FREE, SLOT_BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                slot.start_time.store(start_time, Ordering::Relaxed);
                for used in &slot.used {
                    used.store(0, Ordering::Relaxed);
                }
                slot.pid.store(pid, Ordering::Release);
                self.members.fetch_add(1, Ordering::Relaxed);
                return Some(SlotId(index));
            }
        }
        None
    }

    /// Gives back everything `slot` still holds and frees the slot (normal
    /// process exit).
    pub fn leave(&self, slot: SlotId) {
        let entry = &self.slots[slot.0];
        let pid = entry.pid.load(Ordering::Acquire);
        if pid > 0
            && entry
                .pid
                .compare_exchange(pid, SLOT_BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            self.empty_slot(entry);
        }
    }

    fn empty_slot(&self, entry: &ProcessSlot) {
        for (device, used) in entry.used.iter().enumerate() {
            let bytes = used.swap(0, Ordering::AcqRel);
            if bytes > 0 {
                self.used[device].fetch_sub(bytes, Ordering::AcqRel);
            }
        }
        self.members.fetch_sub(1, Ordering::Relaxed);
        entry.pid.store(SLOT_FREE, Ordering::Release);
    }

    /// Live member processes as (pid, start time).
    pub fn members(&self) -> Vec<(i32, u64)> {
        self.slots
            .iter()
            .filter_map(|s| {
                let pid = s.pid.load(Ordering::Acquire);
                (pid > 0).then(|| (pid, s.start_time.load(Ordering::Relaxed)))
            })
            .collect()
    }

    /// Whether `pid` is (now) the tenant's scanner: it already was, or the
    /// role was free or held by a process `exists` says is gone, and this
    /// call took it.
    pub fn take_scanner_role(&self, pid: i32, exists: impl Fn(i32) -> bool) -> bool {
        let current = self.scanner_pid.load(Ordering::Acquire);
        if current == pid {
            return true;
        }
        if current > 0 && exists(current) {
            return false;
        }
        self.scanner_pid
            .compare_exchange(current, pid, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the scanner role up if `pid` holds it (at exit).
    pub fn drop_scanner_role(&self, pid: i32) {
        let _ = self
            .scanner_pid
            .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Whether any member is alive by `is_alive(pid, start_time)`; stops at
    /// the first live one (a process joining a running tenant pays one
    /// check, not one per member).
    pub fn any_member_alive(&self, is_alive: impl Fn(i32, u64) -> bool) -> bool {
        self.slots.iter().any(|s| {
            let pid = s.pid.load(Ordering::Acquire);
            pid > 0 && is_alive(pid, s.start_time.load(Ordering::Relaxed))
        })
    }

    /// Bytes a member process holds on `device`.
    pub fn member_used(&self, pid: i32, device: usize) -> u64 {
        self.slots
            .iter()
            .filter(|s| s.pid.load(Ordering::Acquire) == pid)
            .map(|s| s.used[device].load(Ordering::Relaxed))
            .sum()
    }

    /// Frees the slots of processes that `is_alive(pid, start_time)` says are
    /// gone, returning their usage to the tenant. Safe to run from several
    /// processes at once: each dead slot is emptied exactly once. Returns the
    /// number of slots reclaimed.
    pub fn reclaim_dead(&self, is_alive: impl Fn(i32, u64) -> bool) -> usize {
        let mut reclaimed = 0;
        for entry in &self.slots {
            let pid = entry.pid.load(Ordering::Acquire);
            if pid <= 0 || is_alive(pid, entry.start_time.load(Ordering::Relaxed)) {
                continue;
            }
            if entry
                .pid
                .compare_exchange(pid, SLOT_BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                self.empty_slot(entry);
                reclaimed += 1;
            }
        }
        reclaimed
    }
}

/// The kernel's start time of `pid` (clock ticks since boot), or `None` if
/// no such process exists. Together with the pid it names one process.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; fields resume after ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 is the first after the name; start time is field 22.
    after_name.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether a process with this pid exists (one `kill(pid, 0)`, no file
/// read). Cheaper than [`process_alive`] but blind to pid reuse and counts a
/// zombie as existing.
pub fn process_exists(pid: i32, _start_time: u64) -> bool {
    // SAFETY: signal 0 only checks that the pid exists and may be signalled.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}

/// Whether the process (pid, start time) is still running (a zombie counts
/// as gone: its memory is no longer in use).
pub fn process_alive(pid: i32, start_time: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(close) = stat.rfind(')') else {
        return false;
    };
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next();
    let started = fields.nth(22 - 4).and_then(|f| f.parse::<u64>().ok());
    state != Some("Z") && state != Some("X") && started == Some(start_time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Region;
    use std::sync::Arc;

    fn ledger(tag: &str) -> (Region<TenantLedger>, std::path::PathBuf) {
        let path =
            std::env::temp_dir().join(format!("dilu-ledger-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let region = Region::<TenantLedger>::open_or_create(&path, 0o600, |l| {
            for device in 0..MAX_DEVICES {
                l.set_budget(device, UNLIMITED);
            }
        })
        .expect("create ledger");
        (region, path)
    }

    #[test]
    fn reservations_never_exceed_the_budget_under_contention() {
        let (region, path) = ledger("contention");
        let region = Arc::new(region);
        region.set_budget(0, 1_000_000);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let region = region.clone();
                std::thread::spawn(move || {
                    let slot = region.join(10_000 + t, 1).expect("slot");
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7919 + t as u64 * 104_729) % 200_000;
                        if region.try_reserve(slot, 0, size).is_ok() {
                            held.push(size);
                        }
                        if held.len() > 10 {
                            region.release(slot, 0, held.remove(0));
                        }
                    }
                    for size in held {
                        region.release(slot, 0, size);
                    }
                    region.leave(slot);
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(
            region.peak(0) <= 1_000_000,
            "peak {} over budget",
            region.peak(0)
        );
        assert!(
            region.peak(0) > 900_000,
            "contention test never came near the budget"
        );
        assert_eq!(region.used(0), 0);
        assert!(region.refusals() > 0);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_dead_member_is_reclaimed_once() {
        let (region, path) = ledger("reclaim");
        region.set_budget(1, 100);
        let dead = region.join(4242, 7).unwrap();
        let live = region.join(4343, 9).unwrap();
        region.try_reserve(dead, 1, 60).unwrap();
        region.try_reserve(live, 1, 30).unwrap();
        assert!(region.try_reserve(live, 1, 20).is_err());
        let alive = |pid: i32, _start: u64| pid == 4343;
        assert_eq!(region.reclaim_dead(alive), 1);
        assert_eq!(
            region.reclaim_dead(alive),
            0,
            "a slot must be reclaimed only once"
        );
        assert_eq!(region.used(1), 30);
        region.try_reserve(live, 1, 70).unwrap();
        assert_eq!(region.members(), vec![(4343, 9)]);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_budget_kept_elsewhere_ignores_the_ledgers_own_word() {
        let (region, path) = ledger("within");
        let slot = region.join(4444, 1).unwrap();
        // The ledger's word says unlimited; the outside budget says 100.
        region.try_reserve_within(slot, 0, 60, 100).unwrap();
        let refusal = region.try_reserve_within(slot, 0, 60, 100).unwrap_err();
        assert_eq!((refusal.used, refusal.budget), (60, 100));
        region.try_reserve_within(slot, 0, 40, 100).unwrap();
        assert_eq!(region.used(0), 100);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn pid_reuse_is_not_mistaken_for_the_original_process() {
        let me = std::process::id() as i32;
        let started = process_start_time(me).expect("own start time");
        assert!(process_alive(me, started));
        assert!(
            !process_alive(me, started + 1),
            "same pid, different start time"
        );
        assert!(!process_alive(i32::MAX - 1, 0));
    }

    #[test]
    fn a_second_opener_sees_the_creators_budget() {
        let (region, path) = ledger("reopen");
        region.set_budget(0, 12345);
        let again =
            Region::<TenantLedger>::open_or_create(&path, 0o600, |_| panic!("not the creator"))
                .unwrap();
        assert!(!again.created());
        assert_eq!(again.budget(0), 12345);
        let _ = std::fs::remove_file(path);
    }

    proptest::proptest! {
        /// Whatever a tenant writes into its ledger file (any bytes, any
        /// length, with the magic or without), the daemon's copy of it is
        /// a region or an error, and every figure the daemon reads from a
        /// copy answers (no panic: it runs under the daemon's lock).
        #[test]
        fn any_ledger_file_is_copied_or_refused_and_read_without_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..(std::mem::size_of::<TenantLedger>() + 64)),
            keep_magic in proptest::bool::ANY,
            fill in proptest::num::u8::ANY,
        ) {
            let dir = std::env::temp_dir().join(format!("dilu-ledger-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("fuzz.ledger");
            let mut bytes = bytes;
            if keep_magic {
                // Long enough to be a region, magic in place, the rest noise.
                bytes.resize(std::mem::size_of::<TenantLedger>(), fill);
                bytes[..8].copy_from_slice(&<TenantLedger as crate::shm::SharedLayout>::MAGIC.to_ne_bytes());
            }
            std::fs::write(&path, &bytes).unwrap();
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            if let Ok(copy) = Region::<TenantLedger>::copy_of_file(&path, uid) {
                for device in 0..MAX_DEVICES {
                    let _ = (copy.used(device), copy.budget(device), copy.peak(device));
                    let _ = copy.member_used(1, device);
                }
                let _ = (copy.refusals(), copy.members());
            } else {
                proptest::prop_assert!(!keep_magic || bytes.len() < std::mem::size_of::<TenantLedger>());
            }
            let _ = std::fs::remove_file(&path);
        }
    }
}
