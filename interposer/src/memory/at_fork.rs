//! The memory budget's part in fork safety (see [`crate::fork`]): the locks
//! a hook may hold are taken before a fork and released after it, and a
//! forked child forgets its parent's allocations, ledger slot and graphs.
//! Registered when the library loads in a process whose configuration gives
//! it a budget (the budget itself starts on first use).

use std::cell::RefCell;
use std::sync::MutexGuard;

use crate::fork::{self, Handlers, Part};
use crate::memory::alloc_table::Overflow;
use crate::memory::{budget, driver_reserved, graph_memory};

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

/// Takes part in every fork from now on when this process has a memory
/// budget to keep (idempotent).
pub fn register_when_budgeted() {
    if !budget::configured() {
        return;
    }
    fork::register(
        Part::Memory,
        Handlers {
            prepare,
            parent,
            child,
        },
    );
}

/// Takes the locks in the order the hooks take them: graph registry, join
/// lock, the charge table's overflow map.
fn prepare() {
    let graphs = graph_memory::lock_for_fork();
    let join = budget::lock_join_for_fork();
    let overflow = budget::existing().map(|b| b.charges.lock_overflow());
    let held = Held {
        _overflow: overflow,
        _join: join,
        graphs,
    };
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

fn parent() {
    HELD.with(|h| h.borrow_mut().take());
}

fn child() {
    if let Some(mut held) = HELD.with(|h| h.borrow_mut().take()) {
        held.graphs.forget_all();
    }
    budget::forget_parent_state_in_child();
    driver_reserved::forget_parent_state_in_child();
}
