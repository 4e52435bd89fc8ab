//! Device memory shared between processes: CUDA IPC handles
//! (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle` / `cuIpcCloseMemHandle`, as
//! `torch.multiprocessing` shares CUDA tensors) and shareable VMM handles
//! (`cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle` with
//! POSIX file descriptors).
//!
//! An IPC handle names the exporter's allocation in its arena memfd; the
//! importer maps those bytes from `/proc/<pid>/fd` (so, as with NVIDIA's
//! driver, only a process allowed to look into the exporter can open it).
//! The memory stays charged to the exporter, and stays allocated after the
//! exporter frees it, until the last importer closes it
//! ([`crate::shm_exports`]); an importer is not charged.

use super::out;
use crate::Res;
use crate::driver::{Driver, current, drv};
use crate::memory::Phys;
use crate::shm_exports::VMM_KEY;
use dilu_abi::cuda::*;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

type CUdeviceptr = sys::CUdeviceptr;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    reserved: [u8; 64],
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: c_int = 1;
const HANDLE_MAGIC: u32 = u32::from_le_bytes(*b"SGIP");
const PAGE: usize = 4096;

export! {
    fn cuIpcGetMemHandle(h: *mut IpcMemHandle, dptr: CUdeviceptr) => get_mem_handle;
    fn cuIpcOpenMemHandle(p: *mut CUdeviceptr, h: IpcMemHandle, flags: c_uint) => open_mem_handle;
    fn cuIpcOpenMemHandle_v2(p: *mut CUdeviceptr, h: IpcMemHandle, flags: c_uint) => open_mem_handle;
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) => close_mem_handle;
    fn cuMemExportToShareableHandle(out: *mut c_void, h: u64, kind: c_int, flags: u64) => export_shareable;
    fn cuMemImportFromShareableHandle(h: *mut u64, os_handle: *mut c_void, kind: c_int) => import_shareable;
}

/// What an IPC handle carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Named {
    phys: u32,
    pid: u64,
    start_time: u64,
    key: u64,
    index: u64,
    fd: u64,
    offset: u64,
    len: u64,
}

