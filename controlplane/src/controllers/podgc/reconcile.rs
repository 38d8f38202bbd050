//! The pod garbage collector's choices (docs/SEEDS-SPEC.md CTL-41, CTL-42), pure functions of
//! the cached pods and nodes and the time: terminated pods beyond the threshold (evicted ones
//! first, then the oldest), terminating pods on out-of-service nodes, pods bound to nodes that
//! are gone (after a quarantine, so a node the cache has not shown yet is not taken for a
//! deleted one), and terminating pods that were never scheduled.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};

use crate::controllers::index::node_of;

/// `node.kubernetes.io/out-of-service`: an admin says the node is down for good.
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// Pod GC tunables.
#[derive(Debug, Clone)]
pub struct PodGcConfig {
    /// `--terminated-pod-gc-threshold`: terminated pods kept before the oldest go (0: never).
    pub terminated_threshold: usize,
    /// How often the collector runs (upstream's `gcCheckPeriod`).
    pub period: Duration,
    /// How long a node missing from the cache stays in quarantine before it is looked up
    /// (upstream's `quarantineTime`).
    pub quarantine: Duration,
}

impl Default for PodGcConfig {
    fn default() -> Self {
        Self {
            terminated_threshold: 12_500,
            period: Duration::from_secs(20),
            quarantine: Duration::from_secs(40),
        }
    }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// Finished: neither Pending, Running nor Unknown.
pub fn is_terminated(p: &Pod) -> bool {
    !matches!(phase(p), "Pending" | "Running" | "Unknown")
}

/// Failed because the kubelet evicted it.
pub fn is_evicted(p: &Pod) -> bool {
    phase(p) == "Failed" && p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

/// The terminated pods beyond `threshold`: evicted first, then by creation time, then name
/// (upstream's `byEvictionAndCreationTimestamp`).
pub fn terminated_beyond(pods: &[Arc<Pod>], threshold: usize) -> Vec<Arc<Pod>> {
    let mut done: Vec<Arc<Pod>> = pods.iter().filter(|p| is_terminated(p)).cloned().collect();
    if threshold == 0 || done.len() <= threshold {
        return Vec::new();
    }
    let n = done.len() - threshold;
    done.sort_by(|a, b| {
        is_evicted(b)
            .cmp(&is_evicted(a))
            .then_with(|| {
                let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    done.truncate(n);
    done
}

fn is_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Terminating pods on nodes that are not ready and carry the out-of-service taint.
pub fn terminating_out_of_service(pods: &[Arc<Pod>], nodes: &HashMap<&str, &Node>) -> Vec<Arc<Pod>> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some())
        .filter(|p| {
            node_of(p).and_then(|n| nodes.get(n)).is_some_and(|n| {
                !is_ready(n)
                    && n.spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_OUT_OF_SERVICE))
            })
        })
        .cloned()
        .collect()
}

/// Terminating pods that were never bound to a node.
pub fn unscheduled_terminating(pods: &[Arc<Pod>]) -> Vec<Arc<Pod>> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_some() && node_of(p).is_none())
        .cloned()
        .collect()
}

/// Pods bound to one of `deleted` nodes.
pub fn orphans(pods: &[Arc<Pod>], deleted: &HashSet<String>) -> Vec<Arc<Pod>> {
    pods.iter()
        .filter(|p| node_of(p).is_some_and(|n| deleted.contains(n)))
        .cloned()
        .collect()
}

/// Node names pods are bound to that the cache does not have, each remembered from when it
/// was first missed.
#[derive(Debug, Default)]
pub struct Quarantine {
    since: HashMap<String, DateTime<Utc>>,
}

impl Quarantine {
    /// Notes the nodes of `pods` missing from `existing`; returns those whose quarantine has
    /// ended (they are forgotten: they are looked up now).
    pub fn missing(
        &mut self,
        pods: &[Arc<Pod>],
        existing: &HashSet<&str>,
        now: DateTime<Utc>,
        quarantine: Duration,
    ) -> Vec<String> {
        for n in pods.iter().filter_map(|p| node_of(p)) {
            if !existing.contains(n) && !self.since.contains_key(n) {
                self.since.insert(n.to_string(), now);
            }
        }
        let q = chrono::Duration::from_std(quarantine).unwrap_or(chrono::Duration::MAX);
        let mut due: Vec<String> = self
            .since
            .iter()
            .filter(|(_, t)| **t + q <= now)
            .map(|(n, _)| n.clone())
            .collect();
        due.sort();
        for n in &due {
            self.since.remove(n);
        }
        due.retain(|n| !existing.contains(n.as_str()));
        due
    }
}
