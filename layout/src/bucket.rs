//! The SM-time token bucket of one tenant on one device: the enforcement
//! state every launch of every process of the tenant updates.
//!
//! It is kept apart from the advisory counters beside it in
//! [`TenantActivity`](crate::activity::TenantActivity) (which only report)
//! and each of its hot words sits on its own cache line, so that counting a
//! launch never contends with charging one. It lives in the tenant's activity
//! region (the file `<tenant>.telemetry`)
//! (memory all its processes map writable, as before): a tenant can only
//! hurt itself by writing it, and the node manager reads the device time it
//! really got from its own cross-checks, not from here.
//!
//! The bucket is GCRA: `tat` is the wall-clock instant at which everything
//! charged so far is paid for at the tenant's share; a launch may start
//! once `tat − depth ≤ now`.

use crate::budget::{FULL_SHARE_PPM, mul_div, wall_cost_ns};
use std::sync::atomic::{AtomicU64, Ordering};

/// One atomic alone on a 64-byte cache line.
#[repr(C, align(64))]
pub struct CacheLine(pub AtomicU64);

impl CacheLine {
    const fn zero() -> Self {
        CacheLine(AtomicU64::new(0))
    }
}

/// GPU time that `wall_ns` of the bucket buys at `share_ppm` (the inverse
/// of [`wall_cost_ns`]).
#[inline]
fn gpu_time_of_wall(wall_ns: u64, share_ppm: u32) -> u64 {
    mul_div(wall_ns, u64::from(share_ppm), u64::from(FULL_SHARE_PPM)) as u64
}

#[repr(C)]
pub struct TokenBucket {
    /// GCRA's theoretical arrival time (CLOCK_MONOTONIC ns). CAS'd by
    /// every launch.
    tat_ns: CacheLine,
    /// GPU time charged too much earlier and not yet given back: later
    /// launches are charged that much less. (Giving it back by moving the
    /// bucket would be lost whenever the bucket is full, or become a
    /// burst.) Read by every launch, written only when non-zero.
    refund_ns: CacheLine,
    /// GPU time found owed while the share was 0 (a measurement settled
    /// then): it cannot be turned into wall-clock time at share 0, so the
    /// next admitted launch pays it. Read by every launch.
    owed_ns: CacheLine,
    /// The quiet board's skipped idle time (see [`crate::quiet`]) this
    /// bucket has taken: a skip moves the bucket once, however many of the
    /// tenant's processes see it. Only held launches touch it.
    skips_taken_ns: CacheLine,
    /// A number naming the tenant on quiet boards, where its shares count
    /// once whatever its processes; 0 until first asked for.
    tenant_key: CacheLine,
}

/// A refund pays at most this part (1/2) of each later launch. Paid out
/// whole, a large refund made the next launches free: the bucket, not moved
/// by them, stood full and let its own accrual beyond the depth go, so the
/// refund replaced the share instead of adding to it. A tenant alone on 3
/// streams, whose estimates are about twice its device time and whose
/// usage feedback refunds the rest every NVML sample, held 55–57% of the
/// device at a cap of 70 on simgpu that way; paid out at half of each
/// launch, 65% over a 3 s run, 69% over its NVML periods after the first
/// second.
///
/// A launch the bucket lets go at once pays a refund only at the rate it
/// arrives ([`REFUND_SPREAD_WALL_NS`]; half price only while half a
/// period's accrual or more is owed), not at half price whatever is owed:
/// at half price every launch after an NVML settlement, a 70% tenant
/// launched faster than the device ran its 20 µs kernels, filled its own
/// queue, waited on it, and the bucket's accrual in those waits (0.8 ms at
/// a time, 20 ms a second) was lost: 67.7% of the device. A launch the
/// bucket holds back may pay half: there a refund shortens a wait and never
/// outruns the device.
///
/// A refunded launch may lower the bucket into its depth, never below its
/// own cost from now (see [`TokenBucket::admit`]). Limited to the launch's
/// own wait instead, a tenant whose demand is just above its share, which
/// waits a few µs per launch, could not spend its refunds: a request loop
/// of one 20 µs kernel per synchronisation, charged 23 µs a kernel (the
/// launch's gap before the kernel is in every sample), used 26.4% of the
/// device at a cap of 30 (29.4–29.6% with the depth;
/// `scripts/bench.sh sm`).
pub const REFUND_DIVISOR: u64 = 2;

