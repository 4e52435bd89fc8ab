//! Quiet samples: a kernel longer than a time slice is timed while the
//! device's other dilu processes hold their launches (the quiet board,
//! [`dilu_layout::quiet`], which says why).
//!
//! - Every process under SM-time control joins its devices' boards (at a
//!   launch that reads the clock anyway) and, at every launch, tests one
//!   word: whether a hold is posted. Only then does it look further
//!   ([`before_launch`]): it waits until the hold ends, and acknowledges it
//!   once its own recent streams have nothing left queued
//!   (`cuStreamQuery`).
//! - A sampled launch of a kind of at least [`LONG_KIND_NS`] whose device
//!   has other active members posts a hold, waits (in its launching
//!   thread) until they acknowledged it and its own streams drained too,
//!   or [`DRAIN_LIMIT_NS`] passed, and is timed; the harvester releases the
//!   hold when it reads the sample ([`release`]). Another process's hold in
//!   force leaves the launch untimed ([`Clearing::Busy`]).
//!
//! A member honours holds within a budget of its own: the time it waits
//! with its own queue drained (its loss; while its queue runs it loses
//! nothing) may be at most [`HONOURED_PPM`] of its time, and
//! [`HONOURED_DEPTH_NS`] more at once. Beyond it a hold is ignored, so a
//! process posting holds without end slows the others by about that much
//! at most.
//!
//! There is one board per GPU and user, named by the GPU's UUID.
//!
//! Not part of it: co-located tenants (the gap board decides when fillers
//! run; a filler's long kind is timed under the gap board's own hold,
//! which only its primary honours, see
//! [`colocation::hold_primary_for_sample`](crate::sm_time::colocation::hold_primary_for_sample)),
//! processes of other users (the board is per user, like the tenant
//! regions), and `DILU_SM_ABLATE=quiet`. Without the board, samples are taken
//! as before.

use crate::sm_time::honoured_holds::HonouredHolds;
use crate::sm_time::precise_sleep::sleep_until;
use crate::sm_time::recent_streams::{self, StreamRef};
use crate::table::REAL;
use dilu_abi::cuda::{CUDA_SUCCESS, sys};
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::monotonic_ns;
use dilu_layout::quiet::{DeviceQuiet, QuietBoard};
use dilu_layout::shm::Region;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// Kinds at least this long are timed quietly. A time slice is 2.08 ms on
/// an H100 and may be set shorter; a kernel well inside a slice gets clean
/// samples among contended ones (which the estimate keeps), one longer
/// than a slice never does.
pub const LONG_KIND_NS: u64 = 1_000_000;
/// Longest a holder waits for the others' queues to drain before it times
/// its launch anyway (a member that stopped launching while its queue
/// runs never acknowledges).
pub const DRAIN_LIMIT_NS: u64 = 20_000_000;
/// Added to a hold beyond the drain and the kernel: the harvester's look
/// (every 200 µs while a sample is out) and a gate.
const HOLD_MARGIN_NS: u64 = 2_000_000;
/// How often a held member looks at the board and its streams.
const HELD_POLL_NS: u64 = 100_000;
/// A member honours holds for at most this share of its time (ppm) ...
pub const HONOURED_PPM: u32 = 200_000;
/// ... and at most this much more than that at once.
pub const HONOURED_DEPTH_NS: u64 = 200_000_000;

/// A board and the file it is mapped from.
type MappedBoard = (Region<QuietBoard>, PathBuf);

/// Each device's board, mapped at this process's first launch there that
/// reads the clock.
static BOARDS: [OnceLock<Option<MappedBoard>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
/// The boards once mapped (the launch path's one load before the hold word).
static MAPPED: [AtomicPtr<QuietBoard>; MAX_DEVICES] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVICES];
const NO_SLOT: u32 = u32::MAX;
/// This process's slot on each device's board.
static SLOT: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(NO_SLOT) }; MAX_DEVICES];
/// This process's pid (refreshed in a forked child).
static MY_PID: AtomicU32 = AtomicU32::new(0);
/// The quiet board's holds this process honoured.
static HONOURED: HonouredHolds = HonouredHolds::new(HONOURED_PPM, HONOURED_DEPTH_NS);

