//! The node lifecycle controller (`node-lifecycle-controller`, events from `node-controller`):
//! every monitor period it checks each node's heartbeat (its Lease and its Ready condition);
//! a node silent for the grace period gets its kubelet-owned conditions set to Unknown and its
//! pods marked not ready at once; nodes whose Ready is False or Unknown get the
//! `not-ready`/`unreachable` NoExecute taint at the per-zone eviction rate (which the taint
//! eviction controller turns into pod deletions), and lose it when they are Ready again. On node
//! changes it keeps the NoSchedule taints the conditions and `spec.unschedulable` call for.
//!
//! Three loops share the state: the monitor (every `--node-monitor-period`), the tainting
//! pass over the zone queues (every 100 ms, upstream's `NodeEvictionPeriod`), and a
//! kube-runtime `Controller` over nodes for the NoSchedule taints and beta labels; a fourth
//! marks pods bound to a node that is already not ready.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::index::{PodsByNode, node_of};
use super::podstatus;
use super::{Failures, Manager, Running, key_of};
use crate::events::{Involved, Kind, Recorder};
pub use reconcile::LifecycleConfig;
use reconcile::{
    DisruptionChange, Health, TaintAction, ZoneState, ZoneTainter, classify, counts_for_zone,
    handle_disruption, has_taint, labels_to_reconcile, noexecute_for, noschedule_diff, observe, taint,
    taint_action, taints_of, zone_of,
};

/// Upstream's event source for node lifecycle events.
pub const COMPONENT: &str = "node-controller";
/// How often the zone queues are tried (upstream's `NodeEvictionPeriod`).
const TAINTING_PERIOD: Duration = Duration::from_millis(100);
/// Attempts at a node status write (upstream's `NodeHealthUpdateRetry`).
const STATUS_RETRIES: usize = 5;
/// Nodes checked at once in a monitor pass (upstream's `nodeUpdateWorkerSize`).
const NODE_WORKERS: usize = 8;

/// Errors of one node sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("the taints of node {0} kept changing under the update")]
    TaintConflict(String),
}

#[derive(Debug, Default)]
struct State {
    health: HashMap<String, Health>,
    tainters: HashMap<String, ZoneTainter>,
    zones: HashMap<String, ZoneState>,
    known: HashSet<String>,
    /// Nodes whose pods could not all be marked not ready.
    retry: HashSet<String>,
    /// Pods (uids) the pod watcher has seen bound.
    seen_pods: HashSet<String>,
}

pub(crate) struct Ctx {
    client: kube::Client,
    nodes: Store<Node>,
    leases: Store<Lease>,
    pods: Store<Pod>,
    by_node: Arc<PodsByNode>,
    recorder: Arc<Recorder>,
    cfg: LifecycleConfig,
    state: Mutex<State>,
    failures: Failures,
}

impl Ctx {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The controller.
pub fn controller(mgr: &Manager, by_node: &Arc<PodsByNode>) -> Running {
    let nodes = mgr.informers.get::<Node>();
    let leases = mgr.informers.get::<Lease>();
    let pods = mgr.informers.get::<Pod>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        nodes: nodes.reader(),
        leases: leases.reader(),
        pods: pods.reader(),
        by_node: by_node.clone(),
        recorder: mgr.recorder(COMPONENT),
        cfg: mgr.cfg.node_lifecycle.clone(),
        state: Mutex::new(State::default()),
        failures: Failures::default(),
    });
    let noschedule = Controller::for_shared_stream(nodes.subscribe(), nodes.reader())
        .with_config(mgr.controller_config())
        .run(reconcile_node, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let pod_watch = watch_pods(ctx.clone(), pods.subscribe(), pods.deletions());
    let monitor = run_monitor(ctx.clone());
    let tainting = run_tainting(ctx);
    Box::pin(async move {
        futures::future::join4(noschedule, pod_watch, monitor, tainting).await;
    })
}

fn error_policy(node: Arc<Node>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&key_of(&*node));
    tracing::warn!(node = %key_of(&*node), error = %err, retry_in = ?delay, "node taints not updated");
    Action::requeue(delay)
}

