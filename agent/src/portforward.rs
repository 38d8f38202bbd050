//! `/portForward/<namespace>/<pod>`: the kubelet's port-forward endpoint. The client (kubectl,
//! through the API server) upgrades to SPDY/3.1, raw or tunnelled in WebSocket binary messages
//! (`SPDY/3.1+portforward.k8s.io`), and opens two streams per forwarded connection, `error` and
//! `data`, paired by their `requestID` header and naming the pod's `port`. The runtime dials
//! `localhost:<port>` inside the pod's network namespace ([`runtime_api::Client::port_forward`],
//! as containerd does) and hands the socket over; the agent copies both ways. A connection that
//! fails is reported on the error stream in the kubelet's words; when either direction ends the
//! other gets a second to finish (containerd's rule), then both streams are closed.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use crate::spdy::{self, Frame, FrameReader, FrameWriter, Out};

/// The stream protocol both upgrades negotiate.
pub const PROTOCOL: &str = "portforward.k8s.io";
/// The WebSocket subprotocol of SPDY tunnelled in WebSocket.
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// How long half of a stream pair waits for the other (the kubelet's stream creation timeout).
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// Most stream pairs being set up at once on one connection.
const MAX_PENDING: usize = 256;
/// How long the runtime's socket may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Once one direction is done, how long the other may still run (containerd's socat-like rule).
const LINGER: Duration = Duration::from_secs(1);

