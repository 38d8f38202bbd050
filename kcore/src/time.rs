//! `metav1.Time` (RFC 3339, seconds) and `metav1.MicroTime` (microseconds) in UTC, through
//! `chrono` (already linked by the `kube` client and `k8s-openapi`).

use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, SecondsFormat, Utc};

fn utc(t: SystemTime) -> DateTime<Utc> {
    DateTime::<Utc>::from(t.max(UNIX_EPOCH))
}

/// Whole seconds since the Unix epoch (0 before it).
pub fn unix_seconds(t: SystemTime) -> i64 {
    utc(t).timestamp()
}

/// `2026-11-29T13:40:00Z`.
pub fn rfc3339(t: SystemTime) -> String {
    utc(t).to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `2026-11-29T13:40:00.123456Z` (Leases' renewTime).
pub fn rfc3339_micros(t: SystemTime) -> String {
    utc(t).to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// `2026-11-29T13:40:00.123456789Z` (CRI log records).
pub fn rfc3339_nanos(t: SystemTime) -> String {
    utc(t).to_rfc3339_opts(SecondsFormat::Nanos, true)
}

/// Seconds since the epoch of an RFC 3339 timestamp (fractions ignored; any offset).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(s).ok().map(|t| t.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_round_trip() {
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_795_000_000_123_456);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
        assert_eq!(rfc3339_micros(t), "2026-11-18T11:06:40.123456Z");
        assert_eq!(rfc3339_nanos(t), "2026-11-18T11:06:40.123456000Z");
        assert_eq!(unix_seconds(t), 1_795_000_000);
        assert_eq!(parse_rfc3339("2026-11-18T11:06:40Z"), Some(1_795_000_000));
        assert_eq!(parse_rfc3339("2026-11-18T11:06:40.123456Z"), Some(1_795_000_000));
        assert_eq!(parse_rfc3339("2026-11-18T12:06:40+01:00"), Some(1_795_000_000));
        assert_eq!(parse_rfc3339("garbage"), None);
        assert_eq!(parse_rfc3339("2026-13-18T11:06:40Z"), None);
        assert_eq!(
            rfc3339(UNIX_EPOCH - std::time::Duration::from_secs(5)),
            "1970-01-01T00:00:00Z"
        );
    }
}
