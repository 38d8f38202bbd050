//! Pod workers: the pods bound to this node run through the node's runtime process, and their
//! status is written back (docs/SEEDS-SPEC.md §4, NODE-1).
//!
//! The pods come from a watch (`fieldSelector=spec.nodeName=<node>`, kube's watcher); the
//! runtime's sandboxes and containers from a relist every [`RELIST`] (the kubelet's PLEG). Each
//! pod has one worker task (`worker.rs`) that wakes on a change of either, or when a back-off
//! ends. Its decisions are pure functions over typed objects: what to do next in `plan.rs`, the
//! status in `status.rs`, the restart back-off in `backoff.rs`; the worker only moves data.
//! Sandboxes of pods the API no longer has are removed once the first list is in.
//!
//! New pods pass node admission first (`admission.rs`, and `pressure.rs` under node pressure).
//! Every 10 s the node's memory and ephemeral storage are compared with the hard eviction
//! thresholds and one pod is evicted when one is met (`pressure.rs`). When the node shuts down,
//! the pods are stopped by priority band (`shutdown.rs`). Both reach a pod through its worker's
//! kill channel. Not yet: service environment variables.

mod admission;
pub(crate) mod backoff;
mod container;
mod correlator;
mod dns;
mod env;
pub(crate) mod events;
mod eviction;
mod grpc;
mod hooks;
mod plan;
pub mod pressure;
mod probe;
pub mod shutdown;
mod status;
mod volumes;
mod worker;

/// Where pods' directories (their volumes) live.
pub use volumes::ROOT as PODS_ROOT;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::{mpsc, watch};

use crate::settings::ShutdownGracePeriod;
use shutdown::NodeState;
use worker::{Ctx, Snapshot, Worker, blocking, runtime};

/// How often the runtime's state is listed (the kubelet's PLEG relists every second).
pub const RELIST: Duration = Duration::from_secs(1);

/// What the pod workers need to know about the node.
#[derive(Debug, Clone)]
pub struct PodSettings {
    pub node: String,
    pub node_ip: Option<String>,
    /// Registries reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Graceful node shutdown's priority bands (empty: off).
    pub shutdown_bands: Vec<ShutdownGracePeriod>,
    /// Eviction thresholds.
    pub thresholds: pressure::Thresholds,
    /// `evictionMaxPodGracePeriod` (soft evictions).
    pub max_pod_grace: u64,
    /// Image garbage collection, asked to remove unused images under image file system
    /// pressure before a pod is evicted.
    pub image_reclaim: Option<pressure::ImageReclaim>,
    /// `evictionMinimumReclaim`.
    pub min_reclaim: pressure::MinimumReclaim,
}

/// The runtime's sandboxes and containers (None when the runtime cannot be reached).
async fn relist() -> Option<Snapshot> {
    let taken = Instant::now();
    let listed = blocking(|| {
        let mut rt = runtime()?;
        Ok::<_, runtime_api::ClientError>((rt.list_sandboxes()?, rt.list_containers()?))
    })
    .await?;
    match listed {
        Ok((sandboxes, containers)) => Some(Snapshot {
            taken,
            sandboxes,
            containers: containers.into_iter().map(|c| (c.id.clone(), c)).collect(),
        }),
        Err(e) => {
            tracing::debug!(error = %e, "runtime relist failed");
            None
        }
    }
}

/// Publishes a fresh snapshot every [`RELIST`].
async fn pleg(tx: watch::Sender<Option<Arc<Snapshot>>>) {
    let mut tick = tokio::time::interval(RELIST);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(s) = relist().await
            && tx.send(Some(Arc::new(s))).is_err()
        {
            return;
        }
    }
}

/// A pod's worker, as the pod loop reaches it.
struct Handle {
    /// The pod's latest version (None once it is gone).
    pod: watch::Sender<Option<Arc<Pod>>>,
    /// Node shutdown's request to stop the pod.
    kill: mpsc::Sender<shutdown::Kill>,
}

