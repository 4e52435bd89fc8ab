//! A quantile of measured latencies and how far it can be trusted: the
//! distribution-free interval of order statistics that holds the true
//! quantile with a stated probability, whatever the latencies' distribution.
//!
//! Why: a run's p99 is one order statistic. From 200 requests it is the
//! second largest, and the same code measured twice gave a primary's p99
//! alone as 0.91x and 1.21x of itself; a p99 ratio needs its range beside
//! it before "within 1.10x" means anything.
//!
//! How: of n independent latencies, the number below the true q-quantile is
//! Binomial(n, q). The l-th smallest latency is at or below the quantile
//! unless fewer than l are, and the u-th at or above it unless u or more
//! are below; so [x(l), x(u)] misses it with probability
//! P(B < l) + P(B >= u), each tail kept at most `tail`. Where even the
//! largest latency leaves more than `tail` of the chance above it, the run
//! is too short to bound the quantile from above: no upper end.

/// The q-quantile of `sorted` (ascending), as the workloads report it: the
/// ceil(q n)-th smallest (0 with no latencies).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return 0.0;
    }
    sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1]
}

/// The interval of `sorted` (ascending) that holds its distribution's true
/// q-quantile except with probability at most `tail` on each side: (lower,
/// upper), `None` where the latencies cannot bound that side (too few of
/// them).
pub fn interval(sorted: &[f64], q: f64, tail: f64) -> (Option<f64>, Option<f64>) {
    let n = sorted.len();
    if n == 0 || !(0.0..1.0).contains(&q) || q == 0.0 {
        return (None, None);
    }
    let pmf = binomial_pmf(n, q);
    // Lower end: the largest l with P(B < l) <= tail (B < l: fewer than l
    // latencies below the quantile).
    let mut below = 0.0;
    let mut lower = None;
    for (k, p) in pmf.iter().enumerate().take(n) {
        below += p;
        // P(B < k + 1) = P(B <= k).
        if below > tail {
            break;
        }
        lower = Some(k + 1);
    }
    // Upper end: the smallest u with P(B >= u) <= tail.
    let mut above = 0.0;
    let mut upper = None;
    for k in (1..=n).rev() {
        above += pmf[k];
        if above > tail {
            break;
        }
        upper = Some(k);
    }
    (
        lower.map(|rank| sorted[rank - 1]),
        upper.map(|rank| sorted[rank - 1]),
    )
}

/// P(B = k) for k in 0..=n, B ~ Binomial(n, q), 0 < q < 1: built in logs
/// from k = n down (q^n alone underflows for large n) and scaled back.
fn binomial_pmf(n: usize, q: f64) -> Vec<f64> {
    let odds = ((1.0 - q) / q).ln();
    let mut logs = vec![0.0; n + 1];
    logs[n] = n as f64 * q.ln();
    for k in (1..=n).rev() {
        // P(k - 1) / P(k) = k / (n - k + 1) * (1 - q) / q.
        logs[k - 1] = logs[k] + (k as f64).ln() - ((n - k + 1) as f64).ln() + odds;
    }
    logs.into_iter().map(f64::exp).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (splitmix64), uniform in [0, 1).
    struct Uniform(u64);
    impl Uniform {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as f64 / u64::MAX as f64
        }
    }

    #[test]
    fn the_probabilities_add_up_for_large_runs() {
        for n in [1, 200, 100_000] {
            let total: f64 = binomial_pmf(n, 0.99).iter().sum();
            assert!((total - 1.0).abs() < 1e-9, "n = {n}: {total}");
        }
    }

    #[test]
    fn two_hundred_requests_cannot_bound_a_p99_from_above() {
        // The largest of 200 is below the true p99 with chance 0.99^200 =
        // 13%: no upper end at 1.25% a side.
        let sorted: Vec<f64> = (1..=200).map(f64::from).collect();
        let (lower, upper) = interval(&sorted, 0.99, 0.0125);
        assert_eq!(upper, None);
        let lower = lower.expect("a lower end");
        assert!((190.0..198.0).contains(&lower), "{lower}");
    }

    #[test]
    fn many_requests_pin_a_p99_down_around_its_estimate() {
        let sorted: Vec<f64> = (1..=10_000).map(f64::from).collect();
        let (lower, upper) = interval(&sorted, 0.99, 0.0125);
        let (lower, upper) = (lower.unwrap(), upper.unwrap());
        assert_eq!(quantile(&sorted, 0.99), 9900.0);
        // 2.24 standard deviations (9.95 ranks) either side of rank 9,900.
        assert!((9874.0..9882.0).contains(&lower), "{lower}");
        assert!((9918.0..9926.0).contains(&upper), "{upper}");
    }

    #[test]
    fn the_interval_holds_the_true_quantile_as_often_as_it_says() {
        // Uniform latencies in [0, 1): the true p99 is 0.99.
        let mut rng = Uniform(7);
        let trials = 400;
        let mut held = 0;
        for _ in 0..trials {
            let mut sorted: Vec<f64> = (0..2_000).map(|_| rng.next()).collect();
            sorted.sort_by(f64::total_cmp);
            let (lower, upper) = interval(&sorted, 0.99, 0.0125);
            if lower.unwrap() <= 0.99 && 0.99 <= upper.unwrap() {
                held += 1;
            }
        }
        // At least 97.5% in expectation; 95% leaves room for chance over
        // 400 trials (the standard error is under 1%).
        assert!(
            held as f64 >= 0.95 * trials as f64,
            "held {held} of {trials}"
        );
        assert!(held < trials, "an interval that always holds is too wide");
    }
}
