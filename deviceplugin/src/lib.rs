//! dilu's Kubernetes device plugin (kubelet device plugin API v1beta1, gRPC
//! over the kubelet's Unix socket). It advertises each GPU of the node as
//! `dilu.io/gpu-share` devices and, when the kubelet sets up a container of
//! a pod the scheduler extender placed, hands it what the extender chose:
//! `CUDA_VISIBLE_DEVICES`, the tenant name and spec (`DILU_TENANT`,
//! `DILU_SPEC`), the interposer library and the node manager's socket
//! mounted, and the interposer preloaded. Pods dilu did not place get
//! nothing.
//!
//! Modules: `api` (generated protocol), `devices` (GPUs from NVML, share
//! IDs), `pods` (finding the pod being set up), `container` (assignment →
//! environment and mounts), `service` (the gRPC service), `kubelet`
//! (serving and registering), `plugin_start` (logging and the API server
//! client, shared with the DRA driver).

pub mod api;
pub mod container;
pub mod devices;
pub mod kubelet;
pub mod plugin_start;
pub mod pods;
pub mod service;
