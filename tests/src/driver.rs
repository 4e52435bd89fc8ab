//! Reaching the CUDA driver from a test workload the way cudarc and CuPy
//! do: `dlopen("libcuda.so.1")` and `dlsym` of exact ABI names (answered by
//! the interposer when it is preloaded).

use dilu_abi::cuda::{CUresult, sys};
use std::ffi::{CString, c_int, c_uint, c_void};

/// The driver library, opened with `dlopen`.
pub struct Driver {
    handle: *mut c_void,
}

impl Driver {
    /// Opens `libcuda.so.1`.
    pub fn open() -> Result<Driver, String> {
        let library = CString::new("libcuda.so.1").expect("no NUL");
        // SAFETY: plain dlopen of a library name.
        let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW) };
        if handle.is_null() {
            return Err("cannot dlopen libcuda.so.1".into());
        }
        Ok(Driver { handle })
    }

    /// The entry point `name` as the function-pointer type `F`, which must
    /// be its C signature from cuda.h.
    pub fn function<F: Copy>(&self, name: &str) -> Result<F, String> {
        let c_name = CString::new(name).expect("no NUL");
        // SAFETY: live dlopen handle, NUL-terminated name.
        let address = unsafe { libc::dlsym(self.handle, c_name.as_ptr()) } as usize;
        if address == 0 {
            return Err(format!("driver lacks {name}"));
        }
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is a function-pointer type matching this symbol's C
        // signature (the caller's contract).
        Ok(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
    }

    /// `cuInit`, then device 0's primary context made current; returns it.
    pub fn primary_context(&self) -> Result<sys::CUcontext, String> {
        self.primary_context_of(0)
    }

    /// `cuInit`, then device `device`'s primary context made current;
    /// returns it.
    pub fn primary_context_of(&self, device: c_int) -> Result<sys::CUcontext, String> {
        let init: unsafe extern "C" fn(c_uint) -> CUresult = self.function("cuInit")?;
        let retain: unsafe extern "C" fn(*mut sys::CUcontext, c_int) -> CUresult =
            self.function("cuDevicePrimaryCtxRetain")?;
        let set_current: unsafe extern "C" fn(sys::CUcontext) -> CUresult =
            self.function("cuCtxSetCurrent")?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: cuda.h contracts; live out-parameter.
        if unsafe { init(0) != 0 || retain(&mut context, device) != 0 || set_current(context) != 0 }
        {
            return Err("driver initialisation failed".into());
        }
        Ok(context)
    }
}

/// The number after `flag` in `args`, or `default` when the flag is absent;
/// `None` when it is present without a number.
pub fn flag_value(args: &[String], flag: &str, default: u64) -> Option<u64> {
    match args.iter().position(|a| a == flag) {
        None => Some(default),
        Some(i) => args.get(i + 1)?.parse().ok(),
    }
}
