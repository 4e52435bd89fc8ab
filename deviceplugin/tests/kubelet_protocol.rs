//! The device plugin through the kubelet's own protocol, from the
//! scheduler's decision to an enforced budget: a test kubelet (the
//! Registration server and DevicePlugin client generated from the official
//! `api.proto`) registers the real `dilu-device-plugin` binary, which reads
//! GPU UUIDs from simgpu's NVML and the pods bound to its node from a mock
//! API server serving Kubernetes Pod JSON. The container environment and
//! mounts `Allocate` returns then start `mem-probe` on simgpu under a node
//! manager, which holds it to the memory the extender wrote on the pod.

use dilu_abi::node_wire::SmShare;
use dilu_abi::pod_assignment::{self, PodAssignment};
use dilu_deviceplugin::api::device_plugin_client::DevicePluginClient;
use dilu_deviceplugin::api::registration_server::{Registration, RegistrationServer};
use dilu_deviceplugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, Empty, PreferredAllocationRequest, RegisterRequest,
};
use dilu_deviceplugin::kubelet::{KUBELET_SOCKET, PLUGIN_SOCKET, connect_unix};
use dilu_harness::workspace::{Scratch, artifact, unique_name};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;

const MIB: u64 = 1 << 20;
const SHARES: u32 = 4;

/// The kubelet's side of registration: hands each request to the test.
struct TestKubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for TestKubelet {
    async fn register(
        &self,
        request: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(Empty {}))
    }
}

/// A pod as the API server returns it once the extender has bound it.
fn bound_pod(name: &str, annotations: serde_json::Value, shares: u32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": format!("uid-{name}"),
            "resourceVersion": "1",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": "gpu-node-1",
            "schedulerName": "dilu-scheduler",
            "containers": [{
                "name": "main",
                "image": "python:3.12",
                "resources": {
                    "limits": {pod_assignment::RESOURCE: shares.to_string()},
                    "requests": {pod_assignment::RESOURCE: shares.to_string()},
                },
            }],
        },
        "status": {"phase": "Pending"},
    })
}

/// A mock API server: lists the node's pods, applies annotation patches,
/// and records every request line.
struct MockApiServer {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

fn start_api_server(pods: Vec<serde_json::Value>) -> MockApiServer {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind the mock API server");
    let url = format!("http://{}", server.server_addr().to_ip().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    std::thread::spawn(move || {
        let mut pods = pods;
        for mut request in server.incoming_requests() {
            let line = format!("{} {}", request.method(), request.url());
            seen.lock().unwrap().push(line.clone());
            let mut body = String::new();
            let _ = request.as_reader().read_to_string(&mut body);
            let answer = if line.starts_with("GET /api/v1/pods") {
                serde_json::json!({
                    "apiVersion": "v1", "kind": "PodList",
                    "metadata": {"resourceVersion": "2"}, "items": pods,
                })
            } else if line.starts_with("PATCH /api/v1/namespaces/default/pods/") {
                let name = line.rsplit('/').next().unwrap().split('?').next().unwrap();
                let patch: serde_json::Value = serde_json::from_str(&body).unwrap();
                let pod = pods
                    .iter_mut()
                    .find(|p| p["metadata"]["name"] == name)
                    .expect("patch of a known pod");
                for (key, value) in patch["metadata"]["annotations"].as_object().unwrap() {
                    pod["metadata"]["annotations"][key] = value.clone();
                }
                pod.clone()
            } else {
                let _ = request.respond(tiny_http::Response::empty(404));
                continue;
            };
            let header = tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
            let _ = request
                .respond(tiny_http::Response::from_string(answer.to_string()).with_header(header));
        }
    });
    MockApiServer { url, requests }
}

/// What a container runtime does with an Allocate answer, for a process on
/// this host: container paths in the environment become the host paths
/// mounted there.
fn host_environment(answer: &ContainerAllocateResponse) -> Vec<(String, String)> {
    answer
        .envs
        .iter()
        .map(|(key, value)| {
            let mut value = value.clone();
            for mount in &answer.mounts {
                if let Some(rest) = value.strip_prefix(&mount.container_path) {
                    value = format!("{}{rest}", mount.host_path);
                }
            }
            (key.clone(), value)
        })
        .collect()
}

struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_pods_annotations_become_its_containers_environment_and_budget() {
    let scratch = Scratch::new("deviceplugin");
    let instance = unique_name("deviceplugin");
    let kubelet_dir = scratch.path("device-plugins");
    std::fs::create_dir_all(&kubelet_dir).unwrap();

    // What the extender wrote when it bound the pod: GPU 1, 64 MiB.
    let assignment = PodAssignment {
        gpu_indices: vec![1],
        tenant: pod_assignment::tenant_name("default", "infer-0"),
        spec: dilu_abi::node_wire::TenantSpec {
            class: dilu_abi::node_wire::WorkClass::Latency,
            slo_ms: Some(50.0),
            sm_request: SmShare::percent(30.0),
            sm_limit: SmShare::percent(45.0),
            mem: Some(dilu_abi::units::Bytes::new(64 * MIB)),
        },
        bound_at_ms: 1_735_689_600_000,
    };
    let annotations = serde_json::to_value(assignment.to_annotations()).unwrap();
    let api = start_api_server(vec![
        bound_pod("infer-0", annotations, 1),
        // Asks for a share but was not placed by dilu: left untouched.
        bound_pod("plain", serde_json::json!({}), 1),
    ]);

    // The test kubelet listens for registrations.
    let (registered, mut registrations) = mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(kubelet_dir.join(KUBELET_SOCKET)).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(TestKubelet(registered)))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );

