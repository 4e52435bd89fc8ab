//! One inference function as the scaling simulation serves it: its batch
//! size, SLO, SM request and limit (found by `dilu profile`'s search on a
//! measured table) and its throughput and batch latency at any SM share
//! (linear between the table's measured shares at that batch).

use dilu_profile::measure::Trials;
use dilu_profile::profile::{Class, Question, find};
use dilu_profile::search::Method;
use dilu_profile::table::ProfileTable;
use dilu_profile::{Config, Grid};

/// A function's serving model.
#[derive(Debug, Clone)]
pub struct Service {
    pub name: String,
    pub batch: u32,
    /// SLO on one request: waiting plus its batch.
    pub slo_s: f64,
    /// SM shares (0–1) from the profile.
    pub request: f64,
    pub limit: f64,
    /// (share, batch latency s, throughput requests/s), ascending share.
    curve: Vec<(f64, f64, f64)>,
}

impl Service {
    /// Profiles `table` for a batch latency of `batch_slo_s` (dilu's
    /// search: batch and request, then the limit); a request's SLO is
    /// `slo_factor` times that (time to wait for a batch in progress).
    pub fn profiled(
        name: &str,
        table: &ProfileTable,
        batch_slo_s: f64,
        slo_factor: f64,
    ) -> Result<Self, String> {
        let grid: Grid = table.grid();
        let mut backend = table.clone();
        let mut trials = Trials::new(&mut backend);
        let profile = find(
            &mut trials,
            &grid,
            &Question {
                class: Class::Latency,
                slo_s: Some(batch_slo_s),
                batch: None,
                method: Method::Dilu,
            },
        )
        .map_err(|error| format!("{name}: {error}"))?;
        let curve: Vec<(f64, f64, f64)> = grid
            .sms
            .iter()
            .filter_map(|&sm| {
                let sample = table.get(Config {
                    batch: profile.batch,
                    sm,
                })?;
                Some((f64::from(sm) / 100.0, sample.latency_s, sample.throughput))
            })
            .collect();
        if curve.is_empty() {
            return Err(format!("{name}: no row at batch {}", profile.batch));
        }
        Ok(Self {
            name: name.to_string(),
            batch: profile.batch,
            slo_s: batch_slo_s * slo_factor,
            request: f64::from(profile.sm_request) / 100.0,
            limit: f64::from(profile.sm_limit) / 100.0,
            curve,
        })
    }

    /// Requests per second at SM share `share`.
    pub fn throughput(&self, share: f64) -> f64 {
        self.at(share, |point| point.2)
    }

    /// Latency of one batch at SM share `share`, seconds.
    pub fn batch_latency(&self, share: f64) -> f64 {
        self.at(share, |point| point.1)
    }

    /// The smallest share in [request, limit] serving `rate` requests per
    /// second, or the limit when none does.
    pub fn share_for(&self, rate: f64) -> f64 {
        const STEP: f64 = 0.01;
        let mut share = self.request;
        while share < self.limit && self.throughput(share) < rate {
            share = (share + STEP).min(self.limit);
        }
        share
    }

    fn at(&self, share: f64, value: impl Fn(&(f64, f64, f64)) -> f64) -> f64 {
        let first = &self.curve[0];
        if share <= first.0 {
            // Below the smallest measured share, throughput shrinks with it.
            return value(first);
        }
        for pair in self.curve.windows(2) {
            let (low, high) = (&pair[0], &pair[1]);
            if share <= high.0 {
                let t = (share - low.0) / (high.0 - low.0);
                return value(low) + t * (value(high) - value(low));
            }
        }
        value(&self.curve[self.curve.len() - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profiled_service_interpolates_between_measured_shares() {
        let table = ProfileTable::parse(
            "1,10,0.100,10\n1,50,0.050,20\n1,100,0.040,21\n4,10,0.400,10\n4,50,0.200,20\n4,100,0.190,21\n",
        )
        .unwrap();
        let service = Service::profiled("f", &table, 0.06, 2.0).unwrap();
        assert_eq!((service.batch, service.request), (1, 0.5));
        assert!((service.slo_s - 0.12).abs() < 1e-12);
        assert!((service.throughput(0.3) - 15.0).abs() < 1e-9);
        assert!((service.batch_latency(0.75) - 0.045).abs() < 1e-9);
        assert!(service.share_for(1.0) == service.request);
        assert!(service.share_for(1000.0) == service.limit);
    }
}
