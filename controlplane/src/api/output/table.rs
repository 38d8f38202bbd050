//! Server-side `meta.k8s.io/v1 Table` output for `kubectl get`: per-kind columns, each row with
//! a PartialObjectMetadata (or the full object with `includeObject=Object`).

use std::time::SystemTime;

use serde_json::{Value, json};

use crate::api::object::age;
use crate::api::registry::Resource;

struct Column {
    name: &'static str,
    ty: &'static str,
    priority: u8,
}

const fn col(name: &'static str, ty: &'static str, priority: u8) -> Column {
    Column { name, ty, priority }
}

fn columns(r: &Resource) -> Vec<Column> {
    match (r.group, r.plural) {
        ("", "pods") => vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "string", 0),
            col("Age", "string", 0),
            col("IP", "string", 1),
            col("Node", "string", 1),
            col("Nominated Node", "string", 1),
            col("Readiness Gates", "string", 1),
        ],
        ("", "namespaces") => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Age", "string", 0),
        ],
        ("", "nodes") => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Roles", "string", 0),
            col("Age", "string", 0),
            col("Version", "string", 0),
            col("Internal-IP", "string", 1),
            col("External-IP", "string", 1),
            col("OS-Image", "string", 1),
            col("Kernel-Version", "string", 1),
            col("Container-Runtime", "string", 1),
        ],
        ("", "configmaps") => vec![
            col("Name", "string", 0),
            col("Data", "integer", 0),
            col("Age", "string", 0),
        ],
        ("", "secrets") => {
            vec![
                col("Name", "string", 0),
                col("Type", "string", 0),
                col("Data", "integer", 0),
                col("Age", "string", 0),
            ]
        }
        ("", "serviceaccounts") => vec![
            col("Name", "string", 0),
            col("Secrets", "integer", 0),
            col("Age", "string", 0),
        ],
        ("", "services") => vec![
            col("Name", "string", 0),
            col("Type", "string", 0),
            col("Cluster-IP", "string", 0),
            col("External-IP", "string", 0),
            col("Port(s)", "string", 0),
            col("Age", "string", 0),
            col("Selector", "string", 1),
        ],
        ("apps", "deployments") => vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Up-to-date", "string", 0),
            col("Available", "string", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ],
        ("apps", "replicasets") => vec![
            col("Name", "string", 0),
            col("Desired", "integer", 0),
            col("Current", "integer", 0),
            col("Ready", "integer", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ],
        ("", "replicationcontrollers") => vec![
            col("Name", "string", 0),
            col("Desired", "integer", 0),
            col("Current", "integer", 0),
            col("Ready", "integer", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ],
        ("apps", "statefulsets") => vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
        ],
        ("apps", "daemonsets") => vec![
            col("Name", "string", 0),
            col("Desired", "integer", 0),
            col("Current", "integer", 0),
            col("Ready", "integer", 0),
            col("Up-to-date", "integer", 0),
            col("Available", "integer", 0),
            col("Node Selector", "string", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ],
        ("apps", "controllerrevisions") => vec![
            col("Name", "string", 0),
            col("Controller", "string", 0),
            col("Revision", "integer", 0),
            col("Age", "string", 0),
        ],
        ("", "componentstatuses") => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Message", "string", 0),
            col("Error", "string", 0),
        ],
        ("storage.k8s.io", "storageclasses") => vec![
            col("Name", "string", 0),
            col("Provisioner", "string", 0),
            col("ReclaimPolicy", "string", 0),
            col("VolumeBindingMode", "string", 0),
            col("AllowVolumeExpansion", "string", 0),
            col("Age", "string", 0),
        ],
        ("storage.k8s.io", "csinodes") => vec![
            col("Name", "string", 0),
            col("Drivers", "integer", 0),
            col("Age", "string", 0),
        ],
        ("certificates.k8s.io", "certificatesigningrequests") => vec![
            col("Name", "string", 0),
            col("Age", "string", 0),
            col("SignerName", "string", 0),
            col("Requestor", "string", 0),
            col("RequestedDuration", "string", 0),
            col("Condition", "string", 0),
        ],
        ("storage.k8s.io", "volumeattachments") => vec![
            col("Name", "string", 0),
            col("Attacher", "string", 0),
            col("PV", "string", 0),
            col("Node", "string", 0),
            col("Attached", "boolean", 0),
            col("Age", "string", 0),
        ],
        ("batch", "jobs") => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Completions", "string", 0),
            col("Duration", "string", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ],
        ("batch", "cronjobs") => vec![
            col("Name", "string", 0),
            col("Schedule", "string", 0),
            col("Timezone", "string", 0),
            col("Suspend", "boolean", 0),
            col("Active", "integer", 0),
            col("Last Schedule", "string", 0),
            col("Age", "string", 0),
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ],
        ("autoscaling", "horizontalpodautoscalers") => vec![
            col("Name", "string", 0),
            col("Reference", "string", 0),
            col("Targets", "string", 0),
            col("MinPods", "string", 0),
            col("MaxPods", "string", 0),
            col("Replicas", "string", 0),
            col("Age", "string", 0),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            col("Name", "string", 0),
            col("Min Available", "string", 0),
            col("Max Unavailable", "string", 0),
            col("Allowed Disruptions", "integer", 0),
            col("Age", "string", 0),
        ],
        ("", "events") | ("events.k8s.io", "events") => vec![
            col("Last Seen", "string", 0),
            col("Type", "string", 0),
            col("Reason", "string", 0),
            col("Object", "string", 0),
            col("Subobject", "string", 1),
            col("Source", "string", 1),
            col("Message", "string", 0),
            col("First Seen", "string", 1),
            col("Count", "string", 1),
            col("Name", "string", 1),
        ],
        _ => vec![col("Name", "string", 0), col("Age", "string", 0)],
    }
}

