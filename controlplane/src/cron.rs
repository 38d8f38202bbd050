//! CronJob schedules as upstream parses them (robfig/cron v3 `ParseStandard`, docs/SEEDS-SPEC.md
//! CTL-34): five fields (minute, hour, day of month, month, day of week 0-6 with Sunday 0),
//! `*`/`?`, ranges, steps (`N/step` means `N-max/step`), month and weekday names, the
//! descriptors `@yearly`/`@annually`/`@monthly`/`@weekly`/`@daily`/`@midnight`/`@hourly` and
//! `@every <duration>`, and a `TZ=`/`CRON_TZ=` prefix. Day of month and day of week are ORed when
//! both are restricted and ANDed when either starts with `*` (`0 0 13 * 5`: every Friday and
//! every 13th).
//!
//! Written here rather than taken from a crate: the Rust cron crates parse six or seven fields
//! with seconds, or differ on the star rule of the day fields or on `N/step`; upstream's
//! behaviour is this exact grammar. Times are computed on the wall clock of the schedule's time
//! zone (jiff, the host's zoneinfo); a wall time skipped by a DST change runs at the same
//! offset after it.

use std::time::Duration;

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// Why a schedule does not parse (the texts are robfig/cron's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("expected exactly 5 fields, found {found}: {spec}")]
    FieldCount { found: usize, spec: String },
    #[error("unrecognized descriptor: {0}")]
    Descriptor(String),
    #[error("failed to parse duration {0}")]
    Every(String),
    #[error("failed to parse int from {0}: strconv.Atoi: parsing {0:?}: invalid syntax")]
    Int(String),
    #[error("beginning of range ({start}) below minimum ({min}): {spec}")]
    BelowMin { start: u32, min: u32, spec: String },
    #[error("end of range ({end}) above maximum ({max}): {spec}")]
    AboveMax { end: u32, max: u32, spec: String },
    #[error("beginning of range ({start}) beyond end of range ({end}): {spec}")]
    Inverted { start: u32, end: u32, spec: String },
    #[error("step of range should be a positive number: {0}")]
    Step(String),
    #[error("too many hyphens: {0}")]
    Hyphens(String),
    #[error("too many slashes: {0}")]
    Slashes(String),
    #[error("provided bad location {name}: {reason}")]
    Location { name: String, reason: String },
}

/// Bounds and names of one field.
struct Field {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Field = Field {
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    min: 1,
    max: 12,
    names: &[
        "", "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DOW: Field = Field {
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// A field's allowed values (bit n = value n) and whether it was written as `*`/`?` (step 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bits {
    set: u64,
    star: bool,
}

impl Bits {
    fn has(self, v: i8) -> bool {
        v >= 0 && self.set & (1u64 << v) != 0
    }
}

/// A parsed schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    Fields {
        minute: Bits,
        hour: Bits,
        dom: Bits,
        month: Bits,
        dow: Bits,
        /// The `TZ=`/`CRON_TZ=` prefix, if any.
        zone: Option<String>,
    },
    /// `@every <duration>`: a constant delay (whole seconds, at least one).
    Every(Duration),
}

fn parse_int(text: &str) -> Result<u32, ScheduleError> {
    text.parse::<u32>().map_err(|_| ScheduleError::Int(text.into()))
}

fn value(text: &str, f: &Field) -> Result<u32, ScheduleError> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = f.names.iter().position(|n| !n.is_empty() && *n == lower) {
        return Ok(i as u32);
    }
    parse_int(text)
}

/// One comma-separated part: `*`, `?`, `a`, `a-b`, each with an optional `/step`.
fn range(expr: &str, f: &Field) -> Result<Bits, ScheduleError> {
    let mut slash = expr.split('/');
    let low_high = slash.next().unwrap_or_default();
    let step_text = slash.next();
    if slash.next().is_some() {
        return Err(ScheduleError::Slashes(expr.into()));
    }
    let mut hyphen = low_high.split('-');
    let first = hyphen.next().unwrap_or_default();
    let second = hyphen.next();
    if hyphen.next().is_some() {
        return Err(ScheduleError::Hyphens(expr.into()));
    }
    let (start, mut end, mut star) = if first == "*" || first == "?" {
        (f.min, f.max, true)
    } else {
        let start = value(first, f)?;
        let end = match second {
            Some(s) => value(s, f)?,
            None => start,
        };
        (start, end, false)
    };
    let step = match step_text {
        None => 1,
        Some(s) => {
            let step = parse_int(s)?;
            if step == 0 {
                return Err(ScheduleError::Step(expr.into()));
            }
            // `N/step` means `N-max/step`.
            if second.is_none() && !star {
                end = f.max;
            }
            if step > 1 {
                star = false;
            }
            step
        }
    };
    if start < f.min {
        return Err(ScheduleError::BelowMin {
            start,
            min: f.min,
            spec: expr.into(),
        });
    }
    if end > f.max {
        return Err(ScheduleError::AboveMax {
            end,
            max: f.max,
            spec: expr.into(),
        });
    }
    if start > end {
        return Err(ScheduleError::Inverted {
            start,
            end,
            spec: expr.into(),
        });
    }
    let mut set = 0u64;
    let mut v = start;
    while v <= end {
        set |= 1u64 << v;
        v += step;
    }
    Ok(Bits { set, star })
}

