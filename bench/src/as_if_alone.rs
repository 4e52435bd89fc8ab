//! The most fillers can harvest beside a primary kept as if alone (its p99
//! within a factor of its p99 alone) when they cannot know when its
//! requests arrive: the yardstick for a co-location scheduler without an
//! SLO, beside the no-delay bound.
//!
//! Why: the no-delay bound counts every idle stretch as if fillers knew each
//! arrival in advance. On a device without preemption a request that finds a
//! filler kernel on it waits for the rest of that kernel and the hand-off
//! back (140 µs on an H100). Where that wait is more than the slack of the
//! primary's slowest requests against its bound, every such request that
//! meets filler work is pushed over, and any scheduler that does not know
//! the arrivals can fill only so much of the idle time before the p99 moves.
//!
//! How: from the primary's requests alone (arrival and latency, served one
//! at a time, as `demo-tenant serve` does). Fillers keeping a share `f` of
//! the primary's idle time, a request arriving while the primary is idle
//! finds filler work with chance `f` (its arrival is independent of the
//! fillers'), and then waits at least the rest of the kernel (uniform over
//! its length, the shortest of the fillers' kernels: the cheapest delay)
//! and a hand-off; the delay carries on to the requests queued behind it.
//! Replaying each request with that delay counts the requests within the
//! bound alone it pushes over it. The p99 stays within the bound while
//! requests over it number at most what the p99's rank leaves, so `f` is at
//! most that allowance (less those over it alone) over the expected pushes
//! per unit of share. Generous on purpose: a request arriving during the
//! hand-off to a filler waits longer, and two delays in one busy stretch
//! count apart. Where some of the idle time has no arrivals at all (the
//! pauses of bursty arrivals), fillers are given all of it.

/// One request of a primary run alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// When it arrived, after the primary's start (ns).
    pub arrival_ns: u64,
    /// How long it took (ns).
    pub latency_ns: u64,
}

/// Requests as `demo-tenant serve --requests FILE` writes them: one per
/// line, arrival and latency in ns (lines starting `#` are not requests).
pub fn parse_requests(text: &str) -> Result<Vec<Request>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.split_whitespace().map(str::parse::<u64>);
            match (fields.next(), fields.next(), fields.next()) {
                (Some(Ok(arrival_ns)), Some(Ok(latency_ns)), None) => Ok(Request {
                    arrival_ns,
                    latency_ns,
                }),
                _ => Err(format!("not an arrival and a latency in ns: {line:?}")),
            }
        })
        .collect()
}

/// The start the arrivals of a `--requests` file count from, on
/// CLOCK_MONOTONIC (its `# start_ns N` line), if it says.
pub fn requests_start_ns(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("# start_ns "))
        .and_then(|n| n.trim().parse().ok())
}

/// Points over a filler kernel at which a request may arrive: the rest of
/// the kernel it waits for is averaged over them.
const ARRIVAL_POINTS: u64 = 16;

/// The largest share of the primary's idle time fillers of `kernel_ns`
/// kernels may keep, in expectation, with the p99 of `requests` within
/// `factor` of their p99 alone, a request that meets filler work waiting
/// the rest of the kernel and `handoff_ns` (0 to 1; 1 where no request can
/// be pushed over, or with no requests).
pub fn filler_share_bound(
    requests: &[Request],
    kernel_ns: u64,
    handoff_ns: u64,
    factor: f64,
) -> f64 {
    let only = KernelShare {
        kernel_ns,
        share: 1.0,
    };
    filler_mix_share_bound(requests, &[only], handoff_ns, factor).share
}

/// What [`filler_mix_share_bound`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareBound {
    /// The largest share of the idle time fillers may keep (0 to 1).
    pub share: f64,
    /// Requests that may be pushed over the bound before the p99 moves.
    pub allowance: f64,
    /// Requests pushed over it, in expectation, per unit of share.
    pub pushes_per_share: f64,
}

/// One length of a filler's kernels and the share of its device time spent
/// in kernels of that length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelShare {
    pub kernel_ns: u64,
    pub share: f64,
}

