//! Container probes (docs/SEEDS-SPEC.md NODE-22..NODE-25): startup, liveness and readiness with
//! exec (through the runtime), httpGet and tcpSocket (from the agent, to the pod's IP).
//!
//! The schedule and the thresholds are pure ([`Prober`]): a probe first runs `initialDelaySeconds`
//! after the container started, then every `periodSeconds`; `failureThreshold` failures in a row
//! flip the result to failure, `successThreshold` successes back. Liveness and readiness wait
//! for the startup probe to succeed. Defaults are upstream's (NODE-24): delay 0, period 10 s,
//! timeout 1 s, success 1, failure 3.
//!
//! HTTPS probes and hooks connect as the kubelet's do: TLS without verifying the container's
//! certificate (`InsecureSkipVerify`: a probe checks that the server answers, not who it is; the
//! handshake's own signatures are still checked), SNI only for a host name.
//!
//! gRPC probes call the standard health service over HTTP/2 (`grpc.rs`).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Startup,
    Liveness,
    Readiness,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Startup, Kind::Liveness, Kind::Readiness];

    /// The word the kubelet's events use (`Liveness probe failed: ...`).
    pub fn word(self) -> &'static str {
        match self {
            Kind::Startup => "Startup",
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
        }
    }

    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            Kind::Startup => c.startup_probe.as_ref(),
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
        }
    }
}

/// A probe's numbers with upstream's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn secs(v: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
}

impl Timing {
    pub fn of(p: &Probe) -> Self {
        let n = |v: Option<i32>, d: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(d)
        };
        Timing {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: n(p.success_threshold, 1),
            failure_threshold: n(p.failure_threshold, 3),
        }
    }
}

/// One probe of one container instance: when it runs next and what it concluded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prober {
    /// Consecutive results of the same kind.
    successes: u32,
    failures: u32,
    last_run: Option<SystemTime>,
    /// The conclusion so far: None before the thresholds decide (readiness then counts as not
    /// ready, startup as not started).
    pub result: Option<bool>,
}

impl Prober {
    /// A prober that already concluded `result` (kept across agent restarts from the API).
    pub fn concluded(result: bool) -> Self {
        Prober {
            result: Some(result),
            ..Prober::default()
        }
    }

    /// When the probe runs next for a container running since `started`.
    pub fn due(&self, started: SystemTime, t: &Timing) -> SystemTime {
        self.last_run
            .map_or(started + t.initial_delay, |last| last + t.period)
    }

    /// Records one outcome at `now`; returns the conclusion when it changed.
    pub fn record(&mut self, ok: bool, now: SystemTime, t: &Timing) -> Option<bool> {
        self.last_run = Some(now);
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        let concluded = if ok && self.successes >= t.success_threshold {
            Some(true)
        } else if !ok && self.failures >= t.failure_threshold {
            Some(false)
        } else {
            None
        };
        match concluded {
            Some(r) if self.result != Some(r) => {
                self.result = Some(r);
                Some(r)
            }
            _ => None,
        }
    }
}

/// Why a probe (or a hook's network or exec action) failed, with the kubelet's texts.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("dial tcp {addr}: connect: {why}")]
    Dial { addr: String, why: String },
    #[error("dial tcp {addr}: i/o timeout")]
    DialTimeout { addr: String },
    #[error("Get \"{url}\": dial tcp {addr}: connect: {why}")]
    HttpDial { url: String, addr: String, why: String },
    #[error("Get \"{url}\": {source}")]
    Http { url: String, source: hyper::Error },
    #[error("Get \"{url}\": {source}")]
    Request { url: String, source: hyper::http::Error },
    #[error("Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)")]
    HttpTimeout { url: String },
    #[error("HTTP probe failed with statuscode: {0}")]
    Status(u16),
    /// The command's output (stdout, then stderr): the kubelet reports just that.
    #[error("{0}")]
    Exec(String),
    #[error("command timed out after {0}s")]
    ExecTimeout(u64),
    #[error(transparent)]
    Runtime(runtime_api::ClientError),
    #[error("the probe was cancelled")]
    Cancelled,
    #[error("the pod has no IP")]
    NoPodIp,
    #[error("Get \"{url}\": {why}")]
    Tls { url: String, why: String },
    #[error(transparent)]
    Grpc(#[from] super::grpc::GrpcError),
    #[error("the probe has no action")]
    NoAction,
    #[error("invalid port {0}")]
    InvalidPort(i32),
    #[error("couldn't find port: {name} in {container}")]
    NamedPort { name: String, container: String },
}

