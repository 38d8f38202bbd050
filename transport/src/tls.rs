//! rustls configurations from PEM, with the ring provider (it cross-compiles to both musl targets;
//! aws-lc-rs does not here) and explicit trust anchors only: a node image has no system trust
//! store, and a cluster trusts its own CA.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use rustls::sign::CertifiedKey;

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
    let cert = Arc::new(SwappableCert::new(cert_pem, key_pem)?);
    server_config_with(cert, client_ca_pem)
}

/// [`server_config`] serving whatever certificate `cert` picks at each handshake (a
/// [`SwappableCert`], or a choice by the requested name).
pub fn server_config_with(
    cert: Arc<dyn rustls::server::ResolvesServerCert>,
    client_ca_pem: Option<&str>,
) -> Result<rustls::ServerConfig, TlsError> {
    let builder =
        rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match client_ca_pem {
        Some(pem) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(root_store(pem)?),
                provider(),
            )
            .allow_unauthenticated()
            .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(cert);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// A server certificate that can be replaced while serving (a node agent starts with a
/// self-signed one and switches to the one the cluster issues).
#[derive(Debug)]
pub struct SwappableCert(std::sync::RwLock<Arc<CertifiedKey>>);

impl SwappableCert {
    /// Starts with the chain of `cert_pem` and the key of `key_pem`.
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        Ok(Self(std::sync::RwLock::new(Arc::new(certified_key(
            cert_pem, key_pem,
        )?))))
    }

    /// Serves `cert_pem`/`key_pem` from the next handshake on (a bad pair changes nothing).
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let key = Arc::new(certified_key(cert_pem, key_pem)?);
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = key;
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for SwappableCert {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }
}

/// A certificate chain and its key (PEM) as rustls serves them; a key that does not match the
/// certificate is an error.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    let signing = provider().key_provider.load_private_key(key)?;
    let certified = CertifiedKey::new(chain, signing);
    // The key must belong to the certificate (rustls checks when it can).
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
        Err(e) => Err(e.into()),
    }
}

/// The DNS names and IP addresses a certificate (PEM, first in the chain) is for, and when it
/// expires.
pub fn certificate_names(pem: &str) -> Option<(Vec<String>, std::time::SystemTime)> {
    let der = certificates(pem).ok()?.into_iter().next()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => names.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(std::net::IpAddr::from),
                        _ => None,
                    };
                    names.extend(ip.map(|i| i.to_string()));
                }
                _ => {}
            }
        }
    }
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some((
        names,
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
    ))
}

/// How a client checks the server's certificate.
#[derive(Debug, Clone, Copy)]
pub enum ServerAuth<'a> {
    /// Against this CA (PEM): the chain, the name the client asked for, and server auth usage.
    Ca(&'a str),
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
