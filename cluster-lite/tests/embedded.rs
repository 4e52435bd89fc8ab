//! Embedded mode end to end on loopback: a coordinator and two node agents;
//! deploy, scale out under load, scale in, a node agent restarting, a lone
//! replica moving to a busy GPU while the cluster shrinks, and (on one
//! three-GPU node) a restartable training gang restarting to empty a GPU.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};
use dilu_cluster::control::{ClusterStatus, ControlReply, ControlRequest, FunctionProfile, send};
use dilu_cluster::coordinator::{self, CoordinatorConfig, CoordinatorHandle};
use dilu_cluster::node_agent::{self, NodeAgentConfig, NodeAgentHandle};

const GIB: u64 = 1 << 30;
/// Generous: the test machine may be small and busy.
const PATIENCE: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(5);

fn start_agent(listen: SocketAddr, name: &str, state_file: PathBuf) -> NodeAgentHandle {
    start_agent_with_gpus(listen, name, state_file, 1)
}

fn start_agent_with_gpus(
    listen: SocketAddr,
    name: &str,
    state_file: PathBuf,
    gpus: u32,
) -> NodeAgentHandle {
    node_agent::start(NodeAgentConfig {
        listen,
        node_name: name.into(),
        gpus,
        gpu_memory: 80 * GIB,
        state_file: Some(state_file),
    })
    .expect("node agent binds loopback")
}

