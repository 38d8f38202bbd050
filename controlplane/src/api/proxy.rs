//! The pod subresources served by the node agent: `pods/<name>/log` (the agent's
//! `/containerLogs/<namespace>/<pod>/<container>`, streamed through) and `pods/<name>/exec`
//! (a WebSocket upgrade spliced to the agent's `/exec/...`).
//!
//! The agent is reached at the Node's `nodeos.dev/kubelet-endpoint` annotation (`IP:PORT`, for
//! nodes behind NAT such as QEMU guests with a host forward), else its InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.Port`. The API server authenticates with a client
//! certificate from the cluster CA (`system:masters`); like an API server without
//! `--kubelet-certificate-authority`, it does not verify the agent's self-signed serving
//! certificate.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde_json::Value;
use tokio::sync::mpsc;

use super::status::ApiError;
use super::{Api, Body, Caller, ChannelBody, Query, Target};

/// The Node annotation with the agent's `IP:PORT` (set by agents behind NAT).
pub const KUBELET_ENDPOINT_ANNOTATION: &str = "nodeos.dev/kubelet-endpoint";

/// Query parameters passed on to the agent.
const LOG_PARAMS: &[&str] = &[
    "follow",
    "tailLines",
    "timestamps",
    "previous",
    "sinceSeconds",
    "limitBytes",
];

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Api {
    pub(crate) async fn pod_log(
        &self,
        t: &Target,
        q: &Query,
        caller: Option<&Caller>,
    ) -> Result<Response<Body>, ApiError> {
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        may_reach_agents(caller, "pods/log", &name, &ns)?;
        let (pod, _) = self.read_object(t.res, Some(&ns), &name).await?;
        let container = pick_container(&pod, &name, q.get("container"))?;
        let (node, addr) = self.agent_of(&pod, &name).await?;
        let mut query: Vec<String> = Vec::new();
        for p in LOG_PARAMS {
            if let Some(v) = q.get(p) {
                query.push(format!("{p}={}", v.replace(['&', '#', ' '], "")));
            }
        }
        let path = format!("/containerLogs/{ns}/{name}/{container}?{}", query.join("&"));
        let tls = self.agent_tls()?;
        let unreachable =
            |e: String| ApiError::internal(format!("cannot reach the agent of node {node} at {addr}: {e}"));
        let mut send = agent_connect(addr, tls, false).await.map_err(unreachable)?;
        let req = http::Request::get(path)
            .header(header::HOST, addr.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if resp.status() != http::StatusCode::OK {
            return Err(agent_error(&node, resp).await);
        }
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let mut body = resp.into_body();
        tokio::spawn(async move {
            loop {
                // A client that leaves ends the agent request too (a quiet `logs -f` included).
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
        let mut out = Response::new(ChannelBody { rx }.boxed());
        out.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        Ok(out)
    }

    /// The node a pod runs on and where its agent listens.
    async fn agent_of(&self, pod: &Value, name: &str) -> Result<(String, SocketAddr), ApiError> {
        let node = pod["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("pod {name} does not have a host assigned")))?;
        let nodes =
            super::registry::find("", "v1", "nodes").ok_or_else(|| ApiError::internal("nodes not served"))?;
        let (node_obj, _) = self.read_object(nodes, None, node).await?;
        let addr = agent_address(&node_obj).ok_or_else(|| {
            ApiError::bad_request(format!("node {node} has no address to reach its agent at"))
        })?;
        Ok((node.to_string(), addr))
    }

    /// The TLS client configuration for agents (client certificate from the cluster CA).
    fn agent_tls(&self) -> Result<Arc<rustls::ClientConfig>, ApiError> {
        self.agent_tls
            .get_or_init(|| {
                let pki = self.pki.as_ref().ok_or("the API server has no cluster CA key")?;
                let (cert, key) = pki.kubelet_client()?;
                let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| e.to_string())?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(UnverifiedServer(provider)))
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| e.to_string())?;
                Ok(Arc::new(cfg))
            })
            .clone()
            .map_err(ApiError::internal)
    }
}

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
            Err(e) => super::error_response(&e),
        }
    }

    async fn splice_exec(
        &self,
        caller: Option<&Caller>,
        req: &mut hyper::Request<hyper::body::Incoming>,
    ) -> Result<Response<Body>, ApiError> {
        if caller.is_none() {
            return Err(ApiError::unauthorized());
        }
        let path = req.uri().path().to_string();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let t = super::parse_target(&segs)?;
        let is_pod = t.res.kind == "Pod" && t.res.group.is_empty();
        if !is_pod || t.sub.as_deref() != Some("exec") || t.name.is_none() {
            return Err(ApiError::bad_request(format!(
                "{path} cannot be upgraded (only pods/<name>/exec)"
            )));
        }
        let q = Query::parse(req.uri().query());
        let name = t.name.clone().unwrap_or_default();
        let ns = t.namespace.clone().unwrap_or_else(|| "default".into());
        may_reach_agents(caller, "pods/exec", &name, &ns)?;
        let (pod, _) = self.read_object(t.res, Some(&ns), &name).await?;
        let container = pick_container(&pod, &name, q.get("container"))?.to_string();
        let (node, addr) = self.agent_of(&pod, &name).await?;
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
        let agent_path = format!(
            "/exec/{ns}/{name}/{container}?{}",
            req.uri().query().unwrap_or_default()
        );
        let tls = self.agent_tls()?;
        let unreachable =
            |e: String| ApiError::internal(format!("cannot reach the agent of node {node} at {addr}: {e}"));
        let mut send = agent_connect(addr, tls, true).await.map_err(unreachable)?;
        let mut up = http::Request::get(agent_path)
            .header(header::HOST, addr.to_string())
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
        let mut agent_resp = send
            .send_request(up)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        if agent_resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            return Err(agent_error(&node, agent_resp).await);
        }
        let mut out = Response::new(super::full(Bytes::new()));
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

