//! Usage values as metrics-server prints them: `resource.Quantity` in its canonical form, CPU
//! from nanocores in the decimal SI format (`250m`, `1234567n`, `12345u`, `2`), memory from bytes
//! in the binary SI format (`64Mi`, `1235628Ki`, a plain number when not a multiple of 1024, and
//! values under 1024 in decimal SI, as `Quantity` does).

use std::time::Duration;

use kcore::quantity::decimal_suffix;

/// A decimal mantissa and its power-of-ten exponent in the canonical form: trailing zeros
/// removed, then the exponent lowered to a multiple of 3.
fn decimal_canonical(value: u64, exponent: i32) -> (u128, i32) {
    let (mut m, mut e) = (u128::from(value), exponent);
    while m >= 10 && m.is_multiple_of(10) {
        m /= 10;
        e += 1;
    }
    match e.rem_euclid(3) {
        1 => (m * 10, e - 1),
        2 => (m * 100, e - 2),
        _ => (m, e),
    }
}

/// `value × 10^exponent` in the decimal SI format.
fn decimal_si(value: u64, exponent: i32) -> String {
    if value == 0 {
        return "0".into();
    }
    let (m, e) = decimal_canonical(value, exponent);
    match decimal_suffix(e) {
        Some(s) => format!("{m}{s}"),
        // Beyond exa: Quantity falls back to an exponent.
        None => format!("{m}e{e}"),
    }
}

/// CPU usage from nanocores (`resource.NewScaledQuantity(n, -9)`, DecimalSI).
pub fn cpu(nanocores: u64) -> String {
    decimal_si(nanocores, -9)
}

/// Memory usage from bytes (`resource.NewQuantity(b, BinarySI)`).
pub fn memory(bytes: u64) -> String {
    if bytes < 1024 {
        return decimal_si(bytes, 0);
    }
    let (mut m, mut e) = (bytes, 0usize);
    while m >= 1024 && m.is_multiple_of(1024) && e < 6 {
        m /= 1024;
        e += 1;
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][e];
    format!("{m}{suffix}")
}

/// A window as Go's `time.Duration.String()` writes whole seconds and milliseconds (`15s`,
/// `10.5s`), the form of `metav1.Duration` in JSON.
pub fn window(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        let frac = format!("{:03}", ms % 1000);
        format!("{}.{}s", ms / 1000, frac.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_as_metrics_server_prints_it() {
        assert_eq!(cpu(0), "0");
        assert_eq!(cpu(250_000_000), "250m");
        assert_eq!(cpu(1_500_000_000), "1500m");
        assert_eq!(cpu(2_000_000_000), "2");
        assert_eq!(cpu(138_458_233), "138458233n");
        assert_eq!(cpu(12_345_000), "12345u");
        assert_eq!(cpu(1_000), "1u");
        assert_eq!(cpu(7), "7n");
        assert_eq!(cpu(3_000_000_000_000), "3k");
    }

    #[test]
    fn memory_as_metrics_server_prints_it() {
        assert_eq!(memory(0), "0");
        assert_eq!(memory(512), "512");
        assert_eq!(memory(1000), "1k");
        assert_eq!(memory(1024), "1Ki");
        assert_eq!(memory(64 << 20), "64Mi");
        assert_eq!(memory(1_265_283_072), "1235628Ki");
        assert_eq!(memory(1_265_283_073), "1265283073");
        assert_eq!(memory(3 << 30), "3Gi");
    }

    #[test]
    fn windows_as_go_durations() {
        assert_eq!(window(Duration::from_secs(15)), "15s");
        assert_eq!(window(Duration::from_millis(10_500)), "10.5s");
        assert_eq!(window(Duration::from_millis(10_059)), "10.059s");
    }
}