/// [`filler_share_bound`] for a filler that runs its kernels in an order of
/// its own (a training step): no scheduler can pick the short ones, so a
/// request that meets its work meets a kernel of each length as often as
/// that length holds of the filler's device time (`kernels`, shares adding
/// up to 1).
pub fn filler_mix_share_bound(
    requests: &[Request],
    kernels: &[KernelShare],
    handoff_ns: u64,
    factor: f64,
) -> ShareBound {
    let served = Served::new(requests);
    let n = served.requests.len();
    if n == 0 {
        return ShareBound {
            share: 1.0,
            allowance: 0.0,
            pushes_per_share: 0.0,
        };
    }
    let Tail {
        rank,
        bound,
        over_alone,
    } = tail(&served.requests, factor);
    // Over the bound, the p99 moves once more than n - rank requests are.
    let allowance = (n - rank).saturating_sub(over_alone) as f64;
    let pushes: f64 = kernels
        .iter()
        .map(|k| k.share * served.expected_pushes(k.kernel_ns, handoff_ns, bound))
        .sum();
    let share = if pushes == 0.0 {
        1.0
    } else {
        (allowance / pushes).min(1.0)
    };
    ShareBound {
        share,
        allowance,
        pushes_per_share: pushes,
    }
}

/// A filler's kernel lengths (ns, one per kernel) as [`KernelShare`]s: in
/// classes each √2 longer than the one before, each class at its kernels'
/// mean length and its share of their summed length. Empty where the
/// lengths add up to nothing.
pub fn kernel_mix(lengths_ns: &[u64]) -> Vec<KernelShare> {
    let total: u64 = lengths_ns.iter().sum();
    if total == 0 {
        return Vec::new();
    }
    // (summed length, count) per class: class j holds lengths under
    // 1 µs · √2^j.
    let mut classes: Vec<(u64, u64)> = Vec::new();
    for &length in lengths_ns.iter().filter(|&&l| l > 0) {
        let class = (2.0 * (length as f64 / 1_000.0).log2()).ceil().max(0.0) as usize;
        if classes.len() <= class {
            classes.resize(class + 1, (0, 0));
        }
        classes[class].0 += length;
        classes[class].1 += 1;
    }
    classes
        .into_iter()
        .filter(|&(_, count)| count > 0)
        .map(|(sum, count)| KernelShare {
            kernel_ns: sum / count,
            share: sum as f64 / total as f64,
        })
        .collect()
}

/// Where a primary's p99 alone lies among its requests, the bound
/// `factor` over it, and how many requests are over that bound alone.
struct Tail {
    /// The p99 as the workloads report it: the ceil(0.99 n)-th smallest.
    rank: usize,
    bound: u64,
    over_alone: usize,
}

fn tail(requests: &[Request], factor: f64) -> Tail {
    let n = requests.len();
    let mut sorted: Vec<u64> = requests.iter().map(|r| r.latency_ns).collect();
    sorted.sort_unstable();
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    let bound = (sorted[rank - 1] as f64 * factor) as u64;
    Tail {
        rank,
        bound,
        over_alone: n - sorted.partition_point(|&l| l <= bound),
    }
}

/// The share of `requests` (a primary's run alone) over `factor` times
/// their p99: those leave fewer of the requests over the p99 for fillers
/// to push over the bound (0 with no requests).
pub fn over_bound_alone(requests: &[Request], factor: f64) -> f64 {
    if requests.is_empty() {
        return 0.0;
    }
    tail(requests, factor).over_alone as f64 / requests.len() as f64
}

/// The as-if-alone bound as a harvest (a share of the primary's idle time):
/// the idle time in which no request arrives (`quiet_idle_share` of it)
/// whole, the rest at `share_bound`, never above the no-delay bound.
pub fn harvest_bound(no_delay_bound: f64, share_bound: f64, quiet_idle_share: f64) -> f64 {
    let quiet = quiet_idle_share.clamp(0.0, 1.0);
    (quiet + (1.0 - quiet) * share_bound).min(no_delay_bound)
}

/// The share of the primary's idle time in which no request arrives, for
/// arrivals that come only in the first `on_ns` of every `on_ns + off_ns`
/// from its start, over a run of `run_ns` in which it was busy `busy_ns`.
pub fn quiet_idle_share(run_ns: u64, busy_ns: u64, on_ns: u64, off_ns: u64) -> f64 {
    let cycle = on_ns + off_ns;
    if off_ns == 0 || cycle == 0 || run_ns <= busy_ns {
        return 0.0;
    }
    let whole = run_ns / cycle;
    let rest = run_ns % cycle;
    let quiet = whole * off_ns + rest.saturating_sub(on_ns);
    (quiet as f64 / (run_ns - busy_ns) as f64).min(1.0)
}

/// The primary's busy time: each request's service, from the moment it
/// could start (its arrival, or its predecessor's end) to its end.
pub fn busy_ns(requests: &[Request]) -> u64 {
    Served::new(requests).service.iter().sum()
}

/// Requests in arrival order, served one at a time: when each ended, and
/// its service (device and host time from the moment it could start, its
/// arrival or its predecessor's end, to its end).
struct Served {
    requests: Vec<Request>,
    done: Vec<u64>,
    service: Vec<u64>,
}

