//! Modules (images read by [`crate::fatbin`]), functions, kernel launches
//! and graphs. Kernels are timed, never executed: simgpu computes no kernel
//! results.

use super::{cstr, out, read};
use crate::Res;
use crate::driver::{Registry, current, drv};
use crate::elf::KernelParam;
use crate::exec::{GRAPH_EXECS, GRAPHS, Graph, GraphExec, KernelOp, Op, resolve};
use crate::fatbin::Image;
use dilu_abi::cuda::*;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

type CUfunction = sys::CUfunction;
type CUmodule = sys::CUmodule;
type CUstream = sys::CUstream;
type CUdeviceptr = sys::CUdeviceptr;

export! {
    fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) => module_load_data;
    fn cuModuleLoadDataEx(m: *mut CUmodule, image: *const c_void, n: c_uint, opts: *mut c_int, vals: *mut *mut c_void) => module_load_data_ex;
    fn cuModuleLoad(m: *mut CUmodule, path: *const c_char) => module_load;
    fn cuModuleUnload(m: CUmodule) => module_unload;
    fn cuModuleLoadFatBinary(m: *mut CUmodule, image: *const c_void) => module_load_fat_binary;
    fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, m: CUmodule, name: *const c_char) => module_get_global;
    fn cuModuleGetLoadingMode(mode: *mut c_int) => module_loading_mode;
    fn cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, name: *const c_char) => module_get_function;
    fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: CUfunction) => func_get_attribute;
    fn cuFuncSetAttribute(f: CUfunction, attr: c_int, v: c_int) => func_set_attribute;
    fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) => func_get_name;
    fn cuFuncGetParamInfo(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) => func_get_param_info;
    fn cuFuncGetParamCount(f: CUfunction, count: *mut usize) => func_get_param_count;
    fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, s: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) | cuLaunchKernel_ptsz => launch_kernel;
    fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shmem: c_uint, s: CUstream, params: *mut *mut c_void) | cuLaunchCooperativeKernel_ptsz => launch_cooperative;
    fn cuLaunchKernelEx(cfg: *const sys::CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) | cuLaunchKernelEx_ptsz => launch_kernel_ex;
    fn cuGraphCreate(g: *mut sys::CUgraph, flags: c_uint) => graph_create;
    fn cuGraphDestroy(g: sys::CUgraph) => graph_destroy;
    fn cuGraphAddKernelNode_v2(node: *mut sys::CUgraphNode, g: sys::CUgraph, deps: *const sys::CUgraphNode, n: usize, p: *const sys::CUDA_KERNEL_NODE_PARAMS) => graph_add_kernel_node;
    fn cuGraphInstantiateWithFlags(e: *mut sys::CUgraphExec, g: sys::CUgraph, flags: u64) => graph_instantiate;
    fn cuGraphInstantiate_v2(e: *mut sys::CUgraphExec, g: sys::CUgraph, err_node: *mut sys::CUgraphNode, log: *mut c_char, size: usize) => graph_instantiate_v2;
    fn cuGraphInstantiateWithParams(e: *mut sys::CUgraphExec, g: sys::CUgraph, p: *mut c_void) | cuGraphInstantiateWithParams_ptsz => graph_instantiate_params;
    fn cuGraphLaunch(e: sys::CUgraphExec, s: CUstream) | cuGraphLaunch_ptsz => graph_launch;
    fn cuGraphExecDestroy(e: sys::CUgraphExec) => graph_exec_destroy;
    fn cuGraphGetNodes(g: sys::CUgraph, nodes: *mut sys::CUgraphNode, n: *mut usize) => graph_get_nodes;
}

pub(crate) struct Func {
    pub name: Arc<str>,
    pub cname: CString,
    pub attrs: Mutex<HashMap<c_int, c_int>>,
    /// The kernel's parameters, when its image says (PTX `.entry`
    /// declarations, a cubin's `EIATTR_KPARAM_INFO`).
    pub params: Option<Vec<KernelParam>>,
}

/// A device variable of a module: allocated on a device the first time it
/// is asked for there, filled with the image's initial bytes.
pub(crate) struct Global {
    size: usize,
    init: Vec<u8>,
    /// Device index -> device address.
    addrs: Mutex<HashMap<usize, u64>>,
}

pub(crate) struct Module {
    pub funcs: HashMap<String, usize>,
    pub order: Vec<usize>,
    globals: HashMap<String, Global>,
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(d) = drv() {
            for g in self.globals.values() {
                for &ptr in g.addrs.lock().unwrap_or_else(|e| e.into_inner()).values() {
                    let _ = d.free(ptr);
                }
            }
        }
    }
}