/// Wall-clock time over which launches that do not wait pay back a refund:
/// each such launch is charged less by the fraction of its cost that the
/// refund owed is of the GPU time the bucket accrues in this time at the
/// share (at most [`REFUND_DIVISOR`]th). It is NVML's sample period on
/// NVIDIA's driver (about 200 ms), the interval at which usage feedback
/// finds refunds, so a steady over-charge is paid back about as fast as it
/// is found, spread over the launches instead of in a burst. Spent only on
/// waits, refunds fell behind where a tenant just above its share rarely
/// waits: the 20 µs request loop above waited at about one launch in five
/// (a wait of a few µs oversleeps by tens), held 27.3–27.6% at a cap of 30
/// on this host, and left 52–56 ms of device time used against 60–63 ms
/// charged in each NVML period.
pub const REFUND_SPREAD_WALL_NS: u64 = 200_000_000;

/// A bucket further ahead of now than this was garbled (a tenant wrote its
/// own activity region): no honest charge puts it there (a launch of 60 ms
/// of GPU time at a 0.1% share would). [`TokenBucket::admit`] takes such a
/// bucket back to now instead of waiting for it, so a tenant that garbles
/// its region never hangs in a wait that will not end.
pub const MAX_LEAD_NS: u64 = 60_000_000_000;

/// Buckets this process found garbled and took back to now.
static GARBLED_RESETS: AtomicU64 = AtomicU64::new(0);

/// How many buckets this process found garbled (see [`MAX_LEAD_NS`]).
pub fn garbled_resets() -> u64 {
    GARBLED_RESETS.load(Ordering::Relaxed)
}

/// When a launch may go, as decided by [`TokenBucket::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Now,
    /// Wait until this CLOCK_MONOTONIC instant (ns).
    At(u64),
    /// The share is 0: nothing was charged; wait for a share and ask again.
    Paused,
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self::new()
    }
}

impl TokenBucket {
    pub const fn new() -> Self {
        TokenBucket {
            tat_ns: CacheLine::zero(),
            refund_ns: CacheLine::zero(),
            owed_ns: CacheLine::zero(),
            skips_taken_ns: CacheLine::zero(),
            tenant_key: CacheLine::zero(),
        }
    }

