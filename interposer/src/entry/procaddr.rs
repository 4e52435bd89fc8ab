//! The two ways a CUDA client finds driver functions without linking to
//! them: `dlsym` on the libcuda handle, and `cuGetProcAddress`/`_v2` (which
//! is how cudart reaches everything after one `dlsym`). Both answers are
//! rewritten here so the pointers a client holds are our wrappers.

use core::cell::Cell;
use core::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use dilu_abi::cuda::{
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CUDA_ERROR_NOT_FOUND, CUDA_SUCCESS, CUresult,
};

use crate::driver;
use crate::entry::exports::ROWS;
use crate::table::{PFN_cuGetProcAddress, PFN_cuGetProcAddress_v2, REAL, ffi, real_address};
use crate::telemetry::stats;

/// First CUDA version whose `cuGetProcAddress` is the `_v2` ABI.
const GPA_V2_SINCE: c_int = 12000;

// Our own functions handed out as addresses: a cast to the typedef's type,
// then to an integer (no transmute).
fn our_gpa_v1() -> usize {
    cuGetProcAddress as PFN_cuGetProcAddress as usize
}

fn our_gpa_v2() -> usize {
    cuGetProcAddress_v2 as PFN_cuGetProcAddress_v2 as usize
}

fn is_gpa_name(name: &[u8]) -> bool {
    name == b"cuGetProcAddress" || name == b"cuGetProcAddress_v2"
}

/// Our replacement for a successful `cuGetProcAddress` answer `p`, if any.
///
/// - `"cuGetProcAddress"` itself: our wrapper with the same ABI as `p`
///   (matched against the real exports, else by the requested version).
/// - `p` is the real function of a table row: that row's wrapper. Matching
///   by pointer works for every version and flags value without version
///   tables; if two rows share one real function, the row whose stream
///   variant matches `flags` wins.
fn replacement(symbol: &[u8], p: usize, version: c_int, flags: u64) -> Option<usize> {
    if p == 0 {
        return None;
    }
    if is_gpa_name(symbol) {
        let v2 = if p == REAL.cuGetProcAddress_v2.address() {
            true
        } else if p == REAL.cuGetProcAddress.address() {
            false
        } else {
            version >= GPA_V2_SINCE
        };
        return Some(if v2 { our_gpa_v2() } else { our_gpa_v1() });
    }
    let want_per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let mut best = None;
    for (id, row) in ROWS.iter().enumerate() {
        if real_address(id) == p {
            if row.per_thread == want_per_thread {
                return Some(row.wrapper_addr());
            }
            best.get_or_insert(row.wrapper_addr());
        }
    }
    best
}

/// Post-processes a real `cuGetProcAddress*` result in place.
///
/// # Safety
/// `symbol` is null or a C string and `pfn` is null or writable, as the
/// caller of `cuGetProcAddress` promised the driver.
unsafe fn rewrite_answer(
    ret: CUresult,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) {
    let mut wrapped = false;
    if ret == CUDA_SUCCESS && !symbol.is_null() && !pfn.is_null() {
        // SAFETY: caller guarantees `symbol` is a C string (non-null here).
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        // SAFETY: `pfn` is non-null and the driver just wrote it.
        let p = unsafe { *pfn } as usize;
        if let Some(w) = replacement(name, p, version, flags) {
            // SAFETY: as above, `pfn` is writable.
            unsafe { *pfn = w as *mut c_void };
            wrapped = true;
        }
        if tracing::enabled!(tracing::Level::TRACE) {
            tracing::trace!(
                symbol = %String::from_utf8_lossy(name),
                version,
                flags,
                wrapped,
                "cuGetProcAddress"
            );
        }
    }
    stats::count_lookup(flags, wrapped);
}