/// Logs and exec run with the API server's `system:masters` client certificate on the node, so
/// nodes and bootstrapping callers may not ask for them (there is no RBAC yet; this is the part of
/// it that keeps a node or a bootstrap token from reaching every other workload).
fn may_reach_agents(caller: Option<&Caller>, resource: &str, name: &str, ns: &str) -> Result<(), ApiError> {
    let Some(c) = caller else {
        return Err(ApiError::unauthorized());
    };
    if c.groups
        .iter()
        .any(|g| g == "system:nodes" || g == "system:bootstrappers")
    {
        let verb = if resource == "pods/log" { "get" } else { "create" };
        return Err(ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "pods \"{name}\" is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"\" in the namespace \"{ns}\"",
                c.user
            ),
            details: Some(serde_json::json!({"name": name, "kind": "pods"})),
        });
    }
    Ok(())
}

/// The container to read: named, or the pod's only one.
fn pick_container<'a>(pod: &'a Value, name: &str, wanted: Option<&'a str>) -> Result<&'a str, ApiError> {
    let names = |list: &str| -> Vec<&'a str> {
        pod["spec"][list]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["name"].as_str()).collect())
            .unwrap_or_default()
    };
    let (containers, inits) = (names("containers"), names("initContainers"));
    match wanted.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) || inits.contains(&c) => Ok(c),
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

/// An HTTP/1.1 connection to an agent (driven by a spawned task; with upgrades for exec).
async fn agent_connect(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    upgrades: bool,
) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>, String> {
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| "connection timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    if upgrades {
        tokio::spawn(conn.with_upgrades());
    } else {
        tokio::spawn(conn);
    }
    Ok(send)
}

/// An agent's error answer as an API error (its text body is the message).
async fn agent_error(node: &str, resp: http::Response<hyper::body::Incoming>) -> ApiError {
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
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

/// Accepts the agent's self-signed serving certificate (signatures are still checked).
#[derive(Debug)]
struct UnverifiedServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for UnverifiedServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
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
    }

    #[test]
    fn nodes_and_bootstrappers_may_not_reach_agents() {
        let who = |user: &str, group: &str| Caller {
            user: user.into(),
            groups: vec![group.into()],
        };
        let node = who("system:node:n1", "system:nodes");
        let err = may_reach_agents(Some(&node), "pods/exec", "web", "default").expect_err("refused");
        assert_eq!((err.code, err.reason), (403, "Forbidden"));
        assert_eq!(
            err.message,
            "pods \"web\" is forbidden: User \"system:node:n1\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
        );
        let boot = who("system:bootstrap:abcdef", "system:bootstrappers");
        assert!(may_reach_agents(Some(&boot), "pods/log", "web", "default").is_err());
        assert!(
            may_reach_agents(
                Some(&who("admin", "system:masters")),
                "pods/log",
                "web",
                "default"
            )
            .is_ok()
        );
        assert_eq!(
            may_reach_agents(None, "pods/log", "web", "default").map_err(|e| e.code),
            Err(401)
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
