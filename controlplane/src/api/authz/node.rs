//! The Node authorizer and the NodeRestriction admission plugin. A node identity
//! (`system:node:<name>` in `system:nodes`) reads the Secrets, ConfigMaps, claims and service
//! account tokens of the pods bound to it, the volumes bound to those claims and the Secrets
//! those volumes name (a graph of pod → object, claim → volume and volume → secret edges kept
//! from the store),
//! its own Node and Lease, lists pods only with `spec.nodeName=<itself>`, and otherwise gets
//! upstream's node rules; admission then keeps its writes to its own Node (not the
//! `node-restriction.kubernetes.io/` labels nor taints) and the pods bound to it.

use std::collections::HashMap;

use serde_json::Value;

use super::policy::node_rules;
use super::rules::Rule;
use super::{Attributes, Denied};
use crate::api::status::ApiError;

/// The store prefix of pods.
pub(crate) const PODS_PREFIX: &str = "/registry/core/pods/";
/// The store prefix of PersistentVolumeClaims (the graph's claim → volume edges).
pub(crate) const CLAIMS_PREFIX: &str = "/registry/core/persistentvolumeclaims/";
/// The store prefix of PersistentVolumes (the graph's volume → secret edges).
pub(crate) const VOLUMES_PREFIX: &str = "/registry/core/persistentvolumes/";
/// The store prefixes the graph is kept from.
pub(crate) const GRAPH_PREFIXES: [&str; 3] = [PODS_PREFIX, CLAIMS_PREFIX, VOLUMES_PREFIX];
/// Node labels a node may not set or change on itself.
const RESTRICTED_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/";

/// The node a caller is, if it is one.
pub(crate) fn node_name<'a>(user: &'a str, groups: &[String]) -> Option<&'a str> {
    let name = user.strip_prefix("system:node:")?;
    (groups.iter().any(|g| g == "system:nodes") && !name.is_empty()).then_some(name)
}

/// What a pod bound to a node lets the node read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PodRefs {
    node: String,
    namespace: String,
    /// (kind, name): `secret`, `configmap`, `pvc`, `serviceaccount`.
    refs: Vec<(&'static str, String)>,
}

/// What a pod's spec names: (kind, name) with kinds `secret`, `configmap`, `pvc` and
/// `serviceaccount`, sorted, without repeats (upstream's `VisitPodSecretNames` and
/// `VisitPodConfigmapNames`, with the claims and the service account).
pub(crate) fn spec_refs(spec: &Value) -> Vec<(&'static str, String)> {
    let mut refs = Vec::new();
    let mut add = |kind: &'static str, v: &Value| {
        if let Some(n) = v.as_str().filter(|n| !n.is_empty()) {
            refs.push((kind, n.to_string()));
        }
    };
    add("serviceaccount", &spec["serviceAccountName"]);
    for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
        add("secret", &s["name"]);
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        add("secret", &v["secret"]["secretName"]);
        add("configmap", &v["configMap"]["name"]);
        add("pvc", &v["persistentVolumeClaim"]["claimName"]);
        add("secret", &v["azureFile"]["secretName"]);
        add("secret", &v["csi"]["nodePublishSecretRef"]["name"]);
        for plugin in [
            "cephfs",
            "cinder",
            "flexVolume",
            "iscsi",
            "rbd",
            "scaleIO",
            "storageos",
        ] {
            add("secret", &v[plugin]["secretRef"]["name"]);
        }
        for src in v["projected"]["sources"].as_array().into_iter().flatten() {
            add("secret", &src["secret"]["name"]);
            add("configmap", &src["configMap"]["name"]);
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                add("secret", &e["valueFrom"]["secretKeyRef"]["name"]);
                add("configmap", &e["valueFrom"]["configMapKeyRef"]["name"]);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                add("secret", &e["secretRef"]["name"]);
                add("configmap", &e["configMapRef"]["name"]);
            }
        }
    }
    refs.sort();
    refs.dedup();
    refs
}

fn pod_refs(pod: &Value) -> Option<PodRefs> {
    let node = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())?;
    Some(PodRefs {
        node: node.to_string(),
        namespace: pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        refs: spec_refs(&pod["spec"]),
    })
}

