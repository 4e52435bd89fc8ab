//! The DRA plugin through the kubelet's own protocols, from an allocated
//! ResourceClaim to an enforced budget: a test kubelet (clients generated
//! from the official `.proto` files) finds the real `dilu-dra-plugin`
//! binary's registration socket, asks `GetInfo`, and calls
//! `NodePrepareResources` for a claim the mock API server returns as the
//! scheduler allocated it; the plugin publishes its ResourceSlice to that
//! server, grants the claim to a node manager and writes a CDI spec, which
//! is checked against the CDI schema and applied as a runtime applies it to
//! start `mem-probe` on simgpu. The plugin is restarted between Prepare and
//! Unprepare.

use dilu_deviceplugin::kubelet::connect_unix;
use dilu_dra::api::dra::dra_plugin_client::DraPluginClient;
use dilu_dra::api::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use dilu_dra::api::registration::registration_client::RegistrationClient;
use dilu_dra::api::registration::{InfoRequest, RegistrationStatus};
use dilu_dra::kubelet::registration_socket;
use dilu_harness::node_manager;
use dilu_harness::workspace::{Scratch, artifact, dilu, simgpu_uuid, unique_name};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const NODE: &str = "gpu-node-1";
const CLAIM_UID: &str = "7c1d4a52-0d3e-4f57-8a4b-2f6b9d0e1c3a";

/// The claim as the API server returns it once the scheduler allocated
/// 64 MiB and 30% of GPU 1 to it, with a co-location role and an SLO in
/// its opaque configuration.
fn allocated_claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "infer-gpu", "namespace": "serving", "uid": CLAIM_UID,
                     "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.dilu.io",
            "capacity": {"requests": {"memory": "64Mi", "sm": "30"}}}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.dilu.io", "pool": NODE,
                         "device": "gpu-1", "shareID": "a1b2c3",
                         "consumedCapacity": {"memory": "64Mi", "sm": "30"}}],
            "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
                "driver": "gpu.dilu.io",
                "parameters": {"apiVersion": "gpu.dilu.io/v1alpha1", "kind": "TenantConfig",
                               "colocation": "primary", "sloMs": 50, "smLimit": 60}}}]}}},
    })
}

/// A mock API server: serves the claim, takes the ResourceSlice, records
/// every request line and the slice it was given.
struct MockApiServer {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    slice: Arc<Mutex<Option<Value>>>,
}

fn start_api_server() -> MockApiServer {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind the mock API server");
    let url = format!("http://{}", server.server_addr().to_ip().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let slice = Arc::new(Mutex::new(None::<Value>));
    let (seen, stored) = (requests.clone(), slice.clone());
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let line = format!("{} {}", request.method(), request.url());
            seen.lock().unwrap().push(line.clone());
            let mut body = String::new();
            let _ = request.as_reader().read_to_string(&mut body);
            let path = line.split('?').next().unwrap().to_string();
            let slice_path = format!("/apis/resource.k8s.io/v1/resourceslices/{NODE}-gpu.dilu.io");
            let (code, answer) = if path
                == "GET /apis/resource.k8s.io/v1/namespaces/serving/resourceclaims/infer-gpu"
            {
                (200, allocated_claim())
            } else if path == format!("GET {slice_path}") {
                match stored.lock().unwrap().clone() {
                    Some(slice) => (200, slice),
                    None => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                         "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                }
            } else if path == "POST /apis/resource.k8s.io/v1/resourceslices" {
                let mut slice: Value = serde_json::from_str(&body).unwrap();
                slice["metadata"]["resourceVersion"] = json!("1");
                *stored.lock().unwrap() = Some(slice.clone());
                (201, slice)
            } else {
                (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "reason": "NotFound", "code": 404, "message": path}),
                )
            };
            let header = tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
            let _ = request.respond(
                tiny_http::Response::from_string(answer.to_string())
                    .with_status_code(code)
                    .with_header(header),
            );
        }
    });
    MockApiServer {
        url,
        requests,
        slice,
    }
}

struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn tenant_status(scratch: &Scratch, name: &str) -> Option<Value> {
    node_manager::status(&scratch.path("nodemgr.sock"))?["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
}

struct Dirs {
    registry: PathBuf,
    plugin: PathBuf,
    cdi: PathBuf,
}

fn start_plugin(
    scratch: &Scratch,
    dirs: &Dirs,
    api: &MockApiServer,
    instance: &str,
) -> KilledOnDrop {
    let plugin = Command::new(env!("CARGO_BIN_EXE_dilu-dra-plugin"))
        .args(["--node", NODE, "--apiserver", &api.url])
        .arg("--registry-dir")
        .arg(&dirs.registry)
        .arg("--plugin-dir")
        .arg(&dirs.plugin)
        .arg("--cdi-dir")
        .arg(&dirs.cdi)
        .arg("--nvml-library")
        .arg(artifact("libsimgpu_nvml.so"))
        .arg("--interposer")
        .arg(artifact("libdilu_interposer.so"))
        .arg("--socket-dir")
        .arg(&scratch.0)
        .arg("--dev-dir")
        .arg(scratch.path("dev"))
        .env("SIMGPU_DEVICES", "2")
        .env("SIMGPU_INSTANCE", instance)
        .spawn()
        .expect("start dilu-dra-plugin");
    KilledOnDrop(plugin)
}

/// What the test kubelet does when the plugin's registration socket
/// appears: asks who it is, says it is registered, connects to its endpoint.
async fn register(dirs: &Dirs) -> DraPluginClient<tonic::transport::Channel> {
    let socket = registration_socket(&dirs.registry);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the registration socket appears within 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut registration = RegistrationClient::new(connect_unix(&socket).await.unwrap());
    let info = registration
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.dilu.io");
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .expect("NotifyRegistrationStatus");
    DraPluginClient::new(connect_unix(Path::new(&info.endpoint)).await.unwrap())
}

fn claim() -> Claim {
    Claim {
        namespace: "serving".into(),
        uid: CLAIM_UID.into(),
        name: "infer-gpu".into(),
    }
}

/// What a container runtime does with a CDI spec's container edits, for a
/// process on this host: container paths in the environment become the
/// host paths mounted there.
fn applied_environment(spec: &Value) -> Vec<(String, String)> {
    let edits = &spec["devices"][0]["containerEdits"];
    let mounts: Vec<(String, String)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["containerPath"].as_str().unwrap().to_string(),
                m["hostPath"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let (key, value) = entry.as_str().unwrap().split_once('=').unwrap();
            let mut value = value.to_string();
            for (container, host) in &mounts {
                if let Some(rest) = value.strip_prefix(container.as_str()) {
                    value = format!("{host}{rest}");
                }
            }
            (key.to_string(), value)
        })
        .collect()
}

/// `mem-probe` in the container the spec describes; `spec_override`
/// replaces its DILU_SPEC as a program that asks for more would.
fn start_probe(
    scratch: &Scratch,
    env: &[(String, String)],
    instance: &str,
    spec_override: &str,
) -> KilledOnDrop {
    let driver = scratch.path("driver");
    if !driver.exists() {
        std::fs::create_dir_all(&driver).unwrap();
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(artifact("libsimgpu.so"), driver.join(name)).unwrap();
        }
    }
    let probe = Command::new(artifact("mem-probe"))
        .envs(env.iter().cloned())
        .env("DILU_SPEC", spec_override)
        .env("LD_LIBRARY_PATH", &driver)
        .env("SIMGPU_DEVICES", "2")
        .env("SIMGPU_INSTANCE", instance)
        .env("DILU_CONTEXT_MEMORY", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start mem-probe");
    KilledOnDrop(probe)
}

