//! Defaults of docs/SEEDS-SPEC.md §1.9 (API-48 to API-50) with the upstream values; `admit` applies
//! them after its own.

use serde_json::{Value, json};

use crate::api::registry::Resource;

/// Sets `obj[key]` when it is absent or null.
fn or_set(obj: &mut Value, key: &str, v: Value) {
    if obj.get(key).is_none_or(Value::is_null) {
        obj[key] = v;
    }
}

/// Defaults of the kinds in API-50 not set by `admit` itself.
pub(crate) fn apply(res: &Resource, obj: &mut Value) {
    match (res.group, res.kind) {
        ("", "Pod") => {
            pod_tolerations(&mut obj["spec"]);
            requests_from_limits(&mut obj["spec"]);
        }
        ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") => {
            let spec = &mut obj["spec"];
            or_set(&mut spec["template"]["spec"], "restartPolicy", json!("Always"));
            if res.kind != "ReplicaSet" {
                or_set(spec, "revisionHistoryLimit", json!(10));
            }
            match res.kind {
                "StatefulSet" => {
                    or_set(spec, "podManagementPolicy", json!("OrderedReady"));
                    or_set(
                        spec,
                        "updateStrategy",
                        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}}),
                    );
                    or_set(
                        spec,
                        "persistentVolumeClaimRetentionPolicy",
                        json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
                    );
                }
                "DaemonSet" => or_set(
                    spec,
                    "updateStrategy",
                    json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
                ),
                _ => {}
            }
        }
        ("batch", "Job") => job_spec(&mut obj["spec"]),
        ("batch", "CronJob") => {
            let spec = &mut obj["spec"];
            or_set(spec, "concurrencyPolicy", json!("Allow"));
            or_set(spec, "suspend", json!(false));
            or_set(spec, "successfulJobsHistoryLimit", json!(3));
            or_set(spec, "failedJobsHistoryLimit", json!(1));
            if spec["jobTemplate"]["spec"].is_object() {
                job_spec(&mut spec["jobTemplate"]["spec"]);
            }
        }
        ("", "ReplicationController") => replication_controller(obj),
        ("", "PodTemplate") => or_set(&mut obj["template"]["spec"], "restartPolicy", json!("Always")),
        ("storage.k8s.io", "StorageClass") => {
            or_set(obj, "reclaimPolicy", json!("Delete"));
            or_set(obj, "volumeBindingMode", json!("Immediate"));
        }
        ("storage.k8s.io", "CSIDriver") => {
            let spec = &mut obj["spec"];
            or_set(spec, "attachRequired", json!(true));
            or_set(spec, "podInfoOnMount", json!(false));
            or_set(spec, "storageCapacity", json!(false));
            or_set(spec, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
            or_set(spec, "requiresRepublish", json!(false));
            or_set(spec, "seLinuxMount", json!(false));
            or_set(spec, "volumeLifecycleModes", json!(["Persistent"]));
        }
        ("", "Service") => service(&mut obj["spec"]),
        ("autoscaling", "HorizontalPodAutoscaler") => hpa(&mut obj["spec"]),
        _ => {}
    }
}

/// A ReplicationController: one replica, and the template's labels as its selector and (when
/// it has none) its own labels (upstream `SetDefaults_ReplicationController`).
fn replication_controller(obj: &mut Value) {
    let labels = obj["spec"]["template"]["metadata"]["labels"].clone();
    let spec = &mut obj["spec"];
    or_set(spec, "replicas", json!(1));
    or_set(&mut spec["template"]["spec"], "restartPolicy", json!("Always"));
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        if spec["selector"].as_object().is_none_or(|s| s.is_empty()) {
            spec["selector"] = labels.clone();
        }
        if obj["metadata"]["labels"].as_object().is_none_or(|l| l.is_empty()) {
            obj["metadata"]["labels"] = labels;
        }
    }
}

/// DefaultTolerationSeconds: tolerate not-ready and unreachable nodes for 300 s unless the pod
/// already tolerates that taint (a user's own tolerationSeconds is kept).
fn pod_tolerations(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    let list = spec["tolerations"].as_array().cloned().unwrap_or_default();
    let mut out = list.clone();
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        let covered = list.iter().any(|t| {
            let effect_ok = t["effect"]
                .as_str()
                .is_none_or(|e| e.is_empty() || e == "NoExecute");
            let key_ok =
                t["key"] == key || (t["key"].as_str().is_none_or(str::is_empty) && t["operator"] == "Exists");
            effect_ok && key_ok
        });
        if !covered {
            out.push(
                json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
            );
        }
    }
    spec["tolerations"] = Value::Array(out);
}

/// A container with limits but no requests for a resource requests its limit.
fn requests_from_limits(spec: &mut Value) {
    for c in crate::api::object::containers_mut(spec, &["containers", "initContainers"]) {
        let Some(limits) = c["resources"]["limits"].as_object().cloned() else {
            continue;
        };
        // A requests value of the wrong type is left for validation to refuse.
        if !(c["resources"]["requests"].is_object() || c["resources"]["requests"].is_null()) {
            continue;
        }
        let resources = &mut c["resources"];
        for (k, v) in limits {
            if resources["requests"].get(&k).is_none() {
                resources["requests"][&k] = v;
            }
        }
    }
}

