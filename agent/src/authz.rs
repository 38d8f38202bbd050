//! Who may use the agent's endpoint: a client certificate from the cluster CA names the caller
//! (the x509 rule: CN is the user, each O a group), or else a bearer token the control plane
//! vouches for through a TokenReview (answers kept 2 min, the kubelet's webhook `cacheTTL`); and
//! every request is authorized by the control plane through a SubjectAccessReview, as the
//! kubelet's webhook mode does: the request maps to `<verb>` on `nodes/<subresource>` named
//! after this node (upstream's `GetRequestAttributes`), and answers are cached (allowed 5 min,
//! denied 30 s: the kubelet's defaults), so a stream of log reads asks once.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::PostParams;
use transport::tls::Identity;

/// How long an allowed answer is reused (the kubelet's `authorization.webhook.cacheAuthorizedTTL`).
pub(crate) const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied answer is reused (`cacheUnauthorizedTTL`).
pub(crate) const DENIED_TTL: Duration = Duration::from_secs(30);
/// Most answers kept; the cache starts over when full.
const CACHE_LIMIT: usize = 4096;
/// How long a TokenReview answer, either way, is reused (the kubelet's
/// `authentication.webhook.cacheTTL`).
pub(crate) const TOKEN_TTL: Duration = Duration::from_secs(120);

/// What a request asks of the node, in the API's terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The attributes of a request to the kubelet API: the HTTP method's verb on `nodes/proxy`,
/// or on `nodes/stats`, `nodes/metrics`, `nodes/log`, `nodes/spec` for those paths.
pub fn attributes(method: &hyper::Method, path: &str) -> Attributes {
    let verb = match *method {
        hyper::Method::POST => "create",
        hyper::Method::GET | hyper::Method::HEAD => "get",
        hyper::Method::PUT => "update",
        hyper::Method::PATCH => "patch",
        hyper::Method::DELETE => "delete",
        _ => "",
    };
    let under = |root: &str| path == root || path.starts_with(&format!("{root}/"));
    let subresource = if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/spec") {
        "spec"
    } else {
        "proxy"
    };
    Attributes { verb, subresource }
}

/// Why a request is refused; the texts are the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("Unauthorized")]
    Unauthenticated,
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Forbidden {
        user: String,
        verb: &'static str,
        subresource: &'static str,
    },
    #[error("Authorization error (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Error {
        user: String,
        verb: &'static str,
        subresource: &'static str,
    },
}

impl Refusal {
    /// The HTTP status the kubelet answers with.
    pub fn status(&self) -> u16 {
        match self {
            Self::Unauthenticated => 401,
            Self::Forbidden { .. } => 403,
            Self::Error { .. } => 500,
        }
    }
}

type Key = (String, Vec<String>, Attributes);

/// A TokenReview answer kept: who (None: not authenticated) and until when.
type TokenAnswer = (Option<Identity>, Instant);

/// The agent's authorizer: SubjectAccessReviews through the node's own client (set once the
/// node has joined; before that every request is an authorization error).
pub struct Authorizer {
    node: String,
    client: OnceLock<kube::Client>,
    cache: Mutex<HashMap<Key, (bool, Instant)>>,
    /// SHA-256 of a bearer token → who the control plane said it is (None: not
    /// authenticated). Digests, not tokens, are kept, as the kubelet's cache does.
    tokens: Mutex<HashMap<[u8; 32], TokenAnswer>>,
}

impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authorizer")
            .field("node", &self.node)
            .field("joined", &self.client.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Authorizer {
    pub fn new(node: &str) -> Self {
        Self {
            node: node.to_string(),
            client: OnceLock::new(),
            cache: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Who a bearer token stands for, as a TokenReview answers (None: not authenticated, also
    /// when the review cannot be made: the kubelet answers 401 then too).
    pub async fn authenticate(&self, token: &str) -> Option<Identity> {
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some((who, until)) = self
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&digest)
            && *until > Instant::now()
        {
            return who.clone();
        }
        let client = self.client.get()?;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(client.clone());
        let answer = match api.create(&PostParams::default(), &review).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "TokenReview failed");
                return None;
            }
        };
        let who = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .and_then(|u| {
                Some(Identity {
                    user: u.username.filter(|n| !n.is_empty())?,
                    groups: u.groups.unwrap_or_default(),
                })
            });
        let mut tokens = self
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if tokens.len() >= CACHE_LIMIT {
            tokens.clear();
        }
        tokens.insert(digest, (who.clone(), Instant::now() + TOKEN_TTL));
        who
    }

    /// The client reviews are sent with (the node's identity may create SubjectAccessReviews).
    pub fn set_client(&self, client: kube::Client) {
        let _ = self.client.set(client);
    }

    /// Decides whether `who` may do `a` on this node.
    pub async fn authorize(&self, who: Option<&Identity>, a: &Attributes) -> Result<(), Refusal> {
        let who = who.ok_or(Refusal::Unauthenticated)?;
        let forbidden = || Refusal::Forbidden {
            user: who.user.clone(),
            verb: a.verb,
            subresource: a.subresource,
        };
        let key = (who.user.clone(), who.groups.clone(), a.clone());
        if let Some(allowed) = self.cached(&key) {
            return if allowed { Ok(()) } else { Err(forbidden()) };
        }
        let allowed = self.review(who, a).await.map_err(|e| {
            tracing::warn!(user = %who.user, error = %e, "SubjectAccessReview failed");
            Refusal::Error {
                user: who.user.clone(),
                verb: a.verb,
                subresource: a.subresource,
            }
        })?;
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, (allowed, Instant::now() + ttl));
        if allowed { Ok(()) } else { Err(forbidden()) }
    }

    fn cached(&self, key: &Key) -> Option<bool> {
        let cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache
            .get(key)
            .filter(|(_, until)| *until > Instant::now())
            .map(|(allowed, _)| *allowed)
    }

    async fn review(&self, who: &Identity, a: &Attributes) -> Result<bool, ReviewError> {
        let client = self.client.get().ok_or(ReviewError::NotJoined)?;
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.user.clone()),
                groups: Some(who.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(a.verb.to_string()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(a.subresource.to_string()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
        let answer = api.create(&PostParams::default(), &sar).await?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// Why a review could not be made.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    #[error("the node has not joined the control plane yet")]
    NotJoined,
    #[error("{0}")]
    Api(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_node_subresources_as_the_kubelet_maps_them() {
        let cases = [
            (hyper::Method::GET, "/containerLogs/ns/p/c", "get", "proxy"),
            (hyper::Method::GET, "/exec/ns/p/c", "get", "proxy"),
            (hyper::Method::POST, "/exec/ns/p/c", "create", "proxy"),
            (hyper::Method::GET, "/stats/summary", "get", "stats"),
            (hyper::Method::GET, "/stats", "get", "stats"),
            (hyper::Method::GET, "/statsx", "get", "proxy"),
            (hyper::Method::GET, "/metrics/cadvisor", "get", "metrics"),
            (hyper::Method::GET, "/logs/messages", "get", "log"),
            (hyper::Method::GET, "/spec/", "get", "spec"),
            (hyper::Method::DELETE, "/pods", "delete", "proxy"),
            (hyper::Method::PUT, "/x", "update", "proxy"),
            (hyper::Method::PATCH, "/x", "patch", "proxy"),
        ];
        for (m, path, verb, sub) in cases {
            assert_eq!(
                attributes(&m, path),
                Attributes {
                    verb,
                    subresource: sub
                },
                "{m} {path}"
            );
        }
    }

    #[test]
    fn refusals_carry_the_kubelets_texts_and_statuses() {
        let f = Refusal::Forbidden {
            user: "mallory".into(),
            verb: "get",
            subresource: "proxy",
        };
        assert_eq!(
            f.to_string(),
            "Forbidden (user=mallory, verb=get, resource=nodes, subresource=proxy)"
        );
        assert_eq!(f.status(), 403);
        assert_eq!(Refusal::Unauthenticated.to_string(), "Unauthorized");
        assert_eq!(Refusal::Unauthenticated.status(), 401);
    }

    #[tokio::test]
    async fn without_a_client_every_caller_is_an_authorization_error_and_nothing_is_cached() {
        let authz = Authorizer::new("n1");
        let who = Identity {
            user: "kube-apiserver-kubelet-client".into(),
            groups: vec![],
        };
        let a = attributes(&hyper::Method::GET, "/containerLogs/a/b/c");
        assert_eq!(authz.authorize(None, &a).await, Err(Refusal::Unauthenticated));
        let err = authz.authorize(Some(&who), &a).await.expect_err("no client");
        assert_eq!(err.status(), 500);
        assert!(authz.cached(&(who.user.clone(), vec![], a)).is_none());
    }
}
