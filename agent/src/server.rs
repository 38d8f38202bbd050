//! The agent's TLS endpoint (the kubelet's port): `/healthz` for anyone, and `/stats/summary`,
//! `/configz`, `/pods` (a PodList of the pods bound to the node, as the agent last saw them),
//! `/containerLogs/<namespace>/<pod>/<container>`, `/exec/...`, `/attach/...` (same path shape)
//! and `/portForward/<namespace>/<pod>` (what the API server proxies `pods/log`, `pods/exec`,
//! `pods/attach` and `pods/portforward` to) for clients with a certificate
//! from the cluster CA whom the control plane allows the matching `nodes/<subresource>` verb
//! ([`crate::authz`]). The serving certificate is the one the cluster issues for the node
//! ([`crate::serving`]); until then a self-signed one, which the API server does not accept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tracing::Instrument;
use transport::Body;
use transport::server::{Limits, Peer};
use transport::tls::SwappableCert;

use crate::attach;
use crate::authz::Authorizer;
use crate::exec;
use crate::logs::{self, LogError, LogOptions};
use crate::portforward;
use crate::remotecommand;
use crate::stats;
use crate::{AgentConfig, AgentError};

/// The certificate served until the cluster issues one: self-signed for `names` (the kubelet's
/// default without serving-certificate bootstrap).
pub(crate) fn self_signed(names: &[String]) -> Result<SwappableCert, AgentError> {
    let key = rcgen::KeyPair::generate().map_err(AgentError::Certificate)?;
    let params = rcgen::CertificateParams::new(names.to_vec()).map_err(AgentError::Certificate)?;
    let cert = params.self_signed(&key).map_err(AgentError::Certificate)?;
    Ok(SwappableCert::new(&cert.pem(), &key.serialize_pem())?)
}

