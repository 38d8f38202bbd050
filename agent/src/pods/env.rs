//! A container's environment (docs/SEEDS-SPEC.md §4.15): `env` values and `valueFrom`
//! (configMapKeyRef, secretKeyRef, fieldRef, resourceFieldRef), `envFrom` with prefixes, the
//! service environment variables ([`service_env`]), and `$(VAR)` expansion in values, command
//! and args, as the kubelet builds it (`makeEnvironmentVariables`, `expansion.Expand`).
//!
//! [`resolve`] is pure over the ConfigMaps and Secrets the worker fetched ([`Sources`]); a
//! missing reference that is not `optional` is the `CreateContainerConfigError` of the kubelet,
//! with its message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Service};

use super::container::NodeFacts;

/// The ConfigMaps and Secrets of the pod's namespace a container refers to: by name, their data
/// (None when the object does not exist).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, String>>>,
    pub secrets: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// The service environment variables ([`service_env`]).
    pub service_env: BTreeMap<String, String>,
}

/// `my-svc` → `MY_SVC` (upstream's `makeEnvVariableName`).
fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// The services a pod in `ns` sees as environment variables (upstream's
/// `getServiceEnvVarMap` and `envvars.FromServices`): with `enableServiceLinks`, every Service
/// of its namespace with a ClusterIP; always the `kubernetes` Service of `default` (unless the
/// namespace has its own `kubernetes`). Each gives `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`
/// (the first port), `<NAME>_SERVICE_PORT_<PORTNAME>` (named ports) and Docker's link variables
/// (`<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>{,_PROTO,_PORT,_ADDR}`).
pub fn service_env(services: &[Service], ns: &str, enable_service_links: bool) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    let ip_of = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|sp| sp.cluster_ip.as_deref())
            .filter(|ip| !ip.is_empty() && *ip != "None")
            .map(str::to_string)
    };
    for s in services.iter().filter(|s| ip_of(s).is_some()) {
        let (Some(name), Some(s_ns)) = (s.metadata.name.as_deref(), s.metadata.namespace.as_deref()) else {
            continue;
        };
        if s_ns == "default" && name == "kubernetes" {
            chosen.entry(name).or_insert(s);
        } else if s_ns == ns && enable_service_links {
            chosen.insert(name, s);
        }
    }
    let mut env = BTreeMap::new();
    for (name, s) in chosen {
        let (Some(ip), Some(spec)) = (ip_of(s), s.spec.as_ref()) else {
            continue;
        };
        let ports = spec.ports.as_deref().unwrap_or_default();
        let Some(first) = ports.first() else {
            continue;
        };
        let prefix = env_name(name);
        env.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        env.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
        for p in ports {
            if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
                env.insert(
                    format!("{prefix}_SERVICE_PORT_{}", env_name(pn)),
                    p.port.to_string(),
                );
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let lower = proto.to_lowercase();
            let host_port = std::net::SocketAddr::new(
                ip.parse().unwrap_or(std::net::IpAddr::from([0, 0, 0, 0])),
                u16::try_from(p.port).unwrap_or(0),
            );
            let url = format!("{lower}://{host_port}");
            if i == 0 {
                env.insert(format!("{prefix}_PORT"), url.clone());
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            env.insert(pp.clone(), url);
            env.insert(format!("{pp}_PROTO"), lower);
            env.insert(format!("{pp}_PORT"), p.port.to_string());
            env.insert(format!("{pp}_ADDR"), ip.clone());
        }
    }
    env
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

/// Which kind of object a reference names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    ConfigMap,
    Secret,
}

