//! The kubelet's event correlation (client-go's `EventCorrelator`, which every kubelet event
//! goes through before it is written), as a pure state machine over `core/v1` Events:
//!
//! - **De-duplication**: an event identical to one recorded before (same source, object,
//!   field path, type, reason and message) is not created again; the stored one is patched with
//!   `count` + 1 and the new `lastTimestamp` (what `kubectl describe` shows as `(x3 over 2m)`).
//! - **Aggregation**: once 10 events of one object, type and reason with *different* messages
//!   were seen within 10 minutes of each other, further ones become one event
//!   `(combined from similar events): <message>`, itself de-duplicated.
//! - **Spam filter**: a source may record 25 events about one object at once, then one every
//!   5 minutes (a token bucket per object); events beyond that are dropped, so a pod that is
//!   always unhealthy costs the API server nothing more.
//!
//! Each cache holds at most 4,096 keys (the least recently used go first), as upstream's.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::status::time;

const MAX_KEYS: usize = 4096;
/// Similar events (differing only in message) seen this many times are combined...
const AGGREGATE_MAX_EVENTS: usize = 10;
/// ...when each came within this long of the previous one.
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// Events a source may record about one object at once...
const SPAM_BURST: f64 = 25.0;
/// ...and how fast that allowance refills (one event per 5 minutes).
const SPAM_REFILL_PER_SEC: f64 = 1.0 / 300.0;

/// What to do with an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Correlated {
    /// Dropped by the spam filter.
    Skip,
    /// A new event to create.
    Create(Event),
    /// An event recorded before: `patch` (strategic merge: `count`, `lastTimestamp`, `message`)
    /// goes to the stored `event.metadata.name`; if it is gone, `event` is created instead.
    Patch { event: Event, patch: serde_json::Value },
}

/// A map that forgets its least recently used key beyond [`MAX_KEYS`].
struct Lru<V> {
    map: HashMap<String, (u64, V)>,
    tick: u64,
}

impl<V> Lru<V> {
    fn new() -> Self {
        Lru {
            map: HashMap::new(),
            tick: 0,
        }
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|(used, v)| {
            *used = tick;
            v
        })
    }

    /// Removes `key`'s value (to be inserted again, changed).
    fn take(&mut self, key: &str) -> Option<V> {
        self.map.remove(key).map(|(_, v)| v)
    }

    fn insert(&mut self, key: String, value: V) {
        self.tick += 1;
        self.map.insert(key, (self.tick, value));
        if self.map.len() > MAX_KEYS
            && let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(k, _)| k.clone())
        {
            self.map.remove(&oldest);
        }
    }
}

/// A token bucket (`golang.org/x/time/rate`'s `Allow`).
struct Bucket {
    tokens: f64,
    at: SystemTime,
}

struct Similar {
    messages: HashSet<String>,
    last: SystemTime,
}

/// What is known of an event already recorded.
struct Logged {
    count: i32,
    first: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    name: Option<String>,
    resource_version: Option<String>,
}

impl Logged {
    fn of(ev: &Event) -> Self {
        Logged {
            count: ev.count.unwrap_or(1),
            first: ev.first_timestamp.clone(),
            name: ev.metadata.name.clone(),
            resource_version: ev.metadata.resource_version.clone(),
        }
    }
}

/// The correlator's state (one per recorder).
pub struct Correlator {
    spam: Lru<Bucket>,
    similar: Lru<Similar>,
    logged: Lru<Logged>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator {
            spam: Lru::new(),
            similar: Lru::new(),
            logged: Lru::new(),
        }
    }
}

fn source(ev: &Event) -> [&str; 2] {
    let s = ev.source.as_ref();
    [
        s.and_then(|s| s.component.as_deref()).unwrap_or_default(),
        s.and_then(|s| s.host.as_deref()).unwrap_or_default(),
    ]
}

/// Source and object: the spam filter's key.
fn object_key(ev: &Event) -> String {
    let o = &ev.involved_object;
    let [component, host] = source(ev);
    [
        component,
        host,
        o.kind.as_deref().unwrap_or_default(),
        o.namespace.as_deref().unwrap_or_default(),
        o.name.as_deref().unwrap_or_default(),
        o.uid.as_deref().unwrap_or_default(),
        o.api_version.as_deref().unwrap_or_default(),
    ]
    .join("")
}

/// Everything but the message: the aggregation key.
fn similar_key(ev: &Event) -> String {
    [
        object_key(ev).as_str(),
        ev.type_.as_deref().unwrap_or_default(),
        ev.reason.as_deref().unwrap_or_default(),
        ev.reporting_component.as_deref().unwrap_or_default(),
        ev.reporting_instance.as_deref().unwrap_or_default(),
    ]
    .join("")
}

/// The whole event (with the field path and message): the de-duplication key. (Upstream's
/// key has the same parts in another order.)
fn event_key(ev: &Event) -> String {
    [
        object_key(ev).as_str(),
        ev.involved_object.field_path.as_deref().unwrap_or_default(),
        ev.type_.as_deref().unwrap_or_default(),
        ev.reason.as_deref().unwrap_or_default(),
        ev.message.as_deref().unwrap_or_default(),
    ]
    .join("")
}

