//! `gpu-calibrate`: measures, on a real NVIDIA GPU, the quantities simgpu's
//! time-sliced model is set by (`simgpu/README.md`, *Calibration*), so its
//! defaults can cite a measurement instead of a guess:
//!
//! - host time of each priced driver call (launch, event record timed and
//!   untimed, query, elapsed, create, synchronise, alloc, free, mem-get-info,
//!   a small copy, a memset);
//! - the device gap between back-to-back kernels of one stream;
//! - kernel-duration jitter and slow drift (event-timed FMA kernels);
//! - whether kernels of two streams of one process overlap;
//! - time slicing between two processes: slice length, the device time lost
//!   per switch, and whether a running thread block is preempted;
//! - hand-offs between two processes that each run requests (4 kernels of
//!   100 µs, then a synchronise): the device gap when the other process's
//!   kernel follows, beside the gap when one's own kernel follows.
//!
//! Device-side timing reads `%globaltimer` (one clock for every context on
//! the device). On simgpu kernels do not execute, so the probes that need
//! `%globaltimer` say so and are skipped; the host-cost and jitter probes
//! run there too (a smoke test, and simgpu's own answers for comparison).
//!
//! `scripts/gpu-check.sh` runs `gpu-calibrate all` and keeps its report.

use cudarc::driver::{result, sys};
use dilu_bench::driver::monotonic_ns;
use dilu_bench::report::{self, Table};
use dilu_bench::{median, percentile};
use std::ffi::{CString, c_void};
use std::process::{Command, ExitCode};
use std::time::Duration;

const USAGE: &str = "usage: gpu-calibrate [all|host|gap|jitter|streams|slice|handoff] [--seconds S]
  all      every probe below (default), a markdown report on stdout
  host     host time per driver call (median and p90 of single timed calls)
  gap      device gap between back-to-back kernels of one stream (%globaltimer)
  jitter   spread of event-timed kernel durations, and their slow drift
  streams  do two streams of one process run kernels at the same time?
  slice    two processes with long kernels: time-slice length, time lost per
           switch, preemption inside a running thread block
  handoff  two processes running requests (4 × 100 µs kernels, then a synchronise):
           the device gap at a hand-off between them and within one
  --seconds S  length of the jitter and slice runs (default 4)";

/// Kernels: `noop`; `span(u64* out, u64 ns)` spins every thread for `ns` of
/// `%globaltimer` and folds each block's start (min) and end (max) into
/// out[0..2]; `slicer(u64* out, u32 cap, u64 run_ns, u64 threshold_ns)`
/// spins every block for `run_ns`, and block 0 records each jump of the
/// timer over `threshold_ns` (the block was not running) as a pair in
/// out[2..], with out[0] = its start and out[1] = the number of jumps;
/// `busy(float*, u32 iters)`: dependent FMAs, a kernel that does real work.
const PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry noop()
{
    ret;
}

.visible .entry span(.param .u64 span_out, .param .u64 span_ns)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [span_out];
    ld.param.u64 %rd2, [span_ns];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd4, %rd3, %rd2;
SPAN_LOOP:
    mov.u64 %rd5, %globaltimer;
    setp.lt.u64 %p1, %rd5, %rd4;
    @%p1 bra SPAN_LOOP;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra SPAN_DONE;
    atom.global.min.u64 %rd6, [%rd1], %rd3;
    atom.global.max.u64 %rd7, [%rd1+8], %rd5;
SPAN_DONE:
    ret;
}

.visible .entry slicer(.param .u64 sl_out, .param .u32 sl_cap, .param .u64 sl_run, .param .u64 sl_threshold)
{
    .reg .pred %p<5>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [sl_out];
    cvta.to.global.u64 %rd1, %rd1;
    ld.param.u32 %r1, [sl_cap];
    ld.param.u64 %rd2, [sl_run];
    ld.param.u64 %rd3, [sl_threshold];
    mov.u64 %rd4, %globaltimer;
    add.u64 %rd5, %rd4, %rd2;
    mov.u64 %rd6, %rd4;
    mov.u32 %r2, 0;
    mov.u32 %r3, %ctaid.x;
    setp.ne.u32 %p4, %r3, 0;
SL_LOOP:
    mov.u64 %rd7, %globaltimer;
    sub.u64 %rd8, %rd7, %rd6;
    setp.le.u64 %p1, %rd8, %rd3;
    @%p1 bra SL_NEXT;
    @%p4 bra SL_NEXT;
    setp.ge.u32 %p2, %r2, %r1;
    @%p2 bra SL_COUNT;
    mul.wide.u32 %rd9, %r2, 16;
    add.u64 %rd10, %rd1, %rd9;
    st.global.u64 [%rd10+16], %rd6;
    st.global.u64 [%rd10+24], %rd7;
SL_COUNT:
    add.u32 %r2, %r2, 1;
SL_NEXT:
    mov.u64 %rd6, %rd7;
    setp.lt.u64 %p3, %rd7, %rd5;
    @%p3 bra SL_LOOP;
    @%p4 bra SL_DONE;
    st.global.u64 [%rd1], %rd4;
    cvt.u64.u32 %rd11, %r2;
    st.global.u64 [%rd1+8], %rd11;
SL_DONE:
    ret;
}

