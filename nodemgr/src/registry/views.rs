//! What the registry shows: tenants' status (for `dilu status` and
//! metrics), what the memory audit needs, and the ledger copies and audit
//! results read outside the lock.

use super::Registry;
use dilu_abi::node_wire::TenantStatus;
use dilu_layout::ledger::{self, TenantLedger};
use dilu_layout::shm::Region;

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
        self.tenants
            .values()
            .map(|t| crate::audit::AuditedTenant {
                name: t.name.clone(),
                pids: t.members.values().map(|m| m.pid).collect(),
                budgets: (0..ledger::MAX_DEVICES)
                    .map(|d| {
                        let bytes = t.regions.budget.mem_budget(d);
                        (bytes != ledger::UNLIMITED).then_some(bytes)
                    })
                    .collect(),
            })
            .collect()
    }

    /// Records what the audit saw a tenant hold on device 0.
    pub fn set_audited(&mut self, name: &str, bytes: Option<u64>) {
        if let Some(t) = self.tenants.get_mut(name) {
            t.audited_bytes = bytes;
        }
    }

    /// Tenants as they are now, for `dilu status` and metrics.
    pub fn status(&self) -> Vec<TenantStatus> {
        self.tenants
            .values()
            .map(|t| {
                let recent = t.sampler.recent();
                TenantStatus {
                    name: t.name.clone(),
                    uid: t.uid,
                    spec: t.spec.clone(),
                    pids: t.members.values().map(|m| m.pid).collect(),
                    mem_used_bytes: t.ledger.as_ref().map_or(0, |l| l.used(0)),
                    mem_budget_bytes: t.mem_budget(0),
                    mem_audited_bytes: t.audited_bytes,
                    sm_current_pct: t.share_ppm as f64 / 10_000.0,
                    sm_achieved_pct: recent.achieved * 100.0,
                    busy_seconds_total: recent.busy_total_ns as f64 / 1e9,
                    launches_total: recent.launches_total,
                    throttled_seconds_total: recent.throttled_total_ns as f64 / 1e9,
                    p99_ms: recent.p99_ns.map(|ns| ns as f64 / 1e6),
                    latency_reports_total: recent.latency_reports_total,
                    latency_seconds_total: recent.latency_sum_total_ns as f64 / 1e9,
                    bubble_ratio: recent.bubble_ratio,
                    gpu: t.gpu,
                    more_gpus: t
                        .more_gpus
                        .iter()
                        .zip(&t.more_devices)
                        .map(|(&gpu, d)| dilu_abi::node_wire::GpuShare {
                            gpu,
                            sm_current_pct: d.share_ppm as f64 / 10_000.0,
                            sm_achieved_pct: d.sampler.recent().achieved * 100.0,
                        })
                        .collect(),
                    waiting: t.sampler.waiting_at_zero(t.share_ppm),
                    over_admitted: t.over_admitted.clone(),
                    granted: self.granted.contains_key(&t.name),
                }
            })
            .collect()
    }
}
