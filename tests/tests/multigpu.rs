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
    let output = batch_loop(node, GPUS, name, ["60", "100"], seconds)
        .arg("--json")
        .output()
        .expect("run the batch tenant");
    assert!(output.status.success(), "{output:?}");
    let rate = summary(&output)["kernels_per_second"].as_f64().unwrap();
    (rate, node.status().unwrap_or(Value::Null))
}

/// `dilu run --sim` of batch tenant `name` with SM `[request, limit]`,
/// a deep queue of 1 ms kernels for `seconds`, on a node of `gpus` GPUs.
fn batch_loop(node: &Node, gpus: u32, name: &str, sm: [&str; 2], seconds: &str) -> Command {
    let mut command = node.command(&dilu(), gpus);
    command
        .args(["run", "--sim", "--tenant", name, "--class", "batch"])
        .args(["--sm-request", sm[0], "--sm-limit", sm[1]])
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
        .stdin(Stdio::null());
    command
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
    let mut server = node
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
    let status =
        node.wait_for_while_running("the latency tenant registered on a GPU", &mut server, |s| {
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
    // build misses a 50 ms SLO even alone. `scripts/bench.sh multigpu`
    // runs this case in a release build and sets the latency tenant's SLO
    // violations beside the batch tenant against each one's run alone.
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

/// A data-parallel tenant: `dilu run --gpus 2` with a deep queue of 1 ms
/// kernels on both of its devices for `seconds`, SM flags `sm`. Its
/// summary: each device's kernels per second, and the
/// `CUDA_VISIBLE_DEVICES` it saw.
fn data_parallel(node: &Node, name: &str, sm: &[&str], seconds: &str) -> Value {
    let output = node
        .command(&dilu(), GPUS)
        .args(["run", "--sim", "--gpus", "2", "--tenant", name])
        .args(sm)
        .arg("--")
        .arg(artifact("cudarc-loop"))
        .args(["--devices", "2", "--seconds", seconds])
        .args(["--blocks", "13200", "--depth", "never", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run the two-GPU tenant");
    assert!(output.status.success(), "{output:?}");
    summary(&output)
}

fn rates(summary: &Value) -> Vec<f64> {
    summary["devices"]
        .as_array()
        .expect("a rate per device")
        .iter()
        .map(|d| d["kernels_per_second"].as_f64().unwrap())
        .collect()
}

/// The two-GPU tenant: placed on two GPUs (listed in bus order in
/// `CUDA_VISIBLE_DEVICES`), it is held to its 30% share on each of them,
/// each device's launches charged to that device's budget.
#[test]
fn a_two_gpu_tenant_is_held_to_its_share_on_both_gpus() {
    let node = Node::new("multigpu-wide");
    let mut daemon = node.start_daemon(GPUS, "dilu");

    let free = data_parallel(&node, &unique_name("wide-free"), &[], "3");
    let capped_name = unique_name("wide-capped");
    let watcher = std::thread::spawn({
        let socket = node.socket();
        let name = capped_name.clone();
        move || {
            // While it runs: the GPUs the daemon shows it on.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while std::time::Instant::now() < deadline {
                let output = Command::new(dilu())
                    .args(["status", "--json", "--socket"])
                    .arg(&socket)
                    .output();
                if let Ok(output) = output
                    && let Ok(status) = serde_json::from_slice::<Value>(&output.stdout)
                    && let Some(t) = tenant(&status, &name)
                {
                    let table = Command::new(dilu())
                        .args(["status", "--socket"])
                        .arg(&socket)
                        .output()
                        .expect("dilu status");
                    return Some((
                        t.clone(),
                        String::from_utf8_lossy(&table.stdout).into_owned(),
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            None
        }
    });
    let capped = data_parallel(&node, &capped_name, &["--sm", "30"], "3");
    let (seen, table) = watcher.join().unwrap().expect("the tenant in the status");

    let visible: Vec<u64> = capped["visible"]
        .as_str()
        .unwrap()
        .split(',')
        .map(|g| g.parse().expect("a GPU index"))
        .collect();
    assert_eq!(visible.len(), 2, "two GPUs: {capped}");
    assert!(visible[0] < visible[1], "in bus order: {capped}");
    assert!(visible.iter().all(|&g| g < u64::from(GPUS)), "{capped}");
    // The daemon shows it on both: device 0 is its first GPU, device 1 its
    // second.
    assert_eq!(seen["gpu"].as_u64(), Some(visible[0]), "{seen}");
    assert_eq!(
        seen["more_gpus"][0]["gpu"].as_u64(),
        Some(visible[1]),
        "{seen}"
    );
    // The operator's table lists it under each of its GPUs.
    assert_eq!(
        dilu_tests::sim_node::table_gpus_of(&table, &capped_name),
        visible
            .iter()
            .map(|g| format!("gpu{g}"))
            .collect::<Vec<_>>(),
        "{table}"
    );

    let (free, capped) = (rates(&free), rates(&capped));
    eprintln!("two-GPU tenant, kernels/s per device: uncapped {free:?}, at 30% {capped:?}");
    for device in 0..2 {
        let ratio = capped[device] / free[device];
        assert!(
            (0.2..=0.4).contains(&ratio),
            "device {device} ran at {ratio:.2} of its uncapped rate under a 30% share \
             (uncapped {free:?}, capped {capped:?})"
        );
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// A two-GPU tenant's memory budget holds on each of its devices: what it
/// allocates on one does not count against the other, and neither goes
/// past the budget.
#[test]
fn a_two_gpu_tenants_memory_budget_holds_on_each_device() {
    let node = Node::new("multigpu-wide-memory");
    let mut daemon = node.start_daemon(GPUS, "dilu");
    let name = unique_name("wide-mem");
    let mut probe = node.probe(GPUS, &name, &["--gpus", "2", "--mem", "64MiB"]);
    const OUT_OF_MEMORY: &str = "alloc 2";
    for device in 0..2 {
        // Device 0's 48 MiB stay held while device 1 allocates.
        assert_eq!(
            probe.ask(&format!("device {device}")),
            format!("device {device}")
        );
        assert_eq!(probe.alloc(48 << 20), "alloc 0", "device {device}: within");
        assert_eq!(
            probe.alloc(32 << 20),
            OUT_OF_MEMORY,
            "device {device}: 80 MiB is past its 64 MiB budget"
        );
    }
    assert_eq!(probe.ask("free"), "free 0");
    let status = node.wait_for("the tenant on two GPUs", |s| {
        tenant(s, &name).is_some_and(|t| t["more_gpus"].as_array().is_some_and(|m| m.len() == 1))
    });
    assert!(tenant(&status, &name).unwrap()["gpu"].is_u64());
    probe.finish();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// On a two-GPU node a tenant on both GPUs (request 20%, limit 75%) gets
/// its share on each GPU from that GPU's tenants alone: on the GPU it has
/// to itself it runs at its limit, on the GPU it shares with a busy tenant
/// held at 60% it gets at most the 40% left. (The placement policy bounds
/// the limits on a GPU to 135%.)
#[test]
fn a_two_gpu_tenants_share_on_each_gpu_follows_that_gpus_tenants() {
    let node = Node::new("multigpu-wide-control");
    let mut daemon = node.start_daemon(TWO, "dilu");
    let (busy, shared) = start_busy_beside(&node, "12");
    let wide = unique_name("wide");
    let output = two_device_loop(&node, &["--gpus", "2", "--tenant", &wide], "4")
        .output()
        .expect("run the two-GPU tenant");
    assert!(output.status.success(), "{output:?}");
    let summary = summary(&output);
    assert_eq!(summary["visible"], "0,1", "{summary}");
    assert_held_beside_busy("two-GPU tenant", &rates(&summary), shared);
    let _ = busy.wait_with_output();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

const TWO: u32 = 2;

/// A busy batch tenant (60% request and limit) placed on one GPU of a
/// two-GPU node for `seconds`, and the GPU it is on.
fn start_busy_beside(node: &Node, seconds: &str) -> (std::process::Child, u64) {
    let other = unique_name("busy");
    let mut busy = batch_loop(node, TWO, &other, ["60", "60"], seconds)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the busy tenant");
    let status = node.wait_for_while_running("the busy tenant on a GPU", &mut busy, |s| {
        tenant(s, &other).is_some_and(|t| t["gpu"].is_u64())
    });
    let shared = tenant(&status, &other).unwrap()["gpu"].as_u64().unwrap();
    (busy, shared)
}

/// `dilu run --sim RUN_ARGS` of a batch tenant (20% request, 75% limit)
/// with a deep queue of 1 ms kernels on two devices for `seconds`.
fn two_device_loop(node: &Node, run_args: &[&str], seconds: &str) -> Command {
    let mut command = node.command(&dilu(), TWO);
    command
        .args(["run", "--sim"])
        .args(run_args)
        .args(["--class", "batch", "--sm-request", "20", "--sm-limit", "75"])
        .arg("--")
        .arg(artifact("cudarc-loop"))
        .args(["--devices", "2", "--seconds", seconds])
        .args(["--blocks", "13200", "--depth", "never", "--json"])
        .stdin(Stdio::null());
    command
}

/// A two-device tenant's rates: on the GPU it has alone it runs at its
/// limit, beside the busy tenant's 60% request (on gpu `shared`) it
/// does not.
fn assert_held_beside_busy(what: &str, rates: &[f64], shared: u64) {
    let (on_shared, alone) = (rates[shared as usize], rates[1 - shared as usize]);
    eprintln!(
        "{what}: {alone:.1} kernels/s on the GPU it has alone, \
         {on_shared:.1} on gpu{shared} beside a 60% request"
    );
    // 1 ms kernels: ~1000/s is the whole GPU. Alone it may use 75% of
    // it; beside the busy tenant at most the 40% left.
    assert!(
        alone > 1.5 * on_shared,
        "alone on a GPU it runs at its limit, beside a 60% request it does not: \
         {alone:.1} vs {on_shared:.1} kernels/s"
    );
}

/// A tenant its user put on two GPUs (`CUDA_VISIBLE_DEVICES`, so `dilu run`
/// places nothing) is controlled on each GPU it launches on, beside that
/// GPU's tenants, as a tenant the node manager placed is. Before, both of
/// its devices followed its device 0 alone.
#[test]
fn a_tenant_on_gpus_its_user_chose_is_controlled_on_each_gpu_it_uses() {
    let node = Node::new("multigpu-chosen");
    let mut daemon = node.start_daemon(TWO, "dilu");
    // Long enough for the daemon to see it on both GPUs while it runs
    // (NVML is read once a second) on a loaded machine.
    let (busy, shared) = start_busy_beside(&node, "17");
    let chosen = unique_name("chosen");
    let mut run = two_device_loop(&node, &["--tenant", &chosen], "8")
        .env("CUDA_VISIBLE_DEVICES", "0,1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the tenant on the GPUs its user chose");
    // While it runs, the status shows it on both GPUs.
    let status = node.wait_for_while_running("the chosen tenant on both GPUs", &mut run, |s| {
        tenant(s, &chosen).is_some_and(|t| {
            t["gpu"].is_u64() && t["more_gpus"].as_array().is_some_and(|m| m.len() == 1)
        })
    });
    let seen = tenant(&status, &chosen).unwrap();
    let mut on: Vec<u64> = vec![seen["gpu"].as_u64().unwrap()];
    on.push(seen["more_gpus"][0]["gpu"].as_u64().unwrap());
    on.sort_unstable();
    assert_eq!(on, [0, 1], "{seen}");
    let output = run.wait_with_output().expect("wait for the chosen tenant");
    assert!(output.status.success(), "{output:?}");
    assert_held_beside_busy("tenant on chosen GPUs", &rates(&summary(&output)), shared);
    let _ = busy.wait_with_output();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// `--gpus` asks what the node cannot give: refused in one line before
/// the program starts.
#[test]
fn gpus_the_node_cannot_give_are_refused_before_the_program_starts() {
    let node = Node::new("multigpu-gpus-flag");
    let mut daemon = node.start_daemon(GPUS, "dilu");
    for (gpus, says) in [
        ("0", "--gpus 0 is invalid".to_string()),
        ("9", format!("asks 9 GPUs; this node has {GPUS}")),
    ] {
        let output = node
            .command(&dilu(), GPUS)
            .args(["run", "--sim", "--gpus", gpus, "--tenant"])
            .arg(unique_name("too-many"))
            .arg("--")
            .arg(artifact("mem-probe"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "--gpus {gpus}: {stderr}");
        assert!(stderr.contains(&says), "--gpus {gpus}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// Two co-location primaries of one user and group, placed on different
/// GPUs (each sees its GPU as device 0), keep to their own GPU's slot of
/// the gap board: the status shows a board for each, on its GPU.
#[test]
fn primaries_on_different_gpus_keep_to_their_own_gpus_board() {
    let mut node = Node::new("multigpu-colo");
    let group = unique_name("colo-wide");
    node.env.push(("DILU_COLO_GROUP".into(), group.clone()));
    // SAFETY: getuid has no preconditions.
    let board = dilu_layout::colocation::board_path(unsafe { libc::getuid() }, &group);
    let mut daemon = node.start_daemon(GPUS, "dilu-colo");
    let names = [unique_name("primary-a"), unique_name("primary-b")];
    let mut primaries: Vec<_> = names
        .iter()
        .map(|name| {
            node.command(&dilu(), GPUS)
                .args(["run", "--sim", "--tenant", name, "--colo", "primary"])
                .args(["--sm-request", "60", "--sm-limit", "60"])
                .arg("--")
                .arg(artifact("demo-tenant"))
                .args(["train", "--load-ms", "3", "--kernels", "4"])
                .args(["--blocks", "6600", "--seconds", "60"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start a primary")
        })
        .collect();
    let status = node.wait_for("a board for each primary", |s| {
        names.iter().all(|name| {
            let gpu = tenant(s, name).and_then(|t| t["gpu"].as_u64());
            s["colocation"].as_array().is_some_and(|boards| {
                boards.iter().any(|c| {
                    c["primary_tenant"] == name.as_str()
                        && gpu.is_some()
                        && c["device"].as_u64() == gpu
                })
            })
        })
    });
    let gpus: Vec<_> = names
        .iter()
        .map(|name| tenant(&status, name).unwrap()["gpu"].clone())
        .collect();
    assert_ne!(gpus[0], gpus[1], "60% + 60% are on different GPUs");
    for primary in &mut primaries {
        let _ = primary.kill();
        let _ = primary.wait();
    }
    let _ = std::fs::remove_file(board);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}