.visible .entry busy(.param .u64 busy_data, .param .u32 busy_iters)
{
    .reg .pred %p<2>;
    .reg .f32 %f<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [busy_data];
    ld.param.u32 %r1, [busy_iters];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    mov.f32 %f2, 0f3F800000;
    mov.u32 %r6, 0;
BUSY_LOOP:
    setp.ge.u32 %p1, %r6, %r1;
    @%p1 bra BUSY_DONE;
    fma.rn.f32 %f1, %f1, 0f3F7FFF58, %f2;
    add.u32 %r6, %r6, 1;
    bra BUSY_LOOP;
BUSY_DONE:
    st.global.f32 [%rd4], %f1;
    ret;
}
"#;

/// Grid of the FMA kernel: ten waves of 132 blocks (100 µs on simgpu's
/// default cost model, and the shape of the SM-time benchmark's kernels).
const BUSY_BLOCKS: u32 = 1320;
const BUSY_THREADS: u32 = 128;
/// Gaps a slicer kernel can record (each kernel runs 200 ms; a 1 ms slice
/// gives about 100).
const SLICER_CAP: u32 = 8192;
const SLICER_RUN_NS: u64 = 200_000_000;
/// A `%globaltimer` jump larger than this means the block was not running.
const SLICER_THRESHOLD_NS: u64 = 3_000;

type Fallible<T> = Result<T, String>;

fn driver_error(what: &'static str) -> impl Fn(result::DriverError) -> String {
    move |error| format!("{what}: {error:?}")
}

struct Gpu {
    name: String,
    sms: u32,
    stream: sys::CUstream,
    noop: sys::CUfunction,
    span: sys::CUfunction,
    slicer: sys::CUfunction,
    busy: sys::CUfunction,
}

fn open_gpu() -> Fallible<Gpu> {
    result::init().map_err(driver_error("cuInit"))?;
    let device = result::device::get(0).map_err(driver_error("cuDeviceGet"))?;
    let name = result::device::get_name(device).map_err(driver_error("cuDeviceGetName"))?;
    let ptx = CString::new(PTX).expect("no NUL in the PTX");
    let function = |module, name: &str| {
        // SAFETY: a module loaded below and a NUL-free entry name of it.
        unsafe { result::module::get_function(module, CString::new(name).expect("no NUL")) }
            .map_err(|e| format!("cuModuleGetFunction({name}): {e:?}"))
    };
    // SAFETY: (block) cuda.h contracts: a device from cuDeviceGet, its
    // primary context made current before any other call, a NUL-terminated
    // PTX image.
    let (module, sms) = unsafe {
        let context = result::primary_ctx::retain(device)
            .map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
        result::ctx::set_current(context).map_err(driver_error("cuCtxSetCurrent"))?;
        let sms = result::device::get_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(driver_error("cuDeviceGetAttribute"))?;
        let module = result::module::load_data(ptx.as_ptr().cast())
            .map_err(driver_error("cuModuleLoadData"))?;
        (module, sms)
    };
    let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
        .map_err(driver_error("cuStreamCreate"))?;
    Ok(Gpu {
        name,
        sms: sms.max(1) as u32,
        stream,
        noop: function(module, "noop")?,
        span: function(module, "span")?,
        slicer: function(module, "slicer")?,
        busy: function(module, "busy")?,
    })
}

/// Launches `function` with the given parameters (pointers to their values).
fn launch(
    function: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Fallible<()> {
    // SAFETY: every caller passes pointers to values of the types the PTX
    // entry declares, in its order, alive for the call.
    unsafe { result::launch_kernel(function, (grid, 1, 1), (block, 1, 1), 0, stream, params) }
        .map_err(driver_error("cuLaunchKernel"))
}

fn sync(stream: sys::CUstream) -> Fallible<()> {
    // SAFETY: a stream created by this program and not destroyed.
    unsafe { result::stream::synchronize(stream) }.map_err(driver_error("cuStreamSynchronize"))
}

/// Device memory of `words` u64s, filled with `fill`.
fn device_words(words: &[u64]) -> Fallible<sys::CUdeviceptr> {
    // SAFETY: allocates exactly the bytes copied into it.
    unsafe {
        let pointer = result::malloc_sync(words.len() * 8).map_err(driver_error("cuMemAlloc"))?;
        result::memcpy_htod_sync(pointer, words).map_err(driver_error("cuMemcpyHtoD"))?;
        Ok(pointer)
    }
}

fn read_words(pointer: sys::CUdeviceptr, count: usize) -> Fallible<Vec<u64>> {
    let mut words = vec![0u64; count];
    // SAFETY: `pointer` holds at least `count` u64s (its allocation).
    unsafe { result::memcpy_dtoh_sync(&mut words, pointer) }
        .map_err(driver_error("cuMemcpyDtoH"))?;
    Ok(words)
}

fn free(pointer: sys::CUdeviceptr) {
    // SAFETY: a pointer from cuMemAlloc, freed once.
    let _ = unsafe { result::free_sync(pointer) };
}

/// Median and 90th percentile of single timed calls of `call`.
fn time_calls(
    reps: usize,
    mut before: impl FnMut() -> Fallible<()>,
    mut call: impl FnMut() -> Fallible<()>,
) -> Fallible<(f64, f64)> {
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        before()?;
        let started = monotonic_ns();
        call()?;
        samples.push((monotonic_ns() - started) as f64);
    }
    Ok((median(&mut samples), percentile(&mut samples, 90.0)))
}

