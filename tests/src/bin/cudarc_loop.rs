//! `cudarc-loop`: an ordinary CUDA program (through the `cudarc` crate,
//! dynamically loading libcuda) that launches a loop of kernels of chosen
//! sizes on chosen streams and prints its throughput.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;
use dilu_harness::ptx::{BLOCK_THREADS, BUSY_KERNEL, PTX};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: cudarc-loop [--seconds S] [--kernels N] [--blocks B[,B...]] [--streams K]
                   [--iters I] [--depth D] [--graph G] [--device N] [--devices N] [--wait-value]
                   [--alloc-on-default-stream] [--window FROM,TO] [--json]
  --seconds S   run for S seconds (default 2; with --kernels, whichever ends first)
  --kernels N   stop after N kernels
  --blocks B,.. grid sizes in blocks, used in turn (default 1320: 100 us on simgpu's default model)
  --streams K   launch round-robin on K new streams (default 1)
  --iters I     FMA iterations per thread, sets kernel length on a real GPU (default 2000)
  --depth D     synchronise after every D launches per stream (default 32); `never`:
                never let a stream drain (wait only for the work launched 128 launches
                earlier on it, as a real driver's bounded launch queue would)
  --graph G     capture G launches into a CUDA graph and launch the graph instead
  --device N    device ordinal (default 0)
  --devices N   run the loop on devices 0..N at once, one thread and context each
                (a data-parallel program); the summary gives each device's rate
  --wait-value  first order stream 0 by a memory value (cuStreamWaitValue32, already
                satisfied), as programs that order streams by values do
  --alloc-on-default-stream
                allocate the buffers (and round-trip the check pattern) on the
                context's default stream rather than on the streams that use them: a peer (XSched
                Level 1) queues an allocation on a stream it schedules and
                returns before the pointer is written
  --window FROM,TO
                also count the kernels completed between two instants (Unix time
                in seconds), seen at the synchronisations of --depth D: a run
                that starts before another program and ends after it reports
                its rate while that program ran (window_kernels_per_second)
  --json        also print a one-line JSON summary";

struct Options {
    seconds: f64,
    kernels: Option<u64>,
    blocks: Vec<u32>,
    streams: usize,
    iters: u32,
    /// Launches per stream between synchronisations; `None`: never.
    depth: Option<u64>,
    graph: Option<u32>,
    device: usize,
    devices: usize,
    wait_value: bool,
    alloc_on_default_stream: bool,
    /// `--window`: Unix times in seconds.
    window: Option<(f64, f64)>,
    json: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        seconds: 2.0,
        kernels: None,
        blocks: vec![1320],
        streams: 1,
        iters: 2000,
        depth: Some(32),
        graph: None,
        device: 0,
        devices: 1,
        wait_value: false,
        alloc_on_default_stream: false,
        window: None,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--json" {
            options.json = true;
            continue;
        }
        if flag == "--wait-value" {
            options.wait_value = true;
            continue;
        }
        if flag == "--alloc-on-default-stream" {
            options.alloc_on_default_stream = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--seconds" => options.seconds = parse(&flag, &value)?,
            "--kernels" => options.kernels = Some(parse(&flag, &value)?),
            "--blocks" => {
                options.blocks = value
                    .split(',')
                    .map(|b| parse(&flag, b.trim()))
                    .collect::<Result<_, _>>()?;
            }
            "--streams" => options.streams = parse(&flag, &value)?,
            "--iters" => options.iters = parse(&flag, &value)?,
            "--depth" if value == "never" => options.depth = None,
            "--depth" => options.depth = Some(parse(&flag, &value)?),
            "--graph" => options.graph = Some(parse(&flag, &value)?),
            "--device" => options.device = parse(&flag, &value)?,
            "--devices" => options.devices = parse(&flag, &value)?,
            "--window" => {
                let (from, to) = value
                    .split_once(',')
                    .ok_or_else(|| format!("--window {value:?}: expected FROM,TO"))?;
                let window = (parse(&flag, from.trim())?, parse(&flag, to.trim())?);
                if window.0 >= window.1 {
                    return Err(format!("--window {value:?}: FROM must be before TO"));
                }
                options.window = Some(window);
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if options.streams == 0
        || options.depth == Some(0)
        || options.blocks.contains(&0)
        || options.devices == 0
    {
        return Err("--streams, --depth, --blocks and --devices must be positive".into());
    }
    if options.window.is_some()
        && (options.depth.is_none() || options.graph.is_some() || options.devices > 1)
    {
        return Err(
            "--window counts completions at the synchronisations of --depth D: not with \
             --depth never, --graph or --devices"
                .into(),
        );
    }
    Ok(options)
}

fn parse<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("bad value {value:?} for {flag}"))
}

