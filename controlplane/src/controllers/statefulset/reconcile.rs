//! The StatefulSet decision (docs/SEEDS-SPEC.md CTL-24..CTL-26, upstream's
//! `stateful_set_control.go`), a pure function of the cached objects: which revision the set is
//! at, which pods and claims to create, patch or delete in what order, and the status.
//!
//! Pods are `<set>-<ordinal>`. With `OrderedReady` one step at a time: create the lowest missing
//! ordinal and wait for it to be Running, Ready and available; scale down from the highest; a
//! rolling update deletes the highest pod not at the update revision (down to `partition`, at
//! most `maxUnavailable` at once) and the next sync creates it again, under the same name, once
//! the old pod is gone. `Parallel` does every creation and deletion at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kcore::labels::{labels_of, selector_matches};
use serde_json::Value;

use crate::controllers::history;
use crate::controllers::podutil::{
    controller_owner, is_available, is_ready, pod_from_template, scaled_value,
};

/// The pod label with the pod's name.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The pod label with the pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The pod label with the name of the revision the pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// `(parent, ordinal)` of a pod name `<parent>-<ordinal>`.
pub fn parent_and_ordinal(name: &str) -> Option<(&str, i32)> {
    let (parent, ord) = name.rsplit_once('-')?;
    if ord.is_empty() || !ord.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parent, ord.parse().ok()?))
}

/// The ordinal of a pod of `set`.
pub fn ordinal_of(set: &StatefulSet, pod: &Pod) -> Option<i32> {
    let (parent, ord) = parent_and_ordinal(pod.metadata.name.as_deref()?)?;
    (Some(parent) == set.metadata.name.as_deref()).then_some(ord)
}

fn set_name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or_default()
}

/// `<set>-<ordinal>`.
pub fn pod_name(set: &StatefulSet, ordinal: i32) -> String {
    format!("{}-{ordinal}", set_name(set))
}

/// `<template>-<set>-<ordinal>` (`data-web-0`).
pub fn claim_name(template: &str, set: &StatefulSet, ordinal: i32) -> String {
    format!("{template}-{}-{ordinal}", set_name(set))
}

fn spec(set: &StatefulSet) -> k8s_openapi::api::apps::v1::StatefulSetSpec {
    set.spec.clone().unwrap_or_default()
}

fn replicas(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0)
}

fn start_ordinal(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0)
}

fn in_range(set: &StatefulSet, ordinal: i32) -> bool {
    let start = start_ordinal(set);
    ordinal >= start && ordinal < start + replicas(set)
}

fn is_parallel(set: &StatefulSet) -> bool {
    set.spec.as_ref().and_then(|s| s.pod_management_policy.as_deref()) == Some("Parallel")
}

fn is_on_delete(set: &StatefulSet) -> bool {
    set.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        == Some("OnDelete")
}

fn partition(set: &StatefulSet) -> Option<i32> {
    set.spec
        .as_ref()?
        .update_strategy
        .as_ref()?
        .rolling_update
        .as_ref()?
        .partition
}

fn max_unavailable(set: &StatefulSet) -> i32 {
    let v = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.clone())
        .unwrap_or(IntOrString::Int(1));
    scaled_value(&v, replicas(set), false).max(1)
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn is_terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

fn running_and_ready(p: &Pod) -> bool {
    phase(p) == "Running" && is_ready(p)
}

fn healthy(p: &Pod) -> bool {
    running_and_ready(p) && !is_terminating(p)
}

fn unavailable(p: Option<&Pod>, min_ready: i32, now: DateTime<Utc>) -> bool {
    p.is_none_or(|p| !healthy(p) || !is_available(p, min_ready, now))
}

/// The revision a pod was made from.
pub fn pod_revision(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .map(String::as_str)
        .unwrap_or_default()
}

/// What to do to have the set's current template in the history.
#[derive(Debug)]
pub enum RevisionStep {
    /// The latest revision already holds it.
    Reuse(Arc<ControllerRevision>),
    /// An older revision holds it (a rollback): give it the next number.
    Renumber(Arc<ControllerRevision>, i64),
    /// New.
    Create(Box<ControllerRevision>),
}

/// The patch a revision of `set` holds.
pub fn revision_data(set: &StatefulSet) -> Value {
    history::template_patch(&spec(set).template)
}

/// A new revision of `set` with number `revision`, named for `collision_count`.
pub fn new_revision(set: &StatefulSet, revision: i64, collision_count: i32) -> ControllerRevision {
    let data = revision_data(set);
    let hash = history::hash_data(&data, Some(collision_count));
    history::new_revision(
        &set.metadata,
        "StatefulSet",
        &spec(set).template,
        data,
        revision,
        &hash,
    )
}

