//! `dilu`: resourcing-complementary placement (ours).
//!
//! Control law, for an instance with per-GPU demand (r = SM request,
//! l = SM limit, m = memory share) on a GPU whose sums before placement are
//! (R, L, M):
//!
//! * admit only if R + r ≤ 1, M + m ≤ 1 and L + l ≤ `limit_bound`
//!   (oversubscription of limits within a bound);
//! * cost, lower is better, the sum of:
//!   - `OPEN_GPU_COST` if the GPU is idle (wake GPUs only when no busy GPU
//!     fits);
//!   - (1 − (R + r)) + `memory_weight` · (1 − (M + m)): best fit, fill GPUs;
//!   - `balance_weight` · |(R + r) − (M + m)|: pack SM against memory, so an
//!     SM-heavy/memory-light instance lands where memory-heavy work already
//!     sits and neither dimension strands the other;
//!   - `risk_weight` · (max(0, L + l − 1) − max(0, L − 1)): each unit of new
//!     limit excess (SLO risk) must buy a real packing gain;
//!   - minus `pairing_bonus` if the GPU hosts only the other class (latency
//!     work next to batch work, whose bursts rarely coincide).
//!
//! Gang instances (training on several GPUs) go to the cheapest set of GPUs
//! on one node.

use super::{OPEN_GPU_COST, PlacementPolicy};
use crate::model::{GpuState, InstanceDemand, SHARE_EPSILON, WorkClass};

/// Tunable weights of the `dilu` control law (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Complementary {
    pub limit_bound: f64,
    pub memory_weight: f64,
    pub balance_weight: f64,
    pub risk_weight: f64,
    pub pairing_bonus: f64,
}

impl Default for Complementary {
    fn default() -> Self {
        Self {
            limit_bound: 1.5,
            memory_weight: 0.5,
            balance_weight: 0.25,
            risk_weight: 0.2,
            pairing_bonus: 0.05,
        }
    }
}

impl PlacementPolicy for Complementary {
    fn name(&self) -> &'static str {
        "dilu"
    }

    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        gpu.sm_request_sum + demand.sm_request <= 1.0 + SHARE_EPSILON
            && gpu.sm_limit_sum + demand.sm_limit <= self.limit_bound + SHARE_EPSILON
            && gpu.memory_fits(demand)
    }

    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        let sm_after = gpu.sm_request_sum + demand.sm_request;
        let memory_after = gpu.memory_share_with(demand.memory_bytes);
        let open = if gpu.is_active() { 0.0 } else { OPEN_GPU_COST };
        let best_fit = (1.0 - sm_after) + self.memory_weight * (1.0 - memory_after);
        let balance = self.balance_weight * (sm_after - memory_after).abs();
        let new_excess = (gpu.sm_limit_sum + demand.sm_limit - 1.0).max(0.0) - gpu.limit_excess();
        let pairing = match demand.class {
            WorkClass::Latency if gpu.latency_instances == 0 && gpu.batch_instances > 0 => {
                self.pairing_bonus
            }
            WorkClass::Batch if gpu.batch_instances == 0 && gpu.latency_instances > 0 => {
                self.pairing_bonus
            }
            _ => 0.0,
        };
        open + best_fit + balance + self.risk_weight * new_excess - pairing
    }
}
