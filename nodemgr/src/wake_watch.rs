//! Protection at a latency tenant's first launch, not a period later.
//!
//! Between periods the control loop watches every latency tenant with an
//! SLO that launched nothing in the last period while a batch tenant
//! shares its GPU, and runs the next period as soon as one of them
//! launches (polling its launch count every [`POLL`]). A period late
//! (5 ms by default), the batch tenant keeps its whole share through the
//! first kernels of the request: on `dilu demo` the first request of each
//! burst waited for 2 ms time slices of training work between each two of
//! its kernels for 6-8 ms.
//!
//! Only while such a tenant rests is anything polled: the loop otherwise
//! sleeps a whole period as before.

use crate::control::Observation;
use crate::control::per_gpu::GpuKey;
use crate::queue_bounds::gpus_with;
use crate::registry::Registry;
use dilu_abi::node_wire::WorkClass;
use std::time::Duration;

/// How often a resting latency tenant's launch count is read.
pub const POLL: Duration = Duration::from_micros(500);

/// The latency tenants watched for their first launch.
#[derive(Debug, Default)]
pub struct WakeWatch {
    /// The registry epoch the positions below belong to.
    epoch: Option<u64>,
    /// (position among the registry's tenants, its device ordinal,
    /// launches on that device at the last period), in position order.
    resting: Vec<(usize, usize, u64)>,
}

impl WakeWatch {
    /// After a period: watches the tenant devices to wake for.
    /// `observations` and `gpus` are the period's, one per tenant device in
    /// the registry's order (each tenant's devices in its own order).
    pub fn arm(&mut self, registry: &Registry, observations: &[Observation], gpus: &[GpuKey]) {
        self.epoch = Some(registry.epoch);
        self.resting.clear();
        let with_batch = gpus_with(observations, gpus, |o| o.class == WorkClass::Batch);
        let mut at = 0;
        for (position, tenant) in registry.tenants.values().enumerate() {
            for device in &tenant.devices {
                let (Some(o), Some(gpu)) = (observations.get(at), gpus.get(at)) else {
                    return;
                };
                at += 1;
                if resting_latency_tenant(o) && with_batch.contains(gpu) {
                    let ordinal = device.ordinal;
                    let launches = tenant.regions.activity.devices[ordinal].pulse()[1];
                    self.resting.push((position, ordinal, launches));
                }
            }
        }
    }

    /// Whether any tenant is watched.
    pub fn watching(&self) -> bool {
        !self.resting.is_empty()
    }

    /// Whether a watched tenant launched since [`arm`](Self::arm).
    pub fn woke(&self, registry: &Registry) -> bool {
        if self.epoch != Some(registry.epoch) {
            return false;
        }
        let mut watched = self.resting.iter().peekable();
        for (position, tenant) in registry.tenants.values().enumerate() {
            while let Some(&&(at, device, launches)) = watched.peek() {
                if at != position {
                    break;
                }
                if tenant.regions.activity.devices[device].pulse()[1] != launches {
                    return true;
                }
                watched.next();
            }
            if watched.peek().is_none() {
                return false;
            }
        }
        false
    }
}

/// A latency tenant with an SLO that launched nothing in the period (not a
/// co-location primary: its gap board protects each launch).
fn resting_latency_tenant(o: &Observation) -> bool {
    o.class == WorkClass::Latency && o.slo_ns.is_some() && o.launches == 0 && !o.colo_primary
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::policy::testing::{busy, tenant};

    #[test]
    fn only_a_resting_latency_tenant_with_an_slo_is_watched() {
        let resting = tenant(WorkClass::Latency, 30, 100);
        assert!(resting_latency_tenant(&resting));
        // Launching: protected by the period already.
        assert!(!resting_latency_tenant(&busy(resting.clone(), 10)));
        // No SLO: nothing to keep.
        let mut no_slo = resting;
        no_slo.slo_ns = None;
        assert!(!resting_latency_tenant(&no_slo));
        assert!(!resting_latency_tenant(&tenant(WorkClass::Batch, 20, 100)));
        let mut primary = tenant(WorkClass::Latency, 30, 100);
        primary.colo_primary = true;
        assert!(!resting_latency_tenant(&primary));
    }
}
