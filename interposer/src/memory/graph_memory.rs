//! CUDA graph memory nodes under the memory budget.
//!
//! A graph's allocation node reserves a fixed address when it is added; the
//! driver backs it with memory each time the graph runs, keeps that memory
//! reserved for graphs between launches (until `cuDeviceGraphMemTrim`), and
//! an allocation that is not freed inside its graph outlives the launch and
//! even the graph. Launches are invisible to a budget that must stay off the
//! launch path, so the rule is built from what the API exposes: node sizes
//! when nodes are added, graph lifetimes, and the driver's own count of the
//! memory it reserves for graphs.
//!
//! 1. Adding an allocation node (`cuGraphAddMemAllocNode`, or
//!    `cuGraphAddNode`/`_v2` with a `CU_GRAPH_NODE_TYPE_MEM_ALLOC` node) on a
//!    device charges its `bytesize`, rounded like every charge, before the
//!    driver runs. Past the budget the call returns
//!    `CUDA_ERROR_OUT_OF_MEMORY` and no node is created.
//! 2. The charge belongs to the graph. It stays while the graph or any
//!    executable graph instantiated from it exists: launches, free nodes,
//!    frees of the address and trims change nothing, since the next launch
//!    needs the memory again.
//! 3. When the graph and all its executables are destroyed, its charges
//!    become the device's *graph leftover*: the driver may still hold that
//!    memory, as an allocation that escaped the graph or as reserve kept
//!    for graphs.
//! 4. The leftover is reconciled with the driver's
//!    `cuDeviceGetGraphMemAttribute(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)`,
//!    which counts both: it shrinks to that amount (never below) when a
//!    graph or executable is destroyed, after `cuDeviceGraphMemTrim`, in
//!    `cuMemGetInfo`, and before an allocation would be refused.
//!
//! So graph memory is charged from the moment it can exist until the driver
//! reports it gone (never under-counted), and once the driver has given it
//! back the charge is given back at the next reconciliation (never leaked).
//! Allocations recorded by stream capture are ordinary stream-ordered
//! allocations to the budget (charged at the captured `cuMemAllocAsync`,
//! returned at the captured free); see `docs/memory-budgets.md`.
//!
//! Bookkeeping is a mutex-guarded registry, touched only when graphs with
//! allocation nodes are built, instantiated or destroyed. With none in the
//! process, the instantiate and destroy hooks cost one atomic load.

#![allow(clippy::too_many_arguments)]

use core::ffi::{c_char, c_uint, c_ulonglong};
use core::mem::offset_of;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use dilu_abi::cuda::sys::{
    CUDA_GRAPH_INSTANTIATE_PARAMS, CUDA_MEM_ALLOC_NODE_PARAMS, CUdevice, CUgraph, CUgraphEdgeData,
    CUgraphExec, CUgraphMem_attribute, CUgraphNode, CUgraphNodeParams, CUgraphNodeType,
    CUmemLocation, CUmemLocationType, CUmemPoolProps,
};
use dilu_abi::cuda::{CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, CUresult};
use dilu_layout::ledger::MAX_DEVICES;

use crate::driver;
use crate::memory::budget::{self, MemoryBudget};
use crate::table::{Cx, REAL};

/// True once this process has charged an allocation node (until a fork).
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Sum of the leftovers of every device (0: nothing to reconcile).
static LEFTOVER: AtomicU64 = AtomicU64::new(0);

static REGISTRY: Mutex<Registry> = Mutex::new(Registry::new());

/// Which graphs and executables hold which allocation-node charges.
pub struct Registry {
    next_id: u64,
    /// Live graph handle -> record.
    graphs: BTreeMap<usize, u64>,
    /// Live executable handle -> record of the graph it came from.
    execs: BTreeMap<usize, u64>,
    records: BTreeMap<u64, Record>,
    /// Charges of destroyed graphs the driver may still hold, per device.
    leftover: [u64; MAX_DEVICES],
}

struct Record {
    /// The graph itself (until destroyed) plus each live executable.
    holders: usize,
    /// (device, bytes) of every allocation node charged.
    charges: Vec<(usize, u64)>,
}

impl Registry {
    const fn new() -> Self {
        Registry {
            next_id: 0,
            graphs: BTreeMap::new(),
            execs: BTreeMap::new(),
            records: BTreeMap::new(),
            leftover: [0; MAX_DEVICES],
        }
    }

    /// Forgets everything (a forked child holds none of its parent's graphs
    /// or charges).
    pub fn forget_all(&mut self) {
        *self = Registry::new();
        ACTIVE.store(false, Ordering::Release);
        LEFTOVER.store(0, Ordering::Release);
    }

