//! The autoscaler against a mock Kubernetes API server (Deployments, their
//! pods, the node managers' pods, the `scale` subresource) and a mock node
//! manager whose `/api/status` follows the pods the Deployments have: an
//! annotated Deployment whose instances are saturated at their limit and
//! over their SLO is scaled up to its maximum, a quiet one is scaled down
//! after quiet windows down to its minimum, an unannotated
//! one is never touched, and failing API calls or a broken node manager
//! cost periods, not the controller.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Request, read_request, respond};
use dilu_cluster::autoscaler::{self, AutoscalerConfig, AutoscalerHandle};
use dilu_cluster::scaling::scalers::IN_PERIODS;
use serde_json::{Value, json};

const NAMESPACE: &str = "prod";
const NODE: &str = "gpu-a";
/// The instances' SM limit (percent).
const LIMIT_PCT: f64 = 50.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Load {
    /// Every instance uses its whole limit and is advised out.
    Saturated,
    /// No instance launches anything.
    Quiet,
    /// The node manager answers with something that is not its status.
    Broken,
}

struct Cluster {
    /// (name, annotations, replicas)
    deployments: Vec<(String, Value, usize)>,
    load: Load,
    /// API calls still to fail with a 500.
    failures_left: usize,
    /// Status reads the node manager answered (one per period here).
    status_reads: usize,
    /// Every scale patch: (deployment, replicas, status reads so far).
    patches: Vec<(String, usize, usize)>,
    nodemgr_port: u16,
}

impl Cluster {
    fn deployment_json(&self, (name, annotations, replicas): &(String, Value, usize)) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": { "name": name, "namespace": NAMESPACE, "annotations": annotations },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "app": name } },
                "template": { "metadata": { "labels": { "app": name } },
                              "spec": { "containers": [{ "name": "server", "image": "server:1" }] } }
            }
        })
    }

    /// The pods a Deployment has at its replicas, on the one GPU node.
    fn pods_of(&self, app: &str) -> Vec<Value> {
        let replicas = self
            .deployments
            .iter()
            .find(|(name, _, _)| name == app)
            .map_or(0, |d| d.2);
        (0..replicas)
            .map(|i| {
                let name = format!("{app}-{i}");
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "app": app },
                                  "annotations": { "dilu.io/tenant": format!("{NAMESPACE}.{name}") } },
                    "spec": { "nodeName": NODE, "containers": [{ "name": "server", "image": "server:1" }] },
                    "status": { "phase": "Running" }
                })
            })
            .collect()
    }

    fn nodemgr_pod(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "dilu-node-x", "namespace": "dilu-system",
                          "labels": { "app.kubernetes.io/name": "dilu", "app.kubernetes.io/component": "node" } },
            "spec": { "nodeName": NODE, "containers": [{ "name": "nodemgr", "image": "dilu:1",
                      "ports": [{ "name": "metrics", "containerPort": self.nodemgr_port }] }] },
            "status": { "phase": "Running", "podIP": "127.0.0.1" }
        })
    }

    /// The node manager's status for the Deployments' current pods (with
    /// fields the autoscaler does not read, such as a signal's GPU).
    fn nodemgr_status(&self) -> Value {
        let mut tenants = Vec::new();
        let mut signals = Vec::new();
        for (name, _, _) in &self.deployments {
            for pod in self.pods_of(name) {
                let tenant = pod["metadata"]["annotations"]["dilu.io/tenant"].clone();
                let achieved = if self.load == Load::Saturated {
                    LIMIT_PCT
                } else {
                    0.0
                };
                tenants.push(json!({
                    "name": tenant, "uid": 1000, "gpu": 0, "waiting": false,
                    "spec": { "class": "Latency", "slo_ms": 20.0, "sm_request_pct": 20.0, "sm_limit_pct": LIMIT_PCT, "mem_bytes": null },
                    "sm_current_pct": achieved, "sm_achieved_pct": achieved
                }));
                if self.load == Load::Saturated {
                    signals.push(json!({ "tenant": tenant, "gpu": 0, "advice": "ScaleOut",
                                         "for_seconds": 2.0, "reason": "at its SM limit and over its SLO" }));
                }
            }
        }
        json!({ "controller": "dilu", "period_ms": 5.0, "gpus": [], "tenants": tenants, "signals": signals })
    }
}

struct Mocks {
    apiserver: SocketAddr,
    cluster: Arc<Mutex<Cluster>>,
}

fn serve(
    listener: TcpListener,
    cluster: Arc<Mutex<Cluster>>,
    handle: fn(TcpStream, &Mutex<Cluster>),
) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let cluster = cluster.clone();
            std::thread::spawn(move || handle(stream, &cluster));
        }
    });
}

