//! `mem-paths`: drives every allocation path of the driver API against a
//! memory budget and reports, per path, whether the budget held to the
//! granule: filling the budget exactly through the path succeeds, one more
//! 512-byte allocation is refused with out-of-memory, and after the path's
//! free the whole budget is free again. The pre-3.2 ABIs, the device malloc
//! heap and a pool's release threshold are checked too.
//!
//! `--via` chooses how the entry points are obtained:
//! `dlsym` (dlsym on the libcuda handle, like cudarc), `linked` (the global
//! symbol, like a program linked with -lcuda), `gpa0` / `gpa2`
//! (cuGetProcAddress_v2 with flags 0 / 2, like cudart).

use dilu_abi::cuda::{self, CUresult, sys};
use std::ffi::{CString, c_int, c_uint, c_void};
use std::process::ExitCode;

const USAGE: &str = "usage: mem-paths --via dlsym|linked|gpa0|gpa2 --budget BYTES";

struct Resolver {
    handle: *mut c_void,
    via: String,
    gpa: Option<GetProcAddress>,
}

type GetProcAddress = unsafe extern "C" fn(
    *const std::ffi::c_char,
    *mut *mut c_void,
    c_int,
    u64,
    *mut c_int,
) -> CUresult;

impl Resolver {
    fn new(via: &str) -> Result<Self, String> {
        let name = CString::new("libcuda.so.1").expect("no NUL");
        // SAFETY: plain dlopen of a library name.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err("cannot dlopen libcuda.so.1".into());
        }
        let mut resolver = Resolver {
            handle,
            via: via.to_string(),
            gpa: None,
        };
        if via.starts_with("gpa") {
            let entry = resolver.dlsym("cuGetProcAddress_v2")?;
            // SAFETY: cuGetProcAddress_v2's signature from cuda.h.
            resolver.gpa = Some(unsafe { std::mem::transmute::<usize, GetProcAddress>(entry) });
        } else if via != "dlsym" && via != "linked" {
            return Err(format!("unknown --via {via}"));
        }
        Ok(resolver)
    }

    fn dlsym(&self, abi_name: &str) -> Result<usize, String> {
        let name = CString::new(abi_name).expect("no NUL");
        let handle = if self.via == "linked" {
            libc::RTLD_DEFAULT
        } else {
            self.handle
        };
        // SAFETY: live handle (or RTLD_DEFAULT), NUL-terminated name.
        let address = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
        if address == 0 {
            return Err(format!("{abi_name} not found"));
        }
        Ok(address)
    }

    /// The entry point for `base` (as cudart names it) or `abi` (its exported
    /// name under this mode's stream semantics).
    fn get<F: Copy>(&self, base: &str, abi: &str) -> Result<F, String> {
        self.get_at(base, abi, 12090)
    }

    /// [`Resolver::get`] for the ABI of CUDA `version` (2000: the pre-3.2
    /// 32-bit memory functions, exported without `_v2`).
    fn get_at<F: Copy>(&self, base: &str, abi: &str, version: c_int) -> Result<F, String> {
        let address = match self.gpa {
            None => self.dlsym(abi)?,
            Some(gpa) => {
                let flags = if self.via == "gpa2" { 2 } else { 0 };
                let name = CString::new(base).expect("no NUL");
                let mut pointer: *mut c_void = std::ptr::null_mut();
                let mut status: c_int = -1;
                // SAFETY: cuGetProcAddress_v2 contract.
                let result =
                    unsafe { gpa(name.as_ptr(), &mut pointer, version, flags, &mut status) };
                if result != cuda::CUDA_SUCCESS || pointer.is_null() {
                    return Err(format!("cuGetProcAddress({base}) -> {result}"));
                }
                pointer as usize
            }
        };
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is the cuda.h signature of this entry point.
        Ok(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
    }
}

type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type MemFree = unsafe extern "C" fn(u64) -> CUresult;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;

struct Harness {
    r: Resolver,
    budget: usize,
    alloc: MemAlloc,
    free: MemFree,
    info: MemGetInfo,
    ptsz: bool,
}

