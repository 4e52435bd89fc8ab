//! Work-conserving co-location, this process's side of the gap board
//! ([`dilu_layout::colocation`], acted on through [`dilu_colocation`]).
//!
//! Configuration (read once; a bad value stops the process with one line):
//! - `DILU_COLO`: `primary`, `filler` (offline) or `online-filler` (a filler
//!   with an SLO: it goes before offline fillers). Unset: no co-location.
//! - `DILU_COLO_GROUP`: the board shared by a primary and its fillers
//!   (default `gpu`): `/dev/shm/dilu-<uid>/colo-<group>.board`. The
//!   board has a slot per GPU of the node: where the program sees GPUs the
//!   node manager placed it on (`CUDA_VISIBLE_DEVICES=3,5` under
//!   `CUDA_DEVICE_ORDER=PCI_BUS_ID`, as `dilu run` sets), its device `k`
//!   uses the slot of the `k`-th GPU listed, so tenants of one user and
//!   group on different GPUs (each seeing its GPU as device 0) keep to
//!   their own GPU's slot; otherwise device `k` uses slot `k`.
//! - primary: `DILU_COLO_TOLERANCE` (a duration; default half its SLO;
//!   without one, learned from its reported requests without fillers'
//!   delay and the fillers' share of the device, see [`learned_tolerance`]):
//!   the delay of one filler kernel its requests can absorb, letting
//!   fillers into gaps no history predicts. A primary without an SLO or a
//!   set tolerance is kept as if alone ([`Board::keep_as_if_alone`](dilu_colocation::Board));
//!   its SLO
//!   (`slo_ms` of `DILU_SPEC`, `dilu run --slo-ms`): the tolerance in
//!   force is at most the slack (SLO minus latency, less the hand-offs)
//!   of the worst of the last 8 reported requests, their latency taken
//!   without the delay fillers caused, so it shrinks before the next
//!   launch when a request nears the SLO on its own and comes back as
//!   such requests age out;
//!   `DILU_COLO_HOLDOFF` (default 150us): idle time shorter than this is the
//!   program between dependent launches, not a gap (except after a request
//!   whose latency the program reported: that gap opens at once, unless the
//!   request had waited behind the one before it).
//! - filler: `DILU_COLO_GUARANTEE` (percent; default its SM request,
//!   `sm_request` of `DILU_SPEC`, or 10 where that is unset or 0): the share a
//!   filler keeps whatever the gaps look like: while it has had less, it
//!   goes before the other fillers' turns, and where its kernels fit no
//!   gap, or the primary's gaps are random and too short to tolerate, they
//!   still go into gaps at that pace. Beside a primary kept as if alone
//!   only a guarantee that was set (the variable or an SM request) holds.
//!
//! A filler's sampled launch of a kind longer than a time slice holds the
//! primary's launches until it was timed ([`hold_primary_for_sample`]):
//! otherwise the sample holds the primary's slice, and the guarantee,
//! counted in those estimates, comes to about half. The primary honours
//! such holds for at most [`HONOURED_SAMPLE_HOLD_PPM`] of its time.
//!
//! Co-location acts on launches that go through SM-time control, which a
//! process with a role always has (with no tenant and no SM limit, an
//! unlimited share of its own, see [`crate::sm_time::tenant_sm`]).

use crate::sm_time::colocation_config::{ColoConfig, Role, from_env};
use crate::sm_time::honoured_holds::HonouredHolds;
use crate::sm_time::precise_sleep::sleep_until;
use crate::sm_time::primary_learning::{Boards, Learning};
use dilu_colocation::{
    Board, FILLER_TURN_NS, FillerGate, MAX_SAMPLE_HOLD_NS, Owed, SampleHoldPost,
};
use dilu_layout::colocation::GapBoard;
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::monotonic_ns;
use dilu_layout::shm::Region;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

