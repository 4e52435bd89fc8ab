//! Work-conserving co-location, this process's side of the gap board
//! ([`dilu_layout::colocation`]).
//!
//! Configuration (read once; a bad value stops the process with one line):
//! - `DILU_COLO`: `primary`, `filler` (offline) or `online-filler` (a filler
//!   with an SLO: it goes before offline fillers). Unset: no co-location.
//! - `DILU_COLO_GROUP`: the board shared by a primary and its fillers
//!   (default `gpu`): `/dev/shm/dilu-<uid>/colo-<group>.board`.
//! - primary: `DILU_COLO_TOLERANCE` (a duration, default 0): the delay of
//!   one filler kernel its requests can absorb, letting fillers into gaps
//!   no history predicts; `DILU_COLO_SLO` (a duration): when a reported
//!   request latency reaches 80% of it the tolerance is withdrawn before
//!   the next launch, and given back after 8 requests in a row under 50%;
//!   `DILU_COLO_HOLDOFF` (default 150us): idle time shorter than this is the
//!   program between dependent launches, not a gap (except after a request
//!   whose latency the program reported: that gap opens at once).
//! - filler: `DILU_COLO_GUARANTEE` (percent, default 10): the share a filler
//!   whose kernels fit no gap falls back to (paced in this process).
//!
//! Co-location acts on launches that go through SM-time control, so the
//! process needs a tenant (`DILU_TENANT`, `dilu run --tenant`).

use crate::sm_time::launch_control::sleep_until;
use dilu_abi::units;
use dilu_layout::bucket::{Admission, TokenBucket};
use dilu_layout::colocation::{DEFAULT_HOLDOFF_NS, DeviceBoard, FillerGate, GapBoard};
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::monotonic_ns;
use dilu_layout::shm::Region;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Filler { online: bool },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColoConfig {
    pub role: Role,
    pub group: String,
    pub tolerance_ns: u64,
    pub holdoff_ns: u64,
    pub slo_ns: Option<u64>,
    pub guarantee_ppm: u32,
}

const ROLE_FORMS: &str = "primary, filler or online-filler";
const GROUP_FORMS: &str = "1 to 64 characters from A-Z a-z 0-9 . _ -";

/// Reads the configuration through `env`; `Err((variable, value, forms))`.
pub fn from_env(
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<ColoConfig>, (String, String, String)> {
    let bad = |var: &str, value: &str, forms: &str| (var.into(), value.into(), forms.into());
    let Some(role) = env("DILU_COLO") else {
        return Ok(None);
    };
    let role = match role.as_str() {
        "primary" => Role::Primary,
        "filler" => Role::Filler { online: false },
        "online-filler" => Role::Filler { online: true },
        other => return Err(bad("DILU_COLO", other, ROLE_FORMS)),
    };
    let group = env("DILU_COLO_GROUP").unwrap_or_else(|| "gpu".into());
    if !(1..=64).contains(&group.len())
        || group.starts_with('.')
        || !group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(bad("DILU_COLO_GROUP", &group, GROUP_FORMS));
    }
    let duration = |var: &str| -> Result<Option<u64>, (String, String, String)> {
        env(var)
            .map(|v| units::parse_duration_ns(&v).map_err(|_| bad(var, &v, units::DURATION_FORMS)))
            .transpose()
    };
    let guarantee_ppm = match env("DILU_COLO_GUARANTEE") {
        None => 100_000,
        Some(v) => match v.trim_end_matches('%').parse::<f64>() {
            Ok(p) if p > 0.0 && p <= 100.0 => (p * 10_000.0).round() as u32,
            _ => {
                return Err(bad(
                    "DILU_COLO_GUARANTEE",
                    &v,
                    "a percentage above 0, up to 100",
                ));
            }
        },
    };
    Ok(Some(ColoConfig {
        role,
        group,
        tolerance_ns: duration("DILU_COLO_TOLERANCE")?.unwrap_or(0),
        holdoff_ns: duration("DILU_COLO_HOLDOFF")?.unwrap_or(DEFAULT_HOLDOFF_NS),
        slo_ns: duration("DILU_COLO_SLO")?,
        guarantee_ppm,
    }))
}

