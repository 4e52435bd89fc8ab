//! What each kind of launch costs in GPU time, learned from measurements.
//!
//! A launch is keyed by what determines its duration as far as we can see:
//! the function and its grid size (or the executable graph). The table is
//! lock-free open addressing in a fixed array (no allocation on the launch
//! path); entries are never removed. Each entry also counts its launches:
//! those since the last measurement were all charged that measurement, so
//! a new one can charge back the exact difference.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const CAPACITY_BITS: u32 = 12;
const CAPACITY: usize = 1 << CAPACITY_BITS;
const MAX_PROBES: usize = 64;

/// What a launch is charged before anything of its kind was measured.
pub const FIRST_GUESS_NS: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchKey(u64);

impl LaunchKey {
    /// A kernel launch of `function` with `blocks` thread blocks in all.
    pub fn kernel(function: usize, blocks: u64) -> Self {
        Self::mix(function as u64, blocks, 0x9E37_79B9_7F4A_7C15)
    }

    /// A launch of the executable graph `exec`.
    pub fn graph(exec: usize) -> Self {
        Self::mix(exec as u64, 0, 0xD6E8_FEB8_6659_FD93)
    }

    /// `b` spread over all 64 bits by one multiplication (so that two
    /// functions at nearby addresses with different grids do not meet), then
    /// the sum multiplied by an odd constant (a bijection: distinct sums stay
    /// distinct keys) whose high bits depend on every input bit and place the
    /// key in the table ([`EstimateTable::entry`]). A full 64-bit finaliser
    /// cost every launch about 15 instructions more for nothing the table
    /// needs. The lowest bit is set (0 marks an empty slot): two kinds
    /// whose products differ in that bit alone, one pair in 2^63, would
    /// share an estimate.
    fn mix(a: u64, b: u64, seed: u64) -> Self {
        LaunchKey(
            (a ^ seed ^ b.wrapping_mul(0x94D0_49BB_1331_11EB)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
                | 1,
        )
    }

    /// Where the key's probe starts: its high bits (Fibonacci hashing).
    fn slot(self) -> usize {
        (self.0 >> (64 - CAPACITY_BITS)) as usize
    }
}

pub struct Entry {
    key: AtomicU64,
    /// Measured duration (ns); 0 until the first measurement.
    estimate_ns: AtomicU64,
    /// Launches of this kind ever charged (the launch path's only write).
    launches: AtomicU64,
    /// `launches` when the last measurement was settled: the launches in
    /// between were all charged the estimate of that time.
    settled_launches: AtomicU64,
    /// Time one launch in this many (see [`sampling_period`]).
    sample_every: AtomicU64,
    /// A sample of this kind is being timed.
    sampling: AtomicBool,
}

/// Host time a sample costs on a real driver, counted generously: its event
/// records (up to six), their queries and the elapsed-time reads.
const SAMPLE_COST_NS: u64 = 10_000;
/// Fewest launches between two samples of one kind.
pub const MIN_SAMPLE_EVERY: u64 = 4;
/// Most launches between two samples of one kind while its estimate moves.
pub const MAX_SAMPLE_EVERY: u64 = 256;
/// Most launches between two samples of a kind whose samples keep agreeing
/// with its estimate: each agreeing sample doubles the period up to this,
/// so a steady program pays for sampling almost never (a sampled launch
/// makes four or more extra driver calls, each about a launch's cost on a
/// real driver).
pub const MAX_STABLE_SAMPLE_EVERY: u64 = 4096;
/// A sample within this fraction (1/32, about 3%) of the estimate agrees
/// with it: the period doubles.
const AGREEING_SHIFT: u32 = 5;
/// ... or within this many ns: two steps of the event timer, whose
/// resolution is about 0.5 µs (`cuEventElapsedTime`'s documentation). A
/// kernel of a few µs is never timed within 3%: on an H100 its samples and
/// the window's mean moved at every sample, so a no-op kind stayed at one
/// sample in 256 and sampling cost about 55 ns per launch.
const AGREEING_FLOOR_NS: u64 = 1_000;
/// A sample more than this fraction (1/4) above the estimate may mean the
/// kind got slower: the period falls back to the base one, so the window
/// renews quickly. In between (noise: waits for other processes, host
/// time) the period stays.
const DIVERGING_SHIFT: u32 = 2;
/// ... and more than this many ns (a few timer steps) away.
const DIVERGING_FLOOR_NS: u64 = 4_000;

/// Whether `ns` is within what timing noise explains of `estimate_ns`.
fn agrees(ns: u64, estimate_ns: u64) -> bool {
    ns.abs_diff(estimate_ns) <= (estimate_ns >> AGREEING_SHIFT).max(AGREEING_FLOOR_NS)
}

/// Whether `ns` is so far from `estimate_ns` that the kind may have changed.
fn diverges(ns: u64, estimate_ns: u64) -> bool {
    ns.abs_diff(estimate_ns) > (estimate_ns >> DIVERGING_SHIFT).max(DIVERGING_FLOOR_NS)
}

/// How often a kind of `estimate_ns` is timed: as often as possible (one
/// in [`MIN_SAMPLE_EVERY`]) while sampling costs at most about 1% of the GPU
/// time the kind uses, so short kernels are timed less often. A power of
/// two, so the launch path tests it with a mask.
pub fn sampling_period(estimate_ns: u64) -> u64 {
    (SAMPLE_COST_NS * 100)
        .div_ceil(estimate_ns.max(1))
        .clamp(MIN_SAMPLE_EVERY, MAX_SAMPLE_EVERY)
        .next_power_of_two()
}

impl Entry {
    const fn empty() -> Self {
        Entry {
            key: AtomicU64::new(0),
            estimate_ns: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            settled_launches: AtomicU64::new(0),
            sample_every: AtomicU64::new(MIN_SAMPLE_EVERY),
            sampling: AtomicBool::new(false),
        }
    }

