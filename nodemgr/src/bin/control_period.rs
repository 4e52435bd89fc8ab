//! What one control period costs the node manager on a full node: the work
//! the daemon's control loop does under the registry lock every period
//! (sample each tenant's telemetry, run each GPU's controller, write the
//! budgets), timed on made-up tenants that launch and report latency
//! between periods. Rows: GPUs × tenants per GPU, per control law, and the
//! same tenants as one group (every tenant on one controller, as before
//! control was per GPU) for comparison; and one GPU with a few active
//! tenants beside many idle ones (registered, share 0, never launching),
//! which should cost the period almost nothing.
//!
//! usage: control-period [--periods N]   (markdown on stdout)

use dilu_abi::node_wire::SmShare;
use dilu_abi::node_wire::{TenantSpec, WorkClass};
use dilu_nodemgr::control::per_gpu::PerGpu;
use dilu_nodemgr::period::{self, PeriodState};
use dilu_nodemgr::registry::{self, HeldPlacement, Peer, Registry};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// Period length the made-up tenants' activity is spread over (the default).
const PERIOD_NS: u64 = 5_000_000;
/// Periods run before timing: the samplers' rings fill over a second, as
/// they have in a daemon that has run for one.
const WARM_UP: u64 = 250;

/// Tenant `index`'s spec; requests are divided by `groups` so that a node
/// run as one group is admitted too.
fn spec(index: usize, groups: u32) -> TenantSpec {
    // One tenant in four serves requests; the rest train. Requests sum to
    // at most 100% of a GPU with 64 tenants on it.
    if index.is_multiple_of(4) {
        TenantSpec {
            class: WorkClass::Latency,
            slo_ms: Some(50.0),
            sm_request: SmShare::percent(2.0 / groups as f64),
            sm_limit: SmShare::percent(100.0),
            mem: None,
        }
    } else {
        TenantSpec {
            class: WorkClass::Batch,
            slo_ms: None,
            sm_request: SmShare::percent(1.0 / groups as f64),
            sm_limit: SmShare::percent(100.0),
            mem: None,
        }
    }
}

/// Lets this process hold two descriptors per tenant.
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, owned rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Prefix of the names of idle tenants, which [`activity`] leaves alone.
const IDLE: &str = "idle";

