//! The co-location board's times: how long a primary's host time between
//! launches lasts, what a hand-off between processes costs, how long a
//! filler's turn and a claim last, how far sample holds are spaced.

/// How long before the fillers' queued work ends a filler may queue its next
/// kernel: hides the filler's own launch latency without letting a queue
/// build (the simulated and real devices run a process's queued kernels
/// back to back, so anything queued is what a returning primary waits for).
pub const QUEUE_LEAD_NS: u64 = 50_000;

/// The most a filler that wakes late (its host's CPUs busy) queues ahead:
/// each of its kernels otherwise waits for a wake-up that comes after the
/// one before has ended. On a 2-core host with two CPU-bound processes a
/// filler alone paced at [`QUEUE_LEAD_NS`] kept the device 26% busy, the
/// same loop at nice 19 without co-location 65%. Beside a primary, only
/// where the whole queue ends before a return predicted from repeating
/// gaps or is within its tolerance.
pub const MAX_QUEUE_LEAD_NS: u64 = 10_000_000;

/// A gap that has outlasted every gap seen and this long means the primary
/// is idle (no requests, or gone): fillers then go, one kernel queued at a
/// time, rather than wait for a return nobody can predict.
pub const IDLE_AFTER_NS: u64 = 10_000_000;

/// Default hold-off: a primary idle for less than this is between dependent
/// launches, not in a gap.
pub const DEFAULT_HOLDOFF_NS: u64 = 150_000;

/// How often a held filler looks at the board again when no instant is
/// known at which things change.
pub const POLL_NS: u64 = 100_000;

/// What handing the GPU from one process to another costs in device time:
/// 138 µs measured on an H100 by `gpu-calibrate` (simgpu's default switch
/// cost). A returning primary pays it after a filler's kernel, so a filler
/// kernel fits a gap only if it ends this long before the gap does.
pub const HANDOFF_NS: u64 = 140_000;

/// How long fillers keep the device with the filler that ran last before
/// another gets priority: fillers taking turns kernel by kernel paid a
/// hand-off on every kernel. A turn of N hand-offs loses about 1/N of the
/// filled time to switches between fillers: three hundred keep that near
/// 0.3% and still share the gaps among fillers many times a second. (A
/// hundred, 14 ms, lost 1.0% of the device to them in the 120 req/s
/// inference shape; in an A/B of two 6 s runs each, 42 ms turns kept the
/// device 90.3/91.0% busy against 88.4/89.3%. Reverted once when
/// `a_filler_delays_the_primary_by_at_most_one_filler_kernel` failed with
/// them; the same long waits showed with 14 ms turns too, from a primary
/// preempted between its launch and its synchronisation on a loaded host,
/// and that test now allows for them.)
pub const FILLER_TURN_NS: u64 = 300 * HANDOFF_NS;

/// How long after the turn holder's queued work ends the others wait for it
/// to queue more: less than one hand-off, so waiting never costs more
/// device time than switching would.
pub const TURN_GRACE_NS: u64 = 100_000;

/// How soon after a gap opens a filler kernel longer than every gap may
/// still go in it where gaps repeat: each moment later is a moment more the
/// returning primary waits. Two looks of a held filler (it wakes for the
/// opening, late by up to a look on a loaded host).
pub const OPENING_NS: u64 = 2 * POLL_NS;

/// How long a filler's claim on the next gap's opening lasts without being
/// renewed (a claimant that died, or took another gap, frees it).
pub const CLAIM_LIFE_NS: u64 = 50_000_000;

/// After a sample hold for a kernel of K, the next may be posted only this
/// many K later: holds then cost a primary at most about 1/this of its
/// time whatever the fillers' samplers ask (a stable kind is timed one
/// launch in thousands anyway).
pub const SAMPLE_HOLD_SPACING: u64 = 32;

/// A sample hold lasts until the kernel's estimated end, an eighth of the
/// kernel (a sample longer than that is left out of the estimate anyway)
/// and this later, unless the filler's harvester read the sample and
/// released it before: the hold word's unit (65.5 µs) and a little. The
/// harvester looks every 200 µs while a sample is out, so a hold ends
/// about then either way; a longer margin only makes the primary wait.
pub const SAMPLE_HOLD_MARGIN_NS: u64 = 100_000;

/// The longest sample hold: a hold word further off than this holds
/// nobody, so a filler that writes one cannot stop its primary; kernels
/// that long are timed without a hold.
pub const MAX_SAMPLE_HOLD_NS: u64 = 50_000_000;
