//! The Job, TTL-after-finished and CronJob controllers through `controlplane serve` with hollow
//! nodes and the real kubectl (docs/SEEDS-SPEC.md CTL-29..CTL-38). Pods finish through the
//! hollow nodes' `nodeos.dev/hollow-run-seconds` / `nodeos.dev/hollow-exit-code` annotations.

use std::path::Path;
use std::time::{Duration, Instant};

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

fn cluster() -> TestCluster {
    TestCluster::start(bin(), &[], &[("node", 3, &[])])
}

/// A Job whose pods run `secs` seconds and exit with `exit`; `spec` adds lines (two-space indent
/// under `spec:`).
fn job(name: &str, secs: u32, exit: i32, spec: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n{spec}  template:\n    metadata:\n      annotations:\n        nodeos.dev/hollow-run-seconds: \"{secs}\"\n        nodeos.dev/hollow-exit-code: \"{exit}\"\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox\n"
    )
}

fn condition(c: &TestCluster, job: &str, type_: &str, field: &str) -> String {
    c.jsonpath(
        &["job", job],
        &format!("{{.status.conditions[?(@.type==\"{type_}\")].{field}}}"),
    )
}

/// Polls `ok` for up to `secs` seconds.
fn eventually(secs: u64, what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn three_completions_two_at_a_time_complete() {
    let c = cluster();
    c.apply(&job("pi", 2, 0, "  completions: 3\n  parallelism: 2\n"));
    // Never more than two at once.
    eventually(60, "the first pods", || {
        c.jsonpath(&["job", "pi"], "{.status.active}") == "2"
    });
    c.wait_for(
        &["job", "pi"],
        "{.status.conditions[?(@.type==\"Complete\")].status}",
        |s| s == "True",
    );
    assert_eq!(c.jsonpath(&["job", "pi"], "{.status.succeeded}"), "3");
    assert_eq!(condition(&c, "pi", "Complete", "reason"), "CompletionsReached");
    assert_eq!(
        condition(&c, "pi", "SuccessCriteriaMet", "message"),
        "Reached expected number of succeeded pods"
    );
    assert!(!c.jsonpath(&["job", "pi"], "{.status.completionTime}").is_empty());
    assert_eq!(
        c.jsonpath(&["job", "pi"], "{.status.uncountedTerminatedPods}"),
        "{}"
    );
    // Three pods, all counted: no tracking finalizer left.
    let pods = c.jsonpath(
        &["pods", "-l", "batch.kubernetes.io/job-name=pi"],
        "{.items[*].metadata.name}",
    );
    assert_eq!(pods.split_whitespace().count(), 3, "{pods}");
    assert!(pods.split_whitespace().all(|p| p.starts_with("pi-")));
    let finalizers = c.jsonpath(&["pods", "-l", "job-name=pi"], "{.items[*].metadata.finalizers}");
    assert!(!finalizers.contains("job-tracking"), "{finalizers}");
    let events = c.kubectl(&["events", "--for", "job/pi"]);
    assert!(
        events.contains("SuccessfulCreate") && events.contains("Created pod: pi-"),
        "{events}"
    );
    assert!(
        events.contains("Completed") && events.contains("Job completed"),
        "{events}"
    );
    let table = c.kubectl(&["get", "jobs"]);
    assert!(
        table.starts_with("NAME   STATUS     COMPLETIONS   DURATION   AGE"),
        "{table}"
    );
    assert!(table.contains("pi     Complete   3/3"), "{table}");
    let wide = c.kubectl(&["get", "jobs", "-o", "wide"]);
    assert!(
        wide.contains("CONTAINERS") && wide.contains("main") && wide.contains("busybox"),
        "{wide}"
    );
}

#[test]
fn a_failing_job_stops_at_its_backoff_limit() {
    let c = cluster();
    c.apply(&job("fail", 1, 1, "  backoffLimit: 1\n"));
    // First failure, a 10 s back-off, the replacement fails too: 2 > backoffLimit 1.
    eventually(90, "the Failed condition", || {
        condition(&c, "fail", "Failed", "status") == "True"
    });
    assert_eq!(condition(&c, "fail", "Failed", "reason"), "BackoffLimitExceeded");
    assert_eq!(
        condition(&c, "fail", "Failed", "message"),
        "Job has reached the specified backoff limit"
    );
    assert_eq!(
        condition(&c, "fail", "FailureTarget", "reason"),
        "BackoffLimitExceeded"
    );
    assert_eq!(c.jsonpath(&["job", "fail"], "{.status.failed}"), "2");
    let pods = c.jsonpath(&["pods", "-l", "job-name=fail"], "{.items[*].status.phase}");
    assert_eq!(pods, "Failed Failed");
    let events = c.kubectl(&["events", "--for", "job/fail"]);
    assert!(events.contains("Warning   BackoffLimitExceeded"), "{events}");
    let table = c.kubectl(&["get", "job", "fail"]);
    assert!(table.contains("fail   Failed   0/1"), "{table}");
}

#[test]
fn an_indexed_job_runs_each_index_once() {
    let c = cluster();
    c.apply(&job(
        "idx",
        1,
        0,
        "  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n",
    ));
    c.wait_for(
        &["job", "idx"],
        "{.status.conditions[?(@.type==\"Complete\")].status}",
        |s| s == "True",
    );
    assert_eq!(c.jsonpath(&["job", "idx"], "{.status.completedIndexes}"), "0-2");
    for ix in 0..3 {
        let name = c.jsonpath(
            &[
                "pods",
                "-l",
                &format!("batch.kubernetes.io/job-completion-index={ix}"),
            ],
            "{.items[*].metadata.name}",
        );
        assert!(name.starts_with(&format!("idx-{ix}-")), "index {ix}: {name:?}");
        let env = c.jsonpath(&["pod", &name], "{.spec.containers[0].env[0].name}");
        assert_eq!(env, "JOB_COMPLETION_INDEX");
        assert_eq!(
            c.jsonpath(&["pod", &name], "{.spec.hostname}"),
            format!("idx-{ix}")
        );
    }
}

#[test]
fn ttl_after_finished_deletes_the_job_and_its_pods() {
    let c = cluster();
    c.apply(&job("short", 1, 0, "  ttlSecondsAfterFinished: 2\n"));
    eventually(60, "the pod", || {
        !c.jsonpath(&["pods", "-l", "job-name=short"], "{.items[*].metadata.name}")
            .is_empty()
    });
    eventually(60, "the Job's deletion", || {
        let (ok, _, err) = c.kubectl_result(&["get", "job", "short"], None);
        !ok && err.contains("NotFound")
    });
    eventually(30, "the pods' deletion", || {
        c.jsonpath(&["pods", "-l", "job-name=short"], "{.items[*].metadata.name}")
            .is_empty()
    });
}

#[test]
fn suspended_jobs_run_nothing_until_resumed() {
    let c = cluster();
    c.apply(&job("later", 1, 0, "  suspend: true\n"));
    eventually(30, "the Suspended condition", || {
        condition(&c, "later", "Suspended", "status") == "True"
    });
    assert_eq!(condition(&c, "later", "Suspended", "reason"), "JobSuspended");
    assert!(c.kubectl(&["get", "job", "later"]).contains("later   Suspended"));
    assert_eq!(
        c.jsonpath(&["pods", "-l", "job-name=later"], "{.items[*].metadata.name}"),
        ""
    );
    c.kubectl(&[
        "patch",
        "job",
        "later",
        "--type=merge",
        "-p",
        "{\"spec\":{\"suspend\":false}}",
    ]);
    c.wait_for(
        &["job", "later"],
        "{.status.conditions[?(@.type==\"Complete\")].status}",
        |s| s == "True",
    );
    assert_eq!(condition(&c, "later", "Suspended", "reason"), "JobResumed");
    let events = c.kubectl(&["events", "--for", "job/later"]);
    assert!(
        events.contains("Job suspended") && events.contains("Job resumed"),
        "{events}"
    );
}

/// A CronJob on `@every 3s` runs a Job (named `<name>-<unix minutes>`, so at most one a minute,
/// as upstream) to completion, records lastScheduleTime/lastSuccessfulTime and upstream's events;
/// an unknown time zone is refused and stores nothing. Concurrency policies and history limits
/// are table-tested (`controllers::cronjob::tests`).
#[test]
fn a_cronjob_runs_on_schedule_and_refuses_a_bad_time_zone() {
    let c = cluster();
    let cron = |name: &str, schedule: &str, extra: &str| {
        format!(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: {name}\nspec:\n  schedule: \"{schedule}\"\n{extra}  jobTemplate:\n    spec:\n      template:\n        metadata:\n          annotations:\n            nodeos.dev/hollow-run-seconds: \"0\"\n        spec:\n          restartPolicy: Never\n          containers:\n          - name: main\n            image: busybox\n"
        )
    };
    c.apply(&cron("tick", "@every 3s", ""));
    c.wait_for(&["cronjob", "tick"], "{.status.lastSuccessfulTime}", |s| {
        !s.is_empty()
    });
    let job = c.jsonpath(&["jobs"], "{.items[0].metadata.name}");
    let minutes = job.strip_prefix("tick-").expect("job named after its CronJob");
    assert!(minutes.parse::<u64>().is_ok(), "{job}");
    assert_eq!(
        c.jsonpath(
            &["jobs", &job],
            "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"
        ),
        "CronJob/tick"
    );
    assert!(
        !c.jsonpath(&["cronjob", "tick"], "{.status.lastScheduleTime}")
            .is_empty()
    );
    eventually(30, "the events", || {
        let events = c.jsonpath(
            &["events", "--field-selector", "involvedObject.name=tick"],
            "{range .items[*]}{.reason} {end}",
        );
        events.contains("SuccessfulCreate") && events.contains("SawCompletedJob")
    });

    // A time zone that does not exist: 422, nothing stored.
    let (ok, _, err) = c.kubectl_result(
        &["apply", "-f", "-"],
        Some(&cron("nowhere", "0 * * * *", "  timeZone: Mars/Olympus\n")),
    );
    assert!(!ok);
    assert!(err.contains("spec.timeZone"), "{err}");
    let (found, _, _) = c.kubectl_result(&["get", "cronjob", "nowhere"], None);
    assert!(!found);
}