struct Colo {
    config: ColoConfig,
    board: Region<GapBoard>,
    /// The board's file: its last user removes it at exit.
    board_path: std::path::PathBuf,
    /// The board slot of each in-process device ([`board_slots`]).
    slots: [usize; MAX_DEVICES],
    /// How many devices the process can have (slots beyond are unused).
    devices: usize,
    /// What the primary learns from its requests or busy periods.
    learning: Learning,
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

/// Per device, this filler's launches at its guaranteed share (per
/// process).
static GUARANTEE: [GuaranteeClock; MAX_DEVICES] = [const { GuaranteeClock::new() }; MAX_DEVICES];
/// GPU time a filler held back longer may catch up on at once (or one of
/// its kernels, where that is longer).
const GUARANTEE_DEPTH_NS: u64 = 1_000_000;
/// How far ahead of its guarantee a filler's record can run: time it had
/// beyond its share longer ago than this gives no lasting lead. It must
/// outlast the other fillers' turns at the gaps (one each), or a filler
/// that had a whole turn falls owed while it waits for theirs, goes ahead
/// of their turns kernel by kernel, and every such kernel costs two
/// hand-offs: with 100 ms beside three fillers on simgpu (turns of 42 ms),
/// they switched 232 times a second and left the device 85.8% busy where a
/// negligible guarantee left it 90.8% (39 switches a second). A second's
/// worth of turns: a filler whose gaps vanish is owed again within about a
/// second.
const GUARANTEE_MEMORY_NS: u64 = 24 * FILLER_TURN_NS;

/// When this filler's launches so far would have run at its guaranteed
/// share: behind `now`, it is owed that share (a virtual clock, like a
/// token bucket's, that every launch moves, gap-filling ones included).
struct GuaranteeClock(AtomicU64);

impl GuaranteeClock {
    const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Where this filler stands at `now` before a kernel of `est_ns`:
    /// owed once its launches so far would have run at its share; overdue
    /// once that was as long ago as this kernel takes at its share (it
    /// waited a whole kernel's pace for a good moment).
    fn standing(&self, now: u64, est_ns: u64, guarantee_ppm: u32) -> Owed {
        let at = self.0.load(Ordering::Relaxed);
        // A guarantee of 0 (none beside a primary kept as if alone): never
        // owed.
        if guarantee_ppm == 0 || at > now {
            Owed::No
        } else if at.saturating_add(at_share(est_ns, guarantee_ppm)) <= now {
            Owed::Overdue
        } else {
            Owed::Yes
        }
    }

    fn charge(&self, now: u64, est_ns: u64, guarantee_ppm: u32) {
        if guarantee_ppm == 0 {
            return;
        }
        let wall = |gpu_ns: u64| at_share(gpu_ns, guarantee_ppm);
        // At least one kernel of catching up: a depth shorter than the
        // kernel would forfeit part of its share at every late launch.
        let floor = now.saturating_sub(wall(GUARANTEE_DEPTH_NS.max(est_ns)));
        let ceiling = now.saturating_add(GUARANTEE_MEMORY_NS);
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |at| {
                Some(at.max(floor).saturating_add(wall(est_ns)).min(ceiling))
            });
    }
}
/// The wall time `gpu_ns` of device time takes at a share of
/// `guarantee_ppm`.
fn at_share(gpu_ns: u64, guarantee_ppm: u32) -> u64 {
    gpu_ns.saturating_mul(1_000_000) / u64::from(guarantee_ppm.max(1))
}

/// Longest single sleep of a held filler: the board is looked at again.
const MAX_HOLD_NS: u64 = 2_000_000;
/// The board slot of each in-process device, and how many devices the
/// process can have: the GPUs `CUDA_VISIBLE_DEVICES` lists, in order, when
/// it lists node GPU indices in PCI bus order (what `dilu run` sets on a
/// node with several GPUs); else slot `k` for device `k`.
fn board_slots(visible: Option<&str>, order: Option<&str>) -> ([usize; MAX_DEVICES], usize) {
    let mut slots: [usize; MAX_DEVICES] = std::array::from_fn(|k| k);
    let listed: Option<Vec<usize>> = visible
        .filter(|_| order == Some("PCI_BUS_ID"))
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| {
            v.split(',')
                .map(|g| g.trim().parse().ok().filter(|&g: &usize| g < MAX_DEVICES))
                .collect()
        });
    match listed {
        Some(gpus) if gpus.len() <= MAX_DEVICES => {
            slots[..gpus.len()].copy_from_slice(&gpus);
            (slots, gpus.len())
        }
        _ => (slots, MAX_DEVICES),
    }
}

