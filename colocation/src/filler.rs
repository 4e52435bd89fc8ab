//! The fillers' side of the board: whether a filler's launch may go now
//! (into a gap it fits, or as the one owed its guarantee), the turn that
//! keeps the device with one filler for a while, and the claim on the next
//! opening of a gap by a filler owed its share.

use crate::board::Board;
use crate::gap_prediction::agree;
use crate::primary::{DELAY_BUDGET_PPM, DELAY_CREDIT_CAP, RATION_CREDIT_FLOOR};
use crate::ration::RATION_DEPTH_NS;
use crate::timing::*;
use std::sync::atomic::Ordering::*;

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

/// How many of a filler's kernels following one that opens a run the risk
/// ration must also afford before that one goes (it spends only its own
/// cost). Paced one kernel at a time, each kernel paid the hand-off to the
/// filler: beside a Poisson primary at 51 req/s on simgpu a filler of
/// 0.15 ms kernels paid 0.86 ms of ration for each, 0.27 ms following its
/// own, and kept 17% of the idle time (in runs, 33%, the p99 alike: the
/// medians of eight runs each).
pub const RATION_RUN_KERNELS: u64 = 8;

/// The most of a request (in ppm) that one kernel dearer than the full
/// ration may be expected to push over the primary's bound: a tenth.
pub const OVER_DEPTH_PUSHES_PPM: u128 = 100_000;

/// What the risk ration says to a kernel beyond the tolerance.
enum Rationed {
    /// No ration applies (a primary with a latency target, no table yet,
    /// or requests pushed over the bound beyond the budget).
    No,
    /// It affords the kernel now, at this cost.
    Now(u64),
    /// It affords it at this instant.
    At(u64),
}

/// The claim word of `filler` at `now`: its id and a coarse time (65.5 µs
/// units, wrapping), so that a claim nobody renews expires.
pub(crate) fn claim_word(filler: u32, now: u64) -> u64 {
    (u64::from(filler) << 32) | ((now >> 16) & 0xFFFF_FFFF)
}

/// The live claimant in `word` at `now`, if any.
pub(crate) fn claimant(word: u64, now: u64) -> Option<u32> {
    let filler = (word >> 32) as u32;
    let age = (((now >> 16) as u32).wrapping_sub(word as u32) as u64) << 16;
    (filler != 0 && age <= CLAIM_LIFE_NS).then_some(filler)
}

