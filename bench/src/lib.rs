//! dilu benchmarks. Each benchmark measures dilu and the thing it is
//! compared with side by side in one run and prints the ratio; results that
//! are committed live in `bench/results/`. Run them all with
//! `scripts/bench.sh`.
//!
//! - `benches/overhead.rs` (criterion): what the interposer adds per driver
//!   call, on simgpu's null driver.
//! - `benches/startup.rs`: the interposer's start-up cost per process, with
//!   0, 16 and 64 other processes of the tenant running.
//! - `scripts/syscalls.sh` with the `bench-client` binary: no syscall on the
//!   launch path.
//! - `benches/demo.rs`: `dilu demo`'s request latency per controller, as a
//!   CDF plot and a table.
//! - `real-overhead` (binary, run by `scripts/gpu-check.sh`): launch and
//!   allocation overhead on the real NVIDIA driver.
//! - `gpu-calibrate` (binary, run by `scripts/gpu-check.sh`): what simgpu's
//!   sharing model is set by (call costs, kernel gap, jitter, streams, time
//!   slices, hand-offs), measured on a real GPU.
//! - [`svg`]: line and CDF plots for reports.
//! - [`as_if_alone`]: what fillers can harvest beside a primary kept as if
//!   alone without knowing its arrivals (the field benchmark's bound).
//! - [`latency_split`]: what a primary's slowest requests waited for (its
//!   kernels, others' kernels, an idle device).

pub mod as_if_alone;
pub mod cli;
pub mod driver;
pub mod latency_split;
pub mod peers;
pub mod report;
pub mod stats;
pub mod steal_gate;
pub mod svg;

pub use stats::{median, percentile};
