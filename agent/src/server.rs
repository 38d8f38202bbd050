//! The agent's TLS endpoint (the kubelet's port): `/healthz` for anyone, and
//! `/containerLogs/<namespace>/<pod>/<container>` and `/exec/<namespace>/<pod>/<container>`
//! (what the API server proxies `pods/log` and `pods/exec` to) for clients with a certificate
//! from the cluster CA in group `system:masters` (the API server's kubelet client, or an admin). The serving certificate is self-signed, as the
//! kubelet's is by default; the API server does not verify it.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

use crate::exec;
use crate::logs::{self, LogError, LogOptions};
use crate::{AgentConfig, AgentError};

type Body = BoxBody<Bytes, Infallible>;

fn tls_config(names: &[String], ca_pem: Option<&str>) -> Result<rustls::ServerConfig, AgentError> {
    let cert_err = |e: &dyn std::fmt::Display| AgentError::Certificate(e.to_string());
    let key = rcgen::KeyPair::generate().map_err(|e| cert_err(&e))?;
    let params = rcgen::CertificateParams::new(names.to_vec()).map_err(|e| cert_err(&e))?;
    let cert = params.self_signed(&key).map_err(|e| cert_err(&e))?;
    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut cfg = match ca_pem {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(c.map_err(|e| cert_err(&e))?)?;
            }
            // Client certificates are optional (health checks), verified when presented.
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| cert_err(&e))?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)?
        }
        None => builder.with_no_client_auth().with_single_cert(chain, key)?,
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Whether a verified client certificate is in group `system:masters`.
fn is_master(cert: &CertificateDer<'_>) -> bool {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return false;
    };
    parsed
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .any(|o| o == "system:masters")
}

fn text(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    resp
}

async fn handle(
    req: Request<Incoming>,
    authorized: bool,
    log_root: Arc<PathBuf>,
) -> Result<Response<Body>, Infallible> {
    if req.uri().path().starts_with("/exec/") {
        if !authorized {
            return Ok(text(
                403,
                "forbidden: a client certificate in group system:masters is required",
            ));
        }
        return Ok(exec_upgrade(req).await);
    }
    let path = req.uri().path();
    if path == "/healthz" {
        return Ok(text(200, "ok"));
    }
    if !path.starts_with("/containerLogs/") {
        return Ok(text(404, "not found"));
    }
    if !authorized {
        return Ok(text(
            403,
            "forbidden: a client certificate in group system:masters is required",
        ));
    }
    let result = async {
        let (ns, pod, container) = logs::parse_path(path)?;
        let opts = LogOptions::parse(req.uri().query())?;
        let file = logs::find_log(&log_root, ns, pod, container, opts.previous)?;
        Ok::<_, LogError>((file, opts))
    }
    .await;
    let (file, opts) = match result {
        Ok(x) => x,
        Err(e) => return Ok(text(e.status(), e.to_string())),
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
        return Ok(text(200, initial));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if !initial.is_empty() && tx.send(Bytes::from(initial)).await.is_err() {
            return;
        }
        follow(file, offset as u64, opts.timestamps, tx).await;
    });
    let mut resp = text(200, Bytes::new());
    *resp.body_mut() = ChannelBody { rx }.boxed();
    Ok(resp)
}

/// `/exec/<namespace>/<pod>/<container>`: a WebSocket upgrade (`v5.channel.k8s.io`) running
/// the command in the container.
async fn exec_upgrade(mut req: Request<Incoming>) -> Response<Body> {
    let (ns, pod, container) = match logs::parse_target(req.uri().path(), "/exec/") {
        Ok((a, b, c)) => (a.to_string(), b.to_string(), c.to_string()),
        Err(e) => return text(e.status(), e.to_string()),
    };
    let opts = match exec::ExecRequest::parse(req.uri().query()) {
        Ok(o) => o,
        Err(e) => return text(400, e),
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let websocket = header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let Some(key) = header("sec-websocket-key").filter(|_| websocket) else {
        return text(400, "exec needs a WebSocket upgrade");
    };
    let offered = req
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|p| p.trim() == exec::PROTOCOL));
    if !offered {
        return text(400, format!("exec needs the {} subprotocol", exec::PROTOCOL));
    }
    let found = tokio::task::spawn_blocking(move || exec::find_container(&ns, &pod, &container)).await;
    let id = match found {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => return text(404, e),
        Err(e) => return text(500, e.to_string()),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(up) => exec::serve(TokioIo::new(up), id, opts).await,
            Err(e) => tracing::debug!(error = %e, "exec upgrade failed"),
        }
    });
    let mut resp = text(101, Bytes::new());
    resp.headers_mut().remove(hyper::header::CONTENT_TYPE);
    let h = resp.headers_mut();
    h.insert(
        hyper::header::UPGRADE,
        hyper::header::HeaderValue::from_static("websocket"),
    );
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    h.insert(
        hyper::header::SEC_WEBSOCKET_PROTOCOL,
        hyper::header::HeaderValue::from_static(exec::PROTOCOL),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&exec::accept_key(&key)) {
        h.insert(hyper::header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// Streams what is appended to `file` from `offset` until the container stops running, the file
/// goes away or the client leaves.
async fn follow(file: PathBuf, mut offset: u64, timestamps: bool, tx: mpsc::Sender<Bytes>) {
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
            let out: String = String::from_utf8_lossy(&lines)
                .lines()
                .filter_map(|l| logs::render(l, timestamps).map(|(_, s)| s))
                .collect();
            if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
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
        let mut client = runtime::api::Client::connect(Path::new(runtime::api::SOCKET)).ok()?;
        let items = client.list_containers().ok()?;
        Some(items.iter().any(|c| {
            c.log_path.as_deref() == Some(file.as_path()) && c.state == runtime::api::State::Running
        }))
    })
    .await
    .ok()
    .flatten()
    .unwrap_or(false)
}

/// A response body fed by a channel.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Serves the agent endpoint until the listener fails. With the cluster CA (`ca_pem`), log
/// requests from its `system:masters` clients are served; without it only `/healthz`.
pub async fn serve(cfg: AgentConfig, ca_pem: Option<String>) -> Result<(), AgentError> {
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(&cfg.server_names, ca_pem.as_deref())?));
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let log_root = Arc::new(PathBuf::from(logs::PODS_LOG_ROOT));
    tracing::info!(listen = %cfg.listen, "ready");
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let log_root = log_root.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let authorized = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .is_some_and(is_master);
            let service = service_fn(move |req| handle(req, authorized, log_root.clone()));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
            }
        });
    }
}