    let interposer = artifact("libdilu_interposer.so");
    let _plugin = KilledOnDrop(
        Command::new(env!("CARGO_BIN_EXE_dilu-device-plugin"))
            .args(["--node", "gpu-node-1", "--apiserver", &api.url])
            .arg("--kubelet-dir")
            .arg(&kubelet_dir)
            .args(["--shares-per-gpu", &SHARES.to_string()])
            .arg("--nvml-library")
            .arg(artifact("libsimgpu_nvml.so"))
            .arg("--interposer")
            .arg(&interposer)
            .arg("--socket-dir")
            .arg(&scratch.0)
            .env("SIMGPU_DEVICES", "2")
            .env("SIMGPU_INSTANCE", &instance)
            .spawn()
            .expect("start dilu-device-plugin"),
    );

    let request = tokio::time::timeout(Duration::from_secs(120), registrations.recv())
        .await
        .expect("the plugin registers within 2 minutes")
        .unwrap();
    assert_eq!(request.version, "v1beta1");
    assert_eq!(request.endpoint, PLUGIN_SOCKET);
    assert_eq!(request.resource_name, pod_assignment::RESOURCE);
    assert!(
        request
            .options
            .is_some_and(|o| o.get_preferred_allocation_available)
    );

    let mut plugin = DevicePluginClient::new(
        connect_unix(&kubelet_dir.join(&request.endpoint))
            .await
            .unwrap(),
    );
    let mut devices = plugin
        .list_and_watch(Empty {})
        .await
        .expect("ListAndWatch")
        .into_inner();
    let listed = devices.next().await.unwrap().unwrap().devices;
    let ids: Vec<String> = listed.iter().map(|d| d.id.clone()).collect();
    assert_eq!(
        ids.len(),
        2 * SHARES as usize,
        "two GPUs of {SHARES} shares"
    );
    assert!(listed.iter().all(|d| d.health == "Healthy"));
    let uuids: std::collections::BTreeSet<&str> = ids
        .iter()
        .map(|id| dilu_deviceplugin::devices::gpu_uuid_of(id))
        .collect();
    assert_eq!(
        uuids.len(),
        2,
        "device IDs carry the two NVML UUIDs: {ids:?}"
    );
    assert!(uuids.iter().all(|u| u.starts_with("GPU-")), "{uuids:?}");
    let gpu1_uuid = ids[SHARES as usize].split("::").next().unwrap().to_string();

