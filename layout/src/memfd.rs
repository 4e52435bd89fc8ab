//! Regions in `memfd`s: what a node manager creates and hands to tenants
//! over a Unix socket.
//!
//! A budget region is made unwritable for everyone but its creator:
//! 1. the creator maps it writable ([`create`]),
//! 2. then seals it ([`seal_read_only`]): `F_SEAL_FUTURE_WRITE` forbids
//!    every *new* writable mapping and `write(2)` (the creator's existing
//!    mapping keeps working), `F_SEAL_SHRINK`/`F_SEAL_GROW` fix its size and
//!    `F_SEAL_SEAL` stops anyone from changing the seals,
//! 3. and hands out a descriptor opened read-only ([`reopen_read_only`]):
//!    a mapping of it never has `VM_MAYWRITE`, so `mprotect` cannot make it
//!    writable either. Reopening `/proc/self/fd/N` for writing gives a
//!    writable descriptor of the same file, but the seal still refuses
//!    writable mappings and writes, even to root.
//!
//! A region tenants write (telemetry) cannot be sealed against writes, but
//! its size is ([`seal_size`]): a tenant holding a read-write descriptor
//! could otherwise `ftruncate` it and every other mapping of it, the
//! daemon's included, would take `SIGBUS` on its next read. A descriptor a
//! tenant hands back is adopted only with its size sealed ([`adopt`]).

use crate::shm::{Region, SharedLayout};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Creates a memfd holding one `T`, initialised by `init` before anyone can
/// see it, and maps it writable. Returns the mapping and the (read-write,
/// sealable) descriptor.
pub fn create<T: SharedLayout>(
    name: &CStr,
    init: impl FnOnce(&T),
) -> io::Result<(Region<T>, OwnedFd)> {
    // SAFETY: name is NUL-terminated; the flags are valid for memfd_create.
    let raw = check(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: raw was just returned by memfd_create and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let length = std::mem::size_of::<T>();
    // Build the initial image in private memory, then write it into the
    // file: the magic is in it, so every mapping sees an initialised region.
    let image = Region::<T>::anonymous(init)?;
    // SAFETY: reading the bytes of a T that only this thread can reach
    // (fresh anonymous mapping); T is plain atomics.
    let bytes = unsafe { std::slice::from_raw_parts((&*image as *const T).cast::<u8>(), length) };
    // SAFETY: fd is ours; extending a fresh memfd zero-fills it.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), length as libc::off_t) })?;
    let mut written = 0;
    while written < length {
        // SAFETY: writing from a live buffer of the given length.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                bytes[written..].as_ptr().cast(),
                length - written,
                written as libc::off_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        written += n as usize;
    }
    let region = Region::<T>::from_fd(fd.as_raw_fd(), true)?;
    Ok((region, fd))
}

/// Seals a memfd so that no new writable mapping or write is possible and
/// its size and seals are fixed. Mappings made before (the creator's) stay
/// writable.
pub fn seal_read_only(fd: &OwnedFd) -> io::Result<()> {
    let seals =
        libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on an fd we own.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// Fixes a memfd's size (and its seals) while leaving it writable: no
/// holder of a descriptor can shrink it under another process's mapping.
pub fn seal_size(fd: &OwnedFd) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on an fd we own.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

/// Maps a region from a descriptor someone else (a tenant) handed over,
/// without waiting and without trusting it: it must be a memfd whose size
/// cannot change (sealed now if the seals are still open), large enough for
/// a `T`, and already carry `T`'s magic. Anything else is refused at once.
pub fn adopt<T: SharedLayout>(fd: &OwnedFd, writable: bool) -> io::Result<Region<T>> {
    let fixed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    let current = seals(fd).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a sealable memfd ({e})"),
        )
    })?;
    if current & fixed != fixed {
        seal_size(fd).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("its size cannot be sealed ({e})"),
            )
        })?;
    }
    Region::<T>::from_fd_now(fd.as_raw_fd(), writable)
}

