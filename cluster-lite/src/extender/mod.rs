//! Kubernetes mode: a kube-scheduler extender over HTTP (`dilu-cluster
//! extender`).
//!
//! Verbs (POST, matched on the last path segment so any `urlPrefix` works):
//! `filter` keeps the nodes where the placement policy finds GPUs for the
//! pod, `prioritize` scores them 0–10 from the policy's cost, `bind` commits
//! the pod to GPUs of the chosen node (with `--apiserver`: writes the
//! placement on the pod as `dilu.io/*` annotations, see
//! `dilu_abi::pod_assignment`, and creates the pod's Binding), `release`
//! (`{"PodUID": ...}`) frees a pod's GPUs. `GET /healthz` answers `ok`,
//! `GET /allocations` dumps the view.
//!
//! With `--apiserver` the view is the cluster's (`apiserver`): rebuilt at
//! start from the annotations of the pods placed before, and kept by
//! watching pods (a deleted or finished pod frees its share) and nodes.
//! Without it allocations come from this process's binds only.
//! Each node's GPU inventory comes from the node object's labels or
//! annotations `dilu.io/gpu-count` and `dilu.io/gpu-memory` when the
//! scheduler sends full nodes, else from the `--inventory` file, else from
//! the `--default-gpus` / `--default-gpu-memory` flags. Malformed requests
//! get HTTP 400 with a JSON body carrying `Error`; nothing in a request can
//! crash the server.

pub(crate) mod apiserver;
pub mod pod_demand;
pub mod wire;

use dilu_abi::node_wire::SmShare;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use dilu_abi::node_wire::TenantSpec;
use dilu_abi::pod_assignment::{self, PodAssignment};
use dilu_abi::units::{Bytes, parse_size};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::model::{ClusterState, InstanceDemand};
use crate::policy::{PlacementPolicy, place_on_node, policy_by_name};
use wire::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    MAX_EXTENDER_PRIORITY, NodeList, node_meta, node_name,
};

/// Largest request body read (a NodeList of thousands of nodes fits).
const MAX_BODY_BYTES: u64 = 64 << 20;

/// GPU inventory of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub gpus: usize,
    /// Per GPU, e.g. "80GiB".
    pub gpu_memory: String,
}

/// How the extender starts.
#[derive(Debug, Clone)]
pub struct ExtenderConfig {
    pub listen: SocketAddr,
    pub policy: String,
    pub inventory: BTreeMap<String, NodeInventory>,
    pub default_gpus: usize,
    pub default_gpu_memory: u64,
    /// The API server: `http://host:port` without TLS (for example
    /// `kubectl proxy`), or `in-cluster` (service account or kubeconfig).
    pub apiserver: Option<String>,
}

struct Allocation {
    /// `namespace/name`, for people reading `/allocations`.
    pod: String,
    node: String,
    demand: InstanceDemand,
    gpus: Vec<usize>,
}

/// The extender's view of the cluster.
pub struct ExtenderState {
    config: ExtenderConfig,
    policy: Box<dyn PlacementPolicy>,
    cluster: ClusterState,
    node_index: HashMap<String, usize>,
    allocations: HashMap<String, Allocation>,
    /// Demands of pods seen in filter/prioritize, by pod UID, for bind.
    pending: HashMap<String, InstanceDemand>,
    api: Option<apiserver::ApiServer>,
}

/// Pending demands kept before the oldest are forgotten.
const MAX_PENDING_PODS: usize = 100_000;

/// An HTTP answer: status code and JSON body.
pub type Answer = (u16, Value);

fn bad_request(message: impl Into<String>) -> Answer {
    (400, json!({ "Error": message.into() }))
}

impl ExtenderState {
    pub fn new(config: ExtenderConfig) -> Result<Self, String> {
        let policy = policy_by_name(&config.policy)
            .ok_or_else(|| format!("unknown policy {:?}", config.policy))?;
        for (node, inventory) in &config.inventory {
            parse_size(&inventory.gpu_memory)
                .map_err(|error| format!("inventory {node}: {error}"))?;
        }
        Ok(Self {
            config,
            policy,
            cluster: ClusterState::default(),
            node_index: HashMap::new(),
            allocations: HashMap::new(),
            pending: HashMap::new(),
            api: None,
        })
    }

