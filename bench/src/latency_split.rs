//! Where a primary's requests spent their time on a shared device: running
//! its own kernels, waiting while other processes' kernels ran, or with the
//! device idle. The last is the primary's host: its program between
//! launches, or its threads waiting for a CPU. On a loaded 2-core machine
//! that part, not the sharing of the device, can make a request slow.
//!
//! Each request's span (its arrival to its end, on CLOCK_MONOTONIC: the
//! clock simgpu's trace and `demo-tenant serve --requests` share) is split
//! by simgpu's trace: the time any of the primary's kernels ran, the time
//! only others' ran, and the rest.

use crate::as_if_alone::Request;
use dilu_abi::simtrace::KernelRecord;

/// One request's latency, split.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestTime {
    pub latency_ns: u64,
    /// The primary's own kernels ran (its earlier requests' too, where it
    /// queued behind them).
    pub own_ns: u64,
    /// Only other processes' kernels ran.
    pub others_ns: u64,
    /// Nothing ran on the device.
    pub idle_ns: u64,
}

/// Disjoint, sorted intervals with the running sum of their lengths, so the
/// time they cover within any span is two binary searches away.
struct Covered {
    intervals: Vec<(u64, u64)>,
    /// Length of all intervals before each one.
    before: Vec<u64>,
}

impl Covered {
    fn new(mut spans: Vec<(u64, u64)>) -> Self {
        spans.sort_unstable();
        let mut intervals: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (start, end) in spans.into_iter().filter(|(s, e)| e > s) {
            match intervals.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => intervals.push((start, end)),
            }
        }
        let mut before = Vec::with_capacity(intervals.len());
        let mut sum = 0;
        for (start, end) in &intervals {
            before.push(sum);
            sum += end - start;
        }
        Self { intervals, before }
    }

    /// Time covered from the beginning of time up to `t`.
    fn up_to(&self, t: u64) -> u64 {
        // Intervals starting before t.
        let count = self.intervals.partition_point(|&(start, _)| start < t);
        match count {
            0 => 0,
            n => {
                let (start, end) = self.intervals[n - 1];
                self.before[n - 1] + end.min(t) - start
            }
        }
    }

    fn within(&self, from: u64, to: u64) -> u64 {
        self.up_to(to).saturating_sub(self.up_to(from))
    }
}

/// Splits each of `requests` (arrivals after `start_ns`) by the kernels of
/// `records` that ran during it: `primary_pid`'s, others', none.
pub fn split(
    requests: &[Request],
    start_ns: u64,
    records: &[KernelRecord],
    primary_pid: u32,
) -> Vec<RequestTime> {
    let spans = |mine: bool| {
        records
            .iter()
            .filter(|r| (r.pid == primary_pid) == mine)
            .map(|r| (r.start_ns, r.end_ns))
            .collect::<Vec<_>>()
    };
    let own = Covered::new(spans(true));
    let any = Covered::new(records.iter().map(|r| (r.start_ns, r.end_ns)).collect());
    requests
        .iter()
        .map(|request| {
            let from = start_ns + request.arrival_ns;
            let to = from + request.latency_ns;
            let own_ns = own.within(from, to);
            let busy = any.within(from, to).max(own_ns);
            RequestTime {
                latency_ns: request.latency_ns,
                own_ns,
                others_ns: busy - own_ns,
                idle_ns: request.latency_ns - busy.min(request.latency_ns),
            }
        })
        .collect()
}

/// The mean split of the slowest `share` of `times` (at least one request;
/// `None` without requests): what the requests that set a tail waited for.
pub fn slowest(times: &[RequestTime], share: f64) -> Option<RequestTime> {
    if times.is_empty() {
        return None;
    }
    let mut sorted = times.to_vec();
    sorted.sort_unstable_by_key(|t| std::cmp::Reverse(t.latency_ns));
    let count = ((times.len() as f64 * share).ceil() as usize).clamp(1, times.len());
    let tail = &sorted[..count];
    let mean = |part: fn(&RequestTime) -> u64| tail.iter().map(part).sum::<u64>() / count as u64;
    Some(RequestTime {
        latency_ns: mean(|t| t.latency_ns),
        own_ns: mean(|t| t.own_ns),
        others_ns: mean(|t| t.others_ns),
        idle_ns: mean(|t| t.idle_ns),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel as simgpu's trace writes it.
    fn kernel(pid: u32, start_ns: u64, end_ns: u64) -> KernelRecord {
        dilu_abi::simtrace::parse_line(&format!(
            r#"{{"pid":{pid},"device":0,"stream":1,"start_ns":{start_ns},"end_ns":{end_ns},"name":"k","blocks":1,"graph":false,"kernel":0,"last":true}}"#
        ))
        .expect("a trace line")
    }

    #[test]
    fn a_request_is_split_into_its_kernels_others_kernels_and_idle_time() {
        const START: u64 = 1_000_000;
        // The request: 100 µs after the start, 1 ms long. A filler kernel
        // runs when it arrives (to 400 µs), the primary's two kernels at
        // 450-550 and 800-900 µs, a filler kernel between them (600-700),
        // overlapping nothing else; a filler kernel after it ends is not
        // counted.
        let records = [
            kernel(2, START, START + 400_000),
            kernel(1, START + 450_000, START + 550_000),
            kernel(2, START + 600_000, START + 700_000),
            kernel(1, START + 800_000, START + 900_000),
            kernel(2, START + 1_200_000, START + 2_000_000),
        ];
        let request = Request {
            arrival_ns: 100_000,
            latency_ns: 1_000_000,
        };
        let [time] = split(&[request], START, &records, 1)[..] else {
            panic!("one request, one split");
        };
        assert_eq!(
            time,
            RequestTime {
                latency_ns: 1_000_000,
                own_ns: 200_000,
                others_ns: 400_000,
                idle_ns: 400_000,
            }
        );
    }

    #[test]
    fn time_two_processes_ran_at_once_counts_as_the_primary_s() {
        // Overlapping records (streams of one process, or a trace's
        // rounding) are not counted twice.
        let records = [kernel(1, 0, 500), kernel(1, 200, 600), kernel(2, 400, 900)];
        let request = Request {
            arrival_ns: 0,
            latency_ns: 1_000,
        };
        let time = split(&[request], 0, &records, 1)[0];
        assert_eq!((time.own_ns, time.others_ns, time.idle_ns), (600, 300, 100));
    }

    #[test]
    fn the_slowest_share_is_averaged_and_never_empty() {
        let time = |latency_ns, idle_ns| RequestTime {
            latency_ns,
            own_ns: latency_ns - idle_ns,
            others_ns: 0,
            idle_ns,
        };
        let times: Vec<RequestTime> = (1..=200).map(|i| time(i * 10, 0)).collect();
        // 1% of 200: the two slowest.
        let tail = slowest(&times, 0.01).unwrap();
        assert_eq!(tail.latency_ns, 1_995);
        let few = [time(50, 20), time(90, 60)];
        assert_eq!(slowest(&few, 0.01).unwrap(), time(90, 60));
        assert_eq!(slowest(&[], 0.01), None);
    }
}
