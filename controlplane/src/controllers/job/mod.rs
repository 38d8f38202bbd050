//! The Job controller (`job-controller`): runs a Job's pods until it completes or fails
//! (completions, parallelism, Indexed Jobs, back-off, backoffLimit and backoffLimitPerIndex,
//! activeDeadlineSeconds, podFailurePolicy, podReplacementPolicy, successPolicy, suspend),
//! tracking finished pods with the `batch.kubernetes.io/job-tracking` finalizer so each is
//! counted exactly once, even across restarts of this controller.
//!
//! The decisions are in `reconcile`; this module reads the Job's pods through an index by
//! controller uid, and performs the pod writes and the status writes between the steps of
//! `reconcile::Sync` (status through `PUT /status` with the cached resourceVersion, so a stale
//! cache never overwrites counters). Pods that still carry the finalizer but whose Job is gone
//! or finished lose it here too (upstream's orphan queue).

pub mod indexes;
pub mod policy;
pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;
use tokio::sync::mpsc;

use self::policy::{BackoffRecord, TRACKING_FINALIZER, has_finalizer};
use self::reconcile::{Event, Skip, Sync, finished_type, pod_for};
use super::expectations::{Expectations, TIMEOUT};
use super::index::OwnerIndex;
use super::podutil::is_active;
use super::slowstart::Creator;
use super::{Failures, Manager, Running, controller_ref, key_of, run_sync};
use crate::events::{Involved, Kind, Recorder};

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "job-controller";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("encoding the Job status: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Pods whose finalizer this controller removed, until the cache shows it gone (upstream's
/// `uidTrackingExpectations`): they must not be counted twice meanwhile.
#[derive(Debug, Default)]
struct FinalizerExpectations {
    by_job: Mutex<HashMap<String, HashMap<String, Instant>>>,
}

impl FinalizerExpectations {
    fn expect(&self, job: &str, uids: impl IntoIterator<Item = String>) {
        let now = Instant::now();
        let mut m = self.by_job.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(job.to_string()).or_default();
        for u in uids {
            e.insert(u, now);
        }
    }

    fn observed(&self, job: &str, uid: &str) {
        let mut m = self.by_job.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.get_mut(job) {
            e.remove(uid);
        }
    }

    /// Still expected, given the Job's cached pods (in the cache without the finalizer, or gone:
    /// fulfilled).
    fn outstanding(&self, job: &str, pods: &[Arc<Pod>]) -> HashSet<String> {
        let mut m = self.by_job.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = m.get_mut(job) else {
            return HashSet::new();
        };
        let holding: HashSet<&str> = pods
            .iter()
            .filter(|p| has_finalizer(p))
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        e.retain(|uid, at| holding.contains(uid.as_str()) && at.elapsed() < TIMEOUT);
        let out = e.keys().cloned().collect();
        if e.is_empty() {
            m.remove(job);
        }
        out
    }

    fn forget(&self, job: &str) {
        self.by_job.lock().unwrap_or_else(|p| p.into_inner()).remove(job);
    }
}

pub(crate) struct Ctx {
    client: kube::Client,
    pods: Arc<OwnerIndex<Pod>>,
    recorder: Arc<Recorder>,
    expectations: Expectations,
    finalizers: FinalizerExpectations,
    backoff: Mutex<HashMap<String, BackoffRecord>>,
    failures: Failures,
    orphans: mpsc::UnboundedSender<ObjectRef<Pod>>,
}

/// Whether `pod` holds the tracking finalizer for a Job that will not remove it: no Job
/// controller, a Job that is gone (or another with its name), or a finished one.
fn is_orphan(pod: &Pod, jobs: &Store<Job>) -> bool {
    if !has_finalizer(pod) {
        return false;
    }
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let Some(owner) = owner else { return true };
    if owner.kind != "Job" || owner.api_version != "batch/v1" {
        return false;
    }
    let r = ObjectRef::<Job>::new(&owner.name).within(pod.metadata.namespace.as_deref().unwrap_or_default());
    match jobs.get(&r) {
        Some(job) if job.metadata.uid.as_deref() == Some(owner.uid.as_str()) => finished_type(&job).is_some(),
        _ => true,
    }
}

/// The controller, subscribed to the shared Job and Pod informers.
pub fn controller(mgr: &Manager) -> Running {
    let jobs = mgr.informers.get::<Job>();
    let pods = mgr.informers.get::<Pod>();
    let index = OwnerIndex::by_controller(&pods);
    let (orphan_tx, orphan_rx) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        pods: index.clone(),
        recorder: mgr.recorder(COMPONENT),
        expectations: Expectations::default(),
        finalizers: FinalizerExpectations::default(),
        backoff: Mutex::new(HashMap::new()),
        failures: Failures::default(),
        orphans: orphan_tx.clone(),
    });
    // Orphans go to their queue.
    let (job_reader, tx) = (jobs.reader(), orphan_tx.clone());
    let changed = pods.subscribe().inspect(move |p| {
        if is_orphan(p, &job_reader) {
            let _ = tx.send(ObjectRef::from_obj(&**p));
        }
    });
    let deleted = pods
        .deletions()
        .filter_map(|p| futures::future::ready(controller_ref::<Job, _>(&*p)));
    // A deleted Job leaves its pods' finalizers to the orphan queue.
    let (idx, tx) = (index, orphan_tx);
    let gone_jobs = jobs.deletions().for_each(move |j| {
        for p in idx.owned_by(j.metadata.uid.as_deref().unwrap_or_default()) {
            if has_finalizer(&p) {
                let _ = tx.send(ObjectRef::from_obj(&*p));
            }
        }
        futures::future::ready(())
    });
    let ctl = Controller::for_shared_stream(jobs.subscribe(), jobs.reader())
        .owns_shared_stream(changed)
        .reconcile_on(deleted)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let orphans = clean_orphans(ctx, orphan_rx, jobs.reader(), pods.reader());
    Box::pin(async move {
        tokio::join!(ctl, gone_jobs, orphans);
    })
}

