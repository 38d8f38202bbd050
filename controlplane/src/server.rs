//! The API server's HTTPS front: the shared server loop of `transport::server` (TLS 1.2/1.3,
//! timeouts, connection cap) with client certificates verified against the cluster CA, bearer
//! tokens (static tokens, service-account JWTs, then bootstrap-token Secrets), and each request handed to [`Api::handle`]
//! (or [`Api::upgrade`] for streams), audited when an audit policy is set ([`crate::audit`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use tokio::net::TcpListener;
use transport::server::{Limits, Peer};
use transport::tls::TlsError;

use crate::api::{Api, Body, Caller, collect_body, error_response};
use crate::audit::{self, Auditor, Level};
use crate::pki::Pki;

/// Bearer tokens: token → caller.
pub type Tokens = HashMap<String, Caller>;

/// The rustls configuration: serving certificate, client certificates optional (verified against
/// the cluster CA when presented), HTTP/1.1 only.
pub fn tls_config(pki: &Pki) -> Result<rustls::ServerConfig, TlsError> {
    transport::tls::server_config(&pki.server_cert_pem, &pki.server_key_pem, Some(&pki.ca_pem))
}

/// Serves `api` on `listener` for ever, recording requests with `audit` when given.
pub async fn serve(
    api: Api,
    listener: TcpListener,
    tls: rustls::ServerConfig,
    tokens: Tokens,
    audit: Option<Auditor>,
) -> Infallible {
    api.set_static_tokens(tokens);
    let audit = audit.map(Arc::new);
    transport::server::serve(listener, Arc::new(tls), Limits::default(), move |peer, req| {
        handle(api.clone(), audit.clone(), peer, req)
    })
    .await
}

async fn handle(
    api: Api,
    audit: Option<Arc<Auditor>>,
    peer: Arc<Peer>,
    req: hyper::Request<Incoming>,
) -> hyper::Response<Body> {
    let caller = match &peer.identity {
        Some(id) => Some(Caller {
            user: id.user.clone(),
            groups: id.groups.clone(),
        }),
        None => bearer_caller(&api, &req).await,
    };
    let audited = audit.and_then(|a| Audited::begin(a, caller.as_ref(), &peer, &req));
    if let Some(a) = &audited {
        a.received().await;
    }
    // Streaming upgrades (exec) keep the raw request; everything else is read whole.
    if req.headers().contains_key(hyper::header::UPGRADE) {
        let resp = api.upgrade(caller.as_ref(), req).await;
        if let Some(a) = audited {
            a.finish("ResponseStarted", resp.status().as_u16(), None, None)
                .await;
        }
        return resp;
    }
    let (parts, body) = req.into_parts();
    let bytes = match collect_body(body).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let Some(a) = audited else {
        return api
            .handle(caller.as_ref(), hyper::Request::from_parts(parts, bytes))
            .await;
    };
    let mut a = a;
    let decoded = (a.level >= Level::Request || a.record.info.verb == "create")
        .then(|| object_of(parts.headers.get(hyper::header::CONTENT_TYPE), &bytes))
        .flatten();
    // A create names its object in the body: the event's objectRef gets the name from there.
    if a.record.info.name.is_empty()
        && let Some(name) = decoded.as_ref().and_then(|o| o["metadata"]["name"].as_str())
    {
        a.record.info.name = name.to_string();
    }
    let request_body = decoded.filter(|_| a.level >= Level::Request);
    let resp = api
        .handle(caller.as_ref(), hyper::Request::from_parts(parts, bytes))
        .await;
    let streaming = a.record.info.verb == "watch"
        || matches!(
            a.record.info.subresource.as_str(),
            "log" | "exec" | "attach" | "portforward" | "proxy"
        );
    if streaming || a.level < Level::RequestResponse {
        let stage = if streaming {
            "ResponseStarted"
        } else {
            "ResponseComplete"
        };
        a.finish(stage, resp.status().as_u16(), request_body, None).await;
        return resp;
    }
    // RequestResponse: the whole answer is read to record it, then sent as read.
    let (parts, body) = resp.into_parts();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let response_body = object_of(parts.headers.get(hyper::header::CONTENT_TYPE), &bytes);
    a.finish(
        "ResponseComplete",
        parts.status.as_u16(),
        request_body,
        response_body,
    )
    .await;
    hyper::Response::from_parts(parts, crate::api::full(bytes))
}

/// A JSON or Kubernetes-protobuf body as an object (other bodies are not recorded).
fn object_of(ct: Option<&hyper::header::HeaderValue>, bytes: &bytes::Bytes) -> Option<serde_json::Value> {
    let ct = ct.and_then(|v| v.to_str().ok()).unwrap_or("application/json");
    crate::api::request::body::parse_object_body(ct, bytes).ok()
}

/// A request being audited: its policy decision and what was known when it arrived.
struct Audited {
    auditor: Arc<Auditor>,
    level: Level,
    omit: Vec<String>,
    record: audit::Record,
}

impl Audited {
    /// The audit of `req`, or None when the policy's level for it is None.
    fn begin(
        auditor: Arc<Auditor>,
        caller: Option<&Caller>,
        peer: &Peer,
        req: &hyper::Request<Incoming>,
    ) -> Option<Self> {
        let (user, groups) = caller.map_or_else(
            || {
                (
                    "system:anonymous".to_string(),
                    vec!["system:unauthenticated".to_string()],
                )
            },
            |c| (c.user.clone(), c.groups.clone()),
        );
        let query = crate::api::request::Query::parse(req.uri().query());
        let info = crate::api::authz::RequestInfo::of(req.method(), req.uri().path(), &query);
        let (level, omit) = auditor.decide(&user, &groups, &info);
        if level == Level::None {
            return None;
        }
        let header = |h: &str| {
            req.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let record = audit::Record {
            level,
            stage: "ResponseComplete",
            audit_id: header("Audit-ID").unwrap_or_else(audit::new_id),
            request_uri: req
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default(),
            info,
            user,
            groups,
            impersonated: header("Impersonate-User"),
            source_ip: peer.addr.ip().to_string(),
            user_agent: header("User-Agent").unwrap_or_default(),
            received: std::time::SystemTime::now(),
            code: 0,
            request_body: None,
            response_body: None,
        };
        Some(Self {
            auditor,
            level,
            omit,
            record,
        })
    }

    /// Records the `RequestReceived` stage (unless omitted).
    async fn received(&self) {
        let record = audit::Record {
            stage: audit::RECEIVED,
            ..self.record.clone()
        };
        self.auditor.record(record, &self.omit).await;
    }

    async fn finish(
        self,
        stage: &'static str,
        code: u16,
        request_body: Option<serde_json::Value>,
        response_body: Option<serde_json::Value>,
    ) {
        let record = audit::Record {
            stage,
            code,
            request_body,
            response_body,
            ..self.record
        };
        self.auditor.record(record, &self.omit).await;
    }
}

/// The caller a request's bearer token names.
async fn bearer_caller(api: &Api, req: &hyper::Request<Incoming>) -> Option<Caller> {
    api.authenticate_bearer(transport::server::bearer_token(req.headers())?)
        .await
}
