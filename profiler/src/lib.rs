//! `dilu profile`: finds a function's batch size, SM request and SM limit by
//! measuring a few (batch, SM share) configurations instead of all of them.
//!
//! It owns the search (which configurations to measure, in what order, and
//! what to conclude) and the profile it writes. How one configuration is
//! measured is behind [`measure::Measure`]: a measured table
//! ([`table::ProfileTable`], for comparing search methods on real
//! measurements without running anything) or the program itself run under
//! `dilu run` (the `dilu` CLI supplies that backend). It touches nothing else:
//! no daemon state, no driver.
//!
//! Modules:
//! - [`table`]: a measured table (`batch,sm,latency_s,throughput` CSV).
//! - [`measure`]: the backend trait, and [`measure::Trials`], which counts
//!   and remembers what a search measured.
//! - [`search`]: the searches (dilu's, Dilu's published HGSS and binary
//!   search, exhaustive).
//! - [`profile`]: the profile a search produces, and the file format.
//! - [`compare`]: every method on the same tables and SLOs, side by side.

pub mod compare;
pub mod measure;
pub mod profile;
pub mod search;
pub mod table;

/// One configuration: a batch size and an SM share in percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Config {
    pub batch: u32,
    pub sm: u32,
}

/// What one configuration measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Latency of one batch (a request), seconds.
    pub latency_s: f64,
    /// Samples per second.
    pub throughput: f64,
    /// Peak device memory, bytes, where the backend knows it.
    pub memory_peak: Option<u64>,
}

impl Sample {
    /// Throughput per SM percent: what the latency search maximises (Dilu's
    /// "efficiency").
    pub fn efficiency(&self, sm: u32) -> f64 {
        self.throughput / f64::from(sm)
    }
}

/// The configurations a search may measure: batch sizes and SM shares, each
/// ascending and without repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grid {
    pub batches: Vec<u32>,
    pub sms: Vec<u32>,
}

impl Grid {
    /// A grid from any lists: sorted, repeats removed. Errors when either is
    /// empty or holds a share outside 1–100 or a batch of 0.
    pub fn new(mut batches: Vec<u32>, mut sms: Vec<u32>) -> Result<Grid, String> {
        batches.sort_unstable();
        batches.dedup();
        sms.sort_unstable();
        sms.dedup();
        if batches.is_empty() || sms.is_empty() {
            return Err("the search grid needs at least one batch size and one SM share".into());
        }
        if batches[0] == 0 {
            return Err("batch sizes start at 1".into());
        }
        if sms[0] == 0 || sms[sms.len() - 1] > 100 {
            return Err("SM shares are percentages from 1 to 100".into());
        }
        Ok(Grid { batches, sms })
    }

    /// Powers of two from 1 to `max_batch`, and shares from `step` to 100 in
    /// steps of `step` (100 always included).
    pub fn standard(max_batch: u32, step: u32) -> Result<Grid, String> {
        if step == 0 || step > 100 {
            return Err("the SM step is a percentage from 1 to 100".into());
        }
        let batches = std::iter::successors(Some(1u32), |b| b.checked_mul(2))
            .take_while(|b| *b <= max_batch.max(1))
            .collect();
        let mut sms: Vec<u32> = (1..=100 / step).map(|k| k * step).collect();
        sms.push(100);
        Grid::new(batches, sms)
    }

    pub fn max_sm(&self) -> u32 {
        self.sms[self.sms.len() - 1]
    }
}
