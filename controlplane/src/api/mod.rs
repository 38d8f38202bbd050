//! The Kubernetes API: routing, verbs (get, list, watch, create, update, patch, delete), object
//! semantics (uid, timestamps, generation, resourceVersion = store revision), discovery, tables,
//! and `Status` errors. Transport-free: [`Api::handle`] takes a request with its whole body and
//! the authenticated caller, so tests drive it without sockets.
//!
//! Layers, each importing only from the ones below it:
//! - this module: [`Api`], [`Api::handle`] (one tracing span per request) and the dispatch to
//!   the verbs;
//! - `verbs/` (get, list, create, update, patch, server-side apply, delete, eviction, tokens,
//!   watch) and `streams/` (logs and exec through the node agents): the `impl Api` blocks, which
//!   take only [`Api`] itself from this module;
//! - `admission/` (defaults, validation, CSR signing), `request/` (target, query, bodies),
//!   `protobuf/` (the Kubernetes protobuf codec: bodies in, answers out), `output/` (responses in
//!   the asked format, warnings, tables, discovery, OpenAPI);
//! - `object/` (names, selectors, the stored form), `schema/` (the type table), `registry`
//!   (served resources) and `status` (`ApiError`).

mod admission;
pub(crate) mod authz;
pub mod metrics;
pub mod object;
pub mod output;
pub mod protobuf;
pub mod registry;
pub mod request;
pub mod schema;
pub mod status;
mod streams;
pub use streams::KUBELET_ENDPOINT_ANNOTATION;
mod verbs;

pub use verbs::bootstrap_tokens::{new_token, token_secret};
pub use verbs::clusterip::ServiceRange;
mod versions;

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use tracing::Instrument;
use tracing::field::{Empty, display};

pub use authz::decisions_per_second as authorizer_decisions_per_second;
pub use output::{Body, Format, error_response, error_response_as, full};
pub use request::Caller;
pub use request::body::{MAX_BODY, collect_body};

use crate::storage::Store;
use object::stored::store_err;
use output::{
    discovery, json_bytes_response, json_response, object_response, openapi, text_response, warnings,
};
use request::body::{parse_delete_options, parse_object_body};
use request::{Query, Target, Want, parse_target};
use status::ApiError;

/// The API layer over a store.
#[derive(Clone)]
pub struct Api {
    pub(crate) store: Arc<dyn Store>,
    /// PEM of the cluster CA, published as `kube-root-ca.crt` in every namespace.
    pub(crate) ca_pem: String,
    /// Events decoded once for all watchers.
    pub(crate) watch_cache: Arc<verbs::watch::WatchCache>,
    /// Unread watch bytes of all clients together.
    pub(crate) watch_budget: Arc<transport::body::SharedBudget>,
    /// Signs node client CSRs (None: CSRs stay pending).
    pub(crate) pki: Option<Arc<crate::pki::Pki>>,
    /// TLS client for node agents (built on first use from `pki`; a failure is kept too).
    pub(crate) agent_client: OnceLock<Result<streams::AgentClient, Arc<streams::AgentTlsError>>>,
    /// The authorizer chain and its RBAC index (fed by every write through `store`).
    pub(crate) authz: Arc<authz::Authz>,
    /// The resource metrics scraper and its samples (`metrics.k8s.io`).
    pub(crate) metrics: Arc<metrics::MetricsState>,
    /// Static bearer tokens (the admin token), set once by the server.
    pub(crate) static_tokens: Arc<OnceLock<std::collections::HashMap<String, Caller>>>,
    /// `--service-cluster-ip-range`.
    pub(crate) service_range: verbs::clusterip::ServiceRange,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").finish_non_exhaustive()
    }
}