/// The update revision of `set` given its history sorted by number (upstream's
/// `getStatefulSetRevisions`).
pub fn update_revision(set: &StatefulSet, sorted: &[Arc<ControllerRevision>]) -> RevisionStep {
    let data = revision_data(set);
    let next = history::next_number(sorted);
    let equal: Vec<&Arc<ControllerRevision>> =
        sorted.iter().filter(|r| history::same_data(r, &data)).collect();
    match (equal.last(), sorted.last()) {
        (Some(e), Some(last)) if e.metadata.name == last.metadata.name => RevisionStep::Reuse((*e).clone()),
        (Some(e), _) => RevisionStep::Renumber((*e).clone(), next),
        (None, _) => {
            let cc = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
            RevisionStep::Create(Box::new(new_revision(set, next, cc)))
        }
    }
}

/// The current revision: the one the status names, else the update revision.
pub fn current_revision(
    set: &StatefulSet,
    sorted: &[Arc<ControllerRevision>],
    update: &Arc<ControllerRevision>,
) -> Arc<ControllerRevision> {
    let name = set.status.as_ref().and_then(|s| s.current_revision.as_deref());
    sorted
        .iter()
        .find(|r| name.is_some() && r.metadata.name.as_deref() == name)
        .cloned()
        .unwrap_or_else(|| update.clone())
}

/// Revisions to delete: the oldest beyond `revisionHistoryLimit` among those no pod uses and
/// that are neither current nor update.
pub fn surplus_revisions(
    set: &StatefulSet,
    sorted: &[Arc<ControllerRevision>],
    pods: &[Arc<Pod>],
    current: &str,
    update: &str,
) -> Vec<Arc<ControllerRevision>> {
    let limit = set
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10);
    let live = |name: &str| name == current || name == update || pods.iter().any(|p| pod_revision(p) == name);
    history::surplus(sorted, &live, limit)
        .into_iter()
        .cloned()
        .collect()
}

/// Pods and revisions a set takes or lets go of (upstream's `ClaimPods` with `isMemberOf`).
#[derive(Debug, Default)]
pub struct Claims {
    /// Pods of the set after the claim.
    pub pods: Vec<Arc<Pod>>,
    pub adopt: Vec<Arc<Pod>>,
    pub release: Vec<Arc<Pod>>,
}

/// Sorts `candidates` (the set's owned pods and its namespace's orphans) into the set's pods,
/// orphans to adopt and owned pods to release.
pub fn claim_pods(set: &StatefulSet, candidates: &[Arc<Pod>]) -> Claims {
    let uid = set.metadata.uid.as_deref().unwrap_or_default();
    let deleting = set.metadata.deletion_timestamp.is_some();
    let selector = &spec(set).selector;
    let mut c = Claims::default();
    for p in candidates {
        let controller = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        let fits = selector_matches(selector, labels_of(&p.metadata.labels)) && ordinal_of(set, p).is_some();
        match controller {
            Some(o) if o.uid == uid => {
                if fits {
                    c.pods.push(p.clone());
                } else if !deleting {
                    c.release.push(p.clone());
                }
            }
            Some(_) => {}
            None => {
                if fits && !deleting && !is_terminating(p) {
                    c.adopt.push(p.clone());
                    c.pods.push(p.clone());
                }
            }
        }
    }
    c
}

/// One action of a sync, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Create a missing claim of the pod `pod`.
    CreateClaim {
        claim: Box<PersistentVolumeClaim>,
        pod: String,
    },
    CreatePod(Box<Pod>),
    DeletePod {
        name: String,
        uid: String,
    },
    /// Put back the pod's identity labels.
    PatchPodLabels {
        name: String,
        uid: String,
        labels: BTreeMap<String, String>,
    },
    /// Set a claim's owner references (the retention policy).
    SetClaimOwners {
        claim: String,
        owners: Vec<OwnerReference>,
    },
}

/// What one sync does.
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Steps may run at once (`Parallel`); otherwise one after another, stopping at an error.
    pub parallel: bool,
    pub status: StatefulSetStatus,
    /// Some pod is ready but not yet available: look again after `minReadySeconds`.
    pub wait_min_ready: bool,
}

