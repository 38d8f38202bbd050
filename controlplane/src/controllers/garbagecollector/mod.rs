//! The garbage collector (`garbage-collector-controller`, docs/SEEDS-SPEC.md §1.6, CTL-43): an
//! owner graph over every served kind that can be listed, watched and deleted (one metadata
//! monitor per kind of the API's registry; events are left out, as upstream), and workers that
//! delete the dependents of deleted owners (Background), delete an owner's blocking dependents
//! before removing its `foregroundDeletion` finalizer (Foreground), and strip an owner's
//! references from its dependents before removing its `orphan` finalizer (Orphan).
//!
//! An owner the graph has not seen is verified with a live GET before anything is deleted
//! (upstream's virtual nodes): a missing owner, or another object with the owner's name but a
//! different uid, is dangling; an existing one keeps its dependents. Deletes carry the
//! dependent's uid as a precondition.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy,
};
use kube::runtime::{WatchStreamExt, metadata_watcher, watcher};
use serde_json::json;
use tokio::sync::{Notify, mpsc};

use super::{Failures, Manager, Running};
use crate::api::registry::{RESOURCES, Resource};
use reconcile::{
    Decision, FOREGROUND, Graph, Identity, Item, ORPHAN, Observed, OwnerState, Policy, Work,
    attempt_to_delete, unblocked, without_owners,
};

/// Upstream's controller name.
pub const NAME: &str = "garbage-collector-controller";
/// Workers (kube-controller-manager's `--concurrent-gc-syncs` default).
const WORKERS: usize = 20;
/// Owner uids remembered as missing (upstream's absent-owner cache), cleared beyond this.
const ABSENT_CACHE: usize = 10_000;
/// The longest the workers wait for the first list of every kind before starting anyway.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// The kinds the collector watches: stored kinds that can be watched and deleted, except
/// events (upstream's ignored resources). One version per group and resource.
pub fn monitored() -> Vec<&'static Resource> {
    let mut seen = HashSet::new();
    RESOURCES
        .iter()
        .filter(|r| ["list", "watch", "delete"].iter().all(|v| r.verbs.contains(v)))
        .filter(|r| r.plural != "events")
        .filter(|r| seen.insert((r.group, r.plural)))
        .collect()
}

fn api_resource(r: &Resource) -> ApiResource {
    ApiResource {
        group: r.group.into(),
        version: r.version.into(),
        api_version: r.api_version(),
        kind: r.kind.into(),
        plural: r.plural.into(),
    }
}

/// What the monitors tell the graph builder.
enum Change {
    Upsert(Observed),
    Delete(String),
    Listed(usize, HashSet<String>),
}

/// A work queue as client-go's: an item is queued once, and processed by one worker at a time
/// (an item added while processed runs again afterwards).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Notify,
}

#[derive(Default)]
struct QueueState {
    order: VecDeque<Work>,
    queued: HashSet<Work>,
    processing: HashSet<Work>,
}

impl Queue {
    fn add(&self, w: Work) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !s.queued.insert(w.clone()) {
            return;
        }
        if !s.processing.contains(&w) {
            s.order.push_back(w);
            drop(s);
            self.ready.notify_one();
        }
    }

    async fn get(&self) -> Work {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(w) = s.order.pop_front() {
                    s.queued.remove(&w);
                    s.processing.insert(w.clone());
                    if !s.order.is_empty() {
                        self.ready.notify_one();
                    }
                    return w;
                }
            }
            notified.await;
        }
    }

    fn done(&self, w: &Work) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.processing.remove(w);
        if s.queued.contains(w) {
            s.order.push_back(w.clone());
            drop(s);
            self.ready.notify_one();
        }
    }
}

struct Ctx {
    client: kube::Client,
    graph: Mutex<Graph>,
    queue: Queue,
    failures: Failures,
    absent: Mutex<HashSet<String>>,
    /// (apiVersion, kind) → the served resource.
    kinds: HashMap<(String, String), &'static Resource>,
    changes: mpsc::UnboundedSender<Change>,
}

#[derive(Debug, thiserror::Error)]
enum GcError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("kind {0} of {1} is not served")]
    UnknownKind(String, String),
}

