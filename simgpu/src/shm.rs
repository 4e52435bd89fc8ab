//! The device state every process of one simulated GPU instance shares: a
//! `#[repr(C)]` struct of atomics in a file under /dev/shm, mapped
//! MAP_SHARED. Created race-free: the creator (O_CREAT|O_EXCL) initialises
//! the file and publishes the magic last; others wait for the magic.

use crate::config::MAX_DEVICES;
use crate::shm_exports::{ExportTable, Released};
use std::ffi::CString;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};

const MAGIC: u64 = 0x5349_4d47_5055_0006; // "SIMGPU" + layout 6
const VERSION: u64 = 6;
pub(crate) const MAX_SLOTS: usize = 256;
/// Slot pid value while a process is filling in its slot or reclaiming one.
const BUSY: u64 = u64::MAX;

#[repr(C)]
pub(crate) struct ShmDevice {
    pub capacity: AtomicU64,
    pub used: AtomicU64,
    /// Device timeline: the latest end of a kernel (segment) so far (ns).
    pub busy_until: AtomicU64,
    /// Who holds the device (`timeslice::Holder`, encoded).
    pub slice: AtomicU64,
    /// Bumped at every change of `slice` that waiters care about; they
    /// sleep on it (futex).
    pub slice_changes: AtomicU32,
    _pad32: u32,
    /// Device time during which kernels of any process ran, ever (ns): the
    /// simulated NVML samples utilisation from its growth.
    pub busy_ns: AtomicU64,
    /// Serial sharing only: the slice before the current one, as `slice`
    /// held it (0 while being rewritten), and when it ended (ns): work that
    /// became ready in it but was processed late still happened in it.
    pub previous_slice: AtomicU64,
    pub previous_slice_end: AtomicU64,
}

#[repr(C)]
pub(crate) struct ShmSlot {
    pub pid: AtomicU64,
    pub start_time: AtomicU64,
    pub used: [AtomicU64; MAX_DEVICES],
    /// Kernels (and event records waiting for the device) this process has
    /// queued on each device and not yet completed: a process with any has
    /// work for the device.
    pub queued: [AtomicU64; MAX_DEVICES],
    /// Device time reserved for this process's kernels on each device (ns).
    pub busy_ns: [AtomicU64; MAX_DEVICES],
    /// Bit d set: the process has a context on device d (NVML lists it as a
    /// running process there).
    pub active_devices: AtomicU64,
}

/// One live process of the shared device, as NVML reports it.
#[allow(dead_code)] // read by the simulated NVML (simgpu/nvml includes this file)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessUsage {
    pub slot: usize,
    pub pid: u32,
    pub used_bytes: u64,
    pub busy_ns: u64,
}

#[repr(C)]
pub(crate) struct ShmLayout {
    magic: AtomicU64,
    version: AtomicU64,
    pub ndev: AtomicU64,
    /// The sharing model every process of the instance uses
    /// (`Sharing::code`), fixed by the process that created it.
    sharing: AtomicU64,
    _pad: [u64; 4],
    pub devs: [ShmDevice; MAX_DEVICES],
    pub slots: [ShmSlot; MAX_SLOTS],
    /// Memory shared between processes (IPC and shareable handles).
    pub exports: ExportTable,
}

pub(crate) struct Shm {
    layout: &'static ShmLayout,
    pub slot: usize,
    /// The instance file, kept open with a shared `flock` for the process's
    /// life: the last process out can tell that nobody else uses the file
    /// and remove it, so instances do not pile up in /dev/shm.
    held: libc::c_int,
    path: CString,
}

/// (device, inode, links) of an open file, or None.
fn identity(fd: libc::c_int) -> Option<(u64, u64, u64)> {
    // SAFETY: zeroed stat is a valid out-parameter for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open, st is writable.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((
        st.st_dev as u64,
        st.st_ino as u64,
        st.st_nlink as u64,
    ))
}

