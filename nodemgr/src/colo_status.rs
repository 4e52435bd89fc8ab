//! Co-location telemetry for `dilu status` and `/metrics`: the gap boards
//! ([`dilu_layout::colocation`]) of the users who have tenants here.
//!
//! Boards live at `/dev/shm/dilu-<uid>/colo-<group>.board`, written by the
//! tenants' interposers. The daemon reads each as a private copy of a file
//! owned by that uid (never mapped: a tenant could truncate a mapping under
//! it) and only when asked for status, outside the registry lock. A board
//! is shown per device its primary used, and only while that primary is a
//! process of one of this daemon's tenants: boards of finished runs and of
//! other users' processes are not this node manager's to report.

use dilu_abi::node_wire::{ColoStatus, TenantStatus};
use dilu_colocation::delay_budget;
use dilu_layout::colocation::{BoardSnapshot, GapBoard};
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::shm::Region;
use std::collections::BTreeSet;
use std::path::Path;

/// The co-location of every board whose primary is one of `tenants`'
/// processes, ordered by group and device.
pub fn collect(tenants: &[TenantStatus]) -> Vec<ColoStatus> {
    let uids: BTreeSet<u32> = tenants.iter().map(|t| t.uid).collect();
    let mut found = Vec::new();
    for uid in uids {
        let dir = dilu_layout::user_region_dir(uid);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(group) = board_group(&name.to_string_lossy()) else {
                continue;
            };
            found.extend(read_board(&entry.path(), uid, &group, tenants));
        }
    }
    found.sort_by(|a, b| (&a.group, a.device).cmp(&(&b.group, b.device)));
    found
}

/// `colo-<group>.board` → `group`.
fn board_group(file_name: &str) -> Option<String> {
    let group = file_name.strip_prefix("colo-")?.strip_suffix(".board")?;
    (!group.is_empty()).then(|| group.to_string())
}

fn read_board(path: &Path, uid: u32, group: &str, tenants: &[TenantStatus]) -> Vec<ColoStatus> {
    let board = match Region::<GapBoard>::copy_of_file(path, uid) {
        Ok(board) => board,
        Err(e) => {
            tracing::debug!("co-location board {}: {e}", path.display());
            return Vec::new();
        }
    };
    (0..MAX_DEVICES)
        .filter_map(|device| {
            let snapshot = board.device(device).snapshot();
            let primary = tenants.iter().find(|t| {
                t.uid == uid
                    && snapshot.primary_pid != 0
                    && t.pids.contains(&(snapshot.primary_pid as i32))
            })?;
            let used = snapshot.primary_busy_ns > 0 || snapshot.filled_ns > 0;
            (snapshot.primary_present && used)
                .then(|| status(group, device as u32, &primary.name, &snapshot))
        })
        .collect()
}

fn status(group: &str, device: u32, primary: &str, s: &BoardSnapshot) -> ColoStatus {
    let seconds = |ns: u64| ns as f64 / 1e9;
    let budget = delay_budget(s.delay_credit_ppm);
    ColoStatus {
        group: group.to_string(),
        device,
        primary_tenant: primary.to_string(),
        primary_pid: s.primary_pid as i32,
        gaps_seen: s.gaps_seen,
        gap_seconds_total: seconds(s.gap_ns),
        filled_seconds_total: seconds(s.filled_ns),
        primary_busy_seconds_total: seconds(s.primary_busy_ns),
        primary_delay_seconds_total: seconds(s.primary_delay_ns),
        primary_slowdown: s.primary_slowdown(),
        predicted_gap_ms: s.predicted_gap_ns as f64 / 1e6,
        gap_period: s.gap_period,
        filler_launches_held: s.filler_held,
        filler_fallbacks: s.fallbacks,
        kept_as_if_alone: s.as_if_alone,
        tolerance_ms: s.tolerance_ns as f64 / 1e6,
        requests_judged_total: s.judged,
        requests_pushed_over_total: s.pushed_over,
        delay_budget_requests: budget.requests_left,
        risky_filling_paused: s.as_if_alone && budget.ration_stopped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_board_files_name_a_group() {
        assert_eq!(board_group("colo-gpu.board").as_deref(), Some("gpu"));
        assert_eq!(board_group("colo-.board"), None);
        assert_eq!(board_group("infer.sm"), None);
        assert_eq!(board_group("colo-gpu.board.tmp"), None);
    }
}
