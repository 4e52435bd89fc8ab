//! The primary's side of the board: attaching, publishing its launches and
//! synchronisations, learning its fillable gaps, its tolerance, and the
//! budget of returns from a gap fillers may delay while it is kept as if
//! alone (no latency target).

use crate::board::Board;
use crate::gap_prediction::{predict_gap, record_in_ring};
use crate::timing::*;
use dilu_layout::colocation::RING;
use std::sync::atomic::Ordering::*;

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
pub(crate) const DELAY_CREDIT_CAP: i64 = 1_000_000;

/// The least credit at which fillers still spend the risk ration: the
/// ration is a model of the primary's tail; requests actually pushed over
/// its bound beyond the budget by more than the count's noise stop it until
/// they are paid for. (Stopped one request beyond it, the ration was off
/// for 38% of a run of a Poisson primary on simgpu whose fillers pushed 6
/// of 988 requests over the bound against a budget of 4.9, and left its
/// p99 at 0.99x alone.)
pub(crate) const RATION_CREDIT_FLOOR: i64 = -3 * DELAY_CREDIT_CAP;

/// The least credit: delays that no gamble of the fillers caused (a kernel
/// within the tolerance that ran longer than its estimate, a filler's set
/// guarantee) cannot ban gambles for ever.
const DELAY_CREDIT_FLOOR: i64 = -5 * DELAY_CREDIT_CAP;

/// How many fillable gaps in a row, each begun at a synchronisation, make
/// the next one fillable at once
/// ([`Board::synced_gap_opens_at_once`](crate::Board)).
/// A loop with one synchronisation inside its iteration (a loss read back
/// before the optimiser's launches) breaks the row at every iteration.
pub const SYNCED_GAPS_TRUSTED: u64 = 32;

/// What a primary kept as if alone has left of its budget of requests that
/// fillers may push over its bound, from the board's credit
/// (`BoardSnapshot::delay_credit_ppm`), as the node manager reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DelayBudget {
    /// Requests fillers may still push over (negative: overdrawn).
    pub requests_left: f64,
    /// Requests pushed over beyond the budget stopped the risk ration:
    /// filler kernels beyond the tolerance wait until it is earned back.
    pub ration_stopped: bool,
}

/// The budget that the board's credit `credit_ppm` stands for.
pub fn delay_budget(credit_ppm: i64) -> DelayBudget {
    DelayBudget {
        requests_left: credit_ppm as f64 / DELAY_CREDIT_CAP as f64,
        ration_stopped: credit_ppm < RATION_CREDIT_FLOOR,
    }
}

/// A gap of the primary's that its launch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapEnded {
    /// When it began (the primary's last synchronisation returned, or its
    /// work was estimated to end).
    pub start_ns: u64,
    pub length_ns: u64,
    /// The delay the launch was counted behind filler work (and the
    /// hand-off back).
    pub delay_ns: u64,
    /// It began when a synchronisation returned: the program had waited
    /// for its work, as a server does to read a request's result. A gap
    /// in which the primary's queue merely ran dry (its host slower than
    /// the device, between two launches of one request) is not.
    pub synced: bool,
}

