//! Table tests of the pod garbage collector's choices (docs/SEEDS-SPEC.md CTL-41).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::reconcile::*;

fn at(secs: i64) -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse::<DateTime<Utc>>().expect("time") + chrono::Duration::seconds(secs)
}

fn pod(name: &str, created: &str, node: Option<&str>, status: Value) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default",
            "creationTimestamp": created}, "spec": {"nodeName": node, "containers": [{"name": "c"}]},
            "status": status}))
        .expect("pod"),
    )
}

fn names(p: &[Arc<Pod>]) -> Vec<&str> {
    p.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
}

#[test]
fn terminated_pods_beyond_the_threshold_go_evicted_then_oldest_first() {
    let pods = vec![
        pod(
            "new-done",
            "2026-06-01T10:00:00Z",
            Some("n"),
            json!({"phase": "Succeeded"}),
        ),
        pod(
            "old-done",
            "2026-06-01T08:00:00Z",
            Some("n"),
            json!({"phase": "Failed"}),
        ),
        pod(
            "evicted",
            "2026-06-01T11:00:00Z",
            Some("n"),
            json!({"phase": "Failed", "reason": "Evicted"}),
        ),
        pod(
            "mid-done",
            "2026-06-01T09:00:00Z",
            Some("n"),
            json!({"phase": "Succeeded"}),
        ),
        pod(
            "running",
            "2026-06-01T07:00:00Z",
            Some("n"),
            json!({"phase": "Running"}),
        ),
    ];
    assert_eq!(names(&terminated_beyond(&pods, 2)), ["evicted", "old-done"]);
    assert!(terminated_beyond(&pods, 4).is_empty());
    assert!(terminated_beyond(&pods, 0).is_empty(), "0 turns it off");
    assert_eq!(
        names(&terminated_beyond(&pods, 3)),
        ["evicted"],
        "running pods never count"
    );
}

#[test]
fn orphans_wait_out_the_quarantine() {
    let pods = vec![
        pod(
            "on-gone",
            "2026-06-01T10:00:00Z",
            Some("gone"),
            json!({"phase": "Running"}),
        ),
        pod(
            "on-live",
            "2026-06-01T10:00:00Z",
            Some("live"),
            json!({"phase": "Running"}),
        ),
        pod(
            "pending",
            "2026-06-01T10:00:00Z",
            None,
            json!({"phase": "Pending"}),
        ),
    ];
    let existing: HashSet<&str> = ["live"].into();
    let mut q = Quarantine::default();
    let forty = Duration::from_secs(40);
    assert!(q.missing(&pods, &existing, at(0), forty).is_empty());
    assert!(q.missing(&pods, &existing, at(20), forty).is_empty());
    assert_eq!(q.missing(&pods, &existing, at(40), forty), ["gone"]);
    let deleted: HashSet<String> = ["gone".to_string()].into();
    assert_eq!(names(&orphans(&pods, &deleted)), ["on-gone"]);
    // A node that showed up meanwhile is not looked up.
    let mut q = Quarantine::default();
    q.missing(&pods, &existing, at(0), forty);
    let both: HashSet<&str> = ["live", "gone"].into();
    assert!(q.missing(&pods, &both, at(40), forty).is_empty());
}

#[test]
fn terminating_pods_without_a_node_or_on_an_out_of_service_node() {
    let deleting = json!({"phase": "Running"});
    let mut unscheduled = (*pod("u", "2026-06-01T10:00:00Z", None, deleting.clone())).clone();
    unscheduled.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(0)));
    let mut on_dead = (*pod("d", "2026-06-01T10:00:00Z", Some("dead"), deleting)).clone();
    on_dead.metadata.deletion_timestamp = unscheduled.metadata.deletion_timestamp.clone();
    let pods = vec![Arc::new(unscheduled), Arc::new(on_dead)];
    assert_eq!(names(&unscheduled_terminating(&pods)), ["u"]);
    let dead: Node = serde_json::from_value(json!({"metadata": {"name": "dead"},
        "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}))
    .expect("node");
    let nodes: HashMap<&str, &Node> = [("dead", &dead)].into();
    assert_eq!(names(&terminating_out_of_service(&pods, &nodes)), ["d"]);
    assert!(terminating_out_of_service(&pods, &HashMap::new()).is_empty());
}