fn host_costs(gpu: &Gpu) -> Fallible<String> {
    let reps = 2000;
    let stream = gpu.stream;
    let nothing = || Ok(());
    let mut table = Table::new(&["call", "median ns", "p90 ns", "simgpu name"]);
    let mut add = |label: &str, simgpu: &str, (p50, p90): (f64, f64)| {
        table.row(vec![
            label.into(),
            report::ns(p50),
            report::ns(p90),
            simgpu.into(),
        ]);
    };
    // Launches: the queue drains every 256 (untimed) so it never fills.
    let mut launched = 0u32;
    add(
        "cuLaunchKernel (no-op, 1×1)",
        "launch",
        time_calls(
            reps,
            || {
                launched += 1;
                if launched.is_multiple_of(256) {
                    sync(stream)
                } else {
                    Ok(())
                }
            },
            || launch(gpu.noop, 1, 1, stream, &mut []),
        )?,
    );
    sync(stream)?;
    let timed = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        .map_err(driver_error("cuEventCreate"))?;
    let other = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
        .map_err(driver_error("cuEventCreate"))?;
    let untimed = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(driver_error("cuEventCreate"))?;
    // SAFETY: (block) events and stream created above, alive throughout.
    unsafe {
        add(
            "cuEventRecord (timed)",
            "event_record",
            time_calls(reps, nothing, || {
                result::event::record(timed, stream).map_err(driver_error("cuEventRecord"))
            })?,
        );
        add(
            "cuEventRecord (CU_EVENT_DISABLE_TIMING)",
            "event_record_untimed",
            time_calls(reps, nothing, || {
                result::event::record(untimed, stream).map_err(driver_error("cuEventRecord"))
            })?,
        );
        result::event::record(other, stream).map_err(driver_error("cuEventRecord"))?;
        sync(stream)?;
        add(
            "cuEventQuery (completed)",
            "event_query",
            time_calls(reps, nothing, || {
                result::event::query(timed).map_err(driver_error("cuEventQuery"))
            })?,
        );
        add(
            "cuEventElapsedTime",
            "event_elapsed",
            time_calls(reps, nothing, || {
                result::event::elapsed(timed, other)
                    .map(|_| ())
                    .map_err(driver_error("cuEventElapsedTime"))
            })?,
        );
        let mut created = Vec::with_capacity(reps);
        add(
            "cuEventCreate",
            "event_create",
            time_calls(reps, nothing, || {
                created.push(
                    result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                        .map_err(driver_error("cuEventCreate"))?,
                );
                Ok(())
            })?,
        );
        for event in created {
            let _ = result::event::destroy(event);
        }
        add(
            "cuStreamSynchronize (idle stream)",
            "synchronize",
            time_calls(reps, nothing, || sync(stream))?,
        );
        add(
            "cuCtxSynchronize (idle)",
            "synchronize",
            time_calls(reps, nothing, || {
                result::ctx::synchronize().map_err(driver_error("cuCtxSynchronize"))
            })?,
        );
        let mut pointers = Vec::with_capacity(reps);
        add(
            "cuMemAlloc (1 MiB)",
            "mem_alloc",
            time_calls(reps / 4, nothing, || {
                pointers.push(result::malloc_sync(1 << 20).map_err(driver_error("cuMemAlloc"))?);
                Ok(())
            })?,
        );
        add(
            "cuMemFree (1 MiB, idle device)",
            "mem_free",
            time_calls(pointers.len(), nothing, || {
                result::free_sync(pointers.pop().expect("one per alloc"))
                    .map_err(driver_error("cuMemFree"))
            })?,
        );
        add(
            "cuMemGetInfo",
            "mem_get_info",
            time_calls(reps, nothing, || {
                result::mem_get_info()
                    .map(|_| ())
                    .map_err(driver_error("cuMemGetInfo"))
            })?,
        );
        let small = device_words(&[0; 512])?;
        add(
            "cuMemcpyHtoD (8 bytes, synchronous)",
            "copy",
            time_calls(reps, nothing, || {
                result::memcpy_htod_sync(small, &[7u64]).map_err(driver_error("cuMemcpyHtoD"))
            })?,
        );
        let mut memsets = 0u32;
        add(
            "cuMemsetD8Async (4 KiB)",
            "copy",
            time_calls(
                reps,
                || {
                    memsets += 1;
                    if memsets.is_multiple_of(256) {
                        sync(stream)
                    } else {
                        Ok(())
                    }
                },
                || {
                    result::memset_d8_async(small, 0, 4096, stream)
                        .map_err(driver_error("cuMemsetD8Async"))
                },
            )?,
        );
        sync(stream)?;
        free(small);
        for event in [timed, other, untimed] {
            let _ = result::event::destroy(event);
        }
    }
    Ok(format!(
        "## Host time per driver call\n\n{reps} single calls each (alloc/free {}), timed with CLOCK_MONOTONIC around the call.\n\n{}",
        reps / 4,
        table.markdown()
    ))
}

