//! `dilu-cluster autoscaler`: scales the Deployments of annotated functions
//! from the node managers' signals, with the rule the scaling simulation's
//! `dilu` scaler runs ([`DiluRule`]), once a period (a second by default,
//! the simulation's step).
//!
//! Each period it lists the Deployments (annotated `dilu.io/autoscale:
//! "true"`), their pods and the node managers' pods, reads `/api/status` of
//! the node managers that host those pods, and per Deployment feeds the
//! rule its load (the sum over its pods' tenants of SM time over SM limit)
//! and whether the node manager advises scaling one of them out (saturated
//! at its limit and over its SLO). The rule's answer, kept within
//! `dilu.io/min-replicas` and `dilu.io/max-replicas`, is written through
//! the Deployment's `scale` subresource. A failed call or an unreachable
//! node manager costs that period (the Deployments it concerns are left as
//! they are, their windows not advanced), never the controller. Notes:
//! `docs/scaling.md`.

mod cluster;
pub mod nodemgr;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dilu_abi::pod_assignment;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;

use crate::extender::apiserver::ApiServer;
use crate::scaling::scalers::DiluRule;
use nodemgr::NodeReport;

/// Opts a Deployment in (`"true"`).
pub const AUTOSCALE: &str = "dilu.io/autoscale";
/// Fewest and most replicas the autoscaler sets.
pub const MIN_REPLICAS: &str = "dilu.io/min-replicas";
pub const MAX_REPLICAS: &str = "dilu.io/max-replicas";
/// Defaults of the two bounds.
pub const DEFAULT_MIN_REPLICAS: usize = 1;
pub const DEFAULT_MAX_REPLICAS: usize = 10;
/// Seconds a new replica takes to serve (pod start, CUDA context,
/// framework, weights): the rule keeps headroom for the load's rises over
/// that long.
pub const START_SECONDS: &str = "dilu.io/start-seconds";
pub const DEFAULT_START_SECONDS: f64 = 15.0;

#[derive(Debug, Clone)]
pub struct AutoscalerConfig {
    /// `in-cluster` or a plain-HTTP API server URL.
    pub apiserver: String,
    /// How often the rule is asked (its windows count periods).
    pub period: Duration,
    /// Only Deployments of this namespace; `None`: every namespace.
    pub namespace: Option<String>,
    /// Label selector of the node managers' pods, and their namespace.
    pub nodemgr_selector: String,
    pub nodemgr_namespace: Option<String>,
    /// Port of a node manager pod that names no container port `metrics`.
    pub nodemgr_port: u16,
    /// Limit on each step of a node manager read.
    pub nodemgr_timeout: Duration,
}

