//! Every search method on the same measured tables, side by side: the
//! configuration each finds, how close it is to the exhaustive optimum, and
//! how many configurations it measured. `profile-compare` prints this as
//! Markdown (`scripts/bench.sh profile` → `bench/results/profile.md`).

use crate::measure::Trials;
use crate::search::{Method, NEAR_FULL, latency, share};
use crate::table::ProfileTable;
use crate::{Config, Grid};
use std::fmt::Write;

/// One method's answer to one latency question.
#[derive(Debug, Clone, Copy)]
pub struct Found {
    pub config: Option<Config>,
    pub efficiency: f64,
    pub trials: usize,
}

pub fn latency_run(table: &ProfileTable, method: Method, slo_s: f64) -> Found {
    run_with(table, |trials, grid| {
        latency::search(method, trials, grid, slo_s)
    })
}

/// dilu's first design (the walk without the climb), for the record.
fn walk_only_run(table: &ProfileTable, slo_s: f64) -> Found {
    run_with(table, |trials, grid| {
        latency::walk_only(trials, grid, slo_s)
    })
}

fn run_with(
    table: &ProfileTable,
    search: impl FnOnce(&mut Trials, &Grid) -> Result<Option<Config>, String>,
) -> Found {
    let grid = table.grid();
    let mut backend = table.clone();
    let mut trials = Trials::new(&mut backend);
    let config = search(&mut trials, &grid).expect("a table never fails to measure");
    let efficiency = config.map_or(0.0, |c| table.get(c).map_or(0.0, |s| s.efficiency(c.sm)));
    Found {
        config,
        efficiency,
        trials: trials.count(),
    }
}

/// Whether `found` is within 2% of the optimum's efficiency (finding
/// nothing is right only when nothing meets the SLO).
pub fn near_optimum(found: &Found, optimum: &Found) -> bool {
    match (found.config, optimum.config) {
        (_, None) => found.config.is_none(),
        (None, Some(_)) => false,
        (Some(_), Some(_)) => found.efficiency >= NEAR_FULL * optimum.efficiency,
    }
}

fn share_run(
    table: &ProfileTable,
    grid: &Grid,
    method: Method,
    batch: u32,
) -> Option<(u32, usize)> {
    let mut backend = table.clone();
    let mut trials = Trials::new(&mut backend);
    let found = share::search(method, &mut trials, grid, batch, 0).ok()?;
    Some((found, trials.count()))
}

/// The SLO range of each table cut into these quantile bands (of its
/// distinct latencies) for the trials-by-quantile table.
pub const SLO_BANDS: usize = 5;

/// The band (0 = lowest SLOs) of the `index`-th of `count` SLOs.
pub fn slo_band(index: usize, count: usize) -> usize {
    (index * SLO_BANDS / count.max(1)).min(SLO_BANDS - 1)
}

/// One quantile band of one table: SLOs, how many dilu kept within 2% of
/// the optimum, and trials of dilu and HGSS.
#[derive(Default, Clone, Copy)]
pub struct Band {
    pub slos: usize,
    pub near: usize,
    pub trials_dilu: usize,
    pub trials_hgss: usize,
    /// SLOs at which dilu took more than three times HGSS's trials.
    pub over_three: usize,
}

impl Band {
    pub fn ratio(&self) -> f64 {
        self.trials_dilu as f64 / self.trials_hgss.max(1) as f64
    }
}

/// dilu against HGSS on one table, band by band.
pub fn bands(table: &ProfileTable) -> [Band; SLO_BANDS] {
    let breakpoints = table.latency_breakpoints();
    let mut bands = [Band::default(); SLO_BANDS];
    for (i, &slo) in breakpoints.iter().enumerate() {
        let optimum = latency_run(table, Method::Exhaustive, slo);
        let dilu = latency_run(table, Method::Dilu, slo);
        let hgss = latency_run(table, Method::Paper, slo);
        let band = &mut bands[slo_band(i, breakpoints.len())];
        band.slos += 1;
        band.near += usize::from(near_optimum(&dilu, &optimum));
        band.trials_dilu += dilu.trials;
        band.trials_hgss += hgss.trials;
        band.over_three += usize::from(dilu.trials > 3 * hgss.trials);
    }
    bands
}

/// SLOs at which to show the detail: latencies of the table at these
/// quantiles of its distinct latencies.
const DETAIL_QUANTILES: [f64; 6] = [0.10, 0.25, 0.40, 0.55, 0.70, 0.85];

