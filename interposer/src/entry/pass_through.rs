//! Rows whose hook has nothing to do in this process, decided once when the
//! library loads: their wrappers call the real function at once, without
//! the handler, its closures or the panic guard. A launch row passes
//! through when the process has no SM-time state (no tenant, SM limit or
//! co-location role: `tenant_sm::configured`), the case where its handler
//! would find none and launch straight away; a process with only a memory
//! budget then pays an indirect call and two loads per launch. Every other
//! row always goes through its handler.

use crate::sm_time::tenant_sm;
use crate::table::HookId;
use std::sync::atomic::{AtomicBool, Ordering};

/// The launch rows: every hook whose handler is `launch_control`'s.
const LAUNCHES: [HookId; 9] = [
    HookId::cuLaunchKernel,
    HookId::cuLaunchKernel_ptsz,
    HookId::cuLaunchKernelEx,
    HookId::cuLaunchKernelEx_ptsz,
    HookId::cuLaunchCooperativeKernel,
    HookId::cuLaunchCooperativeKernel_ptsz,
    HookId::cuLaunchCooperativeKernelMultiDevice,
    HookId::cuGraphLaunch,
    HookId::cuGraphLaunch_ptsz,
];

/// Whether the launch rows pass through (decided once, at load).
static LAUNCHES_PASS: AtomicBool = AtomicBool::new(false);

/// Decides whether the launch rows pass through (the library constructor,
/// before any hooked call: until then they go through their handlers,
/// always safe).
pub fn decide() {
    LAUNCHES_PASS.store(!tenant_sm::configured(), Ordering::Relaxed);
}

/// Whether `id` is a launch row (evaluated at compile time in the
/// wrappers: the other rows carry no check at all).
pub const fn is_launch(id: HookId) -> bool {
    let mut i = 0;
    while i < LAUNCHES.len() {
        if LAUNCHES[i] as usize == id as usize {
            return true;
        }
        i += 1;
    }
    false
}

/// Whether `id`'s wrapper calls the real function directly.
#[inline(always)]
pub fn passes_through(id: HookId) -> bool {
    is_launch(id) && LAUNCHES_PASS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::NAMES;

    #[test]
    fn only_launch_rows_may_pass_through() {
        for id in LAUNCHES {
            let name = NAMES[id as usize].to_str().unwrap();
            assert!(
                name.starts_with("cuLaunch") || name.starts_with("cuGraphLaunch"),
                "{name} is not a launch"
            );
            assert!(is_launch(id));
        }
        assert!(
            !is_launch(HookId::cuMemAlloc_v2),
            "an allocation never passes through"
        );
    }
}
