//! The **gap board** a co-location primary and its fillers share on each
//! device of a GPU group: its memory, as every process maps it. What the
//! primary and the fillers do with it (gap prediction, filler admission and
//! turns, claims, sample holds, the as-if-alone primary's delay budget) is
//! the `dilu-colocation` crate's; this module holds the words, who writes
//! each, and the counters status reads ([`DeviceBoard::snapshot`]).

use crate::MAX_DEVICES;
use crate::bucket::CacheLine;
use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU64, Ordering::*};

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

/// Kernel lengths at which an as-if-alone primary publishes what a filler
/// kernel costs its tail ([`RiskRation::cost_ns`]): the first
/// [`RATION_FIRST_NS`], each next twice the one before.
pub const RATION_POINTS: usize = 10;

/// The shortest kernel length of the ration's table (25 µs; the longest is
/// 25 µs × 2⁹, 12.8 ms).
pub const RATION_FIRST_NS: u64 = 25_000;

/// Length classes of the primary's gap lengths ([`GapLengths`]): the first
/// ends at [`GAP_CLASS_FIRST_NS`], each next √2 times longer (the last
/// about 110 s, and holds every longer gap).
pub const GAP_CLASSES: usize = 40;

/// Where the first gap-length class ends (100 µs).
pub const GAP_CLASS_FIRST_NS: u64 = 100_000;

/// The co-location state of one device.
#[repr(C)]
pub struct DeviceBoard {
    /// Estimated end of the primary's queued work (CLOCK_MONOTONIC ns).
    pub primary_busy_until: CacheLine,
    /// Primary threads inside a synchronisation (their work is in flight).
    pub primary_syncing: CacheLine,
    /// When the primary's current gap began (its last synchronisation
    /// returned); 0 while it has launched since.
    pub gap_start: CacheLine,
    /// The `gap_start` of a gap the primary said ends a request (it
    /// reported the request's latency): that gap opens to fillers at once,
    /// without the hold-off.
    pub request_over: CacheLine,
    /// Estimated end of the fillers' queued work: one reservation at a time.
    pub fillers_busy_until: CacheLine,
    /// The filler that reserved last (its id; 0: none yet): a reservation
    /// by another one costs the device a hand-off between processes.
    pub last_reserver: CacheLine,
    /// The device time the last reservation added to the fillers' queue
    /// (its kernel and any switch), and any queue ahead of it deeper than
    /// the usual lead: the most filler work that can be left once the
    /// primary's own work is done.
    pub last_reservation: CacheLine,
    /// Device time the primary's launches since its last synchronisation
    /// added to the fillers' queue, until that synchronisation tells
    /// whether they went ahead of it.
    pub provisional_push: CacheLine,
    /// The fillers' queued work when the first of those launches came.
    pub pushed_backlog: CacheLine,
    /// Online fillers (with an SLO) waiting for a gap: offline ones yield.
    pub online_waiting: CacheLine,
    /// A filler owed its guarantee waiting for the opening of a gap it can
    /// use: the others leave that opening to it.
    pub opening_claim: OpeningClaim,
    /// A filler timing a long kernel holds the primary's launches.
    pub sample_hold: SampleHold,
    /// Which filler has the device's filler work, and since when.
    pub turn: FillerTurn,
    /// Written by the primary's configuration (and its latency reports).
    pub params: Params,
    /// The as-if-alone primary's risk ration: what each filler kernel
    /// costs its tail, and the fillers' use of it.
    pub ration: RiskRation,
    /// Written once per fillable gap by the primary.
    pub predictor: Predictor,
    pub history: GapHistory,
    /// How long the primary's recent gaps lasted, by length class (written
    /// by the primary, read by fillers weighing a risky kernel).
    pub gap_lengths: GapLengths,
    /// Counters each side writes on its own cache line (relaxed adds), so
    /// a filler's launch never contends with the primary's.
    pub primary_stats: PrimaryStats,
    pub filler_stats: FillerStats,
}

