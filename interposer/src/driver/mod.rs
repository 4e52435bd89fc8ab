//! Reaching the real driver.
//!
//! - The real `dlsym` is found with `dlvsym(RTLD_NEXT, "dlsym", ...)`: our
//!   own exported `dlsym` would otherwise answer (and `libc::dlsym` or
//!   `libloading` bind to it too). That lookup allocates nothing and takes no
//!   lock of ours, so it is safe before initialisation and re-entrantly.
//! - The real driver is `dlopen`ed lazily, once, on the first hooked call or
//!   driver-symbol lookup (`DILU_REAL_LIBCUDA`, default `libcuda.so.1`; glibc
//!   returns the already-loaded object when the program opened it first), and
//!   every function of the typed table [`REAL`] (hooked or called by us, its
//!   types generated from NVIDIA's headers) is resolved with the real `dlsym`
//!   *on that handle* (never `RTLD_DEFAULT`/`RTLD_NEXT`, which would find our
//!   own exports). A call site reads its function with [`resolved`].

// Also: which device a call is about (`devices`) and the real NVML (`nvml`,
// its function types generated from nvml.h in `nvml_api`).
pub mod devices;
pub mod nvml;
mod nvml_api;
mod nvml_types;

use core::ffi::{CStr, c_char, c_void};
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicI32, AtomicU8, AtomicUsize, Ordering};

use crate::table::{NAMES, REAL, RealFn};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Address of the real `dlsym` (0 if it cannot be found). Resolves on first
/// use; racing first uses resolve the same value. Also called from the
/// `dlsym` trampoline, hence `extern "C"` and no panics.
pub extern "C" fn real_dlsym_addr() -> usize {
    let p = REAL_DLSYM.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    let mut found = core::ptr::null_mut();
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: both strings are NUL-terminated literals; `dlvsym` with
        // RTLD_NEXT only reads them and returns a symbol address or null.
        found = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            break;
        }
    }
    let p = found as usize;
    REAL_DLSYM.store(p, Ordering::Relaxed);
    p
}

/// The real `dlsym(handle, name)`; null if the real `dlsym` is unavailable.
pub fn real_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let p = real_dlsym_addr();
    if p == 0 {
        return core::ptr::null_mut();
    }
    // SAFETY: `p` is glibc's `dlsym`, whose C signature is `DlsymFn`. (A
    // libc function, not the driver's, so not in the generated table; it
    // stays an address because the `dlsym` trampoline needs one.)
    let f: DlsymFn = unsafe { core::mem::transmute::<usize, DlsymFn>(p) };
    // SAFETY: same contract as `dlsym` itself; arguments come from our caller.
    unsafe { f(handle, name) }
}

const UNINIT: u8 = 0;
const LOADING: u8 = 1;
const READY: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static LOADER_TID: AtomicI32 = AtomicI32::new(0);

/// The real function of `slot` (a field of [`REAL`]), loading the driver on
/// first use; `None` when the driver lacks it (or cannot be loaded). Hot
/// path: one load and a test, as the slot's address was before it was typed.
#[inline(always)]
pub fn resolved<F: Copy>(slot: &RealFn<F>) -> Option<F> {
    match slot.get() {
        Some(function) => Some(function),
        None => resolved_slow(slot),
    }
}

#[cold]
#[inline(never)]
fn resolved_slow<F: Copy>(slot: &RealFn<F>) -> Option<F> {
    ensure_loaded();
    slot.get()
}

/// Loads the real driver once. Returns `true` when the slots are final;
/// `false` only for a re-entrant call made by the loading thread itself (e.g.
/// from the driver's own constructors), which must not wait for itself.
pub fn ensure_loaded() -> bool {
    if STATE.load(Ordering::Acquire) == READY {
        return true;
    }
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    match STATE.compare_exchange(UNINIT, LOADING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            LOADER_TID.store(me, Ordering::Relaxed);
            if catch_unwind(load).is_err() {
                eprintln!("dilu-interposer: panic while loading the real driver");
            }
            STATE.store(READY, Ordering::Release);
            true
        }
        Err(READY) => true,
        Err(_) => {
            if LOADER_TID.load(Ordering::Relaxed) == me {
                return false;
            }
            while STATE.load(Ordering::Acquire) != READY {
                std::thread::yield_now();
            }
            true
        }
    }
}

/// In a forked child: a load that another thread of the parent had under
/// way at the fork will never finish here (that thread does not exist in
/// the child), so the next use starts it afresh instead of waiting forever.
pub fn restart_interrupted_load() {
    let _ = STATE.compare_exchange(LOADING, UNINIT, Ordering::AcqRel, Ordering::Relaxed);
}

/// `dlopen`s `path`, returning the handle or the `dlerror` text.
fn open(path: &CStr) -> Result<*mut c_void, String> {
    // SAFETY: `path` is NUL-terminated; dlopen has no other preconditions.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if !handle.is_null() {
        return Ok(handle);
    }
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let err = unsafe { libc::dlerror() };
    Err(if err.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: a non-null dlerror result is a valid C string (see above).
        unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned()
    })
}

fn load() {
    let cfg = crate::config::get();
    // Default: the soname cudart uses, then the development name (some
    // installs, and simulated drivers, only provide that one).
    let candidates: &[&CStr] = match cfg.real_libcuda.as_deref() {
        Some(p) => &[p],
        None => &[c"libcuda.so.1", c"libcuda.so"],
    };
    let mut errors = Vec::new();
    let mut opened = None;
    for &path in candidates {
        match open(path) {
            Ok(h) => {
                opened = Some((path, h));
                break;
            }
            Err(e) => errors.push(e),
        }
    }
    let Some((path, handle)) = opened else {
        eprintln!(
            "dilu-interposer: cannot load the real CUDA driver (set DILU_REAL_LIBCUDA to its path): {}",
            errors.join("; ")
        );
        return;
    };
    // SAFETY: the real `dlsym` on the real driver's handle returns that
    // driver's function of exactly the name asked for, whose type is the
    // one cudaTypedefs.h gives it (the table's field type), or null.
    let found = unsafe { REAL.resolve(|name| real_dlsym(handle, name.as_ptr()) as usize) };
    tracing::debug!(
        driver = ?path,
        found,
        hooked = NAMES.len(),
        "real driver loaded"
    );
}
