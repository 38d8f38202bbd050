//! The HTTPS transport: rustls (TLS 1.2/1.3, ALPN http/1.1) with optional client certificates
//! verified against the cluster CA, bearer tokens, and hyper HTTP/1.1 connections handing each
//! request to [`Api::handle`].

use std::collections::HashMap;
use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::api::{Api, Caller, error_response};
use crate::pki::Pki;

/// Errors setting up the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("listening: {0}")]
    Io(#[from] std::io::Error),
}

/// Bearer tokens: token → caller.
pub type Tokens = HashMap<String, Caller>;

/// The rustls configuration: serving certificate, client certificates optional (verified when
/// presented), HTTP/1.1 only.
pub fn tls_config(pki: &Pki) -> Result<rustls::ServerConfig, ServerError> {
    let err = |e: &dyn std::fmt::Display| ServerError::Tls(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
        roots.add(c.map_err(|e| err(&e))?).map_err(|e| err(&e))?;
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()
            .map_err(|e| err(&e))?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pki.server_cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| err(&e))?;
    let key = PrivateKeyDer::from_pem_slice(pki.server_key_pem.as_bytes()).map_err(|e| err(&e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| err(&e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The identity in a verified client certificate: CN is the user, each O a group.
pub fn caller_from_cert(der: &[u8]) -> Option<Caller> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(Caller { user, groups })
}

/// Accepts connections until the listener fails.
pub async fn serve(
    api: Api,
    listener: TcpListener,
    tls: rustls::ServerConfig,
    tokens: Tokens,
) -> Result<(), ServerError> {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let tokens = Arc::new(tokens);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let api = api.clone();
        let tokens = tokens.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let cert_caller = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| caller_from_cert(c.as_ref()));
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let api = api.clone();
                let tokens = tokens.clone();
                let cert_caller = cert_caller.clone();
                async move {
                    let presented = req
                        .headers()
                        .get(hyper::header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .map(|t| t.trim().to_string());
                    let bearer = presented.as_ref().and_then(|t| tokens.get(t).cloned());
                    // Not a static token: perhaps a service-account token.
                    let bearer = match (bearer, presented) {
                        (None, Some(t)) if t.matches('.').count() == 2 => api.authenticate_token(&t).await,
                        (b, _) => b,
                    };
                    let caller = cert_caller.or(bearer);
                    // Streaming upgrades (exec) keep the raw request; everything else is read whole.
                    if req.headers().contains_key(hyper::header::UPGRADE) {
                        return Ok::<_, std::convert::Infallible>(api.upgrade(caller.as_ref(), req).await);
                    }
                    let (parts, body) = req.into_parts();
                    let resp = match crate::api::collect_body(body).await {
                        Ok(bytes) => {
                            api.handle(caller.as_ref(), hyper::Request::from_parts(parts, bytes))
                                .await
                        }
                        Err(e) => error_response(&e),
                    };
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
