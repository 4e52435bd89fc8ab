//! How a placement follows from a policy's admission and costs: the
//! cheapest admitting GPU for a one-GPU instance, the cheapest set for a
//! gang, on classes of identical nodes and by the policy's cost floors and
//! standing indexes where it gives them; where a pod that takes no GPU
//! goes.

use super::rule::{Placement, PlacementPolicy};
use crate::model::{ClusterState, InstanceDemand, PodNeeds, Standing};

/// Where a pod that takes no GPU goes: the node whose host fits `needs`
/// at the least [`PlacementPolicy::host_only_cost`], ties to the lower
/// node, or `None` when no host has its cores and memory free. Such pods
/// matter to GPU placement because their cores are gone for GPU pods: a
/// node with idle GPUs and no cores left strands them (openb's lists have
/// such pods, up to 30% of the tasks in FGD's lists of non-GPU work).
/// Nodes of one class of identical nodes cost alike, so only each class's
/// lowest fitting member is scored.
pub fn place_host_only(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    needs: &PodNeeds,
) -> Option<usize> {
    if let Some(ranked) = policy.place_host_only_by_ranking(cluster, needs) {
        return ranked;
    }
    let mut best: Option<(f64, usize)> = None;
    for node in cluster.class_representatives(needs) {
        let cost = policy.host_only_cost(cluster, node, needs);
        let better = best.is_none_or(|(best_cost, best_node)| {
            cost < best_cost || (cost == best_cost && node < best_node)
        });
        if better {
            best = Some((cost, node));
        }
    }
    best.map(|(_, node)| node)
}

/// Chooses GPUs for `demand` anywhere in the cluster, or `None` if nothing fits.
pub fn place(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
) -> Option<Placement> {
    place_pod(policy, cluster, demand, &PodNeeds::default())
}

/// Chooses GPUs for a pod: `demand` on GPUs of nodes whose host resources
/// and GPU model suit `needs`. A gang stays on one node when the pod says
/// so or the policy prefers it; otherwise it takes the cheapest GPUs of
/// all suitable nodes.
pub fn place_pod(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
) -> Option<Placement> {
    search_with_fallback(policy, cluster, demand, needs, Search::Standing)
}

/// [`place_pod`] without the standing indexes: the search by classes of
/// identical nodes and their cells' cost floors alone, kept for the
/// benchmark that compares them (`placement-latency`).
pub fn place_pod_by_classes(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
) -> Option<Placement> {
    search_with_fallback(policy, cluster, demand, needs, Search::Classes)
}

/// [`place_pod`] scoring every node that fits the pod's host needs: the
/// scan the index of identical nodes replaces, kept for the benchmark that
/// compares them (`placement-latency`) and the tests that they agree.
pub fn place_pod_scanning_every_node(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
) -> Option<Placement> {
    search_with_fallback(policy, cluster, demand, needs, Search::EveryNode)
}

/// [`search`] by the policy, then by its looser form where it places
/// nothing ([`PlacementPolicy::fallback`]).
fn search_with_fallback(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
    by: Search,
) -> Option<Placement> {
    search(policy, cluster, demand, needs, by).or_else(|| {
        let looser = policy.fallback()?;
        search(looser.as_ref(), cluster, demand, needs, by)
    })
}

/// How a search finds the cheapest placement (each gives the same one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Search {
    /// A one-GPU pod from the standing index of its shape, where the
    /// policy fingerprints its costs and an index stands; else as
    /// `Classes`.
    Standing,
    /// One node per class of identical nodes, cheapest cell first where
    /// the policy puts floors under its costs.
    Classes,
    /// Every node.
    EveryNode,
}

