//! End-to-end checks of the foundation: unmodified CUDA programs run under
//! `dilu run --sim`, the interposer sees their calls, and the simulated GPU
//! behaves like one device shared by every process.

use dilu_abi::simtrace as trace;
use dilu_harness::workspace::{
    Scratch, artifact, dilu_run, output_within, read_trace, unique_name,
};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// Environment that isolates one test's simulated GPU from every other test.
fn sim_env(command: &mut Command, instance: &str) {
    command.env("SIMGPU_INSTANCE", instance);
    command.env_remove("SIMGPU_TRACE");
    command.env_remove("SIMGPU_MEMORY");
}

fn json_line(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in output: {text}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON ({e}): {line}"))
}

fn call_reports(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no call report at {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("report line is JSON"))
        .collect()
}

fn recorded_flags2_lookups() -> u64 {
    include_str!("../data/cudart12.9_getprocaddress_requests.txt")
        .lines()
        .filter(|l| l.trim_end().ends_with("flags=2"))
        .count() as u64
}

#[test]
fn cudart_style_client_runs_and_is_intercepted() {
    let scratch = Scratch::new("cudart");
    let report = scratch.path("calls.jsonl");
    let mut command = dilu_run(true, &artifact("cudart-client"), &[]);
    sim_env(&mut command, &unique_name("cudart"));
    command.env("DILU_CALL_REPORT", &report);
    let output = output_within(command, LIMIT);
    assert!(
        output.status.success(),
        "cudart-client failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = json_line(&output.stdout);
    // Every recorded look-up resolves except the empty name cudart probes with.
    let failed = summary["failed"].as_array().expect("failed list");
    assert_eq!(failed.len(), 1, "unexpected failed look-ups: {failed:?}");
    assert!(failed[0].as_str().unwrap().starts_with("@0"), "{failed:?}");
    assert_eq!(summary["round_trip"], true);
    assert_eq!(summary["mem_total"].as_u64(), Some(80 << 30));

    let reports = call_reports(&report);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert_eq!(
        r["lookups"]["flags2"].as_u64(),
        Some(recorded_flags2_lookups()),
        "the interposer must see every flags=2 look-up: {r}"
    );
    assert!(r["lookups"]["wrapped"].as_u64().unwrap() > 0, "{r}");
    for hooked in [
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemGetInfo_v2",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
    ] {
        assert!(
            r["calls"][hooked].as_u64().unwrap_or(0) >= 1,
            "interposer did not see {hooked}: {r}"
        );
    }
}

#[test]
fn cudarc_client_runs_and_is_intercepted() {
    let scratch = Scratch::new("cudarc");
    let report = scratch.path("calls.jsonl");
    let mut command = dilu_run(
        true,
        &artifact("cudarc-loop"),
        &["--kernels", "300", "--blocks", "132", "--json"],
    );
    sim_env(&mut command, &unique_name("cudarc"));
    command.env("DILU_CALL_REPORT", &report);
    let output = output_within(command, LIMIT);
    assert!(
        output.status.success(),
        "cudarc-loop failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(json_line(&output.stdout)["kernels"].as_u64(), Some(300));
    let reports = call_reports(&report);
    let r = &reports[0];
    assert!(
        r["dlsym_wrapped"].as_u64().unwrap() > 0,
        "cudarc resolves by dlsym: {r}"
    );
    assert_eq!(r["calls"]["cuLaunchKernel"].as_u64(), Some(300), "{r}");
}

/// Starts a cudart-client that allocates `bytes` and holds them, returning
/// once the allocation has succeeded.
fn holder(instance: &str, memory: &str, bytes: u64, hold_ms: u64) -> std::process::Child {
    let mut command = dilu_run(
        true,
        &artifact("cudart-client"),
        &[
            "--alloc",
            &bytes.to_string(),
            "--hold-ms",
            &hold_ms.to_string(),
        ],
    );
    sim_env(&mut command, instance);
    command.env("SIMGPU_MEMORY", memory);
    command.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = command.spawn().expect("spawn holder");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert!(
        line.starts_with("holding"),
        "holder did not get its memory: {line:?}"
    );
    child
}

fn allocate_once(instance: &str, memory: &str, bytes: u64) -> std::process::Output {
    let mut command = dilu_run(
        true,
        &artifact("cudart-client"),
        &["--alloc", &bytes.to_string()],
    );
    sim_env(&mut command, instance);
    command.env("SIMGPU_MEMORY", memory);
    output_within(command, LIMIT)
}

#[test]
fn two_processes_share_one_memory_capacity() {
    let instance = unique_name("oom");
    let mut first = holder(&instance, "1GiB", 700 << 20, 60_000);
    let second = allocate_once(&instance, "1GiB", 700 << 20);
    assert_eq!(
        second.status.code(),
        Some(3),
        "second 700 MiB on a 1 GiB device must be out of memory: {}",
        String::from_utf8_lossy(&second.stdout)
    );
    let summary = json_line(&second.stdout);
    assert!(summary["mem_free"].as_u64().unwrap() <= (1 << 30) - (700 << 20));
    first.kill().expect("kill");
    first.wait().expect("wait");
}

#[test]
fn memory_of_a_sigkilled_process_comes_back() {
    let instance = unique_name("sigkill");
    let mut first = holder(&instance, "1GiB", 700 << 20, 60_000);
    // SIGKILL: no exit handler runs; simgpu must reclaim from the dead pid.
    first.kill().expect("kill");
    first.wait().expect("wait");
    let second = allocate_once(&instance, "1GiB", 700 << 20);
    assert!(
        second.status.success(),
        "memory of the killed process was not returned: {}\n{}",
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
}

#[test]
fn two_processes_get_about_half_the_device_each() {
    let scratch = Scratch::new("fair");
    let trace_path = scratch.path("trace.jsonl");
    let instance = unique_name("fair");
    let spawn = || {
        let mut command = dilu_run(
            true,
            &artifact("cudarc-loop"),
            &["--seconds", "3", "--blocks", "1320"],
        );
        sim_env(&mut command, &instance);
        command.env("SIMGPU_TRACE", &trace_path);
        command.stdout(Stdio::null());
        command.spawn().expect("spawn loop")
    };
    let mut a = spawn();
    let mut b = spawn();
    assert!(a.wait().expect("wait").success());
    assert!(b.wait().expect("wait").success());

    let records = read_trace(&trace_path);
    assert!(
        trace::overlapping(&records).is_empty(),
        "kernels overlapped on one device"
    );
    let shares = trace::shares_in_common_window(&records);
    assert_eq!(
        shares.len(),
        2,
        "both processes must appear in the trace: {shares:?}"
    );
    for (pid, share) in &shares {
        assert!(
            (0.40..=0.60).contains(share),
            "pid {pid} got {:.1}% of the device, expected about 50%: {shares:?}",
            share * 100.0
        );
    }
}

#[test]
fn a_bad_simgpu_setting_is_one_clear_line() {
    let mut command = dilu_run(true, &artifact("cudart-client"), &[]);
    sim_env(&mut command, &unique_name("bad"));
    command.env("SIMGPU_MEMORY", "lots");
    let output = output_within(command, LIMIT);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("SIMGPU_MEMORY"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line naming SIMGPU_MEMORY: {stderr}"
    );
    assert!(
        lines[0].contains("lots") && lines[0].contains("GiB"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