fn field(text: &str, f: &Field) -> Result<Bits, ScheduleError> {
    let mut out = Bits { set: 0, star: false };
    for part in text.split(',') {
        let b = range(part, f)?;
        out.set |= b.set;
        out.star |= b.star;
    }
    Ok(out)
}

/// Parses `spec` as upstream's `cron.ParseStandard`.
pub fn parse(spec: &str) -> Result<Schedule, ScheduleError> {
    let mut spec = spec.trim();
    let mut zone = None;
    if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
        let (prefix, rest) = spec.split_once(' ').unwrap_or((spec, ""));
        let name = prefix.split_once('=').map(|(_, z)| z).unwrap_or_default();
        TimeZone::get(name).map_err(|e| ScheduleError::Location {
            name: name.into(),
            reason: e.to_string(),
        })?;
        zone = Some(name.to_string());
        spec = rest.trim();
    }
    if let Some(every) = spec.strip_prefix("@every ") {
        let d = kcore::time::parse_go_duration(every.trim())
            .ok_or_else(|| ScheduleError::Every(every.trim().into()))?;
        // robfig: at least one second, whole seconds.
        let secs = d.as_secs().max(1);
        return Ok(Schedule::Every(Duration::from_secs(secs)));
    }
    let expanded = match spec {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        s if s.starts_with('@') => return Err(ScheduleError::Descriptor(s.into())),
        s => s,
    };
    let fields: Vec<&str> = expanded.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(ScheduleError::FieldCount {
            found: fields.len(),
            spec: format!("[{}]", fields.join(" ")),
        });
    }
    Ok(Schedule::Fields {
        minute: field(fields[0], &MINUTE)?,
        hour: field(fields[1], &HOUR)?,
        dom: field(fields[2], &DOM)?,
        month: field(fields[3], &MONTH)?,
        dow: field(fields[4], &DOW)?,
        zone,
    })
}

fn civil(y: i16, m: i8, d: i8, h: i8, min: i8) -> Option<DateTime> {
    DateTime::new(y, m, d, h, min, 0, 0).ok()
}

impl Schedule {
    /// The zone named in the schedule itself (`TZ=...`), if any.
    pub fn zone(&self) -> Option<&str> {
        match self {
            Schedule::Fields { zone, .. } => zone.as_deref(),
            Schedule::Every(_) => None,
        }
    }