/// The claims a pod of `set` at `ordinal` uses, named for it, labelled with the selector's
/// `matchLabels` (upstream's `getPersistentVolumeClaims`).
pub fn claims_for(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let s = spec(set);
    let match_labels = s.selector.match_labels.clone().unwrap_or_default();
    s.volume_claim_templates
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let template = t.metadata.name.clone().unwrap_or_default();
            let mut labels = t.metadata.labels.clone().unwrap_or_default();
            labels.extend(match_labels.clone());
            PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(claim_name(&template, set, ordinal)),
                    namespace: set.metadata.namespace.clone(),
                    labels: Some(labels),
                    annotations: t.metadata.annotations.clone(),
                    ..ObjectMeta::default()
                },
                spec: t.spec.clone(),
                status: None,
            }
        })
        .collect()
}

fn policy(set: &StatefulSet) -> (bool, bool) {
    let p = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.clone())
        .unwrap_or_default();
    (
        p.when_deleted.as_deref() == Some("Delete"),
        p.when_scaled.as_deref() == Some("Delete"),
    )
}

fn pod_owner(pod: &Pod) -> OwnerReference {
    controller_owner("v1", "Pod", &pod.metadata)
}

/// The owner references a claim should have under the retention policy (upstream's
/// `updateClaimOwnerRefForSetAndPod`): the set owns it when `whenDeleted: Delete` (while its pod
/// is in range, if `whenScaled: Delete` too), the pod owns it when `whenScaled: Delete` and the
/// pod is scaled away. Other owners are kept; a claim controlled by someone else is left alone.
pub fn claim_owners(
    set: &StatefulSet,
    claim: &PersistentVolumeClaim,
    pod: Option<&Pod>,
    pod_in_range: bool,
) -> Vec<OwnerReference> {
    let set_uid = set.metadata.uid.as_deref().unwrap_or_default();
    let pod_uid = pod.and_then(|p| p.metadata.uid.as_deref()).unwrap_or_default();
    let pod_name = pod.and_then(|p| p.metadata.name.as_deref()).unwrap_or_default();
    let ours = |o: &OwnerReference| {
        (o.kind == "StatefulSet" && (o.uid == set_uid || o.name == set_name(set)))
            || (o.kind == "Pod" && (o.uid == pod_uid || o.name == pod_name))
    };
    let existing = claim.metadata.owner_references.clone().unwrap_or_default();
    let foreign_controller = existing.iter().any(|o| o.controller == Some(true) && !ours(o));
    let mut refs: Vec<OwnerReference> = existing.into_iter().filter(|o| !ours(o)).collect();
    if foreign_controller {
        return refs;
    }
    let (when_deleted, when_scaled) = policy(set);
    let scaled_down = !pod_in_range;
    if when_scaled && scaled_down {
        if let Some(p) = pod {
            refs.push(pod_owner(p));
        }
    } else if when_deleted {
        refs.push(controller_owner("apps/v1", "StatefulSet", &set.metadata));
    }
    refs
}

fn same_owners(a: &[OwnerReference], b: &[OwnerReference]) -> bool {
    let key = |o: &OwnerReference| (o.kind.clone(), o.uid.clone());
    let mut x: Vec<_> = a.iter().map(key).collect();
    let mut y: Vec<_> = b.iter().map(key).collect();
    x.sort();
    y.sort();
    x == y
}

/// A pod for `ordinal` from `template` (the template of revision `revision`): the identity
/// (name, hostname, subdomain, labels) and the claim volumes.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let owner = controller_owner("apps/v1", "StatefulSet", &set.metadata);
    let name = pod_name(set, ordinal);
    let mut pod = pod_from_template(template, &ns, &format!("{}-", set_name(set)), owner);
    pod.metadata.name = Some(name.clone());
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_LABEL.into(), revision.into());
    let ps = pod.spec.get_or_insert_with(Default::default);
    ps.hostname = Some(name);
    ps.subdomain = spec(set).service_name.filter(|s| !s.is_empty());
    let templates: Vec<String> = spec(set)
        .volume_claim_templates
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t.metadata.name.clone())
        .collect();
    let mut volumes: Vec<Volume> = templates
        .iter()
        .map(|t| Volume {
            name: t.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(t, set, ordinal),
                read_only: None,
            }),
            ..Volume::default()
        })
        .collect();
    volumes.extend(
        ps.volumes
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !templates.contains(&v.name)),
    );
    ps.volumes = (!volumes.is_empty()).then_some(volumes);
    pod
}

