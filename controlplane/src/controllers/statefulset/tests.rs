//! Table tests of the StatefulSet decision (docs/SEEDS-SPEC.md CTL-24..CTL-26).

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::{Value, json};

use super::reconcile::{
    REVISION_LABEL, RevisionStep, Step, claim_pods, current_revision, new_revision, plan, update_revision,
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

fn set(replicas: i32, extra: Value) -> StatefulSet {
    let mut v = json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "set-uid", "generation": 1},
        "spec": {"replicas": replicas, "serviceName": "web", "selector": {"matchLabels": {"app": "web"}},
                 "podManagementPolicy": "OrderedReady",
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}},
                 "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "nginx", "image": "nginx:1"}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]},
    });
    merge(&mut v, extra);
    serde_json::from_value(v).expect("set")
}

fn with_image(s: &StatefulSet, image: &str) -> StatefulSet {
    let mut s = s.clone();
    if let Some(spec) = s.spec.as_mut()
        && let Some(ps) = spec.template.spec.as_mut()
    {
        ps.containers[0].image = Some(image.into());
    }
    s
}

fn rev(s: &StatefulSet, n: i64) -> ControllerRevision {
    new_revision(s, n, 0)
}

fn rev_name(r: &ControllerRevision) -> String {
    r.metadata.name.clone().unwrap_or_default()
}

/// A pod of the set at `ordinal` and revision `revision`, Running and Ready unless `extra` says
/// otherwise.
fn pod(ordinal: i32, revision: &str, extra: Value) -> Arc<Pod> {
    let name = format!("web-{ordinal}");
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{ordinal}"),
                     "labels": {"app": "web", REVISION_LABEL: revision,
                                "statefulset.kubernetes.io/pod-name": name, "apps.kubernetes.io/pod-index": ordinal.to_string()},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "set-uid", "controller": true}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "nginx", "image": "nginx:1"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-06-01T11:00:00Z"}]},
    });
    merge(&mut v, extra);
    Arc::new(serde_json::from_value(v).expect("pod"))
}

fn claims(names: &[&str]) -> HashMap<String, Arc<PersistentVolumeClaim>> {
    names
        .iter()
        .map(|n| {
            let c: PersistentVolumeClaim =
                serde_json::from_value(json!({"metadata": {"name": n, "namespace": "default"}}))
                    .expect("pvc");
            (n.to_string(), Arc::new(c))
        })
        .collect()
}

fn run(
    s: &StatefulSet,
    pods: &[Arc<Pod>],
    cur: &ControllerRevision,
    upd: &ControllerRevision,
    pvcs: &[&str],
) -> super::reconcile::Plan {
    let c = claims(pvcs);
    plan(s, pods, cur, upd, &|n: &str| c.get(n).cloned(), now())
}

