//! Issue 15's threat model, finding by finding: a tenant (a process the
//! daemon admits, or one that speaks its protocol by hand) must never hurt
//! the root daemon or another tenant. Each test plays the hostile tenant
//! directly over the daemon's socket with dilu's own wire types, against a
//! real `dilu nodemgr` process (so a crash shows as the process dying).

use dilu_abi::node_wire::{self, FromDaemon, NodeStatus, PROTOCOL_VERSION, ToDaemon};
use dilu_abi::seqpacket;
use dilu_harness::workspace::{Scratch, dilu, unique_name};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `dilu nodemgr` child, killed when the test ends.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start(scratch: &Scratch, config: &str) -> Daemon {
        Daemon::start_with_descriptors(scratch, config, None)
    }

    /// A daemon whose soft and hard descriptor limits are `limit` (as
    /// under `ulimit -n`), when given.
    fn start_with_descriptors(scratch: &Scratch, config: &str, limit: Option<u32>) -> Daemon {
        let socket = scratch.path("nodemgr.sock");
        let command = match limit {
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(dilu());
                sh
            }
            None => Command::new(dilu()),
        };
        let child = dilu_harness::node_manager::spawn(command, scratch, config);
        let daemon = Daemon { child, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while daemon.status().is_none() {
            assert!(Instant::now() < deadline, "the daemon never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn status(&self) -> Option<NodeStatus> {
        status_at(&self.socket)
    }

    fn register(&self, tenant: &str, handed_back: &[i32]) -> (OwnedFd, FromDaemon, Vec<OwnedFd>) {
        register_at(&self.socket, tenant, handed_back)
    }
}

/// One status request over the socket (None if it failed).
fn status_at(socket: &Path) -> Option<NodeStatus> {
    dilu_abi::status_parts::fetch(socket, Duration::from_secs(30)).ok()
}

/// Registers a hand-made "process" of `tenant`, handing `fds` back as a
/// re-attaching process would. Returns the connection (the membership lasts
/// while it is open), what the daemon answered and the descriptors it sent.
fn register_at(
    socket: &Path,
    tenant: &str,
    handed_back: &[i32],
) -> (OwnedFd, FromDaemon, Vec<OwnedFd>) {
    let connection =
        seqpacket::connect(socket, Some(Duration::from_secs(30))).expect("connect to the daemon");
    let request = node_wire::encode(&ToDaemon::Register {
        version: PROTOCOL_VERSION,
        tenant: tenant.into(),
        spec: None,
        reattach: !handed_back.is_empty(),
    })
    .unwrap();
    seqpacket::send(&connection, &request, handed_back).expect("send the registration");
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, fds) = seqpacket::recv(&connection, &mut buffer).expect("an answer");
    let answer = node_wire::decode::<FromDaemon>(&buffer[..n]).expect("a valid answer");
    (connection, answer, fds)
}

