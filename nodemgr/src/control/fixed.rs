//! `static`: every tenant gets its request, always (what a fixed per-tenant
//! limit gives, as with HAMi-core's `CUDA_DEVICE_SM_LIMIT` or an MPS
//! active-thread percentage). A baseline: no elasticity at all.

use super::{Controller, Observation};

#[derive(Debug, Default)]
pub struct Static;

impl Controller for Static {
    fn name(&self) -> &'static str {
        "static"
    }

    fn step(&mut self, _now_ns: u64, tenants: &[Observation]) -> Vec<u32> {
        tenants.iter().map(|o| o.request_ppm).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
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
}
