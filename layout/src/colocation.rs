//! Work-conserving co-location on one GPU: the **gap board** a primary
//! tenant and its fillers share.
//!
//! The primary's interposer publishes, at every launch and synchronisation,
//! whether it has work in flight and when it expects that work to end; it
//! also learns how long its gaps (idle intervals) last. A filler's
//! interposer asks the board before every launch and goes only when the
//! primary is idle and the filler's estimated kernel time fits the
//! predicted rest of the gap (or the primary tolerates one filler kernel of
//! delay); fillers together keep at most about one kernel queued, so a
//! returning primary waits at most about one filler kernel. The decision is
//! a few atomic loads and one CAS: no lock, no system call, no daemon.
//!
//! The board is advisory, like telemetry: every co-located tenant maps it
//! writable, and a filler that ignores it is still held to its token
//! bucket share by the node manager. It makes fillers wait, and a primary
//! only for a sample hold: at most [`MAX_SAMPLE_HOLD_NS`] per launch, and
//! within a budget of its time its interposer keeps.
//!
//! Gap prediction ([`predict_gap`]): gaps shorter than the hold-off (the
//! primary's own host time between dependent launches, e.g. between the
//! kernels of one request) are not fillable and are not learned; the last
//! [`HISTORY`] fillable gaps are kept. When they repeat with a period (a
//! training iteration with several gaps of different lengths: data
//! loading, an all-reduce, a pipeline bubble), the next gap is predicted
//! from the gaps at the same position of the last iterations (the shortest
//! of them); otherwise (random gaps, e.g. an inference server's) it is the
//! shortest of the last [`RING`], a cautious value. A filler whose kernels
//! are longer than every recent gap falls back to its guaranteed share (the
//! caller paces it). Where the gaps repeat or are alike, such a kernel goes
//! as one of the longest gaps opens, where it overruns the gap least; where
//! they are random no moment is better than another. A filler owed its
//! share goes ahead of the filler whose turn it is, and claims the next
//! opening of a gap it can use, which the others leave to it for
//! [`OPENING_NS`].
//!
//! Filler turns ([`FILLER_TURN_NS`]): the device hands over between
//! processes at a cost (138 µs on an H100), so the filler that ran last
//! keeps the gaps for a while before the next one gets them, instead of
//! fillers alternating kernel by kernel. A filler about to wait for its own
//! SM-time tokens ends its turn ([`DeviceBoard::end_turn_of`]): the others
//! would otherwise wait for a holder that is asleep.
//!
//! Sample holds ([`DeviceBoard::post_sample_hold`]): a filler kernel
//! longer than a time slice is preempted by the primary's next launch, so a
//! sample of it timed by events also holds the primary's slice (a 3 ms
//! kernel beside 2 ms gaps read 5.4 ms). A filler's guarantee is counted
//! in those estimates, so such a filler got about half of it. A filler
//! timing one kernel of that length in a gap asks the primary to hold its
//! launches until the kernel ran: it costs the primary about what the
//! kernel's overrun of the gap costs it anyway, and holds are spaced
//! ([`SAMPLE_HOLD_SPACING`]).

use crate::MAX_DEVICES;
use crate::bucket::CacheLine;
use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// The share of an as-if-alone primary's requests that fillers may push
/// over its bound (10% over its p99 alone), or where it reports no
/// requests, of its returns from a fillable gap they may delay beyond its
/// tolerance: at most one in 200, so that its p99 stays within the bound
/// wherever its p99.5 alone does. Without a latency target there
/// is no slack to spend; the primary's tail is judged against its own run
/// alone, and a filler kernel that a returning request finds on the device
/// is, on a device without preemption, a request in that tail.
pub const DELAY_BUDGET_PPM: i64 = 5_000;
/// The most credit an as-if-alone primary builds up, and what fillers need
/// to go where no prediction vouches for the gap: one delayed return. More
/// would let a long quiet stretch pay for a run of delayed requests.
const DELAY_CREDIT_CAP: i64 = 1_000_000;
/// The least credit: delays that no gamble of the fillers caused (a kernel
/// within the tolerance that ran longer than its estimate, a filler's set
/// guarantee) cannot ban gambles for ever.
const DELAY_CREDIT_FLOOR: i64 = -5 * DELAY_CREDIT_CAP;

/// Gaps the shortest-gap rule looks at (and at least as many compared
/// before a period is believed).
pub const RING: usize = 8;
/// Most gaps per iteration a period is looked for in.
pub const MAX_PERIOD: usize = 8;
/// Iterations (at least) over which each gap must agree with the gap one
/// period earlier for the period to be believed.
pub const PERIOD_ITERATIONS: usize = 3;
/// Fillable gaps remembered: enough to check the longest period.
pub const HISTORY: usize = MAX_PERIOD * (PERIOD_ITERATIONS + 1);
/// Two gaps agree when they differ by at most 1/this of the longer: sleep
/// and scheduling noise on a loaded host stays within it, the phases of a
/// training iteration (e.g. 4 ms loading, 1 ms all-reduce) do not.
const AGREE_DIVISOR: u64 = 4;
/// How long before the fillers' queued work ends a filler may queue its next
/// kernel: hides the filler's own launch latency without letting a queue
/// build (the simulated and real devices run a process's queued kernels
/// back to back, so anything queued is what a returning primary waits for).
pub const QUEUE_LEAD_NS: u64 = 50_000;
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
const CLAIM_LIFE_NS: u64 = 50_000_000;
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

/// The co-location state of one device.
#[repr(C)]
pub struct DeviceBoard {
    /// Estimated end of the primary's queued work (CLOCK_MONOTONIC ns).
    primary_busy_until: CacheLine,
    /// Primary threads inside a synchronisation (their work is in flight).
    primary_syncing: CacheLine,
    /// When the primary's current gap began (its last synchronisation
    /// returned); 0 while it has launched since.
    gap_start: CacheLine,
    /// The `gap_start` of a gap the primary said ends a request (it
    /// reported the request's latency): that gap opens to fillers at once,
    /// without the hold-off.
    request_over: CacheLine,
    /// Estimated end of the fillers' queued work: one reservation at a time.
    fillers_busy_until: CacheLine,
    /// The filler that reserved last (its id; 0: none yet): a reservation
    /// by another one costs the device a hand-off between processes.
    last_reserver: CacheLine,
    /// The device time the last reservation added to the fillers' queue
    /// (its kernel and any switch): the most filler work that can be left
    /// once the primary's own work is done.
    last_reservation: CacheLine,
    /// Device time the primary's launches since its last synchronisation
    /// added to the fillers' queue, until that synchronisation tells
    /// whether they went ahead of it.
    provisional_push: CacheLine,
    /// The fillers' queued work when the first of those launches came.
    pushed_backlog: CacheLine,
    /// Online fillers (with an SLO) waiting for a gap: offline ones yield.
    online_waiting: CacheLine,
    /// A filler owed its guarantee waiting for the opening of a gap it can
    /// use: the others leave that opening to it.
    opening_claim: OpeningClaim,
    /// A filler timing a long kernel holds the primary's launches.
    sample_hold: SampleHold,
    /// Which filler has the device's filler work, and since when.
    turn: FillerTurn,
    /// Written by the primary's configuration (and its latency reports).
    params: Params,
    /// Written once per fillable gap by the primary.
    predictor: Predictor,
    history: GapHistory,
    /// Counters each side writes on its own cache line (relaxed adds), so
    /// a filler's launch never contends with the primary's.
    primary_stats: PrimaryStats,
    filler_stats: FillerStats,
}

#[repr(C, align(64))]
struct Params {
    /// Delay of one filler kernel the primary accepts (0: none).
    tolerance_ns: AtomicU64,
    holdoff_ns: AtomicU64,
    /// Whether a primary is attached (0: no primary, fillers go freely).
    primary_present: AtomicU64,
    /// The attached primary's process id (0: unknown), so that fillers can
    /// tell when it is gone.
    primary_pid: AtomicU64,
    /// The `gap_start` of a gap after a reported request that had waited
    /// behind the one before it: the next may be waiting too, so that gap
    /// opens only after the hold-off.
    request_queued: AtomicU64,
    /// 1 while the attached primary has no latency target (no SLO): it is
    /// kept as if alone ([`DeviceBoard::keep_as_if_alone`]).
    as_if_alone: AtomicU64,
    /// The as-if-alone primary's budget of returns from a gap delayed
    /// beyond its tolerance, in millionths of one such return (an `i64`'s
    /// bits): [`DELAY_BUDGET_PPM`] more per fillable gap, one whole return
    /// less per delayed one. Fillers may go where no prediction vouches
    /// for the gap only while it could pay for one more delayed return.
    delay_credit: AtomicU64,
    /// 1 once the as-if-alone primary judges its reported requests itself
    /// ([`DeviceBoard::primary_request_judged`]): its returns from gaps are
    /// then no longer counted.
    credit_by_requests: AtomicU64,
}

/// The filler whose kernels the device ran last: the others let it go on
/// for [`FILLER_TURN_NS`] (written by the filler that reserves). The two
/// words are written one after the other; a filler that reads them
/// between the two writes misjudges one launch's priority, nothing more.
#[repr(C, align(64))]
struct FillerTurn {
    /// The holder's id (its process id; 0: none yet).
    owner: AtomicU64,
    /// When its turn began.
    began_ns: AtomicU64,
}

/// The claim of a filler owed its guarantee on the next opening of a gap
/// its kernel can use (one it fits from its start, or for a kernel longer
/// than every gap, a long one: there it overruns least). Without it, the
/// filler whose kernels fit the most gaps keeps the turn and the others
/// fall below their guarantees (a filler of 1.5 ms kernels beside one of
/// 0.6 ms, both guaranteed 20%, got 14.0% and 15.6% in two 8 s runs of
/// the three-gap training shape; 19.9% with claims).
#[repr(C, align(64))]
struct OpeningClaim {
    /// The claimant's process id in the high half, when it last asked in
    /// the low ([`claim_word`]); 0: none.
    word: AtomicU64,
    /// The claimant's kernel estimate.
    est_ns: AtomicU64,
}

/// A filler's hold on the primary's launches while one of its long
/// kernels is timed ([`DeviceBoard::post_sample_hold`]).
#[repr(C, align(64))]
struct SampleHold {
    /// The holder's id in the high half and when the hold lapses in the
    /// low ([`hold_word`]); 0: none. One word, so that a primary never
    /// sees a holder without its deadline.
    word: AtomicU64,
    /// The earliest instant the next hold may be posted.
    next_at_ns: AtomicU64,
}

/// What fillers read: written by the primary once per fillable gap.
#[repr(C, align(64))]
struct Predictor {
    /// The next gap's predicted length (0: not enough history yet).
    predicted_ns: AtomicU64,
    /// Longest of the last [`RING`] gaps.
    longest_ns: AtomicU64,
    /// Gaps per iteration when a period was detected (0: none).
    period: AtomicU64,
    /// Gaps remembered (up to [`HISTORY`]).
    known: AtomicU64,
}

/// The primary's recent fillable gaps (its own, rarely written).
#[repr(C, align(64))]
struct GapHistory {
    ring: [AtomicU64; HISTORY],
    /// Gaps recorded so far; the next goes to `next % HISTORY`.
    next: AtomicU64,
}