/// The steps as short strings: `claim data-web-0`, `create web-0@rev`, `delete web-2`, ...
fn steps(p: &super::reconcile::Plan) -> Vec<String> {
    p.steps
        .iter()
        .map(|s| match s {
            Step::CreateClaim { claim, .. } => {
                format!("claim {}", claim.metadata.name.clone().unwrap_or_default())
            }
            Step::CreatePod(p) => format!("create {}", p.metadata.name.clone().unwrap_or_default()),
            Step::DeletePod { name, .. } => format!("delete {name}"),
            Step::PatchPodLabels { name, .. } => format!("label {name}"),
            Step::SetClaimOwners { claim, owners } => format!(
                "owners {claim} {}",
                owners
                    .iter()
                    .map(|o| o.kind.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        })
        .collect()
}

#[test]
fn ordered_ready_creates_from_zero_up_each_after_the_previous_is_ready() {
    let s = set(3, json!({}));
    let r = rev(&s, 1);
    let n = rev_name(&r);
    let p = run(&s, &[], &r, &r, &[]);
    assert_eq!(
        steps(&p),
        ["claim data-web-0", "create web-0"],
        "one at a time, claim first"
    );
    let p = run(
        &s,
        &[pod(
            0,
            &n,
            json!({"status": {"phase": "Pending", "conditions": []}}),
        )],
        &r,
        &r,
        &["data-web-0"],
    );
    assert!(
        steps(&p).is_empty(),
        "web-1 waits for web-0 to be Running and Ready"
    );
    let p = run(&s, &[pod(0, &n, json!({}))], &r, &r, &["data-web-0"]);
    assert_eq!(steps(&p), ["claim data-web-1", "create web-1"]);
    let p = run(
        &s,
        &[pod(0, &n, json!({})), pod(1, &n, json!({}))],
        &r,
        &r,
        &["data-web-0", "data-web-1"],
    );
    assert_eq!(steps(&p), ["claim data-web-2", "create web-2"]);
    assert_eq!(p.status.replicas, 2);
    assert_eq!(p.status.ready_replicas, Some(2));
}

#[test]
fn parallel_creates_and_deletes_everything_at_once() {
    let s = set(3, json!({"spec": {"podManagementPolicy": "Parallel"}}));
    let r = rev(&s, 1);
    let p = run(&s, &[], &r, &r, &["data-web-0", "data-web-1", "data-web-2"]);
    assert!(p.parallel);
    assert_eq!(steps(&p), ["create web-0", "create web-1", "create web-2"]);
    let n = rev_name(&r);
    let s1 = set(1, json!({"spec": {"podManagementPolicy": "Parallel"}}));
    let pods = [
        pod(0, &n, json!({})),
        pod(1, &n, json!({})),
        pod(2, &n, json!({})),
    ];
    assert_eq!(
        steps(&run(&s1, &pods, &r, &r, &[])),
        ["delete web-2", "delete web-1"]
    );
}

#[test]
fn the_pod_gets_its_identity_and_claim_volumes() {
    let s = set(1, json!({}));
    let r = rev(&s, 1);
    let p = run(&s, &[], &r, &r, &["data-web-0"]);
    let Some(Step::CreatePod(pod)) = p.steps.first() else {
        panic!("no pod: {:?}", p.steps)
    };
    let spec = pod.spec.clone().expect("spec");
    assert_eq!(spec.hostname.as_deref(), Some("web-0"));
    assert_eq!(spec.subdomain.as_deref(), Some("web"));
    let vol = &spec.volumes.expect("volumes")[0];
    assert_eq!(vol.name, "data");
    assert_eq!(
        vol.persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str()),
        Some("data-web-0")
    );
    let labels = pod.metadata.labels.clone().expect("labels");
    assert_eq!(labels["statefulset.kubernetes.io/pod-name"], "web-0");
    assert_eq!(labels["apps.kubernetes.io/pod-index"], "0");
    assert_eq!(labels[REVISION_LABEL], rev_name(&r));
    assert_eq!(labels["app"], "web");
    let owner = &pod.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("StatefulSet", Some(true))
    );
}

#[test]
fn scale_down_goes_from_the_highest_ordinal_one_at_a_time() {
    let s = set(1, json!({}));
    let r = rev(&s, 1);
    let n = rev_name(&r);
    let pods = [
        pod(0, &n, json!({})),
        pod(1, &n, json!({})),
        pod(2, &n, json!({})),
    ];
    assert_eq!(steps(&run(&s, &pods, &r, &r, &[])), ["delete web-2"]);
    // web-2 terminating: wait for it before web-1.
    let going = [
        pod(0, &n, json!({})),
        pod(1, &n, json!({})),
        pod(
            2,
            &n,
            json!({"metadata": {"deletionTimestamp": "2026-06-01T11:59:00Z"}}),
        ),
    ];
    assert!(steps(&run(&s, &going, &r, &r, &[])).is_empty());
}

