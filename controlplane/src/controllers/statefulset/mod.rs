//! The StatefulSet controller (`statefulset-controller`): pods with stable names `<set>-<i>`,
//! hostnames and claims (`<template>-<set>-<i>`), created and removed in order, updated from the
//! highest ordinal down, with their history in ControllerRevisions. The decisions are in
//! `reconcile`; this module reads the caches, writes to the API and records upstream's events.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kcore::labels::{labels_of, selector_matches};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::history;
use super::index::OwnerIndex;
use super::podutil::controller_owner;
use super::{Failures, Manager, Running, controller_ref, retry_after_failure, run_sync};
use crate::events::{Involved, Kind, Recorder};
use reconcile::{RevisionStep, Step};

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "statefulset-controller";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// A pod or claim could not be created, updated or deleted (an event says why).
    #[error("{0}")]
    Step(String),
}

pub(crate) struct Ctx {
    client: kube::Client,
    pods: Arc<OwnerIndex<Pod>>,
    revisions: Arc<OwnerIndex<ControllerRevision>>,
    claims: Store<PersistentVolumeClaim>,
    recorder: Arc<Recorder>,
    failures: Failures,
}

/// The controller, subscribed to the shared StatefulSet, Pod, ControllerRevision and
/// PersistentVolumeClaim informers.
pub fn controller(mgr: &Manager) -> Running {
    let sets = mgr.informers.get::<StatefulSet>();
    let pods = mgr.informers.get::<Pod>();
    let revisions = mgr.informers.get::<ControllerRevision>();
    let claims = mgr.informers.get::<PersistentVolumeClaim>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        pods: OwnerIndex::by_controller(&pods),
        revisions: OwnerIndex::by_controller(&revisions),
        claims: claims.reader(),
        recorder: mgr.recorder(COMPONENT),
        failures: Failures::default(),
    });
    let deleted = pods
        .deletions()
        .filter_map(|p| futures::future::ready(controller_ref::<StatefulSet, _>(&*p)));
    // An orphan named like a set's pod may be adopted by it.
    let set_reader = sets.reader();
    let orphans = pods.subscribe().filter_map(move |p| {
        let has_controller = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true));
        let r = if has_controller {
            None
        } else {
            p.metadata
                .name
                .as_deref()
                .and_then(reconcile::parent_and_ordinal)
                .map(|(parent, _)| {
                    ObjectRef::<StatefulSet>::new(parent)
                        .within(p.metadata.namespace.as_deref().unwrap_or_default())
                })
                .filter(|r| set_reader.get(r).is_some())
        };
        futures::future::ready(r)
    });
    let ctl = Controller::for_shared_stream(sets.subscribe(), sets.reader())
        .owns_shared_stream(pods.subscribe())
        .reconcile_on(deleted)
        .reconcile_on(orphans)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(set: Arc<StatefulSet>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    retry_after_failure(&ctx.failures, "statefulset", &*set, err)
}

async fn reconcile_one(set: Arc<StatefulSet>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    // Nothing is decided on a cache that has not listed yet (a restart would over-create).
    ctx.pods.synced().await;
    ctx.revisions.synced().await;
    super::informer::synced(&ctx.claims).await;
    run_sync(&ctx.failures, "statefulset", &*set, sync(&set, &ctx)).await
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The pods the set may own: those it controls, the orphans of its namespace, and whatever the
/// cache holds under its pods' names (the index may lag the cache by an event).
fn candidates(set: &StatefulSet, ctx: &Ctx) -> Vec<Arc<Pod>> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0);
    let start = set
        .spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0);
    let by_name = (start..start + replicas).filter_map(|i| ctx.pods.get(&ns, &reconcile::pod_name(set, i)));
    for p in ctx
        .pods
        .owned_by(&uid)
        .into_iter()
        .chain(ctx.pods.orphans(&ns))
        .chain(by_name)
    {
        if seen.insert(p.metadata.name.clone()) {
            out.push(p);
        }
    }
    out
}

