//! `dilu-harness`: what dilu's workloads (`tests/src/bin`), end-to-end tests
//! (`tests/tests`) and benchmarks (`bench/`) share, so that the benchmarks
//! do not depend on the test crate.
//!
//! - [`workspace`]: locating the built artifacts (`dilu`, the libraries,
//!   the workloads) from a test or benchmark binary, scratch directories,
//!   simgpu traces.
//! - [`sm_scenario`]: tenants of `cudarc-loop` under `dilu run --sim` and
//!   the split of device time their trace shows.
//! - [`workload`]: the workloads' shared `main` and request shapes.
//! - [`node_manager`]: a test's `dilu nodemgr` and its status.
//! - [`ptx`]: the PTX kernel the workloads run.
//! - [`quantile`]: a latency quantile and the interval that holds the
//!   true one (a p99 ratio's range).
//!
//! Plain Rust and the trace format: no CUDA bindings.

pub mod node_manager;
pub mod ptx;
pub mod quantile;
pub mod sm_scenario;
pub mod workload;
pub mod workspace;
