//! `nodes/<name>/proxy/<path>`: a GET relayed to the node's agent (the kubelet's endpoints:
//! `/healthz`, `/configz`, `/stats/summary`, `/containerLogs/...`), authorized as `get` on
//! `nodes/proxy` by [`Api::route`]; the agent authorizes it again (SubjectAccessReview). The
//! agent's status, content type and body come back as they are, as upstream's proxy passes
//! them.

use bytes::Bytes;
use http::{Response, header};
use http_body_util::{BodyExt, Empty};

use super::Agent;
use crate::api::Api;
use crate::api::output::Body;
use crate::api::registry;
use crate::api::status::ApiError;

impl Api {
    /// `GET /api/v1/nodes/<name>/proxy/<path>?<query>`.
    pub(crate) async fn node_proxy(
        &self,
        name: &str,
        path: &[&str],
        query: Option<&str>,
    ) -> Result<Response<Body>, ApiError> {
        if path.iter().any(|s| matches!(*s, "." | "..")) {
            return Err(ApiError::bad_request(format!(
                "invalid proxy path {:?}",
                path.join("/")
            )));
        }
        let nodes =
            registry::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("nodes not served"))?;
        let (node, _) = self.read_object(nodes, None, name).await?;
        let agent = Agent::of_node(&node)?;
        let mut target = format!("/{}", path.join("/"));
        if let Some(q) = query.filter(|q| !q.is_empty()) {
            target.push('?');
            target.push_str(q);
        }
        let req = http::Request::get(agent.uri(&target))
            .body(Empty::<Bytes>::new())
            .map_err(|e| ApiError::bad_request(format!("invalid proxy path {target:?}: {e}")))?;
        let resp = self.agent_send(&agent, req).await?;
        let status = resp.status();
        let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
        let mut out = Response::new(relay(resp.into_body()));
        *out.status_mut() = status;
        if let Some(ct) = content_type {
            out.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        Ok(out)
    }
}

/// Streams an agent's answer through to the client; a client that leaves ends the agent
/// request too (a quiet `logs -f` included).
pub(super) fn relay(mut body: hyper::body::Incoming) -> Body {
    let (tx, out) = transport::body::channel(16);
    tokio::spawn(async move {
        loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                _ = tx.closed() => return,
            };
            let Some(Ok(frame)) = frame else { return };
            if let Ok(data) = frame.into_data()
                && tx.send(data).await.is_err()
            {
                return;
            }
        }
    });
    out
}
