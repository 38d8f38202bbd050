//! The CronJob decision (docs/SEEDS-SPEC.md CTL-34..CTL-38, upstream's `syncCronJob` and
//! `cleanupFinishedJobs`), a pure function of the CronJob, its Jobs and the time: history
//! limits, the active list, the most recent missed slot (at most one Job however many were
//! missed; more than 100 missed is reported with `TooManyMissedTimes` and the Job is still
//! created, CTL-37), `startingDeadlineSeconds`, Allow/Forbid/Replace, and when to look again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::controllers::job::reconcile::finished_type;
use crate::controllers::podutil::controller_owner;
use crate::cron::{self as schedule, Schedule, UnknownTimeZone};
use crate::events::Kind;

/// The annotation with a Job's scheduled time (RFC 3339, in the CronJob's time zone).
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// More missed slots than this are reported.
pub const MAX_MISSED: i64 = 100;
/// Margin added to the next slot when requeueing (upstream's `nextScheduleDelta`).
const NEXT_DELTA: Duration = Duration::from_millis(100);

/// An event to record about the CronJob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub reason: &'static str,
    pub message: String,
}

fn event(kind: Kind, reason: &'static str, message: String) -> Event {
    Event {
        kind,
        reason,
        message,
    }
}

/// What one sync does.
#[derive(Debug, Default)]
pub struct Plan {
    /// The status to write when `status_changed`.
    pub status: CronJobStatus,
    pub status_changed: bool,
    pub events: Vec<Event>,
    /// Jobs to delete (history limits, `Replace`), oldest first.
    pub delete: Vec<Arc<Job>>,
    /// The Job of this slot, and the slot.
    pub create: Option<Job>,
    pub scheduled: Option<DateTime<Utc>>,
    /// Sync again after this (the next slot); None waits for a change.
    pub requeue: Option<Duration>,
}

pub fn to_timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp::new(t.timestamp(), t.timestamp_subsec_nanos() as i32).unwrap_or(Timestamp::UNIX_EPOCH)
}

pub fn to_chrono(t: Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32).unwrap_or_default()
}

fn in_active(st: &CronJobStatus, uid: &str) -> bool {
    st.active.iter().flatten().any(|r| r.uid.as_deref() == Some(uid))
}

fn remove_active(st: &mut CronJobStatus, uid: &str) {
    if let Some(a) = st.active.as_mut() {
        a.retain(|r| r.uid.as_deref() != Some(uid));
    }
}

fn job_uid(j: &Job) -> &str {
    j.metadata.uid.as_deref().unwrap_or_default()
}

fn job_name(j: &Job) -> &str {
    j.metadata.name.as_deref().unwrap_or_default()
}

/// Active references whose Job is not in the cache: the caller asks the API before dropping
/// them (`MissingJob`).
pub fn unseen_active(cj: &CronJob, jobs: &[Arc<Job>]) -> Vec<ObjectReference> {
    let uids: HashSet<&str> = jobs.iter().map(|j| job_uid(j)).collect();
    cj.status
        .iter()
        .flat_map(|s| s.active.iter().flatten())
        .filter(|r| !uids.contains(r.uid.as_deref().unwrap_or_default()))
        .cloned()
        .collect()
}

/// Whether a running Job of `jobs` is missing from the cached active list (the cache of the
/// CronJob may be older than the Job's: read it again before calling it unexpected).
pub fn has_unlisted_running(cj: &CronJob, jobs: &[Arc<Job>]) -> bool {
    let st = cj.status.clone().unwrap_or_default();
    jobs.iter()
        .any(|j| finished_type(j).is_none() && !in_active(&st, job_uid(j)))
}

/// `<cronjob>-<scheduled time in Unix minutes>`.
pub fn job_name_for(cj: &CronJob, scheduled: DateTime<Utc>) -> String {
    format!(
        "{}-{}",
        cj.metadata.name.as_deref().unwrap_or_default(),
        scheduled.timestamp().div_euclid(60)
    )
}

