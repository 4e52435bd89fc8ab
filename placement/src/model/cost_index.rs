//! Standing cost indexes: for one pod shape under one policy, every class
//! of identical nodes with the cheapest GPU its first fitting member offers,
//! kept in (cost, GPU) order, so that a single-GPU search reads the best
//! placement off the front instead of scoring classes.
//!
//! A class's best (cost, GPU) depends only on its state (which makes it a
//! class), which of its members fit the pod's host needs, the pod and
//! whatever cluster-wide figures the policy reads (its *context*). So an
//! index stays exact as long as its context holds, if the classes a change
//! touched are scored again: every
//! `ClusterState::refresh_node` logs the class a node leaves and the one it
//! joins, with the node ([`ClassLog`]), and an index replays the log since
//! it last looked before it answers. A class's first fitting member can
//! change only through a node at or below it, so a touch by a later node
//! of a class whose offer names its member is passed over (most touches:
//! a large class gains and loses members above its first). An index is
//! built only for a shape whose last search scored many classes in the
//! same context (a search the cell floors could not cut short), since
//! building scores every class once.
//!
//! One cluster-wide figure may stay out of the context where costs move
//! with it continuously and the policy bounds how fast
//! (`PlacementPolicy::cost_drift`: `dilu`'s scarcity of idle GPUs, which
//! changes whenever a GPU opens, so that a context holding it would hold
//! for a decision or two). Each offer keeps the figure it was scored at
//! and its cost's slope, and an answer walks the order from the front,
//! scoring again at today's figure only the offers whose bound still lets
//! them compete, until the next key, less the most any offer can have
//! moved, passes the best found. Where the figure holds, that is the
//! first entry, as without drift.

use std::collections::{BTreeSet, VecDeque};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Mutex;

use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};

use super::node::PodNeeds;
use crate::fast_hash::FastMap;

/// Classes a search must have scored, in a context that then holds, before
/// the next search of its shape builds an index (below this the floors
/// already cut the search short). The crate's tests build at once, so that
/// their small clusters check the indexes against the scan.
#[cfg(not(test))]
const BUILD_AFTER_SCORED: usize = 256;
#[cfg(test)]
const BUILD_AFTER_SCORED: usize = 1;

/// Built indexes kept at once (the least recently used goes first).
const MOST_INDEXES: usize = 256;

/// Classes a search looks at again, for its own index and then for the
/// one next in turn (see [`CostIndexes::keep_up`]): above what the
/// indexes' changes need per search (about 0.1 class per index per search
/// at 100,000 openb GPUs half requested, with 188 indexes), so that turns
/// keep pace, and a bound on what a search spends on others (none where
/// its own index needed as many).
pub const UPKEEP_LOOKS: usize = 32;

/// Shapes remembered without an index before they are forgotten.
const MOST_SHAPES: usize = 4096;

/// Class changes logged before the older half is dropped (an index that
/// has not looked since then looks at every class again).
const LOG_LIMIT: usize = 1 << 20;

/// The classes each node refresh touched, with the node, in order.
#[derive(Debug, Default)]
pub struct ClassLog {
    touched: Vec<Touch>,
    /// Position of `touched[0]` in the whole log.
    start: u64,
    /// Bumped when every class id is dealt afresh (the classes are filed
    /// again): indexes of an older epoch are built again.
    epoch: u64,
}

/// A copy of a cluster starts with no indexes, so its log starts empty
/// where the original's ends.
impl Clone for ClassLog {
    fn clone(&self) -> Self {
        Self {
            touched: Vec::new(),
            start: self.end(),
            epoch: self.epoch,
        }
    }
}

/// A class changed through a node (`u32::MAX`: a node beyond the log's
/// range, taken as below every member).
#[derive(Debug, Clone, Copy)]
struct Touch {
    class: u32,
    node: u32,
}

impl ClassLog {
    /// Logs that class `id` changed through `node` (which joined or left
    /// it, or whose host changed).
    pub fn touch(&mut self, id: u32, node: usize) {
        if self.touched.len() >= LOG_LIMIT {
            let dropped = LOG_LIMIT / 2;
            self.touched.drain(..dropped);
            self.start += dropped as u64;
        }
        self.touched.push(Touch {
            class: id,
            node: u32::try_from(node).unwrap_or(u32::MAX),
        });
    }

    /// Forgets every class: the ids are to be dealt again.
    pub fn restart(&mut self) {
        self.touched.clear();
        self.start = 0;
        self.epoch += 1;
    }

    fn end(&self) -> u64 {
        self.start + self.touched.len() as u64
    }

    /// The touches from position `from` on, or `None` when the log no
    /// longer reaches back that far.
    fn since(&self, from: u64) -> Option<&[Touch]> {
        let offset = from.checked_sub(self.start)?;
        self.touched.get(offset as usize..)
    }
}

/// What a search asks of the indexes.
pub enum Standing {
    /// The cheapest (cost, GPU) over every class, or `None` when no class
    /// offers a GPU.
    Best(Option<(f64, usize)>),
    /// No index answers: search otherwise, then report what it scored with
    /// `ClusterState::note_search`.
    NotIndexed,
}

