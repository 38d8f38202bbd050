//! Admission: defaulting ([`defaults`]) and validation ([`validation`]) of objects (docs/SEEDS-SPEC.md
//! §1.9-1.10), the shape and type checks of request bodies, and approval and signing of node
//! CSRs ([`csr`]). Pure functions of the objects they are given: nothing here reads the store.

mod csr;
mod defaults;
pub(crate) mod ephemeral;
mod validation;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kcore::qos::QosClass;
use serde_json::{Value, json};

pub(crate) use csr::{admit_csr, approval_update, serving_node};

use crate::api::object::selector::{labels_match, selector_requirements};
use crate::api::object::{self, b64, name_of};
use crate::api::registry::Resource;
use crate::api::status::ApiError;

/// Defaults and validation of a new or updated object (the seeds' API-50 defaults that need no
/// other objects, and the name rules).
pub(crate) fn admit(res: &Resource, obj: &mut Value, creating: bool) -> Result<(), ApiError> {
    let name = name_of(obj).to_string();
    let name_err = match (res.group, res.plural) {
        ("", "namespaces") | ("", "services") => object::dns1123_label_error(&name),
        ("rbac.authorization.k8s.io", _) => object::path_segment_error(&name),
        _ => object::dns1123_subdomain_error(&name),
    };
    if let Some(msg) = name_err {
        return Err(ApiError::invalid(
            res,
            &name,
            "metadata.name",
            &format!("Invalid value: {name:?}: {msg}"),
        ));
    }
    if let Some(labels) = obj["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            if !v.is_string() {
                return Err(ApiError::invalid(
                    res,
                    &name,
                    &format!("metadata.labels.{k}"),
                    "Invalid value: must be a string",
                ));
            }
        }
    }
    match (res.group, res.plural) {
        ("", "namespaces") => {
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            if creating {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
                obj["status"] = json!({ "phase": "Active" });
            }
        }
        ("", "pods") => {
            let containers = obj["spec"]["containers"].as_array().cloned().unwrap_or_default();
            if containers.is_empty() {
                return Err(ApiError::invalid(res, &name, "spec.containers", "Required value"));
            }
            for (i, c) in containers.iter().enumerate() {
                if c["name"].as_str().is_none_or(str::is_empty) {
                    return Err(ApiError::invalid(
                        res,
                        &name,
                        &format!("spec.containers[{i}].name"),
                        "Required value",
                    ));
                }
                if c["image"].as_str().is_none_or(str::is_empty) {
                    return Err(ApiError::invalid(
                        res,
                        &name,
                        &format!("spec.containers[{i}].image"),
                        "Required value",
                    ));
                }
            }
            let spec = &mut obj["spec"];
            for (k, v) in [
                ("restartPolicy", json!("Always")),
                ("dnsPolicy", json!("ClusterFirst")),
                ("terminationGracePeriodSeconds", json!(30)),
                ("schedulerName", json!("default-scheduler")),
                ("securityContext", json!({})),
                ("enableServiceLinks", json!(true)),
                ("preemptionPolicy", json!("PreemptLowerPriority")),
                ("priority", json!(0)),
            ] {
                if spec.get(k).is_none() {
                    spec[k] = v;
                }
            }
            let lists = ["containers", "initContainers", "ephemeralContainers"];
            for c in crate::api::object::containers_mut(spec, &lists) {
                if c.get("imagePullPolicy").is_none() {
                    c["imagePullPolicy"] =
                        json!(default_pull_policy(c["image"].as_str().unwrap_or_default()));
                }
                for (k, v) in [
                    ("terminationMessagePath", json!("/dev/termination-log")),
                    ("terminationMessagePolicy", json!("File")),
                    ("resources", json!({})),
                ] {
                    if c.get(k).is_none() {
                        c[k] = v;
                    }
                }
            }
            if creating {
                if obj["spec"]["ephemeralContainers"]
                    .as_array()
                    .is_some_and(|e| !e.is_empty())
                {
                    return Err(ApiError::invalid(
                        res,
                        &name,
                        "spec.ephemeralContainers",
                        "Forbidden: cannot be set on create",
                    ));
                }
                obj["status"] = json!({ "phase": "Pending" });
            }
        }
        ("apps", "deployments")
        | ("apps", "replicasets")
        | ("apps", "statefulsets")
        | ("apps", "daemonsets") => {
            let sel = &obj["spec"]["selector"];
            if sel.is_null() {
                return Err(ApiError::invalid(res, &name, "spec.selector", "Required value"));
            }
            let tmpl_labels = obj["spec"]["template"]["metadata"]["labels"].clone();
            let reqs = selector_requirements(sel);
            if !labels_match(&reqs, Some(&tmpl_labels)) {
                return Err(ApiError::invalid(
                    res,
                    &name,
                    "spec.template.metadata.labels",
                    &format!(
                        "Invalid value: {}: `selector` does not match template `labels`",
                        tmpl_labels
                    ),
                ));
            }
            if res.plural != "daemonsets" && obj["spec"].get("replicas").is_none() {
                obj["spec"]["replicas"] = json!(1);
            }
            if res.plural == "deployments" {
                if obj["spec"].get("progressDeadlineSeconds").is_none() {
                    obj["spec"]["progressDeadlineSeconds"] = json!(600);
                }
                // An absent or empty strategy (protobuf bodies carry `strategy: {}`) is a
                // rolling update; a rolling update without parameters gets 25 % / 25 %.
                let strategy = &mut obj["spec"]["strategy"];
                if strategy["type"].as_str().is_none_or(str::is_empty) {
                    strategy["type"] = json!("RollingUpdate");
                }
                if strategy["type"] == "RollingUpdate" {
                    let ru = &mut strategy["rollingUpdate"];
                    for k in ["maxSurge", "maxUnavailable"] {
                        if ru.get(k).is_none_or(Value::is_null) {
                            ru[k] = json!("25%");
                        }
                    }
                }
            }
        }
        ("", "services") => {
            let spec = &mut obj["spec"];
            if spec.get("type").is_none() {
                spec["type"] = json!("ClusterIP");
            }
            if spec.get("sessionAffinity").is_none() {
                spec["sessionAffinity"] = json!("None");
            }
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports {
                    if p.get("protocol").is_none() {
                        p["protocol"] = json!("TCP");
                    }
                    if p.get("targetPort").is_none() {
                        p["targetPort"] = p["port"].clone();
                    }
                }
            }
        }
        ("", "secrets") => {
            if obj.get("type").is_none() {
                obj["type"] = json!("Opaque");
            }
            if let Some(sd) = obj
                .get_mut("stringData")
                .and_then(Value::as_object_mut)
                .map(std::mem::take)
            {
                for (k, v) in sd {
                    obj["data"][&k] = json!(b64(v.as_str().unwrap_or_default()));
                }
                if let Some(m) = obj.as_object_mut() {
                    m.remove("stringData");
                }
            }
        }
        _ => {}
    }
    defaults::apply(res, obj);
    // After the defaults, as upstream: requests defaulted from limits take part.
    if creating && (res.group, res.plural) == ("", "pods") {
        obj["status"]["qosClass"] = json!(qos_class(&obj["spec"]).as_str());
    }
    validation::validate(res, obj)
}

