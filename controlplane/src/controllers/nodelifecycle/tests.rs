//! Table tests of the node lifecycle decisions (docs/SEEDS-SPEC.md CTL-39).

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::reconcile::*;

fn t0() -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse().expect("time")
}

fn at(secs: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(secs)
}

fn node(extra: Value) -> Node {
    let mut v = json!({
        "metadata": {"name": "n1", "uid": "u1", "creationTimestamp": "2026-06-01T11:00:00Z"},
        "spec": {},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-06-01T12:00:00Z", "lastTransitionTime": "2026-06-01T11:00:00Z"},
            {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": "2026-06-01T12:00:00Z",
             "lastTransitionTime": "2026-06-01T11:00:00Z"},
        ]},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).expect("node")
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

fn cfg() -> LifecycleConfig {
    LifecycleConfig::default()
}

#[test]
fn a_node_silent_past_the_grace_period_gets_unknown_conditions() {
    let n = node(json!({}));
    // First look at t0: heard from now.
    let first = observe(&n, Some(at(0)), None, at(0), &cfg());
    assert!(first.post.is_none());
    assert_eq!(first.health.probe, at(0));
    // Same heartbeat, same lease: 50 s of silence is still within the grace.
    let within = observe(&n, Some(at(0)), Some(&first.health), at(50), &cfg());
    assert!(within.post.is_none());
    let past = observe(&n, Some(at(0)), Some(&first.health), at(51), &cfg());
    assert_eq!(past.observed, "True");
    assert_eq!(past.current.as_deref(), Some("Unknown"));
    let post = past.post.expect("conditions to post");
    let by_type = |t: &str| post.iter().find(|c| c.type_ == t).expect("condition").clone();
    for t in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(by_type(t).status, "Unknown", "{t}");
    }
    let ready = by_type("Ready");
    assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(
        ready.message.as_deref(),
        Some("Kubelet stopped posting node status.")
    );
    assert_eq!(ready.last_transition_time.map(|t| t.0), Some(at(51)));
    assert_eq!(
        ready.last_heartbeat_time.map(|t| t.0),
        Some(at(0)),
        "the heartbeat stays the kubelet's"
    );
    let never = by_type("DiskPressure");
    assert_eq!(never.reason.as_deref(), Some("NodeStatusNeverUpdated"));
    assert_eq!(
        never.message.as_deref(),
        Some("Kubelet never posted node status.")
    );
}

#[test]
fn a_renewed_lease_or_heartbeat_counts_as_hearing_from_the_node() {
    let n = node(json!({}));
    let first = observe(&n, Some(at(0)), None, at(0), &cfg());
    let renewed = observe(&n, Some(at(40)), Some(&first.health), at(40), &cfg());
    assert_eq!(renewed.health.probe, at(40));
    assert!(
        observe(&n, Some(at(40)), Some(&renewed.health), at(80), &cfg())
            .post
            .is_none()
    );
    // Without a lease, a new Ready heartbeat does it.
    let beat = node(
        json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "lastHeartbeatTime": "2026-06-01T12:01:00Z", "lastTransitionTime": "2026-06-01T11:00:00Z"}]}}),
    );
    let seen = observe(&beat, None, Some(&first.health), at(60), &cfg());
    assert_eq!(seen.health.probe, at(60));
    assert_eq!(seen.health.ready_transition, at(0), "Ready did not transition");
    // Already Unknown: nothing more to post.
    let unknown = node(
        json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
        "lastHeartbeatTime": "2026-06-01T12:00:00Z", "lastTransitionTime": "2026-06-01T12:00:51Z"}]}}),
    );
    let h = observe(&unknown, None, None, at(60), &cfg());
    assert!(
        observe(&unknown, None, Some(&h.health), at(200), &cfg())
            .post
            .is_none()
    );
}

#[test]
fn a_node_that_never_posted_status_gets_the_startup_grace() {
    let n = node(
        json!({"metadata": {"creationTimestamp": "2026-06-01T12:00:00Z"}, "status": {"conditions": null}}),
    );
    let first = observe(&n, None, None, at(30), &cfg());
    assert_eq!(first.observed, "Unknown");
    assert!(first.post.is_none(), "60 s from creation");
    let late = observe(&n, None, Some(&first.health), at(61), &cfg());
    let post = late.post.expect("conditions");
    assert!(
        post.iter()
            .all(|c| c.reason.as_deref() == Some("NodeStatusNeverUpdated"))
    );
    assert_eq!(post.len(), 4);
}

#[test]
fn the_taint_follows_the_ready_status() {
    let plain = node(json!({}));
    assert_eq!(
        taint_action(&plain, "Unknown"),
        TaintAction::Queue {
            key: TAINT_UNREACHABLE
        }
    );
    assert_eq!(
        taint_action(&plain, "False"),
        TaintAction::Queue { key: TAINT_NOT_READY }
    );
    assert_eq!(taint_action(&plain, "True"), TaintAction::Reachable);
    let unreachable =
        node(json!({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}}));
    assert_eq!(
        taint_action(&unreachable, "False"),
        TaintAction::Swap {
            add: TAINT_NOT_READY,
            remove: TAINT_UNREACHABLE
        },
        "the two taints are exclusive: swapped at once"
    );
    let gone = node(
        json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "lastHeartbeatTime": null}]}}),
    );
    assert_eq!(noexecute_for(&gone), Some((TAINT_UNREACHABLE, TAINT_NOT_READY)));
    assert_eq!(noexecute_for(&plain), None, "ready again: no taint");
}

