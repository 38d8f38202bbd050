//! Table tests of the Deployment decision (docs/SEEDS-SPEC.md CTL-4..CTL-16).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use super::hash::compute_hash;
use super::reconcile::{
    self, DESIRED_REPLICAS, MAX_REPLICAS, Plan, REVISION, REVISION_HISTORY, Step, plan, resolve_fenceposts,
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

fn template(image: &str) -> Value {
    json!({"metadata": {"labels": {"app": "web"}},
           "spec": {"containers": [{"name": "web", "image": image}], "restartPolicy": "Always"}})
}

/// A Deployment `web` (uid d-uid, generation 1) of `image`, changed by `extra`.
fn deployment(replicas: i32, image: &str, extra: Value) -> Deployment {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "d-uid", "generation": 1},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": template(image), "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600,
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).expect("deployment")
}

fn tpl(image: &str) -> PodTemplateSpec {
    serde_json::from_value(template(image)).expect("template")
}

/// A ReplicaSet of `d` for `image` at `revision` with `replicas` (all available), created
/// `minutes` before now.
fn rs(image: &str, revision: i64, replicas: i32, available: i32, minutes: i64) -> Arc<ReplicaSet> {
    let hash = compute_hash(&tpl(image), None);
    let created = now() - chrono::Duration::minutes(minutes);
    let mut t = template(image);
    t["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{hash}"), "namespace": "default", "uid": format!("uid-{image}"),
                         "resourceVersion": "1", "creationTimestamp": created.to_rfc3339(),
                         "labels": {"app": "web", "pod-template-hash": hash},
                         "annotations": {REVISION: revision.to_string(), DESIRED_REPLICAS: "10", MAX_REPLICAS: "13"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                              "uid": "d-uid", "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web", "pod-template-hash": hash}},
                     "template": t},
            "status": {"replicas": replicas, "readyReplicas": available, "availableReplicas": available,
                       "observedGeneration": 1},
        }))
        .expect("rs"),
    )
}

fn with_annotations(rs: &ReplicaSet, desired: i32, max: i32) -> Arc<ReplicaSet> {
    let mut rs = rs.clone();
    let a = rs.metadata.annotations.get_or_insert_default();
    a.insert(DESIRED_REPLICAS.into(), desired.to_string());
    a.insert(MAX_REPLICAS.into(), max.to_string());
    Arc::new(rs)
}

fn updates(p: &Plan) -> Vec<(String, i32)> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Update { name, replicas, .. } => Some((name.clone(), *replicas)),
            _ => None,
        })
        .collect()
}

fn events(p: &Plan) -> Vec<String> {
    p.steps
        .iter()
        .filter_map(|s| match s {
            Step::Event(e) => Some(format!("{} {}", e.reason, e.message)),
            _ => None,
        })
        .collect()
}

fn created(p: &Plan) -> Option<&ReplicaSet> {
    p.steps.iter().find_map(|s| match s {
        Step::Create(rs) => Some(&**rs),
        _ => None,
    })
}

fn condition(p: &Plan, type_: &str) -> (String, String, String) {
    let c = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", p.status));
    (
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    )
}

fn name_of(image: &str) -> String {
    format!("web-{}", compute_hash(&tpl(image), None))
}

#[test]
fn fence_posts_round_surge_up_and_unavailable_down() {
    let pct = |s: &str| IntOrString::String(s.into());
    let cases = [
        // (surge, unavailable, desired) -> (surge, unavailable)
        (pct("25%"), pct("25%"), 2, (1, 0)),
        (pct("25%"), pct("25%"), 10, (3, 2)),
        (pct("25%"), pct("25%"), 4, (1, 1)),
        (pct("25%"), IntOrString::Int(0), 10, (3, 0)),
        (pct("0%"), pct("1%"), 2, (0, 1)),
        (IntOrString::Int(0), IntOrString::Int(0), 3, (0, 1)),
        (pct("1%"), pct("25%"), 1, (1, 0)),
        (IntOrString::Int(2), pct("50%"), 3, (2, 1)),
    ];
    for (surge, unavailable, desired, want) in cases {
        assert_eq!(
            resolve_fenceposts(Some(&surge), Some(&unavailable), desired),
            want,
            "{surge:?} {unavailable:?} of {desired}"
        );
    }
}

