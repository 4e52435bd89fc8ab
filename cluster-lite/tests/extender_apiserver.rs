//! The extender against a mock Kubernetes API server that serves real
//! object JSON (pod and node lists, watch events): a restarted extender
//! rebuilds its allocations from the annotations of the pods it placed, a
//! pod deletion seen on the watch frees its share, and bind annotates the
//! pod and creates its Binding.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Request, read_request, respond};
use dilu_cluster::extender::{self, ExtenderConfig, ExtenderHandle};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

/// What the mock API server holds, and the open pod watches.
#[derive(Default)]
struct Cluster {
    nodes: Vec<Value>,
    pods: Vec<Value>,
    resource_version: u64,
    pod_watches: Vec<TcpStream>,
    /// Pod watches ever opened.
    pod_watches_opened: usize,
    /// `METHOD path` of every request, with its body.
    requests: Vec<(String, String)>,
}

impl Cluster {
    fn next_version(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    /// Sends one watch event to every open pod watch (one HTTP chunk each).
    fn broadcast(&mut self, kind: &str, pod: &Value) {
        let line = format!("{}\n", json!({ "type": kind, "object": pod }));
        self.pod_watches.retain_mut(|stream| {
            write!(stream, "{:x}\r\n{line}\r\n", line.len()).is_ok() && stream.flush().is_ok()
        });
    }
}

struct MockApiServer {
    addr: SocketAddr,
    cluster: Arc<Mutex<Cluster>>,
}

impl MockApiServer {
    fn start(nodes: Vec<Value>, pods: Vec<Value>) -> MockApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cluster = Arc::new(Mutex::new(Cluster {
            nodes,
            pods,
            resource_version: 100,
            ..Default::default()
        }));
        let shared = cluster.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let cluster = shared.clone();
                std::thread::spawn(move || serve_connection(stream, &cluster));
            }
        });
        MockApiServer { addr, cluster }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The pod is deleted: gone from lists, and a DELETED event is sent.
    fn delete_pod(&self, name: &str) {
        let mut cluster = self.cluster.lock().unwrap();
        let index = cluster
            .pods
            .iter()
            .position(|p| p["metadata"]["name"] == name)
            .expect("a known pod");
        let mut pod = cluster.pods.remove(index);
        pod["metadata"]["resourceVersion"] = json!(cluster.next_version());
        cluster.broadcast("DELETED", &pod);
    }

    fn pod(&self, name: &str) -> Value {
        let cluster = self.cluster.lock().unwrap();
        cluster
            .pods
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .cloned()
            .expect("a known pod")
    }

    fn requests(&self) -> Vec<(String, String)> {
        self.cluster.lock().unwrap().requests.clone()
    }

    fn pod_watches_opened(&self) -> usize {
        self.cluster.lock().unwrap().pod_watches_opened
    }
}

