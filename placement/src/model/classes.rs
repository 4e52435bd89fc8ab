//! Nodes grouped into classes of identical state, and the classes filed by
//! where their GPUs stand: the index a search walks instead of every node.
//!
//! This file knows nothing of GPUs or hosts: the cluster model (`super`)
//! hands it each node's state as a key and the grid cells of its GPUs
//! ([`cell_of`]), and asks back for classes, their members and the classes
//! with a GPU in a cell.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fast_hash::FastMap;

/// Classes opened so far in this process: each opening's generation is
/// its number, unique across clusters and their copies, so that a
/// generation names one node state wherever it is seen (a policy keeps
/// what it measured on a state by it, across the clusters it searches).
static OPENED: AtomicU64 = AtomicU64::new(0);

/// Rows of the grid by a GPU's Σ SM requests, over 0..1.
pub const SM_ROWS: usize = 32;
/// Columns of the grid by a second measure of a GPU (its Σ SM limits, or
/// its fragment weight when the cluster expects a workload), over
/// 0..span (the last also holds all above).
pub const COLUMNS: usize = 16;
/// Steps in which each cell counts its GPUs' memory in use (as a share of
/// their own), so that it knows the most any of them has in use.
pub const MEMORY_STEPS: usize = 8;
/// The first cell of idle GPUs: a row after the grid's, by the same
/// columns (its Σ SM requests and limits are 0; its columns say something
/// only when they are fragment weights). Draining GPUs are in no cell.
pub const IDLE_ROW: u16 = (SM_ROWS * COLUMNS) as u16;
/// Cells in all: the grid's rows and the idle row.
pub const CELLS: usize = (SM_ROWS + 1) * COLUMNS;

/// Where a GPU stands: its cell, its memory and its step of memory in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPoint {
    pub cell: u16,
    pub memory_capacity: u64,
    pub memory_step: u8,
}

/// A cell's GPUs of one memory size, counted by step of memory in use
/// (one per class holding them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRow {
    pub capacity: u64,
    pub at_step: [u32; MEMORY_STEPS],
}

impl MemoryRow {
    /// The most memory in use, as a share, of any GPU counted here (the
    /// top of its highest step in use; infinite for the top step, which
    /// holds all above), or `None` when it counts none.
    pub fn most_share(&self) -> Option<f64> {
        let highest = self.at_step.iter().rposition(|&count| count > 0)?;
        Some(if highest + 1 == MEMORY_STEPS {
            f64::INFINITY
        } else {
            (highest + 1) as f64 / MEMORY_STEPS as f64
        })
    }
}

fn step(value: f64, span: f64, steps: usize) -> usize {
    ((value.max(0.0) / span * steps as f64) as usize).min(steps - 1)
}

/// Where a busy GPU with Σ SM requests `sm_request`, `second` on the
/// columns' measure (spanning 0..`span`) and `memory_share` of its
/// `memory_capacity` in use stands.
pub fn point_of(
    sm_request: f64,
    (second, span): (f64, f64),
    memory_share: f64,
    memory_capacity: u64,
) -> GpuPoint {
    let row = step(sm_request, 1.0, SM_ROWS);
    let column = step(second, span, COLUMNS);
    GpuPoint {
        cell: (row * COLUMNS + column) as u16,
        memory_capacity,
        memory_step: step(memory_share, 1.0, MEMORY_STEPS) as u8,
    }
}

/// The idle row's column of `value`: by the cube root of its share of
/// `span`, so that the columns are finest near 0, where idle GPUs' fragment
/// weights mostly are and where a floor must be fine to stop a search (an
/// idle GPU's cost differs from the open cost by little).
fn idle_step(value: f64, span: f64) -> usize {
    step((value.max(0.0) / span).cbrt(), 1.0, COLUMNS)
}

/// Where an idle GPU of `memory_capacity` stands, `second` on the
/// columns' measure (spanning 0..`span`).
pub fn idle_point(memory_capacity: u64, (second, span): (f64, f64)) -> GpuPoint {
    GpuPoint {
        cell: IDLE_ROW + idle_step(second, span) as u16,
        memory_capacity,
        memory_step: 0,
    }
}

