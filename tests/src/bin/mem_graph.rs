//! `mem-graph`: CUDA graph memory nodes against a memory budget. Builds,
//! launches and destroys graphs with allocation and free nodes (through
//! `cuGraphAddMemAllocNode` and the generic `cuGraphAddNode`) and checks
//! after each step what `cuMemGetInfo` reports as free: an allocation node
//! is charged when added (refused past the budget), stays charged while its
//! graph or executable exists, and is given back once the driver no longer
//! holds the memory (right away for a graph never launched; after
//! `cuDeviceGraphMemTrim` for memory the driver keeps in reserve; after the
//! free and a trim for an allocation that escaped its graph).
//!
//! Prints one JSON line per check and exits non-zero if any failed. With
//! `--budget 0` (no budget) it only checks that the oversized node is
//! accepted, so a refusal under a budget is known to come from dilu.

use dilu_abi::cuda::{self, CUresult, sys};
use dilu_tests::driver::Driver;
use std::ffi::{c_int, c_uint, c_void};
use std::process::ExitCode;

const USAGE: &str = "usage: mem-graph --budget BYTES (a multiple of 4 MiB, or 0)";
const MIB: usize = 1 << 20;

type Graph = sys::CUgraph;
type Node = sys::CUgraphNode;
type Exec = sys::CUgraphExec;

struct Api {
    info: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult,
    free: unsafe extern "C" fn(u64) -> CUresult,
    create: unsafe extern "C" fn(*mut Graph, c_uint) -> CUresult,
    add_alloc: unsafe extern "C" fn(
        *mut Node,
        Graph,
        *const Node,
        usize,
        *mut sys::CUDA_MEM_ALLOC_NODE_PARAMS,
    ) -> CUresult,
    add_free: unsafe extern "C" fn(*mut Node, Graph, *const Node, usize, u64) -> CUresult,
    add_node: unsafe extern "C" fn(
        *mut Node,
        Graph,
        *const Node,
        usize,
        *mut sys::CUgraphNodeParams,
    ) -> CUresult,
    instantiate: unsafe extern "C" fn(*mut Exec, Graph, u64) -> CUresult,
    launch: unsafe extern "C" fn(Exec, sys::CUstream) -> CUresult,
    sync: unsafe extern "C" fn(sys::CUstream) -> CUresult,
    exec_destroy: unsafe extern "C" fn(Exec) -> CUresult,
    destroy: unsafe extern "C" fn(Graph) -> CUresult,
    trim: unsafe extern "C" fn(c_int) -> CUresult,
    attribute: unsafe extern "C" fn(c_int, c_int, *mut c_void) -> CUresult,
}

fn open() -> Result<Api, String> {
    let driver = Driver::open()?;
    driver.primary_context()?;
    Ok(Api {
        info: driver.function("cuMemGetInfo_v2")?,
        free: driver.function("cuMemFree_v2")?,
        create: driver.function("cuGraphCreate")?,
        add_alloc: driver.function("cuGraphAddMemAllocNode")?,
        add_free: driver.function("cuGraphAddMemFreeNode")?,
        add_node: driver.function("cuGraphAddNode")?,
        instantiate: driver.function("cuGraphInstantiateWithFlags")?,
        launch: driver.function("cuGraphLaunch")?,
        sync: driver.function("cuStreamSynchronize")?,
        exec_destroy: driver.function("cuGraphExecDestroy")?,
        destroy: driver.function("cuGraphDestroy")?,
        trim: driver.function("cuDeviceGraphMemTrim")?,
        attribute: driver.function("cuDeviceGetGraphMemAttribute")?,
    })
}

/// Allocation-node parameters for `bytes` of device 0 memory.
fn alloc_params(bytes: usize) -> sys::CUDA_MEM_ALLOC_NODE_PARAMS {
    // SAFETY: a plain C struct for which all-zero is valid (every enum in it
    // has a 0 value, pointers may be null).
    let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
    p.poolProps.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.poolProps.location.id = 0;
    p.bytesize = bytes;
    p
}

