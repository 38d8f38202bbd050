//! An index of one kind's cached objects by their controller's uid (and of the orphans by
//! namespace), so a reconcile reads its own pods or revisions without scanning the whole cache.
//! Fed by the informer's change and deletion streams; answers through the cache itself, so an
//! entry the index still holds for an object that is gone or changed owner is skipped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::informer::{Informer, Object};

#[derive(Default)]
struct Maps {
    /// Controller uid (or `orphan/<namespace>`) → object names.
    by_owner: HashMap<String, HashSet<(String, String)>>,
    /// Object (namespace, name) → the key it is filed under.
    key_of: HashMap<(String, String), String>,
}

/// The index of `K` by controller.
pub struct OwnerIndex<K: Object> {
    store: Store<K>,
    maps: Mutex<Maps>,
}

impl<K: Object> std::fmt::Debug for OwnerIndex<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerIndex").finish_non_exhaustive()
    }
}

fn controller_uid<K: kube::Resource>(o: &K) -> Option<&str> {
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

impl<K: Object> OwnerIndex<K> {
    /// An index kept up to date from `informer` (subscribe before the informers start).
    pub fn new(informer: &Informer<K>) -> Arc<Self> {
        let idx = Arc::new(Self {
            store: informer.reader(),
            maps: Mutex::new(Maps::default()),
        });
        let changes = informer.subscribe().map(|o| (o, true));
        let deletions = informer.deletions().map(|o| (o, false));
        let events = futures::stream::select(changes, deletions);
        let weak = Arc::downgrade(&idx);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some((o, present)) = events.next().await {
                let Some(idx) = weak.upgrade() else { return };
                idx.file(&o, present);
            }
        });
        idx
    }

    fn file(&self, o: &K, present: bool) {
        let m = o.meta();
        let id = (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        );
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = maps.key_of.remove(&id)
            && let Some(set) = maps.by_owner.get_mut(&old)
        {
            set.remove(&id);
            if set.is_empty() {
                maps.by_owner.remove(&old);
            }
        }
        if present {
            let key = controller_uid(o).map_or_else(|| orphan_key(&id.0), str::to_string);
            maps.by_owner.entry(key.clone()).or_default().insert(id.clone());
            maps.key_of.insert(id, key);
        }
    }

    fn lookup(&self, key: &str) -> Vec<Arc<K>> {
        let ids: Vec<(String, String)> = {
            let maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
            maps.by_owner
                .get(key)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default()
        };
        ids.into_iter()
            .filter_map(|(ns, name)| {
                let r = ObjectRef::new(&name);
                self.store.get(&if ns.is_empty() { r } else { r.within(&ns) })
            })
            .collect()
    }

    /// The cached objects whose controller has `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<Arc<K>> {
        self.lookup(uid)
            .into_iter()
            .filter(|o| controller_uid(&**o) == Some(uid))
            .collect()
    }

    /// The cached objects of `namespace` without a controller.
    pub fn orphans(&self, namespace: &str) -> Vec<Arc<K>> {
        self.lookup(&orphan_key(namespace))
            .into_iter()
            .filter(|o| controller_uid(&**o).is_none())
            .collect()
    }

    /// The cached object `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }
}
