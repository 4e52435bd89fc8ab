//! The kubelet device plugin API v1beta1, generated at build time from the
//! vendored `proto/v1beta1/api.proto` (servers and clients of both services).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("v1beta1");

/// The API version the plugin registers with.
pub const VERSION: &str = "v1beta1";
/// Device health values the kubelet understands.
pub const HEALTHY: &str = "Healthy";
