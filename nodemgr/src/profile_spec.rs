//! A profile file (what `dilu profile` writes) read as a tenant's spec.

use crate::error::{self, Error};
use dilu_abi::node_wire::{SmShare, TenantSpec, WorkClass};
use dilu_profile::profile::{Class, Profile};
use std::path::Path;

/// Reads a profile file as a tenant spec (class, SLO, SM request and limit)
/// and its batch size: what `dilu run --profile` and the node manager's
/// `[tenants.NAME] profile` use.
pub fn load_spec(path: &Path) -> error::Result<(TenantSpec, u32)> {
    let profile = Profile::load(path).map_err(Error::Invalid)?;
    let share = |key: &str, percent: u32| {
        SmShare::from_percent(f64::from(percent)).ok_or_else(|| {
            Error::Invalid(format!(
                "{}: {key} {percent} is not a percentage from 0 to 100",
                path.display()
            ))
        })
    };
    let spec = TenantSpec {
        class: match profile.class {
            Class::Latency => WorkClass::Latency,
            Class::Batch => WorkClass::Batch,
        },
        slo_ms: profile.slo_ms,
        sm_request: share("sm_request", profile.sm_request)?,
        sm_limit: share("sm_limit", profile.sm_limit)?,
        mem: None,
    };
    spec.validate()
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    Ok((spec, profile.batch))
}