/// Start and end (`%globaltimer`) of `count` span kernels of `grid` blocks
/// launched back to back on one stream; None where kernels did not run
/// (simgpu).
fn span_kernels(
    gpu: &Gpu,
    count: usize,
    grid: u32,
    threads: u32,
    spin_ns: u64,
) -> Fallible<Option<Vec<(u64, u64)>>> {
    let init: Vec<u64> = (0..count).flat_map(|_| [u64::MAX, 0]).collect();
    let out = device_words(&init)?;
    for index in 0..count {
        let mut slot = out + (index as u64) * 16;
        let mut spin = spin_ns;
        launch(
            gpu.span,
            grid,
            threads,
            gpu.stream,
            &mut [(&raw mut slot).cast(), (&raw mut spin).cast()],
        )?;
    }
    sync(gpu.stream)?;
    let words = read_words(out, count * 2)?;
    free(out);
    let spans: Vec<(u64, u64)> = words.chunks(2).map(|w| (w[0], w[1])).collect();
    Ok(spans
        .iter()
        .all(|&(s, e)| s != u64::MAX && e >= s)
        .then_some(spans))
}

const NO_TIMER: &str =
    "skipped: kernels did not run (no %globaltimer stamps; a simulated driver?)\n";

fn kernel_gap(gpu: &Gpu) -> Fallible<String> {
    let mut table = Table::new(&[
        "kernels",
        "grid × threads",
        "spin µs",
        "gap p10 µs",
        "gap median µs",
        "gap p90 µs",
        "duration over spin µs",
    ]);
    for (grid, threads, spin_ns) in [
        (1, 32, 20_000u64),
        (gpu.sms * 8, 128, 20_000),
        (1, 32, 100_000),
    ] {
        let count = 400;
        // A first batch warms up clocks and the module.
        span_kernels(gpu, 50, grid, threads, spin_ns)?;
        let Some(spans) = span_kernels(gpu, count, grid, threads, spin_ns)? else {
            return Ok(format!(
                "## Device gap between back-to-back kernels\n\n{NO_TIMER}"
            ));
        };
        let mut gaps: Vec<f64> = spans
            .windows(2)
            .map(|w| w[1].0.saturating_sub(w[0].1) as f64 / 1e3)
            .collect();
        let mut extra: Vec<f64> = spans
            .iter()
            .map(|(s, e)| (e - s) as f64 / 1e3 - spin_ns as f64 / 1e3)
            .collect();
        table.row(vec![
            count.to_string(),
            format!("{grid} × {threads}"),
            format!("{}", spin_ns / 1000),
            format!("{:.2}", percentile(&mut gaps, 10.0)),
            format!("{:.2}", median(&mut gaps)),
            format!("{:.2}", percentile(&mut gaps, 90.0)),
            format!("{:.2}", median(&mut extra)),
        ]);
    }
    Ok(format!(
        "## Device gap between back-to-back kernels\n\nOne stream, all kernels queued ahead; gap = next kernel's first block start − this kernel's last block end (`%globaltimer`).\n\n{}",
        table.markdown()
    ))
}

