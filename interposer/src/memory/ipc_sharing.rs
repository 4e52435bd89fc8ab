//! Device memory shared between processes with CUDA IPC handles
//! (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle` / `cuIpcCloseMemHandle`, as
//! `torch.multiprocessing` shares CUDA tensors). One rule: an allocation
//! is charged once, to the tenant that allocated it, for as long as any
//! process maps it. A mapping process is charged nothing; the exporter's
//! `cuMemFree` while others still map the memory frees it in the driver
//! (which keeps it until the last mapping closes) but keeps its charge,
//! given back once no live process maps it (checked before a reservation
//! is refused and when the budget is queried).
//!
//! Mappings are counted in the user's table ([`dilu_layout::ipc_mappings`]),
//! so exporter and mappers must run as the same user. Shareable VMM handles
//! follow the same rule (`vmm_sharing` finds whose export an import is).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use dilu_abi::cuda::{CUDA_SUCCESS, CUresult};
use dilu_layout::ipc_mappings::{MappingTable, handle_digest, table_path};
use dilu_layout::ledger;
use dilu_layout::shm::Region;

use crate::memory::budget::{self, MemoryBudget};

/// Allocations this process exported: pointer -> handle digest.
static EXPORTED: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);
/// Handles this process opened: pointer -> (digest, opens).
static OPENED: Mutex<Option<HashMap<u64, (u64, u32)>>> = Mutex::new(None);
/// Charges of exported allocations freed while others mapped them:
/// (digest, device, bytes).
static HELD: Mutex<Vec<(u64, usize, u64)>> = Mutex::new(Vec::new());
static ANY_HELD: AtomicBool = AtomicBool::new(false);
/// Whether `EXPORTED` ever held anything (a free looks no further before).
static ANY_EXPORTED: AtomicBool = AtomicBool::new(false);

fn table() -> Option<&'static Region<MappingTable>> {
    static TABLE: OnceLock<Option<Region<MappingTable>>> = OnceLock::new();
    TABLE
        .get_or_init(|| user_table(table_path, "IPC mappings"))
        .as_ref()
}

/// This user's shared table at `path_of(uid)`, created if missing; `None`
/// (said once) when it cannot be opened: shared memory is then charged as
/// if nobody mapped it.
pub(crate) fn user_table<T: dilu_layout::shm::SharedLayout>(
    path_of: fn(u32) -> std::path::PathBuf,
    what: &str,
) -> Option<Region<T>> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let path = path_of(uid);
    let opened = path
        .parent()
        .map_or(Ok(()), dilu_layout::shm::private_dir)
        .and_then(|()| Region::<T>::open_or_create(&path, 0o600, |_| {}));
    match opened {
        Ok(region) => Some(region),
        Err(error) => {
            tracing::warn!(
                path = %path.display(),
                %error,
                "cannot open the table of {what}: memory shared with other processes is charged as if nobody mapped it"
            );
            None
        }
    }
}

pub(crate) fn own_pid() -> u64 {
    u64::from(std::process::id())
}

pub(crate) fn alive(pid: u64, start_time: u64) -> bool {
    i32::try_from(pid).is_ok_and(|pid| ledger::process_alive(pid, start_time))
}

/// `cuIpcGetMemHandle` succeeded: `dptr`'s allocation may be mapped elsewhere.
pub fn exported(dptr: u64, handle: &[u8]) {
    exported_as(dptr, handle_digest(handle));
}

/// The allocation charged under `key` may be mapped elsewhere, its
/// mappings counted under `digest` (a VMM export: `vmm_sharing`).
pub fn exported_as(key: u64, digest: u64) {
    let mut exported = EXPORTED.lock().unwrap_or_else(|p| p.into_inner());
    exported
        .get_or_insert_with(HashMap::new)
        .insert(key, digest);
    ANY_EXPORTED.store(true, Ordering::Release);
}

/// `cuIpcOpenMemHandle` returned `dptr` for `handle`.
pub fn opened(dptr: u64, handle: &[u8]) {
    opened_as(dptr, handle_digest(handle));
}

/// This process maps, under `key`, memory whose mappings count under
/// `digest` (until [`closed`] with the same key).
pub fn opened_as(dptr: u64, digest: u64) {
    let Some(table) = table() else { return };
    let pid = own_pid();
    let start_time = i32::try_from(pid)
        .ok()
        .and_then(ledger::process_start_time)
        .unwrap_or(0);
    if !table.opened(pid, start_time, digest, alive) {
        tracing::warn!("the table of IPC mappings is full: this mapping is not counted");
        return;
    }
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    opened
        .get_or_insert_with(HashMap::new)
        .entry(dptr)
        .or_insert((digest, 0))
        .1 += 1;
}

/// `cuIpcCloseMemHandle(dptr)` succeeded (or an imported VMM handle, keyed
/// as opened, was released).
pub fn closed(dptr: u64) {
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    let Some(map) = opened.as_mut() else { return };
    let Some((digest, opens)) = map.get_mut(&dptr) else {
        return;
    };
    let digest = *digest;
    *opens -= 1;
    if *opens == 0 {
        map.remove(&dptr);
    }
    drop(opened);
    if let Some(table) = table() {
        table.closed(own_pid(), digest);
    }
}

/// `cuMemFree` of `dptr` under budget `b`: an ordinary free, except for
/// an exported allocation that other live processes map: the driver frees
/// it (and keeps it until the last mapping closes), its charge stays.
pub fn free(b: &MemoryBudget, dptr: u64, call: impl FnOnce() -> CUresult) -> CUresult {
    if !ANY_EXPORTED.load(Ordering::Acquire) {
        return b.free(dptr, call);
    }
    let digest = {
        let mut exported = EXPORTED.lock().unwrap_or_else(|p| p.into_inner());
        exported.as_mut().and_then(|map| map.remove(&dptr))
    };
    let mapped = digest
        .filter(|&digest| table().is_some_and(|table| table.mapped(digest, own_pid(), alive)));
    let (Some(digest), Some(charge)) = (mapped, mapped.and_then(|_| b.charges.remove(dptr))) else {
        return b.free(dptr, call);
    };
    let result = call();
    if result != CUDA_SUCCESS {
        b.charges.insert(dptr, charge);
        return result;
    }
    HELD.lock().unwrap_or_else(|p| p.into_inner()).push((
        digest,
        usize::from(charge.device),
        charge.bytes,
    ));
    ANY_HELD.store(true, Ordering::Release);
    budget::reclaim_before_refusing(release_unmapped);
    result
}

/// Gives back the charges of freed allocations nobody maps any more;
/// whether there were any.
pub fn release_unmapped() -> bool {
    if !ANY_HELD.load(Ordering::Acquire) {
        return false;
    }
    let (Some(b), Some(table)) = (budget::get(), table()) else {
        return false;
    };
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let before = held.len();
    held.retain(|&(digest, device, bytes)| {
        if table.mapped(digest, own_pid(), alive) {
            return true;
        }
        b.release(device, bytes);
        false
    });
    ANY_HELD.store(!held.is_empty(), Ordering::Release);
    held.len() < before
}
