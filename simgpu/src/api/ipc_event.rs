//! Events shared between processes: `cuIpcGetEventHandle` /
//! `cuIpcOpenEventHandle`, as `torch.multiprocessing` uses them to order a
//! consumer's use of a shared CUDA tensor after the producer's writes.
//!
//! An event created with `CU_EVENT_INTERPROCESS` keeps, besides its own
//! state, two counters in a page of its own (a memfd): how many times it
//! was recorded, and the last record that completed. The handle names the
//! page (pid, start time, descriptor); the opening process maps it from
//! `/proc/<pid>/fd`, as for memory handles. Recording either side's event
//! counts on the page; querying, synchronising and waiting on an opened
//! event read it. A stream that waits on an opened event waits on the host
//! until the record it waits for completed, then queues on: stricter than
//! NVIDIA's driver (which waits on the device), with the same order.

use super::out;
use crate::Res;
use crate::driver::{current, drv};
use crate::exec::{CU_EVENT_DISABLE_TIMING, EVENTS, Event};
use dilu_abi::cuda::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

type CUevent = sys::CUevent;

/// `CU_EVENT_INTERPROCESS`.
pub(crate) const CU_EVENT_INTERPROCESS: u32 = 0x4;
const HANDLE_MAGIC: u32 = u32::from_le_bytes(*b"SGEV");
const PAGE: usize = 4096;
/// How often a wait on another process's record looks again.
const POLL: Duration = Duration::from_micros(50);

/// `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcEventHandle {
    reserved: [u8; 64],
}

export! {
    fn cuIpcGetEventHandle(h: *mut IpcEventHandle, e: CUevent) => get_event_handle;
    fn cuIpcOpenEventHandle(e: *mut CUevent, h: IpcEventHandle) => open_event_handle;
}

#[repr(C)]
struct Counters {
    recorded: AtomicU64,
    completed: AtomicU64,
}

/// The page of an interprocess event, mapped in this process.
pub(crate) struct SharedEvent {
    counters: *const Counters,
    /// The exporter's descriptor (kept open so that others can map it);
    /// `None` in a process that opened the event.
    fd: Option<OwnedFd>,
    /// The exporter, in a process that opened the event: (pid, start time).
    exporter: Option<(u64, u64)>,
}

// SAFETY: the page is only accessed through atomics, and it stays mapped
// for the SharedEvent's life.
unsafe impl Send for SharedEvent {}
// SAFETY: as above.
unsafe impl Sync for SharedEvent {}

impl Drop for SharedEvent {
    fn drop(&mut self) {
        // SAFETY: the page was mapped PAGE bytes long by this value, and
        // nothing uses it once the value is gone.
        unsafe { libc::munmap(self.counters as *mut libc::c_void, PAGE) };
    }
}

impl SharedEvent {
    /// A new page for an event created with `CU_EVENT_INTERPROCESS`.
    pub(crate) fn create() -> Res<SharedEvent> {
        let raw = crate::memory::shareable_memfd(PAGE);
        if raw < 0 {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: a memfd this call created and owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let counters = map(fd.as_raw_fd()).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
        Ok(SharedEvent {
            counters,
            fd: Some(fd),
            exporter: None,
        })
    }

    fn counters(&self) -> &Counters {
        // SAFETY: mapped for the life of self (see Drop).
        unsafe { &*self.counters }
    }

    /// A new record: its number.
    pub(crate) fn record(&self) -> u64 {
        self.counters().recorded.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Record `generation` completed.
    pub(crate) fn complete(&self, generation: u64) {
        self.counters()
            .completed
            .fetch_max(generation, Ordering::AcqRel);
    }

    /// Whether every record so far completed.
    pub(crate) fn done(&self) -> bool {
        let c = self.counters();
        c.completed.load(Ordering::Acquire) >= c.recorded.load(Ordering::Acquire)
    }

    /// Opened from another process: waits until the records made so far
    /// completed, or the exporter is gone.
    pub(crate) fn wait_for_exporter(&self) {
        let Some((pid, start_time)) = self.exporter else {
            return;
        };
        let target = self.counters().recorded.load(Ordering::Acquire);
        let mut polls = 0u32;
        while self.counters().completed.load(Ordering::Acquire) < target {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(1000) && crate::shm::start_time(pid) != Some(start_time) {
                return;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Whether this process opened the event (rather than created it).
    pub(crate) fn opened(&self) -> bool {
        self.exporter.is_some()
    }
}

fn map(fd: i32) -> Option<*const Counters> {
    // SAFETY: a shared mapping of one page of an open file at a
    // kernel-chosen address.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    (addr != libc::MAP_FAILED).then_some(addr as *const Counters)
}

fn own_pid() -> u64 {
    u64::from(std::process::id())
}

fn get_event_handle(_: bool, h: *mut IpcEventHandle, e: CUevent) -> Res {
    drv()?;
    if h.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let event = EVENTS.get(e as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let fd = event
        .shared()
        .and_then(|s| s.fd.as_ref())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut reserved = [0u8; 64];
    reserved[..4].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
    let pid = own_pid();
    let words = [
        pid,
        crate::shm::start_time(pid).unwrap_or(0),
        fd.as_raw_fd() as u64,
    ];
    for (i, w) in words.iter().enumerate() {
        reserved[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    out(h, IpcEventHandle { reserved })
}

fn open_event_handle(_: bool, e: *mut CUevent, h: IpcEventHandle) -> Res {
    current()?;
    if e.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let word = |i: usize| u64::from_le_bytes(h.reserved[8 + 8 * i..16 + 8 * i].try_into().unwrap());
    if h.reserved[..4] != HANDLE_MAGIC.to_le_bytes() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (pid, start_time, fd) = (word(0), word(1), word(2));
    if pid == own_pid() {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    if crate::shm::start_time(pid) != Some(start_time) {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    let path = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}"))
        .map_err(|_| CUDA_ERROR_INVALID_HANDLE)?;
    // SAFETY: path is NUL-terminated; the flags create nothing.
    let raw = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    // SAFETY: a descriptor this call opened and owns.
    let file = unsafe { OwnedFd::from_raw_fd(raw) };
    let counters = map(file.as_raw_fd()).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let shared = SharedEvent {
        counters,
        fd: None,
        exporter: Some((pid, start_time)),
    };
    let flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    let event = Event::interprocess(flags, shared);
    out(e, EVENTS.insert(Arc::new(event)) as CUevent)
}
