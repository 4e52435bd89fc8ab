//! The `hook_table!` macro: turns the one declarative list of hooked driver
//! functions (see `hooks.rs`) into everything interception needs.
//!
//! Row syntax (one row per hooked function, per-thread-stream variant
//! optional):
//!
//! ```text
//! handler_path => fn AbiName [/ AbiName_ptsz] (arg: CType, ...);
//! ```
//!
//! For every ABI name of every row the macro generates:
//! - a variant of [`HookId`] (the row's index into the arrays below);
//! - an exported `#[unsafe(no_mangle)] extern "C"` wrapper with the exact C
//!   signature, which counts the call, loads the real driver pointer from its
//!   slot and calls `handler(cx, next, args...)` under `catch_unwind`;
//! - a slot in [`REAL`]: the real driver's function for that ABI name,
//!   resolved once with the real `dlsym` on the real libcuda handle;
//! - an entry in [`ROWS`]: the C name and the wrapper's address, used by the
//!   `dlsym` override (name -> wrapper) and by the `cuGetProcAddress`
//!   wrappers (real pointer -> wrapper).
//!
//! The per-thread variant reuses the row's handler and signature; the handler
//! sees `cx.per_thread == true`.
//!
//! A handler has the shape
//! `fn(cx: Cx, next: impl FnOnce(args...) -> CUresult, args...) -> CUresult`;
//! `next` calls the real driver function (it may be called with adjusted
//! arguments, or not at all to refuse the call).

macro_rules! hook_table {
    ( $( $handler:path => fn $name:ident $( / $ptsz:ident )? ( $( $arg:ident : $ty:ty ),* $(,)? ); )* ) => {
        /// Index of one hooked ABI name (a table row or its per-thread variant).
        #[allow(non_camel_case_types, clippy::enum_variant_names)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum HookId {
            $( $name, $( $ptsz, )? )*
        }

        /// Number of hooked ABI names.
        pub const HOOK_COUNT: usize = [$( stringify!($name), $( stringify!($ptsz), )? )*].len();

        /// Real driver function per ABI name (0 = not resolved / absent).
        pub static REAL: [::core::sync::atomic::AtomicUsize; HOOK_COUNT] =
            [const { ::core::sync::atomic::AtomicUsize::new(0) }; HOOK_COUNT];

        /// Static description of every hooked ABI name, indexed by [`HookId`].
        pub static ROWS: [$crate::table::Row; HOOK_COUNT] = [
            $(
                $crate::table::Row {
                    name: $crate::table::cstr(concat!(stringify!($name), "\0")),
                    wrapper: $name as *const (),
                    per_thread: false,
                },
                $(
                    $crate::table::Row {
                        name: $crate::table::cstr(concat!(stringify!($ptsz), "\0")),
                        wrapper: $ptsz as *const (),
                        per_thread: true,
                    },
                )?
            )*
        ];

        $( hook_table!(@row $handler, $name, [ $( $ptsz )? ], ( $( $arg : $ty ),* )); )*
    };

    (@row $handler:path, $name:ident, [], $args:tt) => {
        hook_table!(@wrapper $handler, $name, false, $args);
    };
    (@row $handler:path, $name:ident, [ $ptsz:ident ], $args:tt) => {
        hook_table!(@wrapper $handler, $name, false, $args);
        hook_table!(@wrapper $handler, $ptsz, true, $args);
    };

    (@wrapper $handler:path, $name:ident, $per_thread:expr, ( $( $arg:ident : $ty:ty ),* )) => {
        #[doc = concat!(
            "Exported interposer for the driver's `", stringify!($name), "`.\n\n",
            "# Safety\n\nC ABI entry point; the caller's obligations are those of the ",
            "driver function of the same name in `cuda.h`."
        )]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name( $( $arg : $ty ),* ) -> $crate::CUresult {
            type Real = unsafe extern "C" fn( $( $ty ),* ) -> $crate::CUresult;
            const ID: HookId = HookId::$name;
            $crate::stats::count_call(ID as usize);
            let p = $crate::driver::real_fn(&REAL[ID as usize]);
            if p == 0 {
                return ::dilu_abi::cuda::CUDA_ERROR_NOT_FOUND;
            }
            // SAFETY: `p` is non-null and was returned by the real `dlsym` on
            // the real driver for exactly this ABI name, whose C signature is
            // the one written in this table row (from cuda.h).
            let real: Real = unsafe { ::core::mem::transmute::<usize, Real>(p) };
            let done = ::core::cell::Cell::new(None);
            let next = | $( $arg : $ty ),* | -> $crate::CUresult {
                // SAFETY: forwards the C caller's arguments (or a handler's
                // adjustment of them) to the real function of the same ABI.
                let r = unsafe { real( $( $arg ),* ) };
                done.set(Some(r));
                r
            };
            let cx = $crate::table::Cx { hook: ID, per_thread: $per_thread };
            $crate::ffi::entry(
                Some(cx),
                &done,
                || $handler(cx, next, $( $arg ),* ),
                // SAFETY: as above; only reached when the handler panicked
                // before calling the real function.
                || unsafe { real( $( $arg ),* ) },
            )
        }
    };
}

pub(crate) use hook_table;

/// Call context handed to every handler.
#[derive(Clone, Copy, Debug)]
pub struct Cx {
    /// Which ABI name was called.
    pub hook: crate::hooks::HookId,
    /// True for the `_ptsz`/`_ptds` variant (per-thread default stream
    /// semantics for stream handle 0).
    pub per_thread: bool,
}

impl Cx {
    /// The exported C name of the called function.
    pub fn name(&self) -> &'static core::ffi::CStr {
        crate::hooks::ROWS[self.hook as usize].name
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
