//! Bootstrap tokens as upstream: Secrets `bootstrap-token-<id>` in `kube-system` of type
//! `bootstrap.kubernetes.io/token` (`token-id`, `token-secret`, `expiration`,
//! `usage-bootstrap-authentication`, `auth-extra-groups`) authenticate `<id>.<secret>` as
//! `system:bootstrap:<id>` in `system:bootstrappers` while unexpired.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::api::Api;
use crate::api::object::{b64, unb64};
use crate::api::registry;
use crate::api::request::{Caller, Query, Target};
use crate::api::status::ApiError;

/// The Secret type of bootstrap tokens.
pub const TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";

/// `<id>.<secret>` with upstream's shape: 6 and 16 characters of `[a-z0-9]`.
pub(crate) fn split_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok =
        |s: &str, n: usize| s.len() == n && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// Compares without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new token, `<6>.<16>` of `[a-z0-9]` from the system's random source.
pub fn new_token() -> Result<String, getrandom::Error> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut b = [0u8; 22];
    getrandom::fill(&mut b)?;
    // 252 = 7 × 36: bytes at or above it are drawn again, so every character is equally likely.
    let mut out = String::with_capacity(23);
    let mut extra = [0u8; 1];
    for (i, mut x) in b.into_iter().enumerate() {
        while x >= 252 {
            getrandom::fill(&mut extra)?;
            x = extra[0];
        }
        if i == 6 {
            out.push('.');
        }
        out.push(ALPHABET[x as usize % ALPHABET.len()] as char);
    }
    Ok(out)
}

/// The Secret of bootstrap token `<id>.<secret>` for authentication and signing, expiring `ttl`
/// after `now` (None: never), as `kubeadm token create` writes it.
pub fn token_secret(
    id: &str,
    secret: &str,
    description: &str,
    ttl: Option<Duration>,
    now: SystemTime,
) -> Value {
    let mut obj = json!({"apiVersion": "v1", "kind": "Secret",
    "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
    "type": TOKEN_TYPE,
    "data": {
        "description": b64(description),
        "token-id": b64(id), "token-secret": b64(secret),
        "usage-bootstrap-authentication": b64("true"), "usage-bootstrap-signing": b64("true"),
    }});
    if let Some(ttl) = ttl {
        obj["data"]["expiration"] = json!(b64(&kcore::time::rfc3339(now + ttl)));
    }
    obj
}

impl Api {
    /// Stores `token` as its bootstrap-token Secret, expiring `ttl` from now (None: never),
    /// unless one exists: the token of the first start, which the server writes once, so a
    /// restart never revives a token that expired or was deleted.
    pub async fn ensure_bootstrap_token(&self, token: &str, ttl: Option<Duration>) -> Result<(), ApiError> {
        let Some((id, secret)) = split_token(token) else {
            return Err(ApiError::internal(
                "the bootstrap token is not <6>.<16> of [a-z0-9]",
            ));
        };
        let res =
            registry::find("", "v1", "secrets").ok_or_else(|| ApiError::internal("secrets not served"))?;
        let t = Target {
            res,
            namespace: Some("kube-system".into()),
            name: None,
            sub: None,
        };
        let obj = token_secret(
            id,
            secret,
            "The node bootstrap token of the first start (DIR/pki/bootstrap.token).",
            ttl,
            SystemTime::now(),
        );
        match self.create(&t, obj, &Query::default(), None).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The caller a bootstrap token stands for (None: malformed, unknown, expired, not for
    /// authentication, or its Secret is being deleted).
    pub async fn authenticate_bootstrap_token(&self, token: &str) -> Option<Caller> {
        let (id, secret) = split_token(token)?;
        let res = registry::find("", "v1", "secrets")?;
        let (s, _) = self
            .read_object(res, Some("kube-system"), &format!("bootstrap-token-{id}"))
            .await
            .ok()?;
        let data = |k: &str| -> Option<String> { s["data"][k].as_str().and_then(unb64) };
        if s["type"] != TOKEN_TYPE || !s["metadata"]["deletionTimestamp"].is_null() {
            return None;
        }
        if data("token-id").as_deref() != Some(id)
            || !same(data("token-secret")?.as_bytes(), secret.as_bytes())
            || data("usage-bootstrap-authentication").as_deref() != Some("true")
        {
            return None;
        }
        if let Some(exp) = data("expiration") {
            let Some(at) = kcore::time::parse_rfc3339(&exp) else {
                tracing::warn!(id, expiration = %exp, "bootstrap token with an unreadable expiration");
                return None;
            };
            if kcore::time::unix_seconds(SystemTime::now()) >= at {
                tracing::debug!(id, "expired bootstrap token");
                return None;
            }
        }
        let mut groups = vec!["system:bootstrappers".to_string()];
        for g in data("auth-extra-groups").unwrap_or_default().split(',') {
            let g = g.trim();
            if g.starts_with("system:bootstrappers:") && !groups.iter().any(|x| x == g) {
                groups.push(g.to_string());
            }
        }
        groups.push("system:authenticated".into());
        Some(Caller {
            user: format!("system:bootstrap:{id}"),
            groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape() {
        assert_eq!(
            split_token("abc123.0123456789abcdef"),
            Some(("abc123", "0123456789abcdef"))
        );
        assert_eq!(split_token("ABC123.0123456789abcdef"), None);
        assert_eq!(split_token("abc12.0123456789abcdef"), None);
        assert_eq!(split_token("abc123"), None);
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
        let t = new_token().expect("random");
        assert!(split_token(&t).is_some(), "{t}");
        assert_ne!(t, new_token().expect("random"));
    }

    #[test]
    fn token_secrets_expire_as_asked() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = token_secret(
            "abc123",
            "0123456789abcdef",
            "d",
            Some(Duration::from_secs(86_400)),
            now,
        );
        assert_eq!(s["metadata"]["name"], "bootstrap-token-abc123");
        assert_eq!(s["type"], TOKEN_TYPE);
        assert_eq!(
            s["data"]["expiration"].as_str().and_then(unb64).as_deref(),
            Some("2027-01-16T08:00:00Z")
        );
        assert_eq!(
            s["data"]["token-secret"].as_str().and_then(unb64).as_deref(),
            Some("0123456789abcdef")
        );
        let forever = token_secret("abc123", "0123456789abcdef", "d", None, now);
        assert!(forever["data"]["expiration"].is_null());
    }
}
