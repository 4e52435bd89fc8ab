//! Parsing of the sizes and durations users write in flags and env vars.

use std::fmt;

/// Why a user-written value was refused; `Display` gives the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError {
    pub value: String,
    pub expected: &'static str,
}

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid value {:?}: expected {}",
            self.value, self.expected
        )
    }
}

impl std::error::Error for UnitError {}

pub const SIZE_FORMS: &str =
    "a byte size such as 8GiB, 8192MiB, 512M, 8g, 4096m or a plain byte count";

/// Parses a byte size: `8GiB`, `8192MiB`, `512KiB`, `8GB` (decimal),
/// HAMi-style `8g` / `4096m` / `512k` (binary, as HAMi-core reads them), or a
/// plain integer count of bytes. Fractions (`1.5GiB`) are accepted.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let err = || UnitError {
        value: text.to_string(),
        expected: SIZE_FORMS,
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(err());
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "ki" => 1 << 10,
        "m" | "mib" | "mi" => 1 << 20,
        "g" | "gib" | "gi" => 1 << 30,
        "t" | "tib" | "ti" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(err()),
    };
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).ok_or_else(err);
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

pub const DURATION_FORMS: &str =
    "a duration such as 100us, 5ms, 1.5s, 2m, 1h, 250ns or a plain nanosecond count";

/// Parses a duration into nanoseconds: `250ns`, `100us`, `5ms`, `1.5s`,
/// `2m` (minutes), `1h`, or a plain integer of nanoseconds.
pub fn parse_duration_ns(text: &str) -> Result<u64, UnitError> {
    let err = || UnitError {
        value: text.to_string(),
        expected: DURATION_FORMS,
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(err());
    }
    let scale: f64 = match unit.trim() {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return Err(err()),
    };
    let value: f64 = number.parse().map_err(|_| err())?;
    let ns = value * scale;
    if !ns.is_finite() || ns >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(ns.round() as u64)
}

/// A share of one device's SM time, held in millionths (ppm, what the
/// budgets and the controllers use) and written by people as a percent
/// (what flags, configuration files, status and the wire carry: serialised
/// as a percent number, so state files and `dilu status --json` read as
/// they did). One type, so a share is converted in one place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SmShare(u32);

impl SmShare {
    pub const NONE: SmShare = SmShare(0);
    /// The whole device.
    pub const FULL: SmShare = SmShare(1_000_000);

    /// A share in millionths of the device, at most the whole device.
    pub const fn from_ppm(ppm: u32) -> SmShare {
        SmShare(if ppm > Self::FULL.0 {
            Self::FULL.0
        } else {
            ppm
        })
    }

    /// `percent` of the device, to the nearest millionth; `None` outside
    /// 0-100 (or not a number).
    pub fn from_percent(percent: f64) -> Option<SmShare> {
        (0.0..=100.0)
            .contains(&percent)
            .then(|| SmShare((percent * 10_000.0).round() as u32))
    }

    /// For shares written in code: `percent` must be 0-100.
    pub fn percent(percent: f64) -> SmShare {
        Self::from_percent(percent)
            .unwrap_or_else(|| panic!("an SM share of {percent}% is not 0-100%"))
    }

    /// A share a computation gave as a fraction of the device (a
    /// placement's demand), held to 0-1.
    pub fn of_fraction(fraction: f64) -> SmShare {
        // `as` saturates: below 0 (or NaN) is none.
        SmShare::from_ppm((fraction * 1_000_000.0).round() as u32)
    }

    pub const fn ppm(self) -> u32 {
        self.0
    }

    pub fn as_percent(self) -> f64 {
        f64::from(self.0) / 10_000.0
    }

    /// The share as a fraction of the device (0-1).
    pub fn as_fraction(self) -> f64 {
        f64::from(self.0) / 1_000_000.0
    }

    /// What is left of the device beside `used` (none when over it).
    pub const fn rest_beside(used: u32) -> SmShare {
        SmShare(Self::FULL.0.saturating_sub(used))
    }
}

pub const SM_SHARE_FORMS: &str = "a percentage from 0 to 100 such as 30, 30% or 12.5";

/// `30`, `30%`, `12.5`.
impl std::str::FromStr for SmShare {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<SmShare, UnitError> {
        let number = text.trim().strip_suffix('%').unwrap_or(text.trim()).trim();
        number
            .parse()
            .ok()
            .and_then(SmShare::from_percent)
            .ok_or_else(|| UnitError {
                value: text.to_string(),
                expected: SM_SHARE_FORMS,
            })
    }
}

/// `30%`, `12.5%`.
impl fmt::Display for SmShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.as_percent())
    }
}

impl serde::Serialize for SmShare {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.as_percent())
    }
}

impl<'de> serde::Deserialize<'de> for SmShare {
    /// A percent from 0 to 100; anything else is an error, never clamped
    /// (a tenant's message is untrusted).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SmShare, D::Error> {
        let percent = f64::deserialize(deserializer)?;
        SmShare::from_percent(percent).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "an SM share is a percentage from 0 to 100, not {percent}"
            ))
        })
    }
}

