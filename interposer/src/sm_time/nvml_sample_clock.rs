//! NVML's per-process utilisation samples turned into busy time: which
//! samples are new, what period each covers, and whether another process
//! was listed with use lately (then the numbers are not device time).

/// Spacing of NVML's samples assumed until some were seen: NVIDIA's driver
/// samples each process about every 200 ms (measured on an H100, driver
/// 580: `bench/results/gpu-nvml.md`).
pub(crate) const DEFAULT_SAMPLE_SPACING_US: u64 = 200_000;
/// Spacings between NVML's sample times kept to estimate the typical one.
pub(crate) const SPACINGS_KEPT: usize = 16;
/// How long (sample time) after another process was listed with any use
/// this process counts as sharing the device. NVIDIA's driver lists the
/// processes of one device in turn (one per 200 ms sample when two are
/// busy), so one answer without the other proves nothing.
pub(crate) const CONTENDED_FOR_US: u64 = 1_000_000;

/// Turns NVML's samples into busy time. A sample says what percentage of
/// the driver's sample period before its time stamp a kernel of the process
/// ran; the period is not reported, so it is taken as the time since the
/// process's previous sample, or the typical spacing of the driver's samples
/// where that is much longer (a process that was idle is not listed, and its
/// next sample covers one period, not the whole idle stretch).
#[derive(Default)]
pub(crate) struct SampleClock {
    /// Newest sample time seen, of any process (CLOCK_REALTIME µs).
    pub(crate) last_seen_us: u64,
    /// Time of this process's previous sample.
    pub(crate) ours_before_us: u64,
    /// Recent spacings between consecutive sample times (any process).
    pub(crate) spacings: std::collections::VecDeque<u64>,
    /// Newest sample time at which another process was listed with use.
    pub(crate) others_seen_us: u64,
    /// Samples of this process stamped after this time count from the
    /// first answer on (none ran before it); `None`: the first answer is
    /// only the baseline.
    pub(crate) count_from_us: Option<u64>,
}

/// What one answer of NVML says about this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Look {
    /// Busy time (ns) in this process's new samples.
    pub(crate) busy_ns: u64,
    /// The sample time (CLOCK_REALTIME µs, from the start of the first new
    /// sample's period to the newest stamp) that `busy_ns` covers; `None`
    /// when no new sample of this process counted.
    pub(crate) covers_us: Option<(u64, u64)>,
    /// NVML listed this process in a new sample.
    pub(crate) listed: bool,
    /// Another process was listed with use within [`CONTENDED_FOR_US`] of
    /// the newest sample: this process's numbers are not device time.
    pub(crate) contended: bool,
    /// The answer held a sample newer than those seen before (of any
    /// process): only such an answer says anything about who is listed.
    pub(crate) fresh: bool,
}

impl SampleClock {
    pub(crate) fn typical_spacing_us(&self) -> u64 {
        let mut sorted: Vec<u64> = self.spacings.iter().copied().collect();
        sorted.sort_unstable();
        sorted
            .get(sorted.len() / 2)
            .copied()
            .unwrap_or(DEFAULT_SAMPLE_SPACING_US)
    }