/// The pod workers by pod uid.
type Workers = BTreeMap<String, Handle>;

/// Whether a pod is in a terminal phase.
pub(super) fn terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Admits a pod new to this agent (NODE-12): a rejected pod is written `Failed` with the
/// kubelet's reason and message (and handed to its worker that way, so nothing runs). Pods the
/// runtime already runs, terminal pods and pods being deleted are not checked.
async fn admit(
    ctx: &Ctx,
    snap_rx: &watch::Receiver<Option<Arc<Snapshot>>>,
    workers: &Workers,
    shutting_down: bool,
    pressure: pressure::Pressure,
    pod: &mut Pod,
) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let runs = snap_rx
        .borrow()
        .as_ref()
        .is_some_and(|s| s.sandboxes.iter().any(|sb| sb.uid == uid));
    if runs || terminal(pod) || pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    if shutting_down {
        let r = admission::Rejection {
            reason: shutdown::REJECT_REASON.into(),
            message: shutdown::REJECT_MESSAGE.into(),
        };
        return reject(ctx, pod, r).await;
    }
    if let Err(r) = pressure::admit(pressure, pod) {
        return reject(ctx, pod, r).await;
    }
    let node = match ctx.node_object().await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "reading this node failed; admitting without checks");
            return;
        }
    };
    let admitted: Vec<Arc<Pod>> = workers
        .values()
        .filter_map(|h| h.pod.borrow().clone())
        .filter(|p| !terminal(p) && p.metadata.uid.as_deref() != Some(uid.as_str()))
        .collect();
    let admitted: Vec<&Pod> = admitted.iter().map(Arc::as_ref).collect();
    let Err(r) = admission::admit(pod, &node, &admitted) else {
        return;
    };
    reject(ctx, pod, r).await;
}

/// Writes a pod the node does not run `Failed` with the kubelet's reason and message.
async fn reject(ctx: &Ctx, pod: &mut Pod, r: admission::Rejection) {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = pod.metadata.name.clone().unwrap_or_default();
    tracing::warn!(pod = %format!("{ns}/{name}"), reason = %r.reason, message = %r.message, "pod rejected");
    let api: kube::Api<Pod> = kube::Api::namespaced(ctx.client.clone(), &ns);
    let patch = kube::api::Patch::Merge(serde_json::json!({"status": {
        "phase": "Failed", "reason": r.reason, "message": r.message}}));
    if let Err(e) = api
        .patch_status(&name, &kube::api::PatchParams::default(), &patch)
        .await
    {
        tracing::warn!(error = %e, "writing the rejection failed");
    }
    let status = pod.status.get_or_insert_default();
    status.phase = Some("Failed".into());
    status.reason = Some(r.reason);
    status.message = Some(r.message);
}

/// The pods bound to this node as the agent last saw them from the API server (what the
/// kubelet's `/pods` answers).
pub type KnownPods = Arc<watch::Sender<Vec<Arc<Pod>>>>;

/// Starts a watch of every Service into a local cache, returned: the service environment
/// variables of each container start come from it instead of a list from the API (one round
/// trip per container start, part of a 64 ms gap between a sandbox and its container measured
/// under TCG). Stored without managedFields.
fn watch_services(client: kube::Client) -> reflector::Store<Service> {
    let (store, writer) = reflector::store();
    let api: kube::Api<Service> = kube::Api::all(client);
    let stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|s: &mut Service| s.metadata.managed_fields = None);
    let mut stream = reflector::reflector(writer, stream).boxed();
    tokio::spawn(async move {
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "the service watch failed; retrying");
            }
        }
    });
    store
}

