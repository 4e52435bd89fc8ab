//! Per-process device memory: one lazily backed arena per device (device
//! pointers are addresses in it, so copies are plain memcpy), a first-fit
//! allocator, and the virtual-memory-management (cuMemCreate/cuMemMap) pieces.
//!
//! The arena is a memfd mapped shared, so another process can map the same
//! bytes (`cuIpcOpenMemHandle` opens it through `/proc/<pid>/fd`).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Device pointer alignment (cudaMalloc guarantees at least 256 B).
pub(crate) const ALIGN: usize = 256;
/// Accounting granularity: every allocation is charged rounded up to this.
pub(crate) const CHARGE_GRANULE: u64 = 512;
/// VMM granularity reported by cuMemGetAllocationGranularity.
pub(crate) const VMM_GRANULE: usize = 2 << 20;
/// Frees at least this big give their pages back (a hole punched in the
/// memfd).
const DONTNEED_MIN: usize = 1 << 20;

pub(crate) fn charged(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(CHARGE_GRANULE) * CHARGE_GRANULE
}

#[derive(Default)]
struct FirstFit {
    /// offset -> length of free blocks (coalesced).
    free: BTreeMap<usize, usize>,
    /// offset -> length of live blocks.
    live: BTreeMap<usize, usize>,
}

pub(crate) struct Arena {
    pub base: usize,
    pub size: usize,
    /// The memfd behind the arena (-1: an anonymous private mapping, where
    /// memfds are unavailable; nothing can be shared between processes then).
    pub fd: i32,
    fit: Mutex<FirstFit>,
}

impl Arena {
    /// Reserves `size` bytes of lazily backed address space (costs nothing
    /// until touched).
    pub(crate) fn new(size: usize) -> Result<Arena, String> {
        let fd = shareable_memfd(size);
        let (flags, map_fd) = if fd >= 0 {
            (libc::MAP_SHARED | libc::MAP_NORESERVE, fd)
        } else {
            (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
            )
        };
        // SAFETY: a fresh mapping at a kernel-chosen address, of our memfd
        // (sized to `size` above) or anonymous memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                map_fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let error = std::io::Error::last_os_error();
            if fd >= 0 {
                // SAFETY: we own fd and nothing maps it.
                unsafe { libc::close(fd) };
            }
            return Err(format!(
                "simgpu: cannot reserve {size} bytes of address space for device memory: {error}"
            ));
        }
        let mut fit = FirstFit::default();
        fit.free.insert(0, size);
        Ok(Arena {
            base: p as usize,
            size,
            fd,
            fit: Mutex::new(fit),
        })
    }

    pub(crate) fn contains(&self, ptr: usize, len: usize) -> bool {
        ptr >= self.base
            && ptr
                .checked_add(len)
                .is_some_and(|e| e <= self.base + self.size)
    }

    /// First-fit allocation of `len` bytes (a multiple of ALIGN).
    pub(crate) fn alloc(&self, len: usize) -> Option<usize> {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        let mut f = self.fit.lock().unwrap_or_else(|e| e.into_inner());
        let (&off, &flen) = f.free.iter().find(|&(_, &l)| l >= len)?;
        f.free.remove(&off);
        if flen > len {
            f.free.insert(off + len, flen - len);
        }
        f.live.insert(off, len);
        Some(self.base + off)
    }

    /// Frees the block starting at `ptr`; returns its length.
    pub(crate) fn free(&self, ptr: usize) -> Option<usize> {
        let off = ptr.checked_sub(self.base)?;
        let mut f = self.fit.lock().unwrap_or_else(|e| e.into_inner());
        let len = f.live.remove(&off)?;
        let (mut start, mut end) = (off, off + len);
        if let Some((&po, &pl)) = f.free.range(..off).next_back()
            && po + pl == off
        {
            f.free.remove(&po);
            start = po;
        }
        if let Some(&nl) = f.free.get(&end) {
            f.free.remove(&end);
            end += nl;
        }
        f.free.insert(start, end - start);
        drop(f);
        if len >= DONTNEED_MIN {
            self.give_back_pages(off, len);
        }
        Some(len)
    }

    /// Returns the whole pages inside `[off, off+len)` to the system (they
    /// read as zeros afterwards).
    fn give_back_pages(&self, off: usize, len: usize) {
        let page = 4096;
        let a = off.div_ceil(page) * page;
        let b = (off + len) / page * page;
        if b <= a {
            return;
        }
        if self.fd >= 0 {
            // SAFETY: punches a hole in our own memfd, inside the block
            // just freed; nobody may use those bytes any more.
            unsafe {
                libc::fallocate(
                    self.fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    a as libc::off_t,
                    (b - a) as libc::off_t,
                )
            };
        } else {
            // SAFETY: [a, b) lies inside our arena mapping and belongs to
            // the block just freed; nobody may use it any more.
            unsafe {
                libc::madvise(
                    (self.base + a) as *mut libc::c_void,
                    b - a,
                    libc::MADV_DONTNEED,
                )
            };
        }
    }

    /// The live block containing `ptr`: (start, len).
    pub(crate) fn range_of(&self, ptr: usize) -> Option<(usize, usize)> {
        let off = ptr.checked_sub(self.base)?;
        let f = self.fit.lock().unwrap_or_else(|e| e.into_inner());
        let (&o, &l) = f.live.range(..=off).next_back()?;
        (off < o + l).then_some((self.base + o, l))
    }
}

