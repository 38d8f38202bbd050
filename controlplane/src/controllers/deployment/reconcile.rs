//! The Deployment decision (docs/SEEDS-SPEC.md CTL-4..CTL-17), a pure function of the cached
//! Deployment, the ReplicaSets of its namespace, the pods of its ReplicaSets (Recreate only) and
//! the time. It follows upstream's sync (pkg/controller/deployment: `syncDeployment`, `sync`,
//! `rolloutRolling`, `rolloutRecreate`, `syncRolloutStatus`) step by step over working copies of
//! the ReplicaSets, and returns the writes in the order upstream makes them: the code around it
//! runs them and stops at the first failure, as upstream returns on the first error.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentSpec, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kcore::labels::{labels_of, selector_matches};
use serde_json::Value;

use super::hash::compute_hash;
use crate::controllers::podutil::controller_owner;

/// The label that tells a Deployment's ReplicaSets (and their pods) apart.
pub const HASH_LABEL: &str = "pod-template-hash";
pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
/// Longest `revision-history` annotation kept (upstream's `maxRevHistoryLengthInChars`).
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

// Condition reasons (upstream's deployment util).
pub const NEW_RS_CREATED: &str = "NewReplicaSetCreated";
pub const FOUND_NEW_RS: &str = "FoundNewReplicaSet";
pub const RS_UPDATED: &str = "ReplicaSetUpdated";
pub const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";
pub const TIMED_OUT: &str = "ProgressDeadlineExceeded";
pub const PAUSED: &str = "DeploymentPaused";
pub const RESUMED: &str = "DeploymentResumed";
pub const RS_CREATE_ERROR: &str = "ReplicaSetCreateError";
pub const MIN_AVAILABLE: &str = "MinimumReplicasAvailable";
pub const MIN_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

/// An event about the Deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// One write, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Add our controller reference to an orphan ReplicaSet.
    Adopt {
        name: String,
        uid: String,
    },
    /// Remove our reference from a ReplicaSet the selector no longer matches.
    Release {
        name: String,
        uid: String,
    },
    /// Create the new ReplicaSet (its name is deterministic: AlreadyExists is a possible hash
    /// collision).
    Create(Box<ReplicaSet>),
    /// Set a ReplicaSet's size, annotations and minReadySeconds (optimistic on its
    /// resourceVersion).
    Update {
        name: String,
        replicas: i32,
        annotations: BTreeMap<String, String>,
        min_ready_seconds: i32,
    },
    /// Delete an old ReplicaSet beyond `revisionHistoryLimit`.
    Delete {
        name: String,
        uid: String,
    },
    /// The Deployment's `deployment.kubernetes.io/revision` annotation.
    SetRevision(String),
    Event(Event),
}

/// What one sync does.
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// The status to write (None: unchanged).
    pub status: Option<DeploymentStatus>,
    /// Sync again after this long (a progress-deadline check).
    pub requeue_after: Option<Duration>,
}

/// The sync of `d`, given the ReplicaSets of its namespace, the pods of its namespace (only read
/// for Recreate), and the time.
pub fn plan(d: &Deployment, sets: &[Arc<ReplicaSet>], pods: &[Arc<Pod>], now: DateTime<Utc>) -> Plan {
    let mut s = Sync::new(d, now);
    s.run(sets, pods);
    s.finish()
}

/// The working state of one sync: the Deployment (its status and annotations change in memory,
/// as upstream's do) and working copies of its ReplicaSets.
struct Sync {
    d: Deployment,
    original: DeploymentStatus,
    rss: Vec<ReplicaSet>,
    steps: Vec<Step>,
    now: DateTime<Utc>,
    requeue_after: Option<Duration>,
    /// Whether this sync writes the status (upstream's `syncStatusOnly`, `sync` and the
    /// rollouts all end in a status write).
    status_synced: bool,
}

fn spec(d: &Deployment) -> DeploymentSpec {
    d.spec.clone().unwrap_or_default()
}

fn replicas_of(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn rs_status(rs: &ReplicaSet) -> (i32, i32, i32) {
    let s = rs.status.clone().unwrap_or_default();
    (
        s.replicas,
        s.ready_replicas.unwrap_or(0),
        s.available_replicas.unwrap_or(0),
    )
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

/// `GetScaledValueFromIntOrPercent`: a percentage of `total`, rounded up or down.
pub fn scaled_value(v: &IntOrString, total: i32, round_up: bool) -> i32 {
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let pct: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
            let x = pct * f64::from(total) / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
    }
}

/// `ResolveFenceposts`: maxSurge rounds up, maxUnavailable down; both 0 means maxUnavailable 1.
pub fn resolve_fenceposts(
    max_surge: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    desired: i32,
) -> (i32, i32) {
    let zero = IntOrString::Int(0);
    let surge = scaled_value(max_surge.unwrap_or(&zero), desired, true);
    let mut unavailable = scaled_value(max_unavailable.unwrap_or(&zero), desired, false);
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    (surge, unavailable)
}

fn rolling_params(d: &Deployment) -> (IntOrString, IntOrString) {
    let ru = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    let pct = || IntOrString::String("25%".into());
    (
        ru.max_surge.unwrap_or_else(pct),
        ru.max_unavailable.unwrap_or_else(pct),
    )
}

/// `MaxSurge`: 0 for Recreate.
pub fn max_surge(d: &Deployment) -> i32 {
    if is_recreate(d) {
        return 0;
    }
    let (surge, unavailable) = rolling_params(d);
    resolve_fenceposts(Some(&surge), Some(&unavailable), replicas_of(d)).0
}

/// `MaxUnavailable`: 0 for Recreate or no replicas, at most `replicas`.
pub fn max_unavailable(d: &Deployment) -> i32 {
    let replicas = replicas_of(d);
    if is_recreate(d) || replicas == 0 {
        return 0;
    }
    let (surge, unavailable) = rolling_params(d);
    resolve_fenceposts(Some(&surge), Some(&unavailable), replicas)
        .1
        .min(replicas)
}

fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .is_some_and(|p| p != i32::MAX)
}

