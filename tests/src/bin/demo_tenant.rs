//! `demo-tenant`: the two workloads of `dilu demo`, as ordinary CUDA
//! programs (through `cudarc`).
//!
//! - `serve`: an inference server. Requests arrive in bursts (Poisson
//!   arrivals at `--rate` per second during ON periods, nothing during OFF
//!   periods); each request is `--kernels` kernels, each waited for (like
//!   decoding one token after another). With `--host-us US` it is a
//!   framework's server instead: host work before each of a request's
//!   kernels after the first, from half to one and a half `US` µs (an
//!   eager framework's Python between launches), the kernels not waited
//!   for one by one, and one synchronisation at the request's end (reading
//!   its result). A request's latency runs from its arrival (queueing
//!   included) to its last kernel's end; it is reported to
//!   dilu with `dilu_report_latency` when the interposer exports it (not
//!   with `--report-latency no`: a server that does not, as most do not).
//! - `train`: a training loop. Each iteration waits `--load-ms` for data
//!   (a bubble: nothing on the GPU), then launches `--kernels` kernels and
//!   synchronises (the loss). A list (`--load-ms 4,1`) makes an iteration
//!   of several phases, each a gap of its length then the kernels and a
//!   synchronisation (data loading, then e.g. an all-reduce or a pipeline
//!   bubble): gaps of different lengths that repeat every iteration.
//!
//! - `model`: a model served in a closed loop, for `dilu profile`: each
//!   request is a batch of `DILU_BATCH` samples (default 1): host work of
//!   `--host-ms` plus `--host-ms-per-sample` per sample (pre- and
//!   post-processing, no GPU), then `--kernels` kernels of `--blocks` plus
//!   `--blocks-per-sample` per sample blocks, then one synchronisation. Like a
//!   real model, latency falls with the SM share until the host part
//!   dominates, and both latency and throughput grow with the batch (a small
//!   batch leaves waves part-empty). Each request's latency is reported.
//!
//! Prints one JSON line at the end (`serve`: with its p99's range,
//! `p99_low_ms`/`p99_high_ms`, null where the run cannot bound it; see
//! `dilu_harness::quantile`). `serve --latencies FILE` also writes
//! every request's latency (ms, one per line, in completion order) to FILE;
//! `serve --requests FILE` writes every request's arrival (ns after the
//! start) and latency (ns), one request per line, after a line
//! `# start_ns N` (the start on CLOCK_MONOTONIC, simgpu's trace clock): a
//! benchmark's bound on what fillers may take replays them, and its split
//! of a request's time by what the device ran reads them beside the trace.
//! `serve` and `train` with `--launch-log FILE` write, for every kernel
//! launch, the CLOCK_MONOTONIC time (ns) at which the launch call returned,
//! one per line in launch order: set against simgpu's trace, how long each
//! kernel waited for the device.

use cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use dilu_harness::ptx::{BLOCK_THREADS, BUSY_KERNEL, PTX};
use dilu_harness::quantile;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The chance, a side, that a run's p99 range misses the true p99.
const P99_TAIL: f64 = 0.0125;

const USAGE: &str = "usage: demo-tenant serve|train|model [--seconds S] [--blocks B] [--kernels K] [--iters N] [--stream default|new]
    serve: [--rate R/s] [--on-ms MS] [--off-ms MS] [--slo-ms MS] [--seed N] [--host-us US] [--report-latency yes|no] [--latencies FILE] [--requests FILE] [--launch-log FILE]
    train: [--load-ms MS[,MS...]] [--launch-log FILE]
    model: [--blocks-per-sample B] [--host-ms MS] [--host-ms-per-sample MS] (batch size: DILU_BATCH)";

