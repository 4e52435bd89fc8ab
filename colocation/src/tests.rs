//! The co-location policy on a board in anonymous memory.

use super::*;
use crate::filler::{claim_word, claimant};
use crate::sample_hold::hold_word;
use dilu_layout::colocation::{GapBoard, HISTORY, MAX_PERIOD, RING};
use dilu_layout::shm::Region;
use proptest::prelude::*;
use std::sync::atomic::Ordering::*;

const MS: u64 = 1_000_000;
const US: u64 = 1_000;
/// Fillers' ids (process ids on a real board).
const FILLER: u32 = 7;
const ONLINE_FILLER: u32 = 8;

fn board() -> Region<GapBoard> {
    Region::<GapBoard>::anonymous(|_| {}).unwrap()
}

/// A training-like primary: 4 ms of work, then a 3 ms gap, repeated.
fn train_iteration(b: Board, start: u64) -> u64 {
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
fn in_a_learned_gap(b: Board) -> u64 {
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
fn one_kernel_waited_for(b: Board, at: u64) {
    b.primary_launch(at, 200 * US);
    b.primary_sync_begin();
    b.primary_sync_end(at + 200 * US);
}

#[test]
fn after_a_request_that_waited_the_gap_opens_only_after_the_hold_off() {
    let board = board();
    let b = Board::new(board.device(0));
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

/// A loop that synchronises once per iteration, each time before its gap
/// (its data loading): once its gaps repeat and [`SYNCED_GAPS_TRUSTED`]
/// synchronisations in a row began one, a gap opens to fillers as its
/// synchronisation returns; one synchronisation that its host launches
/// right after brings the hold-off back.
#[test]
fn a_loop_whose_synchronisations_begin_its_gaps_opens_them_at_once() {
    let board = board();
    let b = Board::new(board.device(0));
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    let mut t = 1_000 * MS;
    // Each iteration's launch ends the gap before it: one fewer gap ended
    // than iterations run, and the last one's gap is open.
    for _ in 0..SYNCED_GAPS_TRUSTED {
        t = train_iteration(b, t);
    }
    let open = t - 3 * MS;
    assert_eq!(
        b.filler_admit(open + 10 * US, MS, false, FILLER),
        FillerGate::WaitUntil(open + DEFAULT_HOLDOFF_NS),
        "one gap short of the row"
    );
    let next = train_iteration(b, t);
    let gap = next - 3 * MS;
    assert_eq!(
        b.filler_admit(gap + 10 * US, MS, false, FILLER),
        FillerGate::Go
    );
    // The next iteration reads a result back mid-way and launches 50 µs
    // later: a synchronisation that began no gap.
    b.primary_launch(next, 4 * MS);
    b.primary_sync_begin();
    b.primary_sync_end(next + MS);
    b.primary_launch(next + MS + 50 * US, 2 * MS);
    b.primary_sync_begin();
    let gap = next + 4 * MS;
    b.primary_sync_end(gap);
    assert_eq!(
        b.filler_admit(gap + 10 * US, MS, false, FILLER),
        FillerGate::WaitUntil(gap + DEFAULT_HOLDOFF_NS),
        "the row is broken"
    );
}

#[test]
fn a_filler_fills_a_learned_gap_but_not_past_its_end() {
    let board = board();
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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

/// A primary that has learned alike gaps of `gap_ns` after 4 ms of work,
/// at the opening of one more: returns that instant.
fn at_the_opening_of_alike_gaps(b: Board, gap_ns: u64) -> u64 {
    let mut t = 1_000 * MS;
    let mut opens = 0;
    for _ in 0..2 * RING {
        b.primary_launch(t, 4 * MS);
        b.primary_sync_begin();
        b.primary_sync_end(t + 4 * MS);
        opens = t + 4 * MS + DEFAULT_HOLDOFF_NS;
        t += 4 * MS + gap_ns;
    }
    opens
}

/// Alike gaps of 2.06 ms and a filler owed its guarantee whose 2 ms
/// kernels fit none of them once the hold-off and the hand-off are
/// counted: no gap it fits is coming, so it goes as a gap opens (it
/// waited for one it fits for as long as the primary ran).
#[test]
fn a_kernel_a_hand_off_short_of_the_gaps_goes_as_a_gap_opens() {
    let gap_ns = 2_060 * US;
    let kernel = 2 * MS;
    for owed in [Owed::Yes, Owed::Overdue] {
        let board = board();
        let b = Board::new(board.device(0));
        b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        let opens = at_the_opening_of_alike_gaps(b, gap_ns);
        let s = b.snapshot();
        assert_eq!((s.gap_period, s.predicted_gap_ns), (1, gap_ns));
        // Not owed, it waits (the kernel would delay the primary).
        assert!(matches!(
            b.filler_admit(opens, kernel, false, FILLER),
            FillerGate::WaitUntil(_)
        ));
        assert_eq!(
            b.filler_admit_owed(opens, kernel, false, FILLER, owed),
            FillerGate::Fallback,
            "{owed:?}"
        );
    }
}

#[test]
fn a_kernel_that_fits_alike_gaps_goes_into_them_unowed() {
    let board = board();
    let b = Board::new(board.device(0));
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    let opens = at_the_opening_of_alike_gaps(b, 2_060 * US);
    assert_eq!(
        b.filler_admit(opens, 1_500 * US, false, FILLER),
        FillerGate::Go
    );
}

/// A primary with a 4 ms and a 1 ms gap per iteration; the filler
/// `short` (500 µs kernels) holds the turn, `long` (1.5 ms kernels,
/// which fit only the 4 ms gap) is owed its guarantee.
#[test]
fn a_filler_owed_its_guarantee_goes_ahead_of_the_turn_in_gaps_it_fits() {
    let board = board();
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(shared.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
fn filler_work_queued_before_the_primary_came_costs_its_budget_nothing() {
    let board = board();
    let b = Board::new(board.device(0));
    // A filler there first keeps kernels (estimated 2 ms each) queued.
    let t = 5_000 * MS;
    let mut now = t;
    for _ in 0..10 {
        while let FillerGate::WaitUntil(at) = b.filler_admit(now, 2 * MS, false, FILLER) {
            now = at;
        }
    }
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    b.keep_as_if_alone();
    // The primary's first returns meet that queue, which no gamble of the
    // board's put there.
    let mut at = now;
    for _ in 0..3 {
        one_kernel_waited_for(b, at);
        at += 500 * US;
        assert!(b.snapshot().primary_delay_ns > 0, "it met the queue");
    }
    assert!(
        b.delay_credit() >= 0.0,
        "inherited work charged: {}",
        b.delay_credit()
    );
    // Work the board admits beside the primary is charged when it delays
    // a return.
    let queue_gone = t + 100 * MS;
    one_kernel_waited_for(b, queue_gone);
    let before = b.delay_credit();
    b.set_tolerance(MS);
    // (After the turn's grace: the filler's turn is long over.)
    let go = queue_gone + 200 * US + DEFAULT_HOLDOFF_NS + TURN_GRACE_NS;
    assert_eq!(b.filler_admit(go, 500 * US, false, FILLER), FillerGate::Go);
    b.set_tolerance(0);
    one_kernel_waited_for(b, go + 100 * US);
    assert!(
        b.delay_credit() <= before - 0.99,
        "a delayed return beside admitted work: {before} then {}",
        b.delay_credit()
    );
}

#[test]
fn a_reporting_primary_kept_as_if_alone_spends_its_budget_on_requests_pushed_over() {
    let board = board();
    let b = Board::new(board.device(0));
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
    // The node manager's status counts the requests judged, not the
    // returns, and the one pushed over.
    let s = b.snapshot();
    assert!(s.as_if_alone);
    assert_eq!((s.judged, s.pushed_over), (450, 1));
    let budget = crate::delay_budget(s.delay_credit_ppm);
    assert!(budget.requests_left >= 1.0 && !budget.ration_stopped);
    // Five pushed over in a row, from a full budget of one, overdraw it
    // beyond its noise: the ration stops, and the status says so.
    for _ in 0..5 {
        b.primary_request_judged(true);
    }
    let budget = crate::delay_budget(b.snapshot().delay_credit_ppm);
    assert!(budget.requests_left < -3.0, "{budget:?}");
    assert!(budget.ration_stopped);
}

/// A primary tolerating a 2 ms filler kernel, after its first 200 µs of
/// work waited for: returns when that gap began.
fn a_gap_of_a_primary_tolerating_2_ms(b: Board) -> u64 {
    b.attach_primary(1, 2 * MS, DEFAULT_HOLDOFF_NS);
    let t = 5_000 * MS;
    b.primary_launch(t, 200 * US);
    b.primary_sync_begin();
    b.primary_sync_end(t + 200 * US);
    t + 200 * US
}

#[test]
fn tolerance_lets_fillers_into_unpredictable_gaps_and_goes_at_once() {
    let board = board();
    let b = Board::new(board.device(0));
    let at = a_gap_of_a_primary_tolerating_2_ms(b) + 800 * US;
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
    let b = Board::new(board.device(0));
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
fn a_filler_that_wakes_late_queues_as_far_ahead_with_no_primary() {
    let board = board();
    let b = Board::new(board.device(0));
    let t = 5_000 * MS;
    let late = 2 * MS;
    assert_eq!(b.filler_admit(t, MS, false, FILLER), FillerGate::Go);
    // Woken on time, it waits for the lead before its queue's end.
    assert_eq!(
        b.filler_admit(t, MS, false, FILLER),
        FillerGate::WaitUntil(t + MS - QUEUE_LEAD_NS)
    );
    // Woken 2 ms late, it queues up to twice that (less the lead) ahead,
    // then wakes 2 ms before its queue ends.
    for queued in 1..=3 {
        assert_eq!(
            b.filler_admit_led(t, MS, false, FILLER, Owed::No, late),
            FillerGate::Go,
            "{queued} ms queued"
        );
    }
    assert_eq!(
        b.filler_admit_led(t, MS, false, FILLER, Owed::No, late),
        FillerGate::WaitUntil(t + 4 * MS - late)
    );
    // However late it wakes, it queues at most twice the longest lead.
    let mut queued = t + 4 * MS;
    let gate = loop {
        match b.filler_admit_led(t, MS, false, FILLER, Owed::No, 60_000 * MS) {
            FillerGate::Go => queued += MS,
            gate => break gate,
        }
    };
    assert_eq!(gate, FillerGate::WaitUntil(queued - MAX_QUEUE_LEAD_NS));
    let deepest = 2 * MAX_QUEUE_LEAD_NS - QUEUE_LEAD_NS;
    assert!(
        queued - t > deepest && queued - t <= deepest + MS,
        "{} ms queued",
        (queued - t) / MS
    );
}

#[test]
fn beside_a_primary_a_late_filler_queues_deeper_only_within_its_tolerance() {
    let board = board();
    let b = Board::new(board.device(0));
    let at = a_gap_of_a_primary_tolerating_2_ms(b) + DEFAULT_HOLDOFF_NS;
    let late = 4 * MS;
    // Four kernels of 500 µs: the primary returning now waits for all of
    // them, 2 ms, what it tolerates.
    for k in 0..4 {
        assert_eq!(
            b.filler_admit_led(at, 500 * US, false, FILLER, Owed::No, late),
            FillerGate::Go,
            "kernel {k}"
        );
    }
    // A fifth would make it wait 2.5 ms: this one waits for the usual
    // lead, however late the filler wakes.
    assert_eq!(
        b.filler_admit_led(at, 500 * US, false, FILLER, Owed::No, late),
        FillerGate::WaitUntil(at + 2 * MS - QUEUE_LEAD_NS)
    );
}

#[test]
fn a_switch_between_fillers_is_counted_in_their_queue() {
    let board = board();
    let b = Board::new(board.device(0));
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
        let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(back_to_back.device(0));
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
    let b = Board::new(board.device(0));
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
fn a_filler_holds_the_turn(b: Board) -> (u32, u32, u64) {
    let (a, other) = (FILLER, FILLER + 1);
    let t = 1_000 * MS;
    assert_eq!(b.filler_admit(t, MS, false, a), FillerGate::Go);
    (a, other, t + MS)
}

#[test]
fn the_filler_that_ran_last_keeps_the_device_for_its_turn() {
    let board = board();
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(shared.device(0));
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
    let b = Board::new(lone.device(0));
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
fn the_longest_vouched_gap_is_the_longest_phase_seen_that_long_every_time() {
    // Phases of 1, 5 and 2 ms (±5%): whichever gap is next, a 5 ms one
    // (at least its shortest showing) is vouched for within the period.
    let gaps = noisy_loop(&[MS, 5 * MS, 2 * MS], 5);
    for cut in 0..3 {
        let p = predict_gap(&gaps[..gaps.len() - cut]);
        assert!(
            (4_750 * US..=5 * MS).contains(&p.longest_vouched_ns),
            "cut {cut}: {p:?}"
        );
    }
    // Alike gaps with one longer among them: that one is no promise.
    let mut gaps = noisy_loop(&[2 * MS], 12);
    let last = gaps.len() - 3;
    gaps[last] = 2_400 * US;
    let p = predict_gap(&gaps);
    assert_eq!(p.period, 1);
    assert!(p.longest_vouched_ns < 2_100 * US, "{p:?}");
    // Without a period, the next gap's prediction.
    let p = predict_gap(&[
        7 * MS,
        MS,
        13 * MS,
        3 * MS,
        9 * MS,
        2 * MS,
        11 * MS,
        5 * MS,
        8 * MS,
    ]);
    assert_eq!((p.period, p.longest_vouched_ns), (0, p.length_ns));
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
    let b = Board::new(board.device(0));
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
    let b = Board::new(board.device(0));
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
        let b = Board::new(board.device(0));
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

/// A request's last kernel at `at`, waited for and reported: the gap after
/// it opens to fillers at once; returns when it began.
fn request_ended(b: Board, at: u64) -> u64 {
    one_kernel_waited_for(b, at);
    b.primary_request_over(false);
    at + 200 * US
}

#[test]
fn beside_a_primary_kept_as_if_alone_kernels_beyond_its_tolerance_go_as_the_ration_affords() {
    let board = board();
    let b = Board::new(board.device(0));
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    b.keep_as_if_alone();
    let t = 5_000 * MS;
    let gap = request_ended(b, t);
    assert!(
        matches!(
            b.filler_admit(gap, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ),
        "no table yet: the primary's tail is not known"
    );
    // A 1 ms kernel, exposed with the hand-off to it, costs 10 ms of the
    // ration (20 ms deep).
    let costs = std::array::from_fn(|j| 10 * ration::ration_point_ns(j).saturating_sub(HANDOFF_NS));
    b.publish_ration(gap, &costs);
    assert_eq!(b.ration_cost(MS, false), Some(10 * MS));
    // Behind its own queued kernel, no hand-off to it.
    assert_eq!(b.ration_cost(MS, true), Some(10 * (MS - HANDOFF_NS)));
    // The ration is full: the kernel goes, and with it a run of its
    // kernels might.
    let first = gap;
    assert_eq!(b.filler_admit(first, MS, false, FILLER), FillerGate::Go);
    // Its next kernel, launched as the first is about to end, follows it
    // without a hand-off: it costs 8.6 ms, and the ration holds 10.95.
    let second = first + MS - QUEUE_LEAD_NS;
    assert_eq!(b.filler_admit(second, MS, false, FILLER), FillerGate::Go);
    // The primary's next request comes back 3 ms after the first went.
    // The ration holds 4.6 ms in the gap after it: a kernel opening a run
    // waits until it affords the kernel and a run after it (8 more, at
    // most the ration's depth): full again, 18.6 ms after the first went.
    let gap = request_ended(b, first + 3 * MS);
    assert_eq!(
        b.filler_admit(gap, MS, false, FILLER),
        FillerGate::WaitUntil(first + 18_600 * US)
    );
    // A kernel the table says is harmless goes meanwhile.
    b.publish_ration(gap, &[0; dilu_layout::colocation::RATION_POINTS]);
    assert_eq!(b.filler_admit(gap, MS, false, FILLER), FillerGate::Go);
    // One that costs more than the ration holds when full (30 ms of 20)
    // goes only on what the full ration overflowed, 10 ms of it: it would
    // otherwise spend in one gap what shorter kernels of other fillers use
    // in many. Full since about 80 ms, the ration pays for it, and is
    // empty after it.
    let dear = std::array::from_fn(|j| 30 * ration::ration_point_ns(j).saturating_sub(HANDOFF_NS));
    b.publish_ration(gap, &dear);
    // Requests are rare: the primary's gaps last 300 ms, so such a kernel
    // pushes at most 30 ms × 0.5% / 300 ms = 0.05% of a request over.
    for _ in 0..64 {
        b.record_gap_length(300 * MS);
    }
    // (After the turn's grace: the filler's turn is old.)
    let gap = request_ended(b, gap + 100 * MS) + TURN_GRACE_NS;
    assert_eq!(b.filler_admit(gap, MS, false, FILLER), FillerGate::Go);
    // The next, in the primary's next gap, waits until the ration is full
    // again (20 ms after the first went) and has overflowed by 10 ms, the
    // device idle meanwhile.
    let next = request_ended(b, gap + 5 * MS);
    let held = |at: u64| {
        matches!(
            b.filler_admit(at, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        )
    };
    assert!(held(next) && held(gap + 29_900 * US));
    assert_eq!(
        b.filler_admit(gap + 30 * MS, MS, false, FILLER),
        FillerGate::Go
    );
    // Another filler's kernel within the primary's tolerance runs from
    // 55 ms to 55.1 ms: the ration overflows by 10 ms at 60 ms, but the
    // device was not idle beside the primary for as long until 65.1 ms.
    b.set_tolerance(200 * US);
    assert_eq!(
        b.filler_admit(gap + 55 * MS, 100 * US, false, FILLER + 2),
        FillerGate::Go
    );
    b.set_tolerance(0);
    assert!(held(gap + 60 * MS) && held(gap + 65 * MS));
    assert_eq!(
        b.filler_admit(gap + 65_100 * US, MS, false, FILLER),
        FillerGate::Go,
        "the ration overflowed by its excess, and nothing else harvested"
    );
    b.publish_ration(gap, &costs);
    // Requests actually pushed over the bound beyond the budget by more
    // than three stop the ration, full or not.
    for _ in 0..3 {
        b.primary_request_judged(true);
    }
    // (After the turn's grace: the filler's turn is old.)
    let gap = request_ended(b, gap + 100 * MS) + TURN_GRACE_NS;
    assert_eq!(
        b.filler_admit(gap, MS, false, FILLER),
        FillerGate::Go,
        "three requests beyond the budget may be noise: credit {}",
        b.delay_credit()
    );
    b.primary_request_judged(true);
    let gap = request_ended(b, gap + 100 * MS) + TURN_GRACE_NS;
    assert!(
        matches!(
            b.filler_admit(gap, MS, false, FILLER),
            FillerGate::WaitUntil(_)
        ),
        "pushed over four times in a row: credit {}",
        b.delay_credit()
    );
    // A primary with a latency target spends its slack instead.
    b.attach_primary(2, 0, DEFAULT_HOLDOFF_NS);
    let gap = request_ended(b, gap + 100 * MS);
    assert!(matches!(
        b.filler_admit(gap, MS, false, FILLER),
        FillerGate::WaitUntil(_)
    ));
}

#[test]
fn beside_frequent_requests_a_kernel_dearer_than_the_full_ration_never_goes() {
    let board = board();
    let b = Board::new(board.device(0));
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    b.keep_as_if_alone();
    // Gaps of 4 ms; the ration full and the device idle for seconds.
    for _ in 0..64 {
        b.record_gap_length(4 * MS);
    }
    let gap = request_ended(b, 5_000 * MS);
    // A 1 ms kernel costing 400 ms of the ration (20 ms deep) pushes about
    // 400 ms × 0.5% / 4 ms, half a request, over: it waits.
    b.publish_ration(
        0,
        &std::array::from_fn(|j| 400 * ration::ration_point_ns(j).saturating_sub(HANDOFF_NS)),
    );
    assert!(matches!(
        b.filler_admit(gap, MS, false, FILLER),
        FillerGate::WaitUntil(_)
    ));
    // One costing 30 ms pushes about 4% of one over: it goes.
    b.publish_ration(
        0,
        &std::array::from_fn(|j| 30 * ration::ration_point_ns(j).saturating_sub(HANDOFF_NS)),
    );
    assert_eq!(b.filler_admit(gap, MS, false, FILLER), FillerGate::Go);
}

#[test]
fn beside_a_bursty_primary_kept_as_if_alone_risky_kernels_go_in_its_pauses() {
    let board = board();
    let b = Board::new(board.device(0));
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    b.keep_as_if_alone();
    // Bursts of 75 requests at 250 req/s (gaps of 4 ms on average), each
    // followed by a 300 ms pause.
    for _ in 0..13 {
        for i in 0..75 {
            let u = (i as f64 + 0.5) / 75.0;
            b.record_gap_length((-(1.0 - u).ln() * 4.0 * MS as f64) as u64);
        }
        b.record_gap_length(300 * MS);
    }
    // A 1 ms kernel costs 5 ms of the ration (20 ms deep) at a moment like
    // any other of the idle time.
    let costs = std::array::from_fn(|j| 5 * ration::ration_point_ns(j).saturating_sub(HANDOFF_NS));
    b.publish_ration(0, &costs);
    // Filler kernels of 1 ms back to back from `from` on: how many go
    // before the first waits.
    let run = |from: u64| {
        let mut at = from;
        for went in 0..10 {
            match b.filler_admit(at, MS, false, FILLER) {
                FillerGate::Go => at += MS,
                FillerGate::WaitUntil(_) => return went,
                FillerGate::Fallback => panic!("no guarantee is owed"),
            }
        }
        10
    };
    // Just after a request, mid-burst, the primary soon returns: the
    // ration (full) pays for two.
    let gap = request_ended(b, 5_000 * MS);
    let mid_burst = run(gap);
    assert!(mid_burst <= 2, "{mid_burst}");
    // Deep in a pause a return within the next milliseconds is rare: every
    // kernel goes.
    let gap = request_ended(b, 6_000 * MS);
    assert_eq!(run(gap + 60 * MS), 10);
}

#[test]
fn a_primary_launch_after_idle_tells_the_gap_it_ended_and_the_delay_it_met() {
    let board = board();
    let b = Board::new(board.device(0));
    b.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
    let t = 1_000 * MS;
    // The very first launch ends no gap it knows of; one behind it, while
    // the primary is busy, none either.
    assert_eq!(b.primary_launch(t, MS), None);
    assert_eq!(b.primary_launch(t + 10 * US, MS), None);
    b.primary_sync_begin();
    let synced = t + 2 * MS;
    b.primary_sync_end(synced);
    // Idle for 5 ms, nothing of a filler's on the device: the gap from
    // the synchronisation, no delay.
    let back = synced + 5 * MS;
    assert_eq!(
        b.primary_launch(back, MS),
        Some(GapEnded {
            start_ns: synced,
            length_ns: 5 * MS,
            delay_ns: 0,
            synced: true,
        })
    );
    b.primary_sync_begin();
    let synced = back + MS;
    b.primary_sync_end(synced);
    // A filler's 2 ms kernel goes into the next gap; the primary returns
    // 1 ms into it and waits for the rest and the hand-off.
    let filler_at = synced + DEFAULT_HOLDOFF_NS;
    assert_eq!(
        b.filler_admit_owed(filler_at, 2 * MS, false, FILLER, Owed::Overdue),
        FillerGate::Fallback
    );
    let back = filler_at + MS;
    let ended = b.primary_launch(back, MS).expect("a gap ended");
    assert_eq!(ended.start_ns, synced);
    assert_eq!(ended.length_ns, back - synced);
    assert_eq!(ended.delay_ns, MS + HANDOFF_NS);
    assert_eq!(b.primary_delay_ns(), MS + HANDOFF_NS);
    assert!(ended.synced);
    // Its queue runs dry without a synchronisation (a host slower than the
    // device between two launches of one request): the gap is from the
    // estimated end of its work, and no synchronisation began it.
    let busy_until = b.primary_busy_until.0.load(Relaxed);
    let ended = b.primary_launch(busy_until + MS, MS).expect("a gap ended");
    assert_eq!((ended.start_ns, ended.length_ns), (busy_until, MS));
    assert!(!ended.synced);
}

#[test]
fn beside_an_as_if_alone_primary_a_tolerated_kernel_waits_out_a_gap_inside_a_request() {
    // A primary kept as if alone, tolerating a kernel of 1 ms, and a filler
    // of 0.5 ms kernels just past the hold-off into a gap: one that began
    // when a synchronisation returned (`synced`), or one in which the
    // primary's queue ran dry without one; `synchronised_before`: an
    // earlier gap of the primary's began at a synchronisation.
    let admit = |synchronised_before: bool, synced: bool| {
        let board = board();
        let b = Board::new(board.device(0));
        b.attach_primary(1, MS, DEFAULT_HOLDOFF_NS);
        b.keep_as_if_alone();
        let mut t = 1_000 * MS;
        if synchronised_before {
            // One request read back: its gap began at the synchronisation.
            b.primary_launch(t, MS);
            b.primary_sync_begin();
            b.primary_sync_end(t + MS);
            t += 3 * MS;
        }
        b.primary_launch(t, MS);
        if synced {
            b.primary_sync_begin();
            b.primary_sync_end(t + MS);
        }
        let gap_start = t + MS;
        b.filler_admit(
            gap_start + DEFAULT_HOLDOFF_NS + 10 * US,
            MS / 2,
            false,
            FILLER,
        )
    };
    // It synchronises where dilu sees it: a gap its queue ran dry in is the
    // host between two launches of a request.
    assert_ne!(admit(true, false), FillerGate::Go);
    assert_eq!(admit(true, true), FillerGate::Go);
    // It never synchronised where dilu sees it (a blocking copy): any gap
    // may be a request's end.
    assert_eq!(admit(false, false), FillerGate::Go);
}
