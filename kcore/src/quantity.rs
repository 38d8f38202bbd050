//! `resource.Quantity` strings: `100m`, `0.5`, `1`, `64Mi`, `1G`, `1e3`, as CPU millicores or
//! bytes (rounded up, as the kubelet does when it converts).

/// Parses a quantity into a value scaled by `scale` (1000 for millicores, 1 for bytes), rounding
/// up. None for malformed input or overflow.
fn parse_scaled(s: &str, scale: u128) -> Option<u64> {
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
    u64::try_from(num.div_ceil(den)).ok()
}

/// CPU in millicores: `100m` → 100, `0.5` → 500, `2` → 2000.
pub fn cpu_milli(s: &str) -> Option<u64> {
    parse_scaled(s, 1000)
}

/// Bytes: `64Mi` → 67108864, `1G` → 10^9, `128974848` → 128974848.
pub fn bytes(s: &str) -> Option<u64> {
    parse_scaled(s, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quantities() {
        assert_eq!(cpu_milli("100m"), Some(100));
        assert_eq!(cpu_milli("0.5"), Some(500));
        assert_eq!(cpu_milli("2"), Some(2000));
        assert_eq!(cpu_milli("1.0005"), Some(1001), "rounded up");
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
}
