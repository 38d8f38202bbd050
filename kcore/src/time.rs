//! `metav1.Time` (RFC 3339, seconds) and `metav1.MicroTime` (microseconds) in UTC.

use std::time::{SystemTime, UNIX_EPOCH};

fn civil(secs: i64) -> (i64, i64, i64, i64) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem)
}

fn since_epoch(t: SystemTime) -> (i64, u32) {
    t.duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_micros()))
        .unwrap_or((0, 0))
}

/// Whole seconds since the Unix epoch (0 before it).
pub fn unix_seconds(t: SystemTime) -> i64 {
    since_epoch(t).0
}

/// `2026-11-29T13:40:00Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let (y, m, d, rem) = civil(since_epoch(t).0);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `2026-11-29T13:40:00.123456Z` (Leases' renewTime).
pub fn rfc3339_micros(t: SystemTime) -> String {
    let (secs, micros) = since_epoch(t);
    let (y, m, d, rem) = civil(secs);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `2026-11-29T13:40:00.123456789Z` (CRI log records).
pub fn rfc3339_nanos(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (y, m, d2, rem) = civil(d.as_secs() as i64);
    format!(
        "{y:04}-{m:02}-{d2:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Seconds since the epoch of an RFC 3339 UTC timestamp (fractions ignored).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    if s.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip() {
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_795_000_000_123_456);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339_micros(t), "2026-11-18T11:06:40.123456Z");
        assert_eq!(parse_rfc3339("2026-11-18T11:06:40Z"), Some(1_795_000_000));
        assert_eq!(parse_rfc3339("2026-11-18T11:06:40.123456Z"), Some(1_795_000_000));
        assert_eq!(parse_rfc3339("garbage"), None);
    }
}