/// The indexes of one cluster, by shape (the pod and the policy, as the
/// policy's search encodes them). Derived data: a clone of the cluster
/// starts with none.
#[derive(Default)]
pub struct CostIndexes {
    table: Mutex<Table>,
}

impl Clone for CostIndexes {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for CostIndexes {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "CostIndexes {{ built: {} }}", self.built())
    }
}

#[derive(Default)]
struct Table {
    /// By shape and context (`key_of`): a context that changes leaves its
    /// indexes to age out.
    shapes: FastMap<Vec<u64>, ShapeIndex>,
    built: usize,
    /// Searches answered from an index.
    answers: u64,
    /// Counts searches that asked (also the clock of least-recently-used
    /// eviction).
    clock: u64,
    /// Built indexes' keys in the order they are kept up between their own
    /// searches, round robin (a key whose index went is dropped when met).
    turns: VecDeque<Vec<u64>>,
    /// Classes the last answer's own index looked at again: its turn for
    /// another looks at no more than the rest of [`UPKEEP_LOOKS`].
    looked_last: usize,
}

/// Everything about a pod that a policy's costs may read, word by word:
/// its demand and its host needs (the shape an index is kept for).
pub fn shape_key(demand: &InstanceDemand, needs: &PodNeeds) -> Vec<u64> {
    let mut key = Vec::with_capacity(9 + needs.models.len());
    key.extend([
        u64::from(matches!(demand.class, WorkClass::Batch)),
        demand.sm_request.to_bits(),
        demand.sm_limit.to_bits(),
        demand.memory_bytes,
        u64::from(demand.gpus),
        needs.cpu_milli,
        needs.memory_mib,
        u64::from(needs.one_node),
        needs.models.len() as u64,
    ]);
    key.extend(needs.models.iter().map(|&model| u64::from(model)));
    key
}

/// The pod whose [`shape_key`] `key` is, or `None` for a key that is none.
pub fn pod_of_shape(key: &[u64]) -> Option<(InstanceDemand, PodNeeds)> {
    let [
        batch,
        request,
        limit,
        memory_bytes,
        gpus,
        cpu_milli,
        memory_mib,
        one_node,
        count,
        ..,
    ] = *key
    else {
        return None;
    };
    let models = &key[9..];
    if models.len() as u64 != count {
        return None;
    }
    let demand = InstanceDemand {
        class: if batch == 1 {
            WorkClass::Batch
        } else {
            WorkClass::Latency
        },
        sm_request: f64::from_bits(request),
        sm_limit: f64::from_bits(limit),
        memory_bytes,
        gpus: u32::try_from(gpus).ok()?,
    };
    let needs = PodNeeds {
        cpu_milli,
        memory_mib,
        models: models
            .iter()
            .map(|&model| u16::try_from(model).ok())
            .collect::<Option<_>>()?,
        one_node: one_node == 1,
    };
    Some((demand, needs))
}

/// A shape's key with the policy's context last.
fn key_of(shape: &[u64], context: u64) -> Vec<u64> {
    let mut key = Vec::with_capacity(shape.len() + 1);
    key.extend_from_slice(shape);
    key.push(context);
    key
}

#[derive(Default)]
struct ShapeIndex {
    /// Classes the last search of this shape in this context scored
    /// (when it was not answered here).
    scored: usize,
    /// The index, when built.
    built: Option<Built>,
    used: u64,
    /// Whether its key is in the table's `turns`.
    in_turns: bool,
}

struct Built {
    epoch: u64,
    /// Log position replayed up to.
    seen: u64,
    /// (cost's order key, GPU, class) for every class offering a GPU.
    order: BTreeSet<(u64, usize, u32)>,
    /// What each class offered when last looked at, by class id.
    of_class: Offers,
    /// The drift figures the offers in `order` were scored at.
    span: DriftSpan,
    /// Per class id, the last replay that looked at it (`replays`): a
    /// replay's own marks without zeroing a table of every id per answer
    /// (at 100,000 openb GPUs that zeroing was about a tenth of the
    /// indexes' instructions under callgrind).
    looked_in: Vec<u32>,
    replays: u32,
}

impl Built {
    /// Starts a replay: no class looked at yet.
    fn next_replay(&mut self) {
        self.replays = self.replays.wrapping_add(1);
        if self.replays == 0 {
            self.looked_in.fill(0);
            self.replays = 1;
        }
    }

    /// Whether the current replay looked at class slot `slot`.
    fn looked_at(&self, slot: usize) -> bool {
        self.looked_in.get(slot) == Some(&self.replays)
    }

    fn mark_looked_at(&mut self, slot: usize) {
        if self.looked_in.len() <= slot {
            self.looked_in.resize(slot + 1, 0);
        }
        self.looked_in[slot] = self.replays;
    }

