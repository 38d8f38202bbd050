//! Table tests of the Job decision (docs/SEEDS-SPEC.md CTL-29..CTL-33), each driving one sync
//! through its four steps as if every API write succeeded.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::policy::{BackoffRecord, backoff_delay, has_finalizer, match_failure_policy};
use super::reconcile::{Actions, Event, Settled, Skip, Sync, generate_name, pod_for};
use crate::events::Kind;

fn now() -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse().expect("time")
}

fn ago(secs: i64) -> String {
    (now() - chrono::Duration::seconds(secs)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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

fn job(spec: Value, status: Value) -> Job {
    let mut v = json!({
        "metadata": {"name": "pi", "namespace": "default", "uid": "job-uid", "generation": 1,
                     "creationTimestamp": ago(600)},
        "spec": {"completions": 1, "parallelism": 1, "backoffLimit": 6, "completionMode": "NonIndexed",
                 "podReplacementPolicy": "TerminatingOrFailed", "suspend": false,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}},
        "status": {"startTime": ago(300)},
    });
    merge(&mut v["spec"], spec);
    merge(&mut v["status"], status);
    serde_json::from_value(v).expect("job")
}

/// A pod of the Job: `phase` Running (ready), Succeeded or Failed (with `exit` in container
/// `main`), holding the tracking finalizer.
fn pod(name: &str, phase: &str, extra: Value) -> Arc<Pod> {
    let state = match phase {
        "Running" => json!({"running": {"startedAt": ago(60)}}),
        "Succeeded" => json!({"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": ago(5)}}),
        _ => json!({"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(5)}}),
    };
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default", "uid": name, "creationTimestamp": ago(120),
                     "finalizers": ["batch.kubernetes.io/job-tracking"],
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "pi", "uid": "job-uid", "controller": true}]},
        "spec": {"nodeName": "n1", "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": if phase == "Running" { "True" } else { "False" }, "lastTransitionTime": ago(5)}],
                   "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": phase == "Running",
                                          "restartCount": 0, "state": state}]},
    });
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).expect("pod"))
}

fn indexed(name: &str, phase: &str, ix: i32, extra: Value) -> Arc<Pod> {
    let mut e =
        json!({"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": ix.to_string()}}});
    merge(&mut e, extra);
    pod(name, phase, e)
}

/// One sync with every write succeeding.
struct Run {
    sync: Sync,
    actions: Actions,
    removed: Vec<String>,
    settled: Settled,
}

fn run_with(job: &Job, pods: Vec<Arc<Pod>>, backoff: &BackoffRecord) -> Run {
    let mut sync = Sync::new(job, pods.clone(), HashSet::new(), backoff, now()).expect("synced");
    let actions = sync.decide(true);
    sync.outcome(0, true);
    let flush = sync.track();
    let removed: Vec<String> = flush
        .remove_finalizers
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let still: HashSet<String> = pods
        .iter()
        .filter(|p| has_finalizer(p))
        .filter_map(|p| p.metadata.uid.clone())
        .filter(|u| !removed.contains(u))
        .collect();
    let settled = sync.settle(&still);
    Run {
        sync,
        actions,
        removed,
        settled,
    }
}

fn run(job: &Job, pods: Vec<Arc<Pod>>) -> Run {
    run_with(job, pods, &BackoffRecord::default())
}

fn cond<'a>(r: &'a Run, type_: &str) -> Option<&'a JobCondition> {
    r.sync
        .job
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn reason<'a>(r: &'a Run, type_: &str) -> Option<(&'a str, &'a str)> {
    cond(r, type_).map(|c| {
        (
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default(),
        )
    })
}

fn events(e: &[Event]) -> Vec<(Kind, &str, &str)> {
    e.iter()
        .map(|e| (e.kind, e.reason.as_str(), e.message.as_str()))
        .collect()
}

fn names(p: &[Arc<Pod>]) -> Vec<&str> {
    p.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
}

#[test]
fn back_off_doubles_from_10s_to_the_10_minute_cap() {
    let secs: Vec<u64> = (1..=9).map(|n| backoff_delay(n).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 80, 160, 320, 600, 600, 600]);
    assert_eq!(backoff_delay(0), Duration::ZERO);
}

