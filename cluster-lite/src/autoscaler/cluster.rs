//! The autoscaler's calls to the Kubernetes API server (the extender's
//! `kube` client): Deployments, their pods, the node managers' pods, and
//! the `scale` subresource.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, Patch, PatchParams};

use crate::extender::apiserver::ApiServer;

impl ApiServer {
    /// Deployments in `namespace`, or in every namespace.
    pub fn deployments(&self, namespace: Option<&str>) -> Result<Vec<Deployment>, String> {
        let api: Api<Deployment> = match namespace {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        };
        self.runtime
            .block_on(api.list(&ListParams::default()))
            .map(|list| list.items)
            .map_err(|e| format!("listing deployments: {e}"))
    }

    /// Pods matching a label selector (`a=b,c in (d)`) in `namespace`, or
    /// in every namespace.
    pub fn pods(&self, namespace: Option<&str>, selector: &str) -> Result<Vec<Pod>, String> {
        let api: Api<Pod> = match namespace {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        };
        self.runtime
            .block_on(api.list(&ListParams::default().labels(selector)))
            .map(|list| list.items)
            .map_err(|e| format!("listing pods ({selector}): {e}"))
    }

    /// Sets a Deployment's replicas through its `scale` subresource.
    pub fn scale_deployment(
        &self,
        namespace: &str,
        name: &str,
        replicas: usize,
    ) -> Result<(), String> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({ "spec": { "replicas": replicas } });
        self.runtime
            .block_on(api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch)))
            .map(drop)
            .map_err(|e| format!("scaling {namespace}/{name}: {e}"))
    }
}

/// A label selector as a list call's `labelSelector` parameter.
pub fn selector_query(selector: &LabelSelector) -> String {
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    for requirement in selector.match_expressions.iter().flatten() {
        let key = &requirement.key;
        let values = requirement.values.clone().unwrap_or_default().join(",");
        terms.push(match requirement.operator.as_str() {
            "In" => format!("{key} in ({values})"),
            "NotIn" => format!("{key} notin ({values})"),
            "DoesNotExist" => format!("!{key}"),
            _ => key.clone(),
        });
    }
    terms.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn selectors_become_label_queries() {
        let selector = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into(), "b".into()]),
                },
                LabelSelectorRequirement {
                    key: "canary".into(),
                    operator: "DoesNotExist".into(),
                    values: None,
                },
            ]),
        };
        assert_eq!(selector_query(&selector), "app=web,tier in (a,b),!canary");
    }
}