/// Why a port-forward request was refused before the upgrade.
#[derive(Debug, thiserror::Error)]
pub enum PortForwardError {
    #[error("pod {namespace}/{pod} is not running on this node")]
    NoSandbox { namespace: String, pod: String },
    #[error(transparent)]
    Runtime(#[from] runtime_api::ClientError),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

impl PortForwardError {
    pub fn status(&self) -> u16 {
        match self {
            PortForwardError::NoSandbox { .. } => 404,
            PortForwardError::Runtime(e) if e.kind() == runtime_api::ErrorKind::Unavailable => 503,
            PortForwardError::Runtime(_) | PortForwardError::Task(_) => 500,
        }
    }
}

/// The ready sandbox of pod `namespace/pod`.
pub fn find_sandbox(namespace: &str, pod: &str) -> Result<String, PortForwardError> {
    let mut client = runtime_api::Client::connect(std::path::Path::new(runtime_api::SOCKET))?;
    client
        .list_sandboxes()?
        .into_iter()
        .find(|s| s.namespace == namespace && s.name == pod && s.ready)
        .map(|s| s.id)
        .ok_or_else(|| PortForwardError::NoSandbox {
            namespace: namespace.into(),
            pod: pod.into(),
        })
}

/// Why a forwarded connection failed: the text the client reads on its error stream.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The kubelet's wrapping of the dialer's error (its pod is the sandbox, its uid empty).
    #[error("error forwarding port {port} to pod {pod}, uid : {source}")]
    Dial {
        port: u16,
        pod: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to connect to localhost:{port} inside the pod's network namespace: {source}")]
    Connect { port: u16, source: std::io::Error },
    #[error("timed out connecting to localhost:{port} in the pod")]
    ConnectTimeout { port: u16 },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// What dials a port of the pod: the runtime, given the sandbox (a test's loopback listener).
pub type Dialer = std::sync::Arc<dyn Fn(u16) -> Result<OwnedFd, ForwardError> + Send + Sync>;

/// The runtime's dialer for `sandbox_id`.
pub fn runtime_dialer(sandbox_id: String) -> Dialer {
    std::sync::Arc::new(move |port| {
        let dial = || {
            runtime_api::Client::connect(std::path::Path::new(runtime_api::SOCKET))?
                .port_forward(&sandbox_id, port)
        };
        dial().map_err(|e| ForwardError::Dial {
            port,
            pod: sandbox_id.clone(),
            source: Box::new(e),
        })
    })
}

/// Serves SPDY tunnelled in the WebSocket `ws`: binary messages carry the byte stream.
pub async fn serve_tunnelled<S>(ws: WebSocketStream<S>, dial: Dialer)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = tokio::io::duplex(64 << 10);
    let (mut sink, mut stream) = ws.split();
    let (mut from_spdy, mut to_spdy) = tokio::io::split(theirs);
    let inbound = async move {
        while let Some(Ok(msg)) = stream.next().await {
            match msg {
                Message::Binary(b) if to_spdy.write_all(&b).await.is_err() => break,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = to_spdy.shutdown().await;
    };
    let outbound = async move {
        let mut buf = vec![0u8; 32 << 10];
        loop {
            match from_spdy.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    tokio::join!(serve(ours, dial), inbound, outbound);
}

/// One half of a stream pair, as its SYN_STREAM named it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StreamRequest {
    kind: StreamKind,
    port: u16,
    request_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamKind {
    Error,
    Data,
}

/// Why a new stream is refused (the kubelet's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum StreamHeaderError {
    #[error("\"streamType\" header is required")]
    NoStreamType,
    #[error("invalid stream type {0:?}")]
    StreamType(String),
    #[error("\"port\" header is required")]
    NoPort,
    #[error("unable to parse {0:?} as a port")]
    Port(String),
    #[error("port \"0\" must be > 0")]
    ZeroPort,
}

/// The kubelet's checks of a new stream's headers.
fn stream_request(id: u32, headers: &[(String, String)]) -> Result<StreamRequest, StreamHeaderError> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let kind = match get("streamtype") {
        Some("error") => StreamKind::Error,
        Some("data") => StreamKind::Data,
        Some(other) => return Err(StreamHeaderError::StreamType(other.to_string())),
        None => return Err(StreamHeaderError::NoStreamType),
    };
    let port = get("port").ok_or(StreamHeaderError::NoPort)?;
    let port: u16 = port
        .parse()
        .map_err(|_| StreamHeaderError::Port(port.to_string()))?;
    if port == 0 {
        return Err(StreamHeaderError::ZeroPort);
    }
    // Clients older than the header pair streams by id (the kubelet's fallback): error n,
    // data n+2.
    let request_id = match get("requestid") {
        Some(r) if !r.is_empty() => r.to_string(),
        _ => match kind {
            StreamKind::Error => id.to_string(),
            StreamKind::Data => id.saturating_sub(2).to_string(),
        },
    };
    Ok(StreamRequest {
        kind,
        port,
        request_id,
    })
}

/// Half a pair, waiting for its other half.
#[derive(Debug)]
struct Pending {
    error: Option<u32>,
    /// The data stream and what the peer sends on it meanwhile.
    data: Option<(u32, mpsc::Receiver<Bytes>)>,
    port: u16,
    since: Instant,
}

/// Serves one SPDY connection until the peer leaves.
pub async fn serve<IO>(io: IO, dial: Dialer)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let (out_tx, writer) = spdy::spawn_writer(wr);
    let mut reader = FrameReader::new(rd);
    let mut pending: HashMap<String, Pending> = HashMap::new();
    // Where the peer's DATA for a data stream goes (its forwarder).
    let mut inbound: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    loop {
        let frame = match reader.next().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "port-forward connection");
                break;
            }
        };
        match frame {
            Frame::SynStream { id, headers, .. } => {
                let now = Instant::now();
                pending.retain(|_, p| now.duration_since(p.since) < PAIR_TIMEOUT);
                let req = match stream_request(id, &headers) {
                    Ok(r) if pending.len() < MAX_PENDING || pending.contains_key(&r.request_id) => Some(r),
                    Ok(_) => {
                        tracing::debug!(stream = id, "port-forward stream refused: too many pending");
                        None
                    }
                    Err(e) => {
                        tracing::debug!(stream = id, error = %e, "port-forward stream refused");
                        None
                    }
                };
                let Some(req) = req else {
                    let rst = FrameWriter::rst_stream(id, spdy::REFUSED_STREAM);
                    if out_tx.send(Out::Frame(rst)).await.is_err() {
                        break;
                    }
                    continue;
                };
                if out_tx.send(Out::Reply(id)).await.is_err() {
                    break;
                }
                let p = pending.entry(req.request_id.clone()).or_insert(Pending {
                    error: None,
                    data: None,
                    port: req.port,
                    since: now,
                });
                match req.kind {
                    StreamKind::Error => p.error = Some(id),
                    StreamKind::Data => {
                        // What arrives before the pair is complete waits for its forwarder.
                        let (tx, rx) = mpsc::channel(16);
                        inbound.insert(id, tx);
                        p.data = Some((id, rx));
                    }
                }
                if p.error.is_some() && p.data.is_some() {
                    let port = p.port;
                    if let Some(Pending {
                        error: Some(error),
                        data: Some((data, rx)),
                        ..
                    }) = pending.remove(&req.request_id)
                    {
                        tokio::spawn(forward(port, data, error, rx, out_tx.clone(), dial.clone()));
                    }
                }
            }
            Frame::Data { id, fin, data } => {
                if let Some(tx) = inbound.get(&id) {
                    if !data.is_empty() && tx.send(data).await.is_err() {
                        inbound.remove(&id);
                    }
                    if fin {
                        // Dropping the sender is the end of the peer's half.
                        inbound.remove(&id);
                    }
                }
            }
            Frame::RstStream { id, .. } => {
                inbound.remove(&id);
            }
            // Pings from the peer have odd ids (ours would be even): echoed.
            Frame::Ping { id } if id % 2 == 1 => {
                if out_tx.send(Out::Frame(FrameWriter::ping(id))).await.is_err() {
                    break;
                }
            }
            Frame::GoAway => break,
            Frame::Ping { .. } | Frame::Ignored => {}
        }
    }
    drop(inbound);
    drop(out_tx);
    let _ = writer.await;
}