fn serve_connection(mut stream: TcpStream, cluster: &Mutex<Cluster>) {
    let Some(Request {
        method,
        path,
        query,
        body,
    }) = read_request(&stream)
    else {
        return;
    };
    let watch = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let mut cluster = cluster.lock().unwrap();
    cluster
        .requests
        .push((format!("{method} {path}"), body.clone()));
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("GET", ["api", "v1", kind @ ("pods" | "nodes")]) if watch => {
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            );
            if *kind == "pods" {
                cluster.pod_watches.push(stream);
                cluster.pod_watches_opened += 1;
            } else {
                // Nodes do not change in these tests: the watch stays open.
                std::mem::forget(stream);
            }
        }
        ("GET", ["api", "v1", kind @ ("pods" | "nodes")]) => {
            let items = if *kind == "pods" {
                cluster.pods.clone()
            } else {
                cluster.nodes.clone()
            };
            let list_kind = if *kind == "pods" {
                "PodList"
            } else {
                "NodeList"
            };
            let version = cluster.resource_version.to_string();
            respond(
                &mut stream,
                200,
                &json!({ "apiVersion": "v1", "kind": list_kind, "metadata": { "resourceVersion": version }, "items": items }),
            );
        }
        ("PATCH", ["api", "v1", "namespaces", _, "pods", name]) => {
            let patch: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let version = cluster.next_version();
            let Some(pod) = cluster
                .pods
                .iter_mut()
                .find(|p| p["metadata"]["name"] == *name)
            else {
                return respond(&mut stream, 404, &json!({ "kind": "Status", "code": 404 }));
            };
            for (key, value) in patch["metadata"]["annotations"].as_object().unwrap() {
                pod["metadata"]["annotations"][key] = value.clone();
            }
            pod["metadata"]["resourceVersion"] = json!(version);
            let pod = pod.clone();
            cluster.broadcast("MODIFIED", &pod);
            respond(&mut stream, 200, &pod);
        }
        ("POST", ["api", "v1", "namespaces", _, "pods", name, "binding"]) => {
            let binding: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let version = cluster.next_version();
            if let Some(pod) = cluster
                .pods
                .iter_mut()
                .find(|p| p["metadata"]["name"] == *name)
            {
                pod["spec"]["nodeName"] = binding["target"]["name"].clone();
                pod["metadata"]["resourceVersion"] = json!(version);
                let pod = pod.clone();
                cluster.broadcast("MODIFIED", &pod);
            }
            respond(
                &mut stream,
                201,
                &json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201 }),
            );
        }
        _ => respond(&mut stream, 404, &json!({ "kind": "Status", "code": 404 })),
    }
}

/// A GPU node as the API server returns it.
fn node(name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "resourceVersion": "7",
            "labels": { "kubernetes.io/hostname": name, "dilu.io/gpu-count": "1", "dilu.io/gpu-memory": "80Gi" }
        },
        "spec": {},
        "status": { "capacity": { "cpu": "64", "dilu.io/gpu-share": "10" } }
    })
}

/// A pod asking dilu for `sm_request` of a GPU, as it is before scheduling.
fn pod(name: &str, sm_request: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "serving",
            "uid": format!("uid-{name}"),
            "resourceVersion": "50",
            "creationTimestamp": "2025-03-01T10:00:00Z",
            "annotations": {
                "dilu.io/sm-request": sm_request,
                "dilu.io/memory": "10Gi",
                "dilu.io/class": "latency"
            }
        },
        "spec": {
            "schedulerName": "dilu-scheduler",
            "containers": [{
                "name": "server",
                "image": "vllm/vllm-openai:v0.6.0",
                "resources": { "limits": { "dilu.io/gpu-share": "1" }, "requests": { "dilu.io/gpu-share": "1" } }
            }]
        },
        "status": { "phase": "Pending", "qosClass": "BestEffort" }
    })
}

/// The same pod after an earlier extender bound it to GPU 0 of `node`.
fn placed_pod(name: &str, sm_request_pct: f64, node: &str) -> Value {
    let mut pod = pod(name, &(sm_request_pct / 100.0).to_string());
    let spec = json!({
        "class": "Latency", "slo_ms": null, "sm_request_pct": sm_request_pct,
        "sm_limit_pct": sm_request_pct, "mem_bytes": 10 * GIB
    });
    let annotations = &mut pod["metadata"]["annotations"];
    annotations["dilu.io/gpu-indices"] = json!("0");
    annotations["dilu.io/tenant"] = json!(format!("serving.{name}"));
    annotations["dilu.io/spec"] = json!(spec.to_string());
    annotations["dilu.io/bound-at"] = json!("1740823200000");
    pod["spec"]["nodeName"] = json!(node);
    pod["status"]["phase"] = json!("Running");
    pod
}

fn start_extender(api: &MockApiServer) -> ExtenderHandle {
    extender::start(ExtenderConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        policy: "dilu".into(),
        inventory: BTreeMap::new(),
        default_gpus: 8,
        default_gpu_memory: 80 * GIB,
        apiserver: Some(api.url()),
    })
    .expect("the extender starts against the mock API server")
}

fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> Value {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or(Value::Null)
}

fn filter(addr: SocketAddr, pod: &Value) -> Value {
    let args = json!({ "Pod": pod, "NodeNames": ["gpu-1"] });
    http(addr, "POST", "/dilu/filter", &args.to_string())
}

