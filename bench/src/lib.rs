//! dilu benchmarks. Each benchmark measures dilu and the thing it is
//! compared with side by side in one run and prints the ratio; results that
//! are committed live in `bench/results/`. Run them all with
//! `scripts/bench.sh`.
//!
//! - `benches/overhead.rs` (criterion): what the interposer adds per driver
//!   call, on simgpu's null driver.
//! - [`svg`]: line and CDF plots for reports.

pub mod driver;
pub mod report;
pub mod stats;
pub mod svg;

pub use stats::{median, percentile};
