//! dilu benchmarks. Each benchmark measures dilu and the thing it is
//! compared with side by side in one run and prints the ratio; results that
//! are committed live in `bench/results/`. Run them with `scripts/bench.sh`.

/// Median of a sample (sorts it).
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

#[cfg(test)]
mod tests {
    #[test]
    fn median_of_odd_and_even_samples() {
        assert_eq!(super::median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(super::median(&mut []).is_nan());
    }
}
