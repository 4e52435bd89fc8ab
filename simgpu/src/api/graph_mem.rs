//! Graph memory nodes: allocation and free nodes, the per-device graph
//! memory reserve, trimming and its attributes.
//!
//! The model (per process and device, like the driver's graph memory pool):
//! - adding an allocation node reserves a fixed address in the device's
//!   arena and charges nothing;
//! - `cuGraphLaunch` walks the executable's memory nodes in order: an
//!   allocation node makes its allocation live (`used` grows), a free node
//!   ends one. When `used` passes `reserved`, the difference is charged to
//!   the shared device before anything is enqueued: a launch that does not
//!   fit fails with `CUDA_ERROR_OUT_OF_MEMORY` and changes nothing;
//! - an allocation not freed in its graph stays live after the launch (and
//!   after the graph is destroyed) until `cuMemFree`/`cuMemFreeAsync` or a
//!   launched free node ends it; launching its graph again while it is live
//!   is `CUDA_ERROR_INVALID_VALUE`;
//! - ended allocations stay `reserved` (charged) until
//!   `cuDeviceGraphMemTrim`, which gives back everything not live.

use super::{out, read};
use crate::Res;
use crate::driver::drv;
use crate::exec::{GRAPHS, Op};
use crate::memory::charged;
use dilu_abi::cuda::*;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

type CUdevice = sys::CUdevice;
type CUgraph = sys::CUgraph;
type CUgraphNode = sys::CUgraphNode;

export! {
    fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, p: *mut AllocParams) => add_alloc_node;
    fn cuGraphAddMemFreeNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, dptr: sys::CUdeviceptr) => add_free_node;
    fn cuGraphAddNode(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, p: *mut NodeParams) => add_node;
    fn cuGraphAddNode_v2(node: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, p: *mut NodeParams) => add_node_v2;
    fn cuDeviceGraphMemTrim(dev: CUdevice) => trim;
    fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) => get_attribute;
    fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: c_int, value: *mut c_void) => set_attribute;
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2) with the pool's location read
/// as plain integers: `poolProps` starts with two 4-byte enums and
/// `CUmemLocation { type, id }`; the rest of it is opaque here.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AllocParams {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: c_int,
    pub pool_rest: [u8; POOL_PROPS_SIZE - 16],
    pub access_descs: *const c_void,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: sys::CUdeviceptr,
}

const POOL_PROPS_SIZE: usize = std::mem::size_of::<sys::CUmemPoolProps>();
const _: () = assert!(
    std::mem::size_of::<AllocParams>() == std::mem::size_of::<sys::CUDA_MEM_ALLOC_NODE_PARAMS>()
);

/// `CUgraphNodeParams`: the node type, then (at offset 16) the union of
/// per-type parameters, of which the allocation and free forms are used.
#[repr(C)]
pub struct NodeParams {
    pub node_type: u32,
    pub reserved0: [c_int; 3],
    pub params: NodeUnion,
    pub reserved2: i64,
}

#[repr(C)]
pub union NodeUnion {
    pub reserved1: [i64; 29],
    pub alloc: AllocParams,
    pub free_dptr: sys::CUdeviceptr,
}

const _: () =
    assert!(std::mem::size_of::<NodeParams>() == std::mem::size_of::<sys::CUgraphNodeParams>());

const CU_MEM_LOCATION_TYPE_DEVICE: u32 = 1;
const CU_GRAPH_NODE_TYPE_MEM_ALLOC: u32 = 10;
const CU_GRAPH_NODE_TYPE_MEM_FREE: u32 = 11;

struct Allocation {
    dev: usize,
    bytes: u64,
    live: bool,
}

#[derive(Default, Clone, Copy)]
struct Pool {
    used: u64,
    used_high: u64,
    reserved: u64,
    reserved_high: u64,
}

struct State {
    /// Address -> graph allocation (addresses are never reused).
    allocations: BTreeMap<u64, Allocation>,
    pools: BTreeMap<usize, Pool>,
}

