//! `pods/<name>/log`: the agent's `/containerLogs/<namespace>/<pod>/<container>`, streamed
//! through to the client.

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use http_body_util::Empty;

use super::{agent_error, pick_container};
use crate::api::Api;
use crate::api::output::Body;
use crate::api::request::{Query, Target};
use crate::api::status::ApiError;

/// Query parameters passed on to the agent.
const LOG_PARAMS: &[&str] = &[
    "follow",
    "tailLines",
    "timestamps",
    "previous",
    "sinceSeconds",
    "limitBytes",
];

impl Api {
    /// `GET pods/<name>/log` (authorized as `get` on `pods/log` by [`Api::route`]).
    pub(crate) async fn pod_log(&self, t: &Target, q: &Query) -> Result<Response<Body>, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        let (pod, _) = self.read_object(t.res, Some(&ns), &name).await?;
        let container = pick_container(&pod, &name, q.get("container"))?;
        let agent = self.agent_of(&pod, &name).await?;
        let mut query: Vec<String> = Vec::new();
        for p in LOG_PARAMS {
            if let Some(v) = q.get(p) {
                query.push(format!("{p}={}", v.replace(['&', '#', ' '], "")));
            }
        }
        let uri = agent.uri(&format!(
            "/containerLogs/{ns}/{name}/{container}?{}",
            query.join("&")
        ));
        let req = http::Request::get(uri)
            .body(Empty::<Bytes>::new())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let resp = self.agent_send(&agent, req).await?;
        if resp.status() != http::StatusCode::OK {
            return Err(agent_error(&agent.node, resp).await);
        }
        let mut out = Response::new(super::proxy::relay(resp.into_body()));
        out.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        Ok(out)
    }
}