/// Event-timed durations (µs) of `busy` kernels for `seconds`.
fn busy_durations(gpu: &Gpu, iters: u32, seconds: f64) -> Fallible<Vec<(f64, f64)>> {
    let data = device_words(&vec![0u64; (BUSY_BLOCKS * BUSY_THREADS) as usize / 2])?;
    let batch = 100;
    let events: Vec<sys::CUevent> = (0..batch * 2)
        .map(|_| {
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(driver_error("cuEventCreate"))
        })
        .collect::<Fallible<_>>()?;
    let started = monotonic_ns();
    let mut samples = Vec::new();
    while (monotonic_ns() - started) as f64 / 1e9 < seconds {
        let at = (monotonic_ns() - started) as f64 / 1e9;
        for pair in events.chunks(2) {
            let (mut pointer, mut n) = (data, iters);
            // SAFETY: events created above, the stream of this program.
            unsafe { result::event::record(pair[0], gpu.stream) }
                .map_err(driver_error("cuEventRecord"))?;
            launch(
                gpu.busy,
                BUSY_BLOCKS,
                BUSY_THREADS,
                gpu.stream,
                &mut [(&raw mut pointer).cast(), (&raw mut n).cast()],
            )?;
            // SAFETY: as above.
            unsafe { result::event::record(pair[1], gpu.stream) }
                .map_err(driver_error("cuEventRecord"))?;
        }
        sync(gpu.stream)?;
        for pair in events.chunks(2) {
            // SAFETY: both events recorded and completed (synchronised above).
            let ms = unsafe { result::event::elapsed(pair[0], pair[1]) }
                .map_err(driver_error("cuEventElapsedTime"))?;
            samples.push((at, f64::from(ms) * 1e3));
        }
    }
    for event in events {
        // SAFETY: created above, destroyed once.
        let _ = unsafe { result::event::destroy(event) };
    }
    free(data);
    Ok(samples)
}

fn jitter(gpu: &Gpu, seconds: f64) -> Fallible<String> {
    // Find the iterations that make a ~100 µs kernel on this device.
    let probe_iters = 2000;
    let mut probe: Vec<f64> = busy_durations(gpu, probe_iters, 0.3)?
        .iter()
        .map(|s| s.1)
        .collect();
    let probe_us = median(&mut probe);
    let mut table = Table::new(&[
        "target µs",
        "iters",
        "kernels",
        "median µs",
        "σ of ln(duration), within 0.5 s windows",
        "p99/median",
        "drift: σ of ln(window mean)",
    ]);
    for target_us in [100.0, 20.0] {
        let iters = if probe_us > 0.0 {
            ((probe_iters as f64) * target_us / probe_us)
                .round()
                .max(1.0) as u32
        } else {
            probe_iters
        };
        let samples = busy_durations(gpu, iters, seconds / 2.0)?;
        let mut windows: Vec<Vec<f64>> = Vec::new();
        for &(at, us) in &samples {
            let index = (at / 0.5) as usize;
            if windows.len() <= index {
                windows.resize(index + 1, Vec::new());
            }
            windows[index].push(us);
        }
        windows.retain(|w| w.len() >= 20);
        let sigma = |values: &[f64]| {
            let logs: Vec<f64> = values.iter().map(|v| v.max(1e-3).ln()).collect();
            let mean = logs.iter().sum::<f64>() / logs.len() as f64;
            (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / logs.len() as f64).sqrt()
        };
        let mut within: Vec<f64> = windows.iter().map(|w| sigma(w)).collect();
        let means: Vec<f64> = windows
            .iter()
            .map(|w| w.iter().sum::<f64>() / w.len() as f64)
            .collect();
        let mut all: Vec<f64> = samples.iter().map(|s| s.1).collect();
        let mid = median(&mut all);
        table.row(vec![
            format!("{target_us:.0}"),
            iters.to_string(),
            samples.len().to_string(),
            format!("{mid:.2}"),
            format!("{:.4}", median(&mut within)),
            format!("{:.3}", percentile(&mut all, 99.0) / mid),
            format!(
                "{:.4}",
                if means.len() > 1 {
                    sigma(&means)
                } else {
                    f64::NAN
                }
            ),
        ]);
    }
    Ok(format!(
        "## Kernel-duration jitter and drift\n\n`busy` (dependent FMAs), {BUSY_BLOCKS} blocks × {BUSY_THREADS} threads, one stream, each kernel between two timed events; {:.1} s per row.\n\n{}",
        seconds / 2.0,
        table.markdown()
    ))
}

fn streams(gpu: &Gpu) -> Fallible<String> {
    let second = result::stream::create(result::stream::StreamKind::NonBlocking)
        .map_err(driver_error("cuStreamCreate"))?;
    let mut table = Table::new(&[
        "kernels (one per stream)",
        "grid × threads",
        "spin µs",
        "overlap of the two",
        "makespan / one kernel",
    ]);
    // Small grids fit side by side; full grids (two 1024-thread blocks per
    // SM fill an SM's 2048 threads) must take turns.
    for (grid, threads) in [(1u32, 32u32), (gpu.sms, 128), (gpu.sms * 2, 1024)] {
        let spin_ns = 2_000_000u64;
        let out = device_words(&[u64::MAX, 0, u64::MAX, 0])?;
        for (index, stream) in [gpu.stream, second].into_iter().enumerate() {
            let mut slot = out + index as u64 * 16;
            let mut spin = spin_ns;
            launch(
                gpu.span,
                grid,
                threads,
                stream,
                &mut [(&raw mut slot).cast(), (&raw mut spin).cast()],
            )?;
        }
        sync(gpu.stream)?;
        sync(second)?;
        let w = read_words(out, 4)?;
        free(out);
        if w[0] == u64::MAX || w[2] == u64::MAX {
            return Ok(format!("## Streams of one process\n\n{NO_TIMER}"));
        }
        let overlap = w[1].min(w[3]).saturating_sub(w[0].max(w[2])) as f64;
        let one = ((w[1] - w[0]).min(w[3] - w[2])) as f64;
        let makespan = (w[1].max(w[3]) - w[0].min(w[2])) as f64;
        table.row(vec![
            "2".into(),
            format!("{grid} × {threads}"),
            format!("{}", spin_ns / 1000),
            format!("{:.0}%", 100.0 * overlap / one),
            format!("{:.2}", makespan / one),
        ]);
    }
    // SAFETY: created above, destroyed once, idle (synchronised).
    let _ = unsafe { result::stream::destroy(second) };
    Ok(format!(
        "## Streams of one process\n\nTwo non-blocking streams, one `span` kernel each, launched back to back; overlap = time both ran / the shorter kernel.\n\n{}",
        table.markdown()
    ))
}

