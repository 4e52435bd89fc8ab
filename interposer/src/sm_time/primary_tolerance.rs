//! What a co-location primary's reported request latencies say about the
//! delay it tolerates: the slack of its worst recent requests against its
//! SLO, or, without an SLO, its p99 without fillers, learned from its own
//! requests (see `colocation.rs`, which applies the tolerance).

use dilu_colocation::{DELAY_BUDGET_PPM, HANDOFF_NS, ration_costs};
use dilu_layout::colocation::RATION_POINTS;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Requests whose latency bounds the tolerance in force.
pub(crate) const SLACK_WINDOW: usize = 8;

/// The last [`SLACK_WINDOW`] request latencies without the delay fillers
/// caused them (threads of a server may report at once; a lost race
/// overwrites one slot, never tears one).
pub(crate) struct RecentLatencies {
    next: AtomicU32,
    ns: [AtomicU64; SLACK_WINDOW],
    /// The boards' count of the primary's delay behind filler work at the
    /// last report.
    delay_seen_ns: AtomicU64,
}

impl RecentLatencies {
    pub(crate) const fn new() -> Self {
        Self {
            next: AtomicU32::new(0),
            ns: [const { AtomicU64::new(0) }; SLACK_WINDOW],
            delay_seen_ns: AtomicU64::new(0),
        }
    }

    /// A request's latency less the delay behind filler work the boards
    /// counted since the last report (`delay_ns` in all: at launches that
    /// were this request's). Judged on latencies with it in, the tolerance
    /// cut itself (fillers delayed requests, the slack shrank, fillers were
    /// kept out, the slack came back), and a Poisson primary at 96 req/s
    /// beside two fillers on simgpu alternated so.
    pub(crate) fn without_delay(&self, latency_ns: u64, delay_ns: u64) -> u64 {
        let since_last =
            delay_ns.saturating_sub(self.delay_seen_ns.swap(delay_ns, Ordering::Relaxed));
        latency_ns.saturating_sub(since_last)
    }

    /// Forgets the window (the delay seen stays: it is a running count).
    pub(crate) fn forget(&self) {
        for n in &self.ns {
            n.store(0, Ordering::Relaxed);
        }
        self.next.store(0, Ordering::Relaxed);
    }

    /// Records one latency; returns the worst of the window.
    pub(crate) fn record(&self, latency_ns: u64) -> u64 {
        let at = self.next.fetch_add(1, Ordering::Relaxed) as usize % SLACK_WINDOW;
        self.ns[at].store(latency_ns, Ordering::Relaxed);
        self.ns
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .max()
            .unwrap_or(latency_ns)
    }
}

/// Requests whose latencies a primary without an SLO measures what the
/// boards' count of its delay misses against (a median).
pub(crate) const HISTORY_WINDOW: usize = 256;
/// Requests a primary without an SLO learns its tail from: its p99, the
/// 12th longest of 1024. (Of 256, the 4th longest ranged 1.9-3.1 ms over
/// one run of a Poisson primary on simgpu whose p99 alone was 3.0 ms; a
/// low one judged requests within the true bound pushed over it, and
/// stopped fillers for half the run.)
pub(crate) const TAIL_WINDOW: usize = 1024;
/// Requests recorded before a learned tolerance is given at all.
pub(crate) const HISTORY_FIRST: u32 = 32;
/// Reported requests not learned from at all: a program's first requests
/// pay for its start (modules loaded, memory first touched), and one of
/// them set a p99 several times too long, a tolerance with it, and no
/// request beside which no filler went came to correct it.
pub(crate) const WARM_UP_REQUESTS: u64 = 16;
/// How much worse than its p99 alone a primary without an SLO may get: the
/// field's yardstick for a latency-critical tenant beside best-effort work.
pub(crate) const AS_IF_ALONE_P99_PERCENT: u64 = 10;

/// The last `N` request latencies of a primary without an SLO, without
/// the delay fillers caused them (written once per reported request; a
/// lost race overwrites one slot).
pub(crate) struct LatencyHistory<const N: usize> {
    next: AtomicU32,
    ns: [AtomicU64; N],
}

impl<const N: usize> LatencyHistory<N> {
    pub(crate) const fn new() -> Self {
        Self {
            next: AtomicU32::new(0),
            ns: [const { AtomicU64::new(0) }; N],
        }
    }

    /// Forgets every latency recorded.
    pub(crate) fn forget(&self) {
        self.next.store(0, Ordering::Relaxed);
    }