/// Runs this node's pods. When `state` turns [`NodeState::ShuttingDown`], the pods are stopped
/// by priority band and new ones rejected; `state` then becomes [`NodeState::PodsStopped`].
/// `known` follows the pods the workers hold.
pub async fn run(
    client: kube::Client,
    settings: PodSettings,
    state: Arc<watch::Sender<NodeState>>,
    pressure: Arc<watch::Sender<pressure::Pressure>>,
    known: KnownPods,
    events: events::Recorder,
) {
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        node: container::NodeFacts {
            node: settings.node.clone(),
            node_ip: settings.node_ip.clone(),
            insecure_registries: settings.insecure_registries.clone(),
            memory: crate::node::memory_capacity(),
            allocatable_memory: kcore::allocatable::allocatable_memory(
                crate::node::memory_capacity(),
                settings
                    .thresholds
                    .reserved(pressure::Signal::MemoryAvailable, crate::node::memory_capacity()),
            ),
            cpus: crate::node::cpu_capacity(),
        },
        node_object: std::sync::Mutex::new(None),
        events,
        services: watch_services(client.clone()),
    });
    let (snap_tx, snap_rx) = watch::channel(None);
    tokio::spawn(pleg(snap_tx));
    // Admission and adoption need the runtime's view: wait for the first one.
    let mut first = snap_rx.clone();
    while first.borrow_and_update().is_none() {
        if first.changed().await.is_err() {
            return;
        }
    }
    let api: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", settings.node));
    let mut stream = watcher::watcher(api, config).boxed();
    let mut workers = Workers::new();
    // The uids of the list in progress; None between lists.
    let mut listing: Option<BTreeSet<String>> = None;
    let mut listed_once = false;
    let mut sweep = tokio::time::interval(Duration::from_secs(10));
    let mut evict = tokio::time::interval(pressure::INTERVAL);
    evict.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut evictor = pressure::Evictor::new(
        settings.thresholds.clone(),
        settings.max_pod_grace,
        settings.image_reclaim.clone(),
    )
    .with_minimum_reclaim(settings.min_reclaim.clone());
    let mut state_rx = state.subscribe();
    let mut shutting_down = false;
    if *state_rx.borrow_and_update() == NodeState::ShuttingDown {
        // Asked before the pods were listed: nothing of this agent's runs yet.
        shutting_down = true;
        start_shutdown(&workers, &settings.shutdown_bands, state.clone());
    }
    loop {
        let event = tokio::select! {
            e = stream.next() => e,
            _ = sweep.tick() => {
                if listed_once {
                    remove_orphans(&workers, &snap_rx).await;
                }
                continue;
            }
            _ = evict.tick(), if !shutting_down => {
                evictor.tick(&ctx.events, active(&workers), &pressure).await;
                continue;
            }
            changed = state_rx.changed(), if !shutting_down => {
                if changed.is_ok() && *state_rx.borrow_and_update() == NodeState::ShuttingDown {
                    shutting_down = true;
                    start_shutdown(&workers, &settings.shutdown_bands, state.clone());
                }
                continue;
            }
        };
        let Some(event) = event else {
            tracing::error!("the pod watch ended");
            return;
        };
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeSet::new()),
            Ok(watcher::Event::InitApply(pod)) => {
                if let (Some(seen), Some(uid)) = (listing.as_mut(), pod.metadata.uid.clone()) {
                    seen.insert(uid);
                }
                let p = *pressure.borrow();
                apply(&mut workers, &ctx, &snap_rx, (shutting_down, p), pod).await;
            }
            Ok(watcher::Event::InitDone) => {
                let seen = listing.take().unwrap_or_default();
                for (uid, h) in &workers {
                    if !seen.contains(uid) {
                        let _ = h.pod.send(None);
                    }
                }
                listed_once = true;
            }
            Ok(watcher::Event::Apply(pod)) => {
                let p = *pressure.borrow();
                apply(&mut workers, &ctx, &snap_rx, (shutting_down, p), pod).await
            }
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(h) = pod.metadata.uid.as_ref().and_then(|u| workers.get(u)) {
                    let _ = h.pod.send(None);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pod watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        workers.retain(|_, h| !h.pod.is_closed());
        let now: Vec<Arc<Pod>> = workers.values().filter_map(|h| h.pod.borrow().clone()).collect();
        known.send_if_modified(|old| {
            let same = old.len() == now.len() && old.iter().zip(&now).all(|(a, b)| Arc::ptr_eq(a, b));
            if !same {
                *old = now;
            }
            !same
        });
    }
}