impl Board<'_> {
    /// Primary side, once at start: it is present, with its tolerance and
    /// hold-off.
    pub fn attach_primary(&self, pid: u32, tolerance_ns: u64, holdoff_ns: u64) {
        self.params.tolerance_ns.store(tolerance_ns, Relaxed);
        self.params.holdoff_ns.store(holdoff_ns, Relaxed);
        // A primary with a latency target, until it says otherwise.
        self.params.as_if_alone.store(0, Relaxed);
        self.params.synchronises.store(0, Relaxed);
        self.params.synced_gaps_fillable.store(0, Relaxed);
        self.params
            .filled_at_attach
            .store(self.filler_stats.filled_ns.load(Relaxed), Relaxed);
        self.params.primary_pid.store(pid as u64, Relaxed);
        self.params.primary_present.store(1, Release);
    }

    /// Whether a fillable gap of the primary's began at a synchronisation:
    /// until one does, it may wait for its work through calls dilu does not
    /// see (a blocking copy), and any gap may be the end of a request.
    #[inline]
    pub fn primary_synchronises(&self) -> bool {
        self.params.synchronises.load(Relaxed) != 0
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
    /// filler's side reads [`Board::as_if_alone`](crate::Board::as_if_alone)), and go into a gap
    /// no prediction vouches for (a random gap's predicted length, or a
    /// long idle stretch) only while the primary's budget of delayed
    /// returns ([`DELAY_BUDGET_PPM`]) holds one whole return: it starts
    /// with none (its own latency is not known yet, and the first requests
    /// count in its p99 like any), and earns one over 200 fillable gaps or
    /// reported requests.
    pub fn keep_as_if_alone(&self) {
        self.params.delay_credit.store(0, Relaxed);
        self.params.credit_by_requests.store(0, Relaxed);
        self.forget_ration();
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
        self.count_judged(pushed_over);
    }

    /// Counts one request (or return) judged against the bound, for the
    /// node manager's status: how often fillers pushed one over.
    fn count_judged(&self, pushed_over: bool) {
        self.primary_stats.judged.fetch_add(1, Relaxed);
        if pushed_over {
            self.primary_stats.pushed_over.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn add_credit(&self, earned: i64, spent: i64) {
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
    pub(crate) fn count_return(&self, length_ns: u64, delay_ns: u64) {
        if self.params.credit_by_requests.load(Relaxed) != 0 {
            return;
        }
        // Filler work queued before the primary attached (a filler that was
        // there first) is met once, as on any busy device, and no gamble
        // of the board's: charged, a filler of 300 µs kernels 32 deep,
        // estimated 2 ms each until measured, cost a Poisson server's first
        // returns up to five whole ones, and the ration stayed shut for
        // most of a 6 s run on simgpu (one run in ten).
        let risked =
            self.filler_stats.filled_ns.load(Relaxed) != self.params.filled_at_attach.load(Relaxed);
        let delayed = risked && delay_ns > self.params.tolerance_ns.load(Relaxed);
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
            self.count_judged(delayed);
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
    /// expected end. Returns the gap this launch ended, if it was idle.
    #[inline]
    pub fn primary_launch(&self, now: u64, est_ns: u64) -> Option<GapEnded> {
        let busy_until = self.primary_busy_until.0.load(Relaxed);
        let queued = self.fillers_busy_until.0.load(Acquire);
        let mut ended = None;
        if busy_until <= now {
            // It was idle: a gap ends here.
            let synced = self.gap_start.0.swap(0, AcqRel);
            let start = if synced != 0 { synced } else { busy_until };
            let length = now.saturating_sub(start);
            if start != 0 && length > 0 {
                if synced != 0 {
                    self.synced_gap_ended(length);
                }
                self.gap_ended(length, synced != 0);
                // Between requests fillers go at once, so the gaps shorter
                // than the hold-off there are returns they risk meeting
                // too (left out, gaps of a steady random 4 ms on average
                // looked 0.6 times as likely to end within 0.4 ms of a
                // request as they were).
                let between_requests = synced != 0 && self.request_over.0.load(Acquire) == synced;
                if between_requests && length < self.params.holdoff_ns.load(Relaxed) {
                    self.record_gap_length(length);
                }
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
            if start != 0 {
                ended = Some(GapEnded {
                    start_ns: start,
                    length_ns: length,
                    delay_ns: delay,
                    synced: synced != 0,
                });
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
                Ok(_) => return ended,
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
            // within the lead of its end, or behind a deeper queue counted
            // in the reservation) and the hand-off back: pushes
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

    /// A fillable gap of `length_ns` ended (`synced`: it began at a
    /// synchronisation). Only such gaps go into the lengths a risky
    /// kernel is priced by: fillers take that risk only after one (see
    /// `filler_admit`); where the queue ran dry inside a request, they wait.
    /// The first says the primary synchronises through calls dilu sees.
    #[cold]
    pub(crate) fn gap_ended(&self, length_ns: u64, synced: bool) {
        if length_ns < self.params.holdoff_ns.load(Relaxed) {
            return;
        }
        self.primary_stats.gaps_seen.fetch_add(1, Relaxed);
        if synced {
            self.record_gap_length(length_ns);
            if self.params.synchronises.load(Relaxed) == 0 {
                self.params.synchronises.store(1, Relaxed);
            }
        }
        self.primary_stats.gap_ns.fetch_add(length_ns, Relaxed);
        let (recent, known) = record_in_ring(&self.history.ring, &self.history.next, length_ns);
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
        p.longest_vouched_ns
            .store(prediction.longest_vouched_ns, Relaxed);
    }

    /// A gap that began at a synchronisation ended after `length_ns`: one
    /// more fillable in a row, or the row broken.
    fn synced_gap_ended(&self, length_ns: u64) {
        let fillable = &self.params.synced_gaps_fillable;
        if length_ns >= self.params.holdoff_ns.load(Relaxed) {
            if fillable.load(Relaxed) < SYNCED_GAPS_TRUSTED {
                fillable.fetch_add(1, Relaxed);
            }
        } else if fillable.load(Relaxed) != 0 {
            fillable.store(0, Relaxed);
        }
    }

    /// Whether a gap that begins at a synchronisation of this primary is
    /// fillable at once: its gaps repeat, and its last
    /// [`SYNCED_GAPS_TRUSTED`] synchronisations each began a gap of at
    /// least the hold-off (a loop that synchronises once per iteration,
    /// before its data or its all-reduce). The hold-off tells a gap from
    /// the host's time between dependent launches; after such a
    /// synchronisation the loop's host has nothing to launch.
    pub(crate) fn synced_gap_opens_at_once(&self) -> bool {
        self.params.synced_gaps_fillable.load(Relaxed) >= SYNCED_GAPS_TRUSTED
            && self.predictor.period.load(Relaxed) != 0
    }

    /// Undoes `push` of the fillers' queue end (not before `now`).
    pub(crate) fn take_back_push(&self, push: u64, now: u64) {
        if push > 0 {
            let _ = self
                .fillers_busy_until
                .0
                .fetch_update(AcqRel, Acquire, |at| Some(at.saturating_sub(push).max(now)));
        }
    }
}
