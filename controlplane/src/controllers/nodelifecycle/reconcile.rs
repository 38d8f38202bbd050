//! The node lifecycle decisions (docs/SEEDS-SPEC.md CTL-39), pure functions of the cached
//! objects and the time: a node's health from its Ready condition and its Lease (upstream's
//! `tryUpdateNodeHealth`), the conditions to post when the kubelet went silent, the taints its
//! conditions call for, zone states and eviction rates (`handleDisruption`), and the per-zone
//! rate-limited queue of nodes waiting for their NoExecute taint.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// `node.kubernetes.io/unreachable`: Ready is Unknown.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// `node.kubernetes.io/not-ready`: Ready is False.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// `node.kubernetes.io/unschedulable`: the node is cordoned.
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// Nodes with this label are left out of the zone health (upstream's
/// `labelNodeDisruptionExclusion`).
pub const EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";

/// The conditions the kubelet owns, which become Unknown when it goes silent (not
/// NetworkUnavailable: the network plugin owns that one).
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// (condition, status) → the NoSchedule taint upstream keeps on such a node.
const CONDITION_TAINTS: [(&str, &str, &str); 6] = [
    ("Ready", "False", TAINT_NOT_READY),
    ("Ready", "Unknown", TAINT_UNREACHABLE),
    ("MemoryPressure", "True", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
    (
        "NetworkUnavailable",
        "True",
        "node.kubernetes.io/network-unavailable",
    ),
    ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
];

/// Node lifecycle tunables (kube-controller-manager's flags and defaults).
#[derive(Debug, Clone)]
pub struct LifecycleConfig {
    /// `--node-monitor-period`: how often node health is checked.
    pub monitor_period: Duration,
    /// `--node-monitor-grace-period`: silence after which a node's conditions become Unknown.
    pub grace_period: Duration,
    /// `--node-startup-grace-period`: the same for a node that never posted a Ready condition.
    pub startup_grace_period: Duration,
    /// `--node-eviction-rate`: nodes per second, per zone, that get their NoExecute taint.
    pub eviction_rate: f64,
    /// `--secondary-node-eviction-rate`: the rate in a partially disrupted large zone.
    pub secondary_eviction_rate: f64,
    /// `--unhealthy-zone-threshold`: the share of unready nodes that makes a zone unhealthy.
    pub unhealthy_zone_threshold: f64,
    /// `--large-cluster-size-threshold`: above this many nodes an unhealthy zone keeps
    /// evicting at the secondary rate; at or below it evictions stop.
    pub large_cluster_threshold: usize,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            monitor_period: Duration::from_secs(5),
            grace_period: Duration::from_secs(50),
            startup_grace_period: Duration::from_secs(60),
            eviction_rate: 0.1,
            secondary_eviction_rate: 0.01,
            unhealthy_zone_threshold: 0.55,
            large_cluster_threshold: 50,
        }
    }
}

/// What the controller remembers of a node between passes: when it last heard from the
/// kubelet (`probe`, on its own clock), the Ready condition it saw then, and the Lease's
/// renew time.
#[derive(Debug, Clone, PartialEq)]
pub struct Health {
    pub probe: DateTime<Utc>,
    pub ready_transition: DateTime<Utc>,
    pub ready: Option<NodeCondition>,
    pub lease_renew: Option<DateTime<Utc>>,
}

/// One look at a node.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The health to remember.
    pub health: Health,
    /// The Ready status before this pass (`Unknown` when the node never posted one).
    pub observed: String,
    /// The Ready status after it (None: the node has no Ready condition yet).
    pub current: Option<String>,
    /// The node's conditions to post, when the kubelet went silent for longer than the grace.
    pub post: Option<Vec<NodeCondition>>,
    lease_renew: Option<DateTime<Utc>>,
}

impl Observation {
    /// The health to remember once `post` was written.
    pub fn posted(&self, now: DateTime<Utc>) -> Health {
        Health {
            probe: self.health.probe,
            ready_transition: now,
            ready: self
                .post
                .as_ref()
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned()),
            lease_renew: self.lease_renew,
        }
    }
}

