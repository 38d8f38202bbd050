//! The kubelet's Events about a pod and its containers (docs/SEEDS-SPEC.md §4.18, Appendix B),
//! with `source.component: kubelet` and the container as the `fieldPath`.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Event as ApiEvent, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::{mpsc, oneshot};

use super::correlator::{Correlated, Correlator};
use super::status::time;

/// One event about a pod (or one of its containers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub reason: &'static str,
    pub warning: bool,
    pub message: String,
    /// The container's name; its `fieldPath` says whether it is an init container.
    pub container: Option<String>,
}

impl Event {
    pub fn normal(reason: &'static str, container: &str, message: String) -> Self {
        Event {
            reason,
            warning: false,
            message,
            container: Some(container.into()),
        }
    }

    pub fn warning(reason: &'static str, container: &str, message: String) -> Self {
        Event {
            warning: true,
            ..Event::normal(reason, container, message)
        }
    }

    /// An event about the pod itself.
    pub fn pod(reason: &'static str, warning: bool, message: String) -> Self {
        Event {
            reason,
            warning,
            message,
            container: None,
        }
    }
}

/// `spec.containers{main}`, `spec.initContainers{init}` or `spec.ephemeralContainers{debug}`.
fn field_path(pod: &Pod, container: &str) -> String {
    let init = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .any(|c| c.name == container);
    let ephemeral = pod
        .spec
        .as_ref()
        .is_some_and(|s| super::plan::is_ephemeral(s, container));
    let list = if init {
        "initContainers"
    } else if ephemeral {
        "ephemeralContainers"
    } else {
        "containers"
    };
    format!("spec.{list}{{{container}}}")
}

/// `now` in nanoseconds since the epoch, above every value returned before, so that the
/// recorder's event names (`<pod>.<nanoseconds in hex>`, fixed when the event happens) are
/// unique even on a coarse clock. A fixed name makes a try repeated after one that timed out
/// but was stored a conflict (409) rather than a second event.
fn unique_nanos(now: SystemTime) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let nanos = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default();
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(nanos.max(last.saturating_add(1)))
        })
        .unwrap_or_default();
    nanos.max(previous.saturating_add(1))
}

/// The API object for `ev`, which happened at `now`.
fn api_event(pod: &Pod, node: &str, ev: &Event, now: SystemTime) -> ApiEvent {
    let m = &pod.metadata;
    let ns = m.namespace.clone().unwrap_or_else(|| "default".into());
    let name = m.name.clone().unwrap_or_default();
    ApiEvent {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", unique_nanos(now))),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name),
            namespace: Some(ns),
            uid: m.uid.clone(),
            field_path: ev.container.as_deref().map(|c| field_path(pod, c)),
            ..ObjectReference::default()
        },
        reason: Some(ev.reason.into()),
        message: Some(ev.message.clone()),
        type_: Some(if ev.warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(time(now)),
        last_timestamp: Some(time(now)),
        event_time: None::<MicroTime>,
        count: Some(1),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.into()),
        ..ApiEvent::default()
    }
}

/// How many events may wait to be posted; beyond that new ones are dropped (the kubelet's
/// recorder queues 1,000 too).
const QUEUE: usize = 1000;

/// Posts the node's events (the pod workers', the eviction manager's, the image collector's) in
/// the background, one after another in the order they were recorded, so that no pod waits for
/// the API before its next step (the kubelet's recorder is asynchronous as well). Each event
/// carries the time it happened, not the time it was posted.
#[derive(Clone, Debug)]
pub struct Recorder {
    node: String,
    tx: mpsc::Sender<Queued>,
}

/// An event waiting to be posted, the time it happened, and who waits for its write (success
/// or not).
type Queued = (ApiEvent, SystemTime, Option<oneshot::Sender<()>>);

