//! A node with eight GPUs (simgpu, `SIMGPU_DEVICES=8`) under `dilu nodemgr`:
//! each GPU's tenants share that GPU and only that GPU. A tenant's share
//! depends on the tenants of its own GPU (control runs per GPU), and
//! admission refuses what no single GPU can hold, however much the node
//! holds in all.

use dilu_harness::workspace::{artifact, dilu, unique_name};
use dilu_tests::sim_node::{Node, tenant};
use serde_json::Value;
use std::process::{Command, Output, Stdio};

const GPUS: u32 = 8;

/// The last line of a program's stdout, as JSON.
fn summary(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "no JSON summary ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// A batch tenant with a 60% request and a 100% limit, with a deep queue
/// of 1 ms kernels for `seconds`: its kernels per second.
fn train(node: &Node, name: &str, seconds: &str) -> (f64, Value) {
    let output = node
        .command(&dilu(), GPUS)
        .args(["run", "--sim", "--tenant", name])
        .args([
            "--class",
            "batch",
            "--sm-request",
            "60",
            "--sm-limit",
            "100",
        ])
        .arg("--")
        .arg(artifact("cudarc-loop"))
        .args([
            "--seconds",
            seconds,
            "--blocks",
            "13200",
            "--depth",
            "never",
        ])
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .expect("run the batch tenant");
    assert!(output.status.success(), "{output:?}");
    let rate = summary(&output)["kernels_per_second"].as_f64().unwrap();
    (rate, node.status().unwrap_or(Value::Null))
}

/// The case: a nearly idle latency tenant that requests 60% of its
/// GPU does not hold a busy batch tenant on another GPU at the batch
/// tenant's own 60% request; the latency tenant keeps its SLO.
#[test]
fn a_busy_tenant_alone_on_its_gpu_runs_as_fast_as_alone_beside_a_request_on_another_gpu() {
    let node = Node::new("multigpu-shares");
    let mut daemon = node.start_daemon(GPUS, "dilu");
    let (alone, _) = train(&node, &unique_name("train-alone"), "4");

    let infer = unique_name("infer");
    let server = node
        .command(&dilu(), GPUS)
        .args(["run", "--sim", "--tenant", &infer])
        .args(["--class", "latency", "--slo-ms", "50"])
        .args(["--sm-request", "60", "--sm-limit", "100"])
        .arg("--")
        .arg(artifact("demo-tenant"))
        // Nearly idle but never asleep: two 100 µs kernels per request,
        // 40 requests a second, without pauses.
        .args(["serve", "--seconds", "25", "--rate", "40", "--slo-ms", "50"])
        .args([
            "--on-ms",
            "1000",
            "--off-ms",
            "0",
            "--kernels",
            "2",
            "--blocks",
            "1320",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the latency tenant");
    let status = node.wait_for("the latency tenant registered on a GPU", |s| {
        tenant(s, &infer).is_some_and(|t| t["gpu"].is_u64())
    });
    let infer_gpu = tenant(&status, &infer).unwrap()["gpu"].clone();

    let beside = unique_name("train-beside");
    let (probe_name, server_name) = (beside.clone(), infer.clone());
    let watcher = std::thread::spawn({
        let socket = node.socket();
        move || {
            // While it runs: its GPU, and the share the daemon gave it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let mut seen = Vec::new();
            while std::time::Instant::now() < deadline && seen.len() < 20 {
                let output = Command::new(dilu())
                    .args(["status", "--json", "--socket"])
                    .arg(&socket)
                    .output();
                if let Ok(output) = output
                    && let Ok(status) = serde_json::from_slice::<Value>(&output.stdout)
                    && let Some(t) = tenant(&status, &probe_name)
                    && let Some(server) = tenant(&status, &server_name)
                {
                    let share = |t: &Value| t["sm_current_pct"].as_f64().unwrap_or(0.0);
                    seen.push((t["gpu"].clone(), share(t), share(server)));
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            seen
        }
    });
    let (with_request, _) = train(&node, &beside, "4");
    let seen = watcher.join().unwrap();
    assert!(
        !seen.is_empty(),
        "the batch tenant was never seen in the status"
    );
    assert!(
        seen.iter()
            .all(|(gpu, _, _)| *gpu != infer_gpu && gpu.is_u64()),
        "the batch tenant shares no GPU with the latency tenant ({infer_gpu}): {seen:?}"
    );
    assert!(
        seen.iter().any(|(_, share, _)| *share >= 99.0),
        "alone on its GPU, it is given its 100% limit: {seen:?}"
    );
    assert!(
        seen.iter().all(|(_, _, server)| *server >= 60.0),
        "the latency tenant keeps its 60% request: {seen:?}"
    );
    let ratio = with_request / alone;
    eprintln!(
        "batch tenant: {alone:.1} kernels/s alone, {with_request:.1} beside a 60% request on another GPU ({ratio:.2})"
    );
    assert!(
        ratio >= 0.9,
        "beside a request on another GPU it ran at {ratio:.2} of its rate alone ({with_request:.1} vs {alone:.1} kernels/s)"
    );

    let served = server.wait_with_output().unwrap();
    assert!(served.status.success(), "{served:?}");
    // Its latency is printed, not judged: on a loaded machine a debug
    // build misses a 50 ms SLO even alone (the `multigpu` benchmark
    // measures SLO violations per GPU).
    eprintln!("latency tenant: {}", summary(&served));
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// Eight GPUs of 1 GiB hold 8 GiB, but no tenant bigger than one GPU: it
/// is refused before it starts, and one that fits goes to a GPU.
#[test]
fn admission_refuses_what_no_single_gpu_can_hold() {
    let mut node = Node::new("multigpu-admission");
    node.env.push(("SIMGPU_MEMORY".into(), "1GiB".into()));
    let mut daemon = node.start_daemon(GPUS, "dilu");
    let refused = node
        .command(&dilu(), GPUS)
        .args([
            "run",
            "--sim",
            "--tenant",
            &unique_name("huge"),
            "--mem",
            "2GiB",
        ])
        .arg("--")
        .arg(artifact("mem-probe"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no GPU of 8 has room"), "{stderr}");

    // Eight tenants of 60% take one GPU each; a ninth fits on none.
    let big = ["--sm-request", "60", "--sm-limit", "60"];
    let mut probes = Vec::new();
    let mut gpus = std::collections::BTreeSet::new();
    for i in 0..GPUS {
        let name = unique_name(&format!("big{i}"));
        let mut probe = node.probe(GPUS, &name, &big);
        assert_eq!(probe.alloc(1 << 20), "alloc 0");
        let status = node.wait_for("the tenant registered on a GPU", |s| {
            tenant(s, &name).is_some_and(|t| t["gpu"].is_u64())
        });
        gpus.insert(tenant(&status, &name).unwrap()["gpu"].as_u64().unwrap());
        probes.push(probe);
    }
    assert_eq!(gpus.len(), GPUS as usize, "one GPU each: {gpus:?}");
    // The operator's table shows each under its own GPU, 60% reserved on each.
    let table = Command::new(dilu())
        .args(["status", "--socket"])
        .arg(node.socket())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let status = node.status().unwrap();
    for t in status["tenants"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        assert_eq!(
            dilu_tests::sim_node::table_gpu_of(&table, name),
            Some(format!("gpu{}", t["gpu"])),
            "{table}"
        );
    }
    assert_eq!(
        table.matches("1 tenant · requests reserve 60%").count(),
        GPUS as usize,
        "{table}"
    );
    let ninth = node
        .command(&dilu(), GPUS)
        .args(["run", "--sim", "--tenant", &unique_name("ninth")])
        .args(big)
        .arg("--")
        .arg(artifact("mem-probe"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&ninth.stderr);
    assert_eq!(ninth.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no GPU of 8 has room"), "{stderr}");
    for probe in probes {
        probe.finish();
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}
