//! What a co-location primary learns from its requests, reported with
//! `dilu_report_latency`, or, where it reports none, from its busy periods:
//! the tolerance in force, and its tail, bound, risk ration and budget of
//! delayed requests as if alone (which keep a primary without an SLO, and
//! set the least tolerance of one with an SLO), published on its boards
//! (`colocation.rs` owns the process's boards and calls in here).

use crate::sm_time::colocation_config::ColoConfig;
use crate::sm_time::primary_tolerance::{
    FillerOccupancy, HISTORY_WINDOW, LatencyHistory, RecentLatencies, TAIL_WINDOW,
    WARM_UP_REQUESTS, learned_tolerance, pushed_over_bound, tolerance_within_slack,
    waited_behind_previous,
};
use crate::sm_time::run_queue_wait;
use dilu_colocation::{Board, GapEnded, predict_gap, record_in_ring};
use dilu_layout::colocation::HISTORY;
use dilu_layout::monotonic_ns;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};

/// The boards of the process's devices, by in-process device.
#[derive(Clone, Copy)]
pub(crate) struct Boards<'a> {
    of: &'a dyn Fn(usize) -> Board<'a>,
    devices: usize,
}

impl<'a> Boards<'a> {
    pub(crate) fn new(of: &'a dyn Fn(usize) -> Board<'a>, devices: usize) -> Self {
        Self { of, devices }
    }

    fn each(self) -> impl Iterator<Item = Board<'a>> {
        (0..self.devices).map(self.of)
    }

    /// The primary's delay behind filler work the boards counted, in all.
    fn delay_ns(self) -> u64 {
        self.each().map(|board| board.primary_delay_ns()).sum()
    }

    fn set_tolerance(self, tolerance_ns: u64) {
        for board in self.each() {
            board.set_tolerance(tolerance_ns);
        }
    }
}

/// What a primary process learned, kept across its requests.
pub(crate) struct Learning {
    /// The primary's last reported request latencies, less the delay
    /// fillers caused them.
    recent_latencies: RecentLatencies,
    /// The latencies of its requests beside which no filler went at all
    /// (what the boards' count of the delay misses is measured against
    /// them).
    latency_history: LatencyHistory<HISTORY_WINDOW>,
    /// Every warm request's latency less the delay the boards counted,
    /// from which its tail, tolerance and risk ration are learned.
    all_latencies: LatencyHistory<TAIL_WINDOW>,
    /// Requests reported so far.
    requests_reported: AtomicU64,
    /// The delay fillers caused the last reported request, its own and what
    /// it inherited by waiting behind the one before.
    carried_delay_ns: AtomicU64,
    /// The part of it its thread's waits for a CPU were.
    carried_host_wait_ns: AtomicU64,
    /// The boards' count of filler work at the last reported request, and
    /// at the one before it.
    filled_at_last_report: AtomicU64,
    filled_before_last_report: AtomicU64,
    /// When the primary's last reported request ended (0: none yet).
    last_request_end: AtomicU64,
    /// How much of the time fillers kept the device lately, for the
    /// learned tolerance.
    filler_occupancy: FillerOccupancy,
    /// Whether the primary reported a request; until it does, its busy
    /// periods stand in for its requests ([`Learning::busy_period_over`]).
    reports_requests: AtomicBool,
    /// When its current busy period began (0: none yet).
    busy_began: AtomicU64,
    /// Busy periods learned from (until the first report).
    busy_periods_learned: AtomicU64,
    /// The gaps that ended its busy periods.
    period_ends: PeriodEnds,
}

/// One request (or busy period standing in for one) to learn from.
struct Request {
    latency_ns: u64,
    /// The boards' count of the primary's delay behind filler work, in all,
    /// when it ended.
    delay_ns: u64,
    /// How long the reporting thread waited for a CPU since its last report.
    host_wait_ns: u64,
    /// It waited behind the one before.
    queued: bool,
}

