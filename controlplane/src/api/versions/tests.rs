//! The autoscaling/v1 ⇄ v2 conversions and the rewriting of older-version requests.

use serde_json::json;

use super::*;

fn v1() -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": 2, "maxReplicas": 5, "targetCPUUtilizationPercentage": 80},
        "status": {"currentReplicas": 2, "desiredReplicas": 3, "currentCPUUtilizationPercentage": 95},
    })
}

#[test]
fn v1_target_cpu_is_a_v2_utilization_metric() {
    let v2 = hpa_v1_to_v2(v1()).expect("converts");
    assert_eq!(
        v2["spec"]["metrics"],
        json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 80}}}])
    );
    assert_eq!(v2["spec"].get("targetCPUUtilizationPercentage"), None);
    assert_eq!(v2["spec"]["minReplicas"], 2);
    assert_eq!(
        v2["status"]["currentMetrics"],
        json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 95}}}])
    );
    assert_eq!(v2["status"]["desiredReplicas"], 3);
    assert_eq!(v2["metadata"].get("annotations"), None);
}

#[test]
fn v2_only_fields_ride_in_annotations_and_come_back() {
    let v2 = json!({
        "metadata": {"name": "web", "namespace": "default", "annotations": {"team": "a"}},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": 1, "maxReplicas": 10,
                 "metrics": [
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}},
                 ],
                 "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60, "selectPolicy": "Max",
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}},
        "status": {"currentReplicas": 1, "desiredReplicas": 1,
                   "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 12, "averageValue": "12m"}}}],
                   "conditions": [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": "m",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    });
    let down = hpa_v2_to_v1(v2.clone());
    assert_eq!(down["spec"]["targetCPUUtilizationPercentage"], 60);
    assert_eq!(down["spec"].get("metrics"), None);
    assert_eq!(down["spec"].get("behavior"), None);
    assert_eq!(down["status"]["currentCPUUtilizationPercentage"], 12);
    assert_eq!(down["status"].get("conditions"), None);
    let a = &down["metadata"]["annotations"];
    assert_eq!(a["team"], "a");
    let others: Value = serde_json::from_str(a[METRICS].as_str().expect("metrics")).expect("json");
    assert_eq!(others[0]["resource"]["name"], "memory");
    let conditions: Value = serde_json::from_str(a[CONDITIONS].as_str().expect("conditions")).expect("json");
    assert_eq!(conditions[0]["reason"], "ReadyForNewScale");
    assert!(a.get(BEHAVIOR).is_some());

    // Back up: nothing lost but the order of the metrics (the CPU target comes first).
    let up = hpa_v1_to_v2(down).expect("converts");
    assert_eq!(up["spec"]["behavior"], v2["spec"]["behavior"]);
    assert_eq!(up["status"]["conditions"], v2["status"]["conditions"]);
    assert_eq!(up["metadata"]["annotations"], json!({"team": "a"}));
    let metrics = up["spec"]["metrics"].as_array().expect("metrics");
    assert_eq!(metrics.len(), 2);
    assert_eq!(metrics[0]["resource"]["name"], "cpu");
    assert_eq!(metrics[1]["resource"]["name"], "memory");
}

#[test]
fn a_malformed_annotation_is_a_bad_request() {
    let mut obj = v1();
    obj["metadata"]["annotations"] = json!({BEHAVIOR: "{not json"});
    let e = hpa_v1_to_v2(obj).expect_err("refused");
    assert_eq!(e.code, 400);
    assert!(e.message.contains(BEHAVIOR), "{}", e.message);
}

#[test]
fn paths_of_older_versions_are_found() {
    let segs = |p: &'static str| p.split('/').filter(|s| !s.is_empty()).collect::<Vec<_>>();
    for p in [
        "/apis/autoscaling/v1/horizontalpodautoscalers",
        "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers/web",
        "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers/web/status",
        "/apis/autoscaling/v1/watch/namespaces/default/horizontalpodautoscalers",
    ] {
        assert!(older_of(&segs(p)).is_some(), "{p}");
    }
    for p in [
        "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers",
        "/apis/autoscaling/v1",
        "/apis/apps/v1/namespaces/default/deployments",
    ] {
        assert!(older_of(&segs(p)).is_none(), "{p}");
    }
    let older = &OLDER[0];
    assert_eq!(
        older.preferred_path("/apis/autoscaling/v1/namespaces/d/horizontalpodautoscalers?watch=1"),
        "/apis/autoscaling/v2/namespaces/d/horizontalpodautoscalers?watch=1"
    );
}

#[test]
fn answers_are_converted_down_and_statuses_left_alone() {
    let older = &OLDER[0];
    let mut v2 = hpa_v1_to_v2(v1()).expect("converts");
    v2["apiVersion"] = json!("autoscaling/v2");
    v2["kind"] = json!("HorizontalPodAutoscaler");
    let one = older.answer_down(v2.clone());
    assert_eq!(one["apiVersion"], "autoscaling/v1");
    assert_eq!(one["spec"]["targetCPUUtilizationPercentage"], 80);
    let list = older.answer_down(
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscalerList",
        "metadata": {"resourceVersion": "7"}, "items": [v2.clone()]}),
    );
    assert_eq!(list["apiVersion"], "autoscaling/v1");
    assert_eq!(list["items"][0]["apiVersion"], "autoscaling/v1");
    assert_eq!(list["items"][0]["spec"]["targetCPUUtilizationPercentage"], 80);
    let event = older.answer_down(json!({"type": "MODIFIED", "object": v2}));
    assert_eq!(event["object"]["apiVersion"], "autoscaling/v1");
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404});
    assert_eq!(older.answer_down(status.clone()), status);
}

#[test]
fn a_body_of_another_kind_is_refused() {
    let older = &OLDER[0];
    let e = older
        .body_up(json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"}}))
        .expect_err("v2 body on a v1 path");
    assert_eq!(e.code, 400);
    let ok = older.body_up(
        json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "x"}, "spec": {"maxReplicas": 3, "targetCPUUtilizationPercentage": 50}}),
    );
    assert_eq!(ok.expect("v1 body")["apiVersion"], "autoscaling/v2");
}

#[test]
fn a_patch_applies_to_the_older_form_and_keeps_the_resource_version() {
    let older = &OLDER[0];
    let mut current = hpa_v1_to_v2(v1()).expect("converts");
    current["apiVersion"] = json!("autoscaling/v2");
    current["kind"] = json!("HorizontalPodAutoscaler");
    current["metadata"]["resourceVersion"] = json!("42");
    let (parts, _) = Request::builder()
        .method(Method::PATCH)
        .uri("/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/web")
        .body(())
        .expect("request")
        .into_parts();
    let put = patched_update(
        older,
        current,
        "application/merge-patch+json",
        br#"{"spec":{"targetCPUUtilizationPercentage":50}}"#,
        parts,
        "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/web?fieldManager=kubectl-patch",
    )
    .expect("update");
    assert_eq!(put.method(), Method::PUT);
    assert_eq!(put.uri().query(), Some("fieldManager=kubectl-patch"));
    let body: Value = serde_json::from_slice(put.body()).expect("json");
    assert_eq!(body["apiVersion"], "autoscaling/v2");
    assert_eq!(body["metadata"]["resourceVersion"], "42");
    assert_eq!(
        body["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        50
    );
    let bad = patched_update(
        older,
        json!({"kind": "HorizontalPodAutoscaler", "metadata": {}}),
        "application/json-patch+json",
        br#"[{"op":"replace","path":"/spec/nothing/here","value":1}]"#,
        Request::new(()).into_parts().0,
        "/x",
    );
    assert!(bad.is_err());
}
