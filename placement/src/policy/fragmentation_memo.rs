//! What `fgd` keeps of what it measured, across searches: each node
//! state's fragmentation by its content, and a one-GPU pod's increases by
//! the state's number; and the measure itself on shares in the memo's
//! (ascending) order.

use std::hash::Hash;

use crate::fast_hash::FastMap;
use crate::model::{GpuModel, SHARE_EPSILON, TaskType};

/// Nodes of up to this many GPUs are memoised.
pub const MEMO_GPUS: usize = 8;

/// Entries each map keeps at most.
pub const MEMO_LIMIT: usize = 200_000;

/// A map of at most [`MEMO_LIMIT`] entries that, when full, forgets the
/// half least recently used, not everything: the searches of a
/// long-running scheduler then never all start over together, and what
/// they keep reading stays.
#[derive(Debug)]
pub struct Recent<K, V> {
    /// Each entry with the clock of its last use.
    map: FastMap<K, (V, u64)>,
    /// Counts insertions.
    clock: u64,
}

impl<K, V> Default for Recent<K, V> {
    fn default() -> Self {
        Self {
            map: FastMap::default(),
            clock: 0,
        }
    }
}

impl<K: Hash + Eq, V> Recent<K, V> {
    pub fn get(&mut self, key: &K) -> Option<&V> {
        let clock = self.clock;
        self.map.get_mut(key).map(|entry| {
            entry.1 = clock;
            &entry.0
        })
    }

    pub fn insert(&mut self, key: K, value: V) {
        if self.map.len() >= MEMO_LIMIT {
            // The median last use splits the entries in two (ties fall on
            // the side forgotten, so at least half goes).
            let mut uses: Vec<u64> = self.map.values().map(|entry| entry.1).collect();
            let middle = uses.len() / 2;
            let cutoff = *uses.select_nth_unstable(middle).1;
            self.map.retain(|_, entry| entry.1 > cutoff);
        }
        self.clock += 1;
        self.map.insert(key, (value, self.clock));
    }
}

/// What the policy has measured (one lock per node scored).
#[derive(Debug, Default)]
pub struct Measured {
    /// Node states already measured: a node's fragmentation depends only
    /// on its GPU model, free CPU and the multiset of its GPUs' free
    /// shares, and most nodes of a large cluster are in a few such states
    /// (idle, full). Keyed by those exactly ([`memo_key`]), and measured on
    /// the shares in the key's order, so that a state's value does not
    /// depend on which node was measured first (two searches visiting
    /// nodes in different orders decide alike).
    pub states: Recent<MemoKey, f64>,
    /// What a one-GPU pod's placement on each GPU of a node state adds,
    /// keyed by the state's number (`ClusterState::node_state_id`) and
    /// what the increase reads of the pod: one look-up per node instead
    /// of one per distinct free share and scope. A search scores one node
    /// of each of hundreds of classes, most unchanged since the last pod of
    /// the same share and cores.
    pub increases: Recent<IncreaseKey, Increases>,
}

/// A node state's number, the pod's share (its bits) and its cores.
pub type IncreaseKey = [u64; 3];

/// Increases by scope (`fgd`'s `Scope` as an index) and GPU place on the
/// node, and which places hold one (only GPUs that admitted a pod are
/// measured; a scope only when asked for).
#[derive(Debug, Clone, Copy, Default)]
pub struct Increases {
    pub by_place: [[f64; MEMO_GPUS]; 2],
    pub measured: [u8; 2],
}

/// Model and free CPU, then each GPU's free share (its bits), sorted,
/// unused slots `u64::MAX` (no share has those bits).
pub type MemoKey = [u64; 2 + MEMO_GPUS];

/// The memo's key for a node state and its free shares in the key's
/// order; `None` (measure without the memo) for nodes of more than
/// `MEMO_GPUS` GPUs.
pub fn memo_key(
    free: &[f64],
    cpu_free: u64,
    model: GpuModel,
) -> Option<(MemoKey, [f64; MEMO_GPUS])> {
    if free.len() > MEMO_GPUS {
        return None;
    }
    let mut sorted = [0.0f64; MEMO_GPUS];
    sorted[..free.len()].copy_from_slice(free);
    sorted[..free.len()].sort_unstable_by(f64::total_cmp);
    let mut key = [u64::MAX; 2 + MEMO_GPUS];
    key[0] = u64::from(model);
    key[1] = cpu_free;
    for (slot, share) in key[2..].iter_mut().zip(&sorted[..free.len()]) {
        *slot = share.to_bits();
    }
    Some((key, sorted))
}