fn revision_of(rs: &ReplicaSet) -> Option<i64> {
    rs.metadata.annotations.as_ref()?.get(REVISION)?.parse().ok()
}

fn annotation<'a>(rs: &'a ReplicaSet, key: &str) -> Option<&'a str> {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn created(rs: &ReplicaSet) -> Option<DateTime<Utc>> {
    rs.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// `ReplicaSetsByCreationTimestamp`: older first, then by name.
fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> std::cmp::Ordering {
    created(a)
        .cmp(&created(b))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// `ReplicaSetsByRevision`: lower revision first (a set without one counts as revision 0, as
/// upstream's `Revision` reads it), creation order when equal. An unparsable revision also
/// counts as 0: upstream falls to creation order for any pair holding one, which is not a total
/// order (a cycle through a set without a revision), and Rust's sort panics on those.
fn by_revision(a: &ReplicaSet, b: &ReplicaSet) -> std::cmp::Ordering {
    let rev = |rs| revision_of(rs).unwrap_or(0);
    rev(a).cmp(&rev(b)).then_with(|| by_creation(a, b))
}

/// The template as the API holds it, for comparisons: nulls, empty lists and empty maps
/// dropped (upstream's semantic equality treats nil and empty alike).
fn normalized(v: Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Array(a) => {
            let a: Vec<Value> = a
                .into_iter()
                .map(|x| normalized(x).unwrap_or(Value::Null))
                .collect();
            (!a.is_empty()).then_some(Value::Array(a))
        }
        Value::Object(o) => {
            let o: serde_json::Map<String, Value> = o
                .into_iter()
                .filter_map(|(k, v)| normalized(v).map(|v| (k, v)))
                .collect();
            (!o.is_empty()).then_some(Value::Object(o))
        }
        v => Some(v),
    }
}

/// `EqualIgnoreHash`: the two templates are the same but for the pod-template-hash label.
pub fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    let strip = |t: &PodTemplateSpec| {
        let mut t = t.clone();
        if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            l.remove(HASH_LABEL);
        }
        normalized(serde_json::to_value(t).unwrap_or(Value::Null))
    };
    strip(a) == strip(b)
}

fn template_of(rs: &ReplicaSet) -> PodTemplateSpec {
    rs.spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default()
}

fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn has_controller(meta: &ObjectMeta) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true))
}

fn condition<'a>(s: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    s.conditions.iter().flatten().find(|c| c.type_ == type_)
}

fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: DateTime<Utc>,
) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// `SetDeploymentCondition`: same status and reason is no change; same status keeps the
/// transition time; the condition moves to the end.
pub fn set_condition(s: &mut DeploymentStatus, mut c: DeploymentCondition) {
    if let Some(cur) = condition(s, &c.type_) {
        if cur.status == c.status && cur.reason == c.reason {
            return;
        }
        if cur.status == c.status {
            c.last_transition_time = cur.last_transition_time.clone();
        }
    }
    remove_condition(s, &c.type_.clone());
    s.conditions.get_or_insert_with(Vec::new).push(c);
}

fn remove_condition(s: &mut DeploymentStatus, type_: &str) {
    if let Some(cs) = s.conditions.as_mut() {
        cs.retain(|c| c.type_ != type_);
        if cs.is_empty() {
            s.conditions = None;
        }
    }
}

/// The condition upstream sets when the new ReplicaSet cannot be created.
pub fn create_failed(
    d: &Deployment,
    rs_name: &str,
    error: &str,
    now: DateTime<Utc>,
) -> Option<DeploymentCondition> {
    has_progress_deadline(d).then(|| {
        new_condition(
            "Progressing",
            "False",
            RS_CREATE_ERROR,
            format!("Failed to create new replica set {rs_name:?}: {error}"),
            now,
        )
    })
}

/// Two statuses are the same (counts absent and 0 alike).
pub fn same_status(a: &DeploymentStatus, b: &DeploymentStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    a.observed_generation.unwrap_or(0) == b.observed_generation.unwrap_or(0)
        && n(a.replicas) == n(b.replicas)
        && n(a.updated_replicas) == n(b.updated_replicas)
        && n(a.ready_replicas) == n(b.ready_replicas)
        && n(a.available_replicas) == n(b.available_replicas)
        && n(a.unavailable_replicas) == n(b.unavailable_replicas)
        && a.collision_count == b.collision_count
        && a.conditions.clone().unwrap_or_default() == b.conditions.clone().unwrap_or_default()
}

impl Sync {
    fn new(d: &Deployment, now: DateTime<Utc>) -> Self {
        Self {
            original: d.status.clone().unwrap_or_default(),
            d: d.clone(),
            rss: Vec::new(),
            steps: Vec::new(),
            now,
            requeue_after: None,
            status_synced: false,
        }
    }

    fn status(&mut self) -> &mut DeploymentStatus {
        self.d.status.get_or_insert_with(DeploymentStatus::default)
    }

    fn event(&mut self, reason: &'static str, message: String) {
        self.steps.push(Step::Event(Event {
            warning: false,
            reason,
            message,
        }));
    }