/// Removes the tracking finalizer from orphaned pods (checked again against a synced cache).
async fn clean_orphans(
    ctx: Arc<Ctx>,
    mut rx: mpsc::UnboundedReceiver<ObjectRef<Pod>>,
    jobs: Store<Job>,
    pods: Store<Pod>,
) {
    super::informer::synced(&jobs).await;
    super::informer::synced(&pods).await;
    while let Some(r) = rx.recv().await {
        let Some(pod) = pods.get(&r) else { continue };
        if !is_orphan(&pod, &jobs) {
            continue;
        }
        if let Err(e) = remove_finalizer(&ctx.client, &pod).await {
            tracing::warn!(pod = %r, error = %e, "removing the job-tracking finalizer of an orphan failed; retrying");
            let tx = ctx.orphans.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let _ = tx.send(r);
            });
        }
    }
}

async fn remove_finalizer(client: &kube::Client, pod: &Pod) -> Result<(), kube::Error> {
    let api: kube::Api<Pod> = kube::Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    match api
        .patch(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

fn error_policy(job: Arc<Job>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&key_of(&*job));
    let conflict = matches!(err, SyncError::Api(kube::Error::Api(s)) if s.code == 409);
    if conflict {
        tracing::debug!(job = %key_of(&*job), retry_in = ?delay, "status write on a stale Job; retrying");
    } else {
        tracing::warn!(job = %key_of(&*job), error = %err, retry_in = ?delay, "sync failed");
    }
    Action::requeue(delay)
}

async fn reconcile_one(job: Arc<Job>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    run_sync(&ctx.failures, "job", &*job, sync(&job, &ctx)).await
}

/// The Job is finished: its pods' finalizers go (they are counted already), its records too.
async fn finished(job: &Job, ctx: &Ctx, pods: &[Arc<Pod>]) -> Result<Action, SyncError> {
    let key = key_of(job);
    if let Ok(mut b) = ctx.backoff.lock() {
        b.remove(&key);
    }
    for p in pods.iter().filter(|p| has_finalizer(p)) {
        remove_finalizer(&ctx.client, p).await?;
    }
    Ok(Action::await_change())
}

async fn sync(job: &Job, ctx: &Ctx) -> Result<Action, SyncError> {
    let key = key_of(job);
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let pods = ctx.pods.owned_by(&uid);
    if finished_type(job).is_some() {
        return finished(job, ctx, &pods).await;
    }
    let names: HashSet<&str> = pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
    let active: HashSet<&str> = pods
        .iter()
        .filter(|p| is_active(p))
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let outstanding = ctx.expectations.outstanding(&uid, &names, &active);
    let satisfied = outstanding.creates == 0 && outstanding.deletes.is_empty();
    let expected_rm = ctx.finalizers.outstanding(&uid, &pods);
    let backoff = ctx
        .backoff
        .lock()
        .ok()
        .and_then(|b| b.get(&key).cloned())
        .unwrap_or_default();
    let involved = Involved::of(job);
    let mut s = match Sync::new(job, pods.clone(), expected_rm.clone(), &backoff, Utc::now()) {
        Ok(s) => s,
        Err(Skip::UnknownCompletionMode) => {
            ctx.recorder
                .record(
                    &involved,
                    Kind::Warning,
                    "UnknownCompletionMode",
                    "Sync",
                    "Skipped Job sync because completion mode is unknown",
                )
                .await;
            return Ok(Action::await_change());
        }
        Err(Skip::ManagedElsewhere(by)) => {
            tracing::debug!(job = %key, managed_by = %by, "managed by another controller");
            return Ok(Action::await_change());
        }
        Err(Skip::Finished) => return finished(job, ctx, &pods).await,
    };
    let actions = s.decide(satisfied);
    tracing::debug!(
        job = %key,
        pods = pods.len(),
        satisfied,
        create = actions.create.len(),
        delete = actions.delete.len(),
        finishing = actions.delete_keeping_finalizer.len(),
        status = ?s.job.status,
        "decided"
    );
    let api: kube::Api<Pod> = kube::Api::namespaced(
        ctx.client.clone(),
        job.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let mut first_error: Option<SyncError> = None;
    // A finishing Job's active pods go, keeping their finalizers until counted.
    let finishing = futures::future::join_all(
        actions
            .delete_keeping_finalizer
            .iter()
            .map(|p| delete_pod(&api, p)),
    )
    .await;
    let all_finishing_deleted = finishing.iter().all(Result::is_ok);
    for (p, r) in actions.delete_keeping_finalizer.iter().zip(finishing) {
        record_delete(ctx, &involved, p, r, &mut first_error).await;
    }
    // Surplus pods and a suspended Job's pods: finalizer first, then the pod.
    let removed = futures::future::join_all(actions.delete.iter().map(|p| async {
        if has_finalizer(p) {
            remove_finalizer(&ctx.client, p).await?;
        }
        delete_pod(&api, p).await
    }))
    .await;
    for (p, r) in actions.delete.iter().zip(removed) {
        if r.is_ok() {
            // Registered after the fact: a pod the cache shows deleted already fulfils it.
            ctx.expectations
                .deleted(&uid, p.metadata.uid.as_deref().unwrap_or_default());
        }
        record_delete(ctx, &involved, p, r, &mut first_error).await;
    }
    let job_uid = s.job.metadata.uid.clone().unwrap_or_default();
    let creator = Creator {
        api: &api,
        owner_uid: &job_uid,
        expectations: &ctx.expectations,
        recorder: &ctx.recorder,
        involved: &involved,
    };
    let new_pods = actions.create.iter().map(|n| pod_for(&s.job, n)).collect();
    let failed_creates = match creator.create(new_pods).await {
        Ok(()) => 0,
        Err(e) => {
            first_error.get_or_insert(e.source.into());
            i32::try_from(e.not_created).unwrap_or(i32::MAX)
        }
    };
    s.outcome(failed_creates, all_finishing_deleted);
    record_all(ctx, &involved, &actions.events).await;
    // Track: uncounted pods first, then finalizers, then counters and the finish.
    let flush = s.track();
    if flush.write_status {
        write_status(ctx, &mut s).await?;
        if let Ok(mut b) = ctx.backoff.lock() {
            b.insert(key.clone(), s.new_backoff.clone());
        }
    }
    let mut still: HashSet<String> = pods
        .iter()
        .filter(|p| has_finalizer(p) && !expected_rm.contains(p.metadata.uid.as_deref().unwrap_or_default()))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    if !flush.remove_finalizers.is_empty() {
        let uids: Vec<String> = flush
            .remove_finalizers
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        ctx.finalizers.expect(&uid, uids);
        let results = futures::future::join_all(
            flush
                .remove_finalizers
                .iter()
                .map(|p| remove_finalizer(&ctx.client, p)),
        )
        .await;
        for (p, r) in flush.remove_finalizers.iter().zip(results) {
            let pod_uid = p.metadata.uid.clone().unwrap_or_default();
            match r {
                Ok(()) => {
                    still.remove(&pod_uid);
                }
                Err(e) => {
                    ctx.finalizers.observed(&uid, &pod_uid);
                    first_error.get_or_insert(e.into());
                }
            }
        }
    }
    let settled = s.settle(&still);
    if settled.write_status {
        write_status(ctx, &mut s).await?;
        record_all(ctx, &involved, &settled.events).await;
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if finished_type(&s.job).is_some() {
        ctx.finalizers.forget(&uid);
        return Ok(Action::await_change());
    }
    Ok(match actions.requeue {
        Some(d) => Action::requeue(d.max(Duration::from_secs(1))),
        None => Action::requeue(Duration::from_secs(300)),
    })
}

async fn record_all(ctx: &Ctx, involved: &Involved, events: &[Event]) {
    for e in events {
        ctx.recorder
            .record(involved, e.kind, &e.reason, "Sync", &e.message)
            .await;
    }
}

async fn delete_pod(api: &kube::Api<Pod>, p: &Pod) -> Result<(), kube::Error> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api
        .delete(p.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

async fn record_delete(
    ctx: &Ctx,
    involved: &Involved,
    p: &Pod,
    r: Result<(), kube::Error>,
    first_error: &mut Option<SyncError>,
) {
    let name = p.metadata.name.as_deref().unwrap_or_default();
    match r {
        Ok(()) => {
            ctx.recorder
                .record(
                    involved,
                    Kind::Normal,
                    "SuccessfulDelete",
                    "Delete",
                    &format!("Deleted pod: {name}"),
                )
                .await;
        }
        Err(e) => {
            ctx.recorder
                .record(
                    involved,
                    Kind::Warning,
                    "FailedDelete",
                    "Delete",
                    &format!("Error deleting: {e}"),
                )
                .await;
            first_error.get_or_insert(e.into());
        }
    }
}

/// Writes `s.job`'s status (PUT /status with its resourceVersion: a stale cache gets 409 and
/// the sync is retried) and keeps the new resourceVersion for the next write.
async fn write_status(ctx: &Ctx, s: &mut Sync) -> Result<(), SyncError> {
    let api: kube::Api<Job> = kube::Api::namespaced(
        ctx.client.clone(),
        s.job.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let body = serde_json::to_vec(&s.job)?;
    let written = api
        .replace_status(
            s.job.metadata.name.as_deref().unwrap_or_default(),
            &PostParams::default(),
            body,
        )
        .await?;
    tracing::debug!(
        job = %key_of(&s.job),
        from = ?s.job.metadata.resource_version,
        to = ?written.metadata.resource_version,
        succeeded = ?written.status.as_ref().and_then(|st| st.succeeded),
        uncounted = ?written.status.as_ref().and_then(|st| st.uncounted_terminated_pods.clone()),
        "status written"
    );
    s.job.metadata.resource_version = written.metadata.resource_version;
    Ok(())
}
