//! The `DevicePlugin` gRPC service the kubelet calls.

use crate::api::device_plugin_server::DevicePlugin;
use crate::api::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, Empty, HEALTHY,
    ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse,
};
use crate::container::ContainerLayout;
use crate::devices::{self, Gpu};
use crate::pods::{self, PodSource};
use std::pin::Pin;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

pub struct SharePlugin<S> {
    pub gpus: Vec<Gpu>,
    pub shares_per_gpu: u32,
    pub layout: ContainerLayout,
    pub pods: S,
}

impl<S: PodSource> SharePlugin<S> {
    fn device_list(&self) -> Vec<Device> {
        devices::all_share_ids(&self.gpus, self.shares_per_gpu)
            .into_iter()
            .map(|id| Device {
                id,
                health: HEALTHY.into(),
                topology: None,
            })
            .collect()
    }

    fn uuid_of_index(&self, index: u32) -> Option<&str> {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.uuid.as_str())
    }

    /// `size` of the `available` IDs, those that must be included first,
    /// then shares of the GPUs the extender chose, then any.
    fn prefer(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
        chosen: &[u32],
    ) -> Vec<String> {
        let chosen_uuids: Vec<&str> = chosen
            .iter()
            .filter_map(|&i| self.uuid_of_index(i))
            .collect();
        let mut picked: Vec<String> = must_include.iter().take(size).cloned().collect();
        // One share per chosen GPU, so the kubelet's books match the placement.
        for uuid in &chosen_uuids {
            if picked.len() >= size {
                break;
            }
            let already = picked.iter().any(|id| devices::gpu_uuid_of(id) == *uuid);
            if !already
                && let Some(id) = available
                    .iter()
                    .find(|id| devices::gpu_uuid_of(id) == *uuid && !picked.contains(id))
            {
                picked.push(id.clone());
            }
        }
        for id in available {
            if picked.len() >= size {
                break;
            }
            if !picked.contains(id) {
                picked.push(id.clone());
            }
        }
        picked
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: PodSource> DevicePlugin for SharePlugin<S> {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    /// Sends the device list once and keeps the stream open: the GPUs of a
    /// node do not change while the plugin runs (a restart re-registers).
    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let first = ListAndWatchResponse {
            devices: self.device_list(),
        };
        let stream = tokio_stream::once(Ok::<_, Status>(first)).chain(tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let pending = self.pods.pending().await.map_err(Status::unavailable)?;
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            let size = usize::try_from(container.allocation_size).unwrap_or(0);
            let chosen = pods::choose(&pending, size)
                .map(|pod| pod.assignment.gpu_indices.clone())
                .unwrap_or_default();
            container_responses.push(ContainerPreferredAllocationResponse {
                device_i_ds: self.prefer(
                    &container.available_device_i_ds,
                    &container.must_include_device_i_ds,
                    size,
                    &chosen,
                ),
            });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            let pending = self.pods.pending().await.map_err(Status::unavailable)?;
            match pods::choose(&pending, container.devices_ids.len()) {
                Some(pod) => {
                    tracing::info!(
                        pod = %format!("{}/{}", pod.namespace, pod.name),
                        tenant = %pod.assignment.tenant,
                        gpus = ?pod.assignment.gpu_indices,
                        "setting up a container"
                    );
                    self.pods
                        .mark_allocated(pod)
                        .await
                        .map_err(Status::unavailable)?;
                    container_responses.push(self.layout.response(&pod.assignment));
                }
                // Not a pod dilu placed: left as the kubelet has it.
                None => container_responses.push(ContainerAllocateResponse::default()),
            }
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
