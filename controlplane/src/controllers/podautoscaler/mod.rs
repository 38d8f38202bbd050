//! The horizontal pod autoscaler (`horizontalpodautoscaling`; events from
//! `horizontal-pod-autoscaler`; docs/SEEDS-SPEC.md §3.10): every 15 s per HPA, and when its spec
//! changes, reads the target's `/scale`, the pods its selector selects (a label-selected list
//! through the API: the shared pod cache keeps no containers, and their requests are what the
//! utilization is measured against) and their samples from the resource metrics API
//! (`metrics.k8s.io/v1beta1`), sets the scale the metrics ask for, and writes the HPA's status
//! when it changed.
//!
//! The decisions are `reconcile::plan` over `calculator` (replica counts from samples) and
//! `behavior` (stabilization windows, scaling policies, clamps); the recommendations and scale
//! events they remember are kept here, in memory, per HPA. Object and External metrics, and Pods
//! metrics (a custom metrics API), are answered as unavailable: no such API is served.

pub mod behavior;
pub mod calculator;
pub mod metrics;
pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::{Action, Controller};

use self::behavior::History;
use self::calculator::Timing;
use self::metrics::PodMetricsList;
use self::reconcile::{Inputs, Plan, ScaleView, metric_specs, plan, scale_unavailable};
use super::{Manager, Running, key_of};
use crate::events::{Involved, Recorder};

/// Upstream's controller name (`--controllers`).
pub const NAME: &str = "horizontalpodautoscaling";

/// Upstream's event source.
pub const COMPONENT: &str = "horizontal-pod-autoscaler";

/// Upstream's `--horizontal-pod-autoscaler-sync-period`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);

/// Errors of one pass.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Serialize(#[from] serde_json::Error),
}

struct Ctx {
    client: kube::Client,
    recorder: Arc<Recorder>,
    /// Per HPA uid: the recommendations and scale events of past passes.
    histories: Mutex<HashMap<String, History>>,
    /// Scale target kinds resolved through discovery.
    kinds: Mutex<HashMap<GroupVersionKind, ApiResource>>,
}

/// The controller, over the shared HPA informer.
pub fn controller(mgr: &Manager) -> Running {
    let hpas = mgr.informers.get::<HorizontalPodAutoscaler>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        recorder: mgr.recorder(COMPONENT),
        histories: Mutex::new(HashMap::new()),
        kinds: Mutex::new(HashMap::new()),
    });
    // Our own status writes change the HPA too: only new HPAs and spec changes (a new
    // generation) start a pass early; the rest come every sync period.
    let seen: Arc<Mutex<HashMap<String, Option<i64>>>> = Arc::default();
    let generations = seen.clone();
    let changed = hpas.subscribe().filter(move |h| {
        let uid = h.metadata.uid.clone().unwrap_or_default();
        let mut seen = generations.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = seen.insert(uid, h.metadata.generation) != Some(h.metadata.generation);
        futures::future::ready(fresh)
    });
    let forget = {
        let ctx = ctx.clone();
        hpas.deletions().for_each(move |h| {
            if let Some(uid) = &h.metadata.uid {
                ctx.histories
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(uid);
                seen.lock().unwrap_or_else(|p| p.into_inner()).remove(uid);
            }
            futures::future::ready(())
        })
    };
    let ctl = Controller::for_shared_stream(changed, hpas.reader())
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(async move {
        futures::future::join(ctl, forget).await;
    })
}

fn error_policy(hpa: Arc<HorizontalPodAutoscaler>, err: &SyncError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(hpa = %key_of(&*hpa), error = %err, "HorizontalPodAutoscaler sync failed");
    Action::requeue(SYNC_PERIOD)
}

async fn reconcile_one(hpa: Arc<HorizontalPodAutoscaler>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    if hpa.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    use tracing::Instrument;
    sync(&hpa, &ctx)
        .instrument(tracing::debug_span!("sync", kind = "HorizontalPodAutoscaler", key = %key_of(&*hpa)))
        .await?;
    Ok(Action::requeue(SYNC_PERIOD))
}

/// The text of an API error as client-go prints it.
fn api_error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// The resource of a scale target kind: the built-in scalable kinds, else discovery.
async fn scale_resource(ctx: &Ctx, api_version: &str, kind: &str) -> Result<ApiResource, String> {
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = match (group, kind) {
        ("apps", "Deployment") => Some("deployments"),
        ("apps", "ReplicaSet") => Some("replicasets"),
        ("apps", "StatefulSet") => Some("statefulsets"),
        ("", "ReplicationController") => Some("replicationcontrollers"),
        _ => None,
    };
    if let Some(plural) = plural {
        return Ok(ApiResource::from_gvk_with_plural(&gvk, plural));
    }
    if let Some(ar) = ctx.kinds.lock().unwrap_or_else(|p| p.into_inner()).get(&gvk) {
        return Ok(ar.clone());
    }
    let (ar, _) = kube::discovery::pinned_kind(&ctx.client, &gvk)
        .await
        .map_err(|e| format!("unable to determine resource for scale target reference: {e}"))?;
    ctx.kinds
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(gvk, ar.clone());
    Ok(ar)
}

