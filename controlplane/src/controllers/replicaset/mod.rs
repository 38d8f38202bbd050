//! The ReplicaSet controller (`replicaset-controller`): keeps `spec.replicas` pods from the
//! template running, owned through controller references; adopts matching orphans and releases
//! pods whose labels no longer match; deletes surplus pods in upstream's victim order; reports
//! status; never over-creates on a slow cache (expectations).

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kcore::labels::{labels_of, selector_matches};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::expectations::Expectations;
use super::podutil::{controller_owner, is_active, is_ready, pod_from_template};
use super::slowstart::Creator;
use super::{Failures, Manager, Running, controller_ref, retry_after_failure, run_sync};
use crate::events::{Involved, Kind, Recorder};

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "replicaset-controller";

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
}

pub(crate) struct Ctx {
    client: kube::Client,
    pods: Store<Pod>,
    recorder: Arc<Recorder>,
    expectations: Expectations,
    failures: Failures,
}

/// The controller, subscribed to the shared ReplicaSet and Pod informers.
pub fn controller(mgr: &Manager) -> Running {
    let sets = mgr.informers.get::<ReplicaSet>();
    let pods = mgr.informers.get::<Pod>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        pods: pods.reader(),
        recorder: mgr.recorder(COMPONENT),
        expectations: Expectations::default(),
        failures: Failures::default(),
    });
    // A deleted pod, or an orphan a set may adopt, brings its set(s) back.
    let deleted = pods
        .deletions()
        .filter_map(|p| futures::future::ready(controller_ref::<ReplicaSet, _>(&*p)));
    let set_reader = sets.reader();
    let orphans = pods.subscribe().flat_map(move |p| {
        let refs: Vec<ObjectRef<ReplicaSet>> = if p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true))
        {
            Vec::new()
        } else {
            matching_sets(&set_reader, &p)
        };
        futures::stream::iter(refs)
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

fn matching_sets(sets: &Store<ReplicaSet>, pod: &Pod) -> Vec<ObjectRef<ReplicaSet>> {
    let labels = labels_of(&pod.metadata.labels);
    sets.state()
        .iter()
        .filter(|rs| rs.metadata.namespace == pod.metadata.namespace)
        .filter(|rs| {
            rs.spec
                .as_ref()
                .is_some_and(|s| selector_matches(&s.selector, labels))
        })
        .map(|rs| ObjectRef::from_obj(&**rs))
        .collect()
}

fn error_policy(rs: Arc<ReplicaSet>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    retry_after_failure(&ctx.failures, "replicaset", &*rs, err)
}

async fn reconcile_one(rs: Arc<ReplicaSet>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    // Nothing is decided on a cache that has not listed yet (a restart would over-create).
    super::informer::synced(&ctx.pods).await;
    run_sync(&ctx.failures, "replicaset", &*rs, sync(&rs, &ctx)).await
}

