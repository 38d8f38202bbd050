//! OpenAPI v3 (`/openapi/v3`, `/openapi/v3/<group-version>`) and server-side field validation.
//!
//! The schemas are the Kubernetes 1.32 ones as the `k8s-openapi` crate carries them (its
//! `schemars` implementations, with the upstream descriptions), so `kubectl explain` shows the
//! real documentation. Each served kind's schema gets `x-kubernetes-group-version-kind`; list
//! fields get the `x-kubernetes-patch-*`/`x-kubernetes-list-*` markers from the protobuf field
//! table (`schema::list_markers`). Every resource's item path carries a `patch` operation with
//! the `fieldValidation` parameter, which tells kubectl that the server validates fields, so it
//! sends `fieldValidation=Strict` and skips its own (OpenAPI v2) validation.
//!
//! The same schemas drive [`enforce`]: fields a kind does not have are rejected (`Strict`, with
//! the Go API server's `strict decoding error: unknown field "…"` message) or dropped (`Warn`,
//! the default, with a `Warning` header per field; `Ignore`), as the Go server's typed decoding
//! drops them.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use k8s_openapi::schemars::SchemaGenerator;
use k8s_openapi::schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::discovery::{KUBE_MAJOR, KUBE_MINOR};
use super::{Body, full};
use crate::api::registry::{self, Resource};
use crate::api::schema;
use crate::api::status::ApiError;

const REF_PREFIX: &str = "#/components/schemas/";

/// The generated documents, built once on first use.
#[derive(Debug)]
pub struct Documents {
    /// `/openapi/v3`.
    pub root: Bytes,
    /// Group-version path (`api/v1`, `apis/apps/v1`) → (hash, document).
    pub docs: BTreeMap<String, (String, Bytes)>,
    /// Every component schema of every group-version, by name.
    schemas: Map<String, Value>,
    /// (group, version, kind) → schema name.
    kinds: BTreeMap<(&'static str, &'static str, &'static str), String>,
}

/// The documents (generated on first call; ~1 MB of JSON).
pub fn documents() -> &'static Documents {
    static DOCS: OnceLock<Documents> = OnceLock::new();
    DOCS.get_or_init(build)
}

