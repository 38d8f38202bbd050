//! Shared informers: one list+watch per kind for all controllers, a cache (kube's reflector
//! store) they read, a stream of changed objects they subscribe to, and a stream of deleted
//! objects. The deletions stream exists because kube-runtime 2.0's shared reflector dispatches
//! only applied objects to subscribers (see `Writer::dispatch_event` in kube-runtime's
//! `reflector/store.rs`): without it a ReplicaSet would not notice a pod deleted outright until a
//! resync.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

/// Objects a subscriber may lag behind before the writer waits for it.
const SUBSCRIBER_BUFFER: usize = 4096;
/// Deletions kept for slow receivers (a receiver that lags more triggers a resync instead).
const DELETION_BUFFER: usize = 4096;

/// Bound of the object types an informer serves.
pub trait Object:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// One kind's list+watch, cache and change streams.
pub struct Informer<K: Object> {
    api: kube::Api<K>,
    writer: Mutex<Option<Writer<K>>>,
    reader: Store<K>,
    deleted: broadcast::Sender<Arc<K>>,
}

impl<K: Object> Debug for Informer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informer")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

/// Drops what no controller reads: managedFields and the last-applied annotation.
fn strip<K: Object>(o: &mut K) {
    let m = o.meta_mut();
    m.managed_fields = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

impl<K: Object> Informer<K> {
    fn new(client: kube::Client) -> Self {
        let (reader, writer) = reflector::store_shared(SUBSCRIBER_BUFFER);
        let (deleted, _) = broadcast::channel(DELETION_BUFFER);
        Self {
            api: kube::Api::all(client),
            writer: Mutex::new(Some(writer)),
            reader,
            deleted,
        }
    }

    /// The cache.
    pub fn reader(&self) -> Store<K> {
        self.reader.clone()
    }

    /// Objects as they are added or changed (and every object after each relist). Subscribe
    /// before the informers start; afterwards this stream is empty.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let handle = self
            .writer
            .lock()
            .ok()
            .and_then(|w| w.as_ref().and_then(Writer::subscribe));
        futures::stream::iter(handle).flatten()
    }

    /// Objects as they are deleted (their last known state).
    pub fn deletions(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let rx = self.deleted.subscribe();
        futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(obj) => return Some((obj, rx)),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(kind = %K::kind(&()), missed = n, "deletions lagged");
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// Starts the list+watch (once).
    fn start(&self) {
        let Some(writer) = self.writer.lock().ok().and_then(|mut w| w.take()) else {
            return;
        };
        let deleted = self.deleted.clone();
        let stream = watcher(self.api.clone(), watcher::Config::default())
            .default_backoff()
            .modify(strip::<K>)
            .inspect(move |ev| {
                if let Ok(watcher::Event::Delete(obj)) = ev {
                    let _ = deleted.send(Arc::new(obj.clone()));
                }
            });
        let stream = reflector::reflector(writer, stream);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Err(e) = ev {
                    tracing::debug!(kind = %K::kind(&()), error = %e, "watch error");
                }
            }
        });
    }
}

/// Every informer of one controller manager, created on first use.
pub struct Informers {
    client: kube::Client,
    map: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    starters: Mutex<Vec<Box<dyn Fn() + Send>>>,
}

impl Debug for Informers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informers").finish_non_exhaustive()
    }
}

impl Informers {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            map: Mutex::new(HashMap::new()),
            starters: Mutex::new(Vec::new()),
        }
    }

    /// The informer of `K` (created on the first call).
    pub fn get<K: Object>(&self) -> Arc<Informer<K>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map.get(&TypeId::of::<K>())
            && let Ok(inf) = existing.clone().downcast::<Informer<K>>()
        {
            return inf;
        }
        let inf = Arc::new(Informer::<K>::new(self.client.clone()));
        map.insert(TypeId::of::<K>(), inf.clone());
        let starter = inf.clone();
        self.starters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(move || starter.start()));
        inf
    }

    /// Starts every informer created so far.
    pub fn start(&self) {
        for s in self.starters.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            s();
        }
    }

    /// Waits until every informer has listed once.
    pub async fn wait_synced<K: Object>(&self) {
        synced(&self.get::<K>().reader()).await;
    }
}

/// How often [`synced`] looks again.
const SYNC_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits until `store` has listed once. Use this instead of `Store::wait_until_ready`, which
/// wakes only one of several tasks waiting at once: kube-runtime 2.0's `DelayedInit` keeps the
/// waker of the last poll only (a futures oneshot receiver), so with several controllers waiting
/// for the same cache the others may never wake. Polled without relying on that waker.
pub async fn synced<K: Object>(store: &Store<K>) {
    loop {
        match futures::FutureExt::now_or_never(store.wait_until_ready()) {
            Some(_) => return,
            None => tokio::time::sleep(SYNC_POLL).await,
        }
    }
}
