//! Mapping `#[repr(C)]` layouts of atomics into shared memory.
//!
//! A region is a file (normally under `/dev/shm`) holding one `T`. The
//! process that creates the file initialises it and only then publishes the
//! layout's magic number; every other process waits for the magic before
//! using the region. No lock is held once a region is mapped.
//!
//! Files are opened as their owner's only: never through a symlink, and an
//! existing file (or its directory) owned by another user or writable by
//! others is refused with one line naming it and its owner. Each process
//! holding a file region keeps a shared `flock` on it for its life, so the
//! last one out (or the next to start, after a crash) can tell that nobody
//! uses it and remove it ([`Region::remove_if_unused`]; files of crashed runs: `sweep.rs`).

use std::ffi::CString;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
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
    /// The open file holding this process's shared lock (file regions;
    /// -1 otherwise). Atomic so a forked child can take its own.
    held: AtomicI32,
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
        let held = self.held.swap(-1, Ordering::AcqRel);
        if held >= 0 {
            // SAFETY: the descriptor is ours (opened by this Region).
            unsafe { libc::close(held) };
        }
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
    /// file's permission bits when created. The directory is created (0700)
    /// if missing; it and an existing file must be this user's (see the
    /// module doc), or the open is refused with one line saying whose they
    /// are. The process keeps a shared lock on the file while the region
    /// lives.
    pub fn open_or_create(path: &Path, mode: u32, init: impl FnOnce(&T)) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            private_dir(dir)?;
        }
        let name = c_path(path)?;
        let length = std::mem::size_of::<T>();
        // A sweeper may unlink the file between our open and our lock:
        // then the open found a dead file, and we start again.
        for _ in 0..100 {
            // SAFETY: name is NUL-terminated; flags request exclusive creation.
            let raw = unsafe {
                libc::open(
                    name.as_ptr(),
                    libc::O_RDWR
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    mode as libc::c_uint,
                )
            };
            let created = raw >= 0;
            let fd = if created {
                // SAFETY: raw was just returned by open.
                unsafe { OwnedFd::from_raw_fd(raw) }
            } else {
                let error = std::io::Error::last_os_error();
                if error.raw_os_error() == Some(libc::ENOENT)
                    && let Some(dir) = path.parent()
                {
                    // The last file's remover took the empty directory
                    // away after we made it: make it again.
                    private_dir(dir)?;
                    continue;
                }
                if error.raw_os_error() != Some(libc::EEXIST) {
                    return Err(error);
                }
                // SAFETY: name is NUL-terminated.
                let raw = unsafe {
                    libc::open(
                        name.as_ptr(),
                        libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    )
                };
                if raw < 0 {
                    let error = std::io::Error::last_os_error();
                    if error.raw_os_error() == Some(libc::ENOENT) {
                        continue; // removed meanwhile
                    }
                    return Err(refusal(path, &error));
                }
                // SAFETY: raw was just returned by open.
                unsafe { OwnedFd::from_raw_fd(raw) }
            };
            check_owned(path, &fd)?;
            // SAFETY: flock on our own descriptor.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_SH) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if file_links(fd.as_raw_fd())? == 0 {
                continue; // a sweeper removed it before we held it
            }
            if created {
                // SAFETY: fd is ours; extending a new file zero-fills it.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), length as libc::off_t) } != 0 {
                    let error = std::io::Error::last_os_error();
                    // SAFETY: removing the file we created.
                    unsafe { libc::unlink(name.as_ptr()) };
                    return Err(error);
                }
            } else {
                wait_for_length(fd.as_raw_fd(), length)?;
            }
            let region: Region<T> = Region {
                address: map_fd::<T>(fd.as_raw_fd(), true)?,
                length,
                created,
                held: AtomicI32::new(std::os::fd::IntoRawFd::into_raw_fd(fd)),
                _layout: PhantomData,
            };
            if created {
                init(&region);
                region.magic().store(T::MAGIC, Ordering::Release);
            } else {
                region.wait_for_magic()?;
            }
            return Ok(region);
        }
        Err(std::io::Error::other(format!(
            "{}: removed again and again while opening it",
            path.display()
        )))
    }

    /// In a forked child: takes a lock of the child's own on the region's
    /// file (the inherited one is shared with the parent, so the parent's
    /// exit could not tell that the child still uses the file).
    pub fn hold_again(&self, path: &Path) {
        let old = self.held.load(Ordering::Acquire);
        if old < 0 {
            return;
        }
        let Ok(name) = c_path(path) else { return };
        // SAFETY: name is NUL-terminated.
        let raw = unsafe {
            libc::open(
                name.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if raw < 0 {
            return;
        }
        // SAFETY: flock on the descriptor just opened.
        unsafe { libc::flock(raw, libc::LOCK_SH) };
        if self
            .held
            .compare_exchange(old, raw, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: the inherited descriptor is this process's copy; the
            // parent's lock lives on in the parent's descriptor.
            unsafe { libc::close(old) };
        } else {
            // SAFETY: ours, unused.
            unsafe { libc::close(raw) };
        }
    }

    /// Removes the region's file at `path` if no other process holds it
    /// (the last user leaving). Returns whether it was removed.
    pub fn remove_if_unused(&self, path: &Path) -> bool {
        let held = self.held.load(Ordering::Acquire);
        // SAFETY: flock on our own descriptor; non-blocking.
        held >= 0
            && unsafe { libc::flock(held, libc::LOCK_EX | libc::LOCK_NB) } == 0
            && remove_if_same(path, held)
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
            held: AtomicI32::new(-1),
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
            held: AtomicI32::new(-1),
            _layout: PhantomData,
        };
        region.wait_for_magic()?;
        Ok(region)
    }

    /// [`Region::from_fd`] without waiting: for descriptors from someone
    /// untrusted, whose region must be complete already (a short file or a
    /// missing magic is refused at once, never waited for).
    pub fn from_fd_now(fd: libc::c_int, writable: bool) -> std::io::Result<Self> {
        let length = std::mem::size_of::<T>();
        let size = file_size(fd)?;
        if size < length as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("shared region is {size} bytes, expected {length}"),
            ));
        }
        let region: Region<T> = Region {
            address: map_fd::<T>(fd, writable)?,
            length,
            created: false,
            held: AtomicI32::new(-1),
            _layout: PhantomData,
        };
        let magic = region.magic().load(Ordering::Acquire);
        if magic != T::MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "shared region has magic {magic:#x}, expected {:#x}",
                    T::MAGIC
                ),
            ));
        }
        Ok(region)
    }

    /// A private copy of the region in the file at `path`, for a reader
    /// that must not map a file someone else can truncate (the daemon reading
    /// a tenant's ledger: a shrunk mapping would kill it with `SIGBUS`). The
    /// file must be a regular file owned by `owner` (no symlink followed); it
    /// is read once, without waiting or blocking.
    pub fn copy_of_file(path: &Path, owner: u32) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() || meta.uid() != owner {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{} is not a regular file of uid {owner} (uid {})",
                    path.display(),
                    meta.uid()
                ),
            ));
        }
        let length = std::mem::size_of::<T>();
        let copy = Region::<T>::anonymous(|_| {})?;
        copy.magic().store(0, Ordering::Relaxed);
        let mut done = 0;
        while done < length {
            // SAFETY: the destination is this process's private anonymous
            // mapping of `length` bytes; T is valid for any bytes (atomics),
            // and no other thread can reach it yet.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    copy.address.cast::<u8>().add(done).cast(),
                    length - done,
                    done as libc::off_t,
                )
            };
            if n <= 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is shorter than a region", path.display()),
                ));
            }
            done += n as usize;
        }
        if copy.magic().load(Ordering::Acquire) != T::MAGIC {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} does not hold an initialised region", path.display()),
            ));
        }
        Ok(copy)
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