/// Just enough of a pod to tell whether it is bound (most stored pods of a large cluster are
/// read only this far).
#[derive(Debug, Default, serde::Deserialize)]
struct Bound {
    #[serde(default)]
    spec: BoundSpec,
}

#[derive(Debug, Default, serde::Deserialize)]
struct BoundSpec {
    #[serde(default, rename = "nodeName")]
    node_name: Option<String>,
}

/// The references of a stored pod (None: not bound to a node, or not a pod).
fn refs_of(value: &[u8]) -> Option<PodRefs> {
    let bound: Bound = serde_json::from_slice(value).ok()?;
    bound.spec.node_name.filter(|n| !n.is_empty())?;
    pod_refs(&serde_json::from_slice::<Value>(value).ok()?)
}

/// Just enough of a claim to know its volume.
#[derive(Debug, Default, serde::Deserialize)]
struct Claim {
    #[serde(default)]
    spec: ClaimSpec,
}

#[derive(Debug, Default, serde::Deserialize)]
struct ClaimSpec {
    #[serde(default, rename = "volumeName")]
    volume_name: Option<String>,
}

/// The Secrets a PersistentVolume names (upstream's `VisitPVSecretNames`): its source's
/// `secretRef` (in `namespace`, else the claim's namespace for sources whose reference has none),
/// `azureFile.secretName`/`secretNamespace`, and the CSI publish, stage, expand and controller
/// secret references.
fn pv_secrets(pv: &Value) -> Vec<(String, String)> {
    let spec = &pv["spec"];
    let claim_ns = spec["claimRef"]["namespace"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    let mut add = |ns: Option<&str>, name: Option<&str>| {
        if let (Some(ns), Some(name)) = (ns.filter(|n| !n.is_empty()), name.filter(|n| !n.is_empty())) {
            out.push((ns.to_string(), name.to_string()));
        }
    };
    for source in [
        "cephfs",
        "cinder",
        "flexVolume",
        "rbd",
        "scaleIO",
        "iscsi",
        "storageos",
    ] {
        let r = &spec[source]["secretRef"];
        add(r["namespace"].as_str().or(Some(claim_ns)), r["name"].as_str());
    }
    let az = &spec["azureFile"];
    add(
        az["secretNamespace"].as_str().or(Some(claim_ns)),
        az["secretName"].as_str(),
    );
    for r in [
        "controllerPublishSecretRef",
        "nodePublishSecretRef",
        "nodeStageSecretRef",
        "controllerExpandSecretRef",
        "nodeExpandSecretRef",
    ] {
        let r = &spec["csi"][r];
        add(r["namespace"].as_str(), r["name"].as_str());
    }
    out
}

/// Pods bound to nodes and the objects they reference, claims bound to volumes, and the
/// Secrets volumes name. Fed by the store's ordered list and watch of pods, claims and
/// volumes, so only bound pods are kept.
#[derive(Debug, Default)]
pub(crate) struct Graph {
    pods: HashMap<String, PodRefs>,
    /// (kind, namespace, name) → node → number of its pods referencing it.
    edges: HashMap<(&'static str, String, String), HashMap<String, u32>>,
    /// Claim store key → the volume it is bound to.
    claims: HashMap<String, String>,
    /// Volume → (namespace, claim) of the claims bound to it.
    volumes: HashMap<String, Vec<(String, String)>>,
    /// Volume → the Secrets it names.
    volume_secrets: HashMap<String, Vec<(String, String)>>,
    /// Secret (namespace, name) → the volumes naming it.
    secret_volumes: HashMap<(String, String), Vec<String>>,
}

impl Graph {
    /// Applies one stored pod or claim (`value` None: deleted), in store order.
    pub(crate) fn apply(&mut self, key: &str, value: Option<&[u8]>) {
        if let Some(rest) = key.strip_prefix(CLAIMS_PREFIX) {
            self.apply_claim(key, rest, value);
            return;
        }
        if let Some(volume) = key.strip_prefix(VOLUMES_PREFIX) {
            self.apply_volume(volume, value);
            return;
        }
        let refs = value.and_then(refs_of);
        let old = match &refs {
            Some(r) => {
                if self.pods.get(key) == Some(r) {
                    return;
                }
                self.pods.insert(key.to_string(), r.clone())
            }
            None => self.pods.remove(key),
        };
        if let Some(old) = old {
            for (kind, name) in &old.refs {
                let id = (*kind, old.namespace.clone(), name.clone());
                if let Some(nodes) = self.edges.get_mut(&id) {
                    if let Some(n) = nodes.get_mut(&old.node) {
                        *n = n.saturating_sub(1);
                        if *n == 0 {
                            nodes.remove(&old.node);
                        }
                    }
                    if nodes.is_empty() {
                        self.edges.remove(&id);
                    }
                }
            }
        }
        if let Some(new) = refs {
            for (kind, name) in &new.refs {
                *self
                    .edges
                    .entry((*kind, new.namespace.clone(), name.clone()))
                    .or_default()
                    .entry(new.node.clone())
                    .or_default() += 1;
            }
        }
    }

    /// Applies one stored claim; `rest` is its key after the prefix (`<ns>/<name>`).
    fn apply_claim(&mut self, key: &str, rest: &str, value: Option<&[u8]>) {
        let volume = value
            .and_then(|v| serde_json::from_slice::<Claim>(v).ok())
            .and_then(|c| c.spec.volume_name)
            .filter(|v| !v.is_empty());
        let Some((ns, claim)) = rest.split_once('/') else {
            return;
        };
        if let Some(old) = self.claims.remove(key)
            && let Some(list) = self.volumes.get_mut(&old)
        {
            list.retain(|c| c.0 != ns || c.1 != claim);
            if list.is_empty() {
                self.volumes.remove(&old);
            }
        }
        let Some(volume) = volume else { return };
        self.volumes
            .entry(volume.clone())
            .or_default()
            .push((ns.to_string(), claim.to_string()));
        self.claims.insert(key.to_string(), volume);
    }

    /// Applies one stored PersistentVolume named `volume`: its secret edges.
    fn apply_volume(&mut self, volume: &str, value: Option<&[u8]>) {
        for secret in self.volume_secrets.remove(volume).unwrap_or_default() {
            if let Some(list) = self.secret_volumes.get_mut(&secret) {
                list.retain(|v| v != volume);
                if list.is_empty() {
                    self.secret_volumes.remove(&secret);
                }
            }
        }
        let secrets = value
            .and_then(|v| serde_json::from_slice::<Value>(v).ok())
            .map(|pv| pv_secrets(&pv))
            .unwrap_or_default();
        if secrets.is_empty() {
            return;
        }
        for secret in &secrets {
            self.secret_volumes
                .entry(secret.clone())
                .or_default()
                .push(volume.to_string());
        }
        self.volume_secrets.insert(volume.to_string(), secrets);
    }

    fn related(&self, node: &str, kind: &'static str, ns: &str, name: &str) -> bool {
        if kind == "secret"
            && self
                .secret_volumes
                .get(&(ns.to_string(), name.to_string()))
                .is_some_and(|vols| vols.iter().any(|v| self.related(node, "pv", "", v)))
        {
            return true;
        }
        if kind == "pv" {
            return self.volumes.get(name).is_some_and(|claims| {
                claims
                    .iter()
                    .any(|(ns, claim)| self.related(node, "pvc", ns, claim))
            });
        }
        self.edges
            .get(&(kind, ns.to_string(), name.to_string()))
            .is_some_and(|nodes| nodes.contains_key(node))
    }

    /// Forgets what was loaded from `prefix` (before a relist of it).
    pub(crate) fn clear(&mut self, prefix: &str) {
        if prefix == CLAIMS_PREFIX {
            self.claims.clear();
            self.volumes.clear();
        } else if prefix == VOLUMES_PREFIX {
            self.volume_secrets.clear();
            self.secret_volumes.clear();
        } else {
            self.pods.clear();
            self.edges.clear();
        }
    }
}

/// The Node authorizer's decision: `Some(Ok)` allowed, `Some(Err(reason))` no opinion with a
/// reason, `None` no opinion.
/// A denial with `reason`.
fn deny(reason: String) -> Result<(), Denied> {
    Err(Denied(reason))
}

pub(crate) fn authorize(
    graph: &Graph,
    node: &str,
    a: &Attributes<'_>,
    field_selector: &str,
) -> Option<Result<(), Denied>> {
    if !a.resource_request {
        return None;
    }
    let no_relation = || {
        deny(format!(
            "no relationship found between node '{node}' and this object"
        ))
    };
    let read_object = |kind: &'static str, verbs: &[&str]| -> Result<(), Denied> {
        if !verbs.contains(&a.verb) || !a.subresource.is_empty() {
            return deny(format!("can only read individual {} objects", a.resource));
        }
        if a.name.is_empty() {
            return Err("No Object name found".into());
        }
        if graph.related(node, kind, a.namespace, a.name) {
            Ok(())
        } else {
            no_relation()
        }
    };
    let decision = match (a.api_group, a.resource) {
        ("", "secrets") => read_object("secret", &["get", "list", "watch"]),
        ("", "configmaps") => read_object("configmap", &["get", "list", "watch"]),
        ("", "persistentvolumeclaims") if a.subresource.is_empty() => read_object("pvc", &["get"]),
        ("", "persistentvolumes") => read_object("pv", &["get"]),
        ("", "serviceaccounts") if a.subresource == "token" => {
            if a.verb != "create" {
                Err("can only create tokens for individual service accounts".into())
            } else if graph.related(node, "serviceaccount", a.namespace, a.name) {
                Ok(())
            } else {
                no_relation()
            }
        }
        ("coordination.k8s.io", "leases") => {
            if a.namespace != "kube-node-lease" || (a.verb != "create" && a.name != node) {
                Err("can only access node lease with the same name as the requesting node".into())
            } else if ["get", "create", "update", "patch", "delete"].contains(&a.verb) {
                Ok(())
            } else {
                deny(format!(
                    "can only get, create, update, patch, or delete a node lease, not {}",
                    a.verb
                ))
            }
        }
        ("", "nodes") if matches!(a.verb, "get" | "list" | "watch") && a.subresource.is_empty() => {
            if a.name == node {
                Ok(())
            } else if a.verb == "get" {
                deny(format!(
                    "node '{node}' cannot read '{}', only its own Node object",
                    a.name
                ))
            } else {
                deny(format!(
                    "node '{node}' can only {} its own Node object with a metadata.name={node} field selector",
                    a.verb
                ))
            }
        }
        ("", "pods") if matches!(a.verb, "list" | "watch") && a.subresource.is_empty() => {
            let own = field_selector
                .split(',')
                .any(|t| t == format!("spec.nodeName={node}") || t == format!("spec.nodeName=={node}"));
            if own {
                Ok(())
            } else {
                deny(format!(
                    "can only {} pods with spec.nodeName field selector set to {node}",
                    a.verb
                ))
            }
        }
        _ => {
            if node_rules().iter().any(|r: &Rule| r.allows(a)) {
                Ok(())
            } else {
                return None;
            }
        }
    };
    Some(decision)
}

/// A NodeRestriction refusal: `<resource> "<name>" is forbidden: <why>`.
fn refuse(resource: &str, name: &str, why: String) -> ApiError {
    ApiError::forbidden(resource, name, &why)
}

/// The write a NodeRestriction check is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Write<'a> {
    Create(&'a Value),
    Update { old: &'a Value, new: &'a Value },
    Delete(&'a Value),
    Evict(&'a Value),
}

/// NodeRestriction: what node `node` may write of `resource` (core group).
pub(crate) fn admit(node: &str, resource: &str, sub: Option<&str>, w: Write<'_>) -> Result<(), ApiError> {
    let name_of = |v: &Value| v["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let bound_here = |v: &Value| v["spec"]["nodeName"].as_str() == Some(node);
    match resource {
        "nodes" => {
            let (target, labels_before, labels_after, taints) = match w {
                Write::Create(n) => (name_of(n), None, n["metadata"].get("labels"), None),
                Write::Update { old, new } => (
                    name_of(old),
                    old["metadata"].get("labels"),
                    new["metadata"].get("labels"),
                    Some((old["spec"].get("taints"), new["spec"].get("taints"))),
                ),
                Write::Delete(n) | Write::Evict(n) => (name_of(n), None, None, None),
            };
            if target != node {
                return Err(refuse(
                    "nodes",
                    &target,
                    format!("node \"{node}\" is not allowed to modify node \"{target}\""),
                ));
            }
            let restricted = |l: Option<&Value>| -> Vec<(String, Value)> {
                l.and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .filter(|(k, _)| label_is_restricted(k))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let (before, after) = (restricted(labels_before), restricted(labels_after));
            if before != after {
                let mut changed: Vec<String> = before
                    .iter()
                    .chain(after.iter())
                    .filter(|kv| !(before.contains(kv) && after.contains(kv)))
                    .map(|(k, _)| k.clone())
                    .collect();
                changed.sort();
                changed.dedup();
                let verb = if matches!(w, Write::Create(_)) {
                    "set the following labels"
                } else {
                    "modify labels"
                };
                return Err(refuse(
                    "nodes",
                    &target,
                    format!("node \"{node}\" is not allowed to {verb}: {}", changed.join(", ")),
                ));
            }
            if let Some((before, after)) = taints
                && sub.is_none()
                && before != after
            {
                return Err(refuse(
                    "nodes",
                    &target,
                    format!("node \"{node}\" is not allowed to modify taints"),
                ));
            }
            Ok(())
        }
        "pods" => {
            let (pod, why) = match w {
                Write::Create(p) => {
                    if p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null() {
                        return Err(refuse(
                            "pods",
                            &name_of(p),
                            format!(
                                "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
                            ),
                        ));
                    }
                    (p, "create pods")
                }
                Write::Update { old, .. } => (old, "update pod status for pods"),
                Write::Delete(p) => (p, "delete pods"),
                Write::Evict(p) => (p, "evict pods"),
            };
            if matches!(w, Write::Update { .. }) && sub != Some("status") {
                return Err(refuse(
                    "pods",
                    &name_of(pod),
                    format!("node \"{node}\" can only update pod status"),
                ));
            }
            if bound_here(pod) {
                Ok(())
            } else {
                Err(refuse(
                    "pods",
                    &name_of(pod),
                    format!("node \"{node}\" can only {why} with spec.nodeName set to itself"),
                ))
            }
        }
        // The Node authorizer checks the name of every lease request but a create's (the name
        // is in the body): a node creates only its own Lease.
        "leases" => match w {
            Write::Create(l) if name_of(l) != node => Err(ApiError {
                code: 403,
                reason: "Forbidden",
                message: format!(
                    "leases.coordination.k8s.io {:?} is forbidden: can only access node lease with the same name as the requesting node",
                    name_of(l)
                ),
                details: Some(
                    serde_json::json!({"name": name_of(l), "group": "coordination.k8s.io", "kind": "leases"}),
                ),
            }),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Labels under `node-restriction.kubernetes.io/` (and its subdomains).
fn label_is_restricted(key: &str) -> bool {
    let prefix = key.split_once('/').map(|(p, _)| p).unwrap_or_default();
    let restricted = RESTRICTED_LABEL_PREFIX.trim_end_matches('/');
    prefix == restricted || prefix.ends_with(&format!(".{restricted}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs<'a>(
        verb: &'a str,
        group: &'a str,
        res: &'a str,
        sub: &'a str,
        ns: &'a str,
        name: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            api_group: group,
            resource: res,
            subresource: sub,
            name,
            namespace: ns,
            resource_request: true,
            path: "",
        }
    }

    #[test]
    fn nodes_read_what_their_pods_reference() {
        let mut g = Graph::default();
        let pod = json!({"metadata": {"namespace": "default", "name": "web"},
            "spec": {"nodeName": "n1", "serviceAccountName": "robot",
                "volumes": [{"name": "v", "secret": {"secretName": "tls"}}],
                "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "flags"}}]}]}});
        g.apply(
            "/registry/core/pods/default/web",
            Some(&serde_json::to_vec(&pod).expect("json")),
        );
        let get_secret = |name| attrs("get", "", "secrets", "", "default", name);
        assert_eq!(authorize(&g, "n1", &get_secret("tls"), ""), Some(Ok(())));
        assert_eq!(
            authorize(&g, "n2", &get_secret("tls"), ""),
            Some(Err(
                "no relationship found between node 'n2' and this object".into()
            ))
        );
        assert!(authorize(&g, "n1", &get_secret("other"), "").is_some_and(|d| d.is_err()));
        assert!(
            authorize(&g, "n1", &attrs("list", "", "secrets", "", "default", ""), "")
                .is_some_and(|d| d.is_err())
        );
        assert_eq!(
            authorize(
                &g,
                "n1",
                &attrs("get", "", "configmaps", "", "default", "flags"),
                ""
            ),
            Some(Ok(()))
        );
        let token = attrs("create", "", "serviceaccounts", "token", "default", "robot");
        assert_eq!(authorize(&g, "n1", &token, ""), Some(Ok(())));
        assert!(authorize(&g, "n2", &token, "").is_some_and(|d| d.is_err()));
        // The pod leaves: so does the node's access.
        g.apply("/registry/core/pods/default/web", None);
        assert!(authorize(&g, "n1", &get_secret("tls"), "").is_some_and(|d| d.is_err()));
        let pods = attrs("list", "", "pods", "", "", "");
        assert_eq!(authorize(&g, "n1", &pods, "spec.nodeName=n1"), Some(Ok(())));
        assert!(authorize(&g, "n1", &pods, "").is_some_and(|d| d.is_err()));
        let lease = |name| {
            attrs(
                "update",
                "coordination.k8s.io",
                "leases",
                "",
                "kube-node-lease",
                name,
            )
        };
        assert_eq!(authorize(&g, "n1", &lease("n1"), ""), Some(Ok(())));
        assert!(authorize(&g, "n1", &lease("n2"), "").is_some_and(|d| d.is_err()));
        assert_eq!(
            authorize(&g, "n1", &attrs("patch", "", "nodes", "status", "", "n2"), ""),
            Some(Ok(()))
        );
        assert_eq!(
            authorize(&g, "n1", &attrs("delete", "", "secrets", "", "default", "x"), "").map(|d| d.is_ok()),
            Some(false)
        );
        assert_eq!(
            authorize(
                &g,
                "n1",
                &attrs("create", "apps", "deployments", "", "default", ""),
                ""
            ),
            None
        );
    }

    #[test]
    fn nodes_read_the_volumes_of_their_pods_claims() {
        let mut g = Graph::default();
        let put =
            |g: &mut Graph, key: &str, v: Value| g.apply(key, Some(&serde_json::to_vec(&v).expect("json")));
        let pod = |claim: &str| {
            json!({"metadata": {"namespace": "db", "name": "p"},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}})
        };
        let claim = |volume: &str| json!({"metadata": {"namespace": "db", "name": "data"}, "spec": {"volumeName": volume}});
        let get_pv = |name| attrs("get", "", "persistentvolumes", "", "", name);
        let no_relation = |n: &str| {
            Some(Err(Denied(format!(
                "no relationship found between node '{n}' and this object"
            ))))
        };
        put(&mut g, "/registry/core/pods/db/p", pod("data"));
        // The claim is not bound yet: no volume to read.
        put(&mut g, "/registry/core/persistentvolumeclaims/db/data", claim(""));
        assert_eq!(authorize(&g, "n1", &get_pv("pv-1"), ""), no_relation("n1"));
        // Bound: the node of the claim's pod reads the volume, another node does not.
        put(
            &mut g,
            "/registry/core/persistentvolumeclaims/db/data",
            claim("pv-1"),
        );
        assert_eq!(authorize(&g, "n1", &get_pv("pv-1"), ""), Some(Ok(())));
        assert_eq!(authorize(&g, "n2", &get_pv("pv-1"), ""), no_relation("n2"));
        assert_eq!(authorize(&g, "n1", &get_pv("pv-2"), ""), no_relation("n1"));
        // Only get, of one named volume.
        for (verb, name) in [
            ("list", ""),
            ("watch", ""),
            ("delete", "pv-1"),
            ("update", "pv-1"),
        ] {
            assert_eq!(
                authorize(&g, "n1", &attrs(verb, "", "persistentvolumes", "", "", name), ""),
                Some(Err(Denied(
                    "can only read individual persistentvolumes objects".into()
                ))),
                "{verb}"
            );
        }
        // Rebound to another volume, then the pod moves to another claim, then the claim goes.
        put(
            &mut g,
            "/registry/core/persistentvolumeclaims/db/data",
            claim("pv-2"),
        );
        assert_eq!(authorize(&g, "n1", &get_pv("pv-1"), ""), no_relation("n1"));
        assert_eq!(authorize(&g, "n1", &get_pv("pv-2"), ""), Some(Ok(())));
        put(&mut g, "/registry/core/pods/db/p", pod("other"));
        assert_eq!(authorize(&g, "n1", &get_pv("pv-2"), ""), no_relation("n1"));
        put(&mut g, "/registry/core/pods/db/p", pod("data"));
        g.apply("/registry/core/persistentvolumeclaims/db/data", None);
        assert_eq!(authorize(&g, "n1", &get_pv("pv-2"), ""), no_relation("n1"));
        // A relist of claims forgets the claims only, not the pods.
        put(
            &mut g,
            "/registry/core/persistentvolumeclaims/db/data",
            claim("pv-3"),
        );
        g.clear(CLAIMS_PREFIX);
        assert_eq!(authorize(&g, "n1", &get_pv("pv-3"), ""), no_relation("n1"));
        put(
            &mut g,
            "/registry/core/persistentvolumeclaims/db/data",
            claim("pv-3"),
        );
        assert_eq!(authorize(&g, "n1", &get_pv("pv-3"), ""), Some(Ok(())));
    }

    #[test]
    fn nodes_read_the_secrets_of_their_pods_volumes() {
        let mut g = Graph::default();
        let put =
            |g: &mut Graph, key: &str, v: Value| g.apply(key, Some(&serde_json::to_vec(&v).expect("json")));
        let get_secret = |ns, name| attrs("get", "", "secrets", "", ns, name);
        let allowed =
            |g: &Graph, node, ns, name| authorize(g, node, &get_secret(ns, name), "") == Some(Ok(()));
        put(
            &mut g,
            "/registry/core/pods/db/p",
            json!({"metadata": {"namespace": "db", "name": "p"},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}),
        );
        put(
            &mut g,
            "/registry/core/persistentvolumeclaims/db/data",
            json!({"metadata": {"namespace": "db", "name": "data"}, "spec": {"volumeName": "pv-1"}}),
        );
        put(
            &mut g,
            "/registry/core/persistentvolumes/pv-1",
            json!({"metadata": {"name": "pv-1"}, "spec": {
                "claimRef": {"namespace": "db", "name": "data"},
                "csi": {"driver": "d", "volumeHandle": "h",
                    "nodePublishSecretRef": {"namespace": "storage", "name": "publish"},
                    "nodeStageSecretRef": {"namespace": "storage", "name": "stage"},
                    "controllerPublishSecretRef": {"namespace": "storage", "name": "controller"}}}}),
        );
        put(
            &mut g,
            "/registry/core/persistentvolumes/pv-2",
            json!({"metadata": {"name": "pv-2"}, "spec": {
                "claimRef": {"namespace": "db", "name": "other"},
                "rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "ceph"}},
                "azureFile": {"secretName": "az", "shareName": "s"}}}),
        );
        for (ns, name) in [
            ("storage", "publish"),
            ("storage", "stage"),
            ("storage", "controller"),
        ] {
            assert!(allowed(&g, "n1", ns, name), "{ns}/{name}");
            assert!(!allowed(&g, "n2", ns, name), "{ns}/{name} from another node");
        }
        // pv-2's claim is no pod's of n1 (secretRef without a namespace is the claim's).
        assert!(!allowed(&g, "n1", "db", "ceph") && !allowed(&g, "n1", "db", "az"));
        put(
            &mut g,
            "/registry/core/persistentvolumeclaims/db/data",
            json!({"metadata": {"namespace": "db", "name": "data"}, "spec": {"volumeName": "pv-2"}}),
        );
        assert!(allowed(&g, "n1", "db", "ceph") && allowed(&g, "n1", "db", "az"));
        assert!(
            !allowed(&g, "n1", "storage", "publish"),
            "the claim moved to pv-2"
        );
        // The volume changes its references; then it goes; a relist forgets volumes only.
        put(
            &mut g,
            "/registry/core/persistentvolumes/pv-2",
            json!({"metadata": {"name": "pv-2"}, "spec": {"claimRef": {"namespace": "db", "name": "data"},
                "cephfs": {"monitors": ["m"], "secretRef": {"namespace": "ceph", "name": "key"}}}}),
        );
        assert!(!allowed(&g, "n1", "db", "ceph") && allowed(&g, "n1", "ceph", "key"));
        g.apply("/registry/core/persistentvolumes/pv-2", None);
        assert!(!allowed(&g, "n1", "ceph", "key"));
        put(
            &mut g,
            "/registry/core/persistentvolumes/pv-2",
            json!({"metadata": {"name": "pv-2"}, "spec": {"cephfs": {"secretRef": {"namespace": "ceph", "name": "key"}}}}),
        );
        g.clear(VOLUMES_PREFIX);
        assert!(!allowed(&g, "n1", "ceph", "key"));
        assert!(
            authorize(
                &g,
                "n1",
                &attrs("get", "", "persistentvolumes", "", "", "pv-2"),
                ""
            ) == Some(Ok(()))
        );
    }

    #[test]
    fn node_restriction() {
        let node =
            |name: &str, labels: Value| json!({"metadata": {"name": name, "labels": labels}, "spec": {}});
        let err = admit(
            "n1",
            "nodes",
            None,
            Write::Update {
                old: &node("n2", json!({})),
                new: &node("n2", json!({})),
            },
        )
        .expect_err("other node");
        assert_eq!(
            err.message,
            "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
        );
        let old = node("n1", json!({"a": "1"}));
        let new = node(
            "n1",
            json!({"a": "2", "node-restriction.kubernetes.io/role": "db"}),
        );
        let err =
            admit("n1", "nodes", None, Write::Update { old: &old, new: &new }).expect_err("restricted label");
        assert_eq!(
            err.message,
            "nodes \"n1\" is forbidden: node \"n1\" is not allowed to modify labels: node-restriction.kubernetes.io/role"
        );
        let new = node("n1", json!({"a": "2"}));
        assert!(admit("n1", "nodes", None, Write::Update { old: &old, new: &new }).is_ok());
        let pod = |node: &str| json!({"metadata": {"name": "web"}, "spec": {"nodeName": node}});
        assert!(
            admit(
                "n1",
                "pods",
                Some("status"),
                Write::Update {
                    old: &pod("n1"),
                    new: &pod("n1")
                }
            )
            .is_ok()
        );
        let err = admit(
            "n1",
            "pods",
            Some("status"),
            Write::Update {
                old: &pod("n2"),
                new: &pod("n2"),
            },
        )
        .expect_err("other node's pod");
        assert_eq!(
            err.message,
            "pods \"web\" is forbidden: node \"n1\" can only update pod status for pods with spec.nodeName set to itself"
        );
        assert!(admit("n1", "pods", None, Write::Delete(&pod("n2"))).is_err());
        assert!(admit("n1", "pods", None, Write::Create(&pod("n1"))).is_err());
        let lease = |name: &str| json!({"metadata": {"name": name, "namespace": "kube-node-lease"}});
        assert!(admit("n1", "leases", None, Write::Create(&lease("n1"))).is_ok());
        assert!(admit("n1", "leases", None, Write::Create(&lease("n2"))).is_err());
    }
}
