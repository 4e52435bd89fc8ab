//! The node seen GPU by GPU, for operators (`dilu status`/`top`,
//! `/metrics`, `/api/gpus`): each GPU's tenants, its busy time, the share
//! its tenants' requests reserve, and its co-location primary.
//!
//! Derived from a [`NodeStatus`] snapshot. A tenant's GPU is the one the
//! node manager placed it on, or for one it did not place (its user chose
//! the device, e.g. with `CUDA_VISIBLE_DEVICES`) the one its processes
//! launch on; on a node with one GPU (or none NVML shows) every tenant is
//! on it. Tenants on no known GPU yet are shown apart: their shares are
//! controlled together, as one GPU's.

use dilu_abi::node_wire::{NodeStatus, TenantStatus};
use serde::Serialize;
use std::borrow::Cow;

/// One GPU of the node (or the node's unplaced tenants).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuView {
    /// NVML index; `None`: the tenants not placed on a GPU.
    pub gpu: Option<u32>,
    pub name: String,
    /// NVML utilisation (0–1), when NVML is present.
    pub utilization: Option<f64>,
    pub tenants: Vec<String>,
    /// Device time its tenants used over the last second (percent, summed).
    pub achieved_pct: f64,
    /// Its tenants' SM requests, summed (percent of the GPU).
    pub reserved_pct: f64,
    /// Tenants whose launches wait at share 0.
    pub waiting: usize,
    /// The tenant whose gaps fillers use (work-conserving co-location).
    pub colo_primary: Option<String>,
}

/// The GPU label of a tenant: its GPU, or the node's only GPU.
pub fn gpu_of(status: &NodeStatus, tenant: &TenantStatus) -> Option<u32> {
    tenant
        .gpu
        .or_else(|| (status.gpus.len() == 1).then(|| status.gpus[0].index))
}

/// `tenant` as seen on `gpu`: itself on its first GPU, with the share,
/// use and memory of that GPU on another of its GPUs (`dilu run --gpus
/// N`), `None` where it does not run.
pub fn on_gpu<'a>(
    status: &NodeStatus,
    tenant: &'a TenantStatus,
    gpu: Option<u32>,
) -> Option<Cow<'a, TenantStatus>> {
    if gpu_of(status, tenant) == gpu {
        return Some(Cow::Borrowed(tenant));
    }
    let more = tenant.more_gpus.iter().find(|m| Some(m.gpu) == gpu)?;
    let mut seen = tenant.clone();
    seen.sm_current_pct = more.sm_current_pct;
    seen.sm_achieved_pct = more.sm_achieved_pct;
    seen.mem_used_bytes = more.mem_used_bytes;
    seen.mem_budget_bytes = more.mem_budget_bytes;
    seen.mem_audited_bytes = more.mem_audited_bytes;
    Some(Cow::Owned(seen))
}