/// The same parameters in the form `CUgraphNodeParams` carries.
fn v2(p: sys::CUDA_MEM_ALLOC_NODE_PARAMS) -> sys::CUDA_MEM_ALLOC_NODE_PARAMS_v2 {
    sys::CUDA_MEM_ALLOC_NODE_PARAMS_v2 {
        poolProps: p.poolProps,
        accessDescs: p.accessDescs,
        accessDescCount: p.accessDescCount,
        bytesize: p.bytesize,
        dptr: p.dptr,
    }
}

/// A charge as the budget rounds it.
fn charged(bytes: usize) -> usize {
    bytes.div_ceil(512) * 512
}

struct Checks {
    api: Api,
    budget: usize,
    all_ok: bool,
}

impl Checks {
    fn free_now(&self) -> usize {
        let (mut free, mut total) = (0, 0);
        // SAFETY: live out-parameters.
        unsafe { (self.api.info)(&mut free, &mut total) };
        free
    }

    fn graph_attribute(&self, attribute: c_int) -> u64 {
        let mut value = 0u64;
        // SAFETY: the attribute's value is a cuuint64_t.
        unsafe { (self.api.attribute)(0, attribute, (&raw mut value).cast()) };
        value
    }

    fn check(&mut self, name: &str, got: u64, want: u64) {
        let ok = got == want;
        self.all_ok &= ok;
        println!("{{\"check\":\"{name}\",\"got\":{got},\"want\":{want},\"ok\":{ok}}}");
    }

    /// `cuMemGetInfo`'s free must be the budget less `charged` bytes.
    fn charged_now(&mut self, name: &str, charged: usize) {
        let free = self.free_now();
        self.check(name, (self.budget - free) as u64, charged as u64);
    }
}

