//! Workloads and end-to-end test support for dilu.
//!
//! The binaries here are ordinary CUDA programs that know nothing about
//! dilu: `cudarc-loop` drives the driver through the `cudarc` crate, and
//! `cudart-client` reaches it exactly the way NVIDIA's cudart does. The
//! integration tests in `tests/tests/` run them under `dilu run --sim`.

pub mod cubin;
pub mod driver;
pub mod probe;
pub mod ptx;
pub mod sm_scenario;
pub mod workload;
pub mod workspace;
