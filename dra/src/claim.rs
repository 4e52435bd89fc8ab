//! What an allocated ResourceClaim grants: the tenant it becomes, its spec
//! and its GPUs. Pure: the claim comes in as the API server returns it.
//!
//! - The devices are the allocation's results for this driver, each a GPU
//!   of this node's pool.
//! - The memory budget and the guaranteed SM share are the capacity each
//!   result consumed (`memory`, `sm`): what the scheduler counted against
//!   the GPU. A claim allocated without consumable capacity (the feature
//!   gate off) took the whole GPU.
//! - What capacity cannot say comes from the claim's (or its class's)
//!   opaque configuration for this driver, a [`TenantConfig`]: class, SLO,
//!   SM limit and co-location role. Class configuration comes first and
//!   the claim's wins, as Kubernetes orders them.

use crate::DRIVER;
use crate::quantity;
use crate::slice::{MEMORY, SM, gpu_index};
use dilu_abi::node_wire::{Bytes, SmShare, TenantSpec, WorkClass, parse_class};
use dilu_abi::pod_assignment::tenant_name;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};
use serde::{Deserialize, Serialize};

/// The `apiVersion` of [`TenantConfig`].
pub const CONFIG_API_VERSION: &str = "gpu.dilu.io/v1alpha1";
/// The `kind` of [`TenantConfig`].
pub const CONFIG_KIND: &str = "TenantConfig";

/// A claim's opaque configuration for `gpu.dilu.io`: `apiVersion` and
/// `kind` name it; every other field is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantConfig {
    pub api_version: String,
    pub kind: String,
    /// `latency` or `batch`.
    pub class: Option<String>,
    /// Target p99 request latency, ms.
    pub slo_ms: Option<f64>,
    /// Most of the GPU's time it may take when others leave it idle,
    /// percent (at least its `sm` capacity).
    pub sm_limit: Option<f64>,
    /// Co-location role: `primary`, `online-filler` or `filler`.
    pub colocation: Option<String>,
}

/// The co-location roles a claim may take (`DILU_COLO`).
pub const COLOCATION_ROLES: [&str; 3] = ["primary", "online-filler", "filler"];

/// One device of a prepared claim, as the kubelet is told of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
    pub gpu_index: u32,
}

/// What a claim becomes on this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimGrant {
    /// The tenant name its processes register under (`<namespace>.<name>`).
    pub tenant: String,
    pub spec: TenantSpec,
    /// Its co-location role, if it has one.
    pub colocation: Option<String>,
    pub devices: Vec<ClaimDevice>,
}

impl ClaimGrant {
    /// The GPU indices, ascending and once each.
    pub fn gpu_indices(&self) -> Vec<u32> {
        let mut gpus: Vec<u32> = self.devices.iter().map(|d| d.gpu_index).collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }
}

fn consumed(result: &DeviceRequestAllocationResult, name: &str) -> Result<Option<f64>, String> {
    result
        .consumed_capacity
        .as_ref()
        .and_then(|c| c.get(name))
        .map(|q| quantity::parse(&q.0).map_err(|e| format!("consumed capacity {name}: {e}")))
        .transpose()
}

/// The [`TenantConfig`] in force for requests `requests`: this driver's
/// opaque configurations that name none of the claim's requests or one of
/// these, merged in order.
fn config_for(claim: &ResourceClaim, requests: &[&str]) -> Result<TenantConfig, String> {
    let configs = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    let mut merged = TenantConfig::default();
    for config in configs.into_iter().flatten() {
        let Some(opaque) = config.opaque.as_ref().filter(|o| o.driver == DRIVER) else {
            continue;
        };
        let applies = config.requests.as_ref().is_none_or(|names| {
            names.is_empty() || names.iter().any(|n| requests.contains(&n.as_str()))
        });
        if !applies {
            continue;
        }
        let given: TenantConfig = serde_json::from_value(opaque.parameters.0.clone())
            .map_err(|e| format!("{DRIVER} configuration ({} source): {e}", config.source))?;
        if given.api_version != CONFIG_API_VERSION || given.kind != CONFIG_KIND {
            return Err(format!(
                "{DRIVER} configuration must be apiVersion {CONFIG_API_VERSION}, kind \
                 {CONFIG_KIND}; not {:?}, {:?}",
                given.api_version, given.kind
            ));
        }
        merged = TenantConfig {
            class: given.class.or(merged.class),
            slo_ms: given.slo_ms.or(merged.slo_ms),
            sm_limit: given.sm_limit.or(merged.sm_limit),
            colocation: given.colocation.or(merged.colocation),
            api_version: given.api_version,
            kind: given.kind,
        };
    }
    Ok(merged)
}

