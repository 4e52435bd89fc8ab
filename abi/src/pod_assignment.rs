//! What the Kubernetes scheduler extender decided for a pod, as the
//! annotations it writes when it binds the pod, and what the device plugin
//! reads back when the kubelet asks it to set up the pod's container. One
//! definition for both sides.
//!
//! | annotation | value |
//! |---|---|
//! | `dilu.io/gpu-indices` | the node's GPU indices chosen, `0,2` |
//! | `dilu.io/tenant` | the tenant name (budget owner) on the node |
//! | `dilu.io/spec` | the tenant spec, JSON ([`TenantSpec`]) |
//! | `dilu.io/bound-at` | bind time, ms since the epoch (orders a node's pending pods) |
//! | `dilu.io/allocated` | `true` once the device plugin has set up its container |

use crate::node_wire::{self, TenantSpec};
use std::collections::BTreeMap;

pub const GPU_INDICES: &str = "dilu.io/gpu-indices";
pub const TENANT: &str = "dilu.io/tenant";
pub const SPEC: &str = "dilu.io/spec";
pub const BOUND_AT: &str = "dilu.io/bound-at";
pub const ALLOCATED: &str = "dilu.io/allocated";

/// The extended resource the device plugin advertises: one unit is a share
/// of one GPU, so a pod asks for as many units as it needs GPUs.
pub const RESOURCE: &str = "dilu.io/gpu-share";

/// One pod's placement on its node.
#[derive(Debug, Clone, PartialEq)]
pub struct PodAssignment {
    pub gpu_indices: Vec<u32>,
    pub tenant: String,
    pub spec: TenantSpec,
    pub bound_at_ms: u64,
}

impl PodAssignment {
    /// The annotations the extender writes at bind.
    pub fn to_annotations(&self) -> BTreeMap<String, String> {
        let indices: Vec<String> = self.gpu_indices.iter().map(u32::to_string).collect();
        BTreeMap::from([
            (GPU_INDICES.to_string(), indices.join(",")),
            (TENANT.to_string(), self.tenant.clone()),
            (
                SPEC.to_string(),
                serde_json::to_string(&self.spec).expect("a spec always serialises"),
            ),
            (BOUND_AT.to_string(), self.bound_at_ms.to_string()),
        ])
    }

    /// `Ok(None)` for a pod the extender did not place (no `dilu.io/gpu-indices`);
    /// `Err` names the annotation that is malformed.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<PodAssignment>, String> {
        let Some(indices) = annotations.get(GPU_INDICES) else {
            return Ok(None);
        };
        let gpu_indices = indices
            .split(',')
            .map(|i| i.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("{GPU_INDICES}={indices:?}: expected GPU indices such as 0,2"))?;
        let tenant = annotations
            .get(TENANT)
            .ok_or_else(|| format!("{TENANT} is missing beside {GPU_INDICES}"))?
            .clone();
        let spec_text = annotations
            .get(SPEC)
            .ok_or_else(|| format!("{SPEC} is missing beside {GPU_INDICES}"))?;
        let spec: TenantSpec =
            serde_json::from_str(spec_text).map_err(|e| format!("{SPEC}={spec_text:?}: {e}"))?;
        spec.validate().map_err(|e| format!("{SPEC}: {e}"))?;
        let bound_at_ms = match annotations.get(BOUND_AT) {
            Some(text) => text
                .parse()
                .map_err(|_| format!("{BOUND_AT}={text:?}: expected ms since the epoch"))?,
            None => 0,
        };
        Ok(Some(PodAssignment {
            gpu_indices,
            tenant,
            spec,
            bound_at_ms,
        }))
    }

    /// The environment that makes the interposer register this tenant with
    /// the node manager under this spec (what `dilu run` sets).
    pub fn tenant_environment(&self) -> Vec<(String, String)> {
        let mut env = vec![("DILU_TENANT".to_string(), self.tenant.clone())];
        env.extend(node_wire::SpecVar::of(&self.spec).env());
        env
    }
}

/// A tenant name for a pod: `<namespace>.<name>`, cut to the 64 characters
/// a tenant name may have (namespaces and pod names already use only
/// characters tenant names accept).
pub fn tenant_name(namespace: &str, name: &str) -> String {
    let mut tenant = format!("{namespace}.{name}");
    tenant.truncate(64);
    tenant
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_wire::{SmShare, WorkClass};

    #[test]
    fn annotations_round_trip_and_pods_without_them_are_not_dilu_pods() {
        let assignment = PodAssignment {
            gpu_indices: vec![0, 2],
            tenant: tenant_name("default", "resnet-1"),
            spec: TenantSpec {
                class: WorkClass::Latency,
                slo_ms: Some(50.0),
                sm_request: SmShare::percent(30.0),
                sm_limit: SmShare::percent(45.0),
                mem: Some(crate::units::Bytes::gib(8)),
            },
            bound_at_ms: 1_700_000_000_000,
        };
        // The tenant registers with the spec the pod was bound under.
        let env: BTreeMap<String, String> = assignment.tenant_environment().into_iter().collect();
        assert_eq!(env["DILU_TENANT"], "default.resnet-1");
        let registered = TenantSpec::from_vars(|name| env.get(name).cloned());
        assert_eq!(registered, Ok(Some(assignment.spec.clone())));
        let annotations = assignment.to_annotations();
        assert_eq!(annotations[GPU_INDICES], "0,2");
        assert_eq!(
            PodAssignment::from_annotations(&annotations).unwrap(),
            Some(assignment)
        );
        assert_eq!(PodAssignment::from_annotations(&BTreeMap::new()), Ok(None));
        let mut bad = annotations.clone();
        bad.insert(GPU_INDICES.into(), "zero".into());
        assert!(
            PodAssignment::from_annotations(&bad)
                .unwrap_err()
                .contains(GPU_INDICES)
        );
    }
}
