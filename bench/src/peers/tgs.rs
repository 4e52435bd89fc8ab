//! TGS (pkusys/TGS, NSDI'23): a hijack library that stands in for
//! `libcuda.so.1`, one build for high-priority and one for low-priority
//! jobs. The low-priority library throttles its process's kernel launches
//! (thread blocks per period) to what leaves the high-priority process's
//! kernel rate intact; the high-priority one reports that rate every 5 s
//! over a Unix socket. `DILU_PEER_TGS` names a folder with both builds
//! (`high/` and `low/`, each with `libcuda.so.1` and `libcuda.so`), made
//! by `scripts/build-peers.sh` from TGS's sources.
//!
//! There is no TGS server to start: the low-priority process listens on
//! `/etc/gsharing/rate_<GPU uuid>.sock` (hard-coded) and the high-priority
//! one connects to it, so [`start`] only makes sure that folder exists.
//! simgpu's UUID is a hash of `SIMGPU_INSTANCE`: runs on different
//! instances do not meet, but TGS expects one low-priority process per GPU
//! (each one re-binds the socket, and only the last one started hears the
//! high-priority rate; the others run unthrottled).
//!
//! TGS opens the real driver as `libcuda.so.<version>` (the version from
//! `/proc/driver/nvidia/version`, else 450.51.06) and NVML as
//! `libnvidia-ml.so.<version>`: [`start`] links simgpu under those names in
//! its scratch folder, which goes on `LD_LIBRARY_PATH` after the hijack.

use super::{Peer, Role, peer_path};
use std::path::{Path, PathBuf};
use std::process::Command;

/// TGS's folder for its coordination socket, hard-coded in its sources.
const SOCKET_DIR: &str = "/etc/gsharing";
/// The driver version TGS assumes without `/proc/driver/nvidia/version`.
const DEFAULT_DRIVER_VERSION: &str = "450.51.06";

struct Tgs {
    high: PathBuf,
    low: PathBuf,
    driver: PathBuf,
    simgpu: PathBuf,
}

pub fn start(scratch: &Path) -> Result<Box<dyn Peer>, String> {
    let built = peer_path(
        "DILU_PEER_TGS",
        "a folder with TGS's high/ and low/ hijack builds",
    )?;
    let high = built.join("high");
    let low = built.join("low");
    for dir in [&high, &low] {
        if !dir.join("libcuda.so.1").exists() || !dir.join("libcuda.so").exists() {
            return Err(format!(
                "not run: {} lacks libcuda.so.1 or libcuda.so",
                dir.display()
            ));
        }
    }
    let simgpu = super::simgpu_driver_dir()?;
    let driver = scratch.join("tgs-driver");
    link_driver(&driver)?;
    std::fs::create_dir_all(SOCKET_DIR).map_err(|e| {
        format!("not run: TGS's hard-coded socket folder {SOCKET_DIR} cannot be created: {e}")
    })?;
    Ok(Box::new(Tgs {
        high,
        low,
        driver,
        simgpu,
    }))
}

/// Links simgpu and its NVML into `dir` under the names TGS opens.
fn link_driver(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("not run: {}: {e}", dir.display()))?;
    let mut versions = vec![DEFAULT_DRIVER_VERSION.to_string()];
    versions.extend(proc_driver_version().filter(|v| v != DEFAULT_DRIVER_VERSION));
    for version in &versions {
        for (name, target) in [
            ("libcuda.so", "libsimgpu.so"),
            ("libnvidia-ml.so", "libsimgpu_nvml.so"),
        ] {
            let target = dilu_harness::workspace::artifact(target);
            let link = dir.join(format!("{name}.{version}"));
            if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&target, &link)
                    .map_err(|e| format!("not run: {}: {e}", link.display()))?;
            }
        }
    }
    Ok(())
}

/// The driver version TGS reads on this machine: the first dotted number on
/// the `NVRM` line of `/proc/driver/nvidia/version` (TGS's regular
/// expression `([0-9]+)(\.[0-9]+)+`).
fn proc_driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().find(|l| l.starts_with("NVRM"))?;
    line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|word| word.trim_matches('.'))
        .find(|word| word.contains('.') && word.split('.').all(|p| !p.is_empty()))
        .map(str::to_string)
}

impl Peer for Tgs {
    fn name(&self) -> &'static str {
        "TGS"
    }

    fn configure(&self, command: &mut Command, role: Role, _tenant: usize, _share_percent: u32) {
        let hijack = match role {
            Role::Primary => &self.high,
            Role::Filler => &self.low,
        };
        let path = std::env::join_paths([hijack, &self.driver, &self.simgpu])
            .expect("library folders without ':'");
        command.env("LD_LIBRARY_PATH", path);
    }

    /// Each low-priority process unlinks, binds and listens on the GPU's
    /// socket as it starts: two starting together race (one binds, the
    /// other's bind fails, its listen fails and it exits), so fillers start
    /// apart.
    fn filler_spacing(&self) -> std::time::Duration {
        std::time::Duration::from_millis(200)
    }
}