pub(crate) fn fstat(fd: libc::c_int) -> std::io::Result<libc::stat> {
    // SAFETY: fstat on an open fd into a zeroed stat buffer.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat)
}

fn file_links(fd: libc::c_int) -> std::io::Result<u64> {
    Ok(fstat(fd)?.st_nlink)
}

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn refusal(path: &Path, error: &std::io::Error) -> std::io::Error {
    if error.raw_os_error() == Some(libc::ELOOP) {
        return std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is a symbolic link; refusing to follow it",
                path.display()
            ),
        );
    }
    std::io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

fn not_ours(path: &Path, what: &str, owner: u32) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "{} belongs to uid {owner}{what}, not to uid {} running this: another user made it; refusing to use it (root can remove it)",
            path.display(),
            euid()
        ),
    )
}

/// An existing region file must be a regular file of ours that no one else
/// may write.
fn check_owned(path: &Path, fd: &OwnedFd) -> std::io::Result<()> {
    let stat = fstat(fd.as_raw_fd())?;
    if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a regular file; refusing to use it",
                path.display()
            ),
        ));
    }
    if stat.st_uid != euid() {
        return Err(not_ours(path, "", stat.st_uid));
    }
    if stat.st_mode & 0o022 != 0 {
        return Err(not_ours(
            path,
            &format!(" and others may write it (mode {:o})", stat.st_mode & 0o777),
            stat.st_uid,
        ));
    }
    Ok(())
}

