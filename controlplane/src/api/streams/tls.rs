//! The TLS client of the agents: the API server's kubelet-client certificate from the cluster
//! CA, and the agent's serving certificate verified against that CA for the node's name.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Empty;
use transport::client::{NamedClient, Names};
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

/// The pooled client for agents and its table of node names to the addresses they report.
#[derive(Debug, Clone)]
pub(crate) struct AgentClient {
    pub(super) client: NamedClient<Empty<Bytes>>,
    pub(super) names: Names,
}

impl AgentClient {
    /// The client with the kubelet-client certificate of `pki`, trusting only its CA.
    pub(super) fn new(pki: Option<&Pki>) -> Result<Self, AgentTlsError> {
        let pki = pki.ok_or(AgentTlsError::NoClusterCa)?;
        let (cert, key) = pki.kubelet_client()?;
        let cfg = transport::tls::client_config(ServerAuth::Ca(&pki.ca_pem), Some((&cert, &key)))?;
        let names = Names::default();
        let client = transport::client::named_client(Arc::new(cfg), names.clone())?;
        Ok(Self { client, names })
    }
}
