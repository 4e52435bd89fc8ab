//! Which pod the kubelet is setting up. `Allocate` names only device IDs, so
//! the plugin finds the pod among those bound to its node that the extender
//! placed (`dilu.io/gpu-indices`) and the plugin has not yet set up
//! (no `dilu.io/allocated`): the kubelet admits a node's pods one at a time,
//! so the oldest such pod asking for as many shares as the kubelet hands
//! over is the one (the approach HAMi's plugin takes too). The chosen pod
//! is then marked `dilu.io/allocated: "true"`.

use dilu_abi::pod_assignment::{self, PodAssignment};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use std::future::Future;

/// A pod bound to this node, waiting for its container to be set up.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingPod {
    pub namespace: String,
    pub name: String,
    /// `dilu.io/gpu-share` units its containers ask for.
    pub shares: u32,
    pub assignment: PodAssignment,
}

/// Where the plugin learns the pods bound to its node.
pub trait PodSource: Send + Sync + 'static {
    fn pending(&self) -> impl Future<Output = Result<Vec<PendingPod>, String>> + Send;
    fn mark_allocated(&self, pod: &PendingPod) -> impl Future<Output = Result<(), String>> + Send;
}

/// The pod the kubelet is setting up when it hands over `devices` shares:
/// the earliest bound one asking for exactly that many.
pub fn choose(pending: &[PendingPod], devices: usize) -> Option<&PendingPod> {
    pending
        .iter()
        .filter(|pod| pod.shares as usize == devices)
        .min_by_key(|pod| {
            (
                pod.assignment.bound_at_ms,
                pod.namespace.clone(),
                pod.name.clone(),
            )
        })
}

/// A pod waiting for setup, or `None` (not placed by dilu, already set up,
/// finished, being deleted, or with malformed annotations, which are logged).
pub fn pending_pod(pod: &Pod) -> Option<PendingPod> {
    let meta = &pod.metadata;
    let annotations = meta.annotations.clone().unwrap_or_default();
    if meta.deletion_timestamp.is_some() || annotations.contains_key(pod_assignment::ALLOCATED) {
        return None;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let assignment = match PodAssignment::from_annotations(&annotations) {
        Ok(Some(assignment)) => assignment,
        Ok(None) => return None,
        Err(error) => {
            tracing::warn!(pod = ?meta.name, "ignoring a pod with bad dilu annotations: {error}");
            return None;
        }
    };
    let shares = pod
        .spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .filter_map(|c| {
            c.resources
                .as_ref()?
                .limits
                .as_ref()?
                .get(pod_assignment::RESOURCE)
        })
        .filter_map(|quantity| quantity.0.parse::<u32>().ok())
        .sum();
    Some(PendingPod {
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone()?,
        shares,
        assignment,
    })
}

/// Pods from the API server (in-cluster credentials or a kubeconfig).
pub struct ApiServerPods {
    client: kube::Client,
    node: String,
}

impl ApiServerPods {
    pub fn new(client: kube::Client, node: String) -> Self {
        ApiServerPods { client, node }
    }
}

impl PodSource for ApiServerPods {
    async fn pending(&self) -> Result<Vec<PendingPod>, String> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let selector = format!("spec.nodeName={}", self.node);
        let list = pods
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| format!("listing the pods of node {}: {e}", self.node))?;
        Ok(list.items.iter().filter_map(pending_pod).collect())
    }

    async fn mark_allocated(&self, pod: &PendingPod) -> Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let patch = serde_json::json!({
            "metadata": {"annotations": {pod_assignment::ALLOCATED: "true"}}
        });
        pods.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| format!("marking {}/{} allocated: {e}", pod.namespace, pod.name))
    }
}
