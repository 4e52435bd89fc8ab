//! Controllers: pure functions from what tenants did in the last period to
//! the SM-time share each may use in the next one.
//!
//! The daemon samples every tenant's telemetry once per period (default
//! 5 ms), turns the counter differences into an [`Observation`] per tenant
//! and asks the active [`Controller`] for new shares, which it writes into
//! the tenants' budgets. Controllers never touch processes or memory, so
//! they are tested with made-up observations.
//!
//! - [`dilu::Dilu`]: dilu's controller (work-conserving, SLO-protecting);
//!   a co-location primary's guarantee is lent as `dilu-colo` lends it.
//! - `dilu-colo`: [`dilu::Dilu`] lending every latency tenant's whole
//!   guarantee while its latency has slack (co-location protects it per
//!   launch), with no dead band; while all is lent, busy batch tenants may
//!   each use the device but the others' requests.
//! - [`rckm::Rckm`]: the law of Dilu's published code, as a baseline.
//! - [`fixed::Static`]: fixed requests (what HAMi-core or MPS limits give).

pub mod dilu;
pub mod fixed;
pub mod per_gpu;
pub mod policy;
pub mod rckm;

pub use policy::{
    CONTROL_WINDOW_NS, Controller, FULL, Latency, Observation, RECENT_NS, SYNC_TRUSTED_NS,
    share_out_batch,
};

use crate::error::Error;

/// The names `--controller` accepts.
pub const NAMES: [&str; 4] = ["dilu", "dilu-colo", "dilu-rckm", "static"];

/// Builds a controller by name; an unknown name is [`Error::Invalid`],
/// naming the ones there are.
pub fn by_name(name: &str) -> crate::error::Result<Box<dyn Controller>> {
    match name {
        "dilu" => Ok(Box::new(dilu::Dilu::default())),
        "dilu-colo" => Ok(Box::new(dilu::Dilu::new(dilu::Params {
            lend: true,
            ..dilu::Params::default()
        }))),
        "dilu-rckm" | "rckm" => Ok(Box::new(rckm::Rckm::default())),
        "static" => Ok(Box::new(fixed::Static)),
        other => Err(Error::Invalid(format!(
            "unknown controller {other:?}: expected one of {}",
            NAMES.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::policy::testing::*;
    use super::*;
    use dilu_abi::node_wire::WorkClass;

    #[test]
    fn batch_tenants_share_what_is_left_up_to_their_limits() {
        let tenants = vec![
            busy(tenant(WorkClass::Batch, 10, 30), 50),
            busy(tenant(WorkClass::Batch, 20, 100), 50),
            tenant(WorkClass::Batch, 5, 100), // idle: keeps its request as its cap
        ];
        let mut out = vec![0; 3];
        share_out_batch(&tenants, &[0, 1, 2], 900_000, &mut out);
        assert_eq!(out[0], 300_000, "capped at its limit");
        assert_eq!(out[2], 50_000);
        assert_eq!(
            out[0] + out[1],
            900_000,
            "the idle tenant's request is lent: nothing left unused"
        );
        let unknown = by_name("nope").err().unwrap();
        assert!(matches!(unknown, Error::Invalid(_)), "{unknown:?}");
        assert!(unknown.message().contains("dilu-rckm"), "{unknown}");
    }

    /// Every controller, a tenant without a request held at share 0 whose
    /// launches wait, and the device otherwise idle or partly reserved.
    #[test]
    fn a_waiting_tenant_without_a_request_gets_the_idle_device_under_every_controller() {
        let mut waiting = tenant(WorkClass::Batch, 0, 100);
        waiting.share_ppm = 0;
        waiting.throttled_ns = 1_000_000; // waited, launched nothing
        let idle_guaranteed = tenant(WorkClass::Batch, 60, 100);
        for name in NAMES {
            let mut c = by_name(name).unwrap();
            let alone = c.step(0, std::slice::from_ref(&waiting));
            assert_eq!(alone, vec![FULL], "{name}: alone on the device");
            c.reset();
            let shares = c.step(0, &[waiting.clone(), idle_guaranteed.clone()]);
            assert!(shares[0] >= 400_000, "{name}: {shares:?}");
            assert_eq!(shares[1], 600_000, "{name}: the request stays a cap");
            // Without demand it waits for nothing and keeps nothing.
            c.reset();
            let quiet = tenant(WorkClass::Batch, 0, 100);
            assert_eq!(c.step(0, &[quiet])[0], 0, "{name}");
        }
    }

    /// Every controller, a tenant without a request that last launched
    /// longer ago than RECENT_NS but waits in a sync on its own work (a
    /// training step's end): it keeps a share, so the launches that follow
    /// the sync go at once; once out of the sync for RECENT_NS it is quiet.
    #[test]
    fn a_tenant_waiting_in_a_sync_on_its_own_work_keeps_a_share_under_every_controller() {
        let mut syncing = tenant(WorkClass::Batch, 0, 100);
        syncing.idle_ns = 115_000_000;
        syncing.sync_idle_ns = 0;
        let just_out = Observation {
            sync_idle_ns: 3_000_000,
            ..syncing.clone()
        };
        let long_out = Observation {
            sync_idle_ns: RECENT_NS,
            ..syncing.clone()
        };
        let busy_guaranteed = busy(tenant(WorkClass::Batch, 60, 100), 50);
        for name in NAMES {
            let mut c = by_name(name).unwrap();
            for o in [&syncing, &just_out] {
                c.reset();
                let alone = c.step(0, std::slice::from_ref(o));
                assert_eq!(alone, vec![FULL], "{name}: alone on the device");
                c.reset();
                let shares = c.step(0, &[o.clone(), busy_guaranteed.clone()]);
                assert!(shares[0] > 0, "{name}: {shares:?}");
                assert!(shares[1] >= 600_000, "{name}: the request holds");
            }
            c.reset();
            assert_eq!(
                c.step(0, std::slice::from_ref(&long_out))[0],
                0,
                "{name}: quiet"
            );
            // A count left high by a process killed in a sync, its tenant
            // launching nothing since: not at work for ever.
            let stale = Observation {
                idle_ns: SYNC_TRUSTED_NS,
                ..syncing.clone()
            };
            c.reset();
            assert_eq!(
                c.step(0, std::slice::from_ref(&stale))[0],
                0,
                "{name}: a stale sync"
            );
        }
    }

    #[test]
    fn a_share_of_zero_set_on_purpose_stays_zero() {
        let mut waiting = tenant(WorkClass::Batch, 0, 0);
        waiting.throttled_ns = 1_000_000;
        for name in NAMES {
            let mut c = by_name(name).unwrap();
            assert_eq!(c.step(0, std::slice::from_ref(&waiting)), vec![0], "{name}");
        }
    }
}