#[test]
fn three_completions_two_at_a_time() {
    let j = job(
        json!({"completions": 3, "parallelism": 2}),
        json!({"startTime": null}),
    );
    let r = run(&j, vec![]);
    assert_eq!(r.actions.create.len(), 2);
    let st = r.sync.job.status.clone().expect("status");
    assert_eq!(st.active, Some(2));
    assert!(st.start_time.is_some());
    // One succeeded, one running: it is counted through uncountedTerminatedPods and one more
    // pod starts (2 left, parallelism 2).
    let r = run(
        &j,
        vec![
            pod("pi-a", "Succeeded", json!({})),
            pod("pi-b", "Running", json!({})),
        ],
    );
    assert_eq!(r.removed, ["pi-a"]);
    assert_eq!(r.actions.create.len(), 1);
    let st = r.sync.job.status.clone().expect("status");
    assert_eq!(st.succeeded, Some(1));
    assert_eq!(st.ready, Some(1));
    let u = st.uncounted_terminated_pods.expect("uncounted");
    assert!(u.succeeded.is_none() && u.failed.is_none());
}

#[test]
fn completion_sets_success_criteria_met_then_complete() {
    let j = job(
        json!({"completions": 3, "parallelism": 2}),
        json!({"succeeded": 2}),
    );
    let r = run(&j, vec![pod("pi-c", "Succeeded", json!({}))]);
    assert_eq!(
        reason(&r, "SuccessCriteriaMet"),
        Some(("CompletionsReached", "Reached expected number of succeeded pods"))
    );
    assert_eq!(
        reason(&r, "Complete"),
        Some(("CompletionsReached", "Reached expected number of succeeded pods"))
    );
    let st = r.sync.job.status.clone().expect("status");
    assert_eq!(st.succeeded, Some(3));
    assert!(st.completion_time.is_some());
    assert_eq!(
        events(&r.settled.events),
        [(Kind::Normal, "Completed", "Job completed")]
    );
    assert_eq!(
        Sync::new(
            &r.sync.job,
            vec![],
            HashSet::new(),
            &BackoffRecord::default(),
            now()
        )
        .err(),
        Some(Skip::Finished)
    );
}

#[test]
fn a_failed_pod_is_replaced_after_the_back_off() {
    let j = job(json!({}), json!({}));
    let failed = pod("pi-a", "Failed", json!({}));
    // The failure 5 s ago: the replacement waits 5 s more.
    let r = run(&j, vec![failed.clone()]);
    assert!(r.actions.create.is_empty());
    assert_eq!(r.actions.requeue, Some(Duration::from_secs(5)));
    assert_eq!(r.sync.job.status.as_ref().and_then(|s| s.failed), Some(1));
    assert_eq!(r.sync.new_backoff.failures_after_last_success, 1);
    // Third consecutive failure 30 s ago: 40 s back-off, 10 s left.
    let record = BackoffRecord {
        failures_after_last_success: 3,
        last_failure: Some(now() - chrono::Duration::seconds(30)),
    };
    let counted = job(json!({}), json!({"failed": 3}));
    let r = run_with(&counted, vec![], &record);
    assert_eq!(r.actions.requeue, Some(Duration::from_secs(10)));
    // Back-off over: replaced.
    let old = BackoffRecord {
        failures_after_last_success: 1,
        last_failure: Some(now() - chrono::Duration::seconds(11)),
    };
    assert_eq!(run_with(&counted, vec![], &old).actions.create.len(), 1);
}

#[test]
fn backoff_limit_fails_the_job() {
    let j = job(json!({"backoffLimit": 1}), json!({"failed": 1}));
    let r = run(
        &j,
        vec![
            pod("pi-b", "Failed", json!({})),
            pod("pi-c", "Running", json!({})),
        ],
    );
    assert_eq!(names(&r.actions.delete_keeping_finalizer), ["pi-c"]);
    assert_eq!(
        reason(&r, "FailureTarget"),
        Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit"
        ))
    );
    // The deleted pod is still terminating: Failed comes with the next sync.
    assert!(cond(&r, "Failed").is_none());
    assert_eq!(r.sync.job.status.as_ref().and_then(|s| s.failed), Some(3));
    let next = run(&r.sync.job, vec![]);
    assert_eq!(
        reason(&next, "Failed"),
        Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit"
        ))
    );
    assert_eq!(
        events(&next.settled.events),
        [(
            Kind::Warning,
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit"
        )]
    );
    assert!(
        next.sync
            .job
            .status
            .as_ref()
            .and_then(|s| s.completion_time.clone())
            .is_none()
    );
}