/// `device`'s board (by the GPU's UUID), mapping it on first use; `None`
/// when quiet samples and fair turns are both off, in co-location, or the
/// GPU has no UUID.
fn board(device: usize) -> Option<&'static DeviceQuiet> {
    BOARDS
        .get(device)?
        .get_or_init(|| {
            let config = crate::config::get();
            if (config.ablate.quiet && config.ablate.turns) || crate::sm_time::colocation::active()
            {
                return None;
            }
            MY_PID.store(std::process::id(), Ordering::Relaxed);
            let uuid = gpu_uuid(device)?;
            // SAFETY: getuid has no preconditions.
            let path = dilu_layout::quiet::board_path(unsafe { libc::getuid() }, &uuid);
            match Region::<QuietBoard>::open_or_create(&path, 0o600, |_| {}) {
                Ok(region) => {
                    MAPPED[device]
                        .store(&*region as *const QuietBoard as *mut _, Ordering::Release);
                    static LEAVE_AT_EXIT: std::sync::Once = std::sync::Once::new();
                    // SAFETY: registers a plain extern "C" fn with no arguments.
                    LEAVE_AT_EXIT.call_once(|| unsafe {
                        libc::atexit(leave_at_exit);
                    });
                    Some((region, path))
                }
                Err(error) => {
                    tracing::debug!(%error, path = %path.display(), "no quiet board");
                    None
                }
            }
        })
        .as_ref()
        .map(|(board, _)| &***board)
}

/// At exit: this process leaves its slots, and the last user of a board
/// removes its file (as a tenant's last process removes its regions).
extern "C" fn leave_at_exit() {
    let me = MY_PID.load(Ordering::Relaxed);
    for (device, board) in BOARDS.iter().enumerate() {
        if let Some(Some((region, path))) = board.get() {
            let slot = SLOT[device].swap(NO_SLOT, Ordering::AcqRel);
            if slot != NO_SLOT {
                region.leave(slot as usize, me);
            }
            region.remove_if_unused(path);
        }
    }
}

/// The UUID of CUDA device `ordinal`, from the real driver.
fn gpu_uuid(ordinal: usize) -> Option<[u8; 16]> {
    let get = crate::driver::resolved(&REAL.cuDeviceGetUuid)?;
    let mut uuid = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: the real cuDeviceGetUuid; writes 16 bytes to a live local.
    if unsafe { get(&mut uuid, ordinal as sys::CUdevice) } != CUDA_SUCCESS {
        return None;
    }
    Some(uuid.bytes.map(|b| b as u8))
}

#[inline]
fn mapped(device: usize) -> Option<&'static DeviceQuiet> {
    let board = MAPPED.get(device)?.load(Ordering::Acquire);
    // SAFETY: set once from a Region kept in BOARDS for the life of the
    // process (never dropped).
    (!board.is_null()).then(|| unsafe { &**board })
}

/// `device`'s board and this process's slot on it (joining it if new), for
/// the fair turns; `None` without a board or a free slot.
pub(crate) fn member(device: usize, now_ns: u64) -> Option<(&'static DeviceQuiet, usize)> {
    let board = board(device)?;
    Some((board, slot(device, board, now_ns)?))
}

/// This process's slot on `device`'s board, joining it if new.
#[inline(always)]
fn slot(device: usize, board: &DeviceQuiet, now_ns: u64) -> Option<usize> {
    let slot = SLOT[device].load(Ordering::Relaxed);
    if slot != NO_SLOT {
        return Some(slot as usize);
    }
    join(device, board, now_ns)
}

#[cold]
#[inline(never)]
fn join(device: usize, board: &DeviceQuiet, now_ns: u64) -> Option<usize> {
    let joined = board.join(MY_PID.load(Ordering::Relaxed), now_ns, |pid| {
        dilu_layout::ledger::process_start_time(pid as i32).is_some()
    })?;
    SLOT[device].store(joined as u32, Ordering::Relaxed);
    Some(joined)
}

