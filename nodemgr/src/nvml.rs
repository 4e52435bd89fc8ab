//! NVML, when the node has an NVIDIA driver: device identity, utilisation
//! and memory for metrics, admission and the memory audit. `dilu nodemgr
//! --sim` loads simgpu's simulated NVML instead ([`use_library`]), so the
//! same figures come from the simulated GPU. Without NVML the node manager
//! still runs: it reports one device with unknown figures, judges memory
//! admission by `gpu_memory` from its configuration and audits nothing.

use dilu_abi::node_wire::GpuStatus;
use nvml_wrapper::Nvml;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The NVML library to load instead of the driver's (simgpu's), set once
/// before the daemon first asks NVML anything.
static LIBRARY: OnceLock<PathBuf> = OnceLock::new();

/// Makes every later NVML query go to the library at `path` (and fail,
/// rather than fall back to another NVML, where it cannot be loaded).
pub fn use_library(path: &Path) -> crate::error::Result<()> {
    LIBRARY
        .set(path.to_path_buf())
        .map_err(|_| crate::error::Error::Invalid("the NVML library was chosen twice".to_string()))
}

fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| {
        if let Some(path) = LIBRARY.get() {
            return match Nvml::builder().lib_path(path.as_os_str()).init() {
                Ok(nvml) => Some(nvml),
                Err(e) => {
                    tracing::error!(
                        "the simulated NVML ({}) did not start ({e}): no memory admission or audit",
                        path.display()
                    );
                    None
                }
            };
        }
        // The runtime name first: every driver installs libnvidia-ml.so.1,
        // the unversioned name only comes with development packages.
        match Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| Nvml::init())
        {
            Ok(nvml) => Some(nvml),
            Err(e) => {
                tracing::info!(
                    "NVML not available ({e}): device figures come from telemetry only, \
                     memory admission only with gpu_memory (--gpu-memory), no memory audit; \
                     beside simgpu start the node manager with --sim"
                );
                None
            }
        }
    })
    .as_ref()
}

/// Whether NVML (the driver's, or the library [`use_library`] chose) loaded.
pub fn available() -> bool {
    nvml().is_some()
}

/// The device list as a daemon without NVML reports it.
pub fn fallback() -> Vec<GpuStatus> {
    vec![GpuStatus {
        index: 0,
        uuid: "unknown".into(),
        name: "no NVML".into(),
        utilization: None,
        memory_used_bytes: None,
        memory_total_bytes: None,
    }]
}

/// Reads every device NVML knows (or the fallback).
pub fn probe() -> Vec<GpuStatus> {
    let Some(nvml) = nvml() else {
        return fallback();
    };
    let count = nvml.device_count().unwrap_or(0);
    let gpus: Vec<GpuStatus> = (0..count)
        .filter_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            let memory = device.memory_info().ok();
            Some(GpuStatus {
                index,
                uuid: device.uuid().unwrap_or_else(|_| "unknown".into()),
                name: device.name().unwrap_or_default(),
                utilization: device
                    .utilization_rates()
                    .ok()
                    .map(|u| u.gpu as f64 / 100.0),
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
            })
        })
        .collect();
    if gpus.is_empty() { fallback() } else { gpus }
}

/// Fresh figures (once a second); identity stays as probed.
pub fn refresh(previous: &[GpuStatus]) -> Vec<GpuStatus> {
    if nvml().is_none() {
        return previous.to_vec();
    }
    probe()
}

/// Per-process device memory from NVML (`nvmlDeviceGetComputeRunningProcesses`
/// on every device): what the audit compares with budgets. Under simgpu the
/// simulated NVML answers the same query from the shared device state.
pub struct NvmlUsage;

impl crate::audit::UsageSource for NvmlUsage {
    fn process_memory(&mut self) -> Result<Vec<crate::audit::ProcessMemory>, String> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let nvml = nvml().ok_or("NVML is not available")?;
        let count = nvml.device_count().map_err(|e| e.to_string())?;
        let mut usage = Vec::new();
        for index in 0..count {
            let device = nvml.device_by_index(index).map_err(|e| e.to_string())?;
            let processes = device
                .running_compute_processes()
                .map_err(|e| format!("device {index}: {e}"))?;
            for process in processes {
                if let UsedGpuMemory::Used(bytes) = process.used_gpu_memory {
                    usage.push(crate::audit::ProcessMemory {
                        pid: process.pid,
                        device: index,
                        used_bytes: bytes,
                    });
                }
            }
        }
        Ok(usage)
    }
}