impl Api {
    /// An API over `store`, publishing `ca_pem` as `kube-root-ca.crt`.
    pub fn new(store: Arc<dyn Store>, ca_pem: String) -> Self {
        let authz = Arc::new(authz::Authz::default());
        let store = Arc::new(authz::ObservedStore {
            inner: store,
            authz: authz.clone(),
        });
        Self {
            store,
            authz,
            ca_pem,
            watch_cache: Arc::default(),
            watch_budget: transport::body::SharedBudget::new(verbs::watch::ALL_WATCHES_BUFFER_BYTES),
            pki: None,
            agent_client: OnceLock::new(),
            metrics: Arc::default(),
            static_tokens: Arc::default(),
            service_range: verbs::clusterip::ServiceRange::default(),
        }
    }

    /// Hands out Service ClusterIPs from `range` (default `10.96.0.0/12`).
    #[must_use]
    pub fn with_service_range(mut self, range: ServiceRange) -> Self {
        self.service_range = range;
        self
    }

    /// Lets the API approve and sign kubelet client CSRs from bootstrapping nodes with `pki`.
    #[must_use]
    pub fn with_signer(mut self, pki: Arc<crate::pki::Pki>) -> Self {
        self.pki = Some(pki);
        self
    }

    /// Creates what a fresh cluster has: the built-in PriorityClasses and the four namespaces (with their ServiceAccount and CA
    /// ConfigMap). Idempotent.
    pub async fn bootstrap(&self) -> Result<(), ApiError> {
        let namespace =
            |ns: &str| serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        let mut objects: Vec<(&str, &str, &str, serde_json::Value)> =
            ["default", "kube-system", "kube-public", "kube-node-lease"]
                .into_iter()
                .map(|ns| ("", "namespaces", ns, namespace(ns)))
                .collect();
        // The built-in PriorityClasses (upstream's API server creates them at start).
        for (name, value, description) in [
            (
                "system-node-critical",
                2_000_001_000,
                "Used for system critical pods that must not be moved from their current node.",
            ),
            (
                "system-cluster-critical",
                2_000_000_000,
                "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
            ),
        ] {
            objects.push((
                "scheduling.k8s.io",
                "priorityclasses",
                name,
                serde_json::json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": name}, "value": value, "description": description,
                    "preemptionPolicy": "PreemptLowerPriority", "globalDefault": false}),
            ));
        }
        for (group, plural, name, body) in objects {
            let res = registry::find(group, "v1", plural)
                .ok_or_else(|| ApiError::internal(format!("{plural} not served")))?;
            if self
                .store
                .get(&res.key(None, name))
                .await
                .map_err(store_err)?
                .is_some()
            {
                continue;
            }
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
            if group.is_empty() && plural == "namespaces" {
                self.populate_namespace(name).await?;
            }
        }
        Ok(())
    }

    /// Handles one request from `caller` (None = anonymous).
    ///
    /// Each request runs in a `request` span (debug level) with its verb, resource (or path, for
    /// discovery and the like), namespace, name, user, status code and latency, so
    /// `RUST_LOG=controlplane=debug` shows one request's path end to end. With the span disabled
    /// nothing is formatted or timed.
    pub async fn handle(&self, caller: Option<&Caller>, req: Request<Bytes>) -> Response<Body> {
        let span = tracing::debug_span!(
            "request",
            verb = Empty,
            resource = Empty,
            path = Empty,
            namespace = Empty,
            name = Empty,
            user = Empty,
            code = Empty,
            latency = Empty,
        );
        let started = (!span.is_disabled()).then(Instant::now);
        let path = req.uri().path().to_string();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let resp = match versions::older_of(&segs) {
            Some(older) => {
                self.route_older(caller, req, older, &span)
                    .instrument(span.clone())
                    .await
            }
            None => self.route(caller, req, &span).instrument(span.clone()).await,
        };
        if let Some(started) = started {
            span.record("code", resp.status().as_u16());
            span.record("latency", tracing::field::debug(started.elapsed()));
            span.in_scope(|| tracing::debug!("request done"));
        }
        resp
    }

    /// Routes a request: health checks, discovery, OpenAPI, or a resource through [`Self::dispatch`].
    async fn route(
        &self,
        caller: Option<&Caller>,
        req: Request<Bytes>,
        span: &tracing::Span,
    ) -> Response<Body> {
        let path = req.uri().path().to_string();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let format = Format::from_accept(
            req.headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        );
        let query = Query::parse(req.uri().query());
        // Resource paths are parsed before authentication only to name them on the span.
        let target = match segs.as_slice() {
            ["api", _, _, ..] | ["apis", _, _, _, ..] => Some(parse_target(&segs)),
            _ => None,
        };
        if !span.is_disabled() {
            match &target {
                Some(Ok(t)) => record_target(span, req.method(), t, &query),
                _ => {
                    span.record("verb", display(method_verb(req.method())));
                    span.record("path", display(&path));
                }
            }
            if let Some(c) = caller {
                span.record("user", display(&c.user));
            }
        }
        if req.method() == Method::GET && matches!(segs.as_slice(), ["healthz" | "livez" | "readyz", ..]) {
            // A store that takes no writes makes the server unready (and unhealthy), not dead.
            if segs[0] != "livez"
                && let Some(reason) = self.store.failure()
            {
                let mut resp = text_response(500, "");
                *resp.body_mut() = full(format!("[-]etcd failed: {reason}\n{} check failed", segs[0]));
                return resp;
            }
            return text_response(200, "ok");
        }
        let Some(caller) = caller else {
            return error_response_as(&ApiError::unauthorized(), format);
        };
        let impersonated = match authz::reviews::impersonate(&self.authz, caller, req.headers()) {
            Ok(c) => c,
            Err(e) => return error_response_as(&e, format),
        };
        let caller = impersonated.as_ref().unwrap_or(caller);
        let info = authz::RequestInfo::of(req.method(), &path, &query);
        let selector = query.get("fieldSelector").unwrap_or_default();
        if let Err(e) = self.authz.authorize(caller, &info.attributes(), selector) {
            tracing::debug!(user = %caller.user, reason = %e.message, "forbidden");
            return error_response_as(&e, format);
        }
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
            (Method::GET, ["openapi", "v2"]) => Ok(openapi::v2_empty()),
            (Method::GET, ["openapi", "v3"]) => Ok(json_bytes_response(openapi::documents().root.clone())),
            (Method::GET, ["openapi", "v3", gv @ ..]) => openapi::documents()
                .docs
                .get(&gv.join("/"))
                .map(|(_, doc)| json_bytes_response(doc.clone()))
                .ok_or_else(|| ApiError::not_found_path(&path)),
            (Method::POST, s) if authz::reviews::review_of(s).is_some() => {
                let (plural, ns) = authz::reviews::review_of(s).unwrap_or_default();
                let ct = req
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                let authentication = matches!(plural, "selfsubjectreviews" | "tokenreviews");
                let body = if ct.starts_with(protobuf::MEDIA_TYPE) && !authentication {
                    authz::reviews::decode_protobuf_review(plural, req.body())
                } else {
                    parse_object_body(ct, req.body())
                };
                let answered = match body {
                    Ok(body) if plural == "tokenreviews" => self.token_review(body).await,
                    Ok(body) => authz::reviews::answer(&self.authz, caller, plural, ns, body),
                    Err(e) => Err(e),
                };
                answered.map(|v| json_response(201, &v))
            }
            (Method::GET, ["api", "v1", "nodes", name, "proxy", rest @ ..]) => {
                self.node_proxy(name, rest, req.uri().query()).await
            }
            (_, ["api", ..]) | (_, ["apis", ..]) => match target.unwrap_or_else(|| parse_target(&segs)) {
                Ok(t) => {
                    // Warnings raised while handling the request become `Warning` headers.
                    let (result, raised) = authz::CALLER
                        .scope(
                            caller.clone(),
                            warnings::collect(self.dispatch(req, t, query, Some(caller), format)),
                        )
                        .await;
                    result.map(|mut resp| {
                        warnings::attach(&mut resp, raised);
                        resp
                    })
                }
                Err(e) => Err(e),
            },
            _ => Err(ApiError::not_found_path(&path)),
        };
        result.unwrap_or_else(|e| error_response_as(&e, format))
    }

    /// Routes a request to an older version of a resource through its preferred version
    /// ([`versions`]). A patch is read, patched in the older form and written as an update, so
    /// it needs the `get` and `update` permissions rather than `patch`.
    async fn route_older(
        &self,
        caller: Option<&Caller>,
        req: Request<Bytes>,
        older: &'static versions::Older,
        span: &tracing::Span,
    ) -> Response<Body> {
        let format = Format::from_accept(
            req.headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        );
        let watching = Query::parse(req.uri().query()).flag("watch")
            || req.uri().path().split('/').any(|s| s == "watch");
        let plan = match versions::rewrite(older, req) {
            Err(e) => return error_response_as(&e, format),
            Ok(versions::Rewritten::Request(req)) => {
                let resp = self.route(caller, *req, span).await;
                return versions::response_down(older, resp, format, watching).await;
            }
            Ok(versions::Rewritten::Patch(plan)) => *plan,
        };
        let current = self.route(caller, plan.get, span).await;
        if !current.status().is_success() {
            return versions::response_down(older, current, format, false).await;
        }
        let current = match collect_body(current.into_body())
            .await
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| ApiError::internal(e.to_string())))
        {
            Ok(v) => v,
            Err(e) => return error_response_as(&e, format),
        };
        let put = versions::patched_update(
            older,
            current,
            &plan.content_type,
            &plan.patch,
            plan.parts,
            &plan.put_path,
        );
        match put {
            Ok(put) => {
                let resp = self.route(caller, put, span).await;
                versions::response_down(older, resp, format, false).await
            }
            Err(e) => error_response_as(&e, format),
        }
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
        format: Format,
    ) -> Result<Response<Body>, ApiError> {
        let want = Want::of(&req);
        let answer = |code: u16, v: &serde_json::Value| object_response(code, v, format);
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
        if t.res.is_create_only() {
            // Reviews are answered on POST before routing gets here; nothing else is served.
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {})",
                t.res.qualified()
            )));
        }
        if t.res.is_read_only() {
            return match (&method, t.sub.as_deref()) {
                (&Method::GET, None) if !query.flag("watch") && t.res.group == metrics::GROUP => {
                    self.metrics(&t, &query, want).await.map(|v| answer(200, &v))
                }
                (&Method::GET, None) if !query.flag("watch") => {
                    self.component_statuses(&t, want).await.map(|v| answer(200, &v))
                }
                _ => Err(ApiError::method_not_allowed(format!(
                    "the server does not allow this method on the requested resource ({method} {})",
                    t.res.qualified()
                ))),
            };
        }
        match (method, t.name.is_some(), t.sub.as_deref()) {
            (Method::GET, false, None) if query.flag("watch") => self.watch(&t, &query, want, format).await,
            (Method::GET, false, None) => self.list(&t, &query, want, format).await,
            (Method::GET, true, None | Some("status")) => self.get(&t, want).await.map(|v| answer(200, &v)),
            (Method::GET, true, Some(EPHEMERAL)) if is_pods(&t) => {
                self.get(&t, want).await.map(|v| answer(200, &v))
            }
            (Method::GET, true, Some("scale")) => self.get_scale(&t).await.map(|v| answer(200, &v)),
            (Method::GET, true, Some("log")) if t.res.kind == "Pod" && t.res.group.is_empty() => {
                self.pod_log(&t, &query).await
            }
            (Method::POST, false, None) => {
                let obj = parse_object_body(&ct, &body)?;
                let (code, v) = self.create(&t, obj, &query, caller).await?;
                Ok(answer(code, &v))
            }
            (Method::POST, true, Some("token"))
                if t.res.plural == "serviceaccounts" && t.res.group.is_empty() =>
            {
                let body = parse_object_body(&ct, &body)?;
                self.token_request(&t, body).await.map(|v| answer(201, &v))
            }
            (Method::POST, true, Some("eviction")) => {
                // The body (an Eviction with DeleteOptions) must decode; its options are not used.
                if !body.is_empty() {
                    parse_delete_options(&ct, &body)?;
                }
                self.evict(&t).await.map(|v| answer(201, &v))
            }
            (Method::POST, true, Some("binding")) => {
                let obj = parse_object_body(&ct, &body)?;
                self.bind(&t, obj).await.map(|v| answer(201, &v))
            }
            (Method::PUT, true, Some(EPHEMERAL)) if is_pods(&t) => {
                let obj = parse_object_body(&ct, &body)?;
                self.update(&t, obj, &query).await.map(|v| answer(200, &v))
            }
            (Method::PUT, true, None | Some("status") | Some("finalize")) => {
                let obj = parse_object_body(&ct, &body)?;
                self.update(&t, obj, &query).await.map(|v| answer(200, &v))
            }
            (Method::PUT, true, Some("approval")) if t.res.plural == "certificatesigningrequests" => {
                let obj = parse_object_body(&ct, &body)?;
                self.approve_csr(&t, obj, &query, caller)
                    .await
                    .map(|v| answer(200, &v))
            }
            (Method::PUT | Method::PATCH, true, Some("scale")) => self
                .patch_scale(&t, &ct, &body, &query)
                .await
                .map(|v| answer(200, &v)),
            (Method::PATCH, true, Some(EPHEMERAL)) if is_pods(&t) => {
                let (code, v) = self.patch(&t, &ct, &body, &query).await?;
                Ok(answer(code, &v))
            }
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
                Ok(answer(code, &v))
            }
            (Method::DELETE, true, None) => {
                let opts = parse_delete_options(&ct, &body)?;
                self.delete(&t, &opts, &query).await.map(|v| answer(200, &v))
            }
            (Method::DELETE, false, None) => {
                let opts = parse_delete_options(&ct, &body)?;
                self.delete_collection(&t, &opts, &query)
                    .await
                    .map(|v| answer(200, &v))
            }
            (m, _, sub) => Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m} {}{})",
                t.res.qualified(),
                sub.map(|s| format!("/{s}")).unwrap_or_default()
            ))),
        }
    }
}

