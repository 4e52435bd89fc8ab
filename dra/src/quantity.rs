//! Kubernetes quantities (`8Gi`, `512M`, `1.5`, `100m`, `2e9`) as numbers.
//!
//! Their suffixes are not `dilu run`'s: `M` is 10^6 and `m` is a
//! thousandth, so the plugin reads a claim's capacities with this parser
//! and never with [`dilu_abi::units::parse_size`].

/// The value of quantity `text`; `Err` names it and the accepted forms.
pub fn parse(text: &str) -> Result<f64, String> {
    let err = || {
        format!(
            "{text:?} is not a Kubernetes quantity (a number with an optional suffix: \
             Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as 2e9)"
        )
    };
    let trimmed = text.trim();
    let number_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(number_end);
    let mantissa: f64 = number.parse().map_err(|_| err())?;
    let scale = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..].parse().map_err(|_| err())?;
            10f64.powi(power)
        }
        _ => return Err(err()),
    };
    let value = mantissa * scale;
    if value.is_finite() {
        Ok(value)
    } else {
        Err(err())
    }
}

/// A quantity of bytes: rounded up to a whole byte, as Kubernetes does;
/// negative amounts are refused.
pub fn bytes(text: &str) -> Result<u64, String> {
    let value = parse(text)?;
    if value < 0.0 || value >= u64::MAX as f64 {
        return Err(format!("{text:?} is not a byte count"));
    }
    Ok(value.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_mean_what_kubernetes_means() {
        assert_eq!(bytes("8Gi"), Ok(8 << 30));
        assert_eq!(bytes("512M"), Ok(512_000_000), "M is decimal");
        assert_eq!(bytes("85899345920"), Ok(85_899_345_920));
        assert_eq!(bytes("2e9"), Ok(2_000_000_000));
        assert_eq!(bytes("1.5Ki"), Ok(1536));
        assert_eq!(bytes("1500m"), Ok(2), "m is a thousandth; bytes round up");
        assert_eq!(parse("30"), Ok(30.0));
        assert_eq!(parse("250m"), Ok(0.25));
        for bad in ["", "Gi", "8GB", "8 Gi", "x", "1e", "-1"] {
            let error = bytes(bad).unwrap_err();
            assert!(error.contains(&format!("{bad:?}")), "{bad}: {error}");
        }
    }
}