pub(crate) static MODULES: Registry<Module> = Registry::new();
static FUNCS: Registry<Func> = Registry::new();

/// Registers a module for a read image (its kernels become functions).
pub(crate) fn register(image: Image) -> Res<usize> {
    let mut funcs = HashMap::new();
    let mut order = Vec::new();
    let mut params = image.params;
    for name in image.kernels {
        let f = Arc::new(Func {
            name: Arc::from(name.as_str()),
            cname: CString::new(name.clone()).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?,
            attrs: Mutex::new(HashMap::new()),
            params: params.remove(&name),
        });
        let h = FUNCS.insert(f);
        order.push(h);
        funcs.insert(name, h);
    }
    let globals = image
        .globals
        .into_iter()
        .map(|g| {
            let global = Global {
                size: g.size,
                init: g.init,
                addrs: Mutex::new(HashMap::new()),
            };
            (g.name, global)
        })
        .collect();
    Ok(MODULES.insert(Arc::new(Module {
        funcs,
        order,
        globals,
    })))
}

/// Reads the image a client passed by pointer.
pub(crate) fn read_image(image: *const c_void) -> Res<Image> {
    // SAFETY: the CUDA contract makes `image` a module image in memory.
    unsafe { crate::fatbin::from_ptr(image.cast()) }.ok_or(CUDA_ERROR_INVALID_IMAGE)
}

/// Loads an image into a module of the current context.
pub(crate) fn load_image(m: *mut CUmodule, image: *const c_void) -> Res {
    current()?;
    if m.is_null() || image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = register(read_image(image)?)?;
    out(m, h as CUmodule)
}

fn module_load_data(_: bool, m: *mut CUmodule, image: *const c_void) -> Res {
    load_image(m, image)
}

fn module_load_data_ex(
    _: bool,
    m: *mut CUmodule,
    image: *const c_void,
    _n: c_uint,
    _o: *mut c_int,
    _v: *mut *mut c_void,
) -> Res {
    load_image(m, image)
}

fn module_load_fat_binary(_: bool, m: *mut CUmodule, image: *const c_void) -> Res {
    load_image(m, image)
}

/// Reads an image file (cubin, fatbin or PTX).
pub(crate) fn read_image_file(path: *const c_char) -> Res<Image> {
    let p = cstr(path)?.to_str().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    let bytes = std::fs::read(p).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    crate::fatbin::from_bytes(&bytes).ok_or(CUDA_ERROR_INVALID_IMAGE)
}

fn module_load(_: bool, m: *mut CUmodule, path: *const c_char) -> Res {
    current()?;
    if m.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = register(read_image_file(path)?)?;
    out(m, h as CUmodule)
}

pub(crate) const CUDA_ERROR_FILE_NOT_FOUND: CUresult =
    sys::cudaError_enum::CUDA_ERROR_FILE_NOT_FOUND as CUresult;

/// Drops a module and its functions.
pub(crate) fn unload(h: usize) -> Res {
    let module = MODULES.remove(h).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for f in module.funcs.values() {
        FUNCS.remove(*f);
    }
    Ok(())
}

fn module_unload(_: bool, m: CUmodule) -> Res {
    drv()?;
    unload(m as usize)
}

fn module_get_function(_: bool, f: *mut CUfunction, m: CUmodule, name: *const c_char) -> Res {
    drv()?;
    let module = MODULES.get(m as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let name = cstr(name)?.to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
    let h = *module.funcs.get(name).ok_or(CUDA_ERROR_NOT_FOUND)?;
    out(f, h as CUfunction)
}

/// Address and size of a module's global on the current context's device,
/// allocating and initialising it there on first use.
pub(crate) fn module_global(m: usize, name: *const c_char) -> Res<(u64, usize)> {
    let ctx = current()?;
    let d = drv()?;
    let module = MODULES.get(m).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let name = cstr(name)?.to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
    let g = module.globals.get(name).ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut addrs = g.addrs.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&p) = addrs.get(&ctx.dev) {
        return Ok((p, g.size));
    }
    let p = d.alloc(ctx.dev, g.size as u64)?;
    if !d.null() {
        // SAFETY: `p` is a fresh device allocation of at least `g.size`
        // bytes in this process's arena (mapped read-write); `init` is
        // `g.size` bytes long.
        unsafe { std::ptr::copy_nonoverlapping(g.init.as_ptr(), p as *mut u8, g.size) };
    }
    addrs.insert(ctx.dev, p);
    Ok((p, g.size))
}

