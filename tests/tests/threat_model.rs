//! Issue 15's threat model, finding by finding: a tenant (a process the
//! daemon admits, or one that speaks its protocol by hand) must never hurt
//! the root daemon or another tenant. Each test plays the hostile tenant
//! directly over the daemon's socket with dilu's own wire types, against a
//! real `dilu nodemgr` process (so a crash shows as the process dying).

use dilu_abi::node_wire::{self, FromDaemon, NodeStatus, PROTOCOL_VERSION, ToDaemon};
use dilu_abi::seqpacket;
use dilu_tests::workspace::{Scratch, dilu, unique_name};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `dilu nodemgr` child, killed when the test ends.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(scratch: &Scratch, config: &str) -> Daemon {
        let path = scratch.path("nodemgr.toml");
        std::fs::write(&path, config).unwrap();
        let socket = scratch.path("nodemgr.sock");
        let child = Command::new(dilu())
            .arg("nodemgr")
            .arg("--config")
            .arg(&path)
            .arg("--socket")
            .arg(&socket)
            .arg("--run-dir")
            .arg(scratch.path("run"))
            .args(["--foreground", "--metrics", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dilu nodemgr");
        let daemon = Daemon { child, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while daemon.status().is_none() {
            assert!(Instant::now() < deadline, "the daemon never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn status(&self) -> Option<NodeStatus> {
        status_at(&self.socket)
    }

    fn register(&self, tenant: &str, handed_back: &[i32]) -> (OwnedFd, FromDaemon, Vec<OwnedFd>) {
        register_at(&self.socket, tenant, handed_back)
    }
}

/// One status request over the socket (None if it failed).
fn status_at(socket: &Path) -> Option<NodeStatus> {
    let connection = seqpacket::connect(socket, Some(Duration::from_secs(30))).ok()?;
    let request = node_wire::encode(&ToDaemon::Status).unwrap();
    seqpacket::send(&connection, &request, &[]).ok()?;
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, _) = seqpacket::recv(&connection, &mut buffer).ok()?;
    match node_wire::decode::<FromDaemon>(&buffer[..n]).ok()? {
        FromDaemon::Status(status) => Some(*status),
        _ => None,
    }
}

/// Registers a hand-made "process" of `tenant`, handing `fds` back as a
/// re-attaching process would. Returns the connection (the membership lasts
/// while it is open), what the daemon answered and the descriptors it sent.
fn register_at(
    socket: &Path,
    tenant: &str,
    handed_back: &[i32],
) -> (OwnedFd, FromDaemon, Vec<OwnedFd>) {
    let connection =
        seqpacket::connect(socket, Some(Duration::from_secs(30))).expect("connect to the daemon");
    let request = node_wire::encode(&ToDaemon::Register {
        version: PROTOCOL_VERSION,
        tenant: tenant.into(),
        spec: None,
        reattach: !handed_back.is_empty(),
    })
    .unwrap();
    seqpacket::send(&connection, &request, handed_back).expect("send the registration");
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, fds) = seqpacket::recv(&connection, &mut buffer).expect("an answer");
    let answer = node_wire::decode::<FromDaemon>(&buffer[..n]).expect("a valid answer");
    (connection, answer, fds)
}

fn memfd(name: &std::ffi::CStr) -> OwnedFd {
    // SAFETY: name is NUL-terminated; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0, "memfd_create");
    // SAFETY: raw is a fresh descriptor nobody else owns.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

fn truncate(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Finding 1: the telemetry memfd was handed out read-write and unsealed; a
/// tenant truncating it killed the daemon (SIGBUS on its next sample).
#[test]
fn a_tenant_that_truncates_its_telemetry_cannot_kill_the_daemon() {
    let scratch = Scratch::new("threat-truncate");
    let mut daemon = Daemon::start(&scratch, "period_ms = 5\n");
    let tenant = unique_name("trunc");
    let (_connection, answer, fds) = daemon.register(&tenant, &[]);
    assert!(
        matches!(answer, FromDaemon::Registered { .. }),
        "registered: {answer:?}"
    );
    assert_eq!(fds.len(), 2, "budget and telemetry descriptors");
    let truncated = truncate(&fds[1]);
    // Give the control loop many periods to read the region.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        daemon.alive(),
        "the daemon died after a tenant truncated its telemetry (ftruncate: {truncated:?})"
    );
    let status = daemon.status().expect("the daemon still answers");
    assert!(status.tenants.iter().any(|t| t.name == tenant));
    assert!(
        truncated.is_err(),
        "the telemetry's size is sealed (ftruncate must fail)"
    );
}

/// Finding 2 and 5: registration held the registry lock while it waited on
/// descriptors a re-attaching tenant handed back (up to 4 s), freezing the
/// control loop and every status answer. Now a stalled tenant delays only
/// its own registration.
#[test]
fn a_tenant_that_stalls_its_handed_back_fds_cannot_stall_the_control_loop() {
    let scratch = Scratch::new("threat-stall");
    let period_ms = 5.0;
    let daemon = Daemon::start(&scratch, &format!("period_ms = {period_ms}\n"));
    let tenant = unique_name("stall");
    // Empty memfds: a region that never becomes complete.
    let (budget, telemetry) = (memfd(c"stall-budget"), memfd(c"stall-telemetry"));
    let socket = daemon.socket.clone();
    let stalled_tenant = tenant.clone();
    let before = daemon.status().expect("status before");
    let window = Instant::now();
    let stalled = std::thread::spawn(move || {
        let handed_back = [budget.as_raw_fd(), telemetry.as_raw_fd()];
        let (connection, answer, _) = register_at(&socket, &stalled_tenant, &handed_back);
        (answer, connection)
    });
    // Status answers while the stalled registration is in the daemon.
    let mut slowest = Duration::ZERO;
    while window.elapsed() < Duration::from_secs(3) {
        let asked = Instant::now();
        assert!(daemon.status().is_some(), "status answered");
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = daemon.status().expect("status after");
    let elapsed = window.elapsed();
    let (answer, _helper) = stalled.join().unwrap();
    let expected = elapsed.as_secs_f64() * 1e3 / period_ms;
    let ran = (after.control_periods - before.control_periods) as f64;
    eprintln!(
        "periods: {ran} of {expected:.0} expected; slowest status answer {slowest:?}; stalled tenant got {answer:?}"
    );
    assert!(
        slowest < Duration::from_millis(1500),
        "a status request waited {slowest:?} behind a stalled tenant"
    );
    assert!(
        ran >= 0.25 * expected,
        "the control loop ran {ran} periods of {expected:.0} while a tenant stalled"
    );
    assert!(
        matches!(answer, FromDaemon::Registered { .. }),
        "the tenant is admitted with fresh regions: {answer:?}"
    );
}
