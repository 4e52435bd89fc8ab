//! Device memory one process exported and others mapped (CUDA IPC handles
//! and shareable VMM handles), as every process of the instance sees it:
//! who exported what, which processes map it, and whether the exporter has
//! let go of it. The memory stays charged to the exporter until the last
//! mapping is gone, as NVIDIA's driver keeps it allocated until then; a
//! mapping process is not charged for it.
//!
//! The words are plain atomics in the instance file; whoever brings an
//! entry's mappings to zero after the exporter let go (or lets go after
//! the last one closed) gets the charge to return, exactly once.

use std::sync::atomic::{AtomicU64, Ordering::*};

pub(crate) const MAX_EXPORTS: usize = 512;
pub(crate) const MAX_IMPORTS: usize = 1024;
/// `pid` while an entry is being filled in.
const FILLING: u64 = u64::MAX;
/// Keys of shareable VMM handles (a memfd's inode) carry this bit; keys of
/// IPC handles (an exporter's allocation number) do not.
pub(crate) const VMM_KEY: u64 = 1 << 63;

const LIVE: u64 = 0;
const LET_GO: u64 = 1;
const RELEASED: u64 = 2;

#[repr(C)]
pub(crate) struct Export {
    /// The exporter's pid (0: a free entry).
    pid: AtomicU64,
    /// The exporter's process slot.
    slot: AtomicU64,
    key: AtomicU64,
    phys: AtomicU64,
    /// Bytes charged to the exporter for the memory.
    charge: AtomicU64,
    /// Mappings in other processes.
    opens: AtomicU64,
    /// LIVE, LET_GO (the exporter freed it), RELEASED (its charge returned).
    state: AtomicU64,
}

#[repr(C)]
pub(crate) struct Import {
    /// The mapping process's slot + 1 (0: a free record).
    slot: AtomicU64,
    export: AtomicU64,
    key: AtomicU64,
}

#[repr(C)]
pub(crate) struct ExportTable {
    exports: [Export; MAX_EXPORTS],
    imports: [Import; MAX_IMPORTS],
}

/// A charge whose last mapping is gone: `bytes` on device `phys`, to be
/// returned from the exporter's `slot` while it still holds `pid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    pub pid: u64,
    pub slot: usize,
    pub phys: usize,
    pub bytes: u64,
}

impl ExportTable {
    fn entry(&self, index: usize, pid: u64, key: u64) -> Option<&Export> {
        let e = self.exports.get(index)?;
        (e.pid.load(Acquire) == pid && e.key.load(Acquire) == key).then_some(e)
    }

    /// Records memory exported by `pid` (idempotent per key); its index.
    pub(crate) fn publish(
        &self,
        pid: u64,
        slot: usize,
        key: u64,
        phys: usize,
        charge: u64,
    ) -> Option<usize> {
        if let Some(index) = self.find(Some(pid), key) {
            return Some(index);
        }
        for (index, e) in self.exports.iter().enumerate() {
            if e.pid.compare_exchange(0, FILLING, AcqRel, Relaxed).is_ok() {
                e.slot.store(slot as u64, Relaxed);
                e.key.store(key, Relaxed);
                e.phys.store(phys as u64, Relaxed);
                e.charge.store(charge, Relaxed);
                e.opens.store(0, Relaxed);
                e.state.store(LIVE, Relaxed);
                e.pid.store(pid, Release);
                return Some(index);
            }
        }
        None
    }

    /// The live entry of `key` (exported by `pid`, where given).
    pub(crate) fn find(&self, pid: Option<u64>, key: u64) -> Option<usize> {
        self.exports.iter().position(|e| {
            let owner = e.pid.load(Acquire);
            owner != 0
                && owner != FILLING
                && pid.is_none_or(|p| p == owner)
                && e.key.load(Acquire) == key
                && e.state.load(Acquire) == LIVE
        })
    }

    /// The exporter's pid.
    pub(crate) fn owner(&self, index: usize) -> Option<u64> {
        let pid = self.exports.get(index)?.pid.load(Acquire);
        (pid != 0 && pid != FILLING).then_some(pid)
    }

    /// The entry's device and the exporter's charge for it.
    pub(crate) fn charge_of(&self, index: usize) -> Option<(usize, u64)> {
        let e = self.exports.get(index)?;
        Some((e.phys.load(Relaxed) as usize, e.charge.load(Relaxed)))
    }

