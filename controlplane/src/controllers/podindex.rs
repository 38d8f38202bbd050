//! Pods by the node they are bound to (upstream's `spec.nodeName` informer index), for the
//! controllers that act on a node's pods: the node lifecycle (mark them not ready) and taint
//! eviction (a node's NoExecute taints changed). Kept from the shared pod informer's change and
//! deletion streams; lookups resolve through the pod cache, so an entry the streams left behind
//! (a relist drops deletions) is never returned and is pruned on the way.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Running;
use super::informer::Informer;

/// The node a pod is bound to (`None` while unscheduled).
pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Node → pod → uid (a deletion removes only the pod it was about, even when a pod of the same
/// name was created again meanwhile: the change and deletion streams are not ordered together).
type Index = HashMap<String, HashMap<ObjectRef<Pod>, String>>;

/// The index; clones share it.
#[derive(Clone)]
pub struct PodsByNode {
    index: Arc<RwLock<Index>>,
    pods: Store<Pod>,
}

impl std::fmt::Debug for PodsByNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodsByNode").finish_non_exhaustive()
    }
}

impl PodsByNode {
    /// The index over `pods`, and the task that keeps it (subscribes now: call before the
    /// informers start).
    pub fn new(pods: &Informer<Pod>) -> (Self, Running) {
        let me = Self {
            index: Arc::new(RwLock::new(HashMap::new())),
            pods: pods.reader(),
        };
        let changed = pods.subscribe().map(|p| (p, true));
        let deleted = pods.deletions().map(|p| (p, false));
        let index = me.index.clone();
        let task = futures::stream::select(changed, deleted).for_each(move |(p, present)| {
            if let Some(node) = node_of(&p) {
                let r = ObjectRef::from_obj(&*p);
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let mut idx = index.write().unwrap_or_else(|e| e.into_inner());
                if present {
                    idx.entry(node.to_string()).or_default().insert(r, uid);
                } else if let Some(set) = idx.get_mut(node) {
                    if set.get(&r) == Some(&uid) {
                        set.remove(&r);
                    }
                    if set.is_empty() {
                        idx.remove(node);
                    }
                }
            }
            futures::future::ready(())
        });
        (me, Box::pin(task))
    }

    /// The cached pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        let refs: Vec<ObjectRef<Pod>> = {
            let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
            idx.get(node)
                .map(|s| s.keys().cloned().collect())
                .unwrap_or_default()
        };
        let mut out = Vec::with_capacity(refs.len());
        let mut stale = Vec::new();
        for r in refs {
            match self.pods.get(&r) {
                Some(p) if node_of(&p) == Some(node) => out.push(p),
                _ => stale.push(r),
            }
        }
        if !stale.is_empty() {
            let mut idx = self.index.write().unwrap_or_else(|e| e.into_inner());
            if let Some(set) = idx.get_mut(node) {
                for r in &stale {
                    set.remove(r);
                }
                if set.is_empty() {
                    idx.remove(node);
                }
            }
        }
        out
    }
}