/// The kubelet's recorder tries an event up to 12 times, 10 s apart, while the API server
/// cannot be reached or is overloaded (not when it refuses the event); each try here is also
/// bounded by 10 s, so a hung connection holds the queue no longer than that.
const TRIES: u32 = 12;
const RETRY_AFTER: Duration = Duration::from_secs(10);
const TRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a failed post is worth another try: no answer, a timeout, 429 or a 5xx.
fn worth_retrying(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// One write of the recorder: a new event, or a patch of one stored before.
enum Write<'a> {
    Create(&'a ApiEvent),
    Patch(&'a ApiEvent, &'a serde_json::Value),
}

/// Writes one event, retrying as the kubelet's recorder does; returns what the API server
/// stored (the outcome is otherwise only logged). A patch of an event that is gone (deleted,
/// expired) creates it again, as upstream's recorder does.
async fn write_retrying(client: &kube::Client, write: Write<'_>) -> Option<ApiEvent> {
    let ev = match write {
        Write::Create(ev) | Write::Patch(ev, _) => ev,
    };
    let ns = ev.metadata.namespace.as_deref().unwrap_or("default");
    let api: kube::Api<ApiEvent> = kube::Api::namespaced(client.clone(), ns);
    let once = || async {
        if let Write::Patch(ev, patch) = write {
            let name = ev.metadata.name.as_deref().unwrap_or_default();
            match api
                .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                r => return r,
            }
        }
        let mut fresh = ev.clone();
        fresh.metadata.resource_version = None;
        api.create(&PostParams::default(), &fresh).await
    };
    for attempt in 1..=TRIES {
        let error = match tokio::time::timeout(TRY_TIMEOUT, once()).await {
            Ok(Ok(stored)) => return Some(stored),
            Ok(Err(e)) if !worth_retrying(&e) => {
                tracing::debug!(error = %e, reason = ?ev.reason, "event refused");
                return None;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {TRY_TIMEOUT:?}"),
        };
        tracing::debug!(%error, attempt, reason = ?ev.reason, "event not recorded yet");
        if attempt < TRIES {
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }
    tracing::warn!(reason = ?ev.reason, "event not recorded after {TRIES} tries");
    None
}

impl Recorder {
    /// Starts the posting task on the current tokio runtime. Events go through the kubelet's
    /// correlation ([`super::correlator`]) first: repeats patch the stored event's count,
    /// similar ones are combined, a flood about one object is cut.
    pub fn spawn(client: kube::Client, node: String) -> Self {
        let (tx, mut rx) = mpsc::channel::<Queued>(QUEUE);
        tokio::spawn(async move {
            let mut correlator = Correlator::default();
            // `_written` is dropped when this round ends, which tells a waiting sender.
            while let Some((ev, at, _written)) = rx.recv().await {
                let object = ev.involved_object.name.clone().unwrap_or_default();
                let named = || format!("{object}.{:x}", unique_nanos(SystemTime::now()));
                let stored = match correlator.correlate(ev, at, named) {
                    Correlated::Skip => continue,
                    Correlated::Create(ev) => write_retrying(&client, Write::Create(&ev)).await,
                    Correlated::Patch { event, patch } => {
                        write_retrying(&client, Write::Patch(&event, &patch)).await
                    }
                };
                if let Some(stored) = stored {
                    correlator.stored(&stored);
                }
            }
        });
        Recorder { node, tx }
    }

    /// Queues `events` about `pod`; when the queue is full they are dropped (one warning per
    /// call).
    pub fn pod(&self, pod: &Pod, events: Vec<Event>) {
        let now = SystemTime::now();
        let dropped: Vec<&str> = events
            .iter()
            .filter(|ev| {
                self.tx
                    .try_send((api_event(pod, &self.node, ev, now), now, None))
                    .is_err()
            })
            .map(|ev| ev.reason)
            .collect();
        if !dropped.is_empty() {
            tracing::warn!(reasons = ?dropped, "event queue full: events dropped");
        }
    }

    /// Queues a Warning event about this node.
    pub fn node(&self, reason: &'static str, message: String) {
        let now = SystemTime::now();
        if self
            .tx
            .try_send((node_event(&self.node, reason, message, now), now, None))
            .is_err()
        {
            tracing::warn!(reason, "event queue full: event dropped");
        }
    }

    /// Records a Warning event about this node and waits (at most [`TRY_TIMEOUT`]) until the
    /// recorder has written it, or given up: the eviction manager's `EvictionThresholdMet` goes
    /// out before the eviction it announces, through the same correlation as every other event
    /// (a threshold met round after round is one event with a count, as the kubelet's).
    pub async fn node_now(&self, reason: &'static str, message: String) {
        let now = SystemTime::now();
        self.send_and_wait(node_event(&self.node, reason, message, now), now)
            .await;
    }

    /// Like [`Recorder::node_now`], for an event about `pod` (the eviction manager's `Evicted`).
    pub async fn pod_now(&self, pod: &Pod, ev: &Event) {
        let now = SystemTime::now();
        self.send_and_wait(api_event(pod, &self.node, ev, now), now).await;
    }

    async fn send_and_wait(&self, ev: ApiEvent, now: SystemTime) {
        let reason = ev.reason.clone();
        let (written, wait) = oneshot::channel();
        let queued = async {
            if self.tx.send((ev, now, Some(written))).await.is_ok() {
                // The recorder drops its end once the write is done (nothing is sent on it).
                let _ = wait.await;
            }
        };
        if tokio::time::timeout(TRY_TIMEOUT, queued).await.is_err() {
            tracing::debug!(?reason, "event not written yet; going on");
        }
    }
}

/// A Warning event about node `node` (the kubelet's node events, e.g. `EvictionThresholdMet`),
/// in the `default` namespace as the kubelet records them, with the recorder's fixed name.
fn node_event(node: &str, reason: &'static str, message: String, now: SystemTime) -> ApiEvent {
    ApiEvent {
        metadata: ObjectMeta {
            name: Some(format!("{node}.{:x}", unique_nanos(now))),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.into()),
            // The kubelet's node reference carries the node's name as its uid.
            uid: Some(node.into()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(time(now)),
        last_timestamp: Some(time(now)),
        count: Some(1),
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node.into()),
        ..ApiEvent::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    #[test]
    fn only_unreachable_or_overloaded_servers_are_tried_again() {
        let api = |code| {
            kube::Error::Api(kube::core::ErrorResponse {
                status: "Failure".into(),
                message: String::new(),
                reason: String::new(),
                code,
            })
        };
        for (code, again) in [
            (409, false),
            (403, false),
            (422, false),
            (429, true),
            (500, true),
            (503, true),
        ] {
            assert_eq!(worth_retrying(&api(code)), again, "{code}");
        }
        let unreachable = kube::Error::Service(Box::new(std::io::Error::other("connection refused")));
        assert!(worth_retrying(&unreachable));
    }

    #[test]
    fn init_containers_are_named_by_their_list() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(vec![Container {
                    name: "setup".into(),
                    ..Container::default()
                }]),
                containers: vec![Container {
                    name: "main".into(),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let ev = api_event(
            &pod,
            "n1",
            &Event::warning("BackOff", "setup", "m".into()),
            SystemTime::now(),
        );
        assert_eq!(
            ev.involved_object.field_path.as_deref(),
            Some("spec.initContainers{setup}")
        );
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.source.and_then(|s| s.component).as_deref(), Some("kubelet"));
        let ev = api_event(
            &pod,
            "n1",
            &Event::normal("Started", "main", "Container started".into()),
            SystemTime::now(),
        );
        assert_eq!(
            ev.involved_object.field_path.as_deref(),
            Some("spec.containers{main}")
        );
        let named = ev.metadata.name.clone().unwrap_or_default();
        assert!(named.starts_with("web.") && named.len() > 4, "{named}");
        let again = api_event(
            &pod,
            "n1",
            &Event::normal("Started", "main", "again".into()),
            SystemTime::now(),
        );
        assert_ne!(again.metadata.name, ev.metadata.name, "two events, two names");
    }
}
