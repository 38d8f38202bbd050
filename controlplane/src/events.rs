//! Events written through the API as upstream's components write them (`source.component` and
//! `reportingComponent` are the component's name: `default-scheduler`, `replicaset-controller`,
//! ...). A repeat of the same event (same object, reason and message) updates the first one's
//! `count` and `lastTimestamp` instead of creating another.
//!
//! A recorder writes at most [`WRITES_IN_FLIGHT`] events at once; further ones wait their turn
//! (upstream's broadcaster writes from one queue, too). Callers fire events from spawned tasks, and
//! a burst (the node lifecycle controller's `RegisteredNode` for 5,000 nodes registered at once)
//! otherwise put every write in flight together: in `bench scheduler` that burst alone raised the
//! control plane's RSS by about 110 MB within half a second, past its 300 MB target.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// The object an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Involved {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub uid: String,
    pub resource_version: Option<String>,
}

impl Involved {
    /// The object of a typed resource.
    pub fn of<K: kube::Resource<DynamicType = ()>>(o: &K) -> Self {
        let m = o.meta();
        Self {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespace: m.namespace.clone(),
            name: m.name.clone().unwrap_or_default(),
            uid: m.uid.clone().unwrap_or_default(),
            resource_version: m.resource_version.clone(),
        }
    }
}

/// What makes two events the same: (object uid, reason, message).
type Repeat = (String, String, String);

/// Repeats remembered for aggregation (the oldest are forgotten beyond this).
const REMEMBERED: usize = 8192;

/// Event writes one recorder has in flight at most.
pub const WRITES_IN_FLIGHT: usize = 32;

/// Writes events for one component.
pub struct Recorder {
    client: kube::Client,
    component: String,
    instance: String,
    /// [`WRITES_IN_FLIGHT`] permits.
    writes: tokio::sync::Semaphore,
    /// (pod uid, reason, message) → (event name, count).
    seen: Mutex<HashMap<Repeat, (String, i32)>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Warning,
}

impl Recorder {
    pub fn new(client: kube::Client, component: &str, instance: &str) -> Self {
        Self {
            client,
            component: component.into(),
            instance: instance.into(),
            writes: tokio::sync::Semaphore::new(WRITES_IN_FLIGHT),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `object` (failures are logged: events are best effort).
    pub async fn record(&self, object: &Involved, kind: Kind, reason: &str, action: &str, message: &str) {
        // The semaphore is never closed.
        let Ok(_permit) = self.writes.acquire().await else {
            return;
        };
        if let Err(e) = self.write(object, kind, reason, action, message).await {
            tracing::debug!(object = %object.name, reason, error = %e, "event not recorded");
        }
    }

    async fn write(
        &self,
        object: &Involved,
        kind: Kind,
        reason: &str,
        action: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        // Events of cluster-scoped objects live in `default`, as upstream's recorder puts them.
        let ns = object.namespace.clone().unwrap_or_else(|| "default".into());
        let events: kube::Api<Event> = kube::Api::namespaced(self.client.clone(), &ns);
        let now = kcore::time::rfc3339(SystemTime::now());
        let key = (object.uid.clone(), reason.to_string(), message.to_string());
        let repeat = self.seen.lock().ok().and_then(|s| s.get(&key).cloned());
        if let Some((name, count)) = repeat {
            let patch = json!({"count": count + 1, "lastTimestamp": now});
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if let Ok(mut s) = self.seen.lock() {
                        s.insert(key, (name, count + 1));
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("{}.{nanos:x}", object.name);
        let body = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": object.api_version, "kind": object.kind, "name": object.name,
                               "namespace": object.namespace, "uid": object.uid,
                               "resourceVersion": object.resource_version},
            "reason": reason, "message": message,
            "type": match kind { Kind::Normal => "Normal", Kind::Warning => "Warning" },
            "source": {"component": self.component},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": self.component, "reportingInstance": self.instance, "action": action,
        });
        let event: Event = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
        events.create(&PostParams::default(), &event).await?;
        if let Ok(mut s) = self.seen.lock() {
            if s.len() >= REMEMBERED {
                s.clear();
            }
            s.insert(key, (name, 1));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::*;

    /// An API that answers every create after a pause and counts the requests it holds at once.
    #[derive(Clone, Default)]
    struct Slow {
        now: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        done: Arc<AtomicUsize>,
    }

    impl tower::Service<http::Request<kube::client::Body>> for Slow {
        type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
        type Error = Infallible;
        type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
            let s = self.clone();
            Box::pin(async move {
                let held = s.now.fetch_add(1, Ordering::SeqCst) + 1;
                s.most.fetch_max(held, Ordering::SeqCst);
                let body = crate::api::collect_body(req.into_body())
                    .await
                    .unwrap_or_default();
                tokio::time::sleep(Duration::from_millis(50)).await;
                s.now.fetch_sub(1, Ordering::SeqCst);
                s.done.fetch_add(1, Ordering::SeqCst);
                Ok(http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(body))
                    .unwrap_or_default())
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_events_is_written_at_most_writes_in_flight_at_once() {
        let api = Slow::default();
        let recorder = Arc::new(Recorder::new(
            kube::Client::new(api.clone(), "default"),
            "test",
            "i",
        ));
        let tasks: Vec<_> = (0..300)
            .map(|i| {
                let recorder = recorder.clone();
                tokio::spawn(async move {
                    let object = Involved {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        namespace: None,
                        name: format!("node-{i}"),
                        uid: format!("uid-{i}"),
                        resource_version: None,
                    };
                    recorder
                        .record(&object, Kind::Normal, "RegisteredNode", "", "registered")
                        .await;
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        // Every event was written, never more than the bound at once, and the bound was used.
        assert_eq!(api.done.load(Ordering::SeqCst), 300);
        assert_eq!(api.most.load(Ordering::SeqCst), WRITES_IN_FLIGHT);
    }
}
