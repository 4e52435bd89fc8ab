//! Measuring one configuration, and keeping count of what a search measured.

use crate::table::ProfileTable;
use crate::{Config, Sample};
use std::collections::HashMap;

/// A way to measure one configuration. `Ok(None)` means the configuration
/// cannot run (no table row; the program failed or ran out of memory there):
/// a search treats it as not meeting any SLO and as zero throughput.
pub trait Measure {
    fn measure(&mut self, config: Config) -> Result<Option<Sample>, String>;
}

impl Measure for ProfileTable {
    fn measure(&mut self, config: Config) -> Result<Option<Sample>, String> {
        Ok(self.get(config))
    }
}

/// Wraps a backend: each configuration is measured at most once (a search
/// that asks again gets the remembered answer), and the trials are counted
/// in the order they ran. `on_trial` sees each new measurement (progress
/// lines).
pub struct Trials<'a> {
    backend: &'a mut dyn Measure,
    seen: HashMap<Config, Option<Sample>>,
    order: Vec<Config>,
    on_trial: Option<&'a mut dyn FnMut(Config, Option<Sample>)>,
}

impl<'a> Trials<'a> {
    pub fn new(backend: &'a mut dyn Measure) -> Trials<'a> {
        Trials {
            backend,
            seen: HashMap::new(),
            order: Vec::new(),
            on_trial: None,
        }
    }

    pub fn with_progress(
        backend: &'a mut dyn Measure,
        on_trial: &'a mut dyn FnMut(Config, Option<Sample>),
    ) -> Trials<'a> {
        Trials {
            on_trial: Some(on_trial),
            ..Trials::new(backend)
        }
    }

    pub fn get(&mut self, config: Config) -> Result<Option<Sample>, String> {
        if let Some(known) = self.seen.get(&config) {
            return Ok(*known);
        }
        let sample = self.backend.measure(config)?;
        self.seen.insert(config, sample);
        self.order.push(config);
        if let Some(report) = self.on_trial.as_mut() {
            report(config, sample);
        }
        Ok(sample)
    }

    /// Whether `config` meets `slo_s` (an unavailable one never does).
    pub fn meets(&mut self, config: Config, slo_s: f64) -> Result<bool, String> {
        Ok(self.get(config)?.is_some_and(|s| s.latency_s <= slo_s))
    }

    /// Throughput at `config`, 0 where it cannot run.
    pub fn throughput(&mut self, config: Config) -> Result<f64, String> {
        Ok(self.get(config)?.map_or(0.0, |s| s.throughput))
    }

    /// How many distinct configurations have been measured.
    pub fn count(&self) -> usize {
        self.order.len()
    }

    /// A measurement already made (no new trial).
    pub fn known(&self, config: Config) -> Option<Sample> {
        self.seen.get(&config).copied().flatten()
    }

    /// The highest memory peak any trial reported.
    pub fn memory_peak(&self) -> Option<u64> {
        self.seen
            .values()
            .flatten()
            .filter_map(|s| s.memory_peak)
            .max()
    }
}