/// A running autoscaler.
pub struct AutoscalerHandle {
    stopping: Arc<AtomicBool>,
    periods: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl AutoscalerHandle {
    /// Periods run so far.
    pub fn periods(&self) -> u64 {
        self.periods.load(Ordering::Relaxed)
    }

    /// Runs until the process ends.
    pub fn wait(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for AutoscalerHandle {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Connects to the API server and starts the control loop on a thread.
pub fn start(config: AutoscalerConfig) -> Result<AutoscalerHandle, String> {
    if config.period.is_zero() {
        return Err("the autoscaler's period must be above zero".into());
    }
    let api = ApiServer::connect(&config.apiserver)?;
    let stopping = Arc::new(AtomicBool::new(false));
    let periods = Arc::new(AtomicU64::new(0));
    let thread = {
        let (stopping, periods) = (stopping.clone(), periods.clone());
        std::thread::Builder::new()
            .name("dilu-autoscaler".into())
            .spawn(move || run(&api, &config, &stopping, &periods))
            .map_err(|e| format!("cannot start thread: {e}"))?
    };
    Ok(AutoscalerHandle {
        stopping,
        periods,
        thread: Some(thread),
    })
}

fn run(api: &ApiServer, config: &AutoscalerConfig, stopping: &AtomicBool, periods: &AtomicU64) {
    let mut rules: BTreeMap<String, DiluRule> = BTreeMap::new();
    let mut next = Instant::now();
    while !stopping.load(Ordering::Acquire) {
        next += config.period;
        if let Err(error) = step(api, config, &mut rules) {
            tracing::warn!("autoscaler: {error}; trying again next period");
        }
        periods.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now; // overran: do not try to catch up
        }
    }
}

/// A Deployment the autoscaler manages.
#[derive(Debug, Clone, PartialEq)]
pub struct Managed {
    pub namespace: String,
    pub name: String,
    pub replicas: usize,
    pub min: usize,
    pub max: usize,
    pub selector: String,
    /// Seconds a new replica takes to serve.
    pub start_seconds: f64,
}

/// `None` for a Deployment not opted in; an error for one whose bounds do
/// not parse (it is left alone, and the reason logged).
pub fn managed(deployment: &Deployment) -> Option<Result<Managed, String>> {
    let meta = &deployment.metadata;
    let annotations = meta.annotations.as_ref()?;
    if annotations.get(AUTOSCALE).map(String::as_str) != Some("true") {
        return None;
    }
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let name = meta.name.clone().unwrap_or_default();
    let bound = |key: &str, default: usize| match annotations.get(key) {
        None => Ok(default),
        Some(text) => text
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("{namespace}/{name}: {key} {text:?} is not a whole number")),
    };
    Some((|| {
        let min = bound(MIN_REPLICAS, DEFAULT_MIN_REPLICAS)?.max(1);
        let max = bound(MAX_REPLICAS, DEFAULT_MAX_REPLICAS)?;
        if max < min {
            return Err(format!(
                "{namespace}/{name}: {MAX_REPLICAS} {max} is below {MIN_REPLICAS} {min}"
            ));
        }
        let spec = deployment
            .spec
            .as_ref()
            .ok_or_else(|| format!("{namespace}/{name}: no spec"))?;
        let start_seconds = match annotations.get(START_SECONDS) {
            None => DEFAULT_START_SECONDS,
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|seconds| seconds.is_finite() && (0.0..=3600.0).contains(seconds))
                .ok_or_else(|| {
                    format!(
                        "{namespace}/{name}: {START_SECONDS} {text:?} is not seconds from 0 to 3600"
                    )
                })?,
        };
        let selector = cluster::selector_query(&spec.selector);
        if selector.is_empty() {
            return Err(format!("{namespace}/{name}: empty pod selector"));
        }
        Ok(Managed {
            replicas: spec.replicas.unwrap_or(1).max(0) as usize,
            namespace: namespace.clone(),
            name: name.clone(),
            min,
            max,
            selector,
            start_seconds,
        })
    })())
}

/// One period: read, decide, scale.
fn step(
    api: &ApiServer,
    config: &AutoscalerConfig,
    rules: &mut BTreeMap<String, DiluRule>,
) -> Result<(), String> {
    let mut deployments = Vec::new();
    for deployment in api.deployments(config.namespace.as_deref())? {
        match managed(&deployment) {
            Some(Ok(managed)) => deployments.push(managed),
            Some(Err(error)) => tracing::warn!("autoscaler: left alone: {error}"),
            None => {}
        }
    }
    rules.retain(|key, _| {
        deployments
            .iter()
            .any(|d| *key == format!("{}/{}", d.namespace, d.name))
    });
    if deployments.is_empty() {
        return Ok(());
    }
    let mut pods_of = Vec::with_capacity(deployments.len());
    for deployment in &deployments {
        let pods = api.pods(Some(&deployment.namespace), &deployment.selector)?;
        pods_of.push(pods.into_iter().filter(is_live).collect::<Vec<_>>());
    }
    let nodes: BTreeSet<String> = pods_of
        .iter()
        .flatten()
        .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .collect();
    let reports = read_node_managers(api, config, &nodes)?;
    for (deployment, pods) in deployments.iter().zip(&pods_of) {
        let key = format!("{}/{}", deployment.namespace, deployment.name);
        let Some((load, exhausted)) = function_load(pods, &reports) else {
            tracing::warn!("autoscaler: {key}: a node manager of its pods did not answer");
            continue;
        };
        // The rule counts periods: the start time in periods, at least one.
        let start_periods = (deployment.start_seconds / config.period.as_secs_f64().max(1e-3))
            .ceil()
            .max(1.0) as usize;
        let rule = rules
            .entry(key.clone())
            .or_insert_with(|| DiluRule::new(start_periods));
        if rule.start_periods() != start_periods {
            // The annotation changed: a rule for the new start time.
            *rule = DiluRule::new(start_periods);
        }
        let wanted = rule.desired(deployment.replicas, load, exhausted);
        let replicas = wanted.clamp(deployment.min, deployment.max);
        if replicas != deployment.replicas {
            api.scale_deployment(&deployment.namespace, &deployment.name, replicas)?;
            tracing::info!(
                "autoscaler: {key}: {} -> {replicas} replicas (load {load:.2} instances at their limits{})",
                deployment.replicas,
                if exhausted {
                    ", saturated at the limit and over the SLO"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}

/// A pod not being deleted and not finished.
fn is_live(pod: &Pod) -> bool {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
    pod.metadata.deletion_timestamp.is_none() && !finished
}

/// The load of a function's pods in instances at their limits, and whether
/// the node manager advises one of them out; `None` when a pod's node has
/// no report. Pods not yet on a node or not yet a tenant count as starting.
pub fn function_load(
    pods: &[Pod],
    reports: &BTreeMap<String, Option<NodeReport>>,
) -> Option<(f64, bool)> {
    let mut load = 0.0;
    let mut exhausted = false;
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
            continue;
        };
        let report = reports.get(node)?.as_ref()?;
        let tenant = tenant_of(pod);
        load += report.load_of(&tenant).unwrap_or(0.0);
        exhausted |= report.advises_out(&tenant);
    }
    Some((load, exhausted))
}

/// The tenant the extender named the pod (`dilu.io/tenant`), else the
/// name it gives pods.
fn tenant_of(pod: &Pod) -> String {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(pod_assignment::TENANT).cloned())
        .unwrap_or_else(|| {
            pod_assignment::tenant_name(
                pod.metadata.namespace.as_deref().unwrap_or("default"),
                pod.metadata.name.as_deref().unwrap_or(""),
            )
        })
}

/// Reads every node's node manager (in parallel). A node without a node
/// manager pod, or whose node manager does not answer, maps to `None`.
fn read_node_managers(
    api: &ApiServer,
    config: &AutoscalerConfig,
    nodes: &BTreeSet<String>,
) -> Result<BTreeMap<String, Option<NodeReport>>, String> {
    let mut addresses: BTreeMap<String, SocketAddr> = BTreeMap::new();
    if !nodes.is_empty() {
        for pod in api.pods(
            config.nodemgr_namespace.as_deref(),
            &config.nodemgr_selector,
        )? {
            if let Some((node, address)) = nodemgr_address(&pod, config.nodemgr_port)
                && nodes.contains(&node)
            {
                addresses.insert(node, address);
            }
        }
    }
    let timeout = config.nodemgr_timeout;
    let read = std::thread::scope(|scope| {
        let readers: Vec<_> = addresses
            .iter()
            .map(|(node, &address)| {
                (
                    node.clone(),
                    scope.spawn(move || nodemgr::fetch_status(address, timeout)),
                )
            })
            .collect();
        readers
            .into_iter()
            .map(|(node, reader)| {
                let report = match reader.join() {
                    Ok(Ok(report)) => Some(report),
                    Ok(Err(error)) => {
                        tracing::warn!("autoscaler: node {node}: {error}");
                        None
                    }
                    Err(_) => None,
                };
                (node, report)
            })
            .collect::<BTreeMap<_, _>>()
    });
    Ok(nodes
        .iter()
        .map(|node| (node.clone(), read.get(node).cloned().flatten()))
        .collect())
}

/// A node manager pod's node and metrics address (its IP, and the
/// container port named `metrics`, else `default_port`).
fn nodemgr_address(pod: &Pod, default_port: u16) -> Option<(String, SocketAddr)> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone()?;
    let ip: IpAddr = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    let port = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(default_port);
    Some((node, SocketAddr::new(ip, port)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(annotations: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "prod", "annotations": annotations },
            "spec": { "replicas": 2, "selector": { "matchLabels": { "app": "web" } },
                      "template": { "metadata": { "labels": { "app": "web" } } } }
        }))
        .unwrap()
    }

    #[test]
    fn only_opted_in_deployments_with_sound_bounds_are_managed() {
        assert_eq!(managed(&deployment(json!({}))), None);
        assert_eq!(managed(&deployment(json!({ AUTOSCALE: "false" }))), None);
        let web = managed(&deployment(json!({ AUTOSCALE: "true", MAX_REPLICAS: "4" })))
            .unwrap()
            .unwrap();
        assert_eq!((web.replicas, web.min, web.max), (2, 1, 4));
        assert_eq!(web.selector, "app=web");
        let bad = managed(&deployment(
            json!({ AUTOSCALE: "true", MIN_REPLICAS: "3", MAX_REPLICAS: "2" }),
        ));
        assert!(bad.unwrap().unwrap_err().contains("below"));
        let bad = managed(&deployment(
            json!({ AUTOSCALE: "true", MIN_REPLICAS: "two" }),
        ));
        assert!(bad.unwrap().unwrap_err().contains("whole number"));
        assert_eq!(web.start_seconds, DEFAULT_START_SECONDS);
        let slow = managed(&deployment(
            json!({ AUTOSCALE: "true", START_SECONDS: "42.5" }),
        ));
        assert_eq!(slow.unwrap().unwrap().start_seconds, 42.5);
        for text in ["soon", "-1", "NaN", "7200"] {
            let bad = managed(&deployment(
                json!({ AUTOSCALE: "true", START_SECONDS: text }),
            ));
            assert!(bad.unwrap().unwrap_err().contains(START_SECONDS), "{text}");
        }
    }
}