fn memfd(name: &std::ffi::CStr) -> OwnedFd {
    // SAFETY: name is NUL-terminated; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0, "memfd_create");
    // SAFETY: raw is a fresh descriptor nobody else owns.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

fn truncate(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: ftruncate on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Finding 1: the telemetry memfd was handed out read-write and unsealed; a
/// tenant truncating it killed the daemon (SIGBUS on its next sample).
#[test]
fn a_tenant_that_truncates_its_telemetry_cannot_kill_the_daemon() {
    let scratch = Scratch::new("threat-truncate");
    let mut daemon = Daemon::start(&scratch, "period_ms = 5\n");
    let tenant = unique_name("trunc");
    let (_connection, answer, fds) = daemon.register(&tenant, &[]);
    assert!(
        matches!(answer, FromDaemon::Registered { .. }),
        "registered: {answer:?}"
    );
    assert_eq!(fds.len(), 2, "budget and telemetry descriptors");
    let truncated = truncate(&fds[1]);
    // Give the control loop many periods to read the region.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        daemon.alive(),
        "the daemon died after a tenant truncated its telemetry (ftruncate: {truncated:?})"
    );
    let status = daemon.status().expect("the daemon still answers");
    assert!(status.tenants.iter().any(|t| t.name == tenant));
    assert!(
        truncated.is_err(),
        "the telemetry's size is sealed (ftruncate must fail)"
    );
}

/// Finding 2 and 5: registration held the registry lock while it waited on
/// descriptors a re-attaching tenant handed back (up to 4 s), freezing the
/// control loop and every status answer. Now a stalled tenant delays only
/// its own registration.
#[test]
fn a_tenant_that_stalls_its_handed_back_fds_cannot_stall_the_control_loop() {
    let scratch = Scratch::new("threat-stall");
    let period_ms = 5.0;
    let daemon = Daemon::start(&scratch, &format!("period_ms = {period_ms}\n"));
    let tenant = unique_name("stall");
    // Empty memfds: a region that never becomes complete.
    let (budget, telemetry) = (memfd(c"stall-budget"), memfd(c"stall-telemetry"));
    let socket = daemon.socket.clone();
    let stalled_tenant = tenant.clone();
    let before = daemon.status().expect("status before");
    let window = Instant::now();
    let stalled = std::thread::spawn(move || {
        let handed_back = [budget.as_raw_fd(), telemetry.as_raw_fd()];
        let (connection, answer, _) = register_at(&socket, &stalled_tenant, &handed_back);
        (answer, connection)
    });
    // Status answers while the stalled registration is in the daemon.
    let mut slowest = Duration::ZERO;
    while window.elapsed() < Duration::from_secs(3) {
        let asked = Instant::now();
        assert!(daemon.status().is_some(), "status answered");
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = daemon.status().expect("status after");
    let elapsed = window.elapsed();
    let (answer, _helper) = stalled.join().unwrap();
    let expected = elapsed.as_secs_f64() * 1e3 / period_ms;
    let ran = (after.control_periods - before.control_periods) as f64;
    eprintln!(
        "periods: {ran} of {expected:.0} expected; slowest status answer {slowest:?}; stalled tenant got {answer:?}"
    );
    assert!(
        slowest < Duration::from_millis(1500),
        "a status request waited {slowest:?} behind a stalled tenant"
    );
    assert!(
        ran >= 0.25 * expected,
        "the control loop ran {ran} periods of {expected:.0} while a tenant stalled"
    );
    assert!(
        matches!(answer, FromDaemon::Registered { .. }),
        "the tenant is admitted with fresh regions: {answer:?}"
    );
}

/// Finding 1, the ledger too: the daemon mapped the tenant's ledger file,
/// which the tenant can truncate. It now reads a copy.
#[test]
fn a_tenant_that_truncates_its_ledger_cannot_kill_the_daemon() {
    use dilu_layout::ledger::TenantLedger;
    use dilu_layout::shm::Region;
    let scratch = Scratch::new("threat-ledger");
    let mut daemon = Daemon::start(&scratch, "period_ms = 5\n");
    let tenant = unique_name("ledger");
    let (_connection, answer, _fds) = daemon.register(&tenant, &[]);
    assert!(
        matches!(answer, FromDaemon::Registered { .. }),
        "{answer:?}"
    );
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let path = dilu_layout::tenant_region_path(uid, &tenant, "ledger");
    let budget = 64 << 20;
    drop(
        Region::<TenantLedger>::open_or_create(&path, 0o600, |l| l.set_budget(0, budget))
            .expect("create the tenant's ledger"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = daemon.status().expect("status");
        let seen = status
            .tenants
            .iter()
            .any(|t| t.name == tenant && t.mem_budget_bytes == Some(budget));
        if seen {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon never read the ledger"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(0))
        .expect("truncate the ledger");
    std::thread::sleep(Duration::from_millis(500));
    let answered = daemon.status().is_some();
    let _ = std::fs::remove_file(&path);
    assert!(
        daemon.alive() && answered,
        "the daemon died after a tenant truncated its ledger"
    );
}

/// Runs a tenant process under `dilu run --sim` as `uid` (None: as we are).
fn run_tenant(tenant: &str, instance: &str, uid: Option<u32>) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim", "--tenant", tenant, "--mem", "1GiB", "--"])
        .arg(dilu_harness::workspace::artifact("cudart-client"))
        .env("SIMGPU_INSTANCE", instance)
        .env_remove("DILU_MEM_LIMIT")
        .env_remove("DILU_TENANT")
        .env_remove("DILU_NODEMGR_SOCKET")
        .current_dir("/");
    if let Some(uid) = uid {
        command.uid(uid).gid(uid).env("HOME", "/");
    }
    dilu_harness::workspace::output_within(command, Duration::from_secs(120))
}

fn simgpu_instance_file(uid: u32, instance: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/simgpu-{uid}-{instance}"))
}

/// Finding 4: every run used to leave its ledger, SM and telemetry files
/// and its simulated GPU's state in /dev/shm. The last process out removes
/// them now.
#[test]
fn a_finished_tenant_leaves_no_files_behind() {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let tenant = unique_name("tidy");
    let instance = unique_name("tidy");
    let output = run_tenant(&tenant, &instance, None);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let left: Vec<PathBuf> = ["ledger", "sm", "telemetry"]
        .iter()
        .map(|kind| dilu_layout::tenant_region_path(uid, &tenant, kind))
        .chain([simgpu_instance_file(uid, &instance)])
        .filter(|path| path.exists())
        .collect();
    for path in &left {
        let _ = std::fs::remove_file(path);
    }
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A co-location process (`dilu run --colo`, no tenant needed) under
/// `dilu run --sim`, in co-location group `group`.
fn colo_filler(group: &str, instance: &str, seconds: &str) -> Command {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim", "--colo", "filler", "--"])
        .arg(dilu_harness::workspace::artifact("cudarc-loop"))
        .args(["--seconds", seconds])
        .env("SIMGPU_INSTANCE", instance)
        .env("DILU_COLO_GROUP", group)
        .env_remove("DILU_TENANT")
        .env_remove("DILU_NODEMGR_SOCKET")
        .current_dir("/");
    command
}

/// Co-location boards used to stay in /dev/shm for good: nobody removed a
/// board at exit, and only a named tenant's start swept the files of
/// killed processes. Now the last user removes its board, and the next
/// co-location process sweeps the boards killed ones left.
#[test]
fn co_location_boards_go_with_their_last_process_and_killed_ones_are_swept() {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let killed_group = unique_name("colo-killed");
    let killed_board = dilu_layout::colocation::board_path(uid, &killed_group);
    let instance = unique_name("colo-tidy");
    let mut killed = colo_filler(&killed_group, &instance, "60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dilu run");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !killed_board.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let board_seen = killed_board.exists();
    // `dilu run` execs the program: this kills the filler itself.
    let _ = killed.kill();
    let _ = killed.wait();
    assert!(
        board_seen,
        "the filler never opened {}",
        killed_board.display()
    );
    assert!(
        killed_board.exists(),
        "a killed process cannot remove its board"
    );

    let group = unique_name("colo-tidy");
    let board = dilu_layout::colocation::board_path(uid, &group);
    let output = dilu_harness::workspace::output_within(
        colo_filler(&group, &instance, "1"),
        Duration::from_secs(120),
    );
    let _ = std::fs::remove_file(simgpu_instance_file(uid, &instance));
    let left: Vec<&PathBuf> = [&killed_board, &board]
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    for path in &left {
        let _ = std::fs::remove_file(path);
    }
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Finding 4: another user could create a victim's region name first and
/// stop the victim's processes (exit 2). Now a squatted name is never used:
/// the victim's processes agree on a private directory no one can predict,
/// and say so in one line naming the squatted directory and its owner.
#[test]
fn a_name_squatted_by_another_user_does_not_stop_the_victim() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("needs root to play two users; skipped");
        return;
    }
    let victim = 61_000 + std::process::id() % 1000;
    let attacker = victim + 1000;
    let tenant = unique_name("victim");
    let instance = unique_name("victim");
    let cleanup = || {
        for entry in std::fs::read_dir("/dev/shm").unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("dilu-{victim}")) {
                let _ = std::fs::remove_dir_all(entry.path());
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let _ = std::fs::remove_file(simgpu_instance_file(victim, &instance));
    };
    cleanup();
    // What the attacker creates first: the victim's directory (and the
    // file name earlier versions used), open to all, owned by the attacker.
    let squatted = dilu_layout::user_region_dir(victim);
    std::fs::create_dir(&squatted).unwrap();
    std::fs::set_permissions(
        &squatted,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    std::os::unix::fs::chown(&squatted, Some(attacker), Some(attacker)).unwrap();
    let old_name = PathBuf::from(format!("/dev/shm/dilu-{victim}-{tenant}.ledger"));
    std::fs::write(&old_name, b"").unwrap();
    std::os::unix::fs::chown(&old_name, Some(attacker), Some(attacker)).unwrap();

    let output = run_tenant(&tenant, &instance, Some(victim));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let chosen = dilu_layout::user_region_dir(victim);
    let leftovers: Vec<_> = std::fs::read_dir(&chosen)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    cleanup();
    assert!(
        output.status.success(),
        "the victim's process failed (status {:?}): {stderr}",
        output.status.code()
    );
    assert_ne!(chosen, squatted, "the victim uses a directory of its own");
    let line = stderr
        .lines()
        .find(|l| l.contains(&squatted.display().to_string()))
        .unwrap_or_else(|| panic!("no line names the squatted directory: {stderr}"));
    assert!(line.contains(&format!("uid {attacker}")), "{line}");
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");
}

/// Finding 3: the memory budget counts in a ledger the tenant writes. A
/// tenant that zeroes it allocates past its budget; the daemon's audit of
/// real per-process usage (NVML, here simgpu's: `dilu nodemgr --sim`)
/// catches it and, configured to, kills it.
#[test]
fn the_audit_catches_a_tenant_that_zeroes_its_ledger() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::process::ExitStatusExt;
    const MIB: u64 = 1 << 20;
    let scratch = Scratch::new("threat-audit");
    let tenant = unique_name("cheat");
    let instance = unique_name("audit");
    let config = scratch.path("nodemgr.toml");
    std::fs::write(
        &config,
        format!(
            "audit = \"kill\"\naudit_slack = \"1MiB\"\ncontroller = \"static\"\n[tenants.{tenant}]\nmem = \"32MiB\"\n"
        ),
    )
    .unwrap();
    let socket = scratch.path("nodemgr.sock");
    let daemon_child = Command::new(dilu())
        .args(["nodemgr", "--sim"])
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(&socket)
        .arg("--run-dir")
        .arg(scratch.path("run"))
        .args(["--foreground", "--metrics", ""])
        .env("SIMGPU_INSTANCE", &instance)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dilu nodemgr");
    let daemon = Daemon {
        child: daemon_child,
        socket: socket.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while daemon.status().is_none() {
        assert!(Instant::now() < deadline, "the daemon never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut probe = Command::new(dilu())
        .args(["run", "--sim", "--tenant", &tenant, "--"])
        .arg(dilu_harness::workspace::artifact("mem-probe"))
        .env(node_wire::SOCKET_ENV, &socket)
        .env("SIMGPU_INSTANCE", &instance)
        .env("DILU_CONTEXT_MEMORY", "0")
        .env_remove("DILU_MEM_LIMIT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start mem-probe");
    let mut input = probe.stdin.take().unwrap();
    let mut output = BufReader::new(probe.stdout.take().unwrap());
    let mut ask = |command: &str| {
        writeln!(input, "{command}").unwrap();
        input.flush().unwrap();
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    };
    let chunk = 24 * MIB;
    assert_eq!(ask(&format!("alloc {chunk}")), "alloc 0");
    assert_eq!(
        ask(&format!("alloc {chunk}")),
        "alloc 2",
        "the budget holds an honest tenant"
    );
    assert!(
        ask("zero").starts_with("zero "),
        "the tenant zeroed its ledger"
    );
    assert_eq!(
        ask(&format!("alloc {chunk}")),
        "alloc 0",
        "with its ledger zeroed the tenant gets past its budget"
    );
    // 48 MiB held on a 32 MiB budget: the audit (every second) must act.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = probe.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let audited = daemon.status().and_then(|s| {
        s.tenants
            .iter()
            .find(|t| t.name == tenant)
            .and_then(|t| t.mem_audited_bytes)
    });
    let _ = probe.kill();
    let _ = probe.wait();
    let status = status.unwrap_or_else(|| {
        panic!("the over-budget tenant still runs 30 s later (audited: {audited:?})")
    });
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the audit kills the tenant ({status:?})"
    );
}

/// Registers as the hostile user of the test below when it runs this test
/// binary as another uid (`THREAT_MODEL_HOG_SOCKET` set); otherwise nothing.
/// Asks for `THREAT_MODEL_HOG_COUNT` registrations: first as many tenants,
/// then (past half) as more processes of one tenant; prints what it got and
/// holds every admitted connection until its stdin closes.
#[test]
fn hog_registrations_as_another_user_when_asked() {
    let Some(socket) = std::env::var_os("THREAT_MODEL_HOG_SOCKET") else {
        return;
    };
    let count: usize = std::env::var("THREAT_MODEL_HOG_COUNT")
        .unwrap()
        .parse()
        .unwrap();
    let mut held = Vec::new();
    let mut refusals = Vec::new();
    for i in 0..count {
        let tenant = if i < count / 2 {
            format!("hog-{i}")
        } else {
            "hog-0".to_string()
        };
        let (connection, answer, fds) = register_at(Path::new(&socket), &tenant, &[]);
        match answer {
            FromDaemon::Registered { .. } => held.push((connection, fds)),
            FromDaemon::Refused { reason } => refusals.push(reason),
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let tenant_cap = refusals
        .iter()
        .filter(|r| r.contains("max_tenants_per_uid"))
        .count();
    let connection_cap = refusals
        .iter()
        .filter(|r| r.contains("max_connections_per_uid"))
        .count();
    println!(
        "HOG held={} refused={} tenant_cap={tenant_cap} connection_cap={connection_cap} other={:?}",
        held.len(),
        refusals.len(),
        refusals.iter().find(|r| !r.contains("_per_uid"))
    );
    use std::io::Read;
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Issue 50: any local user could lock every tenant out. Under the unit
/// file's old descriptor limit (1024), one user holding about 1,100
/// registrations made every new registration fail ("Too many open
/// files"). Now each user is held to `max_connections_per_uid` and
/// `max_tenants_per_uid`, and another user's tenant registers and gets its
/// budget beside 1,100 hostile registrations.
#[test]
fn one_user_holding_1100_registrations_does_not_lock_another_user_out() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("needs root to play two users; skipped");
        return;
    }
    let hostile = 62_000 + std::process::id() % 1000;
    let scratch = Scratch::new("threat-hog");
    let mut daemon = Daemon::start_with_descriptors(&scratch, "period_ms = 5\n", Some(1024));
    let mut hog = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hog_registrations_as_another_user_when_asked",
            "--nocapture",
        ])
        .env("THREAT_MODEL_HOG_SOCKET", &daemon.socket)
        .env("THREAT_MODEL_HOG_COUNT", "1100")
        .uid(hostile)
        .gid(hostile)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the hostile user's process");
    let mut lines = std::io::BufReader::new(hog.stdout.take().unwrap()).lines();
    let report = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("HOG "))
        .expect("the hostile process reports what it got");
    eprintln!("{report}");
    // While the hostile user holds everything it was given:
    let tenant = unique_name("victim");
    let (_connection, answer, fds) = daemon.register(&tenant, &[]);
    let status = daemon.status();
    let alive = daemon.alive();
    drop(hog.stdin.take());
    // Read its harness's closing lines too: a closed pipe made it print
    // "error: io error when listing tests" into the test log.
    lines.for_each(drop);
    let _ = hog.wait();
    assert!(
        matches!(answer, FromDaemon::Registered { .. }) && fds.len() == 2,
        "the other user's tenant was not admitted: {answer:?}"
    );
    assert!(alive, "the daemon died");
    let status = status.expect("status answers beside the hostile user");
    assert!(status.tenants.iter().any(|t| t.name == tenant));
    let hostile_tenants = status.tenants.iter().filter(|t| t.uid == hostile).count();
    assert_eq!(hostile_tenants, 128, "max_tenants_per_uid's default");
    assert!(
        report.contains("held=512 "),
        "max_connections_per_uid's default: {report}"
    );
    assert!(report.contains("other=None"), "{report}");
}

/// Issue 50: from about 740 registered tenants the status reply was larger
/// than a message, and `dilu status` and `top` failed. Now it comes in
/// parts and `dilu status` lists every tenant beside 1,000 idle ones.
#[test]
fn dilu_status_lists_every_tenant_beside_1000_idle_ones() {
    raise_own_descriptor_limit();
    let scratch = Scratch::new("threat-many");
    let daemon = Daemon::start(
        &scratch,
        "period_ms = 5\nmax_tenants_per_uid = 2000\nmax_connections_per_uid = 2000\n",
    );
    let prefix = unique_name("idle");
    let started = Instant::now();
    let mut held = Vec::new();
    for i in 0..1000 {
        let (connection, answer, _fds) = daemon.register(&format!("{prefix}-{i:04}"), &[]);
        assert!(
            matches!(answer, FromDaemon::Registered { .. }),
            "tenant {i}: {answer:?}"
        );
        held.push(connection);
    }
    eprintln!("registered 1000 in {:?}", started.elapsed());
    let asked = Instant::now();
    let output = dilu_harness::workspace::output_within(
        {
            let mut command = Command::new(dilu());
            command.arg("status").arg("--socket").arg(&daemon.socket);
            command
        },
        Duration::from_secs(60),
    );
    eprintln!("dilu status answered in {:?}", asked.elapsed());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "dilu status failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = stdout.lines().filter(|l| l.starts_with(&prefix)).count();
    assert_eq!(listed, 1000, "tenants listed by dilu status");
    // The one-message request says why it cannot answer, rather than closing.
    let connection = seqpacket::connect(&daemon.socket, Some(Duration::from_secs(30))).unwrap();
    seqpacket::send(
        &connection,
        &node_wire::encode(&ToDaemon::Status).unwrap(),
        &[],
    )
    .unwrap();
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, _) = seqpacket::recv(&connection, &mut buffer).unwrap();
    match node_wire::decode::<FromDaemon>(&buffer[..n]).unwrap() {
        FromDaemon::Error { reason } => assert!(reason.contains("in parts"), "{reason}"),
        other => panic!("expected an error naming the parts, got {other:?}"),
    }
}

/// This test process's soft descriptor limit to its hard one (a test that
/// holds a thousand connections).
fn raise_own_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on an rlimit we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Issue 50, strict wire: a packet over the message size was closed without
/// a word, and bytes after a valid message were accepted. Both now get an
/// error reply that says why, and the daemon keeps serving.
#[test]
fn oversize_and_trailing_bytes_get_an_error_reply() {
    let scratch = Scratch::new("threat-wire");
    let mut daemon = Daemon::start(&scratch, "period_ms = 5\n");
    let ask = |bytes: &[u8]| -> FromDaemon {
        let connection = seqpacket::connect(&daemon.socket, Some(Duration::from_secs(30))).unwrap();
        seqpacket::send(&connection, bytes, &[]).expect("the packet is sent");
        let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
        let (n, _) = seqpacket::recv(&connection, &mut buffer).expect("an answer, not a reset");
        assert!(n > 0, "the daemon closed without a reply");
        node_wire::decode::<FromDaemon>(&buffer[..n]).expect("a valid answer")
    };
    let oversize = vec![0u8; seqpacket::MAX_MESSAGE + 4096];
    match ask(&oversize) {
        FromDaemon::Error { reason } => assert!(reason.contains("larger than"), "{reason}"),
        other => panic!("oversize: {other:?}"),
    }
    let mut trailing = node_wire::encode(&ToDaemon::Status).unwrap();
    trailing.extend_from_slice(b"and more");
    match ask(&trailing) {
        FromDaemon::Error { reason } => assert!(reason.contains("after the end"), "{reason}"),
        other => panic!("trailing bytes: {other:?}"),
    }
    assert!(daemon.alive());
    assert!(daemon.status().is_some(), "the daemon still answers");
}

/// Issue 50: instance files of simulated GPUs whose processes were all
/// killed stayed in /dev/shm for good. A simgpu process's start now removes
/// this user's instance files no process holds, and only those.
#[test]
fn instance_files_of_killed_runs_are_removed_at_the_next_start() {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let stale = simgpu_instance_file(uid, &unique_name("killed"));
    std::fs::write(&stale, vec![0u8; 4096]).unwrap();
    let in_use = simgpu_instance_file(uid, &unique_name("in-use"));
    std::fs::write(&in_use, vec![0u8; 4096]).unwrap();
    let holder = std::fs::File::open(&in_use).unwrap();
    // SAFETY: flock on a descriptor we own (as every user of an instance holds it).
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_SH) }, 0);
    let output = run_tenant(&unique_name("sweeper"), &unique_name("sweeper"), None);
    let (stale_left, in_use_left) = (stale.exists(), in_use.exists());
    let _ = std::fs::remove_file(&stale);
    let _ = std::fs::remove_file(&in_use);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!stale_left, "the unheld instance file was left");
    assert!(in_use_left, "an instance file in use was removed");
}
