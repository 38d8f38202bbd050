//! The DaemonSet controller (`daemonset-controller`): one pod per eligible node, created with a
//! node-name affinity for the scheduler to place; pods on nodes that no longer fit deleted;
//! rolling updates with maxUnavailable/maxSurge, or OnDelete; history in ControllerRevisions.
//! The decisions are in `reconcile`; this module reads the caches, writes to the API and records
//! upstream's events.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use kcore::labels::{labels_of, selector_matches};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::expectations::Expectations;
use super::index::OwnerIndex;
use super::podutil::{controller_owner, is_active};
use super::slowstart::Creator;
use super::{Failures, Manager, Running, controller_ref, retry_after_failure, run_sync};
use crate::events::{Involved, Kind, Recorder};

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "daemonset-controller";
/// Back-off before deleting another failed daemon pod on the same node: 1 s doubling to 15 min.
const FAILED_POD_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(900));

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// Pods could not be created or deleted (events say why).
    #[error("{0}")]
    Pods(String),
    #[error("hash collision creating the ControllerRevision {0}")]
    Collision(String),
}

pub(crate) struct Ctx {
    client: kube::Client,
    nodes: Store<Node>,
    pods: Arc<OwnerIndex<Pod>>,
    revisions: Arc<OwnerIndex<ControllerRevision>>,
    recorder: Arc<Recorder>,
    expectations: Expectations,
    failures: Failures,
    /// `ds/node` → (when the last failed pod was deleted, the current back-off).
    failed_backoff: Mutex<HashMap<String, (Instant, Duration)>>,
}

/// What about a node can change which daemon pods it should run.
fn node_fingerprint(n: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    n.metadata.labels.hash(&mut h);
    if let Some(s) = &n.spec {
        s.unschedulable.hash(&mut h);
        serde_json::to_string(&s.taints).unwrap_or_default().hash(&mut h);
    }
    for c in n.status.iter().flat_map(|s| s.conditions.iter().flatten()) {
        (&c.type_, &c.status).hash(&mut h);
    }
    h.finish()
}

/// The controller, subscribed to the shared DaemonSet, Pod, Node and ControllerRevision
/// informers.
pub fn controller(mgr: &Manager) -> Running {
    let sets = mgr.informers.get::<DaemonSet>();
    let pods = mgr.informers.get::<Pod>();
    let nodes = mgr.informers.get::<Node>();
    let revisions = mgr.informers.get::<ControllerRevision>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        nodes: nodes.reader(),
        pods: OwnerIndex::by_controller(&pods),
        revisions: OwnerIndex::by_controller(&revisions),
        recorder: mgr.recorder(COMPONENT),
        expectations: Expectations::default(),
        failures: Failures::default(),
        failed_backoff: Mutex::new(HashMap::new()),
    });
    let deleted = pods
        .deletions()
        .filter_map(|p| futures::future::ready(controller_ref::<DaemonSet, _>(&*p)));
    let set_reader = sets.reader();
    let orphans = pods.subscribe().flat_map(move |p| {
        let has_controller = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true));
        let refs: Vec<ObjectRef<DaemonSet>> = if has_controller {
            Vec::new()
        } else {
            let labels = labels_of(&p.metadata.labels);
            set_reader
                .state()
                .iter()
                .filter(|ds| ds.metadata.namespace == p.metadata.namespace)
                .filter(|ds| {
                    ds.spec
                        .as_ref()
                        .is_some_and(|s| selector_matches(&s.selector, labels))
                })
                .map(|ds| ObjectRef::from_obj(&**ds))
                .collect()
        };
        futures::stream::iter(refs)
    });
    // A node added, removed, relabelled, (un)tainted or changing condition: every set looks
    // again. Heartbeats and other status changes are ignored.
    let seen: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let forget = seen.clone();
    let all_sets = sets.reader();
    let changed_nodes = nodes.subscribe().filter_map(move |n| {
        let name = n.metadata.name.clone().unwrap_or_default();
        let fp = node_fingerprint(&n);
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        let changed = seen.insert(name, fp) != Some(fp);
        futures::future::ready(changed.then_some(()))
    });
    let removed_nodes = nodes.deletions().map(move |n| {
        if let Some(name) = n.metadata.name.as_deref() {
            forget.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        }
    });
    let node_events = futures::stream::select(changed_nodes, removed_nodes).flat_map(move |()| {
        let refs: Vec<ObjectRef<DaemonSet>> = all_sets
            .state()
            .iter()
            .map(|ds| ObjectRef::from_obj(&**ds))
            .collect();
        futures::stream::iter(refs)
    });
    let ctl = Controller::for_shared_stream(sets.subscribe(), sets.reader())
        .owns_shared_stream(pods.subscribe())
        .reconcile_on(deleted)
        .reconcile_on(orphans)
        .reconcile_on(node_events)
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(ds: Arc<DaemonSet>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    retry_after_failure(&ctx.failures, "daemonset", &*ds, err)
}

