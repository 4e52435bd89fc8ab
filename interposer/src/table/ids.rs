//! `hook_ids!`: what the layers below the exported wrappers need of the
//! hook table (see `rows.rs`), for every ABI name of every row:
//! - a variant of [`HookId`](crate::table::HookId) (the name's index);
//! - its C name in [`NAMES`](crate::table::NAMES);
//! - the address of its slot in [`REAL`](crate::table::REAL) (the typed
//!   table generated from the headers, `driver_api.rs`), by index, for the
//!   `cuGetProcAddress` answers.
//!
//! Handlers and C types are ignored here; the wrappers are generated from
//! the same rows in `entry/exports.rs`.

macro_rules! hook_ids {
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

        /// The exact exported C name of every hooked ABI name, indexed by
        /// [`HookId`].
        pub static NAMES: [&::core::ffi::CStr; HOOK_COUNT] = [
            $(
                $crate::table::cstr(concat!(stringify!($name), "\0")),
                $( $crate::table::cstr(concat!(stringify!($ptsz), "\0")), )?
            )*
        ];

        /// The real driver's address for every hooked ABI name, indexed by
        /// [`HookId`] (0 = not resolved / absent).
        pub fn real_address(id: usize) -> usize {
            static ADDRESS: [fn() -> usize; HOOK_COUNT] = [
                $(
                    || $crate::table::REAL.$name.address(),
                    $( || $crate::table::REAL.$ptsz.address(), )?
                )*
            ];
            ADDRESS[id]()
        }
    };
}

pub(crate) use hook_ids;
