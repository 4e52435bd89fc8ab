//! SM-time accuracy: two tenants busy-looping kernels under `dilu run --sm`
//! on simgpu, and the same two without dilu (plain time slicing), side by
//! side; ground truth from simgpu's kernel trace. Writes
//! `bench/results/sm-accuracy.md`.
//!
//! Run: `cargo bench -p dilu-bench --bench sm_accuracy` (needs the release
//! build of the workspace: `cargo build --release --workspace`).

use dilu_bench::svg::LinePlot;
use dilu_tests::sm_scenario::{Outcome, Scenario, TenantLoop};
use std::fmt::Write as _;
use std::time::Duration;

struct Case {
    name: &'static str,
    shares: &'static [f64],
    args: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "uniform 100 µs kernels",
        shares: &[30.0, 70.0],
        args: &["--seconds", "5", "--depth", "1000"],
    },
    Case {
        name: "uniform 100 µs kernels",
        shares: &[10.0, 90.0],
        args: &["--seconds", "5", "--depth", "1000"],
    },
    Case {
        name: "mixed 20 µs – 5 ms kernels",
        shares: &[30.0, 70.0],
        args: &[
            "--seconds",
            "5",
            "--depth",
            "1000",
            "--blocks",
            "264,1320,13200,66000",
        ],
    },
    Case {
        name: "mixed 20 µs – 5 ms kernels",
        shares: &[10.0, 90.0],
        args: &[
            "--seconds",
            "5",
            "--depth",
            "1000",
            "--blocks",
            "264,1320,13200,66000",
        ],
    },
    Case {
        name: "3 streams, 100 µs kernels",
        shares: &[30.0, 70.0],
        args: &["--seconds", "5", "--depth", "1000", "--streams", "3"],
    },
    Case {
        name: "CUDA graphs of 10 kernels (20–500 µs)",
        shares: &[30.0, 70.0],
        args: &[
            "--seconds",
            "5",
            "--depth",
            "100",
            "--graph",
            "10",
            "--blocks",
            "264,1320,6600",
        ],
    },
    Case {
        name: "3 streams × mixed 20 µs – 5 ms",
        shares: &[30.0, 70.0],
        args: &[
            "--seconds",
            "5",
            "--depth",
            "1000",
            "--streams",
            "3",
            "--blocks",
            "264,1320,13200,66000",
        ],
    },
    Case {
        name: "one tenant alone, 100 µs kernels",
        shares: &[30.0],
        args: &["--seconds", "5", "--depth", "1000"],
    },
];

fn run(case: &Case, limited: bool) -> (Vec<f64>, f64, Outcome) {
    let loops: Vec<TenantLoop> = case
        .shares
        .iter()
        .map(|&share| TenantLoop::new(limited.then_some(share), case.args))
        .collect();
    let outcome = Scenario::start("bench-sm", &loops, &[]).finish(Duration::from_secs(120));
    let shares = outcome.shares();
    let used = shares.iter().sum();
    (shares, used, outcome)
}

/// Device-time share per tenant over time, with and without dilu.
fn plot_over_time(case: &Case, dilu: &Outcome, plain: &Outcome, path: &std::path::Path) {
    let bin_ns = 250_000_000;
    let mut plot = LinePlot::new(
        &format!(
            "{} at {:?}%: device-time share per 250 ms",
            case.name, case.shares
        ),
        "seconds",
        "% of device time",
    )
    .y_range(0.0, 100.0);
    for (label, outcome) in [("dilu", dilu), ("no dilu", plain)] {
        for (tenant, points) in outcome.shares_over_time(bin_ns).iter().enumerate() {
            let name = format!("{label}: tenant {} ({}%)", tenant + 1, case.shares[tenant]);
            plot = plot.series(&name, points);
        }
    }
    match plot.write(path) {
        Ok(()) => eprintln!("wrote {}", path.display()),
        Err(error) => eprintln!("cannot write {}: {error}", path.display()),
    }
}

fn percents(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{:.1}", v * 100.0))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut table = String::from(
        "| workload | target % | dilu: device time % | dilu: split of used % | worst error (pts) | without dilu: device time % |\n|---|---|---|---|---:|---|\n",
    );
    let results = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    for (index, case) in CASES.iter().enumerate() {
        eprintln!("sm_accuracy: {} at {:?} ...", case.name, case.shares);
        let (dilu, used, dilu_outcome) = run(case, true);
        let (plain, _, plain_outcome) = run(case, false);
        if index == 0 {
            plot_over_time(
                case,
                &dilu_outcome,
                &plain_outcome,
                &results.join("sm-share-over-time.svg"),
            );
        }
        // Alone, the share of wall-clock time is the measure; together, how
        // the tenants split the device time they used.
        let judged: Vec<f64> = if case.shares.len() == 1 {
            dilu.clone()
        } else {
            dilu.iter().map(|s| s / used).collect()
        };
        let error = judged
            .iter()
            .zip(case.shares)
            .map(|(got, want)| (got * 100.0 - want).abs())
            .fold(0.0, f64::max);
        let target = case
            .shares
            .iter()
            .map(|s| format!("{s:.0}"))
            .collect::<Vec<_>>()
            .join(" / ");
        let line = format!(
            "| {} | {} | {} | {} | {:.1}{} | {} |\n",
            case.name,
            target,
            percents(&dilu),
            percents(&judged),
            error,
            if error <= 3.0 { "" } else { " ✗" },
            percents(&plain)
        );
        eprint!("{line}");
        table.push_str(&line);
    }
    println!("{table}");
    let out = results.join("sm-accuracy.md");
    let mut doc = String::from("# SM-time accuracy on simgpu\n\n");
    let _ = writeln!(
        doc,
        "Command: `cargo bench -p dilu-bench --bench sm_accuracy` (release build, 2-core VM, no GPU).\n\
         Two `cudarc-loop` tenants (deep pipelines: always work queued) on one simulated GPU with\n\
         2 ms time slices, once under `dilu run --sm A` / `--sm B` and once without dilu. Device time\n\
         from simgpu's kernel trace over the window in which both ran. \"Split of used\" is each\n\
         tenant's part of the device time the two used together (the device loses a little at\n\
         every switch between processes, so shares that add up to 100% cannot both be met in\n\
         absolute terms); a tenant alone is judged by its share of wall-clock time. ✗ marks an\n\
         error above the ±3-point target.\n"
    );
    doc.push_str(&table);
    doc.push_str(
        "\nShares over time for the first row, with and without dilu: `sm-share-over-time.svg`.\n",
    );
    if let Err(error) = std::fs::write(&out, doc) {
        eprintln!("cannot write {}: {error}", out.display());
    } else {
        eprintln!("wrote {}", out.display());
    }
}
