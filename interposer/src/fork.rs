//! Fork safety of the interposer's process-local state: the one
//! `pthread_atfork` registration, and the parts that take part in it.
//!
//! A process forked from a CUDA program (a data-loader worker, a launcher's
//! worker) is a new member of the tenant: single-threaded, holding none of
//! its parent's allocations. The state that must see it that way belongs to
//! the groups above this one, so each registers its own [`Handlers`]
//! ([`register`]: `memory/at_fork.rs` and `sm_time/at_fork.rs`, when the
//! library loads in a process configured with that state); the first registration installs
//! the `pthread_atfork` handlers, once per process. At a fork:
//!
//! - **prepare** (in the forking thread, before the fork): each part's, in
//!   the order of [`Part`]: the memory part takes every lock of ours that a
//!   hook may hold, in the order the hooks take them (graph registry, join
//!   lock, the charge table's overflow map), so no other thread is inside
//!   one at the instant of the fork and the child never inherits a lock
//!   owned by a thread that does not exist there;
//! - **parent** (after): each part's, releasing what its prepare took;
//! - **child**: each part's, in the order of [`Part`], releasing its locks
//!   and forgetting the parent's state (see each part); then a driver load
//!   the fork interrupted is started afresh instead of waited for.
//!
//! The hot path takes no lock, so threads busy allocating never delay a
//! fork. The handlers never load libraries, register handlers or wait for
//! anything but those short critical sections (on older glibc, prepare
//! handlers run under glibc's own atfork lock).

use std::panic::catch_unwind;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::driver;

/// What one part does at a fork (see the module documentation).
#[derive(Clone, Copy)]
pub struct Handlers {
    pub prepare: fn(),
    pub parent: fn(),
    pub child: fn(),
}

impl Handlers {
    /// Nothing to do at that step.
    pub fn nothing() {}
}

/// The parts, in the order their prepare and child handlers run.
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Part {
    Memory,
    SmTime,
}

const PARTS: usize = 2;

static REGISTERED: [OnceLock<Handlers>; PARTS] = [const { OnceLock::new() }; PARTS];
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Adds `part`'s handlers (a second registration of a part is ignored) and
/// installs the `pthread_atfork` handlers if they are not yet.
pub fn register(part: Part, handlers: Handlers) {
    let _ = REGISTERED[part as usize].set(handlers);
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: plain extern "C" functions that catch every panic.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

fn registered() -> impl DoubleEndedIterator<Item = &'static Handlers> {
    REGISTERED.iter().filter_map(OnceLock::get)
}

extern "C" fn prepare() {
    let _ = catch_unwind(|| registered().for_each(|part| (part.prepare)()));
}

extern "C" fn parent() {
    let _ = catch_unwind(|| registered().rev().for_each(|part| (part.parent)()));
}

extern "C" fn child() {
    let _ = catch_unwind(|| {
        registered().for_each(|part| (part.child)());
        driver::restart_interrupted_load();
    });
}
