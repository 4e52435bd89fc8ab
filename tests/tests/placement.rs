//! `dilu run` on a node with several GPUs: the node manager chooses each
//! tenant's GPU with the cluster layer's placement policy, and the tenant's
//! program sees only that GPU. The node is simgpu with two GPUs; the daemon
//! sees them through simgpu's simulated NVML, which also shows on which GPU
//! each tenant's memory really landed.

use dilu_harness::workspace::{artifact, dilu, unique_name};
use dilu_tests::sim_node::{Node, tenant};
use serde_json::Value;
use std::process::{Command, Stdio};

const MIB: u64 = 1 << 20;

fn memory_used(status: &Value, gpu: u64) -> u64 {
    status["gpus"][gpu as usize]["memory_used_bytes"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn tenants_that_only_fit_on_separate_gpus_are_placed_on_separate_gpus() {
    let node = Node::new("placement");
    let mut daemon = node.start_daemon(2, "static");
    // 60% + 60% of one GPU's time cannot be guaranteed on one GPU.
    let big = [
        "--class",
        "batch",
        "--sm-request",
        "60",
        "--sm-limit",
        "60",
        "--mem",
        "1GiB",
    ];
    let names = [unique_name("first"), unique_name("second")];
    let sizes = [64 * MIB, 192 * MIB];
    let mut probes = Vec::new();
    let mut gpus = Vec::new();
    for (name, bytes) in names.iter().zip(sizes) {
        let mut probe = node.probe(2, name, &big);
        // The program allocates on its device 0: whichever GPU it was given.
        assert_eq!(probe.alloc(bytes), "alloc 0");
        let status = node.wait_for("the tenant registered with its GPU", |s| {
            tenant(s, name).is_some_and(|t| t["gpu"].is_u64())
        });
        gpus.push(tenant(&status, name).unwrap()["gpu"].as_u64().unwrap());
        probes.push(probe);
    }
    assert_ne!(gpus[0], gpus[1], "one GPU each: {gpus:?}");

    // Each program's memory is on the GPU the node manager chose for it
    // (NVML counts physical GPUs, whatever the program saw as device 0).
    let status = node.wait_for("NVML shows both allocations", |s| {
        memory_used(s, gpus[0]) >= sizes[0] && memory_used(s, gpus[1]) >= sizes[1]
    });
    assert!(
        memory_used(&status, gpus[0]) < sizes[1],
        "the first GPU holds only the first tenant's memory: {status}"
    );
    let table = Command::new(dilu())
        .args(["status", "--socket"])
        .arg(node.socket())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert_eq!(
        dilu_tests::sim_node::table_gpu_of(&table, &names[1]),
        Some(format!("gpu{}", gpus[1])),
        "the table shows it under its GPU: {table}"
    );

    // A third such tenant fits on neither GPU: refused before it starts.
    let third = node
        .command(&dilu(), 2)
        .args(["run", "--sim", "--tenant", &unique_name("third")])
        .args(big)
        .arg("--")
        .arg(artifact("mem-probe"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&third.stderr);
    assert_eq!(third.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no GPU of 2 has room"), "{stderr}");

    // When one leaves, its GPU takes the next tenant.
    probes.remove(0).finish();
    node.wait_for("the first tenant left", |s| tenant(s, &names[0]).is_none());
    let next = unique_name("next");
    let mut probe = node.probe(2, &next, &big);
    assert_eq!(probe.alloc(MIB), "alloc 0");
    let status = node.wait_for("the next tenant registered", |s| {
        tenant(s, &next).is_some_and(|t| t["gpu"].is_u64())
    });
    assert_eq!(tenant(&status, &next).unwrap()["gpu"], gpus[0]);
    probe.finish();
    probes.remove(0).finish();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

#[test]
fn one_gpu_leaves_dilu_run_as_it_was() {
    let node = Node::new("placement-one");
    let mut daemon = node.start_daemon(1, "static");
    let name = unique_name("only");
    let mut probe = node.probe(1, &name, &["--sm-request", "60", "--sm-limit", "60"]);
    assert_eq!(probe.alloc(MIB), "alloc 0");
    let status = node.wait_for("the tenant registered", |s| tenant(s, &name).is_some());
    assert_eq!(tenant(&status, &name).unwrap()["gpu"], Value::Null);
    probe.finish();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// `dilu run` whose daemon stalls while it places the tenant starts the
/// program anyway, on the GPUs CUDA shows it (so on GPU 0), and says so;
/// once the daemon answers, the tenant is controlled on the GPU it runs on,
/// not on the one the daemon chose for an answer nobody heard (GPU 1:
/// GPU 0's tenant leaves no room for a second 60% request).
#[test]
fn a_tenant_the_stalled_daemon_could_not_place_is_controlled_where_it_runs() {
    let node = Node::new("placement-stalled");
    let mut daemon = node.start_daemon(2, "static");
    let sixty = ["--sm-request", "60", "--sm-limit", "60"];
    let first = unique_name("first");
    let mut resident = node.probe(2, &first, &sixty);
    assert_eq!(resident.alloc(MIB), "alloc 0");
    let status = node.wait_for("the first tenant registered with its GPU", |s| {
        tenant(s, &first).is_some_and(|t| t["gpu"].is_u64())
    });
    let taken = tenant(&status, &first).unwrap()["gpu"].as_u64().unwrap();

    let stalled = dilu_tests::stalled::stall(daemon.id());
    let late = unique_name("late");
    let mut run = node
        .command(&dilu(), 2)
        .args(["run", "--sim", "--tenant", &late, "--class", "batch"])
        .args(sixty)
        .arg("--")
        .arg(artifact("cudarc-loop"))
        .args(["--seconds", "30", "--blocks", "1320"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the late tenant");
    let (lines, said) = std::sync::mpsc::channel();
    let stderr = run.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // `dilu run` says it goes on without a placement; the daemon answers
    // again as the program starts, and finds the placement it chose
    // undelivered.
    let mut heard = Vec::new();
    while !heard
        .iter()
        .any(|l: &String| l.contains("did not say where tenant"))
    {
        match said.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(line) => heard.push(line),
            Err(e) => panic!("the late tenant said ({e}): {heard:#?}"),
        }
    }
    drop(stalled);
    let status =
        node.wait_for_while_running("the late tenant found where it runs", &mut run, |s| {
            tenant(s, &late).is_some_and(|t| t["gpu"].is_u64())
        });
    let entry = tenant(&status, &late).unwrap();
    assert_eq!(entry["gpu"], 0, "controlled where it runs: {entry}");
    if taken == 0 {
        assert!(
            !entry["over_admitted"].is_null(),
            "beside the first tenant's 60% it is named over-admitted: {entry}"
        );
    }
    let _ = run.kill();
    let _ = run.wait();
    resident.finish();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}
