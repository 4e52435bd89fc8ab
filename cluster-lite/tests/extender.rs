//! Kubernetes scheduler extender over real HTTP with JSON shaped like
//! kube-scheduler's (k8s.io/kube-scheduler/extender/v1).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use dilu_cluster::extender::{self, ExtenderConfig, ExtenderHandle, NodeInventory};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

fn start(apiserver: Option<String>) -> ExtenderHandle {
    let mut inventory = BTreeMap::new();
    inventory.insert(
        "gpu-node-b".to_string(),
        NodeInventory {
            gpus: 2,
            gpu_memory: "80GiB".into(),
        },
    );
    extender::start(ExtenderConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        policy: "dilu".into(),
        inventory,
        default_gpus: 1,
        default_gpu_memory: 80 * GIB,
        apiserver,
    })
    .expect("extender listens on loopback")
}

/// Minimal HTTP/1.1 client: returns (status, parsed JSON body).
fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A pod as kube-scheduler sends it (trimmed of nothing the extender needs).
fn pod(name: &str, uid: &str, sm_request: &str, memory: &str) -> Value {
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "serving",
            "uid": uid,
            "resourceVersion": "4711",
            "creationTimestamp": "2025-03-01T10:00:00Z",
            "labels": { "app": name },
            "annotations": {
                "dilu.io/sm-request": sm_request,
                "dilu.io/sm-limit": sm_request,
                "dilu.io/memory": memory,
                "dilu.io/class": "latency"
            }
        },
        "spec": {
            "schedulerName": "dilu-scheduler",
            "containers": [{
                "name": "server",
                "image": "vllm/vllm-openai:v0.6.0",
                "resources": { "requests": { "cpu": "4", "memory": "16Gi" }, "limits": { "memory": "16Gi" } }
            }]
        },
        "status": { "phase": "Pending", "qosClass": "Burstable" }
    })
}

fn node(name: &str, gpu_count: &str) -> Value {
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "labels": { "kubernetes.io/hostname": name, "dilu.io/gpu-count": gpu_count, "dilu.io/gpu-memory": "80Gi" }
        },
        "spec": {},
        "status": { "capacity": { "cpu": "64", "nvidia.com/gpu": gpu_count } }
    })
}

#[test]
fn filter_prioritize_bind_round_trip_with_node_names() {
    let server = start(None);
    let addr = server.addr();
    let args = |pod: Value| {
        json!({ "Pod": pod, "Nodes": null, "NodeNames": ["gpu-node-a", "gpu-node-b"] }).to_string()
    };
    let first = pod("llm-0", "uid-1", "0.6", "30Gi");
    let (status, filtered) = post(addr, "/dilu/filter", &args(first.clone()));
    assert_eq!(status, 200, "{filtered}");
    assert_eq!(filtered["NodeNames"], json!(["gpu-node-a", "gpu-node-b"]));
    assert_eq!(filtered["FailedNodes"], json!({}));
    assert_eq!(filtered["Error"], json!(""));

    let (status, priorities) = post(addr, "/dilu/prioritize", &args(first));
    assert_eq!(status, 200);
    let list = priorities.as_array().expect("HostPriorityList is an array");
    assert_eq!(list.len(), 2);
    for entry in list {
        let score = entry["Score"].as_i64().unwrap();
        assert!((0..=10).contains(&score), "{entry}");
        assert!(entry["Host"].is_string());
    }

    let binding = json!({ "PodName": "llm-0", "PodNamespace": "serving", "PodUID": "uid-1", "Node": "gpu-node-a" });
    let (status, bound) = post(addr, "/dilu/bind", &binding.to_string());
    assert_eq!((status, bound), (200, json!({ "Error": "" })));

    // gpu-node-a has one GPU (the default); 0.6 + 0.6 SM does not fit there.
    let second = pod("llm-1", "uid-2", "0.6", "30Gi");
    let (_, filtered) = post(addr, "/dilu/filter", &args(second.clone()));
    assert_eq!(filtered["NodeNames"], json!(["gpu-node-b"]));
    let reason = filtered["FailedNodes"]["gpu-node-a"]
        .as_str()
        .expect("node a failed");
    assert!(reason.contains("no 1 GPU(s) with room"), "{reason}");

    // A small pod prefers the busy node a (complementary packing).
    let small = pod("infer-0", "uid-3", "0.2", "4Gi");
    let (_, priorities) = post(addr, "/dilu/prioritize", &args(small));
    let score = |host: &str| {
        priorities
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["Host"] == host)
            .unwrap()["Score"]
            .as_i64()
            .unwrap()
    };
    assert!(score("gpu-node-a") > score("gpu-node-b"), "{priorities}");

    let (status, released) = post(addr, "/dilu/release", r#"{"PodUID":"uid-1"}"#);
    assert_eq!((status, released), (200, json!({ "Error": "" })));
    let (_, filtered) = post(addr, "/dilu/filter", &args(second));
    assert_eq!(filtered["NodeNames"], json!(["gpu-node-a", "gpu-node-b"]));
    server.shutdown();
}

#[test]
fn filter_with_full_node_objects_reads_gpu_labels_and_echoes_nodes() {
    let server = start(None);
    let args = json!({
        "Pod": pod("llm-0", "uid-9", "0.5", "20Gi"),
        "Nodes": { "metadata": { "resourceVersion": "1" }, "items": [node("cpu-only", "0"), node("gpu-1", "8")] },
        "NodeNames": null
    });
    let (status, filtered) = post(server.addr(), "/filter", &args.to_string());
    assert_eq!(status, 200, "{filtered}");
    let items = filtered["Nodes"]["items"].as_array().expect("Nodes echoed");
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0],
        node("gpu-1", "8"),
        "node objects come back unchanged"
    );
    assert!(
        filtered["FailedNodes"]["cpu-only"]
            .as_str()
            .unwrap()
            .contains("no dilu GPUs")
    );
    server.shutdown();
}

#[test]
fn malformed_requests_get_400_with_error_and_the_server_keeps_serving() {
    let server = start(None);
    let addr = server.addr();
    for (path, body) in [
        ("/dilu/filter", "{not json"),
        ("/dilu/prioritize", "[1, 2"),
        ("/dilu/bind", "\"just a string\""),
        ("/dilu/filter", r#"{"NodeNames": ["a"]}"#),
        (
            "/dilu/filter",
            &json!({ "Pod": pod("p", "u", "7", "1Gi"), "NodeNames": ["a"] }).to_string(),
        ),
        ("/dilu/release", "{}"),
    ] {
        let (status, answer) = post(addr, path, body);
        assert_eq!(status, 400, "{path} {body} -> {answer}");
        assert!(
            answer["Error"].as_str().is_some_and(|e| !e.is_empty()),
            "{answer}"
        );
    }
    let (status, _) = post(addr, "/dilu/unknown-verb", "{}");
    assert_eq!(status, 404);
    let binding =
        json!({ "PodName": "never-filtered", "PodNamespace": "x", "PodUID": "u-0", "Node": "a" });
    let (status, answer) = post(addr, "/dilu/bind", &binding.to_string());
    assert_eq!(status, 200);
    assert!(
        answer["Error"].as_str().unwrap().contains("not filtered"),
        "{answer}"
    );
    let (status, answer) = post(
        addr,
        "/dilu/filter",
        &json!({ "Pod": pod("ok", "u1", "0.1", "1Gi"), "NodeNames": ["a"] }).to_string(),
    );
    assert_eq!((status, &answer["NodeNames"]), (200, &json!(["a"])));
    server.shutdown();
}