/// Makes `dir` (mode 0700) if it is missing, then checks that no other user
/// can add, swap or remove files in it: it must be a real directory owned by
/// us or root, and if others may write it, sticky and root's (`/dev/shm`).
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    let meta = loop {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", dir.display()),
                ));
            }
        }
        match std::fs::symlink_metadata(dir) {
            // Emptied and removed meanwhile (the last file's remover
            // takes the directory): make it again.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 100 => tries += 1,
            meta => break meta?,
        }
    };
    if !meta.file_type().is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not a directory; refusing to use it", dir.display()),
        ));
    }
    let (owner, mode) = (meta.uid(), meta.mode());
    if owner != euid() && owner != 0 {
        return Err(not_ours(dir, "", owner));
    }
    if owner == euid() && owner != 0 && mode & 0o077 != 0 {
        // Ours but open to others (made by hand): close it. Files already
        // in it are still checked one by one when opened.
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        return Ok(());
    }
    let shared = mode & 0o022 != 0;
    if shared && !(owner == 0 && mode & 0o1000 != 0) {
        return Err(not_ours(
            dir,
            &format!(" and others may write it (mode {:o})", mode & 0o7777),
            owner,
        ));
    }
    Ok(())
}

/// Whether `dir` is a real directory of `uid` that no one else may write.
fn private_of(dir: &Path, uid: u32) -> bool {
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.file_type().is_dir() && m.uid() == uid && m.mode() & 0o077 == 0)
}

/// A user's region directory under `root`: `dilu-<uid>` unless another user
/// squatted that name; then the first (by name) `dilu-<uid>.<suffix>` that
/// is the user's and private, made with a random suffix if there is none
/// (only by the user's own processes; a reader such as the daemon just
/// finds it). Processes of one user all resolve to the same directory, and
/// no other user can predict a random name to squat it too.
pub fn user_dir(root: &Path, uid: u32) -> PathBuf {
    let primary = root.join(format!("dilu-{uid}"));
    let squatted = match std::fs::symlink_metadata(&primary) {
        Err(_) => false,
        Ok(m) => !(m.file_type().is_dir() && m.uid() == uid),
    };
    if !squatted {
        return primary;
    }
    let prefix = format!("dilu-{uid}.");
    let find = || {
        let mut names: Vec<PathBuf> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .filter(|p| private_of(p, uid))
            .collect();
        names.sort();
        names.into_iter().next()
    };
    if let Some(found) = find() {
        return found;
    }
    if euid() == uid {
        for _ in 0..8 {
            let candidate = root.join(format!("{prefix}{:016x}", random_u64()));
            if std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&candidate)
                .is_ok()
            {
                break;
            }
        }
        if let Some(found) = find() {
            let owner = std::fs::symlink_metadata(&primary).map_or(0, |m| m.uid());
            eprintln!(
                "dilu: {} belongs to uid {owner}, not to uid {uid}: using {} instead",
                primary.display(),
                found.display()
            );
            return found;
        }
    }
    primary
}

fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most bytes.len() bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // No entropy source: time and pid still make the name unguessable
        // enough that a squatter must race us for it.
        return crate::clock::monotonic_ns() ^ (u64::from(std::process::id()) << 40);
    }
    u64::from_ne_bytes(bytes)
}

