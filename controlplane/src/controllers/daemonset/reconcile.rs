//! The DaemonSet decision (docs/SEEDS-SPEC.md CTL-28, upstream's `daemon_controller.go` and
//! `update.go`), a pure function of the cached objects: on which nodes a daemon pod is missing,
//! which pods to delete (failed, surplus, on nodes that no longer fit, old ones during a rolling
//! update), the history and the status.
//!
//! A node is eligible when the template's node selector and required node affinity select it
//! and it has no NoSchedule/NoExecute taint the pod does not tolerate; the pod's tolerations
//! include upstream's automatic ones. A pod already there stays while it tolerates the node's
//! NoExecute taints. Pods are created for a node through the required node affinity
//! `metadata.name In [node]` and left to the scheduler.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetSpec, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kcore::labels::node_matches_pod;
use kcore::taints::first_untolerated;

use crate::controllers::history;
use crate::controllers::podutil::{
    controller_owner, is_available, is_ready, pod_from_template, scaled_value,
};

/// The pod (and revision) label with the template hash.
pub const HASH_LABEL: &str = "controller-revision-hash";
/// Most pods created or deleted in one sync (upstream's `BurstReplicas`).
pub const BURST_REPLICAS: usize = 250;

fn spec(ds: &DaemonSet) -> DaemonSetSpec {
    ds.spec.clone().unwrap_or_default()
}

/// Upstream's automatic tolerations of daemon pods (`AddOrUpdateDaemonPodTolerations`).
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let list = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        let t = Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Toleration::default()
        };
        // Upstream's `AddOrUpdateTolerationInPodSpec`: one with the same key, operator, value
        // and effect is replaced, otherwise it is added.
        let same = |x: &Toleration| {
            x.key == t.key
                && x.operator.as_deref().unwrap_or("Equal") == "Exists"
                && x.value.as_deref().unwrap_or_default().is_empty()
                && x.effect == t.effect
        };
        match list.iter_mut().find(|x| same(x)) {
            Some(x) => *x = t,
            None => list.push(t),
        }
    }
}

/// The spec of a daemon pod before its node is set: the template's, with the automatic
/// tolerations.
pub fn daemon_pod_spec(ds: &DaemonSet) -> PodSpec {
    let mut s = spec(ds).template.spec.unwrap_or_default();
    add_daemon_tolerations(&mut s);
    s
}

/// `(should run, should continue running)` on `node` (upstream's `NodeShouldRunDaemonPod`).
pub fn should_run(pod_spec: &PodSpec, node: &Node) -> (bool, bool) {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if pod_spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return (false, false);
    }
    if !node_matches_pod(pod_spec, node) {
        return (false, false);
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tolerations = pod_spec.tolerations.as_deref().unwrap_or_default();
    if first_untolerated(&taints, tolerations, &["NoSchedule", "NoExecute"]).is_none() {
        return (true, true);
    }
    (
        false,
        first_untolerated(&taints, tolerations, &["NoExecute"]).is_none(),
    )
}

/// The node a daemon pod is for: its `nodeName`, else its affinity's `metadata.name In [node]`.
pub fn target_node(pod: &Pod) -> Option<String> {
    let s = pod.spec.as_ref()?;
    if let Some(n) = s.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.into());
    }
    let terms = &s
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.iter().flatten().find_map(|r| {
            (r.key == "metadata.name" && r.operator == "In")
                .then(|| {
                    r.values
                        .as_ref()
                        .and_then(|v| (v.len() == 1).then(|| v[0].clone()))
                })
                .flatten()
        })
    })
}

/// `affinity` with its required node affinity replaced by `metadata.name In [node]` (upstream's
/// `ReplaceDaemonSetPodNodeNameNodeAffinity`).
pub fn node_name_affinity(affinity: Option<Affinity>, node: &str) -> Affinity {
    let mut a = affinity.unwrap_or_default();
    let na = a.node_affinity.get_or_insert_with(NodeAffinity::default);
    na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            match_expressions: None,
        }],
    });
    a
}

/// The daemon pod for `node` at template hash `hash`.
pub fn new_pod(ds: &DaemonSet, hash: &str, node: &str) -> Pod {
    let mut template = spec(ds).template;
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(HASH_LABEL.into(), hash.into());
    let mut ps = daemon_pod_spec(ds);
    ps.affinity = Some(node_name_affinity(ps.affinity.take(), node));
    template.spec = Some(ps);
    let owner = controller_owner("apps/v1", "DaemonSet", &ds.metadata);
    pod_from_template(
        &template,
        ds.metadata.namespace.as_deref().unwrap_or_default(),
        &format!("{}-", ds.metadata.name.as_deref().unwrap_or_default()),
        owner,
    )
}

