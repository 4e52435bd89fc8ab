//! `dilu demo`: an inference tenant with an SLO and a training tenant share
//! one simulated GPU under an embedded node manager; the same scenario runs
//! once per controller (`static`, `dilu-rckm`, `dilu`) and the summary
//! compares SLO violations and training throughput. `--controllers alone`
//! runs the inference tenant without the training tenant: the latencies
//! the others are judged against.
//!
//! The workloads are ordinary CUDA programs (`demo-tenant`) started with
//! `dilu run --sim`; they register with the node manager through the
//! interposer, and the inference program measures each request's latency
//! itself (arrival to completion, queueing included) and reports it with
//! `dilu_report_latency`.
//!
//! With `--latencies-dir DIR` every request's latency is kept in
//! `DIR/<controller>.txt` (ms, one per line): `scripts/bench.sh demo` turns
//! them into `bench/results/demo-latency-cdf.svg` and `demo.md`.

use dilu_abi::node_wire::SmShare;
use dilu_abi::node_wire::{TenantSpec, WorkClass};
use dilu_nodemgr::artifacts;
use dilu_nodemgr::config::Config;
use dilu_nodemgr::daemon::Daemon;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

pub struct DemoSpec {
    pub seconds: u64,
    pub json: bool,
    pub controllers: Vec<String>,
    /// Where to keep each controller's request latencies.
    pub latencies_dir: Option<PathBuf>,
}

/// Not a controller: the inference tenant alone under the node manager
/// (`dilu`), the run the others' latencies are judged against.
pub const ALONE: &str = "alone";

/// The scenario: the inference SLO and both tenants' specs.
pub const SLO_MS: f64 = 15.0;
const SERVE_ARGS: [&str; 6] = ["--blocks", "6600", "--kernels", "8", "--rate", "40"];
const TRAIN_ARGS: [&str; 6] = ["--blocks", "13200", "--kernels", "8", "--load-ms", "4"];

fn specs() -> [(&'static str, TenantSpec); 2] {
    [
        (
            "infer",
            TenantSpec {
                class: WorkClass::Latency,
                slo_ms: Some(SLO_MS),
                sm_request: SmShare::percent(30.0),
                sm_limit: SmShare::percent(100.0),
                mem: None,
            },
        ),
        (
            "train",
            TenantSpec {
                class: WorkClass::Batch,
                slo_ms: None,
                sm_request: SmShare::percent(20.0),
                sm_limit: SmShare::percent(100.0),
                mem: None,
            },
        ),
    ]
}

/// What one controller's run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub controller: String,
    pub slo_violation_rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub requests: u64,
    pub batch_throughput: f64,
}

fn spawn(
    socket: &Path,
    instance: &str,
    tenant: &str,
    mode: &str,
    args: &[&str],
    seconds: u64,
) -> Result<Child, String> {
    let workload = artifacts::find("demo-tenant").map_err(|e| e.to_string())?;
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    Command::new(me)
        .args(["run", "--sim", "--tenant", tenant, "--"])
        .arg(workload)
        .arg(mode)
        .args([
            "--seconds",
            &seconds.to_string(),
            "--slo-ms",
            &SLO_MS.to_string(),
        ])
        .args(args)
        .env(dilu_abi::node_wire::SOCKET_ENV, socket)
        .env("SIMGPU_INSTANCE", instance)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the {tenant} tenant: {e}"))
}

fn finish(mut child: Child, what: &str) -> Result<serde_json::Value, String> {
    let mut stdout = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        let _ = pipe.read_to_string(&mut stdout);
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the {what} tenant failed ({status})"));
    }
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("the {what} tenant printed no summary"))
}