/// kubectl validates manifests against OpenAPI before create/apply; an empty protobuf document
/// is a valid (schema-less) answer, so validation is left to the server.
pub(crate) fn v2_empty() -> Response<Body> {
    let mut resp = Response::new(full(Bytes::new()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
    );
    resp
}

macro_rules! kinds {
    ($($g:literal $v:literal $k:literal => $t:ty),* $(,)?) => {
        /// The schema reference of a served kind, added to `g`'s definitions.
        fn kind_schema(g: &mut SchemaGenerator, group: &str, version: &str, kind: &str) -> Option<Value> {
            match (group, version, kind) {
                $(($g, $v, $k) => serde_json::to_value(g.subschema_for::<$t>()).ok(),)*
                _ => None,
            }
        }
    };
}

kinds! {
    "" "v1" "Pod" => k8s_openapi::api::core::v1::Pod,
    "" "v1" "Namespace" => k8s_openapi::api::core::v1::Namespace,
    "" "v1" "Node" => k8s_openapi::api::core::v1::Node,
    "" "v1" "Service" => k8s_openapi::api::core::v1::Service,
    "" "v1" "Endpoints" => k8s_openapi::api::core::v1::Endpoints,
    "" "v1" "ConfigMap" => k8s_openapi::api::core::v1::ConfigMap,
    "" "v1" "Secret" => k8s_openapi::api::core::v1::Secret,
    "" "v1" "ServiceAccount" => k8s_openapi::api::core::v1::ServiceAccount,
    "" "v1" "Event" => k8s_openapi::api::core::v1::Event,
    "" "v1" "PersistentVolumeClaim" => k8s_openapi::api::core::v1::PersistentVolumeClaim,
    "" "v1" "PersistentVolume" => k8s_openapi::api::core::v1::PersistentVolume,
    "" "v1" "ResourceQuota" => k8s_openapi::api::core::v1::ResourceQuota,
    "" "v1" "LimitRange" => k8s_openapi::api::core::v1::LimitRange,
    "" "v1" "ReplicationController" => k8s_openapi::api::core::v1::ReplicationController,
    "" "v1" "PodTemplate" => k8s_openapi::api::core::v1::PodTemplate,
    "" "v1" "ComponentStatus" => k8s_openapi::api::core::v1::ComponentStatus,
    "apps" "v1" "Deployment" => k8s_openapi::api::apps::v1::Deployment,
    "apps" "v1" "ReplicaSet" => k8s_openapi::api::apps::v1::ReplicaSet,
    "apps" "v1" "StatefulSet" => k8s_openapi::api::apps::v1::StatefulSet,
    "apps" "v1" "DaemonSet" => k8s_openapi::api::apps::v1::DaemonSet,
    "apps" "v1" "ControllerRevision" => k8s_openapi::api::apps::v1::ControllerRevision,
    "batch" "v1" "Job" => k8s_openapi::api::batch::v1::Job,
    "batch" "v1" "CronJob" => k8s_openapi::api::batch::v1::CronJob,
    "coordination.k8s.io" "v1" "Lease" => k8s_openapi::api::coordination::v1::Lease,
    "policy" "v1" "PodDisruptionBudget" => k8s_openapi::api::policy::v1::PodDisruptionBudget,
    "discovery.k8s.io" "v1" "EndpointSlice" => k8s_openapi::api::discovery::v1::EndpointSlice,
    "events.k8s.io" "v1" "Event" => k8s_openapi::api::events::v1::Event,
    "autoscaling" "v2" "HorizontalPodAutoscaler" => k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler,
    "autoscaling" "v1" "HorizontalPodAutoscaler" => k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler,
    "authentication.k8s.io" "v1" "SelfSubjectReview" => k8s_openapi::api::authentication::v1::SelfSubjectReview,
    "authentication.k8s.io" "v1" "TokenReview" => k8s_openapi::api::authentication::v1::TokenReview,
    "authorization.k8s.io" "v1" "LocalSubjectAccessReview" => k8s_openapi::api::authorization::v1::LocalSubjectAccessReview,
    "authorization.k8s.io" "v1" "SelfSubjectAccessReview" => k8s_openapi::api::authorization::v1::SelfSubjectAccessReview,
    "authorization.k8s.io" "v1" "SelfSubjectRulesReview" => k8s_openapi::api::authorization::v1::SelfSubjectRulesReview,
    "authorization.k8s.io" "v1" "SubjectAccessReview" => k8s_openapi::api::authorization::v1::SubjectAccessReview,
    "networking.k8s.io" "v1" "Ingress" => k8s_openapi::api::networking::v1::Ingress,
    "networking.k8s.io" "v1" "IngressClass" => k8s_openapi::api::networking::v1::IngressClass,
    "networking.k8s.io" "v1" "NetworkPolicy" => k8s_openapi::api::networking::v1::NetworkPolicy,
    "node.k8s.io" "v1" "RuntimeClass" => k8s_openapi::api::node::v1::RuntimeClass,
    "scheduling.k8s.io" "v1" "PriorityClass" => k8s_openapi::api::scheduling::v1::PriorityClass,
    "rbac.authorization.k8s.io" "v1" "Role" => k8s_openapi::api::rbac::v1::Role,
    "rbac.authorization.k8s.io" "v1" "RoleBinding" => k8s_openapi::api::rbac::v1::RoleBinding,
    "rbac.authorization.k8s.io" "v1" "ClusterRole" => k8s_openapi::api::rbac::v1::ClusterRole,
    "rbac.authorization.k8s.io" "v1" "ClusterRoleBinding" => k8s_openapi::api::rbac::v1::ClusterRoleBinding,
    "certificates.k8s.io" "v1" "CertificateSigningRequest" => k8s_openapi::api::certificates::v1::CertificateSigningRequest,
    "storage.k8s.io" "v1" "StorageClass" => k8s_openapi::api::storage::v1::StorageClass,
    "storage.k8s.io" "v1" "CSIDriver" => k8s_openapi::api::storage::v1::CSIDriver,
    "storage.k8s.io" "v1" "CSINode" => k8s_openapi::api::storage::v1::CSINode,
    "storage.k8s.io" "v1" "CSIStorageCapacity" => k8s_openapi::api::storage::v1::CSIStorageCapacity,
    "storage.k8s.io" "v1" "VolumeAttachment" => k8s_openapi::api::storage::v1::VolumeAttachment,
    "admissionregistration.k8s.io" "v1" "MutatingWebhookConfiguration" => k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    "admissionregistration.k8s.io" "v1" "ValidatingWebhookConfiguration" => k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
    "admissionregistration.k8s.io" "v1" "ValidatingAdmissionPolicy" => k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
    "admissionregistration.k8s.io" "v1" "ValidatingAdmissionPolicyBinding" => k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
}

/// `api/v1` or `apis/<group>/<version>`.
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn ref_name(reference: &Value) -> Option<&str> {
    reference["$ref"].as_str()?.strip_prefix(REF_PREFIX)
}

fn build() -> Documents {
    let mut gvs: BTreeMap<(&str, &str), Vec<&Resource>> = BTreeMap::new();
    for r in registry::served().filter(|r| r.has_schema()) {
        gvs.entry((r.group, r.version)).or_default().push(r);
    }
    let markers = schema::list_markers();
    let (mut docs, mut all, mut root_paths) = (BTreeMap::new(), Map::new(), Map::new());
    let mut kind_names = BTreeMap::new();
    for ((group, version), resources) in gvs {
        let mut g = SchemaSettings::openapi3().into_generator();
        let mut paths = Map::new();
        let mut kinds = Vec::new();
        for r in &resources {
            let Some(reference) = kind_schema(&mut g, group, version, r.kind) else {
                tracing::warn!(kind = r.kind, "no OpenAPI schema for a served kind");
                continue;
            };
            let Some(name) = ref_name(&reference).map(str::to_string) else {
                continue;
            };
            let gvk = json!({"group": group, "version": version, "kind": r.kind});
            let prefix = format!("/{}", gv_path(group, version));
            let scope = if r.namespaced {
                format!("{prefix}/namespaces/{{namespace}}/{}", r.plural)
            } else {
                format!("{prefix}/{}", r.plural)
            };
            if r.is_create_only() {
                // A review: one POST on the collection, nothing to get or patch.
                paths.insert(scope, create_path(&gvk, &reference));
            } else {
                let mut path = item_path(&gvk, &reference);
                if r.is_read_only()
                    && let Value::Object(ops) = &mut path
                {
                    ops.remove("patch");
                }
                paths.insert(format!("{scope}/{{name}}"), path);
            }
            kind_names.insert((group, version, r.kind), name.clone());
            kinds.push((name, gvk));
        }
        let mut schemas = g.take_definitions(true);
        for (name, gvk) in kinds {
            if let Some(Value::Object(s)) = schemas.get_mut(&name) {
                s.insert("x-kubernetes-group-version-kind".into(), json!([gvk]));
                // k8s-openapi marks metadata required (it is not an Option there); the API does not.
                if let Some(Value::Array(req)) = s.get_mut("required") {
                    req.retain(|f| f != "metadata");
                }
            }
        }
        for (def, field, ext) in &markers {
            if let Some(prop) = schemas
                .get_mut(def.as_str())
                .and_then(|s| s["properties"].get_mut(*field))
                && let Value::Object(p) = prop
            {
                p.extend(ext.clone());
            }
        }
        let doc = json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": format!("v{KUBE_MAJOR}.{KUBE_MINOR}.0")},
            "paths": paths,
            "components": {"schemas": schemas},
        });
        let bytes = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
        let hash: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect();
        let path = gv_path(group, version);
        root_paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
        );
        if let Value::Object(s) = &doc["components"]["schemas"] {
            all.extend(s.clone());
        }
        docs.insert(path, (hash, bytes));
    }
    let root = Bytes::from(serde_json::to_vec(&json!({"paths": root_paths})).unwrap_or_default());
    Documents {
        root,
        docs,
        schemas: all,
        kinds: kind_names,
    }
}