    /// Charges a launch of `cost_ns` GPU time at `share_ppm` (one CAS) and
    /// says when it may go. Never refuses: a launch in debt waits, and the
    /// debt is what it waits for. At share 0 it charges nothing and answers
    /// [`Admission::Paused`]: a zero share is a state to wait out, not a
    /// debt that could never be paid. A refund owed to the tenant lowers
    /// the charge only of a launch that finds the bucket ahead of now (a
    /// full bucket would lose it), by at most that lead: a launch that has
    /// to wait by up to [`REFUND_DIVISOR`]th of its cost, one that goes at
    /// once by the refund's rate (see [`REFUND_SPREAD_WALL_NS`]).
    #[inline]
    pub fn admit(&self, now: u64, cost_ns: u64, share_ppm: u32, depth_ns: u64) -> Admission {
        if share_ppm == 0 {
            return Admission::Paused;
        }
        let mut tat = self.tat_ns.0.load(Ordering::Relaxed);
        if tat.saturating_sub(now) > MAX_LEAD_NS {
            tat = self.take_back_garbled(tat, now);
        }
        let lead = tat.saturating_sub(now);
        let refund = if lead > 0 {
            self.take_refund(cost_ns, share_ppm, lead > depth_ns, lead)
        } else {
            0
        };
        let gpu_ns = (cost_ns - refund).saturating_add(self.take_owed().min(MAX_LEAD_NS));
        let cost = wall_cost_ns(gpu_ns, share_ppm);
        loop {
            let next = tat.max(now).saturating_add(cost);
            match self.tat_ns.0.compare_exchange_weak(
                tat,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let go = tat.saturating_sub(depth_ns);
                    return if go > now {
                        Admission::At(go)
                    } else {
                        Admission::Now
                    };
                }
                Err(actual) => tat = actual,
            }
        }
    }

    /// A garbled bucket (`tat` more than [`MAX_LEAD_NS`] ahead of `now`)
    /// taken back to `now`, with the refund and debt words beside it
    /// cleared; returns the bucket's `tat` now.
    #[cold]
    fn take_back_garbled(&self, tat: u64, now: u64) -> u64 {
        if self
            .tat_ns
            .0
            .compare_exchange(tat, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.refund_ns.0.store(0, Ordering::Relaxed);
            self.owed_ns.0.store(0, Ordering::Relaxed);
            GARBLED_RESETS.fetch_add(1, Ordering::Relaxed);
        }
        self.tat_ns.0.load(Ordering::Relaxed)
    }

    /// Takes from the refund owed to the tenant for a launch of `cost_ns`
    /// that finds the bucket `lead_ns` ahead of now: at most that lead's
    /// GPU time, and at most a [`REFUND_DIVISOR`]th of the cost if the
    /// launch `waits`, else the part of it the refund is of a
    /// [`REFUND_SPREAD_WALL_NS`]'s accrual.
    #[inline]
    fn take_refund(&self, cost_ns: u64, share_ppm: u32, waits: bool, lead_ns: u64) -> u64 {
        let mut owed = self.refund_ns.0.load(Ordering::Relaxed);
        while owed > 0 {
            let half = cost_ns / REFUND_DIVISOR;
            let per_launch = if waits {
                half
            } else {
                let spread = gpu_time_of_wall(REFUND_SPREAD_WALL_NS, share_ppm).max(1);
                (mul_div(cost_ns, owed, spread) as u64).min(half)
            };
            let take = owed
                .min(per_launch)
                .min(gpu_time_of_wall(lead_ns, share_ppm));
            if take == 0 {
                return 0;
            }
            match self.refund_ns.0.compare_exchange_weak(
                owed,
                owed - take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return take,
                Err(actual) => owed = actual,
            }
        }
        0
    }

    /// Takes everything the tenant owes from a zero-share period.
    #[inline]
    fn take_owed(&self) -> u64 {
        if self.owed_ns.0.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.owed_ns.0.swap(0, Ordering::AcqRel)
    }

    /// Marks the quiet board's skipped total `board_skipped_ns` as taken
    /// without taking it: skips made before a launch was held are not its.
    pub fn note_skips(&self, board_skipped_ns: u64) {
        self.skips_taken_ns
            .0
            .fetch_max(board_skipped_ns, Ordering::AcqRel);
    }

    /// Takes the quiet board's skips up to its total `board_skipped_ns`
    /// that this bucket has not taken yet: the bucket's debt shrinks by that
    /// much wall-clock time, as if the idle time every member waited through
    /// had passed, but never below `now` (a skip pays debts; it earns no
    /// credit). Returns the skip taken (0: another process of the tenant
    /// took it already).
    pub fn take_skips(&self, board_skipped_ns: u64, now: u64) -> u64 {
        let before = self
            .skips_taken_ns
            .0
            .fetch_max(board_skipped_ns, Ordering::AcqRel);
        let Some(skip) = board_skipped_ns
            .checked_sub(before)
            .filter(|&skip| skip > 0)
        else {
            return 0;
        };
        // A bucket already paid up (`tat ≤ now`) is left as it is.
        let _ = self
            .tat_ns
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |tat| {
                (tat > now).then(|| tat.saturating_sub(skip).max(now))
            });
        skip
    }

    /// The tenant's key on quiet boards (never 0; the first process to ask
    /// draws it, from its pid and the clock).
    pub fn tenant_key(&self) -> u64 {
        let key = self.tenant_key.0.load(Ordering::Relaxed);
        if key != 0 {
            return key;
        }
        let drawn = (u64::from(std::process::id()) << 32 ^ crate::monotonic_ns()) | 1;
        match self
            .tenant_key
            .0
            .compare_exchange(0, drawn, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => drawn,
            Err(other) => other,
        }
    }

    /// Charges (positive) or refunds (negative) GPU time after the fact, when
    /// a measurement shows that earlier launches cost more or less than they
    /// were charged. A charge moves the bucket at once (at share 0 the next
    /// launch pays it); a refund is taken off the next launches' charges.
    pub fn charge_back(&self, delta_gpu_ns: i64, share_ppm: u32, now: u64) {
        if delta_gpu_ns < 0 {
            self.refund_ns
                .0
                .fetch_add(delta_gpu_ns.unsigned_abs(), Ordering::Relaxed);
            return;
        }
        if share_ppm == 0 {
            self.owed_ns
                .0
                .fetch_add(delta_gpu_ns as u64, Ordering::Relaxed);
            return;
        }
        let wall = wall_cost_ns(delta_gpu_ns as u64, share_ppm);
        let mut tat = self.tat_ns.0.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now).saturating_add(wall);
            match self.tat_ns.0.compare_exchange_weak(
                tat,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => tat = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_garbled_bucket_is_taken_back_to_now_instead_of_waited_for() {
        let (share, depth, now) = (250_000, 1_000_000, 10_000_000_000u64);
        for (tat, refund, owed) in [
            (u64::MAX, 0, 0),
            (now + MAX_LEAD_NS + 1, u64::MAX, u64::MAX),
            (u64::MAX / 3, 7, u64::MAX / 2),
        ] {
            let bucket = TokenBucket::new();
            bucket.tat_ns.0.store(tat, Ordering::Relaxed);
            bucket.refund_ns.0.store(refund, Ordering::Relaxed);
            bucket.owed_ns.0.store(owed, Ordering::Relaxed);
            let before = garbled_resets();
            assert_eq!(bucket.admit(now, 100_000, share, depth), Admission::Now);
            assert!(garbled_resets() > before, "the garbling is counted");
            // From there it paces as a fresh bucket does: never a wait
            // longer than the launches' own cost.
            for _ in 0..10 {
                if let Admission::At(at) = bucket.admit(now, 100_000, share, depth) {
                    assert!(at - now <= 10 * 400_000, "waits {} ns", at - now);
                }
            }
        }
        // Owed time alone is bounded too: a huge debt cannot push the
        // bucket out of reach.
        let bucket = TokenBucket::new();
        bucket.owed_ns.0.store(u64::MAX, Ordering::Relaxed);
        for _ in 0..10 {
            if let Admission::At(at) = bucket.admit(now, 100_000, share, depth) {
                assert!(at - now <= MAX_LEAD_NS, "waits {} ns", at - now);
            }
        }
    }

    #[test]
    fn hot_words_have_cache_lines_of_their_own() {
        assert_eq!(std::mem::size_of::<TokenBucket>(), 5 * 64);
        assert_eq!(std::mem::align_of::<TokenBucket>(), 64);
    }

    #[test]
    fn a_bucket_paces_launches_at_the_share_after_its_depth() {
        let bucket = TokenBucket::new();
        let (share, depth, now) = (250_000, 1_000_000, 10_000_000_000u64);
        // 100 µs launches at 25%: each costs 400 µs of the bucket; the
        // first depth's worth (1 ms) goes at once, then one every 400 µs.
        let admissions: Vec<Admission> = (0..6)
            .map(|_| bucket.admit(now, 100_000, share, depth))
            .collect();
        assert_eq!(&admissions[..3], &[Admission::Now; 3]);
        assert_eq!(admissions[3], Admission::At(now + 200_000));
        assert_eq!(admissions[4], Admission::At(now + 600_000));
        assert_eq!(admissions[5], Admission::At(now + 1_000_000));
    }

    #[test]
    fn idle_time_earns_no_more_than_the_depth() {
        let bucket = TokenBucket::new();
        let depth = 1_000_000;
        assert_eq!(bucket.admit(0, 1_000_000, 500_000, depth), Admission::Now);
        // An hour later: the bucket starts from now, not from an hour of credit.
        let later = 3_600_000_000_000;
        let waited = (0..10)
            .filter(|_| match bucket.admit(later, 100_000, 500_000, depth) {
                Admission::At(t) => t > later,
                _ => false,
            })
            .count();
        // A launch goes while the debt before it is at most the depth: the
        // first with none, then five more (5 × 200 µs = 1 ms); four wait.
        assert_eq!(waited, 4);
    }

    #[test]
    fn charges_move_the_bucket_and_refunds_lower_later_charges() {
        let bucket = TokenBucket::new();
        let now = 1_000_000_000;
        let half = FULL_SHARE_PPM / 2;
        bucket.admit(now, 100_000, half, 0);
        bucket.charge_back(300_000, half, now);
        // 100 µs + 300 µs of GPU time at 50% = 800 µs of debt.
        assert_eq!(bucket.admit(now, 0, half, 0), Admission::At(now + 800_000));
        // A refund of 150 µs pays half of each of the next three 100 µs
        // launches: each costs 50 µs (100 µs of bucket at 50%), so the
        // bucket keeps moving while the refund is paid out, never back.
        bucket.charge_back(-150_000, half, now);
        for n in 0..3 {
            assert_eq!(
                bucket.admit(now, 100_000, half, 0),
                Admission::At(now + 800_000 + n * 100_000)
            );
        }
        assert_eq!(
            bucket.admit(now, 100_000, half, 0),
            Admission::At(now + 1_100_000),
            "the refund is spent: a launch pays in full"
        );
        assert_eq!(
            bucket.admit(now, 0, half, 0),
            Admission::At(now + 1_300_000)
        );
    }

    #[test]
    fn a_refund_is_spent_at_half_on_waits_and_never_on_a_full_bucket() {
        let bucket = TokenBucket::new();
        let now = 1_000_000_000;
        let half = FULL_SHARE_PPM / 2;
        bucket.charge_back(-1_000_000, half, now);
        // A full bucket (idle before): the launch pays in full (100 µs of
        // GPU time = 200 µs of bucket), the refund stays owed, since a
        // lower charge there would only be lost.
        assert_eq!(bucket.admit(now, 100_000, half, 0), Admission::Now);
        assert_eq!(bucket.refund_ns.0.load(Ordering::Relaxed), 1_000_000);
        // Now each launch waits (no depth); each is refunded half its cost
        // (50 µs = 100 µs of bucket).
        assert_eq!(
            bucket.admit(now, 100_000, half, 0),
            Admission::At(now + 200_000)
        );
        assert_eq!(
            bucket.admit(now, 100_000, half, 0),
            Admission::At(now + 300_000)
        );
        assert_eq!(bucket.refund_ns.0.load(Ordering::Relaxed), 900_000);
        // A launch that waits only 40 µs is still refunded half its cost:
        // the refund may take the bucket into its depth (a tenant just
        // above its share waits a little per launch and must still get
        // its refunds) ... but never below that launch's full cost from
        // now. Each case: depth, a first launch's cost (no wait: nothing
        // refunded), then a launch that waits 40 µs, its refund, and when
        // the bucket lets the next launch go.
        let cases = [
            // 1 ms depth, 100 µs launch: refunded 50 µs (half of it), paid
            // 50 µs = 100 µs of bucket, which stands at now + 1.14 ms.
            (1_000_000, 520_000, 100_000, 50_000, now + 140_000),
            // 100 µs depth, 400 µs launch: refunded 70 µs (the wait and
            // the depth, 140 µs of bucket), not 200 µs: the bucket stands
            // at now + 800 µs, what the launch costs after a full bucket.
            (100_000, 70_000, 400_000, 70_000, now + 700_000),
        ];
        for (depth, first, cost, refunded, next_goes) in cases {
            let bucket = TokenBucket::new();
            bucket.charge_back(-1_000_000, half, now);
            bucket.admit(now, first, half, depth);
            assert_eq!(
                bucket.admit(now, cost, half, depth),
                Admission::At(now + 40_000)
            );
            assert_eq!(
                bucket.refund_ns.0.load(Ordering::Relaxed),
                1_000_000 - refunded,
                "the rest stays owed"
            );
            assert_eq!(bucket.admit(now, 0, half, depth), Admission::At(next_goes));
        }
    }

    #[test]
    fn a_launch_that_goes_at_once_pays_a_refund_back_at_the_rate_it_came() {
        let bucket = TokenBucket::new();
        let now = 3_000_000_000;
        let share = 300_000; // 30%: 60 ms of GPU time accrue in the spread
        let depth = 2_000_000;
        // Found 6 ms over-charged (a tenth of the spread's accrual): launches
        // the depth lets go at once pay a tenth of it back each, while it
        // lasts, instead of nothing (or half, which would outrun the device).
        bucket.charge_back(-6_000_000, share, now);
        assert_eq!(bucket.admit(now, 23_000, share, depth), Admission::Now);
        let owed = || bucket.refund_ns.0.load(Ordering::Relaxed);
        assert_eq!(owed(), 6_000_000, "a full bucket takes no refund");
        assert_eq!(bucket.admit(now, 23_000, share, depth), Admission::Now);
        assert_eq!(owed(), 6_000_000 - 2_300);
        let mut ahead = wall_cost_ns(23_000, share) + wall_cost_ns(23_000 - 2_300, share);
        let mut last = 2_300;
        for _ in 0..20 {
            let before = owed();
            assert_eq!(bucket.admit(now, 23_000, share, depth), Admission::Now);
            let took = before - owed();
            // A tenth of what is still owed: a little less each time.
            assert!(took <= last && took > 2_270, "took {took} after {last}");
            last = took;
            ahead += wall_cost_ns(23_000 - took, share);
        }
        // The lower charges moved the bucket: it stands that far ahead.
        assert_eq!(bucket.admit(now, 0, share, 0), Admission::At(now + ahead));
        // A refund as large as the whole spread pays at most half of a launch.
        let bucket = TokenBucket::new();
        bucket.charge_back(-1_000_000_000, share, now);
        bucket.admit(now, 23_000, share, depth);
        bucket.admit(now, 23_000, share, depth);
        assert_eq!(
            bucket.refund_ns.0.load(Ordering::Relaxed),
            1_000_000_000 - 11_500
        );
    }

    #[test]
    fn a_skip_pays_a_debt_once_and_earns_no_credit() {
        let bucket = TokenBucket::new();
        let (now, half, depth) = (2_000_000_000, FULL_SHARE_PPM / 2, 1_000_000);
        bucket.admit(now, 5_000_000, half, depth);
        assert_eq!(
            bucket.admit(now, 100_000, half, depth),
            Admission::At(now + 9_000_000)
        );
        // Skips the board made before this tenant was held are not its.
        bucket.note_skips(40_000_000);
        assert_eq!(bucket.take_skips(40_000_000, now), 0);
        // A skip of 4 ms takes 4 ms of wall time off the debt, once: a
        // second process of the tenant seeing the same total takes nothing.
        assert_eq!(bucket.take_skips(44_000_000, now), 4_000_000);
        assert_eq!(bucket.take_skips(44_000_000, now), 0);
        assert_eq!(
            bucket.admit(now, 100_000, half, depth),
            Admission::At(now + 5_200_000)
        );
        // A skip longer than the debt leaves the bucket paid up, not in credit.
        assert_eq!(bucket.take_skips(1_044_000_000, now), 1_000_000_000);
        let going = (0..10)
            .take_while(|_| bucket.admit(now, 100_000, half, depth) == Admission::Now)
            .count();
        assert_eq!(going, 6, "only the depth goes at once");
    }

    #[test]
    fn every_process_of_a_tenant_draws_the_same_key() {
        let bucket = TokenBucket::new();
        let key = bucket.tenant_key();
        assert_ne!(key, 0);
        assert_eq!(bucket.tenant_key(), key);
        assert_ne!(TokenBucket::new().tenant_key(), 0);
    }

    #[test]
    fn a_zero_share_pauses_without_debt_and_a_raised_share_goes_at_once() {
        let bucket = TokenBucket::new();
        let now = 5_000_000_000;
        let half = FULL_SHARE_PPM / 2;
        for _ in 0..100 {
            assert_eq!(bucket.admit(now, 1_000_000, 0, 0), Admission::Paused);
        }
        // A measurement settled at share 0 is owed, not turned into an
        // endless wall-clock debt.
        bucket.charge_back(200_000, 0, now);
        let later = now + 10_000_000;
        assert_eq!(bucket.admit(later, 100_000, half, 0), Admission::Now);
        // That launch paid its own 100 µs and the 200 µs owed, at 50%.
        assert_eq!(
            bucket.admit(later, 0, half, 0),
            Admission::At(later + 600_000)
        );
    }

    proptest::proptest! {
        /// Whatever a tenant writes into its bucket (any words) and
        /// whatever a launch costs, admission answers, and never with a
        /// wait longer than [`MAX_LEAD_NS`]; settling and skips never panic.
        #[test]
        fn any_bucket_a_tenant_writes_admits_within_the_lead_bound(
            words in proptest::array::uniform5(proptest::num::u64::ANY),
            now in 0u64..(1 << 62),
            cost in proptest::num::u64::ANY,
            share in proptest::num::u32::ANY,
            depth in 0u64..10_000_000_000,
            delta in proptest::num::i64::ANY,
        ) {
            let bucket = TokenBucket::new();
            for (cell, word) in [
                &bucket.tat_ns,
                &bucket.refund_ns,
                &bucket.owed_ns,
                &bucket.skips_taken_ns,
                &bucket.tenant_key,
            ]
            .into_iter()
            .zip(words)
            {
                cell.0.store(word, Ordering::Relaxed);
            }
            for step in 0..4u64 {
                let at = now + step;
                if let Admission::At(go) = bucket.admit(at, cost, share, depth) {
                    proptest::prop_assert!(go - at <= MAX_LEAD_NS, "waits {} ns", go - at);
                }
                bucket.charge_back(delta, share, at);
                let _ = bucket.take_skips(words[3].wrapping_add(step), at);
                let _ = bucket.tenant_key();
            }
        }
    }
}