/// The search behind [`place_pod`]. Nodes in identical states score
/// alike (`ClusterState::refresh_node` says what state is), and ties go to
/// the lower GPU index, so of each class of identical nodes only the first
/// that fits the pod's host needs is scored (for a gang that may span
/// nodes, the first few that could supply its GPUs), and the result is the
/// full scan's. Where the policy puts floors under its costs, only the
/// classes that could beat the best found are scored ([`search_by_floor`]);
/// otherwise every class is, one node each, or for a gang across nodes
/// every node with a check in O(1) (see `bench/results/placement-latency.md`).
/// `Search::EveryNode` scores every node: the scan the index replaced.
/// A one-GPU pod under a policy that fingerprints its costs
/// ([`PlacementPolicy::cost_context`]) is answered from the standing index
/// of its shape where one stands (`ClusterState::standing_best`), which
/// holds every class's best (cost, GPU) in order and re-scores only the
/// classes changed since its last search; a search that scored many
/// classes without one builds one for the next.
fn search(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
    by: Search,
) -> Option<Placement> {
    if let Some(ranked) = policy.place_by_ranking(cluster, demand, needs) {
        return ranked;
    }
    let indexed = by != Search::EveryNode;
    let standing =
        (by == Search::Standing && demand.gpus <= 1 && cluster.standing_indexes_may_pay())
            .then(|| policy.cost_context(cluster))
            .flatten()
            .map(|context| (crate::model::shape_key(demand, needs), context));
    // Without a drift figure the context says all: every class is scored
    // at the same figure.
    let drift = policy.cost_drift(cluster).unwrap_or(0.0);
    let Some((shape, context)) = standing.filter(|_| drift.is_finite()) else {
        return search_classes(policy, cluster, demand, needs, indexed, &mut 0);
    };
    let (mut candidates, mut costs) = (Vec::new(), Vec::new());
    let mut representative = |class| cluster.class_members_fitting(class, needs).next();
    let mut score = |node| {
        cheapest_for_index(
            (policy, cluster, demand, needs),
            node,
            &mut candidates,
            &mut costs,
        )
    };
    if let Standing::Best(best) =
        cluster.standing_best(&shape, (context, drift), &mut representative, &mut score)
    {
        keep_another_index_up(policy, cluster, (context, drift));
        return best.map(|(cost, gpu)| Placement {
            gpus: vec![gpu],
            cost,
        });
    }
    let mut scored = 0;
    let found = search_classes(policy, cluster, demand, needs, indexed, &mut scored);
    cluster.note_search(&shape, context, scored);
    found
}

/// A node's cheapest GPU for a standing index, as the scan finds it (a
/// cost of −0 is given as 0, which it equals in the scan's comparisons),
/// and how fast its cost moves with the drift figure.
fn cheapest_for_index(
    pod: Pod<'_>,
    node: usize,
    candidates: &mut Vec<usize>,
    costs: &mut Vec<(f64, usize)>,
) -> Option<(f64, usize, f64)> {
    costs.clear();
    let slope = node_costs(pod, node, candidates, costs);
    cheapest_one(costs).map(|(cost, index)| (cost + 0.0, index, slope))
}

/// After a search an index answered, the index of another shape in the
/// same context, next in turn, looks at some of the classes changed
/// since it last did (`ClusterState::keep_standing_index_up`): spread over
/// searches, the changes a rare shape's index would otherwise meet all at
/// its next search.
fn keep_another_index_up(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    (context, drift): (u64, f64),
) {
    let Some((shape, demand, needs)) = cluster.standing_index_to_keep_up(context) else {
        return;
    };
    let (mut candidates, mut costs) = (Vec::new(), Vec::new());
    let mut representative = |class| cluster.class_members_fitting(class, &needs).next();
    let mut score = |node| {
        cheapest_for_index(
            (policy, cluster, &demand, &needs),
            node,
            &mut candidates,
            &mut costs,
        )
    };
    cluster.keep_standing_index_up(&shape, (context, drift), &mut representative, &mut score);
}

/// [`search`] without standing indexes, counting the nodes it scores in
/// `scored`.
fn search_classes(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
    indexed: bool,
    scored: &mut usize,
) -> Option<Placement> {
    let wanted = demand.gpus.max(1) as usize;
    let mut costs = Vec::new();
    let mut candidates = Vec::new();
    let spans_nodes = wanted > 1 && !needs.one_node && !policy.gang_on_one_node();
    if indexed
        && let Some(found) = search_by_floor(policy, cluster, demand, needs, spans_nodes, scored)
    {
        return found;
    }
    // Whether `node` (which fits the host needs) adds nothing to the scan's
    // result: enough identical nodes before it fit too. One is enough when
    // a placement takes its GPUs from one node or wants one GPU: its twins
    // offer the same costs at higher GPU indices, which lose every tie. A
    // gang of `wanted` GPUs across nodes may take a GPU of each of the
    // first `wanted` twins; of idle twins, whose GPUs all cost alike, only
    // as many as hold `wanted` GPUs.
    let redundant = |node: usize| {
        if !indexed {
            return false;
        }
        let twins = if spans_nodes {
            twins_to_score(cluster, node, wanted)
        } else {
            1
        };
        cluster.earlier_twins_fitting(node, needs, twins) >= twins
    };
    // One node's GPUs: one node per class, found through the classes (in
    // no order: ties are broken by GPU index below, as the scan in node
    // order breaks them). A gang across nodes: nodes in order.
    let nodes: Box<dyn Iterator<Item = usize>> = if indexed && !spans_nodes {
        Box::new(cluster.class_representatives(needs))
    } else {
        Box::new(
            (0..cluster.nodes.len())
                .filter(|&node| cluster.host_fits(node, needs) && !redundant(node)),
        )
    };
    if wanted == 1 || spans_nodes {
        for node in nodes {
            *scored += 1;
            node_costs(
                (policy, cluster, demand, needs),
                node,
                &mut candidates,
                &mut costs,
            );
        }
        return cheapest(costs, wanted);
    }
    let mut best: Option<Placement> = None;
    let on = (policy, cluster, demand, needs);
    for node in nodes {
        *scored += 1;
        keep_if_better(on, node, wanted, (&mut candidates, &mut costs), &mut best);
    }
    best
}