#[repr(C, align(64))]
pub struct Params {
    /// Delay of one filler kernel the primary accepts (0: none).
    pub tolerance_ns: AtomicU64,
    pub holdoff_ns: AtomicU64,
    /// Whether a primary is attached (0: no primary, fillers go freely).
    pub primary_present: AtomicU64,
    /// The attached primary's process id (0: unknown), so that fillers can
    /// tell when it is gone.
    pub primary_pid: AtomicU64,
    /// The `gap_start` of a gap after a reported request that had waited
    /// behind the one before it: the next may be waiting too, so that gap
    /// opens only after the hold-off.
    pub request_queued: AtomicU64,
    /// 1 while the attached primary has no latency target (no SLO): it is
    /// kept as if alone (`Board::keep_as_if_alone` (dilu-colocation)).
    pub as_if_alone: AtomicU64,
    /// The as-if-alone primary's budget of returns from a gap delayed
    /// beyond its tolerance, in millionths of one such return (an `i64`'s
    /// bits): `DELAY_BUDGET_PPM` (dilu-colocation) more per fillable gap, one whole return
    /// less per delayed one. Fillers may go where no prediction vouches
    /// for the gap only while it could pay for one more delayed return.
    pub delay_credit: AtomicU64,
    /// 1 once the as-if-alone primary judges its reported requests itself
    /// (`Board::primary_request_judged` (dilu-colocation)): its returns from gaps are
    /// then no longer counted.
    pub credit_by_requests: AtomicU64,
    /// 1 once a fillable gap of the primary's began at a synchronisation
    /// (0: none yet; it may wait for its work through calls dilu does not
    /// see, such as a blocking copy, so any gap may end a request).
    pub synchronises: AtomicU64,
    /// The fillers' admitted work (`FillerStats::filled_ns`) when the
    /// primary attached: until more is admitted, the filler work a return
    /// finds ahead was queued before the primary came, not risked beside
    /// it.
    pub filled_at_attach: AtomicU64,
    /// How many of the primary's gaps that began at a synchronisation were
    /// fillable (at least the hold-off) in a row: 0 after one that was not.
    pub synced_gaps_fillable: AtomicU64,
}

/// How much of the risk of pushing an as-if-alone primary's requests over
/// its bound fillers may take (the policy is `ration` in dilu-colocation).
#[repr(C, align(64))]
pub struct RiskRation {
    /// What one filler kernel of each table length costs, in ns of the
    /// ration's wall-time rate (written by the primary at its reports).
    pub cost_ns: [AtomicU64; RATION_POINTS],
    /// 1 once `cost_ns` holds a table (0: none yet, no kernel is rationed).
    pub known: AtomicU64,
    /// The fillers' use: the instant up to which the ration is spent (a
    /// generic cell rate's theoretical arrival time; written by fillers).
    pub spent_until_ns: CacheLine,
}

/// The filler whose kernels the device ran last: the others let it go on
/// for `FILLER_TURN_NS` (dilu-colocation) (written by the filler that reserves). The two
/// words are written one after the other; a filler that reads them
/// between the two writes misjudges one launch's priority, nothing more.
#[repr(C, align(64))]
pub struct FillerTurn {
    /// The holder's id (its process id; 0: none yet).
    pub owner: AtomicU64,
    /// When its turn began.
    pub began_ns: AtomicU64,
}

/// The claim of a filler owed its guarantee on the next opening of a gap
/// its kernel can use (one it fits from its start, or for a kernel longer
/// than every gap, a long one: there it overruns least). Without it, the
/// filler whose kernels fit the most gaps keeps the turn and the others
/// fall below their guarantees (a filler of 1.5 ms kernels beside one of
/// 0.6 ms, both guaranteed 20%, got 14.0% and 15.6% in two 8 s runs of
/// the three-gap training shape; 19.9% with claims).
#[repr(C, align(64))]
pub struct OpeningClaim {
    /// The claimant's process id in the high half, when it last asked in
    /// the low (`claim_word` in dilu-colocation); 0: none.
    pub word: AtomicU64,
    /// The claimant's kernel estimate.
    pub est_ns: AtomicU64,
}