fn identity_labels(set: &StatefulSet, pod: &Pod, ordinal: i32) -> Option<BTreeMap<String, String>> {
    let name = pod_name(set, ordinal);
    let l = labels_of(&pod.metadata.labels);
    let want = [(POD_NAME_LABEL, name), (POD_INDEX_LABEL, ordinal.to_string())];
    if want.iter().all(|(k, v)| l.get(*k) == Some(v)) {
        return None;
    }
    Some(want.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Counts of the status from the set's pods (upstream's `computeReplicaStatus`).
pub fn status(
    set: &StatefulSet,
    pods: &[Arc<Pod>],
    current: &str,
    update: &str,
    collision_count: i32,
    now: DateTime<Utc>,
) -> StatefulSetStatus {
    let min_ready = spec(set).min_ready_seconds.unwrap_or(0);
    let mut st = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        current_revision: Some(current.into()),
        update_revision: Some(update.into()),
        collision_count: Some(collision_count),
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
        ..StatefulSetStatus::default()
    };
    let (mut ready, mut available, mut cur, mut upd) = (0, 0, 0, 0);
    for p in pods.iter().filter(|p| ordinal_of(set, p).is_some()) {
        // Every cached pod was created (the API server sets a phase).
        st.replicas += 1;
        if running_and_ready(p) {
            ready += 1;
            if is_available(p, min_ready, now) {
                available += 1;
            }
        }
        if !is_terminating(p) {
            if pod_revision(p) == current {
                cur += 1;
            }
            if pod_revision(p) == update {
                upd += 1;
            }
        }
    }
    st.ready_replicas = Some(ready);
    st.available_replicas = Some(available);
    st.current_replicas = Some(cur);
    st.updated_replicas = Some(upd);
    st
}

/// A finished rolling update makes the update revision current (upstream's
/// `completeRollingUpdate`).
pub fn complete_rolling_update(set: &StatefulSet, st: &mut StatefulSetStatus) {
    let want = replicas(set);
    if !is_on_delete(set)
        && st.updated_replicas == Some(want)
        && st.ready_replicas == Some(want)
        && st.replicas == want
    {
        st.current_replicas = st.updated_replicas;
        st.current_revision = st.update_revision.clone();
    }
}

