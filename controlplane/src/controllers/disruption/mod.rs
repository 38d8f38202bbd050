//! The disruption controller (`disruption-controller`; its events come from upstream's
//! `controllermanager` source): keeps every PodDisruptionBudget's status current from the pods
//! it selects and their controllers' scale, so the eviction API can decide from it; expires
//! `disruptedPods` entries after two minutes; and clears `DisruptionTarget` conditions left on
//! pods that were not deleted after all.
//!
//! Two kube-runtime `Controller`s: one over budgets (brought back by the changes and deletions
//! of the pods they select, and at the next `disruptedPods` expiry), one over pods that carry
//! a `DisruptionTarget` condition.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};

use super::{Failures, Manager, Running, key_of};
use crate::events::{Involved, Kind, Recorder};
use reconcile::{
    PdbError, Scale, controller_of, current_healthy, disrupted_pods, expected_pods, fail_safe_status,
    go_selector, next_status, selects, stale_disruption_in,
};

/// Upstream's event source for the disruption controller's events.
pub const COMPONENT: &str = "controllermanager";

/// Errors of one budget's sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Pdb(#[from] PdbError),
}

struct Ctx {
    client: kube::Client,
    pods: Store<Pod>,
    replicasets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    statefulsets: Store<StatefulSet>,
    recorder: Arc<Recorder>,
    /// Kinds resolved through discovery for the scale subresource, with whether they have one.
    kinds: Mutex<HashMap<GroupVersionKind, (ApiResource, bool)>>,
    failures: Failures,
}

/// The controller.
pub fn controller(mgr: &Manager) -> Running {
    let pdbs = mgr.informers.get::<PodDisruptionBudget>();
    let pods = mgr.informers.get::<Pod>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        pods: pods.reader(),
        replicasets: mgr.informers.get::<ReplicaSet>().reader(),
        deployments: mgr.informers.get::<Deployment>().reader(),
        statefulsets: mgr.informers.get::<StatefulSet>().reader(),
        recorder: mgr.recorder(COMPONENT),
        kinds: Mutex::new(HashMap::new()),
        failures: Failures::default(),
    });
    let (changed_reader, deleted_reader) = (pdbs.reader(), pdbs.reader());
    let recorder = ctx.recorder.clone();
    let changed = pods.subscribe().flat_map(move |p| {
        let refs = budgets_of(&changed_reader, &p);
        if refs.len() > 1 {
            multiple_budgets_event(&recorder, &p, &refs);
        }
        futures::stream::iter(refs)
    });
    let deleted = pods
        .deletions()
        .flat_map(move |p| futures::stream::iter(budgets_of(&deleted_reader, &p)));
    let budgets = Controller::for_shared_stream(pdbs.subscribe(), pdbs.reader())
        .reconcile_on(changed)
        .reconcile_on(deleted)
        .with_config(mgr.controller_config())
        .run(reconcile_pdb, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let marked = pods
        .subscribe()
        .filter(|p| futures::future::ready(stale_disruption_in(p, Utc::now()).is_some()));
    let stale = Controller::for_shared_stream(marked, pods.reader())
        .with_config(mgr.controller_config())
        .run(reconcile_stale, stale_error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(async move {
        futures::future::join(budgets, stale).await;
    })
}

/// The budgets that select `pod`.
fn budgets_of(pdbs: &Store<PodDisruptionBudget>, pod: &Pod) -> Vec<ObjectRef<PodDisruptionBudget>> {
    let mut refs: Vec<ObjectRef<PodDisruptionBudget>> = pdbs
        .state()
        .iter()
        .filter(|b| selects(b, pod))
        .map(|b| ObjectRef::from_obj(&**b))
        .collect();
    refs.sort_by(|a, b| a.name.cmp(&b.name));
    refs
}

fn multiple_budgets_event(recorder: &Arc<Recorder>, pod: &Pod, refs: &[ObjectRef<PodDisruptionBudget>]) {
    let msg = format!(
        "Pod {:?}/{:?} matches multiple PodDisruptionBudgets.  Chose {:?} arbitrarily.",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        refs.first().map(|r| r.name.as_str()).unwrap_or_default()
    );
    let recorder = recorder.clone();
    let involved = Involved::of(pod);
    tokio::spawn(async move {
        recorder
            .record(&involved, Kind::Warning, "MultiplePodDisruptionBudgets", "", &msg)
            .await;
    });
}

fn error_policy(pdb: Arc<PodDisruptionBudget>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&key_of(&*pdb));
    tracing::warn!(pdb = %key_of(&*pdb), error = %err, retry_in = ?delay, "PodDisruptionBudget sync failed");
    Action::requeue(delay)
}

