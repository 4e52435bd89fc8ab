//! What a driver call costs the calling thread (`SIMGPU_CALL_COST`).
//!
//! A real driver spends microseconds of CPU in every launch, event record or
//! memory call; an interposer's overhead is only meaningful next to that.
//! Each priced call holds a [`Charge`] for its whole body; when the body ends
//! sooner than the call's cost, the thread spins on `CLOCK_MONOTONIC` until
//! the cost has passed (a sleep syscall is far coarser than these costs), so
//! a call takes `max(cost, simgpu's own work)`. Null mode pays the same.

pub(crate) use crate::call_costs::Call;
use crate::now_ns;

/// Held for the body of a priced call; dropping it waits out the rest of
/// the call's cost.
pub(crate) struct Charge {
    until_ns: u64,
}

/// Starts pricing one call. Costs nothing before `cuInit` succeeded.
pub(crate) fn charge(call: Call) -> Charge {
    let cost = match crate::driver::drv() {
        Ok(d) => d.cfg.call_costs.get(call),
        Err(_) => 0,
    };
    Charge {
        until_ns: if cost == 0 { 0 } else { now_ns() + cost },
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.until_ns != 0 {
            wait_until(self.until_ns);
        }
    }
}

/// Waits until `deadline_ns` on CLOCK_MONOTONIC: sleeps through all but the
/// last 100 µs of a long wait, spins through the rest (reading the clock is
/// a vDSO call, tens of ns).
pub(crate) fn wait_until(deadline_ns: u64) {
    const SPIN_NS: u64 = 100_000;
    let now = now_ns();
    if deadline_ns > now + SPIN_NS {
        crate::sleep_until(deadline_ns - SPIN_NS);
    }
    while now_ns() < deadline_ns {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call_costs::{CALLS, CallCosts};

    #[test]
    fn defaults_are_the_measured_values() {
        // Medians measured on an H100 (simgpu/README.md, *Host costs*).
        let c = CallCosts::default();
        assert_eq!(c.get(Call::Launch), 3_800);
        assert_eq!(c.get(Call::EventRecord), 1_300);
        assert_eq!(c.get(Call::MemGetInfo), 7_300);
    }

    #[test]
    fn overrides_and_off() {
        let c = CallCosts::parse("launch=20us, mem_free=1ms").unwrap();
        assert_eq!(c.get(Call::Launch), 20_000);
        assert_eq!(c.get(Call::MemFree), 1_000_000);
        assert_eq!(c.get(Call::EventRecord), 1_300, "others keep defaults");
        assert_eq!(CallCosts::parse("0").unwrap().0, [0; CALLS.len()]);
        assert_eq!(CallCosts::parse("off").unwrap().0, [0; CALLS.len()]);
        assert!(CallCosts::parse("lunch=2us").is_err());
        assert!(CallCosts::parse("launch").is_err());
        assert!(CallCosts::parse("launch=2s").is_err());
    }

    #[test]
    fn a_wait_lasts_at_least_its_cost() {
        let t0 = now_ns();
        wait_until(t0 + 3_000);
        assert!(now_ns() >= t0 + 3_000);
    }
}