#[test]
fn pod_template_hash_is_stable_and_changes_with_the_template_and_collisions() {
    let h = compute_hash(&tpl("nginx:1"), None);
    assert_eq!(h, compute_hash(&tpl("nginx:1"), None));
    assert!(!h.is_empty() && h.len() <= 10, "{h}");
    assert!(
        h.chars().all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
        "{h}"
    );
    assert_ne!(h, compute_hash(&tpl("nginx:2"), None));
    assert_ne!(h, compute_hash(&tpl("nginx:1"), Some(1)));
    assert_ne!(
        compute_hash(&tpl("nginx:1"), Some(1)),
        compute_hash(&tpl("nginx:1"), Some(2))
    );
    // Key order and empty lists/maps do not matter (the manager decodes protobuf).
    let reordered: PodTemplateSpec = serde_json::from_value(json!({
        "spec": {"restartPolicy": "Always", "volumes": [], "containers": [{"image": "nginx:1", "name": "web", "env": []}]},
        "metadata": {"labels": {"app": "web"}, "annotations": {}}}))
    .expect("template");
    assert_eq!(h, compute_hash(&reordered, None));
}

#[test]
fn a_new_deployment_creates_its_first_replica_set() {
    let d = deployment(2, "nginx:1", json!({}));
    let p = plan(&d, &[], &[], now());
    let rs = created(&p).expect("a new replica set");
    let hash = compute_hash(&tpl("nginx:1"), None);
    assert_eq!(rs.metadata.name.as_deref(), Some(format!("web-{hash}").as_str()));
    let annotations = rs.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(DESIRED_REPLICAS).map(String::as_str), Some("2"));
    assert_eq!(
        annotations.get(MAX_REPLICAS).map(String::as_str),
        Some("3"),
        "25% of 2 rounds up to 1"
    );
    assert_eq!(annotations.get(REVISION).map(String::as_str), Some("1"));
    let spec = rs.spec.clone().expect("spec");
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(
        spec.selector
            .match_labels
            .unwrap_or_default()
            .get("pod-template-hash"),
        Some(&hash)
    );
    let labels = spec
        .template
        .and_then(|t| t.metadata)
        .and_then(|m| m.labels)
        .unwrap_or_default();
    assert_eq!(labels.get("pod-template-hash"), Some(&hash));
    assert_eq!(labels.get("app").map(String::as_str), Some("web"));
    let owner = &rs.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Deployment", "d-uid", Some(true))
    );
    assert_eq!(
        events(&p),
        [format!(
            "ScalingReplicaSet Scaled up replica set web-{hash} from 0 to 2"
        )]
    );
    assert!(p.steps.contains(&Step::SetRevision("1".into())));
    assert_eq!(
        condition(&p, "Progressing"),
        (
            "True".into(),
            "NewReplicaSetCreated".into(),
            format!("Created new replica set \"web-{hash}\"")
        )
    );
    assert_eq!(condition(&p, "Available").1, "MinimumReplicasUnavailable");
}