    /// Records one latency.
    pub(crate) fn record(&self, latency_ns: u64) {
        let count = self.next.fetch_add(1, Ordering::Relaxed);
        self.ns[count as usize % N].store(latency_ns, Ordering::Relaxed);
    }

    /// The window's p99 ([`Tail::p99_ns`]), once [`HISTORY_FIRST`] requests
    /// were recorded.
    #[cfg(test)]
    fn p99(&self) -> Option<u64> {
        self.tail(1_000_000, 0).map(|tail| tail.p99_ns)
    }

    /// The latencies recorded (the last `N`), in no order; `None` until
    /// [`HISTORY_FIRST`] were.
    fn window(&self) -> Option<([u64; N], usize)> {
        let count = self.next.load(Ordering::Relaxed);
        if count < HISTORY_FIRST {
            return None;
        }
        let known = (count as usize).min(N);
        let mut window = [0u64; N];
        for (slot, n) in window.iter_mut().zip(&self.ns) {
            *slot = n.load(Ordering::Relaxed);
        }
        Some((window, known))
    }

    /// The window's median, once [`HISTORY_FIRST`] requests were recorded.
    pub(crate) fn median(&self) -> Option<u64> {
        let (mut window, known) = self.window()?;
        Some(*window[..known].select_nth_unstable(known / 2).1)
    }

    /// The window's p99 and the latency fillers keeping the device
    /// `filler_ppm` of the time may push requests over the bound from
    /// ([`Tail`]), every latency taken `uncounted_ns` shorter; `None`
    /// until [`HISTORY_FIRST`] requests were recorded. (Selected, not
    /// sorted: a report costs a few µs of the primary's host time.)
    pub(crate) fn tail(&self, filler_ppm: u64, uncounted_ns: u64) -> Option<Tail> {
        let (mut window, known) = self.window()?;
        let window = &mut window[..known];
        for latency in window.iter_mut() {
            *latency = latency.saturating_sub(uncounted_ns);
        }
        // The rank-th longest (1: the longest).
        let mut longest = |rank: usize| *window.select_nth_unstable(known - rank.clamp(1, known)).1;
        let share_ppm = (DELAY_BUDGET_PPM as u64 * 1_000_000) / filler_ppm.max(1);
        let p99_ns = longest(known / 100 + 2);
        let pushable_ns = longest(((known as u64 * share_ppm / 1_000_000) as usize).max(2));
        Some(Tail {
            p99_ns,
            pushable_ns,
            ration_costs: ration_costs(window, as_if_alone_bound(p99_ns)),
        })
    }
}

/// What a primary's latencies alone say about its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tail {
    /// The p99: the (n/100 + 2)-th longest of n, so that one outlier among
    /// few samples (a request that waited for the host) does not set it;
    /// with the whole window, the 12th longest of 1024.
    pub(crate) p99_ns: u64,
    /// The latency that only the requests fillers may push over the bound
    /// exceed: a request arrives during filler work about as often as
    /// fillers keep the device, and at most [`DELAY_BUDGET_PPM`] of all
    /// requests may be pushed over, so the latency above which lie
    /// `DELAY_BUDGET_PPM / filler_ppm` of the window's requests (at least
    /// the two longest: one outlier does not set it).
    pub(crate) pushable_ns: u64,
    /// What a filler kernel of each of the ration's lengths costs this
    /// tail (`dilu_colocation::ration`).
    pub(crate) ration_costs: [u64; RATION_POINTS],
}

/// The bound of a primary without an SLO: 10% over its p99 alone.
pub(crate) fn as_if_alone_bound(p99_ns: u64) -> u64 {
    p99_ns + p99_ns * AS_IF_ALONE_P99_PERCENT / 100
}

/// How long fillers' share of the device is averaged over.
const OCCUPANCY_SMOOTHING_NS: u64 = 500_000_000;

/// The share of the time (ppm) fillers kept the device lately: the filler
/// work the boards counted per wall time between reported requests,
/// averaged over about [`OCCUPANCY_SMOOTHING_NS`]. It starts at the whole
/// time, the cautious guess, until reports show otherwise.
pub(crate) struct FillerOccupancy {
    last_ns: AtomicU64,
    last_filled_ns: AtomicU64,
    ppm: AtomicU64,
}

impl FillerOccupancy {
    pub(crate) const fn new() -> Self {
        Self {
            last_ns: AtomicU64::new(0),
            last_filled_ns: AtomicU64::new(0),
            ppm: AtomicU64::new(1_000_000),
        }
    }

