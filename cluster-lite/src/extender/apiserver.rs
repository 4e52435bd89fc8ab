//! The extender's link to the Kubernetes API server (the `kube` crate):
//! at start it rebuilds its allocations from the pods it placed before
//! (their `dilu.io/*` annotations) and learns GPU inventory from node
//! objects; watchers keep both current, so a deleted or finished pod frees
//! its share; bind writes the placement on the pod and creates the Binding.
//!
//! Watch events go through a channel to one plain thread that applies them
//! to the state, so no runtime thread ever waits on the state's lock while
//! a bind holding it waits on the runtime.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_stream::StreamExt;

use super::ExtenderState;

/// What the watchers tell the state.
pub enum ClusterEvent {
    /// A node object (its labels and annotations may describe its GPUs).
    Node(Box<Node>),
    /// A pod was created or changed.
    Pod(Box<Pod>),
    /// A pod is gone.
    PodDeleted(Box<Pod>),
    /// A full relist of pods: everything not in it is gone.
    PodsRelisted(Vec<Pod>),
}

/// An API server client with the runtime that drives it.
pub struct ApiServer {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) client: kube::Client,
}

impl ApiServer {
    /// `url`: a plain-HTTP API server (e.g. `kubectl proxy`), or `in-cluster`
    /// for the pod's service account (or the kubeconfig outside a cluster).
    pub fn connect(url: &str) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("dilu-apiserver")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the API server client: {e}"))?;
        let client = runtime.block_on(async {
            let config = if url == "in-cluster" {
                kube::Config::infer()
                    .await
                    .map_err(|e| format!("no API server credentials: {e}"))?
            } else {
                kube::Config::new(url.parse().map_err(|e| format!("--apiserver {url}: {e}"))?)
            };
            kube::Client::try_from(config).map_err(|e| format!("API server client: {e}"))
        })?;
        Ok(ApiServer { runtime, client })
    }

    /// Lists nodes and pods once, so the state is whole before the first
    /// scheduling request is answered.
    pub fn initial_state(&self) -> Result<(Vec<Node>, Vec<Pod>), String> {
        self.runtime.block_on(async {
            let nodes = Api::<Node>::all(self.client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing nodes: {e}"))?;
            let pods = Api::<Pod>::all(self.client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing pods: {e}"))?;
            Ok((nodes.items, pods.items))
        })
    }

    /// Starts the node and pod watchers and the thread that applies what
    /// they see to `state`.
    pub fn watch(&self, state: Arc<Mutex<ExtenderState>>) -> Result<(), String> {
        let (events, received) = crossbeam_channel::unbounded();
        self.runtime
            .spawn(watch_nodes(self.client.clone(), events.clone()));
        self.runtime.spawn(watch_pods(self.client.clone(), events));
        std::thread::Builder::new()
            .name("dilu-cluster-events".into())
            .spawn(move || apply_events(&received, &state))
            .map(drop)
            .map_err(|e| format!("cannot start thread: {e}"))
    }

    /// Writes `annotations` on the pod, then binds it to `node`.
    pub fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        self.runtime.block_on(async {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
            pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("annotating {namespace}/{name}: {e}"))?;
            let binding = Binding {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    uid: (!uid.is_empty()).then(|| uid.to_string()),
                    ..Default::default()
                },
                target: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.to_string()),
                    ..Default::default()
                },
            };
            pods.create_subresource::<_, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            )
            .await
            .map(drop)
            .map_err(|e| format!("binding {namespace}/{name} to {node}: {e}"))
        })
    }
}

async fn watch_nodes(client: kube::Client, events: Sender<ClusterEvent>) {
    // With a backoff: without one a failing watch is retried at once, and
    // the thread spun at 100% CPU against an API server that answered
    // every watch with an error.
    let mut stream = std::pin::pin!(
        watcher(Api::<Node>::all(client), watcher::Config::default()).default_backoff()
    );
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                let _ = events.send(ClusterEvent::Node(Box::new(node)));
            }
            Ok(_) => {}
            Err(error) => tracing::warn!("node watch: {error}"),
        }
    }
}

async fn watch_pods(client: kube::Client, events: Sender<ClusterEvent>) {
    let mut stream = std::pin::pin!(
        watcher(Api::<Pod>::all(client), watcher::Config::default()).default_backoff()
    );
    let mut relist = Vec::new();
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(watcher::Event::Init) => {
                relist.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(pod)) => {
                relist.push(pod);
                continue;
            }
            Ok(watcher::Event::InitDone) => ClusterEvent::PodsRelisted(std::mem::take(&mut relist)),
            Ok(watcher::Event::Apply(pod)) => ClusterEvent::Pod(Box::new(pod)),
            Ok(watcher::Event::Delete(pod)) => ClusterEvent::PodDeleted(Box::new(pod)),
            Err(error) => {
                tracing::warn!("pod watch: {error}");
                continue;
            }
        };
        let _ = events.send(event);
    }
}

fn apply_events(events: &Receiver<ClusterEvent>, state: &Mutex<ExtenderState>) {
    for event in events {
        let mut state = state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match event {
            ClusterEvent::Node(node) => state.observe_node(&node),
            ClusterEvent::Pod(pod) => state.observe_pod(&pod),
            ClusterEvent::PodDeleted(pod) => state.forget_pod(&pod),
            ClusterEvent::PodsRelisted(pods) => state.replace_pods(&pods),
        }
    }
}
