//! Shared informers: one list+watch per kind for all controllers, a cache (kube's reflector
//! store) they read, a stream of changed objects they subscribe to, and a stream of deleted
//! objects.
//!
//! The change and deletion streams are this module's own channels, not kube-runtime's shared
//! reflector handles: kube-runtime 2.0.1's `ReflectHandle` (`reflector/dispatcher.rs`) receives
//! an object reference, looks it up in the store, and when the object is already gone returns
//! `Pending` without a waker registered, so the subscriber stalls until something else wakes its
//! task; a controller then missed the last pod updates of a rollout (a ReplicaSet kept stale
//! `availableReplicas`, rollouts timed out in the hollow-node suites). Here each message carries
//! the object itself, sent after the cache applied the event; the sender waits for slow
//! subscribers (back-pressure, nothing is dropped).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_broadcast::{InactiveReceiver, Sender};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// Objects a subscriber may lag behind before the informer waits for it.
const SUBSCRIBER_BUFFER: usize = 4096;

/// A broadcast channel whose receivers are made on demand; sends wait while any active
/// receiver is full, and go nowhere while there is none.
struct Channel<K> {
    tx: Sender<Arc<K>>,
    idle: InactiveReceiver<Arc<K>>,
}

impl<K> Channel<K> {
    fn new() -> Self {
        let (mut tx, rx) = async_broadcast::broadcast(SUBSCRIBER_BUFFER);
        tx.set_await_active(false);
        Self {
            tx,
            idle: rx.deactivate(),
        }
    }
}

/// Bound of the object types an informer serves.
pub trait Object:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// A function that sees every watch event of an informer before its cache does.
pub type Hook<K> = Box<dyn Fn(&watcher::Event<K>) + Send + Sync>;

/// One kind's list+watch, cache and change streams.
pub struct Informer<K: Object> {
    api: kube::Api<K>,
    writer: Mutex<Option<Writer<K>>>,
    reader: Store<K>,
    changed: Channel<K>,
    deleted: Channel<K>,
    hooks: Mutex<Vec<Hook<K>>>,
    /// What is built once over this informer and shared by every controller asking for it
    /// (the indexes), by name.
    shared: Mutex<HashMap<&'static str, Arc<dyn Any + Send + Sync>>>,
}

impl<K: Object> Debug for Informer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informer")
            .field("kind", &K::kind(&()))
            .finish_non_exhaustive()
    }
}

/// Drops what no controller reads: managedFields and the last-applied annotation; of pods,
/// also the volumes and the containers (the HPA, the one controller reading their requests,
/// lists its pods through the API); of nodes, their system info, images and volumes. A cached
/// pod with one container and the service account's projected volume measured 10-12 KB in
/// memory (heaptrack, 10,000 pods); the volume alone is a 3 KB struct plus its sources, a
/// container a 2 KB struct plus its strings and maps.
fn strip<K: Object>(o: &mut K) {
    crate::scheduler::strip::meta(o);
    let o = o as &mut dyn Any;
    if let Some(spec) = o.downcast_mut::<Pod>().and_then(|p| p.spec.as_mut()) {
        spec.containers = Vec::new();
        spec.init_containers = None;
        spec.ephemeral_containers = None;
        spec.volumes = None;
    } else if let Some(node) = o.downcast_mut::<Node>() {
        crate::scheduler::strip::node(node);
        if let Some(st) = node.status.as_mut() {
            st.images = None;
        }
    }
}

impl<K: Object> Informer<K> {
    fn new(client: kube::Client) -> Self {
        let (reader, writer) = reflector::store();
        Self {
            api: kube::Api::all(client),
            writer: Mutex::new(Some(writer)),
            reader,
            changed: Channel::new(),
            deleted: Channel::new(),
            hooks: Mutex::new(Vec::new()),
            shared: Mutex::new(HashMap::new()),
        }
    }

    /// The `name`d companion of this informer (an index), made by `make` on the first call and
    /// shared afterwards: three controllers indexing the same pods by owner keep one index.
    /// `make` must not ask for another shared companion.
    pub fn shared<T: Any + Send + Sync>(&self, name: &'static str, make: impl FnOnce() -> Arc<T>) -> Arc<T> {
        let mut map = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = map.get(name)
            && let Ok(t) = existing.clone().downcast::<T>()
        {
            return t;
        }
        let t = make();
        map.insert(name, t.clone());
        t
    }

    /// Runs `hook` on every watch event, in the watch's order, before the cache applies the
    /// event and before any subscriber hears of it: an index kept by a hook is current whenever
    /// a controller is woken (client-go's indexers have the same guarantee). Register before
    /// the informers start.
    pub fn on_event(&self, hook: Hook<K>) {
        self.hooks.lock().unwrap_or_else(|p| p.into_inner()).push(hook);
    }

    /// The cache.
    pub fn reader(&self) -> Store<K> {
        self.reader.clone()
    }

    /// Objects as they are added or changed (and every object after each relist), after the
    /// cache has them. Subscribe before the informers start to see the first list.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.changed.idle.activate_cloned()
    }

    /// Objects as they are deleted (their last known state), after the cache dropped them.
    pub fn deletions(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.deleted.idle.activate_cloned()
    }

    /// Starts the list+watch (once), in `scope`.
    fn start(&self, scope: &crate::leader::Scope) {
        let Some(writer) = self.writer.lock().ok().and_then(|mut w| w.take()) else {
            return;
        };
        let hooks = std::mem::take(&mut *self.hooks.lock().unwrap_or_else(|p| p.into_inner()));
        let stream = watcher(self.api.clone(), watcher::Config::default())
            .default_backoff()
            .modify(strip::<K>)
            .inspect(move |ev| {
                if let Ok(ev) = ev {
                    for hook in &hooks {
                        hook(ev);
                    }
                }
            });
        let stream = reflector::reflector(writer, stream);
        let (changed, deleted, cache) = (
            self.changed.tx.clone(),
            self.deleted.tx.clone(),
            self.reader.clone(),
        );
        scope.spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                // The reflector has applied the event to the cache; now tell the subscribers.
                // (A send fails only when no subscriber is active: nothing to tell.)
                match ev {
                    Ok(watcher::Event::Apply(o)) => {
                        let o = cache.get(&ObjectRef::from_obj(&o)).unwrap_or_else(|| Arc::new(o));
                        let _ = changed.broadcast_direct(o).await;
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        let _ = deleted.broadcast_direct(Arc::new(o)).await;
                    }
                    Ok(watcher::Event::InitDone) => {
                        for o in cache.state() {
                            let _ = changed.broadcast_direct(o).await;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(kind = %K::kind(&()), error = %e, "watch error"),
                }
            }
        });
    }
}

/// Starts one informer's list+watch in a scope.
type Starter = Box<dyn Fn(&crate::leader::Scope) + Send>;

/// Every informer of one controller manager, created on first use.
pub struct Informers {
    client: kube::Client,
    map: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    starters: Mutex<Vec<Starter>>,
    /// The informers' watch tasks: they stop when the informers are dropped.
    tasks: crate::leader::Scope,
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
            tasks: crate::leader::Scope::default(),
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
            .push(Box::new(move |scope| starter.start(scope)));
        inf
    }

    /// Starts every informer created so far.
    pub fn start(&self) {
        for s in self.starters.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            s(&self.tasks);
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