    /// At a report at `now`, when the boards had counted `filled_ns` of
    /// filler work in all: the share, updated.
    pub(crate) fn update(&self, now: u64, filled_ns: u64) -> u64 {
        let last = self.last_ns.swap(now, Ordering::Relaxed);
        let before = self.last_filled_ns.swap(filled_ns, Ordering::Relaxed);
        let old = self.ppm.load(Ordering::Relaxed);
        if last == 0 || now <= last {
            return old;
        }
        let elapsed = now - last;
        let sample = (u128::from(filled_ns.saturating_sub(before)) * 1_000_000
            / u128::from(elapsed))
        .min(1_000_000) as u64;
        let weight = u128::from(elapsed);
        let total = weight + u128::from(OCCUPANCY_SMOOTHING_NS);
        let ppm =
            ((u128::from(old) * (total - weight) + u128::from(sample) * weight) / total) as u64;
        self.ppm.store(ppm, Ordering::Relaxed);
        ppm
    }
}

/// The tolerance of a primary without an SLO, from its latencies without
/// fillers. Its bound, 10% over its p99, is what its requests must keep
/// to; a request that finds a filler kernel on the device waits for the
/// rest of it and the hand-off back. (Only a request arriving during the
/// hand-off to the filler also waits for that one, and fillers keep the
/// device in turns, so that hand-off comes once per gap they take, not
/// once per kernel. Charged both at every kernel, fillers harvested 45% of
/// the idle time over the field benchmark's 8 inference shapes on simgpu,
/// 56% charged one, with no worse p99.)
/// Requests arrive during filler work about as often as fillers keep the
/// device, and at most [`DELAY_BUDGET_PPM`] of them may be pushed over the
/// bound: so a filler kernel may be as long as the slack of `tail_ns`, the
/// latency only that many exceed ([`Tail::pushable_ns`]), less the
/// hand-off. Fillers that seldom run may go longer; ones that keep the
/// device busy, about a tenth of the p99 (a request at the p99 then stays
/// within the bound). Out of credit for delayed requests (`in_credit`
/// false), that tenth. Cut, like a set tolerance, to the slack the worst
/// recent request left (less both hand-offs: one recent request is no
/// average). (With the tenth always, a primary of 2.5 ms p99 tolerated
/// nothing beside 140 µs hand-offs, and fillers harvested 0-7% of its
/// idle time on simgpu.)
pub(crate) fn learned_tolerance(
    p99_ns: u64,
    tail_ns: u64,
    worst_recent_ns: u64,
    in_credit: bool,
) -> u64 {
    let bound = as_if_alone_bound(p99_ns);
    let tenth = (p99_ns * AS_IF_ALONE_P99_PERCENT / 100).saturating_sub(HANDOFF_NS);
    let tolerance = if in_credit {
        bound
            .saturating_sub(tail_ns.min(p99_ns))
            .saturating_sub(HANDOFF_NS)
            .max(tenth)
    } else {
        tenth
    };
    tolerance_within_slack(tolerance, bound, worst_recent_ns)
}

/// Whether fillers pushed a request of `latency_ns` (`alone_ns` without the
/// delay they caused) over the bound of a primary without an SLO, 10% over
/// its p99 (`None`: not learned yet; fillers have no credit to gamble with
/// before the budget earned one, so no request is theirs to judge).
pub(crate) fn pushed_over_bound(latency_ns: u64, alone_ns: u64, p99_ns: Option<u64>) -> bool {
    p99_ns.is_some_and(|p99| {
        let bound = as_if_alone_bound(p99);
        latency_ns > bound && alone_ns <= bound
    })
}

/// Whether a request that ended at `now` after `latency_ns` had arrived
/// before the one before it ended (at `previous_end`, 0: none): it waited
/// in the program's queue, so more may be waiting behind it.
pub(crate) fn waited_behind_previous(now: u64, latency_ns: u64, previous_end: u64) -> bool {
    previous_end != 0 && now.saturating_sub(latency_ns) < previous_end
}

