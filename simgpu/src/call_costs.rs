//! The price list of driver calls (`SIMGPU_CALL_COST`): which calls are
//! priced, their defaults, and parsing the setting. Kept apart from the
//! charging in `host_cost` so that simgpu-nvml, which reads simgpu's
//! configuration, can include it without the driver.

/// The priced calls. Defaults and their sources: README, "Host costs".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Launch,
    EventRecord,
    EventRecordUntimed,
    EventQuery,
    EventElapsed,
    EventCreate,
    Synchronize,
    MemAlloc,
    MemFree,
    MemGetInfo,
    Copy,
    StreamOrderedMem,
}

/// (name in `SIMGPU_CALL_COST`, call, default ns).
pub(crate) const CALLS: [(&str, Call, u64); 12] = [
    // Medians measured on an H100 (driver 580, Xeon host) by
    // `gpu-calibrate host`, the first of two runs
    // (bench/results/gpu-check-20261122T153810Z.md; simgpu/README.md lists
    // both).
    ("launch", Call::Launch, 3_800),
    ("event_record", Call::EventRecord, 1_300),
    ("event_record_untimed", Call::EventRecordUntimed, 300),
    ("event_query", Call::EventQuery, 360),
    ("event_elapsed", Call::EventElapsed, 640),
    ("event_create", Call::EventCreate, 440),
    ("synchronize", Call::Synchronize, 500),
    ("mem_alloc", Call::MemAlloc, 28_000),
    ("mem_free", Call::MemFree, 32_000),
    ("mem_get_info", Call::MemGetInfo, 7_300),
    ("copy", Call::Copy, 1_300),
    ("stream_ordered_mem", Call::StreamOrderedMem, 2_000),
];

/// Per-call costs in ns, indexed by `Call as usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallCosts(pub [u64; CALLS.len()]);

impl Default for CallCosts {
    fn default() -> Self {
        let mut ns = [0; CALLS.len()];
        for (_, call, default) in CALLS {
            ns[call as usize] = default;
        }
        CallCosts(ns)
    }
}

impl CallCosts {
    pub(crate) fn get(&self, call: Call) -> u64 {
        self.0[call as usize]
    }

    /// `0` (or `off`) prices every call at zero; otherwise
    /// `NAME=DURATION,...` overrides the named defaults.
    pub(crate) fn parse(text: &str) -> Result<CallCosts, ()> {
        let text = text.trim();
        if text == "0" || text.eq_ignore_ascii_case("off") {
            return Ok(CallCosts([0; CALLS.len()]));
        }
        let mut costs = CallCosts::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, dur) = item.split_once('=').ok_or(())?;
            let (_, call, _) = CALLS.iter().find(|(n, _, _)| *n == name.trim()).ok_or(())?;
            let ns = dilu_abi::units::parse_duration_ns(dur.trim()).map_err(|_| ())?;
            if ns > 1_000_000_000 {
                return Err(());
            }
            costs.0[*call as usize] = ns;
        }
        Ok(costs)
    }

    /// The accepted forms, for the one-line configuration error.
    pub(crate) fn forms() -> String {
        let names: Vec<&str> = CALLS.iter().map(|(n, _, _)| *n).collect();
        format!(
            "0, off, or a comma-separated list of NAME=DURATION (at most 1s) such as launch=2us,mem_get_info=5us; names: {}",
            names.join(", ")
        )
    }
}
