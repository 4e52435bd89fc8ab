//! `dilu-cluster extender`: the kube-scheduler extender server.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use dilu_abi::units::parse_size;
use dilu_cluster::extender::{self, ExtenderConfig, NodeInventory};

#[derive(Debug, Args)]
pub struct ExtenderArgs {
    /// HTTP address kube-scheduler calls (the urlPrefix host:port).
    #[arg(long, default_value = "0.0.0.0:8888")]
    pub listen: SocketAddr,
    /// Placement policy: dilu, dilu-paper, fgd, infless-r, infless-l, exclusive.
    #[arg(long, default_value = "dilu")]
    pub policy: String,
    /// JSON file {"node": {"gpus": 8, "gpu_memory": "80GiB"}, ...}, used when
    /// the scheduler sends only node names.
    #[arg(long)]
    pub inventory: Option<PathBuf>,
    /// GPUs of a node not described by labels or the inventory file.
    #[arg(long, default_value_t = 8)]
    pub default_gpus: usize,
    /// Memory per GPU of such a node.
    #[arg(long, default_value = "80GiB", value_parser = parse_size)]
    pub default_gpu_memory: u64,
    /// The API server: `in-cluster` (the pod's service account, else the
    /// kubeconfig) or a plain-HTTP URL (e.g. kubectl proxy at
    /// http://127.0.0.1:8001). The extender rebuilds its allocations from
    /// it at start, watches pods and nodes, and at bind annotates the pod
    /// and creates its Binding. Without it allocations live only in memory.
    #[arg(long)]
    pub apiserver: Option<String>,
}

pub fn run(args: ExtenderArgs) -> Result<(), String> {
    let inventory: BTreeMap<String, NodeInventory> = match &args.inventory {
        None => BTreeMap::new(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read inventory {}: {error}", path.display()))?;
            serde_json::from_str(&text)
                .map_err(|error| format!("inventory {}: {error}", path.display()))?
        }
    };
    let handle = extender::start(ExtenderConfig {
        listen: args.listen,
        policy: args.policy,
        inventory,
        default_gpus: args.default_gpus,
        default_gpu_memory: args.default_gpu_memory,
        apiserver: args.apiserver,
    })?;
    eprintln!(
        "dilu-cluster extender listening on http://{}",
        handle.addr()
    );
    handle.wait();
    Ok(())
}