/// The collector.
pub fn controller(mgr: &Manager) -> Running {
    let resources = monitored();
    let kinds = RESOURCES
        .iter()
        .map(|r| ((r.api_version(), r.kind.to_string()), r))
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        graph: Mutex::new(Graph::default()),
        queue: Queue::default(),
        failures: Failures::default(),
        absent: Mutex::new(HashSet::new()),
        kinds,
        changes: tx.clone(),
    });
    Box::pin(async move {
        // The monitors, the graph builder and the workers stop with this future.
        let scope = crate::leader::Scope::default();
        let monitors = resources.len();
        for (i, r) in resources.into_iter().enumerate() {
            scope.spawn(monitor(ctx.client.clone(), i, r, tx.clone()));
        }
        // The graph builder: one change at a time.
        let builder = ctx.clone();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        scope.spawn(async move {
            let mut listed = HashSet::new();
            let mut synced_tx = Some(synced_tx);
            while let Some(change) = rx.recv().await {
                let work = {
                    let mut g = builder.graph.lock().unwrap_or_else(|p| p.into_inner());
                    match change {
                        Change::Upsert(o) => g.upsert(o, |av, k| builder.namespaced(av, k)),
                        Change::Delete(uid) => g.remove(&uid),
                        Change::Listed(m, seen) => {
                            listed.insert(m);
                            g.resync(m, &seen)
                        }
                    }
                };
                for w in work {
                    builder.queue.add(w);
                }
                if listed.len() == monitors
                    && let Some(t) = synced_tx.take()
                {
                    let _ = t.send(());
                }
            }
        });
        if tokio::time::timeout(SYNC_TIMEOUT, synced_rx).await.is_err() {
            tracing::warn!("garbage collector: not every kind listed in time; starting anyway");
        }
        tracing::info!(kinds = monitors, "garbage collector synced");
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let ctx = ctx.clone();
                scope.spawn(async move {
                    loop {
                        let w = ctx.queue.get().await;
                        process(&ctx, &w).await;
                        ctx.queue.done(&w);
                    }
                })
            })
            .collect();
        let _ = futures::future::select_all(workers).await;
    })
}

/// One kind's list+watch, as graph changes.
async fn monitor(
    client: kube::Client,
    index: usize,
    r: &'static Resource,
    tx: mpsc::UnboundedSender<Change>,
) {
    let ar = api_resource(r);
    let api: kube::Api<DynamicObject> = kube::Api::all_with(client, &ar);
    // Metadata only (`PartialObjectMetadata`), as upstream's garbage collector reads: the graph
    // needs owners, finalizers and deletion, never specs.
    let stream = metadata_watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut seen: HashSet<String> = HashSet::new();
    while let Some(ev) = stream.next().await {
        let change = match ev {
            Ok(watcher::Event::Init) => {
                seen.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                let Some(obs) = observe(index, r, &o.metadata) else {
                    continue;
                };
                seen.insert(obs.id.uid.clone());
                Change::Upsert(obs)
            }
            Ok(watcher::Event::InitDone) => Change::Listed(index, std::mem::take(&mut seen)),
            Ok(watcher::Event::Apply(o)) => match observe(index, r, &o.metadata) {
                Some(obs) => Change::Upsert(obs),
                None => continue,
            },
            Ok(watcher::Event::Delete(o)) => match o.metadata.uid.clone() {
                Some(uid) => Change::Delete(uid),
                None => continue,
            },
            Err(e) => {
                tracing::debug!(kind = r.kind, error = %e, "garbage collector watch error");
                continue;
            }
        };
        if tx.send(change).is_err() {
            return;
        }
    }
}

fn observe(index: usize, r: &Resource, m: &ObjectMeta) -> Option<Observed> {
    Some(Observed {
        id: Identity {
            api_version: r.api_version(),
            kind: r.kind.into(),
            namespace: m.namespace.clone(),
            name: m.name.clone()?,
            uid: m.uid.clone()?,
        },
        owners: m.owner_references.clone().unwrap_or_default(),
        deleting: m.deletion_timestamp.is_some(),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        monitor: index,
    })
}

impl Ctx {
    fn namespaced(&self, api_version: &str, kind: &str) -> bool {
        self.kinds
            .get(&(api_version.to_string(), kind.to_string()))
            .is_none_or(|r| r.namespaced)
    }

    fn api(&self, id: &Identity) -> Result<kube::Api<DynamicObject>, GcError> {
        let r = self
            .kinds
            .get(&(id.api_version.clone(), id.kind.clone()))
            .ok_or_else(|| GcError::UnknownKind(id.kind.clone(), id.api_version.clone()))?;
        let ar = api_resource(r);
        Ok(match (&id.namespace, r.namespaced) {
            (Some(ns), true) => kube::Api::namespaced_with(self.client.clone(), ns, &ar),
            _ => kube::Api::all_with(self.client.clone(), &ar),
        })
    }

