//! Removing region files that no process holds any more: what crashed or
//! killed processes left in a user's region directory. Every process
//! holding a region file keeps a shared `flock` on it ([`crate::shm`]), so
//! a file that takes an exclusive lock is unused.

use crate::shm::{euid, fstat, is_user_dir};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Most entries of a directory one sweep looks at.
pub const SWEEP_LIMIT: usize = 4096;

/// Removes the files in `dir` (a user's region directory) that no process
/// holds: what crashed processes left behind. Returns how many went.
pub fn sweep_unused(dir: &Path) -> usize {
    sweep_unused_of(dir, euid())
}

/// Removes the files of user `uid` in `dir`, that user's region directory,
/// that no process holds: what the node manager does when one of that
/// user's tenant processes ended, however it ended (a process killed by
/// SIGKILL never removes its own). Safe to run as root on a directory the
/// user controls: the directory is opened once, never through a link, and
/// must be owned by `uid` and writable by nobody else; each file is opened
/// (never through a link), checked to be `uid`'s, locked and removed
/// relative to that open directory, so renames meanwhile can only make it
/// remove names inside the user's own directory. Returns how many went.
pub fn sweep_unused_of(dir: &Path, uid: u32) -> usize {
    let Ok(dir_file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
    else {
        return 0;
    };
    let dir_fd = dir_file.as_raw_fd();
    match fstat(dir_fd) {
        Ok(stat) if stat.st_uid == uid && stat.st_mode & 0o022 == 0 => {}
        _ => return 0,
    }
    // The names of the directory open as dir_fd, not of whatever `dir`
    // names by now.
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{dir_fd}")) else {
        return 0;
    };
    let mut removed = 0;
    // A user with a huge directory costs a sweep this many files at most
    // (the daemon sweeps on its housekeeping thread).
    for entry in entries.flatten().take(SWEEP_LIMIT) {
        let Ok(name) = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(
            entry.file_name().as_os_str(),
        )) else {
            continue;
        };
        // SAFETY: dir_fd is open; name is NUL-terminated; no link is followed.
        let raw = unsafe {
            libc::openat(
                dir_fd,
                name.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            continue;
        }
        // SAFETY: raw was just returned by openat.
        let file = unsafe { OwnedFd::from_raw_fd(raw) };
        let Ok(open) = fstat(file.as_raw_fd()) else {
            continue;
        };
        if open.st_mode & libc::S_IFMT != libc::S_IFREG || open.st_uid != uid {
            continue;
        }
        // SAFETY: flock on a descriptor we own; non-blocking.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // held: a live process uses it
        }
        // SAFETY: a zeroed stat buffer for fstatat to fill.
        let mut named: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: dir_fd is open; name is NUL-terminated; named is writable.
        let same =
            unsafe { libc::fstatat(dir_fd, name.as_ptr(), &mut named, libc::AT_SYMLINK_NOFOLLOW) }
                == 0
                && named.st_dev == open.st_dev
                && named.st_ino == open.st_ino;
        // SAFETY: dir_fd is open; name is NUL-terminated; removes one name in it.
        if same && unsafe { libc::unlinkat(dir_fd, name.as_ptr(), 0) } == 0 {
            removed += 1;
        }
    }
    if removed > 0 && uid == euid() && is_user_dir(dir) {
        // Fails (ENOTEMPTY) if anything is left or was just created in it;
        // a process about to create a file makes the directory again.
        let _ = std::fs::remove_dir(dir);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::TenantLedger;
    use crate::shm::Region;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("dilu-sweep-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// What the node manager sweeps for a user: only that user's unheld
    /// files, only in a real directory of theirs, never through a link.
    #[test]
    fn a_sweep_for_a_user_takes_only_their_unheld_files_in_their_own_directory() {
        let root = scratch("sweep-of");
        let dir = root.join("regions");
        let leftover = dir.join("board");
        drop(Region::<TenantLedger>::open_or_create(&leftover, 0o600, |_| {}).unwrap());
        let held_path = dir.join("held");
        let held = Region::<TenantLedger>::open_or_create(&held_path, 0o600, |_| {}).unwrap();
        // Another user's sweep finds a directory that is not theirs.
        assert_eq!(sweep_unused_of(&dir, euid() + 1), 0);
        assert!(leftover.exists());
        // A link to the directory is not followed.
        let link = root.join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(sweep_unused_of(&link, euid()), 0);
        assert!(leftover.exists());
        // A link inside it is not followed either, nor removed.
        std::os::unix::fs::symlink(&held_path, dir.join("to-held")).unwrap();
        assert_eq!(sweep_unused_of(&dir, euid()), 1);
        assert!(!leftover.exists() && held_path.exists());
        assert!(dir.join("to-held").symlink_metadata().is_ok());
        drop(held);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_last_user_removes_the_file_and_the_next_start_sweeps_leftovers() {
        let root = scratch("sweep");
        let path = root.join("t.ledger");
        let first = Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {}).unwrap();
        let second = Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {}).unwrap();
        assert!(!first.remove_if_unused(&path), "another holder keeps it");
        drop(first);
        assert!(
            second.remove_if_unused(&path),
            "the last one out removes it"
        );
        assert!(!path.exists());
        // A file nobody holds (its process crashed) goes at the next sweep;
        // one still held stays.
        let leftover = root.join("crashed.ledger");
        drop(Region::<TenantLedger>::open_or_create(&leftover, 0o600, |_| {}).unwrap());
        let held_path = root.join("held.ledger");
        let held = Region::<TenantLedger>::open_or_create(&held_path, 0o600, |_| {}).unwrap();
        assert_eq!(sweep_unused(&root), 1);
        assert!(!leftover.exists() && held_path.exists());
        drop(held);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_user_directory_goes_with_its_last_file_and_comes_back_for_the_next() {
        let root = scratch("emptied");
        let dir = root.join(format!("dilu-{}", euid()));
        let (a, b) = (dir.join("a.ledger"), dir.join("b.ledger"));
        let first = Region::<TenantLedger>::open_or_create(&a, 0o600, |_| {}).unwrap();
        let second = Region::<TenantLedger>::open_or_create(&b, 0o600, |_| {}).unwrap();
        assert!(first.remove_if_unused(&a));
        assert!(dir.is_dir(), "kept while another file is in it");
        assert!(second.remove_if_unused(&b));
        assert!(!dir.exists(), "removed with its last file");
        // A crashed process's leftover: the sweep takes it and the directory.
        drop(Region::<TenantLedger>::open_or_create(&a, 0o600, |_| {}).unwrap());
        assert!(dir.is_dir(), "made again for the next file");
        assert_eq!(sweep_unused(&dir), 1);
        assert!(!dir.exists(), "swept with its last file");
        // Other directories are left alone, empty or not.
        let other = root.join("not-a-user-dir");
        let c = other.join("c.ledger");
        let third = Region::<TenantLedger>::open_or_create(&c, 0o600, |_| {}).unwrap();
        assert!(third.remove_if_unused(&c));
        assert!(other.is_dir());
        let _ = std::fs::remove_dir_all(&root);
    }
}
