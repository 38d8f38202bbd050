//! Service-account tokens: `serviceaccounts/<name>/token` (TokenRequest, what `kubectl create
//! token` posts) issues an ES256 JWT signed with the cluster's service-account key, and such a
//! token authenticates its bearer as `system:serviceaccount:<namespace>:<name>` (groups
//! `system:serviceaccounts`, `system:serviceaccounts:<namespace>`, `system:authenticated`) while
//! it is unexpired, carries the API audience and its ServiceAccount still exists with the same uid.
//! TokenReview (`POST authentication.k8s.io/v1 tokenreviews`, what a kubelet's webhook
//! authentication posts) answers who any bearer token this server accepts stands for.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::registry;
use crate::api::request::{Caller, Target};
use crate::api::status::ApiError;

/// Issuer and default audience of the tokens.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Default and minimum lifetime (upstream: one hour; at least ten minutes).
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
const MIN_EXPIRATION_SECONDS: i64 = 600;
/// Longest lifetime handed out (upstream caps it by `--service-account-max-token-expiration`).
const MAX_EXPIRATION_SECONDS: i64 = 48 * 3600;

impl Api {
    /// `POST serviceaccounts/<name>/token`.
    pub(crate) async fn token_request(&self, t: &Target, body: Value) -> Result<Value, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        let (sa, _) = self.read_object(t.res, Some(&ns), &name).await?;
        let pki = self
            .pki
            .as_ref()
            .ok_or_else(|| ApiError::internal("no service-account signing key"))?;
        let spec = &body["spec"];
        let expiration = match spec["expirationSeconds"].as_i64() {
            None => DEFAULT_EXPIRATION_SECONDS,
            Some(s) if s < MIN_EXPIRATION_SECONDS => {
                return Err(ApiError {
                    code: 422,
                    reason: "Invalid",
                    message: format!(
                        "TokenRequest.authentication.k8s.io \"{name}\" is invalid: spec.expirationSeconds: Invalid value: {s}: may not specify a duration less than 10 minutes"
                    ),
                    details: None,
                });
            }
            Some(s) => s.min(MAX_EXPIRATION_SECONDS),
        };
        let audiences: Vec<Value> = match spec["audiences"].as_array() {
            Some(a) if !a.is_empty() => a.clone(),
            _ => vec![json!(ISSUER)],
        };
        let now = kcore::time::unix_seconds(SystemTime::now());
        let mut claims = json!({
            "iss": ISSUER,
            "sub": format!("system:serviceaccount:{ns}:{name}"),
            "aud": audiences,
            "iat": now, "nbf": now, "exp": now + expiration,
            "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name, "uid": sa["metadata"]["uid"]}},
        });
        // A token bound to a pod (what the kubelet asks for a projected volume) names it, and
        // stops authenticating when that pod is gone.
        let bound = &spec["boundObjectRef"];
        if bound.is_object() {
            let kind = bound["kind"].as_str().unwrap_or_default();
            if kind != "Pod" {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for object of kind {kind:?}: only Pod is supported"
                )));
            }
            let pod_name = bound["name"].as_str().unwrap_or_default();
            let pods =
                registry::find("", "v1", "pods").ok_or_else(|| ApiError::internal("pods not served"))?;
            let (pod, _) = self.read_object(pods, Some(&ns), pod_name).await?;
            let uid = &pod["metadata"]["uid"];
            if bound["uid"]
                .as_str()
                .is_some_and(|u| !u.is_empty() && Some(u) != uid.as_str())
            {
                return Err(ApiError {
                    code: 409,
                    reason: "Conflict",
                    details: None,
                    message: format!(
                        "the UID in the bound object reference ({}) does not match the UID in record. The object might have been deleted and then recreated",
                        bound["uid"].as_str().unwrap_or_default()
                    ),
                });
            }
            claims["kubernetes.io"]["pod"] = json!({"name": pod_name, "uid": uid});
            if let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
                claims["kubernetes.io"]["node"] = json!({"name": node});
            }
        }
        let token = pki
            .sign_jwt(&claims)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let expires = UNIX_EPOCH + Duration::from_secs(u64::try_from(now + expiration).unwrap_or(0));
        Ok(json!({
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
            "spec": {"audiences": audiences, "expirationSeconds": expiration,
                "boundObjectRef": if bound.is_object() { bound.clone() } else { Value::Null }},
            "status": {"token": token, "expirationTimestamp": kcore::time::rfc3339(expires)},
        }))
    }

    /// Sets the static bearer tokens (once; later calls change nothing).
    pub fn set_static_tokens(&self, tokens: std::collections::HashMap<String, Caller>) {
        let _ = self.static_tokens.set(tokens);
    }

    /// The caller a bearer token stands for: a static token, a service-account token, or a
    /// bootstrap token.
    pub async fn authenticate_bearer(&self, token: &str) -> Option<Caller> {
        if let Some(c) = self.static_tokens.get().and_then(|t| t.get(token)) {
            return Some(c.clone());
        }
        if token.matches('.').count() == 2 {
            return self.authenticate_token(token).await;
        }
        self.authenticate_bootstrap_token(token).await
    }

    /// `POST tokenreviews`: who `spec.token` stands for. Every token this server accepts is
    /// valid for the API audience only, so a review naming other audiences is not
    /// authenticated (upstream's audience-agnostic authenticators answer the same).
    pub(crate) async fn token_review(&self, mut body: Value) -> Result<Value, ApiError> {
        let token = body["spec"]["token"].as_str().unwrap_or_default().to_string();
        if token.is_empty() {
            return Err(ApiError::bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        let asked: Vec<String> = body["spec"]["audiences"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        let for_api = asked.is_empty() || asked.iter().any(|a| a == ISSUER);
        let who = if for_api {
            self.authenticate_bearer(&token).await
        } else {
            None
        };
        body["apiVersion"] = json!("authentication.k8s.io/v1");
        body["kind"] = json!("TokenReview");
        if !body["metadata"].is_object() {
            body["metadata"] = json!({});
        }
        body["metadata"]["creationTimestamp"] = Value::Null;
        body["status"] = match who {
            Some(c) => {
                json!({"authenticated": true, "user": {"username": c.user, "groups": c.groups}, "audiences": [ISSUER]})
            }
            None if !for_api => {
                json!({"user": {}, "error": format!("token audiences {asked:?} are not valid for this server (it accepts {ISSUER:?})")})
            }
            None => json!({"user": {}, "error": "invalid bearer token"}),
        };
        Ok(body)
    }

    /// The caller a service-account token stands for (None: not one of ours, expired, wrong
    /// audience, or its ServiceAccount is gone or was recreated).
    pub async fn authenticate_token(&self, token: &str) -> Option<Caller> {
        let claims = self.pki.as_ref()?.verify_jwt(token)?;
        let now = kcore::time::unix_seconds(SystemTime::now());
        let fresh = claims["exp"].as_i64().is_some_and(|e| now < e)
            && claims["nbf"].as_i64().is_none_or(|n| n <= now + 60);
        let audience = claims["aud"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == ISSUER))
            || claims["aud"] == ISSUER;
        if !fresh || !audience || claims["iss"] != ISSUER {
            return None;
        }
        let sub = claims["sub"].as_str()?;
        let rest = sub.strip_prefix("system:serviceaccount:")?;
        let (ns, name) = rest.split_once(':')?;
        let res = registry::find("", "v1", "serviceaccounts")?;
        let (sa, _) = self.read_object(res, Some(ns), name).await.ok()?;
        if sa["metadata"]["uid"] != claims["kubernetes.io"]["serviceaccount"]["uid"] {
            return None;
        }
        if let Some(pod_name) = claims["kubernetes.io"]["pod"]["name"].as_str() {
            let pods = registry::find("", "v1", "pods")?;
            let (pod, _) = self.read_object(pods, Some(ns), pod_name).await.ok()?;
            let deleted = pod["metadata"]["deletionTimestamp"]
                .as_str()
                .and_then(kcore::time::parse_rfc3339)
                .is_some_and(|at| at <= now);
            if pod["metadata"]["uid"] != claims["kubernetes.io"]["pod"]["uid"] || deleted {
                return None;
            }
        }
        Some(Caller {
            user: sub.to_string(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        })
    }
}
