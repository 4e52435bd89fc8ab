//! Placement that knows power (`crate::model::power`): `dilu-power`, dilu's
//! rule with a price on the watts a placement adds, and `pwr-fgd`, the
//! combination of PWR and FGD that "Power- and Fragmentation-aware Online
//! Scheduling for GPU Datacenters" (Lettich et al., CCGrid'25) evaluates,
//! written here from that paper and its public simulator's behaviour.
//!
//! **`pwr-fgd`** ranks nodes as Kubernetes' scheduler combines two score
//! plugins. For each node that fits the pod, FGD's plugin scores 100 ×
//! sigmoid(−increase), truncated to an integer, where the increase is the
//! node's fragmentation increase (`fgd`) at the GPU FGD would choose; PWR's
//! scores −(watts the placement adds), truncated, at its own best GPU, and
//! then normalises its scores over the fitting nodes to 0–100 (all alike:
//! 100). A node's score is `pwr_weight` × PWR's + `fgd_weight` × FGD's; the
//! highest wins and the pod takes FGD's GPU there. The scheduler breaks
//! ties at random; here they go to the lower GPU index. The normalisation
//! makes a node's score depend on every other node, so this policy places
//! by ranking ([`PlacementPolicy::place_by_ranking`]) instead of by cost.
//!
//! **`dilu-power`** adds `weight` per 100 W the placement adds (GPUs it
//! wakes, CPU sockets whose first core it takes) to dilu's cost, in the
//! cost's own units (waking a GPU costs 10, `OPEN_GPU_COST`). Cheap GPUs
//! draw pods to them, and where the workload has pods that may run only
//! on some models, that steals the GPUs those pods need: under FGD's
//! protocol on openb's lists where a fifth to a third of the GPU demand
//! names its models, both `pwr-fgd` and a plain price allocated 4-5
//! points less than `fgd`. So a pod that names no model sees a GPU of a
//! model claimed by such pods at a dearer wake: its own watts raised
//! toward the dearest model's by the claim (the share of the workload's
//! GPU demand that needs the model over the model's share of the GPUs, at
//! most 1; `ModelClaims`). The term depends on a node's state only, so the
//! searches' floors and standing indexes hold as for dilu.

use std::sync::{Arc, Mutex};

use super::fgd::FragmentationGradient;
use super::rule::{MoveRequest, Placement, PlacementPolicy, Replica};
use super::search::{cheapest, node_costs};
use crate::model::power::{cpu_watts_added, gpu_watts, model_name, watts_added};
use crate::model::{ClusterState, GpuCell, GpuState, InstanceDemand, PodNeeds, WorkloadMix};

/// `dilu-power`'s price per 100 W when none is given: of 0.003 to 1, the
/// price that allocated most under FGD's protocol on openb's default list
/// (seeds 1-5); the other lists judge it (`bench/results/power.md`).
pub const POWER_WEIGHT: f64 = 0.1;
/// `pwr-fgd`'s weights when none are given: PWR 200, FGD 800, one of the
/// combinations the paper evaluates (PWR 500, 200, 100 or 50 beside FGD
/// 500, 800, 900 or 950).
pub const PWR_FGD_WEIGHTS: (u32, u32) = (200, 800);

/// A policy with a price on the watts its placements add.
pub struct PowerAware {
    inner: Box<dyn PlacementPolicy>,
    /// Cost per 100 W.
    weight: f64,
    /// The claims of the cluster last seen, by its GPU and model counts.
    claims: Mutex<Option<((usize, usize), ModelClaims)>>,
}

impl PowerAware {
    pub fn new(inner: Box<dyn PlacementPolicy>, weight: f64) -> Self {
        Self {
            inner,
            weight,
            claims: Mutex::new(None),
        }
    }

    /// The watts a pod of `needs` sees for waking a GPU of `node`.
    fn wake_watts(&self, cluster: &ClusterState, node: usize, needs: &PodNeeds) -> f64 {
        let own = gpu_watts(model_name(cluster, node)).wake();
        if !needs.models.is_empty() {
            return own;
        }
        let model = cluster
            .hosts
            .get(node)
            .map_or(0, |host| usize::from(host.model));
        let key = (cluster.gpus.len(), cluster.models.len());
        let mut claims = self
            .claims
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let claims = match &mut *claims {
            Some((known, claims)) if *known == key => claims,
            slot => {
                let claims = ModelClaims::new(cluster, self.inner.workload());
                &mut slot.insert((key, claims)).1
            }
        };
        let claim = claims.share.get(model).copied().unwrap_or(0.0);
        own + claim * (claims.dearest_wake - own).max(0.0)
    }
}

