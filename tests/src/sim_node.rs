//! A simulated multi-GPU node for end-to-end tests: one simgpu instance
//! with N GPUs and `dilu nodemgr --sim` (simgpu's simulated NVML) on a
//! private socket; helpers to start tenants with `dilu run` and to wait on
//! the daemon's status.

use crate::probe::Probe;
use dilu_harness::workspace::{Scratch, artifact, dilu, unique_name};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A node manager a test started: killed and reaped when dropped.
pub struct Daemon(Child);

impl std::ops::Deref for Daemon {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Already ended where the test stopped it: both calls then fail.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The simulated node every process of one test shares.
pub struct Node {
    scratch: Scratch,
    instance: String,
    /// More environment for every process of the node (e.g. `SIMGPU_MEMORY`).
    pub env: Vec<(String, String)>,
}

impl Node {
    pub fn new(tag: &str) -> Node {
        Node {
            scratch: Scratch::new(tag),
            instance: unique_name(tag),
            env: Vec::new(),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.scratch.path("nodemgr.sock")
    }

    /// A process on this node's simulated GPUs.
    pub fn command(&self, program: &Path, gpus: u32) -> Command {
        let mut command = Command::new(program);
        command
            .env("SIMGPU_INSTANCE", &self.instance)
            .env("SIMGPU_DEVICES", gpus.to_string())
            .env(dilu_abi::node_wire::SOCKET_ENV, self.socket())
            .env_remove("CUDA_VISIBLE_DEVICES")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Starts the node manager (control law `controller`) and waits until
    /// it lists `gpus` GPUs. It is killed when the handle is dropped, so a
    /// test that fails leaves no daemon behind (one left running after a
    /// failed test cost later benchmarks on the same machine their
    /// timings).
    pub fn start_daemon(&self, gpus: u32, controller: &str) -> Daemon {
        let config = self.scratch.path("nodemgr.toml");
        std::fs::write(&config, format!("controller = \"{controller}\"\n")).unwrap();
        let daemon = self
            .command(&dilu(), gpus)
            .args(["nodemgr", "--sim"])
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(self.socket())
            .arg("--run-dir")
            .arg(self.scratch.path("run"))
            .args(["--foreground", "--metrics", ""])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dilu nodemgr");
        let daemon = Daemon(daemon);
        self.wait_for("the daemon to list its GPUs", |status| {
            status["gpus"].as_array().map(Vec::len) == Some(gpus as usize)
        });
        daemon
    }

    pub fn status(&self) -> Option<Value> {
        dilu_harness::node_manager::status(&self.socket())
    }

    /// Waits (generously: the machine may be loaded) for the daemon's
    /// status to satisfy `check`; returns it.
    pub fn wait_for(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_unless(what, check, |_| {})
    }

    /// [`Node::wait_for`], calling `stop_if(last status)` between two
    /// looks (it panics to stop the wait).
    fn wait_for_unless(
        &self,
        what: &str,
        check: impl Fn(&Value) -> bool,
        mut stop_if: impl FnMut(&Value),
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = Value::Null;
        loop {
            if let Some(status) = self.status() {
                if check(&status) {
                    return status;
                }
                last = status;
            }
            stop_if(&last);
            assert!(Instant::now() < deadline, "{what}: last status {last}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`Node::wait_for`] while `program` runs: a program that ends first
    /// fails the wait with what it said (its stdout and stderr, when
    /// piped), not a minute later with the daemon's status alone.
    pub fn wait_for_while_running(
        &self,
        what: &str,
        program: &mut std::process::Child,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_for_unless(what, check, |last| {
            let Ok(Some(exit)) = program.try_wait() else {
                return;
            };
            let read = |pipe: Option<&mut dyn std::io::Read>| {
                let mut text = String::new();
                if let Some(pipe) = pipe {
                    let _ = pipe.read_to_string(&mut text);
                }
                text
            };
            let stdout = read(program.stdout.as_mut().map(|p| p as _));
            let stderr = read(program.stderr.as_mut().map(|p| p as _));
            panic!(
                "{what}: the program ended first ({exit})\nstdout: {stdout}\nstderr: {stderr}\n\
                 last status {last}"
            );
        })
    }

    /// `dilu run --sim --tenant NAME SPEC -- mem-probe`, driven by line.
    pub fn probe(&self, gpus: u32, tenant: &str, spec: &[&str]) -> Probe {
        let mut command = self.command(&dilu(), gpus);
        command
            .args(["run", "--sim", "--tenant", tenant])
            .args(spec)
            .arg("--")
            .arg(artifact("mem-probe"))
            .env("DILU_CONTEXT_MEMORY", "0");
        Probe::spawn(command)
    }
}

/// A tenant of the status that has processes.
pub fn tenant<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name && t["pids"].as_array().is_some_and(|p| !p.is_empty()))
}

/// The GPU section (`gpu3`, `unplaced`) a tenant's row is under in the
/// `dilu status` table.
pub fn table_gpu_of(table: &str, tenant: &str) -> Option<String> {
    let mut section = None;
    for line in table.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first == "unplaced" || (first.starts_with("gpu") && line.contains(" · ")) {
            section = Some(first.to_string());
        } else if first == tenant {
            return section;
        }
    }
    None
}

/// Every GPU section a tenant has a row under in the `dilu status` table
/// (a tenant on several GPUs is under each), in table order.
pub fn table_gpus_of(table: &str, tenant: &str) -> Vec<String> {
    let mut section = None;
    let mut found = Vec::new();
    for line in table.lines() {
        let first = line.split_whitespace().next().unwrap_or_default();
        if first == "unplaced" || (first.starts_with("gpu") && line.contains(" · ")) {
            section = Some(first.to_string());
        } else if first == tenant {
            found.extend(section.clone());
        }
    }
    found
}