fn ask(probe: &mut KilledOnDrop, command: &str) -> String {
    let stdin = probe.0.stdin.as_mut().unwrap();
    writeln!(stdin, "{command}").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    let stdout = probe.0.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(stdout);
    assert!(reader.read_line(&mut line).unwrap() > 0, "mem-probe exited");
    line.trim_end().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocated_claim_becomes_an_enforced_tenant_and_a_restart_loses_nothing() {
    let scratch = Scratch::new("dra");
    let instance = unique_name("dra");
    let dirs = Dirs {
        registry: scratch.path("plugins_registry"),
        plugin: scratch.path("plugins/gpu.dilu.io"),
        cdi: scratch.path("cdi"),
    };
    std::fs::create_dir_all(scratch.path("dev")).unwrap();
    let api = start_api_server();
    let _daemon = KilledOnDrop(node_manager::start(&scratch, "static"));
    let mut plugin_process = start_plugin(&scratch, &dirs, &api, &instance);
    let mut plugin = register(&dirs).await;

    // The node's slice: one shareable device per simgpu GPU.
    let slice = api.slice.clone();
    wait_for(
        "the ResourceSlice is published",
        Duration::from_secs(60),
        || slice.lock().unwrap().is_some(),
    );
    let slice = api.slice.lock().unwrap().clone().unwrap();
    assert_eq!(slice["spec"]["driver"], "gpu.dilu.io");
    assert_eq!(slice["spec"]["nodeName"], NODE);
    let devices = slice["spec"]["devices"].as_array().unwrap();
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    assert_eq!(
        devices[1]["attributes"]["uuid"]["string"],
        simgpu_uuid(&instance, 1)
    );
    assert!(
        devices
            .iter()
            .all(|d| d["allowMultipleAllocations"] == true)
    );

    let prepared = plugin
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim()],
        })
        .await
        .expect("NodePrepareResources")
        .into_inner();
    let answer = &prepared.claims[CLAIM_UID];
    println!("NodePrepareResources: {answer:?}");
    assert_eq!(answer.error, "");
    assert_eq!(answer.devices.len(), 1);
    let device = &answer.devices[0];
    assert_eq!(
        (device.pool_name.as_str(), device.device_name.as_str()),
        (NODE, "gpu-1")
    );
    assert_eq!(device.request_names, ["gpu"]);
    assert_eq!(device.share_id.as_deref(), Some("a1b2c3"));
    assert_eq!(
        device.cdi_device_ids,
        [format!("gpu.dilu.io/claim={CLAIM_UID}")]
    );

    // The CDI spec: valid by the CDI schema, naming the claim's GPU.
    let spec_path = dirs.cdi.join(format!("gpu.dilu.io-{CLAIM_UID}.json"));
    let validated = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/cdi-validate.sh"
        ))
        .arg(&spec_path)
        .output()
        .unwrap();
    assert!(
        validated.status.success(),
        "CDI schema: {}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
    println!("{}", String::from_utf8_lossy(&validated.stdout).trim());
    let spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    println!("CDI spec: {spec}");
    let env = applied_environment(&spec);
    let var = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    assert_eq!(var("CUDA_VISIBLE_DEVICES"), Some(simgpu_uuid(&instance, 1)));
    assert_eq!(var("DILU_TENANT").as_deref(), Some("serving.infer-gpu"));
    assert_eq!(var("DILU_COLO").as_deref(), Some("primary"));

    // The container's program asks for 1 GiB in its own DILU_SPEC: the
    // claim's 64 MiB holds (the node manager's grant wins).
    let mut probe = start_probe(&scratch, &env, &instance, &format!("mem={}", 1024 * MIB));
    let first = ask(&mut probe, &format!("alloc {}", 48 * MIB));
    let second = ask(&mut probe, &format!("alloc {}", 32 * MIB));
    println!(
        "mem-probe asking DILU_SPEC mem=1GiB: alloc 48 MiB -> {first:?}, then 32 MiB -> {second:?}"
    );
    assert_eq!(first, "alloc 0");
    assert_eq!(
        second,
        format!("alloc {}", dilu_abi::cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "48 + 32 MiB is over the claim's 64 MiB"
    );
    let tenant = tenant_status(&scratch, "serving.infer-gpu").expect("the claim's tenant runs");
    println!(
        "dilu status: tenant {} on gpu {} spec {} budget {} bytes",
        tenant["name"], tenant["gpu"], tenant["spec"], tenant["mem_budget_bytes"]
    );
    assert_eq!(tenant["mem_budget_bytes"], 64 * MIB);
    assert_eq!(tenant["gpu"], 1, "on the GPU the scheduler allocated");
    assert_eq!(
        tenant["granted"], true,
        "dilu status says its spec is the claim's"
    );
    let table = Command::new(dilu())
        .args(["status", "--socket"])
        .arg(scratch.path("nodemgr.sock"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("granted by the cluster (DRA claims; change the claim, not `dilu set`): serving.infer-gpu"),
        "{table}"
    );
    let set = Command::new(dilu())
        .args(["set", "serving.infer-gpu", "--mem", "1GiB", "--socket"])
        .arg(scratch.path("nodemgr.sock"))
        .output()
        .unwrap();
    assert!(!set.status.success(), "dilu set refuses a granted tenant");
    assert!(
        String::from_utf8_lossy(&set.stderr).contains("change its claim"),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert_eq!(tenant["spec"]["sm_request_pct"], 30.0);
    assert_eq!(tenant["spec"]["slo_ms"], 50.0);

    // A restart between Prepare and Unprepare loses nothing: the same
    // answer again without asking the API server, then a clean unprepare.
    let claim_reads = || {
        api.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.contains("/resourceclaims/"))
            .count()
    };
    assert_eq!(claim_reads(), 1);
    let _ = plugin_process.0.kill();
    let _ = plugin_process.0.wait();
    let _ = std::fs::remove_file(registration_socket(&dirs.registry));
    plugin_process = start_plugin(&scratch, &dirs, &api, &instance);
    let mut plugin = register(&dirs).await;
    let again = plugin
        .node_prepare_resources(NodePrepareResourcesRequest {
            claims: vec![claim()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.claims[CLAIM_UID], *answer,
        "same devices after the restart"
    );
    assert_eq!(claim_reads(), 1, "answered from the checkpoint");
    let unprepared = plugin
        .node_unprepare_resources(NodeUnprepareResourcesRequest {
            claims: vec![claim()],
        })
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    assert_eq!(unprepared.claims[CLAIM_UID].error, "");
    assert!(!spec_path.exists(), "the CDI spec is removed");
    let checkpoint: Value =
        serde_json::from_slice(&std::fs::read(dirs.plugin.join("checkpoint.json")).unwrap())
            .unwrap();
    assert_eq!(checkpoint["claims"], json!({}));

    // The grant is gone: once the tenant's process left, the same name
    // runs with what it asks again.
    drop(probe);
    wait_for("the tenant leaves", Duration::from_secs(60), || {
        tenant_status(&scratch, "serving.infer-gpu").is_none()
    });
    let mut free = start_probe(&scratch, &env, &instance, &format!("mem={}", 1024 * MIB));
    let after = ask(&mut free, &format!("alloc {}", 80 * MIB));
    println!("after NodeUnprepareResources, the same program: alloc 80 MiB -> {after:?}");
    assert_eq!(after, "alloc 0");
    drop(plugin_process);
}