    /// Dispatches one request by method and path.
    pub fn answer(&mut self, method: &str, path: &str, body: &[u8]) -> Answer {
        let verb = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        match (method, verb) {
            ("GET", "healthz") => (200, json!("ok")),
            ("GET", "allocations") => (200, self.allocations_json()),
            ("POST", "filter") => self.filter(body),
            ("POST", "prioritize") => self.prioritize(body),
            ("POST", "bind") => self.bind(body),
            ("POST", "release") => self.release(body),
            _ => (
                404,
                json!({ "Error": format!("no such endpoint {method} {path}: expected POST .../filter, .../prioritize, .../bind, .../release") }),
            ),
        }
    }

    fn parse_args(body: &[u8]) -> Result<(ExtenderArgs, Option<InstanceDemand>), Answer> {
        let args: ExtenderArgs = serde_json::from_slice(body)
            .map_err(|error| bad_request(format!("malformed ExtenderArgs JSON: {error}")))?;
        let pod = args
            .pod
            .as_ref()
            .ok_or_else(|| bad_request("ExtenderArgs has no Pod"))?;
        let demand = pod_demand::pod_demand(pod).map_err(|error| {
            bad_request(format!(
                "pod {}/{}: {error}",
                pod.metadata.namespace, pod.metadata.name
            ))
        })?;
        Ok((args, demand))
    }

    /// Names the request's nodes, learning inventory from node objects.
    fn candidate_names(&mut self, args: &ExtenderArgs) -> Vec<String> {
        if let Some(list) = &args.nodes {
            let mut names = Vec::new();
            for node in &list.items {
                if let Some(name) = node_name(node) {
                    self.learn_node(name, Some(node));
                    names.push(name.to_string());
                }
            }
            return names;
        }
        let names = args.node_names.clone().unwrap_or_default();
        for name in &names {
            self.learn_node(name, None);
        }
        names
    }

    fn learn_node(&mut self, name: &str, object: Option<&Value>) {
        if self.node_index.contains_key(name) {
            return;
        }
        let from_object = object.and_then(|node| {
            let gpus = node_meta(node, "dilu.io/gpu-count")?.trim().parse().ok()?;
            let memory = parse_size(node_meta(node, "dilu.io/gpu-memory")?).ok()?;
            Some((gpus, memory))
        });
        let from_file =
            self.config.inventory.get(name).and_then(|inventory| {
                Some((inventory.gpus, parse_size(&inventory.gpu_memory).ok()?))
            });
        let (gpus, memory) = from_object
            .or(from_file)
            .unwrap_or((self.config.default_gpus, self.config.default_gpu_memory));
        let index = self.cluster.add_node(gpus, memory);
        self.node_index.insert(name.to_string(), index);
    }

    fn filter(&mut self, body: &[u8]) -> Answer {
        let (args, demand) = match Self::parse_args(body) {
            Ok(parsed) => parsed,
            Err(answer) => return answer,
        };
        let names = self.candidate_names(&args);
        let mut result = ExtenderFilterResult::default();
        let mut passed = Vec::new();
        for name in &names {
            let fits = match &demand {
                None => true,
                Some(demand) => {
                    let node = self.node_index[name];
                    place_on_node(self.policy.as_ref(), &self.cluster, demand, node).is_some()
                }
            };
            if fits {
                passed.push(name.clone());
            } else if let Some(demand) = &demand {
                let reason = if self.cluster.nodes[self.node_index[name]].is_empty() {
                    "node has no dilu GPUs (set dilu.io/gpu-count)".to_string()
                } else {
                    format!(
                        "dilu: no {} GPU(s) with room for SM request {:.2}, limit {:.2}, {} memory",
                        demand.gpus,
                        demand.sm_request,
                        demand.sm_limit,
                        dilu_abi::units::format_size(demand.memory_bytes)
                    )
                };
                result.failed_nodes.insert(name.clone(), reason);
            }
        }
        match &args.nodes {
            Some(list) => {
                let items = list
                    .items
                    .iter()
                    .filter(|node| node_name(node).is_some_and(|n| passed.iter().any(|p| p == n)))
                    .cloned()
                    .collect();
                result.nodes = Some(NodeList {
                    items,
                    rest: list.rest.clone(),
                });
            }
            None => result.node_names = Some(passed),
        }
        (
            200,
            serde_json::to_value(result).unwrap_or_else(|e| json!({ "Error": e.to_string() })),
        )
    }

