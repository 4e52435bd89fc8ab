//! Probes between two processes: time slicing (slice, time lost per switch,
//! preemption in mid-block) and hand-offs between request loops. Each runs
//! this program's child modes in two processes that start together and
//! print their `%globaltimer` stamps.

use crate::gpu::{
    Fallible, SLICER_CAP, SLICER_RUN_NS, SLICER_THRESHOLD_NS, device_words, driver_error, free,
    launch, open_gpu, read_words, sync,
};
use crate::one_process::NO_TIMER;
use cudarc::driver::result;
use dilu_bench::driver::monotonic_ns;
use dilu_bench::{median, percentile};
use std::process::Command;
use std::time::Duration;

/// One process of the slice probe: slicer kernels from `start_at`
/// (CLOCK_MONOTONIC ns) for `seconds`. Prints `K start end` per kernel and
/// `G from to` per timer jump of block 0.
pub fn slice_child(start_at: u64, seconds: f64) -> Fallible<()> {
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

/// The numbers of a child's output line after its leading tag.
fn numbers_after_tag(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect()
}

impl ProcessTimeline {
    fn parse(text: &str) -> ProcessTimeline {
        let mut timeline = ProcessTimeline {
            kernels: Vec::new(),
            gaps: Vec::new(),
        };
        for line in text.lines() {
            let fields = numbers_after_tag(line);
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
pub fn handoff_child(start_at: u64, seconds: f64) -> Fallible<()> {
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

pub fn handoff(seconds: f64) -> Fallible<String> {
    let mut text = format!(
        "## Hand-offs between two processes running requests\n\nEach process runs requests of {REQUEST_KERNELS} `span` kernels of {} µs (one block) and a synchronise, for {seconds:.1} s; every kernel's start and end (`%globaltimer`), both processes' kernels in one timeline.\n\n",
        REQUEST_KERNEL_NS / 1000
    );
    let printed = run_children("handoff-child", 2, seconds)?;
    let mut kernels: Vec<(u64, u64, usize)> = Vec::new();
    for (process, text) in printed.iter().enumerate() {
        for line in text.lines() {
            let fields = numbers_after_tag(line);
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

pub fn slice(seconds: f64) -> Fallible<String> {
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
