//! A bounded soak of the node manager: tenants come and go, some SIGKILLed
//! mid-run, the daemon is killed with SIGKILL and restarted, operators change
//! budgets, and hostile clients send garbage, oversize and trailing-byte
//! packets, idle connections and registration floods, all on Unix sockets.
//! Invariants are checked all along:
//! - admitted SM requests sum to at most 100% and memory budgets to at most
//!   the GPU's memory (`gpu_memory`),
//! - no live tenant process stays out of `dilu status` for longer than the
//!   unmanaged limit after its start or the daemon's return,
//! - the daemon's RSS and its mean control period stay under their bounds,
//! - nothing of the soak's is left in `/dev/shm` at the end.
//!
//! `soak` (the binary) and `tests/tests/soak.rs` (a short run) drive it;
//! `scripts/bench.sh soak` writes `bench/results/soak.md`.

use dilu_abi::node_wire::{self, FromDaemon, NodeStatus, PROTOCOL_VERSION, ToDaemon};
use dilu_abi::seqpacket;
use dilu_harness::workspace::{Scratch, artifact, dilu, output_within};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a soak does and the bounds it holds the daemon to.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    pub duration: Duration,
    /// Tenant slots kept busy (a slot's process is restarted when it ends).
    pub tenants: usize,
    pub seed: u64,
    /// The longest a live tenant process may stay out of `dilu status`
    /// after it started or the daemon came back.
    pub unmanaged_limit: Duration,
    pub max_rss_bytes: u64,
    /// Bound on the mean control period over each check window.
    pub max_period: Duration,
}

impl Default for SoakConfig {
    fn default() -> Self {
        SoakConfig {
            duration: Duration::from_secs(30),
            tenants: 4,
            seed: 1,
            unmanaged_limit: Duration::from_secs(15),
            max_rss_bytes: 512 << 20,
            max_period: Duration::from_millis(50),
        }
    }
}

/// What happened, and every invariant broken (empty: all held).
#[derive(Debug, Default)]
pub struct SoakReport {
    pub elapsed: Duration,
    pub events: BTreeMap<&'static str, u64>,
    pub violations: Vec<String>,
    pub max_rss_bytes: u64,
    pub max_period_ms: f64,
    pub max_tenants_listed: usize,
    pub max_sm_requested_pct: f64,
    pub max_mem_budgeted_bytes: u64,
    pub longest_unmanaged: Duration,
    /// The uid the hostile clients ran as, where not the tenants' own.
    pub hostile_uid: Option<u32>,
}

/// The simulated GPU's memory the daemon admits against.
const GPU_MEMORY: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const NOMINAL_PERIOD_MS: f64 = 5.0;

/// xorshift64*: reproducible choices from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Tenant {
    name: String,
    child: Child,
    started: Instant,
    /// The last time its pid was listed by the daemon.
    seen: Option<Instant>,
}

struct Soak {
    config: SoakConfig,
    scratch: Scratch,
    prefix: String,
    instance: String,
    daemon: Option<Child>,
    /// When the daemon last came back (or first answered).
    daemon_back: Instant,
    /// When a killed daemon is due to be restarted.
    restart_at: Option<Instant>,
    slots: Vec<Option<Tenant>>,
    generation: u64,
    rng: Rng,
    report: SoakReport,
    last_periods: Option<(Instant, u64, f64)>,
    /// Hostile clients run as another user, still holding connections.
    hostile_clients: Vec<Child>,
}

impl Soak {
    fn count(&mut self, event: &'static str) {
        *self.report.events.entry(event).or_default() += 1;
    }

    fn socket(&self) -> PathBuf {
        self.scratch.path("nodemgr.sock")
    }