    fn prioritize(&mut self, body: &[u8]) -> Answer {
        let (args, demand) = match Self::parse_args(body) {
            Ok(parsed) => parsed,
            Err(answer) => return answer,
        };
        let names = self.candidate_names(&args);
        let costs: Vec<Option<f64>> = names
            .iter()
            .map(|name| {
                let demand = demand.as_ref()?;
                place_on_node(
                    self.policy.as_ref(),
                    &self.cluster,
                    demand,
                    self.node_index[name],
                )
                .map(|placement| placement.cost)
            })
            .collect();
        let feasible = costs.iter().flatten();
        let lowest = feasible.clone().copied().fold(f64::INFINITY, f64::min);
        let highest = feasible.copied().fold(f64::NEG_INFINITY, f64::max);
        let scores: Vec<HostPriority> = names
            .into_iter()
            .zip(costs)
            .map(|(host, cost)| {
                let score = match cost {
                    None => 0,
                    Some(_) if highest - lowest < 1e-12 => MAX_EXTENDER_PRIORITY,
                    Some(cost) => {
                        let better = (highest - cost) / (highest - lowest);
                        (better * MAX_EXTENDER_PRIORITY as f64).round() as i64
                    }
                };
                HostPriority {
                    host,
                    score: score.clamp(0, MAX_EXTENDER_PRIORITY),
                }
            })
            .collect();
        (
            200,
            serde_json::to_value(scores).unwrap_or_else(|e| json!({ "Error": e.to_string() })),
        )
    }

    fn bind(&mut self, body: &[u8]) -> Answer {
        let args: ExtenderBindingArgs = match serde_json::from_slice(body) {
            Ok(args) => args,
            Err(error) => {
                return bad_request(format!("malformed ExtenderBindingArgs JSON: {error}"));
            }
        };
        let result = |error: String| (200, json!(ExtenderBindingResult { error }));
        if args.pod_uid.is_empty() || args.node.is_empty() {
            return bad_request("ExtenderBindingArgs needs PodUID and Node");
        }
        if let Some(existing) = self.allocations.get(&args.pod_uid) {
            return if existing.node == args.node {
                result(String::new())
            } else {
                result(format!(
                    "pod {} is already bound to {}",
                    args.pod_uid, existing.node
                ))
            };
        }
        // The binding args carry no pod spec; the demand comes from the last
        // filter/prioritize of this pod, which the scheduler always sends first.
        let Some(demand) = self.pending_demand(&args) else {
            return result(format!(
                "pod {}/{} was not filtered by this extender; cannot bind",
                args.pod_namespace, args.pod_name
            ));
        };
        self.learn_node(&args.node, None);
        let node = self.node_index[&args.node];
        let Some(placement) = place_on_node(self.policy.as_ref(), &self.cluster, &demand, node)
        else {
            return result(format!("node {} no longer has room for the pod", args.node));
        };
        let gpus_on_node: Vec<usize> = placement
            .gpus
            .iter()
            .map(|gpu| gpu - self.cluster.nodes[node].start)
            .collect();
        let namespace = if args.pod_namespace.is_empty() {
            "default"
        } else {
            &args.pod_namespace
        };
        if let Some(api) = &self.api {
            let assignment = assignment_for(namespace, &args.pod_name, &demand, &gpus_on_node);
            if let Err(error) = api.bind(
                namespace,
                &args.pod_name,
                &args.pod_uid,
                &args.node,
                &assignment.to_annotations(),
            ) {
                return result(format!("API server refused the binding: {error}"));
            }
        }
        self.cluster.apply(&demand, &placement.gpus);
        self.pending.remove(&args.pod_uid);
        self.allocations.insert(
            args.pod_uid.clone(),
            Allocation {
                pod: format!("{namespace}/{}", args.pod_name),
                node: args.node.clone(),
                demand,
                gpus: placement.gpus,
            },
        );
        tracing::info!(pod = %format!("{namespace}/{}", args.pod_name), node = %args.node, gpus = ?gpus_on_node, "bound");
        result(String::new())
    }

