//! Which replica of an inference function a departure in the trace stops:
//! the one the placement policy chooses.

use super::trace::TraceRecord;
use crate::model::{ClusterState, InstanceDemand, WorkClass};
use crate::policy::{PlacementPolicy, Replica};

/// Scale-in bookkeeping. An inference record's departure means "its
/// function scales in by one": the trace fixes how many replicas each
/// function runs over time, not which one stops, so the policy may stop any
/// running replica of that function (single-GPU latency instances with the
/// same function name). The stopped replica's own later departure then
/// passes to the one that kept running, so every function's replica count
/// over time is the trace's whatever the policy chooses. Training and other
/// batch work ends when its job does and is never swapped.
pub(super) struct ScaleIn {
    /// Function index of each record, `None` when it is not a replica.
    function: Vec<Option<usize>>,
    /// Running replicas (record indices) per function.
    running: Vec<Vec<usize>>,
    /// Departure event (record index) → instance it stops by default.
    holder: Vec<usize>,
    /// Instance → the departure event it currently holds.
    event_of: Vec<usize>,
}

impl ScaleIn {
    pub(super) fn new(trace: &[TraceRecord]) -> Self {
        let mut names = std::collections::HashMap::new();
        let function = trace
            .iter()
            .map(|record| {
                is_replica(record).then(|| {
                    let next = names.len();
                    *names.entry(record.function.as_str()).or_insert(next)
                })
            })
            .collect();
        Self {
            function,
            running: vec![Vec::new(); names.len()],
            holder: (0..trace.len()).collect(),
            event_of: (0..trace.len()).collect(),
        }
    }

    pub(super) fn started(&mut self, index: usize) {
        if let Some(function) = self.function[index] {
            self.running[function].push(index);
        }
    }

    /// The instance that departure `event` stops, as `policy` chooses it.
    pub(super) fn stop(
        &mut self,
        event: usize,
        policy: &dyn PlacementPolicy,
        cluster: &ClusterState,
        demands: &[InstanceDemand],
        placed_gpus: &[Vec<usize>],
    ) -> usize {
        let default = self.holder[event];
        let Some(function) = self.function[default] else {
            return default;
        };
        let running = &mut self.running[function];
        let replicas: Vec<Replica<'_>> = running
            .iter()
            .map(|&index| Replica {
                demand: &demands[index],
                gpus: &placed_gpus[index],
            })
            .collect();
        let victim = policy
            .choose_scale_in_victim(cluster, &replicas)
            .and_then(|position| running.get(position).copied())
            .unwrap_or(default);
        if let Some(position) = running.iter().position(|&index| index == victim) {
            running.swap_remove(position);
        }
        if victim != default {
            let victims_event = self.event_of[victim];
            self.holder[victims_event] = default;
            self.event_of[default] = victims_event;
        }
        victim
    }
}

/// Whether a record is one replica of an inference function (may be
/// swapped on scale-in or moved while shrinking).
pub(super) fn is_replica(record: &TraceRecord) -> bool {
    record.class == WorkClass::Latency && record.gpus == 1
}