/// The sync of `set` given its pods (after `claim_pods`), its current and update revisions, a
/// look-up of cached claims by name, and the time.
pub fn plan(
    set: &StatefulSet,
    pods: &[Arc<Pod>],
    current: &ControllerRevision,
    update: &ControllerRevision,
    claims: &dyn Fn(&str) -> Option<Arc<PersistentVolumeClaim>>,
    now: DateTime<Utc>,
) -> Plan {
    let current_name = current.metadata.name.clone().unwrap_or_default();
    let update_name = update.metadata.name.clone().unwrap_or_default();
    let collision_count = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
    let mut plan = Plan {
        parallel: is_parallel(set),
        status: status(set, pods, &current_name, &update_name, collision_count, now),
        ..Plan::default()
    };
    if set.metadata.deletion_timestamp.is_some() {
        complete_rolling_update(set, &mut plan.status);
        return plan;
    }
    let min_ready = spec(set).min_ready_seconds.unwrap_or(0);
    let monotonic = !plan.parallel;
    let start = start_ordinal(set);
    let count = replicas(set);
    let current_template = history::template_of(current).unwrap_or_else(|| spec(set).template);
    let update_template = history::template_of(update).unwrap_or_else(|| spec(set).template);
    let mut slots: Vec<Option<Arc<Pod>>> = vec![None; usize::try_from(count).unwrap_or(0)];
    let mut condemned: Vec<(i32, Arc<Pod>)> = Vec::new();
    for p in pods {
        let Some(ord) = ordinal_of(set, p) else { continue };
        if in_range(set, ord) {
            if let Some(slot) = usize::try_from(ord - start).ok().and_then(|i| slots.get_mut(i)) {
                *slot = Some(p.clone());
            }
        } else {
            condemned.push((ord, p.clone()));
        }
    }
    condemned.sort_by_key(|c| std::cmp::Reverse(c.0));
    let first_unhealthy: Option<String> = slots
        .iter()
        .enumerate()
        .find(|(_, p)| unavailable(p.as_deref(), min_ready, now))
        .map(|(i, _)| pod_name(set, start + i32::try_from(i).unwrap_or(0)))
        .or_else(|| {
            condemned
                .iter()
                .rev()
                .find(|(_, p)| unavailable(Some(p), min_ready, now))
                .map(|(o, _)| pod_name(set, *o))
        });
    let part = partition(set);
    let mut steps = Vec::new();
    let fix_claims = |steps: &mut Vec<Step>, pod: &Pod, ord: i32, in_range: bool| {
        for c in claims_for(set, ord) {
            let name = c.metadata.name.clone().unwrap_or_default();
            if let Some(cached) = claims(&name) {
                let want = claim_owners(set, &cached, Some(pod), in_range);
                if !same_owners(
                    &want,
                    cached.metadata.owner_references.as_deref().unwrap_or_default(),
                ) {
                    steps.push(Step::SetClaimOwners {
                        claim: name,
                        owners: want,
                    });
                }
            }
        }
    };
    let missing_claims = |steps: &mut Vec<Step>, ord: i32| {
        for mut c in claims_for(set, ord) {
            let name = c.metadata.name.clone().unwrap_or_default();
            if claims(&name).is_none() {
                let owners = claim_owners(set, &c, None, true);
                c.metadata.owner_references = (!owners.is_empty()).then_some(owners);
                steps.push(Step::CreateClaim {
                    claim: Box::new(c),
                    pod: pod_name(set, ord),
                });
            }
        }
    };
    // The replicas, lowest ordinal first.
    for (i, slot) in slots.iter().enumerate() {
        let ord = start + i32::try_from(i).unwrap_or(0);
        let Some(p) = slot else {
            missing_claims(&mut steps, ord);
            let (template, revision) = match (is_on_delete(set), part) {
                (false, Some(part)) if ord < start + part => (&current_template, &current_name),
                _ => (&update_template, &update_name),
            };
            steps.push(Step::CreatePod(Box::new(new_pod(set, template, revision, ord))));
            if monotonic {
                return finish(set, plan, steps);
            }
            continue;
        };
        if matches!(phase(p), "Failed" | "Succeeded") {
            if !is_terminating(p) {
                steps.push(Step::DeletePod {
                    name: pod_name(set, ord),
                    uid: p.metadata.uid.clone().unwrap_or_default(),
                });
            }
            if monotonic {
                return finish(set, plan, steps);
            }
            continue;
        }
        if phase(p) == "Pending" {
            missing_claims(&mut steps, ord);
        }
        if monotonic && (is_terminating(p) || !running_and_ready(p)) {
            return finish(set, plan, steps);
        }
        if monotonic && !is_available(p, min_ready, now) {
            plan.wait_min_ready = true;
            return finish(set, plan, steps);
        }
        if let Some(labels) = identity_labels(set, p, ord) {
            steps.push(Step::PatchPodLabels {
                name: pod_name(set, ord),
                uid: p.metadata.uid.clone().unwrap_or_default(),
                labels,
            });
        }
        fix_claims(&mut steps, p, ord, true);
    }
    // Claims of pods being scaled away go to the pods first (whenScaled: Delete).
    for (ord, p) in &condemned {
        fix_claims(&mut steps, p, *ord, false);
    }
    // Scale down from the highest ordinal.
    for (ord, p) in &condemned {
        if is_terminating(p) {
            if monotonic {
                return finish(set, plan, steps);
            }
            continue;
        }
        let first = first_unhealthy.as_deref() == Some(pod_name(set, *ord).as_str());
        if monotonic && !first && (!running_and_ready(p) || !is_available(p, min_ready, now)) {
            return finish(set, plan, steps);
        }
        steps.push(Step::DeletePod {
            name: pod_name(set, *ord),
            uid: p.metadata.uid.clone().unwrap_or_default(),
        });
        if monotonic {
            return finish(set, plan, steps);
        }
    }
    if is_on_delete(set) {
        return finish(set, plan, steps);
    }
    // Rolling update: from the highest ordinal down to the partition, at most maxUnavailable
    // pods unavailable at once.
    let max_unavailable = max_unavailable(set);
    let down = slots
        .iter()
        .filter(|p| unavailable(p.as_deref(), min_ready, now))
        .count();
    let down = i32::try_from(down).unwrap_or(i32::MAX);
    if down < max_unavailable {
        let mut budget = max_unavailable - down;
        let floor = start + part.unwrap_or(0);
        for (i, slot) in slots.iter().enumerate().rev() {
            let ord = start + i32::try_from(i).unwrap_or(0);
            if ord < floor || budget == 0 {
                break;
            }
            if let Some(p) = slot
                && pod_revision(p) != update_name
                && !is_terminating(p)
            {
                steps.push(Step::DeletePod {
                    name: pod_name(set, ord),
                    uid: p.metadata.uid.clone().unwrap_or_default(),
                });
                budget -= 1;
                if let Some(c) = plan.status.current_replicas.as_mut() {
                    *c -= 1;
                }
            }
        }
    }
    finish(set, plan, steps)
}

fn finish(set: &StatefulSet, mut plan: Plan, steps: Vec<Step>) -> Plan {
    plan.steps = steps;
    complete_rolling_update(set, &mut plan.status);
    plan
}
