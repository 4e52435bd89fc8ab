//! The memory audit: what each process really holds on each device, from a
//! source the tenant cannot write (NVML's per-process usage on a real GPU,
//! the same query against simgpu's simulated NVML), compared with its
//! tenant's budget.
//!
//! The interposer's budget check is only as honest as the ledger it counts
//! in, which the tenant's own processes write (and a process that bypasses
//! the interposer never counts at all). The audit is what catches that: a
//! tenant whose processes together hold more than its budget (plus a slack
//! for what the driver keeps beside allocations) is over-running, and the
//! daemon acts as configured ([`AuditAction`]).

use std::collections::BTreeMap;

/// What one process holds on one device, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
    pub device: u32,
    pub used_bytes: u64,
}

/// Where real per-process usage comes from (NVML, or a fake in tests).
pub trait UsageSource: Send {
    fn process_memory(&mut self) -> Result<Vec<ProcessMemory>, String>;
}

/// What the daemon does to a tenant over its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    /// No audit at all.
    Off,
    /// A warning in the daemon's log (and the status), nothing more.
    Log,
    /// SIGTERM to the tenant's processes on the device.
    Signal,
    /// SIGKILL to them.
    Kill,
}

impl AuditAction {
    pub(crate) fn parse(text: &str) -> Result<AuditAction, String> {
        match text {
            "off" => Ok(AuditAction::Off),
            "log" => Ok(AuditAction::Log),
            "signal" => Ok(AuditAction::Signal),
            "kill" => Ok(AuditAction::Kill),
            other => Err(format!(
                "audit = {other:?}: expected off, log, signal or kill"
            )),
        }
    }
}

/// A tenant as the audit sees it: its processes and its budget on each
/// GPU. NVML numbers the node's GPUs; a tenant's budget is per device of
/// its own processes, so a placed tenant's budgets are found by the GPUs
/// it was given.
#[derive(Debug, Clone)]
pub struct AuditedTenant {
    pub name: String,
    pub pids: Vec<i32>,
    /// Its budget on each GPU it was placed on: (NVML index, budget; None:
    /// unlimited).
    pub placed: Vec<(u32, Option<u64>)>,
    /// Its budget on any other GPU (a tenant not placed by the node
    /// manager: on whichever its processes use).
    pub elsewhere: Option<u64>,
}

impl AuditedTenant {
    /// Its budget on node GPU `gpu` (None: unlimited).
    pub fn budget_on(&self, gpu: u32) -> Option<u64> {
        self.placed
            .iter()
            .find(|(g, _)| *g == gpu)
            .map_or(self.elsewhere, |(_, budget)| *budget)
    }
}

/// A tenant holding more than its budget (plus slack) on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overrun {
    pub tenant: String,
    pub device: u32,
    pub used_bytes: u64,
    pub budget_bytes: u64,
    /// The tenant's processes holding memory on that device.
    pub pids: Vec<u32>,
}

/// Each tenant's real usage per device (bytes), for status.
pub fn usage_by_tenant(
    usage: &[ProcessMemory],
    tenants: &[AuditedTenant],
) -> BTreeMap<String, BTreeMap<u32, (u64, Vec<u32>)>> {
    let mut owner: BTreeMap<u32, &str> = BTreeMap::new();
    for tenant in tenants {
        for &pid in &tenant.pids {
            if let Ok(pid) = u32::try_from(pid) {
                owner.insert(pid, &tenant.name);
            }
        }
    }
    let mut totals: BTreeMap<String, BTreeMap<u32, (u64, Vec<u32>)>> = BTreeMap::new();
    for p in usage {
        if let Some(name) = owner.get(&p.pid) {
            let entry = totals
                .entry(name.to_string())
                .or_default()
                .entry(p.device)
                .or_default();
            entry.0 = entry.0.saturating_add(p.used_bytes);
            entry.1.push(p.pid);
        }
    }
    totals
}

