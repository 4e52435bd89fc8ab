//! GPU time a process has already paid its tenant's token bucket for, and
//! spends on its next short launches without touching the bucket.
//!
//! A launch of a few µs cost, within budget, one `clock_gettime` and a CAS
//! on the shared bucket: on an H100 that was most of the launch path's
//! added time. A launch that takes [`LEASE_GPU_NS`] at once from the bucket
//! (one clock read, one CAS, as for one launch) pays for the process's next
//! launches of that size on the device up front, and those only subtract
//! from one word of the process's own memory. Launches costing a lease or
//! more go through the bucket each time, as before.
//!
//! The lease is the process's, not a thread's: a thread-local cell cost a
//! `__tls_get_addr` call on every launch (thread-locals of a `dlopen`ed or
//! preloaded library take the general-dynamic model), about as many
//! instructions as the rest of a spend, and a process of many launching
//! threads held a lease per thread. One word per device holds what is left
//! and how many launches spent from it, so a spend is one compare-exchange
//! (uncontended while one thread launches on the device, as frameworks do).
//!
//! What it changes: the process may have paid for up to one lease per
//! device it has not used yet (the tenant runs that much less, never more),
//! and a share changed (lowered to 0, raised to unlimited) applies after
//! the work it has already paid for: a spend does not read the share, only
//! a renewal does. Telemetry counts a lease's launches when the next one is
//! taken or the lease ends.

use dilu_layout::ledger::MAX_DEVICES;
use std::sync::atomic::{AtomicU64, Ordering};

/// GPU time the process takes from its bucket at once for launches shorter
/// than this. A thirtieth of a time slice (about 2 ms on an H100) and of
/// the 2 ms of vtime fair turns let one process run ahead, an eightieth of
/// the default 5 ms bucket depth: what a process holds cannot move a share
/// measurably. Launches of a few µs (where the bucket's cost shows) share
/// one bucket visit between about sixteen of them: a visit costs about 420
/// instructions (`bench/results/launch-instructions.md`). Twice this cut
/// the visits' part of a launch by half, but two tenants at 30% and 70%
/// that synchronise after every 20 µs kernel (host-bound on two cores)
/// then split the device 49/51 instead of 30/70 (`cargo bench -p
/// dilu-bench --bench sm_accuracy -- --only "k=1, 20 µs, 1 stream"`, run
/// at both sizes).
pub const LEASE_GPU_NS: u64 = 64_000;

/// A lease word: in its low `UNCOUNTED_BITS`, the launches spent from
/// leases since telemetry last counted them; above them, the GPU ns left.
/// A lease holds at most [`LEASE_GPU_NS`] and a spend takes at least 1 ns,
/// so the count stays far below 2^24 between two renewals (which take it).
const UNCOUNTED_BITS: u32 = 24;
const UNCOUNTED_MASK: u64 = (1 << UNCOUNTED_BITS) - 1;

/// One lease word per device.
struct Leases([AtomicU64; MAX_DEVICES]);

static LEASES: Leases = Leases::new();

impl Leases {
    const fn new() -> Self {
        Leases([const { AtomicU64::new(0) }; MAX_DEVICES])
    }

