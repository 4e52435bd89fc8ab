//! Kubernetes mode: a kube-scheduler extender over HTTP (`dilu-cluster
//! extender`).
//!
//! Verbs (POST, matched on the last path segment so any `urlPrefix` works):
//! `filter` keeps the nodes where the placement policy finds GPUs for the
//! pod, `prioritize` scores them 0–10 from the policy's cost, `bind` commits
//! the pod to GPUs of the chosen node (and, with `--apiserver`, creates the
//! pod's Binding through the API server), `release` (`{"PodUID": ...}`)
//! frees a pod's GPUs. `GET /healthz` answers `ok`, `GET /allocations` dumps
//! the view.
//!
//! The extender keeps its own view: per-GPU allocations come from its binds;
//! each node's GPU inventory comes from the node object's labels or
//! annotations `dilu.io/gpu-count` and `dilu.io/gpu-memory` when the
//! scheduler sends full nodes, else from the `--inventory` file, else from
//! the `--default-gpus` / `--default-gpu-memory` flags. Malformed requests
//! get HTTP 400 with a JSON body carrying `Error`; nothing in a request can
//! crash the server.

mod api_binding;
pub mod pod_demand;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use dilu_abi::units::parse_size;
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
    /// `http://host:port` of an API server reachable without TLS (for
    /// example `kubectl proxy`); binds create the pod's Binding there.
    pub apiserver: Option<String>,
}

struct Allocation {
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
        if let Some(apiserver) = &self.config.apiserver
            && let Err(error) = api_binding::create_binding(apiserver, &args)
        {
            return result(format!("API server refused the binding: {error}"));
        }
        self.cluster.apply(&demand, &placement.gpus);
        self.pending.remove(&args.pod_uid);
        self.allocations.insert(
            args.pod_uid.clone(),
            Allocation {
                node: args.node.clone(),
                demand,
                gpus: placement.gpus,
            },
        );
        result(String::new())
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
        match self.allocations.remove(&uid) {
            Some(allocation) => {
                self.cluster.release(&allocation.demand, &allocation.gpus);
                (200, json!({ "Error": "" }))
            }
            None => (
                404,
                json!({ "Error": format!("pod {uid} holds no dilu GPUs") }),
            ),
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

/// Binds the HTTP listener and serves requests on one thread.
pub fn start(config: ExtenderConfig) -> Result<ExtenderHandle, String> {
    let listen = config.listen;
    let mut state = ExtenderState::new(config)?;
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
                        Ok(Some(request)) => serve_one(&mut state, request),
                        Ok(None) => {}
                        Err(error) => tracing::warn!("extender accept failed: {error}"),
                    }
                }
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
