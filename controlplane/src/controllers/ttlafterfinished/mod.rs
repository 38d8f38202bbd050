//! The TTL-after-finished controller (`ttl-after-finished-controller`): deletes a finished Job
//! `ttlSecondsAfterFinished` after it finished, with its pods (`propagationPolicy: Foreground`,
//! the Job's uid as precondition), after checking the TTL again on a fresh read.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{DeleteParams, Preconditions, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};

use self::reconcile::{Ttl, ttl};
use super::{Failures, Manager, Running, key_of};

/// Upstream's component name.
pub const COMPONENT: &str = "ttl-after-finished-controller";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
}

pub(crate) struct Ctx {
    client: kube::Client,
    failures: Failures,
}

/// The controller, subscribed to the shared Job informer.
pub fn controller(mgr: &Manager) -> Running {
    let jobs = mgr.informers.get::<Job>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        failures: Failures::default(),
    });
    let ctl = Controller::for_shared_stream(jobs.subscribe(), jobs.reader())
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(job: Arc<Job>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&key_of(&*job));
    tracing::warn!(job = %key_of(&*job), error = %err, retry_in = ?delay, "cleaning up a finished Job failed");
    Action::requeue(delay)
}

async fn reconcile_one(job: Arc<Job>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let action = sync(&job, &ctx).await?;
    ctx.failures.reset(&key_of(&*job));
    Ok(action)
}

async fn sync(job: &Job, ctx: &Ctx) -> Result<Action, SyncError> {
    match ttl(job, Utc::now()) {
        Ttl::NotDue => return Ok(Action::await_change()),
        Ttl::Left(d) => return Ok(Action::requeue(d)),
        Ttl::Expired => {}
    }
    let ns = job.metadata.namespace.as_deref().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let api: kube::Api<Job> = kube::Api::namespaced(ctx.client.clone(), ns);
    // The cached TTL may be stale: decide on a fresh read.
    let fresh = match api.get(name).await {
        Ok(j) => j,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Action::await_change()),
        Err(e) => return Err(e.into()),
    };
    match ttl(&fresh, Utc::now()) {
        Ttl::NotDue => return Ok(Action::await_change()),
        Ttl::Left(d) => return Ok(Action::requeue(d)),
        Ttl::Expired => {}
    }
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        preconditions: Some(Preconditions {
            uid: fresh.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    tracing::info!(job = %key_of(&fresh), "deleting a finished Job after its TTL");
    match api.delete(name, &dp).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}