#[test]
fn change_cause_is_copied_but_not_the_revision_annotations() {
    let d = deployment(
        1,
        "nginx:1",
        json!({"metadata": {"annotations": {"kubernetes.io/change-cause": "first", REVISION: "7",
        "kubectl.kubernetes.io/last-applied-configuration": "{}"}}}),
    );
    let p = plan(&d, &[], &[], now());
    let a = created(&p)
        .and_then(|rs| rs.metadata.annotations.clone())
        .unwrap_or_default();
    assert_eq!(
        a.get("kubernetes.io/change-cause").map(String::as_str),
        Some("first")
    );
    assert_eq!(a.get(REVISION).map(String::as_str), Some("1"));
    assert!(!a.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
}

#[test]
fn rolling_update_of_10_replicas_with_25_percent_surge_runs_13_pods() {
    // CTL-12: replicas 10, maxSurge 25%, maxUnavailable 0: up to 13 pods, never fewer than 10
    // available.
    let d = deployment(
        10,
        "nginx:2",
        json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}}}}),
    );
    let old = rs("nginx:1", 1, 10, 10, 60);
    let p = plan(&d, std::slice::from_ref(&old), &[], now());
    let new = created(&p).expect("new replica set");
    assert_eq!(
        new.spec.as_ref().and_then(|s| s.replicas),
        Some(3),
        "10 + 3 = 13 pods"
    );
    let a = new.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(a.get(REVISION).map(String::as_str), Some("2"));
    assert_eq!(a.get(MAX_REPLICAS).map(String::as_str), Some("13"));
    assert!(
        updates(&p).is_empty(),
        "no old pod goes before new ones are available"
    );
    // The new pods are not available yet: nothing moves.
    let new_rs = |available: i32| {
        let mut r = (*rs("nginx:2", 2, 3, available, 1)).clone();
        r.metadata.annotations = new.metadata.annotations.clone();
        Arc::new(r)
    };
    let p = plan(&d, &[old.clone(), new_rs(0)], &[], now());
    assert!(updates(&p).is_empty(), "{:?}", p.steps);
    // Three available: three old ones go.
    let p = plan(&d, &[old.clone(), new_rs(3)], &[], now());
    assert_eq!(updates(&p), [(name_of("nginx:1"), 7)]);
    assert_eq!(
        events(&p),
        [format!(
            "ScalingReplicaSet Scaled down replica set {} from 10 to 7",
            name_of("nginx:1")
        )]
    );
    assert_eq!(
        condition(&p, "Progressing").1,
        "ReplicaSetUpdated",
        "{:?}",
        p.status
    );
}

#[test]
fn one_step_per_sync_scale_up_first() {
    let d = deployment(4, "nginx:2", json!({}));
    // max surge 1, max unavailable 1.
    let old = with_annotations(&rs("nginx:1", 1, 3, 3, 60), 4, 5);
    let new = with_annotations(&rs("nginx:2", 2, 1, 1, 1), 4, 5);
    let p = plan(&d, &[old, new], &[], now());
    // 4 pods of 5 allowed: the new set grows by one; the old one waits for the next sync.
    assert_eq!(updates(&p), [(name_of("nginx:2"), 2)]);
}

#[test]
fn unhealthy_old_replicas_go_first() {
    let d = deployment(4, "nginx:2", json!({}));
    // Old: 4 replicas, only 2 available; new: 1 of 1 available.
    let old = with_annotations(&rs("nginx:1", 1, 4, 2, 60), 4, 5);
    let new = with_annotations(&rs("nginx:2", 2, 1, 1, 1), 4, 5);
    let p = plan(&d, &[old, new], &[], now());
    // 5 pods, minAvailable 3, new unavailable 0: 2 may go, both unhealthy ones.
    assert_eq!(updates(&p), [(name_of("nginx:1"), 2)]);
}

#[test]
fn an_old_set_with_more_available_than_its_size_is_never_scaled_up() {
    // Seen live: the old set scaled to 1 still has 2 available pods (its controller has not
    // deleted the surplus yet); the new set is at its full size. Upstream's cleanup step
    // refuses to "scale down" 1 -> 2; nothing may grow the old set.
    let d = deployment(4, "nginx:2", json!({}));
    let mut old = (*with_annotations(&rs("nginx:1", 1, 1, 2, 60), 4, 5)).clone();
    old.status.get_or_insert_default().replicas = 2;
    let new = with_annotations(&rs("nginx:2", 2, 4, 3, 1), 4, 5);
    let p = plan(&d, &[Arc::new(old), new], &[], now());
    assert!(
        updates(&p)
            .iter()
            .all(|(name, size)| name != &name_of("nginx:1") || *size <= 1),
        "{:?}",
        updates(&p)
    );
    assert!(
        !events(&p).iter().any(|e| e.contains("Scaled up")),
        "{:?}",
        events(&p)
    );
}