impl Colo {
    /// The board of in-process device `device`.
    #[inline]
    fn board(&self, device: usize) -> Board<'_> {
        Board::new(self.board.device(self.slots[device.min(MAX_DEVICES - 1)]))
    }
}

#[inline]
fn get() -> Option<&'static Colo> {
    match STATE.get() {
        Some(state) => state.as_ref(),
        None => STATE.get_or_init(init).as_ref(),
    }
}

/// Attaches this process to `board` as the primary.
fn attach_as_primary(board: Board<'_>, config: &ColoConfig) {
    board.attach_primary(std::process::id(), config.tolerance_ns, config.holdoff_ns);
    // Without an SLO, and without a tolerance the operator set (a delay
    // the operator accepted), it is kept as if alone.
    if config.tolerance_learned {
        board.keep_as_if_alone();
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
    // Boards (and other files) that killed processes left behind go now:
    // nobody holds them. A process without a tenant never sweeps otherwise.
    dilu_layout::sweep::sweep_unused(&dilu_layout::user_region_dir(uid));
    let board = Region::<GapBoard>::open_or_create(&path, 0o600, |_| {}).unwrap_or_else(|e| {
        eprintln!(
            "dilu-interposer: cannot open the co-location board {} ({e}); stopping",
            path.display()
        );
        std::process::exit(2)
    });
    refresh_pid();
    let (slots, devices) = board_slots(
        std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        std::env::var("CUDA_DEVICE_ORDER").ok().as_deref(),
    );
    if config.role == Role::Primary {
        // The node manager's default controller lends a primary's guarantee.
        if let Some(sm) = crate::sm_time::tenant_sm::get() {
            sm.activity().mark_colo_primary();
        }
        for &slot in &slots[..devices] {
            attach_as_primary(Board::new(board.device(slot)), &config);
        }
    }
    tracing::debug!(role = ?config.role, group = %config.group, "co-location active");
    // SAFETY: registering a plain extern "C" function with no arguments.
    unsafe { libc::atexit(remove_board_at_exit) };
    Some(Colo {
        config,
        board,
        board_path: path,
        slots,
        devices,
        learning: Learning::new(),
    })
}

/// At exit: the board's last user removes its file, as a tenant's last
/// process removes its regions.
extern "C" fn remove_board_at_exit() {
    if let Some(Some(colo)) = STATE.get() {
        colo.board.remove_if_unused(&colo.board_path);
    }
}

/// Whether this process takes part in co-location (every launch then
/// goes through [`before_launch`]).
#[inline]
pub fn active() -> bool {
    get().is_some()
}

/// Whether this process is a co-location filler (its launches are admitted
/// by their estimates).
#[inline]
pub fn is_filler() -> bool {
    get().is_some_and(|colo| colo.config.role != Role::Primary)
}

/// What the board counts for a filler's kernel of a kind not measured yet:
/// a time slice (2.08 ms measured on an H100). Counted as the launch path's
/// first guess (100 µs), a new filler's first kernels (or a known filler's
/// new kind) fitted every gap, queued together and held the primary for
/// several of them: on simgpu three fillers of 1.4-3 ms kernels starting
/// beside a Poisson primary at 1024 req/s held it twice for 5-6 ms, and
/// the requests of the run's first 70 ms missed a 6 ms SLO.
pub const UNMEASURED_FILLER_KERNEL_NS: u64 = 2_000_000;

/// The estimate a filler's launch of `cost` is admitted with (`measured`:
/// its kind has an estimate of its own).
fn filler_estimate(cost: u64, measured: bool) -> u64 {
    if measured {
        cost
    } else {
        cost.max(UNMEASURED_FILLER_KERNEL_NS)
    }
}

/// Before a launch of `est_ns` on `device` (after the token bucket let it
/// go; `measured`: `est_ns` is its kind's estimate, not a first guess):
/// the primary publishes it; a filler waits for a gap it fits.
/// Returns the time spent waiting.
#[inline]
pub fn before_launch(device: usize, est_ns: u64, measured: bool) -> u64 {
    let Some(colo) = get() else { return 0 };
    let board = colo.board(device);
    match colo.config.role {
        Role::Primary => {
            let now = monotonic_ns();
            match board.primary_pid() {
                // Another process of the primary (a server's helper that
                // launched a kernel, then exited) was attached last and is
                // gone: fillers would take the device as free.
                None => attach_as_primary(board, &colo.config),
                Some(pid) if pid != MY_PID.load(Ordering::Relaxed) => {
                    attach_if_sibling_gone(board, device, &colo.config, pid, now)
                }
                Some(_) => {}
            }
            // Only a primary kept as if alone learns from its busy
            // periods, and only a gap of the hold-off that began at a
            // synchronisation ends one (any such gap, until one does).
            if let Some(gap) = board.primary_launch(now, est_ns)
                && colo.config.tolerance_learned
                && gap.length_ns >= colo.config.holdoff_ns
                && (gap.synced || !board.primary_synchronises())
            {
                let of = |device| colo.board(device);
                let boards = Boards::new(&of, colo.devices);
                colo.learning
                    .busy_period_over(&colo.config, boards, gap, now);
            }
            match board.sample_hold_until(now) {
                None => 0,
                Some(_) => honour_sample_hold(board, device, now, est_ns),
            }
        }
        Role::Filler { online } => {
            let est_ns = filler_estimate(est_ns, measured);
            let now = monotonic_ns();
            // Beside a primary kept as if alone, only a guarantee the
            // operator set holds (a default one would be delay the
            // primary's tail pays for).
            let guarantee = if colo.config.guarantee_set || !board.as_if_alone() {
                colo.config.guarantee_ppm
            } else {
                0
            };
            let waited = match admit(board, device, now, est_ns, online, guarantee) {
                FillerGate::WaitUntil(at) => {
                    hold(board, device, est_ns, online, guarantee, now, at)
                }
                FillerGate::Go | FillerGate::Fallback => 0,
            };
            GUARANTEE[device].charge(now + waited, est_ns, guarantee);
            waited
        }
    }
}

/// The share of its time a primary waits for fillers' sample holds at
/// most (and [`HONOURED_SAMPLE_HOLD_DEPTH_NS`] more at once): the board
/// spaces holds to about a third of this, so only a filler that ignores
/// the spacing meets it.
pub const HONOURED_SAMPLE_HOLD_PPM: u32 = 100_000;
const HONOURED_SAMPLE_HOLD_DEPTH_NS: u64 = 20_000_000;
static SAMPLE_HOLDS_HONOURED: HonouredHolds =
    HonouredHolds::new(HONOURED_SAMPLE_HOLD_PPM, HONOURED_SAMPLE_HOLD_DEPTH_NS);
/// How often a held primary looks whether the hold was released.
const SAMPLE_HOLD_POLL_NS: u64 = 50_000;

/// The primary's launch of `est_ns`, published at `began`, waits while a
/// filler's sample holds it (within its budget); returns the time waited.
#[cold]
#[inline(never)]
fn honour_sample_hold(board: Board<'_>, device: usize, began: u64, est_ns: u64) -> u64 {
    if !SAMPLE_HOLDS_HONOURED.may_honour(device, began) {
        tracing::debug!("sample hold ignored: the primary's budget for holds is spent");
        return 0;
    }
    // One launch waits at most one hold's length, however often holds are
    // posted anew.
    let give_up = began + MAX_SAMPLE_HOLD_NS;
    let mut now = began;
    while let Some(until) = board.sample_hold_until(now)
        && now < give_up
    {
        sleep_until(until.min(give_up).min(now + SAMPLE_HOLD_POLL_NS));
        now = monotonic_ns();
    }
    SAMPLE_HOLDS_HONOURED.charge(device, now, now - began);
    board.primary_held(now, est_ns);
    now - began
}

/// What [`hold_primary_for_sample`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleHolding {
    /// Time the launch as it is.
    NotNeeded,
    /// The primary holds its launches: release with
    /// [`release_sample_hold`] once the sample was read.
    Held,
    /// A sample now would hold the primary's slice: leave it untimed.
    Refused,
}

