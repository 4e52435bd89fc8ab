//! Fair turns: dilu processes sharing a device split the device time they
//! use by their shares, this process's side of the turns on the quiet board
//! ([`dilu_layout::quiet`] says what the board holds).
//!
//! Token buckets cap each tenant's share of *wall-clock* time. Two tenants
//! that synchronise often (request-style work) lose that time to each
//! other instead: every time the device goes from one to the other it idles
//! a hand-off (about 140 µs on an H100), and a tenant whose queue is empty
//! for a moment hands the device over. In a 30/70 pair of loops of four
//! 100 µs kernels, the 30% tenant took its whole 30% of the device while
//! the 70% tenant, waiting behind it at every synchronisation, got 45%: a
//! split of the used time of 39/61.
//!
//! So while this process's share is limited, each launch that goes through
//! the bucket also advances its *vtime* (GPU time charged over its share)
//! and, before it goes, waits while another member that waits on the device
//! is more than [`LAG_NS`] of vtime behind. A member waits on the device
//! while work it queued is not yet run by its launches' estimates (or, while
//! its bucket holds its next launch, by the driver's word: on a shared
//! device work runs later than estimated); a
//! synchronisation on such work and the [`RETURN_NS`] after it returns
//! count too (a request loop's next launches come that soon). A
//! synchronisation that outlasts its work's estimate by more than
//! [`RETURN_NS`] is waiting for something else and holds nobody. So does
//! a member its token bucket holds back, its work run, if the bucket lets
//! it go before the launch about to go would end (by its estimate): the
//! launch's kernel would still hold the device when the other's comes. For
//! the same reason a member that learned it comes back later than
//! [`RETURN_NS`] after its work (but within that work's length more) says
//! when it expects to launch again, and a launch that would still run then
//! waits for it ([`expected_back_after`]).
//!
//! Host-bound request loops (one short kernel, then a synchronisation)
//! count as waiting as well. They once did not, so that their host time
//! would overlap the other member's kernels; but on a time-sliced device
//! each of their kernels costs a hand-off away from the other member and
//! one back, and two loops of 20 µs kernels at 30/70 kept the device busy
//! 12.5% of the time between them, split 50/50, as without dilu. Counted
//! as waiting, the member ahead holds while the other runs about a
//! [`LAG_NS`] of vtime of kernels in a row: 16.6% busy, split 30/70 (and
//! loops of 4 × 20 µs 34.8% -> 40.0%, 50/50 -> 30/70; `scripts/bench.sh sm`).
//!
//! A launch its token bucket holds back waits in [`bucket_wait`], where the
//! members skip idle time together when every one of them is held back by
//! its bucket (the quiet board's module doc says why and how).
//!
//! Bounds: a launch waits at most [`MAX_WAIT_NS`] for turns; a member back
//! from idling (no launch counted and nothing queued for the board's
//! [`ACTIVE_WITHIN_NS`], or taking turns for the first time) takes its
//! vtime up to [`CREDIT_NS`] behind the leader, so it cannot claim the
//! time it did not want. A member that kept launching keeps its claim:
//! moved up at every launch, as before, the 70% tenant of a pair of
//! one-graph request loops, which on a 2-core host cannot launch as fast
//! as its share, lost 940 ms of vtime in 4 s that way. Not part of it:
//! co-located tenants (the gap board decides), unlimited shares (no
//! vtime), and `DILU_SM_ABLATE=turns`.