    #[inline]
    fn spend(&self, device: usize, cost_ns: u64) -> bool {
        let Some(lease) = self.0.get(device) else {
            return false;
        };
        let word = lease.load(Ordering::Relaxed);
        if word >> UNCOUNTED_BITS < cost_ns {
            return false;
        }
        // Lost to another thread's spend or renewal: this launch goes to the
        // bucket (whose renewal keeps what is left), rather than retrying.
        lease
            .compare_exchange(
                word,
                word - (cost_ns << UNCOUNTED_BITS) + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    #[inline]
    fn renew(&self, device: usize, cost_ns: u64, leases_off: bool) -> (u64, u64) {
        let Some(lease) = self.0.get(device) else {
            return (cost_ns, 0);
        };
        if cost_ns >= LEASE_GPU_NS || leases_off {
            // A long launch pays its own way; the lease waits for short ones.
            return (cost_ns, 0);
        }
        // A swap, not a store: what another thread spent since this one
        // looked is in the old word, so it is charged and counted once.
        let old = lease.swap(
            (LEASE_GPU_NS - cost_ns) << UNCOUNTED_BITS,
            Ordering::Relaxed,
        );
        (LEASE_GPU_NS - (old >> UNCOUNTED_BITS), old & UNCOUNTED_MASK)
    }

    #[inline]
    fn end(&self, device: usize) -> u64 {
        let Some(lease) = self.0.get(device) else {
            return 0;
        };
        // Read first: a process without a lease (every unlimited one) does
        // not write the line at each launch.
        if lease.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        lease.swap(0, Ordering::Relaxed) & UNCOUNTED_MASK
    }

    fn forget(&self) {
        for lease in &self.0 {
            lease.store(0, Ordering::Relaxed);
        }
    }
}

/// Spends `cost_ns` from the process's lease on `device`; `false` when the
/// lease holds less (then the launch goes to the bucket).
#[inline]
pub fn spend(device: usize, cost_ns: u64) -> bool {
    LEASES.spend(device, cost_ns)
}

/// What a launch of `cost_ns` that found too little in its lease charges
/// the bucket: a whole lease less what is left of the old one (kept, not
/// lost), or the launch's own cost when that is a lease or more. Returns
/// (GPU ns to charge, launches spent from leases not yet counted).
#[inline]
pub fn renew(device: usize, cost_ns: u64) -> (u64, u64) {
    LEASES.renew(device, cost_ns, crate::config::get().ablate.leases)
}

/// Ends the process's lease on `device` (its share is no longer limited:
/// what is left of the lease was paid for and is not needed). Returns the
/// launches spent from it not yet counted.
#[inline]
pub fn end(device: usize) -> u64 {
    LEASES.end(device)
}

/// A forked child starts with nothing paid: the parent's leases were paid
/// for once, and the parent keeps spending them.
pub fn forget_parent_state_in_child() {
    LEASES.forget();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_launches_pay_the_bucket_once_a_lease() {
        let leases = Leases::new();
        let device = 3;
        // A lease holds six of these and two thirds of a seventh.
        let cost = LEASE_GPU_NS * 3 / 20;
        let mut charged = 0;
        let mut counted = 0;
        for _ in 0..20 {
            if !leases.spend(device, cost) {
                let (charge, uncounted) = leases.renew(device, cost, false);
                charged += charge;
                counted += uncounted + 1;
            }
        }
        // 20 launches: a whole lease, then three renewals that top it up by
        // six launches' worth (the two thirds left each time are kept).
        assert_eq!(charged, LEASE_GPU_NS + 3 * 6 * cost);
        let word = leases.0[device].load(Ordering::Relaxed);
        assert_eq!(
            charged - 20 * cost,
            word >> UNCOUNTED_BITS,
            "what is paid and unspent is kept"
        );
        assert_eq!(
            counted + (word & UNCOUNTED_MASK),
            20,
            "every launch is counted once"
        );
    }

    #[test]
    fn long_launches_other_devices_and_ablation_go_to_the_bucket() {
        let leases = Leases::new();
        assert!(!leases.spend(0, 1), "nothing paid yet");
        let long = LEASE_GPU_NS + 1;
        assert_eq!(leases.renew(0, long, false), (long, 0));
        assert!(!leases.spend(0, 1), "a long launch takes no lease");
        assert_eq!(leases.renew(0, 1_000, false).0, LEASE_GPU_NS);
        assert!(leases.spend(0, 1_000));
        assert!(!leases.spend(1, 1_000), "a lease is per device");
        assert!(!leases.spend(MAX_DEVICES, 1));
        assert_eq!(leases.renew(MAX_DEVICES, 1_000, false), (1_000, 0));
        assert_eq!(leases.renew(2, 1_000, true), (1_000, 0), "leases off");
        assert!(!leases.spend(2, 1));
        leases.forget();
        assert!(!leases.spend(0, 1), "a forked child has nothing paid");
        leases.renew(0, 1_000, false);
        assert!(leases.spend(0, 1_000) && leases.spend(0, 1_000));
        assert_eq!(leases.end(0), 2, "an ended lease's launches are counted");
        assert!(!leases.spend(0, 1), "an ended lease is spent no more");
        assert_eq!(leases.end(0), 0);
    }

    #[test]
    fn threads_sharing_a_lease_are_charged_for_exactly_what_they_launch() {
        let leases = Leases::new();
        let (threads, launches) = (4u64, 20_000u64);
        // Costs from 1 ns to past a lease, so spends, renewals and launches
        // paying their own way interleave between the threads.
        let costs = [1, 700, 3_100, LEASE_GPU_NS / 3, LEASE_GPU_NS + 5];
        let totals: Vec<(u64, u64, u64)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let leases = &leases;
                    scope.spawn(move || {
                        let (mut charged, mut spent, mut counted) = (0, 0, 0);
                        for i in 0..launches {
                            let cost = costs[((i + t) % costs.len() as u64) as usize];
                            spent += cost;
                            if !leases.spend(0, cost) {
                                let (charge, uncounted) = leases.renew(0, cost, false);
                                charged += charge;
                                counted += uncounted + 1;
                            }
                        }
                        (charged, spent, counted)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let charged: u64 = totals.iter().map(|t| t.0).sum();
        let spent: u64 = totals.iter().map(|t| t.1).sum();
        let counted: u64 = totals.iter().map(|t| t.2).sum();
        let word = leases.0[0].load(Ordering::Relaxed);
        assert_eq!(
            charged - spent,
            word >> UNCOUNTED_BITS,
            "charged = launched + what is left, however the threads met"
        );
        assert!(
            word >> UNCOUNTED_BITS < LEASE_GPU_NS,
            "at most one lease held"
        );
        assert_eq!(counted + (word & UNCOUNTED_MASK), threads * launches);
    }
}
