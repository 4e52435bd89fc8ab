//! Where a scaler's missed requests came from: in seconds whose load had
//! no precedent the scaler could have remembered (higher, now or within one
//! cold start, than anything in the [`RISE_MEMORY`] seconds before), or
//! elsewhere. Used by `scaling-report` to say why `dilu` misses.

use super::scalers::RISE_MEMORY;
use super::sim::{Function, Outcome, Setup};

/// Whether `function`'s load at `second` is, or was within one cold start,
/// higher than anything in the [`RISE_MEMORY`] seconds before (counted
/// seconds and, before them, the warm-up's: the pattern wraps).
pub fn unprecedented(function: &Function, setup: &Setup, second: usize) -> bool {
    let length = function.pattern.seconds().max(1) as isize;
    let offset = function.offset_s as isize;
    let rate = |s: isize| {
        function
            .pattern
            .rate((s + offset).rem_euclid(length) as usize, 0)
    };
    let earliest = -(setup.warmup_s as isize);
    let second = second as isize;
    let start = function.cold_start_s(setup).ceil() as isize;
    let recent_from = (second - start).max(earliest);
    let recent = (recent_from..=second).map(rate).fold(0.0, f64::max);
    let before = ((recent_from - RISE_MEMORY as isize).max(earliest)..recent_from)
        .map(rate)
        .fold(0.0, f64::max);
    recent > before
}

/// The share of `outcome`'s missed requests that came in [`unprecedented`]
/// seconds, and the share of all the load of `functions` over `seconds`
/// that did (what the first would be if misses fell anywhere).
pub fn unprecedented_shares(
    functions: &[Function],
    seconds: usize,
    setup: &Setup,
    outcome: &Outcome,
) -> (f64, f64) {
    let (mut missed_there, mut missed) = (0.0, 0.0);
    for &(second, index, requests) in &outcome.missed {
        missed += requests;
        if unprecedented(&functions[index], setup, second) {
            missed_there += requests;
        }
    }
    let (mut load_there, mut load) = (0.0, 0.0);
    for function in functions {
        for second in 0..seconds {
            let rate = function.pattern.rate(second, function.offset_s);
            load += rate;
            if unprecedented(function, setup, second) {
                load_there += rate;
            }
        }
    }
    let share = |part: f64, whole: f64| if whole > 0.0 { part / whole } else { 0.0 };
    (share(missed_there, missed), share(load_there, load))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::pattern::Pattern;
    use crate::scaling::service::Service;
    use dilu_profile::table::ProfileTable;

    #[test]
    fn a_rise_is_unprecedented_only_the_first_time_within_the_memory() {
        // 1, then a step to 5 at 300 s, back to 1, and the same step again
        // 100 s later (remembered), then longer than the memory later
        // (forgotten).
        let mut text = "1\n".repeat(300);
        let last = 420 + RISE_MEMORY + 100;
        for gap in [100, RISE_MEMORY + 100] {
            text.push_str(&"5\n".repeat(10));
            text.push_str(&"1\n".repeat(gap));
        }
        text.push_str(&"5\n".repeat(10));
        let table = ProfileTable::parse("1,10,0.05,40\n1,30,0.02,100\n1,60,0.012,180\n").unwrap();
        let function = Function {
            service: Service::profiled("f", &table, 0.021, 2.0).unwrap(),
            pattern: Pattern::parse("steps", &text).unwrap(),
            offset_s: 0,
            peak_rps: 100.0,
            memory_bytes: 1 << 30,
            weight_bytes: 0,
        };
        let setup = Setup {
            gpus: 1,
            gpus_per_node: 1,
            gpu_memory: 1 << 30,
            runtime_start_s: 5.0,
            storage_bytes_per_s: 1.0,
            warm_runtime_s: 1.0,
            host_bytes_per_s: 1.0,
            warm_starts: false,
            step_s: 0.1,
            seed: 1,
            policy: "dilu".into(),
            target: None,
            warmup_s: 0,
        };
        let at = |second| unprecedented(&function, &setup, second);
        assert!(!at(299) && at(300) && at(305), "the first step");
        assert!(!at(320), "5 s after the step ended, a cold start later");
        assert!(!at(410), "the same step 100 s later was seen before");
        assert!(at(last), "longer than the memory later, it was forgotten");
        // A warm-up plays the pattern's last seconds first (it wraps): they
        // end with the same step, so the first one was seen before.
        let warmed = Setup {
            warmup_s: 400,
            ..setup.clone()
        };
        assert!(!unprecedented(&function, &warmed, 300));
        assert!(unprecedented(&function, &warmed, last));
        let outcome = Outcome {
            missed: vec![(300, 0, 3.0), (410, 0, 1.0)],
            ..Outcome::default()
        };
        let (missed, load) = unprecedented_shares(&[function], last + 10, &setup, &outcome);
        assert_eq!(missed, 0.75);
        assert!(load > 0.0 && load < 0.2, "{load}");
    }
}
