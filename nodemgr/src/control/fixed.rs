//! `static`: every tenant gets its request, always (what a fixed per-tenant
//! limit gives, as with HAMi-core's `CUDA_DEVICE_SM_LIMIT` or an MPS
//! active-thread percentage). A baseline: no elasticity at all. Tenants
//! without a request (best effort) share the part of the device no request
//! reserves, among those that want it, up to their limits.

use super::policy::{Controller, FULL, Observation, share_out_batch};

#[derive(Debug, Default)]
pub struct Static;

impl Controller for Static {
    fn name(&self) -> &'static str {
        "static"
    }

    fn step(&mut self, _now_ns: u64, tenants: &[Observation]) -> Vec<u32> {
        let mut out: Vec<u32> = tenants.iter().map(|o| o.request_ppm).collect();
        let reserved: u64 = out.iter().map(|&r| u64::from(r)).sum();
        let best_effort: Vec<usize> = (0..tenants.len())
            .filter(|&i| tenants[i].request_ppm == 0)
            .collect();
        let unreserved = u64::from(FULL).saturating_sub(reserved) as u32;
        share_out_batch(tenants, &best_effort, unreserved, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::testing::*;
    use super::*;
    use dilu_abi::node_wire::WorkClass;

    #[test]
    fn shares_are_the_requests_whatever_happens() {
        let t = vec![
            with_latency(busy(tenant(WorkClass::Latency, 30, 80), 100), 90, 90),
            tenant(WorkClass::Batch, 70, 100),
        ];
        assert_eq!(Static.step(0, &t), vec![300_000, 700_000]);
    }

    #[test]
    fn best_effort_tenants_share_only_what_no_request_reserves() {
        let best_effort = |throttled_ns| {
            let mut o = tenant(WorkClass::Batch, 0, 100);
            o.throttled_ns = throttled_ns;
            o
        };
        let t = vec![
            tenant(WorkClass::Batch, 30, 100), // idle: its request still holds
            best_effort(1_000),
            best_effort(1_000),
            best_effort(0), // wants nothing
        ];
        assert_eq!(Static.step(0, &t), vec![300_000, 350_000, 350_000, 0]);
    }
}
