//! A node manager for a test: `dilu nodemgr` on a scratch directory's
//! private socket, started and asked for its status the way an operator
//! would (`dilu status --json`).

use crate::workspace::{Scratch, dilu, wait_until_serving};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Starts `dilu nodemgr` with control law `controller` on
/// `<scratch>/nodemgr.sock` (state under `<scratch>/run`, no metrics) and
/// waits up to a minute until it answers ([`wait_until_serving`]).
pub fn start(scratch: &Scratch, controller: &str) -> Child {
    start_configured(scratch, &format!("controller = \"{controller}\"\n"))
}

/// [`start`] with the configuration file `config` (TOML text).
pub fn start_configured(scratch: &Scratch, config: &str) -> Child {
    let mut daemon = spawn(Command::new(dilu()), scratch, config);
    wait_until_serving(
        &mut daemon,
        &scratch.path("nodemgr.sock"),
        Duration::from_secs(60),
    );
    daemon
}

/// Spawns `command` (`dilu`, or something that execs it) as `nodemgr` with
/// the configuration `config` written to `<scratch>/nodemgr.toml`, on
/// `<scratch>/nodemgr.sock`, state under `<scratch>/run`, no metrics, its
/// output discarded; does not wait for it to answer.
pub fn spawn(mut command: Command, scratch: &Scratch, config: &str) -> Child {
    let path = scratch.path("nodemgr.toml");
    std::fs::write(&path, config).unwrap();
    command
        .arg("nodemgr")
        .arg("--config")
        .arg(&path)
        .arg("--socket")
        .arg(scratch.path("nodemgr.sock"))
        .arg("--run-dir")
        .arg(scratch.path("run"))
        .args(["--foreground", "--metrics", ""])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dilu nodemgr")
}

/// The status of the node manager at `socket` (`dilu status --json`), or
/// `None` while it does not answer.
pub fn status(socket: &Path) -> Option<Value> {
    let output = Command::new(dilu())
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| serde_json::from_slice(&output.stdout).ok())
        .flatten()
}