use crate::sm_time::precise_sleep::sleep_until;
use crate::sm_time::quiet_samples;
use crate::sm_time::recent_streams::StreamRef;
use dilu_colocation::HANDOFF_NS;
use dilu_layout::bucket::TokenBucket;
use dilu_layout::budget::is_limited;
use dilu_layout::ledger::MAX_DEVICES;
use dilu_layout::monotonic_ns;
use dilu_layout::quiet::{ACTIVE_WITHIN_NS, DeviceQuiet, MAX_ENGAGED_NS, Turn};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How far ahead (vtime) a member may get of one waiting on the device
/// before it holds: about a time slice (2.08 ms on an H100). Much less
/// would hand the device back and forth more often; much more lets the
/// split drift further within a second.
pub const LAG_NS: u64 = 2_000_000;
/// How far behind the leader (vtime) a member back from idling may start:
/// what it can claim back at once after it wanted less and then wants the
/// device. Far more than one launch's step (a 1 ms kernel at 30%
/// is 3.3 ms), which must never be taken from a member that kept up.
pub const CREDIT_NS: u64 = 50_000_000;
/// After a synchronisation on queued work returns, how long the member still
/// counts as waiting on the device: two hand-offs. Coming back sooner, it
/// would lose more to a switch away and back than the other member gains.
/// (A member that comes back later says when: see [`expected_back_after`].)
pub const RETURN_NS: u64 = 2 * HANDOFF_NS;
/// Longer gaps before a member's next launch are taken as this long when
/// learning how soon it comes back (a time slice): long enough to say it
/// came back late, short enough that one pause (a checkpoint, idling
/// between requests) is unlearned within a few dozen returns.
const LONGEST_GAP_SAMPLE_NS: u64 = LAG_NS;
/// The longest a single launch waits for turns.
pub const MAX_WAIT_NS: u64 = 20_000_000;
/// How often a held launch looks at the board again.
const POLL_NS: u64 = 50_000;
/// How often a launch its bucket holds back looks whether the device idles
/// for every member's bucket (under a hand-off: skipping sooner would not
/// save a switch).
const IDLE_POLL_NS: u64 = 100_000;

/// This process's state per device.
struct DeviceTurn {
    /// GPU time charged over the share, in ns.
    vtime_ns: AtomicU64,
    /// When the work this process queued is expected to have run, by its
    /// launches' estimates.
    queue_end_ns: AtomicU64,
    /// Until when it told the board it waits on the device.
    engaged_until_ns: AtomicU64,
    /// A synchronisation began with work queued that had not run yet.
    pending_sync: AtomicBool,
    /// When a launch last counted its charge here (0: never).
    last_turn_ns: AtomicU64,
    /// When the work the last synchronisation on queued work waited for
    /// was to end by its estimates, until the next launch here measures how
    /// long after that it came (0: none to measure).
    sync_work_end_ns: AtomicU64,
    /// How long after the estimated end of the work a synchronisation
    /// waited for the next launch comes: a high estimate (rises fast, falls
    /// slowly; see [`learn_return_gap`]).
    return_gap_ns: AtomicU64,
}

static TURNS: [DeviceTurn; MAX_DEVICES] = [const {
    DeviceTurn {
        vtime_ns: AtomicU64::new(0),
        queue_end_ns: AtomicU64::new(0),
        engaged_until_ns: AtomicU64::new(0),
        pending_sync: AtomicBool::new(false),
        last_turn_ns: AtomicU64::new(0),
        sync_work_end_ns: AtomicU64::new(0),
        return_gap_ns: AtomicU64::new(0),
    }
}; MAX_DEVICES];

/// Whether fair turns act in this process.
fn enabled() -> bool {
    !crate::config::get().ablate.turns && !crate::sm_time::colocation::active()
}

