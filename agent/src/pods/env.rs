//! A container's environment (docs/SEEDS-SPEC.md §4.15): `env` values and `valueFrom`
//! (configMapKeyRef, secretKeyRef, fieldRef, resourceFieldRef), `envFrom` with prefixes, and
//! `$(VAR)` expansion in values, command and args, as the kubelet builds it
//! (`makeEnvironmentVariables`, `expansion.Expand`).
//!
//! [`resolve`] is pure over the ConfigMaps and Secrets the worker fetched ([`Sources`]); a
//! missing reference that is not `optional` is the `CreateContainerConfigError` of the kubelet,
//! with its message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::container::NodeFacts;

/// The ConfigMaps and Secrets of the pod's namespace a container refers to: by name, their data
/// (None when the object does not exist).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, String>>>,
    pub secrets: BTreeMap<String, Option<BTreeMap<String, String>>>,
}

/// The ConfigMaps and Secrets container `c` refers to (names), to fetch before [`resolve`].
pub fn references(c: &Container) -> (Vec<String>, Vec<String>) {
    let (mut cms, mut secrets) = (Vec::new(), Vec::new());
    for e in c.env.iter().flatten() {
        let from = e.value_from.as_ref();
        if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
            cms.push(r.name.clone());
        }
        if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
            secrets.push(r.name.clone());
        }
    }
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.config_map_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &e.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    cms.sort();
    cms.dedup();
    secrets.sort();
    secrets.dedup();
    (cms, secrets)
}

/// `$(VAR)` expanded from `vars`; `$$` is a literal `$`; unknown references stay as written.
pub fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A downward-API field of the pod.
fn field(pod: &Pod, path: &str, node: &NodeFacts, pod_ip: Option<&str>) -> Result<String, String> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let v = match path {
        "metadata.name" => m.name.clone(),
        "metadata.namespace" => m.namespace.clone(),
        "metadata.uid" => m.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.hostIP" | "status.hostIPs" => node.node_ip.clone(),
        "status.podIP" | "status.podIPs" => pod_ip.map(str::to_string),
        _ => {
            let (map, key) = if let Some(rest) = path.strip_prefix("metadata.labels['") {
                (m.labels.as_ref(), rest.strip_suffix("']"))
            } else if let Some(rest) = path.strip_prefix("metadata.annotations['") {
                (m.annotations.as_ref(), rest.strip_suffix("']"))
            } else {
                return Err(format!("unsupported fieldPath: {path}"));
            };
            return Ok(key.and_then(|k| map?.get(k).cloned()).unwrap_or_default());
        }
    };
    Ok(v.unwrap_or_default())
}

/// `requests.cpu`, `limits.memory`, ... of container `c`, divided by `divisor` and rounded up
/// (cpu in cores by default, memory in bytes).
fn resource_field(c: &Container, resource: &str, divisor: Option<&str>) -> Result<String, String> {
    let r = c.resources.as_ref();
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported container resource: {resource}"))?;
    let map = match kind {
        "requests" => r.and_then(|r| r.requests.as_ref()),
        "limits" => r.and_then(|r| r.limits.as_ref()),
        _ => return Err(format!("unsupported container resource: {resource}")),
    };
    let q = map.and_then(|m| m.get(name)).map(|q| q.0.as_str());
    match name {
        "cpu" => {
            let milli = q.and_then(kcore::quantity::cpu_milli).unwrap_or(0);
            let per = divisor
                .and_then(kcore::quantity::cpu_milli)
                .filter(|d| *d > 0)
                .unwrap_or(1000);
            Ok(milli.div_ceil(per).to_string())
        }
        "memory" | "ephemeral-storage" => {
            let bytes = q.and_then(kcore::quantity::bytes).unwrap_or(0);
            let per = divisor
                .and_then(kcore::quantity::bytes)
                .filter(|d| *d > 0)
                .unwrap_or(1);
            Ok(bytes.div_ceil(per).to_string())
        }
        _ => Err(format!("unsupported container resource: {resource}")),
    }
}