/// The primary's last gaps that ended busy periods (those that began at a
/// synchronisation). Whether they repeat tells a loop from a server: the
/// board's prediction, from every fillable gap, finds a period in a
/// server's requests too where an eager framework's host leaves the same
/// gaps between the same launches of each (five such gaps and one random
/// one between requests still agree with those a period before in all but
/// a sixth).
struct PeriodEnds {
    ring: [AtomicU64; HISTORY],
    seen: AtomicU64,
}

impl PeriodEnds {
    const fn new() -> Self {
        Self {
            ring: [const { AtomicU64::new(0) }; HISTORY],
            seen: AtomicU64::new(0),
        }
    }

    /// Records a gap of `length_ns`; whether the recent ones repeat.
    fn record_and_repeat(&self, length_ns: u64) -> bool {
        let (recent, known) = record_in_ring(&self.ring, &self.seen, length_ns);
        predict_gap(&recent[..known]).period != 0
    }
}

impl Learning {
    pub(crate) const fn new() -> Self {
        Self {
            recent_latencies: RecentLatencies::new(),
            latency_history: LatencyHistory::new(),
            all_latencies: LatencyHistory::new(),
            requests_reported: AtomicU64::new(0),
            carried_delay_ns: AtomicU64::new(0),
            carried_host_wait_ns: AtomicU64::new(0),
            filled_at_last_report: AtomicU64::new(0),
            filled_before_last_report: AtomicU64::new(0),
            last_request_end: AtomicU64::new(0),
            filler_occupancy: FillerOccupancy::new(),
            reports_requests: AtomicBool::new(false),
            busy_began: AtomicU64::new(0),
            busy_periods_learned: AtomicU64::new(0),
            period_ends: PeriodEnds::new(),
        }
    }

    /// A request of `latency_ns` the primary reported, on `current`'s
    /// device: the request is over (its gap opens to fillers at once, or
    /// after the hold-off where it had waited behind the request before
    /// it), and the tolerance in force is cut to the slack of the worst
    /// recent request.
    pub(crate) fn request_reported(
        &self,
        config: &ColoConfig,
        boards: Boards<'_>,
        current: Board<'_>,
        latency_ns: u64,
    ) {
        if !self.reports_requests.swap(true, Relaxed) && self.busy_periods_learned.load(Relaxed) > 0
        {
            self.forget_busy_periods(config, boards);
        }
        let now = monotonic_ns();
        let previous_end = self.last_request_end.swap(now, Relaxed);
        let queued = waited_behind_previous(now, latency_ns, previous_end);
        current.primary_request_over(queued);
        let host_wait_ns = if config.slo_ns.is_some() || config.tolerance_learned {
            run_queue_wait::since_last_call()
        } else {
            0
        };
        let request = Request {
            latency_ns,
            delay_ns: boards.delay_ns(),
            host_wait_ns,
            queued,
        };
        if let Some(tolerance) = self.learn_request(config, boards, request, now) {
            boards.set_tolerance(tolerance);
        }
    }

    /// A primary kept as if alone that reports no requests (a server that
    /// does not call `dilu_report_latency`, as most do not): each of its busy
    /// periods, from a launch after a gap of at least the hold-off that
    /// began at a synchronisation to the start of the next such gap, stands
    /// in for a request. (A server synchronises to read a request's result;
    /// where its queue merely runs dry, an eager framework's host is
    /// between two launches of one request. Until a gap begins at a
    /// synchronisation, any gap of the hold-off ends one: the program may
    /// wait for its work through calls dilu does not see, a blocking copy.)
    /// Its tail, bound, tolerance, risk ration and budget are then learned
    /// from them as from reported requests, and a return that met filler
    /// work costs the budget only where the delay pushed its busy period
    /// over the bound. (Judged by its returns alone, every return that met
    /// filler work cost a whole one, and fillers beside a BERT server at
    /// 3 req/s on simgpu got 4% of its idle time.) Not where those gaps
    /// repeat: a loop's phases are not requests, and its returns judge them
    /// (a tenth of a training step's p99 per gap would be fillers' to take).
    /// Called for a primary kept as if alone (`tolerance_learned`) at each
    /// such gap.
    #[cold]
    pub(crate) fn busy_period_over(
        &self,
        config: &ColoConfig,
        boards: Boards<'_>,
        gap: GapEnded,
        now: u64,
    ) {
        if self.reports_requests.load(Relaxed) {
            return;
        }
        let repeat = self.period_ends.record_and_repeat(gap.length_ns);
        let began = self.busy_began.swap(now, Relaxed);
        if began == 0 || gap.start_ns <= began || repeat {
            return;
        }
        self.busy_periods_learned.fetch_add(1, Relaxed);
        // This launch's delay is the next busy period's.
        let request = Request {
            latency_ns: gap.start_ns - began,
            delay_ns: boards.delay_ns().saturating_sub(gap.delay_ns),
            host_wait_ns: 0,
            queued: false,
        };
        if let Some(tolerance) = self.learn_request(config, boards, request, now) {
            boards.set_tolerance(tolerance);
        }
    }

