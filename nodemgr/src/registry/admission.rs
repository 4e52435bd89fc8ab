//! Admission: whether a tenant's spec fits beside the other tenants of
//! each of its GPUs (SM requests sum to at most the device, memory budgets
//! to at most its memory), the room left for a process that is already
//! running, and the cap on tenants per user.

use super::Registry;
use super::tenant::is_on;
use crate::error::{self, Error};
use dilu_abi::node_wire::{Bytes, SmShare, TenantSpec};
use dilu_layout::budget::FULL_SHARE_PPM;

impl Registry {
    /// Checks that `spec` fits beside the other tenants of each of the
    /// tenant's GPUs (`gpus`: those it was placed on, empty when unplaced;
    /// its spec holds on each).
    pub fn admit_each(&self, name: &str, spec: &TenantSpec, gpus: &[u32]) -> error::Result<()> {
        let Some((&first, more)) = gpus.split_first() else {
            return self.admit(name, spec, None);
        };
        self.admit(name, spec, Some(first))?;
        for &g in more {
            self.admit(name, spec, Some(g))
                .map_err(|e| e.context(format_args!("on gpu{g}")))?;
        }
        Ok(())
    }

    /// Checks that `spec` fits beside every other tenant on the same GPU
    /// (`gpu`: the one it was placed on; unplaced tenants count together,
    /// as on a one-GPU node); `name` is the tenant being admitted or changed.
    pub fn admit(&self, name: &str, spec: &TenantSpec, gpu: Option<u32>) -> error::Result<()> {
        spec.validate().map_err(Error::Invalid)?;
        let held = self
            .held
            .iter()
            .filter(|(_, h)| is_on(&h.gpus, gpu))
            .map(|(n, h)| (n, &h.spec));
        let others: Vec<(&String, &TenantSpec)> = self
            .tenants
            .iter()
            .filter(|(_, t)| t.is_on(gpu))
            .map(|(n, t)| (n, &t.spec))
            .chain(held)
            .filter(|(n, _)| n.as_str() != name)
            .collect();
        let requested: u32 =
            others.iter().map(|(_, s)| s.sm_request.ppm()).sum::<u32>() + spec.sm_request.ppm();
        if requested > FULL_SHARE_PPM {
            let list: Vec<String> = others
                .iter()
                .map(|(n, s)| format!("{n} {}", s.sm_request))
                .collect();
            return Err(Error::Refused(format!(
                "SM requests would sum to {}% of the GPU (> 100%): {name} asks {}, admitted: {}",
                requested as f64 / 10_000.0,
                spec.sm_request,
                if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                }
            )));
        }
        if let (Some(capacity), Some(mem)) = (self.gpu_memory.map(Bytes::new), spec.mem) {
            let used: Bytes = others.iter().filter_map(|(_, s)| s.mem).sum();
            if used.saturating_add(mem) > capacity {
                return Err(Error::Refused(format!(
                    "memory budgets would sum to {} on a {capacity} GPU: {name} asks {mem}, \
                     others hold {used}",
                    used.saturating_add(mem),
                )));
            }
        }
        Ok(())
    }

    /// `spec` cut down to what is left beside the other tenants of `gpu`:
    /// the SM request to the unrequested share, the memory budget to the
    /// unbudgeted memory. What an over-admitted tenant is held to, so the
    /// admitted tenants keep their guarantees.
    pub(super) fn room_left(&self, name: &str, spec: &TenantSpec, gpu: Option<u32>) -> TenantSpec {
        let others = || {
            self.tenants
                .iter()
                .filter(move |(n, t)| t.is_on(gpu) && n.as_str() != name)
                .map(|(_, t)| &t.spec)
        };
        let requested: u32 = others().map(|s| s.sm_request.ppm()).sum();
        let mut held = spec.clone();
        held.sm_request = spec.sm_request.min(SmShare::rest_beside(requested));
        held.sm_limit = spec.sm_limit.max(held.sm_request);
        if let (Some(capacity), Some(mem)) = (self.gpu_memory.map(Bytes::new), spec.mem) {
            let budgeted: Bytes = others().filter_map(|s| s.mem).sum();
            held.mem = Some(mem.min(capacity.saturating_sub(budgeted)));
        }
        held
    }

    /// `spec` cut down to the room left on every one of `gpus` (empty: the
    /// unplaced tenants' group): what a running process that does not fit
    /// there is held to.
    pub(super) fn room_left_on(&self, name: &str, spec: &TenantSpec, gpus: &[u32]) -> TenantSpec {
        let mut held = self.room_left(name, spec, gpus.first().copied());
        for &g in gpus.iter().skip(1) {
            let room = self.room_left(name, spec, Some(g));
            held.sm_request = held.sm_request.min(room.sm_request);
            held.sm_limit = held.sm_limit.max(held.sm_request);
            if let (Some(a), Some(b)) = (held.mem, room.mem) {
                held.mem = Some(a.min(b));
            }
        }
        held
    }

    /// Refuses a new tenant of `uid` when that user already has
    /// `max_tenants_per_uid` (other users' tenants do not count).
    pub(super) fn check_tenant_cap(&self, uid: u32) -> error::Result<()> {
        let held = self.tenants.values().filter(|t| t.uid == uid).count();
        if held >= self.max_tenants_per_uid {
            return Err(Error::Refused(format!(
                "uid {uid} already has {held} tenants registered (max_tenants_per_uid = {})",
                self.max_tenants_per_uid
            )));
        }
        Ok(())
    }
}