/// The item path of a resource: get and patch, the latter with the `fieldValidation` parameter.
/// A string query parameter of an operation.
fn query_param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

/// The collection path of a review: `POST` with the kind in and out.
fn create_path(gvk: &Value, reference: &Value) -> Value {
    let content = json!({"application/json": {"schema": reference}});
    json!({
        "post": {
            "parameters": [query_param("dryRun"), query_param("fieldManager"), query_param("fieldValidation")],
            "requestBody": {"content": content, "required": true},
            "responses": {"201": {"description": "Created", "content": content}},
            "x-kubernetes-action": "post",
            "x-kubernetes-group-version-kind": gvk,
        },
    })
}

fn item_path(gvk: &Value, reference: &Value) -> Value {
    let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
    let body: Map<String, Value> = [
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ]
    .into_iter()
    .map(|ct| (ct.to_string(), json!({"schema": {"type": "object"}})))
    .collect();
    json!({
        "get": {
            "responses": ok,
            "x-kubernetes-action": "get",
            "x-kubernetes-group-version-kind": gvk,
        },
        "patch": {
            "parameters": [query_param("dryRun"), query_param("fieldManager"), query_param("fieldValidation"), query_param("force")],
            "requestBody": {"content": body, "required": true},
            "responses": ok,
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
        },
    })
}