impl Served {
    fn new(requests: &[Request]) -> Self {
        let mut requests = requests.to_vec();
        requests.sort_by_key(|r| r.arrival_ns);
        let done: Vec<u64> = requests
            .iter()
            .map(|r| r.arrival_ns + r.latency_ns)
            .collect();
        let service = (0..requests.len())
            .map(|i| {
                let starts = match i {
                    0 => requests[0].arrival_ns,
                    _ => requests[i].arrival_ns.max(done[i - 1]),
                };
                done[i].saturating_sub(starts)
            })
            .collect();
        Self {
            requests,
            done,
            service,
        }
    }

    /// Requests within `bound` alone that fillers of `kernel_ns` kernels
    /// push over it, per unit of the idle time they keep: every request
    /// arriving while the primary is idle meets filler work with the
    /// chance of that share, waits the rest of the kernel (averaged over
    /// where in it it arrives) and `handoff_ns`, and passes the delay on
    /// to the requests queued behind it.
    fn expected_pushes(&self, kernel_ns: u64, handoff_ns: u64, bound: u64) -> f64 {
        let Served {
            requests,
            done,
            service,
        } = self;
        let n = requests.len();
        let mut pushes = 0.0;
        for i in 0..n {
            // Fillers run only while the primary is idle: a request queued
            // behind its own predecessor meets none.
            if i > 0 && requests[i].arrival_ns < done[i - 1] {
                continue;
            }
            let mut pushed = 0u64;
            for point in 0..ARRIVAL_POINTS {
                let delay = handoff_ns + kernel_ns * (2 * point + 1) / (2 * ARRIVAL_POINTS);
                let mut finish = done[i] + delay;
                let mut j = i;
                loop {
                    let alone = requests[j].latency_ns;
                    let latency = finish - requests[j].arrival_ns;
                    pushed += u64::from(alone <= bound && latency > bound);
                    j += 1;
                    if j == n {
                        break;
                    }
                    let next = requests[j].arrival_ns.max(finish) + service[j];
                    if next <= done[j] {
                        break;
                    }
                    finish = next;
                }
            }
            pushes += pushed as f64 / ARRIVAL_POINTS as f64;
        }
        pushes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;

    #[test]
    fn the_share_over_the_bound_alone_counts_the_tail_beyond_it() {
        // 1 to 1000 µs: the p99 is 990 µs, nothing beyond 1089 µs.
        let even = spaced(1000, |i| (i + 1) * US);
        assert_eq!(over_bound_alone(&even, 1.1), 0.0);
        // The six longest tripled: still the p99's neighbours below it,
        // now six of 1000 over its bound.
        let tail = spaced(1000, |i| {
            if i >= 994 {
                3 * (i + 1) * US
            } else {
                (i + 1) * US
            }
        });
        assert_eq!(over_bound_alone(&tail, 1.1), 0.006);
        assert_eq!(over_bound_alone(&[], 1.1), 0.0);
    }

    /// `n` requests every 10 ms, each `latency(i)` long.
    fn spaced(n: u64, latency: impl Fn(u64) -> u64) -> Vec<Request> {
        (0..n)
            .map(|i| Request {
                arrival_ns: i * 10 * MS,
                latency_ns: latency(i),
            })
            .collect()
    }

    #[test]
    fn requests_with_slack_beyond_the_longest_wait_leave_fillers_the_whole_idle_time() {
        // All 1 ms, the bound 1.5 ms: a 100 µs kernel and a 140 µs hand-off
        // push nobody over.
        let requests = spaced(1000, |_| MS);
        assert_eq!(filler_share_bound(&requests, 100 * US, 140 * US, 1.5), 1.0);
    }

    #[test]
    fn where_the_hand_off_alone_pushes_the_tail_over_the_share_is_what_the_rank_allows() {
        // 1000 requests: 980 of 1 ms and 20 of 1.2 ms. The p99 (the 990th)
        // is 1.2 ms, the bound 1.32 ms: only the slow ones can be pushed
        // over (by any wait over 120 µs: all of them), and 10 may be over.
        let requests = spaced(1000, |i| if i % 50 == 0 { 1_200 * US } else { MS });
        let share = filler_share_bound(&requests, 100 * US, 140 * US, 1.10);
        assert!((share - 0.5).abs() < 1e-9, "{share}");
        // A primary whose slowest requests were further from the bound lets
        // fillers keep more.
        assert!(filler_share_bound(&requests, 100 * US, 140 * US, 1.5) > share);
    }

    #[test]
    fn a_filler_whose_long_kernels_it_cannot_skip_keeps_what_they_allow() {
        // 1000 requests of 1 ms, 10 ms apart: the bound (1.1 ms) leaves each
        // 100 µs, and 10 may go over it. Kernels of 90 µs (no hand-off)
        // push nobody over; ones of 1 ms push a request arriving in all
        // but the first 100 µs of one (14 of 16 points).
        let requests = spaced(1000, |_| MS);
        let short = KernelShare {
            kernel_ns: 90 * US,
            share: 0.9,
        };
        let long = KernelShare {
            kernel_ns: MS,
            share: 0.1,
        };
        assert_eq!(filler_share_bound(&requests, 90 * US, 0, 1.10), 1.0);
        // A tenth of the filler's device time in the long kernels: a
        // request meeting its work meets one a tenth of the time.
        let share = filler_mix_share_bound(&requests, &[short, long], 0, 1.10).share;
        let expected = 10.0 / (0.1 * 1000.0 * 14.0 / 16.0);
        assert!((share - expected).abs() < 1e-9, "{share} vs {expected}");
        // The field's fillers, which a scheduler may pick among, are
        // judged by their shortest kernels; this one cannot be.
        assert!(share < filler_share_bound(&requests, 90 * US, 0, 1.10));
    }

    #[test]
    fn kernel_lengths_group_by_their_share_of_device_time() {
        // Nine of 100 µs and one of 1 ms: the long one holds over half the
        // device time.
        let mut lengths = vec![100 * US; 9];
        lengths.push(MS);
        let mix = kernel_mix(&lengths);
        assert_eq!(mix.len(), 2, "{mix:?}");
        assert_eq!(mix[0].kernel_ns, 100 * US);
        assert!((mix[0].share - 0.9 / 1.9).abs() < 1e-9);
        assert_eq!(mix[1].kernel_ns, MS);
        assert!((mix[1].share - 1.0 / 1.9).abs() < 1e-9);
        assert!(kernel_mix(&[]).is_empty());
        assert!(kernel_mix(&[0, 0]).is_empty());
    }

    #[test]
    fn a_delay_carries_over_to_the_requests_queued_behind() {
        // Pairs: one at t, one 0.1 ms later that waits for it (1 ms each
        // served: the second takes 1.9 ms). Bound: 1.1 x 1.9 ms = 2.09 ms.
        // A wait of 140-340 µs at the first pushes the second over
        // whenever it exceeds 190 µs: (340 - 190) / 200 of the kernel.
        let mut requests = Vec::new();
        for pair in 0..500u64 {
            let t = pair * 10 * MS;
            requests.push(Request {
                arrival_ns: t,
                latency_ns: MS,
            });
            requests.push(Request {
                arrival_ns: t + 100 * US,
                latency_ns: 1_900 * US,
            });
        }
        let share = filler_share_bound(&requests, 200 * US, 140 * US, 1.10);
        // 1000 requests: 10 may be over the bound; 500 idle arrivals each
        // pushing 0.75 (12 of 16 points) of a request.
        let expected = 10.0 / (500.0 * 12.0 / 16.0);
        assert!((share - expected).abs() < 1e-9, "{share} vs {expected}");
    }

    #[test]
    fn the_pauses_of_bursty_arrivals_count_whole() {
        // 300 ms on, 300 ms off over 6 s, busy 0.6 s: 3 s of pause in 5.4 s
        // of idle time.
        let quiet = quiet_idle_share(6_000 * MS, 600 * MS, 300 * MS, 300 * MS);
        assert!((quiet - 3.0 / 5.4).abs() < 1e-9, "{quiet}");
        assert_eq!(quiet_idle_share(6_000 * MS, 600 * MS, 300 * MS, 0), 0.0);
        let bound = harvest_bound(0.95, 0.2, quiet);
        assert!((bound - (quiet + (1.0 - quiet) * 0.2)).abs() < 1e-12);
        assert_eq!(harvest_bound(0.5, 1.0, quiet), 0.5, "never above no-delay");
    }

    #[test]
    fn requests_read_back_as_written_and_bad_lines_are_named() {
        let written = "# start_ns 77000\n0 1500\n2000 900\n\n";
        let requests = parse_requests(written).expect("two requests");
        assert_eq!(requests_start_ns(written), Some(77_000));
        assert_eq!(requests_start_ns("0 1500\n"), None, "an older file");
        assert_eq!(
            requests,
            vec![
                Request {
                    arrival_ns: 0,
                    latency_ns: 1500
                },
                Request {
                    arrival_ns: 2000,
                    latency_ns: 900
                }
            ]
        );
        assert_eq!(busy_ns(&requests), 2400);
        let err = parse_requests("0 1500\n12 x\n").expect_err("a bad line");
        assert!(err.contains("12 x"), "{err}");
    }
}
