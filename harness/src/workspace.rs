//! Locating the workspace's build outputs from a test or benchmark binary.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo profile directory (`target/debug` or `target/release`) that
/// holds the currently running test binary (`target/<profile>/deps/<test>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe has a parent").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Path of an artifact in the profile directory, failing with a clear
/// message when it has not been built.
pub fn artifact(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the whole workspace first (`cargo build --workspace`, or scripts/test.sh)",
        path.display()
    );
    path
}

/// The `dilu` CLI binary.
pub fn dilu() -> PathBuf {
    artifact("dilu")
}

/// Builds a `Command` that runs `program args` under `dilu run [--sim]`.
pub fn dilu_run(sim: bool, program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(dilu());
    command.arg("run");
    if sim {
        command.arg("--sim");
    }
    command.arg("--").arg(program).args(args);
    command
}

/// A unique name for per-test isolation (simgpu instances, tenants,
/// files): the tag, this process's id, a counter, and when this process
/// first asked. The id alone repeats: where process ids wrap at 32768, a
/// long session's builds and tests reach an id again, and a name an
/// earlier run used may still name its shared-memory files.
pub fn unique_name(tag: &str) -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static STARTED: OnceLock<u32> = OnceLock::new();
    // Microseconds since the epoch, 24 bits: repeats every 4.7 hours, and
    // only together with the same process id does a name repeat.
    let started = *STARTED.get_or_init(|| {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        (since_epoch.as_micros() & 0xff_ffff) as u32
    });
    format!(
        "{tag}-{}-{}-{started:06x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The UUID text (`GPU-…`, as NVML and `nvidia-smi -L` show it) of simgpu's
/// physical device `phys` of `instance`: "simgpu", an FNV-1a hash of the
/// instance name, the device index (simgpu/src/identity.rs), written here
/// again so that tests check what simgpu answers rather than reuse it.
pub fn simgpu_uuid(instance: &str, phys: u16) -> String {
    let hash = instance.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut bytes = Vec::with_capacity(16);
    bytes.extend_from_slice(b"simgpu");
    bytes.extend_from_slice(&hash.to_le_bytes());
    bytes.extend_from_slice(&phys.to_le_bytes());
    let mut text = String::from("GPU-");
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        text.push_str(&format!("{b:02x}"));
    }
    text
}

/// Runs a command to completion, killing it if it outlives `limit` (a hung
/// child must fail the test, not the CI run). Stdout and stderr are captured
/// (read while it runs, so a long output cannot fill the pipe and stall it).
pub fn output_within(mut command: Command, limit: std::time::Duration) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let started = std::time::Instant::now();
    let mut killed = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > limit && !killed {
            let _ = child.kill();
            killed = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    if killed {
        panic!(
            "command ran past {limit:?} and was killed\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

/// Waits until the node manager `daemon` at `socket` answers `dilu status`
/// (a tenant started before that would run without it). Panics if the
/// daemon exits first or `limit` passes.
pub fn wait_until_serving(
    daemon: &mut std::process::Child,
    socket: &Path,
    limit: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + limit;
    while !Command::new(dilu())
        .args(["status", "--socket"])
        .arg(socket)
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            daemon.try_wait().unwrap().is_none(),
            "the node manager exited before it served"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the node manager never answered at {}",
            socket.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A scratch directory removed when dropped (kept, and named on stderr,
/// where `DILU_KEEP_SCRATCH` is set: to read a benchmark run's traces).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("dilu-test-{}", unique_name(tag)));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("DILU_KEEP_SCRATCH").is_some() {
            eprintln!("scratch kept: {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Reads a simgpu trace file, failing the test on any malformed line.
pub fn read_trace(path: &Path) -> Vec<dilu_abi::simtrace::KernelRecord> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read trace {}: {e}", path.display()));
    dilu_abi::simtrace::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}