/// Before a launch estimated at `cost_ns` on `device` at `now_ns`, charged
/// `charge_ns` to the bucket (its cost, or a lease's worth of short launches)
/// at `share_ppm` (limited): waits for the turns it owes, then counts the
/// charge. Returns the time waited. (Launches a lease paid for are not seen
/// here: they are short, and the lease's charge stands for them.)
pub fn before_launch(
    device: usize,
    now_ns: u64,
    charge_ns: u64,
    cost_ns: u64,
    share_ppm: u32,
) -> u64 {
    if !enabled() || !crate::sm_time::usage_feedback::may_be_shared(device) {
        return 0;
    }
    let began = now_ns;
    let Some((board, slot)) = quiet_samples::member(device, began) else {
        return 0;
    };
    // Alone on the board, nothing to write: the launch path's threads then
    // share no written cache line here (a process back among others starts
    // at most CREDIT_NS behind them).
    if !board.others_active(slot, began) {
        return 0;
    }
    let turn = &TURNS[device];
    // A load first: only the first launch after a synchronisation writes
    // (and of two threads, only the one whose swap took it learns).
    let work_end = match turn.sync_work_end_ns.load(Ordering::Relaxed) {
        0 => 0,
        _ => turn.sync_work_end_ns.swap(0, Ordering::Relaxed),
    };
    if work_end != 0 {
        let gap = began.saturating_sub(work_end);
        let learned = learn_return_gap(turn.return_gap_ns.load(Ordering::Relaxed), gap);
        turn.return_gap_ns.store(learned, Ordering::Relaxed);
        board.expect_back(slot, 0);
    }
    let mut vtime = turn.vtime_ns.load(Ordering::Relaxed);
    if back_from_idling(turn, began)
        && let Some(leader) = board.leading_vtime(slot, began)
    {
        vtime = vtime.max(leader.saturating_sub(CREDIT_NS));
    }
    let mut now = began;
    while let Some(until) = board.owed_turn(slot, vtime, LAG_NS, now, cost_ns) {
        let give_up = began + MAX_WAIT_NS;
        if now >= give_up {
            break;
        }
        sleep_until(until.min(now + POLL_NS).min(give_up));
        now = monotonic_ns();
    }
    let step = charge_ns.saturating_mul(1_000_000) / u64::from(share_ppm.max(1));
    let vtime = vtime.saturating_add(step);
    turn.vtime_ns.store(vtime, Ordering::Relaxed);
    turn.last_turn_ns.store(now, Ordering::Relaxed);
    let queue_end = turn.queue_end_ns.load(Ordering::Relaxed).max(now) + cost_ns.max(charge_ns);
    turn.queue_end_ns.store(queue_end, Ordering::Relaxed);
    let engaged = engaged_until(turn.engaged_until_ns.load(Ordering::Relaxed), queue_end);
    turn.engaged_until_ns.store(engaged, Ordering::Relaxed);
    // Seconds of queued work still say "waiting" as far as a reader takes
    // it; each later launch says it again.
    let tenant_key =
        crate::sm_time::tenant_sm::get().map_or(0, |sm| sm.bucket(device).tenant_key());
    board.publish_turn(
        slot,
        Turn {
            vtime_ns: vtime,
            engaged_until_ns: engaged.min(now + MAX_ENGAGED_NS),
            share_ppm,
            tenant_key,
        },
    );
    now - began
}

/// A launch on `device` (on `stream`, where there is one) that `bucket`
/// holds back until `wake_at`: sleeps until then, less the idle time the
/// quiet board skips meanwhile. Until the driver says this process's
/// streams ran their work, it tells the board it still waits on the device
/// ([`still_waiting_on_the_device`]); then, that its bucket holds it back. When
/// every other active member is held back by its bucket too with its work
/// run, and their shares add up to the device, the device idles only
/// because the charges stood for more than the work took; this member then
/// skips that idle time for all of them
/// ([`dilu_layout::quiet::DeviceQuiet::skip_idle`]), and every held member
/// takes the skip off its bucket's debt and wakes that much sooner. Each
/// gains its share of the skipped time, so the split stays that of the
/// shares. (Work run by the launches' estimates was not enough: kernels
/// waiting behind another process's time slice run later than estimated,
/// and skips made while they ran gave a 30% tenant of 1 ms kernels 34% of
/// the used time.) Alone on the board, or with turns off, it just sleeps.
pub fn bucket_wait(
    device: usize,
    bucket: &TokenBucket,
    stream: Option<StreamRef>,
    wake_at: u64,
    now: u64,
) {
    let board = (enabled() && crate::sm_time::usage_feedback::may_be_shared(device))
        .then(|| quiet_samples::member(device, now))
        .flatten()
        .filter(|(board, slot)| board.others_active(*slot, now));
    let (Some((board, slot)), Some(stream)) = (board, stream) else {
        sleep_until(wake_at);
        return;
    };
    let mut taken = board.skipped_ns();
    bucket.note_skips(taken);
    let (mut wake_at, mut now) = (wake_at, now);
    let mut work_run = false;
    let mut said_waiting = false;
    while now < wake_at {
        let skipped = board.skipped_ns();
        if skipped > taken {
            bucket.take_skips(skipped, now);
            wake_at = wake_at.saturating_sub(skipped - taken);
            taken = skipped;
            continue;
        }
        if !work_run && quiet_samples::own_work_done(device, stream.stream, stream.per_thread) {
            work_run = true;
            // On the board's clock: wall clock plus the skips taken.
            board.hold_by_bucket(slot, wake_at.saturating_add(taken));
            if said_waiting {
                // Its work ran: it waits on the device no longer (its
                // bucket's hold says the rest).
                no_longer_waiting_on_the_device(device, board, slot, now);
            }
        }
        if !work_run {
            // The driver says its work has not run: later than estimated
            // (the device is shared), it still waits on the device.
            still_waiting_on_the_device(device, board, slot, now);
            said_waiting = true;
        }
        if work_run && board.skip_idle(slot, now).is_some() {
            continue;
        }
        sleep_until(wake_at.min(now + IDLE_POLL_NS));
        now = monotonic_ns();
    }
    if work_run {
        board.hold_by_bucket(slot, 0);
    }
}

