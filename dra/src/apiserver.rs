//! The API server: ResourceClaims read when preparing, the node's
//! ResourceSlice published.

use crate::service::ClaimSource;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, PostParams};

/// ResourceClaims from the API server.
pub struct ApiServerClaims(pub kube::Client);

#[tonic::async_trait]
impl ClaimSource for ApiServerClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| format!("reading ResourceClaim {namespace}/{name}: {e}"))
    }
}

/// Creates `slice`, or replaces the one of the same name.
pub async fn publish(client: &kube::Client, mut slice: ResourceSlice) -> Result<(), String> {
    let api = Api::<ResourceSlice>::all(client.clone());
    let name = slice.metadata.name.clone().unwrap_or_default();
    let shown = |e: kube::Error| format!("publishing ResourceSlice {name}: {e}");
    match api.get_opt(&name).await.map_err(shown)? {
        None => {
            api.create(&PostParams::default(), &slice)
                .await
                .map_err(shown)?;
        }
        Some(current) => {
            slice.spec.pool.generation = current.spec.pool.generation;
            if current.spec == slice.spec {
                return Ok(());
            }
            slice.metadata.resource_version = current.metadata.resource_version;
            slice.spec.pool.generation += 1;
            api.replace(&name, &PostParams::default(), &slice)
                .await
                .map_err(shown)?;
        }
    }
    tracing::info!(slice = %name, "ResourceSlice published");
    Ok(())
}
