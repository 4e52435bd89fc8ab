//! Which processes of one user map device memory another process exported
//! with a CUDA IPC handle: one record per (mapping process, handle). The
//! exporter of an allocation keeps it charged to its budget while any live
//! process maps it (the driver keeps the memory until the last mapping
//! closes), and the mapping processes are charged nothing for it.
//!
//! Handles are named by a digest of their 64 bytes (the same in every
//! process that holds them). A record of a process that died is ignored
//! and reused, so a crashed mapper never holds an exporter's budget.

use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Mappings recorded at once, per user.
pub const RECORDS: usize = 1024;
/// A record's pid while it is being written.
pub(crate) const WRITING: u64 = u64::MAX;

#[repr(C)]
pub struct MappingRecord {
    /// The mapping process (0: a free record).
    pid: AtomicU64,
    start_time: AtomicU64,
    digest: AtomicU64,
    /// Opens of the handle not yet closed in that process.
    opens: AtomicU64,
}

#[repr(C)]
pub struct MappingTable {
    magic: AtomicU64,
    records: [MappingRecord; RECORDS],
}

// SAFETY: #[repr(C)], atomics only, all-zero is every record free.
unsafe impl SharedLayout for MappingTable {
    const MAGIC: u64 = 0x6469_6c75_4950_0001; // "diluIP" v1
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

/// Takes a record whose owner word is `owner` for process `pid`: a free
/// one, or one of a process `alive` says is gone. On success the owner
/// word reads [`WRITING`] until the caller, having filled the record,
/// stores `pid` in it (release). Shared by the user tables of processes
/// that share memory ([`crate::vmm_exports`] too).
pub(crate) fn claim(
    owner: &AtomicU64,
    start_time: &AtomicU64,
    pid: u64,
    alive: impl Fn(u64, u64) -> bool,
) -> bool {
    let current = owner.load(Acquire);
    let free = current == 0
        || (current != WRITING && current != pid && !alive(current, start_time.load(Acquire)));
    free && owner
        .compare_exchange(current, WRITING, AcqRel, Relaxed)
        .is_ok()
}

/// The digest that names a handle: FNV-1a over its bytes.
pub fn handle_digest(handle: &[u8]) -> u64 {
    let digest = handle.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    digest.max(1)
}

/// Where a user's table lives.
pub fn table_path(uid: u32) -> std::path::PathBuf {
    crate::user_region_dir(uid).join("ipc-mappings")
}

impl MappingTable {
    fn record_of(&self, pid: u64, digest: u64) -> Option<&MappingRecord> {
        self.records
            .iter()
            .find(|r| r.pid.load(Acquire) == pid && r.digest.load(Acquire) == digest)
    }

    /// Process `pid` (started at `start_time`) opened the handle named
    /// `digest`. `alive` tells whether a recorded process still runs (a dead
    /// one's record is reused). False when the table is full.
    pub fn opened(
        &self,
        pid: u64,
        start_time: u64,
        digest: u64,
        alive: impl Fn(u64, u64) -> bool,
    ) -> bool {
        if let Some(r) = self.record_of(pid, digest) {
            r.opens.fetch_add(1, AcqRel);
            return true;
        }
        for r in &self.records {
            if claim(&r.pid, &r.start_time, pid, &alive) {
                r.start_time.store(start_time, Relaxed);
                r.digest.store(digest, Relaxed);
                r.opens.store(1, Relaxed);
                r.pid.store(pid, Release);
                return true;
            }
        }
        false
    }

    /// Process `pid` closed one open of the handle named `digest`.
    pub fn closed(&self, pid: u64, digest: u64) {
        if let Some(r) = self.record_of(pid, digest) {
            let left = r.opens.fetch_sub(1, AcqRel).saturating_sub(1);
            if left == 0 {
                r.pid.store(0, Release);
            }
        }
    }

    /// Whether a live process other than `except` maps the handle named
    /// `digest`.
    pub fn mapped(&self, digest: u64, except: u64, alive: impl Fn(u64, u64) -> bool) -> bool {
        self.records.iter().any(|r| {
            let pid = r.pid.load(Acquire);
            pid != 0
                && pid != WRITING
                && pid != except
                && r.digest.load(Acquire) == digest
                && r.opens.load(Acquire) > 0
                && alive(pid, r.start_time.load(Acquire))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Box<MappingTable> {
        // SAFETY: all-zero is a valid table (SharedLayout's contract).
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn a_handle_is_mapped_until_its_last_open_closes_or_its_mapper_dies() {
        let t = table();
        let everyone_alive = |_: u64, _: u64| true;
        let digest = handle_digest(&[7; 64]);
        assert!(!t.mapped(digest, 1, everyone_alive));
        assert!(t.opened(20, 5, digest, everyone_alive));
        assert!(t.opened(20, 5, digest, everyone_alive));
        assert!(t.mapped(digest, 1, everyone_alive));
        assert!(
            !t.mapped(digest, 20, everyone_alive),
            "its own mapping does not count"
        );
        t.closed(20, digest);
        assert!(t.mapped(digest, 1, everyone_alive), "one open left");
        assert!(
            !t.mapped(digest, 1, |pid, _| pid != 20),
            "a dead mapper maps nothing"
        );
        t.closed(20, digest);
        assert!(!t.mapped(digest, 1, everyone_alive));
    }

    #[test]
    fn records_of_dead_processes_are_reused() {
        let t = table();
        for pid in 1..=RECORDS as u64 {
            assert!(t.opened(pid, 1, 9, |_, _| true));
        }
        assert!(!t.opened(5000, 1, 9, |_, _| true), "full");
        assert!(
            t.opened(5000, 1, 9, |pid, _| pid != 3),
            "a dead one's record"
        );
    }
}