    fn run(&mut self, sets: &[Arc<ReplicaSet>], pods: &[Arc<Pod>]) {
        let spec = spec(&self.d);
        // An empty selector would select every pod of the namespace: upstream refuses it.
        if spec.selector.match_labels.as_ref().is_none_or(BTreeMap::is_empty)
            && spec.selector.match_expressions.as_ref().is_none_or(Vec::is_empty)
        {
            self.steps.push(Step::Event(Event {
                warning: true,
                reason: "SelectingAll",
                message: "This deployment is selecting all pods. A non-empty selector is required.".into(),
            }));
            let generation = self.d.metadata.generation;
            if self.original.observed_generation < generation {
                self.status().observed_generation = generation;
                self.status_synced = true;
            }
            return;
        }
        self.claim(sets);
        if self.d.metadata.deletion_timestamp.is_some() {
            let (new, old) = self.all_replica_sets(false);
            self.sync_status(new, &old);
            return;
        }
        self.check_paused_conditions();
        if spec.paused == Some(true) {
            self.sync();
            return;
        }
        if self.is_scaling_event() {
            self.sync();
            return;
        }
        if is_recreate(&self.d) {
            self.rollout_recreate(pods);
        } else {
            self.rollout_rolling();
        }
    }

    fn finish(mut self) -> Plan {
        let status = self.d.status.take().unwrap_or_default();
        let changed = self.status_synced && !same_status(&status, &self.original);
        Plan {
            steps: self.steps,
            status: changed.then_some(status),
            requeue_after: self.requeue_after,
        }
    }

    /// `ClaimReplicaSets`: keep owned sets that match, release owned sets that do not, adopt
    /// matching orphans (not while the Deployment is being deleted).
    fn claim(&mut self, sets: &[Arc<ReplicaSet>]) {
        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let ns = self.d.metadata.namespace.clone();
        let selector = spec(&self.d).selector;
        let deleting = self.d.metadata.deletion_timestamp.is_some();
        for rs in sets.iter().filter(|rs| rs.metadata.namespace == ns) {
            let matches = selector_matches(&selector, labels_of(&rs.metadata.labels));
            let name = rs.metadata.name.clone().unwrap_or_default();
            let rs_uid = rs.metadata.uid.clone().unwrap_or_default();
            if controlled_by(&rs.metadata, &uid) {
                if matches {
                    self.rss.push((**rs).clone());
                } else if !deleting {
                    self.steps.push(Step::Release { name, uid: rs_uid });
                }
            } else if !has_controller(&rs.metadata)
                && matches
                && !deleting
                && rs.metadata.deletion_timestamp.is_none()
            {
                self.steps.push(Step::Adopt { name, uid: rs_uid });
                let mut adopted = (**rs).clone();
                adopted
                    .metadata
                    .owner_references
                    .get_or_insert_with(Vec::new)
                    .push(controller_owner("apps/v1", "Deployment", &self.d.metadata));
                self.rss.push(adopted);
            }
        }
    }

    /// `FindNewReplicaSet`: the oldest set whose template is the Deployment's.
    fn find_new(&self) -> Option<usize> {
        let template = spec(&self.d).template;
        let mut idx: Vec<usize> = (0..self.rss.len()).collect();
        idx.sort_by(|a, b| by_creation(&self.rss[*a], &self.rss[*b]));
        idx.into_iter()
            .find(|i| equal_ignore_hash(&template_of(&self.rss[*i]), &template))
    }

