//! The node manager and the `dilu` command-line front end, as a library so
//! that tests and the demo can run a daemon in-process.
//!
//! - [`control`]: control laws (pure: observations in, shares out).
pub mod control;
