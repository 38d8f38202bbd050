//! `autoscaling/v1` HorizontalPodAutoscalers served over the stored `autoscaling/v2` objects:
//! discovery, create (JSON and kubectl's protobuf), read in both versions, list, patch, status.

use serde_json::json;

use super::*;

const V1: &str = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers";
const V2: &str = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers";

fn hpa_v1(name: &str, cpu: Option<i32>) -> Value {
    let mut spec = json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                          "maxReplicas": 5});
    if let Some(c) = cpu {
        spec["targetCPUUtilizationPercentage"] = json!(c);
    }
    json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": name}, "spec": spec})
}

#[tokio::test]
async fn discovery_lists_v1_after_the_preferred_v2() {
    let f = fixture().await;
    let (code, groups) = f.get("/apis").await;
    assert_eq!(code, 200);
    let g = groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["name"] == "autoscaling")
        .expect("autoscaling")
        .clone();
    assert_eq!(g["preferredVersion"]["version"], "v2");
    let versions: Vec<&str> = g["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert_eq!(versions, ["v2", "v1"]);
    let (code, list) = f.get("/apis/autoscaling/v1").await;
    assert_eq!(code, 200);
    let names: Vec<&str> = list["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["horizontalpodautoscalers", "horizontalpodautoscalers/status"]
    );
}

#[tokio::test]
async fn a_v1_hpa_is_stored_as_v2_and_read_in_both() {
    let f = fixture().await;
    let (code, created) = f.post(V1, hpa_v1("web", Some(50))).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["apiVersion"], "autoscaling/v1");
    assert_eq!(created["spec"]["targetCPUUtilizationPercentage"], 50);
    assert_eq!(created["spec"]["minReplicas"], 1);

    let (code, v2) = f.get(&format!("{V2}/web")).await;
    assert_eq!(code, 200);
    assert_eq!(v2["apiVersion"], "autoscaling/v2");
    assert_eq!(
        v2["spec"]["metrics"],
        json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}])
    );

    // Without a CPU target, v2 defaulting gives 80%, which v1 shows as its target.
    let (code, bare) = f.post(V1, hpa_v1("bare", None)).await;
    assert_eq!(code, 201, "{bare}");
    assert_eq!(bare["spec"]["targetCPUUtilizationPercentage"], 80);

    let (code, list) = f.get(V1).await;
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "HorizontalPodAutoscalerList");
    assert_eq!(list["apiVersion"], "autoscaling/v1");
    let targets: Vec<i64> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["spec"]["targetCPUUtilizationPercentage"].as_i64())
        .collect();
    assert_eq!(targets.len(), 2);
    assert!(targets.contains(&50) && targets.contains(&80), "{targets:?}");

    let (code, missing) = f.get(&format!("{V1}/nope")).await;
    assert_eq!(code, 404);
    assert_eq!(missing["kind"], "Status");
}

#[tokio::test]
async fn kubectl_autoscale_posts_v1_protobuf() {
    let f = fixture().await;
    let body = crate::api::protobuf::encode(&hpa_v1("web", Some(70))).expect("encodes");
    let (code, created) = f
        .call_bytes(
            Some(&admin()),
            Method::POST,
            &format!("{V1}?fieldManager=kubectl-autoscale"),
            "application/vnd.kubernetes.protobuf",
            Bytes::from(body),
            "application/vnd.kubernetes.protobuf, application/json",
        )
        .await;
    assert_eq!(code, 201, "{created}");
    let (_, v2) = f.get(&format!("{V2}/web")).await;
    assert_eq!(
        v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        70
    );
    assert_eq!(v2["metadata"]["managedFields"][0]["manager"], "kubectl-autoscale");
}

#[tokio::test]
async fn patches_of_v1_apply_to_the_v1_form() {
    let f = fixture().await;
    let (code, _) = f.post(V1, hpa_v1("web", Some(50))).await;
    assert_eq!(code, 201);
    let (code, patched) = f
        .call(
            Method::PATCH,
            &format!("{V1}/web"),
            "application/merge-patch+json",
            r#"{"spec":{"targetCPUUtilizationPercentage":65,"maxReplicas":9}}"#,
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["apiVersion"], "autoscaling/v1");
    assert_eq!(patched["spec"]["targetCPUUtilizationPercentage"], 65);
    let (_, v2) = f.get(&format!("{V2}/web")).await;
    assert_eq!(v2["spec"]["maxReplicas"], 9);
    assert_eq!(
        v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        65
    );

    // A patch that breaks validation changes nothing.
    let (code, _) = f
        .call(
            Method::PATCH,
            &format!("{V1}/web"),
            "application/merge-patch+json",
            r#"{"spec":{"maxReplicas":0}}"#,
        )
        .await;
    assert_eq!(code, 422);
    let (_, v2) = f.get(&format!("{V2}/web")).await;
    assert_eq!(v2["spec"]["maxReplicas"], 9);

    // Server-side apply is served in v2 only.
    let (code, refused) = f
        .call(
            Method::PATCH,
            &format!("{V1}/web?fieldManager=m"),
            "application/apply-patch+yaml",
            r#"{"apiVersion":"autoscaling/v1","kind":"HorizontalPodAutoscaler","metadata":{"name":"web"}}"#,
        )
        .await;
    assert_eq!(code, 415, "{refused}");
}

#[tokio::test]
async fn v2_status_shows_in_v1_with_conditions_in_the_annotation() {
    let f = fixture().await;
    let (code, _) = f.post(V1, hpa_v1("web", Some(50))).await;
    assert_eq!(code, 201);
    let (_, mut v2) = f.get(&format!("{V2}/web")).await;
    v2["status"] = json!({"currentReplicas": 3, "desiredReplicas": 4,
        "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 90, "averageValue": "90m"}}}],
        "conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale",
                        "message": "the HPA controller was able to update the target scale to 4",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    let (code, written) = f
        .call(
            Method::PUT,
            &format!("{V2}/web/status"),
            "application/json",
            &v2.to_string(),
        )
        .await;
    assert_eq!(code, 200, "{written}");
    let (code, v1) = f.get(&format!("{V1}/web")).await;
    assert_eq!(code, 200);
    assert_eq!(v1["status"]["currentCPUUtilizationPercentage"], 90);
    assert_eq!(v1["status"]["desiredReplicas"], 4);
    let conditions: Value = serde_json::from_str(
        v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/conditions"]
            .as_str()
            .expect("annotation"),
    )
    .expect("json");
    assert_eq!(conditions[0]["reason"], "SucceededRescale");
}
