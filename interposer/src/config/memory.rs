//! Memory budget configuration: which limit applies to which device.
//!
//! Sources, strongest first:
//! 1. `DILU_MEM_LIMIT` (what `dilu run --mem` sets): `8GiB` (every device),
//!    `50%` (of each device's memory), `0:8GiB,1:4GiB` or `0:50%` (per
//!    device index as the program sees it, i.e. after `CUDA_VISIBLE_DEVICES`).
//! 2. HAMi-core's names, so dilu can replace libvgpu.so in place:
//!    `CUDA_DEVICE_MEMORY_LIMIT_<i>` (one device) over
//!    `CUDA_DEVICE_MEMORY_LIMIT` (every device), values like `4096m`, `8g`.
//!
//! A device with no limit from any source is unlimited.

use dilu_abi::tenant_flags;
use dilu_abi::units::{self, SIZE_FORMS};
use dilu_layout::ledger::MAX_DEVICES;

/// A limit before the device's size is known.
pub use dilu_abi::tenant_flags::MemLimit as Limit;

/// Per-device limits, indexed by the device ordinal the program sees.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemoryLimits {
    pub per_device: [Option<Limit>; MAX_DEVICES],
}

/// A configuration error: the variable, its value and the accepted forms.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub variable: String,
    pub value: String,
    pub expected: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid {}={:?}; expected {}",
            self.variable, self.value, self.expected
        )
    }
}

/// Parses the value of `DILU_MEM_LIMIT` (the rules `dilu run --mem` checks
/// too).
pub fn parse_dilu(value: &str) -> Result<MemoryLimits, ConfigError> {
    tenant_flags::parse_mem_limits(value)
        .map(|per_device| MemoryLimits { per_device })
        .ok_or_else(|| ConfigError {
            variable: "DILU_MEM_LIMIT".into(),
            value: value.into(),
            expected: tenant_flags::MEM_LIMIT_FORMS.into(),
        })
}

/// Reads the limits from an environment lookup (injected for tests).
pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<MemoryLimits, ConfigError> {
    if let Some(value) = get("DILU_MEM_LIMIT").filter(|v| !v.is_empty()) {
        return parse_dilu(&value);
    }
    let hami = |variable: String| -> Result<Option<Limit>, ConfigError> {
        match get(&variable).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(value) => units::parse_size(&value)
                .map(|bytes| Some(Limit::Bytes(bytes)))
                .map_err(|_| ConfigError {
                    variable,
                    value,
                    expected: SIZE_FORMS.into(),
                }),
        }
    };
    let mut limits = MemoryLimits::default();
    let all = hami("CUDA_DEVICE_MEMORY_LIMIT".into())?;
    for (index, slot) in limits.per_device.iter_mut().enumerate() {
        *slot = hami(format!("CUDA_DEVICE_MEMORY_LIMIT_{index}"))?.or(all);
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_env as env;

    #[test]
    fn every_documented_dilu_form() {
        let all = from_env(env(&[("DILU_MEM_LIMIT", "8GiB")])).unwrap();
        assert_eq!(all.per_device[0], Some(Limit::Bytes(8 << 30)));
        assert_eq!(all.per_device[15], Some(Limit::Bytes(8 << 30)));

        let share = from_env(env(&[("DILU_MEM_LIMIT", "50%")])).unwrap();
        assert_eq!(share.per_device[3].unwrap().resolve(80 << 30), 40 << 30);

        let each = from_env(env(&[("DILU_MEM_LIMIT", "0:8GiB,1:4096MiB")])).unwrap();
        assert_eq!(each.per_device[0], Some(Limit::Bytes(8 << 30)));
        assert_eq!(each.per_device[1], Some(Limit::Bytes(4 << 30)));
        assert_eq!(each.per_device[2], None);
    }

    #[test]
    fn hami_names_are_aliases() {
        let limits = from_env(env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "8g"),
        ]))
        .unwrap();
        assert_eq!(limits.per_device[0], Some(Limit::Bytes(4 << 30)));
        assert_eq!(limits.per_device[1], Some(Limit::Bytes(8 << 30)));
        // dilu's own variable wins when both are set.
        let both = from_env(env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
            ("DILU_MEM_LIMIT", "1GiB"),
        ]))
        .unwrap();
        assert_eq!(both.per_device[0], Some(Limit::Bytes(1 << 30)));
    }

    #[test]
    fn no_variable_means_unlimited() {
        assert_eq!(from_env(env(&[])).unwrap(), MemoryLimits::default());
    }

    #[test]
    fn bad_values_name_the_variable_and_the_forms() {
        for bad in [
            "lots",
            "0:8GiB,0:4GiB",
            "16:1GiB",
            "150%",
            "0%",
            "0:",
            "8GiB,",
        ] {
            let error = from_env(env(&[("DILU_MEM_LIMIT", bad)])).unwrap_err();
            assert_eq!(error.variable, "DILU_MEM_LIMIT", "{bad}");
            assert!(error.to_string().contains("0:8GiB"), "{error}");
        }
        let error = from_env(env(&[("CUDA_DEVICE_MEMORY_LIMIT_2", "big")])).unwrap_err();
        assert_eq!(error.variable, "CUDA_DEVICE_MEMORY_LIMIT_2");
        assert!(error.to_string().contains("4096m"), "{error}");
    }
}