/// Exported `cuGetProcAddress` (pre-12.0 ABI, no `symbolStatus`).
///
/// # Safety
/// Same contract as the driver's `cuGetProcAddress`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    REAL.cuGetProcAddress.same_signature(cuGetProcAddress);
    let Some(real) = driver::resolved(&REAL.cuGetProcAddress) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let done = Cell::new(None);
    ffi::entry_or_fall_through(
        None,
        &done,
        || {
            // SAFETY: forwards the caller's arguments unchanged.
            let ret = unsafe { real(symbol, pfn, version, flags) };
            done.set(Some(ret));
            // SAFETY: the caller's `symbol`/`pfn` obligations hold (see above).
            unsafe { rewrite_answer(ret, symbol, pfn, version, flags) };
            ret
        },
        // SAFETY: as above; only reached if we panicked before the real call.
        || unsafe { real(symbol, pfn, version, flags) },
    )
}

/// Exported `cuGetProcAddress_v2` (12.0+ ABI, with `symbolStatus`).
///
/// # Safety
/// Same contract as the driver's `cuGetProcAddress_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_uint,
) -> CUresult {
    REAL.cuGetProcAddress_v2.same_signature(cuGetProcAddress_v2);
    let Some(real) = driver::resolved(&REAL.cuGetProcAddress_v2) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    let done = Cell::new(None);
    ffi::entry_or_fall_through(
        None,
        &done,
        || {
            // SAFETY: forwards the caller's arguments unchanged; `status` is
            // written only by the driver.
            let ret = unsafe { real(symbol, pfn, version, flags, status) };
            done.set(Some(ret));
            // SAFETY: the caller's `symbol`/`pfn` obligations hold (see above).
            unsafe { rewrite_answer(ret, symbol, pfn, version, flags) };
            ret
        },
        // SAFETY: as above; only reached if we panicked before the real call.
        || unsafe { real(symbol, pfn, version, flags, status) },
    )
}

/// Our wrapper for an exact exported name, if it is one we answer for
/// (driver rows, or NVML's; see [`crate::memory::nvml`]). Table rows the real
/// driver lacks are not wrapped.
fn wrapper_for_name(name: &[u8]) -> Option<usize> {
    if name.starts_with(b"nvml") {
        return crate::memory::nvml::wrapper_for_name(name);
    }
    if !name.starts_with(b"cu") {
        return None;
    }
    if name == b"cuGetProcAddress" {
        return Some(our_gpa_v1());
    }
    if name == b"cuGetProcAddress_v2" {
        return Some(our_gpa_v2());
    }
    let i = ROWS.iter().position(|r| r.name.to_bytes() == name)?;
    // While the loading thread itself is inside `dlopen` of the driver the
    // slots are not final: wrap (the wrapper re-checks on call).
    if driver::ensure_loaded() && real_address(i) == 0 {
        return None;
    }
    Some(ROWS[i].wrapper_addr())
}

/// The `dlsym` override's body (entered from the exported `dlsym` symbol).
extern "C" fn dlsym_impl(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let real = driver::real_dlsym(handle, symbol);
    if real.is_null() || symbol.is_null() {
        return real;
    }
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `symbol` is non-null and, per dlsym's contract, a C string
        // (the real dlsym just read it).
        let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
        match wrapper_for_name(name) {
            Some(w) => {
                stats::count_dlsym_wrapped();
                tracing::debug!(symbol = %String::from_utf8_lossy(name), "dlsym wrapped");
                w as *mut c_void
            }
            None => real,
        }
    }))
    .unwrap_or(real)
}

// The exported `dlsym`. glibc's `dlsym(RTLD_NEXT, ...)` searches after the
// object that *called* it (found from the return address), so a request with
// RTLD_NEXT must reach the real `dlsym` by a tail jump that keeps the
// client's return address; anything else goes to `dlsym_impl`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
/// Exported `dlsym` override.
///
/// # Safety
/// Same contract as libc's `dlsym`.
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "jne {imp}",
        // RTLD_NEXT: keep args, resolve the real dlsym, tail-jump to it.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz {imp}",
        "jmp rax",
        imp = sym dlsym_impl,
        resolve = sym driver::real_dlsym_addr,
    )
}

/// Exported `dlsym` override (portable form: `RTLD_NEXT` requests are
/// resolved relative to this library rather than the caller).
///
/// # Safety
/// Same contract as libc's `dlsym`.
#[cfg(not(target_arch = "x86_64"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    dlsym_impl(handle, symbol)
}
