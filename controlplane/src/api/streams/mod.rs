//! The subresources served by the node agent: `pods/<name>/log` (the agent's
//! `/containerLogs/<namespace>/<pod>/<container>`, streamed through), `pods/<name>/exec` and
//! `pods/<name>/portforward` (upgrades spliced to the agent's `/exec/...` and
//! `/portForward/...`) and `nodes/<name>/proxy/<path>` (a GET relayed to the agent).
//!
//! The agent is reached at the address its Node reports (written only by that node's identity or
//! an administrator, NodeRestriction): the `nodeos.dev/kubelet-endpoint` annotation (`IP:PORT`,
//! for nodes behind NAT such as QEMU guests with a host forward), else its InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.Port`. The connection is made to
//! `https://<node name>:<port>` with that address behind the name, so the agent must present a
//! certificate from the cluster CA for the node's name: one issued through a
//! `kubernetes.io/kubelet-serving` CSR, which is approved only for a node's own name and
//! addresses ([`crate::api::admission`]). A forged address reaches no agent. The API server
//! authenticates with its kubelet-client certificate (user `kube-apiserver-kubelet-client`,
//! which holds `system:kubelet-api-admin` only); the agent authorizes each request through a
//! SubjectAccessReview.

mod logs;
mod proxy;
mod tls;
mod upgrade;

pub(crate) use tls::AgentTlsError;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use serde_json::Value;
use transport::client::ClientError;

use crate::api::Api;
use crate::api::registry;
use crate::api::request::Caller;
use crate::api::status::ApiError;

/// The Node annotation with the agent's `IP:PORT` (set by agents behind NAT).
pub const KUBELET_ENDPOINT_ANNOTATION: &str = "nodeos.dev/kubelet-endpoint";

/// Longest wait for an agent's response head.
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest error body read from an agent.
const AGENT_ERROR_LIMIT: usize = 64 << 10;

pub(crate) use tls::AgentClient;

/// A node's agent: the name its serving certificate must carry and where it listens.
#[derive(Debug, Clone)]
struct Agent {
    node: String,
    addr: SocketAddr,
}

impl Agent {
    /// The agent of the Node object `node`.
    fn of_node(node: &Value) -> Result<Self, ApiError> {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let addr = agent_address(node).ok_or_else(|| {
            ApiError::bad_request(format!("node {name} has no address to reach its agent at"))
        })?;
        Ok(Self {
            node: name.to_string(),
            addr,
        })
    }

    /// The URI of `path_and_query` on this agent (the host is the node's name; see the module
    /// doc).
    fn uri(&self, path_and_query: &str) -> String {
        format!("https://{}:{}{path_and_query}", self.node, self.addr.port())
    }
}

impl Api {
    /// The node a pod runs on and where its agent listens.
    async fn agent_of(&self, pod: &Value, name: &str) -> Result<Agent, ApiError> {
        let node = pod["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?;
        let nodes =
            registry::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("nodes not served"))?;
        let (node_obj, _) = self.read_object(nodes, None, node).await?;
        Agent::of_node(&node_obj)
    }

    /// Sends `req` to `agent`; an unreachable or unverifiable agent is a 500 naming both.
    async fn agent_send(
        &self,
        agent: &Agent,
        req: http::Request<Empty<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, ApiError> {
        let client = self.agent_client()?;
        client.names.set(&agent.node, agent.addr.ip());
        transport::client::send(&client.client, req, AGENT_TIMEOUT)
            .await
            .map_err(|e| unreachable(agent, &e))
    }

    /// GETs `path` from the agent of the Node object `node` (the Summary API for
    /// [`crate::api::metrics`]): the whole answer, at most `limit` bytes; an agent's error answer
    /// is an [`ApiError`] as for logs.
    pub(crate) async fn agent_get(&self, node: &Value, path: &str, limit: usize) -> Result<Bytes, ApiError> {
        let agent = Agent::of_node(node)?;
        let req = http::Request::get(agent.uri(path))
            .body(Empty::<Bytes>::new())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let resp = self.agent_send(&agent, req).await?;
        if resp.status() != http::StatusCode::OK {
            return Err(agent_error(&agent.node, resp).await);
        }
        transport::client::read_body(resp.into_body(), limit)
            .await
            .map_err(|e| ApiError::internal(format!("agent of node {}: {e}", agent.node)))
    }

    /// The client for agents (built on first use).
    fn agent_client(&self) -> Result<AgentClient, ApiError> {
        // Built once; a clone shares the connection pool and the name table.
        self.agent_client
            .get_or_init(|| AgentClient::new(self.pki.as_deref()).map_err(std::sync::Arc::new))
            .as_ref()
            .cloned()
            .map_err(|e| ApiError::internal(e.to_string()))
    }
}

impl Api {
    /// Upgrades (`exec`, `portforward`) do not pass [`Api::route`]; they are authorized here as
    /// upstream authorizes them, WebSocket or SPDY: `create` on `pods/<subresource>`. (The agent
    /// only checks that the API server may proxy to nodes, so this is what keeps a caller out of
    /// workloads it may not reach.)
    pub(crate) fn may_connect(
        &self,
        caller: Option<&Caller>,
        subresource: &str,
        name: &str,
        ns: &str,
    ) -> Result<(), ApiError> {
        let Some(c) = caller else {
            return Err(ApiError::unauthorized());
        };
        let a = crate::api::authz::Attributes {
            verb: "create",
            resource: "pods",
            subresource,
            name,
            namespace: ns,
            resource_request: true,
            ..Default::default()
        };
        self.authz.authorize(c, &a, "")
    }
}

/// The container to read: named, or the pod's only one.
fn pick_container<'a>(pod: &'a Value, name: &str, wanted: Option<&'a str>) -> Result<&'a str, ApiError> {
    let names = |list: &str| -> Vec<&'a str> {
        pod["spec"][list]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
            .unwrap_or_default()
    };
    let (containers, inits, ephemeral) = (
        names("containers"),
        names("initContainers"),
        names("ephemeralContainers"),
    );
    match wanted.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) || inits.contains(&c) || ephemeral.contains(&c) => Ok(c),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0]),
        None => {
            let mut msg = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !inits.is_empty() {
                msg.push_str(&format!(" or one of the init containers: [{}]", inits.join(" ")));
            }
            if !ephemeral.is_empty() {
                msg.push_str(&format!(
                    " or one of the ephemeral containers: [{}]",
                    ephemeral.join(" ")
                ));
            }
            Err(ApiError::bad_request(msg))
        }
    }
}

