//! `mem-stress`: many threads allocating and freeing random sizes through
//! `cuMemAlloc_v2`/`cuMemFree_v2` for a while, counting successes and
//! out-of-memory refusals. Used to check that a shared budget holds under
//! concurrency across processes.

use dilu_abi::cuda::{self, CUresult, sys};
use std::ffi::{CString, c_int, c_uint, c_void};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: mem-stress [--threads N] [--seconds S] [--max-bytes B]";

type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type MemFree = unsafe extern "C" fn(u64) -> CUresult;
type SetCurrent = unsafe extern "C" fn(sys::CUcontext) -> CUresult;

/// A driver entry point as the function-pointer type `F` (its cuda.h
/// signature, which the caller names).
fn function<F: Copy>(handle: *mut c_void, name: &str) -> F {
    let name = CString::new(name).expect("no NUL");
    // SAFETY: live dlopen handle, NUL-terminated name.
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
    assert!(address != 0, "driver lacks {name:?}");
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    // SAFETY: F is a function-pointer type matching this symbol's C signature.
    unsafe { std::mem::transmute_copy::<usize, F>(&address) }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str, default: u64| -> Option<u64> {
        match args.iter().position(|a| a == flag) {
            None => Some(default),
            Some(i) => args.get(i + 1)?.parse().ok(),
        }
    };
    let (Some(threads), Some(seconds), Some(max_bytes)) = (
        value("--threads", 16),
        value("--seconds", 3),
        value("--max-bytes", 4 << 20),
    ) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let library = CString::new("libcuda.so.1").expect("no NUL");
    // SAFETY: plain dlopen.
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        eprintln!("mem-stress: cannot dlopen libcuda.so.1");
        return ExitCode::FAILURE;
    }
    let init: unsafe extern "C" fn(c_uint) -> CUresult = function(handle, "cuInit");
    let retain: unsafe extern "C" fn(*mut sys::CUcontext, c_int) -> CUresult =
        function(handle, "cuDevicePrimaryCtxRetain");
    // SAFETY (block): cuda.h contracts; live out-parameters.
    let context = unsafe {
        let mut context: sys::CUcontext = std::ptr::null_mut();
        if init(0) != 0 || retain(&mut context, 0) != 0 {
            eprintln!("mem-stress: driver initialisation failed");
            return ExitCode::FAILURE;
        }
        context as usize
    };
    let alloc: MemAlloc = function(handle, "cuMemAlloc_v2");
    let free: MemFree = function(handle, "cuMemFree_v2");
    let set_current: SetCurrent = function(handle, "cuCtxSetCurrent");
    let granted = AtomicU64::new(0);
    let refused = AtomicU64::new(0);
    let other_errors = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (granted, refused, other_errors) = (&granted, &refused, &other_errors);
            scope.spawn(move || {
                // SAFETY: the context handle came from the driver above.
                unsafe { set_current(context as sys::CUcontext) };
                let mut state =
                    0x9E37_79B9_7F4A_7C15u64 ^ (t << 32) ^ u64::from(std::process::id());
                let mut held: Vec<u64> = Vec::new();
                while Instant::now() < deadline {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let size = 1 + state % max_bytes;
                    let mut pointer = 0u64;
                    // SAFETY: live out-parameter.
                    match unsafe { alloc(&mut pointer, size as usize) } {
                        cuda::CUDA_SUCCESS => {
                            granted.fetch_add(1, Ordering::Relaxed);
                            held.push(pointer);
                        }
                        cuda::CUDA_ERROR_OUT_OF_MEMORY => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            other_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let free_one = held.len() > 3 || (state >> 40).is_multiple_of(3);
                    if let Some(p) = held.pop_if(|_| free_one) {
                        // SAFETY: a pointer this thread allocated.
                        if unsafe { free(p) } != cuda::CUDA_SUCCESS {
                            other_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                for p in held {
                    // SAFETY: pointers this thread allocated.
                    unsafe { free(p) };
                }
            });
        }
    });
    println!(
        "{{\"granted\":{},\"refused\":{},\"other_errors\":{}}}",
        granted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        other_errors.load(Ordering::Relaxed)
    );
    ExitCode::SUCCESS
}
