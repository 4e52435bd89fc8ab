//! Order statistics of benchmark samples.

/// Median of a sample (sorts it); NaN for an empty sample.
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (0–100) by nearest rank: the smallest sample with
/// at least `p`% of the sample at or below it. Sorts the sample; NaN for an
/// empty one.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    assert!((0.0..=100.0).contains(&p), "percentile {p} outside 0..=100");
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    samples[rank.clamp(1, n) - 1]
}

/// Seeded draws (xorshift64*), so that a benchmark measures the same
/// shapes in every run.
pub struct Draws(u64);

impl Draws {
    /// Draws from `state` as it is (the benchmarks' fixed seeds).
    pub fn from_state(state: u64) -> Draws {
        Draws(state | 1)
    }

    /// Draws from a user's seed `seed`, mixed with `base` so that nearby
    /// seeds give unrelated draws (and 0 no stuck state).
    pub fn from_seed(seed: u64, base: u64) -> Draws {
        Draws((seed ^ base).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let s = &mut self.0;
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        let unit = (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64;
        low + (high - low) * unit
    }

    /// Log-uniform in `[low, high)`: as many draws per factor of two.
    pub fn log_uniform(&mut self, low: f64, high: f64) -> f64 {
        self.uniform(low.ln(), high.ln()).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_repeat_per_seed_and_stay_in_range() {
        let take = |mut d: Draws| (0..100).map(|_| d.uniform(2.0, 3.0)).collect::<Vec<_>>();
        let a = take(Draws::from_seed(1, 99));
        assert_eq!(a, take(Draws::from_seed(1, 99)));
        assert_ne!(a, take(Draws::from_seed(2, 99)));
        assert!(a.iter().all(|x| (2.0..3.0).contains(x)));
        let mut d = Draws::from_state(7);
        assert!((0..100).all(|_| (0.05..3.0).contains(&d.log_uniform(0.05, 3.0))));
    }

    #[test]
    fn median_of_odd_and_even_samples() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&mut samples, 50.0), 50.0);
        assert_eq!(percentile(&mut samples, 99.0), 99.0);
        assert_eq!(percentile(&mut samples, 100.0), 100.0);
        assert_eq!(percentile(&mut samples, 0.0), 1.0);
        assert_eq!(percentile(&mut [7.0], 99.0), 7.0);
        assert_eq!(percentile(&mut [1.0, 2.0, 3.0], 50.0), 2.0);
        assert!(percentile(&mut [], 50.0).is_nan());
    }
}
