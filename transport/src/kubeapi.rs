//! The Kubernetes API client stack of the workspace: a `kube::Client` over rustls (ring) that
//! trusts only the CA it is given, authenticated by a bearer token or a client certificate, or
//! configured from a kubeconfig file. The agent, the standalone scheduler and controllers and the
//! hollow nodes all start here; bundled components use the control plane's in-process transport
//! instead (same `kube::Client`, no socket).

use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use kube::client::middleware::BaseUriLayer;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::tls::{ServerAuth, TlsError, client_config};

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum KubeClientError {
    #[error("bad server URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cluster CA: {0}")]
    Ca(#[from] TlsError),
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("{0}")]
    Client(#[from] kube::Error),
    #[error("invalid header value: {0}")]
    Header(#[from] http::header::InvalidHeaderValue),
}

/// How the client authenticates.
#[derive(Debug, Clone)]
pub enum Credentials {
    Bearer(String),
    /// Client certificate and key (PEM).
    Certificate {
        cert_pem: String,
        key_pem: String,
    },
}

/// Longest wait for a connection to the API server (kubeconfig clients; the other stack sets
/// its own in `crate::client`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a response's head. Without it a request on a connection that died without
/// a reset (a NAT forgetting it) waits for ever, and with it the loop that sent it. (Seen once
/// in the two-node VM test: a node agent's pod loop stopped starting pods for minutes while its
/// lease kept the node Ready; this was the suspected cause, not a proven one.) Watches answer
/// their head at once, so this bounds them only until they start.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// A client for `server` (`https://HOST:PORT`) trusting only `ca_pem`, sending `user_agent`
/// (the API server names a writer's field manager after it).
///
/// The stack is the workspace's one HTTP client (`crate::client`) under kube's base-URI layer,
/// not `kube::Client::try_from(Config)`: that stack also links kube's kubeconfig auth machinery
/// (exec plugins, OIDC refresh, jsonpath) into the node binary, which a node never uses.
pub fn client(
    server: &str,
    ca_pem: &str,
    credentials: Credentials,
    user_agent: &str,
) -> Result<kube::Client, KubeClientError> {
    let url = server.parse::<http::Uri>().map_err(|e| KubeClientError::Url {
        url: server.into(),
        reason: e.to_string(),
    })?;
    if url.scheme_str() != Some("https") {
        return Err(KubeClientError::Url {
            url: server.into(),
            reason: "want https://HOST:PORT".into(),
        });
    }
    let (tls, bearer) = match &credentials {
        Credentials::Bearer(token) => (client_config(ServerAuth::Ca(ca_pem), None)?, Some(token)),
        Credentials::Certificate { cert_pem, key_pem } => (
            client_config(ServerAuth::Ca(ca_pem), Some((cert_pem, key_pem)))?,
            None,
        ),
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::USER_AGENT, header_value(user_agent)?);
    if let Some(token) = bearer {
        let mut v = header_value(&format!("Bearer {token}"))?;
        v.set_sensitive(true);
        headers.insert(http::header::AUTHORIZATION, v);
    }
    let http = crate::client::http_client::<kube::client::Body>(Some(Arc::new(tls)))?;
    let service = tower::ServiceBuilder::new()
        .timeout(RESPONSE_TIMEOUT)
        .layer(BaseUriLayer::new(url))
        .map_request(move |mut req: http::Request<kube::client::Body>| {
            for (k, v) in &headers {
                req.headers_mut().entry(k).or_insert_with(|| v.clone());
            }
            req
        })
        .service(http);
    Ok(kube::Client::new(service, "default"))
}

fn header_value(s: &str) -> Result<HeaderValue, KubeClientError> {
    Ok(HeaderValue::from_str(s)?)
}

/// A client configured from the kubeconfig at `path` (its current context).
pub async fn from_kubeconfig(path: &Path, user_agent: &str) -> Result<kube::Client, KubeClientError> {
    let err = |source| KubeClientError::Kubeconfig {
        path: path.display().to_string(),
        source,
    };
    let kc = Kubeconfig::read_from(path).map_err(err)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(err)?;
    finish(cfg, user_agent)
}

fn finish(mut cfg: kube::Config, user_agent: &str) -> Result<kube::Client, KubeClientError> {
    cfg.connect_timeout = Some(CONNECT_TIMEOUT);
    if let Ok(v) = HeaderValue::from_str(user_agent) {
        cfg.headers.push((HeaderName::from_static("user-agent"), v));
    }
    Ok(kube::Client::try_from(cfg)?)
}
