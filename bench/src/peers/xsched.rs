//! XSched (XpuOS/xsched, OSDI'25) at Level 1, as its documentation runs
//! it for transparent scheduling: one `xserver` with the highest-priority-
//! first policy, and every CUDA program loading XSched's shim as its driver
//! (`lib/libcuda.so`, `lib/libcuda.so.1`) with the global scheduler and an
//! automatic XQueue per stream. The shim reaches the real driver, simgpu,
//! through `XSCHED_CUDA_LIB` and `CUXTRA_CUDA_LIB`. Thresholds and batch
//! sizes stay at XSched's defaults: the field is judged at its defaults.
//!
//! `DILU_PEER_XSCHED` names the install directory of an XSched build
//! (`bin/xserver`, `lib/libcuda.so` linking to `libshimcuda.so`); none of
//! XSched's code is in this repository.

use super::{Peer, Role, peer_path, simgpu_lib_dir};
use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BUILD_HINT: &str =
    "an XSched Level 1 install directory: bin/xserver and lib/libcuda.so (the shim)";

/// How long `xserver` may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// A running `xserver` and what its clients need.
pub struct XSched {
    lib: PathBuf,
    driver: PathBuf,
    /// Keeps this server's channels apart from any other XSched on the
    /// machine (read by the channel library the build uses in place of
    /// XSched's unfetchable `ipc` submodule; ignored by any other).
    namespace: String,
    server: Child,
}

pub fn start(scratch: &Path) -> Result<Box<dyn Peer>, String> {
    let install = peer_path("DILU_PEER_XSCHED", BUILD_HINT)?;
    let xserver = install.join("bin/xserver");
    let lib = install.join("lib");
    for needed in [&xserver, &lib.join("libcuda.so"), &lib.join("libcuda.so.1")] {
        if !needed.exists() {
            return Err(format!(
                "not run: DILU_PEER_XSCHED={} has no {}",
                install.display(),
                needed.display()
            ));
        }
    }
    // The shim dlopens the driver by this absolute path, so it gets simgpu,
    // not the shim that programs already loaded under the driver's name.
    let driver = simgpu_lib_dir().join("libcuda.so.1");

    std::fs::create_dir_all(scratch).map_err(|e| format!("not run: {}: {e}", scratch.display()))?;
    let log_path = scratch.join("xserver.log");
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("not run: {}: {e}", log_path.display()))?;
    let err = log
        .try_clone()
        .map_err(|e| format!("not run: {}: {e}", log_path.display()))?;
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let namespace = format!(
        "dilu-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let port = free_port()?;
    let mut server = Command::new(&xserver)
        .args(["HPF", &port.to_string()])
        .env("XSCHED_IPC_NAMESPACE", &namespace)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("not run: {}: {e}", xserver.display()))?;

    // Ready once its HTTP port accepts: xserver opens its event channel
    // before it listens.
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(format!(
                "not run: xserver exited ({status}) before listening: {}",
                tail(&log_path)
            ));
        }
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            let _ = server.wait();
            return Err(format!(
                "not run: xserver did not listen on port {port} within {READY_WITHIN:?}: {}",
                tail(&log_path)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Box::new(XSched {
        lib,
        driver,
        namespace,
        server,
    }))
}

/// A port no one listens on now (the OS's pick).
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("not run: no free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("not run: no free port: {e}"))
}

/// The last lines of a log, on one line.
fn tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

impl Peer for XSched {
    fn name(&self) -> &'static str {
        "XSched"
    }

    fn configure(&self, command: &mut Command, role: Role, _tenant: usize, _share_percent: u32) {
        // The shim answers to the driver's names first in the search path
        // (cudarc opens `libcuda.so`, then `libcuda.so.1`).
        let mut path = self.lib.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(old);
        }
        let priority = match role {
            Role::Primary => "1",
            Role::Filler => "0",
        };
        command
            .env("LD_LIBRARY_PATH", path)
            .env("XSCHED_SCHEDULER", "GLB")
            .env("XSCHED_AUTO_XQUEUE", "ON")
            .env("XSCHED_AUTO_XQUEUE_LEVEL", "1")
            .env("XSCHED_AUTO_XQUEUE_PRIORITY", priority)
            .env("XSCHED_CUDA_LIB", &self.driver)
            .env("CUXTRA_CUDA_LIB", &self.driver)
            .env("XSCHED_IPC_NAMESPACE", &self.namespace);
    }
}

impl Drop for XSched {
    fn drop(&mut self) {
        // SIGINT is xserver's own way to stop; kill it if it lingers.
        // SAFETY: kill(2) on the pid of a child this value owns and has not
        // yet reaped, so the pid cannot name another process.
        unsafe { libc::kill(self.server.id() as libc::pid_t, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.server.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `DILU_PEER_XSCHED` names a build: the server starts, a program
    /// configured as the primary runs to its JSON line with XSched's shim as
    /// its driver (the server logs it as a client), and dropping the peer
    /// stops the server. Without a build (CI) there is nothing to run.
    #[test]
    fn a_configured_program_runs_under_the_server() {
        if std::env::var_os("DILU_PEER_XSCHED").is_none() {
            return;
        }
        let scratch = std::env::temp_dir().join(format!("dilu-xsched-test-{}", std::process::id()));
        let peer = start(&scratch).expect("XSched starts");
        let mut command = Command::new(dilu_harness::workspace::artifact("demo-tenant"));
        command.args(["serve", "--rate", "100", "--seconds", "1"]);
        command.env(
            "SIMGPU_INSTANCE",
            format!("xsched-test-{}", std::process::id()),
        );
        peer.configure(&mut command, Role::Primary, 0, 100);
        let out = command.output().expect("run demo-tenant");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("\"mode\":\"serve\""), "{stdout}");
        drop(peer);
        let log = std::fs::read_to_string(scratch.join("xserver.log")).unwrap_or_default();
        assert!(log.contains("client process"), "{log}");
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