    fn add_charge(&mut self, graph: usize, device: usize, bytes: u64) {
        let id = match self.graphs.get(&graph) {
            Some(&id) => id,
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.graphs.insert(graph, id);
                self.records.insert(
                    id,
                    Record {
                        holders: 1,
                        charges: Vec::new(),
                    },
                );
                id
            }
        };
        if let Some(record) = self.records.get_mut(&id) {
            record.charges.push((device, bytes));
        }
    }

    /// Drops one holder of record `id`; the last one turns its charges
    /// into leftovers, which are then reconciled.
    fn release_holder(&mut self, budget: &MemoryBudget, id: u64) {
        let Some(record) = self.records.get_mut(&id) else {
            return;
        };
        record.holders -= 1;
        if record.holders > 0 {
            return;
        }
        let Some(record) = self.records.remove(&id) else {
            return;
        };
        let mut touched = [false; MAX_DEVICES];
        for (device, bytes) in record.charges {
            self.leftover[device] += bytes;
            LEFTOVER.fetch_add(bytes, Ordering::AcqRel);
            touched[device] = true;
        }
        for (device, _) in touched.iter().enumerate().filter(|(_, t)| **t) {
            self.reconcile(budget, device);
        }
    }

    /// Shrinks `device`'s leftover to what the driver still reserves for
    /// graphs there. Returns the bytes given back.
    fn reconcile(&mut self, budget: &MemoryBudget, device: usize) -> u64 {
        let held = self.leftover[device];
        if held == 0 {
            return 0;
        }
        let Some(reserved) = driver_reserved(device) else {
            return 0;
        };
        let excess = held.saturating_sub(reserved);
        if excess > 0 {
            self.leftover[device] -= excess;
            LEFTOVER.fetch_sub(excess, Ordering::AcqRel);
            budget.release(device, excess);
        }
        excess
    }
}

fn lock() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Locks the registry for `fork` (see [`crate::fork`]).
pub fn lock_for_fork() -> MutexGuard<'static, Registry> {
    lock()
}

/// The driver's count of memory reserved for graphs on `device`.
fn driver_reserved(device: usize) -> Option<u64> {
    let get = driver::resolved(&REAL.cuDeviceGetGraphMemAttribute)?;
    let mut value: u64 = 0;
    let attribute = CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT as c_uint;
    // SAFETY: the real cuDeviceGetGraphMemAttribute; the attribute's value
    // is a cuuint64_t written to a live local.
    let result = unsafe { get(device as CUdevice, attribute, (&raw mut value).cast()) };
    (result == CUDA_SUCCESS).then_some(value)
}

/// Gives back every leftover the driver no longer holds. Cheap (one atomic
/// load) when there is none. Returns whether anything was given back.
pub fn reconcile_all() -> bool {
    if LEFTOVER.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Some(b) = budget::get() else {
        return false;
    };
    let mut registry = lock();
    (0..MAX_DEVICES).fold(0, |sum, device| sum + registry.reconcile(b, device)) > 0
}

/// Reads a 4-byte field of a caller's struct as a raw integer (a C enum may
/// hold values the Rust bindings do not know).
fn raw_u32<T>(base: *const T, offset: usize) -> u32 {
    // SAFETY: `base` is a non-null struct the caller passed to the driver
    // and `offset` lies inside it (from offset_of! on the cuda.h layout).
    unsafe { base.cast::<u8>().add(offset).cast::<u32>().read_unaligned() }
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 share this layout) at `params`:
/// the device its memory lives on, if it is device memory, and its size.
fn device_allocation(params: *const CUDA_MEM_ALLOC_NODE_PARAMS) -> Option<(usize, u64)> {
    const POOL: usize = offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, poolProps);
    const LOCATION: usize = POOL + offset_of!(CUmemPoolProps, location);
    const KIND: usize = LOCATION + offset_of!(CUmemLocation, type_);
    const ID: usize = LOCATION + offset_of!(CUmemLocation, id);
    if params.is_null()
        || raw_u32(params, KIND) != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as u32
    {
        return None;
    }
    let device = raw_u32(params, ID) as usize;
    // SAFETY: non-null caller struct; `bytesize` is a plain size_t.
    let bytes = unsafe { (&raw const (*params).bytesize).read_unaligned() };
    (device < MAX_DEVICES).then_some((device, bytes as u64))
}