struct Colo {
    config: ColoConfig,
    board: Region<GapBoard>,
    /// Requests in a row with latency under half the SLO (primary).
    calm_requests: AtomicU32,
}

static STATE: OnceLock<Option<Colo>> = OnceLock::new();

/// This process's id, the filler's id on the board (read once, and again
/// in a forked child: `getpid` is a system call, not for every launch).
static MY_PID: AtomicU32 = AtomicU32::new(0);

fn refresh_pid() {
    MY_PID.store(std::process::id(), Ordering::Relaxed);
}

/// In a forked child (the SM-time part's fork handler): the child is a
/// filler of its own.
pub(crate) fn forget_parent_state_in_child() {
    refresh_pid();
}

/// Paces a filler that fits no gap at its guarantee (per process).
static FALLBACK: [TokenBucket; MAX_DEVICES] = [const { TokenBucket::new() }; MAX_DEVICES];
const FALLBACK_DEPTH_NS: u64 = 1_000_000;
/// Longest single sleep of a held filler: the board is looked at again.
const MAX_HOLD_NS: u64 = 2_000_000;
/// Calm requests before a withdrawn tolerance is given back.
const CALM_TO_RESTORE: u32 = 8;

#[inline]
fn get() -> Option<&'static Colo> {
    match STATE.get() {
        Some(state) => state.as_ref(),
        None => STATE.get_or_init(init).as_ref(),
    }
}