/// Before a filler's sampled launch of a kind of `estimate_ns`, at least a
/// time slice long (the caller's rule, as for quiet samples): the
/// primary's next launch would preempt the kernel and sit in its sample,
/// so the primary is asked to hold its launches until the sample was read
/// (see [`Board::post_sample_hold`](dilu_colocation::Board)). The launch was let in by the
/// board, so the primary is in a gap; a kernel that fits it costs the
/// primary nothing, one that overruns it costs about what the overrun does
/// anyway. Only fillers hold; the primary's own samples are taken as they
/// are.
pub fn hold_primary_for_sample(device: usize, estimate_ns: u64) -> SampleHolding {
    let Some(colo) = get() else {
        return SampleHolding::NotNeeded;
    };
    if colo.config.role == Role::Primary {
        return SampleHolding::NotNeeded;
    }
    let me = MY_PID.load(Ordering::Relaxed);
    match colo
        .board(device)
        .post_sample_hold(me, monotonic_ns(), estimate_ns)
    {
        SampleHoldPost::TimeAsIs => SampleHolding::NotNeeded,
        SampleHoldPost::Posted => SampleHolding::Held,
        SampleHoldPost::Refused => SampleHolding::Refused,
    }
}

/// The sample a filler's hold on `device` was for was read (or will not
/// be).
pub fn release_sample_hold(device: usize) {
    if let Some(colo) = get() {
        colo.board(device)
            .release_sample_hold(MY_PID.load(Ordering::Relaxed));
    }
}

