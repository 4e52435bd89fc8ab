//! Host time of each driver call simgpu prices.

use crate::gpu::{Fallible, Gpu, device_words, driver_error, free, launch, sync};
use cudarc::driver::{result, sys};
use dilu_bench::driver::monotonic_ns;
use dilu_bench::report::{self, Table};
use dilu_bench::{median, percentile};

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

/// Between timed calls that queue work: synchronises `stream` every 256th
/// time (untimed), so the queue never fills.
fn drain_every_256th(calls: &mut u32, stream: sys::CUstream) -> Fallible<()> {
    *calls += 1;
    if calls.is_multiple_of(256) {
        sync(stream)
    } else {
        Ok(())
    }
}

pub fn host_costs(gpu: &Gpu) -> Fallible<String> {
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
            || drain_every_256th(&mut launched, stream),
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
                || drain_every_256th(&mut memsets, stream),
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
