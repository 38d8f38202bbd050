//! Ephemeral containers (`pods/<name>/ephemeralcontainers`, what `kubectl debug` writes): which
//! changes to a pod's `spec.ephemeralContainers` are allowed and what each may hold, as
//! upstream's `ValidatePodEphemeralContainersUpdate` and `validateEphemeralContainers` decide,
//! with their texts. Pure functions over typed pods. (A create that sets them is refused in
//! `admit`, before any typed decoding.)
//!
//! Departure: upstream appends a Go `cmp.Diff` of the old and new container to "may not be
//! changed"; this says which container changed but prints no diff.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{EphemeralContainer, Pod, ResourceRequirements};

use crate::api::object;

/// One field error: the field's path and upstream's `<Type>: <detail>` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// The annotation of a mirror (static) pod.
const MIRROR: &str = "kubernetes.io/config.mirror";
/// What upstream says of a field an ephemeral container may not set.
const NOT_FOR_EPHEMERAL: &str = "Forbidden: cannot be set for an Ephemeral Container";

/// An update through `pods/ephemeralcontainers` from `old` to `new` (which differ at most in
/// `spec.ephemeralContainers`): containers may only be added, and each must be valid.
pub(crate) fn check_update(old: &Pod, new: &Pod) -> Vec<FieldError> {
    let mut errs = check_containers(new);
    let mirror = old
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR));
    if mirror {
        return vec![FieldError::new(
            "",
            "Forbidden: static pods do not support ephemeral containers",
        )];
    }
    let list = |p: &Pod| -> Vec<EphemeralContainer> {
        p.spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.clone())
            .unwrap_or_default()
    };
    let now = list(new);
    for was in list(old) {
        match now.iter().find(|e| e.name == was.name) {
            None => errs.push(FieldError::new(
                "spec.ephemeralContainers",
                format!(
                    "Forbidden: existing ephemeral containers {:?} may not be removed\n",
                    was.name
                ),
            )),
            Some(e) if *e != was => errs.push(FieldError::new(
                format!("spec.ephemeralContainers[{}]", was.name),
                format!(
                    "Forbidden: existing ephemeral containers {:?} may not be changed\n",
                    was.name
                ),
            )),
            Some(_) => {}
        }
    }
    errs
}

/// Whether `r` holds nothing (Go's zero value: the field was not set).
fn no_resources(r: &ResourceRequirements) -> bool {
    r.claims.as_ref().is_none_or(Vec::is_empty)
        && r.limits.as_ref().is_none_or(|m| m.is_empty())
        && r.requests.as_ref().is_none_or(|m| m.is_empty())
}

