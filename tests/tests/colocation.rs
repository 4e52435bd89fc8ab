//! Work-conserving co-location with real processes on simgpu: a primary
//! and a deep-queue filler sharing one GPU through the gap board
//! (`dilu run --colo`).

use dilu_tests::workspace::{Scratch, artifact, dilu, unique_name, wait_until_serving};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Children killed when the test ends, passed or not.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Removes the co-location group's board file when the test ends.
struct Board(std::path::PathBuf);

impl Board {
    fn of(group: &str) -> Board {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        Board(dilu_abi::colocation::board_path(uid, group))
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `dilu run --sim` of a workload in co-location group `group`, on simgpu
/// instance `group`.
fn colo_run(group: &str, dilu_args: &[&str], program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim"])
        .args(dilu_args)
        .arg("--")
        .arg(artifact(program))
        .args(args)
        .env("SIMGPU_INSTANCE", group)
        .env("DILU_COLO_GROUP", group)
        .env_remove("DILU_SM_LIMIT")
        .env_remove("DILU_COLO_TOLERANCE")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn status(socket: &std::path::Path, json: bool) -> Option<String> {
    let mut command = Command::new(dilu());
    command.arg("status").arg("--socket").arg(socket);
    if json {
        command.arg("--json");
    }
    let output = command.output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn status_shows_the_gaps_of_a_primary_and_the_time_a_filler_filled() {
    let scratch = Scratch::new("colo-status");
    let group = unique_name("colo-status");
    let _board = Board::of(&group);
    let socket = scratch.path("nodemgr.sock");
    std::fs::write(scratch.path("none.toml"), "").unwrap();
    let mut daemon = Command::new(dilu())
        .args(["nodemgr", "--config"])
        .arg(scratch.path("none.toml"))
        .arg("--socket")
        .arg(&socket)
        .arg("--run-dir")
        .arg(scratch.path("run"))
        .args(["--metrics", "", "--controller", "dilu-colo"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the node manager");
    wait_until_serving(&mut daemon, &socket, Duration::from_secs(60));
    let mut processes = Processes(vec![daemon]);
    let primary = format!("{group}-train");
    let tenant = |name: &str| format!("{group}-{name}");
    for (name, spec, program, args) in [
        (
            "train",
            ["--class", "primary", "--sm-request", "40"],
            "demo-tenant",
            &[
                "train",
                "--load-ms",
                "3",
                "--kernels",
                "4",
                "--blocks",
                "6600",
            ][..],
        ),
        (
            "batch",
            ["--colo", "filler", "--sm-request", "20"],
            "cudarc-loop",
            &["--blocks", "6600", "--depth", "32"][..],
        ),
    ] {
        let mut command = colo_run(
            &group,
            &[
                &["--tenant", &tenant(name), "--sm-limit", "100"][..],
                &spec[..],
            ]
            .concat(),
            program,
            &[args, &["--seconds", "120"][..]].concat(),
        );
        command.env(dilu_abi::node_wire::SOCKET_ENV, &socket);
        processes.0.push(command.spawn().expect("start a tenant"));
    }

    // Generous: on a loaded machine the tenants take a while to start.
    let deadline = Instant::now() + Duration::from_secs(90);
    let entry = loop {
        let last = status(&socket, true).unwrap_or_default();
        let parsed: serde_json::Value = serde_json::from_str(&last).unwrap_or_default();
        let found = parsed["colocation"].as_array().and_then(|entries| {
            entries
                .iter()
                .find(|c| c["primary_tenant"] == primary.as_str())
                .cloned()
        });
        if let Some(c) = found
            && c["gaps_seen"].as_u64().unwrap_or(0) >= 5
            && c["filled_seconds_total"].as_f64().unwrap_or(0.0) > 0.0
        {
            break c;
        }
        for child in &mut processes.0 {
            assert!(
                child.try_wait().unwrap().is_none(),
                "a process ended early; last status {last}"
            );
        }
        assert!(
            Instant::now() < deadline,
            "status never showed gaps seen and filled; last status {last}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(entry["group"], group.as_str());
    assert_eq!(entry["device"], 0);
    let gap = entry["gap_seconds_total"].as_f64().unwrap();
    assert!(gap > 0.0, "{entry}");
    // The primary waits 3 ms between iterations: those are its gaps.
    let mean_gap_ms = 1e3 * gap / entry["gaps_seen"].as_f64().unwrap();
    assert!(
        (2.5..40.0).contains(&mean_gap_ms),
        "mean gap {mean_gap_ms:.2} ms: {entry}"
    );
    assert!(entry["primary_busy_seconds_total"].as_f64().unwrap() > 0.0);
    assert!(entry["primary_slowdown"].as_f64().is_some(), "{entry}");

    let text = status(&socket, false).expect("dilu status");
    let line = text
        .lines()
        .find(|l| l.starts_with("co-location gpu0") && l.contains(&primary))
        .unwrap_or_else(|| panic!("no co-location line for {primary}:\n{text}"));
    for part in ["gaps", "filled", "primary slowdown"] {
        assert!(line.contains(part), "{part:?} missing: {line}");
    }
}