/// What a probe run found: success, or why it failed.
pub type Outcome = Result<(), ProbeError>;

/// The port of an httpGet/tcpSocket action: a number, or a named port of the container.
pub fn port(c: &Container, p: &IntOrString) -> Result<u16, ProbeError> {
    match p {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| ProbeError::InvalidPort(*n)),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .and_then(|cp| u16::try_from(cp.container_port).ok())
            .ok_or_else(|| ProbeError::NamedPort {
                name: name.clone(),
                container: c.name.clone(),
            }),
    }
}

/// Runs a tcpSocket probe.
pub async fn tcp(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = format!("{host}:{port}");
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(ProbeError::Dial {
            why: io_text(&e),
            addr,
        }),
        Err(_) => Err(ProbeError::DialTimeout { addr }),
    }
}

/// Go's wording of the common connect errors.
fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::HostUnreachable => "no route to host".into(),
        _ => e.to_string(),
    }
}

/// Runs an httpGet probe: 200-399 is a success (`HTTP probe failed with statuscode: 503`);
/// `https` speaks TLS first (see the module doc).
pub async fn http(
    https: bool,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Outcome {
    let scheme = if https { "https" } else { "http" };
    let url = format!("{scheme}://{host}:{port}{path}");
    let run = async {
        let stream =
            tokio::net::TcpStream::connect((host, port))
                .await
                .map_err(|e| ProbeError::HttpDial {
                    url: url.clone(),
                    addr: format!("{host}:{port}"),
                    why: io_text(&e),
                })?;
        let req = request(host, port, path, headers).map_err(|source| ProbeError::Request {
            url: url.clone(),
            source,
        })?;
        let code = if https {
            let tls_failed = |why: String| ProbeError::Tls {
                url: url.clone(),
                why,
            };
            let config = insecure_tls().map_err(|e| tls_failed(e.to_string()))?;
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| tls_failed(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map_err(|e| tls_failed(format!("tls: {e}")))?;
            send(tls, req).await
        } else {
            send(stream, req).await
        }
        .map_err(|source| ProbeError::Http {
            url: url.clone(),
            source,
        })?;
        if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(ProbeError::Status(code))
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::HttpTimeout { url }),
    }
}

/// The kubelet's probe request: GET with its user agent, `Accept: */*` and the probe's headers.
fn request(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<hyper::Request<Empty<Bytes>>, hyper::http::Error> {
    let mut req = hyper::Request::get(path)
        .header("host", format!("{host}:{port}"))
        .header("user-agent", "kube-probe/1.32")
        .header("accept", "*/*");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    req.body(Empty::<Bytes>::new())
}

/// Sends `req` over a fresh HTTP/1.1 connection on `io` and returns the status code.
async fn send<S>(io: S, req: hyper::Request<Empty<Bytes>>) -> Result<u16, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    Ok(send.send_request(req).await?.status().as_u16())
}

/// Accepts any server certificate but checks the handshake signatures against it.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client configuration of HTTPS probes (built once).
fn insecure_tls() -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    if let Some(c) = CONFIG.get() {
        return Ok(c.clone());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
        .with_no_client_auth();
    Ok(CONFIG.get_or_init(|| Arc::new(config)).clone())
}

/// What a command run in a container printed (stdout, then stderr), as the kubelet reports it.
pub fn exec_text(out: &runtime_api::ExecSyncResult) -> String {
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// Runs `cmd` in container instance `container_id` through the runtime, within `timeout`.
pub async fn exec(
    container_id: &str,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<runtime_api::ExecSyncResult, ProbeError> {
    let id = container_id.to_string();
    let r = super::worker::blocking(move || {
        super::worker::runtime().and_then(|mut rt| rt.exec_sync(&id, cmd, Some(timeout)))
    })
    .await;
    match r {
        Some(Ok(out)) => Ok(out),
        Some(Err(e)) if e.kind() == runtime_api::ErrorKind::DeadlineExceeded => {
            Err(ProbeError::ExecTimeout(timeout.as_secs()))
        }
        Some(Err(e)) => Err(ProbeError::Runtime(e)),
        None => Err(ProbeError::Cancelled),
    }
}

/// Runs an httpGet action (a probe's or a hook's) of container `c` against `default_host`.
pub async fn http_action(c: &Container, g: &HTTPGetAction, default_host: &str, timeout: Duration) -> Outcome {
    let https = g.scheme.as_deref() == Some("HTTPS");
    let port = port(c, &g.port)?;
    let headers: Vec<(String, String)> = g
        .http_headers
        .iter()
        .flatten()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let host = g.host.as_deref().unwrap_or(default_host);
    http(
        https,
        host,
        port,
        g.path.as_deref().unwrap_or("/"),
        &headers,
        timeout,
    )
    .await
}

/// Runs a tcpSocket action (a probe's or a hook's) of container `c` against `default_host`.
pub async fn tcp_action(
    c: &Container,
    t: &TCPSocketAction,
    default_host: &str,
    timeout: Duration,
) -> Outcome {
    let port = port(c, &t.port)?;
    tcp(t.host.as_deref().unwrap_or(default_host), port, timeout).await
}

/// Runs probe `p` of container `c` (instance `container_id`) in a pod at `pod_ip`.
pub async fn run(p: &Probe, c: &Container, container_id: &str, pod_ip: Option<&str>) -> Outcome {
    let t = Timing::of(p);
    if let Some(e) = &p.exec {
        let out = exec(container_id, e.command.clone().unwrap_or_default(), t.timeout).await?;
        return if out.exit_code == 0 {
            Ok(())
        } else {
            Err(ProbeError::Exec(exec_text(&out)))
        };
    }
    let ip = pod_ip.ok_or(ProbeError::NoPodIp)?;
    if let Some(g) = &p.http_get {
        return http_action(c, g, ip, t.timeout).await;
    }
    if let Some(s) = &p.tcp_socket {
        return tcp_action(c, s, ip, t.timeout).await;
    }
    if let Some(g) = &p.grpc {
        let port = u16::try_from(g.port).map_err(|_| ProbeError::InvalidPort(g.port))?;
        let service = g.service.as_deref().unwrap_or_default();
        return Ok(super::grpc::check(ip, port, service, t.timeout).await?);
    }
    Err(ProbeError::NoAction)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    #[test]
    fn defaults_are_upstreams() {
        let t = Timing::of(&Probe::default());
        assert_eq!(
            t,
            Timing {
                initial_delay: Duration::ZERO,
                period: Duration::from_secs(10),
                timeout: Duration::from_secs(1),
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
        let p = Probe {
            period_seconds: Some(5),
            failure_threshold: Some(30),
            initial_delay_seconds: Some(3),
            ..Probe::default()
        };
        let t = Timing::of(&p);
        assert_eq!(
            (t.period.as_secs(), t.failure_threshold, t.initial_delay.as_secs()),
            (5, 30, 3)
        );
    }

    #[test]
    fn thresholds_decide_and_the_schedule_follows_the_period() {
        let t = Timing {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: 2,
            failure_threshold: 3,
        };
        let mut p = Prober::default();
        assert_eq!(p.due(at(0), &t), at(5), "first run after the initial delay");
        let table = [
            // (outcome, conclusion change, result)
            (true, None, None),
            (true, Some(true), Some(true)),
            (false, None, Some(true)),
            (false, None, Some(true)),
            (true, None, Some(true)),
            (false, None, Some(true)),
            (false, None, Some(true)),
            (false, Some(false), Some(false)),
            (true, None, Some(false)),
            (true, Some(true), Some(true)),
        ];
        let mut now = at(5);
        for (i, (ok, change, result)) in table.into_iter().enumerate() {
            assert_eq!(p.record(ok, now, &t), change, "step {i}");
            assert_eq!(p.result, result, "step {i}");
            now = p.due(at(0), &t);
            assert_eq!(
                now,
                at(5 + 10 * (i as u64 + 1)),
                "step {i}: next run one period later"
            );
        }
    }

    #[tokio::test]
    async fn network_probes_report_the_kubelets_texts() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        // A tiny HTTP server: /ok answers 200, anything else 503.
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for s in listener.incoming().take(3) {
                let Ok(mut s) = s else { continue };
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]);
                let code = if req.starts_with("GET /ok ") && req.contains("user-agent: kube-probe/") {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = s.write_all(format!("HTTP/1.1 {code}\r\ncontent-length: 0\r\n\r\n").as_bytes());
            }
        });
        let second = Duration::from_secs(1);
        let text = |r: Outcome| r.map_err(|e| e.to_string());
        assert_eq!(
            text(http(false, "127.0.0.1", port, "/ok", &[], second).await),
            Ok(())
        );
        assert_eq!(
            text(http(false, "127.0.0.1", port, "/ready", &[], second).await),
            Err("HTTP probe failed with statuscode: 503".into())
        );
        assert_eq!(text(tcp("127.0.0.1", port, second).await), Ok(()));
        // A port nobody listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let dead = closed.local_addr().expect("addr").port();
        drop(closed);
        assert_eq!(
            text(tcp("127.0.0.1", dead, second).await),
            Err(format!("dial tcp 127.0.0.1:{dead}: connect: connection refused"))
        );
        assert_eq!(
            text(http(false, "127.0.0.1", dead, "/ready", &[], second).await),
            Err(format!(
                "Get \"http://127.0.0.1:{dead}/ready\": dial tcp 127.0.0.1:{dead}: connect: connection refused"
            ))
        );
    }

    /// HTTPS: a server with a self-signed certificate is probed (not verified, as the
    /// kubelet's probes), its status decides; a plain HTTP server fails the TLS handshake.
    #[tokio::test]
    async fn https_probes_skip_certificate_verification() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cert = rcgen::generate_simple_self_signed(vec!["pod.local".into()]).expect("certificate");
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let server =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(vec![cert.cert.der().clone()], key)
                .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let mut buf = [0u8; 1024];
                let n = tls.read(&mut buf).await.unwrap_or(0);
                let code = if buf[..n].starts_with(b"GET /ok ") {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let reply = format!("HTTP/1.1 {code}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        let second = Duration::from_secs(2);
        let text = |r: Outcome| r.map_err(|e| e.to_string());
        assert_eq!(
            text(http(true, "127.0.0.1", port, "/ok", &[], second).await),
            Ok(())
        );
        assert_eq!(
            text(http(true, "127.0.0.1", port, "/ready", &[], second).await),
            Err("HTTP probe failed with statuscode: 503".into())
        );
        // Plain HTTP where TLS was expected: the handshake fails, with the URL in the text.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let plain_port = plain.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = plain.accept().await {
                let mut buf = [0u8; 1024];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let err = text(http(true, "127.0.0.1", plain_port, "/ok", &[], second).await).expect_err("not TLS");
        assert!(
            err.starts_with(&format!("Get \"https://127.0.0.1:{plain_port}/ok\": tls: ")),
            "{err}"
        );
    }
}