impl Source {
    /// `configmap` / `secret`, as the kubelet's "not found" texts spell them.
    pub fn lower(self) -> &'static str {
        match self {
            Source::ConfigMap => "configmap",
            Source::Secret => "secret",
        }
    }

    /// `ConfigMap` / `Secret`.
    pub fn kind(self) -> &'static str {
        match self {
            Source::ConfigMap => "ConfigMap",
            Source::Secret => "Secret",
        }
    }

    /// The fetched objects of this kind.
    pub fn objects(self, sources: &Sources) -> &BTreeMap<String, Option<BTreeMap<String, String>>> {
        match self {
            Source::ConfigMap => &sources.config_maps,
            Source::Secret => &sources.secrets,
        }
    }
}

/// Why a container's environment (or a downward-API file) cannot be built: the kubelet's
/// `CreateContainerConfigError` messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{} \"{name}\" not found", .of.lower())]
    NotFound { of: Source, name: String },
    #[error("couldn't find key {key} in {} {namespace}/{name}", .of.kind())]
    MissingKey {
        of: Source,
        key: String,
        namespace: String,
        name: String,
    },
    /// A ConfigMap/Secret that could not be read (not one that does not exist): the kubelet's
    /// text when its cache cannot answer.
    #[error("failed to sync {} cache: {reason}", .of.lower())]
    Sync { of: Source, reason: String },
    #[error("unsupported fieldPath: {0}")]
    UnsupportedField(String),
    /// The Services could not be listed (the kubelet's text).
    #[error("failed to list services when setting up env vars")]
    Services,
    #[error("unsupported container resource: {0}")]
    UnsupportedResource(String),
}

/// A downward-API field of the pod (`metadata.*`, a label or annotation, `spec.nodeName`,
/// `spec.serviceAccountName`, `status.hostIP`, `status.podIP`).
pub fn field(pod: &Pod, path: &str, host_ip: Option<&str>, pod_ip: Option<&str>) -> Result<String, EnvError> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref();
    let v = match path {
        "metadata.name" => m.name.clone(),
        "metadata.namespace" => m.namespace.clone(),
        "metadata.uid" => m.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.hostIP" | "status.hostIPs" => host_ip.map(str::to_string),
        "status.podIP" | "status.podIPs" => pod_ip.map(str::to_string),
        _ => {
            let (map, key) = if let Some(rest) = path.strip_prefix("metadata.labels['") {
                (m.labels.as_ref(), rest.strip_suffix("']"))
            } else if let Some(rest) = path.strip_prefix("metadata.annotations['") {
                (m.annotations.as_ref(), rest.strip_suffix("']"))
            } else {
                return Err(EnvError::UnsupportedField(path.into()));
            };
            return Ok(key.and_then(|k| map?.get(k).cloned()).unwrap_or_default());
        }
    };
    Ok(v.unwrap_or_default())
}

/// `requests.cpu`, `limits.memory`, ... of container `c`, divided by `divisor` and rounded up
/// (cpu in cores by default, memory in bytes). A limit the container does not set is the node's
/// allocatable amount, as the kubelet reads it (`MergeContainerResourceLimits`).
pub fn resource_field(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
    node: &NodeFacts,
) -> Result<String, EnvError> {
    let unsupported = || EnvError::UnsupportedResource(resource.into());
    let r = c.resources.as_ref();
    let (kind, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let map = match kind {
        "requests" => r.and_then(|r| r.requests.as_ref()),
        "limits" => r.and_then(|r| r.limits.as_ref()),
        _ => return Err(unsupported()),
    };
    let q = map.and_then(|m| m.get(name)).map(|q| q.0.as_str());
    let (amount, per) = match name {
        "cpu" => (
            q.and_then(kcore::quantity::cpu_milli),
            divisor
                .and_then(kcore::quantity::cpu_milli)
                .filter(|d| *d > 0)
                .unwrap_or(1000),
        ),
        "memory" | "ephemeral-storage" => (
            q.and_then(kcore::quantity::bytes),
            divisor
                .and_then(kcore::quantity::bytes)
                .filter(|d| *d > 0)
                .unwrap_or(1),
        ),
        _ => return Err(unsupported()),
    };
    let unset = if kind == "limits" {
        node.allocatable(name).unwrap_or(0)
    } else {
        0
    };
    Ok(amount.unwrap_or(unset).div_ceil(per).to_string())
}

/// The data of object `name` of kind `source`: None when it is missing and `optional`.
pub fn object<'s>(
    sources: &'s Sources,
    source: Source,
    name: &str,
    optional: Option<bool>,
) -> Result<Option<&'s BTreeMap<String, String>>, EnvError> {
    match source.objects(sources).get(name).and_then(Option::as_ref) {
        Some(data) => Ok(Some(data)),
        None if optional == Some(true) => Ok(None),
        None => Err(EnvError::NotFound {
            of: source,
            name: name.into(),
        }),
    }
}