struct Options {
    mode: String,
    seconds: f64,
    blocks: u32,
    kernels: u32,
    /// FMAs per thread: a real GPU's kernel length follows it (simgpu's
    /// follows the grid).
    iters: u32,
    rate: f64,
    on_ms: f64,
    off_ms: f64,
    slo_ms: f64,
    load_ms: Vec<f64>,
    seed: u64,
    latencies: Option<String>,
    requests: Option<String>,
    launch_log: Option<String>,
    /// Launch on a stream of its own instead of the context's (legacy)
    /// default stream.
    new_stream: bool,
    /// Report each request's latency to dilu (a server that does not, as
    /// most do not, with `--report-latency no`).
    report_latency: bool,
    /// `serve`: host work between a request's launches (0: each kernel
    /// waited for instead).
    host_us: f64,
    blocks_per_sample: u32,
    host_ms: f64,
    host_ms_per_sample: f64,
    batch: u32,
}

fn parse() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mode = args
        .next()
        .ok_or("the first argument is serve, train or model")?;
    if !["serve", "train", "model"].contains(&mode.as_str()) {
        return Err("the first argument is serve, train or model".into());
    }
    let model = mode == "model";
    let batch = match std::env::var("DILU_BATCH") {
        Ok(text) => text
            .parse::<u32>()
            .ok()
            .filter(|b| (1..=65536).contains(b))
            .ok_or_else(|| format!("DILU_BATCH={text:?} is not a batch size from 1 to 65536"))?,
        Err(_) => 1,
    };
    let mut o = Options {
        mode,
        seconds: 5.0,
        blocks: if model { 660 } else { 6600 },
        kernels: if model { 4 } else { 8 },
        iters: 2000,
        rate: 40.0,
        on_ms: 400.0,
        off_ms: 600.0,
        slo_ms: 15.0,
        load_ms: vec![4.0],
        seed: 7,
        latencies: None,
        requests: None,
        launch_log: None,
        new_stream: false,
        report_latency: true,
        blocks_per_sample: 264,
        host_us: 0.0,
        host_ms: 1.0,
        host_ms_per_sample: 0.05,
        batch,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<f64>()
                .map_err(|_| format!("bad value {value:?} for {flag}"))
        };
        match flag.as_str() {
            "--latencies" => o.latencies = Some(value.clone()),
            "--requests" => o.requests = Some(value.clone()),
            "--launch-log" => o.launch_log = Some(value.clone()),
            "--report-latency" => {
                o.report_latency = match value.as_str() {
                    "yes" => true,
                    "no" => false,
                    _ => return Err(format!("bad value {value:?} for {flag}: yes or no")),
                }
            }
            "--stream" => {
                o.new_stream = match value.as_str() {
                    "default" => false,
                    "new" => true,
                    _ => return Err(format!("bad value {value:?} for {flag}: default or new")),
                }
            }
            "--seconds" => o.seconds = number()?,
            "--blocks" => o.blocks = number()? as u32,
            "--kernels" => o.kernels = number()? as u32,
            "--iters" => o.iters = number()? as u32,
            "--rate" => o.rate = number()?,
            "--on-ms" => o.on_ms = number()?,
            "--off-ms" => o.off_ms = number()?,
            "--slo-ms" => o.slo_ms = number()?,
            "--load-ms" => {
                o.load_ms = value
                    .split(',')
                    .map(|v| v.parse::<f64>().ok().filter(|ms| *ms >= 0.0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("bad value {value:?} for {flag}"))?
            }
            "--seed" => o.seed = number()? as u64,
            "--blocks-per-sample" => o.blocks_per_sample = number()? as u32,
            "--host-ms" => o.host_ms = number()?,
            "--host-us" => o.host_us = number()?,
            "--host-ms-per-sample" => o.host_ms_per_sample = number()?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if o.blocks == 0 || o.kernels == 0 || o.iters == 0 || o.rate <= 0.0 {
        return Err("--blocks, --kernels, --iters and --rate must be positive".into());
    }
    if !(0.0..=1e6).contains(&o.host_us) {
        return Err("--host-us must be from 0 to 1000000".into());
    }
    Ok(o)
}

/// `dilu_report_latency` from the interposer, when it is preloaded.
fn latency_reporter() -> Option<extern "C" fn(u64)> {
    // SAFETY: dlsym with a NUL-terminated name on the global scope.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dilu_report_latency".as_ptr()) };
    // SAFETY: the interposer exports `extern "C" fn(u64)` under this name.
    (!address.is_null())
        .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64)>(address) })
}