fn init() -> Option<Colo> {
    let config = match from_env(|name| std::env::var(name).ok()) {
        Ok(config) => config?,
        Err((var, value, forms)) => crate::config::fail(&var, &value.into(), &forms),
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let path = dilu_layout::colocation::board_path(uid, &config.group);
    let board = Region::<GapBoard>::open_or_create(&path, 0o600, |_| {}).unwrap_or_else(|e| {
        eprintln!(
            "dilu-interposer: cannot open the co-location board {} ({e}); stopping",
            path.display()
        );
        std::process::exit(2)
    });
    refresh_pid();
    if config.role == Role::Primary {
        for device in 0..MAX_DEVICES {
            board.device(device).attach_primary(
                std::process::id(),
                config.tolerance_ns,
                config.holdoff_ns,
            );
        }
    }
    tracing::debug!(role = ?config.role, group = %config.group, "co-location active");
    Some(Colo {
        config,
        board,
        calm_requests: AtomicU32::new(0),
    })
}

/// Whether this process takes part in co-location (every launch then
/// goes through [`before_launch`]).
#[inline]
pub fn active() -> bool {
    get().is_some()
}

/// Before a launch of `est_ns` on `device` (after the token bucket let it
/// go): the primary publishes it; a filler waits for a gap it fits.
/// Returns the time spent waiting.
#[inline]
pub fn before_launch(device: usize, est_ns: u64) -> u64 {
    let Some(colo) = get() else { return 0 };
    let board = colo.board.device(device);
    match colo.config.role {
        Role::Primary => {
            board.primary_launch(monotonic_ns(), est_ns);
            0
        }
        Role::Filler { online } => {
            let now = monotonic_ns();
            match board.filler_admit(now, est_ns, online, MY_PID.load(Ordering::Relaxed)) {
                FillerGate::Go => 0,
                gate => hold(colo, board, device, est_ns, online, now, gate),
            }
        }
    }
}

/// Before a filler sleeps for SM-time tokens on `device`: it gives up its
/// turn at the gaps, so the other fillers need not wait for it.
#[cold]
pub fn before_token_wait(device: usize) {
    let Some(colo) = get() else { return };
    if matches!(colo.config.role, Role::Filler { .. }) {
        colo.board
            .device(device)
            .end_turn_of(MY_PID.load(Ordering::Relaxed));
    }
}

#[cold]
fn hold(
    colo: &Colo,
    board: &DeviceBoard,
    device: usize,
    est_ns: u64,
    online: bool,
    began: u64,
    mut gate: FillerGate,
) -> u64 {
    let held = matches!(gate, FillerGate::WaitUntil(_));
    let mut checked_primary = began;
    let me = MY_PID.load(Ordering::Relaxed);
    if held {
        board.record_held();
        if online {
            board.online_waiting(true);
        }
    }
    loop {
        match gate {
            FillerGate::Go => break,
            FillerGate::Fallback => {
                let now = monotonic_ns();
                if let Admission::At(deadline) = FALLBACK[device].admit(
                    now,
                    est_ns,
                    colo.config.guarantee_ppm,
                    FALLBACK_DEPTH_NS,
                ) {
                    sleep_until(deadline);
                }
                break;
            }
            FillerGate::WaitUntil(at) => {
                let now = monotonic_ns();
                if at > now {
                    sleep_until(at.min(now + MAX_HOLD_NS));
                }
                let now = monotonic_ns();
                if now >= checked_primary + PRIMARY_CHECK_NS {
                    checked_primary = now;
                    forget_a_gone_primary(board);
                }
                gate = board.filler_admit(now, est_ns, online, me);
            }
        }
    }
    if held && online {
        board.online_waiting(false);
    }
    monotonic_ns() - began
}

/// How often a held filler checks that the primary it waits for still
/// exists (a primary killed inside a synchronisation would hold it forever).
const PRIMARY_CHECK_NS: u64 = 50_000_000;

#[cold]
fn forget_a_gone_primary(board: &DeviceBoard) {
    let Some(pid) = board.primary_pid() else {
        return;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let gone = unsafe { libc::kill(pid as libc::pid_t, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    if gone {
        tracing::debug!(pid, "co-location: the primary is gone");
        board.detach_primary(pid);
    }
}

/// Around a synchronisation of the primary: its work is in flight until the
/// call returns.
#[inline]
pub fn sync_begin() {
    if let Some(colo) = get()
        && colo.config.role == Role::Primary
    {
        colo.board.device(current_device()).primary_sync_begin();
    }
}

#[inline]
pub fn sync_end() {
    if let Some(colo) = get()
        && colo.config.role == Role::Primary
    {
        colo.board
            .device(current_device())
            .primary_sync_end(monotonic_ns());
    }
}

fn current_device() -> usize {
    crate::sm_time::tenant_sm::get().map_or(0, |sm| sm.current_device())
}

/// A request latency the primary reported: the request is over (its gap
/// opens to fillers at once); withdraw its tolerance at once when it has
/// no slack left, give it back after calm requests.
pub fn latency_reported(latency_ns: u64) {
    let Some(colo) = get() else { return };
    if colo.config.role != Role::Primary {
        return;
    }
    colo.board.device(current_device()).primary_request_over();
    let Some(slo) = colo.config.slo_ns else {
        return;
    };
    let tolerance = if latency_ns * 5 >= slo * 4 {
        colo.calm_requests.store(0, Ordering::Relaxed);
        Some(0)
    } else if latency_ns * 2 < slo {
        let calm = colo.calm_requests.fetch_add(1, Ordering::Relaxed) + 1;
        (calm >= CALM_TO_RESTORE).then_some(colo.config.tolerance_ns)
    } else {
        None
    };
    if let Some(tolerance) = tolerance {
        for device in 0..MAX_DEVICES {
            colo.board.device(device).set_tolerance(tolerance);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_env;

    #[test]
    fn configuration_forms() {
        assert_eq!(from_env(test_env(&[])), Ok(None));
        let c = from_env(test_env(&[
            ("DILU_COLO", "primary"),
            ("DILU_COLO_TOLERANCE", "2ms"),
            ("DILU_COLO_SLO", "10ms"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.role, Role::Primary);
        assert_eq!((c.tolerance_ns, c.slo_ns), (2_000_000, Some(10_000_000)));
        assert_eq!(c.group, "gpu");
        let f = from_env(test_env(&[
            ("DILU_COLO", "online-filler"),
            ("DILU_COLO_GUARANTEE", "25%"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(f.role, Role::Filler { online: true });
        assert_eq!(f.guarantee_ppm, 250_000);
        let e = from_env(test_env(&[("DILU_COLO", "boss")])).unwrap_err();
        assert_eq!(e.0, "DILU_COLO");
        assert!(e.2.contains("online-filler"));
        assert!(
            from_env(test_env(&[
                ("DILU_COLO", "filler"),
                ("DILU_COLO_GROUP", "../x")
            ]))
            .is_err()
        );
    }
}