/// A node condition by type.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The Ready status of a node ("True", "False", "Unknown"), if it has one.
pub fn ready_status(node: &Node) -> Option<&str> {
    condition(node, "Ready").map(|c| c.status.as_str())
}

fn time_of(t: &Option<Time>) -> Option<DateTime<Utc>> {
    t.as_ref().map(|t| t.0)
}

/// Looks at `node` (with its Lease's renew time) given what was remembered: upstream's
/// `tryUpdateNodeHealth`. The node is heard from when its Ready heartbeat or its Lease
/// changed; silent for longer than the grace, every kubelet-owned condition becomes Unknown
/// (`NodeStatusUnknown`, "Kubelet stopped posting node status.", or `NodeStatusNeverUpdated`,
/// "Kubelet never posted node status." for one it never posted).
pub fn observe(
    node: &Node,
    lease_renew: Option<DateTime<Utc>>,
    saved: Option<&Health>,
    now: DateTime<Utc>,
    cfg: &LifecycleConfig,
) -> Observation {
    let created = time_of(&node.metadata.creation_timestamp).unwrap_or(now);
    let current = condition(node, "Ready").cloned();
    let (observed, grace) = match &current {
        None => ("Unknown".to_string(), cfg.startup_grace_period),
        Some(c) => (c.status.clone(), cfg.grace_period),
    };
    let fresh = |transition: DateTime<Utc>| Health {
        probe: now,
        ready_transition: transition,
        ready: current.clone(),
        lease_renew: saved.and_then(|s| s.lease_renew),
    };
    let mut health = match (saved, &current) {
        // Never posted: count from the node's creation.
        (None, None) => Health {
            probe: created,
            ready_transition: created,
            ready: None,
            lease_renew: None,
        },
        (Some(s), None) => Health {
            ready: None,
            ..s.clone()
        },
        (None, Some(_)) => fresh(now),
        (Some(s), Some(cur)) => match &s.ready {
            None => fresh(now),
            Some(old) if old.last_heartbeat_time != cur.last_heartbeat_time => {
                let transition = if old.last_transition_time != cur.last_transition_time {
                    now
                } else {
                    s.ready_transition
                };
                fresh(transition)
            }
            Some(_) => s.clone(),
        },
    };
    // A renewed Lease is a heartbeat too.
    if let Some(renew) = lease_renew
        && health.lease_renew.is_none_or(|old| old < renew)
    {
        health.lease_renew = Some(renew);
        health.probe = now;
    }
    let mut obs = Observation {
        observed,
        current: current.as_ref().map(|c| c.status.clone()),
        post: None,
        lease_renew: health.lease_renew,
        health,
    };
    let silent_for = now - obs.health.probe;
    if silent_for <= chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX) {
        return obs;
    }
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    for type_ in KUBELET_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            None => conditions.push(NodeCondition {
                type_: type_.into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_heartbeat_time: Some(Time(created)),
                last_transition_time: Some(Time(now)),
            }),
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(Time(now));
            }
            Some(_) => {}
        }
    }
    let after = conditions.iter().find(|c| c.type_ == "Ready").cloned();
    let before = current.unwrap_or_else(|| NodeCondition {
        type_: "Ready".into(),
        status: "Unknown".into(),
        last_heartbeat_time: Some(Time(created)),
        last_transition_time: Some(Time(created)),
        ..NodeCondition::default()
    });
    if after.as_ref() != Some(&before) {
        obs.current = after.map(|c| c.status);
        obs.post = Some(conditions);
    }
    obs
}

/// A taint with a key and an effect.
pub fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        ..Taint::default()
    }
}

/// Whether `taints` hold one with `key` and `effect` (upstream's `MatchTaint`).
pub fn has_taint(taints: &[Taint], key: &str, effect: &str) -> bool {
    taints.iter().any(|t| t.key == key && t.effect == effect)
}