/// An amount of device memory in bytes (a tenant's budget per device): written
/// by people as a size (`8GiB`, see [`parse_size`]), printed as one
/// (`8.00 GiB`), and carried on the wire and in state files as the plain
/// byte count, so files written before read the same. One type, so a budget
/// is never taken for a count of MiB or a share.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(u64);

impl Bytes {
    pub const ZERO: Bytes = Bytes(0);

    pub const fn new(bytes: u64) -> Bytes {
        Bytes(bytes)
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> Bytes {
        Bytes(n << 20)
    }

    /// `n` GiB.
    pub const fn gib(n: u64) -> Bytes {
        Bytes(n << 30)
    }

    /// The count of bytes (for the shared-memory budgets and the driver).
    pub const fn get(self) -> u64 {
        self.0
    }

    /// What is left of `self` beside `used` (none when over it).
    pub const fn saturating_sub(self, used: Bytes) -> Bytes {
        Bytes(self.0.saturating_sub(used.0))
    }

    pub const fn saturating_add(self, more: Bytes) -> Bytes {
        Bytes(self.0.saturating_add(more.0))
    }
}

impl std::iter::Sum for Bytes {
    fn sum<I: Iterator<Item = Bytes>>(iter: I) -> Bytes {
        Bytes(iter.map(|b| b.0).fold(0, u64::saturating_add))
    }
}

/// `8GiB`, `512MiB`, `4096m`, a plain byte count ([`parse_size`]).
impl std::str::FromStr for Bytes {
    type Err = UnitError;
    fn from_str(text: &str) -> Result<Bytes, UnitError> {
        parse_size(text).map(Bytes)
    }
}

/// `8.00 GiB` ([`format_size`]).
impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

/// Formats bytes the way the CLI prints them (`8.00 GiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_documented_form() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("8192MiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("4096m").unwrap(), 4 << 30);
        assert_eq!(parse_size("8g").unwrap(), 8 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("12345").unwrap(), 12345);
    }

    #[test]
    fn a_memory_amount_reads_and_prints_as_a_size_and_travels_as_a_count() {
        let budget: Bytes = "8GiB".parse().unwrap();
        assert_eq!(budget, Bytes::gib(8));
        assert_eq!(budget.to_string(), "8.00 GiB");
        assert_eq!(serde_json::to_string(&budget).unwrap(), "8589934592");
        assert_eq!(serde_json::from_str::<Bytes>("8589934592").unwrap(), budget);
        assert!("8 apples".parse::<Bytes>().is_err());
        assert_eq!(
            [Bytes::gib(1), Bytes::mib(512)].into_iter().sum::<Bytes>(),
            Bytes::mib(1536)
        );
        assert_eq!(Bytes::mib(1).saturating_sub(Bytes::gib(1)), Bytes::ZERO);
    }

    #[test]
    fn bad_sizes_are_refused_with_the_forms() {
        let err = parse_size("lots").unwrap_err();
        assert!(err.to_string().contains("8GiB"), "{err}");
        assert!(parse_size("").is_err());
        assert!(parse_size("-1GiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("100us").unwrap(), 100_000);
        assert_eq!(parse_duration_ns("5ms").unwrap(), 5_000_000);
        assert_eq!(parse_duration_ns("1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration_ns("250").unwrap(), 250);
        assert_eq!(parse_duration_ns("2m").unwrap(), 120_000_000_000);
        assert_eq!(parse_duration_ns("1.5h").unwrap(), 5_400_000_000_000);
        assert!(parse_duration_ns("soon").is_err());
    }

    #[test]
    fn a_share_is_kept_in_millionths_and_read_as_a_percent() {
        let share = SmShare::from_percent(33.33).unwrap();
        assert_eq!(share.ppm(), 333_300);
        assert_eq!(share.as_percent(), 33.33);
        assert_eq!(share.to_string(), "33.33%");
        assert_eq!(SmShare::percent(25.0).as_fraction(), 0.25);
        for bad in [-1.0, 100.5, f64::NAN, f64::INFINITY] {
            assert_eq!(SmShare::from_percent(bad), None, "{bad}");
        }
        assert_eq!(SmShare::from_ppm(2_000_000), SmShare::FULL);
        assert_eq!(" 30% ".parse(), Ok(SmShare::percent(30.0)));
        assert_eq!("12.5".parse(), Ok(SmShare::from_ppm(125_000)));
        let error = "101".parse::<SmShare>().unwrap_err();
        assert!(error.to_string().contains("from 0 to 100"), "{error}");
        assert_eq!(SmShare::rest_beside(700_000), SmShare::percent(30.0));
        assert_eq!(SmShare::rest_beside(1_200_000), SmShare::NONE);
        // On the wire and in state files: a percent number, checked.
        assert_eq!(serde_json::to_string(&share).unwrap(), "33.33");
        assert_eq!(
            serde_json::from_str::<SmShare>("40").unwrap(),
            SmShare::percent(40.0)
        );
        assert!(serde_json::from_str::<SmShare>("140").is_err());
        assert!(serde_json::from_str::<SmShare>("-3").is_err());
    }

    #[test]
    fn formats_sizes() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(8 << 30), "8.00 GiB");
    }
}