/// `pods/ephemeralcontainers`: the pod, of which only `spec.ephemeralContainers` is written.
const EPHEMERAL: &str = "ephemeralcontainers";

fn is_pods(t: &Target) -> bool {
    t.res.group.is_empty() && t.res.plural == "pods"
}

/// The Kubernetes verb of a request without a resource target (discovery, OpenAPI, health).
fn method_verb(m: &Method) -> &'static str {
    match *m {
        Method::GET => "get",
        Method::HEAD => "head",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        _ => "other",
    }
}

/// Records a resource request's verb (as in Kubernetes audit logs), resource, namespace and name
/// on the request span.
fn record_target(span: &tracing::Span, m: &Method, t: &Target, q: &Query) {
    let collection = t.name.is_none();
    let verb = match *m {
        Method::GET if collection && q.flag("watch") => "watch",
        Method::GET if collection => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => method_verb(m),
    };
    span.record("verb", display(verb));
    span.record("resource", display(ResourceName(t)));
    if let Some(ns) = &t.namespace {
        span.record("namespace", display(ns));
    }
    if let Some(name) = &t.name {
        span.record("name", display(name));
    }
}

/// A target's resource the way kubectl names it: `pods`, `deployments.apps`, `pods/log`,
/// `deployments.apps/scale` (formatted only when a subscriber records it).
struct ResourceName<'a>(&'a Target);

impl std::fmt::Display for ResourceName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let res = self.0.res;
        f.write_str(res.plural)?;
        if !res.group.is_empty() {
            write!(f, ".{}", res.group)?;
        }
        if let Some(sub) = &self.0.sub {
            write!(f, "/{sub}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