/// One process of the slice probe: slicer kernels from `start_at`
/// (CLOCK_MONOTONIC ns) for `seconds`. Prints `K start end` per kernel and
/// `G from to` per timer jump of block 0.
fn slice_child(start_at: u64, seconds: f64) -> Fallible<()> {
    let gpu = open_gpu()?;
    let words = 2 + 2 * SLICER_CAP as usize;
    let out = device_words(&vec![0u64; words])?;
    while monotonic_ns() < start_at {
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut lines = String::new();
    let deadline = start_at + (seconds * 1e9) as u64;
    while monotonic_ns() < deadline {
        let (mut pointer, mut cap, mut run, mut threshold) =
            (out, SLICER_CAP, SLICER_RUN_NS, SLICER_THRESHOLD_NS);
        launch(
            gpu.slicer,
            gpu.sms,
            1,
            gpu.stream,
            &mut [
                (&raw mut pointer).cast(),
                (&raw mut cap).cast(),
                (&raw mut run).cast(),
                (&raw mut threshold).cast(),
            ],
        )?;
        sync(gpu.stream)?;
        let w = read_words(out, words)?;
        let recorded = (w[1] as usize).min(SLICER_CAP as usize);
        lines.push_str(&format!("K {} {} {}\n", w[0], w[0] + SLICER_RUN_NS, w[1]));
        for pair in w[2..2 + 2 * recorded].chunks(2) {
            lines.push_str(&format!("G {} {}\n", pair[0], pair[1]));
        }
    }
    free(out);
    print!("{lines}");
    Ok(())
}

struct ProcessTimeline {
    /// (start, end) of each kernel.
    kernels: Vec<(u64, u64)>,
    /// Intervals inside a kernel when the process was not running.
    gaps: Vec<(u64, u64)>,
}

impl ProcessTimeline {
    fn parse(text: &str) -> ProcessTimeline {
        let mut timeline = ProcessTimeline {
            kernels: Vec::new(),
            gaps: Vec::new(),
        };
        for line in text.lines() {
            let fields: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            match (line.chars().next(), fields.as_slice()) {
                (Some('K'), [start, end, ..]) => timeline.kernels.push((*start, *end)),
                (Some('G'), [from, to]) => timeline.gaps.push((*from, *to)),
                _ => {}
            }
        }
        timeline
    }

    /// Intervals when this process ran, inside its kernels.
    fn runs(&self) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        for &(start, end) in &self.kernels {
            let mut from = start;
            for &(gap_from, gap_to) in self
                .gaps
                .iter()
                .filter(|g| g.0 >= start && g.1 <= end + 1_000_000)
            {
                if gap_from > from {
                    runs.push((from, gap_from));
                }
                from = gap_to;
            }
            if end > from {
                runs.push((from, end));
            }
        }
        runs
    }
}

fn run_slice_children(count: usize, seconds: f64) -> Fallible<Vec<ProcessTimeline>> {
    Ok(run_children("slice-child", count, seconds)?
        .iter()
        .map(|text| ProcessTimeline::parse(text))
        .collect())
}

