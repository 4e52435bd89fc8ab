//! The node's GPUs (from NVML) and the share devices the plugin advertises.
//!
//! The kubelet counts whole devices, so each GPU is advertised as `shares`
//! devices `<GPU UUID>::<k>`: a pod asks for one `dilu.io/gpu-share` per GPU
//! it needs, and several pods share one GPU. Which GPU a pod really gets is
//! the extender's choice (its annotations); the device IDs the kubelet picks
//! only count how many pods a GPU holds.

use nvml_wrapper::Nvml;
use std::ffi::OsStr;

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// The product name NVML reports (`NVIDIA H100 80GB HBM3`).
    pub model: String,
    /// Its memory, bytes.
    pub memory_bytes: u64,
    /// N of its `/dev/nvidiaN` node.
    pub minor: u32,
}

/// Lists the node's GPUs through NVML loaded from `library`
/// (`libnvidia-ml.so.1` on a GPU node; simgpu's simulated NVML in tests).
pub fn discover(library: &OsStr) -> Result<Vec<Gpu>, String> {
    let nvml = Nvml::builder()
        .lib_path(library)
        .init()
        .map_err(|e| format!("cannot initialise NVML from {}: {e}", library.display()))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    (0..count)
        .map(|index| {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| format!("NVML device {index}: {e}"))?;
            let uuid = device
                .uuid()
                .map_err(|e| format!("NVML UUID of device {index}: {e}"))?;
            let model = device
                .name()
                .map_err(|e| format!("NVML name of device {index}: {e}"))?;
            let memory_bytes = device
                .memory_info()
                .map_err(|e| format!("NVML memory of device {index}: {e}"))?
                .total;
            let minor = device
                .minor_number()
                .map_err(|e| format!("NVML minor number of device {index}: {e}"))?;
            Ok(Gpu {
                index,
                uuid,
                model,
                memory_bytes,
                minor,
            })
        })
        .collect()
}

/// The device ID of share `k` of a GPU.
pub fn share_id(gpu: &Gpu, k: u32) -> String {
    format!("{}::{k}", gpu.uuid)
}

/// The GPU UUID a share device ID belongs to.
pub fn gpu_uuid_of(share: &str) -> &str {
    share.rsplit_once("::").map_or(share, |(uuid, _)| uuid)
}

/// Every share device ID of every GPU, GPU by GPU.
pub fn all_share_ids(gpus: &[Gpu], shares: u32) -> Vec<String> {
    gpus.iter()
        .flat_map(|gpu| (0..shares).map(move |k| share_id(gpu, k)))
        .collect()
}
