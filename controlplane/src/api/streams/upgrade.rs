//! `pods/<name>/exec`, `pods/<name>/attach` and `pods/<name>/portforward`: upgrades spliced to
//! the agent's `/exec/...` and `/attach/...` (WebSocket with `v5`/`v4.channel.k8s.io`, or
//! SPDY/3.1 with `v4.channel.k8s.io` streams) and `/portForward/...` (SPDY/3.1, raw or
//! tunnelled in a WebSocket). The agent speaks the protocols; the API server authorizes, finds
//! the agent, forwards the handshake and then copies bytes both ways.

use bytes::Bytes;
use http::{HeaderName, Method, Response, header};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use super::{agent_error, pick_container};
use crate::api::Api;
use crate::api::output::{Body, error_response, full};
use crate::api::request::{Caller, Query, parse_target};
use crate::api::status::ApiError;

/// The header SPDY clients name their stream protocols in.
const STREAM_PROTOCOL: HeaderName = HeaderName::from_static("x-stream-protocol-version");

impl Api {
    /// `pods/<name>/exec`, `attach` or `portforward` upgraded to a WebSocket or to SPDY/3.1:
    /// the connection is spliced to the node agent, which speaks the protocol.
    pub async fn upgrade(
        &self,
        caller: Option<&Caller>,
        mut req: hyper::Request<hyper::body::Incoming>,
    ) -> Response<Body> {
        match self.splice(caller, &mut req).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        }
    }

    async fn splice(
        &self,
        caller: Option<&Caller>,
        req: &mut hyper::Request<hyper::body::Incoming>,
    ) -> Result<Response<Body>, ApiError> {
        let Some(real) = caller else {
            return Err(ApiError::unauthorized());
        };
        // `kubectl exec --as=...`: the upgrade acts as the impersonated user, as other requests.
        let impersonated = crate::api::authz::reviews::impersonate(&self.authz, real, req.headers())?;
        let caller = Some(impersonated.as_ref().unwrap_or(real));
        let path = req.uri().path().to_string();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let t = parse_target(&segs)?;
        let is_pod = t.res.kind == "Pod" && t.res.group.is_empty();
        let sub = t
            .sub
            .as_deref()
            .filter(|s| is_pod && matches!(*s, "exec" | "attach" | "portforward"));
        let (Some(sub), Some(name)) = (sub, t.name.clone()) else {
            return Err(ApiError::bad_request(format!(
                "{path} cannot be upgraded (only pods/<name>/exec, attach and portforward)"
            )));
        };
        let q = Query::parse(req.uri().query());
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        self.may_connect(caller, sub, &name, &ns)?;
        let (pod, _) = self.read_object(t.res, Some(&ns), &name).await?;
        let websocket = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        // The container and the node are checked before the agent is asked: kubectl retries a
        // refused WebSocket over SPDY and shows the second answer.
        let container = match sub {
            "portforward" => None,
            _ => Some(pick_container(&pod, &name, q.get("container"))?),
        };
        let agent = self.agent_of(&pod, &name).await?;
        let agent_path = if let Some(container) = container {
            format!(
                "/{sub}/{ns}/{name}/{container}?{}",
                req.uri().query().unwrap_or_default()
            )
        } else {
            format!("/portForward/{ns}/{name}")
        };
        // Upstream's agents take a WebSocket upgrade on GET and SPDY on POST.
        let method = if websocket { Method::GET } else { Method::POST };
        let mut up = http::Request::builder()
            .method(method)
            .uri(agent.uri(&agent_path))
            .header(header::CONNECTION, "Upgrade");
        for h in [
            header::UPGRADE,
            header::SEC_WEBSOCKET_KEY,
            header::SEC_WEBSOCKET_VERSION,
            header::SEC_WEBSOCKET_PROTOCOL,
            STREAM_PROTOCOL,
        ] {
            for v in req.headers().get_all(&h) {
                up = up.header(&h, v.clone());
            }
        }
        let up = up
            .body(Empty::<Bytes>::new())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let mut agent_resp = self.agent_send(&agent, up).await?;
        if agent_resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            return Err(agent_error(&agent.node, agent_resp).await);
        }
        let mut out = Response::new(full(Bytes::new()));
        *out.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
        for h in [
            header::UPGRADE,
            header::CONNECTION,
            header::SEC_WEBSOCKET_ACCEPT,
            header::SEC_WEBSOCKET_PROTOCOL,
            STREAM_PROTOCOL,
        ] {
            if let Some(v) = agent_resp.headers().get(&h) {
                out.headers_mut().insert(h, v.clone());
            }
        }
        let client_side = hyper::upgrade::on(req);
        let agent_side = hyper::upgrade::on(&mut agent_resp);
        tokio::spawn(async move {
            let (Ok(c), Ok(a)) = (client_side.await, agent_side.await) else {
                tracing::debug!("upgrade did not complete");
                return;
            };
            let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
            let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
        });
        Ok(out)
    }
}