    pub fn estimate_ns(&self) -> Option<u64> {
        match self.estimate_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(ns),
        }
    }

    /// Launches charged since the last measurement.
    pub fn unmeasured_launches(&self) -> u64 {
        self.launches
            .load(Ordering::Relaxed)
            .saturating_sub(self.settled_launches.load(Ordering::Relaxed))
    }

    /// Records a launch (charged the current estimate, or [`FIRST_GUESS_NS`]
    /// before there is one); returns how many launches of this kind came
    /// before it.
    #[inline]
    pub fn charge(&self) -> u64 {
        self.launches.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the launch that had `launches_before` predecessors is one to
    /// time.
    #[inline]
    pub fn due_for_sample(&self, launches_before: u64) -> bool {
        launches_before & (self.sample_every.load(Ordering::Relaxed) - 1) == 0
    }

    /// Claims the right to time a sample (one at a time per kind).
    pub fn start_sampling(&self) -> bool {
        !self.sampling.swap(true, Ordering::AcqRel)
    }

    /// Whether a sample of this kind is being timed now.
    pub fn sampling(&self) -> bool {
        self.sampling.load(Ordering::Acquire)
    }

    pub fn stop_sampling(&self) {
        self.sampling.store(false, Ordering::Release);
    }

    /// Installs a new estimate (made with a sample of `measured_ns`) and
    /// returns the GPU time the launches since the previous one were
    /// under-charged (negative: over-charged).
    ///
    /// A sample that may hold another process's time slice (`trusted`
    /// false: a kernel longer than a slice timed without a quiet hold, see
    /// [`crate::sm_time::quiet_samples`]) says nothing about the kind by
    /// its distance from the estimate, so it changes the sampling period
    /// only if the estimate moved.
    pub fn settle_sample(&self, estimate_ns: u64, measured_ns: u64, trusted: bool) -> i64 {
        let estimate_ns = estimate_ns.max(1);
        let previous = self.estimate_ns.swap(estimate_ns, Ordering::AcqRel);
        let base = sampling_period(estimate_ns);
        let current = self.sample_every.load(Ordering::Relaxed).max(base);
        // A window's mean moves a little with every sample; only a move
        // beyond noise is a new estimate.
        let moved = previous == 0 || !agrees(estimate_ns, previous);
        let every = if moved || (trusted && diverges(measured_ns, estimate_ns)) {
            base
        } else if trusted && agrees(measured_ns, estimate_ns) {
            (current * 2).min(MAX_STABLE_SAMPLE_EVERY)
        } else {
            current
        };
        self.sample_every.store(every, Ordering::Relaxed);
        let charged_each = match previous {
            0 => FIRST_GUESS_NS,
            previous => previous,
        };
        let launches = self.launches.load(Ordering::Acquire);
        let pending =
            launches.saturating_sub(self.settled_launches.swap(launches, Ordering::AcqRel));
        (pending as i128 * (estimate_ns as i128 - charged_each as i128))
            .clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }
}

pub struct EstimateTable {
    entries: [Entry; CAPACITY],
    /// Shared by kinds that found no room (charged the first guess, or the
    /// last measured duration, never sampled).
    overflow: Entry,
}

impl EstimateTable {
    pub const fn new() -> Self {
        EstimateTable {
            entries: [const { Entry::empty() }; CAPACITY],
            overflow: Entry::empty(),
        }
    }

