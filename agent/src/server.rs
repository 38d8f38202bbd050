//! The agent's TLS endpoint. The serving certificate is self-signed for now; with node join it
//! is issued by the cluster CA.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::{AgentConfig, AgentError};

fn tls_config(names: &[String]) -> Result<rustls::ServerConfig, AgentError> {
    let key = rcgen::KeyPair::generate().map_err(|e| AgentError::Certificate(e.to_string()))?;
    let params =
        rcgen::CertificateParams::new(names.to_vec()).map_err(|e| AgentError::Certificate(e.to_string()))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| AgentError::Certificate(e.to_string()))?;
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, "ok"),
        _ => (StatusCode::NOT_FOUND, "not found"),
    };
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    Ok(resp)
}

/// Serves the agent endpoint until the listener fails.
pub async fn serve(cfg: AgentConfig) -> Result<(), AgentError> {
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(&cfg.server_names)?));
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: cfg.listen,
            source,
        })?;
    tracing::info!(listen = %cfg.listen, "ready");
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service_fn(handle))
                .await
            {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
}
