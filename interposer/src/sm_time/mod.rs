//! SM time: every launch is charged to the tenant's token bucket and waits
//! while it is in debt; samples measure what launches really cost.
//!
//! - [`launch_control`]: the launch path (charge, wait, count, time).
//! - [`launch_lease`]: GPU time a thread already paid for.
//! - [`kernel_estimates`]: what each kind of launch costs.
//! - [`sampler`], [`recent_streams`]: timing sampled launches with events.
//! - [`quiet_samples`]: timing kernels longer than a time slice while the
//!   device's other processes hold their launches.
//! - [`fair_turns`]: tenants sharing a device split the time they use by
//!   their shares.
//! - [`queue_bound`]: a batch tenant beside a latency tenant keeps little
//!   work queued.
//! - [`usage_feedback`]: charges against the device time the driver counted.
//! - [`tenant_sm`]: the tenant's shares, telemetry and buckets as this
//!   process maps them.
//! - [`colocation`]: the gap board of a primary and its fillers;
//!   [`primary_tolerance`]: the delay the primary tolerates, from its
//!   reported latencies; [`run_queue_wait`]: how long a reporting thread
//!   waited for a CPU.

pub mod at_fork;
pub mod colocation;
pub mod colocation_config;
pub mod fair_turns;
pub mod honoured_holds;
pub mod kernel_estimates;
pub mod launch_control;
pub mod launch_lease;
pub mod nvml_sample_clock;
pub mod precise_sleep;
pub mod primary_learning;
pub mod primary_tolerance;
pub mod queue_bound;
pub mod quiet_samples;
pub mod recent_streams;
pub mod run_queue_wait;
pub mod sampler;
pub mod stream_capture;
pub mod tenant_sm;
pub mod usage_feedback;
