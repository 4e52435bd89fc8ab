//! GPU time a launching thread has already paid its tenant's token bucket
//! for, and spends on its next short launches without touching the bucket.
//!
//! A launch of a few µs cost, within budget, one `clock_gettime` and a CAS
//! on the shared bucket: on an H100 that was most of the launch path's
//! added time. A thread that takes [`LEASE_GPU_NS`] at once from the bucket
//! (one clock read, one CAS, as for one launch) pays for its next launches
//! of that size up front, and those only subtract from a thread-local
//! number. Launches costing a lease or more go through the bucket each
//! time, as before.
//!
//! What it changes: a thread may have paid for up to one lease it has not
//! used yet (the tenant runs that much less, never more; when the thread
//! exits it is lost), and a share lowered to 0 stops a thread after the
//! work it has already paid for. Telemetry counts a lease's launches when
//! the thread takes its next one.

use dilu_layout::ledger::MAX_DEVICES;
use std::cell::Cell;

/// GPU time a thread takes from its bucket at once for launches shorter
/// than this. A thirtieth of a time slice (about 2 ms on an H100) and of
/// the 2 ms of vtime fair turns let one process run ahead, an eightieth of
/// the default 5 ms bucket depth: what one thread holds cannot move a share
/// measurably. Launches of a few µs (where the bucket's cost shows) share
/// one bucket visit between about sixteen of them: a visit costs about 440
/// instructions, and at 20 µs (six launches a visit) visits were a third of
/// what a launch with a share added (`bench/results/launch-instructions.md`).
pub const LEASE_GPU_NS: u64 = 64_000;

#[derive(Clone, Copy)]
struct Lease {
    /// Paid for and not yet spent.
    left_ns: u64,
    /// Launches spent from leases since telemetry last counted them.
    uncounted: u64,
}

thread_local! {
    static LEASES: [Cell<Lease>; MAX_DEVICES] =
        const { [const { Cell::new(Lease { left_ns: 0, uncounted: 0 }) }; MAX_DEVICES] };
}

/// Spends `cost_ns` from this thread's lease on `device`; `false` when the
/// lease holds less (then the launch goes to the bucket).
#[inline]
pub fn spend(device: usize, cost_ns: u64) -> bool {
    LEASES.with(|leases| {
        let Some(cell) = leases.get(device) else {
            return false;
        };
        let lease = cell.get();
        if lease.left_ns < cost_ns {
            return false;
        }
        cell.set(Lease {
            left_ns: lease.left_ns - cost_ns,
            uncounted: lease.uncounted + 1,
        });
        true
    })
}

/// What a launch of `cost_ns` that found too little in its lease charges
/// the bucket: a whole lease less what is left of the old one (kept, not
/// lost), or the launch's own cost when that is a lease or more. Returns
/// (GPU ns to charge, launches spent from leases not yet counted).
#[inline]
pub fn renew(device: usize, cost_ns: u64) -> (u64, u64) {
    LEASES.with(|leases| {
        let Some(cell) = leases.get(device) else {
            return (cost_ns, 0);
        };
        let lease = cell.get();
        if cost_ns >= LEASE_GPU_NS || crate::config::get().ablate.leases {
            // A long launch pays its own way; the lease waits for short ones.
            return (cost_ns, 0);
        }
        cell.set(Lease {
            left_ns: LEASE_GPU_NS - cost_ns,
            uncounted: 0,
        });
        (LEASE_GPU_NS - lease.left_ns, lease.uncounted)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_launches_pay_the_bucket_once_a_lease() {
        // Each test runs on a thread of its own: a fresh lease.
        let device = 3;
        // A lease holds six of these and two thirds of a seventh.
        let cost = LEASE_GPU_NS * 3 / 20;
        let mut charged = 0;
        let mut counted = 0;
        for _ in 0..20 {
            if !spend(device, cost) {
                let (charge, uncounted) = renew(device, cost);
                charged += charge;
                counted += uncounted + 1;
            }
        }
        // 20 launches: a whole lease, then three renewals that top it up by
        // six launches' worth (the two thirds left each time are kept).
        assert_eq!(charged, LEASE_GPU_NS + 3 * 6 * cost);
        let left = LEASES.with(|l| l[device].get().left_ns);
        assert_eq!(
            charged - 20 * cost,
            left,
            "what is paid and unspent is kept"
        );
        let uncounted = LEASES.with(|l| l[device].get().uncounted);
        assert_eq!(counted + uncounted, 20, "every launch is counted once");
    }

    #[test]
    fn long_launches_and_other_devices_go_to_the_bucket() {
        assert!(!spend(0, 1), "nothing paid yet");
        assert_eq!(renew(0, 100_000), (100_000, 0));
        assert!(!spend(0, 1), "a long launch takes no lease");
        assert_eq!(renew(0, 1_000).0, LEASE_GPU_NS);
        assert!(spend(0, 1_000));
        assert!(!spend(1, 1_000), "a lease is per device");
        assert!(!spend(MAX_DEVICES, 1));
        assert_eq!(renew(MAX_DEVICES, 1_000), (1_000, 0));
    }
}
