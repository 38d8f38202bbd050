//! Table tests of the CronJob decision (docs/SEEDS-SPEC.md CTL-34..CTL-38).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use jiff::tz::TimeZone;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use serde_json::{Value, json};

use super::reconcile::{Plan, SCHEDULED_TIMESTAMP, plan};
use crate::cron::UnknownTimeZone;
use crate::events::Kind;

fn at(s: &str) -> DateTime<Utc> {
    s.parse().expect("time")
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn cronjob(spec: Value, status: Value) -> CronJob {
    let mut v = json!({
        "metadata": {"name": "report", "namespace": "default", "uid": "cj-uid", "creationTimestamp": "2026-06-01T12:00:30Z"},
        "spec": {"schedule": "* * * * *", "concurrencyPolicy": "Allow", "suspend": false,
                 "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
                 "jobTemplate": {"metadata": {"labels": {"app": "report"}},
                                 "spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "busybox"}]}}}}},
        "status": {},
    });
    merge(&mut v["spec"], spec);
    merge(&mut v["status"], status);
    serde_json::from_value(v).expect("cronjob")
}

/// A Job of the CronJob: `finished` Complete/Failed or running; `started` its start time.
fn job(name: &str, finished: Option<&str>, started: &str) -> Arc<Job> {
    let conds = finished.map(|t| json!([{"type": t, "status": "True", "lastTransitionTime": started}]));
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "report", "uid": "cj-uid", "controller": true}]},
            "spec": {"template": {}},
            "status": {"startTime": started, "completionTime": if finished == Some("Complete") { json!(started) } else { Value::Null },
                       "conditions": conds},
        }))
        .expect("job"),
    )
}

fn active(names: &[&str]) -> Value {
    json!(
        names
            .iter()
            .map(|n| json!({"kind": "Job", "name": n, "namespace": "default", "uid": n}))
            .collect::<Vec<_>>()
    )
}

fn utc() -> Result<TimeZone, UnknownTimeZone> {
    Ok(TimeZone::UTC)
}

fn created(p: &Plan) -> Option<&str> {
    p.create.as_ref().and_then(|j| j.metadata.name.as_deref())
}

fn reasons(p: &Plan) -> Vec<&str> {
    p.events.iter().map(|e| e.reason).collect()
}

fn minutes(t: &str) -> i64 {
    at(t).timestamp() / 60
}

#[test]
fn the_most_recent_slot_names_the_job_in_unix_minutes() {
    let cj = cronjob(json!({}), json!({}));
    // Created 12:00:30, every minute, now 12:05:10: one Job, for 12:05.
    let p = plan(&cj, &[], &[], &utc(), at("2026-06-01T12:05:10Z"));
    assert_eq!(
        created(&p),
        Some(format!("report-{}", minutes("2026-06-01T12:05:00Z")).as_str())
    );
    assert_eq!(p.scheduled, Some(at("2026-06-01T12:05:00Z")));
    assert_eq!(p.requeue, Some(Duration::from_millis(50_100)));
    let job = p.create.as_ref().expect("job");
    assert_eq!(
        job.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SCHEDULED_TIMESTAMP))
            .map(String::as_str),
        Some("2026-06-01T12:05:00Z")
    );
    assert_eq!(
        job.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("report")
    );
    let owner = &job.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!((owner.kind.as_str(), owner.controller), ("CronJob", Some(true)));
    // Before the first slot: nothing, come back at 12:01.
    let p = plan(&cj, &[], &[], &utc(), at("2026-06-01T12:00:40Z"));
    assert!(p.create.is_none());
    assert_eq!(p.requeue, Some(Duration::from_millis(20_100)));
    // The slot already scheduled: nothing more.
    let done = cronjob(json!({}), json!({"lastScheduleTime": "2026-06-01T12:05:00Z"}));
    assert!(
        plan(&done, &[], &[], &utc(), at("2026-06-01T12:05:10Z"))
            .create
            .is_none()
    );
}

#[test]
fn day_of_month_or_day_of_week() {
    // CTL-34: `0 0 13 * 5`, last run Friday 2026-06-05: the next is Saturday the 13th.
    let cj = cronjob(
        json!({"schedule": "0 0 13 * 5"}),
        json!({"lastScheduleTime": "2026-06-05T00:00:00Z"}),
    );
    let p = plan(&cj, &[], &[], &utc(), at("2026-06-13T00:00:30Z"));
    assert_eq!(p.scheduled, Some(at("2026-06-13T00:00:00Z")));
}