/// Before a filler sleeps for SM-time tokens on `device`: it gives up its
/// turn at the gaps, so the other fillers need not wait for it.
#[cold]
pub fn before_token_wait(device: usize) {
    let Some(colo) = get() else { return };
    if matches!(colo.config.role, Role::Filler { .. }) {
        colo.board(device)
            .end_turn_of(MY_PID.load(Ordering::Relaxed));
    }
}

/// Asks the board, saying how this filler stands against its guarantee.
#[inline]
fn admit(
    board: Board<'_>,
    device: usize,
    now: u64,
    est_ns: u64,
    online: bool,
    guarantee_ppm: u32,
) -> FillerGate {
    let me = MY_PID.load(Ordering::Relaxed);
    let owed = GUARANTEE[device].standing(now, est_ns, guarantee_ppm);
    board.filler_admit_led(now, est_ns, online, me, owed, wake_lateness(now))
}

/// How late this filler's held threads wake (the largest recent lateness,
/// halved every [`WAKE_LATENESS_HALF_LIFE_NS`]): on a host whose CPUs are
/// busy, a wake-up comes milliseconds after its instant, and the device
/// idles behind a filler that queues its next kernel only just before its
/// last one ends. The board lets it queue this far ahead where that is
/// safe for the primary.
static WAKE_LATENESS: AtomicU64 = AtomicU64::new(0);
/// When [`WAKE_LATENESS`] was last raised.
static WAKE_LATENESS_AT: AtomicU64 = AtomicU64::new(0);
/// A host's load comes and goes in the time slices of its other processes
/// (milliseconds): a late wake-up predicts more for a while longer.
const WAKE_LATENESS_HALF_LIFE_NS: u64 = 100_000_000;