    /// The first activation strictly after `after`, on the wall clock of `tz` (None if there is
    /// none within five years, like `59 23 31 2 *`).
    pub fn next(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let (minute, hour, dom, month, dow) = match self {
            Schedule::Every(d) => {
                let whole = Timestamp::from_second(after.as_second()).ok()?;
                let secs = i64::try_from(d.as_secs()).ok()?;
                return whole.checked_add(secs.seconds()).ok();
            }
            Schedule::Fields {
                minute,
                hour,
                dom,
                month,
                dow,
                ..
            } => (*minute, *hour, *dom, *month, *dow),
        };
        let start = tz.to_datetime(after);
        // The next whole minute after `after`.
        let mut t = civil(
            start.year(),
            start.month(),
            start.day(),
            start.hour(),
            start.minute(),
        )?
        .checked_add(1.minute())
        .ok()?;
        let limit = start.year().saturating_add(5);
        let day_matches = |d: Date| {
            let dom_ok = dom.has(d.day());
            let dow_ok = dow.has(d.weekday().to_sunday_zero_offset());
            if dom.star || dow.star {
                dom_ok && dow_ok
            } else {
                dom_ok || dow_ok
            }
        };
        loop {
            if t.year() > limit {
                return None;
            }
            if !month.has(t.month()) {
                let first = t.date().first_of_month().checked_add(1.month()).ok()?;
                t = first.to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if !day_matches(t.date()) {
                t = t
                    .date()
                    .tomorrow()
                    .ok()?
                    .to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if !hour.has(t.hour()) {
                t = civil(t.year(), t.month(), t.day(), t.hour(), 0)?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if !minute.has(t.minute()) {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = tz.to_ambiguous_timestamp(t).compatible().ok()?;
            if at > after {
                return Some(at);
            }
            // A wall time repeated by a DST change: look further.
            t = t.checked_add(1.minute()).ok()?;
        }
    }
}

/// A time zone name the host's zone database does not know (jiff's text).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct UnknownTimeZone(pub String);

/// The time zone a CronJob's schedule runs in: `spec.timeZone`, else the controller's own.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, UnknownTimeZone> {
    match name {
        None | Some("Local") => Ok(TimeZone::system()),
        Some(n) => TimeZone::get(n).map_err(|e| UnknownTimeZone(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn next(spec: &str, after: &str) -> String {
        parse(spec)
            .expect("parses")
            .next(ts(after), &TimeZone::UTC)
            .map(|t| t.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn five_fields_ranges_steps_and_names() {
        assert_eq!(next("* * * * *", "2026-06-01T12:00:00Z"), "2026-06-01T12:01:00Z");
        assert_eq!(next("* * * * *", "2026-06-01T12:00:30Z"), "2026-06-01T12:01:00Z");
        assert_eq!(
            next("*/15 * * * *", "2026-06-01T12:01:00Z"),
            "2026-06-01T12:15:00Z"
        );
        assert_eq!(
            next("5/20 * * * *", "2026-06-01T12:30:00Z"),
            "2026-06-01T12:45:00Z"
        );
        assert_eq!(next("0 3 * * *", "2026-06-01T12:00:00Z"), "2026-06-02T03:00:00Z");
        assert_eq!(
            next("30 9-17/4 * * mon-fri", "2026-06-05T14:00:00Z"),
            "2026-06-05T17:30:00Z"
        );
        assert_eq!(
            next("30 9-17/4 * * mon-fri", "2026-06-05T17:30:00Z"),
            "2026-06-08T09:30:00Z"
        );
        assert_eq!(
            next("0 0 1 JAN *", "2026-06-01T00:00:00Z"),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(next("@hourly", "2026-06-01T12:00:00Z"), "2026-06-01T13:00:00Z");
        assert_eq!(next("@weekly", "2026-06-01T12:00:00Z"), "2026-06-07T00:00:00Z");
        assert_eq!(next("@yearly", "2026-06-01T12:00:00Z"), "2027-01-01T00:00:00Z");
        assert_eq!(
            next("@every 90s", "2026-06-01T12:00:00.5Z"),
            "2026-06-01T12:01:30Z"
        );
        assert_eq!(
            next("59 23 31 2 *", "2026-06-01T12:00:00Z"),
            "",
            "February 31st never comes"
        );
    }

    #[test]
    fn day_of_month_or_day_of_week_when_both_are_restricted() {
        // CTL-34: `0 0 13 * 5` is every Friday and every 13th. 2026-06-05 is a Friday.
        assert_eq!(next("0 0 13 * 5", "2026-06-01T00:00:00Z"), "2026-06-05T00:00:00Z");
        assert_eq!(next("0 0 13 * 5", "2026-06-12T00:00:00Z"), "2026-06-13T00:00:00Z");
        // With `*` in one of them the other decides alone.
        assert_eq!(next("0 0 * * 5", "2026-06-05T00:00:00Z"), "2026-06-12T00:00:00Z");
        assert_eq!(next("0 0 13 * *", "2026-06-01T00:00:00Z"), "2026-06-13T00:00:00Z");
        // `*/2` (days 1, 3, 5, ...) is not a star: it ORs with Monday.
        assert_eq!(
            next("0 0 */2 * 1", "2026-06-01T00:00:00Z"),
            "2026-06-03T00:00:00Z"
        );
    }

    #[test]
    fn upstream_error_texts() {
        let err = |s: &str| parse(s).expect_err("invalid").to_string();
        assert_eq!(err("* * * *"), "expected exactly 5 fields, found 4: [* * * *]");
        assert_eq!(err("60 * * * *"), "end of range (60) above maximum (59): 60");
        assert_eq!(err("* * 0 * *"), "beginning of range (0) below minimum (1): 0");
        assert_eq!(err("* * * * 7"), "end of range (7) above maximum (6): 7");
        assert_eq!(
            err("5-1 * * * *"),
            "beginning of range (5) beyond end of range (1): 5-1"
        );
        assert_eq!(
            err("*/0 * * * *"),
            "step of range should be a positive number: */0"
        );
        assert_eq!(
            err("x * * * *"),
            "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax"
        );
        assert_eq!(err("@fortnightly"), "unrecognized descriptor: @fortnightly");
    }

    #[test]
    fn wall_clock_of_the_time_zone() {
        let Ok(moscow) = TimeZone::get("Europe/Moscow") else {
            return; // no zoneinfo on this machine
        };
        // CTL-34's example: 03:00 in Moscow (UTC+3) is midnight UTC.
        let s = parse("0 3 * * *").expect("parses");
        let at = s.next(ts("2026-06-01T12:00:00Z"), &moscow).expect("next");
        assert_eq!(at.to_string(), "2026-06-02T00:00:00Z");
        let Ok(ny) = TimeZone::get("America/New_York") else {
            return;
        };
        // 02:30 does not exist on 2026-03-08 in New York: it runs at 03:30 EDT.
        let at = parse("30 2 * * *")
            .expect("parses")
            .next(ts("2026-03-08T05:00:00Z"), &ny)
            .expect("next");
        assert_eq!(at.to_string(), "2026-03-08T07:30:00Z");
    }
}
