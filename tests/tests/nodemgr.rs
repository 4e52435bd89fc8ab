//! The node manager with real tenant processes on simgpu: budgets reach the
//! interposer (and the tenant cannot raise them), and a daemon killed under
//! load leaves its tenant running on its last budget until a new daemon
//! re-adopts it.

use dilu_harness::workspace::{Scratch, artifact, dilu, read_trace, unique_name};
use dilu_tests::probe::Probe;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Starts a daemon and waits until it answers: a tenant that starts before
/// the socket exists runs standalone for good (on a loaded machine the
/// daemon can be the slower of the two).
fn start_daemon(scratch: &Scratch, config: &Path) -> Child {
    let daemon = daemon_command(scratch, config)
        .args(["--foreground", "--metrics", ""])
        .stderr(Stdio::null())
        .spawn()
        .expect("start dilu nodemgr");
    let deadline = Instant::now() + Duration::from_secs(60);
    while status_json(scratch).is_none() {
        assert!(Instant::now() < deadline, "the daemon never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon
}

fn daemon_command(scratch: &Scratch, config: &Path) -> Command {
    let mut command = Command::new(dilu());
    command
        .arg("nodemgr")
        .arg("--config")
        .arg(config)
        .arg("--socket")
        .arg(scratch.path("nodemgr.sock"))
        .arg("--run-dir")
        .arg(scratch.path("run"))
        .stdout(Stdio::null());
    command
}

/// Starts a daemon with its metrics endpoint on a free port; returns it and
/// the address it logged when ready.
fn start_daemon_with_metrics(scratch: &Scratch, config: &Path) -> (Child, String) {
    let mut daemon = daemon_command(scratch, config)
        .args(["--metrics", "127.0.0.1:0"])
        .env("DILU_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dilu nodemgr");
    let mut log = BufReader::new(daemon.stderr.take().unwrap());
    let mut line = String::new();
    let address = loop {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "the daemon exited before it was ready"
        );
        if line.contains("node manager ready")
            && let Some(rest) = line.split("metrics=\"").nth(1)
        {
            break rest.split('"').next().unwrap().to_string();
        }
    };
    // Keep draining the log so the daemon never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    (daemon, address)
}

fn status_json(scratch: &Scratch) -> Option<serde_json::Value> {
    dilu_harness::node_manager::status(&scratch.path("nodemgr.sock"))
}

/// Waits (generously: the machine may be loaded) for the tenant to be
/// listed with a process, and returns its status entry.
fn wait_for_tenant(scratch: &Scratch, tenant: &str) -> serde_json::Value {
    wait_for_status(scratch, tenant, "the tenant never showed up", |_| true)
}

/// Waits for the tenant to be listed with a process and its status entry to
/// satisfy `check`; returns the entry.
fn wait_for_status(
    scratch: &Scratch,
    tenant: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = serde_json::Value::Null;
    loop {
        if let Some(status) = status_json(scratch)
            && let Some(t) = status["tenants"]
                .as_array()
                .and_then(|ts| ts.iter().find(|t| t["name"] == tenant))
            && t["pids"].as_array().is_some_and(|p| !p.is_empty())
        {
            if check(t) {
                return t.clone();
            }
            last = t.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{what} ({tenant}): last status {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for the daemon's saved state (what a restarted daemon re-adopts)
/// to name `tenant`.
fn wait_for_saved_state(scratch: &Scratch, tenant: &str) {
    let state = scratch.path("run").join("state.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&state).is_ok_and(|text| text.contains(tenant)) {
        assert!(
            Instant::now() < deadline,
            "the daemon never saved {tenant} in {}",
            state.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_daemon_leaves_tenants_on_their_budgets_and_a_new_one_readopts_them() {
    let scratch = Scratch::new("nodemgr-restart");
    let tenant = unique_name("train");
    let config = scratch.path("nodemgr.toml");
    std::fs::write(
        &config,
        format!(
            "controller = \"static\"\n[tenants.{tenant}]\nclass = \"batch\"\nsm_request = 40\nsm_limit = 100\n"
        ),
    )
    .unwrap();
    let mut daemon = start_daemon(&scratch, &config);
    let trace = scratch.path("trace.jsonl");
    let mut workload = Command::new(dilu())
        .args(["run", "--sim", "--tenant", &tenant, "--"])
        .arg(artifact("demo-tenant"))
        .args([
            "train",
            "--seconds",
            "6",
            "--blocks",
            "2640",
            "--kernels",
            "8",
            "--load-ms",
            "2",
        ])
        .env(
            dilu_abi::node_wire::SOCKET_ENV,
            scratch.path("nodemgr.sock"),
        )
        .env("SIMGPU_INSTANCE", unique_name("restart"))
        .env("SIMGPU_TRACE", &trace)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the tenant");

    // A new tenant starts at its limit; the static controller's next tick
    // (which may come after the first status on a busy machine) gives it
    // the request.
    let before = wait_for_status(
        &scratch,
        &tenant,
        "the static controller to give the request (40%)",
        |t| t["sm_current_pct"] == 40.0,
    );
    std::thread::sleep(Duration::from_millis(500));
    wait_for_saved_state(&scratch, &tenant);

    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let killed_at = dilu_layout::monotonic_ns();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        workload.try_wait().unwrap().is_none(),
        "the tenant keeps running without its daemon"
    );

    let mut daemon = start_daemon(&scratch, &config);
    let after = wait_for_tenant(&scratch, &tenant);
    let readopted_at = dilu_layout::monotonic_ns();
    assert_eq!(after["sm_current_pct"], 40.0, "the budget continues");
    assert_eq!(
        after["pids"], before["pids"],
        "the same process, re-adopted"
    );

    let output = workload.wait_with_output().unwrap();
    assert!(output.status.success(), "the tenant finished normally");
    daemon.kill().unwrap();
    daemon.wait().unwrap();

    // Device time around the outage: the tenant's largest gap between
    // kernels (its own data loading is 2 ms), and its share while the
    // daemon was down (the last budget, 40%, still applied).
    let kernels = read_trace(&trace);
    let mut ends: Vec<(u64, u64)> = kernels.iter().map(|k| (k.start_ns, k.end_ns)).collect();
    ends.sort();
    let largest_gap = ends
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1))
        .max()
        .unwrap_or(0);
    let busy_down: u64 = kernels
        .iter()
        .map(|k| {
            k.end_ns
                .min(readopted_at)
                .saturating_sub(k.start_ns.max(killed_at))
        })
        .sum();
    let share_down = busy_down as f64 / (readopted_at - killed_at) as f64;
    println!(
        "restart: largest gap between the tenant's kernels {:.1} ms; device share while the daemon was down {:.1}% (budget 40%)",
        largest_gap as f64 / 1e6,
        share_down * 100.0
    );
    assert!(
        kernels
            .iter()
            .any(|k| k.start_ns > killed_at && k.end_ns < readopted_at),
        "kernels ran while the daemon was down"
    );
    assert!(
        share_down < 0.6,
        "the 40% budget still held: {share_down:.2}"
    );
    assert!(
        largest_gap < 100_000_000,
        "the tenant stalled {:.1} ms around the restart",
        largest_gap as f64 / 1e6
    );
}

/// Starts `mem-probe` under `dilu run --sim RUN_ARGS` with the daemon at
/// `socket` (no context allowance, so budgets are what it allocates).
fn start_probe(socket: &Path, instance: &str, run_args: &[&str]) -> Probe {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim"])
        .args(run_args)
        .arg("--")
        .arg(artifact("mem-probe"))
        .env(dilu_abi::node_wire::SOCKET_ENV, socket)
        .env("SIMGPU_INSTANCE", instance)
        .env("DILU_CONTEXT_MEMORY", "0");
    Probe::spawn(command)
}

/// A daemon with the static controller on a GPU of 256 MiB: its
/// configuration file, its socket and the daemon.
fn start_static_daemon_of_256_mib(
    scratch: &Scratch,
) -> (std::path::PathBuf, std::path::PathBuf, Child) {
    let config = scratch.path("nodemgr.toml");
    std::fs::write(
        &config,
        "controller = \"static\"\ngpu_memory = \"256MiB\"\n",
    )
    .unwrap();
    let daemon = start_daemon(scratch, &config);
    (config, scratch.path("nodemgr.sock"), daemon)
}

/// `mem-probe` as tenant `tenant` with a 128 MiB budget, and what it says
/// on stderr (ready once it has exited).
fn start_probe_of_128_mib(socket: &Path, tenant: &str) -> (Probe, std::thread::JoinHandle<String>) {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim", "--tenant", tenant, "--mem", "128MiB", "--"])
        .arg(artifact("mem-probe"))
        .env(dilu_abi::node_wire::SOCKET_ENV, socket)
        .env("SIMGPU_INSTANCE", unique_name(tenant))
        .env("DILU_CONTEXT_MEMORY", "0")
        .stderr(Stdio::piped());
    let mut probe = Probe::spawn(command);
    let stderr = probe.child.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    (probe, said)
}

fn set_mem(scratch: &Scratch, tenant: &str, mem: &str) {
    let output = Command::new(dilu())
        .args(["set", tenant, "--mem", mem, "--socket"])
        .arg(scratch.path("nodemgr.sock"))
        .output()
        .expect("run dilu set");
    assert!(
        output.status.success(),
        "dilu set --mem {mem}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_daemons_memory_budget_binds_cannot_be_raised_by_the_tenant_and_changes_live() {
    let scratch = Scratch::new("nodemgr-mem");
    let tenant = unique_name("mem");
    let config = scratch.path("nodemgr.toml");
    std::fs::write(&config, "controller = \"static\"\n").unwrap();
    let mut daemon = start_daemon(&scratch, &config);
    // Under the daemon, `--mem` is the budget the tenant asks the daemon
    // for; the daemon writes it into the sealed region.
    let mut probe = start_probe(
        &scratch.path("nodemgr.sock"),
        &unique_name("mem"),
        &["--tenant", &tenant, "--mem", "64MiB"],
    );

    assert_eq!(
        probe.alloc(48 * MIB),
        "alloc 0",
        "48 MiB of a 64 MiB budget"
    );
    wait_for_status(&scratch, &tenant, "budget and usage listed", |t| {
        t["mem_budget_bytes"] == 64 * MIB && t["mem_used_bytes"] == 48 * MIB
    });

    // Everything the tenant can try from inside its own process.
    let raised: serde_json::Value =
        serde_json::from_str(&probe.ask("raise")).expect("the probe reports JSON");
    println!("attempts to raise the budget: {raised}");
    assert_eq!(
        raised["ledger"], "succeeded",
        "the ledger is the tenant's own file"
    );
    for attempt in ["mprotect", "store", "mmap"] {
        let result = raised[attempt].as_str().unwrap_or("missing");
        assert!(result.starts_with("refused"), "{attempt}: {result}");
    }
    // Reopening /proc/self/fd/N read-write may itself be refused; if it is
    // not, mapping or writing the reopened file must be.
    for attempt in ["reopen_mmap", "reopen_write"] {
        let result = raised[attempt].as_str().unwrap_or("refused (not tried)");
        assert!(result.starts_with("refused"), "{attempt}: {result}");
    }
    assert_eq!(
        probe.alloc(32 * MIB),
        format!("alloc {}", dilu_abi::cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "48 + 32 MiB is over the daemon's 64 MiB, whatever the ledger says"
    );

    // The operator raises it: the next allocation sees it.
    set_mem(&scratch, &tenant, "128MiB");
    assert_eq!(probe.alloc(32 * MIB), "alloc 0", "80 MiB of 128 MiB");
    wait_for_status(&scratch, &tenant, "the new budget listed", |t| {
        t["mem_budget_bytes"] == 128 * MIB && t["mem_used_bytes"] == 80 * MIB
    });
    // And lowers it below what is in use: nothing more is granted.
    set_mem(&scratch, &tenant, "64MiB");
    assert_eq!(
        probe.alloc(MIB),
        format!("alloc {}", dilu_abi::cuda::CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert_eq!(probe.ask("free"), "free 0");
    assert_eq!(probe.alloc(60 * MIB), "alloc 0", "freed memory is reusable");

    drop(probe.stdin);
    let status = probe.child.wait().unwrap();
    assert!(status.success(), "the probe exits cleanly: {status}");
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// Runs `dilu nodemgr` with `extra` flags until it is ready, stops it with
/// SIGTERM and returns its stderr. The process started is the one serving
/// (it never forks) and it exits 0.
fn daemon_log(scratch: &Scratch, extra: &[&str]) -> String {
    let config = scratch.path("empty.toml");
    std::fs::write(&config, "").unwrap();
    let socket = scratch.path("nodemgr.sock");
    let mut daemon = daemon_command(scratch, &config)
        .args(extra)
        .args(["--metrics", ""])
        .env("DILU_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dilu nodemgr");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Command::new(dilu())
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .map_or(true, |o| !o.status.success())
    {
        assert!(
            daemon.try_wait().unwrap().is_none(),
            "the daemon exited (or forked away) instead of serving"
        );
        assert!(Instant::now() < deadline, "the daemon never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let output = daemon.wait_with_output().unwrap();
    assert!(output.status.success(), "SIGTERM stops it cleanly");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_daemon_logs_for_journald_by_default_and_for_people_with_foreground() {
    let scratch = Scratch::new("nodemgr-log");
    let service = daemon_log(&scratch, &[]);
    println!("service mode:\n{service}");
    assert!(service.contains("dilu node manager ready"), "{service}");
    for line in service.lines() {
        let priority = line
            .strip_prefix('<')
            .and_then(|rest| rest.split_once('>'))
            .map(|(p, _)| p);
        assert!(
            matches!(priority, Some("3" | "4" | "6" | "7")),
            "every line starts with a syslog priority: {line:?}"
        );
        assert!(!line.contains('\x1b'), "no colour: {line:?}");
    }

    let foreground = daemon_log(&scratch, &["--foreground"]);
    println!("--foreground:\n{foreground}");
    assert!(
        foreground.contains("dilu nodemgr: listening on"),
        "a banner: {foreground}"
    );
    assert!(
        foreground
            .lines()
            .any(|l| l.contains("INFO") && l.starts_with(|c: char| c.is_ascii_digit())),
        "timestamped lines with their level: {foreground}"
    );
    assert!(
        !foreground.lines().any(|l| l.starts_with('<')),
        "{foreground}"
    );
}

/// The body of `GET path` from the daemon's HTTP endpoint.
fn http_get(address: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: dilu\r\n\r\n").unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.contains(" 200"), "{head}");
    body.to_string()
}

fn signal_for<'a>(signals: &'a serde_json::Value, tenant: &str) -> Option<&'a serde_json::Value> {
    signals.as_array()?.iter().find(|s| s["tenant"] == tenant)
}

#[test]
fn scale_signals_reach_the_api_metrics_and_top() {
    let scratch = Scratch::new("nodemgr-signals");
    let slow = unique_name("slow");
    let idle = unique_name("idle");
    let config = scratch.path("nodemgr.toml");
    // Short windows so the test need not wait the defaults (10 s, 300 s).
    std::fs::write(
        &config,
        "controller = \"static\"\nscale_out_after_s = 1\nscale_in_after_s = 1\n",
    )
    .unwrap();
    let (mut daemon, metrics) = start_daemon_with_metrics(&scratch, &config);
    let instance = unique_name("signals");
    let socket = scratch.path("nodemgr.sock");

    // A latency tenant held at its limit (10%) while its requests need ~40%
    // of the device: its queue grows and its p99 stays far over its 5 ms SLO.
    let mut slow_tenant = Command::new(dilu())
        .args(["run", "--sim", "--tenant", &slow])
        .args(["--class", "latency", "--slo-ms", "5"])
        .args(["--sm-request", "10", "--sm-limit", "10", "--"])
        .arg(artifact("demo-tenant"))
        .args(["serve", "--seconds", "120", "--blocks", "6600"])
        .args(["--kernels", "8", "--rate", "100", "--off-ms", "0"])
        .env(dilu_abi::node_wire::SOCKET_ENV, &socket)
        .env("SIMGPU_INSTANCE", &instance)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the latency tenant");
    // A tenant that registers and then never launches a kernel.
    let mut idle_probe = start_probe(&socket, &instance, &["--tenant", &idle]);
    assert_eq!(
        idle_probe.alloc(MIB),
        "alloc 0",
        "the idle tenant registered"
    );

    // Both recommendations, on the JSON API (generous: a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(90);
    let signals = loop {
        let signals: serde_json::Value =
            serde_json::from_str(&http_get(&metrics, "/api/signals")).expect("JSON signals");
        let out = signal_for(&signals, &slow).is_some_and(|s| s["advice"] == "ScaleOut");
        let idle_in = signal_for(&signals, &idle).is_some_and(|s| s["advice"] == "ScaleIn");
        if out && idle_in {
            break signals;
        }
        assert!(
            Instant::now() < deadline,
            "no scale-out for {slow} and scale-in for {idle}: {signals}\nstatus: {}",
            status_json(&scratch).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("signals: {signals}");
    let out = signal_for(&signals, &slow).unwrap();
    assert!(out["for_seconds"].as_f64().unwrap() >= 1.0, "{out}");
    assert!(
        out["reason"].as_str().unwrap().contains("SLO"),
        "says why: {out}"
    );
    assert!(
        signal_for(&signals, &idle).unwrap()["for_seconds"]
            .as_f64()
            .unwrap()
            >= 1.0
    );

    // The same on /metrics and in `dilu top` (a bounded, non-terminal run).
    let text = http_get(&metrics, "/metrics");
    for (tenant, advice) in [(&slow, "out"), (&idle, "in")] {
        // Labelled with the tenant's GPU too.
        let series = format!("tenant=\"{tenant}\",advice=\"{advice}\"}} 1");
        assert!(
            text.lines()
                .any(|l| l.starts_with("dilu_scale_recommendation{gpu=") && l.contains(&series)),
            "{series} missing from:\n{text}"
        );
    }
    let top = Command::new(dilu())
        .args(["top", "--iterations", "2", "--interval", "0.2", "--socket"])
        .arg(&socket)
        .output()
        .expect("run dilu top");
    assert!(top.status.success(), "dilu top exits after its refreshes");
    let table = String::from_utf8_lossy(&top.stdout);
    println!("dilu top:\n{table}");
    assert!(!table.contains('\x1b'), "no screen control off a terminal");
    assert_eq!(table.matches("TENANT").count(), 2, "two snapshots: {table}");
    for tenant in [&slow, &idle] {
        assert!(
            table.lines().any(|l| l.starts_with(tenant.as_str())),
            "{tenant} has a row: {table}"
        );
    }
    assert!(
        table.contains(&format!("recommendation: scale out {slow}"))
            && table.contains(&format!("recommendation: scale in {idle}")),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with(slow.as_str()))
        .unwrap();
    assert!(
        row.contains("latency") && row.contains("10%") && row.contains("/5 ms"),
        "class, limit and SLO: {row}"
    );

    slow_tenant.kill().unwrap();
    slow_tenant.wait().unwrap();
    drop(idle_probe.stdin);
    idle_probe.child.wait().unwrap();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// Issue 50: a tenant started while the daemon was down read the refused
/// connection as "no node manager" and was never managed: invisible to
/// `dilu status` and to admission, it took memory admitted tenants had been
/// promised. Now it runs on its own limits meanwhile, registers within
/// seconds of the daemon's return, and, as it no longer fits, is listed as
/// over-admitted and held to the memory that is left.
#[test]
fn a_tenant_started_while_the_daemon_is_down_is_managed_when_it_returns() {
    let scratch = Scratch::new("nodemgr-late");
    let (config, socket, mut daemon) = start_static_daemon_of_256_mib(&scratch);
    let early = unique_name("early");
    let mut admitted = start_probe(
        &socket,
        &unique_name("early"),
        &["--tenant", &early, "--mem", "192MiB"],
    );
    assert_eq!(admitted.alloc(MIB), "alloc 0");
    // Its first allocation waited for its registration, which the daemon
    // saved before answering: killed now, the daemon has it saved.
    daemon.kill().unwrap();
    let state = std::fs::read_to_string(scratch.path("run").join("state.json")).unwrap();
    assert!(state.contains(&early), "saved before answering: {state}");
    daemon.wait().unwrap();

    // The socket is there, nobody answers: the tenant starts on its own
    // 128 MiB and says so.
    let late = unique_name("late");
    let (mut probe, said) = start_probe_of_128_mib(&socket, &late);
    assert_eq!(
        probe.alloc(96 * MIB),
        "alloc 0",
        "its own 128 MiB meanwhile"
    );

    let mut daemon = start_daemon(&scratch, &config);
    let back = Instant::now();
    let listed = wait_for_status(&scratch, &late, "the late tenant registered", |t| {
        !t["over_admitted"].is_null()
    });
    let after = back.elapsed();
    println!("late tenant listed {after:?} after the daemon answered: {listed}");
    assert!(
        after < Duration::from_secs(20),
        "listed only after {after:?}"
    );
    assert_eq!(
        listed["mem_budget_bytes"],
        64 * MIB,
        "held to what the admitted tenant left"
    );
    let reason = listed["over_admitted"].as_str().unwrap();
    assert!(reason.contains("memory budgets would sum"), "{reason}");
    let table = Command::new(dilu())
        .args(["status", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains(&format!("over-admitted: {late}")),
        "dilu status names it: {table}"
    );
    assert_eq!(
        probe.alloc(MIB),
        format!("alloc {}", dilu_abi::cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "96 MiB held, 64 MiB left to it: nothing more"
    );
    // The admitted tenant keeps its promise.
    assert_eq!(admitted.alloc(128 * MIB), "alloc 0");

    probe.finish();
    admitted.finish();
    let stderr = said.join().unwrap();
    assert!(
        stderr.contains("registers when the node manager answers"),
        "it said what it runs under: {stderr}"
    );
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// A daemon that accepts connections but does not answer for a while (a
/// stalled or overloaded node) neither stops a tenant that starts then nor
/// leaves it unmanaged: the tenant starts on its own limits, says so, and
/// registers once the daemon answers.
#[test]
fn a_tenant_starting_while_the_daemon_stalls_runs_and_registers_when_it_answers() {
    let scratch = Scratch::new("nodemgr-stalled");
    let (_, socket, mut daemon) = start_static_daemon_of_256_mib(&scratch);
    let stalled = dilu_tests::stalled::stall(daemon.id());
    let tenant = unique_name("stalled");
    let (mut probe, said) = start_probe_of_128_mib(&socket, &tenant);
    assert_eq!(
        probe.alloc(96 * MIB),
        "alloc 0",
        "it runs on its own 128 MiB while the daemon stalls"
    );
    assert_eq!(
        probe.alloc(64 * MIB),
        format!("alloc {}", dilu_abi::cuda::CUDA_ERROR_OUT_OF_MEMORY),
        "and is held to them"
    );
    drop(stalled);
    let listed = wait_for_tenant(&scratch, &tenant);
    assert_eq!(listed["mem_budget_bytes"], 128 * MIB, "{listed}");
    assert!(
        listed["over_admitted"].is_null(),
        "it fits beside nobody: {listed}"
    );
    probe.finish();
    let stderr = said.join().unwrap();
    assert!(
        stderr.contains("registers when the node manager answers"),
        "it said what it runs under: {stderr}"
    );
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// Runs a training step loop (8 kernels of about 1 ms after 4 ms of data
/// loading) for 2 s as tenant `name`; returns, per step, how long its 8
/// launches took to return (ms), sorted.
fn step_launch_spreads(scratch: &Scratch, instance: &str, name: &str) -> Vec<f64> {
    let log = scratch.path(&format!("{name}.launches"));
    let status = Command::new(dilu())
        .args(["run", "--sim", "--tenant", name, "--class", "batch", "--"])
        .arg(artifact("demo-tenant"))
        .args([
            "train",
            "--seconds",
            "2",
            "--blocks",
            "13200",
            "--kernels",
            "8",
        ])
        .args(["--load-ms", "4", "--launch-log"])
        .arg(&log)
        .env(
            dilu_abi::node_wire::SOCKET_ENV,
            scratch.path("nodemgr.sock"),
        )
        .env("SIMGPU_INSTANCE", instance)
        .stdout(Stdio::null())
        .status()
        .expect("run the training tenant");
    assert!(status.success(), "the training tenant ran");
    let times: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let mut spreads: Vec<f64> = times
        .chunks_exact(8)
        .map(|step| (step[7] - step[0]) as f64 / 1e6)
        .collect();
    spreads.sort_by(f64::total_cmp);
    spreads
}

/// A batch tenant sharing its GPU with a latency tenant that has an SLO
/// keeps little work queued, so that the latency tenant, when it wakes,
/// does not wait for a whole training step on a time-sliced device: the 8
/// launches of a step, which go at once while the batch tenant has the GPU
/// to itself, are then spread over about the step's length.
#[test]
fn a_batch_tenant_beside_a_latency_tenant_keeps_a_short_queue() {
    let scratch = Scratch::new("nodemgr-queue");
    let config = scratch.path("nodemgr.toml");
    std::fs::write(&config, "").unwrap();
    let daemon = start_daemon(&scratch, &config);
    let instance = unique_name("queue");
    let alone = step_launch_spreads(&scratch, &instance, &unique_name("alone"));

    // A latency tenant with an SLO that rests (a request every few seconds).
    let serve = unique_name("serve");
    let mut latency_tenant = Command::new(dilu())
        .args(["run", "--sim", "--tenant", &serve])
        .args(["--class", "latency", "--slo-ms", "15", "--"])
        .arg(artifact("demo-tenant"))
        .args(["serve", "--seconds", "120", "--rate", "0.2"])
        .env(
            dilu_abi::node_wire::SOCKET_ENV,
            scratch.path("nodemgr.sock"),
        )
        .env("SIMGPU_INSTANCE", &instance)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the latency tenant");
    wait_for_tenant(&scratch, &serve);
    let beside = step_launch_spreads(&scratch, &instance, &unique_name("beside"));
    let _ = latency_tenant.kill();
    let _ = latency_tenant.wait();
    stop_daemon(daemon);

    let median = |v: &[f64]| v[v.len() / 2];
    println!(
        "a step's 8 launches took (median ms): alone {:.3} over {} steps, beside {:.3} over {}",
        median(&alone),
        alone.len(),
        median(&beside),
        beside.len()
    );
    assert!(
        median(&beside) >= 4.0,
        "beside the latency tenant a step's launches wait for its queue: median {} ms",
        median(&beside)
    );
    assert!(
        median(&alone) < median(&beside) / 2.0,
        "alone they go at once: median {} ms against {} ms",
        median(&alone),
        median(&beside)
    );
}

/// `dilu nodemgr --sim` sees the simulated GPU as tenants of `dilu run
/// --sim` do (simgpu's NVML, found beside simgpu, with no library path
/// given): it lists the device with its memory and admits memory budgets
/// by it. (Its audit on simgpu: the threat-model test of a tenant that
/// zeroes its ledger.)
#[test]
fn nodemgr_sim_admits_memory_budgets_by_the_simulated_gpu() {
    let scratch = Scratch::new("nodemgr-sim");
    let instance = unique_name("nodemgr-sim");
    let (daemon, status) = start_sim_daemon(
        &scratch,
        "controller = \"static\"\n",
        &[("SIMGPU_INSTANCE", &instance), ("SIMGPU_MEMORY", "1GiB")],
    );
    let gpu = &status["gpus"][0];
    assert_eq!(gpu["memory_total_bytes"], 1u64 << 30, "{status}");
    assert!(
        gpu["uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")),
        "the simulated GPU's identity: {status}"
    );

    let run = |tenant: &str, mem: &str| {
        let mut command = Command::new(dilu());
        command
            .args(["run", "--sim", "--tenant", tenant, "--mem", mem, "--"])
            .arg(artifact("mem-probe"))
            .env(
                dilu_abi::node_wire::SOCKET_ENV,
                scratch.path("nodemgr.sock"),
            )
            .env("SIMGPU_INSTANCE", &instance)
            .env("SIMGPU_MEMORY", "1GiB")
            .env("DILU_CONTEXT_MEMORY", "0")
            .env_remove("DILU_MEM_LIMIT");
        command
    };
    let first = unique_name("fits");
    let mut admitted = Probe::spawn(run(&first, "768MiB"));
    assert_eq!(admitted.alloc(512 * MIB), "alloc 0");
    wait_for_tenant(&scratch, &first);
    // Registration (and so admission) comes with the first CUDA call.
    let mut refused = run(&unique_name("too-much"), "512MiB")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = refused.stdin.take().unwrap();
    let _ = writeln!(input, "alloc {}", MIB);
    drop(input);
    let refused = refused.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("memory budgets would sum to 1.25 GiB on a 1.00 GiB GPU"),
        "{stderr}"
    );
    admitted.finish();
    stop_daemon(daemon);
}

/// A tenant process killed by SIGKILL (as vLLM kills its engine at
/// shutdown) cannot remove its co-location board (nor its quiet board);
/// the daemon sweeps what it left once it is gone, without waiting for
/// that user's next tenant.
#[test]
fn the_daemon_removes_the_boards_a_killed_tenant_process_left() {
    let scratch = Scratch::new("nodemgr-leftovers");
    let instance = unique_name("leftovers");
    let (daemon, _) = start_sim_daemon(&scratch, "", &[("SIMGPU_INSTANCE", &instance)]);
    let group = unique_name("leftover-group");
    // SAFETY: getuid has no preconditions.
    let board = dilu_layout::colocation::board_path(unsafe { libc::getuid() }, &group);
    let tenant = unique_name("engine");
    let mut engine = Command::new(dilu())
        .args([
            "run", "--sim", "--tenant", &tenant, "--colo", "filler", "--",
        ])
        .arg(artifact("demo-tenant"))
        .args([
            "train",
            "--seconds",
            "120",
            "--load-ms",
            "1",
            "--kernels",
            "2",
        ])
        .env(
            dilu_abi::node_wire::SOCKET_ENV,
            scratch.path("nodemgr.sock"),
        )
        .env("SIMGPU_INSTANCE", &instance)
        .env("DILU_COLO_GROUP", &group)
        .stdout(Stdio::null())
        .spawn()
        .expect("start demo-tenant");
    wait_for_tenant(&scratch, &tenant);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !board.exists() {
        assert!(
            Instant::now() < deadline,
            "the filler never opened its board {}",
            board.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    engine.kill().unwrap();
    engine.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while board.exists() {
        assert!(
            Instant::now() < deadline,
            "{} is still there 30 s after its only process was killed",
            board.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    stop_daemon(daemon);
}

/// Starts `dilu nodemgr --sim` (configuration `config`, environment `env`,
/// no library path of the test's) and waits until it answers; returns it
/// and its first status.
fn start_sim_daemon(
    scratch: &Scratch,
    config: &str,
    env: &[(&str, &str)],
) -> (Child, serde_json::Value) {
    let path = scratch.path("nodemgr.toml");
    std::fs::write(&path, config).unwrap();
    let mut daemon = daemon_command(scratch, &path)
        .args(["--sim", "--foreground", "--metrics", ""])
        .envs(env.iter().copied())
        .env_remove("LD_LIBRARY_PATH")
        .stderr(Stdio::null())
        .spawn()
        .expect("start dilu nodemgr --sim");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = status_json(scratch) {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    match status {
        Some(status) => (daemon, status),
        None => {
            let _ = daemon.kill();
            let _ = daemon.wait();
            panic!("the daemon never answered");
        }
    }
}

/// Stops a daemon as systemd does (SIGTERM), so that, as the simulated
/// node's last process, it removes the node's state from /dev/shm.
fn stop_daemon(daemon: Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let output = daemon.wait_with_output().unwrap();
    assert!(output.status.success(), "SIGTERM stops the daemon cleanly");
}