impl Board<'_> {
    /// Filler side: may a kernel of `est_ns` go at `now`? `online`: the
    /// filler has an SLO (it goes before offline fillers); `filler`: its id
    /// (the process id: the device hands over between processes). On
    /// [`FillerGate::Go`] (or [`FillerGate::Fallback`]) the launch has been
    /// reserved: the board counts it as queued filler work. A filler behind
    /// its guaranteed share asks
    /// with [`Board::filler_admit_owed`](crate::Board::filler_admit_owed).
    #[inline]
    pub fn filler_admit(&self, now: u64, est_ns: u64, online: bool, filler: u32) -> FillerGate {
        self.filler_admit_owed(now, est_ns, online, filler, Owed::No)
    }

    /// [`Board::filler_admit`](crate::Board::filler_admit) for a filler that has had less than its
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
        self.filler_admit_led(now, est_ns, online, filler, owed, QUEUE_LEAD_NS)
    }

    /// [`Board::filler_admit_owed`](crate::Board::filler_admit_owed) for a
    /// filler that wakes `lead_ns` late (its own measure, clamped to
    /// [`QUEUE_LEAD_NS`]..=[`MAX_QUEUE_LEAD_NS`]): it may queue that far
    /// ahead of its queued work's end, beyond [`QUEUE_LEAD_NS`] only where
    /// no primary is attached, or where the returning primary would find
    /// the whole queue gone before its predicted return or would wait for
    /// no more of it than it tolerates.
    #[inline]
    pub fn filler_admit_led(
        &self,
        now: u64,
        est_ns: u64,
        online: bool,
        filler: u32,
        owed: Owed,
        lead_ns: u64,
    ) -> FillerGate {
        let present = self.params.primary_present.load(Acquire) != 0;
        if !online && self.online_waiting.0.load(Relaxed) > 0 {
            return FillerGate::WaitUntil(now + POLL_NS);
        }
        let queued = self.fillers_busy_until.0.load(Acquire);
        let lead = lead_ns.clamp(QUEUE_LEAD_NS, MAX_QUEUE_LEAD_NS);
        // Woken `lead` before its queue ends, a filler that wakes late
        // queues as much again beyond the usual lead: one wake-up per
        // `lead` of its work rather than one per kernel (on a busy host
        // each wake-up may come milliseconds late).
        let depth = (2 * lead).saturating_sub(QUEUE_LEAD_NS);
        if queued > now + depth {
            return FillerGate::WaitUntil(queued - lead);
        }
        // How long this kernel waits behind the fillers' queued work.
        let ahead = queued.saturating_sub(now);
        let mut gate = FillerGate::Go;
        // When the current gap opened to fillers (0: no primary).
        let mut opens = 0;
        // What this launch costs the risk ration (0: it goes without it).
        let mut rationed = 0;
        // A filler owed its guarantee goes ahead of the turn (and leaves it
        // with its holder): guarantees before turns.
        let owed_now = owed != Owed::No;
        if present {
            let busy_until = self.primary_busy_until.0.load(Acquire);
            if self.primary_syncing.0.load(Acquire) > 0 {
                // (Looking every 20 µs once its work is estimated done
                // starts fillers about 30 µs sooner after a training
                // loop's synchronisations, but wakes them on the CPUs the
                // primary's threads wake to; not shown to pay on a
                // 2-core host.)
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
            // A repeating primary whose synchronisations all began gaps
            // (a training loop's): its host has nothing to launch after
            // one. (Held off, fillers beside a loop of 1.3 ms gaps took
            // 0.35 ms of each to start, the hold-off and the hand-off.)
            let loop_gap = synced != 0 && request_over == 0 && self.synced_gap_opens_at_once();
            let holdoff = if (between_requests && !queued_request) || loop_gap {
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
            // once per kernel. One kept as if alone that reports none, only
            // after a synchronisation: where its queue ran dry without one,
            // its host is between two launches of a request (an eager
            // framework's Python), and a delay there recurs as often. (One
            // that never synchronised where dilu sees it, anywhere.)
            let as_if_alone = self.params.as_if_alone.load(Relaxed) != 0;
            let after_sync = synced != 0 || !self.primary_synchronises();
            let may_delay = between_requests || (request_over == 0 && (after_sync || !as_if_alone));
            let tolerated = est_ns <= self.params.tolerance_ns.load(Relaxed) && may_delay;
            let longest = self.predictor.longest_ns.load(Relaxed);
            let mut idle = elapsed >= longest.max(IDLE_AFTER_NS);
            // A primary kept as if alone, out of credit for delayed returns:
            // only a prediction from repeating gaps vouches for a gap (a
            // random gap's length is no promise, nor is a long idle).
            let mut fits = fits;
            if as_if_alone && (self.params.delay_credit.load(Relaxed) as i64) < DELAY_CREDIT_CAP {
                fits &= self.predictor.period.load(Relaxed) != 0;
                idle = false;
            }
            // Queued deeper than the usual lead (the filler wakes late):
            // the primary returning now would wait for all of it, so it
            // must end before a return predicted from repeating gaps (a
            // random gap's length is no promise for a whole queue), or be
            // tolerated whole.
            if ahead > QUEUE_LEAD_NS {
                let ends = elapsed
                    .saturating_add(ahead)
                    .saturating_add(est_ns)
                    .saturating_add(HANDOFF_NS);
                let repeating = self.predictor.period.load(Relaxed) != 0;
                let fits_behind = fits && repeating && ends <= predicted;
                let tolerated_behind = tolerated
                    && ahead.saturating_add(est_ns) <= self.params.tolerance_ns.load(Relaxed);
                if !fits_behind && !tolerated_behind {
                    return FillerGate::WaitUntil(queued - QUEUE_LEAD_NS);
                }
            }
            // Beside a primary kept as if alone, a kernel beyond its
            // tolerance may go where the risk ration affords it (where it
            // may delay the primary, as for the tolerance), unless requests
            // were pushed over its bound beyond the budget.
            if !fits && !tolerated && !idle && may_delay {
                // Its own kernel still queued: this one follows it on the
                // device without a hand-off.
                let following =
                    queued > now && self.last_reserver.0.load(Acquire) == u64::from(filler);
                // The kernel starts behind what is queued: the gap will
                // have lasted that long by then.
                let starts_at = elapsed.saturating_add(queued.saturating_sub(now));
                match self.affordable(now, est_ns, following, starts_at) {
                    Rationed::Now(cost) => rationed = cost,
                    Rationed::At(ready) if owed == Owed::No => {
                        return FillerGate::WaitUntil(ready.max(now + POLL_NS));
                    }
                    Rationed::At(_) | Rationed::No => {}
                }
            }
            // This gap is expected to be as long as the longest recent one
            // (a long phase, or gaps all alike).
            let long_gap = agree(predicted, longest);
            let opening_ends = opens.saturating_add(OPENING_NS);
            if !fits && !tolerated && !idle && rationed == 0 {
                // Owed its guarantee, a filler goes anyway where waiting
                // would not bring a gap it fits: the gaps are random, or
                // all shorter than its kernel. Where they repeat and one
                // fits, it waits for that one.
                let random = self.predictor.period.load(Relaxed) == 0;
                // Judged as `fits` is: against the gaps the prediction
                // vouches for, from the gap's opening, with the hand-off.
                // (Against the longest recent gap, without the hand-off, a
                // filler of 2 ms kernels beside gaps of 2.06 ms waited for
                // a gap it fits as long as the primary ran.)
                let opening = opens - start.min(opens);
                let vouched = self.predictor.longest_vouched_ns.load(Relaxed);
                let fits_none = opening.saturating_add(est_ns).saturating_add(HANDOFF_NS) > vouched;
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
        if rationed > 0 {
            self.spend_ration(now, rationed);
        }
        // With any queue deeper than the lead ahead of it: the primary
        // bounds the fillers' queue by it when its work is done.
        self.last_reservation.0.store(
            switch
                .saturating_add(est_ns)
                .saturating_add(ahead.saturating_sub(QUEUE_LEAD_NS)),
            Release,
        );
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

    /// Whether the risk ration affords a kernel of `est_ns` beside a
    /// primary kept as if alone, starting in a gap that will have lasted
    /// `gap_so_far_ns`.
    fn affordable(&self, now: u64, est_ns: u64, following: bool, gap_so_far_ns: u64) -> Rationed {
        if self.params.as_if_alone.load(Relaxed) == 0
            || (self.params.delay_credit.load(Relaxed) as i64) < RATION_CREDIT_FLOOR
        {
            return Rationed::No;
        }
        let Some(cost) = self.ration_cost(est_ns, following) else {
            return Rationed::No;
        };
        // Priced for a moment like any other of the idle time; this one
        // may be likelier or less likely to meet the primary's return
        // (mid-burst, or deep in a pause between bursts).
        let exposure = est_ns
            + if following {
                HANDOFF_NS
            } else {
                2 * HANDOFF_NS
            };
        let scale = self.risk_scale(gap_so_far_ns, exposure).unwrap_or(1.0);
        let cost = (cost as f64 * scale) as u64;
        // A kernel that costs nothing needs no ration (nor a CAS on it).
        let cost = cost.max(1);
        // One that costs more than the ration holds when full goes only
        // where nothing else harvests, and only beside rare requests: once
        // the full ration has overflowed by the excess and no filler work
        // has run for as long (the device idle beside the primary), and
        // where it pushes at most a tenth of a request over the bound
        // (`cost · β` of the rate); it empties the ration. Overdrawing a
        // full ration, it spent in one gap the ration of many, which other
        // fillers' shorter kernels harvest far more of the idle time with
        // at the same risk. Beside frequent requests each such kernel may
        // push most of one over, and letting it go there cut what the
        // fillers harvested (beside a Poisson primary at 229 req/s with
        // fillers of 2.7 ms and 0.1 ms kernels on simgpu, 11.5% of the
        // idle time against 21.8% without, the means of six runs each,
        // its p99 no better). Never going, it stopped a filler that has
        // one such kernel a step: a ResNet-50 trainer's 7.6 ms convolution
        // beside a BERT server at 3 req/s on simgpu, where it pushes under
        // 1% of a request, made 0% of its steps alone (34% with the rule).
        if cost > RATION_DEPTH_NS {
            let rare = self.mean_gap_ns().is_some_and(|mean_gap| {
                let pushes_ppm =
                    u128::from(cost) * DELAY_BUDGET_PPM as u128 / u128::from(mean_gap.max(1));
                pushes_ppm <= OVER_DEPTH_PUSHES_PPM
            });
            if !rare {
                return Rationed::No;
            }
            let quiet_since = self.fillers_busy_until.0.load(Acquire);
            let ready = self
                .ration_overflowed_at(cost - RATION_DEPTH_NS)
                .max(quiet_since.saturating_add(cost - RATION_DEPTH_NS));
            // Not yet: it looks again as a filler the ration does not
            // pay for does, so that a long idle stretch finds it awake.
            return if ready <= now {
                Rationed::Now(RATION_DEPTH_NS)
            } else {
                Rationed::No
            };
        }
        // One that opens a run of the filler's kernels pays the hand-off
        // to the filler; those following it do not. It goes only once the
        // ration also affords a run of them after it, so that a filler the
        // ration paces pays that hand-off once a run, not once a kernel.
        let needed = if following {
            cost
        } else {
            let follower = self.ration_cost(est_ns, true).unwrap_or(cost);
            let follower = (follower as f64 * scale) as u64;
            cost.saturating_add(follower.saturating_mul(RATION_RUN_KERNELS))
        };
        let ready = self.ration_ready_at(needed);
        if ready <= now {
            Rationed::Now(cost)
        } else {
            Rationed::At(ready)
        }
    }

    /// `filler`, owed its guarantee, claims the next opening of a gap its
    /// kernel of `est_ns` can use (renewed at every look).
    pub(crate) fn claim_next_opening(&self, filler: u32, est_ns: u64, now: u64) {
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

    /// Filler side: a launch was held at least once.
    /// The filler work (estimated) launched while a primary was attached,
    /// in all.
    pub fn filled_ns(&self) -> u64 {
        self.filler_stats.filled_ns.load(Relaxed)
    }

    pub fn record_held(&self) {
        self.filler_stats.filler_held.fetch_add(1, Relaxed);
    }
}