#[test]
fn rollout_completes_and_reports_new_replica_set_available() {
    let d = deployment(
        3,
        "nginx:2",
        json!({"status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3,
        "readyReplicas": 3, "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
        "lastUpdateTime": "2026-06-01T11:59:00Z", "lastTransitionTime": "2026-06-01T11:50:00Z"}]}}),
    );
    let old = with_annotations(&rs("nginx:1", 1, 0, 0, 60), 3, 4);
    let new = with_annotations(&rs("nginx:2", 2, 3, 3, 1), 3, 4);
    let p = plan(&d, &[old, new], &[], now());
    assert!(updates(&p).is_empty());
    assert_eq!(
        condition(&p, "Progressing"),
        (
            "True".into(),
            "NewReplicaSetAvailable".into(),
            format!(
                "ReplicaSet \"{}\" has successfully progressed.",
                name_of("nginx:2")
            )
        )
    );
    assert_eq!(
        condition(&p, "Available"),
        (
            "True".into(),
            "MinimumReplicasAvailable".into(),
            "Deployment has minimum availability.".into()
        )
    );
}

#[test]
fn rollback_to_an_old_template_reuses_its_replica_set_with_the_next_revision() {
    // Revisions 1 (nginx:1) and 2 (nginx:2); the template is nginx:1 again.
    let d = deployment(3, "nginx:1", json!({}));
    let r1 = with_annotations(&rs("nginx:1", 1, 0, 0, 60), 3, 4);
    let r2 = with_annotations(&rs("nginx:2", 2, 3, 3, 30), 3, 4);
    let p = plan(&d, &[r1, r2], &[], now());
    assert!(created(&p).is_none(), "no new set: the old one is the new one");
    let Some(Step::Update {
        name, annotations, ..
    }) = p.steps.first()
    else {
        panic!("{:?}", p.steps);
    };
    assert_eq!(name, &name_of("nginx:1"));
    assert_eq!(annotations.get(REVISION).map(String::as_str), Some("3"));
    assert_eq!(annotations.get(REVISION_HISTORY).map(String::as_str), Some("1"));
    // A second rollback appends to the history.
    let mut r = (*rs("nginx:2", 2, 0, 0, 30)).clone();
    r.metadata
        .annotations
        .get_or_insert_default()
        .insert(REVISION_HISTORY.into(), "1".into());
    let d3 = deployment(3, "nginx:2", json!({}));
    let r3 = rs("nginx:1", 3, 3, 3, 60);
    let p = plan(&d3, &[Arc::new(r), r3], &[], now());
    let Some(Step::Update { annotations, .. }) = p.steps.first() else {
        panic!("{:?}", p.steps);
    };
    assert_eq!(annotations.get(REVISION).map(String::as_str), Some("4"));
    assert_eq!(annotations.get(REVISION_HISTORY).map(String::as_str), Some("1,2"));
}

#[test]
fn a_paused_deployment_does_not_roll_out() {
    let d = deployment(
        3,
        "nginx:2",
        json!({"spec": {"paused": true}, "status": {"conditions": [{"type": "Progressing", "status": "True",
        "reason": "NewReplicaSetAvailable", "lastUpdateTime": "2026-06-01T11:00:00Z", "lastTransitionTime": "2026-06-01T11:00:00Z"}]}}),
    );
    let old = with_annotations(&rs("nginx:1", 1, 3, 3, 60), 3, 4);
    let p = plan(&d, std::slice::from_ref(&old), &[], now());
    assert!(created(&p).is_none());
    assert!(updates(&p).is_empty());
    assert_eq!(
        condition(&p, "Progressing"),
        (
            "Unknown".into(),
            "DeploymentPaused".into(),
            "Deployment is paused".into()
        )
    );
    // Resumed: the condition says so and the rollout starts.
    let mut resumed = d.clone();
    if let Some(s) = resumed.spec.as_mut() {
        s.paused = None;
    }
    resumed.status = p.status.clone();
    let p = plan(&resumed, &[old], &[], now());
    assert!(created(&p).is_some());
    // The new set's creation is the latest word on progress.
    assert_eq!(condition(&p, "Progressing").1, "NewReplicaSetCreated");
}