impl Harness {
    fn stream_abi(&self, name: &str) -> String {
        if self.ptsz {
            format!("{name}_ptsz")
        } else {
            name.to_string()
        }
    }

    fn free_bytes(&self) -> usize {
        let (mut free, mut total) = (0, 0);
        // SAFETY: two live out-parameters.
        unsafe { (self.info)(&mut free, &mut total) };
        free
    }

    /// After a path filled the budget: one more granule must be refused.
    fn over_is_refused(&self) -> bool {
        let mut p = 0u64;
        // SAFETY: live out-parameter.
        let result = unsafe { (self.alloc)(&mut p, 512) };
        if result == cuda::CUDA_SUCCESS {
            // SAFETY: freeing what we just allocated.
            unsafe { (self.free)(p) };
        }
        result == cuda::CUDA_ERROR_OUT_OF_MEMORY
    }

    fn report(&self, path: &str, filled: CUresult, refused: bool, freed: CUresult) -> bool {
        let free_after = self.free_bytes();
        let ok = filled == cuda::CUDA_SUCCESS
            && refused
            && freed == cuda::CUDA_SUCCESS
            && free_after == self.budget;
        println!(
            "{{\"path\":\"{path}\",\"via\":\"{}\",\"fill\":{filled},\"over_refused\":{refused},\"free\":{freed},\"free_after\":{free_after},\"ok\":{ok}}}",
            self.r.via
        );
        ok
    }
}