    /// The object at `id` if it still is the object with `id`'s uid.
    async fn get_live(&self, id: &Identity) -> Result<Option<DynamicObject>, GcError> {
        let got = self.api(id)?.get_opt(&id.name).await?;
        Ok(got.filter(|o| o.metadata.uid.as_deref() == Some(id.uid.as_str())))
    }
}

fn work_key(w: &Work) -> String {
    match w {
        Work::AttemptToDelete(u) => format!("delete/{u}"),
        Work::AttemptToOrphan(u) => format!("orphan/{u}"),
    }
}

async fn process(ctx: &Arc<Ctx>, w: &Work) {
    let result = match w {
        Work::AttemptToDelete(uid) => attempt_delete(ctx, uid).await,
        Work::AttemptToOrphan(uid) => attempt_orphan(ctx, uid).await,
    };
    let key = work_key(w);
    match result {
        Ok(()) => ctx.failures.reset(&key),
        Err(GcError::UnknownKind(kind, av)) => {
            tracing::warn!(%kind, api_version = %av, "garbage collector: owner kind not served; ignoring the item");
        }
        Err(e) => {
            let delay = ctx.failures.next_delay(&key);
            tracing::info!(work = %key, error = %e, ?delay, "garbage collector: retrying");
            let ctx = ctx.clone();
            let w = w.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                ctx.queue.add(w);
            });
        }
    }
}

/// Classifies the owner references of `dep` (upstream's `classifyReferences`): the graph's
/// observed owners are trusted to exist; others are looked up live.
async fn classify(
    ctx: &Ctx,
    dep: &Identity,
    refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
) -> Result<Vec<(String, OwnerState)>, GcError> {
    let mut out = Vec::with_capacity(refs.len());
    for r in refs {
        let cached = {
            let g = ctx.graph.lock().unwrap_or_else(|p| p.into_inner());
            g.nodes.get(&r.uid).and_then(|n| n.observed.clone())
        };
        let owner_namespaced = ctx.namespaced(&r.api_version, &r.kind);
        let state = match cached {
            Some(o) if o.deleting_dependents() => OwnerState::WaitingForDependents,
            Some(_) => OwnerState::Solid,
            None if !reconcile::resolvable(dep.namespace.is_some(), owner_namespaced) => {
                // A cluster-scoped object cannot name a namespaced owner: upstream leaves it
                // alone (the reference can never be resolved).
                tracing::warn!(object = %show(dep), owner = %r.name, kind = %r.kind,
                    "garbage collector: a cluster-scoped object names a namespaced owner; ignored");
                OwnerState::Solid
            }
            None if ctx
                .absent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&r.uid) =>
            {
                OwnerState::Dangling
            }
            None => {
                let id = reconcile::owner_identity(r, dep, owner_namespaced);
                match ctx.get_live(&id).await? {
                    None => {
                        let mut absent = ctx.absent.lock().unwrap_or_else(|p| p.into_inner());
                        if absent.len() >= ABSENT_CACHE {
                            absent.clear();
                        }
                        absent.insert(r.uid.clone());
                        OwnerState::Dangling
                    }
                    Some(o)
                        if o.metadata.deletion_timestamp.is_some()
                            && o.metadata.finalizers.iter().flatten().any(|f| f == FOREGROUND) =>
                    {
                        OwnerState::WaitingForDependents
                    }
                    Some(_) => OwnerState::Solid,
                }
            }
        };
        out.push((r.uid.clone(), state));
    }
    Ok(out)
}

