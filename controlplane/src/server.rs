//! The API server's HTTPS front: the shared server loop of `transport::server` (TLS 1.2/1.3,
//! timeouts, connection cap) with client certificates verified against the cluster CA, bearer
//! tokens (static tokens, service-account JWTs, then bootstrap-token Secrets), and each request handed to [`Api::handle`]
//! (or [`Api::upgrade`] for streams).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use tokio::net::TcpListener;
use transport::server::{Limits, Peer};
use transport::tls::TlsError;

use crate::api::{Api, Body, Caller, collect_body, error_response};
use crate::pki::Pki;

/// Bearer tokens: token → caller.
pub type Tokens = HashMap<String, Caller>;

/// The rustls configuration: serving certificate, client certificates optional (verified against
/// the cluster CA when presented), HTTP/1.1 only.
pub fn tls_config(pki: &Pki) -> Result<rustls::ServerConfig, TlsError> {
    transport::tls::server_config(&pki.server_cert_pem, &pki.server_key_pem, Some(&pki.ca_pem))
}

/// Serves `api` on `listener` for ever.
pub async fn serve(api: Api, listener: TcpListener, tls: rustls::ServerConfig, tokens: Tokens) -> Infallible {
    let tokens = Arc::new(tokens);
    transport::server::serve(listener, Arc::new(tls), Limits::default(), move |peer, req| {
        handle(api.clone(), tokens.clone(), peer, req)
    })
    .await
}

async fn handle(
    api: Api,
    tokens: Arc<Tokens>,
    peer: Arc<Peer>,
    req: hyper::Request<Incoming>,
) -> hyper::Response<Body> {
    let caller = match &peer.identity {
        Some(id) => Some(Caller {
            user: id.user.clone(),
            groups: id.groups.clone(),
        }),
        None => bearer_caller(&api, &tokens, &req).await,
    };
    // Streaming upgrades (exec) keep the raw request; everything else is read whole.
    if req.headers().contains_key(hyper::header::UPGRADE) {
        return api.upgrade(caller.as_ref(), req).await;
    }
    let (parts, body) = req.into_parts();
    match collect_body(body).await {
        Ok(bytes) => {
            api.handle(caller.as_ref(), hyper::Request::from_parts(parts, bytes))
                .await
        }
        Err(e) => error_response(&e),
    }
}

/// The caller a bearer token names: a static token, else a service-account token.
async fn bearer_caller(api: &Api, tokens: &Tokens, req: &hyper::Request<Incoming>) -> Option<Caller> {
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)?;
    if let Some(c) = tokens.get(presented) {
        return Some(c.clone());
    }
    if presented.matches('.').count() == 2 {
        return api.authenticate_token(presented).await;
    }
    api.authenticate_bootstrap_token(presented).await
}
