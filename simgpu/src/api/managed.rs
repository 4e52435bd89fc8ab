//! Unified-memory hints: `cuMemAdvise` / `_v2` and `cuMemPrefetchAsync` /
//! `_v2` (and their `_ptsz` twins), as cuda.h (CUDA 12.9) documents them.
//!
//! On a real driver these move no data a program can see: they validate
//! their arguments and succeed. Here managed memory already lives where
//! host and device both reach it (the arena), so nothing migrates at all.
//!
//! - The range must lie in managed memory (`cuMemAllocManaged`). cuda.h also
//!   admits system-allocated pageable memory, but only on systems with a
//!   non-zero `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`, which simgpu
//!   reports as 0; so device memory from `cuMemAlloc`, host memory and
//!   anything else is `CUDA_ERROR_INVALID_VALUE`, as is a zero count or a
//!   range running past its allocation.
//! - The advice is kept nowhere: only `cuMemRangeGetAttribute(s)` would read
//!   it back, and simgpu does not implement those.
//! - A prefetch is ordered on its stream, but it costs no device time and
//!   changes nothing, so it is not queued at all: a zero-length operation
//!   in FIFO order completes exactly when the work before it does, which no
//!   later call (a query, a synchronisation, an event, a host function) can
//!   tell from no operation; queuing one would only make the stream's worker
//!   drain the kernels it handed ahead. The stream handle is checked as by
//!   every stream call. Inside a capture it records nothing.

use crate::Res;
use crate::driver::drv;
use crate::exec::resolve;
use dilu_abi::cuda::*;
use std::ffi::{c_int, c_uint};

type CUdeviceptr = sys::CUdeviceptr;
type CUstream = sys::CUstream;

/// `CUmemLocation` passed by value: `{ CUmemLocationType type; int id; }`
/// (CUDA 13.2 makes `id` a union of the same size). The type is read as a
/// plain integer so that any value a caller passes is well defined.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

export! {
    fn cuMemAdvise(p: CUdeviceptr, count: usize, advice: c_int, device: sys::CUdevice) => advise;
    fn cuMemAdvise_v2(p: CUdeviceptr, count: usize, advice: c_int, location: MemLocation) => advise_v2;
    fn cuMemPrefetchAsync(p: CUdeviceptr, count: usize, device: sys::CUdevice, s: CUstream) | cuMemPrefetchAsync_ptsz => prefetch;
    fn cuMemPrefetchAsync_v2(p: CUdeviceptr, count: usize, location: MemLocation, flags: c_uint, s: CUstream) | cuMemPrefetchAsync_v2_ptsz => prefetch_v2;
}

/// `CUmem_advise` (cuda.h).
const SET_READ_MOSTLY: c_int = 1;
const UNSET_READ_MOSTLY: c_int = 2;
const SET_PREFERRED_LOCATION: c_int = 3;
const UNSET_PREFERRED_LOCATION: c_int = 4;
const SET_ACCESSED_BY: c_int = 5;
const UNSET_ACCESSED_BY: c_int = 6;

/// `CU_DEVICE_CPU` (cuda.h): the host, where a `CUdevice` is asked for.
const DEVICE_CPU: sys::CUdevice = -1;

/// `CUmemLocationType` (cuda.h).
const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST: c_int = 2;
const LOCATION_HOST_NUMA: c_int = 3;
const LOCATION_HOST_NUMA_CURRENT: c_int = 4;

