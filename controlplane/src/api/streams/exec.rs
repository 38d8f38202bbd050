//! `pods/<name>/exec`: a WebSocket upgrade spliced to the agent's `/exec/...`.

use bytes::Bytes;
use http::{Response, header};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use super::{agent_error, pick_container};
use crate::api::Api;
use crate::api::output::{Body, error_response, full};
use crate::api::request::{Caller, Query, parse_target};
use crate::api::status::ApiError;

impl Api {
    /// `pods/<name>/exec` upgraded to a WebSocket (`v5.channel.k8s.io`): the connection is spliced
    /// to the node agent's `/exec/...` endpoint, which runs the command and speaks the channel
    /// protocol. SPDY upgrades (kubectl's fallback) are refused with the reason.
    pub async fn upgrade(
        &self,
        caller: Option<&Caller>,
        mut req: hyper::Request<hyper::body::Incoming>,
    ) -> Response<Body> {
        match self.splice_exec(caller, &mut req).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        }
    }

    async fn splice_exec(
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
        if !is_pod || t.sub.as_deref() != Some("exec") || t.name.is_none() {
            return Err(ApiError::bad_request(format!(
                "{path} cannot be upgraded (only pods/<name>/exec)"
            )));
        }
        let q = Query::parse(req.uri().query());
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        self.may_exec(caller, &name, &ns)?;
        let (pod, _) = self.read_object(t.res, Some(&ns), &name).await?;
        let container = pick_container(&pod, &name, q.get("container"))?.to_string();
        let agent = self.agent_of(&pod, &name).await?;
        let websocket = req
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if !websocket {
            return Err(ApiError::bad_request(
                "exec over SPDY/3.1 is not supported; use a kubectl that speaks WebSocket (v1.30 or later)",
            ));
        }
        let agent_uri = agent.uri(&format!(
            "/exec/{ns}/{name}/{container}?{}",
            req.uri().query().unwrap_or_default()
        ));
        let mut up = http::Request::get(agent_uri)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket");
        for h in [
            header::SEC_WEBSOCKET_KEY,
            header::SEC_WEBSOCKET_VERSION,
            header::SEC_WEBSOCKET_PROTOCOL,
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
        ] {
            if let Some(v) = agent_resp.headers().get(&h) {
                out.headers_mut().insert(h, v.clone());
            }
        }
        let client_side = hyper::upgrade::on(req);
        let agent_side = hyper::upgrade::on(&mut agent_resp);
        tokio::spawn(async move {
            let (Ok(c), Ok(a)) = (client_side.await, agent_side.await) else {
                tracing::debug!("exec upgrade did not complete");
                return;
            };
            let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
            let _ = tokio::io::copy_bidirectional(&mut c, &mut a).await;
        });
        Ok(out)
    }
}