/// The most recent slot in (earliest, now] (upstream's `mostRecentScheduleTime`): the earliest
/// is the last scheduled time, else the creation, moved up to `now − startingDeadlineSeconds`
/// when `with_deadline`. Returns (earliest, most recent slot, missed slots as upstream counts
/// them).
pub fn most_recent(
    cj: &CronJob,
    now: Timestamp,
    sched: &Schedule,
    tz: &TimeZone,
    with_deadline: bool,
) -> Result<(Timestamp, Option<Timestamp>, i64), String> {
    let st = cj.status.clone().unwrap_or_default();
    let created = cj
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| to_timestamp(t.0))
        .unwrap_or(now);
    let mut earliest = st
        .last_schedule_time
        .as_ref()
        .map_or(created, |t| to_timestamp(t.0));
    if with_deadline
        && let Some(secs) = cj.spec.as_ref().and_then(|s| s.starting_deadline_seconds)
        && let Ok(deadline) = now.checked_sub(jiff::SignedDuration::from_secs(secs))
        && deadline > earliest
    {
        earliest = deadline;
    }
    let too_close = || "time difference between two schedules is less than 1 second".to_string();
    let Some(t1) = sched.next(earliest, tz) else {
        return Err(too_close());
    };
    let Some(t2) = sched.next(t1, tz) else {
        return Err(too_close());
    };
    if now < t1 {
        return Ok((earliest, None, 0));
    }
    if now < t2 {
        return Ok((earliest, Some(t1), 1));
    }
    let interval = (t2 - t1).as_secs_f64().round() as i64;
    if interval < 1 {
        return Err(too_close());
    }
    let elapsed = (now - t1).as_secs();
    let missed = elapsed / interval + 1;
    // Walk the schedule over the last interval or so; for irregular schedules that may find
    // nothing, and then the walk starts from the earliest time (bounded).
    let from = t1
        .checked_add(jiff::SignedDuration::from_secs((missed - 2).max(0) * interval))
        .unwrap_or(t1);
    let walk = |from: Timestamp, limit: usize| {
        let mut last = None;
        let mut t = sched.next(from, tz);
        let mut n = 0;
        while let Some(x) = t {
            if x > now || n >= limit {
                break;
            }
            last = Some(x);
            t = sched.next(x, tz);
            n += 1;
        }
        last
    };
    let recent = walk(from, usize::MAX).or_else(|| walk(earliest, 1_000_000));
    Ok((earliest, recent.or(Some(now)), missed))
}

/// Time until the next slot after the most recent one (plus upstream's 100 ms margin).
pub fn until_next(cj: &CronJob, now: Timestamp, sched: &Schedule, tz: &TimeZone) -> Duration {
    let base = match most_recent(cj, now, sched, tz, false) {
        Ok((earliest, recent, _)) => recent.unwrap_or(earliest),
        Err(_) => now,
    };
    match sched.next(base, tz) {
        Some(next) => {
            let d = (next - now).as_secs_f64().max(0.0);
            Duration::from_secs_f64(d) + NEXT_DELTA
        }
        None => Duration::from_secs(3600),
    }
}

