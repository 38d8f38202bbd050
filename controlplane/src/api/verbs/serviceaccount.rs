//! ServiceAccount admission on pod create: the pod's service account token, the cluster CA and
//! its namespace as a projected volume `kube-api-access-<5 chars>` mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container (docs/SEEDS-SPEC.md
//! CTL-62), unless the pod or its ServiceAccount sets `automountServiceAccountToken: false`.
//! Mounting it on the node is the agent's part.

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::object::random_suffix;
use crate::api::registry;
use crate::api::status::ApiError;

/// Where the token volume is mounted.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token's lifetime in the volume (upstream's `WarnOnlyBoundTokenExpirationSeconds`).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;

impl Api {
    /// Adds the token volume and its mounts to a new pod (`pod` in namespace `ns`).
    pub(crate) async fn mount_service_account_token(
        &self,
        ns: &str,
        pod: &mut Value,
    ) -> Result<(), ApiError> {
        if pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string() {
            return Ok(());
        }
        let spec = &pod["spec"];
        let wanted = match spec["automountServiceAccountToken"].as_bool() {
            Some(b) => b,
            None => {
                let sa_name = spec["serviceAccountName"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                let res = registry::find("", "v1", "serviceaccounts")
                    .ok_or_else(|| ApiError::internal("serviceaccounts not served"))?;
                match self.read_object(res, Some(ns), &sa_name).await {
                    Ok((sa, _)) => sa["automountServiceAccountToken"].as_bool() != Some(false),
                    Err(e) if e.code == 404 => true,
                    Err(e) => return Err(e),
                }
            }
        };
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
        for list in ["initContainers", "containers"] {
            for c in spec[list].as_array_mut().into_iter().flatten() {
                if mounted_already(c) {
                    continue;
                }
                let mount = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
                match c["volumeMounts"].as_array_mut() {
                    Some(m) => m.push(mount),
                    None => c["volumeMounts"] = json!([mount]),
                }
            }
        }
        match spec["volumes"].as_array_mut() {
            Some(v) => v.push(volume),
            None => spec["volumes"] = json!([volume]),
        }
        Ok(())
    }
}
