//! `placement-latency`: how long one placement decision takes as the
//! cluster grows, for `dilu` (its default search with standing indexes,
//! the search by classes alone and the scan of every node, side by side)
//! and `dilu-paper`; writes
//! `bench/results/placement-latency.md` (run by `scripts/bench.sh
//! placement-latency`).
//!
//! Two shapes per size and two fills: uniform 8-GPU nodes filled by the built-in
//! generator's instances (no workload known: `dilu`'s slack fit), and
//! Alibaba's openb node list repeated until it has the size, filled by
//! openb pods drawn at random (the workload known: `dilu`'s fragmentation
//! fit). Each is filled to a share of its GPU capacity requested (pods
//! arriving and never leaving, as in FGD's protocol; 10% is about where
//! openb's own replay runs, 50% a busy cluster; `--fills` others), then the next `MEASURED`
//! pods of the same source are placed and applied in turn, as a scheduler
//! does, each decision timed once: its time includes whatever upkeep the
//! search does (a standing index re-scoring the classes changed since its
//! last search, or being built). Each search runs the same stream (the
//! searches decide alike) from its own fill by a fresh policy, so that
//! none reads back what another measured on the states the same pods lead
//! to. The whole is done `--rounds` times (5), and each figure is the
//! median of the rounds': on a shared 2-core VM one round's p99 moves by
//! half or more from the host alone (the decisions are the same in every
//! round).
//!
//! usage: placement-latency [--out DIR] [--data DIR] [--sizes GPUS,...] [--fills SHARES,...] [--rounds N]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dilu_cluster::model::ClusterState;
use dilu_cluster::policy::{
    PlacementPolicy, place_pod, place_pod_by_classes, place_pod_scanning_every_node,
    policy_for_workload, tell_cluster_the_workload,
};
use dilu_cluster::simulator::inflation::{self, requested_share};
use dilu_cluster::simulator::openb::{self, LimitRule};
use dilu_cluster::simulator::trace::{ArrivalPattern, TraceRecord, TraceSpec, generate};
use dilu_cluster::simulator::{ClusterShape, percentile};

const GIB: u64 = 1 << 30;
/// Cluster sizes measured by default (GPUs).
const SIZES: [usize; 5] = [1_250, 2_500, 5_000, 10_000, 100_000];
const MEASURED: usize = 1000;
/// Rounds whose median each figure is, by default.
const ROUNDS: usize = 5;
/// Shares of the GPU capacity requested before measuring.
const FILLS: [f64; 2] = [0.1, 0.5];

