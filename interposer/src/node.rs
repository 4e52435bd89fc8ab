//! The node manager, as this process sees it: registration happens once,
//! the first time either budget ([`crate::memory::budget`] for memory,
//! [`crate::sm_time::tenant_sm`] for SM time) is set up, and both then read the same
//! sealed, read-only budget region the daemon writes.
//!
//! A process registers only when it names a tenant (`DILU_TENANT`) and the
//! daemon's socket answers; otherwise it runs standalone. A refused
//! registration stops the process with the daemon's reason (fail closed).

use crate::config;
use dilu_abi::node_client::{self, Attached};
use dilu_abi::node_wire::TenantSpec;
use std::sync::OnceLock;

static ATTACHED: OnceLock<Option<&'static Attached>> = OnceLock::new();

/// This process's node-manager attachment, registering on first use; `None`
/// in standalone mode.
pub fn attached() -> Option<&'static Attached> {
    *ATTACHED.get_or_init(|| {
        let name = config::get().tenant.as_deref()?;
        attach(name)
    })
}

fn attach(name: &str) -> Option<&'static Attached> {
    let spec = TenantSpec::from_env().unwrap_or_else(|e| {
        eprintln!("dilu-interposer: cannot read the tenant's spec ({e}); stopping");
        std::process::exit(2)
    });
    match node_client::attach(name, spec) {
        Ok(attached) => {
            if attached.is_some() {
                tracing::debug!(tenant = name, "budgets from the node manager");
            }
            attached
        }
        Err(reason) => {
            eprintln!("dilu-interposer: {reason}; stopping");
            std::process::exit(2)
        }
    }
}
