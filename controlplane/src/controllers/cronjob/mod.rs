//! The CronJob controller (`cronjob-controller`, upstream's v2): creates a Job for the most
//! recent slot of each CronJob's schedule (in its time zone), keeps the active list,
//! lastScheduleTime and lastSuccessfulTime, applies the concurrency policy and the history
//! limits, and comes back at the next slot. Decisions are in `reconcile`, the schedule grammar in
//! `schedule`; this module reads the CronJob's Jobs through an index by controller uid and
//! performs the API calls.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};

use self::reconcile::{has_unlisted_running, plan, unseen_active, with_created};
use super::index::{OwnerIndex, controller_uid};
use super::{Failures, Manager, Running, controller_ref, retry_after_failure, run_sync};
use crate::cron as schedule;
use crate::events::{Involved, Kind, Recorder};

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "cronjob-controller";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("encoding the CronJob status: {0}")]
    Encode(#[from] serde_json::Error),
}

pub(crate) struct Ctx {
    client: kube::Client,
    jobs: Arc<OwnerIndex<Job>>,
    recorder: Arc<Recorder>,
    failures: Failures,
}

/// The controller, subscribed to the shared CronJob and Job informers.
pub fn controller(mgr: &Manager) -> Running {
    let cronjobs = mgr.informers.get::<CronJob>();
    let jobs = mgr.informers.get::<Job>();
    let index = OwnerIndex::by_controller(&jobs);
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        jobs: index,
        recorder: mgr.recorder(COMPONENT),
        failures: Failures::default(),
    });
    let changed = jobs.subscribe();
    let deleted = jobs
        .deletions()
        .filter_map(|j| futures::future::ready(controller_ref::<CronJob, _>(&*j)));
    let ctl = Controller::for_shared_stream(cronjobs.subscribe(), cronjobs.reader())
        .owns_shared_stream(changed)
        .reconcile_on(deleted)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(cj: Arc<CronJob>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    retry_after_failure(&ctx.failures, "cronjob", &*cj, err)
}

async fn reconcile_one(cj: Arc<CronJob>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    // Nothing is decided on a cache that has not listed yet (a restart would over-create).
    ctx.jobs.synced().await;
    run_sync(&ctx.failures, "cronjob", &*cj, sync(&cj, &ctx)).await
}

async fn sync(cached: &CronJob, ctx: &Ctx) -> Result<Action, SyncError> {
    let ns = cached.metadata.namespace.clone().unwrap_or_default();
    let name = cached.metadata.name.clone().unwrap_or_default();
    let uid = cached.metadata.uid.clone().unwrap_or_default();
    let cj_api: kube::Api<CronJob> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let job_api: kube::Api<Job> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let jobs = ctx.jobs.owned_by(&uid);
    let mut cj = cached.clone();
    // A running Job not in the cached active list: the CronJob's cache may lag its Jobs'.
    if has_unlisted_running(&cj, &jobs) {
        match cj_api.get(&name).await {
            Ok(fresh) if fresh.metadata.uid == cj.metadata.uid => cj = fresh,
            Ok(_) => return Ok(Action::await_change()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    // Active Jobs the cache does not have: gone only if the API says so.
    let mut gone: Vec<ObjectReference> = Vec::new();
    for r in unseen_active(&cj, &jobs) {
        match job_api.get(r.name.as_deref().unwrap_or_default()).await {
            Err(kube::Error::Api(s)) if s.code == 404 => gone.push(r),
            Ok(j) if j.metadata.uid != r.uid => gone.push(r),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let tz = schedule::time_zone(cj.spec.as_ref().and_then(|s| s.time_zone.as_deref()));
    let p = plan(&cj, &jobs, &gone, &tz, Utc::now());
    let involved = Involved::of(&cj);
    for e in &p.events {
        ctx.recorder
            .record(&involved, e.kind, e.reason, "Sync", &e.message)
            .await;
    }
    let mut status = p.status.clone();
    let mut changed = p.status_changed;
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    for j in &p.delete {
        let jname = j.metadata.name.as_deref().unwrap_or_default();
        match job_api.delete(jname, &dp).await {
            Ok(_) | Err(kube::Error::Api(kube::core::ErrorResponse { code: 404, .. })) => {
                ctx.recorder
                    .record(
                        &involved,
                        Kind::Normal,
                        "SuccessfulDelete",
                        "Delete",
                        &format!("Deleted job {jname}"),
                    )
                    .await;
            }
            Err(e) => {
                ctx.recorder
                    .record(
                        &involved,
                        Kind::Warning,
                        "FailedDelete",
                        "Delete",
                        &format!("Deleted job: {e}"),
                    )
                    .await;
                return Err(e.into());
            }
        }
    }
    if let (Some(job), Some(scheduled)) = (&p.create, p.scheduled) {
        match job_api.create(&PostParams::default(), job).await {
            Ok(created) => {
                ctx.recorder
                    .record(
                        &involved,
                        Kind::Normal,
                        "SuccessfulCreate",
                        "Create",
                        &format!(
                            "Created job {}",
                            created.metadata.name.as_deref().unwrap_or_default()
                        ),
                    )
                    .await;
                status = with_created(status, &created, scheduled);
                changed = true;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Created before (by us, if we control it): make sure it is listed.
                let existing = job_api
                    .get(job.metadata.name.as_deref().unwrap_or_default())
                    .await?;
                if controller_uid(&existing) == Some(uid.as_str()) {
                    status = with_created(status, &existing, scheduled);
                    changed = true;
                }
            }
            Err(e) => {
                let msg = super::slowstart::api_message(&e);
                ctx.recorder
                    .record(
                        &involved,
                        Kind::Warning,
                        "FailedCreate",
                        "Create",
                        &format!("Error creating job: {msg}"),
                    )
                    .await;
                return Err(e.into());
            }
        }
    }
    if changed {
        write_status(&cj_api, &cj, status).await?;
    }
    Ok(match p.requeue {
        Some(d) => Action::requeue(d.max(Duration::from_millis(100))),
        None => Action::await_change(),
    })
}

/// PUT /status with the read resourceVersion (a stale read gets 409 and the sync is retried).
async fn write_status(
    api: &kube::Api<CronJob>,
    cj: &CronJob,
    status: CronJobStatus,
) -> Result<(), SyncError> {
    let mut body = cj.clone();
    body.status = Some(status);
    let bytes = serde_json::to_vec(&body)?;
    match api
        .replace_status(
            cj.metadata.name.as_deref().unwrap_or_default(),
            &PostParams::default(),
            bytes,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