#[test]
fn resume_sets_deployment_resumed() {
    let d = deployment(
        3,
        "nginx:1",
        json!({"status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3,
        "unavailableReplicas": 3, "conditions": [{"type": "Progressing", "status": "Unknown",
        "reason": "DeploymentPaused", "lastUpdateTime": "2026-06-01T11:00:00Z", "lastTransitionTime": "2026-06-01T11:00:00Z"}]}}),
    );
    let cur = with_annotations(&rs("nginx:1", 1, 3, 0, 60), 3, 4);
    let p = plan(&d, &[cur], &[], now());
    assert_eq!(
        condition(&p, "Progressing"),
        (
            "Unknown".into(),
            "DeploymentResumed".into(),
            "Deployment is resumed".into()
        )
    );
}

#[test]
fn no_progress_past_the_deadline_is_progress_deadline_exceeded() {
    let status = |updated: &str| {
        json!({"status": {"observedGeneration": 1, "replicas": 4, "updatedReplicas": 1, "availableReplicas": 3,
        "readyReplicas": 3, "unavailableReplicas": 1, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability.",
             "lastUpdateTime": "2026-06-01T11:00:00Z", "lastTransitionTime": "2026-06-01T11:00:00Z"},
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
             "lastUpdateTime": updated, "lastTransitionTime": "2026-06-01T11:00:00Z"}]},
        "spec": {"progressDeadlineSeconds": 60}})
    };
    let old = with_annotations(&rs("nginx:1", 1, 3, 3, 60), 3, 4);
    let new = with_annotations(&rs("nginx:2", 2, 1, 0, 5), 3, 4);
    // 30 s since the last progress: not yet; look again when the deadline passes.
    let d = deployment(3, "nginx:2", status("2026-06-01T11:59:30Z"));
    let p = plan(&d, &[old.clone(), new.clone()], &[], now());
    assert!(p.status.is_none(), "{:?}", p.status);
    assert_eq!(p.requeue_after, Some(std::time::Duration::from_secs(31)));
    // 61 s: timed out, counted from the last progress.
    let d = deployment(3, "nginx:2", status("2026-06-01T11:58:59Z"));
    let p = plan(&d, &[old, new], &[], now());
    assert_eq!(
        condition(&p, "Progressing"),
        (
            "False".into(),
            "ProgressDeadlineExceeded".into(),
            format!("ReplicaSet \"{}\" has timed out progressing.", name_of("nginx:2"))
        )
    );
}

#[test]
fn scaling_mid_rollout_is_proportional() {
    // 10 replicas mid-rollout (old 8, new 5 of max 13), scaled to 20: 12 more, shared by size.
    let d = deployment(20, "nginx:2", json!({}));
    let old = with_annotations(&rs("nginx:1", 1, 8, 8, 60), 10, 13);
    let new = with_annotations(&rs("nginx:2", 2, 5, 0, 5), 10, 13);
    let p = plan(&d, &[old, new], &[], now());
    let mut u = updates(&p);
    u.sort();
    let mut want = vec![(name_of("nginx:1"), 15), (name_of("nginx:2"), 10)];
    want.sort();
    assert_eq!(u, want);
    assert!(
        events(&p)
            .iter()
            .all(|e| e.starts_with("ScalingReplicaSet Scaled up"))
    );
}

