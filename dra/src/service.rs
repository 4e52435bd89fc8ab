//! The DRA node service the kubelet calls: a claim is prepared by reading
//! it from the API server, granting its spec to the node manager, writing
//! its CDI spec and remembering it (checkpoint); unprepared by undoing the
//! three. Both are idempotent, as the kubelet retries them.

use crate::api::dra::dra_plugin_server::DraPlugin;
use crate::api::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use crate::cdi::{self, NodeLayout};
use crate::checkpoint::{self, Checkpoint, PreparedClaim};
use crate::claim::{self, ClaimGrant};
use dilu_deviceplugin::devices::Gpu;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::PathBuf;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

/// How long reading one claim may take before its Prepare fails (the
/// kubelet retries).
pub const CLAIM_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Where claims come from (the API server; a fixture in tests).
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String>;
}

/// Where grants go (the node manager's socket).
pub trait GrantSink: Send + Sync + 'static {
    fn grant(&self, grant: &ClaimGrant) -> Result<(), String>;
    fn release(&self, tenant: &str) -> Result<(), String>;
}

/// The node manager at `socket`.
pub struct NodeManager {
    pub socket: PathBuf,
    /// The node's GPU count: a one-GPU node's grants name no GPU.
    pub gpu_count: usize,
}

impl GrantSink for NodeManager {
    fn grant(&self, grant: &ClaimGrant) -> Result<(), String> {
        let gpus = if self.gpu_count > 1 {
            grant.gpu_indices()
        } else {
            Vec::new()
        };
        dilu_abi::operator_client::grant(&self.socket, &grant.tenant, &grant.spec, &gpus).map(drop)
    }

    fn release(&self, tenant: &str) -> Result<(), String> {
        dilu_abi::operator_client::release(&self.socket, tenant).map(drop)
    }
}

pub struct DraService<C, G> {
    pub node: String,
    pub gpus: Vec<Gpu>,
    pub layout: NodeLayout,
    pub cdi_dir: PathBuf,
    pub checkpoint_path: PathBuf,
    pub claims: C,
    pub grants: std::sync::Arc<G>,
    pub prepared: Mutex<Checkpoint>,
}

impl<C: ClaimSource, G: GrantSink> DraService<C, G> {
    /// Loads the checkpoint at `checkpoint::path(plugin_dir)`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: String,
        gpus: Vec<Gpu>,
        layout: NodeLayout,
        cdi_dir: PathBuf,
        plugin_dir: &std::path::Path,
        claims: C,
        grants: G,
    ) -> Result<Self, String> {
        let checkpoint_path = checkpoint::path(plugin_dir);
        let prepared = Checkpoint::load(&checkpoint_path)?;
        Ok(DraService {
            node,
            gpus,
            layout,
            cdi_dir,
            checkpoint_path,
            claims,
            grants: std::sync::Arc::new(grants),
            prepared: Mutex::new(prepared),
        })
    }

    /// Grants every prepared claim again: a node manager that restarted
    /// has forgotten them. Each is granted under the lock Prepare and
    /// Unprepare take, and only while still prepared, so a claim
    /// unprepared meanwhile is never granted back. Returns how many were
    /// granted.
    pub async fn grant_all_again(&self) -> usize {
        let uids: Vec<String> = self.prepared.lock().await.claims.keys().cloned().collect();
        let mut granted = 0;
        for uid in uids {
            let prepared = self.prepared.lock().await;
            let Some(claim) = prepared.claims.get(&uid) else {
                continue;
            };
            let grant = claim.grant.clone();
            let sink = self.grants.clone();
            let answer = tokio::task::spawn_blocking(move || sink.grant(&grant))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            drop(prepared);
            match answer {
                Ok(()) => granted += 1,
                Err(error) => tracing::warn!(claim = %uid, "granting again: {error}"),
            }
        }
        granted
    }

    fn devices_of(prepared: &PreparedClaim) -> Vec<Device> {
        prepared
            .grant
            .devices
            .iter()
            .map(|d| Device {
                request_names: vec![d.request.clone()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: prepared.cdi_device_ids.clone(),
                share_id: d.share_id.clone(),
            })
            .collect()
    }

    async fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, String> {
        let mut prepared = self.prepared.lock().await;
        if let Some(known) = prepared.claims.get(&claim.uid) {
            // Prepared before (a retry, or before a restart): same answer.
            return Ok(Self::devices_of(known));
        }
        if prepared.claims.len() >= checkpoint::MAX_CLAIMS {
            return Err(format!(
                "this node holds {} prepared claims already",
                checkpoint::MAX_CLAIMS
            ));
        }
        // Prepares wait on each other (one checkpoint): a silent API
        // server must not hold the rest for long.
        let object = tokio::time::timeout(
            CLAIM_READ_TIMEOUT,
            self.claims.get(&claim.namespace, &claim.name),
        )
        .await
        .map_err(|_| {
            format!(
                "the API server did not return claim {}/{} within {CLAIM_READ_TIMEOUT:?}",
                claim.namespace, claim.name
            )
        })??;
        let uid = object.metadata.uid.as_deref().unwrap_or_default();
        if uid != claim.uid {
            return Err(format!(
                "claim {}/{} has UID {uid:?} now, not {:?}: it was deleted and made again",
                claim.namespace, claim.name, claim.uid
            ));
        }
        let grant = claim::grant_of(&object, &self.node)?;
        let gpu = |index: u32| {
            self.gpus
                .iter()
                .find(|g| g.index == index)
                .ok_or_else(|| format!("GPU {index} of claim {} is not on this node", claim.name))
        };
        let gpus: Vec<&Gpu> = grant
            .gpu_indices()
            .into_iter()
            .map(gpu)
            .collect::<Result<_, _>>()?;
        let uuids: Vec<String> = gpus.iter().map(|g| g.uuid.clone()).collect();
        let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
        let spec = cdi::spec(&claim.uid, &grant, &uuids, &minors, &self.layout);
        cdi::write(&self.cdi_dir, &claim.uid, &spec)?;
        let sink = self.grants.clone();
        let granted = grant.clone();
        let answer = tokio::task::spawn_blocking(move || sink.grant(&granted))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        if let Err(error) = answer {
            let _ = cdi::remove(&self.cdi_dir, &claim.uid);
            return Err(format!(
                "the node manager refused the claim's grant: {error}"
            ));
        }
        let entry = PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            grant,
            cdi_device_ids: vec![cdi::device_id(&claim.uid)],
        };
        let devices = Self::devices_of(&entry);
        tracing::info!(
            claim = %format!("{}/{}", claim.namespace, claim.name),
            tenant = %entry.grant.tenant,
            gpus = ?entry.grant.gpu_indices(),
            spec = ?entry.grant.spec,
            "claim prepared"
        );
        prepared.claims.insert(claim.uid.clone(), entry);
        prepared.save(&self.checkpoint_path)?;
        Ok(devices)
    }

    async fn unprepare(&self, claim: &Claim) -> Result<(), String> {
        let mut prepared = self.prepared.lock().await;
        let Some(known) = prepared.claims.get(&claim.uid) else {
            // Never prepared here, or unprepared already.
            return cdi::remove(&self.cdi_dir, &claim.uid);
        };
        let tenant = known.grant.tenant.clone();
        // Another prepared claim of the same tenant name keeps its grant.
        let shared = prepared
            .claims
            .iter()
            .any(|(uid, c)| uid != &claim.uid && c.grant.tenant == tenant);
        if !shared {
            let sink = self.grants.clone();
            let who = tenant.clone();
            tokio::task::spawn_blocking(move || sink.release(&who))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r)
                .map_err(|e| format!("releasing {tenant}'s grant: {e}"))?;
        }
        cdi::remove(&self.cdi_dir, &claim.uid)?;
        prepared.claims.remove(&claim.uid);
        prepared.save(&self.checkpoint_path)?;
        tracing::info!(claim = %format!("{}/{}", claim.namespace, claim.name), %tenant, "claim unprepared");
        Ok(())
    }
}

