//! What a user writes for a tenant (its name, memory budget and SM share),
//! checked by one set of rules wherever it is given: `dilu run` before the
//! program starts, the interposer when the same variables are set by hand,
//! and the node manager for every registration.

use dilu_layout::ledger::MAX_DEVICES;

pub const TENANT_NAME_FORMS: &str =
    "1 to 64 characters from A-Z a-z 0-9 . _ -, not starting with a dot";

/// A tenant name: it names files under `/dev/shm`, so no path of its own
/// (`.`, `..`, hidden files) and nothing a file name cannot hold.
pub fn check_tenant_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(70).collect();
        let cut = if shown.len() < name.len() { "…" } else { "" };
        Err(format!(
            "tenant name {shown:?}{cut} is invalid ({} characters): use {TENANT_NAME_FORMS}",
            name.chars().count()
        ))
    }
}

/// A memory limit before the device's size is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemLimit {
    Bytes(u64),
    /// Fraction of the device's total memory, in (0, 1].
    Fraction(f64),
}

impl MemLimit {
    /// The limit in bytes on a device with `total` bytes.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            MemLimit::Bytes(bytes) => bytes,
            MemLimit::Fraction(fraction) => (total as f64 * fraction) as u64,
        }
    }
}

pub const MEM_LIMIT_FORMS: &str = "a size above 0 for every device (8GiB, 8192MiB), a share of each device (50%), \
     or per-device entries (0:8GiB,1:4GiB or 0:50%) with indices below 16";

fn mem_limit(text: &str) -> Option<MemLimit> {
    let text = text.trim();
    if let Some(percent) = text.strip_suffix('%') {
        let value: f64 = percent.trim().parse().ok()?;
        return (value > 0.0 && value <= 100.0).then_some(MemLimit::Fraction(value / 100.0));
    }
    // A budget of 0 bytes would refuse the context itself: never meant.
    crate::units::parse_size(text)
        .ok()
        .filter(|&bytes| bytes > 0)
        .map(MemLimit::Bytes)
}

/// Per-device values of `0:X,1:Y`, or one value for every device.
fn per_device<T: Copy>(
    value: &str,
    one: impl Fn(&str) -> Option<T>,
) -> Option<[Option<T>; MAX_DEVICES]> {
    if !value.contains(':') {
        return Some([Some(one(value)?); MAX_DEVICES]);
    }
    let mut out = [None; MAX_DEVICES];
    let mut seen = [false; MAX_DEVICES];
    for entry in value.split(',') {
        let (index, text) = entry.split_once(':')?;
        let index: usize = index.trim().parse().ok()?;
        if index >= MAX_DEVICES || seen[index] {
            return None;
        }
        seen[index] = true;
        out[index] = Some(one(text)?);
    }
    Some(out)
}

/// `DILU_MEM_LIMIT` (`dilu run --mem`): `None` when it is not one of
/// [`MEM_LIMIT_FORMS`].
pub fn parse_mem_limits(value: &str) -> Option<[Option<MemLimit>; MAX_DEVICES]> {
    per_device(value, mem_limit)
}

pub const SM_LIMIT_FORMS: &str = "a percentage of every device's time from 1 to 100 (30 or 30%), \
     or per-device entries (0:30,1:50) with indices below 16";

/// One SM share in percent (1–100), as written.
fn sm_percent(text: &str) -> Option<f64> {
    let text = text.trim();
    let number = text.strip_suffix('%').unwrap_or(text).trim();
    let percent: f64 = number.parse().ok()?;
    (1.0..=100.0).contains(&percent).then_some(percent)
}

/// `DILU_SM_LIMIT` (`dilu run --sm`), in percent per device: `None` when it
/// is not one of [`SM_LIMIT_FORMS`]. Devices an entry list leaves out are
/// `None` (no limit).
pub fn parse_sm_limits(value: &str) -> Option<[Option<f64>; MAX_DEVICES]> {
    per_device(value, sm_percent)
}

/// The one share `DILU_SM_LIMIT` gives every device (`30`, `30%`), which
/// the node manager takes as a request and a limit; `Err` for a per-device
/// value, which it cannot take (its shares are per tenant).
pub fn uniform_sm_limit(value: &str) -> Result<crate::units::SmShare, String> {
    if value.contains(':') {
        return Err(format!(
            "DILU_SM_LIMIT={value:?} (--sm) gives devices different shares, which the node \
             manager does not take: give the tenant --sm-request and --sm-limit instead"
        ));
    }
    sm_percent(value)
        .and_then(crate::units::SmShare::from_percent)
        .ok_or_else(|| format!("DILU_SM_LIMIT={value:?} is invalid: expected {SM_LIMIT_FORMS}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_be_paths_or_too_long_are_refused_with_the_forms() {
        for good in ["infer", "a.b-c_1", "x"] {
            assert!(check_tenant_name(good).is_ok(), "{good}");
        }
        for bad in [".", "..", ".hidden", "", "a/b", "sp ace", "é"] {
            let error = check_tenant_name(bad).unwrap_err();
            assert!(error.contains("A-Z a-z 0-9"), "{bad}: {error}");
        }
        let long = "n".repeat(300);
        let error = check_tenant_name(&long).unwrap_err();
        assert!(error.contains("300 characters"), "{error}");
        assert!(error.len() < 200, "the name is cut: {error}");
    }

    #[test]
    fn a_memory_limit_of_nothing_is_refused() {
        for bad in [
            "0",
            "0GiB",
            "0%",
            "0:0",
            "-1",
            "x",
            "0:8GiB,0:4GiB",
            "16:1GiB",
        ] {
            assert!(parse_mem_limits(bad).is_none(), "{bad}");
        }
        let limits = parse_mem_limits("0:8GiB,1:50%").unwrap();
        assert_eq!(limits[0], Some(MemLimit::Bytes(8 << 30)));
        assert_eq!(limits[1].unwrap().resolve(80 << 30), 40 << 30);
        assert_eq!(limits[2], None);
    }

    #[test]
    fn sm_shares_are_percentages_and_only_a_uniform_one_goes_to_the_node_manager() {
        assert_eq!(parse_sm_limits("30%").unwrap()[5], Some(30.0));
        assert_eq!(parse_sm_limits("0:30,1:50").unwrap()[1], Some(50.0));
        for bad in ["0", "101", "abc", "0:30,0:40"] {
            assert!(parse_sm_limits(bad).is_none(), "{bad}");
        }
        assert_eq!(
            uniform_sm_limit("50"),
            Ok(crate::units::SmShare::percent(50.0))
        );
        assert!(
            uniform_sm_limit("0:30")
                .unwrap_err()
                .contains("--sm-request")
        );
        assert!(uniform_sm_limit("0").is_err());
    }
}
