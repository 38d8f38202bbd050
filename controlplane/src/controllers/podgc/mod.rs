//! The pod garbage collector (`pod-garbage-collector`): every period it force-deletes (grace
//! 0) the terminated pods beyond `--terminated-pod-gc-threshold`, terminating pods on
//! out-of-service nodes, pods bound to a node that no longer exists (after marking them Failed
//! with `DisruptionTarget`/`DeletionByPodGC`, "PodGC: node no longer exists"), and terminating
//! pods that were never scheduled. Pods that have not finished are moved to `Failed` first, so
//! an orphan does not stay Running for ever in its owner's eyes.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::Utc;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::Store;

use super::podstatus;
use super::{Manager, Running, key_of};
pub use reconcile::PodGcConfig;
use reconcile::{
    Quarantine, orphans, terminated_beyond, terminating_out_of_service, unscheduled_terminating,
};

/// Upstream's controller name.
pub const NAME: &str = "pod-garbage-collector";
/// Deletions in flight at once.
const PARALLEL: usize = 16;

struct Ctx {
    client: kube::Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    cfg: PodGcConfig,
    quarantine: Mutex<Quarantine>,
}

/// The collector.
pub fn controller(mgr: &Manager) -> Running {
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        pods: mgr.informers.get::<Pod>().reader(),
        nodes: mgr.informers.get::<Node>().reader(),
        cfg: mgr.cfg.podgc.clone(),
        quarantine: Mutex::new(Quarantine::default()),
    });
    Box::pin(async move {
        super::informer::synced(&ctx.pods).await;
        super::informer::synced(&ctx.nodes).await;
        let mut tick = tokio::time::interval(ctx.cfg.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            gc(&ctx).await;
        }
    })
}

/// One pass (upstream's `gc`).
async fn gc(ctx: &Ctx) {
    let pods = ctx.pods.state();
    let nodes = ctx.nodes.state();
    let by_name: HashMap<&str, &Node> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, &**n)))
        .collect();
    let terminated = terminated_beyond(&pods, ctx.cfg.terminated_threshold);
    if !terminated.is_empty() {
        tracing::info!(pods = terminated.len(), "garbage collecting terminated pods");
    }
    delete_all(ctx, terminated, None).await;
    delete_all(ctx, terminating_out_of_service(&pods, &by_name), None).await;
    let existing: HashSet<&str> = by_name.keys().copied().collect();
    let due = ctx.quarantine.lock().unwrap_or_else(|p| p.into_inner()).missing(
        &pods,
        &existing,
        Utc::now(),
        ctx.cfg.quarantine,
    );
    let mut deleted = HashSet::new();
    let api: kube::Api<Node> = kube::Api::all(ctx.client.clone());
    for name in due {
        match api.get_opt(&name).await {
            Ok(None) => {
                deleted.insert(name);
            }
            Ok(Some(_)) => {}
            Err(e) => tracing::warn!(node = %name, error = %e, "node not looked up"),
        }
    }
    let orphaned = orphans(&pods, &deleted);
    for p in &orphaned {
        tracing::info!(pod = %key_of(&**p), node = ?p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            "orphaned pod: its node no longer exists");
    }
    delete_all(
        ctx,
        orphaned,
        Some(("DeletionByPodGC", "PodGC: node no longer exists")),
    )
    .await;
    delete_all(ctx, unscheduled_terminating(&pods), None).await;
}

async fn delete_all(ctx: &Ctx, pods: Vec<Arc<Pod>>, condition: Option<(&str, &str)>) {
    use futures::StreamExt;
    futures::stream::iter(pods)
        .for_each_concurrent(PARALLEL, |p| async move {
            match mark_failed_and_delete(ctx, &p, condition).await {
                Ok(()) => tracing::info!(pod = %key_of(&*p), "pod garbage collected"),
                Err(e) => tracing::warn!(pod = %key_of(&*p), error = %e, "pod not garbage collected"),
            }
        })
        .await;
}

/// Moves the pod to Failed (with the condition) unless it finished, then deletes it with
/// grace 0 (upstream's `markFailedAndDeletePodWithCondition`).
async fn mark_failed_and_delete(
    ctx: &Ctx,
    pod: &Pod,
    condition: Option<(&str, &str)>,
) -> Result<(), kube::Error> {
    podstatus::mark_failed(&ctx.client, pod, condition).await?;
    let api: kube::Api<Pod> = kube::Api::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api
        .delete(pod.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
