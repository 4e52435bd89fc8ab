//! `placement-latency`: how long one placement decision takes as the
//! cluster grows, for `dilu` (with the node-class index and scanning every
//! node, side by side) and `dilu-paper`; writes
//! `bench/results/placement-latency.md` (run by `scripts/bench.sh
//! placement-latency`).
//!
//! Two shapes per size and two fills: uniform 8-GPU nodes filled by the built-in
//! generator's instances (no workload known: `dilu`'s slack fit), and
//! Alibaba's openb node list repeated until it has the size, filled by
//! openb pods drawn at random (the workload known: `dilu`'s fragmentation
//! fit). Each is filled to a share of its GPU capacity requested (pods
//! arriving and never leaving, as in FGD's protocol; 10% is about where
//! openb's own replay runs, 50% a busy cluster), then the next 500
//! pods of the same source are each placed (not applied) `REPEATS` times;
//! a decision's time is the least of its repeats, so that a preemption of
//! this process (a loaded 2-core machine) does not count as placement time.
//!
//! usage: placement-latency [--out DIR] [--data DIR] [--sizes GPUS,...]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dilu_cluster::model::ClusterState;
use dilu_cluster::policy::{
    PlacementPolicy, place_pod, place_pod_scanning_every_node, policy_for_workload,
    tell_cluster_the_workload,
};
use dilu_cluster::simulator::inflation::{self, requested_share};
use dilu_cluster::simulator::openb::{self, LimitRule};
use dilu_cluster::simulator::trace::{ArrivalPattern, TraceRecord, TraceSpec, generate};
use dilu_cluster::simulator::{ClusterShape, percentile};

const GIB: u64 = 1 << 30;
/// Cluster sizes measured by default (GPUs).
const SIZES: [usize; 5] = [1_250, 2_500, 5_000, 10_000, 100_000];
const MEASURED: usize = 500;
const REPEATS: usize = 5;
/// Shares of the GPU capacity requested before measuring.
const FILLS: [f64; 2] = [0.1, 0.5];