fn placed(addr: SocketAddr) -> Vec<String> {
    http(addr, "GET", "/allocations", "")["Pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["Pod"].as_str().unwrap().to_string())
        .collect()
}

/// Polls (generously: the machine may be loaded) until `check` holds.
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_restarted_extender_rebuilds_from_the_cluster_and_a_deleted_pod_frees_its_share() {
    // A cluster where an earlier extender placed `llm-0` (60% of GPU 0).
    let api = MockApiServer::start(
        vec![node("gpu-1")],
        vec![placed_pod("llm-0", 60.0, "gpu-1"), pod("llm-1", "0.6")],
    );
    let extender = start_extender(&api);
    let addr = extender.addr();
    assert_eq!(
        placed(addr),
        ["serving/llm-0"],
        "rebuilt from the pod's annotations"
    );

    // So the node (one GPU, from its labels) has no room for another 60%.
    let filtered = filter(addr, &api.pod("llm-1"));
    assert_eq!(filtered["NodeNames"], json!([]), "{filtered}");
    assert!(filtered["FailedNodes"]["gpu-1"].is_string());

    // llm-0 is deleted: the watch frees its share and llm-1 fits.
    eventually("the extender watches pods", || {
        api.pod_watches_opened() == 1
    });
    api.delete_pod("llm-0");
    eventually("the deletion frees llm-0", || placed(addr).is_empty());
    let filtered = filter(addr, &api.pod("llm-1"));
    assert_eq!(filtered["NodeNames"], json!(["gpu-1"]), "{filtered}");

    // Bind writes the placement on the pod, then creates the Binding.
    let binding = json!({ "PodName": "llm-1", "PodNamespace": "serving", "PodUID": "uid-llm-1", "Node": "gpu-1" });
    assert_eq!(
        http(addr, "POST", "/dilu/bind", &binding.to_string()),
        json!({ "Error": "" })
    );
    let requests: Vec<String> = api.requests().into_iter().map(|(line, _)| line).collect();
    let patch = requests
        .iter()
        .position(|r| r == "PATCH /api/v1/namespaces/serving/pods/llm-1")
        .expect("the pod is annotated");
    let bind = requests
        .iter()
        .position(|r| r == "POST /api/v1/namespaces/serving/pods/llm-1/binding")
        .expect("the Binding is created");
    assert!(
        patch < bind,
        "annotations first, so the node side finds them: {requests:?}"
    );
    let bound = api.pod("llm-1");
    let annotations = &bound["metadata"]["annotations"];
    assert_eq!(annotations["dilu.io/gpu-indices"], "0");
    assert_eq!(annotations["dilu.io/tenant"], "serving.llm-1");
    let spec: Value = serde_json::from_str(annotations["dilu.io/spec"].as_str().unwrap()).unwrap();
    assert_eq!(spec["sm_request_pct"], 60.0);
    assert_eq!(spec["mem_bytes"], 10 * GIB);
    assert_eq!(bound["spec"]["nodeName"], "gpu-1");
    extender.shutdown();

    // A new extender knows llm-1 holds the GPU without having bound it.
    let restarted = start_extender(&api);
    assert_eq!(placed(restarted.addr()), ["serving/llm-1"]);
    let filtered = filter(restarted.addr(), &pod("llm-2", "0.6"));
    assert_eq!(filtered["NodeNames"], json!([]), "{filtered}");

    // A pod that finishes frees its share too.
    eventually("the new extender watches pods", || {
        api.pod_watches_opened() == 2
    });
    {
        let mut cluster = api.cluster.lock().unwrap();
        let version = cluster.next_version();
        let pod = cluster
            .pods
            .iter_mut()
            .find(|p| p["metadata"]["name"] == "llm-1")
            .unwrap();
        pod["status"]["phase"] = json!("Succeeded");
        pod["metadata"]["resourceVersion"] = json!(version);
        let pod = pod.clone();
        cluster.broadcast("MODIFIED", &pod);
    }
    eventually("the finished pod frees its share", || {
        placed(restarted.addr()).is_empty()
    });
    restarted.shutdown();
}
