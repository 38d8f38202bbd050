//! Table tests of the ReplicaSet decision (docs/SEEDS-SPEC.md CTL-18..CTL-21).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::reconcile::{plan, victims};
use crate::controllers::expectations::Outstanding;

fn now() -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse().expect("time")
}

fn rs(replicas: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": "frontend", "namespace": "default", "uid": "rs-uid", "generation": 2},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"tier": "frontend"}},
                 "template": {"metadata": {"labels": {"tier": "frontend"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }))
    .expect("rs")
}

fn owned() -> Value {
    json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "frontend", "uid": "rs-uid", "controller": true, "blockOwnerDeletion": true}])
}

fn pod(name: &str, extra: Value) -> Arc<Pod> {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"tier": "frontend"},
                     "creationTimestamp": "2026-06-01T11:00:00Z", "ownerReferences": owned()},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-06-01T11:00:00Z"}]},
    });
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).expect("pod"))
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
    pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
}

#[test]
fn creates_what_is_missing_and_counts_outstanding_creations() {
    let pods = vec![pod("a", json!({}))];
    let p = plan(&rs(3), &pods, &Outstanding::default(), now());
    assert_eq!(p.create, 2);
    assert_eq!(p.status.replicas, 1);
    assert_eq!(p.status.observed_generation, Some(2));
    // Two already created but not yet cached: nothing more to create.
    let pending = Outstanding {
        creates: 2,
        ..Outstanding::default()
    };
    assert_eq!(plan(&rs(3), &pods, &pending, now()).create, 0);
}

#[test]
fn adopts_orphans_and_releases_pods_that_left_the_selector() {
    let orphan = pod("orphan", json!({"metadata": {"ownerReferences": null}}));
    let other_owner = pod(
        "taken",
        json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "other", "uid": "x", "controller": true}]}}),
    );
    let relabeled = pod("moved", json!({"metadata": {"labels": {"tier": "other"}}}));
    let p = plan(
        &rs(1),
        &[orphan, other_owner, relabeled],
        &Outstanding::default(),
        now(),
    );
    assert_eq!(names(&p.adopt), ["orphan"]);
    assert_eq!(names(&p.release), ["moved"]);
    assert_eq!(p.create, 0, "the adopted orphan is the one replica");
    assert!(p.delete.is_empty());
}

#[test]
fn an_orphan_created_after_the_set_is_adopted_then_deleted() {
    let pods = vec![
        pod("a", json!({})),
        pod(
            "pod1",
            json!({"metadata": {"ownerReferences": null,
        "creationTimestamp": "2026-06-01T11:59:59Z"}}),
        ),
    ];
    let p = plan(&rs(1), &pods, &Outstanding::default(), now());
    assert_eq!(names(&p.adopt), ["pod1"]);
    assert_eq!(names(&p.delete), ["pod1"], "the newer pod goes");
}

#[test]
fn finished_and_terminating_pods_do_not_count() {
    let pods = vec![
        pod("done", json!({"status": {"phase": "Succeeded"}})),
        pod(
            "going",
            json!({"metadata": {"deletionTimestamp": "2026-06-01T11:59:00Z"}}),
        ),
        pod("ok", json!({})),
    ];
    let p = plan(&rs(2), &pods, &Outstanding::default(), now());
    assert_eq!(p.create, 1);
    assert_eq!(p.status.replicas, 1);
}

#[test]
fn scale_down_victim_order_of_ctl_21() {
    let ready = |t: &str| json!({"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": t}]}});
    let pods = vec![
        pod(
            "old-running",
            json!({"metadata": {"creationTimestamp": "2026-05-01T00:00:00Z"}}),
        ),
        pod(
            "unscheduled",
            json!({"spec": {"nodeName": null}, "status": {"phase": "Pending", "conditions": []}}),
        ),
        pod(
            "pending",
            json!({"status": {"phase": "Pending", "conditions": []}}),
        ),
        pod(
            "unready",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        ),
        pod(
            "cheap",
            json!({"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-10"}}}),
        ),
        pod("doubled-a", json!({"spec": {"nodeName": "n2"}})),
        pod("just-ready", ready("2026-06-01T11:59:58Z")),
    ];
    let order = victims(&pods, pods.len(), now());
    assert_eq!(
        names(&order),
        [
            "unscheduled",
            "pending",
            "unready",
            "cheap",
            "just-ready",
            "old-running",
            "doubled-a"
        ]
    );
}

#[test]
fn more_replicas_on_one_node_go_first() {
    let pods = vec![
        pod("alone", json!({"spec": {"nodeName": "n1"}})),
        pod("crowd-1", json!({"spec": {"nodeName": "n2"}})),
        pod("crowd-2", json!({"spec": {"nodeName": "n2"}})),
    ];
    let order = victims(&pods, 1, now());
    assert!(names(&order)[0].starts_with("crowd-"));
}

#[test]
fn a_set_being_deleted_creates_and_adopts_nothing() {
    let mut set = rs(3);
    set.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let orphan = pod("orphan", json!({"metadata": {"ownerReferences": null}}));
    let p = plan(&set, &[orphan], &Outstanding::default(), now());
    assert_eq!(p.create, 0);
    assert!(p.adopt.is_empty());
}

/// Thousands of pods whose ready and creation times differ inside one log2 bucket or are
/// exactly equal (as a rollout's pods are): upstream's pairwise rule is not a total order on
/// them, and Rust's sort panicked on it. The order must not depend on the input's order.
#[test]
fn the_victim_order_is_total_on_pods_sharing_time_buckets() {
    let mut pods = Vec::new();
    for i in 0..2000u32 {
        let second = 40 + i % 7; // ~19 min ago: all in one bucket, some exactly equal
        let t = format!("2026-06-01T11:41:{second:02}Z");
        pods.push(pod(
            &format!("p-{:04}", (i * 7919) % 2000),
            json!({
                "metadata": {"creationTimestamp": t},
                "spec": {"nodeName": format!("n{}", i % 13)},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": t}],
                    "containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": true,
                        "restartCount": i % 3}],
                },
            }),
        ));
    }
    let first: Vec<String> = names(&victims(&pods, pods.len(), now()))
        .into_iter()
        .map(str::to_string)
        .collect();
    // A fixed shuffle (multiplicative step coprime with the length).
    let shuffled: Vec<Arc<Pod>> = (0..pods.len())
        .map(|i| pods[(i * 1237) % pods.len()].clone())
        .collect();
    let again = victims(&shuffled, shuffled.len(), now());
    assert_eq!(names(&again), first);
    assert_eq!(first.len(), 2000);
}