    /// `getAllReplicaSetsAndSyncRevision`: the new set (created when `create` and missing) and
    /// the old ones, with the revision annotations in step.
    fn all_replica_sets(&mut self, create: bool) -> (Option<usize>, Vec<usize>) {
        let existing = self.find_new();
        let old: Vec<usize> = (0..self.rss.len()).filter(|i| Some(*i) != existing).collect();
        let max_old = old
            .iter()
            .filter_map(|i| revision_of(&self.rss[*i]))
            .max()
            .unwrap_or(0);
        let new_revision = (max_old + 1).to_string();
        if let Some(i) = existing {
            let mut rs = self.rss[i].clone();
            let annotations_changed = set_new_rs_annotations(&self.d, &mut rs, &new_revision, true);
            let min_ready = spec(&self.d).min_ready_seconds.unwrap_or(0);
            let rs_min_ready = rs.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0);
            if annotations_changed || rs_min_ready != min_ready {
                if let Some(s) = rs.spec.as_mut() {
                    s.min_ready_seconds = Some(min_ready);
                }
                self.steps.push(Step::Update {
                    name: rs.metadata.name.clone().unwrap_or_default(),
                    replicas: rs_replicas(&rs),
                    annotations: rs.metadata.annotations.clone().unwrap_or_default(),
                    min_ready_seconds: min_ready,
                });
                self.rss[i] = rs;
                return (Some(i), old);
            }
            let revision = annotation(&rs, REVISION).unwrap_or_default().to_string();
            self.set_revision(&revision);
            if has_progress_deadline(&self.d) && condition(self.status(), "Progressing").is_none() {
                let msg = format!(
                    "Found new replica set {:?}",
                    rs.metadata.name.clone().unwrap_or_default()
                );
                let c = new_condition("Progressing", "True", FOUND_NEW_RS, msg, self.now);
                set_condition(self.status(), c);
            }
            return (Some(i), old);
        }
        if !create {
            return (None, old);
        }
        let rs = self.new_replica_set(&new_revision, &old);
        let name = rs.metadata.name.clone().unwrap_or_default();
        let replicas = rs_replicas(&rs);
        self.steps.push(Step::Create(Box::new(rs.clone())));
        if replicas > 0 {
            self.event(
                "ScalingReplicaSet",
                format!("Scaled up replica set {name} from 0 to {replicas}"),
            );
        }
        self.set_revision(&new_revision);
        if has_progress_deadline(&self.d) {
            let c = new_condition(
                "Progressing",
                "True",
                NEW_RS_CREATED,
                format!("Created new replica set {name:?}"),
                self.now,
            );
            set_condition(self.status(), c);
        }
        self.rss.push(rs);
        (Some(self.rss.len() - 1), old)
    }

    fn set_revision(&mut self, revision: &str) {
        let annotations = self.d.metadata.annotations.get_or_insert_with(BTreeMap::new);
        if annotations.get(REVISION).map(String::as_str) != Some(revision) {
            annotations.insert(REVISION.into(), revision.into());
            self.steps.push(Step::SetRevision(revision.into()));
        }
    }

    /// The new ReplicaSet: `<name>-<hash>`, the hash label in template and selector, sized by
    /// `NewRSNewReplicas`.
    fn new_replica_set(&self, revision: &str, old: &[usize]) -> ReplicaSet {
        let spec = spec(&self.d);
        let mut template = spec.template.clone();
        let collisions = self.d.status.as_ref().and_then(|s| s.collision_count);
        let hash = compute_hash(&template, collisions);
        let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .insert(HASH_LABEL.into(), hash.clone());
        let labels = meta.labels.clone();
        let mut selector: LabelSelector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(HASH_LABEL.into(), hash.clone());
        let mut rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}-{hash}",
                    self.d.metadata.name.as_deref().unwrap_or_default()
                )),
                namespace: self.d.metadata.namespace.clone(),
                owner_references: Some(vec![controller_owner("apps/v1", "Deployment", &self.d.metadata)]),
                labels,
                creation_timestamp: Some(Time(self.now)),
                ..ObjectMeta::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: Some(spec.min_ready_seconds.unwrap_or(0)),
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let all: Vec<&ReplicaSet> = old.iter().map(|i| &self.rss[*i]).chain([&rs]).collect();
        let replicas = new_rs_new_replicas(&self.d, &all, &rs);
        if let Some(s) = rs.spec.as_mut() {
            s.replicas = Some(replicas);
        }
        set_new_rs_annotations(&self.d, &mut rs, revision, false);
        rs
    }

    /// `checkPausedConditions`: Progressing Unknown with DeploymentPaused / DeploymentResumed.
    fn check_paused_conditions(&mut self) {
        if !has_progress_deadline(&self.d) {
            return;
        }
        let cur = condition(self.status(), "Progressing").cloned();
        if cur.as_ref().and_then(|c| c.reason.as_deref()) == Some(TIMED_OUT) {
            return;
        }
        let paused_cond = cur.as_ref().and_then(|c| c.reason.as_deref()) == Some(PAUSED);
        let paused = spec(&self.d).paused == Some(true);
        let now = self.now;
        if paused && !paused_cond {
            let c = new_condition(
                "Progressing",
                "Unknown",
                PAUSED,
                "Deployment is paused".into(),
                now,
            );
            set_condition(self.status(), c);
            self.status_synced = true;
        } else if !paused && paused_cond {
            let c = new_condition(
                "Progressing",
                "Unknown",
                RESUMED,
                "Deployment is resumed".into(),
                now,
            );
            set_condition(self.status(), c);
            self.status_synced = true;
        }
    }

    /// `isScalingEvent`: an active set was sized for another `replicas`.
    fn is_scaling_event(&mut self) -> bool {
        let (new, old) = self.all_replica_sets(false);
        let replicas = replicas_of(&self.d);
        new.into_iter().chain(old).any(|i| {
            let rs = &self.rss[i];
            rs_replicas(rs) > 0
                && annotation(rs, DESIRED_REPLICAS)
                    .and_then(|v| v.parse::<i32>().ok())
                    .is_some_and(|desired| desired != replicas)
        })
    }

    /// `sync`: scaling, and history cleanup while paused; no rollout.
    fn sync(&mut self) {
        let (new, old) = self.all_replica_sets(false);
        self.scale(new, &old);
        if spec(&self.d).paused == Some(true) && annotation_of(&self.d, ROLLBACK_TO).is_none() {
            self.cleanup(&old);
        }
        self.sync_status(new, &old);
    }

    /// `scale`: a single active set takes all replicas; a saturated new set empties the old
    /// ones; otherwise every active set grows or shrinks in proportion.
    fn scale(&mut self, new: Option<usize>, old: &[usize]) {
        let replicas = replicas_of(&self.d);
        if let Some(i) = self.active_or_latest(new, old) {
            if rs_replicas(&self.rss[i]) != replicas {
                self.scale_and_record(i, replicas);
            }
            return;
        }
        if let Some(n) = new
            && self.is_saturated(n)
        {
            for &i in old {
                if rs_replicas(&self.rss[i]) > 0 {
                    self.scale_and_record(i, 0);
                }
            }
            return;
        }
        if is_recreate(&self.d) {
            return;
        }
        let mut active: Vec<usize> = new
            .into_iter()
            .chain(old.iter().copied())
            .filter(|i| rs_replicas(&self.rss[*i]) > 0)
            .collect();
        let total: i32 = active.iter().map(|i| rs_replicas(&self.rss[*i])).sum();
        let allowed = if replicas > 0 {
            replicas + max_surge(&self.d)
        } else {
            0
        };
        let to_add = allowed - total;
        let operation = if to_add > 0 {
            // Bigger first; newer first among equals.
            active.sort_by(|a, b| {
                let (ra, rb) = (&self.rss[*a], &self.rss[*b]);
                rs_replicas(rb)
                    .cmp(&rs_replicas(ra))
                    .then_with(|| by_creation(rb, ra))
            });
            "up"
        } else if to_add < 0 {
            // Bigger first; older first among equals.
            active.sort_by(|a, b| {
                let (ra, rb) = (&self.rss[*a], &self.rss[*b]);
                rs_replicas(rb)
                    .cmp(&rs_replicas(ra))
                    .then_with(|| by_creation(ra, rb))
            });
            "down"
        } else {
            ""
        };
        let mut added = 0;
        let mut sizes: HashMap<usize, i32> = HashMap::new();
        for i in &active {
            let rs = &self.rss[*i];
            if to_add != 0 {
                let p = self.proportion(rs, to_add, added);
                sizes.insert(*i, rs_replicas(rs) + p);
                added += p;
            } else {
                sizes.insert(*i, rs_replicas(rs));
            }
        }
        for (pos, i) in active.iter().enumerate() {
            let mut size = sizes.get(i).copied().unwrap_or(0);
            if pos == 0 && to_add != 0 {
                size = (size + to_add - added).max(0);
            }
            self.scale_rs(*i, size, operation);
        }
    }

    /// `GetReplicaSetProportion`.
    fn proportion(&self, rs: &ReplicaSet, to_add: i32, added: i32) -> i32 {
        if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
            return 0;
        }
        let fraction = self.fraction(rs);
        let allowed = to_add - added;
        if to_add > 0 {
            fraction.min(allowed)
        } else {
            fraction.max(allowed)
        }
    }

    /// `getReplicaSetFraction`: the set's share of the new size, from the size it was made for
    /// (its max-replicas annotation).
    fn fraction(&self, rs: &ReplicaSet) -> i32 {
        let replicas = replicas_of(&self.d);
        if replicas == 0 {
            return -rs_replicas(rs);
        }
        let max_now = replicas + max_surge(&self.d);
        let before = annotation(rs, MAX_REPLICAS)
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or_else(|| self.original.replicas.unwrap_or(0));
        if before == 0 {
            return 0;
        }
        let size = f64::from(rs_replicas(rs)) * f64::from(max_now) / f64::from(before);
        let rounded = if size < 0.0 { size - 0.5 } else { size + 0.5 } as i32;
        rounded - rs_replicas(rs)
    }

    /// `FindActiveOrLatest`: the only active set, or the newest when none is active.
    fn active_or_latest(&self, new: Option<usize>, old: &[usize]) -> Option<usize> {
        if new.is_none() && old.is_empty() {
            return None;
        }
        let mut olds = old.to_vec();
        olds.sort_by(|a, b| by_creation(&self.rss[*b], &self.rss[*a]));
        let active: Vec<usize> = olds
            .iter()
            .copied()
            .chain(new)
            .filter(|i| rs_replicas(&self.rss[*i]) > 0)
            .collect();
        match active.len() {
            0 => new.or_else(|| olds.first().copied()),
            1 => Some(active[0]),
            _ => None,
        }
    }

    /// `IsSaturated`: the new set was sized for, holds and has available all the replicas.
    fn is_saturated(&self, i: usize) -> bool {
        let rs = &self.rss[i];
        let replicas = replicas_of(&self.d);
        let desired = annotation(rs, DESIRED_REPLICAS).and_then(|v| v.parse::<i32>().ok());
        rs_replicas(rs) == replicas && desired == Some(replicas) && rs_status(rs).2 == replicas
    }

    fn scale_and_record(&mut self, i: usize, size: i32) -> bool {
        let cur = rs_replicas(&self.rss[i]);
        if cur == size {
            return false;
        }
        self.scale_rs(i, size, if cur < size { "up" } else { "down" })
    }

    /// `scaleReplicaSet`: a new size and/or the replicas annotations; the event when the size
    /// changes.
    fn scale_rs(&mut self, i: usize, size: i32, operation: &str) -> bool {
        let replicas = replicas_of(&self.d);
        let max = replicas + max_surge(&self.d);
        let rs = &mut self.rss[i];
        let old = rs_replicas(rs);
        let size_changed = old != size;
        let annotations_changed = replicas_annotations_need_update(rs, replicas, max);
        if !size_changed && !annotations_changed {
            return false;
        }
        if let Some(s) = rs.spec.as_mut() {
            s.replicas = Some(size);
        }
        set_replicas_annotations(rs, replicas, max);
        let name = rs.metadata.name.clone().unwrap_or_default();
        self.steps.push(Step::Update {
            name: name.clone(),
            replicas: size,
            annotations: rs.metadata.annotations.clone().unwrap_or_default(),
            min_ready_seconds: rs.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0),
        });
        if size_changed {
            let verb = if operation == "up" { "up" } else { "down" };
            self.event(
                "ScalingReplicaSet",
                format!("Scaled {verb} replica set {name} from {old} to {size}"),
            );
        }
        size_changed
    }

    /// `cleanupDeployment`: delete the oldest empty sets beyond `revisionHistoryLimit`.
    fn cleanup(&mut self, old: &[usize]) {
        let Some(limit) = spec(&self.d).revision_history_limit.filter(|l| *l != i32::MAX) else {
            return;
        };
        let mut alive: Vec<usize> = old
            .iter()
            .copied()
            .filter(|i| self.rss[*i].metadata.deletion_timestamp.is_none())
            .collect();
        let diff = alive.len() as i32 - limit;
        if diff <= 0 {
            return;
        }
        alive.sort_by(|a, b| by_revision(&self.rss[*a], &self.rss[*b]));
        for i in alive.into_iter().take(usize::try_from(diff).unwrap_or(0)) {
            let rs = &self.rss[i];
            let observed = rs
                .status
                .as_ref()
                .and_then(|s| s.observed_generation)
                .unwrap_or(0);
            if rs_status(rs).0 != 0
                || rs_replicas(rs) != 0
                || rs.metadata.generation.unwrap_or(0) > observed
                || rs.metadata.uid.is_none()
            {
                continue;
            }
            self.steps.push(Step::Delete {
                name: rs.metadata.name.clone().unwrap_or_default(),
                uid: rs.metadata.uid.clone().unwrap_or_default(),
            });
        }
    }

    /// `calculateStatus`: counts over the sets (as they are after this sync's scaling) and the
    /// Available condition.
    fn calculate_status(&self, new: Option<usize>, old: &[usize]) -> DeploymentStatus {
        let all: Vec<&ReplicaSet> = new.iter().chain(old).map(|i| &self.rss[*i]).collect();
        let available: i32 = all.iter().map(|rs| rs_status(rs).2).sum();
        let total: i32 = all.iter().map(|rs| rs_replicas(rs)).sum();
        let current = self.d.status.clone().unwrap_or_default();
        let mut status = DeploymentStatus {
            observed_generation: self.d.metadata.generation,
            replicas: Some(all.iter().map(|rs| rs_status(rs).0).sum()),
            updated_replicas: Some(new.map(|i| rs_status(&self.rss[i]).0).unwrap_or(0)),
            ready_replicas: Some(all.iter().map(|rs| rs_status(rs).1).sum()),
            available_replicas: Some(available),
            unavailable_replicas: Some((total - available).max(0)),
            collision_count: current.collision_count,
            conditions: current.conditions.clone(),
        };
        let c = if available >= replicas_of(&self.d) - max_unavailable(&self.d) {
            new_condition(
                "Available",
                "True",
                MIN_AVAILABLE,
                "Deployment has minimum availability.".into(),
                self.now,
            )
        } else {
            new_condition(
                "Available",
                "False",
                MIN_UNAVAILABLE,
                "Deployment does not have minimum availability.".into(),
                self.now,
            )
        };
        set_condition(&mut status, c);
        status
    }

    /// `syncDeploymentStatus`.
    fn sync_status(&mut self, new: Option<usize>, old: &[usize]) {
        let status = self.calculate_status(new, old);
        self.d.status = Some(status);
        self.status_synced = true;
    }

    /// `DeploymentComplete` against `status`.
    fn complete(&self, status: &DeploymentStatus) -> bool {
        let replicas = replicas_of(&self.d);
        status.updated_replicas.unwrap_or(0) == replicas
            && status.replicas.unwrap_or(0) == replicas
            && status.available_replicas.unwrap_or(0) == replicas
            && status.observed_generation.unwrap_or(0) >= self.d.metadata.generation.unwrap_or(0)
    }

    /// `syncRolloutStatus`: the status with the Progressing condition (progress, completion or
    /// the deadline) and the ReplicaSets' failures.
    fn sync_rollout_status(&mut self, new: Option<usize>, old: &[usize]) {
        let mut status = self.calculate_status(new, old);
        let deadline = has_progress_deadline(&self.d);
        if !deadline {
            remove_condition(&mut status, "Progressing");
        }
        let current = self.d.status.clone().unwrap_or_default();
        let cur = condition(&current, "Progressing").cloned();
        let complete_before = status.replicas == status.updated_replicas
            && cur.as_ref().and_then(|c| c.reason.as_deref()) == Some(NEW_RS_AVAILABLE);
        let name = self.d.metadata.name.clone().unwrap_or_default();
        let new_name = new.and_then(|i| self.rss[i].metadata.name.clone());
        let subject = |what: &str| match &new_name {
            Some(n) => format!("ReplicaSet {n:?} {what}"),
            None => format!("Deployment {name:?} {what}"),
        };
        if deadline && !complete_before {
            if self.complete(&status) {
                let c = new_condition(
                    "Progressing",
                    "True",
                    NEW_RS_AVAILABLE,
                    subject("has successfully progressed."),
                    self.now,
                );
                set_condition(&mut status, c);
            } else if progressing(&current, &status) {
                let mut c = new_condition(
                    "Progressing",
                    "True",
                    RS_UPDATED,
                    subject("is progressing."),
                    self.now,
                );
                if let Some(cur) = &cur {
                    if cur.status == "True" {
                        c.last_transition_time = cur.last_transition_time.clone();
                    }
                    remove_condition(&mut status, "Progressing");
                }
                set_condition(&mut status, c);
            } else if self.timed_out(&status) {
                let c = new_condition(
                    "Progressing",
                    "False",
                    TIMED_OUT,
                    subject("has timed out progressing."),
                    self.now,
                );
                set_condition(&mut status, c);
            }
        }
        match self.replica_failure(new, old) {
            Some(c) => set_condition(&mut status, c),
            None => remove_condition(&mut status, "ReplicaFailure"),
        }
        if same_status(&current, &status) {
            self.requeue_after = self.stuck_requeue(&status);
        }
        self.d.status = Some(status);
        self.status_synced = true;
    }

    /// `DeploymentTimedOut`: no progress since the Progressing condition's last update for
    /// longer than the deadline.
    fn timed_out(&self, status: &DeploymentStatus) -> bool {
        let Some(c) = condition(status, "Progressing") else {
            return false;
        };
        match c.reason.as_deref() {
            Some(NEW_RS_AVAILABLE) => false,
            Some(TIMED_OUT) => true,
            _ => {
                let deadline = i64::from(spec(&self.d).progress_deadline_seconds.unwrap_or(0));
                c.last_update_time
                    .as_ref()
                    .is_some_and(|t| t.0 + chrono::Duration::seconds(deadline) < self.now)
            }
        }
    }

    /// `requeueStuckDeployment`: when to look again for the deadline.
    fn stuck_requeue(&self, status: &DeploymentStatus) -> Option<Duration> {
        let current = self.d.status.clone().unwrap_or_default();
        let c = condition(&current, "Progressing")?;
        if !has_progress_deadline(&self.d) || self.complete(status) || c.reason.as_deref() == Some(TIMED_OUT)
        {
            return None;
        }
        let deadline = i64::from(spec(&self.d).progress_deadline_seconds.unwrap_or(0));
        let at = c.last_update_time.as_ref()?.0 + chrono::Duration::seconds(deadline);
        let after = (at - self.now).to_std().unwrap_or(Duration::ZERO);
        Some(if after < Duration::from_secs(1) {
            Duration::from_secs(1)
        } else {
            after + Duration::from_secs(1)
        })
    }

    /// `getReplicaFailures`: the new set's ReplicaFailure, else an old set's.
    fn replica_failure(&self, new: Option<usize>, old: &[usize]) -> Option<DeploymentCondition> {
        let failure = |i: &usize| {
            self.rss[*i]
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "ReplicaFailure"))
                .map(|c| DeploymentCondition {
                    type_: "ReplicaFailure".into(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_update_time: c.last_transition_time.clone(),
                    last_transition_time: c.last_transition_time.clone(),
                })
        };
        new.iter()
            .find_map(failure)
            .or_else(|| old.iter().find_map(failure))
    }

    /// `rolloutRolling`: one step per sync: scale the new set up, else the old ones down, else
    /// clean up once complete; then the rollout status.
    fn rollout_rolling(&mut self) {
        let (new, old) = self.all_replica_sets(true);
        let Some(n) = new else {
            self.sync_rollout_status(None, &old);
            return;
        };
        if self.reconcile_new(n, &old) {
            self.sync_rollout_status(new, &old);
            return;
        }
        if self.reconcile_old(n, &old) {
            self.sync_rollout_status(new, &old);
            return;
        }
        let current = self.d.status.clone().unwrap_or_default();
        if self.complete(&current) {
            self.cleanup(&old);
        }
        self.sync_rollout_status(new, &old);
    }

    /// `reconcileNewReplicaSet`.
    fn reconcile_new(&mut self, n: usize, old: &[usize]) -> bool {
        let replicas = replicas_of(&self.d);
        let cur = rs_replicas(&self.rss[n]);
        if cur == replicas {
            return false;
        }
        if cur > replicas {
            return self.scale_and_record(n, replicas);
        }
        let all: Vec<&ReplicaSet> = old.iter().chain([&n]).map(|i| &self.rss[*i]).collect();
        let target = new_rs_new_replicas(&self.d, &all, &self.rss[n]);
        self.scale_and_record(n, target)
    }

    /// `reconcileOldReplicaSets`: scale old sets down within maxUnavailable, unhealthy
    /// replicas first.
    fn reconcile_old(&mut self, n: usize, old: &[usize]) -> bool {
        let mut active_old: Vec<usize> = old
            .iter()
            .copied()
            .filter(|i| rs_replicas(&self.rss[*i]) > 0)
            .collect();
        if active_old.is_empty() {
            return false;
        }
        let all_pods: i32 = active_old
            .iter()
            .chain([&n])
            .map(|i| rs_replicas(&self.rss[*i]))
            .sum();
        let min_available = replicas_of(&self.d) - max_unavailable(&self.d);
        let new_unavailable = rs_replicas(&self.rss[n]) - rs_status(&self.rss[n]).2;
        let max_scaled_down = all_pods - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return false;
        }
        // Unhealthy replicas first: they do not lower availability.
        active_old.sort_by(|a, b| by_creation(&self.rss[*a], &self.rss[*b]));
        let mut cleaned = 0;
        for i in active_old.clone() {
            if cleaned >= max_scaled_down {
                break;
            }
            let rs = &self.rss[i];
            let (replicas, available) = (rs_replicas(rs), rs_status(rs).2);
            if replicas == 0 || replicas == available {
                continue;
            }
            // More available than wanted: the set was scaled down and its pods are not gone
            // yet. Upstream's cleanupUnhealthyReplicas refuses that "scale down" (it would grow
            // the set) with an error, which ends the sync; the set's next status brings the next
            // one.
            if available > replicas {
                return cleaned > 0;
            }
            let down = (max_scaled_down - cleaned).min(replicas - available);
            self.scale_and_record(i, replicas - down);
            cleaned += down;
        }
        // Then healthy ones, keeping minAvailable.
        let available: i32 = active_old
            .iter()
            .chain([&n])
            .map(|i| rs_status(&self.rss[*i]).2)
            .sum();
        let mut scaled = 0;
        if available > min_available {
            let total = available - min_available;
            for i in active_old {
                if scaled >= total {
                    break;
                }
                let replicas = rs_replicas(&self.rss[i]);
                if replicas == 0 {
                    continue;
                }
                let down = replicas.min(total - scaled);
                self.scale_and_record(i, replicas - down);
                scaled += down;
            }
        }
        cleaned + scaled > 0
    }

    /// `rolloutRecreate`: old sets to zero, wait until no old pod runs, then the new set at
    /// full size.
    fn rollout_recreate(&mut self, pods: &[Arc<Pod>]) {
        let (mut new, mut old) = self.all_replica_sets(false);
        let mut scaled = false;
        for i in old.clone() {
            if rs_replicas(&self.rss[i]) > 0 && self.scale_and_record(i, 0) {
                scaled = true;
            }
        }
        if scaled {
            self.sync_rollout_status(new, &old);
            return;
        }
        if self.old_pods_running(new, &old, pods) {
            self.sync_rollout_status(new, &old);
            return;
        }
        if new.is_none() {
            (new, old) = self.all_replica_sets(true);
        }
        if let Some(n) = new {
            let replicas = replicas_of(&self.d);
            self.scale_and_record(n, replicas);
        }
        let current = self.d.status.clone().unwrap_or_default();
        if self.complete(&current) {
            self.cleanup(&old);
        }
        self.sync_rollout_status(new, &old);
    }

    /// `oldPodsRunning`: an old set reports pods, or a pod of an old set is not finished.
    fn old_pods_running(&self, new: Option<usize>, old: &[usize], pods: &[Arc<Pod>]) -> bool {
        if old.iter().map(|i| rs_status(&self.rss[*i]).0).sum::<i32>() > 0 {
            return true;
        }
        let new_uid = new.and_then(|i| self.rss[i].metadata.uid.clone());
        let old_uids: Vec<String> = old
            .iter()
            .filter_map(|i| self.rss[*i].metadata.uid.clone())
            .collect();
        pods.iter().any(|p| {
            let owner = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true));
            let Some(owner) = owner else {
                return false;
            };
            if Some(&owner.uid) == new_uid.as_ref() || !old_uids.contains(&owner.uid) {
                return false;
            }
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
    }
}