async fn reconcile_one(ds: Arc<DaemonSet>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    // Nothing is decided on a cache that has not listed yet (a restart would over-create).
    super::informer::synced(&ctx.nodes).await;
    ctx.pods.synced().await;
    ctx.revisions.synced().await;
    run_sync(&ctx.failures, "daemonset", &*ds, sync(&ds, &ctx)).await
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

async fn sync(ds: &DaemonSet, ctx: &Ctx) -> Result<Action, SyncError> {
    let idle = Action::requeue(Duration::from_secs(600));
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(idle);
    }
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let involved = Involved::of(ds);
    let selector = ds.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|m| m.is_empty())
    {
        ctx.recorder
            .record(
                &involved,
                Kind::Warning,
                "SelectingAll",
                "Sync",
                "This daemon set is selecting all pods. A non-empty selector is required.",
            )
            .await;
        return Ok(idle);
    }
    let pod_api: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let owner = controller_owner("apps/v1", "DaemonSet", &ds.metadata);
    // Pods: keep, adopt, release.
    let mut pods = Vec::new();
    for p in ctx.pods.owned_by(&uid) {
        if selector_matches(&selector, labels_of(&p.metadata.labels)) {
            pods.push(p);
        } else {
            let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": p.metadata.uid}});
            patch_pod(&pod_api, &p, &patch).await?;
        }
    }
    for p in ctx.pods.orphans(&ns) {
        if is_active(&p) && selector_matches(&selector, labels_of(&p.metadata.labels)) {
            let patch = json!({"metadata": {"ownerReferences": [owner], "uid": p.metadata.uid}});
            patch_pod(&pod_api, &p, &patch).await?;
            pods.push(p);
        }
    }
    // History.
    let (hash, old) = history(ds, ctx).await?;
    // Expectations of earlier creations and deletions.
    let names: HashSet<&str> = pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
    let active: HashSet<&str> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let outstanding = ctx.expectations.outstanding(&uid, &names, &active);
    let settled = outstanding.creates == 0 && outstanding.deletes.is_empty();
    let nodes = ctx.nodes.state();
    let plan = reconcile::plan(ds, &hash, &nodes, &pods, settled, Utc::now());
    // Failed pods, at most one per node per back-off period.
    let mut delete = plan.delete.clone();
    let mut next_failed_check: Option<Duration> = None;
    for (node, p) in &plan.failed {
        let key = format!("{ns}/{name}/{node}");
        let wait = {
            let mut b = ctx.failed_backoff.lock().unwrap_or_else(|p| p.into_inner());
            match b.get(&key) {
                Some((at, d)) if at.elapsed() < *d => Some(*d - at.elapsed()),
                other => {
                    let d = other.map_or(FAILED_POD_BACKOFF.0, |(_, d)| (*d * 2).min(FAILED_POD_BACKOFF.1));
                    b.insert(key, (Instant::now(), d));
                    None
                }
            }
        };
        if let Some(w) = wait {
            next_failed_check = Some(next_failed_check.map_or(w, |x| x.min(w)));
            continue;
        }
        let msg = format!(
            "Found failed daemon pod {ns}/{} on node {node}, will try to kill it",
            p.metadata.name.as_deref().unwrap_or_default()
        );
        ctx.recorder
            .record(&involved, Kind::Warning, "FailedDaemonPod", "Sync", &msg)
            .await;
        delete.push(p.clone());
    }
    let mut failure = None;
    let creator = Creator {
        api: &pod_api,
        owner_uid: &uid,
        expectations: &ctx.expectations,
        recorder: &ctx.recorder,
        involved: &involved,
    };
    let new_pods = plan
        .create_on
        .iter()
        .map(|node| reconcile::new_pod(ds, &hash, node))
        .collect();
    if let Err(e) = creator.create(new_pods).await {
        failure = Some(e.to_string());
    }
    for victim in &delete {
        if let Err(e) = delete_pod(ctx, &pod_api, &uid, victim, &involved).await {
            failure.get_or_insert(e);
        }
    }
    write_status(ds, ctx, &plan.status).await?;
    // Old revisions beyond the limit.
    let rev_api: kube::Api<ControllerRevision> = kube::Api::namespaced(ctx.client.clone(), &ns);
    for r in reconcile::surplus_revisions(ds, &old, &pods) {
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
    if let Some(e) = failure {
        return Err(SyncError::Pods(e));
    }
    let min_ready = ds.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let mut after = Duration::from_secs(600);
    if plan.wait_min_ready && min_ready > 0 {
        after = after.min(Duration::from_secs(u64::try_from(min_ready).unwrap_or(0) + 1));
    }
    if let Some(w) = next_failed_check {
        after = after.min(w + Duration::from_millis(10));
    }
    Ok(Action::requeue(after))
}