#[test]
fn a_single_active_set_takes_a_scale_change() {
    let d = deployment(5, "nginx:1", json!({}));
    let cur = with_annotations(&rs("nginx:1", 1, 3, 3, 60), 3, 4);
    let p = plan(&d, &[cur], &[], now());
    assert_eq!(updates(&p), [(name_of("nginx:1"), 5)]);
    let Some(Step::Update { annotations, .. }) = p.steps.iter().find(|s| matches!(s, Step::Update { .. }))
    else {
        panic!();
    };
    assert_eq!(annotations.get(DESIRED_REPLICAS).map(String::as_str), Some("5"));
    assert_eq!(annotations.get(MAX_REPLICAS).map(String::as_str), Some("7"));
    assert_eq!(
        events(&p),
        [format!(
            "ScalingReplicaSet Scaled up replica set {} from 3 to 5",
            name_of("nginx:1")
        )]
    );
}

#[test]
fn recreate_waits_for_the_old_pods_to_be_gone() {
    let d = deployment(
        2,
        "nginx:2",
        json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null}}}),
    );
    let old = with_annotations(&rs("nginx:1", 1, 2, 2, 60), 2, 2);
    // First the old set goes to zero, nothing new yet.
    let p = plan(&d, std::slice::from_ref(&old), &[], now());
    assert_eq!(updates(&p), [(name_of("nginx:1"), 0)]);
    assert!(created(&p).is_none());
    // At zero but a pod still terminating: wait.
    let mut empty = (*old).clone();
    if let Some(s) = empty.spec.as_mut() {
        s.replicas = Some(0);
    }
    empty.status = Some(Default::default());
    let empty = Arc::new(empty);
    let pod: Arc<Pod> = Arc::new(
        serde_json::from_value(json!({"metadata": {"name": "old-pod", "namespace": "default",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "uid-nginx:1", "controller": true}]},
            "status": {"phase": "Running"}}))
        .expect("pod"),
    );
    let p = plan(&d, std::slice::from_ref(&empty), &[pod], now());
    assert!(created(&p).is_none());
    // Gone: the new set at full size at once.
    let p = plan(&d, &[empty], &[], now());
    let new = created(&p).expect("new set");
    assert_eq!(new.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let a = new.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(a.get(MAX_REPLICAS).map(String::as_str), Some("2"));
}

#[test]
fn history_beyond_the_limit_is_deleted_oldest_revision_first() {
    let d = deployment(
        3,
        "nginx:4",
        json!({"spec": {"revisionHistoryLimit": 1}, "status": {"observedGeneration": 1, "replicas": 3,
        "updatedReplicas": 3, "availableReplicas": 3}}),
    );
    let sets = vec![
        rs("nginx:1", 1, 0, 0, 60),
        rs("nginx:2", 2, 0, 0, 50),
        rs("nginx:3", 3, 0, 0, 40),
        with_annotations(&rs("nginx:4", 4, 3, 3, 30), 3, 4),
    ];
    let p = plan(&d, &sets, &[], now());
    let deleted: Vec<&str> = p
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Delete { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, [name_of("nginx:1"), name_of("nginx:2")]);
}

#[test]
fn orphans_matching_the_selector_are_adopted() {
    let d = deployment(3, "nginx:1", json!({}));
    let mut orphan = (*with_annotations(&rs("nginx:1", 1, 3, 3, 60), 3, 4)).clone();
    orphan.metadata.owner_references = None;
    let p = plan(&d, &[Arc::new(orphan)], &[], now());
    assert!(matches!(p.steps.first(), Some(Step::Adopt { uid, .. }) if uid == "uid-nginx:1"));
    assert!(created(&p).is_none(), "the adopted set is the new one");
}

#[test]
fn create_failure_condition_text() {
    let d = deployment(1, "nginx:1", json!({}));
    let c = reconcile::create_failed(&d, "web-abc", "quota exceeded", now()).expect("condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref(), c.message.as_deref()),
        (
            "False",
            Some("ReplicaSetCreateError"),
            Some("Failed to create new replica set \"web-abc\": quota exceeded")
        )
    );
}
