//! Mapping `#[repr(C)]` layouts of atomics into shared memory.
//!
//! A region is a file (normally under `/dev/shm`) holding one `T`. The
//! process that creates the file initialises it and only then publishes the
//! layout's magic number; every other process waits for the magic before
//! using the region. No lock is held once a region is mapped.

use std::ffi::CString;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A layout that can live in a shared region: all-zero bytes must be a
/// valid (uninitialised) value, and `header` points at its magic word.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only atomics and plain
/// integers, and be valid when zero-filled.
pub unsafe trait SharedLayout: Sync {
    /// Non-zero value stored in the header once the creator has initialised
    /// the region; it also identifies the layout and its version.
    const MAGIC: u64;
    fn magic(&self) -> &AtomicU64;
}

/// A mapped region holding one `T`, unmapped on drop.
pub struct Region<T: SharedLayout> {
    address: *mut libc::c_void,
    length: usize,
    created: bool,
    _layout: PhantomData<T>,
}

// SAFETY: T is Sync (atomics only) and the mapping lives as long as Region.
unsafe impl<T: SharedLayout> Send for Region<T> {}
// SAFETY: as above; all access goes through &T, which is Sync.
unsafe impl<T: SharedLayout> Sync for Region<T> {}

impl<T: SharedLayout> std::ops::Deref for Region<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the mapping is at least size_of::<T>() bytes, page aligned,
        // and T is valid for any bytes a creator may have left (atomics).
        unsafe { &*(self.address as *const T) }
    }
}

impl<T: SharedLayout> Drop for Region<T> {
    fn drop(&mut self) {
        // SAFETY: address/length are exactly what mmap returned.
        unsafe { libc::munmap(self.address, self.length) };
    }
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn map_fd<T: SharedLayout>(fd: libc::c_int, writable: bool) -> std::io::Result<*mut libc::c_void> {
    let protection = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: fd is an open file at least size_of::<T>() long; a fresh shared mapping.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            std::mem::size_of::<T>(),
            protection,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(address)
}

impl<T: SharedLayout> Region<T> {
    /// Opens the region at `path`, creating and initialising it with `init`
    /// (called once, by the creator only) if it does not exist. `mode` is the
    /// file's permission bits when created.
    pub fn open_or_create(path: &Path, mode: u32, init: impl FnOnce(&T)) -> std::io::Result<Self> {
        let name = c_path(path)?;
        let length = std::mem::size_of::<T>();
        // SAFETY: name is NUL-terminated; flags request exclusive creation.
        let fd = unsafe {
            libc::open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        let (fd, created) = if fd >= 0 {
            // SAFETY: fd is ours; extending a new file zero-fills it.
            if unsafe { libc::ftruncate(fd, length as libc::off_t) } != 0 {
                let error = std::io::Error::last_os_error();
                // SAFETY: closing our own fd and removing the file we created.
                unsafe {
                    libc::close(fd);
                    libc::unlink(name.as_ptr());
                }
                return Err(error);
            }
            (fd, true)
        } else {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EEXIST) {
                return Err(error);
            }
            // SAFETY: name is NUL-terminated.
            let fd = unsafe { libc::open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            wait_for_length(fd, length)?;
            (fd, false)
        };
        let mapped = map_fd::<T>(fd, true);
        // SAFETY: the mapping (if any) keeps the file alive; the fd is no longer needed.
        unsafe { libc::close(fd) };
        let region: Region<T> = Region {
            address: mapped?,
            length,
            created,
            _layout: PhantomData,
        };
        if created {
            init(&region);
            region.magic().store(T::MAGIC, Ordering::Release);
        } else {
            region.wait_for_magic()?;
        }
        Ok(region)
    }

    /// A region in anonymous shared memory: private to this process and the
    /// children it forks, which keep sharing it. `init` runs before return.
    pub fn anonymous(init: impl FnOnce(&T)) -> std::io::Result<Self> {
        let length = std::mem::size_of::<T>();
        // SAFETY: a fresh anonymous shared mapping; zero-filled by the kernel.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                length,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let region: Region<T> = Region {
            address,
            length,
            created: true,
            _layout: PhantomData,
        };
        init(&region);
        region.magic().store(T::MAGIC, Ordering::Release);
        Ok(region)
    }

    /// Maps an already open file descriptor (e.g. received over a socket).
    /// `writable: false` maps it read-only, so the process cannot change it.
    pub fn from_fd(fd: libc::c_int, writable: bool) -> std::io::Result<Self> {
        let length = std::mem::size_of::<T>();
        wait_for_length(fd, length)?;
        let region: Region<T> = Region {
            address: map_fd::<T>(fd, writable)?,
            length,
            created: false,
            _layout: PhantomData,
        };
        region.wait_for_magic()?;
        Ok(region)
    }

    /// Whether this process created (and initialised) the region.
    pub fn created(&self) -> bool {
        self.created
    }

    fn wait_for_magic(&self) -> std::io::Result<()> {
        // The creator initialises in microseconds; a magic that never
        // appears means a creator died mid-way or a different layout.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let magic = self.magic().load(Ordering::Acquire);
            if magic == T::MAGIC {
                return Ok(());
            }
            if magic != 0 || Instant::now() > deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "shared region has magic {magic:#x}, expected {:#x}",
                        T::MAGIC
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn wait_for_length(fd: libc::c_int, length: usize) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        // SAFETY: fstat on an open fd into a zeroed stat buffer.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if stat.st_size as usize >= length {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("shared region is {} bytes, expected {length}", stat.st_size),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