/// The request body's apiVersion/kind must match the URL's resource when present.
pub(crate) fn check_type(res: &Resource, obj: &Value) -> Result<(), ApiError> {
    let kind = obj["kind"].as_str().unwrap_or(res.kind);
    let av = obj["apiVersion"].as_str().unwrap_or_default();
    if kind != res.kind || (!av.is_empty() && av != res.api_version()) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({}) or kind {kind} is not {}",
            res.api_version(),
            res.kind
        )));
    }
    Ok(())
}

/// imagePullPolicy default: `:latest` or no tag → Always, otherwise IfNotPresent (digests too).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// The pod's QoS class, by kcore's rules (the agent's too). Only what QoS reads is taken into a
/// typed `PodSpec`, numbers as quantity strings, so every pod gets a class before validation.
pub fn qos_class(spec: &Value) -> QosClass {
    let resources = |r: &Value| -> Option<ResourceRequirements> {
        let list = |l: &Value| -> Option<BTreeMap<String, Quantity>> {
            let l = l.as_object()?;
            Some(
                l.iter()
                    .filter_map(|(k, v)| {
                        let q = match v {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            _ => return None,
                        };
                        Some((k.clone(), Quantity(q)))
                    })
                    .collect(),
            )
        };
        Some(ResourceRequirements {
            requests: list(&r["requests"]),
            limits: list(&r["limits"]),
            ..Default::default()
        })
    };
    let containers = |list: &Value| -> Vec<Container> {
        list.as_array()
            .into_iter()
            .flatten()
            .map(|c| Container {
                name: c["name"].as_str().unwrap_or_default().to_string(),
                restart_policy: c["restartPolicy"].as_str().map(str::to_string),
                resources: resources(&c["resources"]),
                ..Default::default()
            })
            .collect()
    };
    let typed = PodSpec {
        containers: containers(&spec["containers"]),
        init_containers: Some(containers(&spec["initContainers"])),
        resources: spec
            .get("resources")
            .filter(|r| r.is_object())
            .and_then(resources),
        ..Default::default()
    };
    kcore::qos::compute_qos_class(&typed)
}

