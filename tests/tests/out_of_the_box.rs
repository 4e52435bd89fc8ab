//! What a user who sets nothing meets: `dilu nodemgr` with each controller,
//! then programs under `dilu run` with only the documented flags. Each test
//! is one journey from issue reports: a tenant without an SM request runs
//! (and gets the idle device), `--sm` means something under a node manager,
//! a program started without `--tenant` is still managed, a share of 0 set on
//! purpose says why it waits, and mistakes stop before the program starts.

use dilu_abi::simtrace::busy_ns_by_pid;
use dilu_harness::workspace::{
    Scratch, artifact, dilu, output_within, read_trace, unique_name, wait_until_serving,
};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A node manager on a private socket, killed when dropped.
struct NodeManager {
    child: Child,
    socket: PathBuf,
}

impl NodeManager {
    /// Starts `dilu nodemgr` with `controller` (`None`: its default) and
    /// the configuration text `config`.
    fn start(scratch: &Scratch, controller: Option<&str>, config: &str) -> NodeManager {
        let socket = scratch.path("nodemgr.sock");
        std::fs::write(scratch.path("nodemgr.toml"), config).unwrap();
        let mut command = Command::new(dilu());
        command
            .arg("nodemgr")
            .arg("--config")
            .arg(scratch.path("nodemgr.toml"))
            .arg("--socket")
            .arg(&socket)
            .arg("--run-dir")
            .arg(scratch.path("run"))
            .args(["--metrics", ""]);
        if let Some(name) = controller {
            command.args(["--controller", name]);
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dilu nodemgr");
        wait_until_serving(&mut child, &socket, Duration::from_secs(60));
        NodeManager { child, socket }
    }

    fn status(&self) -> serde_json::Value {
        let output = Command::new(dilu())
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("dilu status");
        assert!(output.status.success(), "dilu status failed");
        serde_json::from_slice(&output.stdout).expect("status JSON")
    }

    /// Waits (generously: the machine may be loaded) until a tenant whose
    /// name starts with `prefix` satisfies `check`; returns its entry.
    fn wait_for(
        &self,
        prefix: &str,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = serde_json::Value::Null;
        loop {
            let status = self.status();
            if let Some(t) = status["tenants"].as_array().and_then(|ts| {
                ts.iter()
                    .find(|t| t["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            }) {
                if check(t) {
                    return t.clone();
                }
                last = t.clone();
            }
            assert!(Instant::now() < deadline, "{what}: last status {last}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NodeManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dilu run --sim RUN_ARGS -- PROGRAM ARGS` against the node manager at
/// `socket`, on simgpu instance `instance`.
fn dilu_run(socket: &PathBuf, instance: &str, run_args: &[&str], program: &str) -> Command {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim", "--socket"])
        .arg(socket)
        .args(run_args)
        .arg("--")
        .arg(artifact(program))
        .env("SIMGPU_INSTANCE", instance)
        .env_remove("DILU_TENANT")
        .env_remove("DILU_SM_LIMIT")
        .env_remove("DILU_NODEMGR_SOCKET");
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A deep-queue loop of 1 ms kernels for 2 s: alone it keeps the device
/// busy however loaded the machine's CPUs are.
const LOOP: [&str; 6] = ["--seconds", "2", "--blocks", "13200", "--depth", "32"];

/// The fraction of its run in which the loop kept the device busy, from
/// simgpu's trace.
fn device_busy(run: &mut Command, trace: &std::path::Path, what: &str) -> (f64, String) {
    run.args(LOOP).env("SIMGPU_TRACE", trace);
    let placeholder = Command::new("true");
    let command = std::mem::replace(run, placeholder);
    // It used to sit at share 0 for good: a hang fails here.
    let output = output_within(command, Duration::from_secs(90));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{what}: {stderr}");
    let records = read_trace(trace);
    let from = records.iter().map(|r| r.start_ns).min().unwrap();
    let to = records.iter().map(|r| r.end_ns).max().unwrap();
    let busy: u64 = busy_ns_by_pid(&records, from, to).values().sum();
    (busy as f64 / (to - from) as f64, stderr)
}

#[test]
fn a_tenant_without_an_sm_request_runs_and_gets_the_idle_device_under_every_controller() {
    let scratch = Scratch::new("ootb-alone");
    let mut alone = dilu_run(
        &scratch.path("no-daemon.sock"),
        &unique_name("ootb"),
        &[],
        "cudarc-loop",
    );
    let (alone, _) = device_busy(&mut alone, &scratch.path("alone.jsonl"), "alone");
    for controller in ["dilu", "dilu-colo", "dilu-rckm", "static"] {
        let scratch = Scratch::new("ootb-best-effort");
        let daemon = NodeManager::start(&scratch, Some(controller), "");
        let mut run = dilu_run(&daemon.socket, &unique_name("ootb"), &[], "cudarc-loop");
        let (managed, stderr) = device_busy(&mut run, &scratch.path("trace.jsonl"), controller);
        assert!(
            stderr.contains("running as tenant cudarc-loop-"),
            "{controller}: the default tenant is said: {stderr}"
        );
        println!(
            "{controller}: device busy {:.1}% (without a node manager {:.1}%)",
            managed * 100.0,
            alone * 100.0
        );
        assert!(
            managed > 0.8 * alone,
            "{controller}: alone with no request it gets the idle device ({:.1}% against {:.1}%)",
            managed * 100.0,
            alone * 100.0
        );
    }
}

/// Issue 47: a training loop without an SM request whose step ends in a
/// sync longer than the node manager's notion of a recent launch (50 ms)
/// waited, at every step start, for the next control period: waiting on its
/// own queued work, it looked quiet and was given share 0. A tenant in a
/// sync is at work: its launches after the sync never wait for tokens.
#[test]
fn a_training_loop_whose_steps_sync_long_on_its_own_work_never_waits_for_its_share() {
    let scratch = Scratch::new("ootb-long-sync");
    let tenant = unique_name("long-sync");
    let daemon = NodeManager::start(&scratch, None, "");
    // Steps of 8 kernels of 15 ms, then a sync of about 120 ms; 1 ms of
    // data loading between steps.
    let mut command = dilu_run(
        &daemon.socket,
        &unique_name("ootb"),
        &["--tenant", &tenant],
        "demo-tenant",
    );
    command
        .args([
            "train",
            "--seconds",
            "6",
            "--kernels",
            "8",
            "--load-ms",
            "1",
        ])
        .env("SIMGPU_KERNEL_COST", "busy=15ms");
    let mut program = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The tenant's wall time waiting for tokens, as the node manager reads
    // it while the loop runs: from 1 s after the tenant shows up (its first
    // launch may wait for a period, as any new tenant's) to the end.
    let mut first_seen = None;
    let mut window: Option<((Instant, f64), (Instant, f64))> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while program.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the training loop hung");
        let status = daemon.status();
        if let Some(t) = status["tenants"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["name"] == tenant.as_str()))
            && let Some(s) = t["throttled_seconds_total"].as_f64()
        {
            let now = Instant::now();
            let seen = *first_seen.get_or_insert(now);
            if now >= seen + Duration::from_secs(1) {
                let from = window.map_or((now, s), |(from, _)| from);
                window = Some((from, (now, s)));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = program.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let ((from, before), (to, after)) = window.expect("the tenant was listed for over 1 s");
    let seconds = (to - from).as_secs_f64();
    let waited_ms = (after - before) * 1e3;
    println!(
        "{report}: waited for tokens {waited_ms:.1} ms in {seconds:.1} s of steps with ~120 ms syncs"
    );
    assert!(seconds >= 1.0, "watched the loop for {seconds:.1} s only");
    // Before the fix every step (about 8 a second) waited for the next
    // control period: about 30 ms a second at the default 5 ms period.
    // Now none waits.
    assert!(
        waited_ms < 5.0 * seconds,
        "waited {waited_ms:.1} ms for tokens in {seconds:.1} s"
    );
}

#[test]
fn a_program_without_tenant_is_managed_and_sm_becomes_its_request_and_limit() {
    let scratch = Scratch::new("ootb-sm");
    let daemon = NodeManager::start(&scratch, None, "");
    let mut command = dilu_run(
        &daemon.socket,
        &unique_name("ootb"),
        &["--sm", "40"],
        "cudarc-loop",
    );
    command.args(["--seconds", "30"]);
    let mut program = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let entry = daemon.wait_for("cudarc-loop-", "listed with its --sm", |t| {
        t["spec"]["sm_request_pct"] == 40.0 && t["spec"]["sm_limit_pct"] == 40.0
    });
    let _ = program.kill();
    let _ = program.wait();
    println!("listed: {}", entry["name"]);

    // A per-device share cannot be a tenant's request: refused before the
    // program starts, with the flags to use.
    let output = dilu_run(
        &daemon.socket,
        &unique_name("ootb"),
        &["--sm", "0:30,1:50"],
        "cudarc-loop",
    )
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("--sm-request"),
        "{}",
        text(&output.stderr)
    );
    assert!(output.stdout.is_empty(), "the program did not start");
}

#[test]
fn a_share_of_zero_set_on_purpose_says_why_it_waits_and_runs_once_raised() {
    let scratch = Scratch::new("ootb-zero");
    let tenant = unique_name("zero");
    let daemon = NodeManager::start(
        &scratch,
        None,
        &format!("[tenants.{tenant}]\nsm_limit = 0\n"),
    );
    let mut command = dilu_run(
        &daemon.socket,
        &unique_name("ootb"),
        &["--tenant", &tenant],
        "cudarc-loop",
    );
    command.args(["--kernels", "200", "--seconds", "120"]);
    let program = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let entry = daemon.wait_for(&tenant, "shown as waiting", |t| t["waiting"] == true);
    assert_eq!(entry["sm_current_pct"], 0.0);
    let table = Command::new(dilu())
        .args(["status", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert!(
        text(&table.stdout).contains(&format!("waiting: {tenant} has SM share 0")),
        "{}",
        text(&table.stdout)
    );
    // Give the process time to say it (2 s of waiting), then release it.
    std::thread::sleep(Duration::from_millis(2500));
    let set = Command::new(dilu())
        .args(["set", &tenant, "--sm-limit", "50", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", text(&set.stderr));
    let started = Instant::now();
    let output = program.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "it ran once raised"
    );
    assert_eq!(
        stderr.matches("has an SM-time share of 0").count(),
        1,
        "said once, with the way out: {stderr}"
    );
    assert!(
        stderr.contains(&format!("dilu set {tenant} --sm-limit")),
        "{stderr}"
    );
}

/// `dilu run` with `args` and no node manager: it must stop before the
/// program, with exit 2 and a line containing `expected`.
fn refused_before_start(args: &[&str], expected: &str) -> Output {
    let marker = std::env::temp_dir().join(unique_name("ootb-started"));
    let mut command = Command::new(dilu());
    command
        .arg("run")
        .args(args)
        .arg("touch")
        .arg(&marker)
        .env("DILU_NODEMGR_SOCKET", "/nonexistent/dilu.sock");
    let output = command.output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(expected), "{args:?}: {stderr}");
    assert!(!marker.exists(), "{args:?}: the program started");
    output
}

#[test]
fn mistakes_stop_before_the_program_starts() {
    // A mistyped flag is a usage error, not the program.
    refused_before_start(&["--sim", "--mme", "2GiB", "--"], "--mme");
    refused_before_start(&["--sim", "--mem", "0", "--"], "--mem \"0\" is invalid");
    refused_before_start(&["--sim", "--mem", "lots", "--"], "50%");
    refused_before_start(&["--sim", "--sm", "0", "--"], "--sm \"0\" is invalid");
    refused_before_start(&["--sim", "--tenant", "..", "--"], "A-Z a-z 0-9");
    let long = "n".repeat(300);
    refused_before_start(&["--sim", "--tenant", &long, "--"], "300 characters");
    // The program's own flags after `--` (or after the program) are its own.
    let output = Command::new(dilu())
        .args(["run", "--sim", "--", "sh", "-c", "echo $0", "--mme"])
        .env("DILU_NODEMGR_SOCKET", "/nonexistent/dilu.sock")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).trim(), "--mme");
}

/// The nice value the program `dilu run` starts with `args` runs at (read
/// from its own /proc stat, field 19), and what dilu said.
fn nice_under(args: &[&str]) -> (i32, String) {
    let output = Command::new(dilu())
        .arg("run")
        .args(args)
        .args(["--", "sh", "-c", "cut -d' ' -f19 /proc/self/stat"])
        .env("DILU_NODEMGR_SOCKET", "/nonexistent/dilu.sock")
        .env_remove("DILU_COLO")
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    let nice = text(&output.stdout).trim().parse().unwrap();
    (nice, stderr)
}

#[test]
fn a_filler_runs_at_a_lower_cpu_priority_than_its_primary_unless_told_otherwise() {
    let own: i32 = std::fs::read_to_string("/proc/self/stat")
        .unwrap()
        .rsplit(") ")
        .next()
        .unwrap()
        .split(' ')
        .nth(16)
        .unwrap()
        .parse()
        .unwrap();
    // A primary and a tenant without a role keep what they inherit.
    assert_eq!(nice_under(&["--sim", "--colo", "primary"]).0, own);
    assert_eq!(nice_under(&["--sim"]).0, own);
    // Fillers get less of the host's CPU, offline ones least; a default
    // never raises a priority already lower.
    assert_eq!(nice_under(&["--sim", "--colo", "filler"]).0, own.max(19));
    assert_eq!(
        nice_under(&["--sim", "--colo", "online-filler"]).0,
        own.max(10)
    );
    // The flag says what it is. Raising a priority takes privilege, so a
    // process without it is told it runs at the one it has.
    let (nice, stderr) = nice_under(&["--sim", "--colo", "filler", "--cpu-nice", "0"]);
    if nice != 0 {
        assert_eq!(nice, own);
        assert!(
            stderr.contains("--cpu-nice (nice 0) is not applied"),
            "{stderr}"
        );
    }
    assert_eq!(nice_under(&["--sim", "--cpu-nice", "19"]).0, 19);
    refused_before_start(&["--sim", "--cpu-nice=-5", "--"], "0..=19");
    refused_before_start(&["--sim", "--cpu-nice", "20", "--"], "0..=19");
}

#[test]
fn flags_only_a_node_manager_reads_are_said_to_do_nothing_without_one() {
    let output = Command::new(dilu())
        .args(["run", "--sim", "--sm-request", "20", "--", "true"])
        .env("DILU_NODEMGR_SOCKET", "/nonexistent/dilu.sock")
        .output()
        .unwrap();
    assert!(output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--sm-request take effect only under a node manager"),
        "{stderr}"
    );
    // A primary's class comes with its role, and its SLO bounds its
    // tolerance without a node manager too: nothing to say.
    let output = Command::new(dilu())
        .args([
            "run", "--sim", "--colo", "primary", "--slo-ms", "8", "--", "true",
        ])
        .env("DILU_NODEMGR_SOCKET", "/nonexistent/dilu.sock")
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(output.stderr.is_empty(), "{}", text(&output.stderr));
    // `dilu set` takes no role: refused, not dropped.
    let output = Command::new(dilu())
        .args([
            "set",
            "x",
            "--colo",
            "filler",
            "--socket",
            "/nonexistent/dilu.sock",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("--colo and --profile are given to `dilu run`"));
}

#[test]
fn without_sim_and_without_a_driver_dilu_run_says_to_install_one_or_use_sim() {
    let output = Command::new(dilu())
        .args(["run", "--", "true"])
        .env("DILU_REAL_LIBCUDA", "/nonexistent/libcuda.so.1")
        .env("DILU_NODEMGR_SOCKET", "/nonexistent/dilu.sock")
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("no CUDA driver found") && stderr.contains("--sim"),
        "{stderr}"
    );
}

#[test]
fn the_daemon_states_its_defaults_and_honours_the_socket_variable() {
    let help = Command::new(dilu())
        .args(["nodemgr", "--help"])
        .output()
        .unwrap();
    let help = text(&help.stdout);
    for controller in ["dilu", "dilu-colo", "dilu-rckm", "static"] {
        assert!(help.contains(controller), "{controller} in: {help}");
    }
    for default in [
        "/run/dilu/nodemgr.sock",
        "[default: /run/dilu]",
        "[default: 127.0.0.1:9400]",
        "[default: 5]",
        "[default: dilu]",
        "/etc/dilu/nodemgr.toml",
    ] {
        assert!(help.contains(default), "{default} in: {help}");
    }

    // DILU_NODEMGR_SOCKET, which tenants and tools read, places the
    // daemon's socket too.
    let scratch = Scratch::new("ootb-socket-env");
    let socket = scratch.path("from-env.sock");
    std::fs::write(scratch.path("none.toml"), "").unwrap();
    let mut daemon = Command::new(dilu())
        .arg("nodemgr")
        .arg("--config")
        .arg(scratch.path("none.toml"))
        .arg("--run-dir")
        .arg(scratch.path("run"))
        .args(["--metrics", ""])
        .env("DILU_NODEMGR_SOCKET", &socket)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_serving(&mut daemon, &socket, Duration::from_secs(60));
    let _ = daemon.kill();
    let _ = daemon.wait();
}
