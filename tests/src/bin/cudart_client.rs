//! `cudart-client`: reaches the CUDA driver exactly the way NVIDIA's cudart
//! 12.9 does, then does real work through the pointers it was given.
//!
//! cudart opens `libcuda.so.1`, takes `cuGetProcAddress_v2` with one dlsym,
//! asks it for `"cuGetProcAddress"` at versions 11030 and 12000, and from
//! then on resolves every entry point through the 12000 pointer. The list of
//! look-ups (`tests/data/cudart12.9_getprocaddress_requests.txt`) is the one
//! cudart 12.9 really makes, in order.

use dilu_abi::cuda::{self, CUresult, sys};
use dilu_harness::ptx::{BLOCK_THREADS, BUSY_KERNEL, PTX};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::process::ExitCode;

const REQUESTS: &str = include_str!("../../data/cudart12.9_getprocaddress_requests.txt");

const USAGE: &str = "usage: cudart-client [--alloc BYTES] [--hold-ms MS] [--per-thread]
  --alloc BYTES  size of the device buffer to allocate (default 1048576)
  --hold-ms MS   keep the buffer this long before freeing it (default 0)
  --per-thread   use the flags=2 (per-thread default stream) entry points throughout
Prints one JSON line; exits 3 when the allocation is refused with out-of-memory.";

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

/// One look-up from the recorded list.
struct Request {
    name: String,
    version: c_int,
    flags: u64,
}

fn parse_requests() -> Vec<Request> {
    REQUESTS
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().strip_prefix('"')?.split_once('"')?;
            let mut version = None;
            let mut flags = None;
            for field in rest.split(',').map(str::trim) {
                if let Some(v) = field.strip_prefix("ver=") {
                    version = v.parse().ok();
                } else if let Some(f) = field.strip_prefix("flags=") {
                    flags = f.parse().ok();
                }
            }
            Some(Request {
                name: name.to_string(),
                version: version?,
                flags: flags?,
            })
        })
        .collect()
}

struct Driver {
    table: HashMap<(String, u64), usize>,
}

impl Driver {
    /// The pointer cudart would hold for `name` under `flags` (the last,
    /// i.e. newest-version, look-up wins, as in cudart's own table).
    fn get<F: Copy>(&self, name: &str, flags: u64) -> Result<F, String> {
        let address = *self
            .table
            .get(&(name.to_string(), flags))
            .ok_or_else(|| format!("{name} (flags={flags}) was not resolved"))?;
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is a function-pointer type matching the ABI that the driver
        // returned for this (name, version, flags); address is non-null.
        Ok(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
    }
}

fn check(what: &str, result: CUresult) -> Result<(), String> {
    if result == cuda::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed with CUresult {result}"))
    }
}