async fn sync(rs: &ReplicaSet, ctx: &Ctx) -> Result<Action, SyncError> {
    let ns = rs.metadata.namespace.clone().unwrap_or_default();
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
        .collect();
    let names: HashSet<&str> = pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
    let active: HashSet<&str> = pods
        .iter()
        .filter(|p| is_active(p))
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    let outstanding = ctx.expectations.outstanding(&uid, &names, &active);
    let plan = reconcile::plan(rs, &pods, &outstanding, Utc::now());
    let pod_api: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let owner = controller_owner("apps/v1", "ReplicaSet", &rs.metadata);
    for p in &plan.adopt {
        let patch = json!({"metadata": {"ownerReferences": [owner], "uid": p.metadata.uid}});
        patch_pod(&pod_api, p, &patch).await?;
    }
    for p in &plan.release {
        let patch = json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": uid}], "uid": p.metadata.uid}});
        patch_pod(&pod_api, p, &patch).await?;
    }
    let involved = Involved::of(rs);
    let mut failure: Option<(&str, String)> = None;
    if plan.create > 0 {
        let template = rs
            .spec
            .as_ref()
            .and_then(|s| s.template.clone())
            .unwrap_or_default();
        let prefix = format!("{}-", rs.metadata.name.as_deref().unwrap_or_default());
        let pod = pod_from_template(&template, &ns, &prefix, owner.clone());
        let creator = Creator {
            api: &pod_api,
            owner_uid: &uid,
            expectations: &ctx.expectations,
            recorder: &ctx.recorder,
            involved: &involved,
        };
        if let Err(e) = creator.create(vec![pod; plan.create]).await {
            failure = Some(("FailedCreate", e.to_string()));
        }
    }
    for victim in &plan.delete {
        let name = victim.metadata.name.clone().unwrap_or_default();
        let vuid = victim.metadata.uid.clone().unwrap_or_default();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(vuid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        ctx.expectations.deleted(&uid, &vuid);
        match pod_api.delete(&name, &dp).await {
            Ok(_) => {
                ctx.recorder
                    .record(
                        &involved,
                        Kind::Normal,
                        "SuccessfulDelete",
                        "Delete",
                        &format!("Deleted pod: {name}"),
                    )
                    .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                ctx.expectations.delete_failed(&uid, &vuid);
                let msg = format!("Error deleting: {e}");
                ctx.recorder
                    .record(&involved, Kind::Warning, "FailedDelete", "Delete", &msg)
                    .await;
                failure = Some(("FailedDelete", msg));
            }
        }
    }
    write_status(rs, ctx, plan.status, failure).await?;
    // Pods that are ready but not yet available become so after minReadySeconds.
    let min_ready = rs.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let waiting = min_ready > 0
        && pods
            .iter()
            .any(|p| reconcile::controlled_by(p, &uid) && is_active(p) && is_ready(p));
    Ok(if waiting {
        Action::requeue(Duration::from_secs(u64::try_from(min_ready).unwrap_or(0) + 1))
    } else {
        Action::requeue(Duration::from_secs(600))
    })
}

async fn patch_pod(api: &kube::Api<Pod>, p: &Pod, patch: &serde_json::Value) -> Result<(), SyncError> {
    let name = p.metadata.name.clone().unwrap_or_default();
    match api
        .patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone, or changed meanwhile: the next sync sees it again.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn write_status(
    rs: &ReplicaSet,
    ctx: &Ctx,
    mut status: k8s_openapi::api::apps::v1::ReplicaSetStatus,
    failure: Option<(&str, String)>,
) -> Result<(), SyncError> {
    let mut conditions: Vec<_> = status
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != "ReplicaFailure")
        .collect();
    if let Some((reason, message)) = failure {
        conditions.push(k8s_openapi::api::apps::v1::ReplicaSetCondition {
            type_: "ReplicaFailure".into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Utc::now())),
        });
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
    let current = rs.status.clone().unwrap_or_default();
    let same = current.replicas == status.replicas
        && current.fully_labeled_replicas.unwrap_or(0) == status.fully_labeled_replicas.unwrap_or(0)
        && current.ready_replicas.unwrap_or(0) == status.ready_replicas.unwrap_or(0)
        && current.available_replicas.unwrap_or(0) == status.available_replicas.unwrap_or(0)
        && current.observed_generation == status.observed_generation
        && current
            .conditions
            .as_ref()
            .map(|c| c.iter().map(|c| (&c.type_, &c.reason)).collect::<Vec<_>>())
            == status
                .conditions
                .as_ref()
                .map(|c| c.iter().map(|c| (&c.type_, &c.reason)).collect::<Vec<_>>());
    if same {
        return Ok(());
    }
    let api: kube::Api<ReplicaSet> = kube::Api::namespaced(
        ctx.client.clone(),
        rs.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"status": {
        "replicas": status.replicas,
        "fullyLabeledReplicas": status.fully_labeled_replicas,
        "readyReplicas": status.ready_replicas,
        "availableReplicas": status.available_replicas,
        "observedGeneration": status.observed_generation,
        "conditions": status.conditions,
    }});
    match api
        .patch_status(
            rs.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
