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

/// A unique name for per-test isolation (simgpu instances, files).
pub fn unique_name(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