    /// A mapping by the process in `importer_slot`: the record to close;
    /// refused (`Err`) where the entry is gone or let go, with the charge
    /// to return where this attempt happened to be its last holder.
    pub(crate) fn open(
        &self,
        index: usize,
        pid: u64,
        key: u64,
        importer_slot: usize,
    ) -> Result<usize, Option<Released>> {
        let e = self.entry(index, pid, key).ok_or(None)?;
        let record = self
            .imports
            .iter()
            .position(|r| {
                r.slot
                    .compare_exchange(0, importer_slot as u64 + 1, AcqRel, Relaxed)
                    .is_ok()
            })
            .ok_or(None)?;
        let r = &self.imports[record];
        r.export.store(index as u64, Relaxed);
        r.key.store(key, Release);
        e.opens.fetch_add(1, AcqRel);
        if e.state.load(Acquire) != LIVE {
            // The exporter let go meanwhile: undo.
            return Err(self.close(record));
        }
        Ok(record)
    }

    /// Ends the mapping of `record`: the charge to return, where it was the
    /// last mapping of memory its exporter had let go of.
    pub(crate) fn close(&self, record: usize) -> Option<Released> {
        let r = self.imports.get(record)?;
        let index = r.export.load(Acquire) as usize;
        let key = r.key.load(Acquire);
        r.export.store(0, Relaxed);
        r.key.store(0, Relaxed);
        r.slot.store(0, Release);
        let e = self.exports.get(index)?;
        if e.key.load(Acquire) != key {
            return None;
        }
        let last = e
            .opens
            .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1))
            .is_ok_and(|n| n == 1);
        if last
            && e.state
                .compare_exchange(LET_GO, RELEASED, AcqRel, Relaxed)
                .is_ok()
        {
            return Some(self.free_entry(e));
        }
        None
    }

    fn free_entry(&self, e: &Export) -> Released {
        let released = Released {
            pid: e.pid.load(Acquire),
            slot: e.slot.load(Relaxed) as usize,
            phys: e.phys.load(Relaxed) as usize,
            bytes: e.charge.load(Relaxed),
        };
        e.pid.store(0, Release);
        released
    }

    /// The exporter lets go of its memory: whether its charge is returned
    /// now (nobody maps it); otherwise the last mapping's close returns it.
    pub(crate) fn let_go(&self, index: usize, pid: u64, key: u64) -> bool {
        let Some(e) = self.entry(index, pid, key) else {
            return true;
        };
        e.state.store(LET_GO, Release);
        if e.opens.load(Acquire) == 0
            && e.state
                .compare_exchange(LET_GO, RELEASED, AcqRel, Relaxed)
                .is_ok()
        {
            self.free_entry(e);
            return true;
        }
        false
    }

    /// Whether the exporter's entry still holds back a charge (false once
    /// the last mapping returned it).
    pub(crate) fn held(&self, index: usize, pid: u64, key: u64) -> bool {
        self.entry(index, pid, key).is_some()
    }

    /// A process in `slot` (`pid`) is gone: its mappings are closed and its
    /// exports forgotten (its whole charge is returned with its slot).
    /// Returns the charges of other exporters its mappings held last.
    pub(crate) fn forget_process(&self, slot: usize, pid: u64) -> Vec<Released> {
        let mut released = Vec::new();
        for (record, r) in self.imports.iter().enumerate() {
            if r.slot.load(Acquire) == slot as u64 + 1
                && let Some(charge) = self.close(record)
            {
                released.push(charge);
            }
        }
        for e in &self.exports {
            if e.pid.load(Acquire) == pid {
                e.state.store(RELEASED, Release);
                e.pid.store(0, Release);
            }
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Box<ExportTable> {
        // SAFETY: an all-zero table is every entry and record free.
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn the_charge_comes_back_once_after_the_exporter_and_every_mapping_let_go() {
        let t = table();
        let e = t.publish(10, 1, 7, 0, 4096).unwrap();
        assert_eq!(t.publish(10, 1, 7, 0, 4096), Some(e), "one entry per key");
        let a = t.open(e, 10, 7, 2).unwrap();
        let b = t.open(e, 10, 7, 3).unwrap();
        assert!(!t.let_go(e, 10, 7), "mapped: the charge stays");
        assert_eq!(
            t.open(e, 10, 7, 4),
            Err(None),
            "freed memory is not opened anew"
        );
        assert_eq!(t.close(a), None, "one mapping left");
        let released = t.close(b).expect("the last mapping returns the charge");
        assert_eq!((released.pid, released.slot, released.bytes), (10, 1, 4096));
        assert!(!t.held(e, 10, 7));
    }

    #[test]
    fn unmapped_memory_is_returned_by_its_exporter_at_once() {
        let t = table();
        let e = t.publish(10, 1, 7, 0, 4096).unwrap();
        let a = t.open(e, 10, 7, 2).unwrap();
        assert_eq!(t.close(a), None, "the exporter still holds it");
        assert!(t.let_go(e, 10, 7));
    }

    #[test]
    fn a_dead_mapper_closes_its_mappings() {
        let t = table();
        let e = t.publish(10, 1, 7, 0, 4096).unwrap();
        t.open(e, 10, 7, 5).unwrap();
        assert!(!t.let_go(e, 10, 7));
        let released = t.forget_process(5, 20);
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].bytes, 4096);
    }
}
