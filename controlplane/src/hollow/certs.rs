//! Serving certificates for hollow nodes. The API server verifies a node's endpoint against a
//! certificate from the cluster CA for the node's name, so hollow nodes ask for them as agents
//! do, through `kubernetes.io/kubelet-serving` CSRs, but one CSR per [`NAMES_PER_CERT`] nodes
//! (a certificate for thousands of names would pass rustls' 64 KiB handshake-message limit),
//! with subject `system:node:<first name>`. The hollow-nodes identity approves them itself
//! (the control plane auto-approves only a node asking for its own name): it needs `approve`
//! on that signer, which an administrator has. Each handshake is answered with the certificate
//! for the name the client sent (SNI); before one is issued, with a self-signed certificate
//! the API server refuses.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::PostParams;
use rustls::sign::CertifiedKey;
use serde_json::json;

/// Node names per certificate.
pub(crate) const NAMES_PER_CERT: usize = 500;
/// How long to wait for one certificate after approving its CSR.
const ISSUE_WAIT: Duration = Duration::from_secs(60);

/// Why hollow nodes got no serving certificates.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    #[error("creating the key or CSR: {0}")]
    Csr(#[from] rcgen::Error),
    #[error("{0}")]
    Pki(#[from] crate::pki::PkiError),
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Tls(#[from] transport::tls::TlsError),
    #[error("CSR {name}: {why}")]
    NotIssued { name: String, why: String },
}

/// The hollow nodes' serving certificates, chosen by the requested name.
#[derive(Debug)]
pub(crate) struct ServingCerts {
    fallback: Arc<CertifiedKey>,
    by_name: RwLock<HashMap<String, Arc<CertifiedKey>>>,
}

impl ServingCerts {
    /// Starts with a self-signed certificate for every name.
    pub(crate) fn self_signed() -> Result<Self, CertError> {
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])?.self_signed(&key)?;
        Ok(Self {
            fallback: Arc::new(transport::tls::certified_key(&cert.pem(), &key.serialize_pem())?),
            by_name: RwLock::new(HashMap::new()),
        })
    }

    fn install(&self, names: &[String], key: Arc<CertifiedKey>) {
        let mut m = self
            .by_name
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for n in names {
            m.insert(n.clone(), key.clone());
        }
    }
}

impl rustls::server::ResolvesServerCert for ServingCerts {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let m = self
            .by_name
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(
            hello
                .server_name()
                .and_then(|n| m.get(n).cloned())
                .unwrap_or_else(|| self.fallback.clone()),
        )
    }
}

/// Asks for, approves and installs certificates for all `names`.
pub(crate) async fn obtain(
    client: &kube::Client,
    names: &[String],
    certs: &ServingCerts,
) -> Result<(), CertError> {
    let csrs: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    for chunk in names.chunks(NAMES_PER_CERT) {
        let first = chunk.first().map(String::as_str).unwrap_or_default();
        let (key, pem) = crate::pki::node_csr(first, chunk)?;
        let csr: CertificateSigningRequest = serde_json::from_value(json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"generateName": format!("hollow-serving-{first}-")},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(pem.as_bytes()),
                "signerName": crate::pki::KUBELET_SERVING_SIGNER,
                "usages": ["digital signature", "key encipherment", "server auth"],
            },
        }))?;
        let mut created = csrs.create(&PostParams::default(), &csr).await?;
        let name = created.metadata.name.clone().unwrap_or_default();
        let mut status = created.status.take().unwrap_or_default();
        status
            .conditions
            .get_or_insert_default()
            .push(serde_json::from_value(json!({
                "type": "Approved", "status": "True", "reason": "HollowNodes",
                "message": "approved by the hollow-nodes process for its own nodes",
            }))?);
        created.status = Some(status);
        csrs.replace_subresource(
            "approval",
            &name,
            &PostParams::default(),
            serde_json::to_vec(&created)?,
        )
        .await?;
        let cert_pem = issued(&csrs, &name).await?;
        let certified = transport::tls::certified_key(&cert_pem, &key.serialize_pem())?;
        certs.install(chunk, Arc::new(certified));
    }
    Ok(())
}

/// The certificate of approved CSR `name` (PEM), once the signer has issued it.
async fn issued(csrs: &kube::Api<CertificateSigningRequest>, name: &str) -> Result<String, CertError> {
    let deadline = tokio::time::Instant::now() + ISSUE_WAIT;
    loop {
        let csr = csrs.get(name).await?;
        let status = csr.status.unwrap_or_default();
        if let Some(c) = status.certificate.filter(|c| !c.0.is_empty()) {
            return String::from_utf8(c.0).map_err(|e| CertError::NotIssued {
                name: name.to_string(),
                why: e.to_string(),
            });
        }
        if let Some(f) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Failed")
        {
            return Err(CertError::NotIssued {
                name: name.to_string(),
                why: f.message.unwrap_or_default(),
            });
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CertError::NotIssued {
                name: name.to_string(),
                why: format!("no certificate {} s after approval", ISSUE_WAIT.as_secs()),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
