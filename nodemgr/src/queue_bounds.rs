//! Which tenants keep their device queue short: under dilu's laws, a batch
//! tenant on a GPU that also runs a latency tenant with an SLO may have at
//! most [`QUEUE_BOUND_NS`] of device time queued ahead of each launch (the
//! interposer's `sm_time::queue_bound` says why and how it waits).
//! Decided every period from the observations, so the bound follows
//! tenants as they come, go and change GPU. Not beside a co-location
//! primary: its gap board already keeps fillers to about one kernel
//! queued. The baselines (`static`, `dilu-rckm`) have no bound.

use crate::control::Observation;
use crate::control::per_gpu::GpuKey;
use dilu_abi::node_wire::WorkClass;

/// The bound (ns). A latency tenant waking up beside a batch tenant waits
/// for about this and the kernel that is running; the batch tenant's host
/// has this long to launch its next kernel before the device runs out of
/// its work (a launch takes a few µs, a loaded host's wake-up tens). On
/// `dilu demo` (a training step queues 8 kernels of 1 ms at once) the
/// first request of a burst ran 5-8 ms of training work without a bound,
/// and with it, the wake-up and unmeasured kernels counted as time slices,
/// 1-3 ms.
pub const QUEUE_BOUND_NS: u64 = 250_000;

/// One bound per observation (same order): [`QUEUE_BOUND_NS`] for a batch
/// tenant's device whose GPU (controller group) has a latency tenant with
/// an SLO (not a co-location primary), else 0.
pub fn queue_bounds(observations: &[Observation], gpus: &[GpuKey], out: &mut Vec<u64>) {
    let guarded = gpus_with(observations, gpus, |o| {
        o.class == WorkClass::Latency && o.slo_ns.is_some() && !o.colo_primary
    });
    out.clear();
    out.extend(observations.iter().zip(gpus).map(|(o, gpu)| {
        if o.class == WorkClass::Batch && guarded.contains(gpu) {
            QUEUE_BOUND_NS
        } else {
            0
        }
    }));
}

/// The GPUs (controller groups) with a tenant `pick` chooses, each once: a
/// node has few, so a look-up in the list is cheap.
pub fn gpus_with(
    observations: &[Observation],
    gpus: &[GpuKey],
    pick: impl Fn(&Observation) -> bool,
) -> Vec<GpuKey> {
    let mut found = Vec::new();
    for (o, gpu) in observations.iter().zip(gpus) {
        if pick(o) && !found.contains(gpu) {
            found.push(*gpu);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::policy::testing::tenant;

    #[test]
    fn only_batch_tenants_beside_a_latency_tenant_with_an_slo_are_bounded() {
        let mut without_slo = tenant(WorkClass::Latency, 30, 100);
        without_slo.slo_ns = None;
        let observations = [
            tenant(WorkClass::Latency, 30, 100),
            tenant(WorkClass::Batch, 20, 100),
            tenant(WorkClass::Batch, 20, 100),
            without_slo,
            tenant(WorkClass::Batch, 20, 100),
        ];
        let gpus = [Some(0), Some(0), Some(1), Some(2), Some(2)];
        let mut bounds = Vec::new();
        queue_bounds(&observations, &gpus, &mut bounds);
        assert_eq!(bounds, [0, QUEUE_BOUND_NS, 0, 0, 0]);
        // A co-location primary's gap board keeps its fillers' queue.
        let mut primary = observations.to_vec();
        primary[0].colo_primary = true;
        queue_bounds(&primary, &gpus, &mut bounds);
        assert_eq!(bounds, [0; 5]);
    }
}