fn run(via: &str, budget: usize) -> Result<bool, String> {
    let r = Resolver::new(via)?;
    type Init = unsafe extern "C" fn(c_uint) -> CUresult;
    type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CUresult;
    type Retain = unsafe extern "C" fn(*mut sys::CUcontext, c_int) -> CUresult;
    type SetCurrent = unsafe extern "C" fn(sys::CUcontext) -> CUresult;
    let init: Init = r.get("cuInit", "cuInit")?;
    let device_get: DeviceGet = r.get("cuDeviceGet", "cuDeviceGet")?;
    let retain: Retain = r.get("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain")?;
    let set_current: SetCurrent = r.get("cuCtxSetCurrent", "cuCtxSetCurrent")?;
    // SAFETY: (whole block) each call follows its cuda.h contract with live
    // locals as out-parameters and sizes within the buffers passed.
    unsafe {
        let mut device = 0;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        if init(0) != 0
            || device_get(&mut device, 0) != 0
            || retain(&mut context, device) != 0
            || set_current(context) != 0
        {
            return Err("driver initialisation failed".into());
        }
        let h = Harness {
            alloc: r.get("cuMemAlloc", "cuMemAlloc_v2")?,
            free: r.get("cuMemFree", "cuMemFree_v2")?,
            info: r.get("cuMemGetInfo", "cuMemGetInfo_v2")?,
            ptsz: via == "gpa2",
            r,
            budget,
        };
        if h.free_bytes() != budget {
            return Err(format!(
                "cuMemGetInfo free is {} before any allocation, expected the budget {budget}",
                h.free_bytes()
            ));
        }
        let mut all_ok = true;
        let null_stream: sys::CUstream = std::ptr::null_mut();
        type StreamSync = unsafe extern "C" fn(sys::CUstream) -> CUresult;
        let sync: StreamSync =
            h.r.get("cuStreamSynchronize", &h.stream_abi("cuStreamSynchronize"))?;

        // cuMemAlloc_v2
        let mut p = 0u64;
        let filled = (h.alloc)(&mut p, budget);
        let refused = h.over_is_refused();
        all_ok &= h.report("cuMemAlloc_v2", filled, refused, (h.free)(p));

        // cuMemAllocPitch_v2: 1024-byte rows are already pitch-aligned.
        type Pitch = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CUresult;
        let pitch_alloc: Pitch = h.r.get("cuMemAllocPitch", "cuMemAllocPitch_v2")?;
        let mut pitch = 0usize;
        let filled = pitch_alloc(&mut p, &mut pitch, 1024, budget / 1024, 4);
        let refused = h.over_is_refused();
        all_ok &= h.report("cuMemAllocPitch_v2", filled, refused, (h.free)(p));

        // cuMemAllocManaged
        type Managed = unsafe extern "C" fn(*mut u64, usize, c_uint) -> CUresult;
        let managed: Managed = h.r.get("cuMemAllocManaged", "cuMemAllocManaged")?;
        let filled = managed(&mut p, budget, 1);
        let refused = h.over_is_refused();
        all_ok &= h.report("cuMemAllocManaged", filled, refused, (h.free)(p));

        // cuMemAllocAsync / cuMemFreeAsync (stream-ordered)
        type AllocAsync = unsafe extern "C" fn(*mut u64, usize, sys::CUstream) -> CUresult;
        type FreeAsync = unsafe extern "C" fn(u64, sys::CUstream) -> CUresult;
        let alloc_async: AllocAsync =
            h.r.get("cuMemAllocAsync", &h.stream_abi("cuMemAllocAsync"))?;
        let free_async: FreeAsync = h.r.get("cuMemFreeAsync", &h.stream_abi("cuMemFreeAsync"))?;
        let filled = alloc_async(&mut p, budget, null_stream);
        sync(null_stream);
        let refused = h.over_is_refused();
        let freed = free_async(p, null_stream);
        sync(null_stream);
        all_ok &= h.report("cuMemAllocAsync", filled, refused, freed);

        // cuMemAllocFromPoolAsync on the device's default pool
        type DefaultPool = unsafe extern "C" fn(*mut sys::CUmemoryPool, c_int) -> CUresult;
        type FromPool =
            unsafe extern "C" fn(*mut u64, usize, sys::CUmemoryPool, sys::CUstream) -> CUresult;
        let default_pool: DefaultPool =
            h.r.get("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool")?;
        let from_pool: FromPool = h.r.get(
            "cuMemAllocFromPoolAsync",
            &h.stream_abi("cuMemAllocFromPoolAsync"),
        )?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        default_pool(&mut pool, device);
        let filled = from_pool(&mut p, budget, pool, null_stream);
        sync(null_stream);
        let refused = h.over_is_refused();
        let freed = free_async(p, null_stream);
        sync(null_stream);
        all_ok &= h.report("cuMemAllocFromPoolAsync", filled, refused, freed);

        // cuMemCreate: half the budget, mapped twice; the second mapping must
        // not be charged again, so the other half is still allocatable.
        type Create =
            unsafe extern "C" fn(*mut u64, usize, *const sys::CUmemAllocationProp, u64) -> CUresult;
        type Release = unsafe extern "C" fn(u64) -> CUresult;
        type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> CUresult;
        type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> CUresult;
        type Unmap = unsafe extern "C" fn(u64, usize) -> CUresult;
        type AddressFree = unsafe extern "C" fn(u64, usize) -> CUresult;
        let create: Create = h.r.get("cuMemCreate", "cuMemCreate")?;
        let release: Release = h.r.get("cuMemRelease", "cuMemRelease")?;
        let reserve: Reserve = h.r.get("cuMemAddressReserve", "cuMemAddressReserve")?;
        let map: Map = h.r.get("cuMemMap", "cuMemMap")?;
        let unmap: Unmap = h.r.get("cuMemUnmap", "cuMemUnmap")?;
        let address_free: AddressFree = h.r.get("cuMemAddressFree", "cuMemAddressFree")?;
        let mut prop: sys::CUmemAllocationProp = std::mem::zeroed();
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = device;
        let half = budget / 2;
        let mut handle = 0u64;
        let mut filled = create(&mut handle, half, &prop, 0);
        let (mut va1, mut va2) = (0u64, 0u64);
        if filled == 0 {
            reserve(&mut va1, half, 0, 0, 0);
            reserve(&mut va2, half, 0, 0, 0);
            let m1 = map(va1, half, 0, handle, 0);
            let m2 = map(va2, half, 0, handle, 0);
            let rest = (h.alloc)(&mut p, budget - half);
            if m1 != 0 || m2 != 0 || rest != 0 {
                filled = if rest != 0 { rest } else { m1.max(m2) };
            }
        }
        let refused = h.over_is_refused();
        (h.free)(p);
        unmap(va1, half);
        unmap(va2, half);
        address_free(va1, half);
        address_free(va2, half);
        all_ok &= h.report("cuMemCreate+cuMemMap x2", filled, refused, release(handle));

        // Arrays: FLOAT (0x20) × 4 channels = 16 bytes per element.
        type ArrayCreate =
            unsafe extern "C" fn(*mut sys::CUarray, *const sys::CUDA_ARRAY_DESCRIPTOR) -> CUresult;
        type Array3DCreate = unsafe extern "C" fn(
            *mut sys::CUarray,
            *const sys::CUDA_ARRAY3D_DESCRIPTOR,
        ) -> CUresult;
        type ArrayDestroy = unsafe extern "C" fn(sys::CUarray) -> CUresult;
        type MipCreate = unsafe extern "C" fn(
            *mut sys::CUmipmappedArray,
            *const sys::CUDA_ARRAY3D_DESCRIPTOR,
            c_uint,
        ) -> CUresult;
        type MipDestroy = unsafe extern "C" fn(sys::CUmipmappedArray) -> CUresult;
        let array_create: ArrayCreate = h.r.get("cuArrayCreate", "cuArrayCreate_v2")?;
        let array3d_create: Array3DCreate = h.r.get("cuArray3DCreate", "cuArray3DCreate_v2")?;
        let array_destroy: ArrayDestroy = h.r.get("cuArrayDestroy", "cuArrayDestroy")?;
        let mip_create: MipCreate =
            h.r.get("cuMipmappedArrayCreate", "cuMipmappedArrayCreate")?;
        let mip_destroy: MipDestroy =
            h.r.get("cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy")?;
        let float = sys::CUarray_format::CU_AD_FORMAT_FLOAT;
        let elements = budget / 16;
        let desc = sys::CUDA_ARRAY_DESCRIPTOR {
            Width: 512,
            Height: elements / 512,
            Format: float,
            NumChannels: 4,
        };
        let mut array: sys::CUarray = std::ptr::null_mut();
        let filled = array_create(&mut array, &desc);
        let refused = h.over_is_refused();
        all_ok &= h.report("cuArrayCreate_v2", filled, refused, array_destroy(array));

        let desc3 = sys::CUDA_ARRAY3D_DESCRIPTOR {
            Width: 256,
            Height: 64,
            Depth: elements / (256 * 64),
            Format: float,
            NumChannels: 4,
            Flags: 0,
        };
        let filled = array3d_create(&mut array, &desc3);
        let refused = h.over_is_refused();
        all_ok &= h.report("cuArray3DCreate_v2", filled, refused, array_destroy(array));

        // Two levels: W×H + (W/2)×(H/2) elements = 5/4 of level 0; fill the
        // rest of the budget with cuMemAlloc.
        let mip_desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
            Width: 512,
            Height: elements / 1024,
            Depth: 0,
            Format: float,
            NumChannels: 4,
            Flags: 0,
        };
        let mip_bytes = 16 * (512 * (elements / 1024) + 256 * (elements / 2048));
        let mut mip: sys::CUmipmappedArray = std::ptr::null_mut();
        let mut filled = mip_create(&mut mip, &mip_desc, 2);
        if filled == 0 {
            filled = (h.alloc)(&mut p, budget - mip_bytes);
        }
        let refused = h.over_is_refused();
        (h.free)(p);
        all_ok &= h.report("cuMipmappedArrayCreate", filled, refused, mip_destroy(mip));

        // The pre-3.2 ABIs: the budget refuses an over-budget cuMemAlloc
        // before the driver sees it, and cuMemGetInfo reports the budget.
        type AllocV1 = unsafe extern "C" fn(*mut c_uint, c_uint) -> CUresult;
        type InfoV1 = unsafe extern "C" fn(*mut c_uint, *mut c_uint) -> CUresult;
        let alloc_v1: AllocV1 = h.r.get_at("cuMemAlloc", "cuMemAlloc", 2000)?;
        let info_v1: InfoV1 = h.r.get_at("cuMemGetInfo", "cuMemGetInfo", 2000)?;
        let mut p32: c_uint = 0;
        let over = alloc_v1(&mut p32, (budget + 512) as c_uint);
        let (mut free32, mut total32): (c_uint, c_uint) = (0, 0);
        let info = info_v1(&mut free32, &mut total32);
        let free_after = h.free_bytes();
        let ok = over == cuda::CUDA_ERROR_OUT_OF_MEMORY
            && info == cuda::CUDA_SUCCESS
            && (free32 as usize, total32 as usize) == (budget, budget)
            && free_after == budget;
        println!(
            "{{\"path\":\"cuMemAlloc+cuMemGetInfo (v1)\",\"via\":\"{}\",\"over\":{over},\"info\":{info},\"free_v1\":{free32},\"free_after\":{free_after},\"ok\":{ok}}}",
            h.r.via
        );
        all_ok &= ok;

        // The device malloc heap (cuCtxSetLimit) is memory too.
        type SetLimit = unsafe extern "C" fn(c_int, usize) -> CUresult;
        let set_limit: SetLimit = h.r.get("cuCtxSetLimit", "cuCtxSetLimit")?;
        const MALLOC_HEAP_SIZE: c_int = 2;
        let half = set_limit(MALLOC_HEAP_SIZE, budget / 2);
        let free_with_heap = h.free_bytes();
        let over = set_limit(MALLOC_HEAP_SIZE, budget * 2);
        let back = set_limit(MALLOC_HEAP_SIZE, 0);
        let free_after = h.free_bytes();
        let ok = half == cuda::CUDA_SUCCESS
            && free_with_heap == budget / 2
            && over == cuda::CUDA_ERROR_OUT_OF_MEMORY
            && back == cuda::CUDA_SUCCESS
            && free_after == budget;
        println!(
            "{{\"path\":\"cuCtxSetLimit(MALLOC_HEAP_SIZE)\",\"via\":\"{}\",\"half\":{half},\"free_with_heap\":{free_with_heap},\"over\":{over},\"free_after\":{free_after},\"ok\":{ok}}}",
            h.r.via
        );
        all_ok &= ok;

        // A pool may not keep freed memory past the budget's back.
        type PoolAttribute =
            unsafe extern "C" fn(sys::CUmemoryPool, c_int, *mut c_void) -> CUresult;
        let default_pool: DefaultPool =
            h.r.get("cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool")?;
        let pool_set: PoolAttribute = h.r.get("cuMemPoolSetAttribute", "cuMemPoolSetAttribute")?;
        let pool_get: PoolAttribute = h.r.get("cuMemPoolGetAttribute", "cuMemPoolGetAttribute")?;
        const RELEASE_THRESHOLD: c_int = 4;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let got = default_pool(&mut pool, device);
        let mut asked = u64::MAX;
        let set = pool_set(pool, RELEASE_THRESHOLD, (&raw mut asked).cast());
        let mut threshold = u64::MAX;
        let read = pool_get(pool, RELEASE_THRESHOLD, (&raw mut threshold).cast());
        let ok = got == cuda::CUDA_SUCCESS
            && set == cuda::CUDA_SUCCESS
            && read == cuda::CUDA_SUCCESS
            && threshold == 0;
        println!(
            "{{\"path\":\"cuMemPoolSetAttribute(RELEASE_THRESHOLD)\",\"via\":\"{}\",\"set\":{set},\"threshold\":{threshold},\"ok\":{ok}}}",
            h.r.via
        );
        all_ok &= ok;
        Ok(all_ok)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let (Some(via), Some(budget)) = (
        value("--via"),
        value("--budget").and_then(|b| b.parse::<usize>().ok()),
    ) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if budget < (4 << 20) || !budget.is_multiple_of(4 << 20) {
        eprintln!("mem-paths: --budget must be a multiple of 4 MiB");
        return ExitCode::from(2);
    }
    match run(via, budget) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("mem-paths: {message}");
            ExitCode::FAILURE
        }
    }
}
