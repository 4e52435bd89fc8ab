//! A co-located process's configuration (`DILU_COLO`, `DILU_COLO_GROUP`,
//! `DILU_COLO_TOLERANCE`, `DILU_COLO_HOLDOFF`, `DILU_COLO_GUARANTEE` and the
//! SLO and SM request of its spec), read once and checked.

use dilu_abi::node_wire::{SPEC_ENV, SmShare, SpecVar};
use dilu_abi::units;
use dilu_colocation::DEFAULT_HOLDOFF_NS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Filler { online: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColoConfig {
    pub role: Role,
    pub group: String,
    pub tolerance_ns: u64,
    /// A primary without an SLO or a set tolerance: its tolerance is
    /// learned from its own latency ([`learned_tolerance`](crate::sm_time::primary_tolerance::learned_tolerance)).
    pub tolerance_learned: bool,
    /// The operator set the tolerance (`DILU_COLO_TOLERANCE`): beside an
    /// SLO it is not raised to what the primary kept as if alone would
    /// tolerate.
    pub tolerance_set: bool,
    pub holdoff_ns: u64,
    pub slo_ns: Option<u64>,
    pub guarantee_ppm: u32,
    /// The filler's guarantee was set (`DILU_COLO_GUARANTEE`, or an SM
    /// request): it holds beside a primary kept as if alone too.
    pub guarantee_set: bool,
}

const ROLE_FORMS: &str = "primary, filler or online-filler";
const GROUP_FORMS: &str = "1 to 64 characters from A-Z a-z 0-9 . _ -";

/// Reads the configuration through `env`; `Err((variable, value, forms))`.
pub fn from_env(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<ColoConfig>, (String, String, String)> {
    let bad = |var: &str, value: &str, forms: &str| (var.into(), value.into(), forms.into());
    let Some(role) = env("DILU_COLO") else {
        return Ok(None);
    };
    let role = match role.as_str() {
        "primary" => Role::Primary,
        "filler" => Role::Filler { online: false },
        "online-filler" => Role::Filler { online: true },
        other => return Err(bad("DILU_COLO", other, ROLE_FORMS)),
    };
    let group = env("DILU_COLO_GROUP").unwrap_or_else(|| "gpu".into());
    if !(1..=64).contains(&group.len())
        || group.starts_with('.')
        || !group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(bad("DILU_COLO_GROUP", &group, GROUP_FORMS));
    }
    let duration = |var: &str| -> Result<Option<u64>, (String, String, String)> {
        env(var)
            .map(|v| units::parse_duration_ns(&v).map_err(|_| bad(var, &v, units::DURATION_FORMS)))
            .transpose()
    };
    let spec = match env(SPEC_ENV) {
        Some(v) => SpecVar::parse(&v).map_err(|e| bad(SPEC_ENV, &v, &e))?,
        None => SpecVar::default(),
    };
    let guarantee_set =
        env("DILU_COLO_GUARANTEE").is_some() || spec.sm_request.is_some_and(|r| r > SmShare::NONE);
    let guarantee_ppm = match env("DILU_COLO_GUARANTEE") {
        None => default_guarantee(spec.sm_request).ppm(),
        Some(v) => match v.parse::<SmShare>() {
            Ok(share) if share > SmShare::NONE => share.ppm(),
            _ => {
                return Err(bad(
                    "DILU_COLO_GUARANTEE",
                    &v,
                    "a percentage above 0, up to 100",
                ));
            }
        },
    };
    let slo_ns = spec
        .slo_ms
        .filter(|_| role == Role::Primary)
        .map(|ms| (ms * 1e6).round() as u64);
    let tolerance = duration("DILU_COLO_TOLERANCE")?;
    Ok(Some(ColoConfig {
        role,
        group,
        tolerance_learned: tolerance.is_none() && slo_ns.is_none(),
        tolerance_set: tolerance.is_some(),
        tolerance_ns: tolerance.unwrap_or_else(|| slo_ns.map_or(0, default_tolerance_ns)),
        holdoff_ns: duration("DILU_COLO_HOLDOFF")?.unwrap_or(DEFAULT_HOLDOFF_NS),
        slo_ns,
        guarantee_ppm,
        guarantee_set,
    }))
}

/// A primary's tolerance when none is set: half its SLO (4 ms of an 8 ms
/// SLO), cut per request to the slack its recent requests left without
/// fillers (see [`tolerance_within_slack`](crate::sm_time::primary_tolerance::tolerance_within_slack)). Without an SLO, none: a
/// primary with no latency target (a training loop) is never knowingly
/// delayed. A quarter kept fillers of 2 ms kernels beside a 6 ms SLO to
/// their guarantees: 58.8% busy on simgpu where half gave 93.0% with no
/// more violations.
fn default_tolerance_ns(slo_ns: u64) -> u64 {
    slo_ns / 2
}

/// A filler's guarantee when none is set: its SM request (the spec it gives
/// the node manager, `--sm-request`), which is what it was promised; with
/// no request, or a request of 0, 10% (so that a filler whose kernels fit
/// no gap still moves).
fn default_guarantee(sm_request: Option<SmShare>) -> SmShare {
    sm_request
        .filter(|&r| r > SmShare::NONE)
        .unwrap_or(SmShare::from_ppm(100_000))
}
