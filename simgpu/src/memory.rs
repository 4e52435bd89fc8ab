//! Per-process device memory: one lazily backed arena per device (device
//! pointers are addresses in it, so copies are plain memcpy), a first-fit
//! allocator, and the virtual-memory-management (cuMemCreate/cuMemMap) pieces.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Device pointer alignment (cudaMalloc guarantees at least 256 B).
pub(crate) const ALIGN: usize = 256;
/// Accounting granularity: every allocation is charged rounded up to this.
pub(crate) const CHARGE_GRANULE: u64 = 512;
/// VMM granularity reported by cuMemGetAllocationGranularity.
pub(crate) const VMM_GRANULE: usize = 2 << 20;
/// Frees at least this big give their pages back with MADV_DONTNEED.
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
    fit: Mutex<FirstFit>,
}

impl Arena {
    /// Reserves `size` bytes of lazily backed address space (costs nothing
    /// until touched).
    pub(crate) fn new(size: usize) -> Result<Arena, String> {
        // SAFETY: anonymous private mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "simgpu: cannot reserve {size} bytes of address space for device memory: {}",
                std::io::Error::last_os_error()
            ));
        }
        let mut fit = FirstFit::default();
        fit.free.insert(0, size);
        Ok(Arena {
            base: p as usize,
            size,
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
            let page = 4096;
            let a = (self.base + off).div_ceil(page) * page;
            let b = (self.base + off + len) / page * page;
            if b > a {
                // SAFETY: [a, b) lies inside our arena mapping and belongs to
                // the block just freed; nobody may use it any more.
                unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED) };
            }
        }
        Some(len)
    }

    /// The live block containing `ptr`: (start, len).
    pub(crate) fn range_of(&self, ptr: usize) -> Option<(usize, usize)> {
        let off = ptr.checked_sub(self.base)?;
        let f = self.fit.lock().unwrap_or_else(|e| e.into_inner());
        let (&o, &l) = f.live.range(..=off).next_back()?;
        (off < o + l).then_some((self.base + o, l))
    }
}

/// A physical allocation made by cuMemCreate: one memfd, so every mapping of
/// it aliases the same bytes. Charged until the handle is released and every
/// mapping of it is gone.
pub(crate) struct Phys {
    pub fd: i32,
    pub size: usize,
    pub dev: usize,
    pub charge: u64,
}

impl Phys {
    pub(crate) fn new(size: usize, dev: usize, charge: u64) -> Option<Phys> {
        // SAFETY: the name is a valid C string.
        let fd = unsafe { libc::memfd_create(c"simgpu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd is the memfd we just created.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
            return None;
        }
        Some(Phys {
            fd,
            size,
            dev,
            charge,
        })
    }
}

impl Drop for Phys {
    fn drop(&mut self) {
        // SAFETY: we own fd.
        unsafe { libc::close(self.fd) };
        if let Ok(d) = crate::driver::drv() {
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
