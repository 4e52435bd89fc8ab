//! Context-independent libraries and kernels (`cuLibrary*`, `cuKernel*`),
//! and occupancy queries.
//!
//! cudart 12.9 loads every registered fatbin with `cuLibraryLoadData` before
//! any context exists, so a library is just a read image. Its module (one
//! per library, shared by every context: simgpu's modules hold no
//! per-context state besides globals, which are per device) is made on
//! first use. A kernel handle is the function handle of that module, which
//! is also what `cuLaunchKernel` accepts for a `CUkernel`.

use super::module::{self, MODULES, func, func_get_attribute, func_set_attribute};
use super::{cstr, out};
use crate::Res;
use crate::driver::{Registry, current, drv};
use dilu_abi::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

type CUfunction = sys::CUfunction;
type CUmodule = sys::CUmodule;
type CUdeviceptr = sys::CUdeviceptr;
type CUdevice = sys::CUdevice;
type Lib = *mut c_void;
type Kernel = *mut c_void;
type BlockToSmem = Option<unsafe extern "C" fn(c_int) -> usize>;

export! {
    fn cuLibraryLoadData(lib: *mut Lib, code: *const c_void, jit_opts: *mut c_int, jit_vals: *mut *mut c_void, n_jit: c_uint, lib_opts: *mut c_int, lib_vals: *mut *mut c_void, n_lib: c_uint) => library_load_data;
    fn cuLibraryLoadFromFile(lib: *mut Lib, path: *const c_char, jit_opts: *mut c_int, jit_vals: *mut *mut c_void, n_jit: c_uint, lib_opts: *mut c_int, lib_vals: *mut *mut c_void, n_lib: c_uint) => library_load_file;
    fn cuLibraryUnload(lib: Lib) => library_unload;
    fn cuLibraryGetModule(m: *mut CUmodule, lib: Lib) => library_get_module;
    fn cuLibraryGetKernel(k: *mut Kernel, lib: Lib, name: *const c_char) => library_get_kernel;
    fn cuLibraryGetKernelCount(n: *mut c_uint, lib: Lib) => library_kernel_count;
    fn cuLibraryEnumerateKernels(ks: *mut Kernel, n: c_uint, lib: Lib) => library_enumerate;
    fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, lib: Lib, name: *const c_char) => library_get_global;
    fn cuLibraryGetManaged(dptr: *mut CUdeviceptr, bytes: *mut usize, lib: Lib, name: *const c_char) => library_get_managed;
    fn cuKernelGetFunction(f: *mut CUfunction, k: Kernel) => kernel_get_function;
    fn cuKernelGetAttribute(v: *mut c_int, attr: c_int, k: Kernel, dev: CUdevice) => kernel_get_attribute;
    fn cuKernelSetAttribute(attr: c_int, v: c_int, k: Kernel, dev: CUdevice) => kernel_set_attribute;
    fn cuKernelGetName(name: *mut *const c_char, k: Kernel) => kernel_get_name;
    fn cuKernelGetLibrary(lib: *mut Lib, k: Kernel) => kernel_get_library;
    fn cuKernelGetParamInfo(k: Kernel, index: usize, offset: *mut usize, size: *mut usize) => kernel_param_info;
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut c_int, f: CUfunction, block: c_int, smem: usize) => occupancy_blocks;
    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut c_int, f: CUfunction, block: c_int, smem: usize, flags: c_uint) => occupancy_blocks_flags;
    fn cuOccupancyMaxPotentialBlockSize(grid: *mut c_int, block: *mut c_int, f: CUfunction, smem_of: BlockToSmem, smem: usize, limit: c_int) => occupancy_block_size;
    fn cuOccupancyMaxPotentialBlockSizeWithFlags(grid: *mut c_int, block: *mut c_int, f: CUfunction, smem_of: BlockToSmem, smem: usize, limit: c_int, flags: c_uint) => occupancy_block_size_flags;
    fn cuOccupancyMaxActiveClusters(n: *mut c_int, f: CUfunction, cfg: *const sys::CUlaunchConfig) => occupancy_clusters;
    fn cuOccupancyMaxPotentialClusterSize(n: *mut c_int, f: CUfunction, cfg: *const sys::CUlaunchConfig) => occupancy_cluster_size;
    fn cuOccupancyAvailableDynamicSMemPerBlock(smem: *mut usize, f: CUfunction, blocks: c_int, block: c_int) => occupancy_dynamic_smem;
}

