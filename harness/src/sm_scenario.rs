//! Running tenants side by side on one simulated GPU and reading back what
//! each got, from simgpu's kernel trace (the ground truth). Shared by the
//! SM-time tests and the accuracy benchmark.

use crate::workspace::{Scratch, artifact, dilu, read_trace, unique_name};
use dilu_abi::simtrace::KernelRecord;
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One tenant: its SM share (percent, `None` = unlimited) and the
/// `cudarc-loop` arguments of its process.
#[derive(Debug, Clone)]
pub struct TenantLoop {
    pub sm_percent: Option<f64>,
    pub loop_args: Vec<String>,
}

impl TenantLoop {
    pub fn new(sm_percent: Option<f64>, loop_args: &[&str]) -> Self {
        TenantLoop {
            sm_percent,
            loop_args: loop_args.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// A scenario run: one simgpu instance, one trace, one tenant per loop.
pub struct Scenario {
    pub scratch: Scratch,
    pub instance: String,
    pub tenants: Vec<String>,
    pub trace: std::path::PathBuf,
    children: Vec<Child>,
}

impl Scenario {
    /// Starts every tenant's loop under `dilu run --sim --tenant T [--sm P]`.
    pub fn start(tag: &str, loops: &[TenantLoop], env: &[(&str, &str)]) -> Scenario {
        let scratch = Scratch::new(tag);
        let instance = unique_name(tag);
        let trace = scratch.path("trace.jsonl");
        let mut tenants = Vec::new();
        let mut children = Vec::new();
        for (index, tenant_loop) in loops.iter().enumerate() {
            let tenant = format!("{instance}-t{index}");
            let mut command = Command::new(dilu());
            command.args(["run", "--sim", "--tenant", &tenant]);
            if let Some(percent) = tenant_loop.sm_percent {
                command.args(["--sm", &percent.to_string()]);
            }
            command
                .arg("--")
                .arg(artifact("cudarc-loop"))
                .args(&tenant_loop.loop_args)
                .arg("--json")
                .env("SIMGPU_INSTANCE", &instance)
                .env("SIMGPU_TRACE", &trace)
                .env_remove("DILU_SM_LIMIT")
                .env_remove("DILU_MEM_LIMIT")
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            children.push(command.spawn().expect("spawn tenant loop"));
            tenants.push(tenant);
        }
        Scenario {
            scratch,
            instance,
            tenants,
            trace,
            children,
        }
    }

    /// Waits for every loop (killing them past `limit`) and reads the trace.
    pub fn finish(mut self, limit: Duration) -> Outcome {
        let started = std::time::Instant::now();
        let mut pids = Vec::new();
        let mut kernels = Vec::new();
        let mut stderrs = Vec::new();
        for child in &mut self.children {
            loop {
                if child.try_wait().expect("try_wait").is_some() {
                    break;
                }
                if started.elapsed() > limit {
                    let _ = child.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for child in self.children.drain(..) {
            let output = child.wait_with_output().expect("collect output");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "a tenant loop failed: {}\n{stdout}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            let line = stdout
                .lines()
                .rev()
                .find(|l| l.starts_with('{'))
                .unwrap_or_else(|| panic!("no JSON summary from a tenant loop: {stdout}"));
            let summary: serde_json::Value = serde_json::from_str(line).expect("JSON summary");
            pids.push(summary["pid"].as_u64().expect("pid") as u32);
            kernels.push(summary["kernels"].as_u64().expect("kernels"));
            stderrs.push(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let records = read_trace(&self.trace);
        for tenant in &self.tenants {
            remove_tenant_files(tenant);
        }
        Outcome {
            pids,
            kernels,
            stderrs,
            records,
            _scratch: self.scratch,
        }
    }
}

/// Removes a tenant's standalone region files from /dev/shm.
pub fn remove_tenant_files(tenant: &str) {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    for kind in ["ledger", "sm", "telemetry"] {
        let _ = std::fs::remove_file(dilu_layout::tenant_region_path(uid, tenant, kind));
    }
}

pub struct Outcome {
    /// Per tenant, in start order.
    pub pids: Vec<u32>,
    pub kernels: Vec<u64>,
    /// What each tenant's process wrote to stderr.
    pub stderrs: Vec<String>,
    pub records: Vec<KernelRecord>,
    _scratch: Scratch,
}

impl Outcome {
    /// Each tenant's busy time over the window in which all were running,
    /// as a fraction of that window (tenant order).
    pub fn shares(&self) -> Vec<f64> {
        self.shares_between(None)
    }

    /// Like [`Outcome::shares`], within `[from, to)` (clamped to the common
    /// window).
    pub fn shares_between(&self, range: Option<(u64, u64)>) -> Vec<f64> {
        let Some((mut from, mut to)) = dilu_abi::simtrace::common_window(&self.records) else {
            return vec![0.0; self.pids.len()];
        };
        if let Some((a, b)) = range {
            from = from.max(a);
            to = to.min(b);
        }
        let busy = dilu_abi::simtrace::busy_ns_by_pid(&self.records, from, to);
        let span = to.saturating_sub(from).max(1) as f64;
        self.pids
            .iter()
            .map(|pid| busy.get(pid).copied().unwrap_or(0) as f64 / span)
            .collect()
    }

    /// Per tenant, its share of each `bin_ns` slice of the common window, as
    /// (seconds from the window's start, share).
    pub fn shares_over_time(&self, bin_ns: u64) -> Vec<Vec<(f64, f64)>> {
        let mut series = vec![Vec::new(); self.pids.len()];
        let Some((from, to)) = dilu_abi::simtrace::common_window(&self.records) else {
            return series;
        };
        let mut start = from;
        while start + bin_ns <= to {
            let shares = self.shares_between(Some((start, start + bin_ns)));
            let at = (start + bin_ns / 2 - from) as f64 / 1e9;
            for (tenant, share) in shares.into_iter().enumerate() {
                series[tenant].push((at, share * 100.0));
            }
            start += bin_ns;
        }
        series
    }

    /// Each tenant's part of the device time used by all of them.
    pub fn split(&self) -> Vec<f64> {
        let shares = self.shares();
        let used: f64 = shares.iter().sum();
        shares
            .iter()
            .map(|s| s / used.max(f64::MIN_POSITIVE))
            .collect()
    }

    /// Per process, per stream: the sequence of grid sizes as executed.
    pub fn blocks_by_stream(&self, tenant: usize) -> BTreeMap<u64, Vec<u64>> {
        let mut streams: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        // One entry per kernel: its last segment (a preempted kernel has several).
        for record in self
            .records
            .iter()
            .filter(|r| r.pid == self.pids[tenant] && r.last)
        {
            streams
                .entry(record.stream)
                .or_default()
                .push((record.start_ns, record.blocks));
        }
        streams
            .into_iter()
            .map(|(stream, mut kernels)| {
                kernels.sort();
                (stream, kernels.into_iter().map(|(_, b)| b).collect())
            })
            .collect()
    }

    /// Kernels of a tenant completed per second of the window in which all
    /// tenants were running (how peers report throughput).
    pub fn kernels_per_second(&self, tenant: usize) -> f64 {
        let Some((from, to)) = dilu_abi::simtrace::common_window(&self.records) else {
            return 0.0;
        };
        let done = self
            .records
            .iter()
            .filter(|r| r.pid == self.pids[tenant] && r.last)
            .filter(|r| r.end_ns > from && r.end_ns <= to)
            .count();
        done as f64 / (to.saturating_sub(from).max(1) as f64 / 1e9)
    }

    /// Kernels of a tenant in the trace.
    pub fn traced_kernels(&self, tenant: usize) -> u64 {
        self.records
            .iter()
            .filter(|r| r.pid == self.pids[tenant] && r.last)
            .count() as u64
    }
}