    /// The entry for `key` where it is found in the slot its probe starts
    /// at: the common case, which the launch path tries first inline.
    #[inline(always)]
    pub fn found_at_start(&self, key: LaunchKey) -> Option<&Entry> {
        let first = &self.entries[key.slot()];
        (first.key.load(Ordering::Acquire) == key.0).then_some(first)
    }

    /// The entry for `key`, inserting it if new, and whether it is the key's
    /// own (`false`: the table is full around this key and the shared
    /// overflow entry was returned).
    #[inline(always)]
    pub fn entry(&self, key: LaunchKey) -> (&Entry, bool) {
        // The probe onwards out of line.
        match self.found_at_start(key) {
            Some(first) => (first, true),
            None => self.probe(key),
        }
    }

    #[inline(never)]
    fn probe(&self, key: LaunchKey) -> (&Entry, bool) {
        let start = key.slot();
        for probe in 0..MAX_PROBES {
            let entry = &self.entries[(start + probe) % CAPACITY];
            let current = entry.key.load(Ordering::Acquire);
            if current == key.0 {
                return (entry, true);
            }
            if current == 0 {
                match entry
                    .key
                    .compare_exchange(0, key.0, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return (entry, true),
                    Err(other) if other == key.0 => return (entry, true),
                    Err(_) => continue,
                }
            }
        }
        (&self.overflow, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_told_apart_and_found_again() {
        let table = Box::new(EstimateTable::new());
        let a = LaunchKey::kernel(0x7f00_1000, 1320);
        let b = LaunchKey::kernel(0x7f00_1000, 2640);
        let g = LaunchKey::graph(0x7f00_1000);
        assert!(a != b && a != g && b != g);
        let (ea, placed) = table.entry(a);
        assert!(placed);
        assert!(std::ptr::eq(ea, table.entry(a).0));
        assert!(!std::ptr::eq(ea, table.entry(b).0));
    }

    #[test]
    fn settling_charges_back_the_exact_difference() {
        let table = Box::new(EstimateTable::new());
        let (entry, _) = table.entry(LaunchKey::kernel(1, 1));
        assert_eq!(entry.estimate_ns(), None);
        for _ in 0..10 {
            entry.charge();
        }
        // Ten launches charged 100 µs each really took 250 µs each.
        assert_eq!(entry.settle_sample(250_000, 250_000, true), 10 * 150_000);
        assert_eq!(entry.estimate_ns(), Some(250_000));
        entry.charge();
        entry.charge();
        assert_eq!(entry.settle_sample(200_000, 200_000, true), -100_000);
        assert_eq!(
            entry.settle_sample(200_000, 200_000, true),
            0,
            "nothing pending"
        );
        assert!(entry.start_sampling());
        assert!(!entry.start_sampling());
        entry.stop_sampling();
        assert!(entry.start_sampling());
    }

    #[test]
    fn short_kernels_are_timed_less_often() {
        assert_eq!(sampling_period(5_000_000), MIN_SAMPLE_EVERY);
        assert_eq!(sampling_period(100_000), 16);
        assert_eq!(sampling_period(20_000), 64);
        assert_eq!(sampling_period(1_000), MAX_SAMPLE_EVERY);
        let table = Box::new(EstimateTable::new());
        let (entry, _) = table.entry(LaunchKey::kernel(2, 1));
        assert!(
            (0..4)
                .map(|n| entry.due_for_sample(n))
                .eq([true, false, false, false])
        );
        entry.settle_sample(100_000, 100_000, true);
        assert!(entry.due_for_sample(32) && !entry.due_for_sample(4) && !entry.due_for_sample(10));
    }

    #[test]
    fn a_steady_kind_is_sampled_ever_less_and_a_change_restores_the_rate() {
        let table = Box::new(EstimateTable::new());
        let (entry, _) = table.entry(LaunchKey::kernel(3, 1));
        let every = || entry.sample_every.load(Ordering::Relaxed);
        entry.settle_sample(100_000, 100_000, true);
        assert_eq!(every(), 16);
        for _ in 0..20 {
            entry.settle_sample(100_000, 101_000, true);
        }
        assert_eq!(every(), MAX_STABLE_SAMPLE_EVERY);
        // Noise keeps the period; a sample far above the estimate (the
        // kernel may have changed) brings the base one back.
        entry.settle_sample(100_000, 115_000, true);
        assert_eq!(every(), MAX_STABLE_SAMPLE_EVERY);
        entry.settle_sample(100_000, 180_000, true);
        assert_eq!(every(), 16);
        entry.settle_sample(100_000, 100_000, true);
        assert_eq!(every(), 32);
        // A sample that may hold another process's slice neither resets
        // the period nor doubles it.
        entry.settle_sample(100_000, 180_000, false);
        entry.settle_sample(100_000, 100_000, false);
        assert_eq!(every(), 32);
        entry.settle_sample(90_000, 90_000, true);
        assert_eq!(every(), sampling_period(90_000));
    }

    #[test]
    fn a_kind_of_a_few_microseconds_timed_with_jitter_is_sampled_ever_less() {
        // A no-op kernel on a real GPU: samples a timer step or two apart,
        // so the window's mean moves slightly at every sample.
        let table = Box::new(EstimateTable::new());
        let (entry, _) = table.entry(LaunchKey::kernel(4, 1));
        let every = || entry.sample_every.load(Ordering::Relaxed);
        entry.settle_sample(3_000, 3_000, true);
        assert_eq!(every(), MAX_SAMPLE_EVERY);
        for (estimate, measured) in [(3_100, 3_500), (2_950, 2_500), (3_050, 3_400)]
            .into_iter()
            .cycle()
            .take(12)
        {
            entry.settle_sample(estimate, measured, true);
        }
        assert_eq!(every(), MAX_STABLE_SAMPLE_EVERY);
        // A kind that became much slower is timed at the base rate again.
        entry.settle_sample(3_000, 9_000, true);
        assert_eq!(every(), MAX_SAMPLE_EVERY);
    }

    #[test]
    fn kinds_of_aligned_functions_and_common_grids_spread_over_the_table() {
        // Function handles are aligned heap addresses close together; grids
        // are small counts. 1,024 such kinds placed at random in 4,096 slots
        // start their probes at about 906 distinct slots.
        let mut slots = std::collections::HashSet::new();
        for function in 0..256usize {
            for blocks in [1u64, 108, 132, 4096] {
                slots.insert(LaunchKey::kernel(0x5555_0000_1000 + function * 0x40, blocks).slot());
            }
        }
        assert!(slots.len() > 850, "{} distinct slots", slots.len());
    }

    #[test]
    fn functions_whose_addresses_differ_like_their_grids_are_still_apart() {
        // Addresses that differ only in the bits a grid count would touch
        // if it were folded in without mixing.
        let f = 0x5555_0000_1000usize;
        for (b1, b2) in [(1u64, 2u64), (108, 132), (1, 4096)] {
            for shift in [0, 29, 32] {
                let g = f ^ (((b1 ^ b2) << shift) as usize);
                assert_ne!(LaunchKey::kernel(f, b1), LaunchKey::kernel(g, b2));
            }
        }
    }

    #[test]
    fn a_full_neighbourhood_falls_back_to_the_overflow_entry() {
        let table = Box::new(EstimateTable::new());
        let mut overflowed = false;
        for i in 0..(CAPACITY as u64 + 10) {
            if !table.entry(LaunchKey::kernel(i as usize, i)).1 {
                overflowed = true;
            }
        }
        assert!(overflowed);
    }
}