/// This process, its launch held by its bucket while the driver says its
/// queued work has not run, tells the board it waits on the device until
/// its next look and one more. Queued work runs later than its
/// estimates say when the device is shared: in a 30/70 pair of loops of
/// sixteen 3 ms kernels, the 70% tenant's work, cut into time slices with
/// the other's, ran past its estimated end while its next launch waited for
/// tokens, and in those moments the 30% tenant, though far ahead in vtime,
/// launched 115 times in 4 s (once in every three launches) and took
/// 31.8–32.1% of the time the two used; told so, 49 times and 30.0%.
fn still_waiting_on_the_device(device: usize, board: &DeviceQuiet, slot: usize, now: u64) {
    let turn = &TURNS[device];
    let said = turn.engaged_until_ns.load(Ordering::Relaxed);
    let until = engaged_until(said, now + 2 * IDLE_POLL_NS);
    turn.engaged_until_ns.store(until, Ordering::Relaxed);
    board.engage_until(slot, until.min(now + MAX_ENGAGED_NS));
}

/// This process, its launch held by its bucket, said it still waited on
/// the device, and the driver now says its work ran: the others need not
/// wait for it until that engagement would have run out (up to two looks,
/// 200 µs of idle device each time in pairs of 1 ms kernels on 3 streams).
fn no_longer_waiting_on_the_device(device: usize, board: &DeviceQuiet, slot: usize, now: u64) {
    TURNS[device].engaged_until_ns.store(now, Ordering::Relaxed);
    board.engage_until(slot, now);
}

/// Whether this process comes back from idling on the device: for the
/// board's [`ACTIVE_WITHIN_NS`] it counted no launch here and waited on
/// nothing (or it never took turns, e.g. it ran alone until now).
fn back_from_idling(turn: &DeviceTurn, now: u64) -> bool {
    idle_since(
        turn.last_turn_ns.load(Ordering::Relaxed),
        turn.engaged_until_ns.load(Ordering::Relaxed),
        now,
    )
}

fn idle_since(last_turn: u64, engaged_until: u64, now: u64) -> bool {
    last_turn == 0 || now.saturating_sub(last_turn.max(engaged_until)) >= ACTIVE_WITHIN_NS
}

/// How long after the estimated end of the work a synchronisation waits
/// for (`waited` of it) this process expects to launch again, having come
/// back `learned` after such work lately: `None` where the board need not
/// know (back within [`RETURN_NS`], which holds others anyway), or where it
/// comes back later than that work and [`RETURN_NS`] more (host-bound: the
/// device is the other members' meanwhile).
///
/// A host-bound loop on a busy host comes back later than [`RETURN_NS`]: a
/// 70% tenant of one-graph request loops (227 µs of work) beside a 30% one
/// on 2 cores launched again 300–400 µs after its graph's estimated end
/// (the synchronisation's wake-up is late when both cores are busy). In
/// every such gap the 30% tenant ran a graph that the 70% one then waited
/// behind: the 30% tenant took 34–38% of the time the two used. A member
/// ahead now waits for one expected back before its own launch would end
/// (see [`dilu_layout::quiet::DeviceQuiet::owed_turn`]): 30.0 and 30.5 in
/// two runs (`scripts/bench.sh sm -- --only "k=1, graphs"`). Counting such
/// a member as waiting on the device until it is back, whatever the launch
/// ahead, split that pair as well but idled the device in every gap of
/// loops of 20 µs kernels on 3 streams: 92–93% of the device time the pair
/// used without dilu, against 100–101% this way.
fn expected_back_after(learned: u64, waited: u64) -> Option<u64> {
    (learned > RETURN_NS && learned <= RETURN_NS + waited).then_some(learned)
}

/// The estimate of how soon a member comes back after a synchronisation
/// (`learned`, 0: none yet) after one more `gap`: it rises a quarter of the
/// way to a longer gap and falls a sixteenth of the way to a shorter one,
/// so it sits among the longer gaps (two thirds of the way up an even
/// spread): a hold that ends before the member is back gains nothing.
fn learn_return_gap(learned: u64, gap: u64) -> u64 {
    let gap = gap.min(LONGEST_GAP_SAMPLE_NS);
    if learned == 0 {
        gap
    } else if gap > learned {
        learned + (gap - learned) / 4
    } else {
        learned - (learned - gap) / 16
    }
}

