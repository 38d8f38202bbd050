//! `resource.Quantity` strings: `100m`, `0.5`, `1`, `64Mi`, `1G`, `1e3`, as CPU millicores or
//! bytes (rounded up, as the kubelet does when it converts), or as an exact value in
//! billionths for comparisons by value (`1` equals `1000m`).

/// Parses a quantity into a value scaled by `scale` (1000 for millicores, 1 for bytes), rounding
/// up. None for malformed input or overflow.
fn parse_scaled(s: &str, scale: u128) -> Option<u128> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.is_empty() || num.starts_with('-') {
        return None;
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    // value = digits / 10^frac_len × multiplier, where the multiplier is (numerator, denominator).
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().ok()?;
            (10u128.checked_pow(exp)?, 1)
        }
        _ => return None,
    };
    let digits: u128 = format!("{int}{frac}").parse().ok()?;
    let den = 10u128.checked_pow(frac.len() as u32)?.checked_mul(div)?;
    let num = digits.checked_mul(mul)?.checked_mul(scale)?;
    Some(num.div_ceil(den))
}

/// CPU in millicores: `100m` → 100, `0.5` → 500, `2` → 2000.
pub fn cpu_milli(s: &str) -> Option<u64> {
    parse_scaled(s, 1000).and_then(|v| u64::try_from(v).ok())
}

/// Bytes: `64Mi` → 67108864, `1G` → 10^9, `128974848` → 128974848.
pub fn bytes(s: &str) -> Option<u64> {
    parse_scaled(s, 1).and_then(|v| u64::try_from(v).ok())
}

/// The value in billionths (`1` → 10^9, `1000m` → 10^9, `1Ki` → 1024 × 10^9), for comparing and
/// adding quantities by value as `resource.Quantity` does. Precision finer than 10^-9 is rounded
/// up (the API's own limit).
pub fn nanos(s: &str) -> Option<u128> {
    parse_scaled(s, 1_000_000_000)
}

/// The decimal SI suffix of a power of ten (`-9` → `n` ... `18` → `E`), as Kubernetes writes
/// quantities; None for other exponents.
pub fn decimal_suffix(exponent: i32) -> Option<&'static str> {
    Some(match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

/// A byte count as `resource.Quantity.String()` writes it: with the largest suffix that divides
/// it exactly, binary (`Ki`, `Mi`, ...) when `binary` and the count is at least 1024, else
/// decimal (`k`, `M`, ...); plain digits when no suffix divides it.
pub fn format_bytes(bytes: u64, binary: bool) -> String {
    let (base, suffixes): (u64, [&str; 6]) = if binary && bytes >= 1024 {
        (1024, ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
    } else {
        (1000, ["k", "M", "G", "T", "P", "E"])
    };
    if bytes == 0 {
        return "0".into();
    }
    let (mut n, mut suffix) = (bytes, "");
    for s in suffixes {
        if n % base != 0 {
            break;
        }
        n /= base;
        suffix = s;
    }
    format!("{n}{suffix}")
}

/// Whether a quantity string uses a binary suffix (`Ki` ... `Ei`).
pub fn is_binary(s: &str) -> bool {
    s.trim_end().ends_with('i')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bytes_as_quantity_strings() {
        for (bytes, binary, want) in [
            (0, true, "0"),
            (512, true, "512"),
            (1024, true, "1Ki"),
            (1 << 30, true, "1Gi"),
            (1024 * 1024 * 1536, true, "1536Mi"),
            (1500, true, "1500"),
            (1_000_000_000, false, "1G"),
            (1_500_000, false, "1500k"),
            (1 << 30, false, "1073741824"),
        ] {
            assert_eq!(format_bytes(bytes, binary), want, "{bytes} {binary}");
        }
        assert!(is_binary("10Mi") && !is_binary("10M") && !is_binary("100"));
    }

    #[test]
    fn parses_quantities() {
        assert_eq!(cpu_milli("100m"), Some(100));
        assert_eq!(cpu_milli("0.5"), Some(500));
        assert_eq!(cpu_milli("2"), Some(2000));
        assert_eq!(cpu_milli("1.0005"), Some(1001), "rounded up");
        assert_eq!(cpu_milli("250000u"), Some(250));
        assert_eq!(cpu_milli("1n"), Some(1), "rounded up");
        assert_eq!(bytes("64Mi"), Some(67_108_864));
        assert_eq!(bytes("170Mi"), Some(178_257_920));
        assert_eq!(bytes("8125292Ki"), Some(8_320_299_008));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("1e3"), Some(1000));
        assert_eq!(bytes("129M"), Some(129_000_000));
        for bad in ["", "-1", "1x", "Mi", "1.2.3", "1e", "abc"] {
            assert_eq!(bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn values_compare_across_forms() {
        assert_eq!(nanos("1"), nanos("1000m"));
        assert_eq!(nanos("0.5"), nanos("500m"));
        assert_eq!(nanos("1Gi"), nanos("1073741824"));
        assert_eq!(nanos("1k"), nanos("1e3"));
        assert_eq!(nanos("1n"), Some(1));
        assert_eq!(
            nanos("8Ei"),
            Some(8 * (1u128 << 60) * 1_000_000_000),
            "no overflow"
        );
        assert!(nanos("100m") < nanos("0.2"));
        assert_eq!(nanos("0"), Some(0));
        assert_eq!(nanos("x"), None);
    }
}
