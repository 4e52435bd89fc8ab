//! The exported driver entry points. Each `export!` line declares one
//! `extern "C"` function (and, after `|`, its per-thread-default-stream
//! twin) whose body runs an internal `fn(per_thread: bool, args..) -> Res`
//! under [`crate::guard`].

macro_rules! export {
    ($( fn $name:ident $params:tt $(| $ptname:ident)? => $imp:ident; )*) => {
        $(
            export!(@one $name, false, $params, $imp);
            $( export!(@one $ptname, true, $params, $imp); )?
        )*
    };
    (@one $name:ident, $pt:expr, ($($a:ident : $t:ty),* $(,)?), $imp:ident) => {
        #[unsafe(no_mangle)]
        #[allow(non_snake_case)]
        pub extern "C" fn $name($($a: $t),*) -> dilu_abi::cuda::CUresult {
            crate::guard(stringify!($name), || $imp($pt, $($a),*))
        }
    };
}

pub mod device;
pub mod graph_mem;
pub mod ipc;
pub mod ipc_event;
pub mod library;
pub mod managed;
pub mod mem;
pub mod misc;
pub mod module;
pub mod pointer;
pub mod stream;
pub mod tensor_map;
pub mod vmm;

pub use device::*;
pub use graph_mem::*;
pub use ipc::*;
pub use ipc_event::*;
pub use library::*;
pub use managed::*;
pub use mem::*;
pub use misc::*;
pub use module::*;
pub use pointer::*;
pub use stream::*;
pub use tensor_map::*;
pub use vmm::*;

use crate::Res;
use dilu_abi::cuda::*;
use std::ffi::{CStr, c_char};

/// Writes an output parameter; a null pointer is CUDA_ERROR_INVALID_VALUE.
pub(crate) fn out<T>(p: *mut T, v: T) -> Res {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the CUDA contract makes `p` a valid, writable, aligned pointer
    // to a T when it is not null (checked above).
    unsafe { p.write(v) };
    Ok(())
}

/// Reads a NUL-terminated string argument.
pub(crate) fn cstr<'a>(p: *const c_char) -> Res<&'a CStr> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the CUDA contract makes a non-null `p` a NUL-terminated string
    // that outlives the call.
    Ok(unsafe { CStr::from_ptr(p) })
}

/// Reads an input struct.
pub(crate) fn read<T: Copy>(p: *const T) -> Res<T> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the CUDA contract makes a non-null `p` point to a valid T.
    Ok(unsafe { p.read_unaligned() })
}