/// Everything the checks do, in order (see the module docs).
fn run(api: Api, budget: usize) -> bool {
    let mut c = Checks {
        api,
        budget,
        all_ok: true,
    };
    let null_stream: sys::CUstream = std::ptr::null_mut();
    let (mut a, mut b, mut g) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    let (mut exec_a, mut exec_g) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut node: Node = std::ptr::null_mut();
    // SAFETY: (whole block) cuda.h contracts, live locals as out-parameters
    // and parameter structs.
    unsafe {
        (c.api.create)(&mut a, 0);
        (c.api.create)(&mut b, 0);
        (c.api.create)(&mut g, 0);
        c.charged_now("nothing charged at start", 0);

        // Past the budget: refused before the driver runs, nothing charged.
        let mut over = alloc_params(budget + 4 * MIB);
        let r = (c.api.add_alloc)(&mut node, a, std::ptr::null(), 0, &mut over);
        c.check(
            "oversized allocation node refused",
            r.into(),
            cuda::CUDA_ERROR_OUT_OF_MEMORY.into(),
        );
        c.charged_now("refused node charged nothing", 0);

        // Within budget: charged exactly, at 512-byte granularity.
        let size_a = budget * 3 / 8 + 1000;
        let mut pa = alloc_params(size_a);
        let r = (c.api.add_alloc)(&mut node, a, std::ptr::null(), 0, &mut pa);
        c.check("allocation node added", r.into(), 0);
        c.charged_now("allocation node charged when added", charged(size_a));
        let alloc_node = node;
        let r = (c.api.add_free)(&mut node, a, &alloc_node, 1, pa.dptr);
        c.check("free node added", r.into(), 0);
        c.check(
            "instantiate",
            (c.api.instantiate)(&mut exec_a, a, 0).into(),
            0,
        );
        c.check("launch", (c.api.launch)(exec_a, null_stream).into(), 0);
        (c.api.sync)(null_stream);
        c.check(
            "driver reserves the graph's memory",
            c.graph_attribute(2),
            charged(size_a) as u64,
        );
        c.charged_now("launch and free node change nothing", charged(size_a));

        // The generic entry point is charged the same way.
        let mut generic: sys::CUgraphNodeParams = std::mem::zeroed();
        generic.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        generic.__bindgen_anon_1.alloc = v2(alloc_params(budget * 3 / 4));
        let r = (c.api.add_node)(&mut node, b, std::ptr::null(), 0, &mut generic);
        c.check(
            "cuGraphAddNode past the budget refused",
            r.into(),
            cuda::CUDA_ERROR_OUT_OF_MEMORY.into(),
        );
        let size_b = budget / 4;
        generic.__bindgen_anon_1.alloc = v2(alloc_params(size_b));
        let r = (c.api.add_node)(&mut node, b, std::ptr::null(), 0, &mut generic);
        c.check("cuGraphAddNode allocation added", r.into(), 0);
        c.charged_now("both graphs charged", charged(size_a) + size_b);

        // The executable keeps graph A's charge after the graph is gone;
        // then the driver still reserves it until trimmed.
        c.check("destroy graph A", (c.api.destroy)(a).into(), 0);
        c.charged_now(
            "executable still holds graph A's charge",
            charged(size_a) + size_b,
        );
        c.check(
            "destroy executable A",
            (c.api.exec_destroy)(exec_a).into(),
            0,
        );
        c.charged_now(
            "memory the driver still reserves stays charged",
            charged(size_a) + size_b,
        );
        c.check("trim", (c.api.trim)(0).into(), 0);
        c.charged_now("trim gives the reserve back", size_b);

        // A graph never launched holds no driver memory: destroying it
        // gives its charge back at once.
        c.check("destroy graph B", (c.api.destroy)(b).into(), 0);
        c.charged_now("destroying an unlaunched graph gives its charge back", 0);

        // An allocation that escapes its graph stays charged while live.
        let size_g = budget / 8;
        let mut pg = alloc_params(size_g);
        c.check(
            "escaping node added",
            (c.api.add_alloc)(&mut node, g, std::ptr::null(), 0, &mut pg).into(),
            0,
        );
        c.check(
            "instantiate escaping",
            (c.api.instantiate)(&mut exec_g, g, 0).into(),
            0,
        );
        c.check(
            "launch escaping",
            (c.api.launch)(exec_g, null_stream).into(),
            0,
        );
        (c.api.sync)(null_stream);
        (c.api.exec_destroy)(exec_g);
        (c.api.destroy)(g);
        c.charged_now("a live escaped allocation stays charged", size_g);
        c.check("escaped allocation freed", (c.api.free)(pg.dptr).into(), 0);
        c.check("trim after the free", (c.api.trim)(0).into(), 0);
        c.charged_now("freed and trimmed: nothing left", 0);
    }
    c.all_ok
}

/// Without a budget the oversized node is simply accepted.
fn run_unbudgeted(api: Api) -> bool {
    let mut graph: Graph = std::ptr::null_mut();
    let mut node: Node = std::ptr::null_mut();
    let mut params = alloc_params(64 * MIB);
    // SAFETY: cuda.h contracts; live out-parameters and parameter struct.
    let r = unsafe {
        (api.create)(&mut graph, 0);
        (api.add_alloc)(&mut node, graph, std::ptr::null(), 0, &mut params)
    };
    println!(
        "{{\"check\":\"unbudgeted node\",\"got\":{r},\"want\":0,\"ok\":{}}}",
        r == 0
    );
    r == 0
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let budget = args
        .iter()
        .position(|a| a == "--budget")
        .and_then(|i| args.get(i + 1))
        .and_then(|b| b.parse::<usize>().ok());
    let Some(budget) = budget.filter(|b| b.is_multiple_of(4 * MIB)) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let api = match open() {
        Ok(api) => api,
        Err(message) => {
            eprintln!("mem-graph: {message}");
            return ExitCode::FAILURE;
        }
    };
    let ok = if budget == 0 {
        run_unbudgeted(api)
    } else {
        run(api, budget)
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