/// Where a node's agent listens.
fn agent_address(node: &Value) -> Option<SocketAddr> {
    if let Some(a) = node["metadata"]["annotations"][KUBELET_ENDPOINT_ANNOTATION].as_str() {
        return a.parse().ok();
    }
    let ip: IpAddr = node["status"]["addresses"]
        .as_array()?
        .iter()
        .find(|a| a["type"] == "InternalIP")?["address"]
        .as_str()?
        .parse()
        .ok()?;
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap_or(10250);
    Some(SocketAddr::new(ip, u16::try_from(port).ok()?))
}

/// An agent that cannot be reached or verified: a 500 naming the node, the address and the
/// whole cause (a certificate that is not the node's says so).
fn unreachable(agent: &Agent, e: &ClientError) -> ApiError {
    ApiError::internal(format!(
        "cannot reach the agent of node {} at {}: {}",
        agent.node,
        agent.addr,
        e.with_causes()
    ))
}

/// An agent's error answer as an API error (its text body, at most 64 KiB, is the message).
async fn agent_error(node: &str, resp: http::Response<hyper::body::Incoming>) -> ApiError {
    let status = resp.status().as_u16();
    let body = transport::client::read_body(resp.into_body(), AGENT_ERROR_LIMIT)
        .await
        .unwrap_or_default();
    let msg = String::from_utf8_lossy(&body).trim().to_string();
    match status {
        404 => ApiError {
            code: 404,
            reason: "NotFound",
            message: msg,
            details: None,
        },
        400 => ApiError::bad_request(msg),
        _ => ApiError::internal(format!("agent of node {node}: HTTP {status}: {msg}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn container_choice_and_messages() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "init"}]}});
        assert_eq!(pick_container(&pod, "p", Some("b")).ok(), Some("b"));
        assert_eq!(pick_container(&pod, "p", Some("init")).ok(), Some("init"));
        assert_eq!(
            pick_container(&pod, "p", Some("x")).map_err(|e| e.message),
            Err("container x is not valid for pod p".into())
        );
        assert_eq!(
            pick_container(&pod, "p", None).map_err(|e| e.message),
            Err("a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [init]".into())
        );
        let one = json!({"spec": {"containers": [{"name": "only"}]}});
        assert_eq!(pick_container(&one, "p", None).ok(), Some("only"));
        let debugged = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}],
            "ephemeralContainers": [{"name": "dbg"}]}});
        assert_eq!(pick_container(&debugged, "p", Some("dbg")).ok(), Some("dbg"));
        assert_eq!(
            pick_container(&debugged, "p", None).map_err(|e| e.message),
            Err("a container name must be specified for pod p, choose one of: [a b] or one of the ephemeral containers: [dbg]".into())
        );
    }

    #[test]
    fn agent_address_from_annotation_or_node_ip() {
        let natted = json!({"metadata": {"annotations": {KUBELET_ENDPOINT_ANNOTATION: "127.0.0.1:40123"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.2.15"}]}});
        assert_eq!(
            agent_address(&natted),
            Some("127.0.0.1:40123".parse().expect("addr"))
        );
        let plain = json!({"status": {"addresses": [{"type": "Hostname", "address": "n"}, {"type": "InternalIP", "address": "10.0.0.5"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}});
        assert_eq!(
            agent_address(&plain),
            Some("10.0.0.5:10250".parse().expect("addr"))
        );
        assert_eq!(agent_address(&json!({"status": {}})), None);
    }
}