/// The container's environment in order (`envFrom` first, then `env`; later names win), or the
/// `CreateContainerConfigError` message.
pub fn resolve(
    pod: &Pod,
    c: &Container,
    sources: &Sources,
    node: &NodeFacts,
    pod_ip: Option<&str>,
) -> Result<Vec<(String, String)>, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut order: Vec<String> = Vec::new();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let set = |order: &mut Vec<String>, vars: &mut BTreeMap<String, String>, k: String, v: String| {
        if vars.insert(k.clone(), v).is_none() {
            order.push(k);
        }
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let data = if let Some(r) = &from.config_map_ref {
            let data = sources.config_maps.get(&r.name).cloned().flatten();
            if data.is_none() && r.optional != Some(true) {
                return Err(format!("configmap \"{}\" not found", r.name));
            }
            data
        } else if let Some(r) = &from.secret_ref {
            let data = sources.secrets.get(&r.name).cloned().flatten();
            if data.is_none() && r.optional != Some(true) {
                return Err(format!("secret \"{}\" not found", r.name));
            }
            data
        } else {
            None
        };
        for (k, v) in data.unwrap_or_default() {
            set(&mut order, &mut vars, format!("{prefix}{k}"), v);
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            Some(expand(v, &vars))
        } else if let Some(from) = &e.value_from {
            if let Some(r) = &from.config_map_key_ref {
                match sources.config_maps.get(&r.name).cloned().flatten() {
                    None if r.optional == Some(true) => None,
                    None => return Err(format!("configmap \"{}\" not found", r.name)),
                    Some(data) => match data.get(&r.key) {
                        Some(v) => Some(v.clone()),
                        None if r.optional == Some(true) => None,
                        None => {
                            return Err(format!(
                                "couldn't find key {} in ConfigMap {ns}/{}",
                                r.key, r.name
                            ));
                        }
                    },
                }
            } else if let Some(r) = &from.secret_key_ref {
                match sources.secrets.get(&r.name).cloned().flatten() {
                    None if r.optional == Some(true) => None,
                    None => return Err(format!("secret \"{}\" not found", r.name)),
                    Some(data) => match data.get(&r.key) {
                        Some(v) => Some(v.clone()),
                        None if r.optional == Some(true) => None,
                        None => return Err(format!("couldn't find key {} in Secret {ns}/{}", r.key, r.name)),
                    },
                }
            } else if let Some(f) = &from.field_ref {
                Some(field(pod, &f.field_path, node, pod_ip)?)
            } else if let Some(r) = &from.resource_field_ref {
                let divisor = r.divisor.as_ref().map(|d| d.0.as_str());
                Some(resource_field(c, &r.resource, divisor)?)
            } else {
                None
            }
        } else {
            Some(String::new())
        };
        if let Some(v) = value {
            set(&mut order, &mut vars, e.name.clone(), v);
        }
    }
    Ok(order
        .into_iter()
        .map(|k| {
            let v = vars.get(&k).cloned().unwrap_or_default();
            (k, v)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeFacts {
        NodeFacts {
            node: "n1".into(),
            node_ip: Some("10.0.2.15".into()),
            insecure_registries: vec![],
            memory: 8 << 30,
        }
    }

    fn pod(env: serde_json::Value, env_from: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "busybox",
                "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "env": env, "envFrom": env_from}]},
        }))
        .expect("pod")
    }

    fn sources() -> Sources {
        let data = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        Sources {
            config_maps: [
                ("app".to_string(), data(&[("MODE", "fast"), ("LEVEL", "3")])),
                ("gone".to_string(), None),
            ]
            .into(),
            secrets: [("creds".to_string(), data(&[("password", "s3cret")]))].into(),
        }
    }

    fn env_of(p: &Pod) -> Result<Vec<String>, String> {
        let c = &p.spec.as_ref().expect("spec").containers[0];
        resolve(p, c, &sources(), &node(), Some("10.244.1.5"))
            .map(|v| v.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    #[test]
    fn env_is_built_as_the_kubelet_builds_it() {
        let p = pod(
            serde_json::json!([
                {"name": "A", "value": "1"},
                {"name": "B", "value": "$(A)-$(MODE)-$$(A)-$(NOPE)"},
                {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                {"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "LEVEL"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "x", "optional": true}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
                {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "MODE", "value": "slow"},
            ]),
            serde_json::json!([{"configMapRef": {"name": "app"}, "prefix": "CFG_"}, {"configMapRef": {"name": "app"}}]),
        );
        assert_eq!(
            env_of(&p),
            Ok(vec![
                "CFG_LEVEL=3".to_string(),
                "CFG_MODE=fast".into(),
                "LEVEL=3".into(),
                "MODE=slow".into(),
                "A=1".into(),
                "B=1-fast-$(A)-$(NOPE)".into(),
                "PASS=s3cret".into(),
                "LVL=3".into(),
                "POD=web".into(),
                "IP=10.244.1.5".into(),
                "APP=web".into(),
                "CPU=1".into(),
                "CPU_M=250".into(),
                "MEM_MI=128".into(),
            ])
        );
    }

    #[test]
    fn missing_references_are_create_container_config_errors() {
        let table = [
            (
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "x"}}}]),
                serde_json::json!([]),
                "configmap \"gone\" not found",
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope"}}}]),
                serde_json::json!([]),
                "couldn't find key nope in ConfigMap prod/app",
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "k"}}}]),
                serde_json::json!([]),
                "secret \"missing\" not found",
            ),
            (
                serde_json::json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}}]),
                serde_json::json!([]),
                "couldn't find key user in Secret prod/creds",
            ),
            (
                serde_json::json!([]),
                serde_json::json!([{"secretRef": {"name": "missing"}}]),
                "secret \"missing\" not found",
            ),
        ];
        for (env, env_from, want) in table {
            assert_eq!(env_of(&pod(env, env_from)), Err(want.to_string()));
        }
        let optional = pod(
            serde_json::json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}}]),
            serde_json::json!([{"secretRef": {"name": "missing", "optional": true}}]),
        );
        assert_eq!(env_of(&optional), Ok(vec![]));
    }

    #[test]
    fn expansion_follows_upstream() {
        let vars: BTreeMap<String, String> = [("A".to_string(), "x".to_string())].into();
        let table = [
            ("$(A)", "x"),
            ("$$(A)", "$(A)"),
            ("$(B)", "$(B)"),
            ("a$b", "a$b"),
            ("$(A", "$(A"),
            ("pre-$(A)-post", "pre-x-post"),
            ("$", "$"),
        ];
        for (input, want) in table {
            assert_eq!(expand(input, &vars), want, "{input}");
        }
        assert_eq!(references(&Container::default()), (vec![], vec![]));
    }
}