/// Removes this user's instance files in `/dev/shm` that no process holds
/// (every user of an instance holds a shared `flock` on it for its life):
/// what runs whose processes were all killed left behind. `own` (the
/// instance being opened) is left to the opener. An opener that races the
/// removal sees the file unlinked after its lock and starts a fresh one.
fn sweep_stale_instances(own: &str) {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let prefix = format!("simgpu-{uid}-");
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(&prefix) || path.to_str() == Some(own) {
            continue;
        }
        let Ok(cpath) = CString::new(path.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: cpath is NUL-terminated; the flags open no terminal and
        // follow no link.
        let fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            continue;
        }
        // SAFETY: zeroed stat is a valid out-parameter for fstat/lstat.
        let mut held: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut named: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and ours; the stats are writable; flock does
        // not wait (LOCK_NB).
        let stale = unsafe {
            libc::fstat(fd, &mut held) == 0
                && held.st_mode & libc::S_IFMT == libc::S_IFREG
                && held.st_uid == uid
                && libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) == 0
                && libc::lstat(cpath.as_ptr(), &mut named) == 0
                && (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
        };
        if stale {
            // SAFETY: cpath names the file we hold locked, which no process uses.
            unsafe { libc::unlink(cpath.as_ptr()) };
        }
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
    }
}

/// Process start time (field 22 of /proc/<pid>/stat), or None if the
/// process does not exist.
/// Least time between two reclaims of dead processes' slots made for
/// utilisation samples ([`Shm::processes_on_devices`]).
const RECLAIM_SPACING_NS: u64 = 100_000_000;

pub(crate) fn start_time(pid: u64) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn os_err(what: &str, path: &str) -> String {
    format!(
        "simgpu: cannot {what} shared device state {path}: {}",
        std::io::Error::last_os_error()
    )
}

impl Shm {
    pub(crate) fn path_for(instance: &str) -> String {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        format!("/dev/shm/simgpu-{uid}-{instance}")
    }

    /// Opens (creating if needed) the instance and claims a process slot.
    /// Attaches this process to the instance as a user of the device with
    /// the sharing model `sharing` (`Sharing::code`): the instance's own, or
    /// an error naming both.
    pub(crate) fn attach(
        instance: &str,
        ndev: usize,
        capacity: u64,
        sharing: u64,
    ) -> Result<Shm, String> {
        let mut shm = Self::open(instance, ndev, capacity, Some(sharing))?;
        shm.slot = shm.claim_slot()?;
        Ok(shm)
    }