    /// Looks again at the classes `touched` changed, in log order, each
    /// once, until `most` have been looked at; returns how many touches it
    /// went through (all of them unless it stopped there) and how many
    /// classes it looked at. The classes of the touches left are looked at
    /// by a later replay, in the state they have then. `slots`: above
    /// every class id in use.
    fn replay(
        &mut self,
        touched: &[Touch],
        slots: usize,
        view: &mut dyn ClassView,
        figure: f64,
        most: usize,
    ) -> (usize, usize) {
        let beyond = slots.max(self.of_class.slots());
        self.next_replay();
        let mut looked = 0;
        for (at, touch) in touched.iter().enumerate() {
            let slot = touch.class as usize;
            // Looked at already in this replay, in its state now (or beyond
            // the table: no class).
            if slot >= beyond || self.looked_at(slot) {
                continue;
            }
            // A class with a member that fits, touched above it: that
            // member is still its first fitting one.
            let representative = self.of_class.get(slot).map(|offer| offer.representative);
            let above = representative.is_some_and(|representative| {
                touch.node != u32::MAX && touch.node as usize > representative
            });
            if above {
                continue;
            }
            if looked == most {
                return (at, looked);
            }
            looked += 1;
            self.mark_looked_at(slot);
            self.rescore(touch.class, view, (true, false), figure);
        }
        (touched.len(), looked)
    }
}

/// Class ids per chunk of [`Offers`].
const OFFERS_PER_CHUNK: usize = 512;

/// Offers by class id, in chunks of fixed size: an id beyond the last
/// chunk adds one instead of moving every offer. As a cluster fills, new
/// class ids appear above the highest one, and a flat table grown to hold
/// one copied an index's whole table (hundreds of kilobytes at 100,000
/// GPUs) inside the search that met it, for each index in turn: most of
/// the time of two of a thousand searches' slowest dozen.
#[derive(Default)]
struct Offers {
    chunks: Vec<Box<[Option<Offer>]>>,
}

impl Offers {
    /// A table with room for ids below `slots`.
    fn with_slots(slots: usize) -> Self {
        let mut offers = Self::default();
        offers.grow_to(slots);
        offers
    }

    fn grow_to(&mut self, slots: usize) {
        while self.slots() < slots {
            self.chunks
                .push(vec![None; OFFERS_PER_CHUNK].into_boxed_slice());
        }
    }

    /// Ids below this have a place.
    fn slots(&self) -> usize {
        self.chunks.len() * OFFERS_PER_CHUNK
    }

    fn get(&self, slot: usize) -> Option<Offer> {
        self.chunks
            .get(slot / OFFERS_PER_CHUNK)
            .and_then(|chunk| chunk[slot % OFFERS_PER_CHUNK])
    }

    fn slot_mut(&mut self, slot: usize) -> &mut Option<Offer> {
        self.grow_to(slot + 1);
        &mut self.chunks[slot / OFFERS_PER_CHUNK][slot % OFFERS_PER_CHUNK]
    }
}

/// What a class offered: scored on the state of its `generation` through
/// its first fitting member `representative`, its best GPU, if any.
#[derive(Clone, Copy)]
struct Offer {
    generation: u64,
    representative: usize,
    best: Option<Scored>,
}

/// A class's cheapest GPU as scored: its cost's order key, the GPU and its
/// place on the node, the drift figure the cost was scored at and how fast
/// it moves with the figure (see `PlacementPolicy::cost_drift`).
#[derive(Clone, Copy)]
struct Scored {
    key: u64,
    gpu: usize,
    place: usize,
    at: f64,
    slope: f64,
}

/// Room for rounding between a cost scored at one drift figure and the
/// bound its slope puts on it at another (costs are sums of a few terms
/// of order one).
const DRIFT_SLACK: f64 = 1e-9;

/// The drift figures an index's offers were scored at, and their largest
/// slope: how far any offer's cost can have moved since (widened as
/// offers come, never narrowed).
#[derive(Clone, Copy)]
struct DriftSpan {
    low: f64,
    high: f64,
    slope: f64,
}

impl DriftSpan {
    fn new(figure: f64) -> Self {
        Self {
            low: figure,
            high: figure,
            slope: 0.0,
        }
    }

    fn widen(&mut self, scored: &Scored) {
        self.low = self.low.min(scored.at);
        self.high = self.high.max(scored.at);
        self.slope = self.slope.max(scored.slope);
    }

    /// The most any offer's cost can differ at `figure` from its key.
    fn reach(&self, figure: f64) -> f64 {
        moved(
            (figure - self.low).abs().max((self.high - figure).abs()),
            self.slope,
        )
    }
}

/// How far a cost of `slope` moves over a `distance` of the figure (none
/// over none, even at an unknown slope).
fn moved(distance: f64, slope: f64) -> f64 {
    if distance == 0.0 {
        0.0
    } else {
        distance * slope
    }
}

/// What an index asks about the classes of a cluster, for one pod.
pub trait ClassView {
    /// The class's first member that fits the pod's host needs.
    fn representative(&mut self, class: u32) -> Option<usize>;
    /// Which state the class id holds: it changes when the id is dealt to
    /// another state.
    fn generation(&self, class: u32) -> u64;
    /// The global index of `node`'s first GPU.
    fn first_gpu(&self, node: usize) -> usize;
    /// The cheapest (cost, GPU) on `node` for the pod, if it admits it,
    /// with how fast that cost moves with the policy's drift figure.
    fn score(&mut self, node: usize) -> Option<(f64, usize, f64)>;
}

