//! The HTTPS server loop of the API server and the node agent: TLS (ALPN `http/1.1`), a
//! handshake timeout, a header read timeout, a cap on open connections, back-off on accept
//! errors (e.g. out of file descriptors), the client certificate's identity handed to the
//! handler, and HTTP upgrades (exec streams) kept available.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::body::Body;
use crate::tls::{Identity, identity_of};

/// Limits of one server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// A TLS handshake that takes longer is dropped.
    pub handshake_timeout: Duration,
    /// A request whose headers take longer to arrive is dropped.
    pub header_read_timeout: Duration,
    /// Connections open at once; the listener waits for one to close beyond this.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            max_connections: 8192,
        }
    }
}

/// The other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// From its client certificate, verified against the configured client CA.
    pub identity: Option<Identity>,
}

/// Longest pause after a failed `accept` (failures double the pause from 5 ms).
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts connections on `listener` for ever, each served by `handler` on its own task.
/// The token of a request's `Authorization: Bearer <token>` header (None: absent or empty).
pub fn bearer_token(headers: &hyper::HeaderMap) -> Option<&str> {
    headers
        .get(hyper::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

pub async fn serve<F, Fut>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    handler: F,
) -> Infallible
where
    F: Fn(Arc<Peer>, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = Duration::from_millis(5);
    loop {
        // Semaphore::acquire_owned fails only when the semaphore is closed; it never is.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            continue;
        };
        let (tcp, addr) = match listener.accept().await {
            Ok(c) => {
                backoff = Duration::from_millis(5);
                c
            }
            Err(e) => {
                tracing::warn!(error = %e, pause = ?backoff, "accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, handler, limits) = (acceptor.clone(), handler.clone(), limits.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%addr, "TLS handshake timed out");
                    return;
                }
            };
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| identity_of(c.as_ref()));
            let peer = Arc::new(Peer { addr, identity });
            let service = service_fn(move |req| {
                let fut = handler(peer.clone(), req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            if let Err(e) = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(%addr, error = %e, "connection ended with an error");
            }
        });
    }
}