async fn patch_pod(api: &kube::Api<Pod>, p: &Pod, patch: &serde_json::Value) -> Result<(), SyncError> {
    let name = p.metadata.name.clone().unwrap_or_default();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The set's revisions put in order (adopting orphans, creating or renumbering the current
/// one, removing its duplicates); returns the current template hash and the old revisions.
async fn history(ds: &DaemonSet, ctx: &Ctx) -> Result<(String, Vec<Arc<ControllerRevision>>), SyncError> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let selector = ds.spec.as_ref().map(|s| s.selector.clone()).unwrap_or_default();
    let api: kube::Api<ControllerRevision> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let owner = controller_owner("apps/v1", "DaemonSet", &ds.metadata);
    let mut revs = ctx.revisions.owned_by(&uid);
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
    super::history::sort(&mut revs);
    let plan = reconcile::history_plan(ds, &revs);
    for d in &plan.duplicates {
        match api
            .delete(
                d.metadata.name.as_deref().unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let current = match plan.current {
        Ok((r, None)) => r,
        Ok((r, Some(n))) => Arc::new(
            api.patch(
                r.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"revision": n})),
            )
            .await?,
        ),
        Err(new) => match api.create(&PostParams::default(), &new).await {
            Ok(created) => Arc::new(created),
            Err(e) if api_code(&e) == Some(409) => {
                let name = new.metadata.name.clone().unwrap_or_default();
                let existing = api.get(&name).await?;
                let data = super::history::template_patch(&ds.spec.clone().unwrap_or_default().template);
                let mine = existing
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid);
                if !(mine && super::history::same_data(&existing, &data)) {
                    // A name collision: the next try hashes with a bigger count.
                    let cc = ds.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0) + 1;
                    let sets: kube::Api<DaemonSet> = kube::Api::namespaced(ctx.client.clone(), &ns);
                    sets.patch_status(
                        ds.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": {"collisionCount": cc}})),
                    )
                    .await?;
                    return Err(SyncError::Collision(name));
                }
                Arc::new(existing)
            }
            Err(e) => return Err(e.into()),
        },
    };
    Ok((reconcile::revision_hash(&current), plan.old))
}

async fn delete_pod(
    ctx: &Ctx,
    api: &kube::Api<Pod>,
    owner: &str,
    victim: &Pod,
    involved: &Involved,
) -> Result<(), String> {
    let name = victim.metadata.name.clone().unwrap_or_default();
    let vuid = victim.metadata.uid.clone().unwrap_or_default();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(vuid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    ctx.expectations.deleted(owner, &vuid);
    match api.delete(&name, &dp).await {
        Ok(_) => {
            ctx.recorder
                .record(
                    involved,
                    Kind::Normal,
                    "SuccessfulDelete",
                    "Delete",
                    &format!("Deleted pod: {name}"),
                )
                .await;
            Ok(())
        }
        Err(e) if api_code(&e) == Some(404) => Ok(()),
        // 409: the uid precondition failed, the pod was replaced; the old one is gone.
        Err(e) if api_code(&e) == Some(409) => {
            ctx.expectations.delete_failed(owner, &vuid);
            Ok(())
        }
        Err(e) => {
            ctx.expectations.delete_failed(owner, &vuid);
            let msg = format!("Error deleting: {}", super::slowstart::api_message(&e));
            ctx.recorder
                .record(involved, Kind::Warning, "FailedDelete", "Delete", &msg)
                .await;
            Err(msg)
        }
    }
}

async fn write_status(ds: &DaemonSet, ctx: &Ctx, status: &DaemonSetStatus) -> Result<(), SyncError> {
    let cur = ds.status.clone().unwrap_or_default();
    let same = cur.desired_number_scheduled == status.desired_number_scheduled
        && cur.current_number_scheduled == status.current_number_scheduled
        && cur.number_misscheduled == status.number_misscheduled
        && cur.number_ready == status.number_ready
        && cur.updated_number_scheduled.unwrap_or(0) == status.updated_number_scheduled.unwrap_or(0)
        && cur.number_available.unwrap_or(0) == status.number_available.unwrap_or(0)
        && cur.number_unavailable.unwrap_or(0) == status.number_unavailable.unwrap_or(0)
        && cur.observed_generation == status.observed_generation;
    if same {
        return Ok(());
    }
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(
        ctx.client.clone(),
        ds.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"status": {
        "desiredNumberScheduled": status.desired_number_scheduled,
        "currentNumberScheduled": status.current_number_scheduled,
        "numberMisscheduled": status.number_misscheduled,
        "numberReady": status.number_ready,
        "updatedNumberScheduled": status.updated_number_scheduled,
        "numberAvailable": status.number_available,
        "numberUnavailable": status.number_unavailable,
        "observedGeneration": status.observed_generation,
    }});
    match api
        .patch_status(
            ds.metadata.name.as_deref().unwrap_or_default(),
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