fn module_get_global(
    _: bool,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: CUmodule,
    name: *const c_char,
) -> Res {
    let (p, size) = module_global(m as usize, name)?;
    if !dptr.is_null() {
        out(dptr, p)?;
    }
    if !bytes.is_null() {
        out(bytes, size)?;
    }
    Ok(())
}

/// Module loading mode: LAZY like a current driver, EAGER when the client
/// asks with `CUDA_MODULE_LOADING=EAGER`.
fn module_loading_mode(_: bool, mode: *mut c_int) -> Res {
    drv()?;
    static MODE: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
    let m = *MODE.get_or_init(|| match std::env::var("CUDA_MODULE_LOADING").as_deref() {
        Ok("EAGER") => 1,
        _ => 2,
    });
    out(mode, m)
}

pub(crate) fn func(f: CUfunction) -> Res<Arc<Func>> {
    drv()?;
    FUNCS.get(f as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// A kernel's parameters; `CUDA_ERROR_NOT_SUPPORTED` when its image did
/// not describe them.
pub(crate) fn func_params(f: CUfunction) -> Res<Vec<KernelParam>> {
    func(f)?.params.clone().ok_or(CUDA_ERROR_NOT_SUPPORTED)
}

/// Offset and size of parameter `index` of a kernel.
pub(crate) fn func_param(f: CUfunction, index: usize) -> Res<KernelParam> {
    let params = func_params(f)?;
    params.get(index).copied().ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn func_get_param_info(
    _: bool,
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> Res {
    let p = func_param(f, index)?;
    // The offset is required, the size optional (as in cuda.h).
    out(offset, p.offset)?;
    if !size.is_null() {
        out(size, p.size)?;
    }
    Ok(())
}

fn func_get_param_count(_: bool, f: CUfunction, count: *mut usize) -> Res {
    out(count, func_params(f)?.len())
}

pub(crate) fn func_get_attribute(_: bool, v: *mut c_int, attr: c_int, f: CUfunction) -> Res {
    let fun = func(f)?;
    if let Some(x) = fun
        .attrs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&attr)
    {
        return out(v, *x);
    }
    let value = match attr {
        0 => 1024,   // MAX_THREADS_PER_BLOCK
        1..=3 => 0,  // static shared / const / local bytes
        4 => 32,     // NUM_REGS
        5 | 6 => 90, // PTX / BINARY version
        7 => 0,
        8 => 49152, // MAX_DYNAMIC_SHARED_SIZE_BYTES default
        9 => -1,    // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=17 => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    out(v, value)
}

pub(crate) fn func_set_attribute(_: bool, f: CUfunction, attr: c_int, v: c_int) -> Res {
    let fun = func(f)?;
    match attr {
        8 if !(0..=232448).contains(&v) => return Err(CUDA_ERROR_INVALID_VALUE),
        8..=15 => {}
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    }
    fun.attrs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(attr, v);
    Ok(())
}

fn func_get_name(_: bool, name: *mut *const c_char, f: CUfunction) -> Res {
    let fun = func(f)?;
    // The CString lives as long as the function handle.
    out(name, fun.cname.as_ptr())
}

/// Validates a launch and builds its kernel operation.
fn kernel_op(f: CUfunction, grid: [c_uint; 3], block: [c_uint; 3], shmem: c_uint) -> Res<KernelOp> {
    let fun = func(f)?;
    let d = drv()?;
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if grid[0] > i32::MAX as u32 || grid[1] > 65535 || grid[2] > 65535 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if block[0] > 1024 || block[1] > 1024 || block[2] > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if block.iter().map(|&b| b as u64).product::<u64>() > 1024 || shmem > 232448 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let blocks = grid.iter().map(|&g| g as u64).product::<u64>();
    Ok(KernelOp {
        dur_ns: d.cfg.kernel_ns(&fun.name, blocks),
        name: fun.name.clone(),
        blocks,
        graph: false,
    })
}

#[allow(clippy::too_many_arguments)]
fn launch_kernel(
    pt: bool,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Launch);
    let op = kernel_op(f, [gx, gy, gz], [bx, by, bz], shmem)?;
    if !params.is_null() && !extra.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let st = resolve(s, pt)?;
    st.enqueue(Op::Kernel(op))?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn launch_cooperative(
    pt: bool,
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shmem: c_uint,
    s: CUstream,
    params: *mut *mut c_void,
) -> Res {
    launch_kernel(
        pt,
        f,
        gx,
        gy,
        gz,
        bx,
        by,
        bz,
        shmem,
        s,
        params,
        std::ptr::null_mut(),
    )
}

fn launch_kernel_ex(
    pt: bool,
    cfg: *const sys::CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Res {
    let c = read(cfg)?;
    launch_kernel(
        pt,
        f,
        c.gridDimX,
        c.gridDimY,
        c.gridDimZ,
        c.blockDimX,
        c.blockDimY,
        c.blockDimZ,
        c.sharedMemBytes,
        c.hStream,
        params,
        extra,
    )
}

fn graph_create(_: bool, g: *mut sys::CUgraph, flags: c_uint) -> Res {
    drv()?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = GRAPHS.insert(Arc::new(Graph {
        ops: Mutex::new(Vec::new()),
    }));
    out(g, h as sys::CUgraph)
}

fn graph_destroy(_: bool, g: sys::CUgraph) -> Res {
    drv()?;
    GRAPHS.remove(g as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}

/// `cuGraphGetNodes`: a graph's nodes are numbered from 1 in the order they
/// were added or captured. With `nodes` null only the count is written;
/// otherwise up to `*n` nodes, the rest of `*n` entries null, and `*n`
/// becomes the number written.
fn graph_get_nodes(_: bool, g: sys::CUgraph, nodes: *mut sys::CUgraphNode, n: *mut usize) -> Res {
    drv()?;
    let graph = GRAPHS.get(g as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let count = graph.ops.lock().unwrap_or_else(|e| e.into_inner()).len();
    if nodes.is_null() {
        return out(n, count);
    }
    let room = read(n)?;
    for i in 0..room {
        let node = if i < count { i + 1 } else { 0 };
        // SAFETY: the caller passes room for `*n` nodes.
        unsafe { nodes.add(i).write(node as sys::CUgraphNode) };
    }
    out(n, room.min(count))
}

/// Nodes run in insertion order (dependencies are not modelled).
fn graph_add_kernel_node(
    _: bool,
    node: *mut sys::CUgraphNode,
    g: sys::CUgraph,
    _deps: *const sys::CUgraphNode,
    _n: usize,
    p: *const sys::CUDA_KERNEL_NODE_PARAMS,
) -> Res {
    drv()?;
    let graph = GRAPHS.get(g as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let p = read(p)?;
    let op = kernel_op(
        p.func,
        [p.gridDimX, p.gridDimY, p.gridDimZ],
        [p.blockDimX, p.blockDimY, p.blockDimZ],
        p.sharedMemBytes,
    )?;
    let mut ops = graph.ops.lock().unwrap_or_else(|e| e.into_inner());
    ops.push(Op::Kernel(op));
    out(node, ops.len() as sys::CUgraphNode)
}

fn instantiate(e: *mut sys::CUgraphExec, g: sys::CUgraph) -> Res {
    drv()?;
    let graph = GRAPHS.get(g as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ops = graph.ops.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if e.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(
        e,
        GRAPH_EXECS.insert(Arc::new(GraphExec { ops })) as sys::CUgraphExec,
    )
}

fn graph_instantiate(_: bool, e: *mut sys::CUgraphExec, g: sys::CUgraph, _flags: u64) -> Res {
    instantiate(e, g)
}

fn graph_instantiate_v2(
    _: bool,
    e: *mut sys::CUgraphExec,
    g: sys::CUgraph,
    err_node: *mut sys::CUgraphNode,
    log: *mut c_char,
    size: usize,
) -> Res {
    if !err_node.is_null() {
        out(err_node, std::ptr::null_mut())?;
    }
    if !log.is_null() && size > 0 {
        out(log, 0)?;
    }
    instantiate(e, g)
}

fn graph_instantiate_params(
    _: bool,
    e: *mut sys::CUgraphExec,
    g: sys::CUgraph,
    _p: *mut c_void,
) -> Res {
    instantiate(e, g)
}

fn graph_launch(pt: bool, e: sys::CUgraphExec, s: CUstream) -> Res {
    let _cost = crate::host_cost::charge(crate::host_cost::Call::Launch);
    drv()?;
    let exec = GRAPH_EXECS
        .get(e as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let st = resolve(s, pt)?;
    exec.launch(&st)
}

fn graph_exec_destroy(_: bool, e: sys::CUgraphExec) -> Res {
    drv()?;
    GRAPH_EXECS
        .remove(e as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(())
}
