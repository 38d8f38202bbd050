//! Table tests of the DaemonSet decision (docs/SEEDS-SPEC.md CTL-28).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::reconcile::{
    HASH_LABEL, daemon_pod_spec, history_plan, new_pod, new_revision, plan, should_run, target_node,
};

fn now() -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse().expect("time")
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

fn ds(extra: Value) -> DaemonSet {
    let mut v = json!({
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-uid", "generation": 3},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                 "template": {"metadata": {"labels": {"app": "agent"}},
                              "spec": {"containers": [{"name": "a", "image": "agent:1"}]}}},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).expect("ds")
}

fn node(name: &str, extra: Value) -> Arc<Node> {
    let mut v = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                       "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).expect("node"))
}

fn pod(name: &str, node: &str, hash: &str, extra: Value) -> Arc<Pod> {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "kube-system", "uid": name,
                     "creationTimestamp": "2026-06-01T11:00:00Z",
                     "labels": {"app": "agent", HASH_LABEL: hash},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-uid", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "a", "image": "agent:1"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-06-01T11:00:00Z"}]},
    });
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).expect("pod"))
}

fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
    pods.iter().filter_map(|p| p.metadata.name.as_deref()).collect()
}

fn taint(key: &str, effect: &str) -> Value {
    json!({"spec": {"taints": [{"key": key, "effect": effect}]}})
}

#[test]
fn one_pod_per_eligible_node_with_selectors_and_taints() {
    let d = ds(json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "edge"}}}}}));
    let nodes = [
        node("a", json!({"metadata": {"labels": {"role": "edge"}}})),
        node("b", json!({"metadata": {"labels": {"role": "core"}}})),
        node(
            "c",
            json!({"metadata": {"labels": {"role": "edge"}}, "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
        ),
        node("d", json!({"metadata": {"labels": {"role": "edge"}}})),
    ];
    let pods = [pod("agent-d", "d", "h", json!({}))];
    let p = plan(&d, "h", &nodes, &pods, true, now());
    assert_eq!(
        p.create_on,
        ["a"],
        "b is not selected, c is tainted, d has its pod"
    );
    assert_eq!(p.status.desired_number_scheduled, 2);
    assert_eq!(p.status.current_number_scheduled, 1);
    assert_eq!((p.status.number_ready, p.status.number_available), (1, Some(1)));
    assert_eq!(p.status.updated_number_scheduled, Some(1));
    assert_eq!(p.status.observed_generation, Some(3));
    // A toleration lets it onto the tainted node.
    let tolerant = ds(
        json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "edge"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]}}}}),
    );
    assert_eq!(
        plan(&tolerant, "h", &nodes, &pods, true, now()).create_on,
        ["a", "c"]
    );
    // Required node affinity selects too.
    let affine = ds(
        json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["core"]}]}]}}}}}}}),
    );
    assert_eq!(plan(&affine, "h", &nodes, &[], true, now()).create_on, ["b"]);
}

#[test]
fn automatic_tolerations_of_daemon_pods() {
    let d = ds(json!({}));
    let spec = daemon_pod_spec(&d);
    let tols: Vec<(String, String)> = spec
        .tolerations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key.unwrap_or_default(), t.effect.unwrap_or_default()))
        .collect();
    let expect = [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    assert_eq!(
        tols,
        expect
            .iter()
            .map(|(k, e)| (k.to_string(), e.to_string()))
            .collect::<Vec<_>>()
    );
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .all(|t| t.toleration_seconds.is_none())
    );
    // Not-ready, cordoned and memory-pressure nodes still run daemon pods; network-unavailable
    // only hostNetwork ones.
    for t in [
        taint("node.kubernetes.io/not-ready", "NoExecute"),
        taint("node.kubernetes.io/unschedulable", "NoSchedule"),
        taint("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ] {
        assert_eq!(should_run(&spec, &node("n", t)), (true, true));
    }
    let net = node("n", taint("node.kubernetes.io/network-unavailable", "NoSchedule"));
    assert_eq!(should_run(&spec, &net), (false, true));
    let host = daemon_pod_spec(&ds(
        json!({"spec": {"template": {"spec": {"hostNetwork": true}}}}),
    ));
    assert_eq!(should_run(&host, &net), (true, true));
    // An untolerated NoExecute taint: not even the existing pod stays.
    assert_eq!(
        should_run(&spec, &node("n", taint("gone", "NoExecute"))),
        (false, false)
    );
}

#[test]
fn pods_are_created_with_node_name_affinity_for_the_scheduler() {
    let d = ds(
        json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "In", "values": ["core"]}]}]}}}}}}}),
    );
    let p = new_pod(&d, "5d4c8b9f7", "node-3");
    let terms = p
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .expect("terms");
    assert_eq!(
        serde_json::to_value(&terms).expect("json"),
        json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-3"]}]}])
    );
    assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.clone()), None);
    assert_eq!(p.metadata.generate_name.as_deref(), Some("agent-"));
    assert_eq!(
        p.metadata.labels.as_ref().map(|l| l[HASH_LABEL].clone()),
        Some("5d4c8b9f7".into())
    );
    assert_eq!(target_node(&p).as_deref(), Some("node-3"));
}