#[test]
fn container_restarts_count_with_restart_policy_on_failure() {
    let j = job(
        json!({"backoffLimit": 2, "template": {"spec": {"restartPolicy": "OnFailure"}}}),
        json!({}),
    );
    let restarting = pod(
        "pi-a",
        "Running",
        json!({"status": {"containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": true,
            "restartCount": 2, "state": {"running": {}}}]}}),
    );
    let r = run(&j, vec![restarting]);
    assert_eq!(
        reason(&r, "FailureTarget").map(|r| r.0),
        Some("BackoffLimitExceeded")
    );
}

#[test]
fn active_deadline_fails_a_job_under_its_backoff_limit() {
    let j = job(
        json!({"activeDeadlineSeconds": 300}),
        json!({"startTime": ago(301)}),
    );
    let r = run(&j, vec![pod("pi-a", "Running", json!({}))]);
    assert_eq!(
        reason(&r, "FailureTarget"),
        Some((
            "DeadlineExceeded",
            "Job was active longer than specified deadline"
        ))
    );
    assert_eq!(names(&r.actions.delete_keeping_finalizer), ["pi-a"]);
    // Before the deadline: a sync is due when it passes.
    let early = job(
        json!({"activeDeadlineSeconds": 300}),
        json!({"startTime": ago(100)}),
    );
    let r = run(&early, vec![pod("pi-a", "Running", json!({}))]);
    assert_eq!(r.actions.requeue, Some(Duration::from_secs(200)));
}

#[test]
fn indexed_pods_carry_their_index() {
    let j = job(
        json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"}),
        json!({"completedIndexes": "1"}),
    );
    let r = run(&j, vec![indexed("pi-0-x", "Running", 0, json!({}))]);
    let ixs: Vec<Option<i32>> = r.actions.create.iter().map(|n| n.index).collect();
    assert_eq!(ixs, [Some(2)]);
    let p = pod_for(&j, &r.actions.create[0]);
    assert_eq!(p.metadata.generate_name.as_deref(), Some("pi-2-"));
    let ann = p.metadata.annotations.clone().expect("annotations");
    assert_eq!(ann["batch.kubernetes.io/job-completion-index"], "2");
    let labels = p.metadata.labels.clone().expect("labels");
    assert_eq!(labels["batch.kubernetes.io/job-completion-index"], "2");
    assert_eq!(labels["batch.kubernetes.io/job-name"], "pi");
    assert_eq!(labels["batch.kubernetes.io/controller-uid"], "job-uid");
    let spec = p.spec.expect("spec");
    assert_eq!(spec.hostname.as_deref(), Some("pi-2"));
    let env = spec.containers[0].env.clone().expect("env");
    assert_eq!(env[0].name, "JOB_COMPLETION_INDEX");
    assert_eq!(
        env[0]
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("metadata.labels['batch.kubernetes.io/job-completion-index']")
    );
    assert_eq!(
        p.metadata.finalizers.as_deref(),
        Some(&["batch.kubernetes.io/job-tracking".to_string()][..])
    );
    // Index 0 succeeds: completedIndexes 0,1.
    let r = run(&j, vec![indexed("pi-0-x", "Succeeded", 0, json!({}))]);
    let st = r.sync.job.status.clone().expect("status");
    assert_eq!(st.completed_indexes.as_deref(), Some("0,1"));
    assert_eq!(st.succeeded, Some(2));
    assert_eq!(generate_name(&"a".repeat(70), Some(12)).len(), 58);
}

