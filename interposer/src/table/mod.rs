//! The hook table, below everything that uses it: which driver functions
//! are hooked (the one list, `rows.rs`), their ids, C names and real-driver
//! slots (generated here by `ids.rs`), the call context every handler
//! receives ([`Cx`]) and panic containment at the FFI edge ([`ffi`]). The
//! exported wrappers are generated from the same rows in
//! [`crate::entry::exports`], the only place that knows the handlers.

pub mod ffi;
mod ids;
mod rows;

use ids::hook_ids;
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