impl Correlator {
    /// Correlates `ev`, which happened at `now`; `name_at` names a combined event (the
    /// recorder's `<object>.<nanoseconds in hex>`).
    pub fn correlate(&mut self, ev: Event, now: SystemTime, name_at: impl FnOnce() -> String) -> Correlated {
        let (ev, key) = self.aggregate(ev, now, name_at);
        let (ev, patch) = self.observe(ev, key);
        if !self.allow(&ev, now) {
            return Correlated::Skip;
        }
        match patch {
            Some(patch) => Correlated::Patch { event: ev, patch },
            None => Correlated::Create(ev),
        }
    }

    /// What the API server stored (after a create or patch): the next identical event patches it.
    pub fn stored(&mut self, ev: &Event) {
        self.logged.insert(event_key(ev), Logged::of(ev));
    }

    /// Upstream's `EventAggregate`: the event to record and its de-duplication key.
    fn aggregate(&mut self, ev: Event, now: SystemTime, name_at: impl FnOnce() -> String) -> (Event, String) {
        let key = event_key(&ev);
        let group = similar_key(&ev);
        let message = ev.message.clone().unwrap_or_default();
        let fresh = || Similar {
            messages: HashSet::new(),
            last: now,
        };
        let mut record = self.similar.take(&group).unwrap_or_else(fresh);
        if now.duration_since(record.last).unwrap_or_default() > AGGREGATE_INTERVAL {
            record = fresh();
        }
        record.messages.insert(message.clone());
        record.last = now;
        let combine = record.messages.len() >= AGGREGATE_MAX_EVENTS;
        if combine && let Some(any) = record.messages.iter().next().cloned() {
            // Not grown beyond the threshold.
            record.messages.remove(&any);
        }
        self.similar.insert(group.clone(), record);
        if !combine {
            return (ev, key);
        }
        let t = time(now);
        let combined = Event {
            metadata: ObjectMeta {
                name: Some(name_at()),
                namespace: ev.metadata.namespace.clone(),
                ..ObjectMeta::default()
            },
            count: Some(1),
            first_timestamp: Some(t.clone()),
            last_timestamp: Some(t),
            involved_object: ev.involved_object,
            message: Some(format!("(combined from similar events): {message}")),
            type_: ev.type_,
            reason: ev.reason,
            source: ev.source,
            ..Event::default()
        };
        (combined, group)
    }

    /// Upstream's `eventObserve`: an event seen before under `key` becomes a patch of the
    /// stored one.
    fn observe(&mut self, mut ev: Event, key: String) -> (Event, Option<serde_json::Value>) {
        let mut patch = None;
        if let Some(last) = self.logged.get_mut(&key).filter(|l| l.count > 0) {
            ev.metadata.name = last.name.clone();
            ev.metadata.resource_version = last.resource_version.clone();
            ev.first_timestamp = last.first.clone();
            ev.count = Some(last.count + 1);
            patch = Some(json!({
                "count": ev.count,
                "lastTimestamp": ev.last_timestamp,
                "message": ev.message,
            }));
        }
        self.logged.insert(key, Logged::of(&ev));
        (ev, patch)
    }

    /// The spam filter: whether the source may record another event about this object now.
    fn allow(&mut self, ev: &Event, now: SystemTime) -> bool {
        let key = object_key(ev);
        let mut bucket = self.spam.take(&key).unwrap_or(Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        let elapsed = now.duration_since(bucket.at).unwrap_or_default().as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * SPAM_REFILL_PER_SEC).min(SPAM_BURST);
        bucket.at = now.max(bucket.at);
        let allowed = bucket.tokens >= 1.0;
        if allowed {
            bucket.tokens -= 1.0;
        }
        self.spam.insert(key, bucket);
        allowed
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EventSource, ObjectReference};

    use super::*;

