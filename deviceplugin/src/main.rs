//! `dilu-device-plugin`: run on every GPU node (the node DaemonSet, beside
//! the node manager).

use clap::Parser;
use dilu_deviceplugin::container::ContainerLayout;
use dilu_deviceplugin::pods::ApiServerPods;
use dilu_deviceplugin::service::SharePlugin;
use dilu_deviceplugin::{devices, kubelet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(about = "Kubernetes device plugin: GPU shares for pods the dilu extender placed")]
struct Args {
    /// This node's name (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// The kubelet's device plugin directory (holds kubelet.sock).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    kubelet_dir: PathBuf,
    /// The extended resource advertised.
    #[arg(long, default_value = dilu_abi::pod_assignment::RESOURCE)]
    resource: String,
    /// Devices advertised per GPU: the most pods one GPU can hold.
    #[arg(long, default_value_t = 10)]
    shares_per_gpu: u32,
    /// NVML library to read GPU UUIDs from.
    #[arg(long, default_value = "libnvidia-ml.so.1")]
    nvml_library: PathBuf,
    /// The interposer library on the node, mounted into containers.
    #[arg(long, default_value = "/var/lib/dilu/lib/libdilu_interposer.so")]
    interposer: PathBuf,
    /// The node manager's socket directory on the node, mounted into containers.
    #[arg(long, default_value = "/run/dilu")]
    socket_dir: PathBuf,
    /// The node manager's socket file name in that directory.
    #[arg(long, default_value = "nodemgr.sock")]
    socket_name: String,
    /// API server URL (plain HTTP, e.g. `kubectl proxy`); default: in-cluster
    /// credentials or the kubeconfig.
    #[arg(long)]
    apiserver: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    dilu_deviceplugin::plugin_start::init_logging();
    dilu_deviceplugin::plugin_start::exit_code("dilu-device-plugin", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), String> {
    let gpus = devices::discover(args.nvml_library.as_os_str())?;
    tracing::info!(gpus = gpus.len(), node = %args.node, "GPUs found");
    let plugin = Arc::new(SharePlugin {
        gpus,
        shares_per_gpu: args.shares_per_gpu,
        layout: ContainerLayout {
            host_interposer: args.interposer,
            host_socket_dir: args.socket_dir,
            socket_name: args.socket_name,
        },
        pods: ApiServerPods::new(
            dilu_deviceplugin::plugin_start::api_client(args.apiserver.as_deref()).await?,
            args.node,
        ),
    });
    loop {
        match kubelet::serve_and_register(plugin.clone(), &args.kubelet_dir, &args.resource).await {
            Ok(()) => tracing::info!("plugin socket removed (kubelet restart?): registering again"),
            Err(error) => tracing::warn!("{error}; retrying"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}