fn stale_error_policy(pod: Arc<Pod>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&format!("pod/{}", key_of(&*pod)));
    tracing::warn!(pod = %key_of(&*pod), error = %err, retry_in = ?delay, "DisruptionTarget not cleared");
    Action::requeue(delay)
}

async fn record(ctx: &Ctx, involved: &Involved, kind: Kind, reason: &str, message: &str) {
    ctx.recorder.record(involved, kind, reason, "", message).await;
}

async fn reconcile_pdb(pdb: Arc<PodDisruptionBudget>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    // The budget cache is ready (the controller waits for it); the others may not be yet.
    super::informer::synced(&ctx.pods).await;
    super::informer::synced(&ctx.replicasets).await;
    super::informer::synced(&ctx.deployments).await;
    super::informer::synced(&ctx.statefulsets).await;
    let key = key_of(&*pdb);
    let action = match sync(&pdb, &ctx).await {
        Ok(a) => a,
        Err(SyncError::Api(kube::Error::Api(s))) if s.code == 409 => {
            return Err(SyncError::Api(kube::Error::Api(s)));
        }
        Err(e) => {
            tracing::warn!(pdb = %key, error = %e, "PodDisruptionBudget sync failed: no disruption allowed");
            let status = fail_safe_status(&pdb, &e.to_string(), Utc::now());
            write_status(&ctx, &pdb, &status).await?;
            Action::await_change()
        }
    };
    ctx.failures.reset(&key);
    Ok(action)
}

/// Upstream's `trySync`.
async fn sync(pdb: &PodDisruptionBudget, ctx: &Ctx) -> Result<Action, SyncError> {
    let involved = Involved::of(pdb);
    let ns = pdb.metadata.namespace.clone().unwrap_or_default();
    let pods: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()) && selects(pdb, p))
        .collect();
    if pods.is_empty() {
        record(ctx, &involved, Kind::Normal, "NoPods", "No matching pods found").await;
    }
    let scales = resolve_scales(ctx, &pods, &ns).await;
    let expected = match expected_pods(pdb, &pods, &scales) {
        Ok(e) => e,
        Err(e) => {
            record(
                ctx,
                &involved,
                Kind::Warning,
                "CalculateExpectedPodCountFailed",
                &format!("Failed to calculate the number of expected pods: {e}"),
            )
            .await;
            return Err(e.into());
        }
    };
    if !expected.unmanaged.is_empty() {
        tracing::debug!(pdb = %key_of(pdb), pods = ?expected.unmanaged, "unmanaged pods");
        let selector = go_selector(pdb.spec.as_ref().and_then(|s| s.selector.as_ref()));
        record(
            ctx,
            &involved,
            Kind::Warning,
            "UnmanagedPods",
            &format!(
                "Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. \
                 As a result, the status of the PDB cannot be calculated correctly, which may result in \
                 undefined behavior. To account for these pods please set \".spec.minAvailable\" field of \
                 the PDB to an integer value."
            ),
        )
        .await;
    }
    let now = Utc::now();
    let (disrupted, recheck, not_deleted) = disrupted_pods(pdb, &pods, now);
    for p in &not_deleted {
        // Upstream's text names the budget's namespace twice.
        record(
            ctx,
            &Involved::of(&**p),
            Kind::Warning,
            "NotDeleted",
            &format!("Pod was expected by PDB {ns}/{ns} to be deleted but it wasn't"),
        )
        .await;
    }
    let current = current_healthy(&pods, &disrupted, now);
    if let Some(status) = next_status(pdb, current, expected.desired, expected.expected, disrupted, now) {
        write_status(ctx, pdb, &status).await?;
    }
    Ok(match recheck {
        Some(at) => {
            Action::requeue((at - now).to_std().unwrap_or(Duration::ZERO) + Duration::from_millis(100))
        }
        None => Action::await_change(),
    })
}

