//! A histogram of durations with power-of-two buckets, updated with one
//! relaxed atomic add and readable by another process at any time.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bucket `i` counts values in `[2^(i-1), 2^i)` ns (bucket 0 counts 0);
/// the last bucket also takes everything longer (2^46 ns ≈ 19 h).
pub const BUCKETS: usize = 48;

#[repr(C)]
pub struct Log2Histogram {
    counts: [AtomicU64; BUCKETS],
}

/// The bucket a value falls in.
pub fn bucket_of(ns: u64) -> usize {
    ((u64::BITS - ns.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// The largest value bucket `i` holds (its upper bound, inclusive).
pub fn bucket_upper_ns(i: usize) -> u64 {
    if i == 0 { 0 } else { (1u64 << i) - 1 }
}

impl Log2Histogram {
    pub fn record(&self, ns: u64) {
        self.counts[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of the counts (each read individually; concurrent records may
    /// land on either side).
    pub fn snapshot(&self) -> [u64; BUCKETS] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }
}

/// Summary statistics of a snapshot.
pub trait HistogramSnapshot {
    fn total(&self) -> u64;
    /// Upper bound of the bucket holding quantile `q` (0..=1), or `None`
    /// when empty. At most a factor of two above the true value.
    fn quantile_upper_ns(&self, q: f64) -> Option<u64>;
    /// Counts recorded since `earlier` (a snapshot of the same histogram).
    fn since(&self, earlier: &Self) -> Self;
}

impl HistogramSnapshot for [u64; BUCKETS] {
    fn total(&self) -> u64 {
        // Counts live in memory tenants write: never trust them not to overflow.
        self.iter()
            .fold(0u64, |sum, &count| sum.saturating_add(count))
    }

    fn quantile_upper_ns(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, count) in self.iter().enumerate() {
            seen = count.saturating_add(seen);
            if seen >= rank {
                return Some(bucket_upper_ns(i));
            }
        }
        Some(bucket_upper_ns(BUCKETS - 1))
    }

    fn since(&self, earlier: &Self) -> Self {
        std::array::from_fn(|i| self[i].saturating_sub(earlier[i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> Log2Histogram {
        Log2Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    #[test]
    fn values_land_in_their_power_of_two_bucket() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(1023), 10);
        assert_eq!(bucket_of(1024), 11);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for ns in [1u64, 7, 1000, 123_456_789] {
            let b = bucket_of(ns);
            assert!(ns <= bucket_upper_ns(b) && ns > bucket_upper_ns(b - 1));
        }
    }

    #[test]
    fn quantiles_are_within_a_factor_of_two() {
        let h = empty();
        for _ in 0..90 {
            h.record(1_000_000);
        }
        for _ in 0..10 {
            h.record(50_000_000);
        }
        let s = h.snapshot();
        assert_eq!(s.total(), 100);
        let p50 = s.quantile_upper_ns(0.5).unwrap();
        assert!((1_000_000..2_000_000).contains(&p50), "p50 {p50}");
        let p99 = s.quantile_upper_ns(0.99).unwrap();
        assert!((50_000_000..100_000_000).contains(&p99), "p99 {p99}");
        let before = s;
        h.record(5);
        assert_eq!(h.snapshot().since(&before).total(), 1);
        assert_eq!(empty().snapshot().quantile_upper_ns(0.5), None);
    }
}
