//! Locating dilu's shared libraries and helper programs on disk.
//!
//! Search order: `$DILU_LIB_DIR`, the directory holding the `dilu` binary
//! (a cargo `target/<profile>` directory), then `<prefix>/lib/dilu` for an
//! installed layout (`<prefix>/bin/dilu`).

use crate::error::{self, Error};
use std::path::{Path, PathBuf};

pub const INTERPOSER_FILE: &str = "libdilu_interposer.so";
pub const SIMGPU_FILE: &str = "libsimgpu.so";
/// simgpu's simulated NVML, built next to the driver (`simgpu/nvml`).
pub const SIMGPU_NVML_FILE: &str = "libsimgpu_nvml.so";

fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("DILU_LIB_DIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(bin_dir) = exe.parent()
    {
        dirs.push(bin_dir.to_path_buf());
        if let Some(prefix) = bin_dir.parent() {
            dirs.push(prefix.join("lib").join("dilu"));
        }
    }
    dirs
}

/// Finds `file` in the search directories, or explains where it looked.
pub fn find(file: &str) -> error::Result<PathBuf> {
    let dirs = search_dirs();
    for dir in &dirs {
        let candidate = dir.join(file);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(Error::System(format!(
        "cannot find {file} (looked in: {}); build it with `cargo build --workspace` or set DILU_LIB_DIR",
        looked.join(", ")
    )))
}

/// Returns a directory in which `libcuda.so.1` and `libcuda.so` both resolve
/// to simgpu, creating the links if needed. Clients differ in which name they
/// open (cudart: `libcuda.so.1`; cudarc: `libcuda.so` first), so both exist.
/// When simgpu's simulated NVML lies beside the driver, `libnvidia-ml.so.1`
/// (and `libnvidia-ml.so`) resolve to it, so programs, the interposer and
/// peers such as HAMi-core see the same simulated GPU through NVML.
pub fn simgpu_driver_dir(simgpu: &Path) -> error::Result<PathBuf> {
    let preferred = simgpu
        .parent()
        .map(|dir| dir.join("simgpu-driver"))
        .into_iter();
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let fallback = std::env::temp_dir().join(format!("dilu-simgpu-{uid}"));
    let mut last_error = String::new();
    for dir in preferred.chain(std::iter::once(fallback)) {
        match link_driver_names(&dir, simgpu) {
            Ok(()) => return Ok(dir),
            Err(err) => last_error = format!("{}: {err}", dir.display()),
        }
    }
    Err(Error::System(format!(
        "cannot prepare the simulated driver directory ({last_error})"
    )))
}

fn link_driver_names(dir: &Path, simgpu: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let driver = simgpu.canonicalize()?;
    let nvml = simgpu
        .with_file_name(SIMGPU_NVML_FILE)
        .canonicalize()
        .ok()
        .into_iter()
        .flat_map(|nvml| {
            [
                ("libnvidia-ml.so.1", nvml.clone()),
                ("libnvidia-ml.so", nvml),
            ]
        });
    let links = [("libcuda.so.1", driver.clone()), ("libcuda.so", driver)];
    for (name, target) in links.into_iter().chain(nvml) {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() == Some(target.as_path()) {
            continue;
        }
        // Replace atomically so a concurrent `dilu run` never sees a missing name.
        let staging = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&staging);
        std::os::unix::fs::symlink(&target, &staging)?;
        std::fs::rename(&staging, &link)?;
    }
    Ok(())
}
