//! The scheduling queue (docs/SEEDS-SPEC.md SCH-2, upstream's three queues): *active* pods are
//! popped highest priority first (then oldest); a pod whose attempt failed with an error waits in
//! *back-off* (1 s doubling to 10 s per attempt); a pod no node fits waits in *unschedulable*
//! until a cluster event that one of the plugins that rejected it cares about (a node added, a
//! taint removed, a pod deleted...) moves it back, or 5 minutes pass. Nothing is retried while
//! nothing changes: an idle cluster with pods that can never fit costs no cycles.
//!
//! Time is passed in, so the queue is tested without waiting.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cache::NodeChange;
use super::plugins::Plugin;
use super::pod::PodInfo;

/// Back-off of a pod's first retry.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Longest back-off.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// An unschedulable pod is retried after this long even if nothing relevant happened.
pub const MAX_UNSCHEDULABLE: Duration = Duration::from_secs(300);

/// Something changed in the cluster that may make pending pods schedulable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterEvent {
    Node(NodeChange),
    NodeDeleted,
    /// A pod bound to a node appeared or changed its labels.
    AssignedPodAdded,
    /// A pod bound to a node went away (or finished): its resources and ports are free.
    AssignedPodDeleted,
}

impl ClusterEvent {
    /// Whether `plugin`'s rejection may no longer hold after this event.
    fn concerns(&self, plugin: Plugin) -> bool {
        use Plugin::*;
        match self {
            ClusterEvent::Node(c) if c.added => true,
            ClusterEvent::Node(c) => match plugin {
                NodeResourcesFit => c.allocatable,
                NodeUnschedulable => c.unschedulable,
                TaintToleration => c.taints,
                NodeAffinity | InterPodAffinity | PodTopologySpread => c.labels,
                NodePorts => false,
            },
            ClusterEvent::NodeDeleted => matches!(plugin, PodTopologySpread | InterPodAffinity),
            ClusterEvent::AssignedPodAdded => matches!(plugin, InterPodAffinity | PodTopologySpread),
            ClusterEvent::AssignedPodDeleted => {
                matches!(
                    plugin,
                    NodeResourcesFit | NodePorts | InterPodAffinity | PodTopologySpread
                )
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Active,
    Backoff,
    Unschedulable {
        since: Instant,
    },
    /// Popped, being scheduled or bound.
    InFlight,
}

#[derive(Debug)]
struct Entry {
    info: Arc<PodInfo>,
    place: Place,
    attempts: u32,
    last_attempt: Option<Instant>,
    /// Queue order among equal priorities.
    timestamp: Instant,
    /// The plugins that rejected it in its last attempt.
    plugins: Vec<Plugin>,
    /// A relevant event arrived while the pod was in flight: a failure goes to back-off, not to
    /// unschedulable (the event may already have fixed it).
    moved_in_flight: bool,
    generation: u64,
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveKey {
    priority: i32,
    timestamp: Instant,
    seq: u64,
    uid: String,
    generation: u64,
}

impl Ord for ActiveKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.timestamp.cmp(&self.timestamp))
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for ActiveKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Sizes of the three queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub active: usize,
    pub backoff: usize,
    pub unschedulable: usize,
    pub in_flight: usize,
}

/// Pending pods of this scheduler.
#[derive(Debug, Default)]
pub struct SchedulingQueue {
    entries: HashMap<String, Entry>,
    active: BinaryHeap<ActiveKey>,
    backoff: BinaryHeap<Reverse<(Instant, u64, String, u64)>>,
    seq: u64,
}

fn backoff_for(attempts: u32) -> Duration {
    let mut d = INITIAL_BACKOFF;
    for _ in 1..attempts {
        if d > MAX_BACKOFF - d {
            return MAX_BACKOFF;
        }
        d += d;
    }
    d.min(MAX_BACKOFF)
}

/// Whether an update of a pending pod may change where it fits (not just its status).
fn spec_or_labels_changed(old: &PodInfo, new: &PodInfo) -> bool {
    old.spec() != new.spec() || old.labels != new.labels
}

impl SchedulingQueue {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn push_active(&mut self, uid: &str, now: Instant) {
        let seq = self.next_seq();
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        e.place = Place::Active;
        e.timestamp = now;
        e.generation = seq;
        self.active.push(ActiveKey {
            priority: e.info.priority,
            timestamp: now,
            seq,
            uid: uid.to_string(),
            generation: seq,
        });
    }

    fn push_backoff(&mut self, uid: &str) {
        let seq = self.next_seq();
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        let until = e
            .last_attempt
            .map(|t| t + backoff_for(e.attempts))
            .unwrap_or_else(Instant::now);
        e.place = Place::Backoff;
        e.generation = seq;
        self.backoff.push(Reverse((until, seq, uid.to_string(), seq)));
    }

    /// Back to active, or to back-off while its back-off has not run out.
    fn requeue(&mut self, uid: &str, now: Instant) {
        let Some(e) = self.entries.get(uid) else { return };
        let backing_off = e.last_attempt.is_some_and(|t| t + backoff_for(e.attempts) > now);
        if backing_off {
            self.push_backoff(uid);
        } else {
            self.push_active(uid, now);
        }
    }

    /// A pending pod appeared or changed.
    pub fn upsert(&mut self, info: Arc<PodInfo>, now: Instant) {
        let uid = info.uid.clone();
        match self.entries.get_mut(&uid) {
            None => {
                self.entries.insert(
                    uid.clone(),
                    Entry {
                        info,
                        place: Place::Active,
                        attempts: 0,
                        last_attempt: None,
                        timestamp: now,
                        plugins: Vec::new(),
                        moved_in_flight: false,
                        generation: 0,
                    },
                );
                self.push_active(&uid, now);
            }
            Some(e) => {
                let changed = spec_or_labels_changed(&e.info, &info);
                let priority_changed = e.info.priority != info.priority;
                e.info = info;
                match e.place {
                    Place::Unschedulable { .. } if changed => self.requeue(&uid, now),
                    Place::InFlight if changed => e.moved_in_flight = true,
                    Place::Active if priority_changed => self.push_active(&uid, now),
                    _ => {}
                }
            }
        }
    }

    /// The pod was bound, deleted or is no longer ours.
    pub fn remove(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// The latest version of a queued pod.
    pub fn get(&self, uid: &str) -> Option<&Arc<PodInfo>> {
        self.entries.get(uid).map(|e| &e.info)
    }

    /// Moves pods whose back-off ran out, and pods unschedulable for [`MAX_UNSCHEDULABLE`].
    pub fn flush(&mut self, now: Instant) {
        while let Some(Reverse((until, _, uid, generation))) = self.backoff.peek().cloned() {
            if until > now {
                break;
            }
            self.backoff.pop();
            if self
                .entries
                .get(&uid)
                .is_some_and(|e| e.place == Place::Backoff && e.generation == generation)
            {
                self.push_active(&uid, now);
            }
        }
        let stale: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.place, Place::Unschedulable { since } if now.duration_since(since) >= MAX_UNSCHEDULABLE))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in stale {
            self.requeue(&uid, now);
        }
    }

    /// The next pod to schedule (highest priority, then oldest), now in flight.
    pub fn pop(&mut self, now: Instant) -> Option<Arc<PodInfo>> {
        self.flush(now);
        while let Some(key) = self.active.pop() {
            let Some(e) = self.entries.get_mut(&key.uid) else {
                continue;
            };
            if e.place != Place::Active || e.generation != key.generation {
                continue;
            }
            e.place = Place::InFlight;
            e.attempts += 1;
            e.last_attempt = Some(now);
            e.moved_in_flight = false;
            return Some(e.info.clone());
        }
        None
    }

    /// No node fits: wait for an event that concerns one of `plugins`.
    pub fn unschedulable(&mut self, uid: &str, plugins: Vec<Plugin>, now: Instant) {
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        e.plugins = plugins;
        if e.moved_in_flight {
            self.push_backoff(uid);
        } else {
            e.place = Place::Unschedulable { since: now };
        }
    }

    /// The attempt failed with an error (binding refused, API error): retry after back-off.
    pub fn failed(&mut self, uid: &str) {
        if self.entries.contains_key(uid) {
            self.push_backoff(uid);
        }
    }

    /// Moves the unschedulable pods this event concerns; returns how many moved.
    pub fn on_event(&mut self, event: ClusterEvent, now: Instant) -> usize {
        let mut moved = Vec::new();
        for (uid, e) in self.entries.iter_mut() {
            let relevant = e.plugins.is_empty() || e.plugins.iter().any(|p| event.concerns(*p));
            match e.place {
                Place::Unschedulable { .. } if relevant => moved.push(uid.clone()),
                Place::InFlight if relevant => e.moved_in_flight = true,
                _ => {}
            }
        }
        for uid in &moved {
            self.requeue(uid, now);
        }
        moved.len()
    }

    /// When the next back-off or unschedulable timeout runs out.
    pub fn next_deadline(&self) -> Option<Instant> {
        let backoff = self.backoff.peek().map(|Reverse((t, ..))| *t);
        let unsched = self
            .entries
            .values()
            .filter_map(|e| match e.place {
                Place::Unschedulable { since } => Some(since + MAX_UNSCHEDULABLE),
                _ => None,
            })
            .min();
        match (backoff, unsched) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn stats(&self) -> QueueStats {
        let mut s = QueueStats::default();
        for e in self.entries.values() {
            match e.place {
                Place::Active => s.active += 1,
                Place::Backoff => s.backoff += 1,
                Place::Unschedulable { .. } => s.unschedulable += 1,
                Place::InFlight => s.in_flight += 1,
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info(name: &str, priority: i32) -> Arc<PodInfo> {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"priority": priority, "containers": [{"name": "c", "image": "x"}]}
        }))
        .expect("pod");
        Arc::new(PodInfo::new(Arc::new(pod), &|_| None))
    }

    #[test]
    fn pops_by_priority_then_age() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::default();
        q.upsert(info("low", 0), t0);
        q.upsert(info("high", 100), t0 + Duration::from_millis(1));
        q.upsert(info("low2", 0), t0 + Duration::from_millis(2));
        let order: Vec<String> = std::iter::from_fn(|| q.pop(t0).map(|p| p.name.clone())).collect();
        assert_eq!(order, ["high", "low", "low2"]);
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        let got: Vec<u64> = (1..=6).map(|a| backoff_for(a).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn failed_pods_wait_out_their_backoff() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::default();
        q.upsert(info("p", 0), t0);
        assert!(q.pop(t0).is_some());
        q.failed("p");
        assert!(q.pop(t0 + Duration::from_millis(999)).is_none(), "1 s back-off");
        assert!(q.pop(t0 + Duration::from_secs(1)).is_some());
        q.failed("p");
        assert!(
            q.pop(t0 + Duration::from_millis(2999)).is_none(),
            "2 s after the second attempt"
        );
        assert!(q.pop(t0 + Duration::from_secs(3)).is_some());
    }

    #[test]
    fn unschedulable_pods_move_only_on_relevant_events() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::default();
        q.upsert(info("p", 0), t0);
        q.pop(t0);
        q.unschedulable("p", vec![Plugin::TaintToleration], t0);
        let later = t0 + Duration::from_secs(20);
        assert_eq!(q.on_event(ClusterEvent::AssignedPodDeleted, later), 0);
        let labels = NodeChange {
            labels: true,
            ..NodeChange::default()
        };
        assert_eq!(q.on_event(ClusterEvent::Node(labels), later), 0);
        assert!(q.pop(later).is_none(), "nothing relevant happened: no retry");
        assert_eq!(q.next_deadline(), Some(t0 + MAX_UNSCHEDULABLE));
        let taints = NodeChange {
            taints: true,
            ..NodeChange::default()
        };
        assert_eq!(q.on_event(ClusterEvent::Node(taints), later), 1);
        assert_eq!(q.pop(later).map(|p| p.name.clone()).as_deref(), Some("p"));
    }

