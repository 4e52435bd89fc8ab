//! Prometheus metrics (`/metrics`) and a small JSON API (`/api/status`,
//! `/api/signals`, for the cluster layer; `/api/gpus`, the node GPU by GPU)
//! over HTTP. Every per-tenant series carries the tenant's GPU as `gpu`.
//!
//! Names carry the `dilu_` prefix and base units (seconds, bytes, ratios
//! 0–1), counters end in `_total`; labels are `gpu`, `uuid` and `tenant`
//! (co-location's `dilu_colo_*` also `group`; never a pid: pids churn and would explode the series count). Every
//! scrape encodes a fresh snapshot of the daemon's status, so `/metrics`
//! and `dilu status` show the same numbers.

use crate::shared_state::Shared;
use dilu_abi::node_wire::{ColoStatus, GpuStatus, NodeStatus, ScaleAdvice, TenantStatus};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

type Labels = Vec<(String, String)>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type CounterFamily = Family<Labels, Counter<f64, AtomicU64>>;

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type TenantValue = fn(&TenantStatus) -> Option<f64>;

/// Per-tenant gauges: name, help, value (None: no sample).
const TENANT_GAUGES: [(&str, &str, TenantValue); 13] = [
    (
        "dilu_tenant_sm_request_ratio",
        "Guaranteed SM-time share (0-1).",
        |t| Some(t.spec.sm_request.as_fraction()),
    ),
    (
        "dilu_tenant_sm_limit_ratio",
        "Most SM-time share a tenant may borrow (0-1).",
        |t| Some(t.spec.sm_limit.as_fraction()),
    ),
    (
        "dilu_tenant_sm_share_ratio",
        "SM-time share the controller set for the next period (0-1).",
        |t| Some(t.sm_current_pct / 100.0),
    ),
    (
        "dilu_tenant_waiting",
        "1 while the tenant's launches wait at an SM-time share of 0.",
        |t| Some(f64::from(u8::from(t.waiting))),
    ),
    (
        "dilu_tenant_over_admitted",
        "1 for a tenant registered beyond admission (its processes were running already and it did not fit: it started while the node manager was away, or was found on a GPU without room).",
        |t| Some(f64::from(u8::from(t.over_admitted.is_some()))),
    ),
    (
        "dilu_tenant_sm_achieved_ratio",
        "Device time the tenant used over the last second (0-1).",
        |t| Some(t.sm_achieved_pct / 100.0),
    ),
    (
        "dilu_tenant_memory_used_bytes",
        "Device memory in use by the tenant, as its own ledger counts it.",
        |t| Some(t.mem_used_bytes as f64),
    ),
    (
        "dilu_tenant_memory_audited_bytes",
        "Device memory the tenant's processes really hold (NVML, the daemon's audit).",
        |t| t.mem_audited_bytes.map(|b| b as f64),
    ),
    (
        "dilu_tenant_memory_budget_bytes",
        "Device memory budget of the tenant.",
        |t| t.mem_budget_bytes.map(|b| b as f64),
    ),
    (
        "dilu_tenant_latency_p99_seconds",
        "p99 request latency over the last second (reported, else sync-to-sync).",
        |t| t.p99_ms.map(|ms| ms / 1e3),
    ),
    (
        "dilu_tenant_slo_seconds",
        "Latency SLO of a latency tenant.",
        |t| t.spec.slo_ms.map(|ms| ms / 1e3),
    ),
    (
        "dilu_tenant_bubble_ratio",
        "Fraction of the last second in which the tenant had no kernel on the GPU.",
        |t| Some(t.bubble_ratio),
    ),
    (
        "dilu_tenant_processes",
        "Live processes of the tenant.",
        |t| Some(t.pids.len() as f64),
    ),
];

/// Per-tenant counters (encoded with `_total`).
const TENANT_COUNTERS: [(&str, &str, TenantValue); 3] = [
    (
        "dilu_tenant_busy_seconds",
        "GPU time charged to the tenant.",
        |t| Some(t.busy_seconds_total),
    ),
    (
        "dilu_tenant_launches",
        "Kernel launches of the tenant.",
        |t| Some(t.launches_total as f64),
    ),
    (
        "dilu_tenant_throttled_seconds",
        "Wall time launches waited for SM-time tokens.",
        |t| Some(t.throttled_seconds_total),
    ),
];

type GpuValue = fn(&GpuStatus) -> Option<f64>;