    /// The primary reports its requests after all: what its busy periods
    /// taught is forgotten, and its requests are learned from the start.
    fn forget_busy_periods(&self, config: &ColoConfig, boards: Boards<'_>) {
        self.recent_latencies.forget();
        self.latency_history.forget();
        self.all_latencies.forget();
        self.requests_reported.store(0, Relaxed);
        self.carried_delay_ns.store(0, Relaxed);
        self.carried_host_wait_ns.store(0, Relaxed);
        for board in boards.each() {
            board.set_tolerance(config.tolerance_ns);
            board.keep_as_if_alone();
        }
    }

    /// Learns from one `request`: the tolerance then in force, or `None`
    /// where the primary has none to learn (a set tolerance without an SLO).
    fn learn_request(
        &self,
        config: &ColoConfig,
        boards: Boards<'_>,
        request: Request,
        now: u64,
    ) -> Option<u64> {
        let Request {
            latency_ns,
            delay_ns,
            host_wait_ns,
            queued,
        } = request;
        if config.slo_ns.is_none() && !config.tolerance_learned {
            return None;
        }
        // Its thread's wait for a CPU is no latency alone either.
        // (Learned with it, 10-15 waits of 1-3 ms per 1000 requests,
        // the device idle meanwhile, on a 2-core host whose fillers
        // kept the device 85% busy set a p99 of 6-8 ms where alone it
        // was 3-4 ms, the tolerance grew with it to 0.5-0.7 ms, and
        // the p99 reached 2-3.5 times alone's.)
        let counted = latency_ns - self.recent_latencies.without_delay(latency_ns, delay_ns);
        let own = counted.saturating_add(host_wait_ns).min(latency_ns);
        // A request that waited behind the one before it waited for
        // that one's delay too: judged, a request pushed over its bound
        // by a delay it inherited counts as the fillers' doing.
        let carried = if queued {
            self.carried_delay_ns.load(Relaxed)
        } else {
            0
        };
        let delay = own.saturating_add(carried).min(latency_ns);
        self.carried_delay_ns.store(delay, Relaxed);
        let carried_wait = if queued {
            self.carried_host_wait_ns.load(Relaxed)
        } else {
            0
        };
        // Nor is it the fillers' to answer for: a request is pushed
        // over by them only where it is over the bound without its
        // wait for a CPU. (Charged to them too, their budget ran out
        // in quiet spells of the same runs, and they kept 2-45% of
        // the idle time in 8 of 13.)
        let host_wait = host_wait_ns.saturating_add(carried_wait).min(delay);
        self.carried_host_wait_ns.store(host_wait, Relaxed);
        let alone = latency_ns - delay;
        // Its latency alone is learned less its own delay only: the
        // delay carried from the request it queued behind judges it
        // (below), but is no measure of what that request's end moved
        // by. Set against the same arrivals alone on simgpu, requests
        // queued behind a delayed one were carried 0.2-1.9 ms on
        // average over 8 shapes of the field benchmark while their
        // latency rose by -0.8 to +0.6 ms (their host ran faster
        // beside busy fillers), and the p99 learned less the carried
        // delay read 0.53-0.92 of the p99 alone (0.64-1.00 without
        // it, each the p99 the primary had beside its fillers). That
        // low a bound priced a filler kernel at 2-5 times what the
        // latencies alone give: beside a Poisson primary at 229 req/s
        // fillers kept 47-55% of its idle time, 62-63% learned
        // without it (its p99 0.91-0.98x alone both ways).
        let learned = latency_ns - own;
        // Against an SLO, a wait for a CPU spent the slack all the same.
        let worst = self.recent_latencies.record(if config.slo_ns.is_some() {
            latency_ns - counted
        } else {
            learned
        });
        // The boards' count of the delay misses some (a filler kernel
        // longer than its estimate, the host's CPUs the fillers use):
        // learned from every request less only that count, the p99
        // crept up with the fillers' work, the tolerance and the bound
        // with it (on simgpu, 1.1 to 1.6 ms in 5 s beside a filler of
        // 0.5 ms kernels). Requests beside which no filler went at all
        // are kept apart, to measure what the count misses.
        let filled: u64 = boards.each().map(|board| board.filled_ns()).sum();
        // Clean: no filler work was launched since the report before
        // the last (a kernel launched just before the last report may
        // still have been running in this request).
        let before = self.filled_at_last_report.swap(filled, Relaxed);
        let earlier = self.filled_before_last_report.swap(before, Relaxed);
        let warm = self.requests_reported.fetch_add(1, Relaxed) >= WARM_UP_REQUESTS;
        // (A wait for a CPU of its own leaves it clean: its latency less the
        // wait is as if alone all the same.)
        let clean = warm && earlier == filled && counted == 0 && carried == 0;
        if clean {
            self.latency_history.record(learned);
        }
        if warm {
            self.all_latencies.record(learned);
        }
        let filler_ppm = self.filler_occupancy.update(now, filled);
        // Learned from clean requests only, the tail missed the
        // requests that waited behind another (few, and seldom clean
        // where fillers go often): a Poisson primary at 31 req/s on
        // simgpu learned a p99 of 2.1 ms where its p99 alone was
        // 3.3 ms, and every request looked near its bound. So every
        // request counts, less the delay the boards counted and less
        // what they missed, the excess of all requests' median over
        // the clean ones'.
        let uncounted = match (self.all_latencies.median(), self.latency_history.median()) {
            (Some(all), Some(clean)) => all.saturating_sub(clean),
            _ => 0,
        };
        let tail = self.all_latencies.tail(filler_ppm, uncounted);
        let pushed_over = pushed_over_bound(latency_ns - host_wait, alone, tail.map(|t| t.p99_ns));
        for board in boards.each() {
            board.primary_request_judged(pushed_over);
        }
        if let Some(t) = &tail {
            for board in boards.each() {
                board.publish_ration(now, &t.ration_costs);
            }
        }
        let in_credit = boards.each().all(|board| board.delay_credit() > 0.0);
        let as_if_alone = tail.map_or(0, |t| {
            learned_tolerance(t.p99_ns, t.pushable_ns, worst, in_credit)
        });
        Some(match config.slo_ns {
            // An SLO's slack is the fillers' to spend; where the primary's
            // own requests leave none (it misses the SLO alone), it is kept
            // as if alone instead: a declared SLO never holds fillers back
            // more than none would. (Held to the slack, beside Poisson
            // primaries that missed an 18 ms and a 9 ms SLO in 6-11% of
            // their requests alone, fillers kept 65% and 53% of the idle
            // time on simgpu; so, 77-79% and 70-73%, as without the SLO,
            // with up to 3 points more requests over the SLO than alone.)
            // Not beyond a tolerance the operator set.
            Some(slo) if config.tolerance_set => {
                tolerance_within_slack(config.tolerance_ns, slo, worst)
            }
            Some(slo) => tolerance_within_slack(config.tolerance_ns, slo, worst).max(as_if_alone),
            None => as_if_alone,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm_time::colocation_config::from_env;
    use dilu_colocation::DEFAULT_HOLDOFF_NS;
    use dilu_layout::colocation::GapBoard;
    use dilu_layout::shm::Region;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_queued_request_is_learned_without_the_delay_of_the_one_before_but_judged_with_it() {
        let config = from_env(|var| (var == "DILU_COLO").then(|| "primary".to_string()))
            .unwrap()
            .unwrap();
        assert!(config.tolerance_learned && config.slo_ns.is_none());
        let region = Region::<GapBoard>::anonymous(|_| {}).unwrap();
        let of = |_| Board::new(region.device(0));
        let boards = Boards::new(&of, 1);
        let board = of(0);
        board.attach_primary(1, 0, DEFAULT_HOLDOFF_NS);
        board.keep_as_if_alone();
        let learning = Learning::new();
        let (mut now, mut counted) = (MS, 0);
        let mut report = |latency_ns: u64, own_delay_ns: u64, queued: bool| {
            now += 10 * MS;
            counted += own_delay_ns;
            let request = Request {
                latency_ns,
                delay_ns: counted,
                host_wait_ns: 0,
                queued,
            };
            learning.learn_request(&config, boards, request, now);
        };
        // Pairs of 3 ms requests: the first delayed 1 ms behind filler
        // work (2 ms alone), the second queued behind it and not delayed
        // itself. Half the requests take 3 ms less their own delay.
        for _ in 0..600 {
            report(3 * MS, MS, false);
            report(3 * MS, 0, true);
        }
        let tail = learning.all_latencies.tail(1_000_000, 0).unwrap();
        assert_eq!(tail.p99_ns, 3 * MS, "learned less the carried delay: 2 ms");
        // Its bound is 3.3 ms. A request pushed to 3.5 ms by its own delay,
        // and the one queued behind it by that delay, both count against
        // the fillers' budget of delayed requests.
        let before = board.delay_credit();
        report(3_500_000, MS, false);
        report(3_500_000, 0, true);
        let spent = before - board.delay_credit();
        assert!(spent > 1.9, "two requests pushed over, {spent} spent");
    }

    /// Learning, from `latencies` in turn, as the primary `vars` configure:
    /// the tolerance in force after each request.
    fn tolerances(vars: &[(&str, &str)], latencies: impl Iterator<Item = u64>) -> Vec<u64> {
        let config = from_env(|var| {
            vars.iter()
                .find(|(name, _)| *name == var)
                .map(|(_, value)| value.to_string())
        })
        .unwrap()
        .unwrap();
        let region = Region::<GapBoard>::anonymous(|_| {}).unwrap();
        let of = |_| Board::new(region.device(0));
        let boards = Boards::new(&of, 1);
        of(0).attach_primary(1, config.tolerance_ns, DEFAULT_HOLDOFF_NS);
        let learning = Learning::new();
        let mut now = MS;
        latencies
            .map(|latency_ns| {
                now += 20 * MS;
                let request = Request {
                    latency_ns,
                    delay_ns: 0,
                    host_wait_ns: 0,
                    queued: false,
                };
                learning
                    .learn_request(&config, boards, request, now)
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn an_slo_the_primary_misses_alone_holds_fillers_back_no_more_than_none() {
        // Requests of 4-13 ms alone, one in ten of them over a 10 ms SLO:
        // the slack of the worst of the last 8 is mostly nothing.
        let latencies = || (0..400u64).map(|i| (4 + (i * 7) % 10) * MS);
        let primary = [("DILU_COLO", "primary")];
        let with_slo = [("DILU_COLO", "primary"), ("DILU_SPEC", "slo_ms=10")];
        let without = tolerances(&primary, latencies());
        let with = tolerances(&with_slo, latencies());
        let learned = *without.last().unwrap();
        assert!(learned > MS, "kept as if alone it tolerates {learned} ns");
        assert!(
            with.iter().zip(&without).all(|(w, n)| w >= n),
            "with the SLO it tolerates no less at any request"
        );
        // An operator's tolerance is not raised.
        let set = [
            ("DILU_COLO", "primary"),
            ("DILU_SPEC", "slo_ms=10"),
            ("DILU_COLO_TOLERANCE", "5ms"),
        ];
        assert_eq!(*tolerances(&set, latencies()).last().unwrap(), 0);
    }
}
