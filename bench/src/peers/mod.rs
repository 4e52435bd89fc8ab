//! The field's GPU-sharing systems, run beside dilu on simgpu: HAMi-core's
//! `libvgpu.so`, XSched (Level 1) and TGS. None of their code is in this
//! repository: `scripts/build-peers.sh` builds each from a checkout of its
//! public sources (with our stand-ins for what a checkout lacks), and each
//! is found through one environment variable naming that build
//! (`DILU_PEER_HAMI`, `DILU_PEER_XSCHED`, `DILU_PEER_TGS`).
//! The field benchmark starts the same programs under each of them;
//! [`start`] says why a peer cannot run when its variable is unset or the
//! build is incomplete, and the benchmark prints that in the peer's row.

pub mod hami_core;
pub mod tgs;
pub mod xsched;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Which side of a co-location a process is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The latency-critical tenant: high priority where the peer has
    /// priorities.
    Primary,
    /// Best-effort work: low priority.
    Filler,
}

/// The peers, in the order result tables list them.
pub const PEERS: [&str; 3] = ["HAMi-core", "XSched", "TGS"];

/// A peer ready to run programs: its built files, and any server it needs
/// (stopped when this is dropped).
pub trait Peer {
    /// The name result tables use (one of [`PEERS`]).
    fn name(&self) -> &'static str;

    /// Sets `command`, a CUDA program started directly (not through
    /// `dilu run`), to run under the peer on simgpu, as `role`. `tenant`
    /// tells the co-located processes apart (0 for the primary, 1.. for
    /// fillers); `share_percent` is the SM share a peer with static shares
    /// gives it (HAMi-core's `CUDA_DEVICE_SM_LIMIT`); peers with priorities
    /// ignore it. The caller sets simgpu's own variables (`SIMGPU_INSTANCE`,
    /// `SIMGPU_TRACE`).
    fn configure(&self, command: &mut Command, role: Role, tenant: usize, share_percent: u32);

    /// How long to wait between starting two fillers (none by default).
    fn filler_spacing(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

/// Starts the peer named `name` (one of [`PEERS`]) with its scratch files
/// under `scratch`, or says why it cannot run here.
pub fn start(name: &str, scratch: &Path) -> Result<Box<dyn Peer>, String> {
    match name {
        "HAMi-core" => hami_core::start(scratch),
        "XSched" => xsched::start(scratch),
        "TGS" => tgs::start(scratch),
        other => Err(format!("no peer named {other:?}")),
    }
}

/// A directory where simgpu answers to the NVIDIA driver's names
/// (`libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1`), made once in the
/// release directory beside the built simgpu: what a peer's library opens
/// as "the real driver".
pub fn simgpu_lib_dir() -> PathBuf {
    let release = dilu_harness::workspace::profile_dir();
    let dir = release.join("peers-lib");
    std::fs::create_dir_all(&dir).expect("create the simgpu link directory");
    for (link, target) in [
        ("libcuda.so.1", "libsimgpu.so"),
        ("libcuda.so", "libsimgpu.so"),
        ("libnvidia-ml.so.1", "libsimgpu_nvml.so"),
    ] {
        let target = dilu_harness::workspace::artifact(target);
        let path = dir.join(link);
        if std::fs::read_link(&path).ok().as_deref() != Some(target.as_path()) {
            let _ = std::fs::remove_file(&path);
            std::os::unix::fs::symlink(&target, &path).expect("link simgpu under a driver name");
        }
    }
    dir
}

/// [`simgpu_lib_dir`], or why not when simgpu is not built.
fn simgpu_driver_dir() -> Result<PathBuf, String> {
    let release = dilu_harness::workspace::profile_dir();
    for name in ["libsimgpu.so", "libsimgpu_nvml.so"] {
        if !release.join(name).exists() {
            return Err(format!(
                "not run: {} is not built (cargo build --release -p simgpu -p simgpu-nvml)",
                release.join(name).display()
            ));
        }
    }
    Ok(simgpu_lib_dir())
}

/// The value of `variable`, a path that must exist, or why not.
fn peer_path(variable: &str, build_hint: &str) -> Result<PathBuf, String> {
    let value = std::env::var_os(variable)
        .ok_or_else(|| format!("not run: {variable} is not set ({build_hint})"))?;
    let path = PathBuf::from(value);
    if !path.exists() {
        return Err(format!(
            "not run: {variable}={} does not exist",
            path.display()
        ));
    }
    Ok(path)
}