/// How much of each GPU model the workload's pods that need it claim.
struct ModelClaims {
    /// Per model (`ClusterState::models`): the share of the workload's GPU
    /// demand that may run only on models including it (split evenly among
    /// them) over the model's share of the cluster's GPUs, at most 1.
    share: Vec<f64>,
    /// The most waking a GPU of the cluster adds.
    dearest_wake: f64,
}

impl ModelClaims {
    fn new(cluster: &ClusterState, workload: Option<&Arc<WorkloadMix>>) -> Self {
        let models = cluster.models.len().max(1);
        let mut gpus_of = vec![0usize; models];
        for (node, gpus) in cluster.nodes.iter().enumerate() {
            let model = cluster
                .hosts
                .get(node)
                .map_or(0, |host| usize::from(host.model));
            if let Some(count) = gpus_of.get_mut(model) {
                *count += gpus.len();
            }
        }
        let dearest_wake = (0..models)
            .filter(|&model| gpus_of[model] > 0)
            .map(|model| gpu_watts(cluster.models.get(model).map_or("", String::as_str)).wake())
            .fold(0.0, f64::max);
        let mut claimed = vec![0.0; models];
        let mut demand = 0.0;
        for task in workload.map_or(&[][..], |mix| &mix.types[..]) {
            let gpus = task.weight * task.share * f64::from(task.gpus);
            demand += gpus;
            for &model in &task.models {
                if let Some(slot) = claimed.get_mut(usize::from(model)) {
                    *slot += gpus / task.models.len() as f64;
                }
            }
        }
        let all = cluster.gpus.len().max(1) as f64;
        let share = claimed
            .iter()
            .zip(&gpus_of)
            .map(|(&claimed, &gpus)| {
                if demand <= 0.0 || gpus == 0 {
                    0.0
                } else {
                    (claimed / demand / (gpus as f64 / all)).min(1.0)
                }
            })
            .collect();
        Self {
            share,
            dearest_wake,
        }
    }
}

impl PlacementPolicy for PowerAware {
    fn name(&self) -> &'static str {
        "dilu-power"
    }

    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        self.inner.admits(gpu, demand)
    }

    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        self.inner.cost(gpu, demand)
    }

    /// The inner policy's: the price on watts is never negative.
    fn cost_floor(
        &self,
        cluster: &ClusterState,
        cell: &GpuCell,
        demand: &InstanceDemand,
    ) -> Option<f64> {
        self.inner.cost_floor(cluster, cell, demand)
    }

    fn cost_context(&self, cluster: &ClusterState) -> Option<u64> {
        let inner = self.inner.cost_context(cluster)?;
        Some(crate::fast_hash::fingerprint([
            inner,
            self.weight.to_bits(),
        ]))
    }

    fn cost_drift(&self, cluster: &ClusterState) -> Option<f64> {
        self.inner.cost_drift(cluster)
    }

    fn costs_on_node(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) {
        self.costs_and_drift_on_node(cluster, node, demand, needs, candidates, out);
    }

    /// The inner policy's bound: the price on watts reads no drift figure.
    fn costs_and_drift_on_node(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) -> f64 {
        let from = out.len();
        let drift = self
            .inner
            .costs_and_drift_on_node(cluster, node, demand, needs, candidates, out);
        // A gang's cost is the mean over its GPUs: each carries its share
        // of the sockets the pod's cores wake.
        let cpu = cpu_watts_added(cluster, node, needs.cpu_milli) / f64::from(demand.gpus.max(1));
        let wake = self.wake_watts(cluster, node, needs);
        for (cost, gpu) in &mut out[from..] {
            let woken = if cluster.gpus[*gpu].is_active() {
                0.0
            } else {
                wake
            };
            *cost += self.weight * (woken + cpu) / 100.0;
        }
        drift
    }

    fn host_only_cost(&self, cluster: &ClusterState, node: usize, needs: &PodNeeds) -> f64 {
        self.inner.host_only_cost(cluster, node, needs)
            + self.weight * cpu_watts_added(cluster, node, needs.cpu_milli) / 100.0
    }

    fn workload(&self) -> Option<&Arc<WorkloadMix>> {
        self.inner.workload()
    }

    fn fallback(&self) -> Option<Box<dyn PlacementPolicy>> {
        let looser = self.inner.fallback()?;
        Some(Box::new(PowerAware::new(looser, self.weight)))
    }

    fn gang_on_one_node(&self) -> bool {
        self.inner.gang_on_one_node()
    }

    fn choose_scale_in_victim(
        &self,
        cluster: &ClusterState,
        replicas: &[Replica<'_>],
    ) -> Option<usize> {
        self.inner.choose_scale_in_victim(cluster, replicas)
    }

    fn consolidation_target(
        &self,
        cluster: &ClusterState,
        request: &MoveRequest<'_>,
    ) -> Option<usize> {
        self.inner.consolidation_target(cluster, request)
    }
}

