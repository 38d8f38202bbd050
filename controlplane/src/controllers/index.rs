//! Indexes of one kind's cached objects by a key (their controller's uid, or the node a pod is
//! bound to), so a reconcile reads its own pods or revisions without scanning the whole cache.
//!
//! An index is kept by an informer hook ([`Informer::on_event`]): it sees each watch event in
//! order and before the cache applies it, so whenever a controller is woken by a change the
//! index already files the changed object. Lookups answer through the cache itself: an entry
//! for an object that is gone (a relist drops deletions) or has moved to another key is
//! skipped and pruned. A relist (which drops the deletions missed while the watch was down)
//! rebuilds the index from the listed objects.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::informer::{Informer, Object};

/// The key an object is filed under (`None`: not filed).
type KeyFn<K> = fn(&K) -> Option<String>;

#[derive(Default)]
struct Maps {
    /// Key → (namespace, name) of the objects filed under it.
    by_key: HashMap<String, HashSet<(String, String)>>,
    /// (namespace, name) → the key it is filed under.
    key_of: HashMap<(String, String), String>,
}

impl Maps {
    fn file(&mut self, id: (String, String), key: Option<String>) {
        self.unfile(&id);
        if let Some(key) = key {
            self.by_key.entry(key.clone()).or_default().insert(id.clone());
            self.key_of.insert(id, key);
        }
    }

    fn unfile(&mut self, id: &(String, String)) {
        if let Some(old) = self.key_of.remove(id)
            && let Some(set) = self.by_key.get_mut(&old)
        {
            set.remove(id);
            if set.is_empty() {
                self.by_key.remove(&old);
            }
        }
    }
}

/// An index of `K` by the key `key_fn` gives each object.
pub struct Index<K: Object> {
    store: Store<K>,
    key_fn: KeyFn<K>,
    maps: Mutex<State>,
}

#[derive(Default)]
struct State {
    current: Maps,
    /// The index being rebuilt by a relist (swapped in when the list is complete).
    relist: Option<Maps>,
}

impl<K: Object> std::fmt::Debug for Index<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