/// Runs the scenario under one controller; `latencies`: the file to keep
/// the inference tenant's request latencies in.
pub fn run_one(
    controller: &str,
    seconds: u64,
    live: bool,
    latencies: Option<&Path>,
) -> Result<Outcome, String> {
    let tag = format!("{}-{controller}", std::process::id());
    let scratch = std::env::temp_dir().join(format!("dilu-demo-{tag}"));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let names: Vec<String> = specs().iter().map(|(n, _)| format!("{n}-{tag}")).collect();
    let config = Config {
        socket: scratch.join("nodemgr.sock"),
        run_dir: scratch.join("run"),
        metrics: None,
        controller: if controller == ALONE {
            "dilu"
        } else {
            controller
        }
        .to_string(),
        tenants: names
            .iter()
            .cloned()
            .zip(specs().map(|(_, s)| s))
            .collect::<BTreeMap<_, _>>(),
        ..Config::default()
    };
    let daemon = Daemon::start(config).map_err(|e| e.to_string())?;
    let instance = format!("demo-{tag}");
    let socket = daemon.shared.config.socket.clone();
    let mut serve_args: Vec<&str> = SERVE_ARGS.to_vec();
    let latencies = latencies.map(|p| p.to_string_lossy().into_owned());
    if let Some(path) = &latencies {
        serve_args.extend(["--latencies", path.as_str()]);
    }
    let serve = spawn(&socket, &instance, &names[0], "serve", &serve_args, seconds);
    let train = if controller == ALONE {
        Ok(None)
    } else {
        spawn(&socket, &instance, &names[1], "train", &TRAIN_ARGS, seconds).map(Some)
    };
    let (mut serve, mut train) = match (serve, train) {
        (Ok(s), Ok(t)) => (s, t),
        (s, t) => {
            let mut error = String::new();
            for result in [s.map(Some), t] {
                match result {
                    Ok(Some(mut child)) => {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    Ok(None) => {}
                    Err(e) => error = e,
                }
            }
            daemon.stop();
            return Err(error);
        }
    };
    let started = Instant::now();
    let mut tick = 1;
    let running = |child: &mut Child| matches!(child.try_wait(), Ok(None));
    while running(&mut serve) || train.as_mut().is_some_and(running) {
        std::thread::sleep(Duration::from_millis(50));
        if started.elapsed() < Duration::from_secs(tick) {
            continue;
        }
        tick += 1;
        if live {
            let status = daemon.shared.status();
            // The server's p99 as the node manager sees it; the trainer
            // reports no requests (its figure would be its step time).
            let cell = |name: &str, with_p99: bool| {
                status.tenants.iter().find(|t| t.name == name).map_or_else(
                    || format!("{:>26}", "(not running)"),
                    |t| {
                        let p99 = match t.p99_ms {
                            Some(p) if with_p99 => format!("~{p:.0}ms"),
                            _ => String::new(),
                        };
                        format!(
                            "{:>5.0}% {:>5.1}% {:>12}",
                            t.sm_current_pct, t.sm_achieved_pct, p99
                        )
                    },
                )
            };
            println!(
                "{controller:>10} {:>3}s  {}   {}",
                tick - 1,
                cell(&names[0], true),
                cell(&names[1], false)
            );
        }
    }
    let serve = finish(serve, "inference");
    let train = train.map(|t| finish(t, "training")).transpose();
    daemon.stop();
    let _ = std::fs::remove_dir_all(&scratch);
    let (serve, train) = (serve?, train?.unwrap_or_default());
    Ok(Outcome {
        controller: controller.to_string(),
        slo_violation_rate: serve["slo_violation_rate"].as_f64().unwrap_or(1.0),
        p50_ms: serve["p50_ms"].as_f64().unwrap_or(0.0),
        p99_ms: serve["p99_ms"].as_f64().unwrap_or(0.0),
        requests: serve["requests"].as_u64().unwrap_or(0),
        batch_throughput: train["iterations_per_second"].as_f64().unwrap_or(0.0),
    })
}

pub fn run(spec: &DemoSpec) -> Result<ExitCode, String> {
    let controllers: Vec<String> = if spec.controllers.is_empty() {
        ["static", "dilu-rckm", "dilu"].map(String::from).to_vec()
    } else {
        spec.controllers.clone()
    };
    for c in controllers.iter().filter(|c| *c != ALONE) {
        dilu_nodemgr::control::by_name(c)
            .map_err(|e| format!("{e}, or {ALONE} (the inference tenant by itself)"))?;
    }
    if !spec.json {
        println!(
            "dilu demo: an inference tenant (bursty requests of 8 x 500 us kernels, SLO p99 {SLO_MS} ms, SM request 30% limit 100%)"
        );
        println!(
            "and a training tenant (8 x 1 ms kernels per iteration after 4 ms of data loading, request 20% limit 100%)"
        );
        println!(
            "share one simulated GPU under the node manager, {} s per controller.",
            spec.seconds
        );
        println!(
            "Each second: each tenant's SM share and the device time it used, and the server's p99 as the\n\
             node manager estimates it (~: from power-of-two buckets, right within a factor of 2). The\n\
             table at the end is what the server measured, request by request.\n"
        );
        println!(
            "{:>10} {:>4}  {:>26}   {:>26}",
            "controller", "time", "inference share/used/p99~", "training share/used"
        );
    }
    if let Some(dir) = &spec.latencies_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut outcomes = Vec::new();
    for controller in &controllers {
        let latencies = spec
            .latencies_dir
            .as_ref()
            .map(|dir| dir.join(format!("{controller}.txt")));
        outcomes.push(run_one(
            controller,
            spec.seconds,
            !spec.json,
            latencies.as_deref(),
        )?);
    }
    if spec.json {
        let entries: Vec<String> = outcomes
            .iter()
            .map(|o| {
                format!(
                    "\"{}\":{{\"slo_violation_rate\":{:.4},\"batch_throughput\":{:.3},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"requests\":{}}}",
                    o.controller,
                    o.slo_violation_rate,
                    o.batch_throughput,
                    o.p50_ms,
                    o.p99_ms,
                    o.requests
                )
            })
            .collect();
        println!(
            "{{\"slo_ms\":{SLO_MS},\"seconds\":{},\"controllers\":{{{}}}}}",
            spec.seconds,
            entries.join(",")
        );
    } else {
        println!();
        println!(
            "{:<10} {:>10} {:>16} {:>10} {:>22}",
            "controller", "requests", "SLO violations", "p99", "training iterations/s"
        );
        for o in &outcomes {
            let training = if o.controller == ALONE {
                "-".to_string()
            } else {
                format!("{:.1}", o.batch_throughput)
            };
            println!(
                "{:<10} {:>10} {:>15.1}% {:>8.1}ms {:>22}",
                o.controller,
                o.requests,
                o.slo_violation_rate * 100.0,
                o.p99_ms,
                training
            );
        }
        if let Some(o) = outcomes.first() {
            println!(
                "\np99 of {} requests: the {}{}",
                o.requests,
                nth_slowest(slowest_at_p99(o.requests)),
                if o.requests < 100 {
                    " (under 100 requests the p99 is the slowest; run longer with --seconds)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Which slowest request the inference tenant's p99 of `n` is (it takes
/// the ⌈0.99 n⌉-th fastest).
fn slowest_at_p99(n: u64) -> u64 {
    n.saturating_sub((n * 99).div_ceil(100)) + 1
}

/// "slowest", "2nd slowest", "11th slowest", "21st slowest", ...
fn nth_slowest(k: u64) -> String {
    if k == 1 {
        return "slowest".into();
    }
    let suffix = match (k % 10, k % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{k}{suffix} slowest")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_of_few_requests_is_the_slowest() {
        assert_eq!(slowest_at_p99(87), 1);
        assert_eq!(slowest_at_p99(99), 1);
        assert_eq!(slowest_at_p99(100), 2);
        assert_eq!(slowest_at_p99(360), 4);
        assert_eq!(nth_slowest(1), "slowest");
        assert_eq!(nth_slowest(4), "4th slowest");
        assert_eq!(nth_slowest(12), "12th slowest");
        assert_eq!(nth_slowest(22), "22nd slowest");
    }
}