#[test]
fn pods_on_nodes_that_no_longer_fit_go_and_extra_or_failed_pods_are_cleaned() {
    let d = ds(json!({"spec": {"template": {"spec": {"nodeSelector": {"role": "edge"}}}}}));
    let nodes = [
        node("a", json!({"metadata": {"labels": {"role": "core"}}})),
        node("b", json!({"metadata": {"labels": {"role": "edge"}}})),
        node("c", json!({"metadata": {"labels": {"role": "edge"}}})),
    ];
    let pods = [
        pod("on-a", "a", "h", json!({})),
        pod("b-old", "b", "h", json!({})),
        pod(
            "b-new",
            "b",
            "h",
            json!({"metadata": {"creationTimestamp": "2026-06-01T11:30:00Z"}}),
        ),
        pod("c-failed", "c", "h", json!({"status": {"phase": "Failed"}})),
    ];
    let p = plan(&d, "h", &nodes, &pods, true, now());
    assert_eq!(names(&p.delete), ["on-a", "b-new"]);
    assert_eq!(
        p.failed
            .iter()
            .map(|(n, p)| (n.as_str(), p.metadata.name.as_deref().unwrap_or_default()))
            .collect::<Vec<_>>(),
        [("c", "c-failed")]
    );
    assert_eq!(p.status.number_misscheduled, 1);
    // Nothing happens while earlier creations are not in the cache yet.
    let p = plan(&d, "h", &nodes, &pods, false, now());
    assert!(p.delete.is_empty() && p.create_on.is_empty());
}

#[test]
fn rolling_update_with_max_unavailable_replaces_one_node_at_a_time() {
    let d = ds(json!({}));
    let nodes = [node("a", json!({})), node("b", json!({})), node("c", json!({}))];
    let old = [
        pod("pa", "a", "old", json!({})),
        pod("pb", "b", "old", json!({})),
        pod("pc", "c", "old", json!({})),
    ];
    let p = plan(&d, "new", &nodes, &old, true, now());
    assert_eq!(p.delete.len(), 1);
    assert!(p.create_on.is_empty());
    assert_eq!(p.status.updated_number_scheduled, Some(0));
    // One node is being replaced (no pod): nothing more until it is available.
    let p = plan(&d, "new", &nodes, &old[1..], true, now());
    assert_eq!(p.create_on, ["a"]);
    assert!(p.delete.is_empty());
    let unready = [
        pod(
            "na",
            "a",
            "new",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        ),
        old[1].clone(),
        old[2].clone(),
    ];
    let p = plan(&d, "new", &nodes, &unready, true, now());
    assert!(p.delete.is_empty() && p.create_on.is_empty());
    let ready = [pod("na", "a", "new", json!({})), old[1].clone(), old[2].clone()];
    assert_eq!(plan(&d, "new", &nodes, &ready, true, now()).delete.len(), 1);
    // OnDelete: old pods stay.
    let on_delete = ds(json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}));
    assert!(
        plan(&on_delete, "new", &nodes, &old, true, now())
            .delete
            .is_empty()
    );
}

#[test]
fn rolling_update_with_surge_starts_the_new_pod_first() {
    let d = ds(json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}}}));
    let nodes = [node("a", json!({})), node("b", json!({}))];
    let old = [pod("pa", "a", "old", json!({})), pod("pb", "b", "old", json!({}))];
    let p = plan(&d, "new", &nodes, &old, true, now());
    assert_eq!(p.create_on.len(), 1, "{:?}", p.create_on);
    assert!(p.delete.is_empty());
    // The new pod on a is available: the old one goes.
    let surged = [pod("na", "a", "new", json!({})), old[0].clone(), old[1].clone()];
    let p = plan(&d, "new", &nodes, &surged, true, now());
    assert_eq!(names(&p.delete), ["pa"]);
}

#[test]
fn history_creates_reuses_or_renumbers_revisions() {
    let d1 = ds(json!({}));
    let d2 = ds(json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "agent:2"}]}}}}));
    let plan1 = history_plan(&d1, &[]);
    let Err(r1) = plan1.current else {
        panic!("expected a new revision")
    };
    assert_eq!(r1.revision, 1);
    let hash = r1
        .metadata
        .labels
        .as_ref()
        .map(|l| l[HASH_LABEL].clone())
        .expect("hash label");
    assert_eq!(
        r1.metadata.name.as_deref(),
        Some(format!("agent-{hash}").as_str())
    );
    let r1 = Arc::new(r1);
    let r2 = Arc::new(new_revision(&d2, 2));
    let hist = [r1.clone(), r2.clone()];
    let p = history_plan(&d2, &hist);
    assert!(matches!(&p.current, Ok((r, None)) if r.metadata.name == r2.metadata.name));
    assert_eq!(p.old.len(), 1);
    // Rollback to d1's template: revision 1 becomes 3.
    let p = history_plan(&d1, &hist);
    assert!(matches!(&p.current, Ok((r, Some(3))) if r.metadata.name == r1.metadata.name));
}
