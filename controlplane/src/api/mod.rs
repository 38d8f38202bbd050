//! The Kubernetes API: routing, verbs (get, list, watch, create, update, patch, delete), object
//! semantics (uid, timestamps, generation, resourceVersion = store revision), discovery, tables,
//! and `Status` errors. Transport-free: [`Api::handle`] takes a request with its whole body and
//! the authenticated caller, so tests drive it without sockets.

mod admission;
mod defaults;
mod delete;
pub mod discovery;
mod eviction;
pub mod fieldmanager;
pub mod object;
pub mod openapi;
pub mod patch;
pub mod protobuf;
mod proxy;
pub mod registry;
pub mod status;
pub mod table;
mod tokens;
pub mod types;
mod verbs;
mod watch;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::storage::Store;
use registry::Resource;
use status::ApiError;

/// Response body: a whole buffer or a stream (watch).
pub type Body = BoxBody<Bytes, Infallible>;

/// Largest request body accepted (etcd's default request limit is 1.5 MiB; Secrets max 1 MiB).
pub const MAX_BODY: usize = 3 << 20;

/// Who is calling (from the client certificate or a bearer token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub groups: Vec<String>,
}

/// The API layer over a store.
#[derive(Clone)]
pub struct Api {
    pub(crate) store: Arc<dyn Store>,
    /// PEM of the cluster CA, published as `kube-root-ca.crt` in every namespace.
    pub(crate) ca_pem: String,
    /// Events decoded once for all watchers.
    pub(crate) watch_cache: Arc<watch::WatchCache>,
    /// Signs node client CSRs (None: CSRs stay pending).
    pub(crate) pki: Option<Arc<crate::pki::Pki>>,
    /// TLS client for node agents (built on first use from `pki`).
    pub(crate) agent_tls: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

/// A parsed request target.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub res: &'static Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

tokio::task_local! {
    /// The warnings of the request being handled (`Warning: 299 - "..."` headers).
    static WARNINGS: std::cell::RefCell<Vec<String>>;
}

/// Adds a warning to the current request's response (nothing outside a request).
pub(crate) fn warn(text: String) {
    let _ = WARNINGS.try_with(|w| w.borrow_mut().push(text));
}

/// Query parameters, decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        let mut out = Vec::new();
        for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.push((kcore::url::percent_decode(k), kcore::url::percent_decode(v)));
        }
        Self(out)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }

    /// The field manager a client named with `fieldManager` (None for the server's own writes).
    pub fn field_manager(&self) -> Option<&str> {
        self.get("fieldManager").filter(|m| !m.is_empty())
    }

    /// Without a `fieldManager` parameter, a client's writes are managed under the product token
    /// of its User-Agent (`kubectl/v1.32.5 (linux/amd64) ...` → `kubectl`), as upstream.
    fn default_field_manager(&mut self, user_agent: Option<&str>) {
        if self.field_manager().is_none() {
            let token = user_agent
                .and_then(|ua| ua.split('/').next())
                .map(str::trim)
                .unwrap_or_default();
            let manager = if token.is_empty() { "unknown" } else { token };
            self.0
                .push(("fieldManager".into(), manager.chars().take(128).collect()));
        }
    }
}

/// A whole-buffer response body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A streaming body fed from a channel (each message is one chunk).
pub(crate) struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|o| o.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut resp = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(crate) fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

fn text_response(code: u16, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(full(text));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// What the client asked the response to look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    Object,
    Table,
}

fn want(req: &Request<Bytes>) -> Want {
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if accept.contains("as=Table") {
        Want::Table
    } else {
        Want::Object
    }
}

/// Splits `/api/v1/...` or `/apis/<g>/<v>/...` into a resource target.
fn parse_target(segs: &[&str]) -> Result<Target, ApiError> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::not_found_path(&segs.join("/"))),
    };
    let lookup = |plural: &str| {
        registry::find(group, version, plural)
            .ok_or_else(|| ApiError::not_found_path(&format!("/{}", segs.join("/"))))
    };
    let t = |res, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| Target {
        res,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.map(str::to_string),
    };
    Ok(match rest {
        ["namespaces", ns, sub] if matches!(*sub, "status" | "finalize") => {
            t(lookup("namespaces")?, None, Some(ns), Some(sub))
        }
        ["namespaces", ns, plural] => t(lookup(plural)?, Some(ns), None, None),
        ["namespaces", ns, plural, name] => t(lookup(plural)?, Some(ns), Some(name), None),
        ["namespaces", ns, plural, name, sub] => t(lookup(plural)?, Some(ns), Some(name), Some(sub)),
        [plural] => t(lookup(plural)?, None, None, None),
        [plural, name] => t(lookup(plural)?, None, Some(name), None),
        [plural, name, sub] => t(lookup(plural)?, None, Some(name), Some(sub)),
        _ => return Err(ApiError::not_found_path(&format!("/{}", segs.join("/")))),
    })
}

