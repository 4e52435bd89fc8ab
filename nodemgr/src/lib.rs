//! The node manager and the `dilu` command-line front end, as a library so
//! that tests and the demo can run a daemon in-process. The `dilu` binary
//! (`src/bin/dilu/`) is the command line; `dilu demo`'s scenario lives
//! there, not in the daemon's code.
//!
//! - [`audit`]: real per-process device memory (NVML) against budgets.
//! - [`config`]: `/etc/dilu/nodemgr.toml` and flags.
//! - [`registry`]: tenants, admission, budget regions (SM share and memory,
//!   the daemon the only writer), re-adoption.
//! - [`server`]: the Unix socket (registration with `SO_PEERCRED`, tools).
//! - [`observe`]: telemetry counters → per-period observations.
//! - [`colo_status`]: co-location gap boards → status and metrics.
//! - [`control`]: control laws (pure: observations in, shares out).
//! - [`daemon`]: threads, control loop, persistence, systemd notification.
//! - [`logging`]: service-mode (journald) and `--foreground` log lines.
//! - [`metrics`]: Prometheus `/metrics` and the JSON API.
//! - [`nvml`]: NVML when present, a fallback when not.
//! - [`placement`]: which GPU `dilu run` puts a tenant on (the cluster
//!   layer's placement rule, on this node's GPUs).
//! - [`ops`]: `dilu status`, `dilu top`, `dilu set`.
//! - [`error`]: the errors its callers get, by kind.

pub mod artifacts;
pub mod audit;
pub mod colo_status;
pub mod config;
pub mod control;
pub mod cpu_priority;
pub mod daemon;
pub mod error;
pub mod gpu_view;
pub mod launch;
pub mod leftovers;
pub mod logging;
pub mod metrics;
pub mod nvml;
pub mod observe;
pub mod ops;
pub mod peer_limits;
pub mod period;
pub mod placement;
pub mod profile_run;
pub mod profile_spec;
pub mod queue_bounds;
pub mod registry;
pub mod server;
pub mod shared_state;
pub mod state_file;
pub mod wake_watch;
