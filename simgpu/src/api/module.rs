//! Modules (PTX text), functions, kernel launches and graphs.

use super::{cstr, out, read};
use crate::Res;
use crate::driver::{Registry, current, drv};
use crate::exec::{GRAPH_EXECS, GRAPHS, Graph, GraphExec, KernelOp, Op, resolve};
use dilu_abi::cuda::*;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

type CUfunction = sys::CUfunction;
type CUmodule = sys::CUmodule;
type CUstream = sys::CUstream;

export! {
    fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) => module_load_data;
    fn cuModuleLoadDataEx(m: *mut CUmodule, image: *const c_void, n: c_uint, opts: *mut c_int, vals: *mut *mut c_void) => module_load_data_ex;
    fn cuModuleLoad(m: *mut CUmodule, path: *const c_char) => module_load;
    fn cuModuleUnload(m: CUmodule) => module_unload;
    fn cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, name: *const c_char) => module_get_function;
    fn cuFuncGetAttribute(v: *mut c_int, attr: c_int, f: CUfunction) => func_get_attribute;
    fn cuFuncSetAttribute(f: CUfunction, attr: c_int, v: c_int) => func_set_attribute;
    fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) => func_get_name;
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
}

pub(crate) struct Func {
    pub name: Arc<str>,
    pub cname: CString,
    pub attrs: Mutex<HashMap<c_int, c_int>>,
}

struct Module {
    funcs: HashMap<String, usize>,
}

static MODULES: Registry<Module> = Registry::new();
static FUNCS: Registry<Func> = Registry::new();

/// Every `.entry NAME` of a PTX text.
fn ptx_entries(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + 6..];
        if !rest.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || "_$.".contains(*c))
            .collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

fn load_text(m: *mut CUmodule, text: &[u8]) -> Res {
    current()?;
    if m.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let text = std::str::from_utf8(text).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
    if !text.contains(".version") && !text.contains(".entry") {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let mut funcs = HashMap::new();
    for name in ptx_entries(text) {
        let f = Arc::new(Func {
            name: Arc::from(name.as_str()),
            cname: CString::new(name.clone()).map_err(|_| CUDA_ERROR_INVALID_PTX)?,
            attrs: Mutex::new(HashMap::new()),
        });
        funcs.insert(name, FUNCS.insert(f));
    }
    out(m, MODULES.insert(Arc::new(Module { funcs })) as CUmodule)
}

fn module_load_data(_: bool, m: *mut CUmodule, image: *const c_void) -> Res {
    if image.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: first 4 bytes of a non-null image; every image is at least that
    // long (ELF and fatbin headers, or PTX text).
    let head = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), 4) };
    if head == b"\x7fELF" || head == [0x50, 0xed, 0x55, 0xba] || head == [0xba, 0x55, 0xed, 0x50] {
        current()?;
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let text = cstr(image.cast())?;
    load_text(m, text.to_bytes())
}

fn module_load_data_ex(
    _: bool,
    m: *mut CUmodule,
    image: *const c_void,
    _n: c_uint,
    _o: *mut c_int,
    _v: *mut *mut c_void,
) -> Res {
    module_load_data(false, m, image)
}

fn module_load(_: bool, m: *mut CUmodule, path: *const c_char) -> Res {
    let p = cstr(path)?.to_str().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    current()?;
    let bytes = std::fs::read(p).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    if bytes.starts_with(b"\x7fELF") {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    load_text(m, &bytes[..end])
}

const CUDA_ERROR_FILE_NOT_FOUND: CUresult =
    sys::cudaError_enum::CUDA_ERROR_FILE_NOT_FOUND as CUresult;

fn module_unload(_: bool, m: CUmodule) -> Res {
    drv()?;
    let module = MODULES
        .remove(m as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for f in module.funcs.values() {
        FUNCS.remove(*f);
    }
    Ok(())
}

fn module_get_function(_: bool, f: *mut CUfunction, m: CUmodule, name: *const c_char) -> Res {
    drv()?;
    let module = MODULES.get(m as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let name = cstr(name)?.to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
    let h = *module.funcs.get(name).ok_or(CUDA_ERROR_NOT_FOUND)?;
    out(f, h as CUfunction)
}

fn func(f: CUfunction) -> Res<Arc<Func>> {
    drv()?;
    FUNCS.get(f as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn func_get_attribute(_: bool, v: *mut c_int, attr: c_int, f: CUfunction) -> Res {
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

fn func_set_attribute(_: bool, f: CUfunction, attr: c_int, v: c_int) -> Res {
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