/// A node's taints.
pub fn taints_of(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The NoSchedule taints a node's conditions and `spec.unschedulable` call for, against the
/// ones it has (upstream's `doNoScheduleTaintingPass`): (to add, to remove).
pub fn noschedule_diff(node: &Node) -> (Vec<Taint>, Vec<Taint>) {
    let mut want: Vec<Taint> = Vec::new();
    for c in node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
    {
        for (type_, status, key) in CONDITION_TAINTS {
            if c.type_ == type_ && c.status == status {
                want.push(taint(key, "NoSchedule"));
            }
        }
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        want.push(taint(TAINT_UNSCHEDULABLE, "NoSchedule"));
    }
    let ours = |t: &Taint| {
        t.effect == "NoSchedule"
            && (t.key == TAINT_UNSCHEDULABLE || CONDITION_TAINTS.iter().any(|(_, _, k)| *k == t.key))
    };
    let have: Vec<&Taint> = taints_of(node).iter().filter(|t| ours(t)).collect();
    let add = want
        .iter()
        .filter(|w| !have.iter().any(|h| h.key == w.key))
        .cloned()
        .collect();
    let remove = have
        .into_iter()
        .filter(|h| !want.iter().any(|w| w.key == h.key))
        .cloned()
        .collect();
    (add, remove)
}

/// The beta OS/arch labels the stable ones call for (upstream's `reconcileNodeLabels`).
pub fn labels_to_reconcile(node: &Node) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(labels) = node.metadata.labels.as_ref() else {
        return out;
    };
    for (primary, secondary) in [
        ("kubernetes.io/os", "beta.kubernetes.io/os"),
        ("kubernetes.io/arch", "beta.kubernetes.io/arch"),
    ] {
        if let Some(v) = labels.get(primary)
            && labels.get(secondary) != Some(v)
        {
            out.insert(secondary.to_string(), v.clone());
        }
    }
    out
}

/// What a node's observed Ready status asks of its NoExecute taints (upstream's
/// `processTaintBaseEviction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaintAction {
    /// Swap the opposite taint at once (the node already has one of the two).
    Swap {
        add: &'static str,
        remove: &'static str,
    },
    /// Queue the node for the taint `key` (rate limited per zone).
    Queue {
        key: &'static str,
    },
    /// Ready: remove both taints and take the node off the queue.
    Reachable,
    None,
}

/// The NoExecute taint action for `node` whose Ready status was `observed` before this pass.
pub fn taint_action(node: &Node, observed: &str) -> TaintAction {
    let taints = taints_of(node);
    match observed {
        "False" if has_taint(taints, TAINT_UNREACHABLE, "NoExecute") => TaintAction::Swap {
            add: TAINT_NOT_READY,
            remove: TAINT_UNREACHABLE,
        },
        "False" => TaintAction::Queue { key: TAINT_NOT_READY },
        "Unknown" if has_taint(taints, TAINT_NOT_READY, "NoExecute") => TaintAction::Swap {
            add: TAINT_UNREACHABLE,
            remove: TAINT_NOT_READY,
        },
        "Unknown" => TaintAction::Queue {
            key: TAINT_UNREACHABLE,
        },
        "True" => TaintAction::Reachable,
        _ => TaintAction::None,
    }
}

/// The NoExecute taint a node in the tainting queue gets now, and the one it loses (upstream's
/// `doNoExecuteTaintingPass`): None once it is Ready again.
pub fn noexecute_for(node: &Node) -> Option<(&'static str, &'static str)> {
    match ready_status(node)? {
        "False" => Some((TAINT_NOT_READY, TAINT_UNREACHABLE)),
        "Unknown" => Some((TAINT_UNREACHABLE, TAINT_NOT_READY)),
        _ => None,
    }
}

/// A node's zone: `<region>:\0:<zone>` from the topology labels (or their beta forms), empty
/// when it has neither (upstream's `GetZoneKey`).
pub fn zone_of(node: &Node) -> String {
    let labels = node.metadata.labels.as_ref();
    let get = |stable: &str, beta: &str| {
        labels
            .and_then(|l| l.get(stable).or_else(|| l.get(beta)))
            .cloned()
            .unwrap_or_default()
    };
    let zone = get(
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/zone",
    );
    let region = get(
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/region",
    );
    if zone.is_empty() && region.is_empty() {
        return String::new();
    }
    format!("{region}:\x00:{zone}")
}

