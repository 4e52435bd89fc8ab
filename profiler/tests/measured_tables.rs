//! dilu's latency search on every measured table (Dilu's five, real GPU):
//! the optimum is kept at every SLO, and in every quantile band of the SLOs
//! it measures at most three times what Dilu's HGSS measures.

use dilu_profile::compare::{SLO_BANDS, bands, latency_run, near_optimum};
use dilu_profile::search::Method;
use dilu_profile::table::ProfileTable;
use std::path::PathBuf;

fn measured_tables() -> Vec<(String, ProfileTable)> {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/data");
    let mut tables = Vec::new();
    for folder in ["dilu-profiles", "dilu-profiles-heldout"] {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(data.join(folder))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "csv"))
            .collect();
        paths.sort();
        for path in paths {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            tables.push((name, ProfileTable::load(&path).unwrap()));
        }
    }
    assert_eq!(tables.len(), 5, "the five measured tables of bench/data");
    tables
}

#[test]
fn dilu_keeps_the_optimum_at_every_slo_of_every_measured_table() {
    for (name, table) in measured_tables() {
        for slo in table.latency_breakpoints() {
            let optimum = latency_run(&table, Method::Exhaustive, slo);
            let found = latency_run(&table, Method::Dilu, slo);
            assert!(
                near_optimum(&found, &optimum),
                "{name} at SLO {:.1} ms: dilu chose {:?} ({:.3}/%), the optimum is {:?} ({:.3}/%)",
                slo * 1000.0,
                found.config,
                found.efficiency,
                optimum.config,
                optimum.efficiency
            );
        }
    }
}

#[test]
fn dilu_measures_at_most_three_times_hgss_in_every_slo_quantile_band() {
    for (name, table) in measured_tables() {
        for (i, band) in bands(&table).iter().enumerate() {
            assert_eq!(band.near, band.slos, "{name} band {i}");
            assert!(
                band.ratio() <= 3.0,
                "{name}, SLO band {i} of {SLO_BANDS}: dilu {} trials, HGSS {}",
                band.trials_dilu,
                band.trials_hgss
            );
        }
    }
}