/// Unlinks `path` if it still names the file open as `fd`; if that was the
/// last file of a user's region directory, the directory goes too.
fn remove_if_same(path: &Path, fd: libc::c_int) -> bool {
    let (Ok(open), Ok(named)) = (fstat(fd), std::fs::symlink_metadata(path)) else {
        return false;
    };
    let removed = open.st_dev == named.dev()
        && open.st_ino == named.ino()
        && std::fs::remove_file(path).is_ok();
    if removed && let Some(dir) = path.parent().filter(|d| is_user_dir(d)) {
        // Fails (ENOTEMPTY) if anything is left or was just created in it;
        // a process about to create a file makes the directory again
        // (see `open_or_create`).
        let _ = std::fs::remove_dir(dir);
    }
    removed
}

/// Whether `dir` is named as a user's primary region directory,
/// `dilu-<uid>` (the squat-avoiding `dilu-<uid>.<random>` ones stay, so that
/// a user's processes keep agreeing on one).
pub(crate) fn is_user_dir(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("dilu-"))
        .is_some_and(|uid| !uid.is_empty() && uid.bytes().all(|b| b.is_ascii_digit()))
}

fn file_size(fd: libc::c_int) -> std::io::Result<u64> {
    Ok(fstat(fd)?.st_size.max(0) as u64)
}

fn wait_for_length(fd: libc::c_int, length: usize) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let size = file_size(fd)?;
        if size >= length as u64 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("shared region is {size} bytes, expected {length}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::TenantLedger;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dilu-shm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Gives `path` to another user; false when this process may not
    /// (the test then has nothing to show).
    fn give_away(path: &Path, uid: u32) -> bool {
        std::os::unix::fs::chown(path, Some(uid), None).is_ok()
    }

    #[test]
    fn a_squatted_user_directory_is_replaced_by_a_private_one_all_processes_find() {
        let root = scratch("squat");
        let me = euid();
        let primary = root.join(format!("dilu-{me}"));
        std::fs::create_dir(&primary).unwrap();
        assert_eq!(user_dir(&root, me), primary, "our own directory is used");
        if !give_away(&primary, me + 4242) {
            return;
        }
        let chosen = user_dir(&root, me);
        assert_ne!(chosen, primary, "a squatted name is not used");
        assert!(private_of(&chosen, me));
        assert_eq!(user_dir(&root, me), chosen, "every process agrees on it");
        let path = chosen.join("t.ledger");
        assert!(Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {}).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_region_file_of_another_user_is_refused_with_its_owner_named() {
        let root = scratch("owner");
        let path = root.join("t.ledger");
        std::fs::write(&path, vec![0u8; std::mem::size_of::<TenantLedger>()]).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        if !give_away(&path, euid() + 4242) {
            return;
        }
        let error = Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {})
            .err()
            .expect("refused")
            .to_string();
        assert!(
            error.contains(&path.display().to_string())
                && error.contains(&format!("uid {}", euid() + 4242))
                && !error.contains('\n'),
            "{error}"
        );
        let link = root.join("link.ledger");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let error = Region::<TenantLedger>::open_or_create(&link, 0o600, |_| {})
            .err()
            .expect("a symlink is refused")
            .to_string();
        assert!(error.contains("symbolic link"), "{error}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Creators racing the removal of the directory's last file: every
    /// creation succeeds (the directory is made again when it went between
    /// a creator's making it and its file's creation).
    #[test]
    fn creating_a_file_never_loses_to_the_directory_s_removal() {
        let root = scratch("race");
        let dir = root.join(format!("dilu-{}", euid()));
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let remover = scope.spawn(|| {
                let path = dir.join("churn.ledger");
                let mut removals = 0;
                while !stop.load(Ordering::Relaxed) {
                    let region = Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {})
                        .expect("the remover's own creation");
                    removals += usize::from(region.remove_if_unused(&path));
                }
                removals
            });
            let creators: Vec<_> = (0..2)
                .map(|t| {
                    let dir = &dir;
                    scope.spawn(move || {
                        for i in 0..300 {
                            let path = dir.join(format!("c{t}-{i}.ledger"));
                            let region =
                                Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {})
                                    .unwrap_or_else(|e| panic!("creating {path:?}: {e}"));
                            assert!(region.remove_if_unused(&path));
                        }
                    })
                })
                .collect();
            let results: Vec<_> = creators.into_iter().map(|c| c.join()).collect();
            stop.store(true, Ordering::Relaxed); // also when a creator failed
            for result in results {
                result.unwrap();
            }
            assert!(remover.join().unwrap() > 0);
        });
        let _ = std::fs::remove_dir_all(&root);
    }
}