/// Writes a budget's status with its resourceVersion as precondition (a conflict with an
/// eviction that charged the budget meanwhile makes the sync run again).
async fn write_status(
    ctx: &Ctx,
    pdb: &PodDisruptionBudget,
    status: &PodDisruptionBudgetStatus,
) -> Result<(), kube::Error> {
    let mut body = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    // A merge patch merges maps: entries that went must be nulled.
    let mut disrupted: serde_json::Map<String, Value> = status
        .disrupted_pods
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    for old in pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        disrupted.entry(old.clone()).or_insert(Value::Null);
    }
    body["disruptedPods"] = Value::Object(disrupted);
    let patch = json!({"metadata": {"resourceVersion": pdb.metadata.resource_version}, "status": body});
    let api: kube::Api<PodDisruptionBudget> = kube::Api::namespaced(
        ctx.client.clone(),
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
    );
    match api
        .patch_status(
            pdb.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The scale of each controller the pods name (upstream's finders: a ReplicaSet's
/// Deployment, a ReplicaSet, a StatefulSet from the caches; anything else, e.g. a
/// ReplicationController, through its scale subresource).
async fn resolve_scales(ctx: &Ctx, pods: &[Arc<Pod>], ns: &str) -> HashMap<String, Scale> {
    let mut out = HashMap::new();
    for p in pods {
        let Some(r) = controller_of(p) else { continue };
        if out.contains_key(&r.uid) {
            continue;
        }
        let scale = match find_cached(ctx, r, ns) {
            Some(s) => s,
            None => scale_subresource(ctx, r, ns).await,
        };
        out.insert(r.uid.clone(), scale);
    }
    out
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

fn find_cached(ctx: &Ctx, r: &OwnerReference, ns: &str) -> Option<Scale> {
    let group = group_of(&r.api_version);
    match (r.kind.as_str(), group) {
        ("ReplicaSet", "apps" | "extensions") => {
            let rs = ctx
                .replicasets
                .get(&ObjectRef::new(&r.name).within(ns))
                .filter(|rs| rs.metadata.uid.as_deref() == Some(r.uid.as_str()))?;
            match controller_of_meta(&rs.metadata) {
                Some(d)
                    if d.kind == "Deployment"
                        && matches!(group_of(&d.api_version), "apps" | "extensions") =>
                {
                    let dep = ctx
                        .deployments
                        .get(&ObjectRef::new(&d.name).within(ns))
                        .filter(|dep| dep.metadata.uid.as_deref() == Some(d.uid.as_str()))?;
                    Some(Scale::Found {
                        uid: d.uid.clone(),
                        replicas: dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                    })
                }
                Some(d) if d.kind == "Deployment" => None,
                _ => Some(Scale::Found {
                    uid: r.uid.clone(),
                    replicas: rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                }),
            }
        }
        ("StatefulSet", "apps") => {
            let ss = ctx
                .statefulsets
                .get(&ObjectRef::new(&r.name).within(ns))
                .filter(|ss| ss.metadata.uid.as_deref() == Some(r.uid.as_str()))?;
            Some(Scale::Found {
                uid: r.uid.clone(),
                replicas: ss.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            })
        }
        _ => None,
    }
}

fn controller_of_meta(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<&OwnerReference> {
    m.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// The scale of any controller through its `/scale` subresource (upstream's
/// `getScaleController`).
async fn scale_subresource(ctx: &Ctx, r: &OwnerReference, ns: &str) -> Scale {
    let (group, version) = match r.api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", r.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &r.kind);
    let known = ctx
        .kinds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&gvk)
        .cloned();
    let (ar, has_scale) = match known {
        Some(k) => k,
        None => match kube::discovery::pinned_kind(&ctx.client, &gvk).await {
            Ok((ar, caps)) => {
                let has = caps.subresources.iter().any(|(s, _)| s.plural == "scale");
                ctx.kinds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(gvk.clone(), (ar.clone(), has));
                (ar, has)
            }
            Err(e) => return Scale::Failed(e.to_string()),
        },
    };
    let resource = if ar.group.is_empty() {
        ar.plural.clone()
    } else {
        format!("{}.{}", ar.plural, ar.group)
    };
    if !has_scale {
        return Scale::Failed(format!("{resource} does not implement the scale subresource"));
    }
    let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(ctx.client.clone(), ns, &ar);
    match api.get_scale(&r.name).await {
        Ok(s) if s.metadata.uid.as_deref() == Some(r.uid.as_str()) => Scale::Found {
            uid: r.uid.clone(),
            replicas: s.spec.and_then(|s| s.replicas).unwrap_or(0),
        },
        Ok(_) => Scale::Missing,
        Err(kube::Error::Api(s)) if s.code == 404 => Scale::Missing,
        Err(e) => Scale::Failed(e.to_string()),
    }
}

/// Clears a `DisruptionTarget` condition left on a pod that was not deleted within two
/// minutes (upstream's `syncStalePodDisruption`).
async fn reconcile_stale(pod: Arc<Pod>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let Some(wait) = stale_disruption_in(&pod, Utc::now()) else {
        return Ok(Action::await_change());
    };
    if !wait.is_zero() {
        return Ok(Action::requeue(wait + Duration::from_millis(100)));
    }
    let patch = json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "False",
        "reason": null, "message": null,
        "lastTransitionTime": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}]}});
    let api: kube::Api<Pod> = kube::Api::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    match api
        .patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => tracing::info!(pod = %key_of(&*pod), "stale DisruptionTarget condition reset to False"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    ctx.failures.reset(&format!("pod/{}", key_of(&*pod)));
    Ok(Action::await_change())
}