async fn attempt_delete(ctx: &Ctx, uid: &str) -> Result<(), GcError> {
    let node = {
        let g = ctx.graph.lock().unwrap_or_else(|p| p.into_inner());
        g.nodes.get(uid).cloned()
    };
    let Some(node) = node else { return Ok(()) };
    if let Some(o) = &node.observed
        && o.deleting
        && !o.deleting_dependents()
    {
        return Ok(());
    }
    let Some(latest) = ctx.get_live(&node.id).await? else {
        // Gone (or replaced): the graph forgets it and its dependents are looked at.
        let _ = ctx.changes.send(Change::Delete(uid.to_string()));
        return Ok(());
    };
    let m = &latest.metadata;
    let refs = m.owner_references.clone().unwrap_or_default();
    let (dependents, blocking) = {
        let g = ctx.graph.lock().unwrap_or_else(|p| p.into_inner());
        let deps: Vec<(String, bool)> = g
            .nodes
            .get(uid)
            .map(|n| {
                n.dependents
                    .iter()
                    .map(|d| {
                        let waiting = g.nodes.get(d).is_some_and(|n| n.deleting_dependents());
                        (d.clone(), waiting)
                    })
                    .collect()
            })
            .unwrap_or_default();
        (deps, g.blocking_dependents(uid))
    };
    let item = Item {
        deleting: m.deletion_timestamp.is_some(),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        dependents,
        blocking,
    };
    let owners = if item.deleting {
        Vec::new()
    } else {
        classify(ctx, &node.id, &refs).await?
    };
    let decision = attempt_to_delete(&item, &owners);
    let api = ctx.api(&node.id)?;
    let rv = m.resource_version.clone();
    match decision {
        Decision::Nothing => Ok(()),
        Decision::RemoveForegroundFinalizer => remove_finalizer(&api, &node.id.name, FOREGROUND).await,
        Decision::DeleteDependents(deps) => {
            for d in deps {
                ctx.queue.add(Work::AttemptToDelete(d));
            }
            Ok(())
        }
        Decision::RemoveOwnerReferences(uids) => {
            tracing::info!(object = %show(&node.id), owners = ?uids, "garbage collector: removing references to dangling or deleting owners");
            let patch = json!({"metadata": {"ownerReferences": refs_value(without_owners(&refs, &uids)), "resourceVersion": rv}});
            patch_ignoring_missing(&api, &node.id.name, &patch).await
        }
        Decision::Delete { policy, unblock } => {
            if unblock {
                let patch = json!({"metadata": {"ownerReferences": unblocked(&refs), "resourceVersion": rv}});
                patch_ignoring_missing(&api, &node.id.name, &patch).await?;
            }
            tracing::info!(object = %show(&node.id), policy = policy.as_str(), "garbage collector: deleting object");
            let dp = DeleteParams {
                propagation_policy: Some(match policy {
                    Policy::Background => PropagationPolicy::Background,
                    Policy::Foreground => PropagationPolicy::Foreground,
                    Policy::Orphan => PropagationPolicy::Orphan,
                }),
                preconditions: Some(Preconditions {
                    uid: Some(node.id.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&node.id.name, &dp).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// Orphans the dependents of `uid` (removes their references to it), then removes its
/// `orphan` finalizer.
async fn attempt_orphan(ctx: &Ctx, uid: &str) -> Result<(), GcError> {
    let (owner, dependents) = {
        let g = ctx.graph.lock().unwrap_or_else(|p| p.into_inner());
        let Some(n) = g.nodes.get(uid) else { return Ok(()) };
        let deps: Vec<Identity> = n
            .dependents
            .iter()
            .filter_map(|d| g.nodes.get(d).map(|dn| dn.id.clone()))
            .collect();
        (n.id.clone(), deps)
    };
    for dep in &dependents {
        let api = ctx.api(dep)?;
        // Retried on a conflict by the queue.
        let Some(latest) = ctx.get_live(dep).await? else {
            continue;
        };
        let refs = latest.metadata.owner_references.clone().unwrap_or_default();
        if !refs.iter().any(|r| r.uid == uid) {
            continue;
        }
        let patch = json!({"metadata": {
            "ownerReferences": refs_value(without_owners(&refs, &[uid.to_string()])),
            "resourceVersion": latest.metadata.resource_version,
        }});
        patch_ignoring_missing(&api, &dep.name, &patch).await?;
    }
    tracing::info!(object = %show(&owner), dependents = dependents.len(), "garbage collector: orphaned dependents");
    remove_finalizer(&ctx.api(&owner)?, &owner.name, ORPHAN).await
}

async fn patch_ignoring_missing(
    api: &kube::Api<DynamicObject>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), GcError> {
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes `finalizer` from the object (its other finalizers stay; a conflict is retried).
async fn remove_finalizer(
    api: &kube::Api<DynamicObject>,
    name: &str,
    finalizer: &str,
) -> Result<(), GcError> {
    let Some(o) = api.get_opt(name).await? else {
        return Ok(());
    };
    let current = o.metadata.finalizers.clone().unwrap_or_default();
    if !current.iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let left: Vec<&String> = current.iter().filter(|f| *f != finalizer).collect();
    let patch = json!({"metadata": {"finalizers": left, "resourceVersion": o.metadata.resource_version}});
    patch_ignoring_missing(api, name, &patch).await
}

/// Owner references as a merge patch sets them: none left removes the field.
fn refs_value(
    refs: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> serde_json::Value {
    if refs.is_empty() {
        serde_json::Value::Null
    } else {
        json!(refs)
    }
}

fn show(id: &Identity) -> String {
    match &id.namespace {
        Some(ns) => format!("{} {ns}/{}", id.kind, id.name),
        None => format!("{} {}", id.kind, id.name),
    }
}
