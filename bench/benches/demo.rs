//! The demo's request latency per controller, as a CDF: runs `dilu demo`
//! (an inference tenant with an SLO beside a training tenant on one
//! simulated GPU under the node manager, once per controller: `static`,
//! `dilu-rckm`, `dilu`), keeps every request's latency, and writes
//! `bench/results/demo-latency-cdf.svg` (one CDF line per controller, the
//! SLO marked) and `bench/results/demo.md` (SLO violation rate, p50/p99
//! latency and training throughput per controller, with the command).
//!
//! Run: `scripts/bench.sh demo` (or `-- --seconds 10`); needs the release
//! build of the workspace (`cargo build --release --workspace`).

use dilu_bench::report::{Table, machine, results_path, write_result};
use dilu_bench::svg::{LinePlot, cdf_points};
use dilu_harness::workspace::dilu;
use std::process::{Command, Stdio};

/// The controllers, in the order the demo compares them.
const CONTROLLERS: [&str; 3] = ["static", "dilu-rckm", "dilu"];

fn seconds_arg() -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("--seconds {v:?}: expected a whole number"))
        })
        .unwrap_or(5)
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
    let command = format!("dilu demo --seconds {seconds} --json --latencies-dir DIR");
    eprintln!("demo: {command} ({} s per controller) ...", seconds);
    let output = Command::new(dilu())
        .args(["demo", "--json", "--seconds", &seconds.to_string()])
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
        "controller",
        "requests",
        "SLO violations",
        "p50 latency (ms)",
        "p99 latency (ms)",
        "training iterations/s",
    ]);
    for controller in CONTROLLERS {
        let result = &summary["controllers"][controller];
        let mut latencies = read_latencies(&dir.join(format!("{controller}.txt")));
        let violations = latencies.iter().filter(|&&l| l > slo_ms).count();
        let rate = violations as f64 / latencies.len().max(1) as f64;
        let p50 = dilu_bench::percentile(&mut latencies, 50.0);
        let p99 = dilu_bench::percentile(&mut latencies, 99.0);
        plot = plot.series(controller, &cdf_points(&latencies));
        table.row(vec![
            controller.to_string(),
            latencies.len().to_string(),
            format!("{:.1}%", rate * 100.0),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
            format!("{:.1}", result["batch_throughput"].as_f64().unwrap_or(0.0)),
        ]);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The SLO as a vertical line across the whole plot.
    plot = plot.series(&format!("SLO {slo_ms} ms"), &[(slo_ms, 0.0), (slo_ms, 1.0)]);
    let svg = results_path("demo-latency-cdf.svg");
    plot.write(&svg)
        .unwrap_or_else(|e| panic!("write {}: {e}", svg.display()));
    eprintln!("results written to {}", svg.display());

    let doc = format!(
        "# dilu demo: latency per controller\n\n\
         Command: `scripts/bench.sh demo -- --seconds {seconds}` (runs `{command}` on the release build).\n\n\
         An inference tenant (bursty requests of 8 × 500 µs kernels, SLO p99 {slo_ms} ms, SM request\n\
         30% limit 100%) and a training tenant (8 × 1 ms kernels per iteration after 4 ms of data\n\
         loading, request 20% limit 100%) share one simulated GPU under the node manager, {seconds} s\n\
         per controller. Latency is each request's arrival to its last kernel's end, queueing\n\
         included, measured by the inference program. Few requests per run (bursty arrivals), so\n\
         p99 is close to the largest sample.\n\n\
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
