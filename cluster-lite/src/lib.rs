//! `dilu-cluster`: the cluster layer of dilu.
//!
//! It places DL function instances onto GPUs so that their needs complement
//! each other (`policy`), decides how many instances each function needs
//! (`scaling`), and runs in three shapes: an embedded coordinator that talks
//! to node managers over TCP (`coordinator`, `node_agent`, `wire_io`), a
//! Kubernetes scheduler extender (`extender`), and a trace-driven simulator
//! (`simulator`) that measures the policies side by side. While load falls,
//! `consolidation` moves replicas left alone on a GPU onto busy GPUs.

pub mod consolidation;
pub mod control;
pub mod coordinator;
pub mod extender;
pub mod node_agent;
pub mod rng;
pub mod scaling;
pub mod simulator;
pub mod wire_io;

// The placement rules live in `dilu-placement` so that the node manager
// places with the same code; these paths keep `crate::policy` and
// `crate::model` working here.
pub use dilu_placement::{model, policy};