/// Percent-encodes a query value.
fn encode_query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The resource metrics API's samples of the pods `selector` selects (the error as upstream's
/// clients print it).
async fn fetch_pod_metrics(
    client: &kube::Client,
    ns: &str,
    selector: &str,
) -> Result<PodMetricsList, String> {
    let url = format!(
        "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods?labelSelector={}",
        encode_query(selector)
    );
    let req = http::Request::get(url)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request::<PodMetricsList>(req).await {
        Ok(list) => Ok(list),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Err("the server could not find the requested resource (get pods.metrics.k8s.io)".into())
        }
        Err(e) => Err(api_error_text(&e)),
    }
}

/// One pass: read, decide, write.
async fn sync(hpa: &HorizontalPodAutoscaler, ctx: &Ctx) -> Result<(), SyncError> {
    let ns = hpa.metadata.namespace.clone().unwrap_or_default();
    let uid = hpa.metadata.uid.clone().unwrap_or_default();
    let spec = hpa.spec.clone().unwrap_or_default();
    let target = &spec.scale_target_ref;
    let api_version = target.api_version.clone().unwrap_or_default();
    let resolved = match scale_resource(ctx, &api_version, &target.kind).await {
        Ok(ar) => {
            let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(ctx.client.clone(), &ns, &ar);
            api.get_scale(&target.name)
                .await
                .map(|s| (api, s))
                .map_err(|e| api_error_text(&e))
        }
        Err(e) => Err(e),
    };
    let (scale_api, scale) = match resolved {
        Ok(r) => r,
        Err(e) => {
            let p = scale_unavailable(hpa, &e, Utc::now());
            return finish(hpa, ctx, p).await;
        }
    };
    let view = ScaleView {
        replicas: scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
        selector: scale.status.as_ref().and_then(|s| s.selector.clone()),
    };
    let min = spec.min_replicas.unwrap_or(1);
    let selector = view.selector.clone().unwrap_or_default();
    let needs_metrics = view.replicas != 0
        && (min..=spec.max_replicas).contains(&view.replicas)
        && !selector.is_empty()
        && metric_specs(hpa)
            .iter()
            .any(|m| matches!(m.type_.as_str(), "Resource" | "ContainerResource"));
    // The pass reads pods only with the samples: without them a metric fails before its pods.
    let (resource_metrics, selected) = if needs_metrics {
        (
            fetch_pod_metrics(&ctx.client, &ns, &selector).await,
            selected_pods(&ctx.client, &ns, &selector).await?,
        )
    } else {
        (Err("not fetched".to_string()), Vec::new())
    };
    let pods: Vec<&Pod> = selected.iter().collect();
    let pods_metrics = BTreeMap::new();
    let inputs = Inputs {
        scale: view,
        pods: &pods,
        resource_metrics: &resource_metrics,
        pods_metrics: &pods_metrics,
        timing: Timing::at(Utc::now()),
    };
    let mut history = ctx
        .histories
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&uid)
        .unwrap_or_default();
    let mut p = plan(hpa, &mut history, &inputs);
    if let Some(r) = p.rescale.clone() {
        let result = update_scale(&scale_api, &target.name, scale, r.desired).await;
        p = p.rescaled(hpa, &mut history, result, Utc::now());
    }
    ctx.histories
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(uid, history);
    finish(hpa, ctx, p).await
}

/// The pods of `ns` that `selector` selects, whole (with their containers' requests); none for a
/// malformed selector: the pass reports it without reading pods.
async fn selected_pods(client: &kube::Client, ns: &str, selector: &str) -> Result<Vec<Pod>, kube::Error> {
    if crate::api::object::selector::parse_label_selector(selector).is_err() {
        return Ok(Vec::new());
    }
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    Ok(api.list(&ListParams::default().labels(selector)).await?.items)
}

/// Sets the target's replica count through its `/scale`.
async fn update_scale(
    api: &kube::Api<DynamicObject>,
    name: &str,
    mut scale: Scale,
    desired: i32,
) -> Result<(), String> {
    scale.spec.get_or_insert_with(Default::default).replicas = Some(desired);
    let body = serde_json::to_vec(&scale).map_err(|e| e.to_string())?;
    api.replace_scale(name, &PostParams::default(), body)
        .await
        .map(|_| ())
        .map_err(|e| api_error_text(&e))
}

/// Records the pass's events and writes the status if it changed.
async fn finish(hpa: &HorizontalPodAutoscaler, ctx: &Ctx, p: Plan) -> Result<(), SyncError> {
    let involved = Involved::of(hpa);
    for e in &p.events {
        ctx.recorder
            .record(&involved, e.kind, e.reason, "", &e.message)
            .await;
    }
    if let Some(e) = &p.error {
        tracing::warn!(hpa = %key_of(hpa), error = %e, "HorizontalPodAutoscaler pass failed");
    }
    if hpa.status.as_ref() == Some(&p.status) {
        return Ok(());
    }
    let mut updated = hpa.clone();
    updated.status = Some(p.status);
    let api: kube::Api<HorizontalPodAutoscaler> = kube::Api::namespaced(
        ctx.client.clone(),
        hpa.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let body = serde_json::to_vec(&updated)?;
    match api
        .replace_status(
            hpa.metadata.name.as_deref().unwrap_or_default(),
            &PostParams::default(),
            body,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => {
            ctx.recorder
                .record(
                    &involved,
                    crate::events::Kind::Warning,
                    "FailedUpdateStatus",
                    "",
                    &api_error_text(&e),
                )
                .await;
            Err(e.into())
        }
    }
}