    /// A node object seen on the API server: learns its GPUs.
    pub fn observe_node(&mut self, node: &Node) {
        if let (Some(name), Ok(object)) = (&node.metadata.name, serde_json::to_value(node)) {
            self.learn_node(name, Some(&object));
        }
    }

    /// A pod seen on the API server: one that dilu placed holds its share
    /// until it finishes or is deleted.
    pub fn observe_pod(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            self.free(&uid);
            return;
        }
        if self.allocations.contains_key(&uid) {
            return;
        }
        let Some(node_name) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let assignment = match PodAssignment::from_annotations(&annotations) {
            Ok(Some(assignment)) => assignment,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(pod = ?pod.metadata.name, "ignoring bad dilu annotations: {error}");
                return;
            }
        };
        self.learn_node(&node_name, None);
        let range = self.cluster.nodes[self.node_index[&node_name]].clone();
        let gpus: Option<Vec<usize>> = assignment
            .gpu_indices
            .iter()
            .map(|&i| Some(range.start + i as usize).filter(|gpu| range.contains(gpu)))
            .collect();
        let Some(gpus) = gpus else {
            tracing::warn!(pod = ?pod.metadata.name, node = %node_name, "the pod's GPU indices are not on its node");
            return;
        };
        let demand = demand_of(&assignment);
        self.cluster.apply(&demand, &gpus);
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        self.allocations.insert(
            uid,
            Allocation {
                pod: format!("{namespace}/{name}"),
                node: node_name,
                demand,
                gpus,
            },
        );
    }

    /// A pod deleted on the API server frees its share.
    pub fn forget_pod(&mut self, pod: &Pod) {
        if let Some(uid) = &pod.metadata.uid {
            self.free(uid);
        }
    }

    /// A full pod list: the allocations become exactly the dilu pods in it.
    pub fn replace_pods(&mut self, pods: &[Pod]) {
        let uids: Vec<String> = self.allocations.keys().cloned().collect();
        for uid in uids {
            self.free(&uid);
        }
        for pod in pods {
            self.observe_pod(pod);
        }
    }

    fn free(&mut self, uid: &str) -> bool {
        match self.allocations.remove(uid) {
            Some(allocation) => {
                self.cluster.release(&allocation.demand, &allocation.gpus);
                tracing::info!(pod = %allocation.pod, node = %allocation.node, "freed");
                true
            }
            None => false,
        }
    }

    fn pending_demand(&self, args: &ExtenderBindingArgs) -> Option<InstanceDemand> {
        self.pending.get(&args.pod_uid).cloned()
    }

    fn remember(&mut self, body: &[u8]) {
        if let Ok((args, Some(demand))) = Self::parse_args(body)
            && let Some(pod) = args.pod
            && !pod.metadata.uid.is_empty()
        {
            if self.pending.len() >= MAX_PENDING_PODS {
                self.pending.clear();
            }
            self.pending.insert(pod.metadata.uid, demand);
        }
    }

    fn release(&mut self, body: &[u8]) -> Answer {
        let uid = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|value| value.get("PodUID")?.as_str().map(str::to_string));
        let Some(uid) = uid else {
            return bad_request("release needs a JSON body {\"PodUID\": \"...\"}");
        };
        if self.free(&uid) {
            (200, json!({ "Error": "" }))
        } else {
            (
                404,
                json!({ "Error": format!("pod {uid} holds no dilu GPUs") }),
            )
        }
    }

    fn allocations_json(&self) -> Value {
        let mut pods: Vec<Value> = self
            .allocations
            .iter()
            .map(|(uid, allocation)| {
                let start = self.cluster.nodes[self.node_index[&allocation.node]].start;
                json!({
                    "PodUID": uid,
                    "Pod": allocation.pod,
                    "Node": allocation.node,
                    "GPUs": allocation.gpus.iter().map(|gpu| gpu - start).collect::<Vec<_>>(),
                })
            })
            .collect();
        pods.sort_by_key(|pod| pod["PodUID"].as_str().unwrap_or("").to_string());
        json!({ "Pods": pods })
    }

    /// Entry point used by the server: remembers pod demands seen in
    /// filter/prioritize so bind can find them.
    pub fn handle(&mut self, method: &str, path: &str, body: &[u8]) -> Answer {
        if method == "POST" && (path.ends_with("filter") || path.ends_with("prioritize")) {
            self.remember(body);
        }
        self.answer(method, path, body)
    }
}