fn text(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(transport::body::full(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    resp
}

/// What the endpoint's handlers share.
#[derive(Debug)]
struct Ctx {
    /// What `/configz` answers.
    configz: Bytes,
    log_root: PathBuf,
    node_name: String,
    sampler: stats::NodeSampler,
    authz: Arc<Authorizer>,
    /// The pods bound to this node, for `/pods`.
    pods: tokio::sync::watch::Receiver<Vec<Arc<k8s_openapi::api::core::v1::Pod>>>,
}

/// A 200 with a JSON body.
fn json(body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = text(200, body.into());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The kubelet's `/pods`: a v1 PodList of the pods bound to the node, oldest first.
fn pod_list(pods: &[Arc<k8s_openapi::api::core::v1::Pod>]) -> serde_json::Value {
    let mut items: Vec<&k8s_openapi::api::core::v1::Pod> = pods.iter().map(|p| &**p).collect();
    items.sort_by(|a, b| {
        let key = |p: &k8s_openapi::api::core::v1::Pod| {
            (
                p.metadata.creation_timestamp.clone(),
                p.metadata.namespace.clone(),
                p.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let items: Vec<serde_json::Value> = items
        .into_iter()
        .map(|p| {
            let mut v = serde_json::to_value(p).unwrap_or_default();
            v["apiVersion"] = serde_json::json!("v1");
            v["kind"] = serde_json::json!("Pod");
            v
        })
        .collect();
    serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
}

/// `/stats/summary` as JSON.
async fn summary(ctx: Arc<Ctx>) -> Response<Body> {
    let made = tokio::task::spawn_blocking(move || {
        let pods = runtime_api::Client::connect(Path::new(runtime_api::SOCKET))?.list_pod_stats()?;
        stats::summary(&ctx.node_name, &ctx.sampler, pods)
    })
    .await;
    match made {
        Ok(Ok(s)) => match serde_json::to_vec(&s) {
            Ok(body) => json(body),
            Err(e) => text(500, e.to_string()),
        },
        Ok(Err(e)) => text(503, e.to_string()),
        Err(e) => text(500, e.to_string()),
    }
}

async fn handle(peer: Arc<Peer>, req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<Body> {
    if req.uri().path() == "/healthz" {
        return text(200, "ok");
    }
    let attrs = crate::authz::attributes(req.method(), req.uri().path());
    let who = match (&peer.identity, transport::server::bearer_token(req.headers())) {
        (Some(id), _) => Some(id.clone()),
        (None, Some(token)) => ctx.authz.authenticate(token).await,
        (None, None) => None,
    };
    if let Err(refusal) = ctx.authz.authorize(who.as_ref(), &attrs).await {
        return text(refusal.status(), refusal.to_string());
    }
    if req.uri().path().starts_with("/exec/") || req.uri().path().starts_with("/attach/") {
        return exec_upgrade(req, &ctx.log_root).await;
    }
    if req.uri().path().starts_with("/portForward/") {
        return port_forward_upgrade(req).await;
    }
    let path = req.uri().path();
    if path == "/stats/summary" {
        return summary(ctx).await;
    }
    if path == "/configz" {
        return json(ctx.configz.clone());
    }
    if path == "/pods" || path == "/pods/" {
        let items: Vec<Arc<k8s_openapi::api::core::v1::Pod>> = ctx.pods.borrow().clone();
        return match serde_json::to_vec(&pod_list(&items)) {
            Ok(body) => json(body),
            Err(e) => text(500, e.to_string()),
        };
    }
    if !path.starts_with("/containerLogs/") {
        return text(404, "not found");
    }
    let result = async {
        let (ns, pod, container) = logs::parse_path(path)?;
        let opts = LogOptions::parse(req.uri().query())?;
        let file = logs::find_log(&ctx.log_root, ns, pod, container, opts.previous)?;
        Ok::<_, LogError>((file, opts))
    }
    .await;
    let (file, opts) = match result {
        Ok(x) => x,
        Err(e) => return text(e.status(), e.to_string()),
    };
    let (data, _) = read_from(file.clone(), 0).await.unwrap_or_default();
    // Only complete lines; a follower picks the rest up from `offset`.
    let offset = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let initial = logs::render_all(
        &String::from_utf8_lossy(&data[..offset]),
        &opts,
        SystemTime::now(),
    );
    if !opts.follow {
        return text(200, initial);
    }
    let (tx, body) = transport::body::channel(16);
    tokio::spawn(async move {
        if !initial.is_empty() && tx.send(Bytes::from(initial)).await.is_err() {
            return;
        }
        let timestamps = opts.timestamps;
        follow(file, offset as u64, tx, move |lines| {
            let out: String = lines
                .lines()
                .filter_map(|l| logs::render(l, timestamps).map(|(_, s)| s))
                .collect();
            (!out.is_empty()).then(|| Bytes::from(out))
        })
        .await;
    });
    let mut resp = text(200, Bytes::new());
    *resp.body_mut() = body;
    resp
}

/// `/exec/<namespace>/<pod>/<container>`: an upgrade to a WebSocket (`v5.channel.k8s.io` or
/// `v4`) or to SPDY/3.1 (`v4.channel.k8s.io` streams, [`remotecommand`]) running the command in
/// the container; `/attach/...`: the same protocols carrying the container's own output
/// ([`attach`]).
async fn exec_upgrade(mut req: Request<Incoming>, log_root: &Path) -> Response<Body> {
    let attaching = req.uri().path().starts_with("/attach/");
    let prefix = if attaching { "/attach/" } else { "/exec/" };
    let (ns, pod, container) = match logs::parse_target(req.uri().path(), prefix) {
        Ok((a, b, c)) => (a.to_string(), b.to_string(), c.to_string()),
        Err(e) => return text(e.status(), e.to_string()),
    };
    let opts = if attaching {
        exec::ExecRequest::parse_flags(req.uri().query())
    } else {
        match exec::ExecRequest::parse(req.uri().query()) {
            Ok(o) => o,
            Err(e) => return text(e.status(), e.to_string()),
        }
    };
    let values = |name: &str| header_values(&req, name);
    let upgrade = values("upgrade");
    let websocket = upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket"));
    let spdy = upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1"));
    let what = prefix.trim_matches('/');
    let key = values("sec-websocket-key").into_iter().next();
    let (transport, switched) = if let Some(key) = key.filter(|_| websocket) {
        // The client's order of preference decides, as upstream's handshake does.
        let offered = values("sec-websocket-protocol");
        let Some(p) = offered
            .iter()
            .find_map(|o| exec::PROTOCOLS.iter().find(|p| *p == o))
        else {
            return text(
                400,
                format!("{what} needs one of the subprotocols {:?}", exec::PROTOCOLS),
            );
        };
        (exec::Transport::WebSocket, switching_to_websocket(&key, p))
    } else if spdy {
        if let Some(refusal) =
            refuse_unnegotiated(&values("x-stream-protocol-version"), remotecommand::PROTOCOL)
        {
            return refusal;
        }
        (exec::Transport::Spdy, switching_to_spdy(remotecommand::PROTOCOL))
    } else {
        return text(400, format!("{what} needs an upgrade to WebSocket or SPDY/3.1"));
    };
    let span =
        tracing::info_span!("exec", namespace = %ns, pod = %pod, container = %container, attach = attaching);
    let log_root = log_root.to_path_buf();
    let found = tokio::task::spawn_blocking(move || {
        let id = exec::find_container(&ns, &pod, &container)?;
        // Attach reads the running instance's log as the runtime writes it.
        let log = logs::find_log(&log_root, &ns, &pod, &container, false).ok();
        Ok::<_, exec::ExecError>((id, log))
    })
    .await
    .map_err(exec::ExecError::from)
    .and_then(|r| r);
    let (id, log) = match found {
        Ok(x) => x,
        Err(e) => return text(e.status(), e.to_string()),
    };
    let log = match log {
        Some(log) => log,
        None if attaching => return text(404, "the container has no log to attach to"),
        None => PathBuf::new(),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = async move {
        match on_upgrade.await {
            Ok(up) if attaching => attach::serve(TokioIo::new(up), transport, id, log, opts).await,
            Ok(up) => exec::serve(TokioIo::new(up), transport, id, opts).await,
            Err(e) => tracing::debug!(error = %e, "upgrade failed"),
        }
    };
    tokio::spawn(session.instrument(span));
    switched
}

/// A header's values, comma-separated lists split, empty ones dropped.
fn header_values(req: &Request<Incoming>, name: &str) -> Vec<String> {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// The kubelet's negotiation of a SPDY stream protocol: a client naming protocols must name
/// ours (a client naming none is from before negotiation, and gets the one we speak). The
/// refusal, if it is one.
fn refuse_unnegotiated(offered: &[String], ours: &str) -> Option<Response<Body>> {
    if offered.is_empty() || offered.iter().any(|p| p == ours) {
        return None;
    }
    Some(text(
        403,
        format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports [\"{ours}\"]"
        ),
    ))
}

/// A 101 answer upgrading to `upgrade`, speaking `protocol` (named in `protocol_header`).
fn switching(upgrade: &'static str, protocol_header: &'static str, protocol: &'static str) -> Response<Body> {
    let mut resp = text(101, Bytes::new());
    resp.headers_mut().remove(hyper::header::CONTENT_TYPE);
    let h = resp.headers_mut();
    let value = hyper::header::HeaderValue::from_static;
    h.insert(hyper::header::CONNECTION, value("Upgrade"));
    h.insert(hyper::header::UPGRADE, value(upgrade));
    h.insert(protocol_header, value(protocol));
    resp
}

/// The 101 answer to a raw SPDY/3.1 upgrade speaking the stream protocol `protocol`.
fn switching_to_spdy(protocol: &'static str) -> Response<Body> {
    switching("SPDY/3.1", "x-stream-protocol-version", protocol)
}

/// The 101 answer to a WebSocket upgrade with client key `key`, speaking subprotocol
/// `protocol`.
fn switching_to_websocket(key: &str, protocol: &'static str) -> Response<Body> {
    let mut resp = switching("websocket", "sec-websocket-protocol", protocol);
    let accept = derive_accept_key(key.trim().as_bytes());
    if let Ok(v) = hyper::header::HeaderValue::from_str(&accept) {
        resp.headers_mut().insert(hyper::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// `/portForward/<namespace>/<pod>[/<uid>]`: an upgrade to SPDY/3.1, raw (`Upgrade: SPDY/3.1`,
/// `X-Stream-Protocol-Version: portforward.k8s.io`) or tunnelled in a WebSocket
/// (`SPDY/3.1+portforward.k8s.io`), forwarding the streams' ports of the pod
/// ([`portforward`]).
async fn port_forward_upgrade(mut req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let mut parts = path["/portForward/".len()..].split('/');
    let (Some(ns), Some(pod)) = (
        parts.next().filter(|s| !s.is_empty()),
        parts.next().filter(|s| !s.is_empty()),
    ) else {
        return text(400, "the path must be /portForward/<namespace>/<pod>");
    };
    let (ns, pod) = (ns.to_string(), pod.to_string());
    let values = |name: &str| header_values(&req, name);
    let upgrade = values("upgrade");
    let websocket = upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket"));
    let spdy = upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1"));
    let key = values("sec-websocket-key").into_iter().next();
    if websocket
        && !values("sec-websocket-protocol")
            .iter()
            .any(|p| p == portforward::TUNNEL_PROTOCOL)
    {
        return text(
            400,
            format!(
                "port-forward over WebSocket needs the {} subprotocol",
                portforward::TUNNEL_PROTOCOL
            ),
        );
    }
    if !(spdy || websocket && key.is_some()) {
        return text(
            400,
            format!(
                "port-forward needs an upgrade to SPDY/3.1, raw or tunnelled in a WebSocket as {}",
                portforward::TUNNEL_PROTOCOL
            ),
        );
    }
    if !websocket
        && let Some(refusal) =
            refuse_unnegotiated(&values("x-stream-protocol-version"), portforward::PROTOCOL)
    {
        return refusal;
    }
    let span = tracing::info_span!("port-forward", namespace = %ns, pod = %pod);
    let found = tokio::task::spawn_blocking(move || portforward::find_sandbox(&ns, &pod))
        .await
        .map_err(portforward::PortForwardError::from)
        .and_then(|r| r);
    let dial = match found {
        Ok(id) => portforward::runtime_dialer(id),
        Err(e) => return text(e.status(), e.to_string()),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session = async move {
        let io = match on_upgrade.await {
            Ok(up) => TokioIo::new(up),
            Err(e) => return tracing::debug!(error = %e, "port-forward upgrade failed"),
        };
        if websocket {
            let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                io,
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            portforward::serve_tunnelled(ws, dial).await;
        } else {
            portforward::serve(io, dial).await;
        }
    };
    tokio::spawn(session.instrument(span));
    match key.filter(|_| websocket) {
        Some(key) => switching_to_websocket(&key, portforward::TUNNEL_PROTOCOL),
        None => switching_to_spdy(portforward::PROTOCOL),
    }
}

/// Streams what is appended to `file` from `offset` until the container stops running, the file
/// goes away or the client leaves: each batch of complete lines as `convert` makes it.
pub(crate) async fn follow<T>(
    file: PathBuf,
    mut offset: u64,
    tx: mpsc::Sender<T>,
    convert: impl Fn(&str) -> Option<T>,
) {
    let mut tick = 0u32;
    let mut pending = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        tick += 1;
        let running = if tick.is_multiple_of(5) {
            still_running(&file).await
        } else {
            true
        };
        let Ok((more, rotated)) = read_from(file.clone(), offset).await else {
            return;
        };
        if rotated {
            offset = 0;
            pending.clear();
        }
        offset += more.len() as u64;
        pending.extend_from_slice(&more);
        if let Some(end) = pending.iter().rposition(|b| *b == b'\n') {
            let lines: Vec<u8> = pending.drain(..=end).collect();
            if let Some(out) = convert(&String::from_utf8_lossy(&lines))
                && tx.send(out).await.is_err()
            {
                return;
            }
        }
        if !running || tx.is_closed() {
            return;
        }
    }
}

/// The content of `file` from `offset` on (blocking reads, off the async threads).
/// A file shorter than `offset` was rotated (the runtime renames a full log and starts a new
/// one): then it is read from its start, and the bool is true.
async fn read_from(file: PathBuf, offset: u64) -> std::io::Result<(Vec<u8>, bool)> {
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(&file)?;
        let rotated = f.metadata()?.len() < offset;
        f.seek(std::io::SeekFrom::Start(if rotated { 0 } else { offset }))?;
        let mut out = Vec::new();
        f.read_to_end(&mut out)?;
        Ok((out, rotated))
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Whether the runtime still runs the container writing `file`.
async fn still_running(file: &Path) -> bool {
    let file = file.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut client = runtime_api::Client::connect(Path::new(runtime_api::SOCKET)).ok()?;
        let items = client.list_containers().ok()?;
        Some(
            items.iter().any(|c| {
                c.log_path.as_deref() == Some(file.as_path()) && c.state == runtime_api::State::Running
            }),
        )
    })
    .await
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// Serves the agent endpoint until the listener fails. With the cluster CA (`ca_pem`), log
/// requests from its `system:masters` clients are served; without it only `/healthz`.
pub async fn serve(
    cfg: AgentConfig,
    ca_pem: Option<String>,
    node_name: String,
    cert: Arc<SwappableCert>,
    authz: Arc<Authorizer>,
    configz: serde_json::Value,
    pods: tokio::sync::watch::Receiver<Vec<Arc<k8s_openapi::api::core::v1::Pod>>>,
) -> Result<(), AgentError> {
    let tls = Arc::new(transport::tls::server_config_with(cert, ca_pem.as_deref())?);
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let ctx = Arc::new(Ctx {
        configz: Bytes::from(serde_json::to_vec(&configz).unwrap_or_default()),
        log_root: PathBuf::from(logs::PODS_LOG_ROOT),
        node_name,
        sampler: stats::NodeSampler::new(cfg.cgroup_root.clone()),
        authz,
        pods,
    });
    tracing::info!(listen = %cfg.listen, "ready");
    match transport::server::serve(listener, tls, Limits::default(), move |peer, req| {
        handle(peer, req, ctx.clone())
    })
    .await {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_listed_oldest_first_as_a_pod_list() {
        let pod = |name: &str, created: &str| -> Arc<k8s_openapi::api::core::v1::Pod> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "n1"},
                }))
                .expect("pod"),
            )
        };
        let list = pod_list(&[
            pod("young", "2026-12-02T10:00:00Z"),
            pod("old", "2026-12-01T10:00:00Z"),
        ]);
        assert_eq!(
            (&list["kind"], &list["apiVersion"]),
            (&serde_json::json!("PodList"), &serde_json::json!("v1"))
        );
        let names: Vec<&str> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["old", "young"]);
        assert_eq!(list["items"][0]["kind"], "Pod");
        assert_eq!(pod_list(&[])["items"], serde_json::json!([]));
    }
}
