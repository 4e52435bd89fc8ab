//! The Grafana dashboard (`deploy/grafana/dilu.json`) against the `/metrics`
//! of a live node manager with a latency tenant on simgpu: every metric a
//! panel queries is one the daemon exports, and every label a panel selects,
//! groups or names a series by is one those metrics carry. A renamed metric
//! or label fails here instead of leaving a panel silently empty.

use dilu_harness::workspace::{Scratch, artifact, dilu, unique_name};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DASHBOARD: &str = include_str!("../../deploy/grafana/dilu.json");

/// Labels Prometheus adds to every series it scrapes (the target's), and
/// `node`, which the chart's ServiceMonitor adds.
const TARGET_LABELS: [&str; 3] = ["instance", "job", "node"];

/// Every family in one `/metrics` text: the sample names it exports
/// (a counter `x` as `x_total`) and the label names seen on its samples.
#[derive(Default)]
struct Exported {
    samples: BTreeMap<String, BTreeSet<String>>,
}

impl Exported {
    fn parse(text: &str) -> Exported {
        let mut exported = Exported::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut words = rest.split_whitespace();
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    continue;
                };
                let names: Vec<String> = match kind {
                    "counter" => vec![format!("{name}_total")],
                    "histogram" => ["_bucket", "_sum", "_count"]
                        .iter()
                        .map(|s| format!("{name}{s}"))
                        .collect(),
                    _ => vec![name.to_string()],
                };
                for n in names {
                    exported.samples.entry(n).or_default();
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let name_end = line.find(['{', ' ']).unwrap_or(line.len());
                let labels = exported
                    .samples
                    .entry(line[..name_end].to_string())
                    .or_default();
                if let Some(inner) = line[name_end..]
                    .strip_prefix('{')
                    .and_then(|l| l.split_once('}'))
                {
                    labels.extend(label_names(inner.0));
                }
            }
        }
        exported
    }
}

/// The label names in `a="x",b=~"y"` (a sample's labels or a selector's matchers).
fn label_names(matchers: &str) -> Vec<String> {
    matchers
        .split(',')
        .filter_map(|m| {
            let name = m.split(['=', '!', '~']).next()?.trim();
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// What one panel query names: its metrics and, per metric, the labels its
/// selector matches on; and the labels it groups or matches by.
struct Query {
    metrics: Vec<(String, Vec<String>)>,
    grouped_by: Vec<String>,
}

fn parse_query(expr: &str) -> Query {
    let mut metrics = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("dilu_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        let mut labels = Vec::new();
        let mut next = &tail[end..];
        if let Some(selector) = next.strip_prefix('{')
            && let Some((inner, after)) = selector.split_once('}')
        {
            labels = label_names(inner);
            next = after;
        }
        metrics.push((name, labels));
        rest = next;
    }
    let mut grouped_by = Vec::new();
    let mut rest = expr;
    // `sum by (...)` and `and on (...)`.
    while let Some(at) = [" by (", " on ("]
        .iter()
        .filter_map(|clause| rest.find(clause))
        .min()
    {
        let (inner, after) = rest[at + 5..].split_once(')').expect("by (...) is closed");
        grouped_by.extend(inner.split(',').map(|l| l.trim().to_string()));
        rest = after;
    }
    Query {
        metrics,
        grouped_by,
    }
}

/// The `{{label}}` names of a legend format.
fn legend_labels(format: &str) -> Vec<String> {
    format
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}").map(|(l, _)| l.trim().to_string()))
        .collect()
}

/// Where the dashboard's queries disagree with what the daemon exports.
fn mismatches(dashboard: &serde_json::Value, exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queries = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a Prometheus expr");
            queries += 1;
            let query = parse_query(expr);
            if query.metrics.is_empty() {
                problems.push(format!("{title}: `{expr}` names no dilu metric"));
            }
            // Labels the query's series can carry: its metrics' (where the
            // live daemon had samples to show them) and the target's.
            let mut known: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
            let mut all_sampled = true;
            for (name, _) in &query.metrics {
                match exported.samples.get(name) {
                    None => problems.push(format!("{title}: `{name}` is not exported")),
                    Some(labels) if labels.is_empty() => all_sampled = false,
                    Some(labels) => known.extend(labels.iter().cloned()),
                }
            }
            for (name, selected) in &query.metrics {
                let Some(labels) = exported.samples.get(name).filter(|l| !l.is_empty()) else {
                    continue;
                };
                for label in selected {
                    if !labels.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                        problems.push(format!("{title}: `{name}` has no label `{label}`"));
                    }
                }
            }
            if all_sampled {
                let legend = target["legendFormat"].as_str().unwrap_or("");
                for label in query.grouped_by.iter().chain(&legend_labels(legend)) {
                    if !known.contains(label) {
                        problems.push(format!("{title}: `{expr}` has no label `{label}`"));
                    }
                }
            }
        }
    }
    if queries == 0 {
        problems.push("the dashboard has no queries".into());
    }
    problems
}