/// Each ephemeral container of `pod` on its own and against the pod's other containers.
fn check_containers(pod: &Pod) -> Vec<FieldError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let others: BTreeSet<&str> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.name.as_str())
        .collect();
    let volumes: BTreeSet<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    let mut names = others.clone();
    let mut errs = Vec::new();
    for (i, e) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let at = |field: &str| format!("spec.ephemeralContainers[{i}].{field}");
        match object::dns1123_label_error(&e.name) {
            Some(_) if e.name.is_empty() => errs.push(FieldError::new(at("name"), "Required value")),
            Some(why) => errs.push(FieldError::new(
                at("name"),
                format!("Invalid value: {:?}: {why}", e.name),
            )),
            None => {}
        }
        if e.image.as_deref().is_none_or(str::is_empty) {
            errs.push(FieldError::new(at("image"), "Required value"));
        }
        for (j, m) in e.volume_mounts.iter().flatten().enumerate() {
            if !volumes.contains(m.name.as_str()) {
                errs.push(FieldError::new(
                    at(&format!("volumeMounts[{j}].name")),
                    format!("Not found: {:?}", m.name),
                ));
            }
        }
        if !names.insert(e.name.as_str()) {
            errs.push(FieldError::new(
                at("name"),
                format!("Duplicate value: {:?}", e.name),
            ));
        }
        if let Some(t) = e.target_container_name.as_deref().filter(|t| !t.is_empty())
            && !others.contains(t)
        {
            errs.push(FieldError::new(
                at("targetContainerName"),
                format!("Not found: {t:?}"),
            ));
        }
        // Fields in upstream's struct order; what an ephemeral container may not set.
        let forbidden = [
            ("ports", e.ports.as_ref().is_some_and(|p| !p.is_empty())),
            (
                "resources",
                e.resources.as_ref().is_some_and(|r| !no_resources(r)),
            ),
            (
                "resizePolicy",
                e.resize_policy.as_ref().is_some_and(|p| !p.is_empty()),
            ),
            (
                "restartPolicy",
                e.restart_policy.as_deref().is_some_and(|p| !p.is_empty()),
            ),
            ("livenessProbe", e.liveness_probe.is_some()),
            ("readinessProbe", e.readiness_probe.is_some()),
            ("startupProbe", e.startup_probe.is_some()),
            ("lifecycle", e.lifecycle.is_some()),
        ];
        for (field, set) in forbidden {
            if set {
                errs.push(FieldError::new(at(field), NOT_FOR_EPHEMERAL));
            }
        }
        for (j, m) in e.volume_mounts.iter().flatten().enumerate() {
            for (field, v) in [("subPath", &m.sub_path), ("subPathExpr", &m.sub_path_expr)] {
                if v.as_deref().is_some_and(|s| !s.is_empty()) {
                    errs.push(FieldError::new(
                        at(&format!("volumeMounts[{j}].{field}")),
                        NOT_FOR_EPHEMERAL,
                    ));
                }
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ephemeral: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "containers": [{"name": "app", "image": "busybox"}],
                "initContainers": [{"name": "setup", "image": "busybox"}],
                "volumes": [{"name": "data", "emptyDir": {}}],
                "ephemeralContainers": ephemeral,
            }
        }))
        .expect("a pod")
    }

    fn text(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    #[test]
    fn a_debug_container_may_be_added() {
        let old = pod(json!([]));
        let new = pod(
            json!([{"name": "debugger", "image": "busybox", "targetContainerName": "app",
            "stdin": true, "tty": true, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "resources": {}, "securityContext": {"privileged": false}}]),
        );
        assert_eq!(text(&check_update(&old, &new)), Vec::<String>::new());
        // And a second one next to it.
        let newer = pod(
            json!([{"name": "debugger", "image": "busybox", "targetContainerName": "app",
            "stdin": true, "tty": true, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "resources": {}, "securityContext": {"privileged": false}},
            {"name": "debugger-2", "image": "alpine"}]),
        );
        assert!(check_update(&new, &newer).is_empty());
    }

    #[test]
    fn existing_ones_may_be_neither_removed_nor_changed() {
        let old = pod(json!([{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]));
        let new = pod(json!([{"name": "b", "image": "alpine"}]));
        assert_eq!(
            text(&check_update(&old, &new)),
            [
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"a\" may not be removed\n",
                "spec.ephemeralContainers[b]: Forbidden: existing ephemeral containers \"b\" may not be changed\n",
            ]
        );
    }

    #[test]
    fn what_an_ephemeral_container_may_not_hold() {
        let old = pod(json!([]));
        let new = pod(json!([
            {"name": "app", "image": "busybox"},
            {"name": "Bad_Name"},
            {"name": "d", "image": "busybox", "targetContainerName": "nope",
             "ports": [{"containerPort": 80}], "resources": {"limits": {"cpu": "1"}},
             "restartPolicy": "Always", "readinessProbe": {"exec": {"command": ["true"]}},
             "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
             "volumeMounts": [{"name": "data", "mountPath": "/d", "subPath": "x"},
                              {"name": "ghost", "mountPath": "/g"}]},
        ]));
        assert_eq!(
            text(&check_update(&old, &new)),
            [
                "spec.ephemeralContainers[0].name: Duplicate value: \"app\"",
                "spec.ephemeralContainers[1].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                "spec.ephemeralContainers[1].image: Required value",
                "spec.ephemeralContainers[2].volumeMounts[1].name: Not found: \"ghost\"",
                "spec.ephemeralContainers[2].targetContainerName: Not found: \"nope\"",
                "spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[2].resources: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[2].restartPolicy: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[2].readinessProbe: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[2].lifecycle: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[2].volumeMounts[0].subPath: Forbidden: cannot be set for an Ephemeral Container",
            ]
        );
    }

    #[test]
    fn static_pods_refuse_them() {
        let mut old = pod(json!([]));
        old.metadata.annotations = Some([(MIRROR.to_string(), "x".to_string())].into());
        let mut new = pod(json!([{"name": "d", "image": "busybox"}]));
        new.metadata.annotations = old.metadata.annotations.clone();
        assert_eq!(
            text(&check_update(&old, &new)),
            [": Forbidden: static pods do not support ephemeral containers"]
        );
    }
}