/// The largest recent lateness at `now`.
fn wake_lateness(now: u64) -> u64 {
    let known = WAKE_LATENESS.load(Ordering::Relaxed);
    let halvings =
        now.saturating_sub(WAKE_LATENESS_AT.load(Ordering::Relaxed)) / WAKE_LATENESS_HALF_LIFE_NS;
    known
        .checked_shr(u32::try_from(halvings).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

/// Counts a wake-up at `now`, `late_ns` after its instant.
fn note_wake_lateness(now: u64, late_ns: u64) {
    if late_ns > wake_lateness(now) {
        WAKE_LATENESS.store(late_ns, Ordering::Relaxed);
        WAKE_LATENESS_AT.store(now, Ordering::Relaxed);
    }
}

/// Waits until the board lets the launch go; returns the time waited.
#[cold]
fn hold(
    board: Board<'_>,
    device: usize,
    est_ns: u64,
    online: bool,
    guarantee_ppm: u32,
    began: u64,
    first_look: u64,
) -> u64 {
    let mut checked_primary = began;
    board.record_held();
    if online {
        board.online_waiting(true);
    }
    let mut now = began;
    let mut gate = FillerGate::WaitUntil(first_look);
    while let FillerGate::WaitUntil(at) = gate {
        if at > now {
            let wake = at.min(now + MAX_HOLD_NS);
            sleep_until(wake);
            now = monotonic_ns();
            note_wake_lateness(now, now.saturating_sub(wake));
        } else {
            now = monotonic_ns();
        }
        if now >= checked_primary + PRIMARY_CHECK_NS {
            checked_primary = now;
            forget_a_gone_primary(board);
        }
        gate = admit(board, device, now, est_ns, online, guarantee_ppm);
    }
    if online {
        board.online_waiting(false);
    }
    now - began
}

/// How often a held filler checks that the primary it waits for still
/// exists (a primary killed inside a synchronisation would hold it
/// forever), and how often a primary process checks that another process
/// of its tenant, attached as the board's primary after it, still exists.
const PRIMARY_CHECK_NS: u64 = 50_000_000;

/// Per device, when this primary process next looks whether the process
/// attached as the primary after it still exists.
static NEXT_SIBLING_CHECK: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];

/// A primary process launching while `sibling`, another process of the
/// primary, is the board's primary: where that one is gone, this one is
/// the primary again. Fillers detach a gone primary only while they wait,
/// so a filler that was let in all along (or none at all) left a dead
/// sibling on the board, and the primary's own launches unpublished.
#[cold]
#[inline(never)]
fn attach_if_sibling_gone(
    board: Board<'_>,
    device: usize,
    config: &ColoConfig,
    sibling: u32,
    now: u64,
) {
    let next_check = &NEXT_SIBLING_CHECK[device.min(MAX_DEVICES - 1)];
    if now < next_check.load(Ordering::Relaxed) {
        return;
    }
    next_check.store(now + PRIMARY_CHECK_NS, Ordering::Relaxed);
    forget_a_gone_primary(board);
    if board.primary_pid().is_none() {
        tracing::debug!(sibling, "co-location: the primary is this process again");
        attach_as_primary(board, config);
    }
}

#[cold]
fn forget_a_gone_primary(board: Board<'_>) {
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
        colo.board(current_device()).primary_sync_begin();
    }
}

#[inline]
pub fn sync_end() {
    if let Some(colo) = get()
        && colo.config.role == Role::Primary
    {
        colo.board(current_device())
            .primary_sync_end(monotonic_ns());
    }
}

fn current_device() -> usize {
    crate::sm_time::tenant_sm::get().map_or(0, |sm| sm.current_device())
}