/// Written by the primary only.
#[repr(C, align(64))]
struct PrimaryStats {
    /// Fillable gaps (at least the hold-off long) and their total length.
    gaps_seen: AtomicU64,
    gap_ns: AtomicU64,
    /// Filler work (estimated) still queued when the primary came back from
    /// a gap, and the hand-off back to it: what it waited for, at most.
    primary_delay_ns: AtomicU64,
    /// The primary's own estimated kernel time.
    primary_busy_ns: AtomicU64,
}

/// Written by fillers only.
#[repr(C, align(64))]
struct FillerStats {
    /// Estimated kernel time fillers launched while a primary was attached.
    filled_ns: AtomicU64,
    fallbacks: AtomicU64,
    filler_held: AtomicU64,
}

/// The board of every device of one GPU group.
#[repr(C)]
pub struct GapBoard {
    magic: AtomicU64,
    devices: [DeviceBoard; MAX_DEVICES],
}

// SAFETY: repr(C), atomics and padding only; all-zero is "no primary, no
// history", a valid state.
unsafe impl SharedLayout for GapBoard {
    const MAGIC: u64 = 0x6469_6c75_4741_000a; // "diluGA" v10 (v10: as-if-alone primaries)
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

impl GapBoard {
    pub fn device(&self, device: usize) -> &DeviceBoard {
        &self.devices[device.min(MAX_DEVICES - 1)]
    }
}

/// How a filler stands against its guaranteed share (its own pacing says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owed {
    /// It has had its share: it goes only into gaps it fits.
    No,
    /// It has had less: where waiting brings no gap its kernel fits, it may
    /// go in one it does not fit, at the least harmful moment.
    Yes,
    /// It has been owed for as long as one of its kernels takes at its
    /// share: where no gap it fits is coming, it goes in the gap it is in.
    Overdue,
}

/// The claim word of `filler` at `now`: its id and a coarse time (65.5 µs
/// units, wrapping), so that a claim nobody renews expires.
fn claim_word(filler: u32, now: u64) -> u64 {
    (u64::from(filler) << 32) | ((now >> 16) & 0xFFFF_FFFF)
}

/// The live claimant in `word` at `now`, if any.
fn claimant(word: u64, now: u64) -> Option<u32> {
    let filler = (word >> 32) as u32;
    let age = (((now >> 16) as u32).wrapping_sub(word as u32) as u64) << 16;
    (filler != 0 && age <= CLAIM_LIFE_NS).then_some(filler)
}

/// The sample-hold word of `filler` lasting until `until_ns` (65.5 µs
/// units, wrapping, rounded up).
fn hold_word(filler: u32, until_ns: u64) -> u64 {
    (u64::from(filler) << 32) | (until_ns.div_ceil(1 << 16) & 0xFFFF_FFFF)
}

/// How long the hold in `word` still lasts at `now`; `None` when there is
/// none or it lapsed.
fn hold_left(word: u64, now: u64) -> Option<u64> {
    if word >> 32 == 0 {
        return None;
    }
    let left = (word as u32).wrapping_sub((now >> 16) as u32) as i32;
    (left > 0).then_some((left as u64) << 16)
}

/// What [`DeviceBoard::post_sample_hold`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleHoldPost {
    /// Not posted, and not needed or not possible: no primary is attached
    /// (nothing preempts the kernel), or the kernel is too long to hold one
    /// for ([`MAX_SAMPLE_HOLD_NS`]). Time the launch as it is.
    TimeAsIs,
    /// Posted: the primary's launches wait until it is released or lapses.
    Posted,
    /// Not posted (the primary has work in flight, another filler holds it,
    /// or a hold was posted too lately): a sample now would hold the
    /// primary's slice.
    Refused,
}

/// What the board says to a filler's launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillerGate {
    /// Go now; the launch was reserved on the board.
    Go,
    /// Go now although this kernel fits no gap the board can vouch for:
    /// the filler said it is owed its guaranteed share (it paces itself).
    Fallback,
    /// Ask again at this instant.
    WaitUntil(u64),
}

/// Counters for `dilu status` and the benchmarks. Times are the
/// interposers' kernel-time estimates, not device measurements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BoardSnapshot {
    pub gaps_seen: u64,
    pub gap_ns: u64,
    pub filled_ns: u64,
    pub primary_delay_ns: u64,
    pub primary_busy_ns: u64,
    pub predicted_gap_ns: u64,
    /// Gaps per iteration of the primary when a period was detected (0:
    /// none, the shortest-recent-gap rule applies).
    pub gap_period: u32,
    pub fallbacks: u64,
    pub filler_held: u64,
    pub primary_present: bool,
    /// The attached primary's process id (0: none or unknown).
    pub primary_pid: u32,
    pub tolerance_ns: u64,
}

impl BoardSnapshot {
    /// Primary slowdown estimate: filler work it found queued ahead of it
    /// when it came back from a gap, per unit of its own kernel time (an
    /// upper bound on the delay fillers caused, from estimates).
    pub fn primary_slowdown(&self) -> f64 {
        self.primary_delay_ns as f64 / self.primary_busy_ns.max(1) as f64
    }
}

impl DeviceBoard {
    /// Primary side, once at start: it is present, with its tolerance and
    /// hold-off.
    pub fn attach_primary(&self, pid: u32, tolerance_ns: u64, holdoff_ns: u64) {
        self.params.tolerance_ns.store(tolerance_ns, Relaxed);
        self.params.holdoff_ns.store(holdoff_ns, Relaxed);
        // A primary with a latency target, until it says otherwise.
        self.params.as_if_alone.store(0, Relaxed);
        self.params.primary_pid.store(pid as u64, Relaxed);
        self.params.primary_present.store(1, Release);
    }

    /// The attached primary's process id, if one is attached.
    pub fn primary_pid(&self) -> Option<u32> {
        let present = self.params.primary_present.load(Acquire) != 0;
        let pid = self.params.primary_pid.load(Relaxed) as u32;
        (present && pid != 0).then_some(pid)
    }

    /// Filler side: the primary `pid` is gone (it may have died inside a
    /// synchronisation): the board forgets it, so nobody waits for it.
    pub fn detach_primary(&self, pid: u32) {
        if self
            .params
            .primary_pid
            .compare_exchange(pid as u64, 0, AcqRel, Relaxed)
            .is_ok()
        {
            self.params.primary_present.store(0, Release);
            self.primary_syncing.0.store(0, Release);
        }
    }

    /// Primary side: the delay it accepts now (lowered at once when its
    /// latency has no slack, restored when it has).
    pub fn set_tolerance(&self, tolerance_ns: u64) {
        if self.params.tolerance_ns.load(Relaxed) != tolerance_ns {
            self.params.tolerance_ns.store(tolerance_ns, Relaxed);
        }
    }

    /// Primary side, once at start, for a primary without a latency target:
    /// it is kept as if alone. Fillers then have no default guarantee (the
    /// filler's side reads [`DeviceBoard::as_if_alone`]), and go into a gap
    /// no prediction vouches for (a random gap's predicted length, or a
    /// long idle stretch) only while the primary's budget of delayed
    /// returns ([`DELAY_BUDGET_PPM`]) holds one whole return: it starts
    /// with none (its own latency is not known yet, and the first requests
    /// count in its p99 like any), and earns one over 200 fillable gaps or
    /// reported requests.
    pub fn keep_as_if_alone(&self) {
        self.params.delay_credit.store(0, Relaxed);
        self.params.credit_by_requests.store(0, Relaxed);
        self.params.as_if_alone.store(1, Release);
    }

    /// Whether the attached primary is kept as if alone.
    #[inline]
    pub fn as_if_alone(&self) -> bool {
        self.params.as_if_alone.load(Relaxed) != 0 && self.params.primary_present.load(Relaxed) != 0
    }

    /// The as-if-alone primary's credit of delayed returns, in returns.
    pub fn delay_credit(&self) -> f64 {
        self.params.delay_credit.load(Relaxed) as i64 as f64 / DELAY_CREDIT_CAP as f64
    }

    /// Primary side, as-if-alone, for a primary that reports its requests:
    /// one request ended, and fillers' delay `pushed_over` it (it took
    /// longer than its bound, 10% over its p99 alone, and would not have
    /// without them). Such a primary's requests, not its returns from gaps,
    /// then fill and spend its budget: a delay that leaves a request within
    /// its bound costs its p99 nothing.
    pub fn primary_request_judged(&self, pushed_over: bool) {
        if self.params.credit_by_requests.load(Relaxed) == 0 {
            self.params.credit_by_requests.store(1, Relaxed);
        }
        self.add_credit(
            DELAY_BUDGET_PPM,
            if pushed_over { DELAY_CREDIT_CAP } else { 0 },
        );
    }

    fn add_credit(&self, earned: i64, spent: i64) {
        let _ = self
            .params
            .delay_credit
            .fetch_update(Relaxed, Relaxed, |bits| {
                let credit =
                    (bits as i64 + earned - spent).clamp(DELAY_CREDIT_FLOOR, DELAY_CREDIT_CAP);
                Some(credit as u64)
            });
    }

    /// Primary side, as-if-alone: it came back from a gap of `length_ns` to
    /// find `delay_ns` of filler work ahead of it. A primary that does not
    /// report its requests has only its returns to judge by: one delayed
    /// beyond its tolerance costs a whole return.
    #[cold]
    fn count_return(&self, length_ns: u64, delay_ns: u64) {
        if self.params.credit_by_requests.load(Relaxed) != 0 {
            return;
        }
        let delayed = delay_ns > self.params.tolerance_ns.load(Relaxed);
        // Only fillable gaps earn credit (fillers wait out shorter ones,
        // except between requests); every delayed return costs it.
        let earned = if length_ns >= self.params.holdoff_ns.load(Relaxed) {
            DELAY_BUDGET_PPM
        } else {
            0
        };
        let spent = if delayed { DELAY_CREDIT_CAP } else { 0 };
        if earned != 0 || spent != 0 {
            self.add_credit(earned, spent);
        }
    }

    /// How long, in all, the primary's launches were estimated to wait
    /// behind filler work.
    pub fn primary_delay_ns(&self) -> u64 {
        self.primary_stats.primary_delay_ns.load(Relaxed)
    }

    pub fn tolerance_ns(&self) -> u64 {
        self.params.tolerance_ns.load(Relaxed)
    }