/// Until when a member whose queued work ends at `queue_end` waits on the
/// device, having said `engaged` before: until that work has run, never
/// cutting short what it said before.
fn engaged_until(engaged: u64, queue_end: u64) -> u64 {
    queue_end.max(engaged)
}

/// The device the calling thread synchronises on, where this process takes
/// turns there (its share is limited).
fn limited_device() -> Option<usize> {
    let sm = crate::sm_time::tenant_sm::get()?;
    let device = sm.current_device();
    (enabled() && is_limited(sm.budget().share_ppm(device))).then_some(device)
}

/// A synchronisation begins: on work not yet run, this process waits on the
/// device until that work's estimated end and [`RETURN_NS`] more (it may
/// run a little late, behind the other member's last kernel), and says when
/// it expects to be back where it learned that it comes later (see
/// [`expected_back_after`]). The next launch learns how soon it came.
#[inline]
pub fn sync_begin() {
    let Some(device) = limited_device() else {
        return;
    };
    let turn = &TURNS[device];
    let now = monotonic_ns();
    let queue_end = turn.queue_end_ns.load(Ordering::Relaxed);
    let pending = queue_end > now;
    turn.pending_sync.store(pending, Ordering::Relaxed);
    if pending && let Some((board, slot)) = quiet_samples::member(device, now) {
        turn.sync_work_end_ns.store(queue_end, Ordering::Relaxed);
        let learned = turn.return_gap_ns.load(Ordering::Relaxed);
        let back_at =
            expected_back_after(learned, queue_end - now).map_or(0, |gap| queue_end + gap);
        board.expect_back(slot, back_at.min(now + MAX_ENGAGED_NS));
        let until = queue_end + RETURN_NS;
        let until = until.max(turn.engaged_until_ns.load(Ordering::Relaxed));
        turn.engaged_until_ns.store(until, Ordering::Relaxed);
        board.engage_until(slot, until.min(now + MAX_ENGAGED_NS));
    }
}