/// A request latency the primary reported: the request is over (its gap
/// opens to fillers at once, or after the hold-off where it had waited
/// behind the request before it), and the tolerance in force is cut to the
/// slack of the worst recent request.
pub fn latency_reported(latency_ns: u64) {
    let Some(colo) = get() else { return };
    if colo.config.role != Role::Primary {
        return;
    }
    let of = |device| colo.board(device);
    let boards = Boards::new(&of, colo.devices);
    colo.learning.request_reported(
        &colo.config,
        boards,
        colo.board(current_device()),
        latency_ns,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_env;

    #[test]
    fn devices_use_the_board_slots_of_the_node_gpus_they_are() {
        let pci = Some("PCI_BUS_ID");
        let (slots, devices) = board_slots(Some("3,5"), pci);
        assert_eq!((slots[0], slots[1], devices), (3, 5, 2));
        let (slots, devices) = board_slots(Some("6"), pci);
        assert_eq!((slots[0], devices), (6, 1));
        // Not node indices in bus order: device k, slot k.
        for (visible, order) in [
            (Some("3,5"), None),
            (Some("3,5"), Some("FASTEST_FIRST")),
            (Some("GPU-8a1b,GPU-77c0"), pci),
            (Some("3,99"), pci),
            (Some(""), pci),
            (None, pci),
        ] {
            let (slots, devices) = board_slots(visible, order);
            assert_eq!(
                (slots[0], slots[1], devices),
                (0, 1, MAX_DEVICES),
                "{visible:?}"
            );
        }
    }

    #[test]
    fn a_guarantee_of_zero_is_never_owed() {
        const MS: u64 = 1_000_000;
        let clock = GuaranteeClock::new();
        assert_eq!(clock.standing(1_000 * MS, MS, 0), Owed::No);
        clock.charge(1_000 * MS, MS, 0);
        assert_eq!(clock.standing(10_000 * MS, MS, 0), Owed::No);
        assert_eq!(
            clock.standing(10_000 * MS, MS, 100_000),
            Owed::Overdue,
            "charging nothing left the clock where it was"
        );
    }

    #[test]
    fn a_filler_kernel_of_an_unmeasured_kind_counts_as_a_time_slice() {
        assert_eq!(filler_estimate(300_000, true), 300_000);
        assert_eq!(filler_estimate(100_000, false), UNMEASURED_FILLER_KERNEL_NS);
        assert_eq!(filler_estimate(5_000_000, false), 5_000_000);
    }

    #[test]
    fn a_filler_is_owed_its_guarantee_only_while_it_had_less() {
        const MS: u64 = 1_000_000;
        const TEN_PERCENT: u32 = 100_000;
        let clock = GuaranteeClock::new();
        let owed = |at: u64| clock.standing(at, MS, TEN_PERCENT) != Owed::No;
        let t = 1_000 * MS;
        assert!(owed(t), "nothing launched yet");
        // The first 1 ms is its depth; the next 1 ms at 10% is 10 ms of its
        // guarantee.
        clock.charge(t, MS, TEN_PERCENT);
        assert!(owed(t));
        clock.charge(t, MS, TEN_PERCENT);
        assert!(!owed(t + 9 * MS));
        assert!(owed(t + 10 * MS));
        // Owed for as long as a kernel takes at its share: overdue.
        assert_eq!(clock.standing(t + 19 * MS, MS, TEN_PERCENT), Owed::Yes);
        assert_eq!(clock.standing(t + 20 * MS, MS, TEN_PERCENT), Owed::Overdue);
        // Held back for a second, it catches up by one depth, not a second.
        let later = t + 1_000 * MS;
        clock.charge(later, MS, TEN_PERCENT);
        assert!(owed(later), "one depth of catching up");
        clock.charge(later, MS, TEN_PERCENT);
        assert!(!owed(later + 9 * MS));
        // Far beyond its share (gaps it filled): the lead is bounded, so a
        // filler whose gaps vanish is owed again within the memory.
        for _ in 0..1_000 {
            clock.charge(later, MS, TEN_PERCENT);
        }
        assert!(!owed(later + GUARANTEE_MEMORY_NS - 1));
        assert!(owed(later + GUARANTEE_MEMORY_NS));
    }

    #[test]
    fn a_filler_that_had_a_turn_is_not_owed_while_the_others_take_theirs() {
        const MS: u64 = 1_000_000;
        const TEN_PERCENT: u32 = 100_000;
        let clock = GuaranteeClock::new();
        // A whole turn at the gaps: its kernels back to back.
        let t = 1_000 * MS;
        let kernel = 400_000;
        for k in 0..FILLER_TURN_NS / kernel {
            clock.charge(t + k * kernel, kernel, TEN_PERCENT);
        }
        let turn_over = t + FILLER_TURN_NS;
        // Four other fillers take a turn each: it had far more than 10%
        // over that time, and waiting for them owes it nothing (owed, it
        // would cut into their turns kernel by kernel, two hand-offs each).
        assert_eq!(
            clock.standing(turn_over + 4 * FILLER_TURN_NS, kernel, TEN_PERCENT),
            Owed::No
        );
        // Kept from the device much longer, it is owed again.
        assert_ne!(
            clock.standing(turn_over + 2 * GUARANTEE_MEMORY_NS, kernel, TEN_PERCENT),
            Owed::No
        );
    }

    #[test]
    fn configuration_forms() {
        assert_eq!(from_env(test_env(&[])), Ok(None));
        let c = from_env(test_env(&[
            ("DILU_COLO", "primary"),
            ("DILU_COLO_TOLERANCE", "2ms"),
            ("DILU_SPEC", "slo_ms=10"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(c.role, Role::Primary);
        assert_eq!((c.tolerance_ns, c.slo_ns), (2_000_000, Some(10_000_000)));
        assert_eq!(c.group, "gpu");
        // Unset, the tolerance follows the SLO; without one it is 0.
        let tolerance = |vars: &[(&str, &str)]| {
            let mut all = vec![("DILU_COLO", "primary")];
            all.extend_from_slice(vars);
            from_env(test_env(&all)).unwrap().unwrap().tolerance_ns
        };
        assert_eq!(
            tolerance(&[("DILU_SPEC", "class=latency,slo_ms=8")]),
            4_000_000
        );
        assert_eq!(tolerance(&[("DILU_SPEC", "slo_ms=20")]), 10_000_000);
        assert_eq!(tolerance(&[]), 0);
        // Without an SLO or a set tolerance it is learned.
        let learned = |vars: &[(&str, &str)]| {
            let mut all = vec![("DILU_COLO", "primary")];
            all.extend_from_slice(vars);
            from_env(test_env(&all)).unwrap().unwrap().tolerance_learned
        };
        assert!(learned(&[]));
        assert!(!learned(&[("DILU_SPEC", "slo_ms=20")]));
        assert!(!learned(&[("DILU_COLO_TOLERANCE", "1ms")]));
        let f = from_env(test_env(&[
            ("DILU_COLO", "online-filler"),
            ("DILU_COLO_GUARANTEE", "25%"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(f.role, Role::Filler { online: true });
        assert_eq!(f.guarantee_ppm, 250_000);
        // Without one, a filler is guaranteed its SM request; the setting
        // wins over the request.
        let guarantee = |vars: &[(&str, &str)]| {
            let mut all = vec![("DILU_COLO", "filler")];
            all.extend_from_slice(vars);
            from_env(test_env(&all)).unwrap().unwrap().guarantee_ppm
        };
        assert_eq!(guarantee(&[("DILU_SPEC", "sm_request=20")]), 200_000);
        assert_eq!(guarantee(&[("DILU_SPEC", "sm_request=0")]), 100_000);
        assert_eq!(guarantee(&[]), 100_000);
        // Set only by the operator: the default does not hold beside a
        // primary kept as if alone.
        let set = |vars: &[(&str, &str)]| {
            let mut all = vec![("DILU_COLO", "filler")];
            all.extend_from_slice(vars);
            from_env(test_env(&all)).unwrap().unwrap().guarantee_set
        };
        assert!(!set(&[]));
        assert!(!set(&[("DILU_SPEC", "sm_request=0")]));
        assert!(set(&[("DILU_SPEC", "sm_request=20")]));
        assert!(set(&[("DILU_COLO_GUARANTEE", "5")]));
        assert_eq!(
            guarantee(&[("DILU_SPEC", "sm_request=20"), ("DILU_COLO_GUARANTEE", "5")]),
            50_000
        );
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
