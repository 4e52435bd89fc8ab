//! GPUs chosen for a tenant before its first process registers (`dilu run`
//! on a node with several GPUs): chosen by the placement policy among what
//! the tenants and the other holds leave, and held for
//! [`PLACEMENT_GRACE`](super::PLACEMENT_GRACE) at most.

use super::Registry;
use super::tenant::{HeldPlacement, MAX_HELD_PLACEMENTS};
use crate::error::{self, Error};
use dilu_abi::node_wire::TenantSpec;
use dilu_abi::tenant_flags::check_tenant_name;
use dilu_layout::MAX_DEVICES;
use std::time::Instant;

impl Registry {
    /// Chooses `count` GPUs for tenant `name` of user `uid` (`dilu run` on
    /// a node with several GPUs, `--gpus N`) and holds them until the
    /// tenant's first process registers. `capacities` is each GPU's memory
    /// (bytes); the spec is the operator's for this name, else `asked`,
    /// else the default, as at registration, and holds on each GPU. A
    /// tenant already running keeps its GPUs (its processes share one
    /// budget). The GPUs come back ascending; empty: one GPU, one asked,
    /// nothing to choose. A request that cannot be met as asked is
    /// [`Error::Invalid`]; one refused beside the node's other tenants,
    /// [`Error::Refused`].
    pub fn place(
        &mut self,
        name: &str,
        uid: u32,
        asked: Option<TenantSpec>,
        capacities: &[u64],
        policy: &dyn dilu_placement::policy::PlacementPolicy,
        count: usize,
    ) -> error::Result<Vec<u32>> {
        check_tenant_name(name).map_err(Error::Invalid)?;
        let count = count.max(1);
        if count > capacities.len().max(1) {
            return Err(Error::Invalid(format!(
                "{name} asks {count} GPUs; this node has {}",
                capacities.len().max(1)
            )));
        }
        if count > MAX_DEVICES {
            // A tenant's regions hold a share and a budget per device.
            return Err(Error::Invalid(format!(
                "{name} asks {count} GPUs; a tenant runs on at most {MAX_DEVICES}"
            )));
        }
        if capacities.len() <= 1 {
            return Ok(Vec::new());
        }
        let spec = self.spec_of(name, asked);
        spec.validate().map_err(Error::Invalid)?;
        let running = |gpus: Vec<u32>| {
            if gpus.len() == count {
                Ok(gpus)
            } else {
                Err(Error::Invalid(format!(
                    "tenant {name:?} already runs on {} GPU(s) ({}); its processes \
                     share one placement, so start them with --gpus {}",
                    gpus.len(),
                    gpus.iter()
                        .map(|g| format!("gpu{g}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    gpus.len()
                )))
            }
        };
        if let Some(tenant) = self.tenants.get(name) {
            if tenant.uid != uid {
                return Err(Error::Refused(format!(
                    "tenant {name:?} belongs to another user (uid {})",
                    tenant.uid
                )));
            }
            if tenant.placed {
                return running(tenant.gpus());
            }
        }
        if let Some(held) = self.held.get_mut(name) {
            if held.uid != uid {
                return Err(Error::Refused(format!(
                    "tenant {name:?} belongs to another user (uid {})",
                    held.uid
                )));
            }
            held.since = Instant::now();
            return running(held.gpus.clone());
        }
        if self.held.len() >= MAX_HELD_PLACEMENTS {
            return Err(Error::Refused(format!(
                "{MAX_HELD_PLACEMENTS} tenants already wait for their first process; try again later"
            )));
        }
        let taken: Vec<(Vec<u32>, &TenantSpec)> = self
            .tenants
            .values()
            .map(|t| (t.gpus(), &t.spec))
            .filter(|(gpus, _)| !gpus.is_empty())
            .chain(self.held.values().map(|h| (h.gpus.clone(), &h.spec)))
            .map(|(gpus, spec)| {
                let gpus = gpus
                    .into_iter()
                    .filter(|&g| (g as usize) < capacities.len())
                    .collect();
                (gpus, spec)
            })
            .collect();
        let taken = taken.iter().map(|(gpus, spec)| (gpus.as_slice(), *spec));
        let gpus = crate::placement::choose(policy, capacities, taken, &spec, count)
            .ok_or_else(|| {
                Error::Refused(format!(
                    "{} {} room for {name} (SM request {}%, limit {}%{}{}) under the {} placement policy",
                    if count == 1 {
                        format!("no GPU of {}", capacities.len())
                    } else {
                        format!("fewer than {count} of the {} GPUs", capacities.len())
                    },
                    if count == 1 { "has" } else { "have" },
                    spec.sm_request.as_percent(),
                    spec.sm_limit.as_percent(),
                    spec.mem.map(|m| format!(", {m}")).unwrap_or_default(),
                    if count == 1 { "" } else { " on each" },
                    policy.name()
                ))
            })?;
        self.held.insert(
            name.to_string(),
            HeldPlacement {
                uid,
                spec,
                gpus: gpus.clone(),
                since: Instant::now(),
            },
        );
        Ok(gpus)
    }
}