/// A memfd of `size` bytes (sparse: costs nothing until touched), or -1.
pub(crate) fn shareable_memfd(size: usize) -> i32 {
    // SAFETY: the name is a valid C string.
    let fd = unsafe { libc::memfd_create(c"simgpu-device-memory".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return -1;
    }
    // SAFETY: fd is the memfd we just created.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        // SAFETY: as above.
        unsafe { libc::close(fd) };
        return -1;
    }
    fd
}

/// A physical allocation made by cuMemCreate (or imported from another
/// process's shareable handle): one memfd, so every mapping of it aliases
/// the same bytes. Charged until the handle is released and every mapping
/// of it is gone.
pub(crate) struct Phys {
    pub fd: i32,
    pub size: usize,
    pub dev: usize,
    pub charge: u64,
    /// Exported (`cuMemExportToShareableHandle`): its entry in the instance's
    /// export table, (index, key). Its charge then stays until the last
    /// importing process lets go too.
    pub exported: std::sync::Mutex<Option<(usize, u64)>>,
    /// Imported: the import record to close (the exporter keeps the charge).
    pub imported: Option<usize>,
}

impl Phys {
    pub(crate) fn new(size: usize, dev: usize, charge: u64) -> Option<Phys> {
        let fd = shareable_memfd(size);
        (fd >= 0).then(|| Phys {
            fd,
            size,
            dev,
            charge,
            exported: std::sync::Mutex::new(None),
            imported: None,
        })
    }
}

impl Drop for Phys {
    fn drop(&mut self) {
        // SAFETY: we own fd.
        unsafe { libc::close(self.fd) };
        let Ok(d) = crate::driver::drv() else { return };
        let Some(shm) = &d.shm else { return };
        if let Some(record) = self.imported {
            if let Some(charge) = shm.exports().close(record) {
                shm.return_charge(charge);
            }
            return;
        }
        let exported = *self.exported.lock().unwrap_or_else(|e| e.into_inner());
        let returned_now = exported.is_none_or(|(index, key)| {
            shm.exports()
                .let_go(index, u64::from(std::process::id()), key)
        });
        if returned_now {
            d.uncharge(self.dev, self.charge);
        }
    }
}

/// A reserved virtual address range (cuMemAddressReserve).
pub(crate) struct Reservation {
    pub size: usize,
    /// offset -> (len, physical allocation) of live mappings.
    pub maps: BTreeMap<usize, (usize, std::sync::Arc<Phys>)>,
}

/// Maps `[addr, addr+len)` inaccessible again (keeps the reservation).
pub(crate) fn protect_none(addr: usize, len: usize) -> bool {
    // SAFETY: the range lies inside a reservation we own; replacing it with
    // an inaccessible anonymous mapping only affects that range.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    p != libc::MAP_FAILED
}