/// Whether the node counts in its zone's health.
pub fn counts_for_zone(node: &Node) -> bool {
    !node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_DISRUPTION))
}

/// A zone's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneState {
    Initial,
    Normal,
    /// No node of the zone is Ready.
    FullDisruption,
    /// More than two nodes and at least the threshold share of them are not Ready.
    PartialDisruption,
}

/// (unready nodes, state) of a zone whose nodes' readiness is `ready` (upstream's
/// `ComputeZoneState`).
pub fn zone_state(ready: &[bool], threshold: f64) -> (usize, ZoneState) {
    let ok = ready.iter().filter(|r| **r).count();
    let bad = ready.len() - ok;
    let state = if ok == 0 && bad > 0 {
        ZoneState::FullDisruption
    } else if bad > 2 && bad as f64 / ready.len() as f64 >= threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    };
    (bad, state)
}

/// The tainting rate of a zone of `size` nodes in `state` (upstream's `setLimiterInZone`): the
/// normal rate, or for a partially disrupted zone the secondary rate in a large cluster and
/// none in a small one. A fully disrupted zone evicts at the normal rate (its nodes are gone,
/// not the network) unless every zone is (then nothing is evicted: see [`handle_disruption`]).
pub fn zone_rate(state: ZoneState, size: usize, cfg: &LifecycleConfig) -> f64 {
    match state {
        ZoneState::PartialDisruption if size > cfg.large_cluster_threshold => cfg.secondary_eviction_rate,
        ZoneState::PartialDisruption => 0.0,
        _ => cfg.eviction_rate,
    }
}

/// What a pass's zone health changes.
#[derive(Debug, Clone, PartialEq)]
pub enum DisruptionChange {
    None,
    /// Every zone lost all its nodes: the control plane is likely cut off, not the nodes.
    /// Remove the NoExecute taints of every node and stop tainting.
    Enter,
    /// Some node is back after a full disruption: every node's health clock restarts now, and
    /// zones get these rates.
    Exit(Vec<(String, f64)>),
    /// Zones whose state changed get these rates.
    Rates(Vec<(String, f64)>),
}

/// Updates the zone states from this pass's readiness per zone (upstream's
/// `handleDisruption`).
pub fn handle_disruption(
    states: &mut HashMap<String, ZoneState>,
    ready_by_zone: &HashMap<String, Vec<bool>>,
    cfg: &LifecycleConfig,
) -> DisruptionChange {
    let mut new_states = HashMap::new();
    let mut all_full = true;
    for (zone, ready) in ready_by_zone {
        let (_, state) = zone_state(ready, cfg.unhealthy_zone_threshold);
        if state != ZoneState::FullDisruption {
            all_full = false;
        }
        new_states.insert(zone.clone(), state);
        states.entry(zone.clone()).or_insert(ZoneState::Initial);
    }
    states.retain(|zone, _| ready_by_zone.contains_key(zone));
    let all_were_full = states.values().all(|s| *s == ZoneState::FullDisruption);
    if all_full && all_were_full {
        return DisruptionChange::None;
    }
    let size = |zone: &str| ready_by_zone.get(zone).map_or(0, Vec::len);
    if all_full {
        for s in states.values_mut() {
            *s = ZoneState::FullDisruption;
        }
        return DisruptionChange::Enter;
    }
    let mut rates = Vec::new();
    for (zone, state) in states.iter_mut() {
        let new = new_states.get(zone).copied().unwrap_or(ZoneState::Normal);
        if all_were_full || *state != new {
            rates.push((zone.clone(), zone_rate(new, size(zone), cfg)));
            *state = new;
        }
    }
    rates.sort_by(|a, b| a.0.cmp(&b.0));
    if all_were_full {
        DisruptionChange::Exit(rates)
    } else {
        DisruptionChange::Rates(rates)
    }
}

/// A token bucket with a burst of one (upstream's `EvictionRateLimiterBurst`); a rate of zero
/// never lets anything through.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    at: DateTime<Utc>,
}