/// What to do with fields a kind does not have (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them (the default).
    Warn,
    /// Refuse the request.
    Strict,
}

impl FieldValidation {
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("" | "Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some("Strict") => Ok(Self::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter {other:?} is not one of \"Ignore\", \"Warn\" or \"Strict\""
            ))),
        }
    }
}

/// Checks `obj` (of the resource's kind) for fields its schema does not have: an error under
/// `Strict`; otherwise they are removed and their paths returned.
pub fn enforce(res: &Resource, obj: &mut Value, mode: FieldValidation) -> Result<Vec<String>, ApiError> {
    let docs = documents();
    let name = docs.kinds.get(&(res.group, res.version, res.kind));
    let Some(schema) = name.and_then(|n| docs.schemas.get(n)) else {
        return Ok(Vec::new());
    };
    let mut w = Walk {
        schemas: &docs.schemas,
        unknown: Vec::new(),
        wrong_type: None,
        prune: mode != FieldValidation::Strict,
    };
    w.walk(schema, obj, &mut String::new());
    let unknown = w.unknown;
    // A value of the wrong type is a decoding error whatever the mode (Go cannot decode it).
    if let Some(e) = w.wrong_type {
        return Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: {e}",
            kind = res.kind,
            version = res.version,
        )));
    }
    if mode == FieldValidation::Strict && !unknown.is_empty() {
        let list: Vec<String> = unknown.iter().map(|f| format!("unknown field {f:?}")).collect();
        return Err(ApiError::bad_request(format!(
            "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
            list.join(", "),
            kind = res.kind,
            version = res.version,
        )));
    }
    Ok(unknown)
}

/// Follows `$ref` and single-element `allOf` wrappers.
fn resolve<'a>(schemas: &'a Map<String, Value>, mut s: &'a Value) -> &'a Value {
    for _ in 0..8 {
        if let Some(name) = ref_name(s) {
            match schemas.get(name) {
                Some(t) => s = t,
                None => return s,
            }
        } else if let Some([inner]) = s["allOf"].as_array().map(Vec::as_slice) {
            s = inner;
        } else {
            break;
        }
    }
    s
}

/// JSON's name for the type of a value, as Go's decoder reports it.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The schema type `v` should have had, when it has another (null fits everything).
fn type_mismatch(schema: &Value, v: &Value) -> Option<&'static str> {
    if v.is_null() {
        return None;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        return (!(v.is_string() || v.is_i64() || v.is_u64())).then_some("int or string");
    }
    let (ok, name) = match schema["type"].as_str()? {
        "string" => (v.is_string(), "string"),
        "integer" => (v.is_i64() || v.is_u64(), "integer"),
        "number" => (v.is_number(), "number"),
        "boolean" => (v.is_boolean(), "boolean"),
        "array" => (v.is_array(), "array"),
        "object" => (v.is_object(), "object"),
        _ => (true, ""),
    };
    (!ok).then_some(name)
}

/// One pass over an object against its schema.
struct Walk<'a> {
    schemas: &'a Map<String, Value>,
    /// Paths of fields the schema does not have.
    unknown: Vec<String>,
    /// The first value of the wrong type.
    wrong_type: Option<String>,
    /// Remove unknown fields.
    prune: bool,
}

