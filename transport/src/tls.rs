//! rustls configurations from PEM, with the ring provider (it cross-compiles to both musl targets;
//! aws-lc-rs does not here) and explicit trust anchors only: a node image has no system trust
//! store, and a cluster trusts its own CA.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Errors building a TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no certificate in the PEM data")]
    NoCertificate,
    #[error("reading PEM: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Who a verified client certificate names: the subject CN is the user, each O a group (the
/// Kubernetes x509 authenticator's rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// The identity in a DER certificate (None when it has no CN or does not parse).
pub fn identity_of(der: &[u8]) -> Option<Identity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(Identity { user, groups })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in `pem`, in order (at least one).
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    Ok(certs)
}

/// A trust store holding the certificates of `ca_pem`.
pub fn root_store(ca_pem: &str) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca_pem)? {
        roots.add(c)?;
    }
    Ok(roots)
}

/// A server configuration: TLS 1.2/1.3, ALPN `http/1.1`, the chain and key of `cert_pem` and
/// `key_pem`. With `client_ca_pem`, client certificates are optional (health checks and bearer
/// tokens need none) and verified against it when presented.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&str>,
) -> Result<rustls::ServerConfig, TlsError> {
    let chain = certificates(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let builder =
        rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let mut cfg = match client_ca_pem {
        Some(pem) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(root_store(pem)?),
                provider(),
            )
            .allow_unauthenticated()
            .build()?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)?
        }
        None => builder.with_no_client_auth().with_single_cert(chain, key)?,
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// How a client checks the server's certificate.
#[derive(Debug, Clone, Copy)]
pub enum ServerAuth<'a> {
    /// Against this CA (PEM).
    Ca(&'a str),
    /// Not at all: only for node agents' self-signed serving certificates, as kube-apiserver
    /// without `--kubelet-certificate-authority` (the security issue replaces it with
    /// CSR-issued serving certificates).
    Unverified,
}

/// A client configuration: TLS 1.2/1.3, ALPN `http/1.1`, the server checked per `server`, and
/// a client certificate when `identity` (certificate PEM, key PEM) is given.
pub fn client_config(
    server: ServerAuth<'_>,
    identity: Option<(&str, &str)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let builder =
        rustls::ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match server {
        ServerAuth::Ca(pem) => builder.with_root_certificates(root_store(pem)?),
        ServerAuth::Unverified => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider()))),
    };
    let mut cfg = match identity {
        Some((cert_pem, key_pem)) => builder.with_client_auth_cert(
            certificates(cert_pem)?,
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?,
        )?,
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Accepts any server certificate but still checks the handshake signatures.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unverified {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, orgs: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        let c = params.self_signed(&key).expect("sign");
        (c.pem(), key.serialize_pem())
    }

    #[test]
    fn identity_is_cn_and_organizations() {
        // rcgen keeps one value per attribute type, so one O here.
        let (pem, _) = cert("system:node:n1", &["system:nodes"]);
        let der = certificates(&pem).expect("pem").remove(0);
        assert_eq!(
            identity_of(der.as_ref()),
            Some(Identity {
                user: "system:node:n1".into(),
                groups: vec!["system:nodes".into()],
            })
        );
    }

    #[test]
    fn bad_pem_is_an_error_not_an_empty_store() {
        assert!(matches!(root_store("not a pem"), Err(TlsError::NoCertificate)));
        let (c, k) = cert("a", &[]);
        assert!(server_config(&c, &k, None).is_ok());
        assert!(server_config(&c, "garbage", None).is_err());
        assert!(client_config(ServerAuth::Ca(&c), Some((&c, &k))).is_ok());
    }
}