#[test]
fn rolling_update_replaces_from_the_highest_ordinal_down() {
    let old = set(3, json!({}));
    let r1 = rev(&old, 1);
    let n1 = rev_name(&r1);
    let new = with_image(&old, "nginx:2");
    let r2 = rev(&new, 2);
    let n2 = rev_name(&r2);
    assert_ne!(n1, n2);
    let pods = [
        pod(0, &n1, json!({})),
        pod(1, &n1, json!({})),
        pod(2, &n1, json!({})),
    ];
    let p = run(&new, &pods, &r1, &r2, &[]);
    assert_eq!(steps(&p), ["delete web-2"]);
    assert_eq!(
        p.status.current_replicas,
        Some(2),
        "upstream counts the deleted pod out"
    );
    // web-2 gone: it comes back under the same name at the update revision, with the new image.
    let p = run(&new, &pods[..2], &r1, &r2, &["data-web-2"]);
    let Some(Step::CreatePod(created)) = p.steps.first() else {
        panic!("{:?}", steps(&p))
    };
    assert_eq!(created.metadata.name.as_deref(), Some("web-2"));
    assert_eq!(
        created
            .metadata
            .labels
            .as_ref()
            .map(|l| l[REVISION_LABEL].clone()),
        Some(n2.clone())
    );
    assert_eq!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone())
            .as_deref(),
        Some("nginx:2")
    );
    // web-2 updated and ready: web-1 next.
    let pods = [
        pod(0, &n1, json!({})),
        pod(1, &n1, json!({})),
        pod(2, &n2, json!({})),
    ];
    assert_eq!(steps(&run(&new, &pods, &r1, &r2, &[])), ["delete web-1"]);
    // web-2 updated but not ready yet: wait.
    let pods = [
        pod(0, &n1, json!({})),
        pod(1, &n1, json!({})),
        pod(
            2,
            &n2,
            json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
        ),
    ];
    assert!(steps(&run(&new, &pods, &r1, &r2, &[])).is_empty());
    // All updated: the update revision becomes current.
    let pods = [
        pod(0, &n2, json!({})),
        pod(1, &n2, json!({})),
        pod(2, &n2, json!({})),
    ];
    let p = run(&new, &pods, &r1, &r2, &[]);
    assert!(steps(&p).is_empty());
    assert_eq!(p.status.current_revision, Some(n2.clone()));
    assert_eq!(
        (p.status.current_replicas, p.status.updated_replicas),
        (Some(3), Some(3))
    );
}

#[test]
fn partition_2_updates_only_web_2_and_recreates_below_it_at_the_current_revision() {
    let old = set(
        3,
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}}),
    );
    let r1 = rev(&old, 1);
    let n1 = rev_name(&r1);
    let new = with_image(&old, "nginx:2");
    let r2 = rev(&new, 2);
    let n2 = rev_name(&r2);
    let pods = [
        pod(0, &n1, json!({})),
        pod(1, &n1, json!({})),
        pod(2, &n2, json!({})),
    ];
    let p = run(&new, &pods, &r1, &r2, &[]);
    assert!(steps(&p).is_empty(), "{:?}", steps(&p));
    assert_eq!(p.status.updated_replicas, Some(1));
    assert_eq!(
        p.status.current_revision,
        Some(n1.clone()),
        "the rollout is partitioned"
    );
    // web-1 deleted by hand: it comes back at the current revision, with the old image.
    let p = run(
        &new,
        &[pod(0, &n1, json!({})), pod(2, &n2, json!({}))],
        &r1,
        &r2,
        &["data-web-1"],
    );
    let Some(Step::CreatePod(created)) = p.steps.first() else {
        panic!("{:?}", steps(&p))
    };
    assert_eq!(
        created
            .metadata
            .labels
            .as_ref()
            .map(|l| l[REVISION_LABEL].clone()),
        Some(n1)
    );
    assert_eq!(
        created
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone())
            .as_deref(),
        Some("nginx:1")
    );
}

#[test]
fn max_unavailable_deletes_that_many_at_once_and_on_delete_none() {
    let old = set(
        4,
        json!({"spec": {"podManagementPolicy": "Parallel", "updateStrategy": {"rollingUpdate": {"maxUnavailable": 2}}}}),
    );
    let r1 = rev(&old, 1);
    let n1 = rev_name(&r1);
    let new = with_image(&old, "nginx:2");
    let r2 = rev(&new, 2);
    let pods: Vec<_> = (0..4).map(|i| pod(i, &n1, json!({}))).collect();
    assert_eq!(
        steps(&run(&new, &pods, &r1, &r2, &[])),
        ["delete web-3", "delete web-2"]
    );
    let on_delete = {
        let mut s = new.clone();
        if let Some(u) = s.spec.as_mut().and_then(|s| s.update_strategy.as_mut()) {
            u.type_ = Some("OnDelete".into());
            u.rolling_update = None;
        }
        s
    };
    assert!(steps(&run(&on_delete, &pods, &r1, &r2, &[])).is_empty());
}

#[test]
fn a_terminating_pod_is_replaced_only_after_it_is_gone() {
    let s = set(2, json!({}));
    let r = rev(&s, 1);
    let n = rev_name(&r);
    let pods = [
        pod(
            0,
            &n,
            json!({"metadata": {"deletionTimestamp": "2026-06-01T11:59:00Z"}}),
        ),
        pod(1, &n, json!({})),
    ];
    assert!(steps(&run(&s, &pods, &r, &r, &["data-web-0"])).is_empty());
    assert_eq!(
        steps(&run(&s, &pods[1..], &r, &r, &["data-web-0"])),
        ["create web-0"]
    );
    // A failed pod is deleted first (and created again once gone).
    let failed = [
        pod(0, &n, json!({"status": {"phase": "Failed"}})),
        pod(1, &n, json!({})),
    ];
    assert_eq!(
        steps(&run(&s, &failed, &r, &r, &["data-web-0"])),
        ["delete web-0"]
    );
}