/// PWR and FGD combined as Kubernetes' scheduler combines score plugins.
pub struct PwrFgd {
    fgd: FragmentationGradient,
    pwr_weight: u32,
    fgd_weight: u32,
}

impl PwrFgd {
    /// `pwr_weight` and `fgd_weight` as the scheduler's plugin weights
    /// (the paper's "PWR 200 FGD 800": 200 and 800).
    pub fn new(mix: Arc<WorkloadMix>, (pwr_weight, fgd_weight): (u32, u32)) -> Self {
        Self {
            fgd: FragmentationGradient::new(mix),
            pwr_weight,
            fgd_weight,
        }
    }

    /// FGD's plugin score for a fragmentation increase.
    fn fgd_score(increase: f64) -> i64 {
        (100.0 / (1.0 + increase.exp())) as i64
    }

    /// The winner among `nodes`, each with PWR's raw score (−watts) and
    /// FGD's score, or `None` when there are none: the index into `nodes`
    /// of the highest combined score, the first of equals.
    fn rank(&self, nodes: &[(i64, i64)]) -> Option<usize> {
        let least = nodes.iter().map(|node| node.0).min()?;
        let most = nodes.iter().map(|node| node.0).max()?;
        let normalised = |pwr: i64| {
            if most == least {
                100
            } else {
                (pwr - least) * 100 / (most - least)
            }
        };
        let mut best: Option<(i64, usize)> = None;
        for (index, &(pwr, fgd)) in nodes.iter().enumerate() {
            let score =
                i64::from(self.pwr_weight) * normalised(pwr) + i64::from(self.fgd_weight) * fgd;
            if best.is_none_or(|(best_score, _)| score > best_score) {
                best = Some((score, index));
            }
        }
        best.map(|(_, index)| index)
    }
}

/// PWR's score for adding `watts`: the drop in the node's draw, truncated.
fn pwr_score(watts: f64) -> i64 {
    -(watts as i64)
}