    // The kubelet asks which share to take: one on the GPU the extender chose.
    let preferred = plugin
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .expect("GetPreferredAllocation")
        .into_inner();
    let picked = &preferred.container_responses[0].device_i_ds;
    assert_eq!(picked.len(), 1);
    assert!(
        picked[0].starts_with(&gpu1_uuid),
        "prefers GPU 1 ({gpu1_uuid}): {picked:?}"
    );

    let answer = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: picked.clone(),
            }],
        })
        .await
        .expect("Allocate")
        .into_inner();
    let container = &answer.container_responses[0];
    let env = &container.envs;
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "1");
    assert_eq!(env["DILU_TENANT"], "default.infer-0");
    assert_eq!(
        env["DILU_SPEC"],
        format!(
            "class=latency,slo_ms=50,sm_request=30,sm_limit=45,mem={}",
            64 * MIB
        )
    );
    let preload = &env["LD_PRELOAD"];
    let interposer_mount = container
        .mounts
        .iter()
        .find(|m| &m.container_path == preload)
        .expect("the preloaded interposer is mounted");
    assert_eq!(Path::new(&interposer_mount.host_path), interposer);
    assert!(interposer_mount.read_only);
    let socket = &env[dilu_abi::node_wire::SOCKET_ENV];
    assert!(
        container
            .mounts
            .iter()
            .any(|m| socket.starts_with(&m.container_path) && Path::new(&m.host_path) == scratch.0),
        "the node manager's socket directory is mounted: {socket}"
    );
    assert!(
        api.requests
            .lock()
            .unwrap()
            .iter()
            .any(|r| r.starts_with("PATCH /api/v1/namespaces/default/pods/infer-0")),
        "the pod is marked set up"
    );

    // The next container asking for a share belongs to a pod dilu did not
    // place (the placed one is set up): it gets nothing.
    let untouched = plugin
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![ids[0].clone()],
            }],
        })
        .await
        .expect("Allocate")
        .into_inner();
    assert_eq!(
        untouched.container_responses[0],
        ContainerAllocateResponse::default()
    );

    // The container's command, with that environment, on simgpu.
    let _daemon = KilledOnDrop(dilu_harness::node_manager::start(&scratch, "static"));
    // The node's "driver": simgpu under the driver's names.
    let simgpu_dir = scratch.path("driver");
    std::fs::create_dir_all(&simgpu_dir).unwrap();
    for name in ["libcuda.so.1", "libcuda.so"] {
        std::os::unix::fs::symlink(artifact("libsimgpu.so"), simgpu_dir.join(name)).unwrap();
    }
    let mut probe = KilledOnDrop(
        Command::new(artifact("mem-probe"))
            .envs(host_environment(container))
            .env("LD_LIBRARY_PATH", &simgpu_dir)
            .env("SIMGPU_DEVICES", "2")
            .env("SIMGPU_INSTANCE", &instance)
            .env("DILU_CONTEXT_MEMORY", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mem-probe"),
    );
    let mut stdin = probe.0.stdin.take().unwrap();
    let mut stdout = BufReader::new(probe.0.stdout.take().unwrap());
    let mut ask = |command: &str| {
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "mem-probe exited");
        line.trim_end().to_string()
    };
    assert_eq!(ask(&format!("alloc {}", 48 * MIB)), "alloc 0");
    assert_eq!(
        ask(&format!("alloc {}", 32 * MIB)),
        format!("alloc {}", dilu_abi::cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "48 + 32 MiB is over the 64 MiB the extender wrote on the pod"
    );
    let status = dilu_harness::node_manager::status(&scratch.path("nodemgr.sock")).unwrap();
    let tenant = status["tenants"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == "default.infer-0"))
        .unwrap_or_else(|| panic!("the pod's tenant is registered: {status}"));
    assert_eq!(tenant["mem_budget_bytes"], 64 * MIB);
}