/// The NoSchedule taints and beta labels of one node.
async fn reconcile_node(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let (add, remove) = noschedule_diff(&node);
    if !add.is_empty() || !remove.is_empty() {
        swap_taints(&ctx, &name, &add, &remove).await?;
    }
    let labels = labels_to_reconcile(&node);
    if !labels.is_empty() {
        let api: kube::Api<Node> = kube::Api::all(ctx.client.clone());
        let patch = json!({"metadata": {"labels": labels}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    ctx.failures.reset(&name);
    Ok(Action::await_change())
}

/// Adds `add` (stamped with the time) and removes `remove` (by key and effect) from a node's
/// taints, with the node's resourceVersion as precondition (read again on a conflict);
/// returns whether anything changed.
async fn swap_taints(ctx: &Ctx, name: &str, add: &[Taint], remove: &[Taint]) -> Result<bool, SyncError> {
    let api: kube::Api<Node> = kube::Api::all(ctx.client.clone());
    let Some(mut node) = ctx.nodes.get(&ObjectRef::new(name)) else {
        return Ok(false);
    };
    for _ in 0..STATUS_RETRIES {
        let old = taints_of(&node);
        let mut new: Vec<Taint> = old
            .iter()
            .filter(|t| !has_taint(remove, &t.key, &t.effect))
            .cloned()
            .collect();
        for a in add {
            if !has_taint(&new, &a.key, &a.effect) {
                new.push(Taint {
                    time_added: Some(Time(Utc::now())),
                    ..a.clone()
                });
            }
        }
        if new.as_slice() == old {
            return Ok(false);
        }
        let taints = if new.is_empty() { json!(null) } else { json!(new) };
        let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
                           "spec": {"taints": taints}});
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await? {
                Some(fresh) => node = Arc::new(fresh),
                None => return Ok(false),
            },
            Err(e) => return Err(e.into()),
        }
    }
    Err(SyncError::TaintConflict(name.into()))
}

fn node_involved(name: &str, uid: Option<&str>) -> Involved {
    Involved {
        api_version: "v1".into(),
        kind: "Node".into(),
        namespace: None,
        name: name.into(),
        uid: uid.unwrap_or_default().into(),
        resource_version: None,
    }
}

/// Records a node event without holding up the caller.
fn node_event(ctx: &Arc<Ctx>, name: &str, uid: Option<&str>, reason: &'static str, message: String) {
    let recorder = ctx.recorder.clone();
    let involved = node_involved(name, uid);
    tokio::spawn(async move {
        recorder
            .record(&involved, Kind::Normal, reason, "", &message)
            .await;
    });
}