struct Library {
    /// The module every context uses (`cuLibraryGetModule`).
    module: usize,
}

impl Drop for Library {
    fn drop(&mut self) {
        let _ = module::unload(self.module);
    }
}

static LIBRARIES: Registry<Library> = Registry::new();

fn library(lib: Lib) -> Res<Arc<Library>> {
    LIBRARIES.get(lib as usize).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn new_library(lib: *mut Lib, image: crate::fatbin::Image) -> Res {
    if lib.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let module = module::register(image)?;
    let h = LIBRARIES.insert(Arc::new(Library { module }));
    out(lib, h as Lib)
}

#[allow(clippy::too_many_arguments)]
fn library_load_data(
    _: bool,
    lib: *mut Lib,
    code: *const c_void,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> Res {
    drv()?;
    if code.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    new_library(lib, module::read_image(code)?)
}

#[allow(clippy::too_many_arguments)]
fn library_load_file(
    _: bool,
    lib: *mut Lib,
    path: *const c_char,
    _jit_opts: *mut c_int,
    _jit_vals: *mut *mut c_void,
    _n_jit: c_uint,
    _lib_opts: *mut c_int,
    _lib_vals: *mut *mut c_void,
    _n_lib: c_uint,
) -> Res {
    drv()?;
    new_library(lib, module::read_image_file(path)?)
}

fn library_unload(_: bool, lib: Lib) -> Res {
    drv()?;
    LIBRARIES
        .remove(lib as usize)
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(())
}

fn library_get_module(_: bool, m: *mut CUmodule, lib: Lib) -> Res {
    drv()?;
    let l = library(lib)?;
    out(m, l.module as CUmodule)
}

fn library_get_kernel(_: bool, k: *mut Kernel, lib: Lib, name: *const c_char) -> Res {
    drv()?;
    let l = library(lib)?;
    let m = MODULES.get(l.module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    let name = cstr(name)?.to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
    let h = *m.funcs.get(name).ok_or(CUDA_ERROR_NOT_FOUND)?;
    out(k, h as Kernel)
}

fn library_kernel_count(_: bool, n: *mut c_uint, lib: Lib) -> Res {
    drv()?;
    let l = library(lib)?;
    let m = MODULES.get(l.module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    out(n, m.order.len() as c_uint)
}

fn library_enumerate(_: bool, ks: *mut Kernel, n: c_uint, lib: Lib) -> Res {
    drv()?;
    let l = library(lib)?;
    let m = MODULES.get(l.module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    if ks.is_null() || (n as usize) < m.order.len() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for (i, &h) in m.order.iter().enumerate() {
        // SAFETY: the caller's array holds `n` >= order.len() entries.
        out(unsafe { ks.add(i) }, h as Kernel)?;
    }
    Ok(())
}

fn library_get_global(
    _: bool,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: Lib,
    name: *const c_char,
) -> Res {
    let l = library(lib)?;
    let (p, size) = module::module_global(l.module, name)?;
    if !dptr.is_null() {
        out(dptr, p)?;
    }
    if !bytes.is_null() {
        out(bytes, size)?;
    }
    Ok(())
}

/// simgpu reads no managed variables from images.
fn library_get_managed(
    _: bool,
    _dptr: *mut CUdeviceptr,
    _bytes: *mut usize,
    lib: Lib,
    name: *const c_char,
) -> Res {
    library(lib)?;
    cstr(name)?;
    Err(CUDA_ERROR_NOT_FOUND)
}

/// Library of a kernel handle.
fn library_of(k: Kernel) -> Res<usize> {
    func(k as CUfunction)?;
    let libs = LIBRARIES.handles();
    libs.into_iter()
        .find(|&h| {
            LIBRARIES
                .get(h)
                .and_then(|l| MODULES.get(l.module))
                .is_some_and(|m| m.order.contains(&(k as usize)))
        })
        .ok_or(CUDA_ERROR_INVALID_HANDLE)
}

fn kernel_get_function(_: bool, f: *mut CUfunction, k: Kernel) -> Res {
    current()?;
    func(k as CUfunction)?;
    out(f, k as CUfunction)
}

fn kernel_get_attribute(pt: bool, v: *mut c_int, attr: c_int, k: Kernel, dev: CUdevice) -> Res {
    drv()?.check_dev(dev)?;
    func_get_attribute(pt, v, attr, k as CUfunction)
}

fn kernel_set_attribute(pt: bool, attr: c_int, v: c_int, k: Kernel, dev: CUdevice) -> Res {
    drv()?.check_dev(dev)?;
    func_set_attribute(pt, k as CUfunction, attr, v)
}

fn kernel_get_name(_: bool, name: *mut *const c_char, k: Kernel) -> Res {
    let f = func(k as CUfunction)?;
    // The CString lives as long as the kernel handle.
    out(name, f.cname.as_ptr())
}

fn kernel_get_library(_: bool, lib: *mut Lib, k: Kernel) -> Res {
    out(lib, library_of(k)? as Lib)
}

/// Offset and size of a kernel's parameter, as its image declares them
/// (`CUDA_ERROR_NOT_SUPPORTED` when the image does not say).
fn kernel_param_info(_: bool, k: Kernel, i: usize, offset: *mut usize, size: *mut usize) -> Res {
    let p = module::func_param(k as CUfunction, i)?;
    // The offset is required, the size optional (as in cuda.h).
    out(offset, p.offset)?;
    if !size.is_null() {
        out(size, p.size)?;
    }
    Ok(())
}

/// Hopper per-SM limits the occupancy model uses.
const SM_THREADS: i64 = 2048;
const SM_BLOCKS: i64 = 32;
const SM_REGISTERS: i64 = 65536;
const SM_SHARED: i64 = 233_472;
const BLOCK_SHARED_MAX: i64 = 232_448;
/// Shared memory the hardware reserves per resident block.
const BLOCK_SHARED_RESERVED: i64 = 1024;

fn attr_of(f: CUfunction, attr: c_int) -> Res<i64> {
    let mut v = 0;
    func_get_attribute(false, &mut v, attr, f)?;
    Ok(v as i64)
}

/// Resident blocks per SM for a block size and dynamic shared memory.
fn blocks_per_sm(f: CUfunction, block: c_int, smem: usize) -> Res<i64> {
    let max_threads = attr_of(f, 0)?;
    if block <= 0 || block as i64 > max_threads {
        return Ok(0);
    }
    let regs = attr_of(f, 4)?.max(1);
    let shared = attr_of(f, 1)? + smem as i64;
    if shared > BLOCK_SHARED_MAX {
        return Ok(0);
    }
    let warps = (block as i64 + 31) / 32;
    let by_threads = SM_THREADS / (warps * 32);
    let by_regs = SM_REGISTERS / (regs * warps * 32);
    let by_shared = SM_SHARED / (shared + BLOCK_SHARED_RESERVED);
    Ok(SM_BLOCKS.min(by_threads).min(by_regs).min(by_shared))
}

fn occupancy_blocks(_: bool, n: *mut c_int, f: CUfunction, block: c_int, smem: usize) -> Res {
    out(n, blocks_per_sm(f, block, smem)? as c_int)
}

fn occupancy_blocks_flags(
    pt: bool,
    n: *mut c_int,
    f: CUfunction,
    block: c_int,
    smem: usize,
    _flags: c_uint,
) -> Res {
    occupancy_blocks(pt, n, f, block, smem)
}

fn occupancy_block_size(
    _: bool,
    grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    smem_of: BlockToSmem,
    smem: usize,
    limit: c_int,
) -> Res {
    let d = drv()?;
    let max = attr_of(f, 0)?;
    let limit = if limit <= 0 {
        max
    } else {
        (limit as i64).min(max)
    };
    let (mut best_block, mut best_threads) = (0i64, 0i64);
    let mut size = limit - limit % 32;
    while size >= 32 {
        let dynamic = match smem_of {
            // SAFETY: the client's callback, called with a block size.
            Some(cb) => unsafe { cb(size as c_int) },
            None => smem,
        };
        let resident = blocks_per_sm(f, size as c_int, dynamic)?;
        if resident * size > best_threads {
            (best_block, best_threads) = (size, resident * size);
        }
        size -= 32;
    }
    if best_block == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let resident = best_threads / best_block;
    out(
        grid,
        (resident * d.cfg.sms as i64).min(i32::MAX as i64) as c_int,
    )?;
    out(block, best_block as c_int)
}

#[allow(clippy::too_many_arguments)]
fn occupancy_block_size_flags(
    pt: bool,
    grid: *mut c_int,
    block: *mut c_int,
    f: CUfunction,
    smem_of: BlockToSmem,
    smem: usize,
    limit: c_int,
    _flags: c_uint,
) -> Res {
    occupancy_block_size(pt, grid, block, f, smem_of, smem, limit)
}

fn occupancy_dynamic_smem(
    _: bool,
    smem: *mut usize,
    f: CUfunction,
    blocks: c_int,
    block: c_int,
) -> Res {
    if blocks <= 0 || block <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if blocks_per_sm(f, block, 0)? < blocks as i64 {
        return out(smem, 0);
    }
    let per_block = SM_SHARED / blocks as i64 - BLOCK_SHARED_RESERVED - attr_of(f, 1)?;
    out(smem, per_block.clamp(0, BLOCK_SHARED_MAX) as usize)
}

/// Largest portable cluster (blocks) on Hopper.
const CLUSTER_MAX: i64 = 8;
const ATTRIBUTE_CLUSTER_DIMENSION: u32 = 4;
const CUDA_ERROR_INVALID_CLUSTER_SIZE: CUresult =
    sys::cudaError_enum::CUDA_ERROR_INVALID_CLUSTER_SIZE as CUresult;

/// Blocks per cluster a launch configuration asks for (1 without the
/// attribute).
fn cluster_blocks(cfg: &sys::CUlaunchConfig) -> Res<i64> {
    if cfg.attrs.is_null() || cfg.numAttrs == 0 {
        return Ok(1);
    }
    for i in 0..cfg.numAttrs as usize {
        // SAFETY: `attrs` holds `numAttrs` CUlaunchAttribute values: a u32
        // id, 4 bytes of padding, then the 64-byte value union whose
        // cluster dimension is three u32.
        let (id, dims) = unsafe {
            let a = cfg.attrs.add(i).cast::<u8>();
            (
                a.cast::<u32>().read_unaligned(),
                a.add(8).cast::<[u32; 3]>().read_unaligned(),
            )
        };
        if id == ATTRIBUTE_CLUSTER_DIMENSION {
            return Ok(dims.iter().map(|&d| d.max(1) as i64).product());
        }
    }
    Ok(1)
}

/// SMs per GPC on Hopper: a cluster's blocks run in one GPC.
const GPC_SMS: i64 = 18;
/// Largest cluster a kernel may use once it allows non-portable sizes.
const CLUSTER_MAX_NON_PORTABLE: i64 = 16;
const ATTRIBUTE_NON_PORTABLE_CLUSTER: c_int = 14;

/// Largest cluster `f` may be launched with.
fn cluster_limit(f: CUfunction) -> Res<i64> {
    Ok(if attr_of(f, ATTRIBUTE_NON_PORTABLE_CLUSTER)? != 0 {
        CLUSTER_MAX_NON_PORTABLE
    } else {
        CLUSTER_MAX
    })
}

/// Clusters that can be resident at once: whole clusters per GPC (the
/// device's SMs split evenly into GPCs of at most 18 SMs).
fn occupancy_clusters(
    _: bool,
    n: *mut c_int,
    f: CUfunction,
    cfg: *const sys::CUlaunchConfig,
) -> Res {
    let d = drv()?;
    let c = super::read(cfg)?;
    let per_cluster = cluster_blocks(&c)?;
    if per_cluster > cluster_limit(f)? {
        return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
    }
    let block = (c.blockDimX * c.blockDimY * c.blockDimZ) as c_int;
    let per_sm = blocks_per_sm(f, block, c.sharedMemBytes as usize)?;
    let sms = d.cfg.sms as i64;
    let gpcs = (sms + GPC_SMS - 1) / GPC_SMS;
    let clusters: i64 = (0..gpcs)
        .map(|g| {
            let in_gpc = sms / gpcs + i64::from(g < sms % gpcs);
            in_gpc * per_sm / per_cluster
        })
        .sum();
    out(n, clusters.min(i32::MAX as i64) as c_int)
}

fn occupancy_cluster_size(
    _: bool,
    n: *mut c_int,
    f: CUfunction,
    cfg: *const sys::CUlaunchConfig,
) -> Res {
    let c = super::read(cfg)?;
    let block = (c.blockDimX * c.blockDimY * c.blockDimZ) as c_int;
    let per_sm = blocks_per_sm(f, block, c.sharedMemBytes as usize)?;
    // A cluster fits in one GPC.
    let size = cluster_limit(f)?.min(per_sm * GPC_SMS);
    out(n, size as c_int)
}