/// The bounds of a cell: Σ SM requests and the columns' measure (spanning
/// 0..`span`), each `[low, high)` (the top row and column hold all above:
/// high infinite; the idle row holds 0 requests).
pub fn cell_ranges(cell: u16, span: f64) -> ([f64; 2], [f64; 2]) {
    let cell = usize::from(cell);
    let (row, column) = (cell / COLUMNS, cell % COLUMNS);
    let range = |index: usize, count: usize, span: f64| {
        let high = if index + 1 == count {
            f64::INFINITY
        } else {
            (index + 1) as f64 * span / count as f64
        };
        [index as f64 * span / count as f64, high]
    };
    if row >= SM_ROWS {
        let [low, high] = range(column, COLUMNS, 1.0);
        return ([0.0; 2], [span * low.powi(3), span * high.powi(3)]);
    }
    (range(row, SM_ROWS, 1.0), range(column, COLUMNS, span))
}

pub const NO_CLASS: u32 = u32::MAX;

const NOT_OCCUPIED: u32 = u32::MAX;

/// The classes of a cluster's nodes (see `ClusterState::refresh_node` for
/// what makes two nodes identical).
#[derive(Debug, Clone)]
pub struct NodeClasses {
    /// Class of each node.
    of_node: Vec<u32>,
    /// Class ids by state key.
    ids: FastMap<Vec<u64>, u32>,
    /// Classes by id; an emptied one waits in `free` for reuse.
    classes: Vec<NodeClass>,
    free: Vec<u32>,
    /// Per cell, the classes with a GPU in it (each once).
    in_cell: Vec<Vec<u32>>,
    /// The cells that hold a class, in no order, and each cell's place
    /// there (`NOT_OCCUPIED` when it holds none), so that a search visits
    /// only these.
    occupied: Vec<u16>,
    occupied_at: Vec<u32>,
    /// Per cell, its GPUs (one per class holding them) by memory size and
    /// step of memory in use.
    memory: Vec<Vec<MemoryRow>>,
}

impl Default for NodeClasses {
    fn default() -> Self {
        Self {
            of_node: Vec::new(),
            ids: FastMap::default(),
            classes: Vec::new(),
            free: Vec::new(),
            in_cell: vec![Vec::new(); CELLS],
            occupied: Vec::new(),
            occupied_at: vec![NOT_OCCUPIED; CELLS],
            memory: vec![Vec::new(); CELLS],
        }
    }
}

#[derive(Debug, Clone, Default)]
struct NodeClass {
    key: Vec<u64>,
    members: BTreeSet<usize>,
    /// The lowest member (kept apart: searches ask for it per node).
    first: usize,
    /// The cells of its GPUs, each once, with the class's place in that
    /// cell's list (for removal in O(1)).
    cells: Vec<(u16, u32)>,
    /// Where each of its GPUs stands (draining ones left out).
    points: Vec<GpuPoint>,
    /// Which opening of a class this is, process-wide (`OPENED`; ids are
    /// reused; a state keeps its generation while its class has members).
    generation: u64,
}

impl NodeClasses {
    /// Makes room for one more node, in no class until [`file`](Self::file).
    pub fn push_node(&mut self) {
        self.of_node.push(NO_CLASS);
    }

    /// Forgets every class (the nodes are to be filed again).
    pub fn clear(&mut self) {
        let nodes = self.of_node.len();
        *self = Self::default();
        self.of_node = vec![NO_CLASS; nodes];
    }

    /// Files `node` in the class of state `key`, whose GPUs stand at
    /// `points()` (any order; draining GPUs left out; asked only when the
    /// class is new), leaving its old class.
    pub fn file(&mut self, node: usize, key: Vec<u64>, points: impl FnOnce() -> Vec<GpuPoint>) {
        let old = self.of_node[node];
        if old != NO_CLASS {
            if self.classes[old as usize].key == key {
                return;
            }
            self.leave(node, old);
        }
        let id = match self.ids.get(&key) {
            Some(&id) => id,
            None => self.open_class(key, points()),
        };
        self.of_node[node] = id;
        let class = &mut self.classes[id as usize];
        if class.members.first().is_none_or(|&first| node < first) {
            class.first = node;
        }
        class.members.insert(node);
    }

