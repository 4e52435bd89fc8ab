//! The workload a cluster expects: the task types FGD's scheduler is
//! given (CPU, GPU share per GPU, GPU count, allowed models) and how often
//! each occurs, and what it says about a node before any pod is scored:
//! how much of the workload could not use each GPU's free share
//! ([`WorkloadMix::fragment_weights`]), which bounds how far placing a pod
//! there can lower the node's fragmentation (see `policy::fgd`).

use dilu_abi::cluster_wire::InstanceDemand;

use super::node::{GpuModel, GpuState, PodNeeds, SHARE_EPSILON};

/// One kind of task in the expected workload.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskType {
    pub cpu_milli: u64,
    /// Share of each GPU it takes (0 for CPU-only tasks).
    pub share: f64,
    /// GPUs it takes (0 for CPU-only tasks).
    pub gpus: u32,
    /// Allowed GPU models; empty means any.
    pub models: Vec<GpuModel>,
    /// Popularity: its fraction of all tasks.
    pub weight: f64,
}

/// The task types a scheduler expects and how often each occurs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadMix {
    pub types: Vec<TaskType>,
}

impl TaskType {
    /// Whether a GPU with `free` of its share free has room for one of
    /// these tasks' shares (FGD's test for a usable free share).
    pub fn fits_in(&self, free: f64) -> bool {
        Self::share_fits(self.share, free)
    }

    /// Whether `free` has room for a per-GPU `share` (FGD's test).
    pub fn share_fits(share: f64, free: f64) -> bool {
        free + SHARE_EPSILON >= share
    }
}

impl WorkloadMix {
    /// Counts the distinct task types of `tasks` (CPU, share per GPU, GPU
    /// count, models) and weighs each by its frequency.
    pub fn from_tasks<'a>(
        tasks: impl IntoIterator<Item = (&'a InstanceDemand, &'a PodNeeds)>,
    ) -> Self {
        let mut types: Vec<TaskType> = Vec::new();
        let mut total = 0.0f64;
        for (demand, needs) in tasks {
            total += 1.0;
            let share = if demand.gpus == 0 {
                0.0
            } else {
                demand.sm_request
            };
            let found = types.iter_mut().find(|task| {
                task.cpu_milli == needs.cpu_milli
                    && (task.share - share).abs() < 1e-6
                    && task.gpus == demand.gpus
                    && task.models == needs.models
            });
            match found {
                Some(task) => task.weight += 1.0,
                None => types.push(TaskType {
                    cpu_milli: needs.cpu_milli,
                    share,
                    gpus: demand.gpus,
                    models: needs.models.clone(),
                    weight: 1.0,
                }),
            }
        }
        for task in &mut types {
            task.weight /= total.max(1.0);
        }
        Self { types }
    }
}

impl WorkloadMix {
    /// Whether every weight is finite and not negative (what the bound of
    /// [`fragment_weights`](Self::fragment_weights) rests on).
    pub fn weights_are_sound(&self) -> bool {
        self.types
            .iter()
            .all(|task| task.weight.is_finite() && task.weight >= 0.0)
    }

    /// The sum of the weights.
    pub fn total_weight(&self) -> f64 {
        self.types.iter().map(|task| task.weight).sum()
    }

    /// For each GPU of a node (`gpus`, its host with `cpu_free` milli-cores
    /// free and GPUs of `model`), a weight that bounds how far placing one
    /// pod of share `s` (at most 1) on it can lower FGD's fragmentation of
    /// the node, counted on every GPU or on busy ones only.
    ///
    /// A busy GPU's is the weight of the task types that count its free
    /// share as a fragment: those that cannot run on the node at all (no
    /// GPU, the model or the CPU missing, or too few GPUs with their share
    /// free, counting idle GPUs' shares or not) and those whose share
    /// exceeds the GPU's free share. The placement lowers the measure by
    /// at most `s` times it: every other task type loses no usable share.
    ///
    /// An idle GPU's bounds the fall itself: on every GPU it is a GPU with
    /// all free, as above; on busy GPUs only, opening it can make a task
    /// type runnable that lacked only fitting GPUs, whose fragments were
    /// then the busy GPUs' whole free shares, at most one per fitting GPU.
    pub fn fragment_weights(&self, gpus: &[GpuState], cpu_free: u64, model: GpuModel) -> Vec<f64> {
        let mut always = 0.0;
        // Task types that run on the node.
        let mut runnable: Vec<&TaskType> = Vec::new();
        // Idle GPUs: types that cannot run on every GPU's measure, and the
        // fragments that opening one could free on the busy GPUs' measure.
        let (mut idle_unrunnable, mut idle_freed) = (0.0, 0.0);
        for task in &self.types {
            let fitting = |busy_only: bool| {
                gpus.iter()
                    .filter(|gpu| !busy_only || gpu.is_active())
                    .filter(|gpu| task.fits_in(gpu.free_share()))
                    .count()
            };
            let possible = task.gpus > 0
                && cpu_free >= task.cpu_milli
                && (task.models.is_empty() || task.models.contains(&model));
            let (on_busy, on_all) = (fitting(true), fitting(false));
            let wanted = task.gpus as usize;
            let runs_on_all = possible && on_all >= wanted;
            let runs_on_busy = possible && on_busy >= wanted;
            if runs_on_all && runs_on_busy {
                runnable.push(task);
            } else {
                always += task.weight;
            }
            if !runs_on_all {
                idle_unrunnable += task.weight;
            }
            if possible && !runs_on_busy {
                idle_freed += task.weight * on_busy as f64;
            }
        }
        let idle = f64::max(idle_unrunnable, idle_freed);
        gpus.iter()
            .map(|gpu| {
                if !gpu.is_active() {
                    return idle;
                }
                let own = gpu.free_share();
                always
                    + runnable
                        .iter()
                        .filter(|task| !task.fits_in(own))
                        .map(|task| task.weight)
                        .sum::<f64>()
            })
            .collect()
    }
}