const GPU_GAUGES: [(&str, &str, GpuValue); 3] = [
    (
        "dilu_gpu_utilization_ratio",
        "GPU utilisation from NVML (0-1).",
        |g| g.utilization,
    ),
    (
        "dilu_gpu_memory_used_bytes",
        "GPU memory in use from NVML.",
        |g| g.memory_used_bytes.map(|b| b as f64),
    ),
    (
        "dilu_gpu_memory_total_bytes",
        "GPU memory from NVML.",
        |g| g.memory_total_bytes.map(|b| b as f64),
    ),
];

type ColoValue = fn(&ColoStatus) -> f64;

/// Per co-located GPU counters (encoded with `_total`), labelled with the
/// device, the board's group and the primary tenant.
const COLO_COUNTERS: [(&str, &str, ColoValue); 7] = [
    (
        "dilu_colo_gaps",
        "Gaps of the co-location primary long enough to fill.",
        |c| c.gaps_seen as f64,
    ),
    (
        "dilu_colo_gap_seconds",
        "Total length of the primary's fillable gaps.",
        |c| c.gap_seconds_total,
    ),
    (
        "dilu_colo_filled_seconds",
        "Filler kernel time (estimated) launched into the primary's gaps.",
        |c| c.filled_seconds_total,
    ),
    (
        "dilu_colo_primary_busy_seconds",
        "The primary's own kernel time (estimated).",
        |c| c.primary_busy_seconds_total,
    ),
    (
        "dilu_colo_primary_delay_seconds",
        "Filler work still queued when the primary came back from a gap (the most it waited).",
        |c| c.primary_delay_seconds_total,
    ),
    (
        "dilu_colo_requests_judged",
        "Requests of the primary judged against its as-if-alone bound, 10% over its p99 alone (returns from gaps where it reports none).",
        |c| c.requests_judged_total as f64,
    ),
    (
        "dilu_colo_requests_pushed_over",
        "Of those, the requests fillers pushed over the bound (its budget is 0.5% of them).",
        |c| c.requests_pushed_over_total as f64,
    ),
];

/// A gauge per co-located GPU that `shown` selects.
fn colo_gauge(
    registry: &mut Registry,
    status: &NodeStatus,
    name: &str,
    help: &str,
    shown: fn(&ColoStatus) -> bool,
    value: ColoValue,
) {
    let family = GaugeFamily::default();
    for c in status.colocation.iter().filter(|c| shown(c)) {
        family.get_or_create(&colo_labels(status, c)).set(value(c));
    }
    registry.register(name, help, family);
}

/// A `gpu` label: the NVML index, or `none` for tenants the node manager
/// did not place on a node with several GPUs.
fn gpu_label(gpu: Option<u32>) -> String {
    gpu.map_or("none".into(), |g| g.to_string())
}

/// A tenant's `gpu` and `uuid` labels.
fn tenant_gpu(status: &NodeStatus, t: &TenantStatus) -> (String, String) {
    let gpu = crate::gpu_view::gpu_of(status, t);
    let uuid = status
        .gpus
        .iter()
        .find(|g| Some(g.index) == gpu)
        .map_or("unknown".into(), |g| g.uuid.clone());
    (gpu_label(gpu), uuid)
}

/// The per-tenant gauges that are a tenant's figure on one GPU: a tenant
/// on several GPUs has one series per GPU of these (its share and use
/// there); its other series are of its first GPU.
const PER_GPU_TENANT_GAUGES: [&str; 7] = [
    "dilu_tenant_sm_request_ratio",
    "dilu_tenant_sm_limit_ratio",
    "dilu_tenant_sm_share_ratio",
    "dilu_tenant_sm_achieved_ratio",
    "dilu_tenant_memory_used_bytes",
    "dilu_tenant_memory_audited_bytes",
    "dilu_tenant_memory_budget_bytes",
];

type ViewValue = fn(&crate::gpu_view::GpuView) -> f64;

/// Per-GPU gauges of the node manager's own view (`gpu="none"`: tenants it
/// did not place, on a node with several GPUs).
const GPU_VIEW_GAUGES: [(&str, &str, ViewValue); 3] = [
    ("dilu_gpu_tenants", "Tenants on the GPU.", |v| {
        v.tenants.len() as f64
    }),
    (
        "dilu_gpu_sm_reserved_ratio",
        "SM-time share the GPU's tenants' requests reserve (0-1).",
        |v| v.reserved_pct / 100.0,
    ),
    (
        "dilu_gpu_sm_achieved_ratio",
        "Device time the GPU's tenants used over the last second, summed (0-1).",
        |v| v.achieved_pct / 100.0,
    ),
];

