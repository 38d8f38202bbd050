//! Defaults and validation rules of SEEDS-SPEC.md §1.9 (API-48 to API-50) and §1.10 (API-51 to
//! API-56), with the upstream values and messages; `admit` runs them after its own defaults.

use serde_json::{Value, json};

use super::registry::Resource;
use super::status::ApiError;

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
        ("", "Service") => service(&mut obj["spec"]),
        ("autoscaling", "HorizontalPodAutoscaler") => hpa_behavior(&mut obj["spec"]),
        _ => {}
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
    for list in ["containers", "initContainers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
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

/// The validation rules of API-51 to API-56 (the first violation, with the upstream message).
pub(crate) fn validate(res: &Resource, obj: &Value) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = |field: &str, msg: String| Err(ApiError::invalid(res, name, field, &msg));
    match (res.group, res.kind) {
        ("", "Pod") => {
            let grace = obj["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30);
            for (i, c) in obj["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                if let Some(s) = c["lifecycle"]["preStop"]["sleep"]["seconds"].as_i64()
                    && !(0..=grace).contains(&s)
                {
                    return invalid(
                        &format!("spec.containers[{i}].lifecycle.preStop.sleep"),
                        format!(
                            "Invalid value: {s}: must be non-negative and less than terminationGracePeriodSeconds ({grace})"
                        ),
                    );
                }
            }
        }
        ("batch", "CronJob") => {
            let schedule = obj["spec"]["schedule"].as_str().unwrap_or_default();
            if schedule.starts_with("TZ=") || schedule.starts_with("CRON_TZ=") {
                return invalid(
                    "spec.schedule",
                    format!(
                        "Invalid value: {schedule:?}: cannot use TZ or CRON_TZ in schedule, use timeZone field instead"
                    ),
                );
            }
            if let Some(tz) = obj["spec"]["timeZone"].as_str()
                && !known_time_zone(tz)
            {
                return invalid(
                    "spec.timeZone",
                    format!("Invalid value: {tz:?}: unknown time zone {tz}"),
                );
            }
            job_rules(
                &obj["spec"]["jobTemplate"]["spec"],
                "spec.jobTemplate.spec",
                &invalid,
            )?;
        }
        ("batch", "Job") => job_rules(&obj["spec"], "spec", &invalid)?,
        ("apps", "Deployment") => {
            let ru = &obj["spec"]["strategy"]["rollingUpdate"];
            let zero = |v: &Value| {
                v.as_i64() == Some(0) || v.as_str().is_some_and(|s| s.trim_end_matches('%') == "0")
            };
            if obj["spec"]["strategy"]["type"] == "RollingUpdate"
                && zero(&ru["maxSurge"])
                && zero(&ru["maxUnavailable"])
            {
                return invalid(
                    "spec.strategy.rollingUpdate.maxUnavailable",
                    format!(
                        "Invalid value: {}: may not be 0 when `maxSurge` is 0",
                        go_int_or_string(&ru["maxUnavailable"])
                    ),
                );
            }
        }
        ("", "Service") => {
            let spec = &obj["spec"];
            let ports = spec["ports"].as_array().cloned().unwrap_or_default();
            if ports.len() > 1 {
                for (i, p) in ports.iter().enumerate() {
                    if p["name"].as_str().is_none_or(str::is_empty) {
                        return invalid(&format!("spec.ports[{i}].name"), "Required value".into());
                    }
                }
            }
            if let Some(t) = spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"].as_i64()
                && !(1..=86_400).contains(&t)
            {
                return invalid(
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!("Invalid value: {t}: must be greater than 0 and less than 86400"),
                );
            }
            let no_selector = spec["selector"].as_object().is_none_or(serde_json::Map::is_empty);
            if spec["clusterIP"] == "None" && no_selector {
                for (i, p) in ports.iter().enumerate() {
                    if let Some(target) = p.get("targetPort").filter(|t| !t.is_null())
                        && *target != p["port"]
                    {
                        return invalid(
                            &format!("spec.ports[{i}].targetPort"),
                            format!(
                                "Invalid value: {target}: must be equal to the value of 'port' when clusterIP = None"
                            ),
                        );
                    }
                }
            }
        }
        ("networking.k8s.io", "Ingress") => {
            for (r, rule) in obj["spec"]["rules"].as_array().into_iter().flatten().enumerate() {
                for (p, path) in rule["http"]["paths"].as_array().into_iter().flatten().enumerate() {
                    if path["pathType"].as_str().is_none_or(str::is_empty) {
                        return invalid(
                            &format!("spec.rules[{r}].http.paths[{p}].pathType"),
                            "Required value: pathType must be specified".into(),
                        );
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn job_rules(
    spec: &Value,
    at: &str,
    invalid: &impl Fn(&str, String) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    let restart = spec["template"]["spec"]["restartPolicy"]
        .as_str()
        .unwrap_or_default();
    if spec["podFailurePolicy"].is_object() && restart != "Never" {
        return invalid(
            &format!("{at}.template.spec.restartPolicy"),
            format!(
                "Invalid value: {restart:?}: only \"Never\" is supported when podFailurePolicy is specified"
            ),
        );
    }
    Ok(())
}

/// Go's `%#v` of an `intstr.IntOrString` (how the upstream message prints it).
fn go_int_or_string(v: &Value) -> String {
    match v {
        Value::String(s) => format!("intstr.IntOrString{{Type:1, IntVal:0, StrVal:{s:?}}}"),
        other => format!(
            "intstr.IntOrString{{Type:0, IntVal:{}, StrVal:\"\"}}",
            other.as_i64().unwrap_or(0)
        ),
    }
}

/// Whether the host's time zone database knows `tz` (as Go's `time.LoadLocation`). Without a
/// database on this machine every name is accepted.
fn known_time_zone(tz: &str) -> bool {
    const DB: &str = "/usr/share/zoneinfo";
    if tz == "UTC" || tz == "Local" {
        return true;
    }
    if tz.is_empty() || tz.starts_with('/') || tz.split('/').any(|p| p == ".." || p == "." || p.is_empty()) {
        return false;
    }
    if !std::path::Path::new(DB).is_dir() {
        return true;
    }
    std::path::Path::new(DB).join(tz).is_file()
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

    fn message(res: &Resource, obj: Value) -> String {
        validate(res, &obj)
            .map(|()| String::new())
            .unwrap_or_else(|e| e.message)
    }

    #[test]
    fn validation_messages() {
        let pod = |sleep: i64| {
            json!({"metadata": {"name": "billing"}, "spec": {"containers": [
            {"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": sleep}}}}]}})
        };
        assert_eq!(
            message(res("", "pods"), pod(40)),
            "Pod \"billing\" is invalid: spec.containers[0].lifecycle.preStop.sleep: Invalid value: 40: must be non-negative and less than terminationGracePeriodSeconds (30)"
        );
        assert_eq!(
            message(res("", "pods"), pod(30)),
            "",
            "equal to the grace period passes"
        );
        assert_eq!(message(res("", "pods"), pod(0)), "");
        let cj = |tz: &str, schedule: &str| {
            json!({"metadata": {"name": "report"},
            "spec": {"schedule": schedule, "timeZone": tz, "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never"}}}}}})
        };
        if std::path::Path::new("/usr/share/zoneinfo/Europe/Moscow").is_file() {
            assert_eq!(
                message(res("batch", "cronjobs"), cj("MSK", "0 * * * *")),
                "CronJob \"report\" is invalid: spec.timeZone: Invalid value: \"MSK\": unknown time zone MSK"
            );
            assert_eq!(
                message(res("batch", "cronjobs"), cj("Europe/Moscow", "0 * * * *")),
                ""
            );
        }
        assert!(
            message(res("batch", "cronjobs"), cj("../../etc/passwd", "0 * * * *"))
                .contains("unknown time zone")
        );
        assert!(
            message(res("batch", "cronjobs"), cj("UTC", "TZ=UTC 0 * * * *"))
                .contains("cannot use TZ or CRON_TZ in schedule")
        );
        let deploy = json!({"metadata": {"name": "d"}, "spec": {"strategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}});
        assert_eq!(
            message(res("apps", "deployments"), deploy),
            "Deployment \"d\" is invalid: spec.strategy.rollingUpdate.maxUnavailable: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"0%\"}: may not be 0 when `maxSurge` is 0"
        );
        let job = json!({"metadata": {"name": "j"}, "spec": {"podFailurePolicy": {"rules": []},
            "template": {"spec": {"restartPolicy": "OnFailure"}}}});
        assert_eq!(
            message(res("batch", "jobs"), job),
            "Job \"j\" is invalid: spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified"
        );
        let svc =
            json!({"metadata": {"name": "s"}, "spec": {"ports": [{"name": "a", "port": 80}, {"port": 81}]}});
        assert_eq!(
            message(res("", "services"), svc),
            "Service \"s\" is invalid: spec.ports[1].name: Required value"
        );
        let svc = json!({"metadata": {"name": "s"}, "spec": {"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}});
        assert!(
            message(res("", "services"), svc)
                .ends_with("Invalid value: 86401: must be greater than 0 and less than 86400")
        );
        let headless = json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80, "targetPort": 8080}]}});
        assert!(
            message(res("", "services"), headless)
                .contains("must be equal to the value of 'port' when clusterIP = None")
        );
        let ing =
            json!({"metadata": {"name": "i"}, "spec": {"rules": [{"http": {"paths": [{"path": "/"}]}}]}});
        assert_eq!(
            message(find("networking.k8s.io", "v1", "ingresses").expect("served"), ing),
            "Ingress \"i\" is invalid: spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"
        );
    }
}
