//! One pooled HTTP/1.1 client (hyper-util's, over hyper-rustls: the stack the `kube` client
//! uses too) for the etcd gateway, the API server's requests to node agents and the benchmarks.
//! Requests carry an absolute URI (`http://` or `https://`); connections are kept alive and
//! reused per host.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;

use crate::tls::TlsError;

/// Errors of one request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Request(#[from] hyper_util::client::legacy::Error),
    #[error("reading the response body: {0}")]
    Body(String),
    #[error("response body larger than {0} bytes")]
    TooLarge(usize),
}

impl ClientError {
    /// The error with each cause it does not already name after it (`a: b: c`): hyper hides
    /// why a connection failed (a refused certificate, a refused connection) in the sources.
    pub fn with_causes(&self) -> String {
        let mut why = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let text = s.to_string();
            if !why.contains(&text) {
                why = format!("{why}: {text}");
            }
            source = s.source();
        }
        why
    }
}

/// A pooled client sending bodies of type `B`.
pub type HttpClient<B> = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, B>;

/// A client for `http://` URIs and, with `tls`, `https://` ones (without it, an https request
/// fails: there are no trust anchors).
pub fn http_client<B>(tls: Option<Arc<rustls::ClientConfig>>) -> Result<HttpClient<B>, TlsError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let mut http = HttpConnector::new();
    tune(&mut http);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_tls(tls)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(pooled(connector))
}

/// A pooled client whose host names are resolved by a [`Names`] table instead of DNS. The host
/// name stays what TLS verifies the server against: the API server reaches a node agent at
/// `https://<node name>:<port>` with the node's reported address behind the name, so the
/// agent must hold a certificate for that node's name.
pub type NamedClient<B> = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector<Names>>, B>;

/// [`NamedClient`] (https only) with TLS configuration `tls` and name table `names`.
pub fn named_client<B>(tls: Arc<rustls::ClientConfig>, names: Names) -> Result<NamedClient<B>, TlsError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let mut http = HttpConnector::new_with_resolver(names);
    tune(&mut http);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_tls(Some(tls))?)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Ok(pooled(connector))
}

/// The TLS configuration a client uses: `tls`, or one trusting nothing.
fn client_tls(tls: Option<Arc<rustls::ClientConfig>>) -> Result<rustls::ClientConfig, TlsError> {
    let mut tls = match tls {
        Some(t) => (*t).clone(),
        None => {
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        }
    };
    // hyper-rustls sets ALPN itself (`enable_http1`) and panics when it is already set.
    tls.alpn_protocols.clear();
    Ok(tls)
}

fn tune<R>(http: &mut HttpConnector<R>) {
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
}

/// How long an idle pooled connection may be reused: below the servers' 30 s header-read
/// timeout (`transport::server::Limits`), which also closes idle keep-alive connections. A
/// node reaches the API server through QEMU's guestfwd relay, which does not always pass the
/// server's close on to the guest: a connection kept longer was reused dead, and every request
/// on it waited out the 60 s response timeout (seen as minutes of `request timed out` reads
/// after the agent-restart VM test's last restart).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

fn pooled<C, B>(connector: C) -> hyper_util::client::legacy::Client<C, B>
where
    C: hyper_util::client::legacy::connect::Connect + Clone,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .build(connector)
}

/// A name-to-address table used as a [`NamedClient`]'s resolver: the owner sets a name's
/// address before sending a request for it; a name it never set does not resolve.
#[derive(Debug, Clone, Default)]
pub struct Names(Arc<std::sync::RwLock<std::collections::HashMap<String, std::net::IpAddr>>>);

impl Names {
    /// Points `name` at `ip`.
    pub fn set(&self, name: &str, ip: std::net::IpAddr) {
        // Every request to an agent sets its name; the write lock is taken only on a change.
        if self.get(name) != Some(ip) {
            self.0
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(name.to_string(), ip);
        }
    }

    fn get(&self, name: &str) -> Option<std::net::IpAddr> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .copied()
    }
}

/// A name [`Names`] does not hold.
#[derive(Debug, thiserror::Error)]
#[error("no address is known for {0:?}")]
pub struct UnknownName(String);

impl tower::Service<Name> for Names {
    type Response = std::iter::Once<std::net::SocketAddr>;
    type Error = UnknownName;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        // The port is the URI's; the connector sets it.
        std::future::ready(
            self.get(name.as_str())
                .map(|ip| std::iter::once(std::net::SocketAddr::new(ip, 0)))
                .ok_or_else(|| UnknownName(name.as_str().to_string())),
        )
    }
}

/// Sends `req`, waiting at most `timeout` for the response head.
pub async fn send<C, B>(
    client: &hyper_util::client::legacy::Client<C, B>,
    req: http::Request<B>,
    timeout: Duration,
) -> Result<http::Response<Incoming>, ClientError>
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
    B: hyper::body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::time::timeout(timeout, client.request(req))
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
        .map_err(ClientError::from)
}

/// Reads a whole response body, refusing more than `limit` bytes (error bodies from a peer that
/// should not be trusted included).
pub async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, ClientError> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ClientError::TooLarge(limit))
        }
        Err(e) => Err(ClientError::Body(e.to_string())),
    }
}
