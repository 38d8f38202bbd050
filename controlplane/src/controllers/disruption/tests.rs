//! Table tests of the PodDisruptionBudget status (docs/SEEDS-SPEC.md CTL-44, CTL-47).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::reconcile::*;

fn at(secs: i64) -> DateTime<Utc> {
    "2026-06-01T12:00:00Z".parse::<DateTime<Utc>>().expect("time") + chrono::Duration::seconds(secs)
}

fn pdb(spec: Value, status: Value) -> PodDisruptionBudget {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": "web"}});
    serde_json::from_value(
        json!({"metadata": {"name": "web", "namespace": "default", "generation": 2},
        "spec": spec, "status": status}),
    )
    .expect("pdb")
}

fn pod(name: &str, ready: bool, owner: Option<&str>) -> Arc<Pod> {
    let refs = owner.map(|uid| {
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": true}])
    });
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default",
            "labels": {"app": "web"}, "ownerReferences": refs},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
        .expect("pod"),
    )
}

fn deployment_of_ten() -> HashMap<String, Scale> {
    // Two ReplicaSets of one Deployment: its replicas count once.
    HashMap::from([
        (
            "rs-old".to_string(),
            Scale::Found {
                uid: "deploy".into(),
                replicas: 10,
            },
        ),
        (
            "rs-new".to_string(),
            Scale::Found {
                uid: "deploy".into(),
                replicas: 10,
            },
        ),
    ])
}

#[test]
fn percentages_round_up() {
    let s = |v: &str| IntOrString::String(v.into());
    assert_eq!(scaled(&s("50%"), 3), Ok(2));
    assert_eq!(scaled(&s("10%"), 1), Ok(1));
    assert_eq!(scaled(&s("0%"), 7), Ok(0));
    assert_eq!(scaled(&s("100%"), 7), Ok(7));
    assert_eq!(scaled(&IntOrString::Int(4), 100), Ok(4));
    assert_eq!(scaled(&s("half"), 4), Err(PdbError::NotPercentage));
}

#[test]
fn expected_pods_come_from_the_owners_replicas() {
    let pods = vec![
        pod("a", true, Some("rs-old")),
        pod("b", true, Some("rs-new")),
        pod("c", false, Some("rs-new")),
    ];
    let scales = deployment_of_ten();
    let pct = pdb(json!({"minAvailable": "50%"}), json!(null));
    assert_eq!(
        expected_pods(&pct, &pods, &scales),
        Ok(Expected {
            expected: 10,
            desired: 5,
            unmanaged: vec![]
        })
    );
    let max = pdb(json!({"maxUnavailable": "25%"}), json!(null));
    assert_eq!(
        expected_pods(&max, &pods, &scales).map(|e| (e.expected, e.desired)),
        Ok((10, 7)),
        "ceil(2.5) = 3 unavailable"
    );
    // An integer minAvailable counts the pods themselves, owner or not.
    let int = pdb(json!({"minAvailable": 2}), json!(null));
    let loose = vec![pod("x", true, None), pod("y", true, None)];
    assert_eq!(
        expected_pods(&int, &loose, &HashMap::new()).map(|e| (e.expected, e.desired)),
        Ok((2, 2))
    );
    // Percentages need the owners: a pod without one is unmanaged, one whose owner is gone an
    // error.
    let mixed = vec![pod("a", true, Some("rs-old")), pod("x", true, None)];
    assert_eq!(
        expected_pods(&pct, &mixed, &scales).map(|e| e.unmanaged),
        Ok(vec!["x".to_string()])
    );
    let orphan = vec![pod("z", true, Some("gone"))];
    assert_eq!(
        expected_pods(&pct, &orphan, &HashMap::from([("gone".into(), Scale::Missing)])),
        Err(PdbError::NoController("z".into()))
    );
    assert_eq!(
        PdbError::NoController("z".into()).to_string(),
        "found no controllers for pod \"z\""
    );
}

