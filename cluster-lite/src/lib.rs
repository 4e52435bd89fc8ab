//! `dilu-cluster`: the cluster layer of dilu.
//!
//! It places DL function instances onto GPUs so that their needs complement
//! each other (`policy`, from `dilu-placement`) in two shapes: a Kubernetes
//! scheduler extender (`extender`) and a trace-driven simulator
//! (`simulator`) that measures the policies side by side. While load falls,
//! `consolidation` moves replicas left alone on a GPU onto busy GPUs (in the
//! simulator). On one machine without Kubernetes, the node manager places
//! `dilu run` tenants with the same policies. `autoscaler` scales the
//! Deployments of annotated functions from the node managers' signals with
//! the rule `scaling` simulates.

pub mod autoscaler;
pub mod consolidation;
pub mod extender;
pub mod rng;
pub mod scaling;
pub mod simulator;

// The placement rules live in `dilu-placement` so that the node manager
// places with the same code; these paths keep `crate::policy` and
// `crate::model` working here.
pub use dilu_placement::{model, policy};
