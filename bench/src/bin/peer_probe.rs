//! `peer-probe`: what one CUDA process sees and pays under a GPU-sharing
//! library (dilu's interposer, HAMi-core's libvgpu.so, or none), for the
//! side-by-side benchmark `cargo bench -p dilu-bench --bench peers`.
//!
//! Opens `libcuda.so.1` and `libnvidia-ml.so.1` by name (so `LD_PRELOAD` and
//! `LD_LIBRARY_PATH` decide who answers) and prints one JSON line:
//! `cuMemGetInfo` and `nvmlDeviceGetMemoryInfo` totals, the mean cost of
//! `cuLaunchKernel`, `cuMemAlloc`+`cuMemFree` (1 MiB) and `cuMemGetInfo`
//! over `--calls N` calls each, and how much it could allocate in 64 MiB
//! pieces before the first refusal.

use dilu_bench::driver::{
    Library, MemAlloc, MemFree, MemGetInfo, alloc_free, init_context, launch_noop, load_noop,
    monotonic_ns,
};
use std::ffi::{c_uint, c_void};
use std::path::Path;

#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// (total, used) through NVML's device 0, if NVML loads.
fn nvml_memory() -> Option<(u64, u64)> {
    let nvml = Library::open(Path::new("libnvidia-ml.so.1")).ok()?;
    let init: unsafe extern "C" fn() -> c_uint = nvml.get("nvmlInit_v2");
    let by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_uint =
        nvml.get("nvmlDeviceGetHandleByIndex_v2");
    let memory: unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_uint =
        nvml.get("nvmlDeviceGetMemoryInfo");
    let mut device = std::ptr::null_mut();
    let mut m = NvmlMemory::default();
    // SAFETY: NVML calls with valid out-pointers.
    let ok = unsafe { init() == 0 && by_index(0, &mut device) == 0 && memory(device, &mut m) == 0 };
    ok.then_some((m.total, m.used))
}

fn mean_ns(calls: u64, mut f: impl FnMut() -> i32) -> Result<f64, String> {
    let start = monotonic_ns();
    for _ in 0..calls {
        let rc = f();
        if rc != 0 {
            return Err(format!("call failed with {rc}"));
        }
    }
    Ok((monotonic_ns() - start) as f64 / calls as f64)
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let calls: u64 = match args.iter().position(|a| a == "--calls") {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .ok_or("usage: peer-probe [--calls N]")?,
        None => 20_000,
    };
    let driver = Library::open(Path::new("libcuda.so.1"))?;
    init_context(&driver)?;
    let alloc: MemAlloc = driver.get("cuMemAlloc_v2");
    let free: MemFree = driver.get("cuMemFree_v2");
    let info: MemGetInfo = driver.get("cuMemGetInfo_v2");
    let sync: unsafe extern "C" fn() -> i32 = driver.get("cuCtxSynchronize");
    let (mut free_bytes, mut total_bytes) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe { info(&mut free_bytes, &mut total_bytes) };
    let nvml = nvml_memory();
    let function = load_noop(&driver)?;
    let launch = driver.get("cuLaunchKernel");
    let launch_ns = mean_ns(calls, || launch_noop(launch, function) as i32)?;
    // SAFETY: plain driver call.
    unsafe { sync() };
    let alloc_free_ns = mean_ns(calls, || alloc_free(alloc, free, 1 << 20) as i32)?;
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    let meminfo_ns = mean_ns(calls, || unsafe { info(&mut f, &mut t) } as i32)?;
    let mut held = Vec::new();
    let piece = 64u64 << 20;
    let refused = loop {
        let mut p = 0u64;
        // SAFETY: valid out-pointer.
        let rc = unsafe { alloc(&mut p, piece as usize) };
        if rc != 0 {
            break rc;
        }
        held.push(p);
        if held.len() as u64 * piece >= 1 << 40 {
            break 0;
        }
    };
    let allocated = held.len() as u64 * piece;
    for p in held {
        // SAFETY: pointers from cuMemAlloc above.
        unsafe { free(p) };
    }
    let (nvml_total, nvml_used) = nvml.map_or(("null".into(), "null".into()), |(t, u)| {
        (t.to_string(), u.to_string())
    });
    println!(
        "{{\"pid\":{},\"meminfo_free\":{free_bytes},\"meminfo_total\":{total_bytes},\
         \"nvml_total\":{nvml_total},\"nvml_used\":{nvml_used},\"launch_ns\":{launch_ns:.1},\
         \"alloc_free_ns\":{alloc_free_ns:.1},\"meminfo_ns\":{meminfo_ns:.1},\
         \"allocated\":{allocated},\"refused_with\":{refused}}}",
        std::process::id()
    );
    Ok(())
}
