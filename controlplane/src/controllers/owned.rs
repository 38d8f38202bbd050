//! Children by their controller's uid: an index over one informer's cache, fed inline from the
//! change and deletion streams a controller already consumes (so it is updated before the
//! controller is triggered), that lets a controller read its own children without scanning
//! every object of the kind at each reconcile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{ObjectRef, Store};

use super::informer::Object;

/// The uid of `o`'s controller (owner reference with `controller: true`), if any.
pub fn controller_uid<K: kube::Resource>(o: &K) -> Option<&str> {
    o.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

/// Children of each controller uid, as references into the informer's cache.
pub struct OwnedIndex<K: Object> {
    store: Store<K>,
    by_owner: Mutex<HashMap<String, HashSet<ObjectRef<K>>>>,
}

impl<K: Object> std::fmt::Debug for OwnedIndex<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedIndex")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

impl<K: Object> OwnedIndex<K> {
    /// An empty index over `store`.
    pub fn new(store: Store<K>) -> Self {
        Self {
            store,
            by_owner: Mutex::new(HashMap::new()),
        }
    }

    /// `o` was added or changed.
    pub fn observe(&self, o: &K) {
        if let Some(uid) = controller_uid(o) {
            self.by_owner
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(uid.to_string())
                .or_default()
                .insert(ObjectRef::from_obj(o));
        }
    }

    /// `o` was deleted.
    pub fn forget(&self, o: &K) {
        let Some(uid) = controller_uid(o) else { return };
        let mut map = self.by_owner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = map.get_mut(uid) {
            set.remove(&ObjectRef::from_obj(o));
            if set.is_empty() {
                map.remove(uid);
            }
        }
    }

    /// The cached children of the controller `owner_uid` (entries that left the cache or
    /// changed controller are dropped on the way).
    pub fn children(&self, owner_uid: &str) -> Vec<Arc<K>> {
        let mut map = self.by_owner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(set) = map.get_mut(owner_uid) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(set.len());
        set.retain(|r| match self.store.get(r) {
            Some(o) if controller_uid(&*o) == Some(owner_uid) => {
                out.push(o);
                true
            }
            _ => false,
        });
        if set.is_empty() {
            map.remove(owner_uid);
        }
        out
    }
}