/// A running extender server.
pub struct ExtenderHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ExtenderHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn wait(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The placement written on a pod at bind.
fn assignment_for(
    namespace: &str,
    name: &str,
    demand: &InstanceDemand,
    gpu_indices: &[usize],
) -> PodAssignment {
    PodAssignment {
        gpu_indices: gpu_indices.iter().map(|&i| i as u32).collect(),
        tenant: pod_assignment::tenant_name(namespace, name),
        spec: TenantSpec {
            class: demand.class,
            slo_ms: None,
            sm_request: SmShare::of_fraction(demand.sm_request),
            sm_limit: SmShare::of_fraction(demand.sm_limit),
            mem: Some(Bytes::new(demand.memory_bytes)),
        },
        bound_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

/// What a placed pod holds on each of its GPUs, read back from its annotations.
fn demand_of(assignment: &PodAssignment) -> InstanceDemand {
    InstanceDemand {
        class: assignment.spec.class,
        sm_request: assignment.spec.sm_request.as_fraction(),
        sm_limit: assignment.spec.sm_limit.as_fraction(),
        memory_bytes: assignment.spec.mem.map_or(0, Bytes::get),
        gpus: assignment.gpu_indices.len() as u32,
    }
}

/// Binds the HTTP listener and serves requests on one thread; with an API
/// server, first rebuilds the state from it and starts watching it.
pub fn start(config: ExtenderConfig) -> Result<ExtenderHandle, String> {
    let listen = config.listen;
    let apiserver = config.apiserver.clone();
    let mut state = ExtenderState::new(config)?;
    let api = match &apiserver {
        Some(url) => {
            let api = apiserver::ApiServer::connect(url)?;
            let (nodes, pods) = api.initial_state()?;
            for node in &nodes {
                state.observe_node(node);
            }
            state.replace_pods(&pods);
            tracing::info!(
                nodes = nodes.len(),
                placed = state.allocations.len(),
                "state rebuilt from the API server"
            );
            Some(api)
        }
        None => None,
    };
    let state = Arc::new(Mutex::new(state));
    if let Some(api) = api {
        api.watch(state.clone())?;
        state.lock().unwrap_or_else(|p| p.into_inner()).api = Some(api);
    }
    let server = tiny_http::Server::http(listen)
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| "listener has no IP address".to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("dilu-extender".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match server.recv_timeout(Duration::from_millis(100)) {
                        Ok(Some(request)) => serve_one(
                            &mut state.lock().unwrap_or_else(|p| p.into_inner()),
                            request,
                        ),
                        Ok(None) => {}
                        Err(error) => tracing::warn!("extender accept failed: {error}"),
                    }
                }
                // The API server client's runtime is dropped here, off any
                // runtime thread.
                drop(state.lock().unwrap_or_else(|p| p.into_inner()).api.take());
            })
            .map_err(|error| format!("cannot start thread: {error}"))?
    };
    Ok(ExtenderHandle {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn serve_one(state: &mut ExtenderState, mut request: tiny_http::Request) {
    let method = request.method().as_str().to_string();
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let mut body = Vec::new();
    let read = request
        .as_reader()
        .take(MAX_BODY_BYTES + 1)
        .read_to_end(&mut body);
    let (status, value) = match read {
        Err(error) => bad_request(format!("cannot read request body: {error}")),
        Ok(_) if body.len() as u64 > MAX_BODY_BYTES => {
            bad_request(format!("request body exceeds {MAX_BODY_BYTES} bytes"))
        }
        Ok(_) => state.handle(&method, &path, &body),
    };
    let text = serde_json::to_string(&value).unwrap_or_else(|_| "{\"Error\":\"encoding\"}".into());
    let content_type = tiny_http::Header::from_bytes("Content-Type", "application/json")
        .expect("static header is valid");
    let response = tiny_http::Response::from_string(text)
        .with_status_code(status)
        .with_header(content_type);
    if let Err(error) = request.respond(response) {
        tracing::debug!("client went away: {error}");
    }
}
