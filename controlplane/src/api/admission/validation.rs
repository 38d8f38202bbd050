//! Validation rules of docs/SEEDS-SPEC.md §1.10 (API-51 to API-56) with the upstream messages;
//! `admit` runs them after the defaults.

use serde_json::Value;

use crate::api::registry::Resource;
use crate::api::status::ApiError;

/// The validation rules of API-51 to API-56 (the first violation, with the upstream message).
pub(crate) fn validate(res: &Resource, obj: &Value) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let invalid = |field: &str, msg: String| Err(ApiError::invalid(res, name, field, &msg));
    if let Some((at, spec)) = pod_spec(res, obj)
        && let Some((field, msg)) = dns_error(spec, at)
    {
        return invalid(&field, msg);
    }
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
            if let Err(e) = crate::cron::parse(schedule) {
                return invalid("spec.schedule", format!("Invalid value: {schedule:?}: {e}"));
            }
            if schedule.contains("TZ") {
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
        ("autoscaling", "HorizontalPodAutoscaler") => {
            // Upstream's ValidateHorizontalPodAutoscalerSpec (scale to zero, beta and on in
            // 1.37 per CTL-53, lets minReplicas be 0 with an Object or External metric).
            let spec = &obj["spec"];
            for field in ["kind", "name"] {
                if spec["scaleTargetRef"][field].as_str().is_none_or(str::is_empty) {
                    return invalid(&format!("spec.scaleTargetRef.{field}"), "Required value".into());
                }
            }
            let max = spec["maxReplicas"].as_i64().unwrap_or(0);
            let object_or_external = spec["metrics"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["type"] == "Object" || m["type"] == "External");
            let lower = if object_or_external { 0 } else { 1 };
            if let Some(min) = spec["minReplicas"].as_i64() {
                if min < lower {
                    return invalid(
                        "spec.minReplicas",
                        format!("Invalid value: {min}: must be greater than or equal to {lower}"),
                    );
                }
                if max >= 1 && max < min {
                    return invalid(
                        "spec.maxReplicas",
                        format!("Invalid value: {max}: must be greater than or equal to `minReplicas`"),
                    );
                }
            }
            if max < 1 {
                return invalid(
                    "spec.maxReplicas",
                    format!("Invalid value: {max}: must be greater than 0"),
                );
            }
        }
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

/// The pod spec an object holds, with its field path: a pod's own or its template's.
fn pod_spec<'a>(res: &Resource, obj: &'a Value) -> Option<(&'static str, &'a Value)> {
    let at = match (res.group, res.kind) {
        ("", "Pod") => "spec",
        ("", "PodTemplate") => "template.spec",
        ("", "ReplicationController")
        | ("apps", "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet")
        | ("batch", "Job") => "spec.template.spec",
        ("batch", "CronJob") => "spec.jobTemplate.spec.template.spec",
        _ => return None,
    };
    let spec = at.split('.').try_fold(obj, |v, key| v.get(key))?;
    Some((at, spec))
}

/// The resolver's limits (upstream's `MaxDNSNameservers`, `MaxDNSSearchPaths`,
/// `MaxDNSSearchListChars`).
const MAX_DNS_NAMESERVERS: usize = 3;
const MAX_DNS_SEARCHES: usize = 32;
const MAX_DNS_SEARCH_CHARS: usize = 2048;

