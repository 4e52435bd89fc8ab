//! The hook table, below everything that uses it: which driver functions
//! are hooked (the one list, `rows.rs`), their ids and C names (generated
//! here by `ids.rs`), the C type of every real driver function the
//! interposer hooks or calls and the one typed table of their real
//! addresses, [`REAL`] (`driver_api.rs`, generated from NVIDIA's headers by
//! `scripts/gen-driver-types.py`), the call context every handler receives
//! ([`Cx`]), what it hands back ([`Outcome`]) and panic containment at the
//! FFI edge ([`ffi`]). The exported
//! wrappers are generated from the same rows in [`crate::entry::exports`],
//! the only place that knows the handlers.

mod driver_api;
pub mod ffi;
mod ids;
mod outcome;
mod real;
mod rows;

pub use driver_api::*;
use ids::hook_ids;
pub use outcome::{AfterHook, Around, Launch, Outcome};
pub use real::RealFn;
pub(crate) use rows::hooked_functions;

hooked_functions!(hook_ids);

/// Call context handed to every handler.
#[derive(Clone, Copy, Debug)]
pub struct Cx {
    /// Which ABI name was called.
    pub hook: HookId,
    /// True for the `_ptsz`/`_ptds` variant (per-thread default stream
    /// semantics for stream handle 0).
    pub per_thread: bool,
}

impl Cx {
    /// The exported C name of the called function.
    pub fn name(&self) -> &'static core::ffi::CStr {
        NAMES[self.hook as usize]
    }
}

/// One hooked ABI name.
pub struct Row {
    /// The exact exported C name.
    pub name: &'static core::ffi::CStr,
    /// Address of our exported wrapper for it.
    pub wrapper: *const (),
    /// Whether this is the per-thread-default-stream variant.
    pub per_thread: bool,
}

// SAFETY: a `Row` is immutable static data; `wrapper` is the address of code,
// never dereferenced as data, so sharing it across threads is sound.
unsafe impl Sync for Row {}

impl Row {
    pub fn wrapper_addr(&self) -> usize {
        self.wrapper as usize
    }
}

/// `&CStr` from a literal built with `concat!(..., "\0")`, at compile time.
pub const fn cstr(s: &'static str) -> &'static core::ffi::CStr {
    match core::ffi::CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("hook table name must be NUL-terminated without interior NUL"),
    }
}