    fn open(
        instance: &str,
        ndev: usize,
        capacity: u64,
        sharing: Option<u64>,
    ) -> Result<Shm, String> {
        let path = Self::path_for(instance);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| sweep_stale_instances(&path));
        let cpath = CString::new(path.clone()).map_err(|_| "simgpu: bad path".to_string())?;
        let size = std::mem::size_of::<ShmLayout>();
        let mut attempts = 0;
        let (fd, creator) = loop {
            attempts += 1;
            let (fd, creator) = Self::open_file(&cpath, &path, size)?;
            // SAFETY: flock on the descriptor just opened.
            unsafe { libc::flock(fd, libc::LOCK_SH) };
            // A last user may have removed the file between our open and
            // our lock: then start again with a fresh one.
            if identity(fd).is_some_and(|(_, _, links)| links > 0) || attempts > 100 {
                break (fd, creator);
            }
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
        };
        if !creator {
            // Wait for the creator to size the file (it does so immediately).
            let deadline = crate::now_ns() + 5_000_000_000;
            loop {
                // SAFETY: zeroed stat is a valid out-parameter for fstat.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: fd is open, st is writable.
                if unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_size as usize >= size {
                    break;
                }
                if crate::now_ns() > deadline {
                    // SAFETY: fd is ours.
                    unsafe { libc::close(fd) };
                    return Err(format!(
                        "simgpu: shared device state {path} was never initialised; remove it"
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        // SAFETY: mapping `size` bytes of a file at least that large.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = os_err("map", &path);
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: the mapping is page aligned, `size` bytes, zero-filled or
        // initialised by a creator, lives for the whole process (never
        // unmapped) and contains only atomics, so shared access is sound.
        let layout: &'static ShmLayout = unsafe { &*(ptr as *const ShmLayout) };
        if creator {
            let ndev = ndev.min(MAX_DEVICES);
            layout.version.store(VERSION, Relaxed);
            layout.ndev.store(ndev as u64, Relaxed);
            layout
                .sharing
                .store(sharing.unwrap_or_else(observer_sharing), Relaxed);
            for d in &layout.devs[..ndev] {
                d.capacity.store(capacity, Relaxed);
            }
            layout.magic.store(MAGIC, Release);
        } else {
            let deadline = crate::now_ns() + 5_000_000_000;
            while layout.magic.load(Acquire) != MAGIC {
                if crate::now_ns() > deadline {
                    return Err(format!(
                        "simgpu: shared device state {path} has no valid header; remove it"
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if layout.version.load(Relaxed) != VERSION {
                return Err(format!(
                    "simgpu: shared device state {path} has another layout version; remove it"
                ));
            }
            let theirs = layout.sharing.load(Relaxed);
            if let Some(mine) = sharing
                && mine != theirs
            {
                return Err(format!(
                    "simgpu: instance {instance} shares its device as SIMGPU_SHARING={}, this process asked for {}: every process of an instance must use the same",
                    crate::config::Sharing::name_of(theirs),
                    crate::config::Sharing::name_of(mine)
                ));
            }
        }
        let shm = Shm {
            layout,
            slot: usize::MAX,
            held: fd,
            path: cpath,
        };
        shm.reclaim_dead();
        Ok(shm)
    }

    /// Opens the instance file, creating and sizing it if it does not exist;
    /// never through a symbolic link. Returns (fd, created).
    fn open_file(cpath: &CString, path: &str, size: usize) -> Result<(libc::c_int, bool), String> {
        // SAFETY: cpath is a valid NUL-terminated string.
        let fd = unsafe {
            libc::open(
                cpath.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600,
            )
        };
        if fd < 0 {
            // SAFETY: as above.
            let fd = unsafe {
                libc::open(
                    cpath.as_ptr(),
                    libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                )
            };
            if fd < 0 {
                return Err(os_err("open", path));
            }
            return Ok((fd, false));
        }
        // SAFETY: fd is an open file we own.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            let e = os_err("size", path);
            // SAFETY: fd is ours; path was created by us.
            unsafe {
                libc::close(fd);
                libc::unlink(cpath.as_ptr());
            }
            return Err(e);
        }
        Ok((fd, true))
    }

    pub(crate) fn ndev(&self) -> usize {
        self.layout.ndev.load(Relaxed) as usize
    }

    pub(crate) fn dev(&self, phys: usize) -> &'static ShmDevice {
        &self.layout.devs[phys]
    }

    fn claim_slot(&self) -> Result<usize, String> {
        let pid = std::process::id() as u64;
        let st = start_time(pid).unwrap_or(1);
        for (i, s) in self.layout.slots.iter().enumerate() {
            if s.pid.compare_exchange(0, BUSY, AcqRel, Relaxed).is_ok() {
                s.start_time.store(st, Relaxed);
                s.pid.store(pid, Release);
                return Ok(i);
            }
        }
        Err("simgpu: all process slots of the shared device are in use".into())
    }

    /// Returns the memory of every process that died without releasing its
    /// slot. A dead slot is claimed with a CAS on its pid, so two scanners
    /// never subtract the same usage twice.
    pub(crate) fn reclaim_dead(&self) {
        let me = std::process::id() as u64;
        for s in self.layout.slots.iter() {
            let pid = s.pid.load(Acquire);
            if pid == 0 || pid == BUSY || pid == me {
                continue;
            }
            let recorded = s.start_time.load(Relaxed);
            let alive = match start_time(pid) {
                Some(t) => t == recorded,
                None => false,
            };
            if alive {
                continue;
            }
            if s.pid.compare_exchange(pid, BUSY, AcqRel, Relaxed).is_ok() {
                self.drain_slot(s, pid);
                s.pid.store(0, Release);
            }
        }
    }

    /// The table of memory shared between processes.
    pub(crate) fn exports(&self) -> &'static ExportTable {
        &self.layout.exports
    }

    /// Returns an exporter's charge whose last mapping is gone (unless the
    /// exporter's slot was drained meanwhile, which returned it).
    pub(crate) fn return_charge(&self, r: Released) {
        let Some(slot) = self.layout.slots.get(r.slot) else {
            return;
        };
        let pid = slot.pid.load(Acquire);
        if (pid != r.pid && pid != BUSY) || r.phys >= MAX_DEVICES {
            return;
        }
        let returned = slot.used[r.phys]
            .fetch_update(AcqRel, Acquire, |u| u.checked_sub(r.bytes))
            .is_ok();
        if returned {
            self.dev(r.phys).used.fetch_sub(r.bytes, AcqRel);
        }
    }

    /// Kernels queued and not yet started by the process in `slot` on
    /// device `phys`.
    pub(crate) fn queued(&self, slot: usize, phys: usize) -> &'static AtomicU64 {
        &self.layout.slots[slot.min(MAX_SLOTS - 1)].queued[phys]
    }

    /// Slots of live processes with kernels queued on device `phys`.
    pub(crate) fn slots_with_work(&self, phys: usize) -> impl Iterator<Item = usize> + '_ {
        self.layout
            .slots
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| {
                let pid = s.pid.load(Relaxed);
                (pid != 0 && pid != BUSY && s.queued[phys].load(Acquire) > 0).then_some(i)
            })
    }

    /// Whether the process in `slot` is still the one that claimed it.
    pub(crate) fn slot_alive(&self, slot: usize) -> bool {
        let Some(s) = self.layout.slots.get(slot) else {
            return false;
        };
        let pid = s.pid.load(Acquire);
        pid != 0 && (pid == BUSY || start_time(pid) == Some(s.start_time.load(Relaxed)))
    }

    fn drain_slot(&self, s: &ShmSlot, pid: u64) {
        let index = self
            .layout
            .slots
            .iter()
            .position(|other| std::ptr::eq(other, s))
            .unwrap_or(MAX_SLOTS);
        for charge in self.layout.exports.forget_process(index, pid) {
            self.return_charge(charge);
        }
        for queued in &s.queued {
            queued.store(0, Relaxed);
        }
        for busy in &s.busy_ns {
            busy.store(0, Relaxed);
        }
        s.active_devices.store(0, Relaxed);
        for (d, used) in s.used.iter().enumerate() {
            let n = used.swap(0, AcqRel);
            if n > 0 {
                self.layout.devs[d].used.fetch_sub(n, AcqRel);
            }
        }
    }

    /// Atomic check-and-add against the device capacity. Refused once the
    /// process's exit released its slot: a charge then would stay behind in
    /// a slot nobody owns.
    pub(crate) fn charge(&self, phys: usize, bytes: u64) -> bool {
        let mine = std::process::id() as u64;
        if self.layout.slots[self.slot].pid.load(Acquire) != mine {
            return false;
        }
        let dev = self.dev(phys);
        for attempt in 0..2 {
            let cap = dev.capacity.load(Relaxed);
            let ok = dev
                .used
                .fetch_update(AcqRel, Acquire, |u| {
                    u.checked_add(bytes).filter(|&n| n <= cap)
                })
                .is_ok();
            if ok {
                self.layout.slots[self.slot].used[phys].fetch_add(bytes, AcqRel);
                return true;
            }
            if attempt == 0 {
                self.reclaim_dead();
            }
        }
        let (used, cap) = (dev.used.load(Acquire), dev.capacity.load(Relaxed));
        static SAID: std::sync::Once = std::sync::Once::new();
        if used > cap {
            // Never so unless usage was given back twice: say it, since the
            // program only sees out-of-memory.
            SAID.call_once(|| {
                eprintln!(
                    "simgpu: device {phys}'s shared memory count reads {used} of {cap} bytes; \
                     remove {} to reset it",
                    self.path.to_string_lossy()
                )
            });
        }
        false
    }

    /// Gives back `bytes` this process charged on `phys`: only what its slot
    /// still holds. A free that runs after the slot was drained (a stream
    /// worker finishing a stream-ordered free while the process exits, after
    /// `release`) was given back by the drain; subtracted again, it wrapped
    /// the device's count below zero and every later allocation there
    /// failed as out of memory.
    pub(crate) fn uncharge(&self, phys: usize, bytes: u64) {
        let held = self.layout.slots[self.slot].used[phys]
            .fetch_update(AcqRel, Acquire, |u| u.checked_sub(bytes))
            .is_ok();
        if held {
            self.dev(phys).used.fetch_sub(bytes, AcqRel);
        }
    }

    /// (free, total) of a device, after reclaiming dead processes' memory.
    pub(crate) fn mem_info(&self, phys: usize) -> (u64, u64) {
        self.reclaim_dead();
        let dev = self.dev(phys);
        let cap = dev.capacity.load(Relaxed);
        let used = dev.used.load(Acquire);
        (cap.saturating_sub(used), cap)
    }

    /// Records that this process has a context on device `phys`.
    pub(crate) fn mark_active(&self, phys: usize) {
        if let Some(s) = self.layout.slots.get(self.slot) {
            s.active_devices.fetch_or(1 << phys, Relaxed);
        }
    }

    /// Counts `ns` of device time reserved for this process on `phys`.
    pub(crate) fn add_busy(&self, phys: usize, ns: u64) {
        self.dev(phys).busy_ns.fetch_add(ns, Relaxed);
        if let Some(s) = self.layout.slots.get(self.slot) {
            s.busy_ns[phys].fetch_add(ns, Relaxed);
        }
    }

    /// Releases this process's slot and usage (normal exit).
    pub(crate) fn release(&self) {
        let s = &self.layout.slots[self.slot];
        let pid = std::process::id() as u64;
        if s.pid.compare_exchange(pid, BUSY, AcqRel, Relaxed).is_ok() {
            self.drain_slot(s, pid);
            s.pid.store(0, Release);
        }
        self.remove_if_last();
    }

    /// Removes the instance file when no live process has a slot and no
    /// other open of the file holds it (ours is the last use); otherwise
    /// drops this open's shared lock, so that whoever leaves last can tell.
    /// Called only as the process exits: a process that opened the file
    /// twice (its driver and its NVML, each with its own lock) left it
    /// behind when each of its two leavers saw the other's lock.
    fn remove_if_last(&self) {
        self.reclaim_dead();
        let last = !self.layout.slots.iter().any(|s| s.pid.load(Acquire) != 0)
            // SAFETY: flock on our own descriptor; non-blocking.
            && unsafe { libc::flock(self.held, libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if !last {
            // SAFETY: flock on our own descriptor.
            unsafe { libc::flock(self.held, libc::LOCK_UN) };
            return;
        }
        // SAFETY: zeroed stat is a valid out-parameter for lstat.
        let mut named: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: path is NUL-terminated, named is writable.
        let found = unsafe { libc::lstat(self.path.as_ptr(), &mut named) } == 0;
        if found
            && identity(self.held).is_some_and(|(dev, ino, _)| {
                dev == named.st_dev as u64 && ino == named.st_ino as u64
            })
        {
            // SAFETY: path is NUL-terminated; it names the file we hold.
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
    }
}

/// The sharing model an observer (the simulated NVML) creating the
/// instance records: the one the processes it observes will ask for, from
/// the same setting (`SIMGPU_SHARING`, time-sliced unless `serial`; a bad
/// value is reported by the driver, not here).
fn observer_sharing() -> u64 {
    match std::env::var("SIMGPU_SHARING").as_deref() {
        Ok("serial") => 0,
        _ => 1,
    }
}

/// What the simulated NVML reads (simgpu/nvml includes this file; the driver
/// itself uses none of it).
#[allow(dead_code)]
impl Shm {
    /// Opens (creating if needed) the instance without claiming a process
    /// slot: an observer such as the simulated NVML, which is no CUDA
    /// process and must not appear as one.
    pub(crate) fn observe(instance: &str, ndev: usize, capacity: u64) -> Result<Shm, String> {
        Self::open(instance, ndev, capacity, None)
    }

    /// An observer's exit: removes the instance file if it is the last
    /// use, else lets go of it.
    pub(crate) fn leave(&self) {
        self.remove_if_last();
    }

    /// Device time reserved for kernels of all processes on `phys`, ever.
    pub(crate) fn device_busy_ns(&self, phys: usize) -> u64 {
        self.dev(phys).busy_ns.load(Relaxed)
    }

    /// (used, capacity) of device `phys`, after reclaiming dead processes.
    pub(crate) fn used_and_capacity(&self, phys: usize) -> (u64, u64) {
        let (free, cap) = self.mem_info(phys);
        (cap - free, cap)
    }

    /// Live processes with a context or memory on device `phys`, in slot
    /// order (dead ones are reclaimed first).
    pub(crate) fn processes(&self, phys: usize) -> Vec<ProcessUsage> {
        self.reclaim_dead();
        self.listed(phys)
    }

    /// [`Shm::processes`] of each of the first `ndev` devices, for
    /// utilisation samples, which every process of a tenant under dilu
    /// takes about every 50 ms: dead processes are reclaimed at most once
    /// per [`RECLAIM_SPACING_NS`] here (each reclaim reads every other
    /// process's `/proc/<pid>/stat`; once per device and query it cost a
    /// 2-core host with 24 such processes most of its time).
    pub(crate) fn processes_on_devices(&self, ndev: usize) -> Vec<Vec<ProcessUsage>> {
        static LAST_RECLAIM_NS: AtomicU64 = AtomicU64::new(0);
        let now = crate::now_ns();
        let last = LAST_RECLAIM_NS.load(Relaxed);
        if now.saturating_sub(last) >= RECLAIM_SPACING_NS
            && LAST_RECLAIM_NS
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.reclaim_dead();
        }
        (0..ndev).map(|phys| self.listed(phys)).collect()
    }

    /// Processes with a context or memory on device `phys` as the table
    /// lists them now.
    fn listed(&self, phys: usize) -> Vec<ProcessUsage> {
        let mut out = Vec::new();
        for (slot, s) in self.layout.slots.iter().enumerate() {
            let pid = s.pid.load(Acquire);
            if pid == 0 || pid == BUSY {
                continue;
            }
            let used_bytes = s.used[phys].load(Relaxed);
            let busy_ns = s.busy_ns[phys].load(Relaxed);
            let active = s.active_devices.load(Relaxed) & (1 << phys) != 0;
            if !active && used_bytes == 0 && busy_ns == 0 {
                continue;
            }
            out.push(ProcessUsage {
                slot,
                pid: pid as u32,
                used_bytes,
                busy_ns,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_after_the_exit_released_the_slot_gives_nothing_back_twice() {
        let instance = format!("shm-test-{}-late-free", std::process::id());
        let gib = 1u64 << 30;
        // An observer (as the node manager's NVML) keeps the instance open
        // between the two processes.
        let observer = Shm::observe(&instance, 1, gib).expect("observe");
        let exiting = Shm::attach(&instance, 1, gib, 1).expect("attach");
        assert!(exiting.charge(0, 64 << 20));
        // The exit drains the slot, returning its 64 MiB ...
        exiting.release();
        assert_eq!(observer.dev(0).used.load(Acquire), 0);
        // ... and a stream worker's free of the same memory comes after it,
        // or an allocation.
        exiting.uncharge(0, 64 << 20);
        assert_eq!(observer.dev(0).used.load(Acquire), 0, "counted below zero");
        assert!(!exiting.charge(0, 1 << 20), "charged to a released slot");
        assert_eq!(observer.dev(0).used.load(Acquire), 0);
        let next = Shm::attach(&instance, 1, gib, 1).expect("attach again");
        assert!(next.charge(0, 64 << 20), "the next process can allocate");
        next.release();
        observer.leave();
    }
}