impl Mocks {
    fn start(deployments: Vec<(String, Value, usize)>, load: Load) -> Mocks {
        let apiserver = TcpListener::bind("127.0.0.1:0").unwrap();
        let nodemgr = TcpListener::bind("127.0.0.1:0").unwrap();
        let cluster = Arc::new(Mutex::new(Cluster {
            deployments,
            load,
            failures_left: 0,
            status_reads: 0,
            patches: Vec::new(),
            nodemgr_port: nodemgr.local_addr().unwrap().port(),
        }));
        let addr = apiserver.local_addr().unwrap();
        serve(apiserver, cluster.clone(), serve_apiserver);
        serve(nodemgr, cluster.clone(), serve_nodemgr);
        Mocks {
            apiserver: addr,
            cluster,
        }
    }

    fn autoscaler(&self) -> AutoscalerHandle {
        autoscaler::start(AutoscalerConfig {
            apiserver: format!("http://{}", self.apiserver),
            period: Duration::from_millis(20),
            namespace: None,
            nodemgr_selector: "app.kubernetes.io/name=dilu,app.kubernetes.io/component=node".into(),
            nodemgr_namespace: None,
            nodemgr_port: 1,
            nodemgr_timeout: Duration::from_secs(2),
        })
        .expect("autoscaler starts")
    }

    fn replicas(&self, name: &str) -> usize {
        let cluster = self.cluster.lock().unwrap();
        cluster.deployments.iter().find(|d| d.0 == name).unwrap().2
    }

    fn set_load(&self, load: Load) -> usize {
        let mut cluster = self.cluster.lock().unwrap();
        cluster.load = load;
        cluster.status_reads
    }

    fn patches(&self) -> Vec<(String, usize, usize)> {
        self.cluster.lock().unwrap().patches.clone()
    }