/// Charges an allocation node of `graph` and runs `call` (the driver's add).
fn add_allocation(
    graph: CUgraph,
    allocation: Option<(usize, u64)>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let (Some(b), Some((device, bytes))) = (budget::get(), allocation) else {
        return call();
    };
    if device >= b.device_count() {
        return call();
    }
    let charge = budget::charged(bytes);
    if b.reserve(device, charge).is_err() {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let result = call();
    if result == CUDA_SUCCESS {
        ACTIVE.store(true, Ordering::Release);
        budget::reclaim_before_refusing(reconcile_all);
        lock().add_charge(graph as usize, device, charge);
    } else {
        b.release(device, charge);
    }
    result
}

/// Parameters of a node that may be an allocation node.
pub trait NodeParams {
    /// (device, bytes) when `params` describes device memory to allocate.
    fn allocation(params: *const Self) -> Option<(usize, u64)>;
}

impl NodeParams for CUDA_MEM_ALLOC_NODE_PARAMS {
    fn allocation(params: *const Self) -> Option<(usize, u64)> {
        device_allocation(params)
    }
}

impl NodeParams for CUgraphNodeParams {
    fn allocation(params: *const Self) -> Option<(usize, u64)> {
        node_allocation(params)
    }
}

/// The generic node-adding call; `CUgraphNodeParams` carries the node type.
fn node_allocation(params: *const CUgraphNodeParams) -> Option<(usize, u64)> {
    const KIND: usize = offset_of!(CUgraphNodeParams, type_);
    const ALLOC: usize = offset_of!(CUgraphNodeParams, __bindgen_anon_1);
    if params.is_null()
        || raw_u32(params, KIND) != CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32
    {
        return None;
    }
    // SAFETY: for an allocation node the union holds
    // CUDA_MEM_ALLOC_NODE_PARAMS_v2, which has the v1 layout.
    device_allocation(unsafe { params.cast::<u8>().add(ALLOC) }.cast())
}

/// `cuGraphAddMemAllocNode` and `cuGraphAddNode`.
pub fn graph_add_node<P: NodeParams>(
    _cx: Cx,
    next: impl FnOnce(*mut CUgraphNode, CUgraph, *const CUgraphNode, usize, *mut P) -> CUresult,
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    count: usize,
    params: *mut P,
) -> CUresult {
    add_allocation(graph, P::allocation(params), || {
        next(node, graph, dependencies, count, params)
    })
}

pub fn graph_add_node_v2(
    _cx: Cx,
    next: impl FnOnce(
        *mut CUgraphNode,
        CUgraph,
        *const CUgraphNode,
        *const CUgraphEdgeData,
        usize,
        *mut CUgraphNodeParams,
    ) -> CUresult,
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    count: usize,
    params: *mut CUgraphNodeParams,
) -> CUresult {
    add_allocation(graph, node_allocation(params), || {
        next(node, graph, dependencies, edges, count, params)
    })
}

/// Runs an instantiation; a new executable of a graph with charged
/// allocation nodes becomes one more holder of its charges.
fn instantiated(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let result = call();
    if result != CUDA_SUCCESS || exec.is_null() || !ACTIVE.load(Ordering::Acquire) {
        return result;
    }
    // SAFETY: the driver reported success, so it wrote the new executable.
    let exec = unsafe { exec.read() } as usize;
    let mut registry = lock();
    if let Some(&id) = registry.graphs.get(&(graph as usize)) {
        if let Some(record) = registry.records.get_mut(&id) {
            record.holders += 1;
        }
        registry.execs.insert(exec, id);
    }
    result
}

/// `cuGraphInstantiate` (10.0 ABI) and `cuGraphInstantiate_v2`.
pub fn graph_instantiate(
    _cx: Cx,
    next: impl FnOnce(*mut CUgraphExec, CUgraph, *mut CUgraphNode, *mut c_char, usize) -> CUresult,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    error_node: *mut CUgraphNode,
    log: *mut c_char,
    log_size: usize,
) -> CUresult {
    instantiated(exec, graph, || next(exec, graph, error_node, log, log_size))
}

pub fn graph_instantiate_with_flags(
    _cx: Cx,
    next: impl FnOnce(*mut CUgraphExec, CUgraph, c_ulonglong) -> CUresult,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    instantiated(exec, graph, || next(exec, graph, flags))
}

pub fn graph_instantiate_with_params(
    _cx: Cx,
    next: impl FnOnce(*mut CUgraphExec, CUgraph, *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult,
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS,
) -> CUresult {
    instantiated(exec, graph, || next(exec, graph, params))
}

/// Runs a destroy call; on success the handle stops holding its record.
fn destroyed(
    handle: usize,
    table: fn(&mut Registry) -> &mut BTreeMap<usize, u64>,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    let result = call();
    if result != CUDA_SUCCESS || !ACTIVE.load(Ordering::Acquire) {
        return result;
    }
    let Some(b) = budget::get() else {
        return result;
    };
    let mut registry = lock();
    if let Some(id) = table(&mut registry).remove(&handle) {
        registry.release_holder(b, id);
    }
    result
}

pub fn graph_exec_destroy(
    _cx: Cx,
    next: impl FnOnce(CUgraphExec) -> CUresult,
    exec: CUgraphExec,
) -> CUresult {
    destroyed(exec as usize, |r| &mut r.execs, || next(exec))
}

pub fn graph_destroy(_cx: Cx, next: impl FnOnce(CUgraph) -> CUresult, graph: CUgraph) -> CUresult {
    destroyed(graph as usize, |r| &mut r.graphs, || next(graph))
}

/// After the driver trims its graph reserve, leftovers follow it down.
pub fn device_graph_mem_trim(
    _cx: Cx,
    next: impl FnOnce(CUdevice) -> CUresult,
    device: CUdevice,
) -> CUresult {
    let result = next(device);
    if result == CUDA_SUCCESS
        && (0..MAX_DEVICES as CUdevice).contains(&device)
        && let Some(b) = budget::get()
    {
        lock().reconcile(b, device as usize);
    }
    result
}
