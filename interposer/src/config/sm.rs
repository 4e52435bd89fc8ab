//! SM-time share configuration: which share of each device's time a tenant
//! may use.
//!
//! Sources, strongest first:
//! 1. `DILU_SM_LIMIT` (what `dilu run --sm` sets): `30` or `30%` (every
//!    device), `0:30,1:50` (per device index as the program sees it).
//!    Percentages from 1 to 100; 100 means unlimited.
//! 2. HAMi-core's names: `CUDA_DEVICE_SM_LIMIT_<i>` over
//!    `CUDA_DEVICE_SM_LIMIT`, integers 0–100 where 0 (HAMi's "no limit") and
//!    100 mean unlimited.
//!
//! The token bucket is 5 ms deep (`dilu_layout::budget::DEFAULT_DEPTH_NS`):
//! after idling a tenant may run ahead of its share by at most that much
//! wall-clock time, i.e. a burst of `share × depth` of GPU time.
//!
//! A throttled tenant releases [`DEFAULT_BURST_NS`] of GPU time at once: a
//! launch that must wait for tokens waits on until the bucket also holds
//! this much (at most a depth's worth), so the tenant's work reaches the GPU
//! in runs about one time slice long. Paced launch by launch, a throttled
//! tenant always has a kernel pending, and a GPU shared by time slicing then
//! switches contexts at every slice of the other tenant (158–165 µs of
//! device time lost per switch on an H100,
//! `bench/results/gpu-calibration.md`). Runs are used only where NVML's
//! samples do not show the process alone on the device, and not by a batch
//! tenant the node manager keeps to a short queue beside a latency tenant
//! (a run is a whole time slice the latency tenant may wait for; see
//! `launch_control::releases_in_runs`). `DILU_SM_ABLATE=runs` (benchmarks
//! only) paces launch by launch instead, and `depth=DURATION` there sets
//! another depth.

use crate::config::memory::ConfigError;
use dilu_abi::tenant_flags;
use dilu_layout::budget::FULL_SHARE_PPM;
use dilu_layout::ledger::MAX_DEVICES;

#[derive(Debug, Clone, PartialEq)]
pub struct SmLimits {
    /// Share in ppm per device ordinal; `None` = unlimited.
    pub per_device: [Option<u32>; MAX_DEVICES],
}

impl SmLimits {
    pub fn any(&self) -> bool {
        self.per_device.iter().any(Option::is_some)
    }
}

impl Default for SmLimits {
    fn default() -> Self {
        SmLimits {
            per_device: [None; MAX_DEVICES],
        }
    }
}

const HAMI_FORMS: &str = "an integer percentage from 0 to 100 (0 = no limit)";
/// One time slice of an H100 (`bench/results/gpu-calibration.md`: medians
/// of 2077–2085 µs over three runs), rounded.
pub const DEFAULT_BURST_NS: u64 = 2_000_000;

/// `DILU_SM_LIMIT` as shares in ppm, `None` for 100 (the whole device) and
/// for devices it leaves out (the rules `dilu run --sm` checks too).
fn parse_dilu(value: &str) -> Result<[Option<u32>; MAX_DEVICES], ConfigError> {
    let percents = tenant_flags::parse_sm_limits(value).ok_or_else(|| ConfigError {
        variable: "DILU_SM_LIMIT".into(),
        value: value.into(),
        expected: tenant_flags::SM_LIMIT_FORMS.into(),
    })?;
    Ok(percents.map(|percent| {
        let ppm = (percent? * 10_000.0).round() as u32;
        (ppm < FULL_SHARE_PPM).then_some(ppm)
    }))
}

fn parse_hami(variable: String, value: String) -> Result<Option<u32>, ConfigError> {
    match value.trim().parse::<u32>() {
        Ok(0) | Ok(100) => Ok(None),
        Ok(percent) if percent < 100 => Ok(Some(percent * 10_000)),
        _ => Err(ConfigError {
            variable,
            value,
            expected: HAMI_FORMS.into(),
        }),
    }
}

/// Reads the shares from an environment lookup (injected for tests).
pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<SmLimits, ConfigError> {
    let mut limits = SmLimits::default();
    if let Some(value) = get("DILU_SM_LIMIT").filter(|v| !v.is_empty()) {
        limits.per_device = parse_dilu(&value)?;
        return Ok(limits);
    }
    let hami = |variable: String| match get(&variable).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(value) => parse_hami(variable, value).map(Some),
    };
    let all = hami("CUDA_DEVICE_SM_LIMIT".into())?;
    for (index, slot) in limits.per_device.iter_mut().enumerate() {
        *slot = match hami(format!("CUDA_DEVICE_SM_LIMIT_{index}"))? {
            Some(share) => share,
            None => all.flatten(),
        };
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_env as env;

    #[test]
    fn every_documented_form() {
        let all = from_env(env(&[("DILU_SM_LIMIT", "30")])).unwrap();
        assert_eq!(all.per_device, [Some(300_000); MAX_DEVICES]);
        let percent = from_env(env(&[("DILU_SM_LIMIT", "12.5%")])).unwrap();
        assert_eq!(percent.per_device[7], Some(125_000));
        let each = from_env(env(&[("DILU_SM_LIMIT", "0:30,1:100")])).unwrap();
        assert_eq!(each.per_device[0], Some(300_000));
        assert_eq!(each.per_device[1], None, "100% is the whole device");
        assert_eq!(each.per_device[2], None);
        assert!(!from_env(env(&[])).unwrap().any());
    }

    #[test]
    fn hami_names_are_aliases() {
        let limits = from_env(env(&[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("CUDA_DEVICE_SM_LIMIT_1", "0"),
        ]))
        .unwrap();
        assert_eq!(limits.per_device[0], Some(400_000));
        assert_eq!(limits.per_device[1], None, "0 is HAMi's no limit");
        let both = from_env(env(&[
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("DILU_SM_LIMIT", "20"),
        ]))
        .unwrap();
        assert_eq!(both.per_device[0], Some(200_000));
    }

    #[test]
    fn bad_values_name_the_variable_and_the_forms() {
        for bad in ["0", "101", "lots", "0:30,0:40", "16:30", "-5", "0:", "30,"] {
            let error = from_env(env(&[("DILU_SM_LIMIT", bad)])).unwrap_err();
            assert_eq!(error.variable, "DILU_SM_LIMIT", "{bad}");
            assert!(error.to_string().contains("0:30,1:50"), "{error}");
        }
        let error = from_env(env(&[("CUDA_DEVICE_SM_LIMIT", "150")])).unwrap_err();
        assert_eq!(error.variable, "CUDA_DEVICE_SM_LIMIT");
    }
}
