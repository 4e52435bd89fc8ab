//! Unix `SOCK_SEQPACKET` sockets carrying whole messages and file
//! descriptors (`SCM_RIGHTS`), and the peer's credentials (`SO_PEERCRED`).
//!
//! Both ends of the node-manager socket use these: the daemon to accept
//! tenants and hand them their regions, the interposer (through
//! [`crate::node_client`]) to register. Plain libc, no allocation beyond the
//! message buffers, every error returned as `io::Error`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;
/// Largest message either side sends.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// Credentials of the process at the other end, as the kernel recorded them
/// when it connected (not what the peer claims).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked before use.
    let fd = check(unsafe {
        libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let bytes = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket path contains NUL"))?;
    let bytes = bytes.as_bytes_with_nul();
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() > addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} is too long", path.display()),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len();
    Ok((addr, len as libc::socklen_t))
}

/// Binds and listens on `path` (a stale socket file is replaced).
pub fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = address(path)?;
    let _ = std::fs::remove_file(path);
    // SAFETY: addr/len describe a valid sockaddr_un.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    // SAFETY: fd is a bound socket.
    check(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// Accepts one connection (blocking).
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4 on a listening socket; peer address not wanted.
    let fd = check(unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just returned by accept4.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects to `path`; every later send and receive on the socket gives up
/// after `timeout` (None: block).
pub fn connect(path: &Path, timeout: Option<Duration>) -> io::Result<OwnedFd> {
    let fd = socket()?;
    let (addr, len) = address(path)?;
    set_timeout(&fd, timeout)?;
    // SAFETY: addr/len describe a valid sockaddr_un.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast(), len) })?;
    Ok(fd)
}

/// Sets (or clears, with None) the send and receive timeouts.
pub fn set_timeout(fd: &OwnedFd, timeout: Option<Duration>) -> io::Result<()> {
    let timeout = timeout.unwrap_or_default();
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval for the size given.
        check(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        })?;
    }
    Ok(())
}

/// The kernel's record of who is at the other end.
pub fn peer_cred(fd: &OwnedFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred/len describe a writable ucred.
    check(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    })?;
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Room for MAX_FDS descriptors of control data, suitably aligned.
#[repr(C, align(8))]
struct ControlBuffer([u8; 64]);

/// Sends one message with `fds` attached.
pub fn send(fd: &OwnedFd, message: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut iov = libc::iovec {
        iov_base: message.as_ptr() as *mut libc::c_void,
        iov_len: message.len(),
    };
    let mut control = ControlBuffer([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds) as libc::c_uint;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
        header.msg_control = control.0.as_mut_ptr().cast();
        header.msg_controllen = space as _;
        // SAFETY: the control buffer holds `space` bytes (≤ 64 for MAX_FDS),
        // so the first header and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&header);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload as usize,
            );
        }
    }
    // SAFETY: header points at live buffers for the duration of the call.
    let sent = unsafe { libc::sendmsg(fd.as_raw_fd(), &header, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one message into `buffer`: its length (0 when the peer closed)
/// and the descriptors that came with it (close-on-exec).
pub fn recv(fd: &OwnedFd, buffer: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let mut control = ControlBuffer([0; 64]);
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut iov;
    header.msg_iovlen = 1;
    header.msg_control = control.0.as_mut_ptr().cast();
    header.msg_controllen = control.0.len() as _;
    let received = loop {
        // SAFETY: header points at live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&header);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    // The kernel installed these descriptors for us.
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&header, cmsg);
        }
    }
    if header.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message larger than the receive buffer",
        ));
    }
    if header.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors than a message may carry",
        ));
    }
    Ok((received, fds))
}

/// Blocks until the peer closes the connection (or it fails), discarding
/// anything it sends meanwhile.
pub fn wait_closed(fd: &OwnedFd) {
    let mut buffer = [0u8; 256];
    loop {
        match recv(fd, &mut buffer) {
            Ok((0, _)) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Whether the peer has closed its end already (a request whose asker
/// gave up waiting): never blocks.
pub fn peer_gone(fd: &OwnedFd) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLRDHUP) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_closed_is_gone_and_one_that_did_not_is_not() {
        let dir = std::env::temp_dir().join(format!("dilu-seqpacket-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let listener = listen(&path, 0o600).unwrap();
        let client = connect(&path, Some(Duration::from_secs(5))).unwrap();
        let server = accept(&listener).unwrap();
        assert!(!peer_gone(&server));
        send(&client, b"asked", &[]).unwrap();
        drop(client);
        // The request is still there to read, and its asker is gone.
        assert!(peer_gone(&server));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn messages_carry_fds_and_the_peer_is_known() {
        let dir = std::env::temp_dir().join(format!("dilu-seqpacket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let listener = listen(&path, 0o600).unwrap();
        let client = connect(&path, Some(Duration::from_secs(5))).unwrap();
        let server = accept(&listener).unwrap();
        let cred = peer_cred(&server).unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        // SAFETY: getuid has no preconditions.
        assert_eq!(cred.uid, unsafe { libc::getuid() });

        let file = std::fs::File::open("/proc/self/stat").unwrap();
        send(&client, b"hello", &[file.as_raw_fd()]).unwrap();
        let mut buffer = [0u8; 64];
        let (n, fds) = recv(&server, &mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"hello");
        assert_eq!(fds.len(), 1);
        assert_ne!(fds[0].as_raw_fd(), file.as_raw_fd());

        drop(client);
        let (n, fds) = recv(&server, &mut buffer).unwrap();
        assert_eq!((n, fds.len()), (0, 0), "a closed peer reads as empty");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