/// A key whose order is `f64::total_cmp`'s.
fn order_key(cost: f64) -> u64 {
    let bits = cost.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn cost_of(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 {
        key & !(1 << 63)
    } else {
        !key
    })
}

impl Built {
    /// Looks at class `class` again. Members of a class score alike, so a
    /// class still in the state it was scored in keeps its cost and its
    /// GPU's place on the node, and only its first fitting member may have
    /// changed: the policy is asked again only for a state not yet scored
    /// here, or with `fresh` for one scored at another drift figure than
    /// `figure`, and the order is touched only where the class's entry
    /// moved (most classes a change touches only gain or lose a later
    /// member). `filed`: whether the class's old entry is in the order.
    /// Returns the class's (cost, GPU), if it offers one.
    fn rescore(
        &mut self,
        class: u32,
        view: &mut dyn ClassView,
        (filed, fresh): (bool, bool),
        figure: f64,
    ) -> Option<(f64, usize)> {
        let slot = class as usize;
        let old = self.of_class.slot_mut(slot).take();
        let entry = |best: Option<Scored>| best.map(|scored| (scored.key, scored.gpu, class));
        let old_entry = old.and_then(|offer| entry(offer.best)).filter(|_| filed);
        let new_entry = match view.representative(class) {
            None => None,
            Some(node) => {
                let (generation, first) = (view.generation(class), view.first_gpu(node));
                let best = match old {
                    Some(offer)
                        if offer.generation == generation
                            && !(fresh && offer.best.is_some_and(|scored| scored.at != figure)) =>
                    {
                        offer.best.map(|scored| Scored {
                            gpu: first + scored.place,
                            ..scored
                        })
                    }
                    _ => view.score(node).map(|(cost, gpu, slope)| Scored {
                        key: order_key(cost),
                        gpu,
                        place: gpu - first,
                        at: figure,
                        slope,
                    }),
                };
                if let Some(scored) = &best {
                    self.span.widen(scored);
                }
                *self.of_class.slot_mut(slot) = Some(Offer {
                    generation,
                    representative: node,
                    best,
                });
                entry(best)
            }
        };
        if old_entry != new_entry {
            if let Some(old_entry) = old_entry {
                self.order.remove(&old_entry);
            }
            if let Some(new_entry) = new_entry {
                self.order.insert(new_entry);
            }
        }
        new_entry.map(|(key, gpu, _)| (cost_of(key), gpu))
    }

    /// The cheapest (cost, GPU) at drift figure `figure`: the order walked
    /// from the front, each offer scored at another figure scored again
    /// where its slope lets it compete, until the next key, less how far
    /// any offer can have moved, is above the best found (ties go to the
    /// lower GPU, as in the scan). Without drift this is the first entry.
    fn best_at(&mut self, figure: f64, view: &mut dyn ClassView) -> Option<(f64, usize)> {
        let reach = self.span.reach(figure);
        let mut best: Option<(f64, usize)> = None;
        let beats = |best: Option<(f64, usize)>, (cost, gpu): (f64, usize)| {
            best.is_none_or(|(best_cost, best_gpu)| {
                cost < best_cost || (cost == best_cost && gpu < best_gpu)
            })
        };
        // Walked in stretches between the offers scored again (which move
        // in the order): the last entry passed, and the class to score.
        let mut after: Option<(u64, usize, u32)> = None;
        loop {
            let mut stale = None;
            let entries = match after {
                None => self.order.range(..),
                Some(entry) => self.order.range((Excluded(entry), Unbounded)),
            };
            for &entry in entries {
                after = Some(entry);
                let (key, gpu, class) = entry;
                let cost = cost_of(key);
                if best.is_some_and(|(best_cost, _)| cost - reach - DRIFT_SLACK > best_cost) {
                    return best;
                }
                let Some(scored) = self
                    .of_class
                    .get(class as usize)
                    .and_then(|offer| offer.best)
                else {
                    continue;
                };
                if scored.at == figure {
                    if beats(best, (cost, gpu)) {
                        best = Some((cost, gpu));
                    }
                    continue;
                }
                let bound = cost - moved((figure - scored.at).abs(), scored.slope) - DRIFT_SLACK;
                if best.is_none_or(|(best_cost, _)| bound <= best_cost) {
                    stale = Some(class);
                    break;
                }
            }
            let Some(class) = stale else {
                return best;
            };
            if let Some(offered) = self.rescore(class, view, (true, true), figure)
                && beats(best, offered)
            {
                best = Some(offered);
            }
        }
    }
}

/// Whether a cluster of `classes` classes could ever build an index (a
/// search scores at most one node per class): else searches need not ask.
pub fn may_build(classes: usize) -> bool {
    classes >= BUILD_AFTER_SCORED
}

