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

#[cfg(test)]
mod tests {
    use super::*;

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