/// Sets the Ready condition of every pod on `node` False, with a `NodeNotReady` event each.
async fn mark_pods_not_ready(ctx: &Ctx, node: &str) -> Result<(), kube::Error> {
    let mut first_error = None;
    for pod in ctx.by_node.pods_on(node) {
        match podstatus::mark_not_ready(&ctx.client, &pod).await {
            Ok(true) => {
                ctx.recorder
                    .record(
                        &Involved::of(&*pod),
                        Kind::Warning,
                        "NodeNotReady",
                        "",
                        "Node is not ready",
                    )
                    .await;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::info!(pod = %key_of(&*pod), node, error = %e, "pod not marked not ready");
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Removes the NoExecute taints of an unreachable or not-ready node and takes it off its
/// zone's queue (upstream's `markNodeAsReachable`).
async fn mark_reachable(ctx: &Ctx, node: &Node) -> Result<bool, SyncError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let remove = [
        taint(reconcile::TAINT_UNREACHABLE, "NoExecute"),
        taint(reconcile::TAINT_NOT_READY, "NoExecute"),
    ];
    swap_taints(ctx, &name, &[], &remove).await?;
    let zone = zone_of(node);
    Ok(ctx
        .state()
        .tainters
        .get_mut(&zone)
        .is_some_and(|t| t.remove(&name)))
}

/// Marks pods that get bound to a node which is not Ready (upstream's `processPod`), and
/// forgets deleted ones.
async fn watch_pods(
    ctx: Arc<Ctx>,
    changed: impl futures::Stream<Item = Arc<Pod>> + Send + 'static,
    deleted: impl futures::Stream<Item = Arc<Pod>> + Send + 'static,
) {
    let changed = changed.map(|p| (p, true));
    let deleted = deleted.map(|p| (p, false));
    let mut events = std::pin::pin!(futures::stream::select(changed, deleted));
    while let Some((pod, present)) = events.next().await {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !present {
            ctx.state().seen_pods.remove(&uid);
            continue;
        }
        let Some(node) = node_of(&pod) else { continue };
        let unready = {
            let mut st = ctx.state();
            if !st.seen_pods.insert(uid) {
                continue;
            }
            st.health
                .get(node)
                .and_then(|h| h.ready.as_ref())
                .is_some_and(|c| c.status != "True")
        };
        if unready && podstatus::needs_not_ready(&pod) {
            match podstatus::mark_not_ready(&ctx.client, &pod).await {
                Ok(true) => {
                    ctx.recorder
                        .record(
                            &Involved::of(&*pod),
                            Kind::Warning,
                            "NodeNotReady",
                            "",
                            "Node is not ready",
                        )
                        .await;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::info!(pod = %key_of(&*pod), error = %e, "pod not marked not ready");
                    ctx.state()
                        .seen_pods
                        .remove(pod.metadata.uid.as_deref().unwrap_or_default());
                }
            }
        }
    }
}

async fn run_monitor(ctx: Arc<Ctx>) {
    super::informer::synced(&ctx.nodes).await;
    super::informer::synced(&ctx.leases).await;
    super::informer::synced(&ctx.pods).await;
    let mut tick = tokio::time::interval(ctx.cfg.monitor_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        monitor_node_health(&ctx).await;
    }
}

/// One monitor pass (upstream's `monitorNodeHealth`).
async fn monitor_node_health(ctx: &Arc<Ctx>) {
    let nodes = ctx.nodes.state();
    let now = Utc::now();
    let added: Vec<Arc<Node>> = {
        let mut st = ctx.state();
        let (added, removed) = classify(&st.known, &nodes);
        let added: Vec<Arc<Node>> = nodes
            .iter()
            .filter(|n| added.iter().any(|a| a.metadata.name == n.metadata.name))
            .cloned()
            .collect();
        for n in &nodes {
            st.tainters
                .entry(zone_of(n))
                .or_insert_with(|| ZoneTainter::new(ctx.cfg.eviction_rate, now));
        }
        for name in removed {
            st.known.remove(&name);
            st.health.remove(&name);
            st.retry.remove(&name);
            for t in st.tainters.values_mut() {
                t.remove(&name);
            }
            tracing::info!(node = %name, "node removed");
            node_event(
                ctx,
                &name,
                None,
                "RemovingNode",
                format!("Node {name} event: Removing Node {name} from Controller"),
            );
        }
        for n in &added {
            st.known.insert(n.metadata.name.clone().unwrap_or_default());
        }
        added
    };
    for n in &added {
        let name = n.metadata.name.clone().unwrap_or_default();
        tracing::info!(node = %name, "node registered");
        node_event(
            ctx,
            &name,
            n.metadata.uid.as_deref(),
            "RegisteredNode",
            format!("Node {name} event: Registered Node {name} in Controller"),
        );
        if let Err(e) = mark_reachable(ctx, n).await {
            tracing::warn!(node = %name, error = %e, "NoExecute taints not removed");
        }
    }
    let results: Vec<Option<(String, bool)>> = futures::stream::iter(nodes.iter().cloned())
        .map(|n| update_node(ctx, n, now))
        .buffer_unordered(NODE_WORKERS)
        .collect()
        .await;
    let mut ready_by_zone: HashMap<String, Vec<bool>> = HashMap::new();
    for (zone, ready) in results.into_iter().flatten() {
        ready_by_zone.entry(zone).or_default().push(ready);
    }
    let change = {
        let mut st = ctx.state();
        handle_disruption(&mut st.zones, &ready_by_zone, &ctx.cfg)
    };
    match change {
        DisruptionChange::None => {}
        DisruptionChange::Enter => {
            tracing::info!("all nodes are not ready: entering master disruption mode, no evictions");
            for n in &nodes {
                if let Err(e) = mark_reachable(ctx, n).await {
                    tracing::warn!(node = %key_of(&**n), error = %e, "NoExecute taints not removed");
                }
            }
            let mut st = ctx.state();
            for t in st.tainters.values_mut() {
                t.set_rate(0.0, now);
            }
        }
        DisruptionChange::Exit(rates) => {
            tracing::info!("some nodes are ready: exiting master disruption mode");
            let mut st = ctx.state();
            for h in st.health.values_mut() {
                h.probe = now;
                h.ready_transition = now;
            }
            set_rates(&mut st, &rates, now);
        }
        DisruptionChange::Rates(rates) => {
            for (zone, rate) in &rates {
                tracing::info!(zone = %zone.replace('\0', ""), rate, "zone changed state");
            }
            set_rates(&mut ctx.state(), &rates, now);
        }
    }
}

fn set_rates(st: &mut State, rates: &[(String, f64)], now: DateTime<Utc>) {
    for (zone, rate) in rates {
        if let Some(t) = st.tainters.get_mut(zone) {
            t.set_rate(*rate, now);
        }
    }
}

/// The lease renew time of node `name`.
fn lease_renew(ctx: &Ctx, name: &str) -> Option<DateTime<Utc>> {
    let lease = ctx.leases.get(&ObjectRef::new(name).within("kube-node-lease"))?;
    lease.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

/// Checks one node; returns its zone and readiness when it counts for the zone's health.
async fn update_node(ctx: &Arc<Ctx>, node: Arc<Node>, now: DateTime<Utc>) -> Option<(String, bool)> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let api: kube::Api<Node> = kube::Api::all(ctx.client.clone());
    let mut node = node;
    let mut seen = None;
    for _ in 0..STATUS_RETRIES {
        let saved = ctx.state().health.get(&name).cloned();
        let obs = observe(&node, lease_renew(ctx, &name), saved.as_ref(), now, &ctx.cfg);
        ctx.state().health.insert(name.clone(), obs.health.clone());
        let Some(conditions) = &obs.post else {
            seen = Some(obs);
            break;
        };
        match post_conditions(&api, &node, conditions).await {
            Ok(()) => {
                tracing::info!(node = %name, "node stopped posting status: conditions Unknown");
                ctx.state().health.insert(name.clone(), obs.posted(now));
                seen = Some(obs);
                break;
            }
            Err(e) => {
                tracing::debug!(node = %name, error = %e, "node status not written; reading it again");
                tokio::time::sleep(Duration::from_millis(20)).await;
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => node = Arc::new(fresh),
                    _ => return None,
                }
            }
        }
    }
    let Some(obs) = seen else {
        tracing::error!(node = %name, "node health not updated: no pods will be evicted");
        return None;
    };
    let zone_entry = counts_for_zone(&node).then(|| (zone_of(&node), obs.current.as_deref() == Some("True")));
    let Some(current) = obs.current.as_deref() else {
        return zone_entry;
    };
    process_taint_based_eviction(ctx, &node, &obs.observed, now).await;
    let needs_retry = ctx.state().retry.contains(&name);
    let went_unready = current != "True" && obs.observed == "True";
    if went_unready {
        node_event(
            ctx,
            &name,
            node.metadata.uid.as_deref(),
            "NodeNotReady",
            format!("Node {name} status is now: NodeNotReady"),
        );
    }
    if (went_unready || (needs_retry && obs.observed != "True"))
        && let Err(e) = mark_pods_not_ready(ctx, &name).await
    {
        tracing::warn!(node = %name, error = %e, "pods not all marked not ready; will retry");
        ctx.state().retry.insert(name);
        return zone_entry;
    }
    ctx.state().retry.remove(&name);
    zone_entry
}

/// Posts a node's conditions with its resourceVersion as precondition.
async fn post_conditions(
    api: &kube::Api<Node>,
    node: &Node,
    conditions: &[NodeCondition],
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
                       "status": {"conditions": conditions}});
    api.patch_status(
        node.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await
    .map(drop)
}

async fn process_taint_based_eviction(ctx: &Arc<Ctx>, node: &Node, observed: &str, now: DateTime<Utc>) {
    let name = node.metadata.name.clone().unwrap_or_default();
    match taint_action(node, observed) {
        TaintAction::Swap { add, remove } => {
            if let Err(e) = swap_taints(
                ctx,
                &name,
                &[taint(add, "NoExecute")],
                &[taint(remove, "NoExecute")],
            )
            .await
            {
                tracing::warn!(node = %name, error = %e, "NoExecute taint not swapped; next pass retries");
            }
        }
        TaintAction::Queue { key } => {
            let mut st = ctx.state();
            let t = st
                .tainters
                .entry(zone_of(node))
                .or_insert_with(|| ZoneTainter::new(ctx.cfg.eviction_rate, now));
            if !has_taint(taints_of(node), key, "NoExecute") {
                t.remove(&name);
            }
            if t.add(&name, now) {
                tracing::debug!(node = %name, taint = key, "queued for its NoExecute taint");
            }
        }
        TaintAction::Reachable => match mark_reachable(ctx, node).await {
            Ok(true) => tracing::info!(node = %name, "node is healthy again, NoExecute taints removed"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "NoExecute taints not removed; next pass retries")
            }
        },
        TaintAction::None => {}
    }
}

