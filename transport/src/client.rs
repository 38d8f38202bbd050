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

/// A pooled client sending bodies of type `B`.
pub type HttpClient<B> = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, B>;

/// A client for `http://` URIs and, with `tls`, `https://` ones (without it, an https request
/// fails: there are no trust anchors).
pub fn http_client<B>(tls: Option<Arc<rustls::ClientConfig>>) -> Result<HttpClient<B>, TlsError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
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
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector))
}

/// Sends `req`, waiting at most `timeout` for the response head.
pub async fn send<B>(
    client: &HttpClient<B>,
    req: http::Request<B>,
    timeout: Duration,
) -> Result<http::Response<Incoming>, ClientError>
where
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