static STATE: Mutex<State> = Mutex::new(State {
    allocations: BTreeMap::new(),
    pools: BTreeMap::new(),
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn add_alloc_node(
    _: bool,
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _n: usize,
    p: *mut AllocParams,
) -> Res {
    let d = drv()?;
    let graph = GRAPHS.get(g as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let params = read(p)?;
    if params.location_type != CU_MEM_LOCATION_TYPE_DEVICE || params.bytesize == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = d.check_dev(params.location_id)?;
    if d.null() {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let bytes = charged(params.bytesize as u64);
    let ptr = d.arenas[dev]
        .alloc(bytes as usize)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)? as u64;
    state().allocations.insert(
        ptr,
        Allocation {
            dev,
            bytes,
            live: false,
        },
    );
    // SAFETY: `p` is the caller's writable parameter struct (read above);
    // the driver returns the allocation's address in its `dptr`.
    unsafe { (&raw mut (*p).dptr).write_unaligned(ptr) };
    let mut ops = graph.ops.lock().unwrap_or_else(|e| e.into_inner());
    ops.push(Op::GraphAlloc { ptr });
    out(node, ops.len() as CUgraphNode)
}

fn add_free_node(
    _: bool,
    node: *mut CUgraphNode,
    g: CUgraph,
    _deps: *const CUgraphNode,
    _n: usize,
    dptr: sys::CUdeviceptr,
) -> Res {
    drv()?;
    let graph = GRAPHS.get(g as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !state().allocations.contains_key(&dptr) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut ops = graph.ops.lock().unwrap_or_else(|e| e.into_inner());
    ops.push(Op::GraphFree { ptr: dptr });
    out(node, ops.len() as CUgraphNode)
}

/// `cuGraphAddNode`: allocation and free nodes only.
fn add_node(
    pt: bool,
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    p: *mut NodeParams,
) -> Res {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null caller struct; the type is a plain 4-byte field.
    let node_type = unsafe { (&raw const (*p).node_type).read_unaligned() };
    // SAFETY: as above; the union member read is the one `node_type` names.
    let params = unsafe { &raw mut (*p).params };
    match node_type {
        CU_GRAPH_NODE_TYPE_MEM_ALLOC => add_alloc_node(pt, node, g, deps, n, params.cast()),
        CU_GRAPH_NODE_TYPE_MEM_FREE => {
            let dptr = read(params.cast::<sys::CUdeviceptr>())?;
            add_free_node(pt, node, g, deps, n, dptr)
        }
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

fn add_node_v2(
    pt: bool,
    node: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const c_void,
    n: usize,
    p: *mut NodeParams,
) -> Res {
    add_node(pt, node, g, deps, n, p)
}

/// Applies the memory nodes of a launch, in order, before any of its work
/// is enqueued; charges the reserve growth to the device first.
pub(crate) fn launch(ops: &[Op]) -> Res {
    if !ops
        .iter()
        .any(|op| matches!(op, Op::GraphAlloc { .. } | Op::GraphFree { .. }))
    {
        return Ok(());
    }
    let d = drv()?;
    let mut st = state();
    // Dry run: every allocation must be dead when reached, every free must
    // end a live one; track each device's peak.
    let mut live: HashMap<u64, bool> = HashMap::new();
    let mut pools = st.pools.clone();
    for op in ops {
        let (ptr, alloc) = match op {
            Op::GraphAlloc { ptr } => (*ptr, true),
            Op::GraphFree { ptr } => (*ptr, false),
            _ => continue,
        };
        let a = st.allocations.get(&ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let was_live = *live.entry(ptr).or_insert(a.live);
        if was_live == alloc {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        live.insert(ptr, alloc);
        let pool = pools.entry(a.dev).or_default();
        if alloc {
            pool.used += a.bytes;
            pool.used_high = pool.used_high.max(pool.used);
        } else {
            pool.used -= a.bytes;
        }
        if pool.used > pool.reserved {
            pool.reserved = pool.used;
            pool.reserved_high = pool.reserved_high.max(pool.reserved);
        }
    }
    let growth: Vec<(usize, u64)> = pools
        .iter()
        .map(|(&dev, p)| {
            (
                dev,
                p.reserved - st.pools.get(&dev).map_or(0, |q| q.reserved),
            )
        })
        .filter(|&(_, g)| g > 0)
        .collect();
    for (i, &(dev, bytes)) in growth.iter().enumerate() {
        if let Err(e) = d.charge(dev, bytes) {
            for &(dev, bytes) in &growth[..i] {
                d.uncharge(dev, bytes);
            }
            return Err(e);
        }
    }
    for (ptr, now_live) in live {
        if let Some(a) = st.allocations.get_mut(&ptr) {
            a.live = now_live;
        }
    }
    st.pools = pools;
    Ok(())
}

/// `cuMemFree`/`cuMemFreeAsync` of a graph allocation: `Some` when `ptr` is
/// one (ending it if live, else an error), `None` for other pointers.
pub(crate) fn free(ptr: u64) -> Option<Res> {
    let mut st = state();
    let a = st.allocations.get_mut(&ptr)?;
    if !a.live {
        return Some(Err(CUDA_ERROR_INVALID_VALUE));
    }
    a.live = false;
    let (dev, bytes) = (a.dev, a.bytes);
    st.pools.entry(dev).or_default().used -= bytes;
    Some(Ok(()))
}

fn trim(_: bool, dev: CUdevice) -> Res {
    let d = drv()?;
    let dev = d.check_dev(dev)?;
    let mut st = state();
    let pool = st.pools.entry(dev).or_default();
    let unused = pool.reserved - pool.used;
    pool.reserved = pool.used;
    drop(st);
    d.uncharge(dev, unused);
    Ok(())
}

fn get_attribute(_: bool, dev: CUdevice, attr: c_int, value: *mut c_void) -> Res {
    let d = drv()?;
    let dev = d.check_dev(dev)?;
    let pool = state().pools.get(&dev).copied().unwrap_or_default();
    let v = match attr {
        0 => pool.used,
        1 => pool.used_high,
        2 => pool.reserved,
        3 => pool.reserved_high,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    out(value.cast::<u64>(), v)
}

/// Only the high watermarks can be set, and only to 0 (reset to current).
fn set_attribute(_: bool, dev: CUdevice, attr: c_int, value: *mut c_void) -> Res {
    let d = drv()?;
    let dev = d.check_dev(dev)?;
    if read(value.cast::<u64>())? != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = state();
    let pool = st.pools.entry(dev).or_default();
    match attr {
        1 => pool.used_high = pool.used,
        3 => pool.reserved_high = pool.reserved,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}