/// Labels of a co-location board's series: the primary's GPU (the board's
/// slot where the node manager placed the primary on it, else the
/// primary's first GPU), group and tenant.
fn colo_labels(status: &NodeStatus, c: &ColoStatus) -> Labels {
    let gpu = status
        .tenants
        .iter()
        .find(|t| t.name == c.primary_tenant)
        .map_or(c.device.to_string(), |t| {
            // A placed primary's board slot is its node GPU.
            match crate::gpu_view::on_gpu(status, t, Some(c.device)) {
                Some(_) if t.gpu.is_some() => c.device.to_string(),
                _ => tenant_gpu(status, t).0,
            }
        });
    vec![
        ("gpu".into(), gpu),
        ("group".into(), c.group.clone()),
        ("tenant".into(), c.primary_tenant.clone()),
    ]
}

fn plain_gauge(registry: &mut Registry, name: &str, help: &str, value: f64) {
    let gauge = Gauge::<f64, AtomicU64>::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

/// The metrics text of one status snapshot.
pub fn render(status: &NodeStatus) -> String {
    let mut registry = Registry::default();
    plain_gauge(
        &mut registry,
        "dilu_nodemgr_control_period_seconds",
        "Control period of the node manager.",
        status.period_ms / 1e3,
    );
    plain_gauge(
        &mut registry,
        "dilu_nodemgr_uptime_seconds",
        "Time since the node manager started.",
        status.uptime_seconds,
    );
    plain_gauge(
        &mut registry,
        "dilu_nodemgr_control_work_seconds",
        "Mean CPU time of one control period's work (sampling, every GPU's controller, budgets).",
        status.control_work_seconds_total / status.control_periods.max(1) as f64,
    );
    let tenant_labels = |t: &TenantStatus| -> Labels {
        let (gpu, uuid) = tenant_gpu(status, t);
        vec![
            ("gpu".into(), gpu),
            ("uuid".into(), uuid),
            ("tenant".into(), t.name.clone()),
        ]
    };
    for (name, help, value) in TENANT_GAUGES {
        let family = GaugeFamily::default();
        let per_gpu = PER_GPU_TENANT_GAUGES.contains(&name);
        for t in &status.tenants {
            if let Some(v) = value(t) {
                family.get_or_create(&tenant_labels(t)).set(v);
            }
            for m in t.more_gpus.iter().filter(|_| per_gpu) {
                let Some(seen) = crate::gpu_view::on_gpu(status, t, Some(m.gpu)) else {
                    continue;
                };
                // Labelled with that GPU.
                let mut seen = seen.into_owned();
                seen.gpu = Some(m.gpu);
                if let Some(v) = value(&seen) {
                    family.get_or_create(&tenant_labels(&seen)).set(v);
                }
            }
        }
        registry.register(name, help, family);
    }
    for (name, help, value) in TENANT_COUNTERS {
        let family = CounterFamily::default();
        for t in &status.tenants {
            if let Some(v) = value(t) {
                family.get_or_create(&tenant_labels(t)).inc_by(v.max(0.0));
            }
        }
        registry.register(name, help, family);
    }
    for (name, help, value) in GPU_GAUGES {
        let family = GaugeFamily::default();
        for g in &status.gpus {
            let labels = vec![
                ("gpu".into(), g.index.to_string()),
                ("uuid".into(), g.uuid.clone()),
            ];
            if let Some(v) = value(g) {
                family.get_or_create(&labels).set(v);
            }
        }
        registry.register(name, help, family);
    }
    for (name, help, value) in GPU_VIEW_GAUGES {
        let family = GaugeFamily::default();
        for view in crate::gpu_view::by_gpu(status) {
            let labels = vec![("gpu".into(), gpu_label(view.gpu))];
            family.get_or_create(&labels).set(value(&view));
        }
        registry.register(name, help, family);
    }
    for (name, help, value) in COLO_COUNTERS {
        let family = CounterFamily::default();
        for c in &status.colocation {
            family
                .get_or_create(&colo_labels(status, c))
                .inc_by(value(c).max(0.0));
        }
        registry.register(name, help, family);
    }
    colo_gauge(
        &mut registry,
        status,
        "dilu_colo_primary_slowdown_ratio",
        "Upper estimate of the primary's slowdown from fillers: queued filler work it found, and the hand-off back, / its kernel time.",
        |_| true,
        |c| c.primary_slowdown,
    );
    // Only primaries kept as if alone have a tail budget: a gauge of 0
    // for the others would read as one spent.
    colo_gauge(
        &mut registry,
        status,
        "dilu_colo_delay_budget_requests",
        "Requests fillers may still push over the bound of a primary kept as if alone (negative: overdrawn; below -3 filler kernels beyond its tolerance wait).",
        |c| c.kept_as_if_alone,
        |c| c.delay_budget_requests,
    );
    let scale = GaugeFamily::default();
    for s in &status.signals {
        let advice = match s.advice {
            ScaleAdvice::ScaleOut => "out",
            ScaleAdvice::ScaleIn => "in",
        };
        let labels = vec![
            ("gpu".into(), gpu_label(s.gpu)),
            ("tenant".into(), s.tenant.clone()),
            ("advice".into(), advice.into()),
        ];
        scale.get_or_create(&labels).set(1.0);
    }
    registry.register(
        "dilu_scale_recommendation",
        "1 while the node manager recommends scaling a tenant out or in.",
        scale,
    );
    let mut text = String::new();
    if encode(&mut text, &registry).is_err() {
        text = "# EOF\n".into();
    }
    text
}

/// Binds the endpoint; returns the server and the address it got.
pub(crate) fn bind(addr: &str) -> Result<(tiny_http::Server, String), String> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}"))?;
    let bound = match server.server_addr() {
        tiny_http::ListenAddr::IP(a) => a.to_string(),
        other => other.to_string(),
    };
    Ok((server, bound))
}

