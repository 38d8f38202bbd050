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

/// Go's `time.ParseDuration`: numbers (with an optional fraction) each followed by a unit
/// (`h`, `m`, `s`, `ms`, `us`/`µs`, `ns`), e.g. `90s`, `1h30m`, `1.5h`, `500ms`; a bare `0`.
/// None when malformed (signs are not taken: no caller wants a negative duration).
pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(std::time::Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    std::time::Duration::try_from_secs_f64(total).ok()
}

/// Go's `time.Duration.String()` of the whole seconds of `d` (`0s`, `90s` → `1m30s`,
/// `1h0m0s`).
pub fn go_duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec}s"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_and_print_as_go() {
        use std::time::Duration;
        for (text, want) in [
            ("90s", Some(Duration::from_secs(90))),
            ("1h30m", Some(Duration::from_secs(5400))),
            ("1.5h", Some(Duration::from_secs(5400))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1m0.5s", Some(Duration::from_millis(60_500))),
            ("0", Some(Duration::ZERO)),
            ("0s", Some(Duration::ZERO)),
            ("", None),
            ("5", None),
            ("5x", None),
            ("-5s", None),
            ("s", None),
        ] {
            assert_eq!(parse_go_duration(text), want, "{text:?}");
        }
        for (secs, text) in [
            (0, "0s"),
            (59, "59s"),
            (90, "1m30s"),
            (300, "5m0s"),
            (3600, "1h0m0s"),
            (3661, "1h1m1s"),
        ] {
            assert_eq!(go_duration(Duration::from_secs(secs)), text);
        }
    }

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
