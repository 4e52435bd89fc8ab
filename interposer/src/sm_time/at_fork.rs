//! The SM-time state's part in fork safety (see [`crate::fork`]): a forked
//! child has no sampling harvester or usage-feedback thread, its charges are
//! its own, and it knows its own pid on the gap and quiet boards. Taken when
//! the library loads in a process whose configuration gives it SM-time
//! state; every reset below is a few stores, so a child of a process that
//! never launched pays nothing worth counting.

use crate::fork::{self, Handlers, Part};
use crate::sm_time::{colocation, launch_lease, quiet_samples, sampler, tenant_sm, usage_feedback};

/// Takes part in every fork from now on when this process has SM-time state
/// to keep (idempotent).
pub fn register_when_configured() {
    if !tenant_sm::configured() {
        return;
    }
    fork::register(
        Part::SmTime,
        Handlers {
            prepare: Handlers::nothing,
            parent: Handlers::nothing,
            child,
        },
    );
}

fn child() {
    sampler::forget_parent_state_in_child();
    usage_feedback::forget_parent_state_in_child();
    colocation::forget_parent_state_in_child();
    quiet_samples::forget_parent_state_in_child();
    launch_lease::forget_parent_state_in_child();
}
