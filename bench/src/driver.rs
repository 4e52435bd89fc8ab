//! Reaching a CUDA driver library (simgpu, the real `libcuda.so.1`, or the
//! interposer's exports) from a benchmark, without linking to it.
//!
//! The overhead benchmark opens both simgpu and the interposer `RTLD_LOCAL`
//! in one process and takes the same ABI name from each: the driver's export
//! is "direct", the interposer's wrapper (which forwards to that same driver,
//! `DILU_REAL_LIBCUDA`) is "through dilu". The small client programs in
//! `src/bin/` open the driver by path the way cudart does, so under
//! `LD_PRELOAD` their `dlsym` answers are the interposer's wrappers.

use dilu_abi::cuda::{CUDA_SUCCESS, CUresult};
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

pub type Init = unsafe extern "C" fn(c_uint) -> CUresult;
pub type PrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
pub type CtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> CUresult;
pub type ModuleLoadData = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CUresult;
pub type ModuleGetFunction =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> CUresult;
pub type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
pub type CtxSynchronize = unsafe extern "C" fn() -> CUresult;
pub type MemFree = unsafe extern "C" fn(u64) -> CUresult;
pub type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
pub type GetProcAddress =
    unsafe extern "C" fn(*const i8, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
pub type LaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// A parameterless kernel that does nothing.
pub const NOOP_PTX: &str =
    ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n";

pub use dilu_harness::workspace::profile_dir;

/// A build artifact of the profile directory, failing with what to build.
pub fn artifact(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (scripts/bench.sh does: cargo build --release -p simgpu -p dilu-interposer)",
        path.display()
    );
    path
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the
/// machine, so a parent's and a child's readings can be subtracted.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a live local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// CPU time the calling thread has used. Unlike the wall clock it does not
/// count time the thread waited for a core, which on a shared machine is
/// most of the noise.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a live local.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    std::time::Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// A `dlopen`ed library.
pub struct Library(*mut c_void);

// SAFETY: a dlopen handle is a process-wide token; dlsym on it is thread-safe.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

impl Library {
    /// Opens `path` `RTLD_NOW | RTLD_LOCAL`: the interposer's exported
    /// `dlsym` then does not replace the process's own.
    pub fn open(path: &Path) -> Result<Library, String> {
        let name = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{} contains NUL", path.display()))?;
        // SAFETY: dlopen of a NUL-terminated path.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
            let error = unsafe { libc::dlerror() };
            let why = if error.is_null() {
                "unknown error".to_string()
            } else {
                // SAFETY: non-null dlerror text is a valid C string.
                unsafe { std::ffi::CStr::from_ptr(error) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("cannot load {}: {why}", path.display()));
        }
        Ok(Library(handle))
    }

    /// The function `name`, typed as `F` (a `cuda.h` function-pointer type).
    pub fn get<F: Copy>(&self, name: &str) -> F {
        let symbol = CString::new(name).expect("no NUL");
        // SAFETY: live handle, NUL-terminated name.
        let address = unsafe { libc::dlsym(self.0, symbol.as_ptr()) } as usize;
        assert!(address != 0, "the library has no {name}");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: callers name F as the cuda.h signature of `name`.
        unsafe { std::mem::transmute_copy::<usize, F>(&address) }
    }
}

impl Library {
    /// The function `name` as the library itself defines it, looked up with
    /// the C library's own `dlsym`: under the interposer the plain `dlsym`
    /// answers with its wrapper, this with the function it wraps. `None`
    /// when the C library's `dlsym` cannot be found.
    pub fn get_unwrapped<F: Copy>(&self, name: &str) -> Option<F> {
        type Dlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
        // SAFETY: dlopen with RTLD_NOLOAD only returns a handle to the C
        // library already loaded (or null); dlvsym reads NUL-terminated
        // literals. Neither is hooked by the interposer.
        let libc_dlsym = unsafe {
            let libc = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if libc.is_null() {
                return None;
            }
            [c"GLIBC_2.34", c"GLIBC_2.2.5"]
                .iter()
                .map(|version| libc::dlvsym(libc, c"dlsym".as_ptr(), version.as_ptr()))
                .find(|found| !found.is_null())?
        };
        // SAFETY: glibc's dlsym, whose C signature is `Dlsym`.
        let libc_dlsym: Dlsym = unsafe { std::mem::transmute::<*mut c_void, Dlsym>(libc_dlsym) };
        let symbol = CString::new(name).expect("no NUL");
        // SAFETY: live handle, NUL-terminated name.
        let address = unsafe { libc_dlsym(self.0, symbol.as_ptr()) } as usize;
        if address == 0 {
            return None;
        }
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: callers name F as the cuda.h signature of `name`.
        Some(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
    }
}

fn check(what: &str, result: CUresult) -> Result<(), String> {
    if result == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed with CUresult {result}"))
    }
}

/// `cuInit`, then the primary context of device 0 made current.
pub fn init_context(driver: &Library) -> Result<(), String> {
    let mut context = std::ptr::null_mut();
    // SAFETY: cuda.h contracts; the out-parameter is a live local.
    unsafe {
        check("cuInit", driver.get::<Init>("cuInit")(0))?;
        check(
            "cuDevicePrimaryCtxRetain",
            driver.get::<PrimaryCtxRetain>("cuDevicePrimaryCtxRetain")(&mut context, 0),
        )?;
        check(
            "cuCtxSetCurrent",
            driver.get::<CtxSetCurrent>("cuCtxSetCurrent")(context),
        )
    }
}

/// Loads [`NOOP_PTX`] in the current context and returns the `noop`
/// function handle (as an address, so it can cross threads).
pub fn load_noop(driver: &Library) -> Result<usize, String> {
    let ptx = CString::new(NOOP_PTX).expect("no NUL");
    let name = CString::new("noop").expect("no NUL");
    let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: cuda.h contracts; NUL-terminated PTX and name, live out-parameters.
    unsafe {
        check(
            "cuModuleLoadData",
            driver.get::<ModuleLoadData>("cuModuleLoadData")(&mut module, ptx.as_ptr().cast()),
        )?;
        check(
            "cuModuleGetFunction",
            driver.get::<ModuleGetFunction>("cuModuleGetFunction")(
                &mut function,
                module,
                name.as_ptr(),
            ),
        )?;
    }
    Ok(function as usize)
}

/// One 1×1 launch of the parameterless `noop` kernel on the null stream.
#[inline]
pub fn launch_noop(launch: LaunchKernel, function: usize) -> CUresult {
    // SAFETY: a function handle from cuModuleGetFunction, the null stream and
    // no parameters, as `noop` takes none.
    unsafe {
        launch(
            function as *mut c_void,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

/// `cuMemAlloc_v2` of `bytes` then `cuMemFree_v2`, through one library.
#[inline]
pub fn alloc_free(alloc: MemAlloc, free: MemFree, bytes: usize) -> CUresult {
    let mut pointer = 0u64;
    // SAFETY: cuda.h contracts with a live out-parameter; the pointer freed is
    // the one just allocated.
    unsafe {
        let result = alloc(&mut pointer, bytes);
        if result != CUDA_SUCCESS {
            return result;
        }
        free(pointer)
    }
}
