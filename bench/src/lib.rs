//! dilu benchmarks.