/// Runs `count` copies of a child mode that start their kernels together;
/// returns what each printed.
fn run_children(mode: &str, count: usize, seconds: f64) -> Fallible<Vec<String>> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // Both start their kernels at the same moment, after their set-up.
    let start_at = monotonic_ns() + 3_000_000_000;
    let children: Vec<_> = (0..count)
        .map(|_| {
            Command::new(&exe)
                .args([mode, &start_at.to_string(), &seconds.to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("spawn slice-child: {e}"))
        })
        .collect::<Fallible<_>>()?;
    let mut printed = Vec::new();
    for child in children {
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!(
                "{mode} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        printed.push(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Ok(printed)
}

/// Kernels per request and their length in the hand-off probe.
const REQUEST_KERNELS: usize = 4;
const REQUEST_KERNEL_NS: u64 = 100_000;

/// One process of the hand-off probe: requests of [`REQUEST_KERNELS`] span
/// kernels, each followed by a synchronise. Prints `S start end` per kernel.
fn handoff_child(start_at: u64, seconds: f64) -> Fallible<()> {
    let gpu = open_gpu()?;
    let init: Vec<u64> = (0..REQUEST_KERNELS).flat_map(|_| [u64::MAX, 0]).collect();
    let out = device_words(&init)?;
    while monotonic_ns() < start_at {
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut lines = String::new();
    let deadline = start_at + (seconds * 1e9) as u64;
    while monotonic_ns() < deadline {
        // SAFETY: `out` holds exactly `init`'s words.
        unsafe { result::memcpy_htod_sync(out, &init) }.map_err(driver_error("cuMemcpyHtoD"))?;
        for index in 0..REQUEST_KERNELS {
            let mut slot = out + index as u64 * 16;
            let mut spin = REQUEST_KERNEL_NS;
            launch(
                gpu.span,
                1,
                32,
                gpu.stream,
                &mut [(&raw mut slot).cast(), (&raw mut spin).cast()],
            )?;
        }
        sync(gpu.stream)?;
        for pair in read_words(out, REQUEST_KERNELS * 2)?.chunks(2) {
            lines.push_str(&format!("S {} {}\n", pair[0], pair[1]));
        }
    }
    free(out);
    print!("{lines}");
    Ok(())
}

fn handoff(seconds: f64) -> Fallible<String> {
    let mut text = format!(
        "## Hand-offs between two processes running requests\n\nEach process runs requests of {REQUEST_KERNELS} `span` kernels of {} µs (one block) and a synchronise, for {seconds:.1} s; every kernel's start and end (`%globaltimer`), both processes' kernels in one timeline.\n\n",
        REQUEST_KERNEL_NS / 1000
    );
    let printed = run_children("handoff-child", 2, seconds)?;
    let mut kernels: Vec<(u64, u64, usize)> = Vec::new();
    for (process, text) in printed.iter().enumerate() {
        for line in text.lines() {
            let fields: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|f| f.parse().ok())
                .collect();
            if let [start, end] = fields.as_slice()
                && *start != u64::MAX
            {
                kernels.push((*start, *end, process));
            }
        }
    }
    if kernels.is_empty() {
        return Ok(text + NO_TIMER);
    }
    kernels.sort_unstable();
    let (mut handoffs, mut own) = (Vec::new(), Vec::new());
    for pair in kernels.windows(2) {
        let gap = pair[1].0.saturating_sub(pair[0].1) as f64 / 1e3;
        if pair[0].2 == pair[1].2 {
            &mut own
        } else {
            &mut handoffs
        }
        .push(gap);
    }
    let span_ns = kernels.last().map_or(0, |k| k.1) - kernels[0].0;
    let ran_ns: u64 = kernels.iter().map(|k| k.1 - k.0).sum();
    text.push_str(&format!(
        "- {} kernels; the device ran one of them {:.1}% of the time.\n",
        kernels.len(),
        100.0 * ran_ns as f64 / span_ns.max(1) as f64
    ));
    for (label, gaps) in [
        ("the other process's kernel follows", &mut handoffs),
        ("its own kernel follows", &mut own),
    ] {
        text.push_str(&format!(
            "- Gap when {label}: {} times, p10 {:.1} µs, median {:.1} µs, p90 {:.1} µs.\n",
            gaps.len(),
            percentile(gaps, 10.0),
            median(gaps),
            percentile(gaps, 90.0)
        ));
    }
    Ok(text)
}

fn slice(seconds: f64) -> Fallible<String> {
    let mut text = format!(
        "## Time slicing between two processes\n\nEach process runs `slicer` kernels ({} ms each, one 1-thread block per SM, so no block ever ends mid-run) for {seconds:.1} s; block 0 records every `%globaltimer` jump over {} µs (it was not running).\n\n",
        SLICER_RUN_NS / 1_000_000,
        SLICER_THRESHOLD_NS / 1000
    );
    let alone = run_slice_children(1, 1.0)?;
    if alone[0].kernels.iter().all(|k| k.0 == 0) {
        return Ok(text + NO_TIMER);
    }
    let alone_gaps = alone[0].gaps.len();
    let alone_ns: u64 = alone[0].kernels.iter().map(|k| k.1 - k.0).sum();
    text.push_str(&format!(
        "- One process alone: {alone_gaps} jumps in {:.2} s of kernels (the timer's own noise floor).\n",
        alone_ns as f64 / 1e9
    ));
    let pair = run_slice_children(2, seconds)?;
    let runs: Vec<Vec<(u64, u64)>> = pair.iter().map(ProcessTimeline::runs).collect();
    // The window in which both had kernels.
    let lo = pair
        .iter()
        .map(|p| p.kernels.first().map_or(0, |k| k.0))
        .max()
        .unwrap_or(0);
    let hi = pair
        .iter()
        .map(|p| p.kernels.last().map_or(0, |k| k.1))
        .min()
        .unwrap_or(0);
    if hi <= lo {
        return Ok(
            text + "- The two processes' kernels did not overlap in time: nothing to measure.\n"
        );
    }
    let inside = |r: &&(u64, u64)| r.0 > lo && r.1 < hi;
    let mut slices: Vec<f64> = runs
        .iter()
        .flatten()
        .filter(inside)
        .map(|r| (r.1 - r.0) as f64 / 1e3)
        .collect();
    // Each gap of process 0 holds runs of process 1; what is left of the gap
    // is device time neither ran: two switches' worth.
    let mut lost_per_switch = Vec::new();
    let mut switches = 0usize;
    for &(from, to) in pair[0].gaps.iter().filter(|g| g.0 > lo && g.1 < hi) {
        let other: u64 = runs[1]
            .iter()
            .map(|r| r.1.min(to).saturating_sub(r.0.max(from)))
            .sum();
        if other > 0 {
            switches += 2;
            lost_per_switch.push((to - from).saturating_sub(other) as f64 / 2.0 / 1e3);
        }
    }
    let share = |index: usize| {
        runs[index]
            .iter()
            .map(|r| r.1.min(hi).saturating_sub(r.0.max(lo)))
            .sum::<u64>() as f64
            / (hi - lo) as f64
    };
    let busy = share(0) + share(1);
    text.push_str(&format!(
        "- Both: {:.2} s together; {} switches ({:.0}/s). Share of the window: {:.1}% and {:.1}%; neither ran {:.2}%.\n",
        (hi - lo) as f64 / 1e9,
        switches,
        switches as f64 / ((hi - lo) as f64 / 1e9),
        100.0 * share(0),
        100.0 * share(1),
        100.0 * (1.0 - busy)
    ));
    text.push_str(&format!(
        "- Slice (one process's uninterrupted run): p10 {:.0} µs, median {:.0} µs, p90 {:.0} µs over {} runs.\n",
        percentile(&mut slices, 10.0),
        median(&mut slices),
        percentile(&mut slices, 90.0),
        slices.len()
    ));
    text.push_str(&format!(
        "- Device time lost per switch (gap of one not covered by the other, halved): p10 {:.1} µs, median {:.1} µs, p90 {:.1} µs.\n",
        percentile(&mut lost_per_switch, 10.0),
        median(&mut lost_per_switch),
        percentile(&mut lost_per_switch, 90.0)
    ));
    text.push_str(&format!(
        "- Preemption inside a running block: {} (block 0 runs one thread for the whole kernel; every recorded jump is a stop in mid-block).\n",
        if switches > 0 { "yes" } else { "not seen" }
    ));
    Ok(text)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Some(child @ ("slice-child" | "handoff-child")) = args.first().map(String::as_str) {
        let parsed = (
            args.get(1).and_then(|a| a.parse().ok()),
            args.get(2).and_then(|a| a.parse().ok()),
        );
        let (Some(start_at), Some(seconds)) = parsed else {
            eprintln!("gpu-calibrate {child} START_NS SECONDS");
            return ExitCode::from(2);
        };
        let ran = if child == "slice-child" {
            slice_child(start_at, seconds)
        } else {
            handoff_child(start_at, seconds)
        };
        return match ran {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("gpu-calibrate {child}: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let mut probe = "all".to_string();
    let mut seconds = 4.0;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--seconds" => match rest.next().and_then(|s| s.parse::<f64>().ok()) {
                Some(s) if s > 0.0 => seconds = s,
                _ => {
                    eprintln!("gpu-calibrate: --seconds needs a positive number\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "all" | "host" | "gap" | "jitter" | "streams" | "slice" | "handoff" => {
                probe = arg.clone()
            }
            other => {
                eprintln!("gpu-calibrate: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let run = || -> Fallible<String> {
        let gpu = open_gpu()?;
        let mut text = format!(
            "# gpu-calibrate\n\nDevice: {} ({} SMs). Host: {}.\n\n",
            gpu.name,
            gpu.sms,
            report::machine()
        );
        let all = probe == "all";
        if all || probe == "host" {
            text += &host_costs(&gpu)?;
            text.push('\n');
        }
        if all || probe == "gap" {
            text += &kernel_gap(&gpu)?;
            text.push('\n');
        }
        if all || probe == "jitter" {
            text += &jitter(&gpu, seconds)?;
            text.push('\n');
        }
        if all || probe == "streams" {
            text += &streams(&gpu)?;
            text.push('\n');
        }
        if all || probe == "slice" {
            text += &slice(seconds)?;
            text.push('\n');
        }
        if all || probe == "handoff" {
            text += &handoff(seconds)?;
        }
        Ok(text)
    };
    match run() {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("gpu-calibrate: {error}");
            ExitCode::FAILURE
        }
    }
}
