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

mod gpu;
mod host;
mod one_process;
mod two_processes;

use dilu_bench::report;
use gpu::{Fallible, open_gpu};
use host::host_costs;
use one_process::{jitter, kernel_gap, streams};
use std::process::ExitCode;
use two_processes::{handoff, handoff_child, slice, slice_child};

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