/// The task types' shares, distinct, and each type's place among them:
/// how many of a node's shares a type cannot use is then counted once per
/// distinct share (openb's 91 task types have 25), not once per type.
#[derive(Debug, Clone, Default)]
pub struct ShareSteps {
    shares: Vec<f64>,
    of_type: Vec<usize>,
}

impl ShareSteps {
    pub fn new(types: &[TaskType]) -> Self {
        let mut shares: Vec<f64> = types.iter().map(|task| task.share).collect();
        shares.sort_unstable_by(f64::total_cmp);
        shares.dedup_by(|a, b| a.to_bits() == b.to_bits());
        let of_type = types
            .iter()
            .map(|task| shares.partition_point(|share| share.total_cmp(&task.share).is_lt()))
            .collect();
        Self { shares, of_type }
    }
}

/// Distinct shares counted on the stack (more go to the heap).
const STACK_STEPS: usize = 64;

/// `fgd`'s fragmentation of a node (`FragmentationGradient::
/// node_fragmentation`) for the task types `types` (not empty; `steps`
/// built from them), of free shares in ascending order (at most
/// `MEMO_GPUS`), bit for bit: a task type's unusable shares are then the
/// first ones, and their sum (in that order) a prefix sum, so that each
/// type costs a look-up instead of a pass over the node's GPUs (this runs
/// for every node state a search meets first).
pub fn sorted_fragmentation(
    types: &[TaskType],
    steps: &ShareSteps,
    sorted: &[f64],
    cpu_free: u64,
    model: GpuModel,
) -> f64 {
    let total: f64 = sorted.iter().sum();
    if total <= SHARE_EPSILON {
        return 0.0;
    }
    let mut prefix = [0.0f64; MEMO_GPUS + 1];
    for (at, &share) in sorted.iter().enumerate() {
        prefix[at + 1] = prefix[at] + share;
    }
    // Per distinct share, how many of the node's shares are too small for
    // it.
    let mut on_stack = [0usize; STACK_STEPS];
    let mut on_heap = Vec::new();
    let unusable: &mut [usize] = if steps.shares.len() <= STACK_STEPS {
        &mut on_stack[..steps.shares.len()]
    } else {
        on_heap.resize(steps.shares.len(), 0);
        &mut on_heap
    };
    for (count, &step) in unusable.iter_mut().zip(&steps.shares) {
        *count = sorted
            .iter()
            .take_while(|&&share| !TaskType::share_fits(step, share))
            .count();
    }
    types
        .iter()
        .zip(&steps.of_type)
        .map(|(task, &step)| {
            let runnable = task.gpus > 0
                && cpu_free >= task.cpu_milli
                && (task.models.is_empty() || task.models.contains(&model));
            if !runnable {
                return task.weight * total;
            }
            let unusable = unusable[step];
            let fitting = (sorted.len() - unusable) as u32;
            task.weight
                * if fitting >= task.gpus {
                    prefix[unusable]
                } else {
                    total
                }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_memo_forgets_the_half_least_recently_used() {
        let mut memo: Recent<u64, u64> = Recent::default();
        let limit = MEMO_LIMIT as u64;
        for key in 0..limit {
            memo.insert(key, key * 2);
        }
        // Keys 0..10 read again: among the most recently used now.
        for key in 0..10 {
            assert_eq!(memo.get(&key), Some(&(key * 2)));
        }
        memo.insert(limit, 0);
        assert!(memo.map.len() <= MEMO_LIMIT / 2 + 1, "{}", memo.map.len());
        for key in (0..10).chain([limit - 1, limit]) {
            assert!(memo.get(&key).is_some(), "{key} forgotten");
        }
        assert_eq!(memo.get(&10), None);
        assert_eq!(memo.get(&(limit / 2)), None);
    }
}
