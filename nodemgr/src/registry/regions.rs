//! A tenant's two shared-memory regions as the daemon makes and writes
//! them: the sealed budget region (SM share and memory budget per device,
//! only the daemon writes it) and the activity region its processes write.

use crate::error::{self, Error};
use dilu_abi::units::Bytes;
use dilu_layout::activity::TenantActivity;
use dilu_layout::budget::{self, DEFAULT_DEPTH_NS, FULL_SHARE_PPM, TenantBudget, UNLIMITED_SHARE};
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::memfd;
use dilu_layout::shm::Region;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::Arc;

pub struct Regions {
    pub budget: Region<TenantBudget>,
    /// Read-only descriptor handed to members (shared so a reply can carry
    /// it after the registry lock is released).
    pub budget_ro: Arc<OwnedFd>,
    /// Tenants write it; its size is sealed so none can shrink it under the
    /// daemon's mapping.
    pub activity: Region<TenantActivity>,
    pub activity_fd: Arc<OwnedFd>,
    /// The activity region was handed back by a re-attaching process (adopted).
    pub adopted: bool,
}

/// Writes one share to every device of a budget.
pub fn write_share(budget: &TenantBudget, share_ppm: u32) {
    let value = if share_ppm >= FULL_SHARE_PPM {
        UNLIMITED_SHARE
    } else {
        share_ppm
    };
    for device in 0..MAX_DEVICES {
        if budget.share_ppm(device) != value {
            budget.set_share_ppm(device, value);
        }
    }
}

/// Writes a tenant's shares device by device: (ordinal, share) for each
/// of its devices, the first listed also to every device not listed (a
/// tenant not placed by the daemon may start using one any time: it is
/// held to that share until the daemon counts the device).
pub fn write_shares(budget: &TenantBudget, shares: impl IntoIterator<Item = (usize, u32)>) {
    for (device, share) in per_device(shares, 0).into_iter().enumerate() {
        let value = if share >= FULL_SHARE_PPM {
            UNLIMITED_SHARE
        } else {
            share
        };
        if budget.share_ppm(device) != value {
            budget.set_share_ppm(device, value);
        }
    }
}

/// Writes a tenant's queue bounds device by device, as [`write_shares`]
/// writes shares.
pub fn write_queue_bounds(budget: &TenantBudget, bounds: impl IntoIterator<Item = (usize, u64)>) {
    for (device, bound) in per_device(bounds, 0).into_iter().enumerate() {
        budget.set_queue_bound_ns(device, bound);
    }
}

/// One value per device slot: each listed (ordinal, value) in its slot,
/// the first listed (else `none`) in every other.
fn per_device<T: Copy>(listed: impl IntoIterator<Item = (usize, T)>, none: T) -> [T; MAX_DEVICES] {
    let mut listed = listed.into_iter().peekable();
    let first = listed.peek().map_or(none, |&(_, value)| value);
    let mut all = [first; MAX_DEVICES];
    for (ordinal, value) in listed {
        if let Some(slot) = all.get_mut(ordinal) {
            *slot = value;
        }
    }
    all
}

/// Makes a tenant's regions. `handed_back` is an activity-region descriptor a
/// re-attaching process gave back: adopted only if it is a memfd region whose
/// size is (or can now be) sealed, checked without waiting; otherwise the
/// tenant starts with a fresh one. Runs outside the registry lock. A
/// failure is the machine's ([`Error::System`]: out of memory, or of file
/// descriptors).
pub fn create_regions(name: &str, handed_back: Option<OwnedFd>) -> error::Result<Regions> {
    fresh_regions(name, handed_back).map_err(Error::System)
}

fn fresh_regions(name: &str, handed_back: Option<OwnedFd>) -> Result<Regions, String> {
    let label = CString::new(format!("dilu-budget-{name}")).map_err(|e| e.to_string())?;
    let (budget, budget_fd) = memfd::create::<TenantBudget>(&label, |b| {
        b.set_depth_ns(DEFAULT_DEPTH_NS);
        write_share(b, 0);
        b.set_mem_budget_all(Some(0));
    })
    .map_err(|e| format!("cannot create the budget region: {e}"))?;
    memfd::seal_read_only(&budget_fd).map_err(|e| format!("cannot seal the budget region: {e}"))?;
    let budget_ro = memfd::reopen_read_only(&budget_fd)
        .map_err(|e| format!("cannot reopen the budget region: {e}"))?;
    let adopted = handed_back.and_then(|fd| match memfd::adopt::<TenantActivity>(&fd, true) {
        Ok(region) => Some((region, fd)),
        Err(e) => {
            tracing::warn!(
                tenant = name,
                "not adopting the activity region handed back: {e}"
            );
            None
        }
    });
    let (activity, activity_fd, adopted) = match adopted {
        Some((region, fd)) => (region, fd, true),
        None => {
            let label = CString::new(format!("dilu-tel-{name}")).map_err(|e| e.to_string())?;
            let (region, fd) = memfd::create::<TenantActivity>(&label, |_| {})
                .map_err(|e| format!("cannot create the activity region: {e}"))?;
            memfd::seal_size(&fd).map_err(|e| format!("cannot seal the activity region: {e}"))?;
            (region, fd, false)
        }
    };
    Ok(Regions {
        budget,
        budget_ro: Arc::new(budget_ro),
        activity,
        activity_fd: Arc::new(activity_fd),
        adopted,
    })
}

/// Sets a fresh budget region to a tenant's share and memory budget
/// (memory writes only: runs under the registry lock).
pub(super) fn configure(regions: &Regions, share_ppm: u32, mem: Option<Bytes>) {
    write_share(&regions.budget, share_ppm);
    regions.budget.set_mem_budget_all(mem.map(Bytes::get));
}

/// A share as the interposer reads it (for tests and tools).
pub fn effective_share(budget: &TenantBudget) -> u32 {
    let v = budget.share_ppm(0);
    if budget::is_limited(v) {
        v
    } else {
        FULL_SHARE_PPM
    }
}