    /// Waits (generously: the machine may be loaded) for a condition.
    fn wait_for(&self, what: &str, condition: impl Fn(&Mocks) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !condition(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; patches: {:?}",
                self.patches()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn serve_apiserver(mut stream: TcpStream, cluster: &Mutex<Cluster>) {
    let Some(request) = read_request(&stream) else {
        return;
    };
    let mut cluster = cluster.lock().unwrap();
    if cluster.failures_left > 0 {
        cluster.failures_left -= 1;
        return respond(
            &mut stream,
            500,
            &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd timeout", "reason": "InternalError", "code": 500 }),
        );
    }
    let Request { method, .. } = &request;
    let list = |kind: &str, items: Vec<Value>| json!({ "apiVersion": "v1", "kind": kind, "metadata": { "resourceVersion": "1" }, "items": items });
    match (method.as_str(), request.segments().as_slice()) {
        ("GET", ["apis", "apps", "v1", "deployments"]) => {
            let items = cluster
                .deployments
                .iter()
                .map(|d| cluster.deployment_json(d))
                .collect();
            respond(&mut stream, 200, &list("DeploymentList", items));
        }
        ("GET", ["api", "v1", "namespaces", NAMESPACE, "pods"]) => {
            let selector = request.param("labelSelector").unwrap_or_default();
            let app = selector.strip_prefix("app=").unwrap_or("");
            respond(&mut stream, 200, &list("PodList", cluster.pods_of(app)));
        }
        ("GET", ["api", "v1", "pods"]) => {
            let selector = request.param("labelSelector").unwrap_or_default();
            let items = if selector.contains("app.kubernetes.io/component=node") {
                vec![cluster.nodemgr_pod()]
            } else {
                vec![]
            };
            respond(&mut stream, 200, &list("PodList", items));
        }
        (
            "PATCH",
            [
                "apis",
                "apps",
                "v1",
                "namespaces",
                NAMESPACE,
                "deployments",
                name,
                "scale",
            ],
        ) => {
            let patch: Value = serde_json::from_str(&request.body).unwrap_or(Value::Null);
            let Some(replicas) = patch["spec"]["replicas"].as_u64() else {
                return respond(&mut stream, 422, &json!({ "kind": "Status", "code": 422 }));
            };
            let reads = cluster.status_reads;
            let name = name.to_string();
            cluster
                .patches
                .push((name.clone(), replicas as usize, reads));
            if let Some(deployment) = cluster.deployments.iter_mut().find(|d| d.0 == name) {
                deployment.2 = replicas as usize;
            }
            respond(
                &mut stream,
                200,
                &json!({ "apiVersion": "autoscaling/v1", "kind": "Scale",
                         "metadata": { "name": name, "namespace": NAMESPACE },
                         "spec": { "replicas": replicas }, "status": { "replicas": replicas } }),
            );
        }
        _ => respond(&mut stream, 404, &json!({ "kind": "Status", "code": 404 })),
    }
}

fn serve_nodemgr(mut stream: TcpStream, cluster: &Mutex<Cluster>) {
    let Some(request) = read_request(&stream) else {
        return;
    };
    let mut cluster = cluster.lock().unwrap();
    if request.path != "/api/status" {
        return respond(&mut stream, 404, &json!("not found"));
    }
    cluster.status_reads += 1;
    if cluster.load == Load::Broken {
        return respond(&mut stream, 200, &json!(["not", "a", "status"]));
    }
    let status = cluster.nodemgr_status();
    respond(&mut stream, 200, &status);
}

fn deployments(web_replicas: usize) -> Vec<(String, Value, usize)> {
    vec![
        (
            "web".into(),
            json!({ "dilu.io/autoscale": "true", "dilu.io/min-replicas": "2", "dilu.io/max-replicas": "5" }),
            web_replicas,
        ),
        // Saturated too, but not opted in.
        ("other".into(), json!({ "team": "search" }), 1),
    ]
}

#[test]
fn saturated_functions_grow_to_their_maximum_and_quiet_ones_shrink_to_their_minimum() {
    let mocks = Mocks::start(deployments(2), Load::Saturated);
    let scaler = mocks.autoscaler();
    mocks.wait_for("web at its maximum", |m| m.replicas("web") == 5);
    // The rule keeps the load at 80% of the limits: 2 -> 3 at the first
    // period; then the load has risen by one within a start time, and it
    // keeps room for another such rise: 5, the maximum, never above it.
    let grown: Vec<usize> = mocks.patches().iter().map(|p| p.1).collect();
    assert_eq!(grown, [3, 5], "scale-ups: {grown:?}");
    assert!(
        mocks.patches()[0].2 <= 2,
        "out at once: {:?}",
        mocks.patches()
    );
    // Still saturated for a while: nothing above the maximum.
    let reads = mocks.set_load(Load::Saturated);
    mocks.wait_for("ten more periods", |m| {
        m.set_load(Load::Saturated) >= reads + 10
    });
    assert_eq!(mocks.patches().len(), 2);

    // Quiet: down, each step after a quiet window, to the most that window
    // asked for; the room for a rise like the last ones is kept while
    // they are remembered (RISE_MEMORY periods), then it goes too.
    let quiet_from = mocks.set_load(Load::Quiet);
    mocks.wait_for("web at its minimum", |m| m.replicas("web") == 2);
    let shrunk: Vec<(usize, usize)> = mocks.patches()[2..].iter().map(|p| (p.1, p.2)).collect();
    assert_eq!(
        shrunk.iter().map(|s| s.0).collect::<Vec<_>>(),
        [4, 3, 2],
        "scale-downs: {shrunk:?}"
    );
    let mut previous = quiet_from;
    for (_, reads) in &shrunk {
        assert!(
            *reads >= previous + IN_PERIODS,
            "scaled in after {} quiet periods",
            reads - previous
        );
        previous = *reads;
    }
    let reads = mocks.set_load(Load::Quiet);
    mocks.wait_for("a window more", |m| {
        m.set_load(Load::Quiet) >= reads + IN_PERIODS + 5
    });
    assert_eq!(mocks.replicas("web"), 2, "below its minimum");
    assert!(
        mocks.patches().iter().all(|p| p.0 == "web"),
        "an unannotated Deployment was scaled: {:?}",
        mocks.patches()
    );
    assert_eq!(mocks.replicas("other"), 1);
    assert!(scaler.periods() > 0);
}

#[test]
fn failing_api_calls_and_a_broken_node_manager_cost_periods_not_the_controller() {
    let mocks = Mocks::start(deployments(2), Load::Broken);
    mocks.cluster.lock().unwrap().failures_left = 20;
    let scaler = mocks.autoscaler();
    mocks.wait_for("the failures served", |m| {
        m.cluster.lock().unwrap().failures_left == 0
    });
    let reads = mocks.set_load(Load::Broken);
    mocks.wait_for("broken status reads", |m| {
        m.set_load(Load::Broken) >= reads + 10
    });
    // Unreadable signals never scale.
    assert!(mocks.patches().is_empty(), "{:?}", mocks.patches());
    let periods = scaler.periods();
    // The controller is still there: once the node manager answers, it acts.
    mocks.set_load(Load::Saturated);
    // (The rule scales out at the first period that reads the load, which
    // may be the period running when `periods` was read.)
    mocks.wait_for("web scaled out", |m| m.replicas("web") > 2);
    mocks.wait_for("the controller's next period", |_| {
        scaler.periods() > periods
    });
    // More failing calls on the way up: it still gets there.
    mocks.cluster.lock().unwrap().failures_left = 4;
    mocks.wait_for("web at its maximum", |m| m.replicas("web") == 5);
}
