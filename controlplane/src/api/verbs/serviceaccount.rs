//! ServiceAccount admission on pod create: the pod's service account token, the cluster CA and
//! its namespace as a projected volume `kube-api-access-<5 chars>` mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container (docs/SEEDS-SPEC.md
//! CTL-62), unless the pod or its ServiceAccount sets `automountServiceAccountToken: false`.
//! Mounting it on the node is the agent's part.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::authz::node::spec_refs;
use crate::api::object::random_suffix;
use crate::api::object::sparse::Paths;
use crate::api::registry;
use crate::api::status::ApiError;

/// Where the token volume is mounted.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token's lifetime in the volume (upstream's `WarnOnlyBoundTokenExpirationSeconds`).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

/// How often the `default` ServiceAccount is looked for before a pod naming it is refused (the
/// ServiceAccount controller creates it just after its namespace), and how long between tries:
/// upstream's 10 attempts, 100-200 ms apart.
const DEFAULT_ATTEMPTS: u32 = 10;

impl Api {
    /// ServiceAccount admission of a new pod (`pod` in namespace `ns`; `shown` is the name
    /// upstream's messages use: the request's name, or its `generateName`). The ServiceAccount
    /// must exist (403 `error looking up service account <ns>/<sa>: serviceaccount "<sa>" not
    /// found`); its token is mounted unless the pod or the account opts out; the account's
    /// `imagePullSecrets` are copied to a pod that names none. Mirror pods may reference no
    /// service account, no secret and no token projection.
    pub(crate) async fn admit_service_account(
        &self,
        ns: &str,
        shown: &str,
        pod: &mut Value,
    ) -> Result<(), ApiError> {
        if pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string() {
            return mirror_pod_references(&pod["spec"])
                .map_err(|why| ApiError::forbidden("pods", shown, why));
        }
        let sa_name = match pod["spec"]["serviceAccountName"].as_str() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => "default".to_string(),
        };
        pod["spec"]["serviceAccountName"] = json!(sa_name);
        let sa = self.service_account(ns, &sa_name).await.map_err(|e| {
            let why = if e.code == 404 {
                format!("serviceaccount {sa_name:?} not found")
            } else {
                e.message
            };
            ApiError::forbidden(
                "pods",
                shown,
                &format!("error looking up service account {ns}/{sa_name}: {why}"),
            )
        })?;
        let has_pull_secrets = pod["spec"]["imagePullSecrets"]
            .as_array()
            .is_some_and(|l| !l.is_empty());
        if !has_pull_secrets {
            let names: Vec<Value> = sa["imagePullSecrets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["name"].as_str())
                .map(|n| json!({ "name": n }))
                .collect();
            if !names.is_empty() {
                pod["spec"]["imagePullSecrets"] = Value::Array(names);
            }
        }
        let spec = &pod["spec"];
        let wanted = spec["automountServiceAccountToken"]
            .as_bool()
            .or(sa["automountServiceAccountToken"].as_bool())
            .unwrap_or(true);
        let mounted_already = |c: &Value| {
            c["volumeMounts"]
                .as_array()
                .is_some_and(|m| m.iter().any(|v| v["mountPath"] == MOUNT_PATH))
        };
        if !wanted {
            return Ok(());
        }
        let taken: Vec<String> = spec["volumes"]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(|x| x["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let mut name = format!("kube-api-access-{}", random_suffix());
        while taken.contains(&name) {
            name = format!("kube-api-access-{}", random_suffix());
        }
        let volume = json!({"name": name, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]}});
        let spec = &mut pod["spec"];
        for c in crate::api::object::containers_mut(spec, &["initContainers", "containers"]) {
            if mounted_already(c) {
                continue;
            }
            let mount = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
            match c["volumeMounts"].as_array_mut() {
                Some(m) => m.push(mount),
                None => c["volumeMounts"] = json!([mount]),
            }
        }
        match spec["volumes"].as_array_mut() {
            Some(v) => v.push(volume),
            None => spec["volumes"] = json!([volume]),
        }
        Ok(())
    }

    /// What admission reads of the ServiceAccount `name` in `ns` (its image pull secrets and
    /// token automounting); `default` is looked for [`DEFAULT_ATTEMPTS`] times.
    async fn service_account(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        static READ: OnceLock<Paths> = OnceLock::new();
        let read = READ.get_or_init(|| Paths::new(["imagePullSecrets", "automountServiceAccountToken"]));
        let res = registry::find("", "v1", "serviceaccounts")
            .ok_or_else(|| ApiError::internal("serviceaccounts not served"))?;
        let attempts = if name == "default" { DEFAULT_ATTEMPTS } else { 1 };
        let mut jitter = [0u8; 1];
        let _ = getrandom::fill(&mut jitter);
        let pause = Duration::from_millis(100 + u64::from(jitter[0]) % 100);
        let mut last = None;
        for i in 0..attempts {
            if i > 0 {
                tokio::time::sleep(pause).await;
            }
            match self.read_fields(res, Some(ns), name, read).await {
                Ok(sa) => return Ok(sa),
                Err(e) if e.code == 404 => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| ApiError::not_found(res, name)))
    }
}

/// Why a mirror pod (a node's static pod) may not be created: it references a service account,
/// a secret, or a service-account token projection (upstream's messages).
fn mirror_pod_references(spec: &Value) -> Result<(), &'static str> {
    if spec["serviceAccountName"].as_str().is_some_and(|n| !n.is_empty()) {
        return Err("a mirror pod may not reference service accounts");
    }
    if spec_refs(spec).iter().any(|(kind, _)| *kind == "secret") {
        return Err("a mirror pod may not reference secrets");
    }
    let projects_token = spec["volumes"].as_array().into_iter().flatten().any(|v| {
        v["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| !s["serviceAccountToken"].is_null())
    });
    if projects_token {
        return Err("a mirror pod may not use ServiceAccountToken volume projections");
    }
    Ok(())
}