/// A coordinator on loopback (responsive scaling, 20 ms ticks) that has
/// registered every node in `nodes`; returns it and its control address.
fn start_coordinator(nodes: Vec<String>, policy: &str) -> (CoordinatorHandle, String) {
    let count = nodes.len();
    let coordinator = coordinator::start(CoordinatorConfig {
        control_listen: "127.0.0.1:0".parse().unwrap(),
        nodes,
        policy: policy.into(),
        scaling: "responsive".into(),
        tick: Duration::from_millis(20),
        io_timeout: IO_TIMEOUT,
        node_grace: Duration::from_secs(120),
    })
    .expect("coordinator starts");
    let control = coordinator.control_addr().to_string();
    wait_for(&control, "every node to register", |s| {
        s.nodes.len() == count && s.nodes.iter().all(|n| n.connected)
    });
    (coordinator, control)
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

/// Deploys `replicas` instances of `function` and asserts that all were placed.
fn deploy_exactly(
    control: &str,
    function: &str,
    profile: &FunctionProfile,
    replicas: u32,
    scenario: &str,
) {
    let request = ControlRequest::Deploy {
        function: function.into(),
        profile: profile.clone(),
        replicas,
    };
    let reply = send(control, &request, IO_TIMEOUT).expect("deploy answers");
    assert_eq!(
        reply,
        ControlReply::Deployed {
            function: function.into(),
            live: replicas
        },
        "{scenario}: deploy {function} ×{replicas}"
    );
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
    let (coordinator, control) = start_coordinator(
        vec![first.addr().to_string(), second_addr.to_string()],
        "dilu",
    );

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
        restartable: false,
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
        restartable: false,
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

/// Each agent's instance ids (sorted), then stops everything and removes
/// the scenario's scratch folder.
fn tear_down(
    coordinator: CoordinatorHandle,
    agents: Vec<NodeAgentHandle>,
    scratch: &std::path::Path,
) -> Vec<Vec<u64>> {
    let per_node = agents
        .iter()
        .map(|agent| {
            let mut ids: Vec<u64> = agent.instances().iter().map(|r| r.instance_id).collect();
            ids.sort_unstable();
            ids
        })
        .collect();
    coordinator.shutdown();
    for agent in agents {
        agent.shutdown();
    }
    let _ = std::fs::remove_dir_all(scratch);
    per_node
}

/// Deploys `svc` and `anchor` so that `svc`'s newest instance shares node
/// B's GPU with `anchor` while its two older ones share node A's GPU, then
/// scales `svc` in to one instance. Returns the ids of `svc`'s instances in
/// deploy order and what each node runs at the end (instance ids).
fn scale_in_scenario(policy: &str) -> (Vec<u64>, u64, Vec<Vec<u64>>) {
    let scratch = std::env::temp_dir().join(format!(
        "dilu-embedded-scale-in-{policy}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&scratch).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let agents = [
        start_agent(loopback, "node-a", scratch.join("a.json")),
        start_agent(loopback, "node-b", scratch.join("b.json")),
    ];
    let (coordinator, control) = start_coordinator(
        agents
            .iter()
            .map(|agent| agent.addr().to_string())
            .collect(),
        policy,
    );
    // No load and an hour of cold start: the autoscaler keeps what is
    // deployed, so only the Deploy calls below change replica counts.
    let profile = |sm: f64, memory_gib: u64| FunctionProfile {
        demand: InstanceDemand {
            class: WorkClass::Latency,
            sm_request: sm,
            sm_limit: sm,
            memory_bytes: memory_gib * GIB,
            gpus: 1,
        },
        throughput_rps: 100.0,
        cold_start_s: 3600.0,
        restartable: false,
    };
    let deploy = |function: &str, sm: f64, memory_gib: u64, replicas: u32| {
        let request = ControlRequest::Deploy {
            function: function.into(),
            profile: profile(sm, memory_gib),
            replicas,
        };
        let reply = send(&control, &request, IO_TIMEOUT).expect("deploy answers");
        assert_eq!(
            reply,
            ControlReply::Deployed {
                function: function.into(),
                live: replicas
            },
            "{policy}"
        );
    };
    let ids = |function: &str| -> Vec<u64> {
        let mut ids: Vec<u64> = agents
            .iter()
            .flat_map(|agent| agent.instances())
            .filter(|record| record.function == function)
            .map(|record| record.instance_id)
            .collect();
        ids.sort_unstable();
        ids
    };
    // svc ×2 fill node A's GPU to 0.6 SM and 60 GiB; anchor (0.5 SM) does
    // not fit there and opens node B; svc's third instance does not fit
    // node A's memory and joins anchor on node B.
    deploy("svc", 0.3, 30, 2);
    deploy("anchor", 0.5, 10, 1);
    deploy("svc", 0.3, 30, 3);
    let svc = ids("svc");
    let anchor = ids("anchor")[0];
    let [first, second] = &agents;
    assert_eq!(first.instances().len(), 2, "{policy}: svc ×2 on node A");
    assert_eq!(
        second.instances().len(),
        2,
        "{policy}: anchor and svc on node B"
    );
    deploy("svc", 0.3, 30, 2);
    deploy("svc", 0.3, 30, 1);
    let per_node = tear_down(coordinator, Vec::from(agents), &scratch);
    (svc, anchor, per_node)
}

#[test]
fn scale_in_stops_the_instance_the_policy_chooses() {
    // dilu stops the two svc instances on node A (the second one leaves that
    // GPU idle) and keeps the newest, which shares node B with anchor.
    let (svc, anchor, per_node) = scale_in_scenario("dilu");
    assert_eq!(svc.len(), 3);
    let mut node_b = vec![anchor, svc[2]];
    node_b.sort_unstable();
    assert_eq!(per_node, vec![vec![], node_b], "dilu empties node A");
    // dilu-paper does not choose: the coordinator stops the newest instance
    // each time, and both GPUs stay busy.
    let (svc, anchor, per_node) = scale_in_scenario("dilu-paper");
    assert_eq!(
        per_node,
        vec![vec![svc[0]], vec![anchor]],
        "newest stop first"
    );
}

/// Cold start of `svc` in the consolidation scenario: how long its old copy
/// keeps serving after a move. Long enough that a status poll sees both
/// copies even on a busy machine.
const SVC_COLD_START: Duration = Duration::from_secs(2);

/// What `consolidation_scenario` saw.
struct Consolidation {
    /// `svc`'s instance alone on node B's GPU before load falls.
    lone: u64,
    anchor: u64,
    /// Instance ids on nodes A and B when the scenario ended.
    per_node: Vec<Vec<u64>>,
    /// `svc`'s live replica count at the end.
    svc_live: u32,
    /// Whether some status showed a new `svc` copy on node A while the lone
    /// one still ran on node B (`None` if no copy appeared on node A).
    both_seen: Option<bool>,
    /// From scaling `filler` to zero to the scenario's end.
    elapsed: Duration,
}

/// Leaves `svc` alone on node B's GPU while node A's GPU is busy (`anchor`)
/// with room for it, then makes the cluster shrink. A first coordinator
/// places everything (anchor and six fillers fill node A, so svc opens node
/// B) and stops; a second one re-learns the instances, adopts them by
/// deploying the same counts (no starts), and scales `filler` to zero: six
/// stops and no start since it started, so it is shrinking (a coordinator
/// that started every instance itself never sees twice as many stops as
/// starts). With
/// `wait_for_move` it waits until `svc` has left node B, else `quiet` long.
fn consolidation_scenario(policy: &str, wait_for_move: bool, quiet: Duration) -> Consolidation {
    let scratch = std::env::temp_dir().join(format!(
        "dilu-embedded-consolidation-{policy}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let agents = [
        start_agent(loopback, "node-a", scratch.join("a.json")),
        start_agent(loopback, "node-b", scratch.join("b.json")),
    ];
    let addresses: Vec<String> = agents.iter().map(|a| a.addr().to_string()).collect();
    // No load: the autoscaler keeps what is deployed (an hour of cold start
    // keeps six idle fillers from scaling in on their own).
    let profile = |class, sm_request: f64, sm_limit: f64, memory_gib: u64, cold_start_s: f64| {
        FunctionProfile {
            demand: InstanceDemand {
                class,
                sm_request,
                sm_limit,
                memory_bytes: memory_gib * GIB,
                gpus: 1,
            },
            throughput_rps: 100.0,
            cold_start_s,
            restartable: false,
        }
    };
    // anchor is batch work, which never moves: only svc is a lone replica
    // that may move.
    let anchor_profile = profile(WorkClass::Batch, 0.3, 0.3, 10, 3600.0);
    let filler_profile = profile(WorkClass::Latency, 0.1, 0.1, 5, 3600.0);
    // On node A with anchor: Σrequests 0.6, Σlimits 0.75, 40 GiB.
    let svc_profile = profile(
        WorkClass::Latency,
        0.3,
        0.45,
        30,
        SVC_COLD_START.as_secs_f64(),
    );
    let deploy = |control: &str, function: &str, profile: &FunctionProfile, replicas: u32| {
        deploy_exactly(control, function, profile, replicas, policy)
    };
    let ids_on = |status: &ClusterStatus, node: usize, function: &str| -> Vec<u64> {
        let address = &addresses[node];
        status
            .nodes
            .iter()
            .filter(|n| &n.address == address)
            .flat_map(|n| &n.instances)
            .filter(|record| record.function == function)
            .map(|record| record.instance_id)
            .collect()
    };

    let (first, control) = start_coordinator(addresses.clone(), policy);
    deploy(&control, "anchor", &anchor_profile, 1);
    deploy(&control, "filler", &filler_profile, 6);
    deploy(&control, "svc", &svc_profile, 1);
    let placed = status(&control);
    first.shutdown();
    let anchor = ids_on(&placed, 0, "anchor");
    let lone = ids_on(&placed, 1, "svc");
    assert_eq!(anchor.len(), 1, "{policy}: anchor on node A: {placed:#?}");
    assert_eq!(
        ids_on(&placed, 0, "filler").len(),
        6,
        "{policy}: fillers on node A"
    );
    assert_eq!(lone.len(), 1, "{policy}: svc alone on node B: {placed:#?}");
    let (anchor, lone) = (anchor[0], lone[0]);

    let (coordinator, control) = start_coordinator(addresses.clone(), policy);
    deploy(&control, "anchor", &anchor_profile, 1);
    deploy(&control, "filler", &filler_profile, 6);
    deploy(&control, "svc", &svc_profile, 1);
    let shrink_began = Instant::now();
    deploy(&control, "filler", &filler_profile, 0);

    let mut both_seen = None;
    if wait_for_move {
        // Polls fast: the old copy outlives the new one's placement by the
        // cold start, and a status is one snapshot of the coordinator's view.
        let deadline = Instant::now() + PATIENCE;
        loop {
            let current = status(&control);
            let on_a = ids_on(&current, 0, "svc");
            let on_b = ids_on(&current, 1, "svc");
            if both_seen.is_none() && !on_a.is_empty() {
                both_seen = Some(on_b.contains(&lone));
            }
            if both_seen.is_some() && on_b.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{policy}: timed out waiting for svc to leave node B; last status: {current:#?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    } else {
        std::thread::sleep(quiet);
    }
    let elapsed = shrink_began.elapsed();
    let end = wait_for(&control, "svc to have its replica", |s| live(s, "svc") == 1);
    let per_node = tear_down(coordinator, Vec::from(agents), &scratch);
    Consolidation {
        lone,
        anchor,
        per_node,
        svc_live: live(&end, "svc"),
        both_seen,
        elapsed,
    }
}

#[test]
fn a_replica_left_alone_moves_to_a_busy_gpu_when_load_falls() {
    let moved = consolidation_scenario("dilu", true, Duration::ZERO);
    assert_eq!(
        moved.both_seen,
        Some(true),
        "make-before-break: the new copy runs on node A while the old one still serves"
    );
    assert!(
        moved.elapsed >= SVC_COLD_START,
        "the old copy serves for the cold start: {:?}",
        moved.elapsed
    );
    assert_eq!(moved.svc_live, 1, "svc keeps its one replica");
    let [node_a, node_b] = &moved.per_node[..] else {
        panic!("two nodes: {:?}", moved.per_node);
    };
    assert!(node_b.is_empty(), "node B's GPU is idle: {node_b:?}");
    assert_eq!(node_a.len(), 2, "anchor and the moved svc: {node_a:?}");
    assert!(node_a.contains(&moved.anchor));
    assert!(!node_a.contains(&moved.lone), "svc runs as a new instance");

    // dilu-paper answers no consolidation target: nothing moves, given at
    // least twice the time the move took under dilu.
    let quiet = (moved.elapsed * 2).max(SVC_COLD_START + Duration::from_secs(1));
    let stayed = consolidation_scenario("dilu-paper", false, quiet);
    assert_eq!(
        stayed.per_node,
        vec![vec![stayed.anchor], vec![stayed.lone]],
        "dilu-paper leaves svc alone on node B"
    );
    assert_eq!(stayed.svc_live, 1);
}

/// What `gang_restart_scenario` saw.
struct GangRestart {
    /// `train`'s instance id before load fell, and its GPUs (node-local).
    before: (u64, Vec<u32>),
    /// `train`'s instances at the end: (id, GPUs).
    after: Vec<(u64, Vec<u32>)>,
    /// `train`'s live count at the end.
    live: u32,
}

/// One node with three GPUs: `anchor` (batch, 0.5 SM) and two fillers on
/// GPU 0, so the two-GPU `train` job (0.45 SM per GPU) opens GPUs 1 and 2,
/// each of which it then holds alone. As in `consolidation_scenario`, a
/// second coordinator adopts the instances and scales `filler` to zero, so
/// the cluster is shrinking and GPU 0 has room for one share of `train`.
/// With `wait_for_restart` it waits until `train` runs as a new instance,
/// else `quiet` long.
fn gang_restart_scenario(
    restartable: bool,
    wait_for_restart: bool,
    quiet: Duration,
) -> GangRestart {
    let scratch = std::env::temp_dir().join(format!(
        "dilu-embedded-gang-restart-{restartable}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let agents = vec![start_agent_with_gpus(
        loopback,
        "node-a",
        scratch.join("a.json"),
        3,
    )];
    let addresses = vec![agents[0].addr().to_string()];
    // No load and an hour of cold start: only the deploys change counts.
    let profile =
        |class, sm_request: f64, sm_limit: f64, memory_gib: u64, gpus: u32| FunctionProfile {
            demand: InstanceDemand {
                class,
                sm_request,
                sm_limit,
                memory_bytes: memory_gib * GIB,
                gpus,
            },
            throughput_rps: 100.0,
            cold_start_s: 3600.0,
            restartable: false,
        };
    let anchor = profile(WorkClass::Batch, 0.5, 0.5, 10, 1);
    let filler = profile(WorkClass::Latency, 0.1, 0.1, 5, 1);
    // With anchor alone on GPU 0: Σrequests 0.95, Σlimits 1.0.
    let train = FunctionProfile {
        restartable,
        ..profile(WorkClass::Batch, 0.45, 0.5, 30, 2)
    };
    let deploy = |control: &str, function: &str, profile: &FunctionProfile, replicas: u32| {
        deploy_exactly(control, function, profile, replicas, "gang restart")
    };
    let trains = |status: &ClusterStatus| -> Vec<(u64, Vec<u32>)> {
        status
            .nodes
            .iter()
            .flat_map(|n| &n.instances)
            .filter(|record| record.function == "train")
            .map(|record| {
                let mut gpus = record.gpu_indices.clone();
                gpus.sort_unstable();
                (record.instance_id, gpus)
            })
            .collect()
    };

    let (first, control) = start_coordinator(addresses.clone(), "dilu");
    deploy(&control, "anchor", &anchor, 1);
    deploy(&control, "filler", &filler, 2);
    deploy(&control, "train", &train, 1);
    let placed = status(&control);
    first.shutdown();
    let [before] = &trains(&placed)[..] else {
        panic!("one train instance: {placed:#?}");
    };
    assert_eq!(
        before.1,
        vec![1, 2],
        "train opens GPUs 1 and 2: {placed:#?}"
    );

    let (coordinator, control) = start_coordinator(addresses, "dilu");
    deploy(&control, "anchor", &anchor, 1);
    deploy(&control, "filler", &filler, 2);
    deploy(&control, "train", &train, 1);
    deploy(&control, "filler", &filler, 0);
    if wait_for_restart {
        wait_for(&control, "train to restart as a new instance", |s| {
            trains(s).iter().any(|(id, _)| *id != before.0)
        });
    } else {
        std::thread::sleep(quiet);
    }
    let end = wait_for(&control, "train to be live", |s| live(s, "train") == 1);
    let after = trains(&end);
    tear_down(coordinator, agents, &scratch);
    GangRestart {
        before: before.clone(),
        after,
        live: live(&end, "train"),
    }
}

#[test]
fn a_restartable_gang_restarts_to_empty_a_gpu_when_load_falls() {
    let restarted = gang_restart_scenario(true, true, Duration::ZERO);
    assert_eq!(restarted.live, 1, "train keeps its one instance");
    let [(id, gpus)] = &restarted.after[..] else {
        panic!("one train instance: {:?}", restarted.after);
    };
    assert_ne!(*id, restarted.before.0, "a restart is a new instance");
    assert_eq!(
        gpus,
        &vec![0, 2],
        "GPU 1's share joins anchor on GPU 0, so GPU 1 goes idle"
    );

    // Without the function's consent the job stays where it is.
    let stayed = gang_restart_scenario(false, false, Duration::from_secs(1));
    assert_eq!(
        stayed.after,
        vec![stayed.before],
        "a non-restartable job never moves"
    );
    assert_eq!(stayed.live, 1);
}
