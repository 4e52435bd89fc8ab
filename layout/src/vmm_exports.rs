//! Which processes of one user exported device memory as a shareable VMM
//! handle (`cuMemExportToShareableHandle` with a POSIX file descriptor),
//! so that a process importing such a descriptor can tell whose allocation
//! it maps: one record per (exporting process, allocation), holding a
//! descriptor the exporter keeps open on the exported file. The importer
//! compares its descriptor with each (`kcmp`: the same open file), then
//! counts its mapping in [`crate::ipc_mappings`] under the record's digest.
//!
//! A record of a process that died is ignored and reused.

use crate::ipc_mappings::{WRITING, claim};
use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Exports recorded at once, per user.
pub const RECORDS: usize = 256;

#[repr(C)]
pub struct ExportRecord {
    /// The exporting process (0: a free record).
    pid: AtomicU64,
    start_time: AtomicU64,
    /// The exporter's own descriptor on the exported file.
    fd: AtomicU64,
    /// The name its mappings are counted under.
    digest: AtomicU64,
}

#[repr(C)]
pub struct ExportTable {
    magic: AtomicU64,
    records: [ExportRecord; RECORDS],
}

// SAFETY: #[repr(C)], atomics only, all-zero is every record free.
unsafe impl SharedLayout for ExportTable {
    const MAGIC: u64 = 0x6469_6c75_564d_0001; // "diluVM" v1
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

/// Where a user's table lives.
pub fn table_path(uid: u32) -> std::path::PathBuf {
    crate::user_region_dir(uid).join("vmm-exports")
}

impl ExportTable {
    /// Process `pid` (started at `start_time`) exported an allocation,
    /// keeping descriptor `fd` on it; its mappings count under `digest`.
    /// `alive` tells whether a recorded process still runs. False when
    /// the table is full.
    pub fn exported(
        &self,
        pid: u64,
        start_time: u64,
        fd: u64,
        digest: u64,
        alive: impl Fn(u64, u64) -> bool,
    ) -> bool {
        for r in &self.records {
            if claim(&r.pid, &r.start_time, pid, &alive) {
                r.start_time.store(start_time, Relaxed);
                r.fd.store(fd, Relaxed);
                r.digest.store(digest, Relaxed);
                r.pid.store(pid, Release);
                return true;
            }
        }
        false
    }

    /// Process `pid` no longer exports the allocation named `digest`.
    pub fn withdrawn(&self, pid: u64, digest: u64) {
        for r in &self.records {
            if r.pid.load(Acquire) == pid && r.digest.load(Acquire) == digest {
                r.pid.store(0, Release);
            }
        }
    }

    /// The digest of the first live export by a process other than
    /// `except` for which `same_file(pid, fd)` holds.
    pub fn find(
        &self,
        except: u64,
        alive: impl Fn(u64, u64) -> bool,
        same_file: impl Fn(u64, u64) -> bool,
    ) -> Option<u64> {
        self.records.iter().find_map(|r| {
            let pid = r.pid.load(Acquire);
            let live = pid != 0
                && pid != WRITING
                && pid != except
                && alive(pid, r.start_time.load(Acquire));
            (live && same_file(pid, r.fd.load(Acquire))).then(|| r.digest.load(Acquire))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Box<ExportTable> {
        // SAFETY: all-zero is a valid table (SharedLayout's contract).
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn an_import_finds_the_live_export_of_the_same_file() {
        let t = table();
        let alive = |_: u64, _: u64| true;
        assert!(t.exported(10, 1, 40, 77, alive));
        assert!(t.exported(11, 1, 41, 78, alive));
        assert_eq!(t.find(99, alive, |pid, fd| pid == 11 && fd == 41), Some(78));
        assert_eq!(t.find(11, alive, |pid, _| pid == 11), None, "not its own");
        assert_eq!(
            t.find(99, |pid, _| pid != 11, |pid, _| pid == 11),
            None,
            "dead"
        );
        t.withdrawn(10, 77);
        assert_eq!(t.find(99, alive, |pid, _| pid == 10), None, "withdrawn");
    }
}