impl Api {
    /// An API over `store`, publishing `ca_pem` as `kube-root-ca.crt`.
    pub fn new(store: Arc<dyn Store>, ca_pem: String) -> Self {
        Self {
            store,
            ca_pem,
            watch_cache: Arc::default(),
            pki: None,
            agent_tls: std::sync::OnceLock::new(),
        }
    }

    /// Lets the API approve and sign kubelet client CSRs from bootstrapping nodes with `pki`.
    #[must_use]
    pub fn with_signer(mut self, pki: Arc<crate::pki::Pki>) -> Self {
        self.pki = Some(pki);
        self
    }

    /// Creates what a fresh cluster has: the four namespaces (with their ServiceAccount and CA
    /// ConfigMap). Idempotent.
    pub async fn bootstrap(&self) -> Result<(), ApiError> {
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let res =
                registry::find("", "v1", "namespaces").ok_or_else(|| ApiError::internal("no namespaces"))?;
            if self
                .store
                .get(&res.key(None, ns))
                .await
                .map_err(verbs::store_err)?
                .is_none()
            {
                let body =
                    serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                let target = Target {
                    res,
                    namespace: None,
                    name: None,
                    sub: None,
                };
                match self.create(&target, body, &Query::default(), None).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Handles one request from `caller` (None = anonymous).
    pub async fn handle(&self, caller: Option<&Caller>, req: Request<Bytes>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        if req.method() == Method::GET && matches!(segs.as_slice(), ["healthz" | "livez" | "readyz", ..]) {
            return text_response(200, "ok");
        }
        if caller.is_none() {
            return error_response(&ApiError::unauthorized());
        }
        let query = Query::parse(req.uri().query());
        let result = match (req.method().clone(), segs.as_slice()) {
            (Method::GET, ["version"]) => Ok(json_response(200, &discovery::version())),
            (Method::GET, ["api"]) | (Method::GET, ["apis"]) => {
                Ok(self.discovery_root(&req, segs[0] == "api"))
            }
            (Method::GET, ["api", v]) => discovery::resource_list("", v)
                .map(|d| json_response(200, &d))
                .ok_or_else(|| ApiError::not_found_path(&path)),
            (Method::GET, ["apis", g, v]) => discovery::resource_list(g, v)
                .map(|d| json_response(200, &d))
                .ok_or_else(|| ApiError::not_found_path(&path)),
            (Method::GET, ["openapi", "v2"]) => Ok(openapi_v2_empty()),
            (Method::GET, ["openapi", "v3"]) => Ok(json_bytes_response(openapi::documents().root.clone())),
            (Method::GET, ["openapi", "v3", gv @ ..]) => openapi::documents()
                .docs
                .get(&gv.join("/"))
                .map(|(_, doc)| json_bytes_response(doc.clone()))
                .ok_or_else(|| ApiError::not_found_path(&path)),
            (_, ["api", ..]) | (_, ["apis", ..]) => match parse_target(&segs) {
                Ok(t) => {
                    // Warnings raised while handling the request become `Warning` headers.
                    let (result, warnings) = WARNINGS
                        .scope(std::cell::RefCell::new(Vec::new()), async {
                            let r = self.dispatch(req, t, query, caller).await;
                            (r, WARNINGS.with(|w| w.take()))
                        })
                        .await;
                    result.map(|mut resp| {
                        for w in warnings {
                            let text = format!("299 - {}", serde_json::Value::String(w));
                            if let Ok(v) = HeaderValue::from_str(&text) {
                                resp.headers_mut().append(header::WARNING, v);
                            }
                        }
                        resp
                    })
                }
                Err(e) => Err(e),
            },
            _ => Err(ApiError::not_found_path(&path)),
        };
        result.unwrap_or_else(|e| error_response(&e))
    }

    fn discovery_root(&self, req: &Request<Bytes>, core: bool) -> Response<Body> {
        let accept = req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if accept.contains("as=APIGroupDiscoveryList") {
            let mut resp = json_response(200, &discovery::aggregated(core));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(discovery::AGGREGATED_CT),
            );
            resp
        } else if core {
            json_response(200, &discovery::legacy_api())
        } else {
            json_response(200, &discovery::legacy_apis())
        }
    }

    async fn dispatch(
        &self,
        req: Request<Bytes>,
        t: Target,
        query: Query,
        caller: Option<&Caller>,
    ) -> Result<Response<Body>, ApiError> {
        let want = want(&req);
        let method = req.method().clone();
        let explicit_manager = query.field_manager().is_some();
        let mut query = query;
        query.default_field_manager(
            req.headers()
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok()),
        );
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = req.into_body();
        if body.len() > MAX_BODY {
            return Err(ApiError::too_large(MAX_BODY));
        }
        if t.namespace.is_some() && !t.res.namespaced {
            return Err(ApiError::not_found_path(&format!(
                "namespaced path for cluster-scoped {}",
                t.res.qualified()
            )));
        }
        match (method, t.name.is_some(), t.sub.as_deref()) {
            (Method::GET, false, None) if query.flag("watch") => self.watch(&t, &query, want).await,
            (Method::GET, false, None) => self.list(&t, &query, want).await.map(|v| json_response(200, &v)),
            (Method::GET, true, None | Some("status")) => {
                self.get(&t, want).await.map(|v| json_response(200, &v))
            }
            (Method::GET, true, Some("scale")) => self.get_scale(&t).await.map(|v| json_response(200, &v)),
            (Method::GET, true, Some("log")) if t.res.kind == "Pod" && t.res.group.is_empty() => {
                self.pod_log(&t, &query, caller).await
            }
            (Method::POST, false, None) => {
                let obj = parse_object_body(&ct, &body)?;
                let (code, v) = self.create(&t, obj, &query, caller).await?;
                Ok(json_response(code, &v))
            }
            (Method::POST, true, Some("token"))
                if t.res.plural == "serviceaccounts" && t.res.group.is_empty() =>
            {
                let body = parse_object_body(&ct, &body)?;
                self.token_request(&t, body).await.map(|v| json_response(201, &v))
            }
            (Method::POST, true, Some("eviction")) => self.evict(&t).await.map(|v| json_response(201, &v)),
            (Method::POST, true, Some("binding")) => {
                let obj = parse_object_body(&ct, &body)?;
                self.bind(&t, obj).await.map(|v| json_response(201, &v))
            }
            (Method::PUT, true, None | Some("status") | Some("finalize")) => {
                let obj = parse_object_body(&ct, &body)?;
                self.update(&t, obj, &query).await.map(|v| json_response(200, &v))
            }
            (Method::PUT | Method::PATCH, true, Some("scale")) => self
                .patch_scale(&t, &ct, &body, &query)
                .await
                .map(|v| json_response(200, &v)),
            (Method::PATCH, true, None | Some("status")) => {
                if ct.starts_with("application/apply-patch") && !explicit_manager {
                    return Err(ApiError {
                        code: 422,
                        reason: "Invalid",
                        message: "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into(),
                        details: None,
                    });
                }
                let (code, v) = self.patch(&t, &ct, &body, &query).await?;
                Ok(json_response(code, &v))
            }
            (Method::DELETE, true, None) => {
                let opts = if body.is_empty() {
                    Value::Null
                } else {
                    parse_json_body("application/json", &body)?
                };
                self.delete(&t, &opts, &query)
                    .await
                    .map(|v| json_response(200, &v))
            }
            (Method::DELETE, false, None) => {
                let opts = if body.is_empty() {
                    Value::Null
                } else {
                    parse_json_body("application/json", &body)?
                };
                self.delete_collection(&t, &opts, &query)
                    .await
                    .map(|v| json_response(200, &v))
            }
            (m, _, sub) => Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m} {}{})",
                t.res.qualified(),
                sub.map(|s| format!("/{s}")).unwrap_or_default()
            ))),
        }
    }
}

