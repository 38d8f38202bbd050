//! The taint eviction controller (`taint-eviction-controller`): pods on a node with NoExecute
//! taints they do not tolerate are deleted at once; pods that tolerate them for
//! `tolerationSeconds` are deleted when that time has passed since the controller saw the
//! taint, unless the taint goes or the pod comes to tolerate it for ever first (the planned
//! deletion is then cancelled). Each deletion is announced with a `TaintManagerEviction` event
//! ("Marking for deletion Pod <ns>/<name>") and the pod's `DisruptionTarget` condition
//! (`DeletionByTaintManager`); it goes through a plain delete (PodDisruptionBudgets do not
//! apply) with the pod's grace period.
//!
//! A kube-runtime `Controller` over pods; a node whose NoExecute taints change brings back the
//! pods bound to it (through the pods-by-node index), and a planned deletion is a requeue at its
//! time.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::DeleteParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};

use super::index::{PodsByNode, node_of};
use super::podstatus;
use super::{Failures, Manager, Running, key_of};
use crate::events::{Involved, Kind, Recorder};
use reconcile::{Decision, Planned, decide, noexecute};

/// Upstream's component name (events' source).
pub const COMPONENT: &str = "taint-eviction-controller";
/// Attempts at a deletion (upstream's `retries`).
const RETRIES: usize = 5;

/// Errors of one pod's sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
}

pub(crate) struct Ctx {
    client: kube::Client,
    nodes: Store<Node>,
    recorder: Arc<Recorder>,
    /// Planned evictions by pod key, with the pod's uid.
    planned: Mutex<HashMap<String, (String, Planned)>>,
    failures: Failures,
}

impl Ctx {
    fn planned(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Planned)>> {
        self.planned.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The controller.
pub fn controller(mgr: &Manager, by_node: &Arc<PodsByNode>) -> Running {
    let nodes = mgr.informers.get::<Node>();
    let pods = mgr.informers.get::<Pod>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        nodes: nodes.reader(),
        recorder: mgr.recorder(COMPONENT),
        planned: Mutex::new(HashMap::new()),
        failures: Failures::default(),
    });
    // A node whose NoExecute taints changed brings back its pods.
    let last: Arc<Mutex<HashMap<String, Vec<Taint>>>> = Arc::default();
    let seen = last.clone();
    let index = by_node.clone();
    let node_changes = nodes.subscribe().flat_map(move |n| {
        let name = n.metadata.name.clone().unwrap_or_default();
        let taints = noexecute(taints_of(&n));
        let before = seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), taints.clone());
        let refs: Vec<ObjectRef<Pod>> = if before.unwrap_or_default() != taints {
            index
                .pods_on(&name)
                .iter()
                .map(|p| ObjectRef::from_obj(&**p))
                .collect()
        } else {
            Vec::new()
        };
        futures::stream::iter(refs)
    });
    let forget_nodes = nodes.deletions().for_each(move |n| {
        if let Some(name) = n.metadata.name.as_deref() {
            last.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        }
        futures::future::ready(())
    });
    let forget_pods = forget_deleted_pods(ctx.clone(), pods.deletions());
    let ctl = Controller::for_shared_stream(pods.subscribe(), pods.reader())
        .reconcile_on(node_changes)
        .with_config(mgr.controller_config())
        .run(reconcile_pod, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(async move {
        futures::future::join3(ctl, forget_nodes, forget_pods).await;
    })
}

fn error_policy(pod: Arc<Pod>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&key_of(&*pod));
    tracing::warn!(pod = %key_of(&*pod), error = %err, retry_in = ?delay, "taint eviction failed");
    Action::requeue(delay)
}

/// A deleted pod's planned eviction is cancelled.
async fn forget_deleted_pods(ctx: Arc<Ctx>, deleted: impl futures::Stream<Item = Arc<Pod>> + Send) {
    let mut deleted = std::pin::pin!(deleted);
    while let Some(pod) = deleted.next().await {
        let key = key_of(&*pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let removed = {
            let mut planned = ctx.planned();
            match planned.get(&key) {
                Some((u, _)) if *u == uid => planned.remove(&key),
                _ => None,
            }
        };
        if let Some((_, Planned::At { .. })) = removed {
            cancel_event(&ctx, &pod).await;
        }
    }
}

async fn cancel_event(ctx: &Ctx, pod: &Pod) {
    ctx.recorder
        .record(
            &Involved::of(pod),
            Kind::Normal,
            "TaintManagerEviction",
            "",
            &format!("Cancelling deletion of Pod {}", key_of(pod)),
        )
        .await;
}

fn until(fire: chrono::DateTime<Utc>) -> Duration {
    (fire - Utc::now())
        .to_std()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(10))
}

async fn reconcile_pod(pod: Arc<Pod>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let Some(node_name) = node_of(&pod) else {
        return Ok(Action::await_change());
    };
    let key = key_of(&*pod);
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let node = ctx.nodes.get(&ObjectRef::new(node_name));
    let planned = ctx
        .planned()
        .get(&key)
        .filter(|(u, _)| *u == uid)
        .map(|(_, p)| *p);
    let now = Utc::now();
    let decision = decide(&pod, node.as_deref().map(taints_of), planned, now);
    let action = match decision {
        Decision::Keep => Action::await_change(),
        Decision::Cancel => {
            ctx.planned().remove(&key);
            if let Some(Planned::At { .. }) = planned {
                tracing::info!(pod = %key, "planned taint eviction cancelled");
                cancel_event(&ctx, &pod).await;
            }
            Action::await_change()
        }
        Decision::Wait { created, fire } => {
            if planned.is_none() {
                tracing::info!(pod = %key, node = node_name, at = %fire, "pod deletion planned for a NoExecute taint");
            }
            ctx.planned()
                .insert(key.clone(), (uid, Planned::At { created, fire }));
            Action::requeue(until(fire))
        }
        Decision::Evict { cancelled } => {
            if cancelled {
                cancel_event(&ctx, &pod).await;
            }
            ctx.planned().insert(key.clone(), (uid, Planned::Done));
            if let Err(e) = evict(&ctx, &pod).await {
                ctx.planned().remove(&key);
                return Err(e.into());
            }
            Action::await_change()
        }
    };
    ctx.failures.reset(&key);
    Ok(action)
}

/// Announces and deletes the pod (upstream's `deletePodHandler`): the event, the
/// `DisruptionTarget` condition, then a graceful delete; retried a few times.
async fn evict(ctx: &Ctx, pod: &Pod) -> Result<(), kube::Error> {
    let key = key_of(pod);
    tracing::info!(pod = %key, "deleting pod for a NoExecute taint");
    ctx.recorder
        .record(
            &Involved::of(pod),
            Kind::Normal,
            "TaintManagerEviction",
            "",
            &format!("Marking for deletion Pod {key}"),
        )
        .await;
    let api: kube::Api<Pod> = kube::Api::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut last = None;
    for _ in 0..RETRIES {
        let attempt = async {
            podstatus::set_disruption_target(
                &ctx.client,
                pod,
                "DeletionByTaintManager",
                "Taint manager: deleting due to NoExecute taint",
            )
            .await?;
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e),
            }
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match last {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