    /// Primary side, on every launch of `est_ns` estimated device time:
    /// closes the gap it was in (learning its length) and moves its
    /// expected end.
    #[inline]
    pub fn primary_launch(&self, now: u64, est_ns: u64) {
        let busy_until = self.primary_busy_until.0.load(Relaxed);
        let queued = self.fillers_busy_until.0.load(Acquire);
        if busy_until <= now {
            // It was idle: a gap ends here.
            let synced = self.gap_start.0.swap(0, AcqRel);
            let start = if synced != 0 { synced } else { busy_until };
            let length = now.saturating_sub(start);
            if start != 0 && length > 0 {
                self.gap_ended(length);
            }
            // Filler work still queued, or ended less than a hand-off ago:
            // the device hands back to the primary after it (a hand-off
            // is delay fillers cause too, and most of it beside short
            // filler kernels).
            let delay = if queued == 0 {
                0
            } else {
                queued.saturating_add(HANDOFF_NS).saturating_sub(now)
            };
            if delay > 0 {
                self.primary_stats
                    .primary_delay_ns
                    .fetch_add(delay, Relaxed);
            }
            if start != 0 && self.params.as_if_alone.load(Relaxed) != 0 {
                self.count_return(length, delay);
            }
        }
        self.primary_stats
            .primary_busy_ns
            .fetch_add(est_ns, Relaxed);
        // The kernel starts only once the filler work queued ahead of it
        // has run and the device has been handed back: until then it is
        // still to come, and fillers must not take that time for a gap
        // (a primary thread preempted between its launch and its
        // synchronisation on a loaded host let a filler queue more behind
        // which the primary's kernel then waited).
        // The fillers' own work, without what this primary's launches
        // since its synchronisation pushed it by (that is no filler work to
        // wait behind, nor to push again).
        let queued = queued.saturating_sub(self.provisional_push.0.load(Acquire));
        let starts = if queued > now {
            // The device time-slices between processes: where the fillers'
            // slice ends before their queued work does, the primary's
            // kernel goes between and the fillers' work ends that much
            // (and two hand-offs) later. Counted until the primary's
            // synchronisation tells which happened (see
            // `primary_sync_end`). Not counting it let the fillers'
            // estimate of their queue run behind the device, until their
            // kernels waited tens of ms on it and each kernel of a request
            // waited behind them.
            let push = est_ns.saturating_add(2 * HANDOFF_NS);
            self.fillers_busy_until.0.fetch_add(push, AcqRel);
            self.provisional_push.0.fetch_add(push, AcqRel);
            self.pushed_backlog.0.fetch_max(queued - now, AcqRel);
            queued.saturating_add(HANDOFF_NS)
        } else {
            now
        };
        let mut current = busy_until;
        loop {
            let next = current.max(starts).saturating_add(est_ns);
            // SeqCst: ordered against a filler's sample hold (see
            // `post_sample_hold`).
            match self
                .primary_busy_until
                .0
                .compare_exchange_weak(current, next, SeqCst, Relaxed)
            {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Primary side: a synchronisation begins (its work is in flight until
    /// it returns, whatever the estimate says).
    #[inline]
    pub fn primary_sync_begin(&self) {
        self.primary_syncing.0.fetch_add(1, AcqRel);
    }

    /// Primary side: a synchronisation returned at `now`: its work is done.
    #[inline]
    pub fn primary_sync_end(&self, now: u64) {
        let before = self.primary_syncing.0.fetch_sub(1, AcqRel);
        if before <= 1 {
            let predicted = self.primary_busy_until.0.fetch_min(now, AcqRel);
            let push = self.provisional_push.0.swap(0, AcqRel);
            let backlog = self.pushed_backlog.0.swap(0, AcqRel);
            // The primary's work ended when predicted for it behind the
            // fillers' queue: it ran after that queue, which it did not
            // push back. Ending earlier, it went ahead of part of it: what
            // is left of that queue, at most what was queued when it
            // launched, runs from now on.
            if now.saturating_add(HANDOFF_NS) >= predicted {
                self.take_back_push(push, now);
            } else if push > 0 {
                let most = now.saturating_add(backlog).saturating_add(2 * HANDOFF_NS);
                self.fillers_busy_until.0.fetch_min(most, AcqRel);
            }
            // Its work done, what is left of the fillers' is at most their
            // last reservation (one kernel queued at a time, the next only
            // within the lead of its end) and the hand-off back: pushes
            // counted for kernels that did not go ahead of filler work (the
            // device lets a kernel finish its time slice, and a filler
            // kernel shorter than its estimate leaves the device idle)
            // otherwise pile up. On simgpu, a bursty primary at 719 req/s
            // had the fillers' queue estimated up to 33 ms ahead of the
            // device between its requests, and the device idle behind it.
            if push > 0 {
                let most = now
                    .saturating_add(HANDOFF_NS + QUEUE_LEAD_NS)
                    .saturating_add(self.last_reservation.0.load(Acquire));
                self.fillers_busy_until.0.fetch_min(most, AcqRel);
            }
            self.gap_start.0.store(now, Release);
        }
    }

    /// Primary side: a request ended (its latency was reported). The hold-off
    /// tells a gap from the program's time between dependent launches; after
    /// the request's last synchronisation nothing depends on it, so the gap
    /// it is in opens to fillers at once, unless the request had `queued`
    /// behind the one before it. Then the next request may be waiting
    /// already, and the hold-off lets it launch first: opened at once, a
    /// filler kernel went in between two waiting requests, and in a backlog
    /// each request waited for one more (on simgpu, 9% of the filler
    /// kernels beside a Poisson primary at 1024 req/s went in while a
    /// request waited).
    #[inline]
    pub fn primary_request_over(&self, queued: bool) {
        let start = self.gap_start.0.load(Acquire);
        if start != 0 {
            if queued {
                self.params.request_queued.store(start, Release);
            }
            self.request_over.0.store(start, Release);
        }
    }

    #[cold]
    fn gap_ended(&self, length_ns: u64) {
        if length_ns < self.params.holdoff_ns.load(Relaxed) {
            return;
        }
        self.primary_stats.gaps_seen.fetch_add(1, Relaxed);
        self.primary_stats.gap_ns.fetch_add(length_ns, Relaxed);
        let h = &self.history;
        let count = h.next.fetch_add(1, Relaxed) + 1;
        h.ring[((count - 1) % HISTORY as u64) as usize].store(length_ns, Relaxed);
        let known = count.min(HISTORY as u64) as usize;
        // Oldest first, on the stack: no allocation on the launch path.
        let mut recent = [0u64; HISTORY];
        for (i, gap) in recent[..known].iter_mut().enumerate() {
            let at = (count - known as u64 + i as u64) % HISTORY as u64;
            *gap = h.ring[at as usize].load(Relaxed);
        }
        let recent = &recent[..known];
        let prediction = predict_gap(recent);
        let longest = recent[known.saturating_sub(RING)..]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let p = &self.predictor;
        p.predicted_ns.store(prediction.length_ns, Relaxed);
        p.period.store(prediction.period as u64, Relaxed);
        p.longest_ns.store(longest, Relaxed);
        p.known.store(known as u64, Relaxed);
    }

    /// Filler side: may a kernel of `est_ns` go at `now`? `online`: the
    /// filler has an SLO (it goes before offline fillers); `filler`: its id
    /// (the process id: the device hands over between processes). On
    /// [`FillerGate::Go`] (or [`FillerGate::Fallback`]) the launch has been
    /// reserved: the board counts it as queued filler work. A filler behind
    /// its guaranteed share asks
    /// with [`DeviceBoard::filler_admit_owed`].
    #[inline]
    pub fn filler_admit(&self, now: u64, est_ns: u64, online: bool, filler: u32) -> FillerGate {
        self.admit_filler(now, est_ns, online, filler, Owed::No)
    }

    /// [`DeviceBoard::filler_admit`] for a filler that has had less than its
    /// guaranteed share: where waiting would bring no gap its kernel fits
    /// (the primary's gaps are random and it tolerates no kernel this long,
    /// or every recent gap is shorter than the kernel), it may still go in
    /// the gap as [`FillerGate::Fallback`], delaying a returning primary by
    /// at most this one kernel. A guarantee is kept whatever the gaps look
    /// like. Where the gaps repeat or are alike, such a kernel goes as one
    /// of the longest gaps opens (a later start overruns the gap by more);
    /// `Owed::Overdue` goes in the gap it is in. Owed, a filler goes ahead
    /// of the turn, and while it waits it claims the next opening of a gap
    /// it can use (one it fits, or for a kernel longer than every gap, a
    /// long one).
    #[inline]
    pub fn filler_admit_owed(
        &self,
        now: u64,
        est_ns: u64,
        online: bool,
        filler: u32,
        owed: Owed,
    ) -> FillerGate {
        self.admit_filler(now, est_ns, online, filler, owed)
    }

    #[inline]
    fn admit_filler(
        &self,
        now: u64,
        est_ns: u64,
        online: bool,
        filler: u32,
        owed: Owed,
    ) -> FillerGate {
        let present = self.params.primary_present.load(Acquire) != 0;
        if !online && self.online_waiting.0.load(Relaxed) > 0 {
            return FillerGate::WaitUntil(now + POLL_NS);
        }
        let queued = self.fillers_busy_until.0.load(Acquire);
        if queued > now + QUEUE_LEAD_NS {
            return FillerGate::WaitUntil(queued - QUEUE_LEAD_NS);
        }
        let mut gate = FillerGate::Go;
        // When the current gap opened to fillers (0: no primary).
        let mut opens = 0;
        // A filler owed its guarantee goes ahead of the turn (and leaves it
        // with its holder): guarantees before turns.
        let owed_now = owed != Owed::No;
        if present {
            let busy_until = self.primary_busy_until.0.load(Acquire);
            if self.primary_syncing.0.load(Acquire) > 0 {
                return FillerGate::WaitUntil(now + POLL_NS);
            }
            if busy_until > now {
                return FillerGate::WaitUntil(busy_until);
            }
            let synced = self.gap_start.0.load(Acquire);
            let start = if synced != 0 { synced } else { busy_until };
            let request_over = self.request_over.0.load(Acquire);
            let between_requests = synced != 0 && request_over == synced;
            let queued_request =
                between_requests && self.params.request_queued.load(Acquire) == synced;
            let holdoff = if between_requests && !queued_request {
                0
            } else {
                self.params.holdoff_ns.load(Relaxed)
            };
            opens = start.saturating_add(holdoff);
            if opens > now {
                return FillerGate::WaitUntil(opens);
            }
            // Fillers start after the hold-off, but the gap is measured
            // from its start: the primary's return is predicted from it.
            let elapsed = now - start.min(now);
            let predicted = self.predictor.predicted_ns.load(Relaxed);
            let fits = predicted > 0
                && elapsed.saturating_add(est_ns).saturating_add(HANDOFF_NS) <= predicted;
            // A primary that reports its requests accepts the delay between
            // them only: inside a request every gap it waits could recur
            // once per kernel.
            let tolerated = est_ns <= self.params.tolerance_ns.load(Relaxed)
                && (between_requests || request_over == 0);
            let longest = self.predictor.longest_ns.load(Relaxed);
            let mut idle = elapsed >= longest.max(IDLE_AFTER_NS);
            // A primary kept as if alone, out of credit for delayed returns:
            // only a prediction from repeating gaps vouches for a gap (a
            // random gap's length is no promise, nor is a long idle).
            let mut fits = fits;
            if self.params.as_if_alone.load(Relaxed) != 0
                && (self.params.delay_credit.load(Relaxed) as i64) < DELAY_CREDIT_CAP
            {
                fits &= self.predictor.period.load(Relaxed) != 0;
                idle = false;
            }
            // This gap is expected to be as long as the longest recent one
            // (a long phase, or gaps all alike).
            let long_gap = agree(predicted, longest);
            let opening_ends = opens.saturating_add(OPENING_NS);
            if !fits && !tolerated && !idle {
                // Owed its guarantee, a filler goes anyway where waiting
                // would not bring a gap it fits: the gaps are random, or
                // all shorter than its kernel. Where they repeat and one
                // fits, it waits for that one.
                let random = self.predictor.period.load(Relaxed) == 0;
                let fits_none = est_ns > longest;
                match owed {
                    Owed::Yes | Owed::Overdue if random || fits_none => {
                        if owed == Owed::Overdue || (random && !long_gap) {
                            // Overdue, or gaps of no predictable length:
                            // no later moment is known to be better.
                            gate = FillerGate::Fallback;
                        } else if long_gap && now <= opening_ends {
                            // The kernel overruns the gap least if it
                            // starts as a long gap opens.
                            gate = FillerGate::Fallback;
                        } else {
                            self.claim_next_opening(filler, est_ns, now);
                            return FillerGate::WaitUntil(now + POLL_NS);
                        }
                    }
                    // A gap it fits comes (the gaps repeat): owed, it
                    // claims that one's opening.
                    Owed::Yes | Owed::Overdue => {
                        self.claim_next_opening(filler, est_ns, now);
                        return FillerGate::WaitUntil(now + POLL_NS);
                    }
                    // This gap is about to end: wait for the next one.
                    Owed::No => return FillerGate::WaitUntil(now + POLL_NS),
                }
            }
            // Another filler, owed its guarantee, claimed this opening and
            // can use this gap: it goes first.
            if !owed_now && now < opening_ends {
                let word = self.opening_claim.word.load(Acquire);
                let claimed = self.opening_claim.est_ns.load(Relaxed);
                let usable = opens - start.min(opens) + claimed + HANDOFF_NS <= predicted
                    || (claimed > longest && long_gap);
                if usable && claimant(word, now).is_some_and(|c| c != filler) {
                    return FillerGate::WaitUntil(opening_ends);
                }
            }
        }
        let owner = self.turn.owner.load(Acquire);
        let me = u64::from(filler);
        let turn_ends = self
            .turn
            .began_ns
            .load(Acquire)
            .saturating_add(FILLER_TURN_NS);
        let young = now < turn_ends;
        // While the holder's work may still be followed by more of it (its
        // queued work has just ended, or the gap has just opened and it is
        // waking for it), the holder goes first in its turn and the others
        // after it (or as its turn ends, when they go first).
        let grace_ends = queued.max(opens).saturating_add(TURN_GRACE_NS);
        if !owed_now && owner != 0 && grace_ends > now && (owner == me) != young {
            return FillerGate::WaitUntil(if young {
                grace_ends.min(turn_ends)
            } else {
                grace_ends
            });
        }
        // A kernel of another filler than the last reserver's, queued
        // behind that one's work, costs the device hand-offs between
        // processes (uncounted, the estimate ran behind the device by them:
        // on simgpu, three fillers taking turns left kernels waiting
        // 20-35 ms behind what the board believed was queued).
        let last = self.last_reserver.0.load(Acquire);
        // Behind another filler's queued work: a hand-off to this one, and
        // where the other's slice ends first, it is preempted and resumes
        // after this kernel, a second hand-off.
        let switch = if last != me && queued > now {
            2 * HANDOFF_NS
        } else {
            0
        };
        let next = now
            .max(queued)
            .saturating_add(switch)
            .saturating_add(est_ns);
        if self
            .fillers_busy_until
            .0
            .compare_exchange(queued, next, AcqRel, Relaxed)
            .is_err()
        {
            // Another filler reserved first: look again at once.
            return FillerGate::WaitUntil(now);
        }
        if last != me {
            self.last_reserver.0.store(me, Release);
        }
        self.last_reservation
            .0
            .store(switch.saturating_add(est_ns), Release);
        if owed_now {
            // Served: the claim (if it was this filler's) is spent.
            let claim = self.opening_claim.word.load(Acquire);
            if claimant(claim, now) == Some(filler) {
                let _ = self
                    .opening_claim
                    .word
                    .compare_exchange(claim, 0, AcqRel, Relaxed);
            }
        }
        // A filler owed its guarantee leaves the turn with its holder: the
        // turn is for the device time beyond guarantees.
        if !owed_now && (owner != me || !young) {
            // A new turn: another filler's, or the holder's again when
            // nobody took over.
            self.turn.owner.store(me, Release);
            self.turn.began_ns.store(now, Release);
        }
        if present {
            self.filler_stats.filled_ns.fetch_add(est_ns, Relaxed);
            if gate == FillerGate::Fallback {
                self.filler_stats.fallbacks.fetch_add(1, Relaxed);
            }
        }
        gate
    }

    /// `filler`, owed its guarantee, claims the next opening of a gap its
    /// kernel of `est_ns` can use (renewed at every look).
    fn claim_next_opening(&self, filler: u32, est_ns: u64, now: u64) {
        self.opening_claim.est_ns.store(est_ns, Relaxed);
        self.opening_claim
            .word
            .store(claim_word(filler, now), Release);
    }

    /// Filler side: an online filler begins or stops waiting for a gap.
    pub fn online_waiting(&self, waiting: bool) {
        if waiting {
            self.online_waiting.0.fetch_add(1, AcqRel);
        } else {
            let _ = self
                .online_waiting
                .0
                .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
        }
    }

    /// Filler side: `filler` is about to wait for its own SM-time tokens.
    /// If it holds the turn, the turn ends now: the others would otherwise
    /// wait for it (a grace, or its turn's end) while it sleeps and the
    /// device idles. So does its claim on an opening, for the same reason.
    pub fn end_turn_of(&self, filler: u32) {
        if self.turn.owner.load(Acquire) == u64::from(filler) {
            self.turn.began_ns.store(0, Release);
        }
        let claim = self.opening_claim.word.load(Acquire);
        if (claim >> 32) as u32 == filler {
            let _ = self
                .opening_claim
                .word
                .compare_exchange(claim, 0, AcqRel, Relaxed);
        }
    }

    /// Filler side, before a timed launch of its kernel of `est_ns` (already
    /// reserved on the board): the primary holds its launches until the
    /// kernel ran, at most the kernel's estimate, an eighth and
    /// [`SAMPLE_HOLD_MARGIN_NS`] after the fillers' queued work ends. Only
    /// while the primary is idle (a kernel of it in flight would be in the
    /// sample anyway), and at most once per [`SAMPLE_HOLD_SPACING`] kernels.
    pub fn post_sample_hold(&self, filler: u32, now: u64, est_ns: u64) -> SampleHoldPost {
        if self.params.primary_present.load(Acquire) == 0 {
            return SampleHoldPost::TimeAsIs;
        }
        let hold = &self.sample_hold;
        if hold.next_at_ns.load(Relaxed) > now {
            return SampleHoldPost::Refused;
        }
        let ends = self.fillers_busy_until.0.load(Acquire).max(now + est_ns);
        let until = ends
            .saturating_add(est_ns / 8)
            .saturating_add(SAMPLE_HOLD_MARGIN_NS);
        // The word rounds up by less than its unit.
        if until - now + (1 << 16) > MAX_SAMPLE_HOLD_NS {
            return SampleHoldPost::TimeAsIs;
        }
        let word = hold_word(filler, until);
        let current = hold.word.load(Acquire);
        if hold_left(current, now).is_some()
            || hold
                .word
                .compare_exchange(current, word, SeqCst, Relaxed)
                .is_err()
        {
            return SampleHoldPost::Refused;
        }
        // All SeqCst, as the primary's publishing of a launch and its look
        // at the hold: either it sees this hold at its next launch, or this
        // sees that launch.
        let idle = self.primary_syncing.0.load(SeqCst) == 0
            && self.primary_busy_until.0.load(SeqCst) <= now;
        if !idle {
            let _ = hold.word.compare_exchange(word, 0, AcqRel, Relaxed);
            return SampleHoldPost::Refused;
        }
        hold.next_at_ns.store(
            now.saturating_add(SAMPLE_HOLD_SPACING.saturating_mul(est_ns)),
            Relaxed,
        );
        SampleHoldPost::Posted
    }

    /// Filler side: `filler`'s sample was read (or will not be): the
    /// primary may launch.
    pub fn release_sample_hold(&self, filler: u32) {
        let word = self.sample_hold.word.load(Acquire);
        if (word >> 32) as u32 == filler {
            let _ = self
                .sample_hold
                .word
                .compare_exchange(word, 0, AcqRel, Relaxed);
        }
    }

    /// Primary side, after [`DeviceBoard::primary_launch`] published the
    /// launch: until when a filler's sample holds it (`None`: go).
    #[inline]
    pub fn sample_hold_until(&self, now: u64) -> Option<u64> {
        hold_left(self.sample_hold.word.load(SeqCst), now)
            .filter(|&left| left <= MAX_SAMPLE_HOLD_NS)
            .map(|left| now + left)
    }

    /// Primary side: its launch of `est_ns` waited for a sample hold until
    /// `now`: its work ends no earlier than `now + est_ns`.
    pub fn primary_held(&self, now: u64, est_ns: u64) {
        self.primary_busy_until
            .0
            .fetch_max(now.saturating_add(est_ns), AcqRel);
        // Held, it launches after the fillers' work: it pushes none back.
        let push = est_ns.saturating_add(2 * HANDOFF_NS);
        let taken = self
            .provisional_push
            .0
            .fetch_update(AcqRel, Acquire, |p| Some(p.saturating_sub(push)))
            .unwrap_or(0)
            .min(push);
        self.take_back_push(taken, now);
    }

    /// Undoes `push` of the fillers' queue end (not before `now`).
    fn take_back_push(&self, push: u64, now: u64) {
        if push > 0 {
            let _ = self
                .fillers_busy_until
                .0
                .fetch_update(AcqRel, Acquire, |at| Some(at.saturating_sub(push).max(now)));
        }
    }

    /// Filler side: a launch was held at least once.
    /// The filler work (estimated) launched while a primary was attached,
    /// in all.
    pub fn filled_ns(&self) -> u64 {
        self.filler_stats.filled_ns.load(Relaxed)
    }

    pub fn record_held(&self) {
        self.filler_stats.filler_held.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> BoardSnapshot {
        BoardSnapshot {
            gaps_seen: self.primary_stats.gaps_seen.load(Relaxed),
            gap_ns: self.primary_stats.gap_ns.load(Relaxed),
            filled_ns: self.filler_stats.filled_ns.load(Relaxed),
            primary_delay_ns: self.primary_stats.primary_delay_ns.load(Relaxed),
            primary_busy_ns: self.primary_stats.primary_busy_ns.load(Relaxed),
            predicted_gap_ns: self.predictor.predicted_ns.load(Relaxed),
            gap_period: self.predictor.period.load(Relaxed) as u32,
            fallbacks: self.filler_stats.fallbacks.load(Relaxed),
            filler_held: self.filler_stats.filler_held.load(Relaxed),
            primary_present: self.params.primary_present.load(Relaxed) != 0,
            primary_pid: self.params.primary_pid.load(Relaxed) as u32,
            tolerance_ns: self.params.tolerance_ns.load(Relaxed),
        }
    }
}

/// The next gap of a primary, predicted from its recent gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapPrediction {
    /// 0: no prediction (fewer than two gaps).
    pub length_ns: u64,
    /// Gaps per iteration, when the gaps repeat (0: no period found).
    pub period: usize,
}

fn agree(a: u64, b: u64) -> bool {
    a.abs_diff(b) <= a.max(b) / AGREE_DIVISOR
}

/// Predicts the gap after `recent` (fillable gaps, oldest first).
///
/// The smallest period `p` (1 to [`MAX_PERIOD`]) is taken for which the
/// last `max(p × PERIOD_ITERATIONS, RING)` gaps each agree with the gap `p`
/// before it, all but a quarter of them (one outlier spoils two
/// comparisons); the prediction is then the shortest of those gaps at the
/// next gap's position. Without a period it is the shortest of the last
/// [`RING`] gaps. Either way a cautious value: the gap it predicts was
/// seen at least that long every time.
pub fn predict_gap(recent: &[u64]) -> GapPrediction {
    let n = recent.len();
    if n < 2 {
        return GapPrediction {
            length_ns: 0,
            period: 0,
        };
    }
    for period in 1..=MAX_PERIOD {
        let window = (period * PERIOD_ITERATIONS).max(RING);
        if n < window + period {
            break;
        }
        let mismatches = (n - window..n)
            .filter(|&i| !agree(recent[i], recent[i - period]))
            .count();
        if mismatches <= window / 4 {
            // The next gap is at position n: the same position one, two,
            // ... periods back, within the window.
            let length_ns = (1..)
                .map(|k| k * period)
                .take_while(|&back| back <= window)
                .map(|back| recent[n - back])
                .min()
                .unwrap_or(0);
            return GapPrediction { length_ns, period };
        }
    }
    GapPrediction {
        length_ns: recent[n.saturating_sub(RING)..]
            .iter()
            .copied()
            .min()
            .unwrap_or(0),
        period: 0,
    }
}

/// The board file of co-location group `group`:
/// `/dev/shm/dilu-<uid>/colo-<group>.board`.
pub fn board_path(uid: u32, group: &str) -> std::path::PathBuf {
    crate::user_region_dir(uid).join(format!("colo-{group}.board"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Region;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;
    /// Fillers' ids (process ids on a real board).
    const FILLER: u32 = 7;
    const ONLINE_FILLER: u32 = 8;

    fn board() -> Region<GapBoard> {
        Region::<GapBoard>::anonymous(|_| {}).unwrap()
    }

    #[test]
    fn hot_words_have_cache_lines_of_their_own() {
        assert_eq!(std::mem::align_of::<DeviceBoard>(), 64);
        assert_eq!(std::mem::size_of::<CacheLine>(), 64);
        // The primary's counters and the fillers' never share a line.
        let primary = std::mem::offset_of!(DeviceBoard, primary_stats);
        let filler = std::mem::offset_of!(DeviceBoard, filler_stats);
        assert!(primary / 64 != filler / 64);
        assert!(std::mem::size_of::<PrimaryStats>() <= 64);
        assert!(std::mem::size_of::<FillerStats>() <= 64);
    }

    /// A training-like primary: 4 ms of work, then a 3 ms gap, repeated.
    fn train_iteration(b: &DeviceBoard, start: u64) -> u64 {
        for k in 0..8 {
            b.primary_launch(start + k * US, 500 * US);
        }
        b.primary_sync_begin();
        let end = start + 4 * MS;
        b.primary_sync_end(end);
        end + 3 * MS
    }

    /// A primary that has learned its 3 ms gaps, at the start of one more:
    /// returns when that gap began.
    fn in_a_learned_gap(b: &DeviceBoard) -> u64 {
        let mut t = 1_000 * MS;
        for _ in 0..RING {
            t = train_iteration(b, t);
        }
        b.primary_launch(t, 4 * MS);
        b.primary_sync_begin();
        let gap = t + 4 * MS;
        b.primary_sync_end(gap);
        gap
    }

    #[test]
    fn a_filler_timing_a_long_kernel_holds_the_primary_until_it_ran() {
        let board = board();
        let b = board.device(0);
        let kernel = 3 * MS;
        assert_eq!(
            b.post_sample_hold(FILLER, 1_000 * MS, kernel),
            SampleHoldPost::TimeAsIs
        );
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let gap = in_a_learned_gap(b);
        let t = gap + DEFAULT_HOLDOFF_NS;
        assert_eq!(
            b.filler_admit_owed(t, kernel, false, FILLER, Owed::Overdue),
            FillerGate::Fallback
        );
        assert_eq!(
            b.post_sample_hold(FILLER, t, kernel),
            SampleHoldPost::Posted
        );
        // Another filler cannot hold it too.
        assert_eq!(
            b.post_sample_hold(ONLINE_FILLER, t, kernel),
            SampleHoldPost::Refused
        );
        // The primary's return 1 ms later waits for the kernel, at most its
        // estimate, an eighth and the margin (give or take the word's two
        // roundings).
        let back = t + MS;
        b.primary_launch(back, 500 * US);
        let until = b.sample_hold_until(back).expect("held");
        let ends = t + kernel;
        assert!(
            until >= ends + kernel / 8 + SAMPLE_HOLD_MARGIN_NS,
            "{until}"
        );
        assert!(until <= ends + kernel / 8 + SAMPLE_HOLD_MARGIN_NS + (2 << 16));
        assert_eq!(b.sample_hold_until(until), None, "lapsed");
        // Read 300 µs after the kernel's end, the sample lets the primary go.
        let released = ends + 300 * US;
        b.release_sample_hold(ONLINE_FILLER);
        assert!(
            b.sample_hold_until(back).is_some(),
            "only its holder releases it"
        );
        b.release_sample_hold(FILLER);
        assert_eq!(b.sample_hold_until(back), None);
        // Fillers see the held launch's work end after the hold.
        b.primary_held(released, 500 * US);
        assert_eq!(
            b.filler_admit(released, 100 * US, false, FILLER),
            FillerGate::WaitUntil(released + 500 * US)
        );
        // The next hold only after the spacing.
        b.primary_sync_begin();
        let next_gap = released + 500 * US;
        b.primary_sync_end(next_gap);
        let spaced = t + SAMPLE_HOLD_SPACING * kernel;
        assert_eq!(
            b.post_sample_hold(FILLER, next_gap + DEFAULT_HOLDOFF_NS, kernel),
            SampleHoldPost::Refused
        );
        let later = spaced.max(next_gap + DEFAULT_HOLDOFF_NS);
        assert_eq!(
            b.post_sample_hold(FILLER, later, kernel),
            SampleHoldPost::Posted
        );
    }

    #[test]
    fn a_sample_hold_never_lasts_longer_than_the_limit() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let gap = in_a_learned_gap(b);
        let t = gap + DEFAULT_HOLDOFF_NS;
        // A kernel too long to hold the primary for is timed as it is.
        assert_eq!(
            b.post_sample_hold(FILLER, t, MAX_SAMPLE_HOLD_NS),
            SampleHoldPost::TimeAsIs
        );
        assert_eq!(b.sample_hold_until(t), None);
        // A hold word written by hand, further off than the limit (a
        // filler ignoring the protocol), holds nobody.
        for far in [MAX_SAMPLE_HOLD_NS + MS, 3_600_000 * MS] {
            b.sample_hold
                .word
                .store(hold_word(FILLER, t + far), Relaxed);
            assert_eq!(b.sample_hold_until(t), None, "{far} ns off");
        }
        b.sample_hold
            .word
            .store(hold_word(FILLER, t + 10 * MS), Relaxed);
        assert!(b.sample_hold_until(t).is_some());
    }

    #[test]
    fn no_sample_hold_while_the_primary_has_work_in_flight() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let gap = in_a_learned_gap(b);
        // The primary launched (after the filler was let in): the sample
        // would hold its kernel, so no hold, and the primary is not held.
        let t = gap + DEFAULT_HOLDOFF_NS;
        b.primary_launch(t, 500 * US);
        assert_eq!(
            b.post_sample_hold(FILLER, t, 3 * MS),
            SampleHoldPost::Refused
        );
        assert_eq!(b.sample_hold_until(t), None);
        // Inside a synchronisation its work is in flight whatever the estimate.
        b.primary_sync_begin();
        assert_eq!(
            b.post_sample_hold(FILLER, t + 5 * MS, 3 * MS),
            SampleHoldPost::Refused
        );
        b.primary_sync_end(t + 6 * MS);
        assert_eq!(
            b.post_sample_hold(FILLER, t + 6 * MS, 3 * MS),
            SampleHoldPost::Posted
        );
    }

    #[test]
    fn a_gap_after_a_reported_request_opens_without_the_hold_off() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let gap = in_a_learned_gap(b);
        let soon = gap + 10 * US;
        // A synchronisation alone may be between dependent launches.
        assert_eq!(
            b.filler_admit(soon, MS, false, FILLER),
            FillerGate::WaitUntil(gap + DEFAULT_HOLDOFF_NS)
        );
        // Once the request it ended is reported, nothing depends on it.
        b.primary_request_over(false);
        assert_eq!(b.filler_admit(soon, MS, false, FILLER), FillerGate::Go);
        // The next gap is one of unknown kind again.
        b.primary_launch(soon + MS, 4 * MS);
        b.primary_sync_begin();
        let next = soon + 5 * MS;
        b.primary_sync_end(next);
        assert_eq!(
            b.filler_admit(next + 10 * US, MS, false, FILLER),
            FillerGate::WaitUntil(next + DEFAULT_HOLDOFF_NS)
        );
    }

    /// The primary launches one 200 µs kernel at `at` and synchronises
    /// as it ends.
    fn one_kernel_waited_for(b: &DeviceBoard, at: u64) {
        b.primary_launch(at, 200 * US);
        b.primary_sync_begin();
        b.primary_sync_end(at + 200 * US);
    }

    #[test]
    fn after_a_request_that_waited_the_gap_opens_only_after_the_hold_off() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 2 * MS, DEFAULT_HOLDOFF_NS);
        let t = 5_000 * MS;
        one_kernel_waited_for(b, t);
        // The request had waited behind the one before it: the next one
        // may be waiting now, and gets the hold-off to launch.
        b.primary_request_over(true);
        let soon = t + 210 * US;
        assert_eq!(
            b.filler_admit(soon, MS, false, FILLER),
            FillerGate::WaitUntil(t + 200 * US + DEFAULT_HOLDOFF_NS)
        );
        // It did not come: the gap is between requests, and the primary's
        // tolerance holds in it.
        let later = t + 200 * US + DEFAULT_HOLDOFF_NS;
        assert_eq!(b.filler_admit(later, MS, false, FILLER), FillerGate::Go);
        // A request that had not waited opens its gap at once again.
        let next = later + 5 * MS;
        one_kernel_waited_for(b, next);
        b.primary_request_over(false);
        assert_eq!(
            b.filler_admit(next + 210 * US, MS, false, FILLER),
            FillerGate::Go
        );
    }

    #[test]
    fn a_filler_fills_a_learned_gap_but_not_past_its_end() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let mut t = 1_000 * MS;
        for _ in 0..RING {
            t = train_iteration(b, t);
        }
        assert_eq!(b.snapshot().predicted_gap_ns, 3 * MS);
        // The primary is busy: the filler waits for its expected end.
        b.primary_launch(t, 4 * MS);
        assert_eq!(
            b.filler_admit(t, MS, false, FILLER),
            FillerGate::WaitUntil(t + 4 * MS)
        );
        b.primary_sync_begin();
        let gap = t + 4 * MS;
        b.primary_sync_end(gap);
        // Inside the hold-off: not yet.
        assert_eq!(
            b.filler_admit(gap + 10 * US, MS, false, FILLER),
            FillerGate::WaitUntil(gap + DEFAULT_HOLDOFF_NS)
        );
        // 1 ms kernels: two fit in the 3 ms gap after the hold-off.
        let at = gap + DEFAULT_HOLDOFF_NS;
        assert_eq!(b.filler_admit(at, MS, false, FILLER), FillerGate::Go);
        // A second one must wait for the first (no queue)...
        assert!(matches!(
            b.filler_admit(at, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(b.filler_admit(at + MS, MS, false, FILLER), FillerGate::Go);
        // ...and a third would end past the gap: held.
        assert!(matches!(
            b.filler_admit(at + 2 * MS, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        // A filler whose 5 ms kernels fit no gap waits, even owed its
        // guarantee this late in the gap; overdue, it goes.
        assert!(matches!(
            b.filler_admit(at + 2 * MS, 5 * MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert!(matches!(
            b.filler_admit_owed(at + 2 * MS, 5 * MS, false, FILLER, Owed::Yes),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(
            b.filler_admit_owed(at + 2 * MS, 5 * MS, false, FILLER, Owed::Overdue),
            FillerGate::Fallback
        );
        assert_eq!(b.snapshot().fallbacks, 1);
        // Owed or not, never while the primary is busy.
        b.primary_launch(at + 8 * MS, MS);
        assert!(matches!(
            b.filler_admit_owed(at + 8 * MS, 5 * MS, false, FILLER, Owed::Overdue),
            FillerGate::WaitUntil(_)
        ));
    }

    /// Repeating 3 ms gaps, a filler owed its guarantee whose 5 ms kernels
    /// fit none: it goes as a gap opens, where it overruns the gap least,
    /// ahead of the filler whose turn it is, and claims the next opening
    /// when it comes too late.
    #[test]
    fn a_kernel_longer_than_every_gap_goes_as_a_gap_opens() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let (long, short) = (FILLER, FILLER + 1);
        let gap = in_a_learned_gap(b);
        let opens = gap + DEFAULT_HOLDOFF_NS;
        // The short filler takes the gap and its turn; the long one, owed
        // only from the middle of the gap, is too late for this one.
        assert_eq!(
            b.filler_admit(opens, 500 * US, false, short),
            FillerGate::Go
        );
        let middle = gap + 3 * MS / 2;
        assert!(matches!(
            b.filler_admit_owed(middle, 5 * MS, false, long, Owed::Yes),
            FillerGate::WaitUntil(_)
        ));
        // The next gap: the short filler, whose turn it is, waits for the
        // claimed opening; the long one goes at it.
        b.primary_launch(gap + 3 * MS, 4 * MS);
        b.primary_sync_begin();
        let next = gap + 7 * MS;
        b.primary_sync_end(next);
        let opens = next + DEFAULT_HOLDOFF_NS;
        assert_eq!(
            b.filler_admit(opens, 500 * US, false, short),
            FillerGate::WaitUntil(opens + OPENING_NS)
        );
        assert_eq!(
            b.filler_admit_owed(opens + POLL_NS, 5 * MS, false, long, Owed::Yes),
            FillerGate::Fallback
        );
        // The claim is spent and the turn is still the short filler's.
        assert!(claimant(b.opening_claim.word.load(Relaxed), opens).is_none());
        assert_eq!(b.turn.owner.load(Relaxed), u64::from(short));
    }

    /// A primary with a 4 ms and a 1 ms gap per iteration; the filler
    /// `short` (500 µs kernels) holds the turn, `long` (1.5 ms kernels,
    /// which fit only the 4 ms gap) is owed its guarantee.
    #[test]
    fn a_filler_owed_its_guarantee_goes_ahead_of_the_turn_in_gaps_it_fits() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let (short, long) = (FILLER, FILLER + 1);
        let phase = |t: u64, gap: u64| {
            b.primary_launch(t, 2 * MS);
            b.primary_sync_begin();
            b.primary_sync_end(t + 2 * MS);
            (t + 2 * MS + DEFAULT_HOLDOFF_NS, t + 2 * MS + gap)
        };
        let mut t = 1_000 * MS;
        for _ in 0..8 {
            t = phase(t, 4 * MS).1;
            t = phase(t, MS).1;
        }
        // The 4 ms gap: short takes it and its turn.
        let (opens, next) = phase(t, 4 * MS);
        assert_eq!(
            b.filler_admit(opens, 500 * US, false, short),
            FillerGate::Go
        );
        // The 1 ms gap: long fits it not; owed, it claims the next opening
        // it fits, which is not this one: short goes.
        let (opens, next) = phase(next, MS);
        assert!(matches!(
            b.filler_admit_owed(opens, 3 * MS / 2, false, long, Owed::Yes),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(
            b.filler_admit(opens, 500 * US, false, short),
            FillerGate::Go
        );
        // The next 4 ms gap: short, whose turn it is, leaves the opening to
        // long, and long goes ahead of the turn without taking it.
        let (opens, _) = phase(next, 4 * MS);
        assert_eq!(
            b.filler_admit(opens, 500 * US, false, short),
            FillerGate::WaitUntil(opens + OPENING_NS)
        );
        assert_eq!(
            b.filler_admit_owed(opens + POLL_NS, 3 * MS / 2, false, long, Owed::Yes),
            FillerGate::Go
        );
        assert_eq!(b.turn.owner.load(Relaxed), u64::from(short));
        // Served, long's claim is spent: short is left no opening for it.
        assert!(claimant(b.opening_claim.word.load(Relaxed), opens).is_none());
    }

    #[test]
    fn a_filler_waiting_for_its_tokens_gives_up_its_claim() {
        let board = board();
        let b = board.device(0);
        let t = 1_000 * MS;
        b.claim_next_opening(FILLER, MS, t);
        b.end_turn_of(FILLER + 1);
        assert_eq!(
            claimant(b.opening_claim.word.load(Relaxed), t),
            Some(FILLER),
            "only the claimant gives it up"
        );
        b.end_turn_of(FILLER);
        assert_eq!(claimant(b.opening_claim.word.load(Relaxed), t), None);
    }

    #[test]
    fn an_unrenewed_claim_expires() {
        let t = 1_000 * MS;
        let word = claim_word(FILLER, t);
        assert_eq!(claimant(word, t), Some(FILLER));
        assert_eq!(claimant(word, t + CLAIM_LIFE_NS - MS), Some(FILLER));
        assert_eq!(claimant(word, t + CLAIM_LIFE_NS + MS), None);
        assert_eq!(claimant(0, t), None);
    }

    #[test]
    fn the_filler_that_ran_last_goes_first_when_the_next_gap_opens() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 2 * MS, DEFAULT_HOLDOFF_NS);
        let (a, other) = (FILLER, FILLER + 1);
        let gap = |t: u64| {
            b.primary_launch(t, 200 * US);
            b.primary_sync_begin();
            b.primary_sync_end(t + 200 * US);
            t + 200 * US + DEFAULT_HOLDOFF_NS
        };
        let opens = gap(1_000 * MS);
        assert_eq!(b.filler_admit(opens, MS, false, a), FillerGate::Go);
        // The primary comes back after a's kernel; in its next gap the other
        // filler asks first, but a, waking for the same gap, goes first.
        let opens = gap(opens + 2 * MS);
        assert_eq!(
            b.filler_admit(opens, MS, false, other),
            FillerGate::WaitUntil(opens + TURN_GRACE_NS)
        );
        assert_eq!(
            b.filler_admit(opens + 10 * US, MS, false, a),
            FillerGate::Go
        );
        // Had a not come, the other would have gone after the grace.
        let opens = gap(opens + 3 * MS);
        assert_eq!(
            b.filler_admit(opens + TURN_GRACE_NS, MS, false, other),
            FillerGate::Go
        );
    }

    #[test]
    fn a_filler_kernel_fits_only_if_the_primary_gets_the_device_back_in_time() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let gap = in_a_learned_gap(b);
        let opens = gap + DEFAULT_HOLDOFF_NS;
        // The 3 ms gap less the hold-off and one hand-off: fits exactly...
        let room = 3 * MS - DEFAULT_HOLDOFF_NS - HANDOFF_NS;
        assert!(matches!(
            b.filler_admit(opens, room + 1, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(b.filler_admit(opens, room, false, FILLER), FillerGate::Go);
    }

    #[test]
    fn a_primary_kernel_behind_filler_work_keeps_the_gap_closed_until_it_ran() {
        let shared = board();
        let b = shared.device(0);
        b.attach_primary(1, MS, DEFAULT_HOLDOFF_NS);
        let t = 1_000 * MS;
        // A filler's 1 ms kernel is on the device when the primary launches
        // a 200 µs one and its thread, preempted, does not synchronise.
        assert_eq!(b.filler_admit(t, MS, false, FILLER), FillerGate::Go);
        b.primary_launch(t + 100 * US, 200 * US);
        // The primary's kernel runs after the filler's and a hand-off: the
        // filler may not queue more until then (and the hold-off after).
        // Until the primary's synchronisation tells whether its kernel went
        // ahead of the filler's at a slice's end instead, the fillers' queue
        // counts it so, and two hand-offs.
        let primary_ends = t + MS + HANDOFF_NS + 200 * US;
        assert_eq!(
            b.filler_admit(t + MS - QUEUE_LEAD_NS, MS, false, FILLER),
            FillerGate::WaitUntil(primary_ends + HANDOFF_NS - QUEUE_LEAD_NS)
        );
        assert!(matches!(
            b.filler_admit(primary_ends + HANDOFF_NS, MS, false, FILLER),
            FillerGate::WaitUntil(at) if at >= primary_ends + DEFAULT_HOLDOFF_NS
        ));
    }

    #[test]
    fn a_primary_idle_longer_than_every_gap_no_longer_holds_fillers() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let gap = in_a_learned_gap(b);
        // 2 ms fits the 3 ms gaps only at its start; later in the gap it is
        // held, as the primary is expected back...
        let late = gap + 2 * MS;
        assert!(matches!(
            b.filler_admit(late, 2 * MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        // ...but once the gap has outlasted every gap seen and the idle
        // floor, the primary is idle (the training loop ended): it goes.
        let idle = gap + IDLE_AFTER_NS;
        assert_eq!(b.filler_admit(idle, 2 * MS, false, FILLER), FillerGate::Go);
    }

    #[test]
    fn a_primary_gone_inside_a_synchronisation_is_forgotten() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(4242, 0, DEFAULT_HOLDOFF_NS);
        let t = 9_000 * MS;
        b.primary_launch(t, 200 * US);
        b.primary_sync_begin(); // killed here: it never returns
        let later = t + 60_000 * MS;
        assert!(matches!(
            b.filler_admit(later, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(b.primary_pid(), Some(4242));
        b.detach_primary(4241); // another pid: nothing changes
        assert_eq!(b.primary_pid(), Some(4242));
        b.detach_primary(4242);
        assert_eq!(b.primary_pid(), None);
        assert_eq!(b.filler_admit(later, MS, false, FILLER), FillerGate::Go);
    }

    #[test]
    fn a_primary_kept_as_if_alone_gambles_on_random_gaps_once_per_budget() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        b.keep_as_if_alone();
        assert!(b.as_if_alone());
        // Random gaps (no period): the prediction is the shortest, 2 ms.
        let mut state = 0x9e37_79b9_u64;
        let mut random_gap = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (2 + (state >> 33) % 8) * MS
        };
        let mut t = 5_000 * MS;
        for k in 0..200 {
            one_kernel_waited_for(b, t);
            let at = t + 200 * US + DEFAULT_HOLDOFF_NS;
            t += 200 * US + random_gap();
            if k == 20 {
                assert!(
                    matches!(
                        b.filler_admit(at, MS, false, FILLER),
                        FillerGate::WaitUntil(_)
                    ),
                    "no credit at first: the primary's latency is not known yet"
                );
            }
        }
        one_kernel_waited_for(b, t);
        let gap = t + 200 * US;
        let at = gap + DEFAULT_HOLDOFF_NS;
        assert_eq!(b.snapshot().gap_period, 0);
        assert_eq!(
            b.filler_admit(at, MS, false, FILLER),
            FillerGate::Go,
            "the budget holds one delayed return: a kernel that fits the prediction goes"
        );
        // The primary came back while that kernel ran: a delayed return.
        let back = at + 300 * US;
        one_kernel_waited_for(b, back);
        assert!(b.delay_credit() < 0.01, "spent: {}", b.delay_credit());
        // A return nobody delayed, once the fillers' queue ran.
        one_kernel_waited_for(b, back + 5 * MS);
        let next_gap = back + 5 * MS + 200 * US;
        assert!(
            matches!(
                b.filler_admit(next_gap + DEFAULT_HOLDOFF_NS, MS, false, FILLER),
                FillerGate::WaitUntil(_)
            ),
            "out of credit, a random gap's prediction vouches for nothing"
        );
        b.set_tolerance(MS);
        assert_eq!(
            b.filler_admit(next_gap + DEFAULT_HOLDOFF_NS, 500 * US, false, FILLER),
            FillerGate::Go,
            "a kernel within the tolerance still goes"
        );
        b.set_tolerance(0);
        // 200 returns from fillable gaps that nobody delayed earn it back.
        let mut t = next_gap + 20 * MS;
        for k in 0..200 {
            one_kernel_waited_for(b, t);
            t += 200 * US + (2 + k % 5) * MS;
        }
        one_kernel_waited_for(b, t);
        assert!(b.delay_credit() >= 1.0, "earned back: {}", b.delay_credit());
        // (After the turn's grace: the turn it had is long over.)
        assert_eq!(
            b.filler_admit(
                t + 200 * US + DEFAULT_HOLDOFF_NS + TURN_GRACE_NS,
                MS,
                false,
                FILLER
            ),
            FillerGate::Go
        );
        // A primary attaching with a latency target is not kept so.
        b.attach_primary(2, 0, DEFAULT_HOLDOFF_NS);
        assert!(!b.as_if_alone());
    }

    #[test]
    fn a_reporting_primary_kept_as_if_alone_spends_its_budget_on_requests_pushed_over() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        b.keep_as_if_alone();
        // Requests delayed within their bound cost nothing.
        for _ in 0..250 {
            b.primary_request_judged(false);
        }
        assert!(b.delay_credit() >= 1.0);
        b.primary_request_judged(true);
        assert!(
            b.delay_credit() < 0.01,
            "one pushed over: {}",
            b.delay_credit()
        );
        // Returns from gaps no longer count: 300 clean ones earn nothing.
        let mut t = 5_000 * MS;
        for k in 0..300 {
            one_kernel_waited_for(b, t);
            t += 200 * US + (2 + k % 7) * MS;
        }
        assert!(
            b.delay_credit() < 0.01,
            "returns counted: {}",
            b.delay_credit()
        );
        // The request pushed over earned its share too: 199 more make 200.
        for _ in 0..198 {
            b.primary_request_judged(false);
        }
        assert!(b.delay_credit() < 1.0, "199 requests are not enough");
        b.primary_request_judged(false);
        assert!(b.delay_credit() >= 1.0, "200 are: {}", b.delay_credit());
    }

    #[test]
    fn tolerance_lets_fillers_into_unpredictable_gaps_and_goes_at_once() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 2 * MS, DEFAULT_HOLDOFF_NS);
        let t = 5_000 * MS;
        b.primary_launch(t, 200 * US);
        b.primary_sync_begin();
        b.primary_sync_end(t + 200 * US);
        let at = t + MS;
        assert_eq!(
            b.filler_admit(at, MS, false, FILLER),
            FillerGate::Go,
            "tolerated"
        );
        b.set_tolerance(0);
        assert!(
            matches!(
                b.filler_admit(at + MS, MS, false, FILLER),
                FillerGate::WaitUntil(_)
            ),
            "taken back: the next launch already waits"
        );
    }

    #[test]
    fn inside_a_request_a_reporting_primary_tolerates_no_filler_kernel() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 2 * MS, DEFAULT_HOLDOFF_NS);
        let t = 5_000 * MS;
        // One request ended and was reported: this primary says where its
        // requests end.
        one_kernel_waited_for(b, t);
        b.primary_request_over(false);
        // The next request's first kernel, then a gap inside it (longer
        // than the hold-off: a slow host between two dependent kernels).
        let next = t + 3 * MS;
        one_kernel_waited_for(b, next);
        let inside = next + 200 * US + 2 * DEFAULT_HOLDOFF_NS;
        assert!(
            matches!(
                b.filler_admit(inside, MS, false, FILLER),
                FillerGate::WaitUntil(_)
            ),
            "each kernel of a request could wait a filler kernel"
        );
        b.primary_request_over(false);
        assert_eq!(
            b.filler_admit(inside, MS, false, FILLER),
            FillerGate::Go,
            "between requests, within the tolerance"
        );
    }

    #[test]
    fn a_switch_between_fillers_is_counted_in_their_queue() {
        let board = board();
        let b = board.device(0);
        let (a, other) = (FILLER, FILLER + 1);
        let t = 5_000 * MS;
        assert_eq!(b.filler_admit(t, MS, false, a), FillerGate::Go);
        let queued = t + MS;
        // Its own next kernel follows without a hand-off.
        let at = queued - QUEUE_LEAD_NS;
        assert_eq!(b.filler_admit(at, MS, false, a), FillerGate::Go);
        let queued = queued + MS;
        // Another filler's kernel behind that work: a hand-off to it, and
        // one back where it preempts the first at its slice's end.
        let at = queued - QUEUE_LEAD_NS;
        assert_eq!(
            b.filler_admit_owed(at, MS, false, other, Owed::Yes),
            FillerGate::Go
        );
        let queued = queued + 2 * HANDOFF_NS + MS;
        assert_eq!(
            b.filler_admit(at, MS, false, a),
            FillerGate::WaitUntil(queued - QUEUE_LEAD_NS),
            "the queue ends after both kernels and the hand-offs"
        );
    }

    #[test]
    fn a_primary_that_went_ahead_of_queued_filler_work_pushes_it_back() {
        for went_ahead in [false, true] {
            let board = board();
            let b = board.device(0);
            // Tolerating a filler kernel: the gap (unknown yet) is open.
            b.attach_primary(1, 2 * MS, DEFAULT_HOLDOFF_NS);
            let t = 5_000 * MS;
            // 2 ms of filler work is queued (no gap learned yet: the
            // primary has not launched) when the primary launches 500 µs.
            assert_eq!(b.filler_admit(t, 2 * MS, false, FILLER), FillerGate::Go);
            let queued = t + 2 * MS;
            let launch = t + 100 * US;
            b.primary_launch(launch, 500 * US);
            b.primary_sync_begin();
            // Behind the fillers' work, its kernel ends a hand-off and its
            // own length after that work; ahead of it, at once.
            let ended = if went_ahead {
                launch + HANDOFF_NS + 500 * US
            } else {
                queued + HANDOFF_NS + 500 * US
            };
            b.primary_sync_end(ended);
            let gate = b.filler_admit(ended + DEFAULT_HOLDOFF_NS, MS, false, FILLER);
            if went_ahead {
                // The fillers' rest runs after it: their queue ends the
                // primary's kernel and two hand-offs later than booked.
                let pushed = queued + 500 * US + 2 * HANDOFF_NS;
                assert_eq!(gate, FillerGate::WaitUntil(pushed - QUEUE_LEAD_NS));
            } else {
                assert_eq!(gate, FillerGate::Go, "their work ran before it: no push");
            }
        }
    }

    #[test]
    fn pushes_never_make_the_fillers_queue_longer_than_their_work_and_two_hand_offs() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let mut now = 5_000 * MS;
        // A filler's 3 ms kernel is queued; the primary then runs 12
        // kernels of 300 µs, each ahead of it (at the slices' ends), 1 ms
        // apart.
        assert_eq!(
            b.filler_admit_owed(now, 3 * MS, false, FILLER, Owed::Overdue),
            FillerGate::Go
        );
        for _ in 0..12 {
            b.primary_launch(now, 300 * US);
            b.primary_sync_begin();
            now += HANDOFF_NS + 300 * US;
            b.primary_sync_end(now);
            let queued = b.fillers_busy_until.0.load(Relaxed).saturating_sub(now);
            assert!(
                queued <= 3 * MS + 2 * HANDOFF_NS,
                "{queued} ns queued behind 3 ms of filler work"
            );
            now += MS;
        }
        // Back to back (a primary with requests queued): each kernel
        // waited for a time slice's end or for the filler kernel's, ran,
        // and the next was launched at once. The filler's work left is
        // never more than that kernel, however many kernels were counted
        // as pushing it.
        let back_to_back = super::tests::board();
        let b = back_to_back.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let mut now = 5_000 * MS;
        assert_eq!(
            b.filler_admit_owed(now, 3 * MS, false, FILLER, Owed::Overdue),
            FillerGate::Go
        );
        for _ in 0..20 {
            b.primary_launch(now, 300 * US);
            b.primary_sync_begin();
            now += 350 * US;
            b.primary_sync_end(now);
            let queued = b.fillers_busy_until.0.load(Relaxed).saturating_sub(now);
            assert!(
                queued <= 3 * MS + 2 * HANDOFF_NS,
                "{queued} ns queued behind 3 ms of filler work"
            );
        }
    }

    #[test]
    fn offline_fillers_yield_to_waiting_online_ones() {
        let board = board();
        let b = board.device(0);
        b.online_waiting(true);
        assert!(matches!(
            b.filler_admit(MS, US, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(b.filler_admit(MS, US, true, ONLINE_FILLER), FillerGate::Go);
        b.online_waiting(false);
        assert_eq!(b.filler_admit(3 * MS, US, false, FILLER), FillerGate::Go);
    }

    /// Filler `a` takes the turn with a 1 ms kernel: returns `a`, another
    /// filler, and when that kernel ends.
    fn a_filler_holds_the_turn(b: &DeviceBoard) -> (u32, u32, u64) {
        let (a, other) = (FILLER, FILLER + 1);
        let t = 1_000 * MS;
        assert_eq!(b.filler_admit(t, MS, false, a), FillerGate::Go);
        (a, other, t + MS)
    }

    #[test]
    fn the_filler_that_ran_last_keeps_the_device_for_its_turn() {
        let board = board();
        let b = board.device(0);
        let (a, other, end) = a_filler_holds_the_turn(b);
        // Near the end of a's kernel, a queues its next; the other filler
        // waits for a's work to end plus the grace, even when it asks first.
        let near = end - QUEUE_LEAD_NS / 2;
        assert_eq!(
            b.filler_admit(near, MS, false, other),
            FillerGate::WaitUntil(end + TURN_GRACE_NS)
        );
        assert_eq!(b.filler_admit(near, MS, false, a), FillerGate::Go);
        // a stops asking (it synchronises): after the grace the other goes
        // and the turn is its own.
        let after = end + MS + TURN_GRACE_NS;
        assert_eq!(b.filler_admit(after, MS, false, other), FillerGate::Go);
        assert!(matches!(
            b.filler_admit(after + MS - QUEUE_LEAD_NS / 2, MS, false, a),
            FillerGate::WaitUntil(_)
        ));
    }

    #[test]
    fn a_filler_waiting_for_its_tokens_hands_its_turn_over_at_once() {
        let board = board();
        let b = board.device(0);
        let (a, other, end) = a_filler_holds_the_turn(b);
        let near = end - QUEUE_LEAD_NS / 2;
        assert!(matches!(
            b.filler_admit(near, MS, false, other),
            FillerGate::WaitUntil(_)
        ));
        // a's next launch must wait for its SM-time tokens: its turn ends,
        // and the other queues behind a's kernel without waiting for a.
        b.end_turn_of(other);
        assert!(
            matches!(
                b.filler_admit(near, MS, false, other),
                FillerGate::WaitUntil(_)
            ),
            "only the holder can end its turn"
        );
        b.end_turn_of(a);
        assert_eq!(b.filler_admit(near, MS, false, other), FillerGate::Go);
    }

    #[test]
    fn a_turn_ends_and_a_lone_filler_loses_at_most_a_grace_per_turn() {
        let shared = board();
        let b = shared.device(0);
        let (a, other) = (FILLER, FILLER + 1);
        let start = 1_000 * MS;
        let mut t = start;
        // a runs back to back until its turn is over.
        while t < start + FILLER_TURN_NS {
            assert_eq!(b.filler_admit(t, MS, false, a), FillerGate::Go, "{t}");
            t += MS;
        }
        // Asking as a's last kernel of its turn ends, the other is told to
        // come back when the turn ends, not after the grace.
        assert_eq!(
            b.filler_admit(t - QUEUE_LEAD_NS / 2, MS, false, other),
            FillerGate::WaitUntil(start + FILLER_TURN_NS)
        );
        // Now the other goes first: a waits for the grace, the other not.
        assert_eq!(
            b.filler_admit(t, MS, false, a),
            FillerGate::WaitUntil(t + TURN_GRACE_NS)
        );
        assert_eq!(b.filler_admit(t, MS, false, other), FillerGate::Go);
        // With nobody else, a filler whose turn ran out waits one grace and
        // then holds a new turn: back to back again.
        let lone = board();
        let b = lone.device(0);
        let mut t = start;
        let mut waited = 0;
        while t < start + 3 * FILLER_TURN_NS {
            match b.filler_admit(t, MS, false, a) {
                FillerGate::Go => t += MS,
                FillerGate::WaitUntil(at) => {
                    waited += 1;
                    assert_eq!(at, t + TURN_GRACE_NS);
                    t = at;
                }
                FillerGate::Fallback => unreachable!(),
            }
        }
        assert_eq!(waited, 2, "one grace per turn after the first");
    }

    /// `iterations` of a loop whose gaps are `phases`, each scaled by a
    /// deterministic ±5% noise (sleep and scheduling on a loaded host).
    fn noisy_loop(phases: &[u64], iterations: usize) -> Vec<u64> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut gaps = Vec::new();
        for _ in 0..iterations {
            for &gap in phases {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let noise = (state % 101) as i64 - 50; // -50..=50 per mille
                gaps.push((gap as i64 + gap as i64 * noise / 1000) as u64);
            }
        }
        gaps
    }

    #[test]
    fn alike_gaps_are_predicted_by_the_shortest_recent_one() {
        let gaps = noisy_loop(&[3 * MS], 12);
        let p = predict_gap(&gaps);
        assert_eq!(p.period, 1);
        assert_eq!(
            p.length_ns,
            *gaps[gaps.len() - RING..].iter().min().unwrap()
        );
        assert_eq!(
            predict_gap(&gaps[..1]).length_ns,
            0,
            "one gap is no history"
        );
        assert_eq!(
            predict_gap(&gaps[..2]).length_ns,
            gaps[..2].iter().copied().min().unwrap()
        );
    }

    #[test]
    fn gaps_of_a_repeating_iteration_are_predicted_per_phase() {
        // Data loading 4 ms, then an all-reduce 1 ms, every iteration.
        let gaps = noisy_loop(&[4 * MS, MS], 8);
        // After a 1 ms gap comes a 4 ms one, and the other way round.
        let after_short = predict_gap(&gaps);
        assert_eq!(after_short.period, 2);
        assert!(
            (3_800 * US..=4 * MS).contains(&after_short.length_ns),
            "{after_short:?}"
        );
        let after_long = predict_gap(&gaps[..gaps.len() - 1]);
        assert_eq!(after_long.period, 2);
        assert!(
            (950 * US..=MS).contains(&after_long.length_ns),
            "{after_long:?}"
        );
        // The shortest-gap rule would have said 1 ms for both.
        // Three phases: 1, 5, 2 ms.
        let gaps = noisy_loop(&[MS, 5 * MS, 2 * MS], 5);
        for (cut, expect) in [(0, MS), (1, 2 * MS), (2, 5 * MS)] {
            let p = predict_gap(&gaps[..gaps.len() - cut]);
            assert_eq!(p.period, 3, "cut {cut}: {p:?}");
            assert!(
                p.length_ns <= expect && p.length_ns >= expect * 94 / 100,
                "cut {cut}: {p:?}"
            );
        }
        // Too little history for the period yet: the cautious rule.
        let early = predict_gap(&gaps[..6]);
        assert_eq!(
            (early.period, early.length_ns),
            (0, *gaps[..6].iter().min().unwrap())
        );
    }

    #[test]
    fn one_outlier_gap_does_not_lose_the_period() {
        let mut gaps = noisy_loop(&[4 * MS, MS], 8);
        let at = gaps.len() - 5;
        gaps[at] *= 3; // a slow data load
        assert_eq!(predict_gap(&gaps).period, 2);
    }

    #[test]
    fn random_gaps_keep_the_cautious_rule() {
        // Exponential gaps (Poisson arrivals, mean 5 ms).
        let mut state = 7u64;
        let gaps: Vec<u64> = (0..2_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let uniform = ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                (-uniform.ln() * 5e6) as u64 + 200 * US
            })
            .collect();
        let mut bolder = 0;
        for n in HISTORY..gaps.len() {
            let recent = &gaps[n - HISTORY..n];
            let shortest = *recent[HISTORY - RING..].iter().min().unwrap();
            if predict_gap(recent).length_ns > shortest {
                bolder += 1;
            }
        }
        assert!(bolder * 100 < gaps.len(), "{bolder} bolder predictions");
    }

    #[test]
    fn a_filler_fills_each_phase_of_a_repeating_iteration() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        // Each phase: 2 ms of work, then its gap (4 ms, then 1 ms).
        let mut t = 1_000 * MS;
        let phase = |t: &mut u64, gap: u64| {
            b.primary_launch(*t, 2 * MS);
            b.primary_sync_begin();
            b.primary_sync_end(*t + 2 * MS);
            *t += 2 * MS + gap;
        };
        for _ in 0..8 {
            phase(&mut t, 4 * MS);
            phase(&mut t, MS);
        }
        // The primary's next gap is a 4 ms one.
        b.primary_launch(t, 2 * MS);
        b.primary_sync_begin();
        let gap = t + 2 * MS;
        b.primary_sync_end(gap);
        let s = b.snapshot();
        assert_eq!((s.gap_period, s.predicted_gap_ns), (2, 4 * MS));
        // 1 ms filler kernels: three fit after the hold-off (the shortest
        // gap, 1 ms, would have let none in).
        let mut at = gap + DEFAULT_HOLDOFF_NS;
        for _ in 0..3 {
            assert_eq!(b.filler_admit(at, MS, false, FILLER), FillerGate::Go);
            at += MS;
        }
        assert!(matches!(
            b.filler_admit(at, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        // Owed its guarantee, even overdue, it still waits: a gap it fits
        // comes every iteration.
        for owed in [Owed::Yes, Owed::Overdue] {
            assert!(matches!(
                b.filler_admit_owed(at, MS, false, FILLER, owed),
                FillerGate::WaitUntil(_)
            ));
        }
    }

    /// (Where gaps repeat and one fits, an owed filler waits for it: the
    /// test of per-phase prediction above.)
    #[test]
    fn an_owed_filler_goes_into_random_gaps_it_does_not_fit() {
        let board = board();
        let b = board.device(0);
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        // Gaps of 1 to 13 ms in no order: no period; shortest 1 ms.
        let mut t = 1_000 * MS;
        for gap in [7, 1, 13, 3, 9, 2, 11, 5, 8, 1, 12, 4].map(|g| g * MS) {
            b.primary_launch(t, MS);
            b.primary_sync_begin();
            b.primary_sync_end(t + MS);
            t += MS + gap;
        }
        b.primary_launch(t, MS);
        b.primary_sync_begin();
        let gap = t + MS;
        b.primary_sync_end(gap);
        assert_eq!(b.snapshot().gap_period, 0);
        let at = gap + DEFAULT_HOLDOFF_NS;
        assert!(matches!(
            b.filler_admit(at, 2 * MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(
            b.filler_admit_owed(at, 2 * MS, false, FILLER, Owed::Yes),
            FillerGate::Fallback
        );
    }

    proptest! {
        /// Whatever the gaps: a prediction is one of the recent gaps, and a
        /// period no longer than the longest looked for.
        #[test]
        fn a_prediction_is_a_gap_that_was_seen(
            gaps in proptest::collection::vec(1u64..50_000_000, 0..HISTORY + 1),
        ) {
            let p = predict_gap(&gaps);
            prop_assert!(p.period <= MAX_PERIOD);
            if gaps.len() >= 2 {
                prop_assert!(gaps.contains(&p.length_ns));
            } else {
                prop_assert_eq!(p.length_ns, 0);
            }
        }

        /// Whatever fillers of whatever kernel lengths ask, whenever: when
        /// the primary comes back, the filler work queued ahead of it is at
        /// most one filler kernel plus the queue lead (and the primary's
        /// own kernels it went ahead of that work with).
        #[test]
        fn a_returning_primary_finds_at_most_one_filler_kernel(
            kernels in proptest::collection::vec(10u64..3_000, 1..4),
            asks in proptest::collection::vec((0usize..4, 0u64..20_000, 0u8..3), 1..300),
            returns in proptest::collection::vec(0u64..20_000, 1..20),
            tolerance in 0u64..4_000,
        ) {
            let board = board();
            let b = board.device(0);
            b.attach_primary(1, tolerance * US, DEFAULT_HOLDOFF_NS);
            let longest = kernels.iter().max().unwrap() * US;
            // (time, a filler's ask: (filler, kernel, how it stands against
            // its guarantee), or the primary returning)
            type Ask = (u32, u64, u8);
            let mut events: Vec<(u64, Option<Ask>)> =
                asks.iter().map(|&(k, t, owed)| {
                    let k = k % kernels.len();
                    (t * US, Some((k as u32 + 1, kernels[k] * US, owed)))
                }).collect();
            events.extend(returns.iter().map(|&t| (t * US, None)));
            events.sort();
            let base = 1_000 * MS;
            // Returns into queued filler work, each of which pushed that
            // work back by its kernel and two hand-offs (it went ahead:
            // its synchronisation came at once).
            let mut pushes = 0;
            for (t, ask) in events {
                let now = base + t;
                match ask {
                    // Fillers owed their guarantee too: they skip the fit,
                    // never the queue.
                    Some((filler, est, 0)) => { let _ = b.filler_admit(now, est, false, filler); }
                    Some((filler, est, 1)) => { let _ = b.filler_admit_owed(now, est, false, filler, Owed::Yes); }
                    Some((filler, est, _)) => { let _ = b.filler_admit_owed(now, est, false, filler, Owed::Overdue); }
                    None => {
                        let queued = b.fillers_busy_until.0.load(Relaxed).saturating_sub(now);
                        if queued == 0 {
                            pushes = 0;
                        }
                        let pushed = pushes * (200 * US + 2 * HANDOFF_NS);
                        // Hand-offs between fillers are counted in their
                        // queue (two where one's kernel may preempt
                        // another's).
                        prop_assert!(
                            queued <= longest + QUEUE_LEAD_NS + 2 * HANDOFF_NS + pushed,
                            "{queued} queued"
                        );
                        if queued > 0 {
                            pushes += 1;
                        }
                        b.primary_launch(now, 200 * US);
                        b.primary_sync_begin();
                        b.primary_sync_end(now + 200 * US);
                    }
                }
            }
        }
    }
}