    #[test]
    fn unschedulable_pods_are_retried_after_five_minutes() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::default();
        q.upsert(info("p", 0), t0);
        q.pop(t0);
        q.unschedulable("p", vec![Plugin::NodeResourcesFit], t0);
        assert!(q.pop(t0 + Duration::from_secs(299)).is_none());
        assert!(q.pop(t0 + MAX_UNSCHEDULABLE).is_some());
    }

    #[test]
    fn an_event_during_the_attempt_sends_a_failure_to_backoff() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::default();
        q.upsert(info("p", 0), t0);
        q.pop(t0);
        q.on_event(
            ClusterEvent::Node(NodeChange {
                added: true,
                ..NodeChange::default()
            }),
            t0,
        );
        q.unschedulable("p", vec![Plugin::NodeResourcesFit], t0);
        assert_eq!(q.stats().backoff, 1);
        assert!(q.pop(t0 + INITIAL_BACKOFF).is_some());
    }

    #[test]
    fn a_spec_update_moves_an_unschedulable_pod() {
        let t0 = Instant::now();
        let mut q = SchedulingQueue::default();
        q.upsert(info("p", 0), t0);
        q.pop(t0);
        q.unschedulable("p", vec![Plugin::TaintToleration], t0);
        let mut pod = info("p", 0)
            .pod
            .as_deref()
            .cloned()
            .expect("a pending pod's object");
        if let Some(spec) = pod.spec.as_mut() {
            spec.tolerations = Some(vec![Default::default()]);
        }
        q.upsert(
            Arc::new(PodInfo::new(Arc::new(pod), &|_| None)),
            t0 + Duration::from_secs(5),
        );
        assert!(q.pop(t0 + Duration::from_secs(5)).is_some());
    }
}