/// The uid of `o`'s controller (owner reference with `controller: true`), if any.
pub fn controller_uid<K: kube::Resource>(o: &K) -> Option<&str> {
    o.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

fn orphan_key(ns: &str) -> String {
    format!("orphan/{ns}")
}

/// Controller uid, or `orphan/<namespace>` for objects without a controller.
fn controller_key<K: kube::Resource>(o: &K) -> Option<String> {
    Some(controller_uid(o).map_or_else(
        || orphan_key(o.meta().namespace.as_deref().unwrap_or_default()),
        str::to_string,
    ))
}

/// The node a pod is bound to (`None` while unscheduled).
pub fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn node_key(p: &Pod) -> Option<String> {
    node_of(p).map(str::to_string)
}

fn id_of<K: kube::Resource>(o: &K) -> (String, String) {
    let m = o.meta();
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

impl<K: Object> Index<K> {
    /// An index kept current by a hook on `informer` (call before the informers start).
    fn new(informer: &Informer<K>, key_fn: KeyFn<K>) -> Arc<Self> {
        let idx = Arc::new(Self {
            store: informer.reader(),
            key_fn,
            maps: Mutex::new(State::default()),
        });
        let weak = Arc::downgrade(&idx);
        informer.on_event(Box::new(move |ev| {
            let Some(idx) = weak.upgrade() else { return };
            let mut state = idx.lock();
            match ev {
                watcher::Event::Apply(o) => state.current.file(id_of(o), (idx.key_fn)(o)),
                watcher::Event::Delete(o) => state.current.unfile(&id_of(o)),
                watcher::Event::Init => state.relist = Some(Maps::default()),
                watcher::Event::InitApply(o) => {
                    let key = (idx.key_fn)(o);
                    if let Some(relist) = state.relist.as_mut() {
                        relist.file(id_of(o), key.clone());
                    }
                    state.current.file(id_of(o), key);
                }
                watcher::Event::InitDone => {
                    if let Some(relist) = state.relist.take() {
                        state.current = relist;
                    }
                }
            }
        }));
        idx
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cached objects filed under `key` (stale entries pruned).
    fn lookup(&self, key: &str) -> Vec<Arc<K>> {
        let mut state = self.lock();
        let maps = &mut state.current;
        let Some(ids) = maps.by_key.get_mut(key) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(ids.len());
        ids.retain(|(ns, name)| {
            let r = ObjectRef::new(name);
            match self.store.get(&if ns.is_empty() { r } else { r.within(ns) }) {
                Some(o) if (self.key_fn)(&o).as_deref() == Some(key) => {
                    out.push(o);
                    true
                }
                // Not yet in the cache (the hook runs first): keep it.
                None => true,
                Some(_) => false,
            }
        });
        if ids.is_empty() {
            maps.by_key.remove(key);
        }
        out
    }

    /// Waits until the cache behind the index has listed once.
    pub async fn synced(&self) {
        super::informer::synced(&self.store).await;
    }

    /// The cached object `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }
}

/// The index of `K` by controller.
pub type OwnerIndex<K> = Index<K>;

impl<K: Object> Index<K> {
    /// Objects of `informer` by their controller's uid (and the orphans by namespace); one
    /// index per informer, however many controllers ask.
    pub fn by_controller(informer: &Informer<K>) -> Arc<Self> {
        informer.shared("by-controller", || Self::new(informer, controller_key::<K>))
    }

    /// The cached objects whose controller has `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<Arc<K>> {
        self.lookup(uid)
    }

    /// The cached objects of `namespace` without a controller.
    pub fn orphans(&self, namespace: &str) -> Vec<Arc<K>> {
        self.lookup(&orphan_key(namespace))
    }
}

/// Pods by the node they are bound to (upstream's `spec.nodeName` informer index), for the
/// controllers that act on a node's pods: the node lifecycle (mark them not ready) and taint
/// eviction (a node's NoExecute taints changed).
pub type PodsByNode = Index<Pod>;

impl Index<Pod> {
    /// The pods of `informer` by node.
    pub fn by_node(informer: &Informer<Pod>) -> Arc<Self> {
        informer.shared("by-node", || Self::new(informer, node_key))
    }

    /// The cached pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        self.lookup(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, owner: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "ownerReferences": owner.map(|o| vec![serde_json::json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": o, "uid": o,
                    "controller": true,
                })]),
            },
            "spec": {"containers": [], "nodeName": node},
        }))
        .expect("pod")
    }

    #[test]
    fn keys_of_controller_and_node_indexes() {
        assert_eq!(
            controller_key(&pod("a", None, Some("rs-1"))).as_deref(),
            Some("rs-1")
        );
        assert_eq!(
            controller_key(&pod("a", None, None)).as_deref(),
            Some("orphan/default")
        );
        assert_eq!(node_key(&pod("a", Some("n1"), None)).as_deref(), Some("n1"));
        assert_eq!(node_key(&pod("a", None, None)), None);
    }

    #[test]
    fn refiling_moves_an_object_and_unfiling_removes_it() {
        let mut maps = Maps::default();
        let id = ("default".to_string(), "a".to_string());
        maps.file(id.clone(), Some("n1".into()));
        maps.file(id.clone(), Some("n2".into()));
        assert!(!maps.by_key.contains_key("n1"));
        assert_eq!(maps.by_key["n2"].len(), 1);
        maps.file(id.clone(), None);
        assert!(maps.by_key.is_empty() && maps.key_of.is_empty());
        maps.file(id.clone(), Some("n1".into()));
        maps.unfile(&id);
        assert!(maps.by_key.is_empty() && maps.key_of.is_empty());
    }
}
