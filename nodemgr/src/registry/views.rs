//! What the registry shows: tenants' status (for `dilu status` and
//! metrics), what the memory audit needs, and the ledger copies and audit
//! results read outside the lock.

use super::{Registry, Tenant};
use dilu_abi::node_wire::{GpuShare, TenantStatus};
use dilu_layout::ledger::{self, TenantLedger};
use dilu_layout::shm::Region;
use std::collections::BTreeMap;

impl Registry {
    /// Each tenant's (name, uid), to read their ledgers without the lock.
    pub fn ledger_sources(&self) -> Vec<(String, u32)> {
        self.tenants
            .values()
            .map(|t| (t.name.clone(), t.uid))
            .collect()
    }

    /// Stores a ledger copy read outside the lock.
    pub fn set_ledger(&mut self, name: &str, uid: u32, ledger: Option<Region<TenantLedger>>) {
        if let Some(tenant) = self.tenants.get_mut(name)
            && tenant.uid == uid
        {
            tenant.ledger = ledger;
        }
    }

    /// What the memory audit needs: each tenant's processes and budgets.
    /// The budget audited is the daemon's (the sealed region), never the
    /// tenant's own ledger, which the tenant can rewrite.
    pub fn audit_view(&self) -> Vec<crate::audit::AuditedTenant> {
        let daemon_budget = |t: &Tenant, device: usize| {
            let bytes = t.regions.budget.mem_budget(device);
            (bytes != ledger::UNLIMITED).then_some(bytes)
        };
        self.tenants
            .values()
            .map(|t| crate::audit::AuditedTenant {
                name: t.name.clone(),
                pids: t.members.values().map(|m| m.pid).collect(),
                placed: (t.devices.iter())
                    .filter_map(|d| Some((d.gpu?, daemon_budget(t, d.ordinal))))
                    .collect(),
                elsewhere: daemon_budget(t, t.devices[0].ordinal),
            })
            .collect()
    }

    /// Records what NVML showed a tenant's processes hold, by node GPU
    /// (NVML index): a device on a known GPU that GPU's; a device on none
    /// (of a tenant not placed, before its GPU is known) the most they hold
    /// on one GPU, the figure its per-device budget is judged by.
    /// `held_on` lists every GPU NVML showed its processes on.
    pub fn set_audited(&mut self, name: &str, held_on: &BTreeMap<u32, u64>) {
        let Some(t) = self.tenants.get_mut(name) else {
            return;
        };
        t.seen_on_gpus = held_on.keys().copied().collect();
        for device in &mut t.devices {
            device.audited_bytes = Some(match device.gpu {
                Some(gpu) => held_on.get(&gpu).copied().unwrap_or(0),
                None => held_on.values().copied().max().unwrap_or(0),
            });
        }
    }

    /// Tenants as they are now, for `dilu status` and metrics: the
    /// figures of each one's first device, and of each other device on a
    /// known GPU.
    pub fn status(&self) -> Vec<TenantStatus> {
        self.tenants
            .values()
            .map(|t| {
                let first = &t.devices[0];
                let recent = first.sampler.recent();
                TenantStatus {
                    name: t.name.clone(),
                    uid: t.uid,
                    spec: t.spec.clone(),
                    pids: t.members.values().map(|m| m.pid).collect(),
                    mem_used_bytes: t.ledger.as_ref().map_or(0, |l| l.used(first.ordinal)),
                    mem_budget_bytes: t.mem_budget(first.ordinal),
                    mem_audited_bytes: first.audited_bytes,
                    sm_current_pct: first.share_ppm as f64 / 10_000.0,
                    sm_achieved_pct: recent.achieved * 100.0,
                    busy_seconds_total: recent.busy_total_ns as f64 / 1e9,
                    launches_total: recent.launches_total,
                    throttled_seconds_total: recent.throttled_total_ns as f64 / 1e9,
                    p99_ms: recent.p99_ns.map(|ns| ns as f64 / 1e6),
                    latency_reports_total: recent.latency_reports_total,
                    latency_seconds_total: recent.latency_sum_total_ns as f64 / 1e9,
                    bubble_ratio: recent.bubble_ratio,
                    gpu: first.gpu,
                    more_gpus: (t.devices.iter().skip(1))
                        .filter_map(|d| {
                            let k = d.ordinal;
                            Some(GpuShare {
                                gpu: d.gpu?,
                                sm_current_pct: d.share_ppm as f64 / 10_000.0,
                                sm_achieved_pct: d.sampler.recent().achieved * 100.0,
                                mem_used_bytes: t.ledger.as_ref().map_or(0, |l| l.used(k)),
                                mem_budget_bytes: t.mem_budget(k),
                                mem_audited_bytes: d.audited_bytes,
                            })
                        })
                        .collect(),
                    waiting: first.sampler.waiting_at_zero(first.share_ppm),
                    over_admitted: t.over_admitted.clone(),
                    granted: self.granted.contains_key(&t.name),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{ProcessMemory, find_overruns, usage_by_tenant};
    use dilu_abi::node_wire::SmShare;
    use dilu_abi::node_wire::TenantSpec;

    const MIB: u64 = 1 << 20;

    fn add(registry: &mut Registry, name: &str, pid: i32, gpus: &[u32]) {
        let spec = TenantSpec {
            mem: Some(dilu_abi::units::Bytes::new(64 * MIB)),
            sm_request: SmShare::percent(10.0),
            ..TenantSpec::default()
        };
        crate::registry::testing::register_on(registry, name, pid, gpus, spec);
    }

    /// NVML numbers the node's GPUs, a tenant its own devices: a tenant
    /// placed on gpu1 and gpu3 is audited on those two, and its status
    /// shows what it holds on each (not what NVML's gpu0 holds).
    #[test]
    fn a_placed_tenant_is_audited_and_shown_on_the_gpus_it_was_given() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        add(&mut registry, "wide", 100, &[1, 3]);
        add(&mut registry, "free", 200, &[]);
        let held = |pid, device, mib| ProcessMemory {
            pid,
            device,
            used_bytes: mib * MIB,
        };
        let usage = [
            held(100, 1, 10),
            held(100, 3, 96),
            held(200, 0, 5),
            held(200, 2, 30),
        ];
        let tenants = registry.audit_view();
        let totals = usage_by_tenant(&usage, &tenants);
        for (name, devices) in &totals {
            let held_on = devices.iter().map(|(&g, (b, _))| (g, *b)).collect();
            registry.set_audited(name, &held_on);
        }
        let overruns = find_overruns(&usage, &tenants, 4 * MIB);
        let over: Vec<(&str, u32)> = overruns
            .iter()
            .map(|o| (o.tenant.as_str(), o.device))
            .collect();
        assert_eq!(over, [("wide", 3)], "96 MiB on its second GPU, budget 64");
        let status = registry.status();
        let wide = status.iter().find(|t| t.name == "wide").unwrap();
        assert_eq!(wide.gpu, Some(1));
        assert_eq!(wide.mem_audited_bytes, Some(10 * MIB));
        assert_eq!(wide.more_gpus.len(), 1);
        assert_eq!(wide.more_gpus[0].gpu, 3);
        assert_eq!(wide.more_gpus[0].mem_audited_bytes, Some(96 * MIB));
        assert_eq!(wide.more_gpus[0].mem_budget_bytes, Some(64 * MIB));
        // Not placed: the most it holds on one GPU, what its per-device
        // budget is judged by.
        let free = status.iter().find(|t| t.name == "free").unwrap();
        assert_eq!(free.gpu, None);
        assert_eq!(free.mem_audited_bytes, Some(30 * MIB));
    }
}