/// A registry of `gpus × per_gpu` tenants, placed round-robin (`None`: all
/// unplaced, one group), and `idle` idle tenants on GPU 0.
fn node(gpus: u32, per_gpu: usize, placed: bool, idle: usize) -> Result<Registry, String> {
    let mut registry = Registry::new(BTreeMap::new(), None);
    // All tenants here are this process's uid: the per-uid cap (a guard
    // against one user filling the node) does not apply to a made-up node.
    registry.max_tenants_per_uid = usize::MAX;
    let connection: Arc<std::os::fd::OwnedFd> = Arc::new(
        std::fs::File::open("/dev/null")
            .map_err(|e| e.to_string())?
            .into(),
    );
    let uid = std::process::id(); // any uid: nothing is checked against it here
    let groups = if placed { 1 } else { gpus };
    let mut add = |name: String, gpu: u32, spec: TenantSpec| -> Result<(), String> {
        if placed {
            registry.held.insert(
                name.clone(),
                HeldPlacement {
                    uid,
                    spec: spec.clone(),
                    gpus: vec![gpu],
                    since: Instant::now(),
                },
            );
        }
        let peer = Peer {
            pid: std::process::id() as i32,
            uid,
            connection: connection.clone(),
        };
        let fresh = registry::create_regions(&name, None).map_err(|e| e.to_string())?;
        registry
            .register(&name, peer, 0, Some(spec), fresh)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    for i in 0..gpus as usize * per_gpu {
        add(
            format!("t{i:04}"),
            i as u32 % gpus,
            spec(i / gpus as usize, groups),
        )?;
    }
    for i in 0..idle {
        let spec = TenantSpec {
            sm_request: SmShare::percent(0.0),
            ..spec(1, groups)
        };
        add(format!("{IDLE}{i:05}"), 0, spec)?;
    }
    Ok(registry)
}

/// Tenants' activity between periods: every batch tenant launches, every
/// latency tenant launches one period in three and reports a latency.
fn activity(registry: &Registry, period: u64, now_ns: u64) {
    let active = registry
        .tenants
        .iter()
        .filter(|(name, _)| !name.starts_with(IDLE));
    for (i, (_, tenant)) in active.enumerate() {
        let telemetry = &tenant.regions.activity;
        if tenant.spec.class == WorkClass::Latency {
            if (period + i as u64).is_multiple_of(3) {
                telemetry.devices[0].record_launch(now_ns, 400_000);
                telemetry.report_latency(20_000_000 + (i as u64 % 7) * 1_000_000);
            }
        } else {
            telemetry.devices[0].record_launch(now_ns, PERIOD_NS / 64);
        }
    }
}

/// CPU time this thread has used (ns): unlike wall time, it leaves out the
/// time other processes of a busy machine run instead of this one.
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into a valid, owned timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

struct Row {
    cpu_p50_us: f64,
    cpu_p99_us: f64,
    cpu_max_us: f64,
    wall_p50_us: f64,
    wall_p99_us: f64,
}

/// The `q` quantile of sorted costs.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

fn measure(registry: &mut Registry, law: &str, periods: u64) -> Result<Row, String> {
    let mut controllers = PerGpu::new(law).map_err(|e| e.to_string())?;
    let mut state = PeriodState::default();
    let mut now_ns = dilu_layout::monotonic_ns();
    let mut cpu = Vec::with_capacity(periods as usize);
    let mut wall = Vec::with_capacity(periods as usize);
    for p in 0..periods + WARM_UP {
        now_ns += PERIOD_NS;
        activity(registry, p, now_ns);
        let (started, cpu_started) = (Instant::now(), thread_cpu_ns());
        period::run(registry, &mut controllers, &mut state, now_ns);
        if p >= WARM_UP {
            cpu.push(thread_cpu_ns().saturating_sub(cpu_started) as f64 / 1e3);
            wall.push(started.elapsed().as_nanos() as f64 / 1e3);
        }
    }
    cpu.sort_by(f64::total_cmp);
    wall.sort_by(f64::total_cmp);
    Ok(Row {
        cpu_p50_us: quantile(&cpu, 0.5),
        cpu_p99_us: quantile(&cpu, 0.99),
        cpu_max_us: quantile(&cpu, 1.0),
        wall_p50_us: quantile(&wall, 0.5),
        wall_p99_us: quantile(&wall, 0.99),
    })
}

fn main() -> Result<(), String> {
    let mut periods = 2000u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--periods" => {
                periods = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--periods needs a positive count")?;
            }
            "-h" | "--help" => {
                println!("usage: control-period [--periods N]   (markdown on stdout)");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    raise_descriptor_limit();
    println!(
        "| GPUs | tenants per GPU | idle tenants | control | law | CPU p50 µs | CPU p99 µs | CPU max µs | wall p50 µs | wall p99 µs |"
    );
    println!("|---:|---:|---:|---|---|---:|---:|---:|---:|---:|");
    let shapes = [(1, 8, 0), (1, 64, 0), (8, 8, 0), (8, 64, 0), (1, 8, 1000)];
    for (gpus, per_gpu, idle) in shapes {
        for placed in [true, false] {
            if !placed && gpus == 1 {
                continue; // one GPU: the same thing
            }
            let mut registry = node(gpus, per_gpu, placed, idle)?;
            for law in ["dilu", "dilu-colo", "static"] {
                eprintln!(
                    "control-period: {gpus} × {per_gpu} + {idle} idle, {law}, placed: {placed}"
                );
                let row = measure(&mut registry, law, periods)?;
                println!(
                    "| {gpus} | {per_gpu} | {idle} | {} | {law} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    if placed { "per GPU" } else { "one group" },
                    row.cpu_p50_us,
                    row.cpu_p99_us,
                    row.cpu_max_us,
                    row.wall_p50_us,
                    row.wall_p99_us
                );
            }
        }
    }
    Ok(())
}