/// What `claim` (as the API server returned it, allocated) grants on node
/// `node`. `Err` is one line the kubelet shows on the pod's events.
pub fn grant_of(claim: &ResourceClaim, node: &str) -> Result<ClaimGrant, String> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or("default");
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let results: Vec<&DeviceRequestAllocationResult> = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == DRIVER)
        .collect();
    if results.is_empty() {
        return Err(format!(
            "claim {namespace}/{name} has no device of {DRIVER} allocated"
        ));
    }
    let mut devices = Vec::new();
    let (mut memory, mut sm) = (Vec::new(), Vec::new());
    for result in &results {
        if result.pool != node {
            return Err(format!(
                "claim {namespace}/{name}: device {} is in pool {:?}, not this node's ({node})",
                result.device, result.pool
            ));
        }
        let gpu = gpu_index(&result.device).ok_or_else(|| {
            format!(
                "claim {namespace}/{name}: {:?} is not a device this driver publishes",
                result.device
            )
        })?;
        memory.push(consumed(result, MEMORY)?);
        sm.push(consumed(result, SM)?);
        devices.push(ClaimDevice {
            request: result.request.clone(),
            pool: result.pool.clone(),
            device: result.device.clone(),
            share_id: result.share_id.clone(),
            gpu_index: gpu,
        });
    }
    // One spec holds on every GPU of a tenant.
    let same = |values: &[Option<f64>], what: &str| {
        if values.windows(2).all(|w| w[0] == w[1]) {
            Ok(values[0])
        } else {
            Err(format!(
                "claim {namespace}/{name}: its devices consumed different {what} ({values:?}); \
                 dilu holds one budget on every GPU of a claim, so ask the same on each"
            ))
        }
    };
    let memory = same(&memory, MEMORY)?;
    let sm = same(&sm, SM)?;
    let requests: Vec<&str> = results.iter().map(|r| r.request.as_str()).collect();
    let config = config_for(claim, &requests)?;

    let mut spec = TenantSpec::default();
    if let Some(role) = &config.colocation {
        if !COLOCATION_ROLES.contains(&role.as_str()) {
            return Err(format!(
                "colocation must be one of {}, not {role:?}",
                COLOCATION_ROLES.join(", ")
            ));
        }
        if role == "primary" {
            spec.class = WorkClass::Latency;
        }
    }
    if let Some(class) = &config.class {
        spec.class = parse_class(class)
            .ok_or_else(|| format!("class must be latency or batch, not {class:?}"))?;
    }
    spec.slo_ms = config.slo_ms;
    // Without consumable capacity the claim holds the whole GPU.
    let share = |what: &str, percent: Option<f64>| match percent {
        None => Ok(SmShare::FULL),
        Some(percent) => SmShare::from_percent(percent)
            .ok_or_else(|| format!("{what} {percent}% is not a percentage from 0 to 100")),
    };
    spec.sm_request = share(SM, sm)?;
    spec.sm_limit = share("smLimit", config.sm_limit)?;
    if spec.sm_limit < spec.sm_request {
        return Err(format!(
            "smLimit {} is below the {} of {SM} the claim consumed",
            spec.sm_limit, spec.sm_request
        ));
    }
    spec.mem = memory.map(|bytes| Bytes::new(bytes.ceil() as u64));
    spec.validate()
        .map_err(|e| format!("claim {namespace}/{name}: {e}"))?;
    Ok(ClaimGrant {
        tenant: tenant_name(namespace, name),
        spec,
        colocation: config.colocation,
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An allocated claim as the API server returns it.
    pub fn allocated(results: serde_json::Value, config: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "infer-gpu", "namespace": "serving", "uid": "uid-1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dilu.io"}}]}},
            "status": {"allocation": {"devices": {"results": results, "config": config}}},
        }))
        .unwrap()
    }

    fn result(device: &str, memory: &str, sm: &str) -> serde_json::Value {
        json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device,
               "shareID": "share-1", "consumedCapacity": {"memory": memory, "sm": sm}})
    }

    fn config(source: &str, parameters: serde_json::Value) -> serde_json::Value {
        json!({"source": source, "requests": [], "opaque": {"driver": DRIVER, "parameters": parameters}})
    }

    fn tenant_config(fields: serde_json::Value) -> serde_json::Value {
        let mut value = json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND});
        value
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        value
    }

    #[test]
    fn consumed_capacity_is_the_budget_and_the_claims_config_wins_over_the_class() {
        let claim = allocated(
            json!([result("gpu-1", "8Gi", "30")]),
            json!([
                config("FromClass", tenant_config(json!({"class": "batch", "smLimit": 50}))),
                config("FromClaim", tenant_config(json!({"colocation": "primary", "sloMs": 50, "class": "latency"}))),
                // Another driver's configuration is not ours to read.
                {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"anything": 1}}},
            ]),
        );
        let grant = grant_of(&claim, "node-a").unwrap();
        assert_eq!(grant.tenant, "serving.infer-gpu");
        assert_eq!(
            grant.spec,
            TenantSpec {
                class: WorkClass::Latency,
                slo_ms: Some(50.0),
                sm_request: SmShare::percent(30.0),
                sm_limit: SmShare::percent(50.0),
                mem: Some(Bytes::gib(8)),
            }
        );
        assert_eq!(grant.colocation.as_deref(), Some("primary"));
        assert_eq!(grant.gpu_indices(), vec![1]);
        assert_eq!(grant.devices[0].share_id.as_deref(), Some("share-1"));
    }

    #[test]
    fn without_consumable_capacity_a_claim_holds_the_whole_gpu() {
        let mut whole = result("gpu-0", "0", "0");
        whole.as_object_mut().unwrap().remove("consumedCapacity");
        let grant = grant_of(&allocated(json!([whole]), json!([])), "node-a").unwrap();
        assert_eq!(grant.spec.sm_request, SmShare::FULL);
        assert_eq!(grant.spec.mem, None);
        assert_eq!(grant.spec.class, WorkClass::Batch);
    }

    #[test]
    fn what_dilu_cannot_enforce_as_asked_is_refused_with_the_reason() {
        let refused = |results: serde_json::Value, configs: serde_json::Value| {
            grant_of(&allocated(results, configs), "node-a").unwrap_err()
        };
        let one = json!([result("gpu-0", "1Gi", "20")]);
        assert!(refused(json!([]), json!([])).contains("no device of gpu.dilu.io"));
        let mut elsewhere = result("gpu-0", "1Gi", "20");
        elsewhere["pool"] = json!("node-b");
        assert!(refused(json!([elsewhere]), json!([])).contains("not this node's"));
        assert!(refused(json!([result("gpu-x", "1Gi", "20")]), json!([])).contains("not a device"));
        let uneven = json!([result("gpu-0", "1Gi", "20"), result("gpu-1", "2Gi", "20")]);
        assert!(refused(uneven, json!([])).contains("different memory"));
        let cases = [
            (json!({"smLimit": 10}), "below"),
            (json!({"colocation": "boss"}), "colocation must be"),
            (json!({"class": "fast"}), "class must be"),
            (json!({"sloMs": -1}), "SLO"),
            (json!({"memory": "1Gi"}), "unknown field"),
        ];
        for (fields, why) in cases {
            let error = refused(
                one.clone(),
                json!([config("FromClaim", tenant_config(fields.clone()))]),
            );
            assert!(error.contains(why), "{fields}: {error}");
        }
        let wrong_kind = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        assert!(refused(one, json!([config("FromClaim", wrong_kind)])).contains(CONFIG_KIND));
    }
}