    fn start_daemon(&mut self) {
        let child = Command::new(dilu())
            .arg("nodemgr")
            .arg("--config")
            .arg(self.scratch.path("nodemgr.toml"))
            .arg("--socket")
            .arg(self.socket())
            .arg("--run-dir")
            .arg(self.scratch.path("run"))
            .args(["--foreground", "--metrics", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dilu nodemgr");
        self.daemon = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.status().is_none() {
            if Instant::now() > deadline {
                self.report
                    .violations
                    .push("the daemon did not answer within 60 s of its start".into());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.daemon_back = Instant::now();
        self.last_periods = None;
    }

    fn status(&self) -> Option<NodeStatus> {
        dilu_abi::status_parts::fetch(&self.socket(), Duration::from_secs(10)).ok()
    }

    /// `dilu run --sim --tenant NAME FLAGS -- mem-probe` on the soak's
    /// daemon and simulated GPU, its input piped, its output dropped.
    fn tenant_command(&self, name: &str, flags: &[&str]) -> Command {
        let mut command = Command::new(dilu());
        command
            .args(["run", "--sim", "--tenant", name])
            .args(flags)
            .arg("--")
            .arg(artifact("mem-probe"))
            .env(node_wire::SOCKET_ENV, self.socket())
            .env("SIMGPU_INSTANCE", &self.instance)
            .env("DILU_CONTEXT_MEMORY", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    fn start_tenant(&mut self, slot: usize) {
        self.generation += 1;
        let name = format!("{}-{slot}-{}", self.prefix, self.generation);
        let mem = (32 + self.rng.below(8) * 32) * MIB;
        let request = self.rng.below(5) * 10;
        let mut command = self.tenant_command(
            &name,
            &[
                "--mem",
                &format!("{}MiB", mem / MIB),
                "--sm-request",
                &request.to_string(),
            ],
        );
        let Ok(mut child) = command.spawn() else {
            self.count("tenant failed to start");
            return;
        };
        // Its first allocation sets up its budget, and so registers it.
        if let Some(stdin) = child.stdin.as_mut() {
            let _ = writeln!(stdin, "alloc {}", MIB);
        }
        self.count("tenant started");
        self.slots[slot] = Some(Tenant {
            name,
            child,
            started: Instant::now(),
            seen: None,
        });
    }

    /// Restarts ended tenant processes; counts how they ended.
    fn reap(&mut self) {
        for slot in 0..self.slots.len() {
            let ended = match self.slots[slot].as_mut() {
                Some(t) => t.child.try_wait().ok().flatten(),
                None => None,
            };
            if let Some(status) = ended {
                self.count(match status.code() {
                    Some(0) => "tenant exited cleanly",
                    Some(2) => "tenant refused admission (exit 2)",
                    Some(_) => "tenant exited with another status",
                    None => "tenant ended by a signal",
                });
                self.slots[slot] = None;
            }
            if self.slots[slot].is_none() {
                self.start_tenant(slot);
            }
        }
    }

    fn kill_tenant(&mut self) {
        let slot = self.rng.below(self.slots.len() as u64) as usize;
        if let Some(t) = self.slots[slot].as_mut() {
            let _ = t.child.kill();
            self.count("tenant SIGKILLed");
        }
    }

    fn finish_tenant(&mut self) {
        let slot = self.rng.below(self.slots.len() as u64) as usize;
        if let Some(t) = self.slots[slot].as_mut() {
            drop(t.child.stdin.take());
            self.count("tenant asked to finish");
        }
    }

    fn kill_daemon(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
            self.count("daemon SIGKILLed");
            let down = Duration::from_millis(200 + self.rng.below(1800));
            self.restart_at = Some(Instant::now() + down);
        }
    }

    fn change_budget(&mut self) {
        let Some(name) = self.slots.iter().flatten().map(|t| t.name.clone()).next() else {
            return;
        };
        let mut command = Command::new(dilu());
        command.args(["set", &name, "--socket"]).arg(self.socket());
        if self.rng.below(2) == 0 {
            command.args(["--sm-request", &(self.rng.below(6) * 10).to_string()]);
        } else {
            command.args(["--mem", &format!("{}MiB", 32 + self.rng.below(12) * 32)]);
        }
        let output = output_within(command, Duration::from_secs(60));
        self.count(if output.status.success() {
            "budget changed"
        } else {
            "budget change refused"
        });
    }

    fn hostile(&mut self) {
        let kind = self.rng.below(HOSTILE_KINDS);
        let seed = self.rng.next();
        let prefix = format!("{}-hog{}", self.prefix, self.rng.next() % 1000);
        let socket = self.socket();
        let Some(uid) = hostile_uid() else {
            // Not root: the hostile client is this process, the tenants'
            // own uid.
            let (event, held, hold) = hostile_action(kind, &socket, &prefix, seed);
            std::thread::spawn(move || {
                std::thread::sleep(hold);
                drop(held);
            });
            self.count(event);
            return;
        };
        // Another user: this binary's hostile mode, run as that uid, says
        // what it did and holds its connections for their time.
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let child = Command::new(artifact("soak"))
            .arg("--hostile")
            .arg(kind.to_string())
            .arg("--socket")
            .arg(&socket)
            .args(["--prefix", &prefix, "--seed", &seed.to_string()])
            .uid(uid)
            .gid(uid)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let Ok(mut child) = child else {
            self.count("hostile: could not start as another user");
            return;
        };
        let line = child
            .stdout
            .take()
            .and_then(|out| std::io::BufReader::new(out).lines().next())
            .and_then(Result::ok)
            .unwrap_or_default();
        let event = HOSTILE_EVENTS
            .iter()
            .find(|e| **e == line)
            .copied()
            .unwrap_or("hostile: the other user's client said nothing");
        self.count(event);
        self.hostile_clients.push(child);
        self.hostile_clients
            .retain_mut(|c| matches!(c.try_wait(), Ok(None)));
    }

    /// Reads the status and checks the invariants on it.
    fn check(&mut self) {
        let daemon_pid = self.daemon.as_ref().map(|d| d.id());
        let Some(status) = self.status() else {
            return;
        };
        self.count("status checked");
        let now = Instant::now();
        let requested: f64 = status
            .tenants
            .iter()
            .map(|t| t.spec.sm_request.as_percent())
            .sum();
        let budgeted: u64 = status
            .tenants
            .iter()
            .filter_map(|t| t.spec.mem)
            .map(dilu_abi::units::Bytes::get)
            .sum();
        let r = &mut self.report;
        r.max_sm_requested_pct = r.max_sm_requested_pct.max(requested);
        r.max_mem_budgeted_bytes = r.max_mem_budgeted_bytes.max(budgeted);
        r.max_tenants_listed = r.max_tenants_listed.max(status.tenants.len());
        if requested > 100.0 + 1e-6 {
            r.violations
                .push(format!("SM requests sum to {requested}% of the GPU"));
        }
        if budgeted > GPU_MEMORY {
            r.violations.push(format!(
                "memory budgets sum to {} MiB on a {} MiB GPU",
                budgeted / MIB,
                GPU_MEMORY / MIB
            ));
        }
        if status.tenants.iter().any(|t| t.over_admitted.is_some()) {
            *r.events
                .entry("status checks listing an over-admitted tenant")
                .or_default() += 1;
        }
        let listed: Vec<i32> = status.tenants.iter().flat_map(|t| t.pids.clone()).collect();
        for t in self.slots.iter_mut().flatten() {
            if listed.contains(&(t.child.id() as i32)) {
                t.seen = Some(now);
                continue;
            }
            if t.child.try_wait().ok().flatten().is_some() {
                continue;
            }
            let since = [Some(t.started), Some(self.daemon_back), t.seen]
                .into_iter()
                .flatten()
                .max()
                .expect("started is always there");
            let out = now - since;
            r.longest_unmanaged = r.longest_unmanaged.max(out);
            if out > self.config.unmanaged_limit {
                r.violations.push(format!(
                    "tenant {} (pid {}) alive and not listed for {out:?}",
                    t.name,
                    t.child.id()
                ));
                // Said once per process.
                t.seen = Some(now);
            }
        }
        if let Some(pid) = daemon_pid
            && let Some(rss) = rss_bytes(pid)
        {
            r.max_rss_bytes = r.max_rss_bytes.max(rss);
            if rss > self.config.max_rss_bytes {
                r.violations.push(format!("daemon RSS {} MiB", rss / MIB));
            }
        }
        match self.last_periods {
            Some((at, periods, uptime)) if now - at >= Duration::from_secs(2) => {
                let ran = status.control_periods.saturating_sub(periods).max(1);
                let mean_ms = (status.uptime_seconds - uptime) * 1e3 / ran as f64;
                self.report.max_period_ms = self.report.max_period_ms.max(mean_ms);
                if mean_ms > self.config.max_period.as_secs_f64() * 1e3 {
                    self.report.violations.push(format!(
                        "mean control period {mean_ms:.1} ms over {:.1} s (nominal {NOMINAL_PERIOD_MS} ms)",
                        status.uptime_seconds - uptime
                    ));
                }
                self.last_periods = Some((now, status.control_periods, status.uptime_seconds));
            }
            Some(_) => {}
            None => self.last_periods = Some((now, status.control_periods, status.uptime_seconds)),
        }
    }

    /// Ends every tenant and the daemon, runs one clean tenant (its start
    /// sweeps what killed ones left), and checks `/dev/shm` for leftovers.
    fn finish(&mut self) {
        for t in self.slots.iter_mut().flatten() {
            let _ = t.child.kill();
            let _ = t.child.wait();
        }
        self.slots.clear();
        let mut command = self.tenant_command(&format!("{}-sweep", self.prefix), &[]);
        // Its first allocation sets up its ledger, sweeping what no
        // process holds; then it ends cleanly.
        let clean = command.spawn().ok().and_then(|mut child| {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = writeln!(stdin, "alloc {MIB}");
            }
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if let Some(status) = child.try_wait().ok().flatten() {
                    return Some(status.success());
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Some(false);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        if clean != Some(true) {
            self.report
                .violations
                .push("the final clean tenant did not run and end cleanly".into());
        }
        if let Some(mut daemon) = self.daemon.take() {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let mut left: Vec<PathBuf> = Vec::new();
        let dir = dilu_layout::user_region_dir(uid);
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().contains(&self.prefix) {
                left.push(entry.path());
            }
        }
        let instance = PathBuf::from(format!("/dev/shm/simgpu-{uid}-{}", self.instance));
        if instance.exists() {
            left.push(instance);
        }
        if !left.is_empty() {
            self.report
                .violations
                .push(format!("left in /dev/shm: {left:?}"));
            for path in &left {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// One registration over the socket as a hostile client; the connection
/// (held open: the tenant lives while it is) when admitted.
fn register(socket: &Path, tenant: &str) -> Option<std::os::fd::OwnedFd> {
    let connection = seqpacket::connect(socket, Some(Duration::from_secs(5))).ok()?;
    let request = node_wire::encode(&ToDaemon::Register {
        version: PROTOCOL_VERSION,
        tenant: tenant.into(),
        spec: None,
        reattach: false,
    })
    .ok()?;
    seqpacket::send(&connection, &request, &[]).ok()?;
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, _fds) = seqpacket::recv(&connection, &mut buffer).ok()?;
    match node_wire::decode::<FromDaemon>(&buffer[..n]).ok()? {
        FromDaemon::Registered { .. } => Some(connection),
        _ => None,
    }
}

/// The kinds of hostile client: a random packet, an oversize one, a
/// valid request with trailing bytes, 20 connections that never speak, a
/// flood of 100 registrations.
pub const HOSTILE_KINDS: u64 = 5;

/// What the report counts of a hostile client's visit.
pub const HOSTILE_EVENTS: [&str; 8] = [
    "hostile: random packet",
    "hostile: oversize packet, error reply",
    "hostile: oversize packet, no error reply",
    "hostile: trailing bytes, error reply",
    "hostile: trailing bytes, no error reply",
    "hostile: 20 idle connections",
    "hostile: flood of 100 registrations",
    "hostile: flood of 100 registrations, none admitted",
];

/// The uid the hostile clients run as, another user than the tenants':
/// only root can play one.
pub fn hostile_uid() -> Option<u32> {
    // SAFETY: geteuid has no preconditions.
    (unsafe { libc::geteuid() } == 0).then(|| 62_000 + std::process::id() % 1000)
}

/// One hostile client's visit of `kind` ([`HOSTILE_KINDS`]) to the daemon at
/// `socket`: what it came to ([`HOSTILE_EVENTS`]), and the connections it
/// holds and for how long.
pub fn hostile_action(
    kind: u64,
    socket: &Path,
    prefix: &str,
    seed: u64,
) -> (&'static str, Vec<std::os::fd::OwnedFd>, Duration) {
    let mut rng = Rng(seed.max(1));
    let answered = |bytes: &[u8]| -> bool {
        let Ok(connection) = seqpacket::connect(socket, Some(Duration::from_secs(5))) else {
            return false;
        };
        if seqpacket::send(&connection, bytes, &[]).is_err() {
            return false;
        }
        let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
        matches!(
            seqpacket::recv(&connection, &mut buffer)
                .ok()
                .and_then(|(n, _)| node_wire::decode::<FromDaemon>(&buffer[..n]).ok()),
            Some(FromDaemon::Error { .. })
        )
    };
    let none = (Vec::new(), Duration::ZERO);
    let (event, (held, hold)) = match kind {
        0 => {
            let len = 1 + rng.below(2000) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let _ = answered(&bytes);
            (HOSTILE_EVENTS[0], none)
        }
        1 => {
            let ok = answered(&vec![0xa5; seqpacket::MAX_MESSAGE + 1000]);
            (HOSTILE_EVENTS[if ok { 1 } else { 2 }], none)
        }
        2 => {
            let mut bytes = node_wire::encode(&ToDaemon::Status).unwrap();
            bytes.extend_from_slice(b"trailing");
            let ok = answered(&bytes);
            (HOSTILE_EVENTS[if ok { 3 } else { 4 }], none)
        }
        3 => {
            // Connections that never speak, held past the daemon's timeout.
            let held: Vec<_> = (0..20)
                .filter_map(|_| seqpacket::connect(socket, None).ok())
                .collect();
            (HOSTILE_EVENTS[5], (held, Duration::from_secs(3)))
        }
        _ => {
            // A registration flood, held a moment, then dropped.
            let held: Vec<_> = (0..100)
                .filter_map(|i| register(socket, &format!("{prefix}-{i}")))
                .collect();
            let event = HOSTILE_EVENTS[if held.is_empty() { 7 } else { 6 }];
            (event, (held, Duration::from_secs(1)))
        }
    };
    (event, held, hold)
}

fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs one soak; `progress` gets a line every few seconds.
pub fn run(config: SoakConfig, mut progress: impl FnMut(&str)) -> SoakReport {
    let scratch = Scratch::new("soak");
    std::fs::write(
        scratch.path("nodemgr.toml"),
        format!(
            "period_ms = {NOMINAL_PERIOD_MS}\ngpu_memory = \"{}MiB\"\n",
            GPU_MEMORY / MIB
        ),
    )
    .expect("write the soak's configuration");
    let tag = dilu_harness::workspace::unique_name("soak");
    let mut soak = Soak {
        slots: (0..config.tenants).map(|_| None).collect(),
        rng: Rng(config.seed.max(1)),
        prefix: tag.clone(),
        instance: tag,
        config,
        scratch,
        daemon: None,
        daemon_back: Instant::now(),
        restart_at: None,
        generation: 0,
        report: SoakReport::default(),
        last_periods: None,
        hostile_clients: Vec::new(),
    };
    let started = Instant::now();
    soak.start_daemon();
    let mut last_progress = Instant::now();
    while started.elapsed() < soak.config.duration {
        if let Some(at) = soak.restart_at
            && Instant::now() >= at
        {
            soak.restart_at = None;
            soak.start_daemon();
            soak.count("daemon restarted");
        }
        soak.reap();
        if soak.daemon.is_some() {
            match soak.rng.below(100) {
                0..=9 => soak.kill_tenant(),
                10..=14 => soak.finish_tenant(),
                15..=17 => soak.kill_daemon(),
                18..=27 => soak.change_budget(),
                28..=37 => soak.hostile(),
                _ => {}
            }
            soak.check();
        } else if soak.rng.below(4) == 0 {
            soak.kill_tenant();
        }
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            progress(&format!(
                "soak: {:.0} s of {:.0} s, {} events, {} violations",
                started.elapsed().as_secs_f64(),
                soak.config.duration.as_secs_f64(),
                soak.report.events.values().sum::<u64>(),
                soak.report.violations.len()
            ));
        }
        std::thread::sleep(Duration::from_millis(100 + soak.rng.below(150)));
    }
    if soak.daemon.is_none() {
        soak.start_daemon();
        soak.count("daemon restarted");
    }
    soak.check();
    soak.finish();
    for client in &mut soak.hostile_clients {
        let _ = client.kill();
        let _ = client.wait();
    }
    soak.report.hostile_uid = hostile_uid();
    soak.report.elapsed = started.elapsed();
    soak.report
}

/// The report as Markdown (what `bench/results/soak.md` holds).
pub fn markdown(config: &SoakConfig, report: &SoakReport, command: &str) -> String {
    let mut out = String::new();
    out.push_str("# Soak: tenants, daemon restarts and hostile clients\n\n");
    out.push_str(&format!(
        "Written by `{command}` (`tests/src/soak.rs`).\n\n"
    ));
    out.push_str(&format!(
        "Duration {:.0} s, {} tenant slots, seed {}, one simulated GPU ({} MiB admitted against), \
         control period {NOMINAL_PERIOD_MS} ms, {} build, default per-user caps ({}). \
         Each tenant asks for 32 to 256 MiB and an SM request of 0 to 40%; many are refused \
         admission by design.\n\n",
        report.elapsed.as_secs_f64(),
        config.tenants,
        config.seed,
        GPU_MEMORY / MIB,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        match report.hostile_uid {
            Some(uid) => format!(
                "the hostile clients run as uid {uid}, another user than the tenants', so their \
                 floods meet that user's `max_tenants_per_uid` and `max_connections_per_uid`"
            ),
            None => "the hostile clients run as the tenants' own uid (another needs root), so \
                     their floods meet `max_tenants_per_uid`"
                .to_string(),
        }
    ));
    out.push_str("## Events\n\n| event | count |\n|---|---:|\n");
    for (event, count) in &report.events {
        out.push_str(&format!("| {event} | {count} |\n"));
    }
    let held = |ok: bool| if ok { "held" } else { "BROKEN" };
    let unmanaged_ok = !report.violations.iter().any(|v| v.contains("not listed"));
    out.push_str("\n## Invariants\n\n| invariant | bound | worst seen | |\n|---|---|---|---|\n");
    out.push_str(&format!(
        "| admitted SM requests | ≤ 100% | {:.0}% | {} |\n",
        report.max_sm_requested_pct,
        held(report.max_sm_requested_pct <= 100.0 + 1e-6)
    ));
    out.push_str(&format!(
        "| admitted memory budgets | ≤ {} MiB | {} MiB | {} |\n",
        GPU_MEMORY / MIB,
        report.max_mem_budgeted_bytes / MIB,
        held(report.max_mem_budgeted_bytes <= GPU_MEMORY)
    ));
    out.push_str(&format!(
        "| a live tenant out of `dilu status` | ≤ {:.0} s after its start or the daemon's return | {:.1} s | {} |\n",
        config.unmanaged_limit.as_secs_f64(),
        report.longest_unmanaged.as_secs_f64(),
        held(unmanaged_ok)
    ));
    out.push_str(&format!(
        "| daemon RSS | ≤ {} MiB | {:.1} MiB | {} |\n",
        config.max_rss_bytes / MIB,
        report.max_rss_bytes as f64 / MIB as f64,
        held(report.max_rss_bytes <= config.max_rss_bytes)
    ));
    out.push_str(&format!(
        "| mean control period per ≥ 2 s window | ≤ {} ms | {:.1} ms | {} |\n",
        config.max_period.as_millis(),
        report.max_period_ms,
        held(report.max_period_ms <= config.max_period.as_secs_f64() * 1e3)
    ));
    let leak_ok = !report.violations.iter().any(|v| v.contains("/dev/shm"));
    out.push_str(&format!(
        "| files left in `/dev/shm` at the end | none | {} | {} |\n",
        if leak_ok { "none" } else { "some" },
        held(leak_ok)
    ));
    out.push_str(&format!(
        "\nMost tenants listed at once: {}.\n",
        report.max_tenants_listed
    ));
    if report.violations.is_empty() {
        out.push_str("\nEvery invariant held.\n");
    } else {
        out.push_str("\n## Violations\n\n");
        for v in &report.violations {
            out.push_str(&format!("- {v}\n"));
        }
    }
    out
}