    /// Folds in one answer: every sample NVML returned (any process) as
    /// (pid, time stamp µs, SM percent). The first answer sets where
    /// counting starts: it counts only this process's samples stamped after
    /// [`count_from_us`](Self::count_from_us).
    pub(crate) fn fold(&mut self, pid: u32, samples: &[(u32, u64, u32)]) -> Look {
        if let Some(newest_other) = samples
            .iter()
            .filter(|s| s.0 != pid && s.2 > 0)
            .map(|s| s.1)
            .max()
        {
            self.others_seen_us = self.others_seen_us.max(newest_other);
        }
        let mut stamps: Vec<u64> = samples
            .iter()
            .map(|s| s.1)
            .filter(|&t| t > self.last_seen_us)
            .collect();
        stamps.sort_unstable();
        stamps.dedup();
        let first_answer = self.last_seen_us == 0;
        let mut previous = self.last_seen_us;
        for &stamp in &stamps {
            if previous != 0 {
                if self.spacings.len() == SPACINGS_KEPT {
                    self.spacings.pop_front();
                }
                self.spacings.push_back(stamp - previous);
            }
            previous = stamp;
        }
        let mut ours: Vec<(u64, u32)> = samples
            .iter()
            .filter(|s| s.0 == pid && s.1 > self.last_seen_us)
            .map(|s| (s.1, s.2))
            .collect();
        ours.sort_unstable();
        ours.dedup_by_key(|s| s.0);
        self.last_seen_us = previous;
        let contended = self.contended();
        let fresh = !stamps.is_empty();
        if first_answer {
            let count_from = self.count_from_us.unwrap_or(u64::MAX);
            let baseline = ours.partition_point(|s| s.0 <= count_from);
            self.ours_before_us = baseline.checked_sub(1).map_or(0, |last| ours[last].0);
            if baseline == ours.len() {
                return Look {
                    busy_ns: 0,
                    covers_us: None,
                    listed: !ours.is_empty(),
                    contended,
                    fresh,
                };
            }
            ours.drain(..baseline);
        }
        let typical = self.typical_spacing_us();
        let mut busy_ns = 0u64;
        let mut covers_us: Option<(u64, u64)> = None;
        for &(stamp, percent) in &ours {
            // Up to a quarter over the typical spacing is jitter of the
            // driver's sampler; more is a stretch without a sample.
            let period_us = match self.ours_before_us {
                before if before != 0 && stamp - before <= typical * 5 / 4 => stamp - before,
                _ => typical,
            };
            busy_ns += bounded_by_first_launch(
                period_us * 1_000 * u64::from(percent.min(100)) / 100,
                stamp,
                period_us,
                self.count_from_us,
            );
            self.ours_before_us = stamp;
            let from = covers_us.map_or(stamp.saturating_sub(period_us), |(from, _)| from);
            covers_us = Some((from, stamp));
        }
        Look {
            busy_ns,
            covers_us,
            listed: !ours.is_empty(),
            contended,
            fresh,
        }
    }

    /// NVML had no sample newer than the last one seen (its NOT_FOUND):
    /// nothing new, and whether another process shares the device is as
    /// the samples seen last said. (Taking this for "alone" made every look
    /// between two samples of a busy pair count as one in which this
    /// process went unlisted, and after 2 s the pair's tenants stopped
    /// correcting for good, also once the other one had left.)
    pub(crate) fn nothing_new(&self) -> Look {
        Look {
            busy_ns: 0,
            covers_us: None,
            listed: false,
            contended: self.contended(),
            fresh: false,
        }
    }

    pub(crate) fn contended(&self) -> bool {
        self.others_seen_us != 0 && self.others_seen_us + CONTENDED_FOR_US >= self.last_seen_us
    }
}

/// A sample's busy time, at most the time from the process's first launch
/// (`count_from_us`) to the sample's stamp where its period began before
/// that launch. NVIDIA's driver counts busy time before a process's first
/// kernel launch (its start-up: context, module, first copies): on an
/// H200 a sample stamped 34 ms before the first launch said 44%. Counted
/// whole, the period holding the first launch (46%, 92 ms) was settled
/// against the 16.6 ms charged since that launch, and the 75 ms debt held
/// a 50% tenant at 0-36% in its next samples. A stamp on another clock
/// (before the launch, or a period or more after it) leaves the busy time
/// as it is.
fn bounded_by_first_launch(
    busy_ns: u64,
    stamp_us: u64,
    period_us: u64,
    count_from_us: Option<u64>,
) -> u64 {
    match count_from_us {
        Some(first) if stamp_us > first && stamp_us - first < period_us => {
            busy_ns.min((stamp_us - first) * 1_000)
        }
        _ => busy_ns,
    }
}