/// The tolerance in force: a filler kernel delays a request by at most the
/// tolerance and the hand-offs to the filler and back, so it may be at
/// most the slack the worst recent request left without fillers, less
/// those hand-offs (a request like it then still meets the SLO).
pub(crate) fn tolerance_within_slack(configured_ns: u64, slo_ns: u64, worst_recent_ns: u64) -> u64 {
    let slack = slo_ns
        .saturating_sub(worst_recent_ns)
        .saturating_sub(2 * HANDOFF_NS);
    configured_ns.min(slack)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tolerance_shrinks_to_the_worst_recent_slack_and_comes_back() {
        const MS: u64 = 1_000_000;
        let recent = RecentLatencies::new();
        let tolerance = |latency| tolerance_within_slack(2 * MS, 15 * MS, recent.record(latency));
        assert_eq!(tolerance(4 * MS), 2 * MS, "ample slack: all of it");
        assert_eq!(
            tolerance(14 * MS),
            MS - 2 * HANDOFF_NS,
            "1 ms of slack left, less the hand-offs"
        );
        assert_eq!(tolerance(16 * MS), 0, "a violation: none");
        for _ in 0..SLACK_WINDOW - 1 {
            assert_eq!(tolerance(4 * MS), 0, "the violation is still recent");
        }
        assert_eq!(tolerance(4 * MS), 2 * MS, "aged out");
    }

    #[test]
    fn the_slack_is_judged_without_the_delay_fillers_caused() {
        const MS: u64 = 1_000_000;
        let recent = RecentLatencies::new();
        let mut delay_total = 0;
        // Requests of 3 ms alone under a 6 ms SLO, each delayed 2 ms by a
        // filler kernel: the slack without fillers is 3 ms every time, so
        // the tolerance stays, request after request.
        for request in 0..3 * SLACK_WINDOW {
            delay_total += 2 * MS;
            let worst = recent.record(recent.without_delay(5 * MS, delay_total));
            assert_eq!(worst, 3 * MS, "request {request}");
            assert_eq!(
                tolerance_within_slack(3 * MS, 6 * MS, worst),
                3 * MS - 2 * HANDOFF_NS
            );
        }
        // A request slow on its own still cuts it.
        let worst = recent.record(recent.without_delay(5 * MS + 500_000, delay_total));
        assert_eq!(
            tolerance_within_slack(3 * MS, 6 * MS, worst),
            MS / 2 - 2 * HANDOFF_NS
        );
    }

    #[test]
    fn without_an_slo_the_tolerance_is_a_tenth_of_the_p99_less_the_hand_off_back() {
        const MS: u64 = 1_000_000;
        let history = LatencyHistory::<TAIL_WINDOW>::new();
        assert!(!pushed_over_bound(5 * MS, 4 * MS, None), "no bound yet");
        assert!(
            pushed_over_bound(4_500_000, 4 * MS, Some(4 * MS)),
            "over 4.4 ms"
        );
        assert!(
            !pushed_over_bound(4_300_000, 3 * MS, Some(4 * MS)),
            "within"
        );
        assert!(
            !pushed_over_bound(6 * MS, 5 * MS, Some(4 * MS)),
            "over the bound alone: not the fillers' doing"
        );
        // Fewer than HISTORY_FIRST requests: nothing learned yet.
        history.record(30 * MS);
        assert_eq!(history.p99(), None, "one slow request");
        for _ in 2..HISTORY_FIRST {
            history.record(4 * MS);
            assert_eq!(history.p99(), None);
        }
        history.record(4 * MS);
        assert_eq!(
            history.p99(),
            Some(4 * MS),
            "one outlier among few requests does not set the p99"
        );
        // One request of 10 ms in 200, the others 4 ms: the p99 is 4 ms.
        let mut p99 = None;
        for k in 0..400u64 {
            history.record(if k % 200 == 199 { 10 * MS } else { 4 * MS });
            p99 = history.p99();
        }
        assert_eq!(p99, Some(4 * MS));
        // In credit, fillers keeping the device busy all the time: the
        // tail is about the p99, and the tolerance a tenth of it less the
        // hand-off back to the primary.
        let tenth = 400_000 - HANDOFF_NS;
        assert_eq!(learned_tolerance(4 * MS, 4 * MS, 3 * MS, true), tenth);
        // Fillers seldom on the device: the tail is shorter (3 ms), and a
        // filler kernel may be as long as its slack against the bound.
        assert_eq!(
            learned_tolerance(4 * MS, 3 * MS, 2 * MS, true),
            1_400_000 - HANDOFF_NS
        );
        // ... cut to the slack of the worst recent request (3.5 ms).
        assert_eq!(
            learned_tolerance(4 * MS, 3 * MS, 3_500_000, true),
            900_000 - 2 * HANDOFF_NS
        );
        // Out of credit: the tenth; a recent request as slow as the bound
        // (4.4 ms) leaves no slack either way.
        assert_eq!(learned_tolerance(4 * MS, 3 * MS, 2 * MS, false), tenth);
        assert_eq!(learned_tolerance(4 * MS, 3 * MS, 4_400_000, true), 0);
        // A p99 of 2 ms, fillers always on: kernels of 60 µs (a tenth of
        // it less the hand-off back); one of 1.4 ms, none.
        assert_eq!(learned_tolerance(2 * MS, 2 * MS, MS, true), 60_000);
        assert_eq!(learned_tolerance(1_400_000, 1_400_000, MS, true), 0);
        // Most requests slow, the tail follows: the p99 is the slow one.
        for _ in 0..HISTORY_WINDOW {
            history.record(20 * MS);
            p99 = history.p99();
        }
        assert_eq!(p99, Some(20 * MS));
    }

    #[test]
    fn the_tail_fillers_may_push_over_shrinks_as_they_keep_the_device_busier() {
        const MS: u64 = 1_000_000;
        let history = LatencyHistory::<TAIL_WINDOW>::new();
        // 256 requests of 1 to 256 ms.
        for k in 1..=HISTORY_WINDOW as u64 {
            history.record(k * MS);
        }
        assert_eq!(history.p99(), Some(253 * MS), "the 4th longest");
        // Fillers on the device all the time: only the two longest
        // (0.5% of 256, at least two) may be pushed over.
        let pushable = |ppm| history.tail(ppm, 0).map(|t| t.pushable_ns);
        assert_eq!(pushable(1_000_000), Some(255 * MS));
        // A tenth of the time: a tenth of the requests arrive during
        // filler work and 0.5% of all may be pushed over, so those of the
        // 5% longest (12 of 256) may be.
        assert_eq!(pushable(100_000), Some(245 * MS));
        // Never: every request may be (the shortest).
        assert_eq!(pushable(0), Some(MS));
        assert_eq!(history.tail(0, 0).map(|t| t.p99_ns), history.p99());
        // Delay the boards missed (the median of every request's over the
        // clean ones') comes off every latency.
        assert_eq!(history.median(), Some(129 * MS));
        assert_eq!(history.tail(0, 10 * MS).map(|t| t.p99_ns), Some(243 * MS));
        // The window full, 1024 requests of 1 to 1024 ms after them: the
        // p99 is the 12th longest of the last 1024, and the first 256 are
        // forgotten.
        for k in 1..=TAIL_WINDOW as u64 {
            history.record(k * MS);
        }
        assert_eq!(history.p99(), Some(1013 * MS));
        assert_eq!(history.median(), Some(513 * MS));
    }

    #[test]
    fn one_slow_stretch_of_requests_moves_the_learned_p99_little() {
        const MS: u64 = 1_000_000;
        let history = LatencyHistory::<TAIL_WINDOW>::new();
        // A steady primary: one request in 50 takes 3 ms, the others 1 ms,
        // so 2% of them are at 3 ms and its p99 is 3 ms.
        for k in 0..TAIL_WINDOW {
            history.record(if k % 50 == 49 { 3 * MS } else { MS });
        }
        assert_eq!(history.p99(), Some(3 * MS));
        // A stretch of 256 requests with none slow (a quiet spell of a
        // random primary): judged on those alone, its p99 would be 1 ms and
        // every delayed request would look pushed over a bound of 1.1 ms.
        for _ in 0..256 {
            history.record(MS);
        }
        assert_eq!(
            history.p99(),
            Some(3 * MS),
            "the window still holds 15 slow ones"
        );
    }

    #[test]
    fn fillers_share_of_the_device_starts_whole_and_follows_their_work() {
        const MS: u64 = 1_000_000;
        let occupancy = FillerOccupancy::new();
        assert_eq!(occupancy.update(1_000 * MS, 0), 1_000_000, "first report");
        // No filler work for a smoothing period: halfway down.
        assert_eq!(occupancy.update(1_500 * MS, 0), 500_000);
        // Fillers busy 20% of a long stretch: close to 20%.
        let share = occupancy.update(11_500 * MS, 2_000 * MS);
        assert!((200_000..230_000).contains(&share), "{share}");
    }

    #[test]
    fn a_request_that_arrived_before_the_previous_one_ended_had_waited() {
        const MS: u64 = 1_000_000;
        let now = 1_000 * MS;
        assert!(!waited_behind_previous(now, 3 * MS, 0), "the first request");
        assert!(waited_behind_previous(now, 3 * MS, now - 2 * MS));
        assert!(!waited_behind_previous(now, 3 * MS, now - 4 * MS));
        assert!(!waited_behind_previous(now, 3 * MS, now - 3 * MS));
    }
}
