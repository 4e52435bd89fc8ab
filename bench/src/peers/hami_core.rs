//! HAMi-core (Project-HAMi/HAMi-core): `libvgpu.so`, preloaded into each
//! process, counts memory against `CUDA_DEVICE_MEMORY_LIMIT` and throttles
//! launches to `CUDA_DEVICE_SM_LIMIT` percent of the SMs, sharing per-tenant
//! state through a `CUDA_DEVICE_MEMORY_SHARED_CACHE` file (one per container
//! in a real deployment). No server. `DILU_PEER_HAMI` names a build of the
//! library made by `scripts/build-peers.sh`; processes are set up the way
//! `scripts/peers.sh` runs them.

use super::{Peer, Role, peer_path};
use std::path::{Path, PathBuf};
use std::process::Command;

struct HamiCore {
    library: PathBuf,
    driver_dir: PathBuf,
    scratch: PathBuf,
}

/// What the shared cache files of this peer are called in its scratch
/// folder (one per tenant).
const CACHE_PREFIX: &str = "hami-tenant-";
const CACHE_SUFFIX: &str = ".cache";

pub fn start(scratch: &Path) -> Result<Box<dyn Peer>, String> {
    let library = peer_path(
        "DILU_PEER_HAMI",
        "the path of a libvgpu.so built from HAMi-core's public sources",
    )?;
    let driver_dir = super::simgpu_driver_dir()?;
    std::fs::create_dir_all(scratch)
        .map_err(|e| format!("not run: scratch folder {}: {e}", scratch.display()))?;
    // A cache left by an earlier run would hand its processes' usage to
    // this one.
    remove_caches(scratch);
    Ok(Box::new(HamiCore {
        library,
        driver_dir,
        scratch: scratch.to_path_buf(),
    }))
}

fn remove_caches(scratch: &Path) {
    let Ok(entries) = std::fs::read_dir(scratch) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(CACHE_PREFIX) && name.ends_with(CACHE_SUFFIX) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

impl Peer for HamiCore {
    fn name(&self) -> &'static str {
        "HAMi-core"
    }

    fn configure(&self, command: &mut Command, _role: Role, tenant: usize, share_percent: u32) {
        let cache = self
            .scratch
            .join(format!("{CACHE_PREFIX}{tenant}{CACHE_SUFFIX}"));
        command
            .env("LD_PRELOAD", &self.library)
            .env("CUDA_REDIRECT", &self.library)
            .env("LD_LIBRARY_PATH", &self.driver_dir)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache)
            .env("LIBCUDA_LOG_LEVEL", "0")
            .env("CUDA_DEVICE_SM_LIMIT", share_percent.to_string());
    }
}

impl Drop for HamiCore {
    fn drop(&mut self) {
        remove_caches(&self.scratch);
    }
}