/// The synchronisation returned. After waiting for work it queued, this
/// process still waits on the device for [`RETURN_NS`]: its next launches
/// come about that soon.
#[inline]
pub fn sync_end() {
    let Some(device) = limited_device() else {
        return;
    };
    let turn = &TURNS[device];
    if !turn.pending_sync.swap(false, Ordering::Relaxed) {
        return;
    }
    let now = monotonic_ns();
    if let Some((board, slot)) = quiet_samples::member(device, now) {
        // Work still queued on other streams keeps it waiting longer.
        let queue_end = turn.queue_end_ns.load(Ordering::Relaxed);
        let until = engaged_until(now + RETURN_NS, queue_end);
        turn.engaged_until_ns.store(until, Ordering::Relaxed);
        board.engage_until(slot, until.min(now + MAX_ENGAGED_NS));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_member_that_idled_or_never_took_turns_is_moved_up_to_the_leader() {
        let now = 10_000_000_000;
        assert!(idle_since(0, 0, now), "first turns");
        // Launched 1 ms ago, or waiting on work queued until now: active.
        assert!(!idle_since(now - 1_000_000, 0, now));
        assert!(!idle_since(now - 2 * ACTIVE_WITHIN_NS, now, now));
        // No launch and nothing queued for the board's activity window.
        assert!(idle_since(now - ACTIVE_WITHIN_NS, 0, now));
        assert!(idle_since(
            now - 3 * ACTIVE_WITHIN_NS,
            now - ACTIVE_WITHIN_NS,
            now
        ));
    }

    #[test]
    fn a_member_says_when_it_is_back_only_when_later_than_two_handoffs_and_within_its_work() {
        // The 70% tenant of a pair of one-graph loops on a busy 2-core
        // host: 227 µs of work, back about 330 µs after its estimated end.
        assert_eq!(expected_back_after(330_000, 227_000), Some(330_000));
        // Back within two hand-offs: the return window covers it already.
        assert_eq!(expected_back_after(50_000, 227_000), None);
        assert_eq!(expected_back_after(RETURN_NS, 227_000), None);
        // Back later than its work and two hand-offs more: host-bound, the
        // device is the others' meanwhile.
        assert_eq!(expected_back_after(600_000, 227_000), None);
        // A loop of one 20 µs kernel may say so for 20 µs beyond them.
        assert_eq!(
            expected_back_after(RETURN_NS + 20_000, 20_000),
            Some(RETURN_NS + 20_000)
        );
        assert_eq!(expected_back_after(RETURN_NS + 20_001, 20_000), None);
        // Nothing learned yet: nothing said.
        assert_eq!(expected_back_after(0, 227_000), None);
    }

    #[test]
    fn how_soon_a_member_comes_back_is_learned_from_its_longer_gaps() {
        // Gaps spread evenly over 200-400 µs: the estimate settles among
        // the longer ones, above the middle.
        let mut learned = 0;
        for i in 0..2_000u64 {
            learned = learn_return_gap(learned, 200_000 + (i * 7 % 11) * 20_000);
        }
        assert!((310_000..=360_000).contains(&learned), "learned {learned}");
        // One pause of a second counts as a time slice, and is unlearned
        // (back within its work's length) within a few dozen returns.
        let paused = learn_return_gap(learned, 1_000_000_000);
        assert_eq!(paused, learned + (LAG_NS - learned) / 4);
        assert_eq!(expected_back_after(paused, 227_000), None);
        let mut after = paused;
        let returns = (1..)
            .find(|_| {
                after = learn_return_gap(after, 300_000);
                expected_back_after(after, 227_000).is_some()
            })
            .unwrap();
        assert!(returns <= 40, "{returns} returns to unlearn a pause");
    }

    #[test]
    fn a_member_whose_work_has_not_run_while_its_bucket_holds_it_is_waited_for() {
        use dilu_layout::quiet::QuietBoard;
        use dilu_layout::shm::Region;
        let board = Region::<QuietBoard>::anonymous(|_| {}).unwrap();
        let device = 11; // no other test uses it
        let now = 50_000_000_000;
        let ahead = board.join(1, now, |_| true).unwrap();
        let behind = board.join(2, now, |_| true).unwrap();
        board.publish_turn(
            ahead,
            Turn {
                vtime_ns: 10 * LAG_NS,
                ..Turn::default()
            },
        );
        // Its work ran past the estimates: nothing said holds anybody.
        board.publish_turn(behind, Turn::default());
        assert_eq!(board.owed_turn(ahead, 10 * LAG_NS, LAG_NS, now, 0), None);
        // Held by its bucket, the driver says its work has not run yet.
        still_waiting_on_the_device(device, &board, behind, now);
        let until = board.owed_turn(ahead, 10 * LAG_NS, LAG_NS, now, 0);
        assert_eq!(until, Some(now + 2 * IDLE_POLL_NS));
        // Unless it looks again (its work still not run), that ends.
        let later = now + 2 * IDLE_POLL_NS;
        assert_eq!(board.owed_turn(ahead, 10 * LAG_NS, LAG_NS, later, 0), None);
        // Once the driver says its work ran, it takes that back at once.
        still_waiting_on_the_device(device, &board, behind, now);
        no_longer_waiting_on_the_device(device, &board, behind, now + 1);
        assert_eq!(
            board.owed_turn(ahead, 10 * LAG_NS, LAG_NS, now + 1, 0),
            None
        );
        // A longer wait it said before (queued work) is never cut short,
        // and the board is told at most its limit ahead.
        TURNS[device]
            .engaged_until_ns
            .store(now + 10 * MAX_ENGAGED_NS, Ordering::Relaxed);
        still_waiting_on_the_device(device, &board, behind, now);
        assert_eq!(
            board.owed_turn(ahead, 10 * LAG_NS, LAG_NS, now, 0),
            Some(now + MAX_ENGAGED_NS)
        );
    }

    #[test]
    fn queued_work_waits_on_the_device_until_it_ran() {
        let now = 1_000_000_000;
        // Four 100 µs kernels queued: waiting until they ran.
        assert_eq!(engaged_until(0, now + 400_000), now + 400_000);
        // A request loop's one 20 µs kernel counts too (on a time-sliced
        // device it costs the other member a hand-off either way).
        assert_eq!(engaged_until(0, now + 20_000), now + 20_000);
        // Work that ran says nothing new.
        assert_eq!(engaged_until(0, now - 1), now - 1);
        // What was said before is never cut short: the moment after a
        // synchronisation outlasts the short kernel launched in it.
        assert_eq!(
            engaged_until(now + RETURN_NS, now + 20_000),
            now + RETURN_NS
        );
    }
}