#[tonic::async_trait]
impl<C: ClaimSource, G: GrantSink> DraPlugin for DraService<C, G> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let answer = match self.prepare(&claim).await {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), "prepare failed: {error}");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let error = match self.unprepare(&claim).await {
                Ok(()) => String::new(),
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), "unprepare failed: {error}");
                    error
                }
            };
            claims.insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// The claim the API server would return: 1 GiB and 20% of GPU 0.
    struct OneClaim;

    #[tonic::async_trait]
    impl ClaimSource for OneClaim {
        async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
            Ok(serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": namespace, "uid": "uid-1"},
                "spec": {},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": crate::DRIVER, "pool": "node-a", "device": "gpu-0",
                    "consumedCapacity": {"memory": "1Gi", "sm": "20"}}]}}},
            }))
            .unwrap())
        }
    }

    /// A node manager that records what it is told.
    #[derive(Default)]
    struct Recorded(StdMutex<Vec<String>>);

    impl GrantSink for Recorded {
        fn grant(&self, grant: &ClaimGrant) -> Result<(), String> {
            self.0
                .lock()
                .unwrap()
                .push(format!("grant {}", grant.tenant));
            Ok(())
        }
        fn release(&self, tenant: &str) -> Result<(), String> {
            self.0.lock().unwrap().push(format!("release {tenant}"));
            Ok(())
        }
    }

    #[tokio::test]
    async fn prepared_claims_are_granted_again_and_unprepared_ones_never() {
        let dir = std::env::temp_dir().join(format!("dilu-dra-service-{}", std::process::id()));
        let gpu = Gpu {
            index: 0,
            uuid: "GPU-0".into(),
            model: "test".into(),
            memory_bytes: 80 << 30,
            minor: 0,
        };
        let layout = NodeLayout {
            host_interposer: "/lib/interposer.so".into(),
            host_socket_dir: "/run/dilu".into(),
            socket_name: "nodemgr.sock".into(),
            dev_dir: dir.join("dev"),
        };
        let service = DraService::new(
            "node-a".into(),
            vec![gpu],
            layout,
            dir.join("cdi"),
            &dir,
            OneClaim,
            Recorded::default(),
        )
        .unwrap();
        let claim = Claim {
            namespace: "ns".into(),
            uid: "uid-1".into(),
            name: "c".into(),
        };
        let devices = service.prepare(&claim).await.unwrap();
        assert_eq!(devices[0].device_name, "gpu-0");
        assert_eq!(service.grant_all_again().await, 1);
        service.unprepare(&claim).await.unwrap();
        assert_eq!(service.grant_all_again().await, 0);
        assert_eq!(
            *service.grants.0.lock().unwrap(),
            ["grant ns.c", "grant ns.c", "release ns.c"],
            "granted at prepare and again, released at unprepare, not granted back"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