/// What a search places and where: the policy, the cluster, the pod's
/// demand and its needs.
type Pod<'a> = (
    &'a dyn PlacementPolicy,
    &'a ClusterState,
    &'a InstanceDemand,
    &'a PodNeeds,
);

/// Scores a placement of `wanted` GPUs on `node` alone and keeps it in
/// `best` if it beats it.
fn keep_if_better(
    on: Pod<'_>,
    node: usize,
    wanted: usize,
    (candidates, costs): (&mut Vec<usize>, &mut Vec<(f64, usize)>),
    best: &mut Option<Placement>,
) {
    costs.clear();
    node_costs(on, node, candidates, costs);
    // One GPU: compared before a placement is built for it.
    if wanted == 1 {
        if let Some((cost, index)) = cheapest_one(costs)
            && beats(cost, index, best.as_ref())
        {
            *best = Some(Placement {
                gpus: vec![index],
                cost,
            });
        }
        return;
    }
    if let Some(candidate) = cheapest(std::mem::take(costs), wanted)
        && beats(candidate.cost, candidate.gpus[0], best.as_ref())
    {
        *best = Some(candidate);
    }
}

/// Whether a placement of `cost` whose first GPU is `first` is better
/// than `best`: cheaper, or as cheap on a lower GPU index (the scan in
/// node order breaks ties so).
fn beats(cost: f64, first: usize, best: Option<&Placement>) -> bool {
    best.is_none_or(|current| {
        cost < current.cost || (cost == current.cost && first < current.gpus[0])
    })
}

/// Room for rounding between a cell's floor and the costs it bounds (the
/// costs compare shares with `SHARE_EPSILON`, 1e-9, here and there).
const FLOOR_SLACK: f64 = 1e-7;

/// The search by the policy's cost floors, or `None` when the policy gives
/// none: the occupied cells of the grid (see `GpuCell`) go cheapest floor
/// first, each class of nodes is scored once, at the first cell that holds
/// one of its GPUs, and the search stops at a cell whose floor exceeds the
/// cost to beat: every class not yet scored has all its GPUs in that cell
/// or later ones, so none can cost less or tie. The cost to beat is the
/// best placement's, or for a gang across nodes the cost of the dearest of
/// the `wanted` cheapest GPUs found. The result is the scan's.
fn search_by_floor(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    needs: &PodNeeds,
    spans_nodes: bool,
    scored: &mut usize,
) -> Option<Option<Placement>> {
    let wanted = demand.gpus.max(1) as usize;
    let mut cells = Vec::new();
    for (cell, bounds) in cluster.occupied_cells() {
        let floor = policy.cost_floor(cluster, &bounds, demand)?;
        if floor.is_finite() {
            cells.push((floor, cell));
        }
    }
    cells.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut seen = vec![false; cluster.class_slots()];
    let (mut candidates, mut costs) = (Vec::new(), Vec::new());
    let mut best: Option<Placement> = None;
    // A gang across nodes: its `wanted` cheapest GPUs so far, by (cost, GPU).
    let mut cheapest_gpus: Vec<(f64, usize)> = Vec::new();
    for (floor, cell) in cells {
        let to_beat = if spans_nodes {
            (cheapest_gpus.len() == wanted).then(|| cheapest_gpus[wanted - 1].0)
        } else {
            best.as_ref().map(|best| best.cost)
        };
        if to_beat.is_some_and(|cost| floor > cost + FLOOR_SLACK) {
            break;
        }
        for class in cluster.classes_in_cell(cell, &mut seen) {
            if !spans_nodes {
                if let Some(node) = cluster.class_members_fitting(class, needs).next() {
                    *scored += 1;
                    let on = (policy, cluster, demand, needs);
                    keep_if_better(on, node, wanted, (&mut candidates, &mut costs), &mut best);
                }
                continue;
            }
            // As the scan: the first `twins` fitting members of a class (see
            // `search`), each GPU of theirs a candidate.
            let members: Vec<usize> = cluster
                .class_members_fitting(class, needs)
                .take(wanted)
                .collect();
            let Some(&first) = members.first() else {
                continue;
            };
            for &node in members.iter().take(twins_to_score(cluster, first, wanted)) {
                costs.clear();
                node_costs(
                    (policy, cluster, demand, needs),
                    node,
                    &mut candidates,
                    &mut costs,
                );
                for &entry in &costs {
                    keep_cheapest(&mut cheapest_gpus, entry, wanted);
                }
            }
        }
    }
    if spans_nodes {
        return Some(cheapest(cheapest_gpus, wanted));
    }
    Some(best)
}