impl CostIndexes {
    /// How many searches the indexes answered, of how many that asked.
    pub fn answers(&self) -> (u64, u64) {
        self.table
            .try_lock()
            .map_or((0, 0), |table| (table.answers, table.clock))
    }

    /// How many indexes are built now.
    pub fn built(&self) -> usize {
        self.table.try_lock().map_or(0, |table| table.built)
    }

    /// The best (cost, GPU) for `shape` in `context` (the policy's
    /// fingerprint) at drift figure `figure`, from its index, built or
    /// brought up to date through `log` as needed; `view` answers for
    /// the classes and the pod, `classes` lists every class in use, and
    /// `slots` is above every class id.
    pub fn best(
        &self,
        shape: &[u64],
        (context, figure): (u64, f64),
        log: &ClassLog,
        classes: &mut dyn Iterator<Item = u32>,
        slots: usize,
        view: &mut dyn ClassView,
    ) -> Standing {
        // Another thread searching the same cluster: search without.
        let Ok(mut table) = self.table.try_lock() else {
            return Standing::NotIndexed;
        };
        table.clock += 1;
        let now = table.clock;
        let key = key_of(shape, context);
        let Some(index) = table.shapes.get_mut(&key) else {
            return Standing::NotIndexed;
        };
        index.used = now;
        if let Some(built) = &mut index.built
            && built.epoch == log.epoch
        {
            let looked = match log.since(built.seen) {
                Some(touched) => built.replay(touched, slots, view, figure, usize::MAX).1,
                // The log no longer reaches back: every class is looked at
                // again, those still in the states scored here at little cost.
                None => {
                    built.order.clear();
                    built.span = DriftSpan::new(figure);
                    for class in classes {
                        built.rescore(class, view, (false, false), figure);
                    }
                    usize::MAX
                }
            };
            built.seen = log.end();
            let best = built.best_at(figure, view);
            table.answers += 1;
            table.looked_last = looked;
            return Standing::Best(best);
        }
        // Never built, or built before the classes were filed again: build
        // when the last search was costly.
        let had = index.built.take().is_some();
        if !had && index.scored < BUILD_AFTER_SCORED {
            return Standing::NotIndexed;
        }
        let mut built = Built {
            epoch: log.epoch,
            seen: log.end(),
            order: BTreeSet::new(),
            of_class: Offers::with_slots(slots),
            span: DriftSpan::new(figure),
            looked_in: Vec::new(),
            replays: 0,
        };
        for class in classes {
            built.rescore(class, view, (false, false), figure);
        }
        let best = built.best_at(figure, view);
        index.built = Some(built);
        let queue = !index.in_turns;
        index.in_turns = true;
        table.answers += 1;
        // Built: every class looked at, no turn for another.
        table.looked_last = usize::MAX;
        if queue {
            table.turns.push_back(key);
        }
        if !had {
            table.built += 1;
            table.evict_beyond(MOST_INDEXES);
        }
        Standing::Best(best)
    }

    /// The shape (its key, [`shape_key`]) of the index in `context` next in
    /// turn to be kept up, that has changes to look at (none where the last
    /// answer's own index looked at [`UPKEEP_LOOKS`] classes or more); the
    /// turn passes to the next. Searches answered by an index keep another up so that no
    /// index meets all the changes since its shape's last search at once
    /// (a rare shape's search at 100,000 GPUs looked at hundreds of
    /// classes): with [`keep_up`](Self::keep_up).
    pub fn next_to_keep_up(&self, context: u64, log: &ClassLog) -> Option<Vec<u64>> {
        let mut table = self.table.try_lock().ok()?;
        let table = &mut *table;
        if table.looked_last >= UPKEEP_LOOKS {
            return None;
        }
        for _ in 0..table.turns.len() {
            let key = table.turns.pop_front()?;
            let Some(index) = table.shapes.get_mut(&key) else {
                continue;
            };
            let Some(built) = &index.built else {
                index.in_turns = false;
                continue;
            };
            let changed = built.epoch == log.epoch
                && log
                    .since(built.seen)
                    .is_some_and(|touched| !touched.is_empty());
            let ours = key.last() == Some(&context);
            let shape = (ours && changed).then(|| key[..key.len() - 1].to_vec());
            table.turns.push_back(key);
            if shape.is_some() {
                return shape;
            }
        }
        None
    }

    /// Looks at the classes changed since the index of `shape` in
    /// `context` last looked, as many as the last answer's own index left
    /// of [`UPKEEP_LOOKS`], at drift figure `figure`, through `view` (for
    /// that shape's pod); the rest wait for its next turn or search.
    /// `slots` is above every class id.
    pub fn keep_up(
        &self,
        shape: &[u64],
        (context, figure): (u64, f64),
        log: &ClassLog,
        slots: usize,
        view: &mut dyn ClassView,
    ) {
        let Ok(mut table) = self.table.try_lock() else {
            return;
        };
        let most = UPKEEP_LOOKS.saturating_sub(table.looked_last);
        let Some(built) = table
            .shapes
            .get_mut(&key_of(shape, context))
            .and_then(|index| index.built.as_mut())
        else {
            return;
        };
        if built.epoch != log.epoch {
            return;
        }
        let Some(touched) = log.since(built.seen) else {
            return;
        };
        let (went, _) = built.replay(touched, slots, view, figure, most);
        built.seen += went as u64;
    }