/// The seals on a memfd.
pub fn seals(fd: &OwnedFd) -> io::Result<libc::c_int> {
    // SAFETY: fcntl on an fd we own.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// A new descriptor of the same file, opened read-only (through
/// `/proc/self/fd`), to hand to a process that must only read it.
pub fn reopen_read_only(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
    // SAFETY: path is NUL-terminated.
    let raw = check(unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    // SAFETY: raw was just returned by open.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::TenantBudget;

    #[test]
    fn a_sealed_region_stays_writable_for_its_creator_only() {
        let (budget, fd) =
            create::<TenantBudget>(c"test-sm", |b| b.set_share_ppm(0, 250_000)).unwrap();
        seal_read_only(&fd).unwrap();
        budget.set_share_ppm(0, 300_000);
        let reader_fd = reopen_read_only(&fd).unwrap();
        let reader = Region::<TenantBudget>::from_fd(reader_fd.as_raw_fd(), false).unwrap();
        assert_eq!(
            reader.share_ppm(0),
            300_000,
            "the reader sees the creator's writes"
        );
        assert!(
            Region::<TenantBudget>::from_fd(fd.as_raw_fd(), true).is_err(),
            "no new writable mapping, even from the read-write fd"
        );
        assert!(seals(&fd).unwrap() & libc::F_SEAL_FUTURE_WRITE != 0);
    }

    fn truncate(fd: &OwnedFd) -> io::Result<libc::c_int> {
        // SAFETY: ftruncate on an fd we own.
        check(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) })
    }

    #[test]
    fn a_size_sealed_region_stays_writable_but_cannot_shrink() {
        use crate::activity::TenantActivity;
        let (_region, fd) = create::<TenantActivity>(c"test-tel", |_| {}).unwrap();
        seal_size(&fd).unwrap();
        assert!(Region::<TenantActivity>::from_fd(fd.as_raw_fd(), true).is_ok());
        assert!(truncate(&fd).is_err(), "a sealed size refuses ftruncate");
    }

    #[test]
    fn adopting_seals_an_open_memfd_and_refuses_what_is_not_a_region() {
        use crate::activity::TenantActivity;
        let (_region, fd) = create::<TenantActivity>(c"test-adopt", |_| {}).unwrap();
        assert!(adopt::<TenantActivity>(&fd, true).is_ok());
        assert!(truncate(&fd).is_err(), "adoption sealed its size");
        // Empty memfd: refused at once, not waited for.
        // SAFETY: name is NUL-terminated.
        let raw = unsafe { libc::memfd_create(c"empty".as_ptr(), libc::MFD_ALLOW_SEALING) };
        // SAFETY: raw is a fresh fd.
        let empty = unsafe { OwnedFd::from_raw_fd(check(raw).unwrap()) };
        let started = std::time::Instant::now();
        assert!(adopt::<TenantActivity>(&empty, true).is_err());
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
        // A pipe is no memfd.
        let mut ends = [0; 2];
        // SAFETY: ends has room for two fds.
        check(unsafe { libc::pipe(ends.as_mut_ptr()) }).unwrap();
        // SAFETY: both ends are fresh and ours.
        let (read, _write) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        assert!(adopt::<TenantActivity>(&read, true).is_err());
    }

    proptest::proptest! {
        /// Whatever a tenant hands back (any size, any bytes, sealed or
        /// not), adoption answers at once, with a region or an error.
        #[test]
        fn any_handed_back_memfd_is_adopted_or_refused_at_once(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..9000),
            keep_magic in proptest::bool::ANY,
            seal in proptest::bool::ANY,
        ) {
            use crate::activity::TenantActivity;
            // SAFETY: name is NUL-terminated.
            let raw = unsafe { libc::memfd_create(c"fuzz".as_ptr(), libc::MFD_ALLOW_SEALING) };
            // SAFETY: raw is a fresh fd.
            let fd = unsafe { OwnedFd::from_raw_fd(check(raw).unwrap()) };
            let mut bytes = bytes;
            if keep_magic && bytes.len() >= 8 {
                bytes[..8].copy_from_slice(&<TenantActivity as SharedLayout>::MAGIC.to_ne_bytes());
            }
            let file = std::fs::File::from(fd.try_clone().unwrap());
            std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
            if seal {
                seal_size(&fd).unwrap();
            }
            let started = std::time::Instant::now();
            let adopted = adopt::<TenantActivity>(&fd, true);
            proptest::prop_assert!(started.elapsed() < std::time::Duration::from_millis(500));
            if let Ok(region) = adopted {
                proptest::prop_assert!(bytes.len() >= std::mem::size_of::<TenantActivity>());
                let _ = region.devices[0].snapshot();
                proptest::prop_assert!(truncate(&fd).is_err(), "adopted means size-sealed");
            }
        }
    }
}