/// Exponential inter-arrival times from a small deterministic generator.
struct Arrivals(u64);

impl Arrivals {
    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn next_gap_s(&mut self, rate: f64) -> f64 {
        -self.uniform().ln() / rate
    }
}

fn run(o: &Options) -> Result<String, Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let module = ctx.load_module(Ptx::from_src(PTX))?;
    let function = module.load_function(BUSY_KERNEL)?;
    let blocks = if o.mode == "model" {
        o.blocks + o.blocks_per_sample.saturating_mul(o.batch)
    } else {
        o.blocks
    };
    // The buffer is allocated on the default stream either way (a peer,
    // XSched, queues an allocation on a stream it schedules and returns
    // before the pointer is written), and ready before the first launch.
    let buffer: CudaSlice<f32> = ctx
        .default_stream()
        .alloc_zeros(blocks as usize * BLOCK_THREADS as usize)?;
    let stream = if o.new_stream {
        ctx.default_stream().synchronize()?;
        // SAFETY: the one buffer is used on this one stream only, after
        // the default stream's allocation finished.
        unsafe { ctx.disable_event_tracking() };
        ctx.new_stream()?
    } else {
        ctx.default_stream()
    };
    let iters = o.iters;
    let launched = std::cell::RefCell::new(Vec::<u64>::new());
    let launch = || -> Result<(), cudarc::driver::DriverError> {
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&function);
        builder.arg(&buffer).arg(&iters);
        // SAFETY: `busy` takes (float*, u32) and the buffer holds grid × block floats.
        unsafe { builder.launch(config) }.map(|_| ())?;
        if o.launch_log.is_some() {
            launched.borrow_mut().push(dilu_layout::monotonic_ns());
        }
        Ok(())
    };
    let write_launch_log = || -> Result<(), String> {
        let Some(path) = &o.launch_log else {
            return Ok(());
        };
        let lines: String = launched.borrow().iter().map(|t| format!("{t}\n")).collect();
        std::fs::write(path, lines).map_err(|e| format!("{path}: {e}"))
    };
    let started = Instant::now();
    // The same instant on the clock traces use (Instant reads
    // CLOCK_MONOTONIC too, but does not say its value).
    let started_ns = dilu_layout::monotonic_ns();
    let deadline = Duration::from_secs_f64(o.seconds);
    if o.mode == "train" {
        let mut iterations = 0u64;
        while started.elapsed() < deadline {
            for load_ms in &o.load_ms {
                std::thread::sleep(Duration::from_secs_f64(load_ms / 1e3));
                for _ in 0..o.kernels {
                    launch()?;
                }
                stream.synchronize()?;
            }
            iterations += 1;
        }
        let seconds = started.elapsed().as_secs_f64();
        write_launch_log()?;
        return Ok(format!(
            "{{\"mode\":\"train\",\"iterations\":{iterations},\"seconds\":{seconds:.3},\"iterations_per_second\":{:.3}}}",
            iterations as f64 / seconds
        ));
    }
    let report = latency_reporter().filter(|_| o.report_latency);
    if o.mode == "model" {
        let host =
            Duration::from_secs_f64((o.host_ms + o.host_ms_per_sample * f64::from(o.batch)) / 1e3);
        let mut latencies = Vec::new();
        while started.elapsed() < deadline {
            let request = Instant::now();
            std::thread::sleep(host);
            for _ in 0..o.kernels {
                launch()?;
            }
            stream.synchronize()?;
            let latency = request.elapsed();
            if let Some(report) = report {
                report(latency.as_nanos() as u64);
            }
            latencies.push(latency.as_secs_f64() * 1e3);
        }
        let seconds = started.elapsed().as_secs_f64();
        let n = latencies.len();
        return Ok(format!(
            "{{\"mode\":\"model\",\"batch\":{},\"requests\":{n},\"mean_ms\":{:.3},\"throughput\":{:.1},\"reported\":{}}}",
            o.batch,
            latencies.iter().sum::<f64>() / n.max(1) as f64,
            n as f64 * f64::from(o.batch) / seconds,
            report.is_some()
        ));
    }
    let mut arrivals = Arrivals(o.seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    // A generator of its own: the arrivals are the same with host work or
    // without.
    let mut host_times = Arrivals(o.seed.max(1).wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
    let cycle = (o.on_ms + o.off_ms) / 1e3;
    let mut next_arrival = 0.0f64;
    let mut latencies = Vec::new();
    // (arrival after the start, latency), ns, for `--requests`.
    let mut requests: Vec<(u64, u64)> = Vec::new();
    loop {
        next_arrival += arrivals.next_gap_s(o.rate);
        // Arrivals only in the ON part of each cycle: skip to the next one.
        let phase = next_arrival % cycle;
        if phase > o.on_ms / 1e3 {
            next_arrival += cycle - phase;
        }
        if next_arrival >= o.seconds {
            break;
        }
        let arrival = started + Duration::from_secs_f64(next_arrival);
        if let Some(wait) = arrival.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if o.host_us > 0.0 {
            for kernel in 0..o.kernels {
                if kernel > 0 {
                    let us = o.host_us * (0.5 + host_times.uniform());
                    host_work(Duration::from_secs_f64(us / 1e6));
                }
                launch()?;
            }
            stream.synchronize()?;
        } else {
            for _ in 0..o.kernels {
                launch()?;
                stream.synchronize()?;
            }
        }
        let latency = arrival.elapsed();
        if let Some(report) = report {
            report(latency.as_nanos() as u64);
        }
        latencies.push(latency.as_secs_f64() * 1e3);
        if o.requests.is_some() {
            requests.push(((next_arrival * 1e9) as u64, latency.as_nanos() as u64));
        }
    }
    if let Some(path) = &o.requests {
        let mut lines = format!("# start_ns {started_ns}\n");
        lines.extend(requests.iter().map(|(a, l)| format!("{a} {l}\n")));
        std::fs::write(path, lines).map_err(|e| format!("{path}: {e}"))?;
    }
    if let Some(path) = &o.latencies {
        let lines: String = latencies.iter().map(|l| format!("{l:.4}\n")).collect();
        std::fs::write(path, lines).map_err(|e| format!("{path}: {e}"))?;
    }
    write_launch_log()?;
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len();
    let violations = latencies.iter().filter(|&&l| l > o.slo_ms).count();
    // The p99's range: holds the true p99 but with at most 1.25% chance a
    // side (two of them, alone and beside, bound a ratio at 95%).
    let (low, high) = quantile::interval(&latencies, 0.99, P99_TAIL);
    let json = |bound: Option<f64>| bound.map_or("null".to_string(), |ms| format!("{ms:.3}"));
    Ok(format!(
        "{{\"mode\":\"serve\",\"requests\":{n},\"violations\":{violations},\"slo_violation_rate\":{:.4},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"p99_low_ms\":{},\"p99_high_ms\":{},\"reported\":{}}}",
        violations as f64 / n.max(1) as f64,
        quantile::quantile(&latencies, 0.5),
        quantile::quantile(&latencies, 0.99),
        json(low),
        json(high),
        report.is_some()
    ))
}

/// Host work of `length`: the thread stays on its CPU, as a framework's
/// Python does between launches (a sleep would hand the CPU to others and
/// wake late).
fn host_work(length: Duration) {
    let until = Instant::now() + length;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn main() -> ExitCode {
    dilu_harness::workload::main("demo-tenant", USAGE, parse, run)
}
