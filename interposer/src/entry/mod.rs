//! Entry points: the exported wrappers of every hooked driver function
//! ([`exports`], generated from the table's rows), the hook bodies of the
//! launch, capture and synchronisation rows ([`handlers`], which re-exports
//! the memory rows' bodies from [`crate::memory`]), and the two ways a
//! client finds driver functions without linking to them ([`procaddr`]:
//! `dlsym` and `cuGetProcAddress`); which rows skip their handler in this
//! process ([`pass_through`]). Top of the call path: it may use every
//! other group, and no other group uses it.

pub mod exports;
mod handlers;
pub mod pass_through;
mod procaddr;