/// The TARGETS cell of an HPA (upstream's `formatHPAMetrics`): `current/target` per metric,
/// the first two, then `+ N more...`.
fn hpa_targets(specs: &Value, statuses: &Value) -> String {
    let specs = specs.as_array().cloned().unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let unknown = || "<unknown>".to_string();
    let status = |i: usize, key: &str| -> Option<Value> {
        statuses
            .get(i)
            .map(|st| st[key].clone())
            .filter(|v| v.is_object())
    };
    let q = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let mut list: Vec<String> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let ty = spec["type"].as_str().unwrap_or_default();
        let item = match ty {
            "External" | "Object" => {
                let key = if ty == "External" { "external" } else { "object" };
                let target = &spec[key]["target"];
                let current = status(i, key);
                match q(&target["averageValue"]) {
                    Some(avg) => {
                        let cur = current
                            .and_then(|c| q(&c["current"]["averageValue"]))
                            .unwrap_or_else(unknown);
                        format!("{cur}/{avg} (avg)")
                    }
                    None => {
                        let cur = current
                            .and_then(|c| q(&c["current"]["value"]))
                            .unwrap_or_else(unknown);
                        format!("{cur}/{}", q(&target["value"]).unwrap_or_default())
                    }
                }
            }
            "Pods" => {
                let cur = status(i, "pods")
                    .and_then(|c| q(&c["current"]["averageValue"]))
                    .unwrap_or_else(unknown);
                format!(
                    "{cur}/{}",
                    q(&spec["pods"]["target"]["averageValue"]).unwrap_or_default()
                )
            }
            "Resource" | "ContainerResource" => {
                let key = if ty == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let source = &spec[key];
                let current = status(i, key);
                let resource = s(&source["name"]);
                match q(&source["target"]["averageValue"]) {
                    Some(avg) => {
                        let cur = current
                            .and_then(|c| q(&c["current"]["averageValue"]))
                            .unwrap_or_else(unknown);
                        format!("{resource}: {cur}/{avg}")
                    }
                    None => {
                        let cur = current
                            .and_then(|c| c["current"]["averageUtilization"].as_i64())
                            .map_or_else(unknown, |u| format!("{u}%"));
                        let target = source["target"]["averageUtilization"]
                            .as_i64()
                            .map_or_else(|| "<auto>".to_string(), |u| format!("{u}%"));
                        format!("{resource}: {cur}/{target}")
                    }
                }
            }
            _ => "<unknown type>".into(),
        };
        list.push(item);
    }
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        return format!("{} + {} more...", list.join(", "), count - 2);
    }
    list.join(", ")
}