/// `[p, p+count)` must lie inside one managed allocation.
fn check_range(p: CUdeviceptr, count: usize) -> Res {
    if count == 0 || !super::mem::is_managed(p, count) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// A `CUdevice` naming a processor: `CU_DEVICE_CPU` or a device ordinal
/// (every simulated device has `CONCURRENT_MANAGED_ACCESS` = 1, which cuda.h
/// requires of a GPU here).
fn check_processor(device: sys::CUdevice) -> Res {
    if device != DEVICE_CPU {
        drv()?.check_dev(device)?;
    }
    Ok(())
}

/// Whether `id` is a NUMA node of this host (Linux lists them in sysfs; a
/// kernel without NUMA support has node 0 alone).
fn host_numa_node(id: c_int) -> bool {
    let nodes = std::path::Path::new("/sys/devices/system/node");
    id >= 0 && (nodes.join(format!("node{id}")).exists() || (id == 0 && !nodes.exists()))
}

/// A `CUmemLocation` that `allowed` types admit: a device ordinal
/// (`CUDA_ERROR_INVALID_DEVICE` if there is no such device), the host (id
/// ignored), a host NUMA node (a node of this host) or the calling thread's
/// nearest node (id ignored). Any other type is `CUDA_ERROR_INVALID_VALUE`.
fn check_location(location: MemLocation, allowed: &[c_int]) -> Res {
    if !allowed.contains(&location.kind) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match location.kind {
        LOCATION_DEVICE => drv()?.check_dev(location.id).map(|_| ()),
        LOCATION_HOST_NUMA if !host_numa_node(location.id) => Err(CUDA_ERROR_INVALID_VALUE),
        _ => Ok(()),
    }
}

/// `cuMemAdvise`: `device` is ignored for the read-mostly advices and for
/// unsetting the preferred location (cuda.h says so of SET_READ_MOSTLY here
/// and of all three in `cuMemAdvise_v2`); the others name a processor.
fn advise(_: bool, p: CUdeviceptr, count: usize, advice: c_int, device: sys::CUdevice) -> Res {
    drv()?;
    check_range(p, count)?;
    match advice {
        SET_READ_MOSTLY | UNSET_READ_MOSTLY | UNSET_PREFERRED_LOCATION => Ok(()),
        SET_PREFERRED_LOCATION | SET_ACCESSED_BY | UNSET_ACCESSED_BY => check_processor(device),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemAdvise_v2`: the location is ignored for the read-mostly advices and
/// for unsetting the preferred location; a preferred location is a device,
/// the host or a host NUMA node; accessed-by takes a device or the host
/// ("All other location types are invalid").
fn advise_v2(_: bool, p: CUdeviceptr, count: usize, advice: c_int, location: MemLocation) -> Res {
    drv()?;
    check_range(p, count)?;
    match advice {
        SET_READ_MOSTLY | UNSET_READ_MOSTLY | UNSET_PREFERRED_LOCATION => Ok(()),
        SET_PREFERRED_LOCATION => check_location(
            location,
            &[
                LOCATION_DEVICE,
                LOCATION_HOST,
                LOCATION_HOST_NUMA,
                LOCATION_HOST_NUMA_CURRENT,
            ],
        ),
        SET_ACCESSED_BY | UNSET_ACCESSED_BY => {
            check_location(location, &[LOCATION_DEVICE, LOCATION_HOST])
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuMemPrefetchAsync`: to `CU_DEVICE_CPU` or a device (see the module
/// comment for why nothing is queued).
fn prefetch(pt: bool, p: CUdeviceptr, count: usize, device: sys::CUdevice, s: CUstream) -> Res {
    resolve(s, pt)?;
    check_range(p, count)?;
    check_processor(device)
}

/// `cuMemPrefetchAsync_v2`: to a device, the host, a host NUMA node or the
/// calling thread's nearest one; `flags` must be 0.
fn prefetch_v2(
    pt: bool,
    p: CUdeviceptr,
    count: usize,
    location: MemLocation,
    flags: c_uint,
    s: CUstream,
) -> Res {
    resolve(s, pt)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_range(p, count)?;
    check_location(
        location,
        &[
            LOCATION_DEVICE,
            LOCATION_HOST,
            LOCATION_HOST_NUMA,
            LOCATION_HOST_NUMA_CURRENT,
        ],
    )
}