fn json_bytes_response(body: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// kubectl validates manifests against OpenAPI before create/apply; an empty protobuf document
/// is a valid (schema-less) answer, so validation is left to the server.
fn openapi_v2_empty() -> Response<Body> {
    let mut resp = Response::new(full(Bytes::new()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"),
    );
    resp
}

/// Decodes a create/update body: Kubernetes protobuf (what kubectl 1.32's typed clients send) or
/// JSON.
pub(crate) fn parse_object_body(ct: &str, body: &Bytes) -> Result<Value, ApiError> {
    if ct.split(';').next().unwrap_or_default().trim() == protobuf::MEDIA_TYPE {
        return protobuf::decode(body).map_err(|e| {
            ApiError::bad_request(format!("the request body could not be decoded as protobuf: {e}"))
        });
    }
    parse_json_body(ct, body)
}

/// Decodes a JSON (or YAML-flavoured JSON) request body into an object.
pub(crate) fn parse_json_body(ct: &str, body: &Bytes) -> Result<Value, ApiError> {
    let media = ct.split(';').next().unwrap_or_default().trim();
    match media {
        ""
        | "application/json"
        | "application/yaml"
        | "application/apply-patch+yaml"
        | "application/merge-patch+json"
        | "application/json-patch+json"
        | "application/strategic-merge-patch+json"
        | "*/*" => {}
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body could not be decoded as JSON: {e}")))
}

/// Reads a hyper body into bytes, refusing more than [`MAX_BODY`].
pub async fn collect_body<B>(body: B) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            Err(ApiError::too_large(MAX_BODY))
        }
        Err(e) => Err(ApiError::bad_request(format!("reading the request body: {e}"))),
    }
}

#[cfg(test)]
mod tests;
