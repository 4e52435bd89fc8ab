//! JSON shapes of the kube-scheduler extender protocol
//! (k8s.io/kube-scheduler/extender/v1): Go structs without json tags, so the
//! keys are the PascalCase field names; the embedded `Pod` and `NodeList` use
//! Kubernetes' own camelCase keys. Only the fields the extender reads are
//! typed; node objects are kept whole so a filter can echo them back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    pub pod: Option<Pod>,
    #[serde(default)]
    pub nodes: Option<NodeList>,
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct PodSpec {
    #[serde(default)]
    pub containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub resources: Resources,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Resources {
    #[serde(default)]
    pub requests: BTreeMap<String, Value>,
    #[serde(default)]
    pub limits: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<Value>,
    #[serde(flatten)]
    pub rest: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    pub nodes: Option<NodeList>,
    pub node_names: Option<Vec<String>>,
    pub failed_nodes: BTreeMap<String, String>,
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    pub error: String,
}

impl PartialEq for NodeList {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items && self.rest == other.rest
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    pub node: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    pub error: String,
}

/// Highest score an extender may give (extenderv1.MaxExtenderPriority).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Name of a node object, from `metadata.name`.
pub fn node_name(node: &Value) -> Option<&str> {
    node.get("metadata")?.get("name")?.as_str()
}

/// A label or annotation of a node object.
pub fn node_meta<'a>(node: &'a Value, key: &str) -> Option<&'a str> {
    let metadata = node.get("metadata")?;
    ["labels", "annotations"]
        .iter()
        .find_map(|section| metadata.get(*section)?.get(key)?.as_str())
}
