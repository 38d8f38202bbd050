//! The ReplicaSet decision (docs/SEEDS-SPEC.md CTL-18..CTL-22), a pure function of the cached
//! objects: which pods to adopt or release, how many to create, which to delete (upstream's
//! victim order), and the status to report.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use kcore::labels::{labels_of, selector_matches};

use crate::controllers::expectations::Outstanding;
use crate::controllers::podutil::{is_active, is_available, is_ready, ready_since};

/// Most pods created or deleted in one sync (upstream's `burstReplicas`).
pub const BURST_REPLICAS: usize = 500;
/// The annotation that ranks scale-down victims (lower first).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// What one sync does.
#[derive(Debug, Default)]
pub struct Plan {
    /// Orphans the selector matches: add our controller reference.
    pub adopt: Vec<Arc<Pod>>,
    /// Owned pods the selector no longer matches: remove our reference.
    pub release: Vec<Arc<Pod>>,
    pub create: usize,
    /// Victims, first to go first.
    pub delete: Vec<Arc<Pod>>,
    pub status: ReplicaSetStatus,
}

/// Whether `pod` is controlled by the owner with `uid`.
pub fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

fn has_controller(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true))
}

/// The sync of `rs` given the pods of its namespace, what is still in flight, and the time.
pub fn plan(rs: &ReplicaSet, pods: &[Arc<Pod>], outstanding: &Outstanding, now: DateTime<Utc>) -> Plan {
    let mut plan = Plan::default();
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let spec = rs.spec.clone().unwrap_or_default();
    let selector = &spec.selector;
    let deleting = rs.metadata.deletion_timestamp.is_some();
    // Claim: keep owned pods that still match, release the others, adopt matching orphans.
    let mut owned: Vec<Arc<Pod>> = Vec::new();
    for p in pods {
        if !is_active(p) && !controlled_by(p, &uid) {
            continue;
        }
        let matches = selector_matches(selector, labels_of(&p.metadata.labels));
        if controlled_by(p, &uid) {
            if matches {
                owned.push(p.clone());
            } else if !deleting {
                plan.release.push(p.clone());
            }
        } else if !has_controller(p) && matches && !deleting && p.metadata.deletion_timestamp.is_none() {
            plan.adopt.push(p.clone());
            owned.push(p.clone());
        }
    }
    let active: Vec<Arc<Pod>> = owned
        .iter()
        .filter(|p| {
            is_active(p)
                && !outstanding
                    .deletes
                    .contains(p.metadata.uid.as_deref().unwrap_or_default())
        })
        .cloned()
        .collect();
    let want = usize::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0);
    let have = active.len() + outstanding.creates;
    if !deleting {
        if have < want {
            plan.create = (want - have).min(BURST_REPLICAS);
        } else if have > want && outstanding.creates == 0 {
            let n = (have - want).min(BURST_REPLICAS);
            plan.delete = victims(&active, n, now);
        }
    }
    plan.status = status(rs, &owned, now);
    plan
}

/// The status from the owned pods (before this sync's changes, as upstream reports it).
pub fn status(rs: &ReplicaSet, owned: &[Arc<Pod>], now: DateTime<Utc>) -> ReplicaSetStatus {
    let spec = rs.spec.clone().unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let template_labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let active: Vec<&Arc<Pod>> = owned.iter().filter(|p| is_active(p)).collect();
    let count = |f: &dyn Fn(&Pod) -> bool| active.iter().filter(|p| f(p)).count() as i32;
    let old = rs.status.clone().unwrap_or_default();
    ReplicaSetStatus {
        replicas: active.len() as i32,
        fully_labeled_replicas: Some(count(&|p| {
            let l = labels_of(&p.metadata.labels);
            template_labels.iter().all(|(k, v)| l.get(k) == Some(v))
        })),
        ready_replicas: Some(count(&|p| is_ready(p))),
        available_replicas: Some(count(&|p| is_available(p, min_ready, now))),
        observed_generation: rs.metadata.generation,
        conditions: old.conditions,
    }
}

fn phase_ordinal(p: &Pod) -> u8 {
    match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 3,
    }
}

fn deletion_cost(p: &Pod) -> i32 {
    p.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DELETION_COST))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0)
}

/// `floor(log2(now − t))` in nanoseconds (−1 for times not in the past), upstream's logarithmic
/// scale-down buckets.
fn log_rank(t: DateTime<Utc>, now: DateTime<Utc>) -> i64 {
    match (now - t).num_nanoseconds() {
        Some(d) if d > 0 => (d as f64).log2() as i64,
        Some(_) => -1,
        None => 63,
    }
}

/// The key that orders pods by which to delete first (upstream's `ActivePodsWithRanks`, with
/// `LogarithmicScaleDown`): unscheduled, then Pending < Unknown < Running, not ready, lower
/// deletion cost, more replicas on its node, ready for less time (log2 buckets), more
/// restarts, newer (log2 buckets), then UID.
///
/// A key rather than upstream's pairwise `Less`: upstream compares two ready times (and two
/// creation times) by bucket and falls to the UID when they differ but share a bucket, yet to
/// the next criterion when they are exactly equal; that relation is not transitive, and
/// Rust's sort panics on such a comparator (it did, under 3,000 replicas, every few seconds).
/// The key agrees with upstream except for two pods whose times differ inside one bucket:
/// there restarts and creation bucket are consulted before the UID.
type DeleteKey = (
    bool,
    u8,
    bool,
    i32,
    std::cmp::Reverse<usize>,
    i64,
    std::cmp::Reverse<i32>,
    i64,
    String,
);

fn delete_key(p: &Pod, on_node: usize, now: DateTime<Utc>) -> DeleteKey {
    use std::cmp::Reverse;
    let scheduled = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let ready = is_ready(p);
    // Only ready pods are compared by ready time; a ready pod without one is deleted first.
    let ready_bucket = match (ready, ready_since(p)) {
        (false, _) => 0,
        (true, Some(t)) => log_rank(t, now),
        (true, None) => i64::MIN,
    };
    let created_bucket = p
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(i64::MIN, |t| log_rank(t.0, now));
    (
        scheduled,
        phase_ordinal(p),
        ready,
        deletion_cost(p),
        Reverse(on_node),
        ready_bucket,
        Reverse(restarts(p)),
        created_bucket,
        p.metadata.uid.clone().unwrap_or_default(),
    )
}

/// The `n` pods to delete first.
pub fn victims(active: &[Arc<Pod>], n: usize, now: DateTime<Utc>) -> Vec<Arc<Pod>> {
    let mut per_node: HashMap<String, usize> = HashMap::new();
    for p in active {
        if let Some(node) = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
        {
            *per_node.entry(node).or_default() += 1;
        }
    }
    let rank = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .and_then(|n| per_node.get(n))
            .copied()
            .unwrap_or(0)
    };
    let mut ranked: Vec<(DeleteKey, &Arc<Pod>)> =
        active.iter().map(|p| (delete_key(p, rank(p), now), p)).collect();
    ranked.sort_by(|a, b| a.0.cmp(&b.0));
    ranked.into_iter().take(n).map(|(_, p)| p.clone()).collect()
}