    fn event(pod: &str, reason: &str, message: &str, at: SystemTime) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{pod}.{reason}.{}", message.len())),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{pod}")),
                api_version: Some("v1".into()),
                field_path: Some("spec.containers{main}".into()),
                ..ObjectReference::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Normal".into()),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some("n1".into()),
            }),
            first_timestamp: Some(time(at)),
            last_timestamp: Some(time(at)),
            count: Some(1),
            ..Event::default()
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    /// Correlates and, as the recorder does, tells the correlator what the server stored
    /// (the event as sent, with a resource version).
    fn record(c: &mut Correlator, ev: Event, now: SystemTime) -> Correlated {
        let out = c.correlate(ev, now, || {
            format!(
                "web.{:x}",
                now.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs()
            )
        });
        let stored = match &out {
            Correlated::Create(e) | Correlated::Patch { event: e, .. } => Some(e.clone()),
            Correlated::Skip => None,
        };
        if let Some(mut e) = stored {
            e.metadata.resource_version = Some("7".into());
            c.stored(&e);
        }
        out
    }

    #[test]
    fn identical_events_patch_the_first_with_a_count() {
        let mut c = Correlator::default();
        let first = record(&mut c, event("web", "Started", "Container started", at(0)), at(0));
        let Correlated::Create(created) = first else {
            panic!("first is created: {first:?}")
        };
        for (n, t) in [(2, 30), (3, 95)] {
            let out = record(&mut c, event("web", "Started", "Container started", at(t)), at(t));
            let Correlated::Patch { event, patch } = out else {
                panic!("repeat {n} patches: {out:?}")
            };
            assert_eq!(event.metadata.name, created.metadata.name, "the stored event");
            assert_eq!(event.count, Some(n));
            assert_eq!(event.first_timestamp, Some(time(at(0))), "first time kept");
            assert_eq!(
                patch,
                json!({"count": n, "lastTimestamp": time(at(t)), "message": "Container started"})
            );
        }
        // Another message, another container, another pod: separate events.
        for ev in [
            event("web", "Started", "Container started again", at(100)),
            {
                let mut e = event("web", "Started", "Container started", at(100));
                e.involved_object.field_path = Some("spec.containers{side}".into());
                e
            },
            event("db", "Started", "Container started", at(100)),
        ] {
            let out = record(&mut c, ev, at(100));
            assert!(matches!(out, Correlated::Create(_)), "{out:?}");
        }
    }

    #[test]
    fn ten_similar_messages_within_ten_minutes_are_combined() {
        let mut c = Correlator::default();
        let unhealthy = |i: u64| {
            event(
                "web",
                "Unhealthy",
                &format!("Readiness probe failed: {i}"),
                at(i * 50),
            )
        };
        for i in 0..9 {
            let out = record(&mut c, unhealthy(i), at(i * 50));
            assert!(
                matches!(&out, Correlated::Create(e) if !e.message.as_deref().unwrap_or_default().starts_with("(combined")),
                "{i}: {out:?}"
            );
        }
        let out = record(&mut c, unhealthy(9), at(450));
        let Correlated::Create(combined) = out else {
            panic!("the 10th is a new combined event: {out:?}")
        };
        assert_eq!(
            combined.message.as_deref(),
            Some("(combined from similar events): Readiness probe failed: 9")
        );
        assert_eq!(combined.reason.as_deref(), Some("Unhealthy"));
        let out = record(&mut c, unhealthy(10), at(500));
        let Correlated::Patch { event, patch } = out else {
            panic!("the next patches the combined one: {out:?}")
        };
        assert_eq!(event.metadata.name, combined.metadata.name);
        assert_eq!(event.count, Some(2));
        assert_eq!(
            patch["message"],
            "(combined from similar events): Readiness probe failed: 10"
        );
    }

    #[test]
    fn similar_events_further_apart_than_ten_minutes_are_not_combined() {
        let mut c = Correlator::default();
        for i in 0..12u64 {
            let t = at(i * 601);
            let out = record(&mut c, event("web", "Unhealthy", &format!("failed: {i}"), t), t);
            assert!(
                matches!(&out, Correlated::Create(e) if e.message.as_deref() == Some(format!("failed: {i}").as_str())),
                "{i}: {out:?}"
            );
        }
    }

    #[test]
    fn twenty_five_events_per_object_then_one_per_five_minutes() {
        let mut c = Correlator::default();
        // Identical events count too (each is a write).
        let outs: Vec<Correlated> = (0..30)
            .map(|_| {
                record(
                    &mut c,
                    event("web", "BackOff", "Back-off restarting", at(0)),
                    at(0),
                )
            })
            .collect();
        assert_eq!(outs.iter().filter(|o| **o != Correlated::Skip).count(), 25);
        assert!(outs[25..].iter().all(|o| *o == Correlated::Skip));
        // Another object has its own allowance.
        assert!(matches!(
            record(&mut c, event("db", "BackOff", "x", at(0)), at(0)),
            Correlated::Create(_)
        ));
        // 299 s later still nothing; at 300 s one more.
        assert_eq!(
            record(
                &mut c,
                event("web", "BackOff", "Back-off restarting", at(299)),
                at(299)
            ),
            Correlated::Skip
        );
        let out = record(
            &mut c,
            event("web", "BackOff", "Back-off restarting", at(300)),
            at(300),
        );
        assert!(matches!(out, Correlated::Patch { .. }), "{out:?}");
        assert_eq!(
            record(
                &mut c,
                event("web", "BackOff", "Back-off restarting", at(301)),
                at(301)
            ),
            Correlated::Skip
        );
    }

    #[test]
    fn the_least_recently_used_keys_are_forgotten() {
        let mut l = Lru::new();
        for i in 0..MAX_KEYS {
            l.insert(format!("k{i}"), i);
        }
        assert!(l.get_mut("k0").is_some(), "k0 used again");
        l.insert("new".into(), 0);
        assert_eq!(l.map.len(), MAX_KEYS);
        assert!(l.get_mut("k0").is_some(), "recently used: kept");
        assert!(l.get_mut("k1").is_none(), "least recently used: forgotten");
    }
}