#[test]
fn noschedule_taints_mirror_the_conditions_and_cordon() {
    let lost = node(json!({"spec": {"unschedulable": true},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}, {"type": "DiskPressure", "status": "True"}]}}));
    let (add, remove) = noschedule_diff(&lost);
    let keys: Vec<&str> = add.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/disk-pressure",
            "node.kubernetes.io/unschedulable"
        ]
    );
    assert!(add.iter().all(|t| t.effect == "NoSchedule"));
    assert!(remove.is_empty());
    let back = node(json!({"spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}));
    let (add, remove) = noschedule_diff(&back);
    assert!(add.is_empty());
    assert_eq!(remove.len(), 1, "only our NoSchedule taint goes: {remove:?}");
    assert_eq!(remove[0].key, "node.kubernetes.io/unreachable");
}

#[test]
fn zone_states_and_their_rates() {
    let t = 0.55;
    assert_eq!(zone_state(&[true, true, false], t), (1, ZoneState::Normal));
    assert_eq!(zone_state(&[false, false], t), (2, ZoneState::FullDisruption));
    assert_eq!(
        zone_state(&[false, false, true, true], t),
        (2, ZoneState::Normal),
        "more than two must be down"
    );
    assert_eq!(
        zone_state(&[false, false, false, true, true], t),
        (3, ZoneState::PartialDisruption),
        "3/5 = 0.6 >= 0.55"
    );
    assert_eq!(
        zone_state(&[false, false, false, true, true, true], t),
        (3, ZoneState::Normal),
        "0.5 < 0.55"
    );
    let c = cfg();
    assert_eq!(zone_rate(ZoneState::Normal, 10, &c), 0.1);
    assert_eq!(
        zone_rate(ZoneState::PartialDisruption, 50, &c),
        0.0,
        "small cluster: evictions stop"
    );
    assert_eq!(zone_rate(ZoneState::PartialDisruption, 51, &c), 0.01);
    assert_eq!(zone_rate(ZoneState::FullDisruption, 5, &c), 0.1);
}

#[test]
fn all_zones_down_stops_evictions_and_one_node_back_resumes_them() {
    let c = cfg();
    let mut states = HashMap::new();
    let zones = |a: Vec<bool>, b: Vec<bool>| HashMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    assert_eq!(
        handle_disruption(&mut states, &zones(vec![true, true], vec![true]), &c),
        DisruptionChange::Rates(vec![("a".into(), 0.1), ("b".into(), 0.1)])
    );
    // One zone fully down: it keeps the normal rate.
    assert_eq!(
        handle_disruption(&mut states, &zones(vec![true, true], vec![false]), &c),
        DisruptionChange::Rates(vec![("b".into(), 0.1)])
    );
    assert_eq!(states["b"], ZoneState::FullDisruption);
    // Every zone down: a control-plane problem, no evictions.
    assert_eq!(
        handle_disruption(&mut states, &zones(vec![false, false], vec![false]), &c),
        DisruptionChange::Enter
    );
    assert_eq!(
        handle_disruption(&mut states, &zones(vec![false, false], vec![false]), &c),
        DisruptionChange::None
    );
    assert_eq!(
        handle_disruption(&mut states, &zones(vec![true, false], vec![false]), &c),
        DisruptionChange::Exit(vec![("a".into(), 0.1), ("b".into(), 0.1)])
    );
    // A small zone half down (3 of 5): evictions stop there.
    let mut states = HashMap::new();
    let five = HashMap::from([("z".to_string(), vec![false, false, false, true, true])]);
    assert_eq!(
        handle_disruption(&mut states, &five, &c),
        DisruptionChange::Rates(vec![("z".into(), 0.0)])
    );
}

#[test]
fn the_zone_queue_taints_one_node_per_ten_seconds() {
    let mut q = ZoneTainter::new(0.1, at(0));
    for n in ["a", "b", "c"] {
        assert!(q.add(n, at(0)));
    }
    assert!(!q.add("a", at(0)), "already queued");
    assert_eq!(q.next_due(at(0)).as_deref(), Some("a"));
    assert_eq!(q.next_due(at(0)), None);
    assert_eq!(q.next_due(at(9)), None);
    assert_eq!(q.next_due(at(10)).as_deref(), Some("b"));
    assert!(!q.add("a", at(10)), "a taken node stays a member");
    assert!(q.remove("c"));
    assert_eq!(q.next_due(at(30)), None);
    assert!(q.remove("a"));
    assert!(q.add("a", at(30)));
    // A zone whose rate is zero taints nothing.
    q.set_rate(0.0, at(30));
    assert_eq!(q.next_due(at(100)), None);
    // Back to a rate: the new bucket starts empty, as the stopped one was (upstream's
    // `SwapLimiter`).
    q.set_rate(0.1, at(100));
    assert_eq!(q.next_due(at(100)), None);
    assert_eq!(q.next_due(at(110)).as_deref(), Some("a"));
}

#[test]
fn zones_come_from_the_topology_labels() {
    let n = node(
        json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z1",
        "failure-domain.beta.kubernetes.io/region": "r1"}}}),
    );
    assert_eq!(zone_of(&n), "r1:\x00:z1");
    assert_eq!(zone_of(&node(json!({}))), "");
    let excluded = node(json!({"metadata": {"labels": {"node.kubernetes.io/exclude-disruption": ""}}}));
    assert!(!counts_for_zone(&excluded));
    let labels = labels_to_reconcile(&node(
        json!({"metadata": {"labels": {"kubernetes.io/os": "linux", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "arm64"}}}),
    ));
    assert_eq!(labels.len(), 1);
    assert_eq!(labels["beta.kubernetes.io/arch"], "arm64");
}