struct Args {
    out: PathBuf,
    data: PathBuf,
    sizes: Vec<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        out: PathBuf::from("bench/results"),
        data: PathBuf::from("bench/data/alibaba-openb"),
        sizes: SIZES.to_vec(),
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = || words.next().ok_or(format!("{word} needs a value"));
        match word.as_str() {
            "--out" => args.out = value()?.into(),
            "--data" => args.data = value()?.into(),
            "--sizes" => {
                let text = value()?;
                args.sizes = text
                    .split(',')
                    .map(|size| size.trim().parse::<usize>().ok().filter(|&gpus| gpus >= 8))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!(
                        "--sizes {text:?}: GPU counts of 8 or more, comma-separated"
                    ))?;
            }
            "-h" | "--help" => {
                println!("usage: placement-latency [--out DIR] [--data DIR] [--sizes GPUS,...]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// One row: a shape and size, one search, its decision times.
struct Row {
    fill: f64,
    shape: &'static str,
    gpus: usize,
    busy_gpus: usize,
    /// Nodes with work on them.
    busy_nodes: usize,
    /// Classes of identical nodes (what the indexed search scores).
    node_states: usize,
    policy: String,
    search: &'static str,
    p50_us: f64,
    p99_us: f64,
}

type Search = fn(
    &dyn PlacementPolicy,
    &ClusterState,
    &dilu_cluster::model::InstanceDemand,
    &dilu_cluster::model::PodNeeds,
) -> Option<dilu_cluster::policy::Placement>;

/// Fills a cluster of `shape` with `pods` (in order, never leaving) until
/// `fill` of its capacity is requested; the rest are the pods to measure.
fn filled(
    policy: &dyn PlacementPolicy,
    shape: &ClusterShape,
    pods: &[TraceRecord],
    fill: f64,
) -> (ClusterState, usize) {
    let mut cluster = shape.build();
    tell_cluster_the_workload(policy, &mut cluster);
    let goal = fill * shape.gpus() as f64;
    let mut requested = 0.0;
    let mut used = 0;
    for pod in pods {
        if requested >= goal {
            break;
        }
        used += 1;
        requested += requested_share(pod);
        let (demand, needs) = (pod.demand(), pod.needs(&cluster));
        if let Some(placement) = place_pod(policy, &cluster, &demand, &needs) {
            cluster.apply(&demand, &placement.gpus);
            cluster.apply_host(cluster.gpus[placement.gpus[0]].node, &needs);
        }
    }
    (cluster, used)
}

fn time_decisions(
    policy: &dyn PlacementPolicy,
    cluster: &ClusterState,
    pods: &[TraceRecord],
    search: Search,
) -> (f64, f64) {
    let mut times: Vec<u64> = pods
        .iter()
        .map(|pod| {
            let (demand, needs) = (pod.demand(), pod.needs(cluster));
            (0..REPEATS)
                .map(|_| {
                    let started = Instant::now();
                    std::hint::black_box(search(policy, cluster, &demand, &needs));
                    started.elapsed().as_nanos() as u64
                })
                .min()
                .unwrap_or(0)
        })
        .collect();
    times.sort_unstable();
    (
        percentile(&times, 0.5) / 1000.0,
        percentile(&times, 0.99) / 1000.0,
    )
}

fn measure(
    rows: &mut Vec<Row>,
    shape_name: &'static str,
    shape: &ClusterShape,
    pods: &[TraceRecord],
    mix: Arc<dilu_cluster::policy::WorkloadMix>,
    fill: f64,
) {
    for name in ["dilu", "dilu-paper"] {
        let policy = policy_for_workload(name, mix.clone()).expect("known policy");
        let (cluster, used) = filled(policy.as_ref(), shape, pods, fill);
        let sample = &pods[used..(used + MEASURED).min(pods.len())];
        let searches: &[(&'static str, Search)] = if name == "dilu" {
            &[
                ("indexed", place_pod),
                ("every node", place_pod_scanning_every_node),
            ]
        } else {
            &[("indexed", place_pod)]
        };
        for &(search_name, search) in searches {
            let (p50_us, p99_us) = time_decisions(policy.as_ref(), &cluster, sample, search);
            eprintln!(
                "{shape_name} {} GPUs {name} {search_name}: p50 {p50_us:.1} µs p99 {p99_us:.1} µs",
                shape.gpus()
            );
            rows.push(Row {
                fill,
                shape: shape_name,
                gpus: shape.gpus(),
                busy_gpus: cluster.active_gpus(),
                busy_nodes: (0..cluster.nodes.len())
                    .filter(|&node| !cluster.node_is_idle(node))
                    .count(),
                node_states: cluster.node_classes(),
                policy: name.to_string(),
                search: search_name,
                p50_us,
                p99_us,
            });
        }
    }
}

/// For `dilu` at each fill and shape: how busy nodes, node states and the
/// p50 of each search grow from the smallest size to the largest.
fn growth_table(rows: &[Row], sizes: &[usize]) -> String {
    let mut out = String::from(
        "| requested | shape | GPUs | busy nodes | node states | indexed p50 µs | every node p50 µs |\n\
         |---:|---|---|---|---|---|---|\n",
    );
    let (Some(&small), Some(&large)) = (sizes.iter().min(), sizes.iter().max()) else {
        return out;
    };
    for fill in FILLS {
        for shape in ["uniform, generated", "openb nodes, openb pods"] {
            let find = |size: usize, search: &str| {
                rows.iter().find(|row| {
                    row.fill == fill
                        && row.shape == shape
                        && row.policy == "dilu"
                        && row.search == search
                        && row.gpus >= size
                        && row.gpus < size + 100
                })
            };
            let (Some(a), Some(b), Some(a_scan), Some(b_scan)) = (
                find(small, "indexed"),
                find(large, "indexed"),
                find(small, "every node"),
                find(large, "every node"),
            ) else {
                continue;
            };
            let ratio = |x: f64, y: f64| y / x.max(f64::MIN_POSITIVE);
            let _ = writeln!(
                out,
                "| {:.0}% | {shape} | {} → {} (×{:.1}) | {} → {} (×{:.1}) | {} → {} (×{:.1}) | {:.1} → {:.1} (×{:.1}) | {:.1} → {:.1} (×{:.1}) |",
                fill * 100.0,
                a.gpus,
                b.gpus,
                ratio(a.gpus as f64, b.gpus as f64),
                a.busy_nodes,
                b.busy_nodes,
                ratio(a.busy_nodes as f64, b.busy_nodes as f64),
                a.node_states,
                b.node_states,
                ratio(a.node_states as f64, b.node_states as f64),
                a.p50_us,
                b.p50_us,
                ratio(a.p50_us, b.p50_us),
                a_scan.p50_us,
                b_scan.p50_us,
                ratio(a_scan.p50_us, b_scan.p50_us),
            );
        }
    }
    out
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let open = |name: &str| {
        let path = args.data.join(name);
        std::fs::File::open(&path)
            .map(std::io::BufReader::new)
            .map_err(|error| format!("cannot open {}: {error}", path.display()))
    };
    let nodes = openb::read_nodes(open("openb_node_list_gpu_node.csv")?, 80 * GIB)?;
    // GPU placement decisions are what is timed: the list's pods without
    // GPUs (placed by their cores alone) are left out.
    let openb_pods: Vec<TraceRecord> = openb::read_pods(
        open("openb_pod_list_default.csv")?,
        LimitRule::default(),
        80 * GIB,
    )?
    .records
    .into_iter()
    .filter(TraceRecord::takes_gpus)
    .collect();
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let started = Instant::now();
    let mut rows = Vec::new();
    for (fill, gpus) in FILLS
        .iter()
        .flat_map(|&fill| args.sizes.iter().map(move |&gpus| (fill, gpus)))
    {
        let uniform = ClusterShape::uniform(gpus, 8, 80 * GIB);
        let generated = generate(&TraceSpec {
            instances: 2 * gpus,
            cluster_gpus: gpus,
            arrival: ArrivalPattern::Poisson,
            seed: 5,
        });
        measure(
            &mut rows,
            "uniform, generated",
            &uniform,
            &generated,
            Arc::default(),
            fill,
        );
        let shape = ClusterShape::tiled(&nodes, gpus);
        let drawn = inflation::inflate(&openb_pods, shape.gpus(), fill + 0.3, 1);
        let mix = Arc::new(inflation::workload_mix(&drawn, &shape));
        measure(
            &mut rows,
            "openb nodes, openb pods",
            &shape,
            &drawn,
            mix,
            fill,
        );
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Placement latency as the cluster grows\n\n\
         Written by `scripts/bench.sh placement-latency` (`placement-latency`,\n\
         `cluster-lite/src/bin/placement_latency.rs`); nothing here is edited by hand. Release build,\n\
         this machine's load when it started: {load}; {seconds:.0} s in all.\n\n\
         Each cluster is filled until 10% or 50% of its GPU capacity is requested (pods arriving in\n\
         order, never leaving; openb's own replay keeps about 1% of its GPUs in use); then each of the next {MEASURED} pods is placed (not applied) {REPEATS} times and a\n\
         decision's time is the least of its repeats (a preemption of the process is not placement\n\
         time). *uniform, generated*: 8-GPU nodes and the built-in generator's instances (no workload\n\
         known: `dilu` fits by slack). *openb nodes, openb pods*: Alibaba's openb node list repeated to\n\
         the size and its default pod list drawn at random (workload known: `dilu` fits by FGD's\n\
         fragmentation, its costliest score; the cluster is told the workload, `ClusterState::expect_workload`). `indexed`: the search groups nodes into classes of\n\
         identical state (every GPU's request, limit and memory sums, instance counts and draining,\n\
         the host's CPU capacity and use, memory capacity and GPU model; `ClusterState::refresh_node`)\n\
         and files each class by the cells of its GPUs (Σ SM requests by Σ SM limits, or by fragment\n\
         weight when the workload is known; memory in use per GPU size); the policy puts a floor under\n\
         its cost on each cell (`PlacementPolicy::cost_floor`), and the search scores the first\n\
         fitting node of each class, cheapest cell first, until a cell's floor exceeds the best cost found\n\
         (`placement/src/policy/mod.rs`, `search_by_floor`); `every node`: the scan of every node, on the\n\
         same cluster, which gives the same decisions (tests\n\
         `the_node_index_places_exactly_as_scanning_every_node` and\n\
         `indexed_search_matches_the_scan_on_openb_with_departures`). *busy nodes*: nodes with work\n\
         on them after the fill; *node states*: the classes then, idle ones included.\n\n\
         **How the cost grows.** The search scores the classes whose cells' floors are at or below the\n\
         best cost, so its cost grows with how many classes could hold the best GPU, not with the nodes\n\
         or the classes: few where a pod fits a GPU tightly and the floors are tight (the slack fit;\n\
         the fragmentation fit with idle GPUs plentiful), most of them where the floors are loose. The\n\
         fragmentation fit's floor is loose on a busy cluster: it bounds how far a pod can lower a node's\n\
         fragmentation, not the price on limit excess or the rise that opening an idle GPU makes, so\n\
         at 50% requested it still scores most classes for small pods and gangs. The table below gives\n\
         the growth from the smallest cluster to the largest, measured in this run.\n\n\
         {growth}\n\
         | requested | shape | GPUs | GPUs in use | busy nodes | node states | policy | search | p50 µs | p99 µs |\n|---:|---|---:|---:|---:|---:|---|---|---:|---:|",
        seconds = started.elapsed().as_secs_f64(),
        growth = growth_table(&rows, &args.sizes),
    );
    for row in &rows {
        let _ = writeln!(
            md,
            "| {:.0}% | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
            row.fill * 100.0,
            row.shape,
            row.gpus,
            row.busy_gpus,
            row.busy_nodes,
            row.node_states,
            row.policy,
            row.search,
            row.p50_us,
            row.p99_us
        );
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|error| format!("cannot create {}: {error}", args.out.display()))?;
    let path = args.out.join("placement-latency.md");
    std::fs::write(&path, md)
        .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn main() {
    if let Err(error) = run() {
        eprintln!("placement-latency: {error}");
        std::process::exit(1);
    }
}
