//! What every control law sees and answers: one [`Observation`] per tenant
//! and period in, one share per tenant out ([`Controller`]), and the
//! water-filling of batch shares the laws have in common.

use dilu_abi::node_wire::WorkClass;

/// Window over which the controller judges latency.
pub const CONTROL_WINDOW_NS: u64 = 200_000_000;
/// Parts per million of the device: all of it.
pub const FULL: u32 = 1_000_000;
/// A tenant that launched this recently still wants the device (a deep
/// queue of 1 ms kernels synchronises for 32 ms between bursts of launches).
pub const RECENT_NS: u64 = 50_000_000;
/// A sync counts as work only this long after the tenant's last launch. A
/// process killed inside a sync leaves its tenant's count of syncing
/// threads high while the tenant's other processes live on; past this
/// bound that claim is ignored. A live tenant whose sync outlasts it waits
/// at most one control period on its next launch: nothing, beside a sync
/// this long.
pub const SYNC_TRUSTED_NS: u64 = 10_000_000_000;

/// What one tenant did during the last period, and what it is allowed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub class: WorkClass,
    /// Latency target (latency tenants).
    pub slo_ns: Option<u64>,
    pub request_ppm: u32,
    pub limit_ppm: u32,
    /// The share in force during the period.
    pub share_ppm: u32,
    /// Length of the period (wall-clock ns).
    pub period_ns: u64,
    /// GPU time charged in the period.
    pub busy_ns: u64,
    pub launches: u64,
    /// Wall time launches spent waiting for tokens in the period.
    pub throttled_ns: u64,
    /// Time since the tenant last launched anything (0 if it did in this
    /// period; `u64::MAX` if never).
    pub idle_ns: u64,
    /// Time since the tenant was last seen inside a synchronising call,
    /// waiting on work it queued (0 if it is in one now; `u64::MAX` if
    /// never): at work though it launches nothing (a training step's sync
    /// can take longer than [`RECENT_NS`]).
    pub sync_idle_ns: u64,
    /// Latency over a recent window (reported request latency, else the
    /// sync-to-sync proxy).
    pub latency: Latency,
    /// A co-location primary (protected per launch by its GPU's gap board).
    pub colo_primary: bool,
}

/// Recent latency of a tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Latency {
    /// p99 over the recent window, when there were samples.
    pub p99_ns: Option<u64>,
    /// Mean of the samples that completed in this period (None: none did).
    pub period_mean_ns: Option<u64>,
}

impl Observation {
    /// Fraction of the period the tenant kept the device busy.
    pub fn utilisation(&self) -> f64 {
        self.busy_ns as f64 / self.period_ns.max(1) as f64
    }

    /// Whether the tenant wants more than it has: it waited for tokens, or
    /// used nearly all of its share.
    pub fn saturated(&self) -> bool {
        self.throttled_ns > 0 || self.utilisation() * FULL as f64 >= 0.9 * self.share_ppm as f64
    }

    /// Whether the tenant was at work within the last `ns`: it launched,
    /// or was inside a synchronising call (waiting on its own queue) with a
    /// launch within [`SYNC_TRUSTED_NS`]. A tenant stuck in a sync for
    /// another reason counts as at work too, for that long at most.
    pub fn at_work_within(&self, ns: u64) -> bool {
        self.idle_ns < ns || (self.sync_idle_ns < ns && self.idle_ns < SYNC_TRUSTED_NS)
    }

    /// Whether the tenant wants the device now: it launched or synchronised
    /// within [`RECENT_NS`] (a program waiting on its queue between launches
    /// is still at work, and launches again when the sync returns: at share
    /// 0 it would wait for the next period), or its launches waited for
    /// tokens (a tenant held at share 0 launches nothing, and waiting is the
    /// only demand it can show).
    pub fn wants_device(&self) -> bool {
        self.launches > 0 || self.at_work_within(RECENT_NS) || self.throttled_ns > 0
    }

    /// Whether the tenant is in the middle of its work this period: it
    /// launched, or is inside a synchronising call now.
    pub fn in_request(&self) -> bool {
        self.launches > 0 || self.sync_idle_ns == 0
    }