/// The trials-by-quantile table: every table's SLOs cut into
/// [`SLO_BANDS`] bands from the lowest to the highest.
fn write_bands(out: &mut String, tables: &[(String, ProfileTable, bool)]) {
    let _ = writeln!(
        out,
        "\n### Trials by SLO quantile\n\n\
         Each table's SLOs cut into {SLO_BANDS} bands by quantile (0–20% are its lowest \
         latencies). \"optimum kept\": dilu within 2% of the exhaustive optimum at every SLO \
         of the band. Trials are summed over the band's SLOs. \"SLOs over 3×\": the band's SLOs \
         at which dilu, alone, took more than 3× HGSS's trials.\n"
    );
    let _ = writeln!(
        out,
        "| table | SLO quantile | SLOs | optimum kept | trials: dilu | trials: HGSS | dilu / HGSS | SLOs over 3× |"
    );
    let _ = writeln!(out, "|---|---|---:|---|---:|---:|---:|---:|");
    let mut worst: f64 = 0.0;
    for (name, table, _) in tables {
        let bands = bands(table);
        for (i, band) in bands.iter().enumerate() {
            worst = worst.max(band.ratio());
            let _ = writeln!(
                out,
                "| {name} | {}–{}% | {} | {} ({}/{}) | {} | {} | {:.2} | {} |",
                i * 100 / SLO_BANDS,
                (i + 1) * 100 / SLO_BANDS,
                band.slos,
                if band.near == band.slos { "yes" } else { "no" },
                band.near,
                band.slos,
                band.trials_dilu,
                band.trials_hgss,
                band.ratio(),
                band.over_three
            );
        }
    }
    let _ = writeln!(
        out,
        "\nHighest dilu / HGSS ratio in any band of any table: {worst:.2}."
    );
}

fn cell(found: &Found) -> String {
    match found.config {
        Some(c) => format!(
            "b{} @ {}% ({:.2}/%, {} trials)",
            c.batch, c.sm, found.efficiency, found.trials
        ),
        None => format!("none ({} trials)", found.trials),
    }
}

/// Totals over every SLO of one table.
#[derive(Default)]
struct Tally {
    slos: usize,
    near: [usize; 3],
    trials: [usize; 3],
    worst_gap: [f64; 3],
    /// dilu's first design, the walk alone: within 2%, trials.
    walk: (usize, usize),
}

impl Tally {
    /// One row of the inference summary table.
    fn write_row(&self, out: &mut String, name: &str, held_out: &str) {
        let _ = writeln!(
            out,
            "| {name} | {held_out} | {} | {} | {} | {} | {:.1}% | {:.1}% | {} | {} | {} | {} | {:.2} |",
            self.slos,
            self.near[1],
            self.walk.0,
            self.near[0],
            self.worst_gap[1] * 100.0,
            self.worst_gap[0] * 100.0,
            self.trials[1],
            self.walk.1,
            self.trials[0],
            self.trials[2],
            self.trials[0] as f64 / self.trials[1].max(1) as f64,
        );
    }
}

