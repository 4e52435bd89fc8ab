//! Time integrals over a replay: GPU-seconds in use, what the GPUs in use
//! leave free or oversubscribe, and the watts the cluster draws.

use crate::model::ClusterState;

#[derive(Default)]
pub(super) struct Integrals {
    pub(super) last_time: f64,
    /// Length of the last span advanced over.
    pub(super) last_span: f64,
    pub(super) active_seconds: f64,
    pub(super) sm_free_seconds: f64,
    pub(super) memory_free_seconds: f64,
    pub(super) excess_seconds: f64,
    pub(super) at_risk_seconds: f64,
    /// Watts the cluster drew (`crate::model::power`) times seconds, and
    /// the seconds.
    watt_seconds: f64,
    seconds: f64,
}

impl Integrals {
    pub(super) fn advance(&mut self, now: f64, cluster: &ClusterState) {
        let span = (now - self.last_time).max(0.0);
        self.last_time = now;
        self.last_span = span;
        if span == 0.0 {
            return;
        }
        self.seconds += span;
        self.watt_seconds += span * crate::model::power::cluster_watts(cluster);
        for gpu in cluster.gpus.iter().filter(|gpu| gpu.is_active()) {
            self.active_seconds += span;
            self.sm_free_seconds += span * (1.0 - gpu.sm_request_sum).max(0.0);
            self.memory_free_seconds += span * (1.0 - gpu.memory_share_with(0)).max(0.0);
            let excess = gpu.limit_excess();
            self.excess_seconds += span * excess;
            if excess > 1e-9 {
                self.at_risk_seconds += span;
            }
        }
    }

    pub(super) fn per_active(&self, value: f64) -> f64 {
        if self.active_seconds > 0.0 {
            value / self.active_seconds
        } else {
            0.0
        }
    }

    /// The mean watts drawn over the spans advanced.
    pub(super) fn mean_watts(&self) -> f64 {
        if self.seconds > 0.0 {
            self.watt_seconds / self.seconds
        } else {
            0.0
        }
    }
}