/// A tiny deterministic generator so mixed-size runs are repeatable.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn run(options: &Options) -> Result<String, Box<dyn std::error::Error>> {
    if options.devices > 1 {
        return run_devices(options);
    }
    let mut syncs = Vec::new();
    let (launched, seconds) = run_on(options, options.device, &mut syncs)?;
    let rate = launched as f64 / seconds;
    let mut summary = format!(
        "cudarc-loop: {launched} kernels in {seconds:.2} s on {} stream(s): {rate:.1} kernels/s",
        options.streams
    );
    let window = options.window.map(|w| window_rate(&syncs, w));
    if let Some(window) = &window {
        match window {
            Some((kernels, span)) => summary.push_str(&format!(
                "\ncudarc-loop: {kernels} kernels completed in {span:.2} s of the window: {:.1} kernels/s",
                *kernels as f64 / span
            )),
            None => summary.push_str("\ncudarc-loop: the run saw no two synchronisations inside the window"),
        }
    }
    if options.json {
        let window_fields = match window {
            Some(Some((kernels, span))) => format!(
                ",\"window_kernels\":{kernels},\"window_seconds\":{span:.6},\"window_kernels_per_second\":{:.3}",
                kernels as f64 / span
            ),
            _ => String::new(),
        };
        summary.push_str(&format!(
            "\n{{\"kernels\":{launched},\"seconds\":{seconds:.6},\"kernels_per_second\":{rate:.3},\"streams\":{}{window_fields},\"pid\":{}}}",
            options.streams,
            std::process::id()
        ));
    }
    Ok(summary)
}

/// The kernels completed between the first and the last synchronisation
/// inside `window` (Unix seconds), and the seconds between those two; `None`
/// when fewer than two fell inside it.
fn window_rate(syncs: &[(f64, u64)], (from, to): (f64, f64)) -> Option<(u64, f64)> {
    let inside: Vec<&(f64, u64)> = syncs
        .iter()
        .filter(|(t, _)| *t >= from && *t <= to)
        .collect();
    let (first, last) = (inside.first()?, inside.last()?);
    (last.0 > first.0).then(|| (last.1 - first.1, last.0 - first.0))
}

/// Now as Unix time in seconds.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `--devices N`: the loop on devices 0..N at once, one thread each.
fn run_devices(options: &Options) -> Result<String, Box<dyn std::error::Error>> {
    let results: Vec<Result<(u64, f64), String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..options.devices)
            .map(|device| {
                scope.spawn(move || {
                    run_on(options, device, &mut Vec::new()).map_err(|e| e.to_string())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a device's thread panicked".into()))
            })
            .collect()
    });
    let mut lines = Vec::new();
    let mut entries = Vec::new();
    for (device, result) in results.into_iter().enumerate() {
        let (launched, seconds) = result.map_err(|e| format!("device {device}: {e}"))?;
        let rate = launched as f64 / seconds;
        lines.push(format!(
            "cudarc-loop: device {device}: {launched} kernels in {seconds:.2} s: {rate:.1} kernels/s"
        ));
        entries.push(format!(
            "{{\"device\":{device},\"kernels\":{launched},\"seconds\":{seconds:.6},\"kernels_per_second\":{rate:.3}}}"
        ));
    }
    let mut summary = lines.join("\n");
    if options.json {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
        summary.push_str(&format!(
            "\n{{\"devices\":[{}],\"visible\":{visible:?},\"pid\":{}}}",
            entries.join(","),
            std::process::id()
        ));
    }
    Ok(summary)
}