/// Each GPU of the node in index order (idle ones too), then the unplaced
/// tenants if any. The tenants of each keep the status's order.
pub fn by_gpu(status: &NodeStatus) -> Vec<GpuView> {
    let mut views: Vec<GpuView> = status
        .gpus
        .iter()
        .map(|g| GpuView {
            gpu: Some(g.index),
            name: g.name.clone(),
            utilization: g.utilization,
            tenants: Vec::new(),
            achieved_pct: 0.0,
            reserved_pct: 0.0,
            waiting: 0,
            colo_primary: None,
        })
        .collect();
    let places = status.tenants.iter().flat_map(|t| {
        let more = t.more_gpus.iter().map(|m| (Some(m.gpu), m.sm_achieved_pct));
        std::iter::once((gpu_of(status, t), t.sm_achieved_pct))
            .chain(more)
            .map(move |(gpu, achieved)| (t, gpu, achieved))
    });
    for (t, gpu, achieved) in places {
        let at = match views.iter().position(|v| v.gpu == gpu) {
            Some(at) => at,
            None => {
                views.push(GpuView {
                    gpu,
                    name: if gpu.is_some() {
                        "(not listed by NVML)".into()
                    } else {
                        "not placed by the node manager".into()
                    },
                    utilization: None,
                    tenants: Vec::new(),
                    achieved_pct: 0.0,
                    reserved_pct: 0.0,
                    waiting: 0,
                    colo_primary: None,
                });
                views.len() - 1
            }
        };
        let view = &mut views[at];
        view.tenants.push(t.name.clone());
        view.achieved_pct += achieved;
        view.reserved_pct += t.spec.sm_request.as_percent();
        view.waiting += usize::from(t.waiting);
    }
    // A board's slot is the node GPU of a primary the node manager placed
    // (its interposer maps devices to the GPUs `dilu run` listed), else the
    // primary's own device ordinal; its GPU is then the primary tenant's.
    for c in &status.colocation {
        let Some(primary) = status.tenants.iter().find(|t| t.name == c.primary_tenant) else {
            continue;
        };
        let on =
            |gpu: u32| primary.gpu == Some(gpu) || primary.more_gpus.iter().any(|m| m.gpu == gpu);
        let gpu = match primary.gpu {
            Some(_) if on(c.device) => Some(c.device),
            Some(gpu) => Some(gpu),
            None if status.gpus.len() <= 1 => gpu_of(status, primary),
            None => None,
        };
        if let Some(view) = views.iter_mut().find(|v| v.gpu == gpu) {
            view.colo_primary = Some(c.primary_tenant.clone());
        }
    }
    views.sort_by_key(|v| (v.gpu.is_none(), v.gpu));
    views
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::SmShare;
    use dilu_abi::node_wire::{GpuStatus, TenantSpec};

    fn gpu(index: u32) -> GpuStatus {
        GpuStatus {
            index,
            uuid: format!("GPU-{index}"),
            name: "Sim".into(),
            utilization: Some(0.5),
            memory_used_bytes: None,
            memory_total_bytes: None,
        }
    }

    fn tenant(name: &str, gpu: Option<u32>, request: f64) -> TenantStatus {
        TenantStatus {
            name: name.into(),
            uid: 0,
            spec: TenantSpec {
                sm_request: SmShare::percent(request),
                ..TenantSpec::default()
            },
            pids: vec![1],
            mem_used_bytes: 0,
            mem_budget_bytes: None,
            mem_audited_bytes: None,
            sm_current_pct: 0.0,
            sm_achieved_pct: 10.0,
            busy_seconds_total: 0.0,
            launches_total: 0,
            throttled_seconds_total: 0.0,
            p99_ms: None,
            latency_reports_total: 0,
            latency_seconds_total: 0.0,
            bubble_ratio: 0.0,
            gpu,
            more_gpus: Vec::new(),
            waiting: false,
            over_admitted: None,
            granted: false,
        }
    }

    #[test]
    fn tenants_are_grouped_by_their_gpu_and_unplaced_ones_apart() {
        let status = NodeStatus {
            controller: "dilu".into(),
            period_ms: 5.0,
            uptime_seconds: 1.0,
            gpus: vec![gpu(0), gpu(1), gpu(2)],
            tenants: vec![
                tenant("a", Some(1), 30.0),
                tenant("b", Some(1), 20.0),
                tenant("c", Some(0), 60.0),
                tenant("free", None, 5.0),
            ],
            signals: Vec::new(),
            control_periods: 0,
            control_work_seconds_total: 0.0,
            control_work_max_ms: 0.0,
            colocation: Vec::new(),
        };
        let views = by_gpu(&status);
        let shown: Vec<_> = views
            .iter()
            .map(|v| (v.gpu, v.tenants.clone(), v.reserved_pct))
            .collect();
        assert_eq!(
            shown,
            vec![
                (Some(0), vec!["c".to_string()], 60.0),
                (Some(1), vec!["a".into(), "b".into()], 50.0),
                (Some(2), vec![], 0.0),
                (None, vec!["free".into()], 5.0),
            ]
        );
        // One GPU: every tenant is on it.
        let one = NodeStatus {
            gpus: vec![gpu(0)],
            tenants: vec![tenant("free", None, 5.0)],
            ..status
        };
        assert_eq!(by_gpu(&one).len(), 1);
        assert_eq!(by_gpu(&one)[0].tenants, vec!["free".to_string()]);
    }

    #[test]
    fn a_tenant_on_two_gpus_is_shown_under_each_with_its_share_there() {
        let mut wide = tenant("wide", Some(0), 30.0);
        wide.more_gpus = vec![dilu_abi::node_wire::GpuShare {
            gpu: 2,
            sm_current_pct: 45.0,
            sm_achieved_pct: 40.0,
            ..Default::default()
        }];
        let status = NodeStatus {
            controller: "dilu".into(),
            period_ms: 5.0,
            uptime_seconds: 1.0,
            gpus: vec![gpu(0), gpu(1), gpu(2)],
            tenants: vec![wide, tenant("b", Some(2), 20.0)],
            signals: Vec::new(),
            control_periods: 0,
            control_work_seconds_total: 0.0,
            control_work_max_ms: 0.0,
            colocation: Vec::new(),
        };
        let shown: Vec<_> = by_gpu(&status)
            .iter()
            .map(|v| (v.gpu, v.tenants.clone(), v.reserved_pct, v.achieved_pct))
            .collect();
        assert_eq!(
            shown,
            vec![
                (Some(0), vec!["wide".to_string()], 30.0, 10.0),
                (Some(1), vec![], 0.0, 0.0),
                (Some(2), vec!["wide".into(), "b".into()], 50.0, 50.0),
            ]
        );
        let wide = &status.tenants[0];
        assert_eq!(on_gpu(&status, wide, Some(2)).unwrap().sm_current_pct, 45.0);
        assert_eq!(
            on_gpu(&status, wide, Some(0)).unwrap().sm_achieved_pct,
            10.0
        );
        assert!(on_gpu(&status, wide, Some(1)).is_none());
    }
}