/// The whole comparison as Markdown. `tables` are (name, table, held out).
pub fn report(tables: &[(String, ProfileTable, bool)]) -> String {
    let mut out = String::new();
    let methods = Method::ALL;
    let _ = writeln!(
        out,
        "## Inference: most throughput per SM % meeting the SLO\n\n\
         Every SLO equal to a latency in the table (each is a point where the set of \
         configurations meeting it changes). \"within 2%\": the method's configuration has at \
         least 98% of the exhaustive optimum's throughput per SM % (or both find nothing). \
         Trials: configurations measured. \"walk only\" is dilu's first design (the staircase \
         walk without the climb or the bounds), designed on the two tables not held out; the \
         climb was added after seeing its misses on the held-out ones, and the bounds that prune \
         the walk (and their noise slack) after seeing all five tables, so for dilu's final \
         search no table is unseen.\n"
    );
    let _ = writeln!(
        out,
        "| table | held out | SLOs | within 2%: dilu-paper (HGSS) | within 2%: walk only | within 2%: dilu | worst gap: HGSS | worst gap: dilu | trials: HGSS | trials: walk only | trials: dilu | trials: exhaustive | dilu / HGSS trials |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut all = Tally::default();
    let mut details = String::new();
    for (name, table, held_out) in tables {
        let mut tally = Tally::default();
        let breakpoints = table.latency_breakpoints();
        for &slo in &breakpoints {
            let runs: Vec<Found> = methods
                .iter()
                .map(|m| latency_run(table, *m, slo))
                .collect();
            let optimum = &runs[2];
            let walk = walk_only_run(table, slo);
            tally.walk.0 += usize::from(near_optimum(&walk, optimum));
            tally.walk.1 += walk.trials;
            tally.slos += 1;
            for (i, run) in runs.iter().enumerate() {
                tally.near[i] += usize::from(near_optimum(run, optimum));
                tally.trials[i] += run.trials;
                if optimum.efficiency > 0.0 {
                    let gap = 1.0 - run.efficiency / optimum.efficiency;
                    tally.worst_gap[i] = tally.worst_gap[i].max(gap);
                }
            }
        }
        tally.write_row(&mut out, name, if *held_out { "yes" } else { "no" });
        all.slos += tally.slos;
        all.walk.0 += tally.walk.0;
        all.walk.1 += tally.walk.1;
        for i in 0..3 {
            all.near[i] += tally.near[i];
            all.trials[i] += tally.trials[i];
            all.worst_gap[i] = all.worst_gap[i].max(tally.worst_gap[i]);
        }
        let _ = writeln!(
            details,
            "\n### {name}{}\n\n| SLO ms | exhaustive | dilu-paper (HGSS) | dilu | dilu within 2% | dilu / HGSS trials |\n|---:|---|---|---|---|---:|",
            if *held_out { " (held out)" } else { "" }
        );
        for q in DETAIL_QUANTILES {
            let slo = breakpoints[((breakpoints.len() - 1) as f64 * q).round() as usize];
            let runs: Vec<Found> = methods
                .iter()
                .map(|m| latency_run(table, *m, slo))
                .collect();
            let _ = writeln!(
                details,
                "| {:.1} | {} | {} | {} | {} | {:.2} |",
                slo * 1000.0,
                cell(&runs[2]),
                cell(&runs[1]),
                cell(&runs[0]),
                if near_optimum(&runs[0], &runs[2]) {
                    "yes"
                } else {
                    "no"
                },
                runs[0].trials as f64 / runs[1].trials.max(1) as f64
            );
        }
    }
    all.write_row(&mut out, "**all**", "");
    write_bands(&mut out, tables);
    let _ = writeln!(
        out,
        "\nConfigurations at six SLOs per table (the 10th to 85th percentile of its latencies): \
         batch @ SM share (throughput per SM %, trials).\n{details}"
    );

    let _ = writeln!(
        out,
        "\n## Training: smallest SM share within 2% of the throughput at 100%\n\n\
         Each batch size of each table taken as a training function. \"exact\": the same \
         share as the exhaustive search; \"valid\": the share's throughput is within 2% of full.\n\n\
         | table | held out | batches | exact: dilu-paper | exact: dilu | valid: dilu-paper | valid: dilu | trials: dilu-paper | trials: dilu | trials: exhaustive |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (name, table, held_out) in tables {
        let grid = table.grid();
        let (mut batches, mut exact, mut valid, mut trials) = (0, [0; 3], [0; 3], [0; 3]);
        for &batch in &grid.batches {
            let runs: Vec<Option<(u32, usize)>> = methods
                .iter()
                .map(|m| share_run(table, &grid, *m, batch))
                .collect();
            let Some((best, _)) = runs[2] else { continue };
            let full = table
                .get(Config {
                    batch,
                    sm: grid.max_sm(),
                })
                .map_or(0.0, |s| s.throughput);
            batches += 1;
            for (i, run) in runs.iter().enumerate() {
                let Some((found, used)) = run else { continue };
                exact[i] += usize::from(*found == best);
                let at = table
                    .get(Config { batch, sm: *found })
                    .map_or(0.0, |s| s.throughput);
                valid[i] += usize::from(at >= NEAR_FULL * full);
                trials[i] += used;
            }
        }
        let _ = writeln!(
            out,
            "| {name} | {} | {batches} | {} | {} | {} | {} | {} | {} | {} |",
            if *held_out { "yes" } else { "no" },
            exact[1],
            exact[0],
            valid[1],
            valid[0],
            trials[1],
            trials[0],
            trials[2]
        );
    }
    out
}