fn http_get(address: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("connect to the metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: dilu\r\n\r\n").unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut stream, &mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.contains(" 200"), "{head}");
    body.to_string()
}

/// A daemon with its metrics on a free port; returns it and the address.
fn start_daemon(scratch: &Scratch) -> (Child, String) {
    // The defaults: an empty configuration file.
    std::fs::write(scratch.path("nodemgr.toml"), "").unwrap();
    let mut daemon = Command::new(dilu())
        .args(["nodemgr", "--foreground", "--metrics", "127.0.0.1:0"])
        .arg("--config")
        .arg(scratch.path("nodemgr.toml"))
        .arg("--socket")
        .arg(scratch.path("nodemgr.sock"))
        .arg("--run-dir")
        .arg(scratch.path("run"))
        .env("DILU_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dilu nodemgr");
    let mut log = BufReader::new(daemon.stderr.take().unwrap());
    let mut line = String::new();
    let mut last = String::new();
    let address = loop {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "the daemon exited before it was ready: {last}"
        );
        last.clone_from(&line);
        if line.contains("node manager ready")
            && let Some(rest) = line.split("metrics=\"").nth(1)
        {
            break rest.split('"').next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    (daemon, address)
}

#[test]
fn the_dashboard_queries_only_what_a_live_node_manager_exports() {
    let dashboard: serde_json::Value =
        serde_json::from_str(DASHBOARD).expect("deploy/grafana/dilu.json is JSON");
    let scratch = Scratch::new("dashboard");
    let (mut daemon, address) = start_daemon(&scratch);
    let tenant_name = unique_name("infer");
    let mut tenant = Command::new(dilu())
        .args(["run", "--sim", "--tenant", &tenant_name])
        .args(["--class", "latency", "--slo-ms", "50", "--mem", "1GiB"])
        .args(["--sm-request", "30", "--sm-limit", "60", "--"])
        .arg(artifact("demo-tenant"))
        .args(["serve", "--seconds", "60", "--rate", "50"])
        .env(
            dilu_abi::node_wire::SOCKET_ENV,
            scratch.path("nodemgr.sock"),
        )
        .env("SIMGPU_INSTANCE", unique_name("dashboard"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start a latency tenant");
    // Until the tenant's latency is reported (generous: a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(90);
    let text = loop {
        let text = http_get(&address, "/metrics");
        if text
            .lines()
            .any(|l| l.starts_with("dilu_tenant_latency_p99_seconds{") && l.contains(&tenant_name))
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the tenant's p99 never reached /metrics:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = tenant.kill();
    let _ = tenant.wait();
    let _ = daemon.kill();
    let _ = daemon.wait();

    println!("/metrics:\n{text}");
    let exported = Exported::parse(&text);
    let problems = mismatches(&dashboard, &exported);
    assert!(
        problems.is_empty(),
        "deploy/grafana/dilu.json does not match /metrics:\n{}\n\n{text}",
        problems.join("\n")
    );

    // The check itself: a renamed metric and a label no series has are caught.
    let broken: serde_json::Value = serde_json::from_str(
        &DASHBOARD
            .replace("dilu_tenant_sm_share_ratio", "dilu_tenant_sm_shares_ratio")
            .replace("{{tenant}} p99", "{{pod}} p99"),
    )
    .unwrap();
    let caught = mismatches(&broken, &exported);
    assert!(
        caught
            .iter()
            .any(|p| p.contains("dilu_tenant_sm_shares_ratio"))
            && caught.iter().any(|p| p.contains("`pod`")),
        "{caught:?}"
    );
}