async fn sync(set: &StatefulSet, ctx: &Ctx) -> Result<Action, SyncError> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let name = set.metadata.name.clone().unwrap_or_default();
    let pod_api: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let owner = controller_owner("apps/v1", "StatefulSet", &set.metadata);
    // Pods: adopt and release.
    let claimed = reconcile::claim_pods(set, &candidates(set, ctx));
    for p in &claimed.adopt {
        let patch = json!({"metadata": {"ownerReferences": [owner], "uid": p.metadata.uid}});
        patch_ignoring_races(&pod_api, p.metadata.name.as_deref().unwrap_or_default(), &patch).await?;
    }
    for p in &claimed.release {
        let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": p.metadata.uid}});
        patch_ignoring_races(&pod_api, p.metadata.name.as_deref().unwrap_or_default(), &patch).await?;
    }
    // History.
    let (mut sorted, collision_count) = revisions(set, ctx).await?;
    let mut set_now = set.clone();
    set_now
        .status
        .get_or_insert_with(Default::default)
        .collision_count = Some(collision_count);
    let update = apply_revision_step(&set_now, ctx, &mut sorted).await?;
    let current = reconcile::current_revision(&set_now, &sorted, &update);
    // Pods and claims.
    let claims = ctx.claims.clone();
    let claim_ns = ns.clone();
    let lookup = move |c: &str| claims.get(&ObjectRef::new(c).within(&claim_ns));
    let plan = reconcile::plan(&set_now, &claimed.pods, &current, &update, &lookup, Utc::now());
    let involved = Involved::of(set);
    let outcome = run_steps(ctx, &ns, &name, &involved, &plan.steps, plan.parallel).await;
    write_status(set, ctx, plan.status.clone()).await?;
    // Old revisions beyond the limit.
    let cur_name = current.metadata.name.clone().unwrap_or_default();
    let upd_name = update.metadata.name.clone().unwrap_or_default();
    history::sort(&mut sorted);
    let rev_api: kube::Api<ControllerRevision> = kube::Api::namespaced(ctx.client.clone(), &ns);
    for r in reconcile::surplus_revisions(&set_now, &sorted, &claimed.pods, &cur_name, &upd_name) {
        match rev_api
            .delete(
                r.metadata.name.as_deref().unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    outcome?;
    let min_ready = set.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
    Ok(if plan.wait_min_ready && min_ready > 0 {
        Action::requeue(Duration::from_secs(u64::try_from(min_ready).unwrap_or(0) + 1))
    } else {
        Action::requeue(Duration::from_secs(600))
    })
}

async fn patch_ignoring_races<K>(
    api: &kube::Api<K>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), SyncError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The set's revisions (adopting matching orphans), sorted, and its collision count.
async fn revisions(set: &StatefulSet, ctx: &Ctx) -> Result<(Vec<Arc<ControllerRevision>>, i32), SyncError> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let uid = set.metadata.uid.clone().unwrap_or_default();
    let selector = set.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    let mut revs = ctx.revisions.owned_by(&uid);
    let api: kube::Api<ControllerRevision> = kube::Api::namespaced(ctx.client.clone(), &ns);
    if set.metadata.deletion_timestamp.is_none() {
        let owner = controller_owner("apps/v1", "StatefulSet", &set.metadata);
        for r in ctx.revisions.orphans(&ns) {
            if !selector_matches(&selector, labels_of(&r.metadata.labels)) {
                continue;
            }
            let patch = json!({"metadata": {"ownerReferences": [owner], "uid": r.metadata.uid}});
            match api
                .patch(
                    r.metadata.name.as_deref().unwrap_or_default(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(adopted) => revs.push(Arc::new(adopted)),
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    history::sort(&mut revs);
    let cc = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
    Ok((revs, cc))
}

/// Makes sure the set's template is the latest revision; returns it (and adds it to `sorted`).
async fn apply_revision_step(
    set: &StatefulSet,
    ctx: &Ctx,
    sorted: &mut Vec<Arc<ControllerRevision>>,
) -> Result<Arc<ControllerRevision>, SyncError> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let api: kube::Api<ControllerRevision> = kube::Api::namespaced(ctx.client.clone(), &ns);
    match reconcile::update_revision(set, sorted) {
        RevisionStep::Reuse(r) => Ok(r),
        RevisionStep::Renumber(r, n) => {
            let patch = json!({"revision": n});
            let updated = Arc::new(
                api.patch(
                    r.metadata.name.as_deref().unwrap_or_default(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?,
            );
            sorted.retain(|x| x.metadata.name != updated.metadata.name);
            sorted.push(updated.clone());
            Ok(updated)
        }
        RevisionStep::Create(rev) => {
            let mut rev = *rev;
            let mut cc = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
            loop {
                match api.create(&PostParams::default(), &rev).await {
                    Ok(created) => {
                        let created = Arc::new(created);
                        sorted.push(created.clone());
                        return Ok(created);
                    }
                    Err(e) if api_code(&e) == Some(409) => {
                        let existing = api.get(rev.metadata.name.as_deref().unwrap_or_default()).await?;
                        let data = reconcile::revision_data(set);
                        let mine = existing
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|o| Some(&o.uid) == set.metadata.uid.as_ref());
                        if mine && history::same_data(&existing, &data) {
                            let existing = Arc::new(existing);
                            sorted.retain(|x| x.metadata.name != existing.metadata.name);
                            sorted.push(existing.clone());
                            return Ok(existing);
                        }
                        // A name collision: a new name from a bigger count, kept in the status.
                        cc += 1;
                        write_collision_count(set, ctx, cc).await?;
                        rev = reconcile::new_revision(set, rev.revision, cc);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
}

async fn write_collision_count(set: &StatefulSet, ctx: &Ctx, cc: i32) -> Result<(), SyncError> {
    let api: kube::Api<StatefulSet> = kube::Api::namespaced(
        ctx.client.clone(),
        set.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"status": {"collisionCount": cc}});
    api.patch_status(
        set.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Runs the steps: one after another (stopping at the first failure), or, for `Parallel`, the
/// claim work first and then pod creations and deletions in batches of 1, 2, 4, ...
async fn run_steps(
    ctx: &Ctx,
    ns: &str,
    set: &str,
    involved: &Involved,
    steps: &[Step],
    parallel: bool,
) -> Result<(), SyncError> {
    if !parallel {
        for s in steps {
            run_step(ctx, ns, set, involved, s).await?;
        }
        return Ok(());
    }
    let (first, second): (Vec<&Step>, Vec<&Step>) = steps
        .iter()
        .partition(|s| !matches!(s, Step::CreatePod(_) | Step::DeletePod { .. }));
    for wave in [first, second] {
        let mut rest = wave.as_slice();
        let mut batch = 1usize;
        while !rest.is_empty() {
            let n = batch.min(rest.len());
            let (now, later) = rest.split_at(n);
            let results =
                futures::future::join_all(now.iter().map(|s| run_step(ctx, ns, set, involved, s))).await;
            if let Some(e) = results.into_iter().find_map(Result::err) {
                return Err(e);
            }
            rest = later;
            batch = batch.saturating_mul(2).min(500);
        }
    }
    Ok(())
}

async fn run_step(ctx: &Ctx, ns: &str, set: &str, involved: &Involved, step: &Step) -> Result<(), SyncError> {
    let pods: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), ns);
    let pvcs: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(ctx.client.clone(), ns);
    let event = |kind: Kind, reason: &'static str, action: &'static str, message: String| async move {
        ctx.recorder
            .record(involved, kind, reason, action, &message)
            .await;
    };
    match step {
        Step::CreateClaim { claim, pod } => {
            let c = claim.metadata.name.clone().unwrap_or_default();
            match pvcs.create(&PostParams::default(), &**claim).await {
                Ok(_) => {
                    event(
                        Kind::Normal,
                        "SuccessfulCreate",
                        "Create",
                        format!("create Claim {c} Pod {pod} in StatefulSet {set} success"),
                    )
                    .await;
                }
                Err(e) if api_code(&e) == Some(409) => {}
                Err(e) => {
                    let m = super::slowstart::api_message(&e);
                    event(
                        Kind::Warning,
                        "FailedCreate",
                        "Create",
                        format!("create Claim {c} for Pod {pod} in StatefulSet {set} failed error: {m}"),
                    )
                    .await;
                    let m = format!("failed to create PVC {c}: {m}");
                    event(
                        Kind::Warning,
                        "FailedCreate",
                        "Create",
                        format!("create Pod {pod} in StatefulSet {set} failed error: {m}"),
                    )
                    .await;
                    return Err(SyncError::Step(m));
                }
            }
        }
        Step::CreatePod(p) => {
            let pod = p.metadata.name.clone().unwrap_or_default();
            match pods.create(&PostParams::default(), &**p).await {
                Ok(_) => {
                    event(
                        Kind::Normal,
                        "SuccessfulCreate",
                        "Create",
                        format!("create Pod {pod} in StatefulSet {set} successful"),
                    )
                    .await;
                }
                Err(e) if api_code(&e) == Some(409) => {}
                Err(e) => {
                    let m = super::slowstart::api_message(&e);
                    event(
                        Kind::Warning,
                        "FailedCreate",
                        "Create",
                        format!("create Pod {pod} in StatefulSet {set} failed error: {m}"),
                    )
                    .await;
                    return Err(SyncError::Step(m));
                }
            }
        }
        Step::DeletePod { name, uid } => {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match pods.delete(name, &dp).await {
                Ok(_) => {
                    event(
                        Kind::Normal,
                        "SuccessfulDelete",
                        "Delete",
                        format!("delete Pod {name} in StatefulSet {set} successful"),
                    )
                    .await;
                }
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => {
                    let m = super::slowstart::api_message(&e);
                    event(
                        Kind::Warning,
                        "FailedDelete",
                        "Delete",
                        format!("delete Pod {name} in StatefulSet {set} failed error: {m}"),
                    )
                    .await;
                    return Err(SyncError::Step(m));
                }
            }
        }
        Step::PatchPodLabels { name, uid, labels } => {
            let patch = json!({"metadata": {"labels": labels, "uid": uid}});
            match pods
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    event(
                        Kind::Normal,
                        "SuccessfulUpdate",
                        "Update",
                        format!("update Pod {name} in StatefulSet {set} successful"),
                    )
                    .await;
                }
                Err(e) if matches!(api_code(&e), Some(404 | 409)) => {}
                Err(e) => {
                    let m = super::slowstart::api_message(&e);
                    event(
                        Kind::Warning,
                        "FailedUpdate",
                        "Update",
                        format!("update Pod {name} in StatefulSet {set} failed error: {m}"),
                    )
                    .await;
                    return Err(SyncError::Step(m));
                }
            }
        }
        Step::SetClaimOwners { claim, owners } => {
            let patch = json!({"metadata": {"ownerReferences": owners}});
            match pvcs
                .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if api_code(&e) == Some(404) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

async fn write_status(set: &StatefulSet, ctx: &Ctx, status: StatefulSetStatus) -> Result<(), SyncError> {
    let cur = set.status.clone().unwrap_or_default();
    let same = cur.replicas == status.replicas
        && cur.ready_replicas.unwrap_or(0) == status.ready_replicas.unwrap_or(0)
        && cur.available_replicas.unwrap_or(0) == status.available_replicas.unwrap_or(0)
        && cur.current_replicas.unwrap_or(0) == status.current_replicas.unwrap_or(0)
        && cur.updated_replicas.unwrap_or(0) == status.updated_replicas.unwrap_or(0)
        && cur.current_revision == status.current_revision
        && cur.update_revision == status.update_revision
        && cur.observed_generation == status.observed_generation
        && cur.collision_count.unwrap_or(0) == status.collision_count.unwrap_or(0);
    if same {
        return Ok(());
    }
    let api: kube::Api<StatefulSet> = kube::Api::namespaced(
        ctx.client.clone(),
        set.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"status": {
        "replicas": status.replicas,
        "readyReplicas": status.ready_replicas,
        "availableReplicas": status.available_replicas,
        "currentReplicas": status.current_replicas,
        "updatedReplicas": status.updated_replicas,
        "currentRevision": status.current_revision,
        "updateRevision": status.update_revision,
        "observedGeneration": status.observed_generation,
        "collisionCount": status.collision_count,
    }});
    match api
        .patch_status(
            set.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if api_code(&e) == Some(404) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
