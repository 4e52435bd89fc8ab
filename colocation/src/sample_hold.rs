//! Sample holds: a filler timing a kernel longer than a time slice holds
//! the primary's launches until that kernel ran, so the sample is the
//! kernel's own time and not the primary's slice as well.

use crate::board::Board;
use crate::timing::*;
use std::sync::atomic::Ordering::*;

/// What [`Board::post_sample_hold`](crate::Board::post_sample_hold) did.
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

/// The sample-hold word of `filler` lasting until `until_ns` (65.5 µs
/// units, wrapping, rounded up).
pub(crate) fn hold_word(filler: u32, until_ns: u64) -> u64 {
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

impl Board<'_> {
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

    /// Primary side, after [`Board::primary_launch`](crate::Board::primary_launch) published the
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
}
