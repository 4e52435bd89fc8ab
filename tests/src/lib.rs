//! Workloads and end-to-end test support for dilu.
//!
//! The binaries here are ordinary CUDA programs that know nothing about
//! dilu: `cudarc-loop` drives the driver through the `cudarc` crate, and
//! `cudart-client` reaches it exactly the way NVIDIA's cudart does. The
//! integration tests in `tests/tests/` run them under `dilu run --sim`.
//! What the workloads, the tests and the benchmarks share (finding the
//! built artifacts, the SM-time scenarios, the PTX) is in `dilu-harness`.

pub mod cubin;
pub mod driver;
pub mod probe;
pub mod sim_node;
pub mod soak;
pub mod stalled;
