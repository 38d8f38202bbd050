//! A minimal Kubernetes API client: JSON over HTTPS (rustls, the cluster CA from the machine
//! config, a bearer token or a client certificate), one connection per request.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use serde_json::Value;
use tokio::net::TcpStream;

/// Longest wait for one request, connection and TLS handshake included.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Errors talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad server URL {0:?} (want https://HOST:PORT)")]
    Url(String),
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP: {0}")]
    Http(String),
    #[error("{method} {path}: HTTP {code}: {message}")]
    Status {
        method: String,
        path: String,
        code: u16,
        message: String,
    },
}

/// How requests authenticate.
#[derive(Debug, Clone)]
pub enum Credentials {
    Bearer(String),
    /// Client certificate and key (PEM).
    Certificate {
        cert_pem: String,
        key_pem: String,
    },
}

/// A client for one API server.
#[derive(Clone)]
pub struct ApiClient {
    addr: String,
    host: String,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    bearer: Option<String>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// A client for `server` (`https://HOST[:PORT]`) trusting only `ca_pem`.
    pub fn new(server: &str, ca_pem: &str, creds: Credentials) -> Result<Self, ClientError> {
        let hostport = server
            .strip_prefix("https://")
            .ok_or_else(|| ClientError::Url(server.into()))?
            .trim_end_matches('/');
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
                h.trim_start_matches('[').trim_end_matches(']').to_string(),
                p.parse::<u16>().map_err(|_| ClientError::Url(server.into()))?,
            ),
            _ => (hostport.to_string(), 443),
        };
        let tls_err = |e: &dyn std::fmt::Display| ClientError::Tls(e.to_string());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.map_err(|e| tls_err(&e))?).map_err(|e| tls_err(&e))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(&e))?
            .with_root_certificates(roots);
        let (mut tls, bearer) = match creds {
            Credentials::Bearer(t) => (builder.with_no_client_auth(), Some(t)),
            Credentials::Certificate { cert_pem, key_pem } => {
                let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| tls_err(&e))?;
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| tls_err(&e))?;
                (
                    builder
                        .with_client_auth_cert(chain, key)
                        .map_err(|e| tls_err(&e))?,
                    None,
                )
            }
        };
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = ServerName::try_from(host.clone()).map_err(|e| tls_err(&e))?;
        Ok(Self {
            addr: format!("{host}:{port}"),
            host: hostport.to_string(),
            server_name,
            tls: Arc::new(tls),
            bearer,
        })
    }

    /// Sends one request (at most [`REQUEST_TIMEOUT`]); a status of 300 or more becomes
    /// [`ClientError::Status`].
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        match tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.request_inner(method, path, content_type, body),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(ClientError::Http(format!(
                "{method} {path}: no answer within {REQUEST_TIMEOUT:?}"
            ))),
        }
    }

    async fn request_inner(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        let http = |e: &dyn std::fmt::Display| ClientError::Http(e.to_string());
        let tcp = TcpStream::connect(&self.addr)
            .await
            .map_err(|source| ClientError::Connect {
                addr: self.addr.clone(),
                source,
            })?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|source| ClientError::Connect {
                addr: self.addr.clone(),
                source,
            })?;
        let (mut send, conn) = http1::handshake(TokioIo::new(tls)).await.map_err(|e| http(&e))?;
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host)
            .header("accept", "application/json")
            .header("content-type", content_type)
            .header("user-agent", concat!("nodeos-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(t) = &self.bearer {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = Full::new(body.map(|b| Bytes::from(b.to_string())).unwrap_or_default());
        let resp = send
            .send_request(req.body(body).map_err(|e| http(&e))?)
            .await
            .map_err(|e| http(&e))?;
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.map_err(|e| http(&e))?.to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if code >= 300 {
            let message = v["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ClientError::Status {
                method: method.into(),
                path: path.into(),
                code,
                message,
            });
        }
        Ok(v)
    }
}