impl Named {
    fn encode(&self) -> IpcMemHandle {
        let mut reserved = [0u8; 64];
        reserved[..4].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        reserved[4..8].copy_from_slice(&self.phys.to_le_bytes());
        let words = [
            self.pid,
            self.start_time,
            self.key,
            self.index,
            self.fd,
            self.offset,
            self.len,
        ];
        for (i, w) in words.iter().enumerate() {
            reserved[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        IpcMemHandle { reserved }
    }

    fn decode(h: &IpcMemHandle) -> Option<Named> {
        let b = &h.reserved;
        if b[..4] != HANDLE_MAGIC.to_le_bytes() {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(b[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        Some(Named {
            phys: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            pid: word(0),
            start_time: word(1),
            key: word(2),
            index: word(3),
            fd: word(4),
            offset: word(5),
            len: word(6),
        })
    }
}

/// This process's exported allocations: base -> (table index, key).
fn exported() -> std::sync::MutexGuard<'static, BTreeMap<u64, (usize, u64)>> {
    static M: Mutex<BTreeMap<u64, (usize, u64)>> = Mutex::new(BTreeMap::new());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocations this process freed while other processes mapped them: base
/// -> (device, table index, key). Their address range stays taken until
/// the last mapping is gone.
fn let_go() -> std::sync::MutexGuard<'static, Vec<(u64, usize, usize, u64)>> {
    static M: Mutex<Vec<(u64, usize, usize, u64)>> = Mutex::new(Vec::new());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

struct Mapping {
    /// The page-aligned mapping that holds the bytes.
    map_addr: usize,
    map_len: usize,
    len: usize,
    dev: usize,
    record: usize,
    /// Opens of the same handle in this process (one mapping).
    opens: u32,
    handle: (u64, u64),
}

/// Handles this process opened: returned pointer -> mapping.
fn mappings() -> std::sync::MutexGuard<'static, BTreeMap<u64, Mapping>> {
    static M: Mutex<BTreeMap<u64, Mapping>> = Mutex::new(BTreeMap::new());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

fn own_pid() -> u64 {
    u64::from(std::process::id())
}

fn get_mem_handle(_: bool, h: *mut IpcMemHandle, dptr: CUdeviceptr) -> Res {
    let d = drv()?;
    if h.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let shm = d.shm.as_ref().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let (dev, arena) = d
        .arenas
        .iter()
        .enumerate()
        .find(|(_, a)| a.contains(dptr as usize, 1))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if arena.fd < 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let (base, len) = arena
        .range_of(dptr as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    static NEXT_KEY: AtomicU64 = AtomicU64::new(1);
    let mut exports = exported();
    let (index, key) = match exports.get(&(base as u64)) {
        Some(&entry) => entry,
        None => {
            let key = NEXT_KEY.fetch_add(1, Relaxed);
            let phys = d.phys(dev);
            let index = shm
                .exports()
                .publish(own_pid(), shm.slot, key, phys, len as u64)
                .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            exports.insert(base as u64, (index, key));
            (index, key)
        }
    };
    let named = Named {
        phys: d.phys(dev) as u32,
        pid: own_pid(),
        start_time: crate::shm::start_time(own_pid()).unwrap_or(0),
        key,
        index: index as u64,
        fd: arena.fd as u64,
        offset: (base - arena.base) as u64,
        len: len as u64,
    };
    out(h, named.encode())
}

/// `cuMemFree` of an exported allocation: true where other processes still
/// map it, so its address range and charge stay (returned by the last
/// importer's close).
pub(crate) fn freed_while_mapped(dev: usize, base: u64) -> bool {
    let Some((index, key)) = exported().remove(&base) else {
        return false;
    };
    let Ok(d) = drv() else { return false };
    let Some(shm) = &d.shm else { return false };
    if shm.exports().let_go(index, own_pid(), key) {
        return false;
    }
    let_go().push((base, dev, index, key));
    true
}

/// Gives back to the arenas the address ranges of allocations whose last
/// importer has closed them (their charge was returned then).
pub(crate) fn reclaim_let_go(d: &Driver) {
    let Some(shm) = &d.shm else { return };
    let mut held = let_go();
    held.retain(|&(base, dev, index, key)| {
        if shm.exports().held(index, own_pid(), key) {
            return true;
        }
        d.arenas[dev].free(base as usize);
        false
    });
}

fn open_mem_handle(_: bool, p: *mut CUdeviceptr, h: IpcMemHandle, _flags: c_uint) -> Res {
    let d = drv()?;
    let ctx = current()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let shm = d.shm.as_ref().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let named = Named::decode(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if named.pid == own_pid() {
        // NVIDIA's driver opens handles of other processes only.
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let mut maps = mappings();
    if let Some((&ptr, m)) = maps
        .iter_mut()
        .find(|(_, m)| m.handle == (named.pid, named.key))
    {
        m.opens += 1;
        return out(p, ptr);
    }
    if crate::shm::start_time(named.pid) != Some(named.start_time) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let index = named.index as usize;
    if shm.exports().charge_of(index).map(|(_, bytes)| bytes) != Some(named.len) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let record = opened(shm, index, named.pid, named.key)?;
    let close_record = || {
        if let Some(charge) = shm.exports().close(record) {
            shm.return_charge(charge);
        }
    };
    let start = named.offset as usize / PAGE * PAGE;
    let end = (named.offset + named.len) as usize;
    let map_len = end.div_ceil(PAGE) * PAGE - start;
    let Some(map_addr) = map_exporter_bytes(named.pid, named.fd, start, map_len) else {
        close_record();
        return Err(CUDA_ERROR_MAP_FAILED);
    };
    let ptr = (map_addr + (named.offset as usize - start)) as u64;
    maps.insert(
        ptr,
        Mapping {
            map_addr,
            map_len,
            len: named.len as usize,
            dev: ctx.dev,
            record,
            opens: 1,
            handle: (named.pid, named.key),
        },
    );
    out(p, ptr)
}

/// Records this process's mapping of export `index`; its record.
fn opened(shm: &crate::shm::Shm, index: usize, pid: u64, key: u64) -> Res<usize> {
    shm.exports()
        .open(index, pid, key, shm.slot)
        .map_err(|charge| {
            if let Some(charge) = charge {
                shm.return_charge(charge);
            }
            CUDA_ERROR_INVALID_HANDLE
        })
}

/// Maps `[offset, offset+len)` of the exporter's arena memfd (`fd` in
/// process `pid`) shared into this process.
fn map_exporter_bytes(pid: u64, fd: u64, offset: usize, len: usize) -> Option<usize> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")).ok()?;
    // SAFETY: path is NUL-terminated; the flags create nothing.
    let file = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if file < 0 {
        return None;
    }
    // SAFETY: a fresh shared mapping of the file just opened, at a
    // kernel-chosen address; the descriptor may close once it is mapped.
    let addr = unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            file,
            offset as libc::off_t,
        );
        libc::close(file);
        addr
    };
    (addr != libc::MAP_FAILED).then_some(addr as usize)
}

fn close_mem_handle(_: bool, dptr: CUdeviceptr) -> Res {
    let d = drv()?;
    let mut maps = mappings();
    let m = maps.get_mut(&dptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    m.opens -= 1;
    if m.opens > 0 {
        return Ok(());
    }
    let m = maps.remove(&dptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    drop(maps);
    // Like cuMemFree, closing waits for the work queued on the memory.
    if let Ok(c) = current() {
        let _ = c.synchronize();
    }
    // SAFETY: the mapping was made by open_mem_handle and is no longer
    // handed out.
    unsafe { libc::munmap(m.map_addr as *mut c_void, m.map_len) };
    if let Some(shm) = &d.shm
        && let Some(charge) = shm.exports().close(m.record)
    {
        shm.return_charge(charge);
    }
    Ok(())
}

/// The device of `[ptr, ptr+len)` where it lies in memory opened from
/// another process's IPC handle.
pub(crate) fn imported_dev(ptr: u64, len: usize) -> Option<usize> {
    let maps = mappings();
    let (&base, m) = maps.range(..=ptr).next_back()?;
    let end = ptr.checked_add(len as u64)?;
    (end <= base + m.len as u64).then_some(m.dev)
}

fn export_shareable(_: bool, os_handle: *mut c_void, h: u64, kind: c_int, _flags: u64) -> Res {
    let d = drv()?;
    if kind != POSIX_FD {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let shm = d.shm.as_ref().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    let phys = super::vmm::phys_of(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let key = VMM_KEY | inode(phys.fd).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if phys.imported.is_none() {
        let mut exported = phys.exported.lock().unwrap_or_else(|e| e.into_inner());
        if exported.is_none() {
            let index = shm
                .exports()
                .publish(own_pid(), shm.slot, key, d.phys(phys.dev), phys.charge)
                .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
            *exported = Some((index, key));
        }
    }
    // SAFETY: duplicates our own memfd; the caller owns the copy.
    let fd = unsafe { libc::fcntl(phys.fd, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    out(os_handle.cast::<c_int>(), fd)
}

fn inode(fd: c_int) -> Option<u64> {
    // SAFETY: a zeroed stat is a valid out-parameter for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into st only.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino & !VMM_KEY)
}

fn import_shareable(_: bool, h: *mut u64, os_handle: *mut c_void, kind: c_int) -> Res {
    let d = drv()?;
    if kind != POSIX_FD {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if h.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let shm = d.shm.as_ref().ok_or(CUDA_ERROR_NOT_SUPPORTED)?;
    // The POSIX descriptor travels in the pointer's bits, as in NVIDIA's API.
    let given = os_handle as usize as c_int;
    let key = VMM_KEY | inode(given).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let index = shm
        .exports()
        .find(None, key)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let (phys, _) = shm
        .exports()
        .charge_of(index)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let exporter = shm
        .exports()
        .owner(index)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let dev = d
        .cfg
        .visible
        .iter()
        .position(|&p| p == phys)
        .map_or_else(|| current().map(|c| c.dev), Ok)?;
    // SAFETY: fstat writes into st only.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `given` is the caller's descriptor.
    if unsafe { libc::fstat(given, &mut st) } != 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let record = opened(shm, index, exporter, key)?;
    // SAFETY: duplicates the caller's descriptor, which stays theirs.
    let fd = unsafe { libc::fcntl(given, libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 {
        if let Some(charge) = shm.exports().close(record) {
            shm.return_charge(charge);
        }
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let imported = Phys {
        fd,
        size: st.st_size as usize,
        dev,
        charge: 0,
        exported: Mutex::new(None),
        imported: Some(record),
    };
    out(h, super::vmm::insert_phys(Arc::new(imported)))
}