async fn run_tainting(ctx: Arc<Ctx>) {
    super::informer::synced(&ctx.nodes).await;
    let mut tick = tokio::time::interval(TAINTING_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        taint_due_nodes(&ctx).await;
    }
}

/// Gives the nodes due in each zone queue their NoExecute taint (upstream's
/// `doNoExecuteTaintingPass`).
async fn taint_due_nodes(ctx: &Ctx) {
    let now = Utc::now();
    let zones: Vec<String> = ctx.state().tainters.keys().cloned().collect();
    for zone in zones {
        loop {
            let next = ctx.state().tainters.get_mut(&zone).and_then(|t| t.next_due(now));
            let Some(name) = next else { break };
            let Some(node) = ctx.nodes.get(&ObjectRef::new(&name)) else {
                if let Some(t) = ctx.state().tainters.get_mut(&zone) {
                    t.remove(&name);
                }
                continue;
            };
            let Some((add, remove)) = noexecute_for(&node) else {
                continue; // Ready again
            };
            match swap_taints(
                ctx,
                &name,
                &[taint(add, "NoExecute")],
                &[taint(remove, "NoExecute")],
            )
            .await
            {
                Ok(_) => tracing::info!(node = %name, taint = add, "NoExecute taint added"),
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "NoExecute taint not added; retrying");
                    if let Some(t) = ctx.state().tainters.get_mut(&zone) {
                        t.retry(&name, now);
                    }
                }
            }
        }
    }
}
