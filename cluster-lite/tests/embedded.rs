//! Embedded mode end to end on loopback: a coordinator and two node agents;
//! deploy, scale out under load, scale in, and a node agent restarting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};
use dilu_cluster::control::{ClusterStatus, ControlReply, ControlRequest, FunctionProfile, send};
use dilu_cluster::coordinator::{self, CoordinatorConfig};
use dilu_cluster::node_agent::{self, NodeAgentConfig, NodeAgentHandle};

const GIB: u64 = 1 << 30;
/// Generous: the test machine may be small and busy.
const PATIENCE: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(5);

fn start_agent(listen: SocketAddr, name: &str, state_file: PathBuf) -> NodeAgentHandle {
    node_agent::start(NodeAgentConfig {
        listen,
        node_name: name.into(),
        gpus: 1,
        gpu_memory: 80 * GIB,
        state_file: Some(state_file),
    })
    .expect("node agent binds loopback")
}

fn status(control: &str) -> ClusterStatus {
    match send(control, &ControlRequest::Status, IO_TIMEOUT).expect("status answers") {
        ControlReply::Status(status) => status,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Polls the coordinator until `condition` holds; panics with the last status.
fn wait_for(
    control: &str,
    what: &str,
    condition: impl Fn(&ClusterStatus) -> bool,
) -> ClusterStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let current = status(control);
        if condition(&current) {
            return current;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last status: {current:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn live(status: &ClusterStatus, function: &str) -> u32 {
    status.function(function).map_or(0, |f| f.live)
}

#[test]
fn deploy_scale_out_scale_in_and_node_restart() {
    let scratch = std::env::temp_dir().join(format!("dilu-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let first = start_agent(loopback, "node-a", scratch.join("a.json"));
    let mut second = start_agent(loopback, "node-b", scratch.join("b.json"));
    let second_addr = second.addr();
    let coordinator = coordinator::start(CoordinatorConfig {
        control_listen: loopback,
        nodes: vec![first.addr().to_string(), second_addr.to_string()],
        policy: "dilu".into(),
        scaling: "responsive".into(),
        tick: Duration::from_millis(20),
        io_timeout: IO_TIMEOUT,
        node_grace: Duration::from_secs(120),
    })
    .expect("coordinator starts");
    let control = coordinator.control_addr().to_string();
    wait_for(&control, "both nodes to register", |s| {
        s.nodes.iter().all(|n| n.connected)
    });

    // Deploy: each instance needs 0.3 SM and 30 GiB, serves 100 req/s.
    let profile = FunctionProfile {
        demand: InstanceDemand {
            class: WorkClass::Latency,
            sm_request: 0.3,
            sm_limit: 0.45,
            memory_bytes: 30 * GIB,
            gpus: 1,
        },
        throughput_rps: 100.0,
        cold_start_s: 0.0,
    };
    let deploy = ControlRequest::Deploy {
        function: "resnet".into(),
        profile,
        replicas: 1,
    };
    let reply = send(&control, &deploy, IO_TIMEOUT).expect("deploy answers");
    assert_eq!(
        reply,
        ControlReply::Deployed {
            function: "resnet".into(),
            live: 1
        }
    );

    // Scale out: 350 req/s needs ceil(350 / 90) = 4 instances. Each node has
    // one 80 GiB GPU and memory allows two instances per GPU, so they must
    // spread over both nodes.
    first.set_request_rate("resnet", 350.0);
    let scaled_out = wait_for(&control, "scale-out to 4", |s| live(s, "resnet") == 4);
    assert_eq!(
        first.instances().len(),
        2,
        "agents track the live instances"
    );
    assert_eq!(
        second.instances().len(),
        2,
        "agents track the live instances"
    );
    assert!(scaled_out.nodes.iter().all(|n| n.connected));

    // Scale in lazily to the floor of one instance once load drops.
    first.set_request_rate("resnet", 10.0);
    wait_for(&control, "scale-in to 1", |s| live(s, "resnet") == 1);
    assert_eq!(first.instances().len() + second.instances().len(), 1);

    // Load again so both nodes hold instances, then restart node B.
    first.set_request_rate("resnet", 350.0);
    wait_for(&control, "second scale-out", |s| live(s, "resnet") == 4);
    let before: Vec<u64> = second.instances().iter().map(|r| r.instance_id).collect();
    assert_eq!(before.len(), 2, "node B holds half of the 4 instances");
    second.shutdown();
    wait_for(&control, "node B to be seen down", |s| {
        s.nodes
            .iter()
            .any(|n| n.address == second_addr.to_string() && !n.connected)
    });
    second = start_agent(second_addr, "node-b", scratch.join("b.json"));
    let relearned = wait_for(&control, "node B to reconnect", |s| {
        s.nodes.iter().all(|n| n.connected)
    });
    let node_b = relearned
        .nodes
        .iter()
        .find(|n| n.address == second_addr.to_string())
        .expect("node B listed");
    let after: Vec<u64> = node_b.instances.iter().map(|r| r.instance_id).collect();
    assert_eq!(after, before, "coordinator re-learns node B's instances");
    assert_eq!(
        live(&relearned, "resnet"),
        4,
        "no duplicate placements during the restart"
    );

    coordinator.shutdown();
    first.shutdown();
    second.shutdown();
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn deploy_with_bad_profile_or_unreachable_coordinator_is_a_clear_error() {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let coordinator = coordinator::start(CoordinatorConfig {
        control_listen: loopback,
        nodes: vec![],
        policy: "dilu".into(),
        scaling: "dilu-paper".into(),
        tick: Duration::from_millis(50),
        io_timeout: IO_TIMEOUT,
        node_grace: Duration::from_secs(1),
    })
    .expect("coordinator starts");
    let control = coordinator.control_addr().to_string();
    let mut profile = FunctionProfile {
        demand: InstanceDemand {
            class: WorkClass::Batch,
            sm_request: 0.8,
            sm_limit: 0.5,
            memory_bytes: GIB,
            gpus: 1,
        },
        throughput_rps: 10.0,
        cold_start_s: 1.0,
    };
    let deploy = |profile: &FunctionProfile| ControlRequest::Deploy {
        function: "train".into(),
        profile: profile.clone(),
        replicas: 1,
    };
    let ControlReply::Error(reason) = send(&control, &deploy(&profile), IO_TIMEOUT).unwrap() else {
        panic!("limit below request must be refused");
    };
    assert!(reason.contains("sm-request <= sm-limit"), "{reason}");
    profile.demand.sm_limit = 0.9;
    let ControlReply::Error(reason) = send(&control, &deploy(&profile), IO_TIMEOUT).unwrap() else {
        panic!("no node means nothing can be placed");
    };
    assert!(reason.contains("placed 0 of 1"), "{reason}");
    coordinator.shutdown();
    let error = send("127.0.0.1:1", &ControlRequest::Status, IO_TIMEOUT).unwrap_err();
    assert!(error.contains("cannot reach coordinator"), "{error}");
}
