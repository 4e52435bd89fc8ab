//! `dilu-cluster autoscaler`: scales annotated Deployments from the node
//! managers' signals.

use std::time::Duration;

use clap::Args;
use dilu_cluster::autoscaler::{self, AutoscalerConfig};

#[derive(Debug, Args)]
pub struct AutoscalerArgs {
    /// The API server: `in-cluster` (the pod's service account, else the
    /// kubeconfig) or a plain-HTTP URL (e.g. kubectl proxy at
    /// http://127.0.0.1:8001).
    #[arg(long, default_value = "in-cluster")]
    pub apiserver: String,
    /// How often the scaling rule is asked, in milliseconds; its windows
    /// (out: 3 of 6 periods, in: 30 of 40) count periods.
    #[arg(long, default_value_t = 1000)]
    pub period_ms: u64,
    /// Only Deployments of this namespace (default: every namespace).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Label selector of the node managers' pods.
    #[arg(
        long,
        default_value = "app.kubernetes.io/name=dilu,app.kubernetes.io/component=node"
    )]
    pub nodemgr_selector: String,
    /// Namespace of the node managers' pods (default: every namespace).
    #[arg(long)]
    pub nodemgr_namespace: Option<String>,
    /// Metrics port of a node manager pod that names no container port
    /// `metrics`.
    #[arg(long, default_value_t = 9400)]
    pub nodemgr_port: u16,
    /// Limit on each step of reading a node manager, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub nodemgr_timeout_ms: u64,
}

pub fn run(args: AutoscalerArgs) -> Result<(), String> {
    let handle = autoscaler::start(AutoscalerConfig {
        apiserver: args.apiserver,
        period: Duration::from_millis(args.period_ms),
        namespace: args.namespace,
        nodemgr_selector: args.nodemgr_selector,
        nodemgr_namespace: args.nodemgr_namespace,
        nodemgr_port: args.nodemgr_port,
        nodemgr_timeout: Duration::from_millis(args.nodemgr_timeout_ms),
    })?;
    eprintln!(
        "dilu-cluster autoscaler: scaling Deployments annotated {}=\"true\" every {} ms",
        autoscaler::AUTOSCALE,
        args.period_ms
    );
    handle.wait();
    Ok(())
}
