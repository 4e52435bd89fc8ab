//! `dilu demo`: two unmodified CUDA programs share one simulated GPU under
//! dilu, with a live view of each one's device time read from simgpu's
//! kernel trace (the ground truth).

use crate::artifacts;
use dilu_abi::simtrace::{self, KernelRecord};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

pub struct DemoSpec {
    pub seconds: u64,
    pub json: bool,
    pub controllers: Vec<String>,
}

/// One demo tenant: a name and the workload arguments that shape it.
struct TenantPlan {
    name: &'static str,
    about: &'static str,
    args: &'static [&'static str],
}

const TENANTS: [TenantPlan; 2] = [
    TenantPlan {
        name: "inference",
        about: "20 us kernels, synchronises after each one",
        args: &["--blocks", "264", "--depth", "1"],
    },
    TenantPlan {
        name: "training",
        about: "400 us kernels, 32 in flight",
        args: &["--blocks", "5280", "--depth", "32"],
    },
];

struct Running {
    plan: &'static TenantPlan,
    child: Child,
}

/// Reads a growing trace file from where it left off.
struct TraceFollower {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl TraceFollower {
    fn new(path: PathBuf) -> Self {
        TraceFollower {
            path,
            offset: 0,
            partial: String::new(),
        }
    }

    fn poll(&mut self) -> Result<Vec<KernelRecord>, String> {
        let Ok(mut file) = File::open(&self.path) else {
            return Ok(Vec::new()); // no kernel has finished yet
        };
        file.seek(SeekFrom::Start(self.offset))
            .map_err(|e| e.to_string())?;
        let mut fresh = String::new();
        let read = file.read_to_string(&mut fresh).map_err(|e| e.to_string())?;
        self.offset += read as u64;
        self.partial.push_str(&fresh);
        let records = simtrace::parse(&self.partial)?;
        let keep_from = self.partial.rfind('\n').map_or(0, |i| i + 1);
        self.partial.drain(..keep_from);
        Ok(records)
    }
}

fn spawn_tenant(
    plan: &'static TenantPlan,
    seconds: u64,
    instance: &str,
    trace: &Path,
) -> Result<Running, String> {
    let workload = artifacts::find("cudarc-loop")?;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = Command::new(me)
        .args(["run", "--sim", "--"])
        .arg(workload)
        .args(["--seconds", &seconds.to_string(), "--json"])
        .args(plan.args)
        .env("SIMGPU_INSTANCE", instance)
        .env("SIMGPU_TRACE", trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the {} tenant: {e}", plan.name))?;
    Ok(Running { plan, child })
}

/// Device time per pid over records, as a fraction of `window_ns`.
fn busy_fractions(records: &[KernelRecord], from: u64, to: u64) -> BTreeMap<u32, f64> {
    let window = (to - from).max(1) as f64;
    simtrace::busy_ns_by_pid(records, from, to)
        .into_iter()
        .map(|(pid, ns)| (pid, ns as f64 / window))
        .collect()
}

pub fn run(spec: &DemoSpec) -> Result<ExitCode, String> {
    let scratch = std::env::temp_dir().join(format!("dilu-demo-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let trace_path = scratch.join("trace.jsonl");
    let instance = format!("demo-{}", std::process::id());

    if !spec.json {
        println!(
            "dilu demo: {} CUDA programs share one simulated GPU for {} s (trace: {})",
            TENANTS.len(),
            spec.seconds,
            trace_path.display()
        );
        for plan in &TENANTS {
            println!("  {:<10} {}", plan.name, plan.about);
        }
        println!();
        println!(
            "{:>5}  {}",
            "time",
            TENANTS
                .map(|p| format!("{:>18}", format!("{} busy", p.name)))
                .join("")
        );
    }
    let mut running = Vec::new();
    for plan in &TENANTS {
        running.push(spawn_tenant(plan, spec.seconds, &instance, &trace_path)?);
    }
    let pids: Vec<u32> = running.iter().map(|r| r.child.id()).collect();

    let mut follower = TraceFollower::new(trace_path.clone());
    let mut all = Vec::new();
    let started = Instant::now();
    let mut tick = 1;
    while running
        .iter_mut()
        .any(|r| matches!(r.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() < Duration::from_secs(tick) {
            continue;
        }
        tick += 1;
        let fresh = follower.poll()?;
        if !spec.json && !fresh.is_empty() {
            let from = fresh.iter().map(|r| r.start_ns).min().unwrap_or(0);
            let to = fresh.iter().map(|r| r.end_ns).max().unwrap_or(from);
            let fractions = busy_fractions(&fresh, from, to);
            let cells: Vec<String> = pids
                .iter()
                .map(|pid| {
                    let share = fractions.get(pid).copied().unwrap_or(0.0);
                    format!("{:>17.1}%", share * 100.0)
                })
                .collect();
            println!("{:>4}s  {}", tick - 1, cells.join(" "));
        }
        all.extend(fresh);
    }
    all.extend(follower.poll()?);

    let mut rows = Vec::new();
    for tenant in &mut running {
        let mut stdout = String::new();
        if let Some(mut pipe) = tenant.child.stdout.take() {
            let _ = pipe.read_to_string(&mut stdout);
        }
        let status = tenant.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("the {} tenant failed ({status})", tenant.plan.name));
        }
        let rate = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|v| v["kernels_per_second"].as_f64())
            .unwrap_or(0.0);
        rows.push((tenant.plan.name, tenant.child.id(), rate));
    }
    let from = all.iter().map(|r| r.start_ns).min().unwrap_or(0);
    let to = all.iter().map(|r| r.end_ns).max().unwrap_or(from);
    let fractions = busy_fractions(&all, from, to);
    let overlaps = simtrace::overlapping(&all).len();
    let _ = std::fs::remove_dir_all(&scratch);

    if spec.json {
        let tenants: Vec<String> = rows
            .iter()
            .map(|(name, pid, rate)| {
                format!(
                    "\"{name}\":{{\"kernels_per_second\":{rate:.3},\"device_share\":{:.4}}}",
                    fractions.get(pid).copied().unwrap_or(0.0)
                )
            })
            .collect();
        println!(
            "{{\"tenants\":{{{}}},\"kernels\":{},\"overlapping_kernels\":{overlaps}}}",
            tenants.join(","),
            all.len()
        );
    } else {
        println!();
        println!(
            "{:<10} {:>8} {:>14} {:>13}",
            "tenant", "pid", "kernels/s", "device time"
        );
        for (name, pid, rate) in &rows {
            let share = fractions.get(pid).copied().unwrap_or(0.0);
            println!("{name:<10} {pid:>8} {rate:>14.1} {:>12.1}%", share * 100.0);
        }
        println!(
            "{} kernels executed; {overlaps} overlapped on the device (must be 0).",
            all.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
