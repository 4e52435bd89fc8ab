//! Device memory shared between processes as shareable VMM handles
//! (`cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle` with
//! POSIX file descriptors), under the rule of IPC handles
//! ([`crate::memory::ipc_sharing`]): charged once, to the tenant that
//! created the allocation, while any live process maps it; an importer is
//! charged nothing, and the exporter's `cuMemRelease` while an importer
//! still holds the memory keeps the charge until the last importer
//! releases it.
//!
//! The importer gets only a descriptor, passed over a Unix socket (or
//! `pidfd_getfd`): the same open file as the exporter's. The exporter keeps
//! a descriptor of its own on that file and records it in the user's table
//! ([`dilu_layout::vmm_exports`]); the importer finds the export whose
//! descriptor is the same file as its own with `kcmp(KCMP_FILE)` (NVIDIA's
//! exported descriptors need not differ by inode), then counts its mapping
//! under that export's digest. A descriptor that matches no export (another
//! user's, or `kcmp` denied by a container's seccomp profile) is charged
//! as before: nothing to the importer, and the exporter's charge ends at
//! its release.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use dilu_layout::ledger;
use dilu_layout::shm::Region;
use dilu_layout::vmm_exports::{ExportTable, table_path};

use crate::memory::budget::TAG_HANDLE;
use crate::memory::ipc_sharing::{self, alive, own_pid};

/// Handles this process exported: handle -> (digest, its own descriptor).
static EXPORTS: Mutex<Option<HashMap<u64, (u64, i32)>>> = Mutex::new(None);

/// The lowest descriptor number the exporter's own copies take, out of the
/// way of the small numbers programs expect to be theirs.
const OWN_FD_FLOOR: i32 = 512;

fn table() -> Option<&'static Region<ExportTable>> {
    static TABLE: OnceLock<Option<Region<ExportTable>>> = OnceLock::new();
    TABLE
        .get_or_init(|| ipc_sharing::user_table(table_path, "VMM exports"))
        .as_ref()
}

fn start_time() -> u64 {
    i32::try_from(own_pid())
        .ok()
        .and_then(ledger::process_start_time)
        .unwrap_or(0)
}

/// `cuMemExportToShareableHandle` gave descriptor `fd` for `handle`.
pub fn exported(handle: u64, fd: i32) {
    let Some(table) = table() else { return };
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor the driver just returned.
    let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, OWN_FD_FLOOR) };
    if own < 0 {
        return;
    }
    let pid = own_pid();
    let start = start_time();
    let digest = export_digest(pid, start, handle);
    if !table.exported(pid, start, own as u64, digest, alive) {
        tracing::warn!("the table of VMM exports is full: this export is not counted");
        // SAFETY: the copy made above, used nowhere else.
        unsafe { libc::close(own) };
        return;
    }
    let mut exports = EXPORTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, previous)) = exports
        .get_or_insert_with(HashMap::new)
        .insert(handle, (digest, own))
    {
        // Exported twice: one copy is enough.
        // SAFETY: this module's own copy of an earlier export.
        unsafe { libc::close(previous) };
    }
    ipc_sharing::exported_as(TAG_HANDLE | handle, digest);
}

/// `cuMemImportFromShareableHandle` made `handle` from descriptor `fd`.
pub fn imported(handle: u64, fd: i32) {
    let Some(table) = table() else { return };
    let me = own_pid();
    let digest = table.find(me, alive, |pid, theirs| same_file(me, pid, fd, theirs));
    if let Some(digest) = digest {
        ipc_sharing::opened_as(TAG_HANDLE | handle, digest);
    }
}

/// `cuMemRelease(handle)` succeeded: an import no longer maps, an export is
/// no longer offered (what importers hold stays counted).
pub fn released(handle: u64) {
    ipc_sharing::closed(TAG_HANDLE | handle);
    let export = {
        let mut exports = EXPORTS.lock().unwrap_or_else(|p| p.into_inner());
        exports.as_mut().and_then(|map| map.remove(&handle))
    };
    if let Some((digest, own)) = export {
        if let Some(table) = table() {
            table.withdrawn(own_pid(), digest);
        }
        // SAFETY: this module's own copy, recorded only in the entry removed.
        unsafe { libc::close(own) };
    }
}

/// A digest naming one export: FNV-1a over the exporter and the handle.
fn export_digest(pid: u64, start_time: u64, handle: u64) -> u64 {
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&pid.to_le_bytes());
    bytes[8..16].copy_from_slice(&start_time.to_le_bytes());
    bytes[16..].copy_from_slice(&handle.to_le_bytes());
    dilu_layout::ipc_mappings::handle_digest(&bytes)
}

/// Whether this process's `fd` and process `pid`'s `theirs` are the same
/// open file.
fn same_file(me: u64, pid: u64, fd: i32, theirs: u64) -> bool {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: kcmp only compares kernel objects of the two processes; a
    // process it may not inspect gives an error, taken as "not the same".
    let answer = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            me as libc::pid_t,
            pid as libc::pid_t,
            KCMP_FILE,
            fd as libc::c_ulong,
            theirs as libc::c_ulong,
        )
    };
    answer == 0
}