#[test]
fn status_counts_healthy_pods_and_allows_the_difference() {
    let pods = vec![
        pod("a", true, Some("rs-new")),
        pod("b", true, Some("rs-new")),
        pod("c", true, Some("rs-new")),
        pod("d", false, Some("rs-new")),
    ];
    let budget = pdb(json!({"minAvailable": 2}), json!(null));
    let (disrupted, recheck, _) = disrupted_pods(&budget, &pods, at(0));
    assert!(disrupted.is_empty() && recheck.is_none());
    let current = current_healthy(&pods, &disrupted, at(0));
    assert_eq!(current, 3);
    let status = next_status(&budget, current, 2, 4, disrupted, at(0)).expect("new status");
    assert_eq!(
        (
            status.current_healthy,
            status.desired_healthy,
            status.expected_pods,
            status.disruptions_allowed
        ),
        (3, 2, 4, 1)
    );
    assert_eq!(status.observed_generation, Some(2));
    let cond = &status.conditions.as_ref().expect("conditions")[0];
    assert_eq!(
        (cond.type_.as_str(), cond.status.as_str(), cond.reason.as_str()),
        ("DisruptionAllowed", "True", "SufficientPods")
    );
    // Written once: the same numbers write nothing.
    let current_pdb = pdb(
        json!({"minAvailable": 2}),
        serde_json::to_value(&status).expect("json"),
    );
    assert!(next_status(&current_pdb, 3, 2, 4, BTreeMap::new(), at(5)).is_none());
    // No pods expected yet: no disruption, whatever the numbers.
    let none = next_status(&budget, 3, 0, 0, BTreeMap::new(), at(0)).expect("status");
    assert_eq!(none.disruptions_allowed, 0);
    assert_eq!(none.conditions.expect("conditions")[0].reason, "InsufficientPods");
}

#[test]
fn disrupted_pods_count_as_gone_for_two_minutes() {
    let pods = vec![pod("a", true, None), pod("b", true, None)];
    let budget = pdb(
        json!({"minAvailable": 1}),
        json!({"disruptedPods": {"a": "2026-06-01T12:00:00Z", "gone": "2026-06-01T12:00:00Z"},
               "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2, "disruptionsAllowed": 0}),
    );
    let (disrupted, recheck, not_deleted) = disrupted_pods(&budget, &pods, at(60));
    assert_eq!(
        disrupted.keys().collect::<Vec<_>>(),
        ["a"],
        "a pod that no longer exists is dropped"
    );
    assert_eq!(recheck, Some(at(120)));
    assert!(not_deleted.is_empty());
    assert_eq!(current_healthy(&pods, &disrupted, at(60)), 1);
    let (after, _, not_deleted) = disrupted_pods(&budget, &pods, at(121));
    assert!(after.is_empty());
    assert_eq!(not_deleted.len(), 1, "a was expected to be deleted but was not");
    assert_eq!(current_healthy(&pods, &after, at(121)), 2);
}

#[test]
fn a_failed_sync_allows_no_disruption() {
    let budget = pdb(
        json!({"minAvailable": "50%"}),
        json!({"disruptionsAllowed": 3, "currentHealthy": 4, "desiredHealthy": 1, "expectedPods": 4,
               "observedGeneration": 2}),
    );
    let st = fail_safe_status(&budget, "found no controllers for pod \"z\"", at(0));
    assert_eq!(st.disruptions_allowed, 0);
    let c = &st.conditions.expect("conditions")[0];
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("False", "SyncFailed", "found no controllers for pod \"z\"")
    );
}

#[test]
fn stale_disruption_conditions_wait_two_minutes() {
    let marked: Pod =
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": {"phase": "Running",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                        "lastTransitionTime": "2026-06-01T12:00:00Z"}]}}))
        .expect("pod");
    assert_eq!(
        stale_disruption_in(&marked, at(30)),
        Some(Duration::from_secs(90))
    );
    assert_eq!(stale_disruption_in(&marked, at(200)), Some(Duration::ZERO));
    let mut deleting = marked.clone();
    deleting.metadata.deletion_timestamp = Some(Time(at(0)));
    assert_eq!(stale_disruption_in(&deleting, at(200)), None);
}

#[test]
fn selectors_print_as_go_does() {
    let b = pdb(json!({}), json!(null));
    assert_eq!(
        go_selector(b.spec.as_ref().and_then(|s| s.selector.as_ref())),
        "&LabelSelector{MatchLabels:map[string]string{app: web,},MatchExpressions:[]LabelSelectorRequirement{},}"
    );
}
