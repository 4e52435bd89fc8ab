//! Fork safety of the interposer's process-local state.
//!
//! A process forked from a CUDA program (a data-loader worker, a launcher's
//! worker) is a new member of the tenant: single-threaded, holding none of
//! its parent's allocations. `pthread_atfork` handlers, installed once when
//! the memory budget starts, make the interposer see it that way:
//!
//! - **prepare** (in the forking thread, before the fork): takes every lock
//!   of ours that a hook may hold, in the order the hooks take them (graph
//!   registry, join lock, the charge table's overflow map), so no other
//!   thread is inside one at the instant of the fork and the child never
//!   inherits a lock owned by a thread that does not exist there;
//! - **parent** (after): releases them;
//! - **child**: releases them and forgets the parent's state: its ledger slot
//!   (the child joins with its own on first use), its watcher thread, its
//!   context charges, the entries of its charge table (a free of an
//!   inherited pointer refunds nothing) and its graph records; a driver load
//!   the fork interrupted is started afresh instead of waited for.
//!
//! The hot path takes no lock, so threads busy allocating never delay a
//! fork. The handlers never load libraries, register handlers or wait for
//! anything but those short critical sections (on older glibc, prepare
//! handlers run under glibc's own atfork lock).

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::driver;
use crate::memory::alloc_table::Overflow;
use crate::memory::{budget, graph_memory};

/// Locks held from prepare to parent/child. Fields drop in declaration
/// order, the reverse of the order they are taken.
struct Held {
    _overflow: Option<MutexGuard<'static, Overflow>>,
    _join: MutexGuard<'static, ()>,
    graphs: MutexGuard<'static, graph_memory::Registry>,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Registers the handlers (once per process).
pub fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: plain extern "C" functions that catch every panic.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

extern "C" fn prepare() {
    let _ = catch_unwind(|| {
        let graphs = graph_memory::lock_for_fork();
        let join = budget::lock_join_for_fork();
        let overflow = budget::existing().map(|b| b.charges.lock_overflow());
        let held = Held {
            _overflow: overflow,
            _join: join,
            graphs,
        };
        HELD.with(|h| *h.borrow_mut() = Some(held));
    });
}

extern "C" fn parent() {
    let _ = catch_unwind(|| HELD.with(|h| h.borrow_mut().take()));
}

extern "C" fn child() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(mut held) = HELD.with(|h| h.borrow_mut().take()) {
            held.graphs.forget_all();
        }
        budget::forget_parent_state_in_child();
        crate::sm_time::sampler::forget_parent_state_in_child();
        crate::sm_time::usage_feedback::forget_parent_state_in_child();
        driver::restart_interrupted_load();
    }));
}