#[test]
fn more_than_100_missed_slots_are_reported_and_the_job_still_created() {
    // CTL-37 (1.37's code): 180 missed minutes, one Job for the most recent.
    let cj = cronjob(json!({}), json!({"lastScheduleTime": "2026-06-01T09:00:00Z"}));
    let p = plan(&cj, &[], &[], &utc(), at("2026-06-01T12:00:10Z"));
    assert_eq!(reasons(&p), ["TooManyMissedTimes"]);
    assert_eq!(
        p.events[0].message,
        "too many missed start times: 180. Set or decrease .spec.startingDeadlineSeconds or check clock skew"
    );
    assert_eq!(p.events[0].kind, Kind::Warning);
    assert_eq!(p.scheduled, Some(at("2026-06-01T12:00:00Z")));
    // The docs' example: down 08:29-10:21, startingDeadlineSeconds 200: 3 missed in the window,
    // the Job starts at 10:22 without the warning.
    let windowed = cronjob(
        json!({"startingDeadlineSeconds": 200}),
        json!({"lastScheduleTime": "2026-06-01T08:29:00Z"}),
    );
    let p = plan(&windowed, &[], &[], &utc(), at("2026-06-01T10:22:05Z"));
    assert!(reasons(&p).is_empty(), "{:?}", reasons(&p));
    assert_eq!(p.scheduled, Some(at("2026-06-01T10:22:00Z")));
}

#[test]
fn a_slot_older_than_the_starting_deadline_is_skipped() {
    let cj = cronjob(
        json!({"schedule": "0 * * * *", "startingDeadlineSeconds": 60}),
        json!({"lastScheduleTime": "2026-06-01T10:00:00Z"}),
    );
    // 11:00 was missed by 5 minutes: no Job now, the next try is 12:00.
    let p = plan(&cj, &[], &[], &utc(), at("2026-06-01T11:05:00Z"));
    assert!(p.create.is_none());
    assert_eq!(p.requeue, Some(Duration::from_millis(55 * 60 * 1000 + 100)));
    // Within the deadline it runs.
    let p = plan(&cj, &[], &[], &utc(), at("2026-06-01T11:00:30Z"));
    assert_eq!(p.scheduled, Some(at("2026-06-01T11:00:00Z")));
}

#[test]
fn forbid_skips_and_replace_deletes_the_running_job() {
    let running = job("report-1", None, "2026-06-01T12:04:00Z");
    let status = json!({"lastScheduleTime": "2026-06-01T12:04:00Z", "active": active(&["report-1"])});
    let forbid = cronjob(json!({"concurrencyPolicy": "Forbid"}), status.clone());
    let p = plan(
        &forbid,
        std::slice::from_ref(&running),
        &[],
        &utc(),
        at("2026-06-01T12:05:01Z"),
    );
    assert!(p.create.is_none());
    assert_eq!(reasons(&p), ["JobAlreadyActive"]);
    assert_eq!(
        p.events[0].message,
        "Not starting job because prior execution is running and concurrency policy is Forbid"
    );
    let replace = cronjob(json!({"concurrencyPolicy": "Replace"}), status.clone());
    let p = plan(
        &replace,
        std::slice::from_ref(&running),
        &[],
        &utc(),
        at("2026-06-01T12:05:01Z"),
    );
    assert_eq!(p.delete.len(), 1);
    assert!(p.status.active.is_none());
    assert!(p.create.is_some());
    let allow = cronjob(json!({}), status);
    let p = plan(&allow, &[running], &[], &utc(), at("2026-06-01T12:05:01Z"));
    assert!(p.delete.is_empty() && p.create.is_some());
}

