//! Events written through the API as upstream's components write them (`source.component` and
//! `reportingComponent` are the component's name: `default-scheduler`, `replicaset-controller`,
//! ...). A repeat of the same event (same object, reason and message) updates the first one's
//! `count` and `lastTimestamp` instead of creating another.

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

/// Writes events for one component.
pub struct Recorder {
    client: kube::Client,
    component: String,
    instance: String,
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
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `object` (failures are logged: events are best effort).
    pub async fn record(&self, object: &Involved, kind: Kind, reason: &str, action: &str, message: &str) {
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