/// The tenants whose processes hold more than `budget + slack` on a device.
pub fn find_overruns(
    usage: &[ProcessMemory],
    tenants: &[AuditedTenant],
    slack: u64,
) -> Vec<Overrun> {
    let totals = usage_by_tenant(usage, tenants);
    let mut overruns = Vec::new();
    for tenant in tenants {
        let Some(devices) = totals.get(&tenant.name) else {
            continue;
        };
        for (&device, (used, pids)) in devices {
            if let Some(budget) = tenant.budget_on(device)
                && *used > budget.saturating_add(slack)
            {
                overruns.push(Overrun {
                    tenant: tenant.name.clone(),
                    device,
                    used_bytes: *used,
                    budget_bytes: budget,
                    pids: pids.clone(),
                });
            }
        }
    }
    overruns
}

/// Acts on one overrun as configured.
pub fn act(overrun: &Overrun, action: AuditAction) {
    let Overrun {
        tenant,
        device,
        used_bytes,
        budget_bytes,
        pids,
    } = overrun;
    let used = dilu_abi::units::format_size(*used_bytes);
    let budget = dilu_abi::units::format_size(*budget_bytes);
    let signal = match action {
        AuditAction::Off => return,
        AuditAction::Log => None,
        AuditAction::Signal => Some(nix::sys::signal::Signal::SIGTERM),
        AuditAction::Kill => Some(nix::sys::signal::Signal::SIGKILL),
    };
    tracing::warn!(
        tenant,
        device,
        ?pids,
        action = ?action,
        "tenant holds {used} of device memory, over its budget of {budget} (its ledger under-counts, or a process bypasses the interposer)"
    );
    if let Some(signal) = signal {
        for &pid in pids {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            if let Err(e) = nix::sys::signal::kill(pid, signal) {
                tracing::warn!(tenant, %pid, "cannot signal: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    struct Fake(Vec<ProcessMemory>);

    impl UsageSource for Fake {
        fn process_memory(&mut self) -> Result<Vec<ProcessMemory>, String> {
            Ok(self.0.clone())
        }
    }

    fn tenant(name: &str, pids: &[i32], budget: Option<u64>) -> AuditedTenant {
        AuditedTenant {
            name: name.into(),
            pids: pids.to_vec(),
            placed: Vec::new(),
            elsewhere: budget,
        }
    }

    #[test]
    fn a_tenant_over_its_budget_is_found_and_others_are_not() {
        let mut source = Fake(vec![
            // "cheat" zeroed its ledger: two processes hold 96 MiB on a 64 MiB budget.
            ProcessMemory {
                pid: 10,
                device: 0,
                used_bytes: 48 * MIB,
            },
            ProcessMemory {
                pid: 11,
                device: 0,
                used_bytes: 48 * MIB,
            },
            // "honest" is within its budget plus slack.
            ProcessMemory {
                pid: 20,
                device: 0,
                used_bytes: 66 * MIB,
            },
            // "free" has no budget; 999 belongs to nobody the daemon knows.
            ProcessMemory {
                pid: 30,
                device: 1,
                used_bytes: 4096 * MIB,
            },
            ProcessMemory {
                pid: 999,
                device: 0,
                used_bytes: 4096 * MIB,
            },
        ]);
        let tenants = [
            tenant("cheat", &[10, 11], Some(64 * MIB)),
            tenant("honest", &[20], Some(64 * MIB)),
            tenant("free", &[30], None),
        ];
        let usage = source.process_memory().unwrap();
        let overruns = find_overruns(&usage, &tenants, 4 * MIB);
        assert_eq!(
            overruns,
            vec![Overrun {
                tenant: "cheat".into(),
                device: 0,
                used_bytes: 96 * MIB,
                budget_bytes: 64 * MIB,
                pids: vec![10, 11],
            }]
        );
    }

    #[test]
    fn actions_parse_and_unknown_ones_are_named() {
        assert_eq!(AuditAction::parse("kill"), Ok(AuditAction::Kill));
        let error = AuditAction::parse("nuke").unwrap_err();
        assert!(
            error.contains("nuke") && error.contains("signal"),
            "{error}"
        );
    }
}