/// A filler's hold on the primary's launches while one of its long
/// kernels is timed (`Board::post_sample_hold` (dilu-colocation)).
#[repr(C, align(64))]
pub struct SampleHold {
    /// The holder's id in the high half and when the hold lapses in the
    /// low (`hold_word` in dilu-colocation); 0: none. One word, so that a primary never
    /// sees a holder without its deadline.
    pub word: AtomicU64,
    /// The earliest instant the next hold may be posted.
    pub next_at_ns: AtomicU64,
}

/// What fillers read: written by the primary once per fillable gap.
#[repr(C, align(64))]
pub struct Predictor {
    /// The next gap's predicted length (0: not enough history yet).
    pub predicted_ns: AtomicU64,
    /// Longest of the last [`RING`] gaps.
    pub longest_ns: AtomicU64,
    /// Gaps per iteration when a period was detected (0: none).
    pub period: AtomicU64,
    /// Gaps remembered (up to [`HISTORY`]).
    pub known: AtomicU64,
    /// The longest gap the prediction vouches for within the next period
    /// (the longest of its positions' predictions; without a period, the
    /// next gap's).
    pub longest_vouched_ns: AtomicU64,
}

/// The primary's recent fillable gaps (its own, rarely written).
#[repr(C, align(64))]
pub struct GapHistory {
    pub ring: [AtomicU64; HISTORY],
    /// Gaps recorded so far; the next goes to `next % HISTORY`.
    pub next: AtomicU64,
}

/// The primary's recent gaps by length, each class's count in
/// units of [`GAP_WEIGHT`] per gap, all halved whenever the total passes
/// twice [`GAP_LENGTHS_REMEMBERED`] gaps (older gaps fade).
#[repr(C, align(64))]
pub struct GapLengths {
    /// Class `j` holds gaps shorter than `GAP_CLASS_FIRST_NS · √2^j` (and
    /// not in an earlier class); the last class holds every longer gap.
    pub weight: [AtomicU64; GAP_CLASSES],
    /// The sum of `weight`.
    pub total: AtomicU64,
}

/// One gap's weight when it is recorded.
pub const GAP_WEIGHT: u64 = 1 << 16;

/// About how many gaps [`GapLengths`] remembers (between this and twice it).
pub const GAP_LENGTHS_REMEMBERED: u64 = 1024;

/// Written by the primary only.
#[repr(C, align(64))]
pub struct PrimaryStats {
    /// Fillable gaps (at least the hold-off long) and their total length.
    pub gaps_seen: AtomicU64,
    pub gap_ns: AtomicU64,
    /// Filler work (estimated) still queued when the primary came back from
    /// a gap, and the hand-off back to it: what it waited for, at most.
    pub primary_delay_ns: AtomicU64,
    /// The primary's own estimated kernel time.
    pub primary_busy_ns: AtomicU64,
    /// A primary kept as if alone: its requests (or, where it reports none,
    /// its returns from fillable gaps) judged against its bound, and those
    /// fillers pushed over it (returns: delayed beyond its tolerance).
    pub judged: AtomicU64,
    pub pushed_over: AtomicU64,
}

/// Written by fillers only.
#[repr(C, align(64))]
pub struct FillerStats {
    /// Estimated kernel time fillers launched while a primary was attached.
    pub filled_ns: AtomicU64,
    pub fallbacks: AtomicU64,
    pub filler_held: AtomicU64,
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
    const MAGIC: u64 = 0x6469_6c75_4741_0011; // "diluGA" v17 (v17: fillable synchronised gaps in a row)
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

impl GapBoard {
    pub fn device(&self, device: usize) -> &DeviceBoard {
        &self.devices[device.min(MAX_DEVICES - 1)]
    }
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
    /// The primary has no latency target: it is kept as if alone.
    pub as_if_alone: bool,
    /// Its budget of requests fillers may still push over its bound, in
    /// millionths of one (negative: overdrawn).
    pub delay_credit_ppm: i64,
    pub judged: u64,
    pub pushed_over: u64,
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
            as_if_alone: self.params.as_if_alone.load(Relaxed) != 0,
            delay_credit_ppm: self.params.delay_credit.load(Relaxed) as i64,
            judged: self.primary_stats.judged.load(Relaxed),
            pushed_over: self.primary_stats.pushed_over.load(Relaxed),
        }
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
}