/// The Job a CronJob starts for `scheduled` (upstream's `getJobFromTemplate2`).
pub fn job_for(cj: &CronJob, scheduled: DateTime<Utc>, tz: &TimeZone) -> Job {
    let template = cj
        .spec
        .as_ref()
        .map(|s| s.job_template.clone())
        .unwrap_or_default();
    let tm = template.metadata.unwrap_or_default();
    let mut annotations = tm.annotations.unwrap_or_default();
    let local = to_timestamp(scheduled).to_zoned_datetime(tz.clone());
    annotations.insert(
        SCHEDULED_TIMESTAMP.into(),
        local
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z"),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(job_name_for(cj, scheduled)),
            namespace: cj.metadata.namespace.clone(),
            labels: tm.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_owner("batch/v1", "CronJob", &cj.metadata)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// History limits: the oldest finished Jobs beyond them (successful 3, failed 1 by default,
/// applied by the API), oldest start first.
fn over_history(cj: &CronJob, jobs: &[Arc<Job>]) -> Vec<Arc<Job>> {
    let spec = cj.spec.clone().unwrap_or_default();
    let mut out = Vec::new();
    for (kind, limit) in [
        ("Complete", spec.successful_jobs_history_limit),
        ("Failed", spec.failed_jobs_history_limit),
    ] {
        let Some(limit) = limit else { continue };
        let mut done: Vec<Arc<Job>> = jobs
            .iter()
            .filter(|j| finished_type(j) == Some(kind))
            .cloned()
            .collect();
        let n = done.len().saturating_sub(usize::try_from(limit).unwrap_or(0));
        if n == 0 {
            continue;
        }
        let start = |j: &Job| j.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
        done.sort_by(|a, b| match (start(a), start(b)) {
            (Some(x), Some(y)) if x != y => x.cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            _ => job_name(a).cmp(job_name(b)),
        });
        out.extend(done.into_iter().take(n));
    }
    out
}

/// One sync of `cj` with its Jobs. `gone` are active references the API confirmed deleted;
/// `tz` the resolved `spec.timeZone` (or the error loading it).
pub fn plan(
    cj: &CronJob,
    jobs: &[Arc<Job>],
    gone: &[ObjectReference],
    tz: &Result<TimeZone, UnknownTimeZone>,
    now: DateTime<Utc>,
) -> Plan {
    let mut p = Plan {
        status: cj.status.clone().unwrap_or_default(),
        ..Plan::default()
    };
    let spec = cj.spec.clone().unwrap_or_default();
    // History limits first.
    for j in over_history(cj, jobs) {
        remove_active(&mut p.status, job_uid(&j));
        p.status_changed = true;
        p.delete.push(j);
    }
    for j in jobs {
        let uid = job_uid(j);
        let listed = in_active(&p.status, uid);
        let finished = finished_type(j);
        match finished {
            None if !listed => p.events.push(event(
                Kind::Warning,
                "UnexpectedJob",
                format!(
                    "Saw a job that the controller did not create or forgot: {}",
                    job_name(j)
                ),
            )),
            Some(how) if listed => {
                remove_active(&mut p.status, uid);
                p.events.push(event(
                    Kind::Normal,
                    "SawCompletedJob",
                    format!("Saw completed job: {}, status: {how}", job_name(j)),
                ));
                p.status_changed = true;
            }
            Some("Complete") => {
                let done = j.status.as_ref().and_then(|s| s.completion_time.clone());
                if let Some(t) = done
                    && p.status.last_successful_time.as_ref().is_none_or(|l| t.0 > l.0)
                {
                    p.status.last_successful_time = Some(t);
                    p.status_changed = true;
                }
            }
            _ => {}
        }
    }
    for r in gone {
        p.events.push(event(
            Kind::Normal,
            "MissingJob",
            format!(
                "Active job went missing: {}",
                r.name.as_deref().unwrap_or_default()
            ),
        ));
        remove_active(&mut p.status, r.uid.as_deref().unwrap_or_default());
        p.status_changed = true;
    }
    if p.status.active.as_ref().is_some_and(Vec::is_empty) {
        p.status.active = None;
    }
    if cj.metadata.deletion_timestamp.is_some() {
        return p;
    }
    let tz = match tz {
        Ok(tz) => tz.clone(),
        Err(e) => {
            let name = spec.time_zone.clone().unwrap_or_default();
            p.events.push(event(
                Kind::Warning,
                "UnknownTimeZone",
                format!("invalid timeZone: {name:?}: {e}"),
            ));
            return p;
        }
    };
    if spec.suspend == Some(true) {
        return p;
    }
    if spec.schedule.contains("TZ") {
        p.events.push(event(
            Kind::Warning,
            "UnsupportedSchedule",
            format!(
                "CRON_TZ or TZ used in schedule {:?} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details",
                spec.schedule
            ),
        ));
    }
    let sched = match schedule::parse(&spec.schedule) {
        Ok(s) => s,
        Err(e) => {
            p.events.push(event(
                Kind::Warning,
                "UnparseableSchedule",
                format!("unparseable schedule: {:?} : {e}", spec.schedule),
            ));
            return p;
        }
    };
    let tz = match sched.zone().map(|z| schedule::time_zone(Some(z))) {
        Some(Ok(z)) => z,
        _ => tz,
    };
    let now_ts = to_timestamp(now);
    let next = until_next(cj, now_ts, &sched, &tz);
    let scheduled = match most_recent(cj, now_ts, &sched, &tz, true) {
        Err(e) => {
            p.events.push(event(
                Kind::Warning,
                "InvalidSchedule",
                format!("invalid schedule: {} : {e}", spec.schedule),
            ));
            return p;
        }
        Ok((_, None, _)) => {
            p.requeue = Some(next);
            return p;
        }
        Ok((_, Some(t), missed)) => {
            if missed > MAX_MISSED {
                p.events.push(event(
                    Kind::Warning,
                    "TooManyMissedTimes",
                    format!(
                        "too many missed start times: {missed}. Set or decrease .spec.startingDeadlineSeconds or check clock skew"
                    ),
                ));
            }
            to_chrono(t)
        }
    };
    p.requeue = Some(next);
    if let Some(secs) = spec.starting_deadline_seconds
        && scheduled + chrono::Duration::seconds(secs) < now
    {
        p.events.push(event(
            Kind::Warning,
            "MissSchedule",
            format!(
                "Missed scheduled time to start a job: {}",
                scheduled.format("%a, %d %b %Y %H:%M:%S %z")
            ),
        ));
        return p;
    }
    let name = job_name_for(cj, scheduled);
    let processed = p
        .status
        .active
        .iter()
        .flatten()
        .any(|r| r.name.as_deref() == Some(name.as_str()))
        || p.status
            .last_schedule_time
            .as_ref()
            .is_some_and(|t| t.0 == scheduled);
    if processed {
        return p;
    }
    let active = p.status.active.clone().unwrap_or_default();
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !active.is_empty() => {
            p.events.push(event(
                Kind::Normal,
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            ));
            return p;
        }
        Some("Replace") => {
            for r in &active {
                let uid = r.uid.as_deref().unwrap_or_default();
                if let Some(j) = jobs.iter().find(|j| job_uid(j) == uid)
                    && !p.delete.iter().any(|d| job_uid(d) == uid)
                {
                    p.delete.push(j.clone());
                }
                remove_active(&mut p.status, uid);
                p.status_changed = true;
            }
            if p.status.active.as_ref().is_some_and(Vec::is_empty) {
                p.status.active = None;
            }
        }
        _ => {}
    }
    p.create = Some(job_for(cj, scheduled, &tz));
    p.scheduled = Some(scheduled);
    p
}

/// The active-list entry of a created Job.
pub fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        resource_version: job.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// The status after the Job of `scheduled` was created (or found already created by us).
pub fn with_created(mut status: CronJobStatus, job: &Job, scheduled: DateTime<Utc>) -> CronJobStatus {
    let uid = job_uid(job).to_string();
    let active = status.active.get_or_insert_with(Vec::new);
    if !active.iter().any(|r| r.uid.as_deref() == Some(uid.as_str())) {
        active.push(reference(job));
    }
    status.last_schedule_time = Some(Time(scheduled));
    status
}
