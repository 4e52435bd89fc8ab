//! The policies `dilu` is measured against: Kubernetes' exclusive GPUs,
//! INFless-style reservation of limits or of requests, and the scheduler
//! published with the Dilu paper.

use super::rule::{OPEN_GPU_COST, PlacementPolicy};
use crate::model::{ClusterState, GpuCell, GpuState, InstanceDemand, SHARE_EPSILON};

/// One instance per GPU (what the Kubernetes device plugin gives); first fit.
pub struct Exclusive;

impl PlacementPolicy for Exclusive {
    fn name(&self) -> &'static str {
        "exclusive"
    }
    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        !gpu.is_active() && gpu.memory_fits(demand)
    }
    fn cost(&self, _gpu: &GpuState, _demand: &InstanceDemand) -> f64 {
        0.0
    }
    fn cost_floor(
        &self,
        _cluster: &ClusterState,
        cell: &GpuCell,
        _demand: &InstanceDemand,
    ) -> Option<f64> {
        Some(if cell.idle { 0.0 } else { f64::INFINITY })
    }
}

/// Reserves each instance's SM limit: Σlimits ≤ 1, best fit on SM.
pub struct InflessLimits;

impl PlacementPolicy for InflessLimits {
    fn name(&self) -> &'static str {
        "infless-l"
    }
    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        gpu.sm_limit_sum + demand.sm_limit <= 1.0 + SHARE_EPSILON && gpu.memory_fits(demand)
    }
    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        1.0 - (gpu.sm_limit_sum + demand.sm_limit)
    }
    fn cost_floor(
        &self,
        _cluster: &ClusterState,
        cell: &GpuCell,
        demand: &InstanceDemand,
    ) -> Option<f64> {
        if !cell.may_fit_limit(demand, 1.0) {
            return Some(f64::INFINITY);
        }
        let most = cell.limit_range()[1];
        Some(1.0 - (most + demand.sm_limit).min(1.0 + SHARE_EPSILON))
    }
}

/// Reserves each instance's SM request: Σrequests ≤ 1, limits unbounded,
/// best fit on SM.
pub struct InflessRequests;

impl PlacementPolicy for InflessRequests {
    fn name(&self) -> &'static str {
        "infless-r"
    }
    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        gpu.sm_request_sum + demand.sm_request <= 1.0 + SHARE_EPSILON && gpu.memory_fits(demand)
    }
    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        1.0 - (gpu.sm_request_sum + demand.sm_request)
    }
    fn cost_floor(
        &self,
        _cluster: &ClusterState,
        cell: &GpuCell,
        demand: &InstanceDemand,
    ) -> Option<f64> {
        if !cell.may_fit_request(demand) {
            return Some(f64::INFINITY);
        }
        Some(1.0 - cell.most_sm_after(demand))
    }
}

/// Bound on Σlimits in the published Dilu scheduler.
pub const DILU_PAPER_LIMIT_BOUND: f64 = 1.5;

/// The published Dilu scheduler: Σrequests ≤ 1 and Σlimits ≤ 1.5; best fit on
/// 0.6·(1 − SM use) + 0.4·(1 − memory use) after placement; tiered search
/// (GPUs already in use first, idle GPUs only when none fits). Gang instances
/// take the best-scoring GPUs wherever they are.
pub struct DiluPaper;

impl PlacementPolicy for DiluPaper {
    fn name(&self) -> &'static str {
        "dilu-paper"
    }
    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        gpu.sm_request_sum + demand.sm_request <= 1.0 + SHARE_EPSILON
            && gpu.sm_limit_sum + demand.sm_limit <= DILU_PAPER_LIMIT_BOUND + SHARE_EPSILON
            && gpu.memory_fits(demand)
    }
    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        let sm_use = gpu.sm_request_sum + demand.sm_request;
        let memory_use = gpu.memory_share_with(demand.memory_bytes);
        let tier = if gpu.is_active() { 0.0 } else { OPEN_GPU_COST };
        tier + 0.6 * (1.0 - sm_use) + 0.4 * (1.0 - memory_use)
    }
    fn cost_floor(
        &self,
        _cluster: &ClusterState,
        cell: &GpuCell,
        demand: &InstanceDemand,
    ) -> Option<f64> {
        if !cell.may_fit_request(demand) || !cell.may_fit_limit(demand, DILU_PAPER_LIMIT_BOUND) {
            return Some(f64::INFINITY);
        }
        let tier = if cell.idle { OPEN_GPU_COST } else { 0.0 };
        Some(
            tier + 0.6 * (1.0 - cell.most_sm_after(demand))
                + 0.4 * (1.0 - cell.most_memory_after(demand)),
        )
    }
    fn gang_on_one_node(&self) -> bool {
        false
    }
}
