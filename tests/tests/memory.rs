//! Memory budgets, end to end on simgpu: every allocation path, every way of
//! reaching the driver, concurrency across processes, dead processes, and
//! what programs see as their GPU's size.

use dilu_harness::workspace::{artifact, dilu_run, output_within, unique_name};
use dilu_layout::ledger::TenantLedger;
use dilu_layout::shm::Region;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const MIB: u64 = 1 << 20;

fn sim(command: &mut Command, instance: &str) {
    command.env("SIMGPU_INSTANCE", instance);
    for var in [
        "SIMGPU_TRACE",
        "SIMGPU_MEMORY",
        "DILU_MEM_LIMIT",
        "DILU_TENANT",
        "DILU_CONTEXT_MEMORY",
    ] {
        command.env_remove(var);
    }
    for i in 0..16 {
        command.env_remove(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"));
    }
    command.env_remove("CUDA_DEVICE_MEMORY_LIMIT");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn last_json(stdout: &[u8]) -> serde_json::Value {
    let out = text(stdout);
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON in {out}"));
    serde_json::from_str(line).expect("JSON")
}

fn ledger_path(tenant: &str) -> std::path::PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    dilu_layout::tenant_region_path(uid, tenant, "ledger")
}

fn open_ledger(tenant: &str) -> Region<TenantLedger> {
    Region::<TenantLedger>::open_or_create(&ledger_path(tenant), 0o600, |_| {
        panic!("the tenant ledger should already exist")
    })
    .expect("open ledger")
}

/// Opens (creating, empty) a tenant's ledger before its processes start, so
/// the test can read it after they are gone: the last process out removes a
/// ledger nobody else holds. The first process writes its budget into it.
fn hold_ledger(tenant: &str) -> Region<TenantLedger> {
    Region::<TenantLedger>::open_or_create(&ledger_path(tenant), 0o600, |_| {})
        .expect("create the ledger")
}

#[test]
fn every_allocation_path_is_held_to_the_budget_whichever_way_it_is_reached() {
    for via in ["dlsym", "linked", "gpa0", "gpa2"] {
        let mut command = dilu_run(
            true,
            &artifact("mem-paths"),
            &["--via", via, "--budget", &(8 * MIB).to_string()],
        );
        sim(&mut command, &unique_name("paths"));
        command
            .env("DILU_MEM_LIMIT", "8MiB")
            .env("DILU_CONTEXT_MEMORY", "0");
        let output = output_within(command, LIMIT);
        let stdout = text(&output.stdout);
        let paths: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        assert_eq!(
            paths.len(),
            12,
            "via {via}: every path must report: {stdout}\n{}",
            text(&output.stderr)
        );
        for path in &paths {
            assert_eq!(path["ok"], true, "via {via}: {path}");
        }
        assert!(
            output.status.success(),
            "via {via}: {}",
            text(&output.stderr)
        );
        // The program sees only the driver's error; the user is told why,
        // once per process, with the budget.
        let stderr = text(&output.stderr);
        let said: Vec<&str> = stderr
            .lines()
            .filter(|line| line.contains("was refused as out of memory"))
            .collect();
        assert_eq!(said.len(), 1, "via {via}: {stderr}");
        assert!(
            said[0].contains(&format!("its memory budget is {} bytes", 8 * MIB)),
            "via {via}: {}",
            said[0]
        );
    }
}

#[test]
fn the_same_paths_are_unlimited_without_a_budget() {
    // Guards the test above: without dilu's budget the over-budget
    // allocation succeeds, so "refused" really comes from the interposer.
    let mut command = Command::new(artifact("dilu"));
    command
        .args(["run", "--sim", "--"])
        .arg(artifact("mem-paths"))
        .args(["--via", "dlsym", "--budget", &(8 * MIB).to_string()]);
    sim(&mut command, &unique_name("unbudgeted"));
    let output = output_within(command, LIMIT);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("expected the budget"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn concurrent_processes_of_a_tenant_never_exceed_its_budget() {
    let tenant = unique_name("stress");
    let instance = unique_name("stress");
    let budget = 16 * MIB;
    let spawn = || {
        let mut command = dilu_run(
            true,
            &artifact("mem-stress"),
            &["--threads", "16", "--seconds", "3"],
        );
        sim(&mut command, &instance);
        // The simulated device is exactly the budget: anything the budget
        // admitted beyond it would be refused by simgpu itself and logged.
        command
            .env("DILU_TENANT", &tenant)
            .env("DILU_MEM_LIMIT", "16MiB")
            .env("DILU_CONTEXT_MEMORY", "0")
            .env("SIMGPU_MEMORY", "16MiB")
            .env("SIMGPU_LOG_ERRORS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().expect("spawn stress")
    };
    let ledger = hold_ledger(&tenant);
    let children = [spawn(), spawn()];
    let mut granted = 0;
    let mut refused = 0;
    for child in children {
        let output = child.wait_with_output().expect("wait");
        let stderr = text(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(
            !stderr.contains("cuMemAlloc_v2 -> 2"),
            "simgpu ran out of memory behind the budget's back: {stderr}"
        );
        let summary = last_json(&output.stdout);
        assert_eq!(summary["other_errors"], 0, "{summary}");
        granted += summary["granted"].as_u64().unwrap();
        refused += summary["refused"].as_u64().unwrap();
    }
    assert!(
        granted > 1000 && refused > 1000,
        "the budget was not contended: {granted} granted, {refused} refused"
    );
    assert!(
        ledger.peak(0) <= budget,
        "peak {} over budget {budget}",
        ledger.peak(0)
    );
    assert!(
        ledger.peak(0) > budget / 2,
        "stress never came near the budget"
    );
    assert_eq!(
        ledger.used(0),
        0,
        "memory still charged after every process exited"
    );
    let _ = std::fs::remove_file(ledger_path(&tenant));
}

/// Starts cudart-client under a tenant; returns once its allocation is held.
fn holder(tenant: &str, instance: &str, bytes: u64) -> std::process::Child {
    let mut command = dilu_run(
        true,
        &artifact("cudart-client"),
        &["--alloc", &bytes.to_string(), "--hold-ms", "60000"],
    );
    sim(&mut command, instance);
    command
        .env("DILU_TENANT", tenant)
        .env("DILU_MEM_LIMIT", "8MiB")
        .env("DILU_CONTEXT_MEMORY", "0")
        .stdout(Stdio::piped());
    let mut child = command.spawn().expect("spawn holder");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    assert!(
        line.starts_with("holding"),
        "holder did not get its memory: {line:?}"
    );
    child
}

#[test]
fn a_sigkilled_members_memory_returns_to_the_tenant_promptly() {
    let tenant = unique_name("killed");
    let instance = unique_name("killed");
    let mut survivor = holder(&tenant, &instance, MIB);
    let mut victim = holder(&tenant, &instance, 6 * MIB);
    let ledger = open_ledger(&tenant);
    assert_eq!(ledger.used(0), 7 * MIB);

    victim.kill().expect("SIGKILL");
    victim.wait().expect("reap");
    // The survivor's watcher reclaims the dead member without anyone
    // allocating; documented bound 100 ms, allow for a loaded machine.
    let killed_at = Instant::now();
    while ledger.used(0) != MIB {
        assert!(
            killed_at.elapsed() < Duration::from_secs(3),
            "dead member's 6 MiB still charged after {:?}",
            killed_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // And the memory really is usable by the tenant again.
    let mut command = dilu_run(
        true,
        &artifact("cudart-client"),
        &["--alloc", &(6 * MIB).to_string()],
    );
    sim(&mut command, &instance);
    command
        .env("DILU_TENANT", &tenant)
        .env("DILU_MEM_LIMIT", "8MiB")
        .env("DILU_CONTEXT_MEMORY", "0");
    let output = output_within(command, LIMIT);
    assert!(output.status.success(), "{}", text(&output.stdout));

    survivor.kill().expect("kill");
    survivor.wait().expect("reap");
    let _ = std::fs::remove_file(ledger_path(&tenant));
}

#[test]
fn programs_see_the_budget_as_their_gpu_with_the_context_charged() {
    let mut command = Command::new(artifact("dilu"));
    command
        .args(["run", "--sim", "--mem", "1GiB", "--"])
        .arg(artifact("cudart-client"));
    sim(&mut command, &unique_name("info"));
    let output = output_within(command, LIMIT);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let summary = last_json(&output.stdout);
    assert_eq!(summary["mem_total"].as_u64(), Some(1 << 30));
    // The default context allowance (256 MiB) is already in use.
    assert_eq!(summary["mem_free"].as_u64(), Some((1 << 30) - 256 * MIB));
}

#[test]
fn hami_variables_work_as_aliases() {
    let mut command = dilu_run(
        true,
        &artifact("cudart-client"),
        &["--alloc", &(2 * MIB).to_string()],
    );
    sim(&mut command, &unique_name("hami"));
    command
        .env("CUDA_DEVICE_MEMORY_LIMIT_0", "4m")
        .env("DILU_CONTEXT_MEMORY", "0");
    let output = output_within(command, LIMIT);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        last_json(&output.stdout)["mem_total"].as_u64(),
        Some(4 * MIB)
    );

    let mut command = dilu_run(
        true,
        &artifact("cudart-client"),
        &["--alloc", &(5 * MIB).to_string()],
    );
    sim(&mut command, &unique_name("hami"));
    command
        .env("CUDA_DEVICE_MEMORY_LIMIT", "4m")
        .env("DILU_CONTEXT_MEMORY", "0");
    let output = output_within(command, LIMIT);
    assert_eq!(
        output.status.code(),
        Some(3),
        "5 MiB under a 4 MiB budget must be out of memory"
    );
}

#[test]
fn a_bad_memory_limit_stops_the_program_with_one_line() {
    // Given as `--mem`, `dilu run` refuses it before the program starts;
    // set by hand as DILU_MEM_LIMIT, the interposer does, by the same rules.
    for (flag, variable, names) in [
        (Some("lots"), None, "--mem"),
        (None, Some("lots"), "DILU_MEM_LIMIT"),
    ] {
        let mut command = Command::new(artifact("dilu"));
        command.args(["run", "--sim"]);
        if let Some(value) = flag {
            command.args(["--mem", value]);
        }
        command.arg("--").arg(artifact("cudart-client"));
        sim(&mut command, &unique_name("badmem"));
        if let Some(value) = variable {
            command.env("DILU_MEM_LIMIT", value);
        }
        let output = output_within(command, LIMIT);
        assert_eq!(output.status.code(), Some(2), "{names}");
        let stderr = text(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(names) && stderr.contains("0:8GiB"),
            "{stderr}"
        );
        assert!(output.stdout.is_empty(), "the program must not have run");
    }
}

#[test]
fn forked_workers_neither_deadlock_nor_disturb_the_tenants_accounting() {
    let tenant = unique_name("fork");
    let mut command = dilu_run(
        true,
        &artifact("mem-fork"),
        &["--children", "9", "--hold", &(8 * MIB).to_string()],
    );
    sim(&mut command, &unique_name("fork"));
    command
        .env("DILU_TENANT", &tenant)
        .env("DILU_MEM_LIMIT", "64MiB")
        .env("DILU_CONTEXT_MEMORY", "1MiB");
    let ledger = hold_ledger(&tenant);
    // Generous: nine children and four busy threads on a loaded machine; a
    // deadlocked child is killed by mem-fork after 60 s and counted.
    let output = output_within(command, Duration::from_secs(300));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let summary = last_json(&output.stdout);
    let base = summary["base"].as_u64().unwrap();
    assert_eq!(
        base,
        9 * MIB,
        "parent: 1 MiB context + 8 MiB held: {summary}"
    );
    assert_eq!(
        summary["hung"], 0,
        "a forked child deadlocked: {summary}\n{stderr}"
    );
    assert_eq!(summary["busy_errors"], 0, "{summary}");

    let children = summary["children"].as_array().unwrap();
    assert_eq!(
        children.len(),
        9,
        "every child must report: {summary}\n{stderr}"
    );
    for child in children {
        // Like NVIDIA's driver, the simulated one refuses CUDA in a forked
        // child; the interposer passes that through and keeps no charge.
        assert_eq!(child["info"], 3, "{child}");
        assert_eq!(child["alloc"], 3, "{child}");
        assert_eq!(child["free_inherited"], 3, "{child}");
        // The child is its own member, holding exactly its context.
        assert_eq!(child["own"].as_u64(), Some(MIB), "{child}");
        // Its view of the tenant includes the parent's usage and its own.
        assert!(
            child["tenant_used"].as_u64().unwrap() >= base + MIB,
            "the child sees less than the parent's usage plus its own: {child}"
        );
        assert!(child["members"].as_u64().unwrap() >= 2, "{child}");
    }
    assert!(
        ["exit", "_exit", "sigkill"]
            .iter()
            .all(|how| children.iter().any(|c| c["exit"] == *how)),
        "every way of ending must be covered: {summary}"
    );

    // Each child's usage was given back exactly once, whichever way it
    // ended: never below the parent's own usage, and back to exactly it.
    assert!(
        summary["lowest_used"].as_u64().unwrap() >= base,
        "the tenant's usage dropped below the parent's: a child's exit subtracted twice: {summary}"
    );
    assert_eq!(summary["settled_used"].as_u64(), Some(base), "{summary}");
    assert_eq!(summary["settled_members"], 1, "{summary}");
    assert_eq!(summary["parent_own"].as_u64(), Some(base), "{summary}");
    assert_eq!(summary["freed"], 0, "{summary}");
    assert_eq!(summary["after_free"].as_u64(), Some(MIB), "{summary}");
    assert_eq!(
        ledger.used(0),
        0,
        "memory still charged after the parent exited"
    );
    let _ = std::fs::remove_file(ledger_path(&tenant));
}

#[test]
fn graph_memory_nodes_are_held_to_the_budget_and_given_back() {
    let mut command = dilu_run(
        true,
        &artifact("mem-graph"),
        &["--budget", &(64 * MIB).to_string()],
    );
    sim(&mut command, &unique_name("graph"));
    command
        .env("DILU_MEM_LIMIT", "64MiB")
        .env("DILU_CONTEXT_MEMORY", "0");
    let output = output_within(command, LIMIT);
    let stdout = text(&output.stdout);
    let checks: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert!(
        checks.len() >= 25,
        "every check must report: {stdout}\n{}",
        text(&output.stderr)
    );
    for check in &checks {
        assert_eq!(check["ok"], true, "{check}");
    }
    assert!(output.status.success(), "{}", text(&output.stderr));

    // Guard: without a budget the same oversized node is accepted, so the
    // refusal above comes from the interposer.
    let mut command = dilu_run(true, &artifact("mem-graph"), &["--budget", "0"]);
    sim(&mut command, &unique_name("graph-free"));
    let output = output_within(command, LIMIT);
    assert!(
        output.status.success(),
        "{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}
