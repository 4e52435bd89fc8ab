//! A measured profile table, as Dilu's profiler writes them: one line per
//! configuration, `batch,sm,latency_s,throughput`, no header (a header line
//! naming those columns is accepted). Missing configurations are allowed (a
//! model that does not fit at a small share has no row there); a search that
//! asks for one gets "unavailable", as if the program had failed there.

use crate::{Config, Grid, Sample};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone)]
pub struct ProfileTable {
    rows: BTreeMap<Config, Sample>,
}

impl ProfileTable {
    pub fn load(path: &Path) -> Result<ProfileTable, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read profile table {}: {e}", path.display()))?;
        ProfileTable::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the CSV text. Every error names the line and what was expected.
    pub fn parse(text: &str) -> Result<ProfileTable, String> {
        let mut rows = BTreeMap::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if index == 0 && line.to_ascii_lowercase().starts_with("batch") {
                continue;
            }
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let expected = "expected batch,sm,latency_s,throughput (e.g. 4,30,0.021,190.5)";
            if fields.len() != 4 {
                return Err(format!(
                    "line {number}: {} fields, {expected}",
                    fields.len()
                ));
            }
            let number_at = |i: usize| -> Result<f64, String> {
                fields[i]
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| {
                        format!(
                            "line {number}: {:?} is not a number ≥ 0; {expected}",
                            fields[i]
                        )
                    })
            };
            let whole = |v: f64, what: &str, max: f64| -> Result<u32, String> {
                if v.fract() == 0.0 && v >= 1.0 && v <= max {
                    Ok(v as u32)
                } else {
                    Err(format!(
                        "line {number}: {what} {v} must be a whole number from 1 to {max}"
                    ))
                }
            };
            let batch = whole(number_at(0)?, "batch", 1_048_576.0)?;
            let sm = whole(number_at(1)?, "SM share", 100.0)?;
            let latency_s = number_at(2)?;
            let throughput = number_at(3)?;
            let config = Config { batch, sm };
            let sample = Sample {
                latency_s,
                throughput,
                memory_peak: None,
            };
            if rows.insert(config, sample).is_some() {
                return Err(format!(
                    "line {number}: batch {batch} at SM {sm}% appears twice"
                ));
            }
        }
        if rows.is_empty() {
            return Err(
                "no configurations (expected lines of batch,sm,latency_s,throughput)".into(),
            );
        }
        Ok(ProfileTable { rows })
    }

    /// Every batch size and SM share that appears in the table.
    pub fn grid(&self) -> Grid {
        let batches = self.rows.keys().map(|c| c.batch).collect();
        let sms = self.rows.keys().map(|c| c.sm).collect();
        Grid::new(batches, sms).expect("a parsed table has valid, non-empty axes")
    }

    pub fn get(&self, config: Config) -> Option<Sample> {
        self.rows.get(&config).copied()
    }

    /// Every distinct latency in the table, ascending: the SLOs at which the
    /// set of configurations meeting it changes.
    pub fn latency_breakpoints(&self) -> Vec<f64> {
        let mut all: Vec<f64> = self.rows.values().map(|s| s.latency_s).collect();
        all.sort_by(f64::total_cmp);
        all.dedup();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dilu_format_with_and_without_header() {
        let table =
            ProfileTable::parse("1.000000,10.000000,0.016,61.9\n2,10,0.023,83.7\n").unwrap();
        assert_eq!(table.grid().batches, vec![1, 2]);
        let with_header =
            ProfileTable::parse("batch,sm,latency_s,throughput\n1,10,0.016,61.9\n").unwrap();
        assert_eq!(
            with_header
                .get(Config { batch: 1, sm: 10 })
                .unwrap()
                .throughput,
            61.9
        );
    }

    #[test]
    fn bad_lines_name_the_line_and_the_format() {
        for (text, needle) in [
            ("1,10,0.01\n", "line 1: 3 fields"),
            ("1,10,0.01,5\n1,200,0.01,5\n", "line 2: SM share 200"),
            ("1,10,x,5\n", "\"x\" is not a number"),
            ("1.5,10,0.01,5\n", "batch 1.5"),
            ("1,10,0.01,5\n1,10,0.02,6\n", "appears twice"),
            ("1,10,NaN,5\n", "not a number"),
            ("\n# only a comment\n", "no configurations"),
        ] {
            let error = ProfileTable::parse(text).unwrap_err();
            assert!(error.contains(needle), "{text:?}: {error}");
        }
    }
}