/// How many nodes of `node`'s class a gang of `wanted` GPUs across nodes
/// may take GPUs from: `wanted`, or of idle nodes, whose GPUs all cost
/// alike, as many as hold `wanted` GPUs.
fn twins_to_score(cluster: &ClusterState, node: usize, wanted: usize) -> usize {
    if cluster.node_is_idle(node) {
        wanted.div_ceil(cluster.nodes[node].len().max(1))
    } else {
        wanted
    }
}

/// Adds `entry` (cost, GPU) to `kept`, the at most `wanted` cheapest
/// entries in (cost, GPU) order.
fn keep_cheapest(kept: &mut Vec<(f64, usize)>, entry: (f64, usize), wanted: usize) {
    let order = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    if kept.len() == wanted && kept.last().is_some_and(|last| order(&entry, last).is_ge()) {
        return;
    }
    let at = kept.partition_point(|kept| order(kept, &entry).is_lt());
    kept.insert(at, entry);
    kept.truncate(wanted);
}

/// Like [`place`], but every GPU of the placement is on one node, whatever
/// the policy's gang preference (for front ends whose nodes host an instance
/// only on their own GPUs).
pub fn place_on_one_node(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
) -> Option<Placement> {
    let needs = PodNeeds {
        one_node: true,
        ..PodNeeds::default()
    };
    place_pod(policy, cluster, demand, &needs)
}

/// Chooses GPUs for `demand` among the GPUs of one node.
pub fn place_on_node(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    demand: &InstanceDemand,
    node: usize,
) -> Option<Placement> {
    cluster.nodes.get(node)?;
    let (mut candidates, mut costs) = (Vec::new(), Vec::new());
    let needs = PodNeeds::default();
    node_costs(
        (policy, cluster, demand, &needs),
        node,
        &mut candidates,
        &mut costs,
    );
    cheapest(costs, demand.gpus.max(1) as usize)
}

/// Pushes (cost, GPU) for every GPU of `node` that admits `demand` and is
/// not draining; returns how fast the cheapest moves with the policy's
/// drift figure (`PlacementPolicy::costs_and_drift_on_node`; 0 where no
/// GPU admits it).
pub(super) fn node_costs(
    (policy, cluster, demand, needs): Pod<'_>,
    node: usize,
    candidates: &mut Vec<usize>,
    costs: &mut Vec<(f64, usize)>,
) -> f64 {
    candidates.clear();
    candidates.extend(cluster.nodes[node].clone().filter(|&index| {
        let gpu = &cluster.gpus[index];
        gpu.draining == 0 && policy.admits(gpu, demand)
    }));
    if candidates.is_empty() {
        return 0.0;
    }
    policy.costs_and_drift_on_node(cluster, node, demand, needs, candidates, costs)
}

/// The cheapest of `costs` (ties: lower GPU index), or `None`.
fn cheapest_one(costs: &[(f64, usize)]) -> Option<(f64, usize)> {
    let mut best: Option<(f64, usize)> = None;
    for &(cost, index) in costs {
        if best.is_none_or(|(best_cost, best_index)| {
            cost < best_cost || (cost == best_cost && index < best_index)
        }) {
            best = Some((cost, index));
        }
    }
    best
}

/// The `wanted` cheapest of `costs` (ties: lower GPU index), or `None`.
pub(super) fn cheapest(mut costs: Vec<(f64, usize)>, wanted: usize) -> Option<Placement> {
    if costs.len() < wanted {
        return None;
    }
    if wanted == 1 {
        return cheapest_one(&costs).map(|(cost, index)| Placement {
            gpus: vec![index],
            cost,
        });
    }
    costs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    costs.truncate(wanted);
    let cost = costs.iter().map(|(cost, _)| cost).sum::<f64>() / wanted as f64;
    let mut gpus: Vec<usize> = costs.into_iter().map(|(_, index)| index).collect();
    gpus.sort_unstable();
    Some(Placement { gpus, cost })
}