/// Fields the server reads and defaults must have the right JSON shape before anything indexes
/// into them: objects, arrays, arrays of objects. A wrong shape is a 400/422, never a panic.
pub(crate) fn check_shape(res: &Resource, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let present = |p: &str| obj.pointer(p).filter(|v| !v.is_null());
    let field = |p: &str| p.trim_start_matches('/').replace('/', ".");
    for p in [
        "/metadata",
        "/metadata/labels",
        "/metadata/annotations",
        "/spec",
        "/status",
        "/data",
        "/stringData",
        "/binaryData",
        "/spec/selector",
        "/spec/template",
        "/spec/template/metadata",
        "/spec/template/spec",
    ] {
        if present(p).is_some_and(|v| !v.is_object()) {
            return Err(ApiError::invalid(
                res,
                &name,
                &field(p),
                "Invalid value: must be an object",
            ));
        }
    }
    for p in [
        "/spec/containers",
        "/spec/initContainers",
        "/spec/ports",
        "/metadata/ownerReferences",
        "/spec/template/spec/containers",
        "/spec/template/spec/initContainers",
    ] {
        if let Some(v) = present(p) {
            let ok = v.as_array().is_some_and(|a| a.iter().all(Value::is_object));
            if !ok {
                return Err(ApiError::invalid(
                    res,
                    &name,
                    &field(p),
                    "Invalid value: must be a list of objects",
                ));
            }
        }
    }
    if present("/metadata/finalizers")
        .is_some_and(|v| !v.as_array().is_some_and(|a| a.iter().all(Value::is_string)))
    {
        return Err(ApiError::invalid(
            res,
            &name,
            "metadata.finalizers",
            "Invalid value: must be a list of strings",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::registry::find;

    fn create_pod(containers: Value) -> Value {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": containers}});
        admit(find("", "v1", "pods").expect("served"), &mut pod, true).expect("admitted");
        pod
    }

    #[test]
    fn qos_class_by_value_after_defaults() {
        let g = create_pod(json!([{"name": "a", "image": "x", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1073741824"}}}]));
        assert_eq!(g["status"]["qosClass"], "Guaranteed", "1 equals 1000m");
        let limits_only = create_pod(json!([{"name": "a", "image": "x", "resources": {
            "limits": {"cpu": "500m", "memory": "64Mi"}}}]));
        assert_eq!(
            limits_only["status"]["qosClass"], "Guaranteed",
            "requests defaulted from limits"
        );
        let numeric = create_pod(json!([{"name": "a", "image": "x", "resources": {
            "requests": {"cpu": 1, "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]));
        assert_eq!(numeric["status"]["qosClass"], "Guaranteed");
        let b = create_pod(json!([{"name": "a", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]));
        assert_eq!(b["status"]["qosClass"], "Burstable");
        let be = create_pod(json!([{"name": "a", "image": "x"}]));
        assert_eq!(
            be["status"],
            json!({"phase": "Pending", "qosClass": "BestEffort"})
        );
    }
}