/// A launch on `device` that read the clock (`now_ns`): this process is an
/// active member of the device's board.
#[inline]
pub fn launched(device: usize, now_ns: u64) {
    let Some(board) = board(device) else { return };
    if let Some(slot) = slot(device, board, now_ns) {
        board.seen(slot, now_ns);
    }
}

/// Before a launch on `stream` of `device`: waits while another process
/// holds the device for a quiet sample. Returns the time waited.
#[inline]
pub fn before_launch(device: usize, stream: sys::CUstream, per_thread: bool) -> u64 {
    match mapped(device) {
        Some(board) if board.hold_posted() && !crate::config::get().ablate.quiet => {
            held(device, board, stream, per_thread)
        }
        _ => 0,
    }
}

#[cold]
#[inline(never)]
fn held(device: usize, board: &DeviceQuiet, stream: sys::CUstream, per_thread: bool) -> u64 {
    let me = MY_PID.load(Ordering::Relaxed);
    let began = monotonic_ns();
    let Some(first) = board.posted_for(me, began) else {
        return 0;
    };
    if !HONOURED.may_honour(device, began) {
        tracing::debug!("quiet hold ignored: this process's budget for holds is spent");
        return 0;
    }
    let slot = SLOT[device].load(Ordering::Relaxed);
    // While its own queue runs, a held member loses nothing: only the
    // time after that is charged to its budget.
    let mut drained_at = None;
    let mut now = began;
    while let Some(hold) = board.posted_for(me, now) {
        if hold.seq != first.seq {
            break; // another hold: the budget decides again at the next launch
        }
        if drained_at.is_none() && own_work_done(device, stream, per_thread) {
            drained_at = Some(now);
            if slot != NO_SLOT {
                board.acknowledge(slot as usize, hold.seq);
            }
        }
        sleep_until(hold.until_ns.min(now + HELD_POLL_NS));
        now = monotonic_ns();
    }
    let acknowledged = drained_at.is_some();
    HONOURED.charge(device, now, now - drained_at.unwrap_or(now));
    tracing::trace!(
        seq = first.seq,
        held_ns = now - began,
        acknowledged,
        "held for a quiet sample"
    );
    now - began
}

/// Whether every stream this process launched on lately on `device`
/// (and `stream`) has finished its work. Never while a capture is in
/// progress (a query could invalidate it).
pub(crate) fn own_work_done(device: usize, stream: sys::CUstream, per_thread: bool) -> bool {
    if crate::sm_time::stream_capture::capturing_anywhere() {
        return false;
    }
    let pin = recent_streams::Pin::new();
    let others = recent_streams::others(&pin, device, stream, per_thread);
    let own = StreamRef { stream, per_thread };
    std::iter::once(own)
        .chain(others.iter())
        .all(|s| stream_idle(s) != Some(false))
}

/// `cuStreamQuery`: `Some(true)` when `stream` has nothing left to run.
fn stream_idle(stream: StreamRef) -> Option<bool> {
    let query = match stream.per_thread {
        true => crate::driver::resolved(&REAL.cuStreamQuery_ptsz)
            .or_else(|| crate::driver::resolved(&REAL.cuStreamQuery)),
        false => crate::driver::resolved(&REAL.cuStreamQuery),
    }?;
    // SAFETY: the real cuStreamQuery on a stream of ours that is pinned
    // (not destroyed meanwhile) or the one about to be launched on.
    match unsafe { query(stream.stream) } {
        CUDA_SUCCESS => Some(true),
        dilu_abi::cuda::CUDA_ERROR_NOT_READY => Some(false),
        _ => None,
    }
}

/// A hold this process posted for one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietHold {
    device: usize,
    seq: u64,
    drained: bool,
    /// Posted on the co-location gap board (a filler holding its primary),
    /// not on the quiet board.
    on_gap_board: bool,
}

impl QuietHold {
    /// Whether every active member acknowledged it before the launch was
    /// timed (else the drain limit passed, and the sample may hold another
    /// process's slice).
    pub fn drained(&self) -> bool {
        self.drained
    }
}

/// What [`clear_the_device`] did for a sampled launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clearing {
    /// A short kind, no other active member, or no board: time it as is.
    NotNeeded,
    /// Held (release it once the sample is read, see [`release`]).
    Held(QuietHold),
    /// Another process holds the device for its own sample: timed now,
    /// this launch would share the device with it; leave it untimed.
    Busy,
}

