//! The TLS client of the agents: the API server's client certificate from the cluster CA; the
//! agent's self-signed serving certificate is not verified (as an API server without
//! `--kubelet-certificate-authority`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::pki::Pki;

/// Why the agents' TLS client cannot be built (the API answers 500 with the text).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentTlsError {
    #[error("the API server has no cluster CA key")]
    NoClusterCa,
    /// The kubelet-client certificate could not be issued.
    #[error("{0}")]
    Certificate(String),
    #[error("{0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("{0}")]
    Tls(#[from] rustls::Error),
}

/// The client configuration: the kubelet-client certificate of `pki`, any server certificate.
pub(super) fn client_config(pki: Option<&Pki>) -> Result<Arc<rustls::ClientConfig>, AgentTlsError> {
    let pki = pki.ok_or(AgentTlsError::NoClusterCa)?;
    let (cert, key) = pki.kubelet_client().map_err(AgentTlsError::Certificate)?;
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(UnverifiedServer(provider)))
        .with_client_auth_cert(chain, key)?;
    Ok(Arc::new(cfg))
}

/// Accepts the agent's self-signed serving certificate (signatures are still checked).
#[derive(Debug)]
struct UnverifiedServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for UnverifiedServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