impl TokenBucket {
    pub fn new(rate: f64, now: DateTime<Utc>) -> Self {
        Self {
            rate,
            tokens: 1.0,
            at: now,
        }
    }

    fn refill(&mut self, now: DateTime<Utc>) {
        if now > self.at {
            let secs = (now - self.at).to_std().map(|d| d.as_secs_f64()).unwrap_or(0.0);
            self.tokens = (self.tokens + secs * self.rate).min(1.0);
            self.at = now;
        }
    }

    /// Takes a token if there is one.
    pub fn try_accept(&mut self, now: DateTime<Utc>) -> bool {
        if self.rate <= 0.0 {
            return false;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }
}

/// The nodes of one zone waiting for their NoExecute taint, taken in the order they came at
/// the zone's rate (upstream's `RateLimitedTimedQueue`). A node stays a member after it was
/// taken, so it is not queued again until it is removed (it became Ready).
#[derive(Debug, Clone)]
pub struct ZoneTainter {
    queue: BTreeMap<(DateTime<Utc>, u64), String>,
    members: HashMap<String, Option<(DateTime<Utc>, u64)>>,
    bucket: TokenBucket,
    seq: u64,
}

impl ZoneTainter {
    pub fn new(rate: f64, now: DateTime<Utc>) -> Self {
        Self {
            queue: BTreeMap::new(),
            members: HashMap::new(),
            bucket: TokenBucket::new(rate, now),
            seq: 0,
        }
    }

    /// Queues `node` unless it is a member; returns whether it was queued.
    pub fn add(&mut self, node: &str, now: DateTime<Utc>) -> bool {
        if self.members.contains_key(node) {
            return false;
        }
        self.push(node, now);
        true
    }

    fn push(&mut self, node: &str, at: DateTime<Utc>) {
        self.seq += 1;
        let key = (at, self.seq);
        self.queue.insert(key, node.to_string());
        self.members.insert(node.to_string(), Some(key));
    }

    /// Forgets `node`; returns whether it was a member.
    pub fn remove(&mut self, node: &str) -> bool {
        match self.members.remove(node) {
            Some(key) => {
                if let Some(k) = key {
                    self.queue.remove(&k);
                }
                true
            }
            None => false,
        }
    }

    /// The next node due, if the rate allows one now (it stays a member).
    pub fn next_due(&mut self, now: DateTime<Utc>) -> Option<String> {
        let (&key, _) = self.queue.first_key_value()?;
        if key.0 > now || !self.bucket.try_accept(now) {
            return None;
        }
        let node = self.queue.remove(&key)?;
        self.members.insert(node.clone(), None);
        Some(node)
    }

    /// Queues a taken `node` again at `at` (its taint could not be written).
    pub fn retry(&mut self, node: &str, at: DateTime<Utc>) {
        if self.members.contains_key(node) {
            self.push(node, at);
        }
    }

    /// Changes the rate (upstream's `SwapLimiter`: a new bucket, full unless the old one was
    /// empty).
    pub fn set_rate(&mut self, rate: f64, now: DateTime<Utc>) {
        if self.bucket.rate() == rate {
            return;
        }
        let had_token = self.bucket.try_accept(now);
        self.bucket = TokenBucket::new(rate, now);
        if !had_token {
            self.bucket.try_accept(now);
        }
    }

    pub fn is_member(&self, node: &str) -> bool {
        self.members.contains_key(node)
    }

    /// Nodes waiting.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
}

/// The nodes added and removed since the last pass (upstream's `classifyNodes`).
pub fn classify<'a>(
    known: &HashSet<String>,
    nodes: &'a [std::sync::Arc<Node>],
) -> (Vec<&'a Node>, Vec<String>) {
    let names: HashSet<&str> = nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    let added = nodes
        .iter()
        .filter(|n| !known.contains(n.metadata.name.as_deref().unwrap_or_default()))
        .map(|n| &**n)
        .collect();
    let mut removed: Vec<String> = known
        .iter()
        .filter(|k| !names.contains(k.as_str()))
        .cloned()
        .collect();
    removed.sort();
    (added, removed)
}