#[test]
fn finished_jobs_leave_the_active_list_and_history_is_limited() {
    let status = json!({"active": active(&["j5"]), "lastScheduleTime": "2026-06-01T12:05:00Z"});
    let cj = cronjob(json!({}), status);
    let jobs = vec![
        job("j1", Some("Complete"), "2026-06-01T12:01:00Z"),
        job("j2", Some("Complete"), "2026-06-01T12:02:00Z"),
        job("j3", Some("Failed"), "2026-06-01T12:03:00Z"),
        job("j4", Some("Complete"), "2026-06-01T12:04:00Z"),
        job("j5", Some("Complete"), "2026-06-01T12:05:00Z"),
        job("j0", Some("Failed"), "2026-06-01T12:00:00Z"),
    ];
    let p = plan(&cj, &jobs, &[], &utc(), at("2026-06-01T12:05:30Z"));
    let deleted: Vec<&str> = p
        .delete
        .iter()
        .filter_map(|j| j.metadata.name.as_deref())
        .collect();
    assert_eq!(
        deleted,
        ["j1", "j0"],
        "4 complete over 3, 2 failed over 1, oldest first"
    );
    assert!(p.status.active.is_none());
    assert!(
        p.events
            .iter()
            .any(|e| e.reason == "SawCompletedJob" && e.message == "Saw completed job: j5, status: Complete")
    );
    // The next sync records the last success.
    let cj = cronjob(json!({}), json!({"lastScheduleTime": "2026-06-01T12:05:00Z"}));
    let p = plan(&cj, &jobs[3..5], &[], &utc(), at("2026-06-01T12:05:30Z"));
    assert_eq!(
        p.status.last_successful_time.map(|t| t.0),
        Some(at("2026-06-01T12:05:00Z"))
    );
}

#[test]
fn unexpected_and_missing_jobs() {
    let cj = cronjob(
        json!({}),
        json!({"active": active(&["gone"]), "lastScheduleTime": "2026-06-01T12:05:00Z"}),
    );
    let stray = job("stray", None, "2026-06-01T12:04:00Z");
    let gone = cj.status.as_ref().and_then(|s| s.active.clone()).expect("active");
    let p = plan(&cj, &[stray], &gone, &utc(), at("2026-06-01T12:05:30Z"));
    assert_eq!(reasons(&p), ["UnexpectedJob", "MissingJob"]);
    assert_eq!(
        p.events[0].message,
        "Saw a job that the controller did not create or forgot: stray"
    );
    assert_eq!(p.events[1].message, "Active job went missing: gone");
}

#[test]
fn suspended_invalid_zone_or_schedule_create_nothing() {
    let now = at("2026-06-01T12:05:10Z");
    let suspended = cronjob(json!({"suspend": true}), json!({}));
    let p = plan(&suspended, &[], &[], &utc(), now);
    assert!(p.create.is_none() && p.requeue.is_none() && p.events.is_empty());
    let zoned = cronjob(json!({"timeZone": "Mars/Olympus"}), json!({}));
    let p = plan(
        &zoned,
        &[],
        &[],
        &Err(UnknownTimeZone("no such zone".into())),
        now,
    );
    assert_eq!(reasons(&p), ["UnknownTimeZone"]);
    assert_eq!(
        p.events[0].message,
        "invalid timeZone: \"Mars/Olympus\": no such zone"
    );
    assert!(
        p.create.is_none() && p.requeue.is_none(),
        "no crash loop: wait for a change"
    );
    let bad = cronjob(json!({"schedule": "* * * * 7"}), json!({}));
    let p = plan(&bad, &[], &[], &utc(), now);
    assert_eq!(reasons(&p), ["UnparseableSchedule"]);
    assert_eq!(
        p.events[0].message,
        "unparseable schedule: \"* * * * 7\" : end of range (7) above maximum (6): 7"
    );
    let never = cronjob(json!({"schedule": "59 23 31 2 *"}), json!({}));
    let p = plan(&never, &[], &[], &utc(), now);
    assert_eq!(reasons(&p), ["InvalidSchedule"]);
    assert_eq!(
        p.events[0].message,
        "invalid schedule: 59 23 31 2 * : time difference between two schedules is less than 1 second"
    );
}

#[test]
fn the_scheduled_timestamp_is_written_in_the_time_zone() {
    let Ok(moscow) = TimeZone::get("Europe/Moscow") else {
        return; // no zoneinfo on this machine
    };
    let cj = cronjob(
        json!({"schedule": "0 3 * * *", "timeZone": "Europe/Moscow"}),
        json!({}),
    );
    let p = plan(&cj, &[], &[], &Ok(moscow), at("2026-06-02T00:00:20Z"));
    assert_eq!(p.scheduled, Some(at("2026-06-02T00:00:00Z")));
    let job = p.create.expect("job");
    assert_eq!(
        job.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SCHEDULED_TIMESTAMP))
            .map(String::as_str),
        Some("2026-06-02T03:00:00+03:00")
    );
}