    /// Recent p99 as a fraction of the SLO (0 when unknown).
    pub fn slo_pressure(&self) -> f64 {
        match (self.latency.p99_ns, self.slo_ns) {
            (Some(p99), Some(slo)) if slo > 0 => p99 as f64 / slo as f64,
            _ => 0.0,
        }
    }
}

/// A control law. `step` is called once per period with one observation
/// per tenant (same order every time while the tenant set is unchanged;
/// `reset` is called when it changes) and returns one share per tenant.
pub trait Controller: Send {
    fn name(&self) -> &'static str;
    fn step(&mut self, now_ns: u64, tenants: &[Observation]) -> Vec<u32>;
    /// The tenant set changed: forget per-tenant state.
    fn reset(&mut self) {}
    /// Whether, under this law, a batch tenant beside a latency tenant with
    /// an SLO keeps a short queue (`crate::queue_bounds`) and the control
    /// loop runs a period at such a tenant's first launch
    /// (`crate::wake_watch`): dilu's laws, not the baselines.
    fn guards_between_periods(&self) -> bool {
        false
    }
}

/// Splits `available` ppm among batch tenants (indices) by water-filling:
/// each keeps at least its request, and tenants with demand share what is
/// left equally up to their limits. The requests of tenants without demand
/// are lent too: a tenant without a request (best effort) gets the device's
/// idle time, and a guaranteed tenant that wakes up has its request back in
/// the next period (it keeps its request as its cap meanwhile, so its first
/// launches go at once).
pub fn share_out_batch(tenants: &[Observation], batch: &[usize], available: u32, out: &mut [u32]) {
    share_out_batch_above(tenants, batch, available, out, |i| tenants[i].request_ppm);
}

/// [`share_out_batch`] with tenant `i`'s floor `floor(i)` in place of its
/// request (a law that may hold a tenant below its request in a period,
/// having given it its request over a longer time).
pub fn share_out_batch_above(
    tenants: &[Observation],
    batch: &[usize],
    available: u32,
    out: &mut [u32],
    floor: impl Fn(usize) -> u32,
) {
    let mut left = available as i64;
    let mut hungry = Vec::with_capacity(batch.len());
    for &i in batch {
        out[i] = floor(i);
        if tenants[i].wants_device() {
            left -= out[i] as i64;
            hungry.push(i);
        }
    }
    while left > 0 && !hungry.is_empty() {
        let each = (left / hungry.len() as i64).max(1);
        let mut next = Vec::new();
        for &i in &hungry {
            let room = tenants[i].limit_ppm.saturating_sub(out[i]) as i64;
            let give = room.min(each).min(left);
            out[i] += give as u32;
            left -= give;
            if (out[i] as i64) < tenants[i].limit_ppm as i64 {
                next.push(i);
            }
        }
        if next.len() == hungry.len() && each == 1 {
            break;
        }
        hungry = next;
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A tenant observation with sensible defaults for tests.
    pub fn tenant(class: WorkClass, request_pct: u32, limit_pct: u32) -> Observation {
        Observation {
            class,
            slo_ns: (class == WorkClass::Latency).then_some(50_000_000),
            request_ppm: request_pct * 10_000,
            limit_ppm: limit_pct * 10_000,
            share_ppm: request_pct * 10_000,
            period_ns: 5_000_000,
            busy_ns: 0,
            launches: 0,
            throttled_ns: 0,
            idle_ns: u64::MAX,
            sync_idle_ns: u64::MAX,
            latency: Latency::default(),
            colo_primary: false,
        }
    }

    /// The tenant was busy `pct` percent of the period.
    pub fn busy(mut o: Observation, pct: u64) -> Observation {
        o.busy_ns = o.period_ns * pct / 100;
        o.launches = 10;
        o.idle_ns = 0;
        o
    }

    pub fn with_latency(mut o: Observation, p99_ms: u64, mean_ms: u64) -> Observation {
        o.latency = Latency {
            p99_ns: Some(p99_ms * 1_000_000),
            period_mean_ns: Some(mean_ms * 1_000_000),
        };
        o
    }
}