/// The pods that have not ended, with their workers.
fn active(workers: &Workers) -> Vec<shutdown::Target> {
    workers
        .values()
        .filter_map(|h| {
            let pod = h.pod.borrow().clone()?;
            (!terminal(&pod)).then(|| shutdown::Target {
                pod,
                kill: h.kill.clone(),
            })
        })
        .collect()
}

/// Starts node shutdown: the pods that still run are stopped by priority band in the
/// background (the loop keeps taking pod changes, rejecting new pods); `state` becomes
/// [`NodeState::PodsStopped`] when that is over.
fn start_shutdown(workers: &Workers, bands: &[ShutdownGracePeriod], state: Arc<watch::Sender<NodeState>>) {
    let targets = active(workers);
    tracing::info!(pods = targets.len(), "node shutdown: stopping the pods");
    let bands = bands.to_vec();
    tokio::spawn(async move {
        shutdown::stop_pods(&bands, targets).await;
        tracing::info!("node shutdown: the pods are stopped");
        state.send_replace(NodeState::PodsStopped);
    });
}

/// Hands a pod's new version to its worker, starting one (after admission) for a new pod.
async fn apply(
    workers: &mut Workers,
    ctx: &Arc<Ctx>,
    snap_rx: &watch::Receiver<Option<Arc<Snapshot>>>,
    (shutting_down, pressure): (bool, pressure::Pressure),
    mut pod: Pod,
) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    if let Some(h) = workers.get(&uid)
        && !h.pod.is_closed()
    {
        let _ = h.pod.send(Some(Arc::new(pod)));
        return;
    }
    admit(ctx, snap_rx, workers, shutting_down, pressure, &mut pod).await;
    let (tx, rx) = watch::channel(Some(Arc::new(pod)));
    let (kill_tx, kill_rx) = mpsc::channel(1);
    let w = Worker::new(ctx.clone(), uid.clone(), rx, kill_rx, snap_rx.clone());
    tokio::spawn(w.run());
    workers.insert(
        uid,
        Handle {
            pod: tx,
            kill: kill_tx,
        },
    );
}

/// Removes sandboxes and volume directories whose pod has no worker (deleted while the agent
/// was down).
async fn remove_orphans(workers: &Workers, snap_rx: &watch::Receiver<Option<Arc<Snapshot>>>) {
    for entry in std::fs::read_dir(volumes::ROOT).into_iter().flatten().flatten() {
        let uid = entry.file_name().to_string_lossy().into_owned();
        if !workers.contains_key(&uid) {
            tracing::info!(uid = %uid, "the pod is gone from the API; removing its volumes");
            if let Err(e) = volumes::remove_pod_dir(&entry.path()) {
                tracing::warn!(uid = %uid, error = %e, "removing the pod's volumes failed");
            }
        }
    }
    let Some(snap) = snap_rx.borrow().clone() else {
        return;
    };
    let orphans: Vec<(String, String)> = snap
        .sandboxes
        .iter()
        .filter(|s| !workers.contains_key(&s.uid))
        .map(|s| (s.id.clone(), format!("{}/{}", s.namespace, s.name)))
        .collect();
    if orphans.is_empty() {
        return;
    }
    blocking(move || {
        let Ok(mut rt) = runtime() else { return };
        for (id, pod) in orphans {
            tracing::info!(sandbox = %id, pod = %pod, "the pod is gone from the API; removing its sandbox");
            if let Err(e) = rt.remove_sandbox(&id) {
                tracing::warn!(sandbox = %id, error = %e, "removing the sandbox failed");
            }
        }
    })
    .await;
}
