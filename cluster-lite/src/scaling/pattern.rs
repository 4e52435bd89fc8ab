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
}