/// One forwarded connection: dial, copy both ways, report a failure on the error stream, close
/// both streams.
async fn forward(
    port: u16,
    data: u32,
    error: u32,
    inbound: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Out>,
    dial: Dialer,
) {
    if let Err(e) = relay(port, data, inbound, &out, dial).await {
        tracing::debug!(port, error = %e, "port forward failed");
        for f in FrameWriter::data(error, e.to_string().as_bytes(), false) {
            let _ = out.send(Out::Frame(f)).await;
        }
    }
    for id in [data, error] {
        for f in FrameWriter::data(id, b"", true) {
            let _ = out.send(Out::Frame(f)).await;
        }
    }
}

async fn relay(
    port: u16,
    data: u32,
    mut inbound: mpsc::Receiver<Bytes>,
    out: &mpsc::Sender<Out>,
    dial: Dialer,
) -> Result<(), ForwardError> {
    let fd = tokio::task::spawn_blocking(move || dial(port)).await??;
    let std_stream = std::net::TcpStream::from(fd);
    std_stream.set_nonblocking(true)?;
    let sock = tokio::net::TcpStream::from_std(std_stream)?;
    // The runtime's socket may still be connecting: writable once it is done either way.
    let connected = async {
        sock.writable().await?;
        match sock.take_error()? {
            Some(e) => Err(e),
            None => Ok(()),
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connected).await {
        Ok(Ok(())) => {}
        Ok(Err(source)) => return Err(ForwardError::Connect { port, source }),
        Err(_) => return Err(ForwardError::ConnectTimeout { port }),
    }
    let (mut rd, mut wr) = sock.into_split();
    let to_peer = async {
        let mut buf = vec![0u8; 32 << 10];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    for f in FrameWriter::data(data, &buf[..n], false) {
                        if out.send(Out::Frame(f)).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                Err(e) => return Err(ForwardError::Io(e)),
            }
        }
    };
    let to_pod = async {
        while let Some(chunk) = inbound.recv().await {
            wr.write_all(&chunk).await?;
        }
        let _ = wr.shutdown().await;
        Ok(())
    };
    tokio::pin!(to_peer, to_pod);
    let (first, other_done) = tokio::select! {
        r = &mut to_peer => (r, false),
        r = &mut to_pod => (r, true),
    };
    let second = if other_done {
        tokio::time::timeout(LINGER, &mut to_peer).await
    } else {
        tokio::time::timeout(LINGER, &mut to_pod).await
    };
    first.and(second.unwrap_or(Ok(())))
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;

    use super::*;

    fn hdrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn stream_headers_are_checked_as_the_kubelet_checks_them() {
        let ok = stream_request(
            5,
            &hdrs(&[("streamtype", "data"), ("port", "80"), ("requestid", "7")]),
        );
        assert_eq!(
            ok,
            Ok(StreamRequest {
                kind: StreamKind::Data,
                port: 80,
                request_id: "7".into()
            })
        );
        // Older clients: the pair is found from the stream ids.
        let e = stream_request(5, &hdrs(&[("streamtype", "error"), ("port", "80")])).expect("error");
        let d = stream_request(7, &hdrs(&[("streamtype", "data"), ("port", "80")])).expect("data");
        assert_eq!(e.request_id, "5");
        assert_eq!(d.request_id, "5");
        for (h, want) in [
            (vec![("port", "80")], "\"streamType\" header is required"),
            (
                vec![("streamtype", "x"), ("port", "80")],
                "invalid stream type \"x\"",
            ),
            (vec![("streamtype", "data")], "\"port\" header is required"),
            (
                vec![("streamtype", "data"), ("port", "70000")],
                "unable to parse \"70000\" as a port",
            ),
            (
                vec![("streamtype", "data"), ("port", "0")],
                "port \"0\" must be > 0",
            ),
        ] {
            assert_eq!(
                stream_request(1, &hdrs(&h)).map_err(|e| e.to_string()),
                Err(want.to_string())
            );
        }
    }

    fn loopback_dialer() -> (Dialer, u16) {
        let l = TcpListener::bind("127.0.0.1:0").expect("listener");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for mut c in l.incoming().flatten() {
                let mut b = [0u8; 64];
                let n = c.read(&mut b).unwrap_or(0);
                let _ = c.write_all(b"echo:");
                let _ = c.write_all(&b[..n]);
            }
        });
        let dial: Dialer = Arc::new(|port| {
            TcpStream::connect(("127.0.0.1", port))
                .map(OwnedFd::from)
                .map_err(|e| ForwardError::Dial {
                    port,
                    pod: "test".into(),
                    source: Box::new(e),
                })
        });
        (dial, port)
    }

    #[tokio::test]
    async fn a_stream_pair_reaches_the_port_and_failures_reach_the_error_stream() {
        let (dial, port) = loopback_dialer();
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        tokio::spawn(serve(server_io, dial));
        let (rd, mut wr) = tokio::io::split(client_io);
        let mut z = crate::spdy::dict_deflate();
        let mut syn = |id, fin, h: &[(&str, &str)]| crate::spdy::syn_stream(&mut z, id, fin, h);
        let p = port.to_string();
        // Pair 1 to the echo server, pair 2 to a port nothing listens on.
        wr.write_all(&syn(
            1,
            true,
            &[("streamtype", "error"), ("port", &p), ("requestid", "0")],
        ))
        .await
        .expect("write");
        wr.write_all(&syn(
            3,
            false,
            &[("streamtype", "data"), ("port", &p), ("requestid", "0")],
        ))
        .await
        .expect("write");
        for f in FrameWriter::data(3, b"hi", false) {
            wr.write_all(&f).await.expect("write");
        }
        wr.write_all(&syn(
            5,
            true,
            &[("streamtype", "error"), ("port", "1"), ("requestid", "1")],
        ))
        .await
        .expect("write");
        wr.write_all(&syn(
            7,
            false,
            &[("streamtype", "data"), ("port", "1"), ("requestid", "1")],
        ))
        .await
        .expect("write");
        // A stream without a port is refused; a ping comes back.
        wr.write_all(&syn(9, false, &[("streamtype", "data")]))
            .await
            .expect("write");
        wr.write_all(&FrameWriter::ping(11)).await.expect("write");
        // A client that opens the data stream first and sends at once: kept until the pair is
        // complete.
        wr.write_all(&syn(
            13,
            false,
            &[("streamtype", "data"), ("port", &p), ("requestid", "2")],
        ))
        .await
        .expect("write");
        for f in FrameWriter::data(13, b"yo", false) {
            wr.write_all(&f).await.expect("write");
        }
        wr.write_all(&syn(
            15,
            true,
            &[("streamtype", "error"), ("port", &p), ("requestid", "2")],
        ))
        .await
        .expect("write");
        let mut r = FrameReader::new(rd);
        let mut data: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut fins = Vec::new();
        let (mut replies, mut resets, mut pings) = (0, Vec::new(), 0);
        while fins.len() < 6 || replies < 6 || resets.is_empty() || pings == 0 {
            let f = tokio::time::timeout(Duration::from_secs(10), r.next())
                .await
                .expect("frames in time")
                .expect("frame")
                .expect("open");
            match f {
                Frame::Data { id, fin, data: d } => {
                    data.entry(id).or_default().extend_from_slice(&d);
                    if fin {
                        fins.push(id);
                    }
                }
                Frame::Ignored => replies += 1,
                Frame::RstStream { id, status } => resets.push((id, status)),
                Frame::Ping { id } => {
                    assert_eq!(id, 11);
                    pings += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(data.get(&3).map(Vec::as_slice), Some(&b"echo:hi"[..]));
        assert_eq!(data.get(&1).map_or(0, Vec::len), 0, "no error on the good pair");
        let err = String::from_utf8_lossy(data.get(&5).expect("error text")).to_string();
        assert!(
            err.starts_with("error forwarding port 1 to pod test, uid : ") && err.contains("refused"),
            "{err}"
        );
        fins.sort_unstable();
        assert_eq!(fins, vec![1, 3, 5, 7, 13, 15]);
        assert_eq!(data.get(&13).map(Vec::as_slice), Some(&b"echo:yo"[..]));
        assert_eq!(resets, vec![(9, spdy::REFUSED_STREAM)]);
    }
}
