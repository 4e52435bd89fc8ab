//! Probes inside one process: the device gap between back-to-back kernels,
//! duration jitter and drift, and whether two streams overlap.

use crate::gpu::{
    BUSY_BLOCKS, BUSY_THREADS, Fallible, Gpu, device_words, driver_error, free, launch, read_words,
    sync,
};
use cudarc::driver::{result, sys};
use dilu_bench::driver::monotonic_ns;
use dilu_bench::report::Table;
use dilu_bench::{median, percentile};

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

pub const NO_TIMER: &str =
    "skipped: kernels did not run (no %globaltimer stamps; a simulated driver?)\n";

pub fn kernel_gap(gpu: &Gpu) -> Fallible<String> {
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

pub fn jitter(gpu: &Gpu, seconds: f64) -> Fallible<String> {
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

pub fn streams(gpu: &Gpu) -> Fallible<String> {
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