/// The first error of a pod spec's `dnsPolicy` and `dnsConfig` (upstream's `validateDNSPolicy`
/// and `validatePodDNSConfig`), the spec being at field path `at`: field and message.
fn dns_error(spec: &Value, at: &str) -> Option<(String, String)> {
    // Go formats a []string value as `[]string{"a", "b"}`.
    let go_strings = |v: &[&str]| {
        let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
        format!("[]string{{{}}}", items.join(", "))
    };
    let policy = spec["dnsPolicy"].as_str().unwrap_or_default();
    // Upstream's order, unsorted.
    const POLICIES: [&str; 4] = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
    if !policy.is_empty() && !POLICIES.contains(&policy) {
        return Some((
            format!("{at}.dnsPolicy"),
            format!(
                "Unsupported value: {policy:?}: supported values: {}",
                POLICIES.map(|p| format!("{p:?}")).join(", ")
            ),
        ));
    }
    let config = spec.get("dnsConfig").filter(|c| !c.is_null());
    let strings = |key: &str| -> Vec<&str> {
        config
            .and_then(|c| c[key].as_array())
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let nameservers = strings("nameservers");
    if policy == "None" {
        if config.is_none() {
            return Some((
                format!("{at}.dnsConfig"),
                "Required value: must provide `dnsConfig` when `dnsPolicy` is None".into(),
            ));
        }
        if nameservers.is_empty() {
            return Some((
                format!("{at}.dnsConfig.nameservers"),
                "Required value: must provide at least one DNS nameserver when `dnsPolicy` is None".into(),
            ));
        }
    }
    let config = config?;
    if nameservers.len() > MAX_DNS_NAMESERVERS {
        return Some((
            format!("{at}.dnsConfig.nameservers"),
            format!(
                "Invalid value: {}: must not have more than {MAX_DNS_NAMESERVERS} nameservers",
                go_strings(&nameservers)
            ),
        ));
    }
    if let Some((i, ns)) = nameservers
        .iter()
        .enumerate()
        .find(|(_, ns)| ns.parse::<std::net::IpAddr>().is_err())
    {
        return Some((
            format!("{at}.dnsConfig.nameservers[{i}]"),
            format!("Invalid value: {ns:?}: must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"),
        ));
    }
    let searches = strings("searches");
    if searches.len() > MAX_DNS_SEARCHES {
        return Some((
            format!("{at}.dnsConfig.searches"),
            format!(
                "Invalid value: {}: must not have more than {MAX_DNS_SEARCHES} search paths",
                go_strings(&searches)
            ),
        ));
    }
    if searches.join(" ").len() > MAX_DNS_SEARCH_CHARS {
        return Some((
            format!("{at}.dnsConfig.searches"),
            format!(
                "Invalid value: {}: must not have more than {MAX_DNS_SEARCH_CHARS} characters (including spaces) in the search list",
                go_strings(&searches)
            ),
        ));
    }
    for (i, search) in searches.iter().enumerate() {
        // A trailing dot is fine.
        let name = search.strip_suffix('.').unwrap_or(search);
        if let Some(e) = crate::api::object::dns1123_subdomain_error(name) {
            return Some((
                format!("{at}.dnsConfig.searches[{i}]"),
                format!("Invalid value: {name:?}: {e}"),
            ));
        }
    }
    let options = config["options"].as_array().into_iter().flatten().enumerate();
    for (i, o) in options {
        if o["name"].as_str().is_none_or(str::is_empty) {
            return Some((
                format!("{at}.dnsConfig.options[{i}]"),
                "Required value: must not be empty".into(),
            ));
        }
    }
    None
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
    use serde_json::json;

    use super::*;
    use crate::api::registry::find;

    fn res(g: &str, plural: &str) -> &'static Resource {
        find(g, "v1", plural).expect("served")
    }

    fn message(res: &Resource, obj: Value) -> String {
        validate(res, &obj)
            .map(|()| String::new())
            .unwrap_or_else(|e| e.message)
    }

    #[test]
    fn pod_dns_settings_are_checked_as_upstream_checks_them() {
        let pod = |spec: Value| {
            let mut spec = spec;
            spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
            json!({"metadata": {"name": "web"}, "spec": spec})
        };
        let pods = res("", "pods");
        let searches: Vec<String> = (0..33).map(|i| format!("d{i}.example")).collect();
        let long: Vec<String> = (0..21).map(|i| format!("{i:0>100}")).collect();
        let table = [
            (json!({}), ""),
            (json!({"dnsPolicy": "Default"}), ""),
            (
                json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["192.0.2.1", "2001:db8::1"],
                    "searches": ["svc.example.", "example"], "options": [{"name": "ndots", "value": "2"}]}}),
                "",
            ),
            (
                json!({"dnsPolicy": "Cluster"}),
                "spec.dnsPolicy: Unsupported value: \"Cluster\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
            ),
            (
                json!({"dnsPolicy": "None"}),
                "spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None",
            ),
            (
                json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["a.example"]}}),
                "spec.dnsConfig.nameservers: Required value: must provide at least one DNS nameserver when `dnsPolicy` is None",
            ),
            (
                json!({"dnsConfig": {"nameservers": ["1.1.1.1", "1.0.0.1", "8.8.8.8", "9.9.9.9"]}}),
                "spec.dnsConfig.nameservers: Invalid value: []string{\"1.1.1.1\", \"1.0.0.1\", \"8.8.8.8\", \"9.9.9.9\"}: must not have more than 3 nameservers",
            ),
            (
                json!({"dnsConfig": {"nameservers": ["1.1.1.1", "dns.example"]}}),
                "spec.dnsConfig.nameservers[1]: Invalid value: \"dns.example\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ),
            (
                json!({"dnsConfig": {"searches": ["ok.example", "Bad_Domain"]}}),
                "spec.dnsConfig.searches[1]: Invalid value: \"Bad_Domain\": a lowercase RFC 1123 subdomain",
            ),
            (
                json!({"dnsConfig": {"options": [{"name": "ndots"}, {"value": "1"}]}}),
                "spec.dnsConfig.options[1]: Required value: must not be empty",
            ),
        ];
        for (spec, want) in table {
            let got = message(pods, pod(spec.clone()));
            if want.is_empty() {
                assert_eq!(got, "", "{spec}");
            } else {
                assert!(
                    got.starts_with(&format!("Pod \"web\" is invalid: {want}")),
                    "{spec}: {got}"
                );
            }
        }
        let got = message(pods, pod(json!({"dnsConfig": {"searches": searches}})));
        assert!(
            got.contains("spec.dnsConfig.searches: Invalid value: []string{\"d0.example\", ")
                && got.ends_with(": must not have more than 32 search paths"),
            "{got}"
        );
        let got = message(pods, pod(json!({"dnsConfig": {"searches": long}})));
        assert!(
            got.ends_with(": must not have more than 2048 characters (including spaces) in the search list"),
            "{got}"
        );
        // Templates are checked where they are.
        let template = json!({"spec": {"dnsPolicy": "None", "containers": [{"name": "c"}]}});
        let got = message(
            res("apps", "deployments"),
            json!({"metadata": {"name": "web"}, "spec": {"template": template.clone()}}),
        );
        assert!(
            got.starts_with(
                "Deployment.apps \"web\" is invalid: spec.template.spec.dnsConfig: Required value"
            ),
            "{got}"
        );
        let got = message(
            res("batch", "cronjobs"),
            json!({"metadata": {"name": "web"}, "spec": {"schedule": "* * * * *",
                "jobTemplate": {"spec": {"template": template}}}}),
        );
        assert!(
            got.contains("spec.jobTemplate.spec.template.spec.dnsConfig: Required value"),
            "{got}"
        );
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
                "CronJob.batch \"report\" is invalid: spec.timeZone: Invalid value: \"MSK\": unknown time zone MSK"
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
        assert_eq!(
            message(res("batch", "cronjobs"), cj("UTC", "every day")),
            "CronJob.batch \"report\" is invalid: spec.schedule: Invalid value: \"every day\": expected exactly 5 fields, found 2: [every day]"
        );
        assert_eq!(
            message(res("batch", "cronjobs"), cj("UTC", "61 * * * *")),
            "CronJob.batch \"report\" is invalid: spec.schedule: Invalid value: \"61 * * * *\": end of range (61) above maximum (59): 61"
        );
        let hpa = |min: i64, max: i64| {
            json!({"metadata": {"name": "h"}, "spec": {
            "scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": min, "maxReplicas": max}})
        };
        let hpas =
            crate::api::registry::find("autoscaling", "v2", "horizontalpodautoscalers").expect("served");
        assert_eq!(
            message(hpas, hpa(0, 3)),
            "HorizontalPodAutoscaler.autoscaling \"h\" is invalid: spec.minReplicas: Invalid value: 0: must be greater than or equal to 1"
        );
        assert_eq!(
            message(hpas, hpa(1, 0)),
            "HorizontalPodAutoscaler.autoscaling \"h\" is invalid: spec.maxReplicas: Invalid value: 0: must be greater than 0"
        );
        assert_eq!(message(hpas, hpa(2, 2)), "");
        let deploy = json!({"metadata": {"name": "d"}, "spec": {"strategy": {"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}});
        assert_eq!(
            message(res("apps", "deployments"), deploy),
            "Deployment.apps \"d\" is invalid: spec.strategy.rollingUpdate.maxUnavailable: Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"0%\"}: may not be 0 when `maxSurge` is 0"
        );
        let job = json!({"metadata": {"name": "j"}, "spec": {"podFailurePolicy": {"rules": []},
            "template": {"spec": {"restartPolicy": "OnFailure"}}}});
        assert_eq!(
            message(res("batch", "jobs"), job),
            "Job.batch \"j\" is invalid: spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified"
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
            "Ingress.networking.k8s.io \"i\" is invalid: spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"
        );
    }
}