/// The cells of an Event row (upstream's `printEvent`, wide: the server prints every column),
/// from a core/v1 Event or an events.k8s.io/v1 one (its fields under their newer names).
fn event_cells(obj: &Value, now: SystemTime) -> Vec<Value> {
    let newer = obj.get("regarding").is_some() || obj["apiVersion"] == "events.k8s.io/v1";
    let field = |old: &str, new: &str| -> Value { if newer { obj[new].clone() } else { obj[old].clone() } };
    let since = |t: &Value| seconds_between(t, None, now).map(human_duration);
    let first = since(&field("firstTimestamp", "deprecatedFirstTimestamp"))
        .or_else(|| since(&obj["eventTime"]))
        .unwrap_or_else(|| "<unknown>".into());
    let mut last = since(&field("lastTimestamp", "deprecatedLastTimestamp")).unwrap_or_else(|| first.clone());
    let mut count = field("count", "deprecatedCount").as_i64().unwrap_or(0);
    if obj["series"].is_object() {
        last = since(&obj["series"]["lastObservedTime"]).unwrap_or_else(|| "<unknown>".into());
        count = obj["series"]["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let involved = field("involvedObject", "regarding");
    let kind = s(&involved["kind"]).to_lowercase();
    let target = match involved["name"].as_str().filter(|n| !n.is_empty()) {
        Some(n) => format!("{kind}/{n}"),
        None => kind,
    };
    let source = field("source", "deprecatedSource");
    let first_non_empty = |a: &Value, b: &Value| -> String {
        a.as_str()
            .filter(|x| !x.is_empty())
            .or(b.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let component = first_non_empty(&source["component"], &obj["reportingController"]);
    let instance = first_non_empty(&source["host"], &obj["reportingInstance"]);
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        json!(s(&obj["type"])),
        json!(s(&obj["reason"])),
        json!(target),
        json!(s(&involved["fieldPath"])),
        json!(source),
        json!(s(&field("message", "note")).trim()),
        json!(first),
        json!(count),
        json!(s(&obj["metadata"]["name"])),
    ]
}

/// `k=v,k2=v2` of a string map, `<none>` when empty (upstream's `labels.FormatLabels`).
fn format_labels(m: &Value) -> String {
    let pairs: Vec<String> = m
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    if pairs.is_empty() {
        "<none>".into()
    } else {
        pairs.join(",")
    }
}

/// apimachinery's `duration.HumanDuration` (kubectl's DURATION and AGE texts: `31s`, `4m23s`,
/// `3h5m`, `2d4h`, `1y20d`).
/// A CSR's CONDITION column (upstream's `extractCSRStatus`): Denied, else Approved, else
/// Pending, then `,Failed` and `,Issued`.
fn csr_condition(csr: &Value) -> String {
    let has = |t: &str| {
        csr["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|x| x["type"] == t))
    };
    let mut out = if has("Denied") {
        "Denied"
    } else if has("Approved") {
        "Approved"
    } else {
        "Pending"
    }
    .to_string();
    if has("Failed") {
        out.push_str(",Failed");
    }
    if csr["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
    {
        out.push_str(",Issued");
    }
    out
}

pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// metav1's `FormatLabelSelector`: requirements sorted by key, `<none>` when empty or absent.
fn format_label_selector(sel: &Value) -> String {
    if !sel.is_object() {
        return "<none>".into();
    }
    let mut reqs: Vec<(String, String)> = Vec::new();
    for (k, v) in sel["matchLabels"].as_object().into_iter().flatten() {
        reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or_default())));
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = s(&e["key"]);
        let mut values: Vec<String> = e["values"].as_array().into_iter().flatten().map(s).collect();
        values.sort();
        let text = match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        };
        reqs.push((key, text));
    }
    reqs.sort();
    let out: Vec<String> = reqs.into_iter().map(|(_, t)| t).collect();
    if out.is_empty() {
        "<none>".into()
    } else {
        out.join(",")
    }
}

/// Seconds from an RFC 3339 time to `now` (or to `until`).
fn seconds_between(from: &Value, until: Option<&Value>, now: SystemTime) -> Option<i64> {
    let start = kcore::time::parse_rfc3339(from.as_str()?)?;
    let end = match until.and_then(Value::as_str) {
        Some(t) => kcore::time::parse_rfc3339(t)?,
        None => kcore::time::unix_seconds(now),
    };
    Some(end - start)
}

/// The CONTAINERS and IMAGES cells of a pod template.
fn template_containers(template: &Value) -> (String, String) {
    container_cells(&template["spec"])
}

/// The CONTAINERS and IMAGES cells of a pod spec.
fn container_cells(pod_spec: &Value) -> (String, String) {
    let containers = pod_spec["containers"].as_array().cloned().unwrap_or_default();
    let names = containers
        .iter()
        .map(|c| s(&c["name"]))
        .collect::<Vec<_>>()
        .join(",");
    let images = containers
        .iter()
        .map(|c| s(&c["image"]))
        .collect::<Vec<_>>()
        .join(",");
    (names, images)
}

/// kubectl's Job STATUS.
fn job_status(job: &Value) -> &'static str {
    let has = |t: &str| {
        job["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == t && c["status"] == "True")
    };
    if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if job["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else if has("Suspended") {
        "Suspended"
    } else if has("FailureTarget") {
        "FailureTarget"
    } else if has("SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// Whether container status `c` is of a native sidecar (an init container with
/// `restartPolicy: Always`).
fn is_sidecar(pod: &Value, c: &Value) -> bool {
    pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["name"] == c["name"] && s["restartPolicy"] == "Always")
}

/// kubectl's pod STATUS column (the essentials of upstream `printPod`).
pub fn pod_status(pod: &Value) -> String {
    let st = &pod["status"];
    let mut reason = st["reason"]
        .as_str()
        .or(st["phase"].as_str())
        .unwrap_or("Pending")
        .to_string();
    let inits = st["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total_init = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    let mut initializing = false;
    for (idx, c) in inits.iter().enumerate() {
        let state = &c["state"];
        if state["terminated"]["exitCode"].as_i64() == Some(0) {
            continue;
        }
        // A native sidecar that started does not hold initialization back.
        if is_sidecar(pod, c) && c["started"].as_bool() == Some(true) {
            continue;
        }
        initializing = true;
        reason = if let Some(r) = state["terminated"]["reason"].as_str() {
            format!("Init:{r}")
        } else if !state["terminated"].is_null() {
            format!("Init:ExitCode:{}", i(&state["terminated"]["exitCode"]))
        } else if let Some(r) = state["waiting"]["reason"]
            .as_str()
            .filter(|r| *r != "PodInitializing")
        {
            format!("Init:{r}")
        } else {
            format!("Init:{idx}/{total_init}")
        };
        break;
    }
    let initialized = st["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Initialized" && c["status"] == "True");
    // As upstream: with the Initialized condition True the main containers decide.
    if initialized {
        initializing = false;
    }
    if !initializing {
        let mut has_running = false;
        for c in st["containerStatuses"].as_array().into_iter().flatten().rev() {
            let state = &c["state"];
            if let Some(r) = state["waiting"]["reason"].as_str() {
                reason = r.to_string();
            } else if let Some(r) = state["terminated"]["reason"].as_str() {
                reason = r.to_string();
            } else if !state["terminated"].is_null() {
                let sig = i(&state["terminated"]["signal"]);
                reason = if sig != 0 {
                    format!("Signal:{sig}")
                } else {
                    format!("ExitCode:{}", i(&state["terminated"]["exitCode"]))
                };
            } else if !state["running"].is_null() && c["ready"].as_bool() == Some(true) {
                has_running = true;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        reason = if st["reason"].as_str() == Some("NodeLost") {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

fn cells(r: &Resource, obj: &Value, now: SystemTime) -> Vec<Value> {
    let name = json!(s(&obj["metadata"]["name"]));
    let created = age(
        obj["metadata"]["creationTimestamp"].as_str().unwrap_or_default(),
        now,
    );
    let none = || json!("<none>");
    match (r.group, r.plural) {
        ("", "pods") => {
            let statuses = obj["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            // Native sidecars count as containers of the pod (upstream printPod).
            let sidecars: Vec<Value> = obj["status"]["initContainerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| is_sidecar(obj, c))
                .cloned()
                .collect();
            let total = obj["spec"]["containers"].as_array().map_or(0, Vec::len)
                + obj["spec"]["initContainers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["restartPolicy"] == "Always")
                    .count();
            let ready = statuses
                .iter()
                .chain(&sidecars)
                .filter(|c| c["ready"].as_bool() == Some(true))
                .count();
            let restarts: i64 = statuses
                .iter()
                .chain(&sidecars)
                .map(|c| i(&c["restartCount"]))
                .sum();
            let ip = obj["status"]["podIP"].as_str().map_or_else(none, |x| json!(x));
            let node = obj["spec"]["nodeName"].as_str().map_or_else(none, |x| json!(x));
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(pod_status(obj)),
                json!(restarts.to_string()),
                json!(created),
                ip,
                node,
                none(),
                none(),
            ]
        }
        ("", "namespaces") => vec![
            name,
            json!(obj["status"]["phase"].as_str().unwrap_or("Active")),
            json!(created),
        ],
        ("", "nodes") => {
            let ready = obj["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| {
                    if c["status"] == "True" {
                        "Ready"
                    } else if c["status"] == "False" {
                        "NotReady"
                    } else {
                        "Unknown"
                    }
                })
                .unwrap_or("Unknown");
            let status = if obj["spec"]["unschedulable"].as_bool() == Some(true) {
                format!("{ready},SchedulingDisabled")
            } else {
                ready.to_string()
            };
            let roles: Vec<String> = obj["metadata"]["labels"]
                .as_object()
                .map(|l| {
                    l.keys()
                        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let addr = |t: &str| {
                obj["status"]["addresses"]
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["type"] == t))
                    .map_or_else(none, |x| x["address"].clone())
            };
            let info = &obj["status"]["nodeInfo"];
            vec![
                name,
                json!(status),
                json!(if roles.is_empty() {
                    "<none>".to_string()
                } else {
                    roles.join(",")
                }),
                json!(created),
                json!(s(&info["kubeletVersion"])),
                addr("InternalIP"),
                addr("ExternalIP"),
                json!(s(&info["osImage"])),
                json!(s(&info["kernelVersion"])),
                json!(s(&info["containerRuntimeVersion"])),
            ]
        }
        ("", "configmaps") => {
            let n = obj["data"].as_object().map_or(0, |m| m.len())
                + obj["binaryData"].as_object().map_or(0, |m| m.len());
            vec![name, json!(n), json!(created)]
        }
        ("", "secrets") => {
            let n = obj["data"].as_object().map_or(0, |m| m.len());
            vec![
                name,
                json!(obj["type"].as_str().unwrap_or("Opaque")),
                json!(n),
                json!(created),
            ]
        }
        ("", "serviceaccounts") => vec![
            name,
            json!(obj["secrets"].as_array().map_or(0, Vec::len)),
            json!(created),
        ],
        ("", "services") => {
            let spec = &obj["spec"];
            let ports: Vec<String> = spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(np) => format!("{}:{np}/{proto}", i(&p["port"])),
                        None => format!("{}/{proto}", i(&p["port"])),
                    }
                })
                .collect();
            let selector = spec["selector"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .filter(|x| !x.is_empty())
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(spec["type"].as_str().unwrap_or("ClusterIP")),
                json!(spec["clusterIP"].as_str().unwrap_or("<none>")),
                json!("<none>"),
                json!(if ports.is_empty() {
                    "<none>".to_string()
                } else {
                    ports.join(",")
                }),
                json!(created),
                json!(selector),
            ]
        }
        ("apps", "deployments") | ("apps", "replicasets") => {
            let spec = &obj["spec"];
            let st = &obj["status"];
            let containers = spec["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let names = containers
                .iter()
                .map(|c| s(&c["name"]))
                .collect::<Vec<_>>()
                .join(",");
            let images = containers
                .iter()
                .map(|c| s(&c["image"]))
                .collect::<Vec<_>>()
                .join(",");
            let selector = spec["selector"]["matchLabels"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let desired = spec["replicas"].as_i64().unwrap_or(1);
            if r.plural == "deployments" {
                vec![
                    name,
                    json!(format!("{}/{desired}", i(&st["readyReplicas"]))),
                    json!(i(&st["updatedReplicas"])),
                    json!(i(&st["availableReplicas"])),
                    json!(created),
                    json!(names),
                    json!(images),
                    json!(selector),
                ]
            } else {
                vec![
                    name,
                    json!(desired),
                    json!(i(&st["replicas"])),
                    json!(i(&st["readyReplicas"])),
                    json!(created),
                    json!(names),
                    json!(images),
                    json!(selector),
                ]
            }
        }
        ("", "replicationcontrollers") => {
            let spec = &obj["spec"];
            let containers = spec["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let join = |key: &str| {
                containers
                    .iter()
                    .map(|c| s(&c[key]))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let selector = spec["selector"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            vec![
                name,
                json!(spec["replicas"].as_i64().unwrap_or(1)),
                json!(i(&obj["status"]["replicas"])),
                json!(i(&obj["status"]["readyReplicas"])),
                json!(created),
                json!(join("name")),
                json!(join("image")),
                json!(selector),
            ]
        }
        ("", "componentstatuses") => {
            let healthy = obj["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Healthy"));
            let status = match healthy.map(|c| &c["status"]) {
                Some(v) if v == "True" => "Healthy",
                Some(v) if v == "False" => "Unhealthy",
                _ => "Unknown",
            };
            let field = |k: &str| json!(healthy.map(|c| s(&c[k])).unwrap_or_default());
            vec![name, json!(status), field("message"), field("error")]
        }
        ("storage.k8s.io", "storageclasses") => {
            let default =
                obj["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true";
            let name = if default {
                json!(format!("{} (default)", s(&obj["metadata"]["name"])))
            } else {
                name
            };
            vec![
                name,
                json!(s(&obj["provisioner"])),
                json!(obj["reclaimPolicy"].as_str().unwrap_or("Delete")),
                json!(obj["volumeBindingMode"].as_str().unwrap_or("Immediate")),
                json!(obj["allowVolumeExpansion"].as_bool().unwrap_or(false).to_string()),
                json!(created),
            ]
        }
        ("storage.k8s.io", "csinodes") => vec![
            name,
            json!(obj["spec"]["drivers"].as_array().map_or(0, Vec::len)),
            json!(created),
        ],
        ("storage.k8s.io", "volumeattachments") => vec![
            name,
            json!(s(&obj["spec"]["attacher"])),
            json!(s(&obj["spec"]["source"]["persistentVolumeName"])),
            json!(s(&obj["spec"]["nodeName"])),
            json!(obj["status"]["attached"].as_bool().unwrap_or(false)),
            json!(created),
        ],
        ("certificates.k8s.io", "certificatesigningrequests") => vec![
            name,
            json!(created),
            json!(s(&obj["spec"]["signerName"])),
            json!(s(&obj["spec"]["username"])),
            obj["spec"]["expirationSeconds"]
                .as_i64()
                .map_or_else(none, |e| json!(human_duration(e))),
            json!(csr_condition(obj)),
        ],
        ("apps", "statefulsets") => {
            let (names, images) = template_containers(&obj["spec"]["template"]);
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    i(&obj["status"]["readyReplicas"]),
                    obj["spec"]["replicas"].as_i64().unwrap_or(1)
                )),
                json!(created),
                json!(names),
                json!(images),
            ]
        }
        ("apps", "daemonsets") => {
            let st = &obj["status"];
            let (names, images) = template_containers(&obj["spec"]["template"]);
            vec![
                name,
                json!(i(&st["desiredNumberScheduled"])),
                json!(i(&st["currentNumberScheduled"])),
                json!(i(&st["numberReady"])),
                json!(i(&st["updatedNumberScheduled"])),
                json!(i(&st["numberAvailable"])),
                json!(format_labels(&obj["spec"]["template"]["spec"]["nodeSelector"])),
                json!(created),
                json!(names),
                json!(images),
                json!(format_label_selector(&obj["spec"]["selector"])),
            ]
        }
        ("apps", "controllerrevisions") => {
            let controller = obj["metadata"]["ownerReferences"]
                .as_array()
                .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
                .map_or_else(
                    || "<none>".to_string(),
                    |r| {
                        let group = s(&r["apiVersion"])
                            .rsplit_once('/')
                            .map(|(g, _)| g.to_string())
                            .unwrap_or_default();
                        let kind = s(&r["kind"]).to_lowercase();
                        let gk = if group.is_empty() {
                            kind
                        } else {
                            format!("{kind}.{group}")
                        };
                        format!("{gk}/{}", s(&r["name"]))
                    },
                );
            vec![
                name,
                json!(controller),
                json!(i(&obj["revision"])),
                json!(created),
            ]
        }
        ("batch", "jobs") => {
            let spec = &obj["spec"];
            let st = &obj["status"];
            let succeeded = i(&st["succeeded"]);
            let completions = match spec["completions"].as_i64() {
                Some(c) => format!("{succeeded}/{c}"),
                None => match spec["parallelism"].as_i64().unwrap_or(0) {
                    p if p > 1 => format!("{succeeded}/1 of {p}"),
                    _ => format!("{succeeded}/1"),
                },
            };
            let duration = seconds_between(
                &st["startTime"],
                Some(&st["completionTime"]).filter(|v| !v.is_null()),
                now,
            )
            .map(human_duration)
            .unwrap_or_default();
            let (names, images) = container_cells(&spec["template"]["spec"]);
            let created = seconds_between(&obj["metadata"]["creationTimestamp"], None, now)
                .map_or_else(|| "<unknown>".to_string(), human_duration);
            vec![
                name,
                json!(job_status(obj)),
                json!(completions),
                json!(duration),
                json!(created),
                json!(names),
                json!(images),
                json!(format_label_selector(&spec["selector"])),
            ]
        }
        ("autoscaling", "horizontalpodautoscalers") => {
            let spec = &obj["spec"];
            let target = &spec["scaleTargetRef"];
            vec![
                name,
                json!(format!("{}/{}", s(&target["kind"]), s(&target["name"]))),
                json!(hpa_targets(&spec["metrics"], &obj["status"]["currentMetrics"])),
                json!(
                    spec["minReplicas"]
                        .as_i64()
                        .map_or_else(|| "<unset>".to_string(), |m| m.to_string())
                ),
                json!(i(&spec["maxReplicas"])),
                json!(i(&obj["status"]["currentReplicas"])),
                json!(created),
            ]
        }
        ("policy", "poddisruptionbudgets") => {
            let int_or_string = |v: &Value| match v {
                Value::String(x) => x.clone(),
                Value::Number(n) => n.to_string(),
                _ => "N/A".into(),
            };
            vec![
                name,
                json!(int_or_string(&obj["spec"]["minAvailable"])),
                json!(int_or_string(&obj["spec"]["maxUnavailable"])),
                json!(i(&obj["status"]["disruptionsAllowed"])),
                json!(created),
            ]
        }
        ("", "events") | ("events.k8s.io", "events") => event_cells(obj, now),
        ("batch", "cronjobs") => {
            let spec = &obj["spec"];
            let last = seconds_between(&obj["status"]["lastScheduleTime"], None, now)
                .map_or_else(|| "<none>".to_string(), human_duration);
            let suspend = match spec["suspend"].as_bool() {
                Some(true) => "True",
                Some(false) => "False",
                None => "<unset>",
            };
            let template = &spec["jobTemplate"]["spec"];
            let created = seconds_between(&obj["metadata"]["creationTimestamp"], None, now)
                .map_or_else(|| "<unknown>".to_string(), human_duration);
            let (names, images) = container_cells(&template["template"]["spec"]);
            vec![
                name,
                json!(s(&spec["schedule"])),
                json!(spec["timeZone"].as_str().unwrap_or("<none>")),
                json!(suspend),
                json!(obj["status"]["active"].as_array().map_or(0, Vec::len)),
                json!(last),
                json!(created),
                json!(names),
                json!(images),
                json!(format_label_selector(&template["selector"])),
            ]
        }
        _ => vec![name, json!(created)],
    }
}

/// PartialObjectMetadata for a row.
fn partial(obj: &Value) -> Value {
    json!({ "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"].clone() })
}

/// A Table of `objects`, with `resource_version` (and `continue`) in its list metadata.
pub fn table(
    r: &Resource,
    objects: &[Value],
    resource_version: &str,
    cont: Option<&str>,
    full: bool,
) -> Value {
    let now = SystemTime::now();
    let defs: Vec<Value> = columns(r)
        .into_iter()
        .map(|c| {
            json!({
                "name": c.name, "type": c.ty, "format": if c.name == "Name" { "name" } else { "" },
                "description": c.name, "priority": c.priority,
            })
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| json!({ "cells": cells(r, o, now), "object": if full { o.clone() } else { partial(o) } }))
        .collect();
    let mut meta = json!({ "resourceVersion": resource_version });
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({ "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs, "rows": rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_condition_column_as_upstream() {
        let csr = |types: &[&str], cert: &str| {
            let c: Vec<Value> = types
                .iter()
                .map(|t| json!({"type": t, "status": "True"}))
                .collect();
            json!({"status": {"conditions": c, "certificate": cert}})
        };
        let cases = [
            (csr(&[], ""), "Pending"),
            (csr(&["Approved"], ""), "Approved"),
            (csr(&["Approved"], "Y2VydA=="), "Approved,Issued"),
            (csr(&["Approved", "Failed"], ""), "Approved,Failed"),
            (csr(&["Denied"], ""), "Denied"),
            (csr(&["Failed"], ""), "Pending,Failed"),
        ];
        for (obj, want) in cases {
            assert_eq!(csr_condition(&obj), want, "{obj}");
        }
    }

    #[test]
    fn human_durations_as_kubectl_prints_them() {
        let cases = [
            (31, "31s"),
            (119, "119s"),
            (134, "2m14s"),
            (263, "4m23s"),
            (600, "10m"),
            (3 * 3600 + 300, "3h5m"),
            (10 * 3600, "10h"),
            (2 * 86_400 + 4 * 3600, "2d4h"),
            (30 * 86_400, "30d"),
            (800 * 86_400, "2y70d"),
        ];
        for (secs, text) in cases {
            assert_eq!(human_duration(secs), text, "{secs}");
        }
    }

    #[test]
    fn job_and_cronjob_rows() {
        let res = |plural| crate::api::registry::find("batch", "v1", plural).expect("served");
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_780_000_000);
        let at = |secs: u64| kcore::time::rfc3339(now - std::time::Duration::from_secs(secs));
        let job = json!({"metadata": {"name": "pi", "creationTimestamp": at(300)},
            "spec": {"completions": 3, "parallelism": 2, "selector": {"matchLabels": {"b": "2", "a": "1"}},
                     "template": {"spec": {"containers": [{"name": "pi", "image": "perl"}]}}},
            "status": {"succeeded": 3, "startTime": at(300), "completionTime": at(269),
                       "conditions": [{"type": "Complete", "status": "True"}]}});
        assert_eq!(
            cells(res("jobs"), &job, now),
            [
                json!("pi"),
                json!("Complete"),
                json!("3/3"),
                json!("31s"),
                json!("5m"),
                json!("pi"),
                json!("perl"),
                json!("a=1,b=2")
            ]
        );
        let running = json!({"metadata": {"name": "w"}, "spec": {"parallelism": 4},
            "status": {"startTime": at(263), "conditions": [{"type": "FailureTarget", "status": "True"}]}});
        let row = cells(res("jobs"), &running, now);
        assert_eq!(
            row[1..4],
            [json!("FailureTarget"), json!("0/1 of 4"), json!("4m23s")]
        );
        assert_eq!(row[7], json!("<none>"));
        let cj = json!({"metadata": {"name": "report", "creationTimestamp": at(164)},
            "spec": {"schedule": "*/1 * * * *", "suspend": false,
                     "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}},
            "status": {"lastScheduleTime": at(14), "active": [{"name": "report-1"}]}});
        assert_eq!(
            cells(res("cronjobs"), &cj, now)[..7],
            [
                json!("report"),
                json!("*/1 * * * *"),
                json!("<none>"),
                json!("False"),
                json!(1),
                json!("14s"),
                json!("2m44s")
            ]
        );
    }

    #[test]
    fn native_sidecars_count_as_pod_containers() {
        let pod = json!({"metadata": {"name": "staged"},
            "spec": {"containers": [{"name": "main"}],
                     "initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}]},
            "status": {"phase": "Running",
                "conditions": [{"type": "Initialized", "status": "True"}],
                "initContainerStatuses": [
                    {"name": "setup", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "proxy", "started": true, "ready": true, "restartCount": 2, "state": {"running": {}}}],
                "containerStatuses": [{"name": "main", "ready": true, "restartCount": 1, "state": {"running": {}}}]}});
        assert_eq!(pod_status(&pod), "Running");
        let pods = crate::api::registry::RESOURCES
            .iter()
            .find(|r| r.group.is_empty() && r.plural == "pods")
            .expect("pods");
        let row = cells(pods, &pod, SystemTime::UNIX_EPOCH);
        assert_eq!(row[1..4], [json!("2/2"), json!("Running"), json!("3")]);
        let mut starting = pod.clone();
        starting["status"]["conditions"] = json!([]);
        starting["status"]["initContainerStatuses"][1] =
            json!({"name": "proxy", "started": false, "state": {"waiting": {"reason": "PodInitializing"}}});
        assert_eq!(pod_status(&starting), "Init:1/2");
    }

    #[test]
    fn pod_status_strings() {
        let p = |st: Value| json!({"spec": {"containers": [{}], "initContainers": [{}, {}]}, "status": st, "metadata": {}});
        assert_eq!(pod_status(&p(json!({"phase": "Pending"}))), "Pending");
        assert_eq!(
            pod_status(&p(
                json!({"phase": "Running", "containerStatuses": [{"ready": true, "state": {"running": {}}}]})
            )),
            "Running"
        );
        assert_eq!(
            pod_status(&p(
                json!({"phase": "Running", "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]})
            )),
            "CrashLoopBackOff"
        );
        assert_eq!(
            pod_status(&p(json!({"phase": "Pending", "initContainerStatuses": [
                {"state": {"terminated": {"exitCode": 0}}}, {"state": {"running": {}}}]}))),
            "Init:1/2"
        );
        assert_eq!(
            pod_status(&p(
                json!({"phase": "Pending", "initContainerStatuses": [{"state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
            )),
            "Init:Error"
        );
        let mut t = p(json!({"phase": "Running"}));
        t["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(pod_status(&t), "Terminating");
    }

    fn res(plural: &str) -> &'static Resource {
        crate::api::registry::RESOURCES
            .iter()
            .find(|r| r.group == "apps" && r.plural == plural)
            .expect("resource")
    }

    #[test]
    fn workload_rows_as_kubectl_prints_them() {
        let now = SystemTime::now();
        let sts = json!({"metadata": {"name": "web"}, "spec": {"replicas": 3,
            "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1"}]}}},
            "status": {"readyReplicas": 2}});
        let row = cells(res("statefulsets"), &sts, now);
        assert_eq!(
            (&row[1], &row[3], &row[4]),
            (&json!("2/3"), &json!("nginx"), &json!("nginx:1"))
        );
        let ds = json!({"metadata": {"name": "agent"}, "spec": {
            "selector": {"matchLabels": {"app": "agent"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
            "template": {"spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "a", "image": "busybox"}]}}},
            "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                       "updatedNumberScheduled": 3, "numberAvailable": 2}});
        let row = cells(res("daemonsets"), &ds, now);
        assert_eq!(
            &row[1..7],
            &[
                json!(3),
                json!(3),
                json!(2),
                json!(3),
                json!(2),
                json!("disk=ssd")
            ]
        );
        assert_eq!(row[10], json!("app=agent,tier in (a,b)"));
        let cr = json!({"metadata": {"name": "web-5d9f8c7b6", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "u", "controller": true}]}, "revision": 2});
        let row = cells(res("controllerrevisions"), &cr, now);
        assert_eq!((&row[1], &row[2]), (&json!("statefulset.apps/web"), &json!(2)));
    }

    #[test]
    fn hpa_pdb_and_event_rows() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_780_000_000);
        let ago = |secs: u64| {
            kcore::time::rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_780_000_000 - secs))
        };
        let hpa_res =
            crate::api::registry::find("autoscaling", "v2", "horizontalpodautoscalers").expect("served");
        let hpa = json!({"metadata": {"name": "web", "creationTimestamp": ago(30)},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 2, "maxReplicas": 5,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}},
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "120"}}},
                ]},
            "status": {"currentReplicas": 3, "currentMetrics": [
                {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 95, "averageValue": "95m"}}}]}});
        assert_eq!(
            cells(hpa_res, &hpa, now),
            vec![
                json!("web"),
                json!("Deployment/web"),
                json!("cpu: 95%/80%, memory: <unknown>/100Mi + 1 more..."),
                json!("2"),
                json!(5),
                json!(3),
                json!("30s")
            ]
        );
        let bare = json!({"metadata": {"name": "b"}, "spec": {"scaleTargetRef": {"kind": "ReplicaSet", "name": "rs"}, "maxReplicas": 1}});
        let row = cells(hpa_res, &bare, now);
        assert_eq!(row[2], json!("<none>"));
        assert_eq!(row[3], json!("<unset>"));

        let pdb_res = crate::api::registry::find("policy", "v1", "poddisruptionbudgets").expect("served");
        let pdb = json!({"metadata": {"name": "zk", "creationTimestamp": ago(5)},
            "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}});
        assert_eq!(
            cells(pdb_res, &pdb, now),
            vec![json!("zk"), json!("50%"), json!("N/A"), json!(1), json!("5s")]
        );

        let ev_res = crate::api::registry::find("", "v1", "events").expect("served");
        let ev = json!({"metadata": {"name": "web-1.abc"}, "type": "Normal", "reason": "Scheduled",
            "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": ""},
            "source": {"component": "default-scheduler"},
            "message": "Successfully assigned default/web-1 to n1 ",
            "firstTimestamp": ago(200), "lastTimestamp": ago(65), "count": 3});
        assert_eq!(
            cells(ev_res, &ev, now),
            vec![
                json!("65s"),
                json!("Normal"),
                json!("Scheduled"),
                json!("pod/web-1"),
                json!(""),
                json!("default-scheduler"),
                json!("Successfully assigned default/web-1 to n1"),
                json!("3m20s"),
                json!(3),
                json!("web-1.abc")
            ]
        );
        let new_res = crate::api::registry::find("events.k8s.io", "v1", "events").expect("served");
        let newer = json!({"apiVersion": "events.k8s.io/v1", "metadata": {"name": "e"}, "type": "Warning",
            "reason": "BackOff", "regarding": {"kind": "Pod", "name": "p"}, "note": "Back-off",
            "eventTime": ago(10), "reportingController": "kubelet", "reportingInstance": "n1",
            "series": {"count": 7, "lastObservedTime": ago(2)}});
        assert_eq!(
            cells(new_res, &newer, now),
            vec![
                json!("2s"),
                json!("Warning"),
                json!("BackOff"),
                json!("pod/p"),
                json!(""),
                json!("kubelet, n1"),
                json!("Back-off"),
                json!("10s"),
                json!(7),
                json!("e")
            ]
        );
    }
}