fn job_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    let per_index = spec.get("backoffLimitPerIndex").is_some_and(|v| !v.is_null());
    or_set(
        spec,
        "backoffLimit",
        json!(if per_index { 2_147_483_647 } else { 6 }),
    );
    if spec.get("podFailurePolicy").is_some_and(|v| !v.is_null()) {
        or_set(spec, "podReplacementPolicy", json!("Failed"));
    } else {
        or_set(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    }
    or_set(spec, "completionMode", json!("NonIndexed"));
    or_set(spec, "suspend", json!(false));
    if spec.get("completions").is_none_or(Value::is_null)
        && spec.get("parallelism").is_none_or(Value::is_null)
    {
        spec["completions"] = json!(1);
    }
    or_set(spec, "parallelism", json!(1));
}

fn service(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    if spec["sessionAffinity"] == "ClientIP" {
        or_set(
            spec,
            "sessionAffinityConfig",
            json!({"clientIP": {"timeoutSeconds": 10800}}),
        );
    }
    if spec["clusterIP"] == "None" {
        or_set(spec, "clusterIPs", json!(["None"]));
    }
    if spec["type"] == "LoadBalancer" {
        or_set(spec, "allocateLoadBalancerNodePorts", json!(true));
    }
    if spec["type"] != "ExternalName" {
        or_set(spec, "internalTrafficPolicy", json!("Cluster"));
    }
}

/// An HPA (upstream's v2 `SetDefaults_HorizontalPodAutoscaler`): `minReplicas` 1, without
/// metrics a CPU utilization target of 80%, and the behavior defaults.
fn hpa(spec: &mut Value) {
    or_set(spec, "minReplicas", json!(1));
    if spec["metrics"].as_array().is_none_or(|m| m.is_empty()) {
        spec["metrics"] = json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 80}}}]);
    }
    hpa_behavior(spec);
}

/// With a `behavior`, the missing direction gets the upstream default rules, and given rules
/// their `selectPolicy`.
fn hpa_behavior(spec: &mut Value) {
    let Some(b) = spec.get_mut("behavior").filter(|b| b.is_object()) else {
        return;
    };
    if b.get("scaleUp").is_none_or(Value::is_null) {
        b["scaleUp"] = json!({"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15}]});
    }
    if b.get("scaleDown").is_none_or(Value::is_null) {
        b["scaleDown"] = json!({"selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]});
    }
    for dir in ["scaleUp", "scaleDown"] {
        if b[dir].is_object() {
            or_set(&mut b[dir], "selectPolicy", json!("Max"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::registry::find;

    fn res(g: &str, plural: &str) -> &'static Resource {
        let v = if g == "autoscaling" { "v2" } else { "v1" };
        find(g, v, plural).expect("served")
    }

    #[test]
    fn pod_defaults() {
        let mut pod = json!({"spec": {"tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
            "effect": "NoExecute", "tolerationSeconds": 60}],
            "containers": [{"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}]}});
        apply(res("", "pods"), &mut pod);
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
                   {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}])
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "500m", "memory": "256Mi"}})
        );
    }

    #[test]
    fn workload_defaults() {
        let mut sts = json!({"spec": {"template": {"spec": {}}}});
        apply(res("apps", "statefulsets"), &mut sts);
        assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(
            sts["spec"]["updateStrategy"],
            json!({"rollingUpdate": {"maxUnavailable": 1, "partition": 0}, "type": "RollingUpdate"})
        );
        assert_eq!(
            sts["spec"]["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        let mut job = json!({"spec": {"template": {"spec": {}}}});
        apply(res("batch", "jobs"), &mut job);
        assert_eq!(
            (&job["spec"]["backoffLimit"], &job["spec"]["completions"]),
            (&json!(6), &json!(1))
        );
        let mut indexed = json!({"spec": {"backoffLimitPerIndex": 1, "podFailurePolicy": {"rules": []}}});
        apply(res("batch", "jobs"), &mut indexed);
        assert_eq!(indexed["spec"]["backoffLimit"], 2_147_483_647);
        assert_eq!(indexed["spec"]["podReplacementPolicy"], "Failed");
        let mut cj = json!({"spec": {"concurrencyPolicy": "Forbid", "jobTemplate": {"spec": {}}}});
        apply(res("batch", "cronjobs"), &mut cj);
        assert_eq!(
            (
                &cj["spec"]["concurrencyPolicy"],
                &cj["spec"]["successfulJobsHistoryLimit"],
                &cj["spec"]["failedJobsHistoryLimit"]
            ),
            (&json!("Forbid"), &json!(3), &json!(1))
        );
        let mut svc =
            json!({"spec": {"sessionAffinity": "ClientIP", "clusterIP": "None", "type": "ClusterIP"}});
        apply(res("", "services"), &mut svc);
        assert_eq!(
            svc["spec"]["sessionAffinityConfig"],
            json!({"clientIP": {"timeoutSeconds": 10800}})
        );
        assert_eq!(svc["spec"]["clusterIPs"], json!(["None"]));
        let mut hpa = json!({"spec": {"behavior": {"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}}});
        apply(res("autoscaling", "horizontalpodautoscalers"), &mut hpa);
        assert_eq!(
            hpa["spec"]["behavior"]["scaleUp"],
            json!({"policies": [{"periodSeconds": 15, "type": "Pods", "value": 4}, {"periodSeconds": 15, "type": "Percent", "value": 100}],
                   "selectPolicy": "Max", "stabilizationWindowSeconds": 0})
        );
        assert_eq!(hpa["spec"]["behavior"]["scaleDown"]["selectPolicy"], "Max");
    }
}