/// The value of `key` in object `name` (a configMapKeyRef / secretKeyRef); None when optional
/// and missing.
fn key_ref(
    sources: &Sources,
    source: Source,
    namespace: &str,
    name: &str,
    key: &str,
    optional: Option<bool>,
) -> Result<Option<String>, EnvError> {
    let Some(data) = object(sources, source, name, optional)? else {
        return Ok(None);
    };
    match data.get(key) {
        Some(v) => Ok(Some(v.clone())),
        None if optional == Some(true) => Ok(None),
        None => Err(EnvError::MissingKey {
            of: source,
            key: key.into(),
            namespace: namespace.into(),
            name: name.into(),
        }),
    }
}

/// The container's environment in order (`envFrom` first, then `env`; later names win).
pub fn resolve(
    pod: &Pod,
    c: &Container,
    sources: &Sources,
    node: &NodeFacts,
    pod_ip: Option<&str>,
) -> Result<Vec<(String, String)>, EnvError> {
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
            object(sources, Source::ConfigMap, &r.name, r.optional)?
        } else if let Some(r) = &from.secret_ref {
            object(sources, Source::Secret, &r.name, r.optional)?
        } else {
            None
        };
        for (k, v) in data.into_iter().flatten() {
            set(&mut order, &mut vars, format!("{prefix}{k}"), v.clone());
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            // References resolve to the variables declared so far, then the service ones.
            (Some(v), _) if sources.service_env.is_empty() => Some(expand(v, &vars)),
            (Some(v), _) => {
                let mut known = sources.service_env.clone();
                known.extend(vars.iter().map(|(k, v)| (k.clone(), v.clone())));
                Some(expand(v, &known))
            }
            (None, None) => Some(String::new()),
            (None, Some(from)) => {
                if let Some(r) = &from.config_map_key_ref {
                    key_ref(sources, Source::ConfigMap, ns, &r.name, &r.key, r.optional)?
                } else if let Some(r) = &from.secret_key_ref {
                    key_ref(sources, Source::Secret, ns, &r.name, &r.key, r.optional)?
                } else if let Some(f) = &from.field_ref {
                    Some(field(pod, &f.field_path, node.node_ip.as_deref(), pod_ip)?)
                } else if let Some(r) = &from.resource_field_ref {
                    let divisor = r.divisor.as_ref().map(|d| d.0.as_str());
                    Some(resource_field(c, &r.resource, divisor, node)?)
                } else {
                    None
                }
            }
        };
        if let Some(v) = value {
            set(&mut order, &mut vars, e.name.clone(), v);
        }
    }
    // Then the service variables the container did not declare itself.
    for (k, v) in &sources.service_env {
        if !vars.contains_key(k) {
            set(&mut order, &mut vars, k.clone(), v.clone());
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
pub(super) mod tests {
    use super::*;

    /// A node with 8 GiB and 4 CPUs at 10.0.2.15 (shared with the volume tests).
    pub(in crate::pods) fn node() -> NodeFacts {
        NodeFacts {
            node: "n1".into(),
            node_ip: Some("10.0.2.15".into()),
            insecure_registries: vec![],
            memory: 8 << 30,
            allocatable_memory: kcore::allocatable::allocatable_memory(
                8 << 30,
                kcore::allocatable::EVICTION_HARD_MEMORY,
            ),
            cpus: 4,
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
            service_env: BTreeMap::new(),
        }
    }

    fn env_of(p: &Pod) -> Result<Vec<String>, String> {
        let c = &p.spec.as_ref().expect("spec").containers[0];
        resolve(p, c, &sources(), &node(), Some("10.244.1.5"))
            .map(|v| v.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
            .map_err(|e| e.to_string())
    }

    fn service(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .expect("service")
    }

    #[test]
    fn service_variables_are_upstreams() {
        let services = [
            service(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443, "protocol": "TCP"}]),
            ),
            service(
                "prod",
                "my-svc",
                "10.96.5.7",
                serde_json::json!([
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"}]),
            ),
            service("prod", "headless", "None", serde_json::json!([{"port": 80}])),
            service(
                "other",
                "elsewhere",
                "10.96.9.9",
                serde_json::json!([{"port": 80}]),
            ),
        ];
        let env = service_env(&services, "prod", true);
        let want: BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("MY_SVC_SERVICE_HOST", "10.96.5.7"),
            ("MY_SVC_SERVICE_PORT", "80"),
            ("MY_SVC_SERVICE_PORT_HTTP", "80"),
            ("MY_SVC_SERVICE_PORT_DNS", "53"),
            ("MY_SVC_PORT", "tcp://10.96.5.7:80"),
            ("MY_SVC_PORT_80_TCP", "tcp://10.96.5.7:80"),
            ("MY_SVC_PORT_80_TCP_PROTO", "tcp"),
            ("MY_SVC_PORT_80_TCP_PORT", "80"),
            ("MY_SVC_PORT_80_TCP_ADDR", "10.96.5.7"),
            ("MY_SVC_PORT_53_UDP", "udp://10.96.5.7:53"),
            ("MY_SVC_PORT_53_UDP_PROTO", "udp"),
            ("MY_SVC_PORT_53_UDP_PORT", "53"),
            ("MY_SVC_PORT_53_UDP_ADDR", "10.96.5.7"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(env, want);
        // enableServiceLinks: false keeps only the kubernetes Service's.
        let quiet = service_env(&services, "prod", false);
        assert!(
            quiet.keys().all(|k| k.starts_with("KUBERNETES_")) && quiet.len() == 8,
            "{quiet:?}"
        );
        // A namespace's own `kubernetes` Service wins over default's.
        let mine = service(
            "prod",
            "kubernetes",
            "10.96.7.7",
            serde_json::json!([{"port": 8443}]),
        );
        let env = service_env(&[services[0].clone(), mine], "prod", true);
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.7.7");
        // Declared variables come first and win; references see the service variables.
        let p = pod(
            serde_json::json!([
                {"name": "URL", "value": "http://$(MY_SVC_SERVICE_HOST):$(MY_SVC_SERVICE_PORT)"},
                {"name": "MY_SVC_SERVICE_PORT", "value": "9"}]),
            serde_json::json!(null),
        );
        let sources = Sources {
            service_env: service_env(&services, "prod", true),
            ..Sources::default()
        };
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let got = resolve(&p, c, &sources, &node(), None).expect("resolves");
        assert_eq!(got[0], ("URL".to_string(), "http://10.96.5.7:80".to_string()));
        assert_eq!(got[1], ("MY_SVC_SERVICE_PORT".to_string(), "9".to_string()));
        assert_eq!(got.len(), 2 + want.len() - 1, "each service variable once");
        assert!(
            got.iter()
                .any(|(k, v)| k == "KUBERNETES_SERVICE_HOST" && v == "10.96.0.1")
        );
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
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "CPU_LIMIT_M", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
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
                // No cpu limit: the node's allocatable cpu (4 CPUs).
                "CPU_LIMIT=4".into(),
                "CPU_LIMIT_M=4000".into(),
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
