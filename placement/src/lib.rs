//! `dilu-placement`: which GPU an instance goes to, as one library.
//!
//! - [`model`]: nodes, their GPUs and the running sums of what the
//!   instances on each GPU ask for.
//! - [`policy`]: the placement rules (dilu's complementary placement and the
//!   baselines) behind one interface, and the search that turns a rule into
//!   a placement.
//!
//! Pure data and arithmetic (no I/O, no threads), so the cluster layer
//! (simulator, Kubernetes extender) and the node manager (`dilu run` on a
//! multi-GPU node) place with the same code.

mod fast_hash;
pub mod model;
pub mod policy;