    fn leave(&mut self, node: usize, id: u32) {
        let class = &mut self.classes[id as usize];
        class.members.remove(&node);
        if let Some(&first) = class.members.first() {
            class.first = first;
            return;
        }
        let key = std::mem::take(&mut class.key);
        let cells = std::mem::take(&mut class.cells);
        for point in std::mem::take(&mut class.points) {
            *self.memory_count(point) -= 1;
        }
        self.ids.remove(&key);
        for (cell, slot) in cells {
            let list = &mut self.in_cell[usize::from(cell)];
            list.swap_remove(slot as usize);
            if list.is_empty() {
                let at = std::mem::replace(&mut self.occupied_at[usize::from(cell)], NOT_OCCUPIED);
                self.occupied.swap_remove(at as usize);
                if let Some(&moved) = self.occupied.get(at as usize) {
                    self.occupied_at[usize::from(moved)] = at;
                }
            }
            let list = &self.in_cell[usize::from(cell)];
            // The class moved into the freed slot learns its new place.
            if let Some(&moved) = list.get(slot as usize) {
                for entry in &mut self.classes[moved as usize].cells {
                    if entry.0 == cell {
                        entry.1 = slot;
                    }
                }
            }
        }
        self.free.push(id);
    }

    fn open_class(&mut self, key: Vec<u64>, points: Vec<GpuPoint>) -> u32 {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.classes.push(NodeClass::default());
                (self.classes.len() - 1) as u32
            }
        };
        let mut distinct: Vec<u16> = points.iter().map(|point| point.cell).collect();
        distinct.sort_unstable();
        distinct.dedup();
        for &point in &points {
            *self.memory_count(point) += 1;
        }
        let class = &mut self.classes[id as usize];
        class.generation = OPENED.fetch_add(1, Ordering::Relaxed) + 1;
        class.points = points;
        class.cells.clear();
        for cell in distinct {
            if self.in_cell[usize::from(cell)].is_empty() {
                self.occupied_at[usize::from(cell)] = self.occupied.len() as u32;
                self.occupied.push(cell);
            }
            let list = &mut self.in_cell[usize::from(cell)];
            class.cells.push((cell, list.len() as u32));
            list.push(id);
        }
        class.key = key.clone();
        self.ids.insert(key, id);
        id
    }

    /// How many classes there are.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The id of `node`'s class.
    pub fn of(&self, node: usize) -> Option<u32> {
        self.of_node.get(node).copied().filter(|&id| id != NO_CLASS)
    }

    /// Ids of every class in use, in no order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.classes.len() as u32).filter(|&id| !self.classes[id as usize].members.is_empty())
    }

    /// Slots for per-class marks: every id is below this.
    pub fn id_bound(&self) -> usize {
        self.classes.len()
    }

    /// The lowest member of class `id`, or `None` when it has none (an id
    /// emptied since it was logged).
    pub fn first(&self, id: u32) -> Option<usize> {
        let class = &self.classes[id as usize];
        (!class.members.is_empty()).then_some(class.first)
    }

    /// Which opening of a class id `id` holds now (see `NodeClass`).
    pub fn generation(&self, id: u32) -> u64 {
        self.classes
            .get(id as usize)
            .map_or(0, |class| class.generation)
    }

    /// The members of class `id`, in node order.
    pub fn members(&self, id: u32) -> impl Iterator<Item = usize> + '_ {
        self.classes[id as usize].members.iter().copied()
    }

    /// The members of class `id` below `node`, in node order.
    pub fn members_before(&self, id: u32, node: usize) -> impl Iterator<Item = usize> + '_ {
        self.classes[id as usize].members.range(..node).copied()
    }

    /// The count of GPUs like `point` in its cell.
    fn memory_count(&mut self, point: GpuPoint) -> &mut u32 {
        let rows = &mut self.memory[usize::from(point.cell)];
        let row = match rows
            .iter()
            .position(|row| row.capacity == point.memory_capacity)
        {
            Some(row) => row,
            None => {
                rows.push(MemoryRow {
                    capacity: point.memory_capacity,
                    at_step: [0; MEMORY_STEPS],
                });
                rows.len() - 1
            }
        };
        &mut rows[row].at_step[usize::from(point.memory_step)]
    }

    /// The GPUs in `cell` by memory size and step of memory in use.
    pub fn memory_in(&self, cell: u16) -> &[MemoryRow] {
        self.memory
            .get(usize::from(cell))
            .map_or(&[], |rows| rows.as_slice())
    }

    /// The cells that hold a class, in no order.
    pub fn occupied(&self) -> &[u16] {
        &self.occupied
    }

    /// The classes with a GPU in `cell`.
    pub fn in_cell(&self, cell: u16) -> &[u32] {
        self.in_cell
            .get(usize::from(cell))
            .map_or(&[], |list| list.as_slice())
    }
}