/// CTL-31's example: 8 completions, 4 at a time, backoffLimitPerIndex 2, maxFailedIndexes 3,
/// a FailIndex rule on exit code 42 of container `reindex` and an Ignore rule on
/// DisruptionTarget.
fn ctl31(status: Value) -> Job {
    job(
        json!({"completions": 8, "parallelism": 4, "completionMode": "Indexed", "backoffLimitPerIndex": 2,
               "maxFailedIndexes": 3, "backoffLimit": 2_147_483_647, "podReplacementPolicy": "Failed",
               "podFailurePolicy": {"rules": [
                   {"action": "FailIndex", "onExitCodes": {"containerName": "reindex", "operator": "In", "values": [42]}},
                   {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
               "template": {"spec": {"containers": [{"name": "reindex", "image": "busybox"}]}}}),
        status,
    )
}

fn failed_ix(name: &str, ix: i32, exit: i32, count: i32) -> Arc<Pod> {
    indexed(
        name,
        "Failed",
        ix,
        json!({"metadata": {"annotations": {"batch.kubernetes.io/job-index-failure-count": count.to_string()}},
               "status": {"containerStatuses": [{"name": "reindex", "image": "busybox", "imageID": "", "ready": false,
                   "restartCount": 0, "state": {"terminated": {"exitCode": exit, "finishedAt": ago(30)}}}]}}),
    )
}

#[test]
fn backoff_limit_per_index_retries_an_index_twice() {
    let j = ctl31(json!({}));
    // Index 0 failed once (count 0): the replacement inherits count 1 after the 10 s back-off
    // (the failure was 30 s ago), and the failed pod keeps its finalizer until then.
    let r = run(&j, vec![failed_ix("pi-0-a", 0, 1, 0)]);
    let zero = r
        .actions
        .create
        .iter()
        .find(|n| n.index == Some(0))
        .expect("index 0 replaced");
    assert_eq!(zero.failure_counts, Some((1, 0)));
    assert_eq!(r.actions.create.len(), 4);
    // Third failure (count 2 = backoffLimitPerIndex): index 0 fails, the Job goes on.
    let r = run(&j, vec![failed_ix("pi-0-c", 0, 1, 2)]);
    assert_eq!(
        r.sync
            .job
            .status
            .as_ref()
            .and_then(|s| s.failed_indexes.clone())
            .as_deref(),
        Some("0")
    );
    assert!(cond(&r, "FailureTarget").is_none());
    assert!(r.actions.create.iter().all(|n| n.index != Some(0)));
    // Exit code 42 in `reindex`: FailIndex at once.
    let r = run(&j, vec![failed_ix("pi-3-a", 3, 42, 0)]);
    assert_eq!(
        r.sync
            .job
            .status
            .as_ref()
            .and_then(|s| s.failed_indexes.clone())
            .as_deref(),
        Some("3")
    );
}

#[test]
fn more_failed_indexes_than_max_fail_the_job() {
    let j = ctl31(json!({"failedIndexes": "0,2,4"}));
    let r = run(&j, vec![failed_ix("pi-6-a", 6, 42, 0)]);
    assert_eq!(
        reason(&r, "FailureTarget"),
        Some((
            "MaxFailedIndexesExceeded",
            "Job has exceeded the specified maximal number of failed indexes"
        ))
    );
    // Every index done, some failed: FailedIndexes.
    let j = ctl31(json!({"failedIndexes": "0", "completedIndexes": "1-6", "succeeded": 6}));
    let r = run(&j, vec![failed_ix("pi-7-a", 7, 42, 0)]);
    assert_eq!(
        reason(&r, "FailureTarget"),
        Some(("FailedIndexes", "Job has failed indexes"))
    );
}

#[test]
fn pod_failure_policy_rules() {
    let j = job(
        json!({"podReplacementPolicy": "Failed", "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0, 42]}}]}}),
        json!({}),
    );
    let exit = |code: i32| {
        pod(
            "pi-a",
            "Failed",
            json!({"status": {"containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": ago(5)}}}]}}),
        )
    };
    let policy = j.spec.as_ref().and_then(|s| s.pod_failure_policy.as_ref());
    let v = match_failure_policy(policy, &exit(42));
    assert_eq!(
        v.fail_job.as_deref(),
        Some("Container main for pod default/pi-a failed with exit code 42 matching FailJob rule at index 0")
    );
    assert!(match_failure_policy(policy, &exit(3)).counts);
    let disrupted = pod(
        "pi-b",
        "Failed",
        json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}]}}),
    );
    assert!(!match_failure_policy(policy, &disrupted).counts);
    // FailJob: the Job fails with reason PodFailurePolicy.
    let r = run(&j, vec![exit(42)]);
    assert_eq!(
        reason(&r, "Failed"),
        Some((
            "PodFailurePolicy",
            "Container main for pod default/pi-a failed with exit code 42 matching FailJob rule at index 0"
        ))
    );
    // Ignore: not counted against backoffLimit (the replacement still waits out the back-off,
    // as upstream's back-off record takes every failed pod).
    let r = run(&j, vec![disrupted]);
    assert_eq!(r.sync.job.status.as_ref().and_then(|s| s.failed), None);
    assert!(cond(&r, "FailureTarget").is_none());
    assert_eq!(r.actions.requeue, Some(Duration::from_secs(5)));
}

