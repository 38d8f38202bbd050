//! Node IPAM (`node-ipam-controller`, events from `cidrAllocator`): every Node gets
//! `spec.podCIDR`/`spec.podCIDRs` from the cluster CIDR (`--cluster-cidr`, default
//! 10.244.0.0/16, one `/--node-cidr-mask-size` (24) each) when it registers; the CIDRs nodes
//! already hold are taken first, so none is handed out twice, and a deleted node's CIDR is free
//! again. A kube-runtime `Controller` over nodes; the allocator is one locked table.

pub mod reconcile;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use serde_json::json;

use super::{Failures, Manager, Running, key_of};
use crate::events::{Involved, Kind, Recorder};
pub use reconcile::IpamConfig;
use reconcile::{Allocator, IpamError};

/// Upstream's component name of the range allocator's events.
pub const COMPONENT: &str = "cidrAllocator";
/// When to look again at a node that found no CIDR left.
const EXHAUSTED_RETRY: Duration = Duration::from_secs(60);

/// Errors of one node's sync.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}")]
    Api(#[from] kube::Error),
}

struct Ctx {
    client: kube::Client,
    nodes: Store<Node>,
    recorder: Arc<Recorder>,
    allocator: Mutex<Allocator>,
    /// Set once the CIDRs of the nodes at start are recorded.
    loaded: tokio::sync::OnceCell<()>,
    failures: Failures,
}

impl Ctx {
    fn allocator(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.allocator.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The controller (nothing when `--allocate-node-cidrs=false` or the CIDRs are invalid).
pub fn controller(mgr: &Manager) -> Running {
    let cfg = mgr.cfg.node_ipam.clone();
    if !cfg.enabled {
        return Box::pin(futures::future::pending());
    }
    let allocator = match Allocator::new(cfg.cluster_cidr, cfg.node_mask) {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "node IPAM disabled");
            return Box::pin(futures::future::pending());
        }
    };
    let nodes = mgr.informers.get::<Node>();
    let ctx = Arc::new(Ctx {
        client: mgr.client.clone(),
        nodes: nodes.reader(),
        recorder: mgr.recorder(COMPONENT),
        allocator: Mutex::new(allocator),
        loaded: tokio::sync::OnceCell::new(),
        failures: Failures::default(),
    });
    let released = {
        let ctx = ctx.clone();
        nodes.deletions().for_each(move |n| {
            if let Some(cidr) = ctx
                .allocator()
                .release(n.metadata.uid.as_deref().unwrap_or_default())
            {
                tracing::info!(node = %key_of(&*n), %cidr, "pod CIDR released");
            }
            futures::future::ready(())
        })
    };
    let ctl = Controller::for_shared_stream(nodes.subscribe(), nodes.reader())
        .with_config(mgr.controller_config())
        .run(reconcile_node, error_policy, ctx)
        .for_each(|_| futures::future::ready(()));
    Box::pin(async move {
        futures::future::join(ctl, released).await;
    })
}

fn error_policy(node: Arc<Node>, err: &SyncError, ctx: Arc<Ctx>) -> Action {
    let delay = ctx.failures.next_delay(&key_of(&*node));
    tracing::warn!(node = %key_of(&*node), error = %err, retry_in = ?delay, "pod CIDR not assigned");
    Action::requeue(delay)
}

/// The CIDRs the nodes in the cache hold (once, before the first allocation).
async fn load(ctx: &Ctx) {
    super::informer::synced(&ctx.nodes).await;
    let mut a = ctx.allocator();
    for n in ctx.nodes.state() {
        let uid = n.metadata.uid.as_deref().unwrap_or_default();
        for cidr in pod_cidrs(&n).iter().take(1) {
            if let Err(e) = a.occupy(uid, cidr) {
                tracing::warn!(node = %key_of(&*n), error = %e, "pod CIDR not recorded");
            }
        }
    }
}

fn pod_cidrs(n: &Node) -> Vec<String> {
    let spec = n.spec.as_ref();
    let list = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if !list.is_empty() {
        return list;
    }
    spec.and_then(|s| s.pod_cidr.clone())
        .filter(|c| !c.is_empty())
        .into_iter()
        .collect()
}

fn involved(n: &Node) -> Involved {
    Involved::of(n)
}

async fn reconcile_node(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, SyncError> {
    ctx.loaded.get_or_init(|| load(&ctx)).await;
    let name = node.metadata.name.clone().unwrap_or_default();
    let uid = node.metadata.uid.clone().unwrap_or_default();
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(cidr) = pod_cidrs(&node).first() {
        if let Err(e) = ctx.allocator().occupy(&uid, cidr) {
            tracing::warn!(node = %name, error = %e, "pod CIDR not recorded");
        }
        return Ok(Action::await_change());
    }
    let allocated = ctx.allocator().allocate(&uid);
    let cidr = match allocated {
        Ok(c) => c,
        Err(e @ IpamError::Exhausted(_)) => {
            tracing::warn!(node = %name, error = %e, "no pod CIDR for the node");
            ctx.recorder
                .record(
                    &involved(&node),
                    Kind::Normal,
                    "CIDRNotAvailable",
                    "",
                    &format!("Node {name} status is now: CIDRNotAvailable"),
                )
                .await;
            return Ok(Action::requeue(EXHAUSTED_RETRY));
        }
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "no pod CIDR for the node");
            return Ok(Action::await_change());
        }
    };
    let api: kube::Api<Node> = kube::Api::all(ctx.client.clone());
    let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
                       "spec": {"podCIDR": cidr.to_string(), "podCIDRs": [cidr.to_string()]}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(node = %name, %cidr, "pod CIDR assigned");
            ctx.failures.reset(&name);
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.allocator().release(&uid);
            Ok(Action::await_change())
        }
        // Changed meanwhile: the next look decides again (the reservation is kept).
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Action::requeue(Duration::from_millis(100))),
        Err(e) => {
            ctx.allocator().release(&uid);
            ctx.recorder
                .record(
                    &involved(&node),
                    Kind::Normal,
                    "CIDRAssignmentFailed",
                    "",
                    &format!("Node {name} status is now: CIDRAssignmentFailed"),
                )
                .await;
            Err(e.into())
        }
    }
}