/// Answers HTTP requests until the daemon stops.
pub fn serve(shared: Arc<Shared>, server: tiny_http::Server) {
    while !shared.stopping.load(Ordering::Acquire) {
        let request = match server.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(Some(request)) => request,
            Ok(None) => continue,
            Err(_) => return,
        };
        let header = |content_type: &str| {
            tiny_http::Header::from_bytes("Content-Type", content_type).expect("valid header")
        };
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let response = match path.as_str() {
            "/metrics" => tiny_http::Response::from_string(render(&shared.status()))
                .with_header(header(CONTENT_TYPE)),
            "/api/status" => tiny_http::Response::from_string(
                serde_json::to_string(&shared.status()).unwrap_or_default(),
            )
            .with_header(header("application/json")),
            "/api/signals" => tiny_http::Response::from_string(
                serde_json::to_string(&shared.status().signals).unwrap_or_default(),
            )
            .with_header(header("application/json")),
            "/api/gpus" => tiny_http::Response::from_string(
                serde_json::to_string(&crate::gpu_view::by_gpu(&shared.status()))
                    .unwrap_or_default(),
            )
            .with_header(header("application/json")),
            _ => tiny_http::Response::from_string(
                "not found: try /metrics, /api/status, /api/signals, /api/gpus\n",
            )
            .with_status_code(404),
        };
        let _ = request.respond(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::ColoStatus;
    use dilu_abi::node_wire::SmShare;

    #[test]
    fn co_location_counters_are_exported_per_gpu_group_and_primary() {
        let status = NodeStatus {
            controller: "dilu-colo".into(),
            period_ms: 5.0,
            uptime_seconds: 1.0,
            gpus: Vec::new(),
            tenants: Vec::new(),
            signals: Vec::new(),
            control_periods: 0,
            control_work_seconds_total: 0.0,
            control_work_max_ms: 0.0,
            colocation: vec![ColoStatus {
                group: "gpu".into(),
                device: 0,
                primary_tenant: "train".into(),
                primary_pid: 42,
                gaps_seen: 7,
                gap_seconds_total: 0.5,
                filled_seconds_total: 0.25,
                primary_busy_seconds_total: 2.0,
                primary_delay_seconds_total: 0.02,
                primary_slowdown: 0.01,
                predicted_gap_ms: 3.0,
                gap_period: 2,
                filler_launches_held: 3,
                filler_fallbacks: 0,
                kept_as_if_alone: true,
                tolerance_ms: 0.08,
                requests_judged_total: 1800,
                requests_pushed_over_total: 9,
                delay_budget_requests: -3.5,
                risky_filling_paused: true,
            }],
        };
        let text = render(&status);
        let labels = r#"{gpu="0",group="gpu",tenant="train"}"#;
        for line in [
            format!("dilu_colo_gaps_total{labels} 7.0"),
            format!("dilu_colo_filled_seconds_total{labels} 0.25"),
            format!("dilu_colo_primary_slowdown_ratio{labels} 0.01"),
            format!("dilu_colo_requests_judged_total{labels} 1800"),
            format!("dilu_colo_requests_pushed_over_total{labels} 9"),
            format!("dilu_colo_delay_budget_requests{labels} -3.5"),
        ] {
            assert!(text.contains(&line), "{line} missing:\n{text}");
        }
        // A primary with an SLO has no tail budget: none is shown, not 0.
        let mut with_slo = status;
        with_slo.colocation[0].kept_as_if_alone = false;
        let text = render(&with_slo);
        assert!(text.contains("dilu_colo_gaps_total"), "{text}");
        assert!(!text.contains("dilu_colo_delay_budget_requests{"), "{text}");
    }

    #[test]
    fn per_tenant_series_carry_the_tenants_gpu() {
        use dilu_abi::node_wire::{GpuStatus, TenantSpec};
        let gpu = |index: u32| GpuStatus {
            index,
            uuid: format!("GPU-{index}"),
            name: "Sim".into(),
            utilization: None,
            memory_used_bytes: None,
            memory_total_bytes: None,
        };
        let tenant = |name: &str, gpu: Option<u32>| TenantStatus {
            name: name.into(),
            uid: 0,
            spec: TenantSpec {
                sm_request: SmShare::percent(40.0),
                ..TenantSpec::default()
            },
            pids: vec![1],
            mem_used_bytes: 0,
            mem_budget_bytes: None,
            mem_audited_bytes: None,
            sm_current_pct: 100.0,
            sm_achieved_pct: 50.0,
            busy_seconds_total: 1.0,
            launches_total: 1,
            throttled_seconds_total: 0.0,
            p99_ms: None,
            latency_reports_total: 0,
            latency_seconds_total: 0.0,
            bubble_ratio: 0.5,
            gpu,
            more_gpus: Vec::new(),
            waiting: false,
            over_admitted: None,
            granted: false,
        };
        let status = NodeStatus {
            controller: "dilu".into(),
            period_ms: 5.0,
            uptime_seconds: 1.0,
            gpus: vec![gpu(0), gpu(1)],
            tenants: vec![tenant("a", Some(1)), tenant("b", None), {
                let mut wide = tenant("wide", Some(0));
                wide.more_gpus = vec![dilu_abi::node_wire::GpuShare {
                    gpu: 1,
                    sm_current_pct: 30.0,
                    sm_achieved_pct: 25.0,
                    mem_used_bytes: 3 << 30,
                    mem_budget_bytes: Some(8 << 30),
                    mem_audited_bytes: Some(4 << 30),
                }];
                wide
            }],
            signals: Vec::new(),
            control_periods: 0,
            control_work_seconds_total: 0.0,
            control_work_max_ms: 0.0,
            colocation: Vec::new(),
        };
        let text = render(&status);
        for line in [
            r#"dilu_tenant_sm_share_ratio{gpu="1",uuid="GPU-1",tenant="a"} 1.0"#,
            r#"dilu_tenant_sm_share_ratio{gpu="none",uuid="unknown",tenant="b"} 1.0"#,
            r#"dilu_gpu_tenants{gpu="0"} 1.0"#,
            // A tenant on gpu0 and gpu1: its share on each, under each.
            r#"dilu_tenant_sm_share_ratio{gpu="0",uuid="GPU-0",tenant="wide"} 1.0"#,
            r#"dilu_tenant_sm_share_ratio{gpu="1",uuid="GPU-1",tenant="wide"} 0.3"#,
            r#"dilu_tenant_sm_achieved_ratio{gpu="1",uuid="GPU-1",tenant="wide"} 0.25"#,
            // And its memory there.
            r#"dilu_tenant_memory_used_bytes{gpu="1",uuid="GPU-1",tenant="wide"} 3221225472.0"#,
            r#"dilu_tenant_memory_budget_bytes{gpu="1",uuid="GPU-1",tenant="wide"} 8589934592.0"#,
            r#"dilu_tenant_memory_audited_bytes{gpu="1",uuid="GPU-1",tenant="wide"} 4294967296.0"#,
            r#"dilu_gpu_tenants{gpu="1"} 2.0"#,
            r#"dilu_gpu_sm_reserved_ratio{gpu="1"} 0.8"#,
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
    }
}