#[test]
fn pod_replacement_policy_failed_waits_for_terminating_pods() {
    let terminating = pod(
        "pi-a",
        "Running",
        json!({"metadata": {"deletionTimestamp": ago(1), "deletionGracePeriodSeconds": 30}}),
    );
    let wait = run(
        &job(json!({"podReplacementPolicy": "Failed"}), json!({})),
        vec![terminating.clone()],
    );
    assert!(wait.actions.create.is_empty());
    assert_eq!(wait.sync.job.status.as_ref().and_then(|s| s.terminating), Some(1));
    // TerminatingOrFailed: the deleted pod counts as failed and is replaced after the back-off.
    let j = job(json!({}), json!({}));
    let r = run(&j, vec![terminating]);
    assert_eq!(r.sync.job.status.as_ref().and_then(|s| s.failed), Some(1));
}

#[test]
fn suspend_deletes_active_pods_and_resume_restarts_the_clock() {
    let j = job(
        json!({"suspend": true, "parallelism": 2, "completions": 4}),
        json!({}),
    );
    let r = run(
        &j,
        vec![
            pod("pi-a", "Running", json!({})),
            pod("pi-b", "Running", json!({})),
        ],
    );
    assert_eq!(r.actions.delete.len(), 2);
    assert_eq!(reason(&r, "Suspended"), Some(("JobSuspended", "Job suspended")));
    assert_eq!(cond(&r, "Suspended").map(|c| c.status.as_str()), Some("True"));
    assert_eq!(
        events(&r.actions.events),
        [(Kind::Normal, "Suspended", "Job suspended")]
    );
    let mut resumed = r.sync.job.clone();
    if let Some(s) = resumed.spec.as_mut() {
        s.suspend = Some(false);
    }
    let r = run(&resumed, vec![]);
    assert_eq!(reason(&r, "Suspended"), Some(("JobResumed", "Job resumed")));
    assert_eq!(cond(&r, "Suspended").map(|c| c.status.as_str()), Some("False"));
    assert_eq!(r.actions.create.len(), 2);
    assert_eq!(
        r.sync
            .job
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0),
        Some(now())
    );
}

#[test]
fn success_policy_finishes_an_indexed_job_early() {
    let j = job(
        json!({"completions": 5, "parallelism": 5, "completionMode": "Indexed",
               "successPolicy": {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}}),
        json!({}),
    );
    let r = run(
        &j,
        vec![
            indexed("pi-0-a", "Succeeded", 0, json!({})),
            indexed("pi-1-a", "Running", 1, json!({})),
        ],
    );
    assert_eq!(
        reason(&r, "SuccessCriteriaMet"),
        Some(("SuccessPolicy", "Matched rules at index 0"))
    );
    assert_eq!(names(&r.actions.delete_keeping_finalizer), ["pi-1-a"]);
    assert!(cond(&r, "Complete").is_none(), "waits for the deleted pod");
}

#[test]
fn surplus_pods_go_in_upstream_order() {
    let j = job(json!({"completions": 5, "parallelism": 1}), json!({}));
    let pending = pod(
        "pi-p",
        "Pending",
        json!({"status": {"conditions": [], "containerStatuses": []}}),
    );
    let running = pod("pi-r", "Running", json!({}));
    let r = run(&j, vec![running, pending]);
    assert_eq!(names(&r.actions.delete), ["pi-p"]);
}
