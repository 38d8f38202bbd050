//! Table tests of the TTL-after-finished decision.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use serde_json::json;

use super::reconcile::{Ttl, ttl};

fn now() -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse().expect("time")
}

fn job(ttl: Option<i32>, finished: Option<(&str, &str)>) -> Job {
    let conds = finished.map(|(t, at)| json!([{"type": t, "status": "True", "lastTransitionTime": at}]));
    serde_json::from_value(json!({
        "metadata": {"name": "pi", "namespace": "default"},
        "spec": {"ttlSecondsAfterFinished": ttl, "template": {}},
        "status": {"conditions": conds},
    }))
    .expect("job")
}

#[test]
fn finished_jobs_expire_ttl_seconds_after_their_finish() {
    assert_eq!(ttl(&job(Some(100), None), now()), Ttl::NotDue);
    assert_eq!(
        ttl(&job(None, Some(("Complete", "2026-06-01T11:00:00Z"))), now()),
        Ttl::NotDue
    );
    assert_eq!(
        ttl(&job(Some(100), Some(("Complete", "2026-06-01T11:59:00Z"))), now()),
        Ttl::Left(Duration::from_secs(40))
    );
    assert_eq!(
        ttl(&job(Some(60), Some(("Failed", "2026-06-01T11:59:00Z"))), now()),
        Ttl::Expired
    );
    assert_eq!(
        ttl(&job(Some(0), Some(("Complete", "2026-06-01T12:00:00Z"))), now()),
        Ttl::Expired
    );
    let mut deleting = job(Some(0), Some(("Complete", "2026-06-01T11:00:00Z")));
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    assert_eq!(ttl(&deleting, now()), Ttl::NotDue);
}
