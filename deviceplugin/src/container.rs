//! What a container placed by dilu gets: the pure translation of a pod's
//! assignment into the kubelet's `ContainerAllocateResponse`.
//!
//! The interposer is preloaded with the `LD_PRELOAD` variable rather than an
//! `/etc/ld.so.preload` mount: the variable is per container and is what
//! `dilu run` sets (the path the tests exercise), and a mount over
//! `/etc/ld.so.preload` would hide whatever the image itself preloads. A
//! program that clears its environment escapes the preload; the node
//! manager's NVML audit catches memory held outside a budget.

use crate::api::{ContainerAllocateResponse, Mount};
use dilu_abi::pod_assignment::PodAssignment;
use std::path::PathBuf;

/// Where the node keeps what containers get, and where containers see it.
#[derive(Debug, Clone)]
pub struct ContainerLayout {
    /// The interposer library on the node (installed by the DaemonSet).
    pub host_interposer: PathBuf,
    /// The node manager's socket directory on the node (`/run/dilu`).
    pub host_socket_dir: PathBuf,
    /// The socket's file name in that directory.
    pub socket_name: String,
}

/// Where a container finds the interposer.
pub const CONTAINER_INTERPOSER: &str = "/usr/local/lib/dilu/libdilu_interposer.so";
/// Where a container finds the node manager's socket directory: the whole
/// directory is mounted so a restarted node manager's new socket is seen.
pub const CONTAINER_SOCKET_DIR: &str = "/run/dilu";

impl ContainerLayout {
    /// The environment and mounts that put the container under `assignment`.
    pub fn response(&self, assignment: &PodAssignment) -> ContainerAllocateResponse {
        let indices: Vec<String> = assignment.gpu_indices.iter().map(u32::to_string).collect();
        let mut envs: std::collections::HashMap<String, String> =
            assignment.tenant_environment().into_iter().collect();
        // Node indices: the node manager keys budgets by them, so every GPU
        // stays visible to the runtime and CUDA picks the chosen ones.
        envs.insert("NVIDIA_VISIBLE_DEVICES".into(), "all".into());
        envs.insert("CUDA_VISIBLE_DEVICES".into(), indices.join(","));
        envs.insert("LD_PRELOAD".into(), CONTAINER_INTERPOSER.into());
        envs.insert(
            dilu_abi::node_wire::SOCKET_ENV.into(),
            format!("{CONTAINER_SOCKET_DIR}/{}", self.socket_name),
        );
        ContainerAllocateResponse {
            envs,
            mounts: vec![
                Mount {
                    container_path: CONTAINER_INTERPOSER.into(),
                    host_path: self.host_interposer.display().to_string(),
                    read_only: true,
                },
                Mount {
                    container_path: CONTAINER_SOCKET_DIR.into(),
                    host_path: self.host_socket_dir.display().to_string(),
                    read_only: false,
                },
            ],
            ..Default::default()
        }
    }
}