impl Walk<'_> {
    fn walk(&mut self, schema: &Value, v: &mut Value, path: &mut String) {
        let schemas = self.schemas;
        let schema = resolve(schemas, schema);
        if schema["x-kubernetes-preserve-unknown-fields"] == true {
            return;
        }
        if let Some(want) = type_mismatch(schema, v) {
            if self.wrong_type.is_none() {
                let at = if path.is_empty() {
                    "the object"
                } else {
                    path.as_str()
                };
                self.wrong_type = Some(format!(
                    "json: cannot unmarshal {} into {at} of type {want}",
                    json_kind(v)
                ));
            }
            return;
        }
        let len = path.len();
        let enter = |path: &mut String, k: &str| {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(k);
        };
        match v {
            Value::Object(m) => {
                if let Some(props) = schema["properties"].as_object() {
                    let mut drop = Vec::new();
                    for (k, child) in m.iter_mut() {
                        enter(path, k);
                        match props.get(k) {
                            Some(s) => self.walk(s, child, path),
                            None => {
                                self.unknown.push(path.clone());
                                drop.push(k.clone());
                            }
                        }
                        path.truncate(len);
                    }
                    if self.prune {
                        for k in drop {
                            m.remove(&k);
                        }
                    }
                } else if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    for (k, child) in m.iter_mut() {
                        enter(path, k);
                        self.walk(extra, child, path);
                        path.truncate(len);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item) = schema.get("items") {
                    for (i, child) in items.iter_mut().enumerate() {
                        path.push_str(&format!("[{i}]"));
                        self.walk(item, child, path);
                        path.truncate(len);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::registry::find;

    #[test]
    fn documents_cover_every_served_kind() {
        let d = documents();
        let root: Value = serde_json::from_slice(&d.root).expect("root JSON");
        for r in crate::api::registry::served().filter(|r| r.has_schema()) {
            let path = gv_path(r.group, r.version);
            let url = root["paths"][&path]["serverRelativeURL"]
                .as_str()
                .expect("listed");
            let (hash, doc) = &d.docs[&path];
            assert!(url.ends_with(hash.as_str()));
            let doc: Value = serde_json::from_slice(doc).expect("doc JSON");
            let found = doc["components"]["schemas"]
                .as_object()
                .expect("schemas")
                .values()
                .any(|s| {
                    s["x-kubernetes-group-version-kind"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|g| g["kind"] == r.kind && g["group"] == r.group))
                });
            assert!(found, "{} {}", r.api_version(), r.kind);
        }
        let apps: Value = serde_json::from_slice(&d.docs["apis/apps/v1"].1).expect("apps");
        let item = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(item["x-kubernetes-group-version-kind"]["kind"], "Deployment");
        let core: Value = serde_json::from_slice(&d.docs["api/v1"].1).expect("core");
        let containers =
            &core["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
        assert!(
            core["components"]["schemas"]["io.k8s.api.core.v1.Pod"]["required"]
                .as_array()
                .is_none_or(Vec::is_empty)
        );
    }

    #[test]
    fn unknown_fields_are_refused_or_dropped() {
        let deploy = find("apps", "v1", "deployments").expect("served");
        let obj = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"any-key": "v"}, "annotations": {"a": "b"}, "colour": "red"},
            "spec": {
                "replicaz": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"spec": {"containers": [
                    {"name": "a", "image": "nginx", "resources": {"limits": {"cpu": "1"}}},
                    {"name": "b", "image": "nginx", "imagez": "x", "ports": [{"containerPort": 80, "hostPortt": 1}]}
                ]}}
            }
        });
        let mut strict = obj.clone();
        let err = enforce(deploy, &mut strict, FieldValidation::Strict).expect_err("strict refuses");
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: strict decoding error: \
             unknown field \"metadata.colour\", unknown field \"spec.replicaz\", \
             unknown field \"spec.template.spec.containers[1].imagez\", \
             unknown field \"spec.template.spec.containers[1].ports[0].hostPortt\""
        );
        assert_eq!(strict, obj, "nothing changed under Strict");
        let mut warn = obj.clone();
        let dropped = enforce(deploy, &mut warn, FieldValidation::Warn).expect("warn keeps going");
        assert_eq!(dropped.len(), 4);
        assert!(warn["spec"].get("replicaz").is_none() && warn["metadata"].get("colour").is_none());
        assert_eq!(warn["metadata"]["labels"]["any-key"], "v");
        assert_eq!(
            warn["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "1"
        );
        let mut clean = warn.clone();
        assert_eq!(
            enforce(deploy, &mut clean, FieldValidation::Strict).expect("valid"),
            Vec::<String>::new()
        );
        assert!(FieldValidation::parse(Some("Loose")).is_err());
        // Wrong types are refused in every mode.
        let mut typed = clean.clone();
        typed["spec"]["replicas"] = json!("two");
        let err = enforce(deploy, &mut typed, FieldValidation::Ignore).expect_err("wrong type");
        assert_eq!(
            err.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into spec.replicas of type integer"
        );
        let mut ok = clean.clone();
        ok["spec"]["strategy"] =
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25%"}});
        ok["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] =
            json!({"cpu": 1, "memory": "1Gi"});
        ok["spec"]["paused"] = json!(null);
        assert!(
            enforce(deploy, &mut ok, FieldValidation::Strict).is_ok(),
            "int-or-string, quantities, nulls"
        );
    }
}
