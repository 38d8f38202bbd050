//! Table tests of the taint eviction decision (docs/SEEDS-SPEC.md CTL-40).

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::{Pod, Taint};
use serde_json::{Value, json};

use super::reconcile::{Decision, Planned, decide};

fn at(secs: i64) -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse::<DateTime<Utc>>().expect("time") + Duration::seconds(secs)
}

fn pod(tolerations: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}], "tolerations": tolerations}}))
    .expect("pod")
}

fn taints(v: Value) -> Vec<Taint> {
    serde_json::from_value(v).expect("taints")
}

fn unreachable() -> Vec<Taint> {
    taints(json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]))
}

fn tolerate_unreachable(seconds: Value) -> Value {
    json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": seconds}])
}

#[test]
fn an_untolerated_noexecute_taint_evicts_at_once() {
    let t = unreachable();
    assert_eq!(
        decide(&pod(json!([])), Some(&t), None, at(0)),
        Decision::Evict { cancelled: false }
    );
    // NoSchedule taints do not evict.
    let soft = taints(json!([{"key": "dedicated", "effect": "NoSchedule"}]));
    assert_eq!(decide(&pod(json!([])), Some(&soft), None, at(0)), Decision::Keep);
    // Once done, not again until cancelled.
    assert_eq!(
        decide(&pod(json!([])), Some(&t), Some(Planned::Done), at(5)),
        Decision::Keep
    );
}

#[test]
fn toleration_seconds_delay_the_eviction() {
    let t = unreachable();
    let p = pod(tolerate_unreachable(json!(5)));
    let planned = match decide(&p, Some(&t), None, at(0)) {
        Decision::Wait { created, fire } => {
            assert_eq!((created, fire), (at(0), at(5)));
            Planned::At { created, fire }
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(
        decide(&p, Some(&t), Some(planned), at(3)),
        Decision::Wait {
            created: at(0),
            fire: at(5)
        }
    );
    assert_eq!(
        decide(&p, Some(&t), Some(planned), at(5)),
        Decision::Evict { cancelled: false }
    );
    // A longer toleration later keeps the planned time (upstream keeps the first timer).
    let longer = pod(tolerate_unreachable(json!(60)));
    assert_eq!(
        decide(&longer, Some(&t), Some(planned), at(3)),
        Decision::Wait {
            created: at(0),
            fire: at(5)
        }
    );
    // Zero or negative seconds: no time at all.
    assert_eq!(
        decide(&pod(tolerate_unreachable(json!(0))), Some(&t), None, at(0)),
        Decision::Evict { cancelled: false }
    );
    // The node vanished: the planned deletion still happens on time.
    assert_eq!(
        decide(&p, None, Some(planned), at(6)),
        Decision::Evict { cancelled: false }
    );
}

#[test]
fn the_shortest_used_toleration_counts() {
    let two = taints(
        json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                            {"key": "maintenance", "effect": "NoExecute"}]),
    );
    let p = pod(json!([
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "maintenance", "operator": "Exists", "tolerationSeconds": 30},
        {"operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 1}
    ]));
    assert_eq!(
        decide(&p, Some(&two), None, at(0)),
        Decision::Wait {
            created: at(0),
            fire: at(30)
        }
    );
    // Without seconds a toleration holds for ever.
    let forever = pod(json!([{"operator": "Exists"}]));
    assert_eq!(decide(&forever, Some(&two), None, at(0)), Decision::Keep);
}

#[test]
fn removing_the_taint_or_the_toleration_in_time_changes_the_plan() {
    let t = unreachable();
    let planned = Planned::At {
        created: at(0),
        fire: at(300),
    };
    let p = pod(tolerate_unreachable(json!(300)));
    assert_eq!(
        decide(&p, Some(&[]), Some(planned), at(10)),
        Decision::Cancel,
        "taint removed"
    );
    let forever = pod(json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]));
    assert_eq!(
        decide(&forever, Some(&t), Some(planned), at(10)),
        Decision::Cancel,
        "tolerated for ever now"
    );
    assert_eq!(
        decide(&pod(json!([])), Some(&t), Some(planned), at(10)),
        Decision::Evict { cancelled: true },
        "the toleration was removed: evicted now, the planned deletion replaced"
    );
    assert_eq!(
        decide(&p, Some(&[]), Some(Planned::Done), at(10)),
        Decision::Cancel,
        "a done eviction is forgotten too (silently)"
    );
}
