//! `dilu-dra-plugin`: dilu's Kubernetes DRA driver, `gpu.dilu.io`.
//!
//! Owns the node's side of Dynamic Resource Allocation: it publishes the
//! node's GPUs as devices shareable by consumable capacity ([`slice`]), and
//! turns each ResourceClaim the kubelet prepares into a tenant whose
//! budgets are the claim's ([`claim`]): a grant to the node manager (which
//! then wins over anything the container asks) and a CDI spec that puts the
//! container under the interposer ([`cdi`]). Prepared claims survive a
//! restart ([`checkpoint`]).
//!
//! May touch: the kubelet's plugin sockets, the CDI directory, its
//! checkpoint file, the API server (ResourceSlices, ResourceClaims) and the
//! node manager's socket (operator requests). Never links the interposer.
//!
//! - [`api`]: the kubelet's gRPC interfaces (vendored `.proto`);
//! - [`quantity`]: Kubernetes quantities;
//! - [`service`]: `NodePrepareResources` / `NodeUnprepareResources`;
//! - [`kubelet`]: registration with the kubelet and serving;
//! - [`apiserver`]: reading claims, publishing the slice.

pub mod api;
pub mod apiserver;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod kubelet;
pub mod quantity;
pub mod service;
pub mod slice;

/// The driver's name: its DeviceClass selects `device.driver == "gpu.dilu.io"`.
pub const DRIVER: &str = "gpu.dilu.io";
