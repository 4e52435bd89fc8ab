//! What the daemon persists for re-adoption, and the tenants of a previous
//! daemon taken back from it: they keep their requests admitted while their
//! processes re-register (within [`READOPT_GRACE`](super::READOPT_GRACE)).

use super::Registry;
use super::regions::{configure, create_regions, write_shares};
use super::tenant::{Tenant, devices_on};
use dilu_abi::node_wire::TenantSpec;
use dilu_abi::tenant_flags::check_tenant_name;
use dilu_layout::MAX_DEVICES;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;

/// What is persisted under the run directory for re-adoption. Its shape
/// stays readable by the daemon that wrote it before (device 0's share
/// and GPU apart from the others').
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedTenant {
    pub name: String,
    pub uid: u32,
    pub spec: TenantSpec,
    pub share_ppm: u32,
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub more_gpus: Vec<u32>,
    /// The share on each of `more_gpus` (its devices 1..).
    #[serde(default)]
    pub more_shares: Vec<u32>,
    #[serde(default)]
    pub over_admitted: Option<String>,
}

impl Registry {
    /// The state to persist.
    pub fn saved(&self) -> Vec<SavedTenant> {
        self.tenants
            .values()
            .map(|t| SavedTenant {
                name: t.name.clone(),
                uid: t.uid,
                spec: t.spec.clone(),
                share_ppm: t.devices[0].share_ppm,
                // The GPUs its processes chose are found again from their
                // use; only the daemon's placement is kept.
                gpu: t.devices[0].gpu.filter(|_| t.placed),
                more_gpus: (t.devices[1..].iter())
                    .filter_map(|d| d.gpu.filter(|_| t.placed))
                    .collect(),
                more_shares: (t.devices[1..].iter())
                    .filter(|_| t.placed)
                    .map(|d| d.share_ppm)
                    .collect(),
                over_admitted: t.over_admitted.clone(),
            })
            .collect()
    }

    /// Tenants of a previous daemon, waiting for their processes to
    /// re-register: they keep their requests admitted meanwhile.
    pub fn restore(&mut self, saved: Vec<SavedTenant>) {
        for s in saved {
            let devices = 1 + s.more_gpus.len();
            if check_tenant_name(&s.name).is_err()
                || self.tenants.contains_key(&s.name)
                || devices > MAX_DEVICES
            {
                continue;
            }
            let Ok(regions) = create_regions(&s.name, None) else {
                continue;
            };
            configure(&regions, s.share_ppm, s.spec.mem);
            // A saved tenant has more GPUs only if it has a first one.
            let gpus: Vec<u32> = s.gpu.into_iter().chain(s.more_gpus).collect();
            let mut devices = devices_on(&gpus, s.share_ppm);
            for (device, &share) in devices[1..].iter_mut().zip(&s.more_shares) {
                device.share_ppm = share;
            }
            write_shares(
                &regions.budget,
                devices.iter().map(|d| (d.ordinal, d.share_ppm)),
            );
            self.tenants.insert(
                s.name.clone(),
                Tenant {
                    name: s.name,
                    uid: s.uid,
                    spec: s.spec,
                    regions,
                    members: BTreeMap::new(),
                    ledger: None,
                    awaiting_since: Some(Instant::now()),
                    placed: !gpus.is_empty(),
                    seen_on_gpus: Vec::new(),
                    devices,
                    over_admitted: s.over_admitted,
                },
            );
            self.epoch += 1;
        }
    }
}