/// The loop on `device`: kernels launched and seconds taken. With
/// `--window`, `syncs` gets (Unix time, kernels completed) at each
/// synchronisation of `--depth D`.
fn run_on(
    options: &Options,
    device: usize,
    syncs: &mut Vec<(f64, u64)>,
) -> Result<(u64, f64), Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(device)?;
    // Streams are independent here; cudarc's cross-stream event tracking
    // would add an event record and wait per launch.
    // SAFETY: this program never shares a buffer between streams.
    unsafe { ctx.disable_event_tracking() };
    let module = ctx.load_module(Ptx::from_src(PTX))?;
    let function = module.load_function(BUSY_KERNEL)?;
    let streams: Vec<Arc<CudaStream>> = (0..options.streams)
        .map(|_| ctx.new_stream())
        .collect::<Result<_, _>>()?;

    let max_blocks = *options.blocks.iter().max().expect("non-empty");
    let elements = (max_blocks as usize) * (BLOCK_THREADS as usize);
    let buffers: Vec<CudaSlice<f32>> = if options.alloc_on_default_stream {
        let default = ctx.default_stream();
        let buffers = streams
            .iter()
            .map(|_| default.alloc_zeros::<f32>(elements))
            .collect::<Result<_, _>>()?;
        // The streams are not ordered after the default stream's work.
        default.synchronize()?;
        buffers
    } else {
        streams
            .iter()
            .map(|s| s.alloc_zeros::<f32>(elements))
            .collect::<Result<_, _>>()?
    };

    if options.wait_value {
        use cudarc::driver::DevicePtr;
        let (zeros, _in_use) = buffers[0].device_ptr(&streams[0]);
        // SAFETY: a live stream and device buffer of this context; waiting
        // for a value >= 0 (CU_STREAM_WAIT_VALUE_GEQ) is satisfied at once.
        let result = unsafe { sys::cuStreamWaitValue32_v2(streams[0].cu_stream(), zeros, 0, 0) };
        eprintln!("cudarc-loop: cuStreamWaitValue32_v2 returned {result:?}");
    }

    // Memory must really hold data: round-trip a pattern before the loop.
    let pattern: Vec<f32> = (0..4096).map(|i| i as f32 * 0.5).collect();
    let copy_stream = if options.alloc_on_default_stream {
        ctx.default_stream()
    } else {
        streams[0].clone()
    };
    let device_copy = copy_stream.clone_htod(&pattern)?;
    let back = copy_stream.clone_dtoh(&device_copy)?;
    if back != pattern {
        return Err("device memory round-trip returned different data".into());
    }

    let mut rng = SplitMix(0x5eed);
    let mut launched: u64 = 0;
    let deadline = Duration::from_secs_f64(options.seconds);
    let started = Instant::now();
    let launch_one = |stream: &Arc<CudaStream>, buffer: &CudaSlice<f32>, blocks: u32| {
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&function);
        builder.arg(buffer).arg(&options.iters);
        // SAFETY: `busy` takes (float*, u32) and the buffer holds grid × block floats.
        unsafe { builder.launch(config) }.map(|_| ())
    };

    if let Some(graph_len) = options.graph {
        let stream = &streams[0];
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        for _ in 0..graph_len {
            let blocks = options.blocks[(rng.next() as usize) % options.blocks.len()];
            launch_one(stream, &buffers[0], blocks)?;
        }
        let graph = stream
            .end_capture(sys::CUgraphInstantiate_flags(0))?
            .ok_or("stream capture produced no graph")?;
        let mut since_sync = 0;
        let never = NeverDrain::new(&ctx, 1)?;
        while started.elapsed() < deadline && options.kernels.is_none_or(|n| launched < n) {
            graph.launch()?;
            launched += u64::from(graph_len);
            since_sync += 1;
            match options.depth {
                Some(depth) if since_sync >= depth => {
                    stream.synchronize()?;
                    since_sync = 0;
                }
                Some(_) => {}
                None => never.launched(0, stream, u64::from(graph_len))?,
            }
        }
    } else {
        let never = NeverDrain::new(&ctx, streams.len())?;
        'outer: loop {
            for (stream, buffer) in streams.iter().zip(&buffers) {
                if started.elapsed() >= deadline || options.kernels.is_some_and(|n| launched >= n) {
                    break 'outer;
                }
                let blocks = options.blocks[(rng.next() as usize) % options.blocks.len()];
                launch_one(stream, buffer, blocks)?;
                launched += 1;
            }
            match options.depth {
                Some(depth) if launched.is_multiple_of(depth * options.streams as u64) => {
                    for stream in &streams {
                        stream.synchronize()?;
                    }
                    if options.window.is_some() {
                        syncs.push((unix_now(), launched));
                    }
                }
                Some(_) => {}
                None => {
                    for (index, stream) in streams.iter().enumerate() {
                        never.launched(index, stream, 1)?;
                    }
                }
            }
        }
    }
    for stream in &streams {
        stream.synchronize()?;
    }
    if options.window.is_some() {
        syncs.push((unix_now(), launched));
    }
    Ok((launched, started.elapsed().as_secs_f64()))
}

/// `--depth never`: each stream waits only for the work it launched
/// [`NeverDrain::AHEAD`] launches earlier, so it always has that much queued
/// and never runs dry (a real driver blocks a launch once its queue is full;
/// simgpu's queue has no bound).
struct NeverDrain {
    /// Per stream: launches since its marker was recorded, and the marker.
    streams: std::cell::RefCell<Vec<(u64, cudarc::driver::CudaEvent)>>,
}

impl NeverDrain {
    const AHEAD: u64 = 128;

    fn new(ctx: &Arc<CudaContext>, streams: usize) -> Result<Self, cudarc::driver::DriverError> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let markers = (0..streams)
            .map(|_| ctx.new_event(flags).map(|event| (0, event)))
            .collect::<Result<_, _>>()?;
        Ok(NeverDrain {
            streams: std::cell::RefCell::new(markers),
        })
    }

    /// `launches` more kernels were launched on `stream` (number `index`).
    fn launched(
        &self,
        index: usize,
        stream: &Arc<CudaStream>,
        launches: u64,
    ) -> Result<(), cudarc::driver::DriverError> {
        let mut streams = self.streams.borrow_mut();
        let (count, marker) = &mut streams[index];
        *count += launches;
        if *count >= Self::AHEAD {
            // The work up to the previous marker is done: AHEAD launches
            // stay queued behind it.
            marker.synchronize()?;
            marker.record(stream)?;
            *count = 0;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    dilu_harness::workload::main("cudarc-loop", USAGE, parse_options, run)
}
