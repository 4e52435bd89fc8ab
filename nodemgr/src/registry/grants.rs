//! Specs the cluster granted (the DRA plugin's prepared ResourceClaims):
//! they win over what a tenant's processes ask and over the configuration,
//! because the scheduler already counted them against the device.

use super::Registry;
use super::tenant::Grant;
use crate::error::{self, Error};
use dilu_abi::node_wire::{Bytes, TenantSpec};
use dilu_abi::tenant_flags::check_tenant_name;
use dilu_layout::MAX_DEVICES;

/// Grants the daemon keeps at most (a node holds far fewer claims): a
/// client that loops cannot grow the registry without bound.
pub const MAX_GRANTS: usize = 4096;

impl Registry {
    /// Grants `spec` on `gpus` to tenant `name`: its spec from now on, and
    /// its GPUs from its first process on (a running tenant keeps the GPUs
    /// it runs on). A running tenant changes at once if the spec fits
    /// beside the others on its GPUs; otherwise nothing changes and the
    /// error says why. Returns the spec and whether anything changed: the
    /// DRA driver grants every prepared claim again every few seconds, and
    /// the same grant again must not disturb the controllers (which start
    /// over when the tenant set changes).
    pub fn grant(
        &mut self,
        name: &str,
        spec: TenantSpec,
        mut gpus: Vec<u32>,
    ) -> error::Result<(TenantSpec, bool)> {
        check_tenant_name(name).map_err(Error::Invalid)?;
        spec.validate().map_err(Error::Invalid)?;
        gpus.sort_unstable();
        gpus.dedup();
        if gpus.len() > MAX_DEVICES {
            return Err(Error::Invalid(format!(
                "{} GPUs granted; at most {MAX_DEVICES}",
                gpus.len()
            )));
        }
        if !self.granted.contains_key(name) && self.granted.len() >= MAX_GRANTS {
            return Err(Error::Refused(format!(
                "the node manager holds {MAX_GRANTS} grants already; release some first"
            )));
        }
        let mut changed = false;
        if let Some(tenant) = self.tenants.get(name)
            && tenant.spec != spec
        {
            self.admit_each(name, &spec, &tenant.gpus())?;
            let tenant = self.tenants.get_mut(name).expect("checked above");
            tenant.spec = spec.clone();
            tenant
                .regions
                .budget
                .set_mem_budget_all(spec.mem.map(Bytes::get));
            self.epoch += 1;
            changed = true;
        }
        let grant = Grant {
            spec: spec.clone(),
            gpus,
        };
        changed |= self.granted.get(name) != Some(&grant);
        self.granted.insert(name.to_string(), grant);
        Ok((spec, changed))
    }

    /// The GPUs granted to tenant `name`, ascending (empty: none named).
    pub(super) fn granted_gpus(&self, name: &str) -> Vec<u32> {
        self.granted
            .get(name)
            .map_or_else(Vec::new, |grant| grant.gpus.clone())
    }

    /// Ends tenant `name`'s grant; whether it had one. A running tenant
    /// keeps the spec it runs with until its processes leave.
    pub fn release(&mut self, name: &str) -> bool {
        self.granted.remove(name).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Peer, create_regions};
    use dilu_abi::node_wire::SmShare;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn peer() -> Peer {
        Peer {
            pid: std::process::id() as i32,
            uid: 1,
            connection: Arc::new(std::fs::File::open("/dev/null").unwrap().into()),
        }
    }

    fn spec(request: f64, mem: u64) -> TenantSpec {
        TenantSpec {
            sm_request: SmShare::percent(request),
            sm_limit: SmShare::percent(request.max(50.0)),
            mem: Some(Bytes::new(mem)),
            ..TenantSpec::default()
        }
    }

    #[test]
    fn a_grant_wins_over_what_the_process_and_the_configuration_ask() {
        let configured = BTreeMap::from([("claim".to_string(), spec(10.0, 1 << 30))]);
        let mut registry = Registry::new(configured, None);
        let granted = spec(30.0, 64 << 20);
        assert_eq!(
            registry.grant("claim", granted.clone(), Vec::new()),
            Ok((granted.clone(), true))
        );
        // The process asks for the whole device: it gets the grant.
        let (_, in_force, _) = registry
            .register(
                "claim",
                peer(),
                0,
                Some(spec(100.0, 1 << 40)),
                create_regions("test", None).unwrap(),
            )
            .unwrap();
        assert_eq!(in_force, granted);
        assert_eq!(
            registry.tenants["claim"].regions.budget.mem_budget(0),
            64 << 20
        );
        // The same grant again changes nothing (the controllers go on).
        let epoch = registry.epoch;
        assert_eq!(
            registry.grant("claim", granted.clone(), Vec::new()),
            Ok((granted.clone(), false))
        );
        assert_eq!(registry.epoch, epoch);
        // A new grant changes the running tenant's budget at once.
        let bigger = spec(40.0, 128 << 20);
        assert!(
            registry
                .grant("claim", bigger.clone(), Vec::new())
                .unwrap()
                .1
        );
        assert_eq!(registry.tenants["claim"].spec, bigger);
        assert_eq!(
            registry.tenants["claim"].regions.budget.mem_budget(0),
            128 << 20
        );
        // One that does not fit beside another tenant is refused, and
        // nothing changes.
        registry
            .register(
                "other",
                peer(),
                0,
                Some(spec(50.0, 1 << 20)),
                create_regions("test", None).unwrap(),
            )
            .unwrap();
        assert!(
            registry
                .grant("claim", spec(70.0, 1 << 20), Vec::new())
                .is_err()
        );
        assert_eq!(registry.granted["claim"].spec, bigger);
        // `dilu set` would be undone at the next grant: refused, and the
        // status says why.
        let set = dilu_abi::node_wire::SpecUpdate {
            mem: Some(Bytes::gib(1)),
            ..Default::default()
        };
        assert!(matches!(
            registry.update("claim", &set),
            Err(Error::Refused(reason)) if reason.contains("claim")
        ));
        let flags: Vec<(String, bool)> = registry
            .status()
            .into_iter()
            .map(|t| (t.name, t.granted))
            .collect();
        assert_eq!(
            flags,
            [("claim".to_string(), true), ("other".to_string(), false)]
        );
        assert!(registry.release("claim"));
        assert!(
            registry.update("claim", &set).is_ok(),
            "released: the operator's again"
        );
        assert!(!registry.release("claim"), "released once");
        assert!(registry.grant("bad name!", granted, Vec::new()).is_err());
        assert!(registry.grant("zero", spec(10.0, 0), Vec::new()).is_err());
    }

    #[test]
    fn a_granted_tenant_runs_on_its_gpus_and_is_admitted_there_only() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        let big = spec(60.0, 1 << 20);
        registry.grant("on-two", big.clone(), vec![3, 1]).unwrap();
        registry.grant("on-zero", big.clone(), vec![0]).unwrap();
        for name in ["on-two", "on-zero"] {
            registry
                .register(name, peer(), 0, None, create_regions("test", None).unwrap())
                .unwrap();
        }
        assert_eq!(registry.tenants["on-two"].gpus(), vec![1, 3]);
        assert_eq!(registry.tenants["on-zero"].gpus(), vec![0]);
        // 60% + 60% on GPU 1 does not fit.
        registry.grant("third", big, vec![1]).unwrap();
        let refused = registry
            .register(
                "third",
                peer(),
                0,
                None,
                create_regions("test", None).unwrap(),
            )
            .unwrap_err();
        assert!(
            matches!(&refused, Error::Refused(reason) if reason.contains("SM")),
            "{refused:?}"
        );
    }
}
