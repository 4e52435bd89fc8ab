//! `dilu-dra-plugin`: run on every GPU node (the node DaemonSet, beside
//! the node manager) of a cluster that asks for GPUs with DRA.

use clap::Parser;
use dilu_dra::cdi::NodeLayout;
use dilu_dra::service::{DraService, NodeManager};
use dilu_dra::{apiserver, kubelet, slice};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    about = "Kubernetes DRA driver gpu.dilu.io: GPUs shared by consumable capacity, \
             each claim's memory and SM share enforced by dilu"
)]
struct Args {
    /// This node's name (the DaemonSet passes spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// The kubelet's plugin registry directory (its plugin watcher looks here).
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// The plugin's own directory: its DRA socket and checkpoint.
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpu.dilu.io")]
    plugin_dir: PathBuf,
    /// Where CDI specs are written for the container runtime.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// NVML library to read the GPUs from.
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
    /// The node's device directory (GPU device nodes handed to containers).
    #[arg(long, default_value = "/dev")]
    dev_dir: PathBuf,
    /// How often prepared claims are granted to the node manager again (a
    /// restarted node manager has forgotten them), in seconds.
    #[arg(long, default_value_t = 10)]
    regrant_seconds: u64,
    /// API server URL (plain HTTP, e.g. `kubectl proxy`); default: in-cluster
    /// credentials or the kubeconfig.
    #[arg(long)]
    apiserver: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    dilu_deviceplugin::plugin_start::init_logging();
    dilu_deviceplugin::plugin_start::exit_code("dilu-dra-plugin", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), String> {
    if args.regrant_seconds == 0 {
        return Err("--regrant-seconds must be at least 1".into());
    }
    let gpus = dilu_deviceplugin::devices::discover(args.nvml_library.as_os_str())?;
    tracing::info!(gpus = gpus.len(), node = %args.node, "GPUs found");
    let client = dilu_deviceplugin::plugin_start::api_client(args.apiserver.as_deref()).await?;
    let service = Arc::new(DraService::new(
        args.node.clone(),
        gpus.clone(),
        NodeLayout {
            host_interposer: args.interposer,
            host_socket_dir: args.socket_dir.clone(),
            socket_name: args.socket_name.clone(),
            dev_dir: args.dev_dir,
        },
        args.cdi_dir,
        &args.plugin_dir,
        apiserver::ApiServerClaims(client.clone()),
        NodeManager {
            socket: args.socket_dir.join(&args.socket_name),
            gpu_count: gpus.len(),
        },
    )?);
    let restored = service.prepared.lock().await.claims.len();
    if restored > 0 {
        tracing::info!(
            claims = restored,
            "prepared claims restored from the checkpoint"
        );
    }
    // The slice, until the API server takes it; then kept as published.
    let slice = slice::resource_slice(&args.node, &gpus, 1);
    tokio::spawn(async move {
        loop {
            match apiserver::publish(&client, slice.clone()).await {
                Ok(()) => tokio::time::sleep(Duration::from_secs(60)).await,
                Err(error) => {
                    tracing::warn!("{error}; retrying in 5 s");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        }
    });
    let regrant = service.clone();
    let period = Duration::from_secs(args.regrant_seconds);
    tokio::spawn(async move {
        loop {
            regrant.grant_all_again().await;
            tokio::time::sleep(period).await;
        }
    });
    kubelet::serve(service, &args.plugin_dir, &args.registry_dir).await
}
