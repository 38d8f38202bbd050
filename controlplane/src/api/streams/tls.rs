//! The TLS client of the agents: the API server's client certificate from the cluster CA; the
//! agent's self-signed serving certificate is not verified (as an API server without
//! `--kubelet-certificate-authority`).

use std::sync::Arc;

use transport::client::HttpClient;
use transport::tls::{ServerAuth, TlsError};

use crate::pki::Pki;

/// Why the agents' client cannot be built (the API answers 500 with the text).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentTlsError {
    #[error("the API server has no cluster CA key")]
    NoClusterCa,
    /// The kubelet-client certificate could not be issued.
    #[error("{0}")]
    Certificate(#[from] crate::pki::PkiError),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// The pooled client for agents: the kubelet-client certificate of `pki`, any server certificate.
pub(super) fn agent_client(
    pki: Option<&Pki>,
) -> Result<HttpClient<http_body_util::Empty<bytes::Bytes>>, AgentTlsError> {
    let pki = pki.ok_or(AgentTlsError::NoClusterCa)?;
    let (cert, key) = pki.kubelet_client()?;
    let cfg = transport::tls::client_config(ServerAuth::Unverified, Some((&cert, &key)))?;
    Ok(transport::client::http_client(Some(Arc::new(cfg)))?)
}
