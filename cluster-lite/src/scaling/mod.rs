//! Request-level simulation of 2D scaling: functions receive requests by an
//! arrival pattern; each instance is a latency tenant whose SM share the
//! node manager raises from its request towards its limit under load
//! (vertical scaling, shared fairly on a GPU whose limits oversubscribe it);
//! a horizontal scaler, asked every second, sets how many instances each
//! function runs; new instances are placed by a cluster policy and serve
//! after a cold start. What it measures: the share of requests within
//! their SLO, GPU-hours (GPUs with any instance, over time) and instance
//! starts, per scaler and arrival pattern (`cluster-lite/src/bin/
//! scaling_report/`, `bench/results/scaling.md`). The mechanism notes are
//! in `docs/scaling.md`.

pub mod misses;
pub mod pattern;
pub mod scalers;
pub mod service;
pub mod sim;
