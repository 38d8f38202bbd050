//! The namespace controller (`namespace-controller`, CTL-61): a Terminating namespace (with the
//! `kubernetes` finalizer in `spec.finalizers`) is emptied — every namespaced kind's objects
//! deleted as a collection in the background, then listed again — with upstream's five
//! conditions on its status; once nothing is left the `kubernetes` finalizer is removed
//! through `/finalize` and the API server removes the namespace.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use serde_json::json;

use self::reconcile::{Pass, Remaining, conditions};
use super::{Failures, Manager, Running};
use crate::api::registry::{RESOURCES, Resource};

/// Upstream's controller name.
pub const NAME: &str = "namespace-controller";
/// The finalizer this controller owns.
pub const FINALIZER: &str = "kubernetes";
/// How soon a namespace whose content is still going away is looked at again.
const RECHECK: Duration = Duration::from_secs(1);

/// Errors of one sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("encoding the namespace: {0}")]
    Encode(#[from] serde_json::Error),
}

struct Ctx {
    client: kube::Client,
    failures: Failures,
}

/// The namespaced kinds a namespace's content is made of.
fn content_kinds() -> Vec<&'static Resource> {
    let mut seen = std::collections::HashSet::new();
    RESOURCES
        .iter()
        .filter(|r| r.namespaced && ["list", "delete"].iter().all(|v| r.verbs.contains(v)))
        .filter(|r| seen.insert((r.group, r.plural)))
        .collect()
}

/// The controller, over the shared Namespace informer.
pub fn controller(mgr: &Manager) -> Running {
    let namespaces = mgr.informers.get::<Namespace>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        failures: Failures::default(),
    });
    let ctl = Controller::for_shared_stream(namespaces.subscribe(), namespaces.reader())
        .with_config(mgr.controller_config())
        .run(reconcile_one, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(ctl)
}

fn error_policy(ns: Arc<Namespace>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    super::retry_after_failure(&ctx.failures, "namespace-controller", &*ns, err)
}

async fn reconcile_one(ns: Arc<Namespace>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    if ns.metadata.deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let action = sync(ns.metadata.name.as_deref().unwrap_or_default(), &ctx).await?;
    ctx.failures
        .reset(ns.metadata.name.as_deref().unwrap_or_default());
    Ok(action)
}

fn has_finalizer(ns: &Namespace) -> bool {
    ns.spec
        .as_ref()
        .and_then(|s| s.finalizers.as_ref())
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

async fn sync(name: &str, ctx: &Ctx) -> Result<Action, SyncError> {
    let api: kube::Api<Namespace> = kube::Api::all(ctx.client.clone());
    // Decide on a fresh read (upstream's `retryOnConflictError` get).
    let Some(ns) = api.get_opt(name).await? else {
        return Ok(Action::await_change());
    };
    if ns.metadata.deletion_timestamp.is_none() || !has_finalizer(&ns) {
        return Ok(Action::await_change());
    }
    let pass = delete_content(ctx, name).await;
    let current = ns
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let wanted = conditions(&current, &pass, Utc::now());
    if wanted != current {
        let patch = json!({"status": {"conditions": wanted}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if !pass.done() {
        return Ok(Action::requeue(RECHECK));
    }
    // Empty: the `kubernetes` finalizer goes (the namespace with it, when no other is left).
    let Some(mut ns) = api.get_opt(name).await? else {
        return Ok(Action::await_change());
    };
    if let Some(spec) = ns.spec.as_mut() {
        spec.finalizers = Some(
            spec.finalizers
                .take()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != FINALIZER)
                .collect(),
        );
    }
    tracing::info!(namespace = %name, "namespace emptied; finalizing");
    match api
        .replace_subresource("finalize", name, &PostParams::default(), serde_json::to_vec(&ns)?)
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Action::await_change()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes every namespaced kind's objects in `namespace` and counts what is left.
async fn delete_content(ctx: &Ctx, namespace: &str) -> Pass {
    let mut pass = Pass::default();
    for r in content_kinds() {
        let ar = kube::api::ApiResource {
            group: r.group.into(),
            version: r.version.into(),
            api_version: r.api_version(),
            kind: r.kind.into(),
            plural: r.plural.into(),
        };
        let api: kube::Api<DynamicObject> = kube::Api::namespaced_with(ctx.client.clone(), namespace, &ar);
        let listed = match api.list_metadata(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                pass.discovery_errors
                    .push(format!("{}/{}: {e}", r.api_version(), r.plural));
                continue;
            }
        };
        if listed.items.is_empty() {
            continue;
        }
        let live = listed
            .items
            .iter()
            .any(|o| o.metadata.deletion_timestamp.is_none());
        if live
            && let Err(e) = api
                .delete_collection(&DeleteParams::background(), &ListParams::default())
                .await
        {
            pass.delete_errors.push(format!(
                "{} for gvr: {}, Resource={}: {e}",
                namespace,
                r.api_version(),
                r.plural
            ));
        }
        let left = match api.list_metadata(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                pass.discovery_errors
                    .push(format!("{}/{}: {e}", r.api_version(), r.plural));
                continue;
            }
        };
        if left.is_empty() {
            continue;
        }
        let mut remaining = Remaining {
            resource: format!("{}.{}", r.plural, r.group),
            count: left.len(),
            ..Remaining::default()
        };
        for o in &left {
            for f in o.metadata.finalizers.iter().flatten() {
                *remaining.finalizers.entry(f.clone()).or_default() += 1;
            }
        }
        pass.remaining.push(remaining);
    }
    pass
}