fn annotation_of<'a>(d: &'a Deployment, key: &str) -> Option<&'a str> {
    d.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `DeploymentProgressing`: more updated, ready or available replicas, or fewer old ones.
fn progressing(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    let old_old = n(old.replicas) - n(old.updated_replicas);
    let new_old = n(new.replicas) - n(new.updated_replicas);
    n(new.updated_replicas) > n(old.updated_replicas)
        || new_old < old_old
        || n(new.ready_replicas) > n(old.ready_replicas)
        || n(new.available_replicas) > n(old.available_replicas)
}

/// `NewRSNewReplicas`: the new set's size this step: up to `replicas + maxSurge` pods in all,
/// never above `replicas` (Recreate: `replicas` at once).
pub fn new_rs_new_replicas(d: &Deployment, all: &[&ReplicaSet], new: &ReplicaSet) -> i32 {
    let replicas = replicas_of(d);
    let cur = rs_replicas(new);
    if is_recreate(d) {
        return replicas;
    }
    let (surge, _) = rolling_params(d);
    let max_total = replicas + scaled_value(&surge, replicas, true);
    let current: i32 = all.iter().map(|rs| rs_replicas(rs)).sum();
    if current >= max_total {
        return cur;
    }
    cur + (max_total - current).min(replicas - cur)
}

fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    annotation(rs, DESIRED_REPLICAS) != Some(desired.to_string().as_str())
        || annotation(rs, MAX_REPLICAS) != Some(max.to_string().as_str())
}

fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let a = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if a.get(k) != Some(&v) {
            a.insert(k.into(), v);
            changed = true;
        }
    }
    changed
}

/// Annotations never copied from the Deployment to its sets (upstream's `annotationsToSkip`).
pub fn skip_annotation(key: &str) -> bool {
    matches!(
        key,
        LAST_APPLIED | REVISION | REVISION_HISTORY | DESIRED_REPLICAS | MAX_REPLICAS | ROLLBACK_TO
    )
}

/// `SetNewReplicaSetAnnotations`: the Deployment's annotations, the revision (raised to
/// `new_revision` when lower, the old number kept in revision-history), and for a set about to
/// be created the replicas annotations. Returns whether anything changed.
pub fn set_new_rs_annotations(d: &Deployment, rs: &mut ReplicaSet, new_revision: &str, exists: bool) -> bool {
    let mut changed = false;
    let a = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if skip_annotation(k) || a.get(k) == Some(v) {
            continue;
        }
        a.insert(k.clone(), v.clone());
        changed = true;
    }
    let old_revision = a.get(REVISION).cloned();
    let old_int: i64 = match old_revision.as_deref() {
        None | Some("") => 0,
        Some(s) => match s.parse() {
            Ok(v) => v,
            Err(_) => return false,
        },
    };
    let Ok(new_int) = new_revision.parse::<i64>() else {
        return false;
    };
    if old_int < new_int {
        a.insert(REVISION.into(), new_revision.into());
        changed = true;
        if let Some(old) = old_revision.filter(|o| !o.is_empty()) {
            let history = a.get(REVISION_HISTORY).cloned().unwrap_or_default();
            if history.is_empty() {
                a.insert(REVISION_HISTORY.into(), old);
            } else {
                let mut parts: Vec<&str> = history.split(',').collect();
                let mut total = history.len() + old.len() + 1;
                let mut start = 0;
                while total > MAX_REVISION_HISTORY_CHARS && start < parts.len() {
                    total -= parts[start].len() + 1;
                    start += 1;
                }
                if total <= MAX_REVISION_HISTORY_CHARS {
                    parts = parts.split_off(start);
                    parts.push(&old);
                    let joined = parts.join(",");
                    a.insert(REVISION_HISTORY.into(), joined);
                }
            }
        }
    }
    if !exists {
        let replicas = replicas_of(d);
        if set_replicas_annotations(rs, replicas, replicas + max_surge(d)) {
            changed = true;
        }
    }
    changed
}