impl PlacementPolicy for PwrFgd {
    fn name(&self) -> &'static str {
        "pwr-fgd"
    }

    fn admits(&self, gpu: &GpuState, demand: &InstanceDemand) -> bool {
        self.fgd.admits(gpu, demand)
    }

    fn cost(&self, gpu: &GpuState, demand: &InstanceDemand) -> f64 {
        self.fgd.cost(gpu, demand)
    }

    fn costs_on_node(
        &self,
        cluster: &ClusterState,
        node: usize,
        demand: &InstanceDemand,
        needs: &PodNeeds,
        candidates: &[usize],
        out: &mut Vec<(f64, usize)>,
    ) {
        self.fgd
            .costs_on_node(cluster, node, demand, needs, candidates, out);
    }

    fn host_only_cost(&self, cluster: &ClusterState, node: usize, needs: &PodNeeds) -> f64 {
        self.fgd.host_only_cost(cluster, node, needs)
    }

    fn workload(&self) -> Option<&Arc<WorkloadMix>> {
        self.fgd.workload()
    }

    /// Nodes of one class score alike, so each class's first fitting node
    /// stands for it (the scan's ties go to lower GPU indices, which it
    /// holds).
    fn place_by_ranking(
        &self,
        cluster: &ClusterState,
        demand: &InstanceDemand,
        needs: &PodNeeds,
    ) -> Option<Option<Placement>> {
        let wanted = demand.gpus.max(1) as usize;
        let (mut candidates, mut costs) = (Vec::new(), Vec::new());
        let mut choices: Vec<Placement> = Vec::new();
        let mut scores: Vec<(i64, i64)> = Vec::new();
        for node in cluster.class_representatives(needs) {
            costs.clear();
            node_costs(
                (self, cluster, demand, needs),
                node,
                &mut candidates,
                &mut costs,
            );
            let Some(choice) = cheapest(costs.clone(), wanted) else {
                continue;
            };
            // PWR's own choice: for a share of one GPU the GPU adding the
            // least; whole GPUs are the ones FGD takes (idle ones).
            let watts = if wanted == 1 {
                candidates
                    .iter()
                    .map(|&gpu| watts_added(cluster, node, &[gpu], needs.cpu_milli))
                    .fold(f64::INFINITY, f64::min)
            } else {
                watts_added(cluster, node, &choice.gpus, needs.cpu_milli)
            };
            scores.push((pwr_score(watts), Self::fgd_score(choice.cost)));
            choices.push(choice);
        }
        // The first of equal scores is the lowest GPU index: classes come
        // in no order, so sort the fitting nodes by their first GPU.
        let mut order: Vec<usize> = (0..choices.len()).collect();
        order.sort_unstable_by_key(|&index| choices[index].gpus[0]);
        let ranked: Vec<(i64, i64)> = order.iter().map(|&index| scores[index]).collect();
        Some(
            self.rank(&ranked)
                .map(|winner| choices.swap_remove(order[winner])),
        )
    }

    fn place_host_only_by_ranking(
        &self,
        cluster: &ClusterState,
        needs: &PodNeeds,
    ) -> Option<Option<usize>> {
        let mut nodes: Vec<usize> = cluster.class_representatives(needs).collect();
        nodes.sort_unstable();
        let scores: Vec<(i64, i64)> = nodes
            .iter()
            .map(|&node| {
                (
                    pwr_score(cpu_watts_added(cluster, node, needs.cpu_milli)),
                    Self::fgd_score(self.fgd.host_only_cost(cluster, node, needs)),
                )
            })
            .collect();
        Some(self.rank(&scores).map(|winner| nodes[winner]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HostState, WorkClass};
    use crate::policy::{Complementary, place_host_only, place_pod, tell_cluster_the_workload};

    /// Idle nodes of two GPUs and 64 vCPUs each, in this order: G3 (A100s,
    /// waking one adds 350 W), G2 (A10s, 120 W) and T4 (60 W).
    fn mixed_cluster() -> ClusterState {
        let mut cluster = ClusterState::default();
        for name in ["G3", "G2", "T4"] {
            let model = cluster.model_index(name);
            cluster.add_host(
                2,
                1 << 34,
                HostState {
                    cpu_milli: 64_000,
                    cpu_used: 0,
                    memory_mib: 1 << 20,
                    memory_used: 0,
                    model,
                },
            );
        }
        cluster
    }

    fn share_pod(share: f64, models: Vec<u16>) -> (InstanceDemand, PodNeeds) {
        let demand = InstanceDemand {
            class: WorkClass::Batch,
            sm_request: share,
            sm_limit: share,
            memory_bytes: 1 << 30,
            gpus: 1,
        };
        let needs = PodNeeds {
            cpu_milli: 4_000,
            memory_mib: 1024,
            models,
            one_node: true,
        };
        (demand, needs)
    }

    /// The mix of `pods`, each `count` times.
    fn mix(pods: &[((InstanceDemand, PodNeeds), usize)]) -> Arc<WorkloadMix> {
        Arc::new(WorkloadMix::from_tasks(pods.iter().flat_map(
            |((demand, needs), count)| std::iter::repeat_n((demand, needs), *count),
        )))
    }

    fn gpu_of(
        policy: &dyn PlacementPolicy,
        cluster: &ClusterState,
        pod: &(InstanceDemand, PodNeeds),
    ) -> usize {
        place_pod(policy, cluster, &pod.0, &pod.1)
            .expect("fits")
            .gpus[0]
    }

    #[test]
    fn pwr_fgd_wakes_the_gpu_adding_fewest_watts_where_fgd_scores_alike() {
        let pod = share_pod(0.5, Vec::new());
        let workload = mix(&[(pod.clone(), 10)]);
        let mut cluster = mixed_cluster();
        let fgd = FragmentationGradient::new(workload.clone());
        tell_cluster_the_workload(&fgd, &mut cluster);
        // Alike for FGD: every idle node the same; it takes the first.
        assert_eq!(gpu_of(&fgd, &cluster, &pod), 0);
        // PWR's normalised score tells them apart: the T4 node.
        let pwr_fgd = PwrFgd::new(workload.clone(), PWR_FGD_WEIGHTS);
        assert_eq!(gpu_of(&pwr_fgd, &cluster, &pod), 4);
        // Without PWR's weight, FGD's choice.
        let fgd_only = PwrFgd::new(workload, (0, 800));
        assert_eq!(gpu_of(&fgd_only, &cluster, &pod), 0);
        // Once a G2 GPU is half taken, FGD prefers filling it (it leaves no
        // fragment) and so does PWR (it wakes nothing).
        cluster.apply(&pod.0, &[2]);
        cluster.apply_host(1, &pod.1);
        assert_eq!(gpu_of(&pwr_fgd, &cluster, &pod), 2);
    }

    #[test]
    fn pwr_fgd_puts_cores_where_a_socket_is_awake() {
        let pod = share_pod(0.5, Vec::new());
        let workload = mix(&[(pod.clone(), 10)]);
        let mut cluster = mixed_cluster();
        let pwr_fgd = PwrFgd::new(workload, PWR_FGD_WEIGHTS);
        tell_cluster_the_workload(&pwr_fgd, &mut cluster);
        // Cores taken on the G2 node: its first socket is awake.
        cluster.apply_host(
            1,
            &PodNeeds {
                cpu_milli: 2_000,
                ..Default::default()
            },
        );
        let cores_only = PodNeeds {
            cpu_milli: 8_000,
            memory_mib: 1024,
            ..Default::default()
        };
        assert_eq!(place_host_only(&pwr_fgd, &cluster, &cores_only), Some(1));
    }

    #[test]
    fn dilu_power_wakes_cheap_gpus_unless_pods_that_need_them_claim_them() {
        let anywhere = share_pod(0.5, Vec::new());
        let mut cluster = mixed_cluster();
        let t4 = cluster.model_index("T4");
        let on_t4 = share_pod(0.5, vec![t4]);
        let open = mix(&[(anywhere.clone(), 10)]);
        tell_cluster_the_workload(&Complementary::for_workload(open.clone()), &mut cluster);
        let dilu = Complementary::for_workload(open.clone());
        assert_eq!(gpu_of(&dilu, &cluster, &anywhere), 0, "dilu: the first");
        let priced = PowerAware::new(
            Box::new(Complementary::for_workload(open.clone())),
            POWER_WEIGHT,
        );
        assert_eq!(gpu_of(&priced, &cluster, &anywhere), 4, "the T4");
        // Half the workload's GPU demand may run on T4s only, which are a
        // third of the GPUs: they are claimed, and a pod that may run
        // anywhere wakes the next cheapest (the G2's A10), while one that
        // needs a T4 still takes it. (The price is raised so that watts
        // outweigh what FGD's measure says against a half-used A10, which
        // the T4-only pods could not use.)
        let claimed = mix(&[(anywhere.clone(), 5), (on_t4.clone(), 5)]);
        let unclaimed = PowerAware::new(Box::new(Complementary::for_workload(open.clone())), 1.0);
        assert_eq!(gpu_of(&unclaimed, &cluster, &anywhere), 4, "the T4");
        let priced = PowerAware::new(Box::new(Complementary::for_workload(claimed)), 1.0);
        assert_eq!(gpu_of(&priced, &cluster, &anywhere), 2, "an A10");
        assert_eq!(gpu_of(&priced, &cluster, &on_t4), 4);
        // A weight of nothing is dilu.
        let free = PowerAware::new(
            Box::new(Complementary::for_workload(mix(&[(anywhere.clone(), 10)]))),
            0.0,
        );
        assert_eq!(gpu_of(&free, &cluster, &anywhere), 0);
    }
}
