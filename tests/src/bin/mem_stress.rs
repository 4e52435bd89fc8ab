//! `mem-stress`: many threads allocating and freeing random sizes through
//! `cuMemAlloc_v2`/`cuMemFree_v2` for a while, counting successes and
//! out-of-memory refusals. Used to check that a shared budget holds under
//! concurrency across processes.

use dilu_abi::cuda::{self, CUresult, sys};
use dilu_tests::driver::{Driver, flag_value};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: mem-stress [--threads N] [--seconds S] [--max-bytes B]";

type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type MemFree = unsafe extern "C" fn(u64) -> CUresult;
type SetCurrent = unsafe extern "C" fn(sys::CUcontext) -> CUresult;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(threads), Some(seconds), Some(max_bytes)) = (
        flag_value(&args, "--threads", 16),
        flag_value(&args, "--seconds", 3),
        flag_value(&args, "--max-bytes", 4 << 20),
    ) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let opened = Driver::open().and_then(|driver| {
        let context = driver.primary_context()? as usize;
        let alloc: MemAlloc = driver.function("cuMemAlloc_v2")?;
        let free: MemFree = driver.function("cuMemFree_v2")?;
        let set_current: SetCurrent = driver.function("cuCtxSetCurrent")?;
        Ok((context, alloc, free, set_current))
    });
    let (context, alloc, free, set_current) = match opened {
        Ok(opened) => opened,
        Err(message) => {
            eprintln!("mem-stress: {message}");
            return ExitCode::FAILURE;
        }
    };
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