struct Options {
    alloc: usize,
    hold_ms: u64,
    per_thread: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        alloc: 1 << 20,
        hold_ms: 0,
        per_thread: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--per-thread" => options.per_thread = true,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--alloc" | "--hold-ms" => {
                let value = args.next().ok_or(format!("{flag} needs a value"))?;
                let number: u64 = value
                    .parse()
                    .map_err(|_| format!("bad value {value:?} for {flag}"))?;
                if flag == "--alloc" {
                    options.alloc = number as usize;
                } else {
                    options.hold_ms = number;
                }
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(options)
}

/// Resolves every recorded look-up the way cudart does. Returns the table and
/// the look-ups that failed.
fn resolve_all() -> Result<(Driver, Vec<String>, usize), String> {
    let library = CString::new("libcuda.so.1").expect("no NUL");
    // SAFETY: plain dlopen of a library name.
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let reason = unsafe { libc::dlerror() };
        let reason = if reason.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: non-null dlerror result is a valid C string.
            unsafe { CStr::from_ptr(reason) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(format!("dlopen(libcuda.so.1) failed: {reason}"));
    }
    let symbol = CString::new("cuGetProcAddress_v2").expect("no NUL");
    // SAFETY: handle is a live dlopen handle; symbol is NUL-terminated.
    let entry = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    if entry.is_null() {
        return Err("libcuda.so.1 has no cuGetProcAddress_v2".into());
    }
    // SAFETY: cuGetProcAddress_v2 has this signature in cuda.h.
    let mut get_proc: GetProcAddressV2 = unsafe { std::mem::transmute(entry) };

    let mut table = HashMap::new();
    let mut failed = Vec::new();
    let requests = parse_requests();
    for request in &requests {
        let name = CString::new(request.name.as_str()).expect("no NUL");
        let mut pointer: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        // SAFETY: arguments follow cuGetProcAddress_v2's contract.
        let result = unsafe {
            get_proc(
                name.as_ptr(),
                &mut pointer,
                request.version,
                request.flags,
                &mut status,
            )
        };
        if result != cuda::CUDA_SUCCESS || pointer.is_null() {
            failed.push(format!(
                "{}@{} flags={} -> result {result} status {status}",
                request.name, request.version, request.flags
            ));
            continue;
        }
        if request.name == "cuGetProcAddress" && request.version >= 12000 {
            // SAFETY: at version 12000 the driver hands out the _v2 ABI.
            get_proc = unsafe { std::mem::transmute::<*mut c_void, GetProcAddressV2>(pointer) };
        }
        table.insert((request.name.clone(), request.flags), pointer as usize);
    }
    Ok((Driver { table }, failed, requests.len()))
}

/// What the work phase ended with; `summary` is a JSON object.
enum Outcome {
    Completed { summary: String, round_trip: bool },
    OutOfMemory { summary: String },
}

fn work(driver: &Driver, options: &Options) -> Result<Outcome, String> {
    type Init = unsafe extern "C" fn(c_uint) -> CUresult;
    type DeviceGet = unsafe extern "C" fn(*mut sys::CUdevice, c_int) -> CUresult;
    type PrimaryRetain = unsafe extern "C" fn(*mut sys::CUcontext, sys::CUdevice) -> CUresult;
    type CtxSetCurrent = unsafe extern "C" fn(sys::CUcontext) -> CUresult;
    type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
    type MemAlloc = unsafe extern "C" fn(*mut sys::CUdeviceptr, usize) -> CUresult;
    type MemFree = unsafe extern "C" fn(sys::CUdeviceptr) -> CUresult;
    type HtoD = unsafe extern "C" fn(sys::CUdeviceptr, *const c_void, usize) -> CUresult;
    type DtoH = unsafe extern "C" fn(*mut c_void, sys::CUdeviceptr, usize) -> CUresult;
    type MemsetD8 = unsafe extern "C" fn(sys::CUdeviceptr, u8, usize) -> CUresult;
    type ModuleLoadData = unsafe extern "C" fn(*mut sys::CUmodule, *const c_void) -> CUresult;
    type ModuleGetFunction =
        unsafe extern "C" fn(*mut sys::CUfunction, sys::CUmodule, *const c_char) -> CUresult;
    type LaunchKernel = unsafe extern "C" fn(
        sys::CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        sys::CUstream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CUresult;
    type StreamSynchronize = unsafe extern "C" fn(sys::CUstream) -> CUresult;

    let stream_flags = if options.per_thread { 2 } else { 0 };
    let init: Init = driver.get("cuInit", 0)?;
    let device_get: DeviceGet = driver.get("cuDeviceGet", 0)?;
    let retain: PrimaryRetain = driver.get("cuDevicePrimaryCtxRetain", 0)?;
    let set_current: CtxSetCurrent = driver.get("cuCtxSetCurrent", 0)?;
    let mem_get_info: MemGetInfo = driver.get("cuMemGetInfo", 0)?;
    let mem_alloc: MemAlloc = driver.get("cuMemAlloc", 0)?;
    let mem_free: MemFree = driver.get("cuMemFree", 0)?;
    let htod: HtoD = driver.get("cuMemcpyHtoD", stream_flags)?;
    let dtoh: DtoH = driver.get("cuMemcpyDtoH", stream_flags)?;
    let memset: MemsetD8 = driver.get("cuMemsetD8", stream_flags)?;
    let load: ModuleLoadData = driver.get("cuModuleLoadData", 0)?;
    let get_function: ModuleGetFunction = driver.get("cuModuleGetFunction", 0)?;
    let launch_legacy: LaunchKernel = driver.get("cuLaunchKernel", 0)?;
    let launch_per_thread: LaunchKernel = driver.get("cuLaunchKernel", 2)?;
    let stream_sync: StreamSynchronize = driver.get("cuStreamSynchronize", stream_flags)?;

    // SAFETY: (whole block) every call follows its cuda.h contract with
    // pointers to live locals/buffers of the right sizes.
    unsafe {
        check("cuInit", init(0))?;
        let mut device: sys::CUdevice = 0;
        check("cuDeviceGet", device_get(&mut device, 0))?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        check("cuDevicePrimaryCtxRetain", retain(&mut context, device))?;
        check("cuCtxSetCurrent", set_current(context))?;
        let (mut free, mut total) = (0usize, 0usize);
        check("cuMemGetInfo", mem_get_info(&mut free, &mut total))?;

        let mut buffer: sys::CUdeviceptr = 0;
        let alloc_result = mem_alloc(&mut buffer, options.alloc);
        if alloc_result == cuda::CUDA_ERROR_OUT_OF_MEMORY {
            let summary = format!(
                "{{\"mem_total\":{total},\"mem_free\":{free},\"alloc\":{},\"alloc_result\":{alloc_result}}}",
                options.alloc
            );
            return Ok(Outcome::OutOfMemory { summary });
        }
        check("cuMemAlloc", alloc_result)?;

        // Data must round-trip: write a pattern, overwrite part with memset, read back.
        let length = options.alloc.min(1 << 20);
        let pattern: Vec<u8> = (0..length).map(|i| (i % 251) as u8).collect();
        check(
            "cuMemcpyHtoD",
            htod(buffer, pattern.as_ptr().cast(), length),
        )?;
        let cleared = length / 2;
        check("cuMemsetD8", memset(buffer, 0xAB, cleared))?;
        let mut back = vec![0u8; length];
        check(
            "cuMemcpyDtoH",
            dtoh(back.as_mut_ptr().cast(), buffer, length),
        )?;
        let round_trip =
            back[..cleared].iter().all(|&b| b == 0xAB) && back[cleared..] == pattern[cleared..];

        let ptx = CString::new(PTX).expect("no NUL");
        let mut module: sys::CUmodule = std::ptr::null_mut();
        check("cuModuleLoadData", load(&mut module, ptx.as_ptr().cast()))?;
        let name = CString::new(BUSY_KERNEL).expect("no NUL");
        let mut function: sys::CUfunction = std::ptr::null_mut();
        check(
            "cuModuleGetFunction",
            get_function(&mut function, module, name.as_ptr()),
        )?;

        // The busy kernel needs grid × block floats; launch within the buffer.
        let blocks = (options.alloc / (4 * BLOCK_THREADS as usize)).clamp(1, 1320) as c_uint;
        let mut data = buffer;
        let mut iters: u32 = 100;
        let mut params: [*mut c_void; 2] = [(&raw mut data).cast(), (&raw mut iters).cast()];
        let null_stream: sys::CUstream = std::ptr::null_mut();
        for launch in [launch_legacy, launch_per_thread] {
            check(
                "cuLaunchKernel",
                launch(
                    function,
                    blocks,
                    1,
                    1,
                    BLOCK_THREADS,
                    1,
                    1,
                    0,
                    null_stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )?;
        }
        check("cuStreamSynchronize", stream_sync(null_stream))?;
        if options.hold_ms > 0 {
            println!("holding {} bytes", options.alloc);
            std::thread::sleep(std::time::Duration::from_millis(options.hold_ms));
        }
        check("cuMemFree", mem_free(buffer))?;
        let summary = format!(
            "{{\"mem_total\":{total},\"mem_free\":{free},\"alloc\":{},\"alloc_result\":0,\"round_trip\":{round_trip},\"launches\":2}}",
            options.alloc
        );
        Ok(Outcome::Completed {
            summary,
            round_trip,
        })
    }
}

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("cudart-client: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (driver, failed, total) = match resolve_all() {
        Ok(resolved) => resolved,
        Err(message) => {
            eprintln!("cudart-client: {message}");
            return ExitCode::FAILURE;
        }
    };
    let failed_json: Vec<String> = failed.iter().map(|f| format!("{f:?}")).collect();
    let lookups = format!(
        "\"lookups\":{total},\"resolved\":{},\"failed\":[{}]",
        total - failed.len(),
        failed_json.join(",")
    );
    match work(&driver, &options) {
        Ok(Outcome::OutOfMemory { summary }) => {
            println!("{{{lookups},{}", &summary[1..]);
            ExitCode::from(3)
        }
        Ok(Outcome::Completed {
            summary,
            round_trip,
        }) => {
            println!("{{{lookups},{}", &summary[1..]);
            if round_trip {
                ExitCode::SUCCESS
            } else {
                eprintln!("cudart-client: device memory round-trip returned different data");
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            println!("{{{lookups}}}");
            eprintln!("cudart-client: {message}");
            ExitCode::FAILURE
        }
    }
}