#[test]
fn retention_policy_sets_claim_owners() {
    let claims_all = ["data-web-0", "data-web-1"];
    // Retain/Retain: claims are never owned.
    let s = set(1, json!({}));
    let r = rev(&s, 1);
    let n = rev_name(&r);
    let pods = [pod(0, &n, json!({})), pod(1, &n, json!({}))];
    assert_eq!(steps(&run(&s, &pods, &r, &r, &claims_all)), ["delete web-1"]);
    // whenScaled: Delete: the claim of the pod scaled away is owned by that pod before it goes.
    let s = set(
        1,
        json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenScaled": "Delete"}}}),
    );
    assert_eq!(
        steps(&run(&s, &pods, &r, &r, &claims_all)),
        ["owners data-web-1 Pod", "delete web-1"]
    );
    // whenDeleted: Delete: the set owns every claim (and a new claim is created owned).
    let s = set(
        2,
        json!({"spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete"}}}),
    );
    assert_eq!(
        steps(&run(&s, &pods, &r, &r, &claims_all)),
        ["owners data-web-0 StatefulSet", "owners data-web-1 StatefulSet"]
    );
    let p = run(&s, &[], &r, &r, &[]);
    let Some(Step::CreateClaim { claim, .. }) = p.steps.first() else {
        panic!("{:?}", steps(&p))
    };
    assert_eq!(
        claim
            .metadata
            .owner_references
            .as_ref()
            .map(|o| o[0].kind.clone()),
        Some("StatefulSet".into())
    );
    assert_eq!(
        claim.metadata.labels.as_ref().map(|l| l["app"].clone()),
        Some("web".into())
    );
}

#[test]
fn revisions_are_reused_renumbered_on_rollback_or_created() {
    let s1 = set(1, json!({}));
    let s2 = with_image(&s1, "nginx:2");
    let r1 = Arc::new(rev(&s1, 1));
    let r2 = Arc::new(rev(&s2, 2));
    let history = vec![r1.clone(), r2.clone()];
    assert!(
        matches!(update_revision(&s2, &history), RevisionStep::Reuse(r) if r.metadata.name == r2.metadata.name)
    );
    // Back to the first template (rollout undo): the old revision gets number 3.
    assert!(
        matches!(update_revision(&s1, &history), RevisionStep::Renumber(r, 3) if r.metadata.name == r1.metadata.name)
    );
    let s3 = with_image(&s1, "nginx:3");
    let RevisionStep::Create(r3) = update_revision(&s3, &history) else {
        panic!("expected a new revision")
    };
    assert_eq!(r3.revision, 3);
    assert!(r3.metadata.name.as_deref().is_some_and(|n| n.starts_with("web-")));
    assert_eq!(
        r3.metadata.labels.as_ref().map(|l| l["app"].clone()),
        Some("web".into())
    );
    // The current revision is the status's, else the update revision.
    let mut with_status = s2.clone();
    with_status.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
        current_revision: r1.metadata.name.clone(),
        ..Default::default()
    });
    assert_eq!(
        current_revision(&with_status, &history, &r2).metadata.name,
        r1.metadata.name
    );
    assert_eq!(
        current_revision(&s2, &history, &r2).metadata.name,
        r2.metadata.name
    );
}

#[test]
fn claims_adopt_orphans_of_the_same_name_and_release_relabelled_pods() {
    let s = set(3, json!({}));
    let orphan = pod(1, "x", json!({"metadata": {"ownerReferences": null}}));
    let stranger = {
        let mut p = (*pod(2, "x", json!({"metadata": {"ownerReferences": null}}))).clone();
        p.metadata.name = Some("other-2".into());
        Arc::new(p)
    };
    let moved = pod(0, "x", json!({"metadata": {"labels": {"app": "other"}}}));
    let c = claim_pods(&s, &[orphan, stranger, moved]);
    let names = |v: &[Arc<Pod>]| {
        v.iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&c.adopt), ["web-1"]);
    assert_eq!(names(&c.release), ["web-0"]);
    assert_eq!(names(&c.pods), ["web-1"]);
}
