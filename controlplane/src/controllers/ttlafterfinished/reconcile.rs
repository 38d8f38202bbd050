//! When a finished Job's `ttlSecondsAfterFinished` runs out (docs/SEEDS-SPEC.md CTL-32): the
//! finish time is the transition of its Complete or Failed condition.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;

use crate::controllers::job::reconcile::finish_time;

/// What the TTL says about a Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ttl {
    /// No TTL, not finished, or already being deleted.
    NotDue,
    /// Delete it now.
    Expired,
    /// Look again after this.
    Left(Duration),
}

/// The TTL state of `job` at `now`.
pub fn ttl(job: &Job, now: DateTime<Utc>) -> Ttl {
    let Some(secs) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
        return Ttl::NotDue;
    };
    if job.metadata.deletion_timestamp.is_some() {
        return Ttl::NotDue;
    }
    let Some(finished) = finish_time(job) else {
        return Ttl::NotDue;
    };
    let expires = finished + chrono::Duration::seconds(i64::from(secs));
    match (expires - now).to_std() {
        Ok(d) if !d.is_zero() => Ttl::Left(d),
        _ => Ttl::Expired,
    }
}
