//! The demo's request latency per controller, as a CDF: runs `dilu demo`
//! (an inference tenant with an SLO beside a training tenant on one
//! simulated GPU under the node manager, once per controller: `static`,
//! `dilu-rckm`, `dilu`), keeps every request's latency, and writes
//! `bench/results/demo-latency-cdf.svg` (one CDF line per controller, the
//! SLO marked) and `bench/results/demo.md` (SLO violation rate, p50/p99
//! latency and training throughput per controller, with the command).
//!
//! The inference tenant also runs alone (`dilu demo --controllers alone`,
//! in the same run), and each controller's p50 and p99 are given as ratios
//! to alone's, as the field judges co-location.
//!
//! Run: `scripts/bench.sh demo` (the demo's default length; or `--
//! --seconds 30`); needs the release build of the workspace (`cargo build
//! --release --workspace`).

use dilu_bench::report::{Table, machine, results_path, write_result};
use dilu_bench::svg::{LinePlot, cdf_points};
use dilu_harness::workspace::dilu;
use std::process::{Command, Stdio};

/// The inference tenant alone, then the controllers in the order the demo
/// compares them.
const RUNS: [&str; 4] = ["alone", "static", "dilu-rckm", "dilu"];

fn seconds_arg() -> Option<u64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("--seconds {v:?}: expected a whole number"))
        })
}

fn read_latencies(path: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seconds = seconds_arg();
    let dir = std::env::temp_dir().join(format!("dilu-bench-demo-{}", std::process::id()));
    let length = seconds.map_or(String::new(), |s| format!(" --seconds {s}"));
    let command = format!(
        "dilu demo --controllers {}{length} --json --latencies-dir DIR",
        RUNS.join(",")
    );
    eprintln!("demo: {command} ...");
    let mut demo = Command::new(dilu());
    demo.args(["demo", "--json", "--controllers", &RUNS.join(",")]);
    if let Some(s) = seconds {
        demo.args(["--seconds", &s.to_string()]);
    }
    let output = demo
        .arg("--latencies-dir")
        .arg(&dir)
        .stderr(Stdio::inherit())
        .output()
        .expect("run dilu demo");
    assert!(output.status.success(), "dilu demo failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary from dilu demo: {stdout}"));
    let seconds = summary["seconds"].as_u64().expect("seconds in the summary");
    let slo_ms = summary["slo_ms"].as_f64().expect("slo_ms in the summary");

    let mut plot = LinePlot::new(
        &format!("dilu demo: inference request latency per controller ({seconds} s each)"),
        "request latency (ms, log scale)",
        "fraction of requests ≤ x",
    )
    .y_range(0.0, 1.0)
    .steps()
    .log_x();
    let mut table = Table::new(&[
        "run",
        "requests",
        "SLO violations",
        "p50 latency (ms)",
        "p99 latency (ms)",
        "p50 / alone",
        "p99 / alone",
        "training iterations/s",
    ]);
    let mut alone = (f64::NAN, f64::NAN);
    for run in RUNS {
        let result = &summary["controllers"][run];
        let mut latencies = read_latencies(&dir.join(format!("{run}.txt")));
        let violations = latencies.iter().filter(|&&l| l > slo_ms).count();
        let rate = violations as f64 / latencies.len().max(1) as f64;
        let p50 = dilu_bench::percentile(&mut latencies, 50.0);
        let p99 = dilu_bench::percentile(&mut latencies, 99.0);
        if run == "alone" {
            alone = (p50, p99);
        }
        plot = plot.series(run, &cdf_points(&latencies));
        table.row(vec![
            run.to_string(),
            latencies.len().to_string(),
            format!("{:.1}%", rate * 100.0),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{:.2}x", p50 / alone.0),
            format!("{:.2}x", p99 / alone.1),
            if run == "alone" {
                "-".to_string()
            } else {
                format!("{:.1}", result["batch_throughput"].as_f64().unwrap_or(0.0))
            },
        ]);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The SLO as a vertical line across the whole plot.
    plot = plot.series(&format!("SLO {slo_ms} ms"), &[(slo_ms, 0.0), (slo_ms, 1.0)]);
    let svg = results_path("demo-latency-cdf.svg");
    plot.write(&svg)
        .unwrap_or_else(|e| panic!("write {}: {e}", svg.display()));
    eprintln!("results written to {}", svg.display());

    let bench_length = if length.is_empty() {
        String::new()
    } else {
        format!(" --{length}")
    };
    let doc = format!(
        "# dilu demo: latency per controller\n\n\
         Command: `scripts/bench.sh demo{bench_length}` (runs `{command}` on the release build).\n\n\
         An inference tenant (bursty requests of 8 × 500 µs kernels, SLO p99 {slo_ms} ms, SM request\n\
         30% limit 100%) and a training tenant (8 × 1 ms kernels per iteration after 4 ms of data\n\
         loading, request 20% limit 100%) share one simulated GPU under the node manager, {seconds} s\n\
         per controller; `alone` is the inference tenant without the training tenant, in the same\n\
         run, and the ratios are each run's percentile over alone's. Latency is each request's\n\
         arrival to its last kernel's end, queueing included, measured by the inference program.\n\n\
         {}\n\
         ![latency CDF per controller](demo-latency-cdf.svg)\n\n\
         Machine: {}.\n\n\
         A loaded, shared 2-core VM without a GPU: the simulated GPU and both tenants compete with\n\
         other work for the CPU, which adds latency under every controller.\n",
        table.markdown(),
        machine()
    );
    print!("{doc}");
    write_result("demo.md", &doc);
}
