//! Arrival patterns: a relative request rate per second (Dilu's workload
//! files, `bench/data/dilu-workloads/`), scaled to requests per second.

/// One pattern: a relative rate for each second, repeated when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    pub name: String,
    pub rates: Vec<f64>,
}

impl Pattern {
    /// Reads one number (≥ 0) per line; blank lines are skipped, and a bad
    /// line is named.
    pub fn parse(name: &str, text: &str) -> Result<Self, String> {
        let mut rates = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            match line.parse::<f64>() {
                Ok(rate) if rate.is_finite() && rate >= 0.0 => rates.push(rate),
                _ => {
                    return Err(format!(
                        "{name}: line {}: {line:?} is not a rate >= 0",
                        index + 1
                    ));
                }
            }
        }
        if rates.iter().all(|rate| *rate == 0.0) {
            return Err(format!("{name}: no second with requests"));
        }
        Ok(Self {
            name: name.to_string(),
            rates,
        })
    }

    /// A generated pattern none of the scalers was tuned on: one day
    /// compressed into `seconds` (a rate between 0.1 and 1, lowest at the
    /// start, highest half-way) with spikes on top: about one every two
    /// minutes, each 5 to 30 s long, raising the rate by 1 to 3 times the
    /// day's peak at its height, with a sharp rise and a gradual fall.
    /// The same `seed` gives the same pattern.
    pub fn diurnal_with_spikes(seconds: usize, seed: u64) -> Self {
        let mut rng = crate::rng::SeededRng::new(seed);
        let day = |second: usize| {
            let phase = 2.0 * std::f64::consts::PI * second as f64 / seconds.max(1) as f64;
            0.55 - 0.45 * phase.cos()
        };
        let mut rates: Vec<f64> = (0..seconds).map(day).collect();
        let mut second = 0.0;
        loop {
            second += rng.exponential(120.0);
            let start = second as usize;
            if start >= seconds {
                break;
            }
            let length = rng.between(5.0, 30.0);
            let height = rng.between(1.0, 3.0);
            for (offset, rate) in rates[start..].iter_mut().enumerate() {
                let offset = offset as f64;
                if offset >= length {
                    break;
                }
                // Full height within two seconds, then falling linearly.
                let rise = ((offset + 1.0) / 2.0).min(1.0);
                *rate += height * rise * (1.0 - offset / length);
            }
        }
        Self {
            name: format!("diurnal-spikes-{seed}"),
            rates,
        }
    }

    pub fn seconds(&self) -> usize {
        self.rates.len()
    }

    pub fn peak(&self) -> f64 {
        self.rates.iter().copied().fold(0.0, f64::max)
    }

    /// The relative rate in second `second`, counted from `offset` into the
    /// pattern (so functions sharing a pattern need not peak together).
    pub fn rate(&self, second: usize, offset: usize) -> f64 {
        self.rates[(second + offset) % self.rates.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_wrap_and_bad_lines_are_named() {
        let pattern = Pattern::parse("p", "0.5\n\n2\n0\n").unwrap();
        assert_eq!(pattern.rates, [0.5, 2.0, 0.0]);
        assert_eq!(
            (pattern.peak(), pattern.rate(4, 0), pattern.rate(0, 1)),
            (2.0, 2.0, 2.0)
        );
        let error = Pattern::parse("p", "1\n-3\n").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        assert!(Pattern::parse("p", "0\n0\n").is_err());
    }

    #[test]
    fn a_generated_day_repeats_by_seed_and_has_spikes_above_it() {
        let day = Pattern::diurnal_with_spikes(1200, 7);
        assert_eq!(day, Pattern::diurnal_with_spikes(1200, 7));
        assert_ne!(day, Pattern::diurnal_with_spikes(1200, 8));
        assert_eq!(day.seconds(), 1200);
        // The night is quiet, noon is not; spikes go past the day's 1.0.
        assert!(day.rates[0] < 0.5 && day.rates[600] >= 1.0);
        let spiking = day.rates.iter().filter(|&&rate| rate > 1.05).count();
        assert!(spiking >= 20, "{spiking} seconds above the day's peak");
        assert!(
            day.rates
                .iter()
                .all(|rate| rate.is_finite() && *rate >= 0.1)
        );
    }
}