/// Before a sampled launch of a kind estimated at `estimate_ns` on
/// `stream` of `device`: if the kind is long and others are active on the
/// device, posts a hold and waits until their queues and this process's
/// own drained (at most [`DRAIN_LIMIT_NS`]).
pub fn clear_the_device(
    device: usize,
    estimate_ns: Option<u64>,
    stream: sys::CUstream,
    per_thread: bool,
) -> Clearing {
    let Some(estimate_ns) = estimate_ns.filter(|&ns| ns >= LONG_KIND_NS) else {
        return Clearing::NotNeeded;
    };
    if crate::config::get().ablate.quiet {
        return Clearing::NotNeeded;
    }
    if crate::sm_time::colocation::active() {
        use crate::sm_time::colocation::{SampleHolding, hold_primary_for_sample};
        return match hold_primary_for_sample(device, estimate_ns) {
            SampleHolding::NotNeeded => Clearing::NotNeeded,
            SampleHolding::Held => Clearing::Held(QuietHold {
                device,
                seq: 0,
                drained: true,
                on_gap_board: true,
            }),
            SampleHolding::Refused => Clearing::Busy,
        };
    }
    let Some(board) = board(device) else {
        return Clearing::NotNeeded;
    };
    let now = monotonic_ns();
    let Some(slot) = slot(device, board, now) else {
        return Clearing::NotNeeded;
    };
    if !board.others_active(slot, now) {
        return Clearing::NotNeeded;
    }
    let until = now + DRAIN_LIMIT_NS + 2 * estimate_ns + HOLD_MARGIN_NS;
    let Some(seq) = board.post(MY_PID.load(Ordering::Relaxed), now, until) else {
        return Clearing::Busy;
    };
    let drain_by = now + DRAIN_LIMIT_NS;
    let mut at = now;
    // Our own queue too: the timed kernel then starts at once, and the
    // hold need only cover it.
    let drained = loop {
        if board.all_drained(slot, seq, at) && own_work_done(device, stream, per_thread) {
            break true;
        }
        if at >= drain_by {
            break false;
        }
        sleep_until(at + HELD_POLL_NS / 2);
        at = monotonic_ns();
    };
    board.extend(seq, at, at + 2 * estimate_ns + HOLD_MARGIN_NS);
    tracing::trace!(seq, waited_ns = at - now, drained, "quiet hold posted");
    Clearing::Held(QuietHold {
        device,
        seq,
        drained,
        on_gap_board: false,
    })
}

/// Ends a hold (its sample was read, or is not taken).
pub fn release(hold: QuietHold) {
    if hold.on_gap_board {
        crate::sm_time::colocation::release_sample_hold(hold.device);
    } else if let Some(board) = mapped(hold.device) {
        board.release(hold.seq);
    }
}

/// In a forked child: a process of its own on the board.
pub(crate) fn forget_parent_state_in_child() {
    MY_PID.store(std::process::id(), Ordering::Relaxed);
    for slot in &SLOT {
        slot.store(NO_SLOT, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_gives_holds_at_most_its_budget_of_idle_time() {
        // A device index no other test uses.
        let device = MAX_DEVICES - 1;
        let mut now = 1_000_000_000_000;
        // Someone posts 20 ms holds back to back for a second: the member
        // idles through them only while its budget lasts.
        let mut idle = 0;
        let start = now;
        while now < start + 1_000_000_000 {
            if HONOURED.may_honour(device, now) {
                HONOURED.charge(device, now + 20_000_000, 20_000_000);
                idle += 20_000_000;
            }
            now += 20_000_000;
        }
        let allowed = HONOURED_DEPTH_NS + 1_000_000_000 * u64::from(HONOURED_PPM) / 1_000_000;
        assert!(idle <= allowed + 20_000_000, "idled {idle} ns");
        assert!(idle >= 200_000_000, "honoured too little: {idle} ns");
        // Refused holds cost nothing: after a quiet spell it honours again.
        assert!(HONOURED.may_honour(device, now + 2_000_000_000));
    }
}
