//! The probes of the side-by-side benchmark (`peer-suites`, run by
//! `scripts/peers.sh`) checked without HAMi-core: under dilu each suite's
//! probe must see the budget hold, and with no limiter the same probe must
//! see it not hold, so a probe that cannot tell the two apart fails here
//! before it misleads the comparison. Needs the debug workspace build
//! (`dilu`, simgpu and its NVML).

use dilu_harness::workspace::{Scratch, artifact, dilu, output_within, unique_name};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const PROBE: &str = env!("CARGO_BIN_EXE_peer-suites");
const MIB: u64 = 1 << 20;
const LIMIT: Duration = Duration::from_secs(120);

/// `peer-suites ARGS` under `dilu run --sim` with a memory budget, in
/// `tenant` on simgpu instance `instance`.
fn under_dilu(tenant: &str, instance: &str, mem: u64, args: &[&str]) -> Command {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim", "--tenant", tenant, "--mem"])
        .arg(mem.to_string())
        .arg("--")
        .arg(PROBE)
        .args(args)
        .env("SIMGPU_INSTANCE", instance)
        .env("SIMGPU_LOG_ERRORS", "0");
    command
}

/// `peer-suites ARGS` on simgpu with no limiter: the simulated driver and
/// NVML under their real names, first on `LD_LIBRARY_PATH`.
fn unlimited(libs: &Scratch, instance: &str, args: &[&str]) -> Command {
    for (name, target) in [
        ("libcuda.so.1", "libsimgpu.so"),
        ("libnvidia-ml.so.1", "libsimgpu_nvml.so"),
    ] {
        let link = libs.path(name);
        if !link.exists() {
            std::os::unix::fs::symlink(artifact(target), &link).expect("link the simulated driver");
        }
    }
    let mut command = Command::new(PROBE);
    command
        .args(args)
        .env("LD_LIBRARY_PATH", &libs.0)
        .env("SIMGPU_INSTANCE", instance);
    command
}

fn json_line(command: Command) -> Value {
    let output = output_within(command, LIMIT);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "peer-suites failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .rfind(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in {stdout:?}"));
    serde_json::from_str(line).expect("valid JSON")
}

fn paths() -> Vec<String> {
    let output = Command::new(PROBE)
        .args(["paths", "--path", "list"])
        .output()
        .expect("run peer-suites");
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[test]
fn the_paths_probe_sees_every_path_held_under_dilu() {
    let limit = 512 * MIB;
    let limit_arg = limit.to_string();
    let all = paths();
    assert_eq!(all.len(), 9, "the paths the suite drives: {all:?}");
    for path in &all {
        let tenant = unique_name("peer-paths");
        let r = json_line(under_dilu(
            &tenant,
            &tenant,
            limit,
            &["paths", "--path", path, "--limit", &limit_arg],
        ));
        let granted = r["granted"].as_u64().unwrap();
        assert!(
            granted > 0 && granted <= limit,
            "{path}: granted {granted} under a {limit}-byte budget: {r}"
        );
        assert_eq!(
            r["refused_with"], 2,
            "{path}: refused with out-of-memory: {r}"
        );
        assert_eq!(
            r["free_after"], r["free_before"],
            "{path}: freeing gave everything back: {r}"
        );
    }
}

#[test]
fn the_paths_probe_sees_no_limit_without_a_limiter() {
    let libs = Scratch::new("peer-libs");
    let limit = (512 * MIB).to_string();
    for path in ["cuMemAlloc_v2", "cuMemCreate+cuMemMap"] {
        let instance = unique_name("peer-unlimited");
        let r = json_line(unlimited(
            &libs,
            &instance,
            &["paths", "--path", path, "--limit", &limit],
        ));
        assert_eq!(
            r["granted"].as_u64().unwrap(),
            1024 * MIB,
            "{path}: all 16 pieces (twice the limit) are granted on an unlimited GPU: {r}"
        );
        assert_eq!(r["refused_with"], 0, "{r}");
    }
}

#[test]
fn racing_processes_of_a_tenant_get_exactly_its_budget_under_dilu() {
    let tenant = unique_name("peer-race");
    let budget = 256 * MIB;
    let mut command = under_dilu(
        &tenant,
        &tenant,
        budget,
        &[
            "concurrent",
            "--procs",
            "4",
            "--piece",
            &(16 * MIB).to_string(),
        ],
    );
    command.env("DILU_CONTEXT_MEMORY", "0");
    let r = json_line(command);
    assert_eq!(r["started"], 4, "{r}");
    assert_eq!(
        r["total"].as_u64().unwrap(),
        budget,
        "the four processes together got the budget, no more, no less: {r}"
    );
}

#[test]
fn a_sigkilled_holders_memory_is_grabbed_again_under_dilu() {
    let tenant = unique_name("peer-kill");
    let mut holder = under_dilu(&tenant, &tenant, 1 << 30, &["hold", "--bytes"]);
    holder
        .arg((640 * MIB).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut holder = holder.spawn().expect("start the holder");
    let mut ready = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap())
        .read_line(&mut ready)
        .expect("read the holder's ready line");
    assert!(ready.starts_with("ready"), "holder: {ready:?}");
    let grab = |wait: &str| {
        json_line(under_dilu(
            &tenant,
            &tenant,
            1 << 30,
            &[
                "grab",
                "--bytes",
                &(512 * MIB).to_string(),
                "--wait-s",
                wait,
            ],
        ))
    };
    let held = grab("0");
    assert_eq!(
        held["first_status"], 2,
        "over the budget while held: {held}"
    );
    assert!(held["granted_after_s"].is_null(), "{held}");
    holder.kill().expect("SIGKILL the holder");
    holder.wait().expect("reap the holder");
    let after = grab("30");
    assert!(
        after["granted_after_s"].is_number(),
        "the killed holder's memory came back to the tenant: {after}"
    );
}

#[test]
fn the_view_probe_finds_itself_in_nvmls_process_list() {
    let tenant = unique_name("peer-view");
    let r = json_line(under_dilu(
        &tenant,
        &tenant,
        1 << 30,
        &["view", "--bytes", &(128 * MIB).to_string()],
    ));
    assert_eq!(r["meminfo_total"].as_u64().unwrap(), 1 << 30, "{r}");
    let pid = r["pid"].as_u64().unwrap();
    for key in ["processes_v1", "processes_v3"] {
        let own = r[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} is a list: {r}"))
            .iter()
            .find(|p| p[0].as_u64() == Some(pid))
            .unwrap_or_else(|| panic!("{key} lists the probe itself: {r}"))
            .clone();
        assert!(
            own[1].as_u64().unwrap() >= 128 * MIB,
            "{key} shows the probe's 128 MiB: {r}"
        );
    }
}

#[test]
fn the_startup_probe_times_starts_beside_holders() {
    let tenant = unique_name("peer-start");
    let r = json_line(under_dilu(
        &tenant,
        &tenant,
        1 << 30,
        &["startup", "--others", "2", "--runs", "3"],
    ));
    assert_eq!(r["others"], 2);
    assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
}