fn hash_of(p: &Pod) -> &str {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .map(String::as_str)
        .unwrap_or_default()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn terminating(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

/// Scheduled first, then older, then by name (upstream's `podByCreationTimestampAndPhase`).
fn oldest_first(pods: &mut [Arc<Pod>]) {
    pods.sort_by(|a, b| {
        let scheduled = |p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty())
        };
        scheduled(b)
            .cmp(&scheduled(a))
            .then_with(|| {
                let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// The set's pods by the node they are for; finished pods being deleted are left out.
pub fn pods_by_node(pods: &[Arc<Pod>]) -> HashMap<String, Vec<Arc<Pod>>> {
    let mut m: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    for p in pods {
        if terminating(p) && matches!(phase(p), "Succeeded" | "Failed") {
            continue;
        }
        if let Some(n) = target_node(p) {
            m.entry(n).or_default().push(p.clone());
        }
    }
    for list in m.values_mut() {
        oldest_first(list);
    }
    m
}

/// What to do about the history.
#[derive(Debug)]
pub struct HistoryPlan {
    /// The revision of the current template: existing (renumbered to the second value when
    /// that is set) or to create.
    pub current: Result<(Arc<ControllerRevision>, Option<i64>), ControllerRevision>,
    /// Duplicates of the current revision to delete.
    pub duplicates: Vec<Arc<ControllerRevision>>,
    /// Revisions of other templates, sorted.
    pub old: Vec<Arc<ControllerRevision>>,
}

/// A new revision of `ds` with number `revision` (labels: the template's and the hash).
pub fn new_revision(ds: &DaemonSet, revision: i64) -> ControllerRevision {
    let s = spec(ds);
    let hash = history::template_hash(&s.template, ds.status.as_ref().and_then(|st| st.collision_count));
    let mut r = history::new_revision(
        &ds.metadata,
        "DaemonSet",
        &s.template,
        history::template_patch(&s.template),
        revision,
        &hash,
    );
    if let Some(l) = r.metadata.labels.as_mut() {
        l.remove(history::HASH_LABEL);
        l.insert(HASH_LABEL.into(), hash);
    }
    r
}

/// Sorts the set's revisions into the current one and the old ones (upstream's
/// `constructHistory`).
pub fn history_plan(ds: &DaemonSet, sorted: &[Arc<ControllerRevision>]) -> HistoryPlan {
    let data = history::template_patch(&spec(ds).template);
    let (mut current, old): (Vec<_>, Vec<_>) =
        sorted.iter().cloned().partition(|r| history::same_data(r, &data));
    let next = old.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    let Some(keep) = current.pop() else {
        return HistoryPlan {
            current: Err(new_revision(ds, next)),
            duplicates: Vec::new(),
            old,
        };
    };
    let renumber = (keep.revision < next).then_some(next);
    HistoryPlan {
        current: Ok((keep, renumber)),
        duplicates: current,
        old,
    }
}

/// The hash of a revision (its label, else its name's suffix).
pub fn revision_hash(r: &ControllerRevision) -> String {
    r.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL).cloned())
        .unwrap_or_else(|| {
            let name = r.metadata.name.as_deref().unwrap_or_default();
            name.rsplit_once('-')
                .map(|(_, h)| h.to_string())
                .unwrap_or_default()
        })
}

/// Old revisions to delete: beyond `revisionHistoryLimit`, oldest first, not used by a pod.
pub fn surplus_revisions(
    ds: &DaemonSet,
    old: &[Arc<ControllerRevision>],
    pods: &[Arc<Pod>],
) -> Vec<Arc<ControllerRevision>> {
    let limit = spec(ds).revision_history_limit.unwrap_or(10);
    let named: HashMap<String, String> = old
        .iter()
        .map(|r| (r.metadata.name.clone().unwrap_or_default(), revision_hash(r)))
        .collect();
    let live = |name: &str| {
        let h = named.get(name).map(String::as_str).unwrap_or_default();
        pods.iter().any(|p| hash_of(p) == h)
    };
    history::surplus(old, &live, limit).into_iter().cloned().collect()
}

/// What one sync does.
#[derive(Debug, Default)]
pub struct Plan {
    /// Nodes to create a daemon pod for.
    pub create_on: Vec<String>,
    pub delete: Vec<Arc<Pod>>,
    /// Failed daemon pods to delete (subject to a back-off per node), with their node.
    pub failed: Vec<(String, Arc<Pod>)>,
    pub status: DaemonSetStatus,
    /// Some pod is ready but not yet available: look again after `minReadySeconds`.
    pub wait_min_ready: bool,
}

fn rolling(ds: &DaemonSet) -> Option<(IntOrString, IntOrString)> {
    let u = spec(ds).update_strategy.unwrap_or_default();
    if u.type_.as_deref().is_some_and(|t| t != "RollingUpdate") {
        return None;
    }
    let r = u.rolling_update.unwrap_or_default();
    Some((
        r.max_surge.unwrap_or(IntOrString::Int(0)),
        r.max_unavailable.unwrap_or(IntOrString::Int(1)),
    ))
}

/// The sync of `ds` with current template hash `hash`, given all nodes, the set's pods, whether
/// earlier creations and deletions are all in the cache, and the time.
pub fn plan(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    pods: &[Arc<Pod>],
    settled: bool,
    now: DateTime<Utc>,
) -> Plan {
    let by_node = pods_by_node(pods);
    let pod_spec = daemon_pod_spec(ds);
    let min_ready = spec(ds).min_ready_seconds.unwrap_or(0);
    let mut plan = Plan {
        status: status(ds, hash, nodes, &by_node, &pod_spec, now),
        ..Plan::default()
    };
    plan.wait_min_ready =
        min_ready > 0 && plan.status.number_ready != plan.status.number_available.unwrap_or(0);
    if !settled {
        return plan;
    }
    // Upstream's `AllowsSurge`: maxSurge scaled against one node.
    let surge_allowed = rolling(ds).is_some_and(|(surge, _)| scaled_value(&surge, 1, true) > 0);
    let empty = Vec::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let (run, keep) = should_run(&pod_spec, node);
        let here = by_node.get(&name);
        match (run, keep, here) {
            (true, _, None) => plan.create_on.push(name),
            (_, true, _) => {
                let mut running = Vec::new();
                for p in here.unwrap_or(&empty) {
                    if terminating(p) {
                        continue;
                    }
                    match phase(p) {
                        "Failed" => plan.failed.push((name.clone(), p.clone())),
                        "Succeeded" => plan.delete.push(p.clone()),
                        _ => running.push(p.clone()),
                    }
                }
                if running.len() <= 1 {
                    continue;
                }
                if !surge_allowed {
                    plan.delete.extend(running.into_iter().skip(1));
                    continue;
                }
                // With surge: keep the oldest new pod, and the oldest old one only while the
                // new one is not yet available.
                let (mut new, mut old): (Option<Arc<Pod>>, Option<Arc<Pod>>) = (None, None);
                for p in running {
                    let slot = if hash_of(&p) == hash { &mut new } else { &mut old };
                    if slot.is_none() {
                        *slot = Some(p);
                    } else {
                        plan.delete.push(p);
                    }
                }
                if let (Some(n), Some(o)) = (new, old)
                    && (!is_ready(&o) || is_available(&n, min_ready, now))
                {
                    plan.delete.push(o);
                }
            }
            (_, false, Some(list)) => plan
                .delete
                .extend(list.iter().filter(|p| !terminating(p)).cloned()),
            _ => {}
        }
    }
    // Unscheduled pods for nodes that no longer exist.
    let known: std::collections::HashSet<&str> =
        nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect();
    for (node, list) in &by_node {
        if known.contains(node.as_str()) {
            continue;
        }
        plan.delete.extend(
            list.iter()
                .filter(|p| {
                    !terminating(p)
                        && p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.as_deref())
                            .is_none_or(str::is_empty)
                })
                .cloned(),
        );
    }
    if !plan.create_on.is_empty() || !plan.delete.is_empty() || !plan.failed.is_empty() {
        plan.create_on.truncate(BURST_REPLICAS);
        plan.delete.truncate(BURST_REPLICAS);
        return plan;
    }
    if let Some((surge, unavailable)) = rolling(ds) {
        rolling_update(
            ds,
            hash,
            nodes,
            &by_node,
            &pod_spec,
            surge,
            unavailable,
            now,
            &mut plan,
        );
    }
    plan
}

/// The up-to-date and the old pod of one node; `None` when there is more than one of either
/// (the manage step cleans that up first).
/// The up-to-date and the old daemon pod of one node.
type NewAndOld = (Option<Arc<Pod>>, Option<Arc<Pod>>);

fn new_and_old(pods: &[Arc<Pod>], hash: &str) -> Option<NewAndOld> {
    let (mut new, mut old) = (None, None);
    for p in pods.iter().filter(|p| !terminating(p)) {
        let slot = if hash_of(p) == hash { &mut new } else { &mut old };
        if slot.is_some() {
            return None;
        }
        *slot = Some(p.clone());
    }
    Some((new, old))
}

/// Upstream's `rollingUpdate`: without surge, delete old pods while at most `maxUnavailable`
/// nodes are without an available pod; with surge, create the new pod next to the old one on
/// at most `maxSurge` nodes and delete the old one once the new one is available.
#[allow(clippy::too_many_arguments)]
fn rolling_update(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    pod_spec: &PodSpec,
    surge: IntOrString,
    unavailable: IntOrString,
    now: DateTime<Utc>,
    plan: &mut Plan,
) {
    let min_ready = spec(ds).min_ready_seconds.unwrap_or(0);
    let desired = plan.status.desired_number_scheduled;
    let max_surge = scaled_value(&surge, desired, true);
    let mut max_unavailable = scaled_value(&unavailable, desired, true);
    if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    // Every node that should run a pod, and every node that has one, in node order.
    let mut names: Vec<String> = nodes
        .iter()
        .filter(|n| should_run(pod_spec, n).0)
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let listed: std::collections::HashSet<String> = names.iter().cloned().collect();
    let mut extra: Vec<String> = by_node.keys().filter(|n| !listed.contains(*n)).cloned().collect();
    extra.sort();
    names.extend(extra);
    let empty = Vec::new();
    let available = |p: &Pod| is_available(p, min_ready, now);
    if max_surge == 0 {
        let mut down = 0;
        let mut replace = Vec::new();
        let mut candidates = Vec::new();
        for n in &names {
            let Some((new, old)) = new_and_old(by_node.get(n).unwrap_or(&empty), hash) else {
                down += 1;
                continue;
            };
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => down += 1,
                (Some(new), None) => {
                    if !available(&new) {
                        down += 1;
                    }
                }
                (None, Some(old)) => {
                    if !available(&old) {
                        replace.push(old);
                        down += 1;
                    } else if down < max_unavailable {
                        candidates.push(old);
                    }
                }
            }
        }
        let room = usize::try_from((max_unavailable - down).max(0))
            .unwrap_or(0)
            .min(candidates.len());
        plan.delete.extend(replace);
        plan.delete.extend(candidates.into_iter().take(room));
        return;
    }
    let mut surged = 0;
    let mut allowed = Vec::new();
    let mut candidates = Vec::new();
    for n in &names {
        let Some((new, old)) = new_and_old(by_node.get(n).unwrap_or(&empty), hash) else {
            surged += 1;
            continue;
        };
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                if !available(&old) {
                    allowed.push(n.clone());
                } else if surged < max_surge {
                    candidates.push(n.clone());
                }
            }
            (Some(new), Some(old)) => {
                if available(&new) {
                    plan.delete.push(old);
                } else {
                    surged += 1;
                }
            }
        }
    }
    let room = usize::try_from((max_surge - surged).max(0))
        .unwrap_or(0)
        .min(candidates.len());
    plan.create_on.extend(allowed);
    plan.create_on.extend(candidates.into_iter().take(room));
}

/// The status (upstream's `updateDaemonSetStatus`): per eligible node, the oldest pod counts.
pub fn status(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    pod_spec: &PodSpec,
    now: DateTime<Utc>,
) -> DaemonSetStatus {
    let min_ready = spec(ds).min_ready_seconds.unwrap_or(0);
    let (mut desired, mut current, mut mis, mut ready, mut updated, mut available) = (0, 0, 0, 0, 0, 0);
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let pods = by_node.get(name).filter(|l| !l.is_empty());
        if should_run(pod_spec, node).0 {
            desired += 1;
            let Some(first) = pods.and_then(|l| l.first()) else {
                continue;
            };
            current += 1;
            if is_ready(first) {
                ready += 1;
                if is_available(first, min_ready, now) {
                    available += 1;
                }
            }
            if hash_of(first) == hash {
                updated += 1;
            }
        } else if pods.is_some() {
            mis += 1;
        }
    }
    let old = ds.status.clone().unwrap_or_default();
    DaemonSetStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: mis,
        number_ready: ready,
        updated_number_scheduled: Some(updated),
        number_available: Some(available),
        number_unavailable: Some(desired - available),
        observed_generation: ds.metadata.generation,
        collision_count: old.collision_count,
        conditions: old.conditions,
    }
}