struct Args {
    out: PathBuf,
    data: PathBuf,
    sizes: Vec<usize>,
    /// Shares of the capacity requested before the decisions are timed.
    fills: Vec<f64>,
    rounds: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        out: PathBuf::from("bench/results"),
        data: PathBuf::from("bench/data/alibaba-openb"),
        sizes: SIZES.to_vec(),
        fills: FILLS.to_vec(),
        rounds: ROUNDS,
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
            "--fills" => {
                let text = value()?;
                args.fills = text
                    .split(',')
                    .map(|share| {
                        share
                            .trim()
                            .parse::<f64>()
                            .ok()
                            .filter(|&share| share > 0.0 && share < 1.0)
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or(format!(
                        "--fills {text:?}: shares of the capacity above 0 and below 1, comma-separated"
                    ))?;
            }
            "--rounds" => {
                let text = value()?;
                args.rounds = text
                    .parse()
                    .ok()
                    .filter(|&rounds| rounds >= 1)
                    .ok_or(format!("--rounds {text:?}: a count of 1 or more"))?;
            }
            "-h" | "--help" => {
                println!(
                    "usage: placement-latency [--out DIR] [--data DIR] [--sizes GPUS,...] [--fills SHARES,...] [--rounds N]"
                );
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
    /// Share of the searches a standing index answered (`None`: none asked).
    answered_share: Option<f64>,
    p50_us: f64,
    p99_us: f64,
    /// What a decision takes on average (the throughput a scheduler gets).
    mean_us: f64,
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
            cluster.apply_pod(&demand, &placement.gpus, &needs);
        }
    }
    (cluster, used)
}

/// Places and applies `pods` in turn on `cluster` by `search`, timing each
/// decision; their p50, p99 and mean in µs.
fn time_decisions(
    policy: &dyn PlacementPolicy,
    cluster: &mut ClusterState,
    pods: &[TraceRecord],
    search: Search,
) -> (f64, f64, f64) {
    let mut times: Vec<u64> = Vec::with_capacity(pods.len());
    for pod in pods {
        let (demand, needs) = (pod.demand(), pod.needs(cluster));
        let started = Instant::now();
        let placement = std::hint::black_box(search(policy, cluster, &demand, &needs));
        times.push(started.elapsed().as_nanos() as u64);
        if let Some(placement) = placement {
            cluster.apply_pod(&demand, &placement.gpus, &needs);
        }
    }
    times.sort_unstable();
    let mean_ns = times.iter().sum::<u64>() as f64 / times.len().max(1) as f64;
    (
        percentile(&times, 0.5) / 1000.0,
        percentile(&times, 0.99) / 1000.0,
        mean_ns / 1000.0,
    )
}

fn measure(
    rows: &mut Vec<Row>,
    shape_name: &'static str,
    shape: &ClusterShape,
    pods: &[TraceRecord],
    mix: Arc<dilu_cluster::policy::WorkloadMix>,
    fill: f64,
    rounds: usize,
) {
    for name in ["dilu", "dilu-paper"] {
        let searches: &[(&'static str, Search)] = if name == "dilu" {
            &[
                ("standing indexes", place_pod),
                ("classes", place_pod_by_classes),
                ("every node", place_pod_scanning_every_node),
            ]
        } else {
            // `dilu-paper` says nothing of what its costs read
            // (`PlacementPolicy::cost_context`): its default search is by
            // classes.
            &[("classes", place_pod)]
        };
        // Per search, each round's p50 and p99, the share answered and
        // each round's mean.
        let mut timed = vec![(Vec::new(), Vec::new(), None, Vec::new()); searches.len()];
        let mut after_fill = (0, 0, 0);
        for round in 0..rounds {
            // Each search from its own fill by a fresh policy (its memo of
            // node states empty): a scheduler that has been running with
            // that search, and none sees what the others measured on the
            // states the same pods lead to.
            for (slot, &(search_name, search)) in searches.iter().enumerate() {
                let policy = policy_for_workload(name, mix.clone()).expect("known policy");
                let (mut cluster, used) = filled(policy.as_ref(), shape, pods, fill);
                let sample = &pods[used..(used + MEASURED).min(pods.len())];
                after_fill = (
                    cluster.active_gpus(),
                    (0..cluster.nodes.len())
                        .filter(|&node| !cluster.node_is_idle(node))
                        .count(),
                    cluster.node_classes(),
                );
                let (answered_before, asked_before) = cluster.standing_answers();
                let (p50_us, p99_us, mean_us) =
                    time_decisions(policy.as_ref(), &mut cluster, sample, search);
                let (answered, asked) = cluster.standing_answers();
                eprintln!(
                    "{shape_name} {} GPUs {name} {search_name} round {}: p50 {p50_us:.1} µs p99 {p99_us:.1} µs mean {mean_us:.1} µs",
                    shape.gpus(),
                    round + 1
                );
                let entry = &mut timed[slot];
                entry.0.push(p50_us);
                entry.1.push(p99_us);
                entry.3.push(mean_us);
                entry.2 = (asked > asked_before)
                    .then(|| (answered - answered_before) as f64 / (asked - asked_before) as f64);
            }
        }
        let (busy_gpus, busy_nodes, node_states) = after_fill;
        for (&(search_name, _), (p50s, p99s, answered_share, means)) in searches.iter().zip(timed) {
            rows.push(Row {
                fill,
                shape: shape_name,
                gpus: shape.gpus(),
                busy_gpus,
                busy_nodes,
                node_states,
                policy: name.to_string(),
                search: search_name,
                answered_share,
                p50_us: median(p50s),
                p99_us: median(p99s),
                mean_us: median(means),
            });
        }
    }
}

/// The median of `values` (the mean of the middle two of an even count).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// For `dilu` at each fill and shape: how node states and each search's
/// p50 and p99 grow from the smallest size to the largest.
fn growth_table(rows: &[Row], sizes: &[usize], fills: &[f64]) -> String {
    let mut out = String::from(
        "| requested | shape | GPUs | node states | standing indexes p50 / p99 µs | classes p50 / p99 µs | every node p50 / p99 µs |\n\
         |---:|---|---|---|---|---|---|\n",
    );
    let (Some(&small), Some(&large)) = (sizes.iter().min(), sizes.iter().max()) else {
        return out;
    };
    let ratio = |x: f64, y: f64| y / x.max(f64::MIN_POSITIVE);
    for &fill in fills {
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
            let growth = |search: &str| {
                let (Some(a), Some(b)) = (find(small, search), find(large, search)) else {
                    return None;
                };
                Some(format!(
                    "{:.1} / {:.1} → {:.1} / {:.1} (×{:.1} / ×{:.1})",
                    a.p50_us,
                    a.p99_us,
                    b.p50_us,
                    b.p99_us,
                    ratio(a.p50_us, b.p50_us),
                    ratio(a.p99_us, b.p99_us)
                ))
            };
            let (Some(a), Some(b), Some(standing), Some(classes), Some(scan)) = (
                find(small, "standing indexes"),
                find(large, "standing indexes"),
                growth("standing indexes"),
                growth("classes"),
                growth("every node"),
            ) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {:.0}% | {shape} | {} → {} (×{:.1}) | {} → {} (×{:.1}) | {standing} | {classes} | {scan} |",
                fill * 100.0,
                a.gpus,
                b.gpus,
                ratio(a.gpus as f64, b.gpus as f64),
                a.node_states,
                b.node_states,
                ratio(a.node_states as f64, b.node_states as f64),
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
    for (fill, gpus) in args
        .fills
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
            args.rounds,
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
            args.rounds,
        );
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Placement latency as the cluster grows\n\n\
         Written by {command}\n\
         `cluster-lite/src/bin/placement_latency.rs`); nothing here is edited by hand. Release build,\n\
         this machine's load when it started: {load}; {seconds:.0} s in all.\n\n\
         Each cluster is filled until {fills} of its GPU capacity is requested (pods arriving in\n\
         order, never leaving; openb's own replay keeps about 1% of its GPUs in use); then the next\n\
         {MEASURED} pods are placed and applied in turn, as a scheduler does, each decision timed once (its\n\
         time includes whatever upkeep the search does), by each search from its own fill by a fresh\n\
         policy (what a policy measured on the node states the fill and the stream lead to stays its\n\
         own: no search reads back another's). All of it {rounds} times; each p50, p99 and mean below is the\n\
         median of the rounds' (the decisions are the\n\
         same in every round; on this shared 2-core machine one round's p99 moves by half or more from\n\
         the host alone).\n\
         *uniform, generated*: 8-GPU nodes and the built-in generator's instances (no workload\n\
         known: `dilu` fits by slack). *openb nodes, openb pods*: Alibaba's openb node list repeated to\n\
         the size and its default pod list drawn at random (workload known: `dilu` fits by FGD's\n\
         fragmentation, its costliest score; the cluster is told the workload, `ClusterState::expect_workload`).\n\n\
         The searches, which all decide alike (tests `the_node_index_places_exactly_as_scanning_every_node`,\n\
         `standing_indexes_place_as_the_scan_while_pods_come_go_and_gpus_drain` and\n\
         `indexed_search_matches_the_scan_on_openb_with_departures`):\n\n\
         - `classes`: nodes are grouped into classes of identical state (every GPU's request, limit\n\
         and memory sums, instance counts and draining, the host's CPU capacity and use, memory capacity\n\
         and GPU model; `ClusterState::refresh_node`), each class filed by the cells of its GPUs (Σ SM\n\
         requests by Σ SM limits, or by fragment weight when the workload is known; memory in use per\n\
         GPU size); the policy puts a floor under its cost on each cell (`PlacementPolicy::cost_floor`),\n\
         and the search scores the first fitting node of each class, cheapest cell first, until a\n\
         cell's floor exceeds the best cost found (`search_by_floor`). Its cost grows with how many\n\
         classes could hold the best GPU: few where the floors are tight (the slack fit; the\n\
         fragmentation fit with idle GPUs plentiful), most of them where they are loose (the\n\
         fragmentation fit on a busy cluster, whose floor bounds how far a pod can lower a node's\n\
         fragmentation, not what opening an idle GPU costs).\n\
         - `standing indexes` (the default, `place_pod`): a one-GPU pod under a policy that says what its\n\
         costs read besides the node (`PlacementPolicy::cost_context`: `dilu`'s parameters, its\n\
         workload and whether idle GPUs are scarce at all, somewhat or run out) is answered from a\n\
         standing index of its shape: every class's best (cost, GPU) in order, re-scored only for the\n\
         classes that changed since that shape's last search (`placement/src/model/cost_index.rs`),\n\
         and where the figure its costs drift with (`PlacementPolicy::cost_drift`: how scarce idle GPUs\n\
         are) has moved, for the classes whose bound lets them compete at today's. An index is built by the next\n\
         search of a shape after one that scored 256 classes or more in the same context, and dropped\n\
         when unused while 256 others are newer; a class still in the state it was scored in keeps its\n\
         cost (its first fitting member may change); gangs and other searches go by classes. After each\n\
         search an index answered, the index of another shape, next in turn, looks at the classes changed\n\
         since it last did, as many as the search's own index left of {upkeep} (`CostIndexes::keep_up`):\n\
         a rare shape's search no longer meets all the changes since its last at once. It runs on from\n\
         the fill, with the indexes the fill built (a scheduler that has been running); *answered*:\n\
         the share of its searches an index answered.\n\
         - `every node`: the scan of every node.\n\n\
         `dilu-paper` does not say what its costs read, so its default search is by classes.\n\n\
         *busy nodes*: nodes with work on them after the fill; *node states*: the classes then, idle ones\n\
         included. The table below gives the growth from the smallest cluster to the largest, measured\n\
         in this run.\n\n\
         {growth}\n\
         | requested | shape | GPUs | GPUs in use | busy nodes | node states | policy | search | answered | p50 µs | p99 µs | mean µs |\n|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
        seconds = started.elapsed().as_secs_f64(),
        command = match std::env::args()
            .skip(1)
            .reduce(|line, word| line + " " + &word)
        {
            None => "`scripts/bench.sh placement-latency` (`placement-latency`,".to_string(),
            Some(arguments) => format!("`placement-latency {arguments}` ("),
        },
        fills = {
            let shares: Vec<String> = args
                .fills
                .iter()
                .map(|share| format!("{:.0}%", share * 100.0))
                .collect();
            match shares.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => String::new(),
            }
        },
        rounds = args.rounds,
        upkeep = dilu_cluster::model::UPKEEP_LOOKS,
        growth = growth_table(&rows, &args.sizes, &args.fills),
    );
    for row in &rows {
        let _ = writeln!(
            md,
            "| {:.0}% | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} |",
            row.fill * 100.0,
            row.shape,
            row.gpus,
            row.busy_gpus,
            row.busy_nodes,
            row.node_states,
            row.policy,
            row.search,
            row.answered_share
                .map_or("–".to_string(), |share| format!("{:.0}%", share * 100.0)),
            row.p50_us,
            row.p99_us,
            row.mean_us
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