    /// Records that a search of `shape` in `context` scored `scored`
    /// classes without an index.
    pub fn note_search(&self, shape: &[u64], context: u64, scored: usize) {
        let Ok(mut table) = self.table.try_lock() else {
            return;
        };
        if table.shapes.len() >= MOST_SHAPES {
            table.shapes.retain(|_, index| index.built.is_some());
            if table.shapes.len() >= MOST_SHAPES {
                return;
            }
        }
        let now = table.clock;
        let index = table.shapes.entry(key_of(shape, context)).or_default();
        index.scored = scored;
        index.used = now;
    }
}

impl Table {
    fn evict_beyond(&mut self, most: usize) {
        while self.built > most {
            let oldest = self
                .shapes
                .iter()
                .filter(|(_, index)| index.built.is_some())
                .min_by_key(|(_, index)| index.used)
                .map(|(shape, _)| shape.clone());
            let Some(shape) = oldest else { return };
            if let Some(index) = self.shapes.get_mut(&shape) {
                index.built = None;
            }
            self.built -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_keys_sort_costs_as_total_cmp_and_give_them_back() {
        let costs = [-3.5, -0.0, 0.0, 1e-9, 2.0, 10.25, f64::INFINITY];
        for pair in costs.windows(2) {
            assert!(order_key(pair[0]) < order_key(pair[1]), "{pair:?}");
        }
        for cost in costs {
            assert_eq!(cost_of(order_key(cost)).to_bits(), cost.to_bits());
        }
    }

    /// Two-GPU nodes; a class's representative, generation and the
    /// policy's costs per node are set by hand, and every score counted.
    #[derive(Default)]
    struct Fake {
        representative: FastMap<u32, usize>,
        generation: FastMap<u32, u64>,
        cost: FastMap<usize, (f64, usize)>,
        /// How fast each node's cost moves with the drift figure (none
        /// unless set).
        slope: FastMap<usize, f64>,
        scored: Vec<usize>,
    }

    impl ClassView for Fake {
        fn representative(&mut self, class: u32) -> Option<usize> {
            self.representative.get(&class).copied()
        }
        fn generation(&self, class: u32) -> u64 {
            self.generation[&class]
        }
        fn first_gpu(&self, node: usize) -> usize {
            2 * node
        }
        fn score(&mut self, node: usize) -> Option<(f64, usize, f64)> {
            self.scored.push(node);
            let slope = self.slope.get(&node).copied().unwrap_or(0.0);
            self.cost.get(&node).map(|&(cost, gpu)| (cost, gpu, slope))
        }
    }

    #[test]
    fn an_index_asks_the_policy_again_only_for_states_it_has_not_scored() {
        let (indexes, mut log) = (CostIndexes::default(), ClassLog::default());
        let mut view = Fake::default();
        // Class 0: node 3, its second GPU at cost 2; class 1: node 5, its
        // first GPU at cost 1.
        view.representative.extend([(0, 3), (1, 5)]);
        view.generation.extend([(0, 1), (1, 2)]);
        view.cost.extend([(3, (2.0, 7)), (5, (1.0, 10))]);
        let ask = |view: &mut Fake, log: &ClassLog| match indexes.best(
            &[9],
            (4, 0.0),
            log,
            &mut [0, 1].into_iter(),
            2,
            view,
        ) {
            Standing::Best(best) => best,
            Standing::NotIndexed => panic!("no index answered"),
        };
        assert!(matches!(
            indexes.best(&[9], (4, 0.0), &log, &mut [0, 1].into_iter(), 2, &mut view),
            Standing::NotIndexed
        ));
        indexes.note_search(&[9], 4, 2);
        assert_eq!(ask(&mut view, &log), Some((1.0, 10)));
        assert_eq!(view.scored, [3, 5]);
        // Class 1 gains node 9, above its first fitting member: passed over
        // (the view is not asked for its representative again, so a wrong
        // answer planted there does not show).
        view.representative.insert(1, 4);
        log.touch(1, 9);
        assert_eq!(ask(&mut view, &log), Some((1.0, 10)));
        // Node 5 leaves class 1, whose first member is now node 6, in the
        // same state: same cost, same place on the node, no new score.
        view.representative.insert(1, 6);
        log.touch(1, 5);
        assert_eq!(ask(&mut view, &log), Some((1.0, 12)));
        assert_eq!(view.scored, [3, 5]);
        // Class 0's id dealt to another state (a new generation), cheaper:
        // its member left first.
        view.generation.insert(0, 3);
        view.cost.insert(3, (0.5, 6));
        log.touch(0, 3);
        assert_eq!(ask(&mut view, &log), Some((0.5, 6)));
        assert_eq!(view.scored, [3, 5, 3]);
        // Class 0 has no member that fits any more (node 3's host changed).
        view.representative.remove(&0);
        log.touch(0, 3);
        assert_eq!(ask(&mut view, &log), Some((1.0, 12)));
        // So many changes that the log no longer reaches back: every class
        // is looked at again, class 1 (same state) without a new score.
        view.representative.insert(1, 8);
        for _ in 0..=LOG_LIMIT {
            log.touch(1, 20);
        }
        assert_eq!(ask(&mut view, &log), Some((1.0, 16)));
        assert_eq!(view.scored, [3, 5, 3]);
        // Another context is another index, not built yet.
        assert!(matches!(
            indexes.best(&[9], (5, 0.0), &log, &mut [0, 1].into_iter(), 2, &mut view),
            Standing::NotIndexed
        ));
    }

    #[test]
    fn offers_scored_at_another_drift_figure_are_scored_again_only_where_they_may_compete() {
        let (indexes, mut log) = (CostIndexes::default(), ClassLog::default());
        let mut view = Fake::default();
        // Classes 0, 1, 2 on nodes 1, 2, 3: costs 1.0, 1.5 and 5.0 at
        // figure 0, moving by 2, 0 and 1 per unit of it.
        for (class, node, cost, slope) in [(0, 1, 1.0, 2.0), (1, 2, 1.5, 0.0), (2, 3, 5.0, 1.0)] {
            view.representative.insert(class, node);
            view.generation.insert(class, 1);
            view.cost.insert(node, (cost, 2 * node));
            view.slope.insert(node, slope);
        }
        let ask = |view: &mut Fake, log: &ClassLog, figure: f64| match indexes.best(
            &[9],
            (4, figure),
            log,
            &mut [0, 1, 2].into_iter(),
            3,
            view,
        ) {
            Standing::Best(best) => best,
            Standing::NotIndexed => panic!("no index answered"),
        };
        indexes.note_search(&[9], 4, 3);
        assert_eq!(ask(&mut view, &log, 0.0), Some((1.0, 2)));
        assert_eq!(view.scored, [1, 2, 3]);
        // At figure 0.5 class 0 costs 2.0: it and class 1 (whose bound
        // still competes) are scored again; class 2, whose cost can have
        // fallen by 0.5 at most, cannot beat 1.5 and is not.
        view.cost.insert(1, (2.0, 2));
        assert_eq!(ask(&mut view, &log, 0.5), Some((1.5, 4)));
        assert_eq!(view.scored, [1, 2, 3, 1, 2]);
        // The same figure again: every offer that may compete is current.
        assert_eq!(ask(&mut view, &log, 0.5), Some((1.5, 4)));
        assert_eq!(view.scored.len(), 5);
        // Further on, class 2 has fallen to 1.4 (its slope allows 4.1 by
        // figure 4.1): found, though its key was last.
        view.cost.insert(1, (9.2, 2));
        view.cost.insert(3, (1.4, 6));
        assert_eq!(ask(&mut view, &log, 4.1), Some((1.4, 6)));
        assert_eq!(view.scored[5..], [2, 1, 3]);
        // Class 1 in a new state, at 1.0 with an unknown slope: scored again
        // at the next figure, where it costs 3.0, and class 2 (which may
        // have moved by 0.1) with it; class 0 (at 9.2, moving by 0.2 at
        // most) is not.
        view.generation.insert(1, 2);
        view.cost.insert(2, (1.0, 5));
        view.slope.insert(2, f64::INFINITY);
        log.touch(1, 2);
        assert_eq!(ask(&mut view, &log, 4.1), Some((1.0, 5)));
        assert_eq!(view.scored[8..], [2]);
        view.cost.insert(2, (3.0, 5));
        assert_eq!(ask(&mut view, &log, 4.2), Some((1.4, 6)));
        assert_eq!(view.scored[9..], [2, 3]);
    }

    #[test]
    fn indexes_take_turns_to_look_at_changes_a_bounded_step_at_a_time() {
        let (indexes, mut log) = (CostIndexes::default(), ClassLog::default());
        let mut view = Fake::default();
        let classes = UPKEEP_LOOKS as u32 + 5;
        // Class c on node c + 1, its first GPU at cost c + 1.
        for class in 0..classes {
            let node = class as usize + 1;
            view.representative.insert(class, node);
            view.generation.insert(class, 1);
            view.cost.insert(node, (f64::from(class) + 1.0, 2 * node));
        }
        let ask = |shape: u64, context: u64, view: &mut Fake, log: &ClassLog| match indexes.best(
            &[shape],
            (context, 0.0),
            log,
            &mut (0..classes),
            classes as usize,
            view,
        ) {
            Standing::Best(best) => best,
            Standing::NotIndexed => panic!("no index answered"),
        };
        // Every class in a new state, `step` units cheaper than at first.
        let change_all = |view: &mut Fake, log: &mut ClassLog, generation: u64, step: f64| {
            for class in 0..classes {
                let node = class as usize + 1;
                view.generation.insert(class, generation);
                view.cost
                    .insert(node, (f64::from(class) + 1.0 - step, 2 * node));
                log.touch(class, node);
            }
        };
        // Shapes 9 and 8 in context 4, shape 7 in context 5.
        for (shape, context) in [(9, 4), (8, 4), (7, 5)] {
            indexes.note_search(&[shape], context, classes as usize);
            assert_eq!(ask(shape, context, &mut view, &log), Some((1.0, 2)));
        }
        // A build looks at every class: no turn after it.
        change_all(&mut view, &mut log, 2, 0.5);
        assert_eq!(indexes.next_to_keep_up(4, &log), None);
        // Shape 7's search (another context) looks at every class again,
        // more than a turn's worth: still no turn after it.
        assert_eq!(ask(7, 5, &mut view, &log), Some((0.5, 2)));
        assert_eq!(indexes.next_to_keep_up(5, &log), None);
        // Once more, with shape 7's index up to date: its search looks at
        // nothing and a turn follows, for shape 9 (first in the round).
        assert_eq!(ask(7, 5, &mut view, &log), Some((0.5, 2)));
        view.scored.clear();
        assert_eq!(indexes.next_to_keep_up(4, &log), Some(vec![9]));
        indexes.keep_up(&[9], (4, 0.0), &log, classes as usize, &mut view);
        assert_eq!(view.scored.len(), UPKEEP_LOOKS);
        // The turn passes to the other shape of the context (shape 7's
        // index is another context's).
        assert_eq!(indexes.next_to_keep_up(4, &log), Some(vec![8]));
        // Shape 9's own search looks at the classes its turn did not and
        // answers as the cluster is; the turn after it looks at what is
        // left of a turn's worth.
        view.scored.clear();
        assert_eq!(ask(9, 4, &mut view, &log), Some((0.5, 2)));
        assert_eq!(view.scored.len(), 5);
        // Up to date, shape 9 is passed over; shape 8's index still has
        // changes.
        assert_eq!(indexes.next_to_keep_up(4, &log), Some(vec![8]));
        view.scored.clear();
        indexes.keep_up(&[8], (4, 0.0), &log, classes as usize, &mut view);
        assert_eq!(view.scored.len(), UPKEEP_LOOKS - 5);
    }

    #[test]
    fn a_shape_s_pod_is_read_back_from_its_key() {
        let demand = InstanceDemand {
            class: WorkClass::Batch,
            sm_request: 0.25,
            sm_limit: 0.75,
            memory_bytes: 3 << 30,
            gpus: 1,
        };
        let needs = PodNeeds {
            cpu_milli: 6000,
            memory_mib: 2048,
            models: vec![2, 5],
            one_node: true,
        };
        let key = shape_key(&demand, &needs);
        assert_eq!(pod_of_shape(&key), Some((demand, needs)));
        // A key cut short, or with a model count it does not hold, is none.
        assert_eq!(pod_of_shape(&key[..8]), None);
        assert_eq!(pod_of_shape(&key[..key.len() - 1]), None);
    }

    #[test]
    fn classes_opened_above_every_id_an_index_has_seen_are_filed() {
        let (indexes, mut log) = (CostIndexes::default(), ClassLog::default());
        let mut view = Fake::default();
        view.representative.insert(0, 1);
        view.generation.insert(0, 1);
        view.cost.insert(1, (2.0, 3));
        let ask = |view: &mut Fake, log: &ClassLog, slots: usize| match indexes.best(
            &[9],
            (4, 0.0),
            log,
            &mut [0].into_iter(),
            slots,
            view,
        ) {
            Standing::Best(best) => best,
            Standing::NotIndexed => panic!("no index answered"),
        };
        indexes.note_search(&[9], 4, 1);
        assert_eq!(ask(&mut view, &log, 1), Some((2.0, 3)));
        // Ids far above the index's table (several chunks up) open one
        // after another as the cluster fills; the cheapest wins, and its
        // offer goes when its last member leaves.
        let opened = [3 * OFFERS_PER_CHUNK as u32 + 7, OFFERS_PER_CHUNK as u32];
        for (step, &id) in opened.iter().enumerate() {
            let node = 10 + step;
            view.representative.insert(id, node);
            view.generation.insert(id, 5 + step as u64);
            view.cost.insert(node, (1.0 - step as f64 * 0.5, 2 * node));
            log.touch(id, node);
        }
        let slots = opened[0] as usize + 1;
        assert_eq!(ask(&mut view, &log, slots), Some((0.5, 22)));
        view.representative.remove(&opened[1]);
        log.touch(opened[1], 11);
        assert_eq!(ask(&mut view, &log, slots), Some((1.0, 20)));
    }

    #[test]
    fn a_log_that_dropped_an_index_s_position_asks_for_a_rebuild() {
        let mut log = ClassLog::default();
        for id in 0..(LOG_LIMIT as u32 + 1) {
            log.touch(id, 0);
        }
        assert!(log.since(0).is_none());
        assert_eq!(log.since(log.end()).map(<[Touch]>::len), Some(0));
        let last = log.since(log.end() - 1).expect("recent positions stay");
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].class, LOG_LIMIT as u32);
    }
}
