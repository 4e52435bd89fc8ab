//! The control law of Dilu's published code ("rCKM"), as a baseline.
//!
//! Every 5 ms window it compares the inference tenant's busy period (here:
//! the mean latency of the requests that completed in the window) with the
//! shortest one seen so far. Overflow `o = busy / min`:
//! - `o ≥ 1.6` (emergency): the batch budget is divided by `o`;
//! - `o < 1.2`: the batch budget is multiplied by 1.3 (recovery);
//! - otherwise it is kept.
//!
//! After 0.6 s without inference activity batch tenants get their whole
//! limit. Inference tenants are never limited (their limit). With several
//! latency tenants, the largest overflow decides.

use super::policy::{Controller, FULL, Observation, share_out_batch};
use dilu_abi::node_wire::WorkClass;

pub const EMERGENCY: f64 = 1.6;
pub const RECOVERY: f64 = 1.2;
pub const GROWTH: f64 = 1.3;
pub const IDLE_NS: u64 = 600_000_000;
/// The smallest batch budget (so a budget divided many times can recover).
pub const FLOOR_PPM: u32 = 10_000;

#[derive(Debug)]
pub struct Rckm {
    /// Batch budget as a fraction of the device (shared by batch tenants).
    batch_ppm: u32,
    /// Shortest busy period seen per tenant index.
    min_busy_ns: Vec<u64>,
}

impl Default for Rckm {
    fn default() -> Self {
        Rckm {
            batch_ppm: FULL,
            min_busy_ns: Vec::new(),
        }
    }
}

impl Controller for Rckm {
    fn name(&self) -> &'static str {
        "dilu-rckm"
    }

    fn reset(&mut self) {
        self.min_busy_ns.clear();
    }

    fn step(&mut self, _now_ns: u64, tenants: &[Observation]) -> Vec<u32> {
        if self.min_busy_ns.len() != tenants.len() {
            self.min_busy_ns = vec![u64::MAX; tenants.len()];
        }
        let mut out = vec![0; tenants.len()];
        let mut overflow: Option<f64> = None;
        let mut inference_idle = true;
        let mut batch = Vec::new();
        for (i, o) in tenants.iter().enumerate() {
            if o.class == WorkClass::Batch {
                batch.push(i);
                continue;
            }
            out[i] = o.limit_ppm;
            inference_idle &= !o.at_work_within(IDLE_NS);
            if let Some(busy) = o.latency.period_mean_ns.filter(|&b| b > 0) {
                self.min_busy_ns[i] = self.min_busy_ns[i].min(busy);
                let ratio = busy as f64 / self.min_busy_ns[i] as f64;
                overflow = Some(overflow.map_or(ratio, |o: f64| o.max(ratio)));
            }
        }
        if inference_idle {
            self.batch_ppm = FULL;
        } else if let Some(o) = overflow {
            if o >= EMERGENCY {
                self.batch_ppm = ((self.batch_ppm as f64 / o) as u32).max(FLOOR_PPM);
            } else if o < RECOVERY {
                self.batch_ppm = ((self.batch_ppm as f64 * GROWTH) as u32).min(FULL);
            }
        }
        share_out_batch(tenants, &batch, self.batch_ppm, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::testing::*;
    use super::*;

    #[test]
    fn emergency_divides_recovery_multiplies_idleness_restores() {
        let mut c = Rckm::default();
        let mut t = vec![
            busy(tenant(WorkClass::Latency, 30, 100), 10),
            busy(tenant(WorkClass::Batch, 0, 100), 90),
        ];
        t[0] = with_latency(t[0].clone(), 10, 10);
        assert_eq!(c.step(0, &t)[1], FULL, "overflow 1: keeps growing, capped");
        t[0] = with_latency(t[0].clone(), 20, 20); // overflow 2.0
        assert_eq!(c.step(0, &t)[1], 500_000);
        t[0] = with_latency(t[0].clone(), 14, 14); // 1.4: hold
        assert_eq!(c.step(0, &t)[1], 500_000);
        t[0] = with_latency(t[0].clone(), 11, 11); // 1.1: × 1.3
        assert_eq!(c.step(0, &t)[1], 650_000);
        t[0].latency = Default::default(); // no request completed: hold
        assert_eq!(c.step(0, &t)[1], 650_000);
        t[0] = with_latency(t[0].clone(), 40, 40); // 4.0
        assert_eq!(c.step(0, &t)[1], 162_500);
        t[0].idle_ns = IDLE_NS;
        assert_eq!(c.step(0, &t)[1], FULL, "0.6 s idle: batch gets it all");
    }
}
