//! gRPC probes (docs/SEEDS-SPEC.md NODE-23): one `grpc.health.v1.Health/Check` call over
//! HTTP/2 without TLS, as the kubelet makes it (`pkg/probe/grpc`), with its texts.
//!
//! The call is small enough to write by hand over hyper's HTTP/2 client: a five-byte gRPC frame
//! around a one-field protobuf message each way, the status in the `grpc-status` trailer (or
//! header, for a trailers-only answer). A gRPC stack (tonic, prost) would add far more to the
//! node binary than these lines; hyper's HTTP/2 is the only new code linked (the `h2` crate).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kcore::time::go_duration;

/// The health service's path.
pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// Why a gRPC probe failed, in the kubelet's words.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GrpcError {
    #[error("timeout: failed to connect service \"{addr}\" within {within}: context deadline exceeded")]
    Connect { addr: String, within: String },
    #[error("error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {0}")]
    Unimplemented(String),
    #[error("timeout: health rpc did not complete within {0}")]
    Timeout(String),
    #[error("error: health rpc probe failed: {0}")]
    Failed(String),
    #[error("service unhealthy (responded with \"{0}\")")]
    Unhealthy(String),
}

/// gRPC status code names, as grpc-go prints them.
fn code_name(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("Code({code})"), |n| (*n).to_string())
}

/// The health service's `ServingStatus` names.
fn serving_status(n: u64) -> String {
    match n {
        0 => "UNKNOWN".into(),
        1 => "SERVING".into(),
        2 => "NOT_SERVING".into(),
        3 => "SERVICE_UNKNOWN".into(),
        other => other.to_string(),
    }
}

/// The request: a gRPC frame (uncompressed, length) around `HealthCheckRequest{service}`.
pub fn request_frame(service: &str) -> Bytes {
    let mut msg = BytesMut::new();
    if !service.is_empty() {
        msg.put_u8(0x0a); // field 1, length-delimited
        put_varint(&mut msg, service.len() as u64);
        msg.put_slice(service.as_bytes());
    }
    let mut frame = BytesMut::with_capacity(5 + msg.len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(msg.len()).unwrap_or(u32::MAX));
    frame.put_slice(&msg);
    frame.freeze()
}

fn put_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn get_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            return None;
        }
        let b = buf.get_u8();
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The `status` of a `HealthCheckResponse` frame (0, UNKNOWN, when absent); None when the
/// bytes are not one well-formed frame.
pub fn response_status(frame: &[u8]) -> Option<u64> {
    let mut b = frame;
    if b.len() < 5 || b.get_u8() != 0 {
        return None;
    }
    let len = usize::try_from(b.get_u32()).ok()?;
    let mut msg = b.get(..len)?;
    let mut status = 0;
    while msg.has_remaining() {
        let key = get_varint(&mut msg)?;
        match (key >> 3, key & 7) {
            (1, 0) => status = get_varint(&mut msg)?,
            (_, 0) => {
                get_varint(&mut msg)?;
            }
            (_, 1) if msg.remaining() >= 8 => msg.advance(8),
            (_, 2) => {
                let n = usize::try_from(get_varint(&mut msg)?).ok()?;
                if msg.remaining() < n {
                    return None;
                }
                msg.advance(n);
            }
            (_, 5) if msg.remaining() >= 4 => msg.advance(4),
            _ => return None,
        }
    }
    Some(status)
}

/// `grpc-message` is percent-encoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |j: usize| b.get(j).and_then(|c| (*c as char).to_digit(16));
        match (b[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// grpc-go's code for an HTTP status other than 200 (`unexpected HTTP status code...`).
fn code_of_http(status: u16) -> u32 {
    match status {
        400 => 13,
        401 => 16,
        403 => 7,
        404 => 12,
        429 | 502 | 503 | 504 => 14,
        _ => 2,
    }
}

/// A failed call as the kubelet reports it.
fn rpc_error(code: u32, message: &str) -> GrpcError {
    if code == 12 {
        GrpcError::Unimplemented(message.to_string())
    } else {
        GrpcError::Failed(format!("rpc error: code = {} desc = {message}", code_name(code)))
    }
}

/// Checks `service` at `host:port` within `timeout`.
pub async fn check(host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), GrpcError> {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let within = go_duration(timeout);
    let deadline = tokio::time::Instant::now() + timeout;
    let connect = tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect((host, port))).await;
    let Ok(Ok(stream)) = connect else {
        return Err(GrpcError::Connect { addr, within });
    };
    let call = async {
        let failed = |e: &dyn std::fmt::Display| GrpcError::Failed(e.to_string());
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(|e| failed(&e))?;
        tokio::spawn(conn);
        let req = hyper::Request::post(format!("http://{addr}{CHECK_PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("user-agent", "kube-probe/1.32")
            .body(Full::new(request_frame(service)))
            .map_err(|e| failed(&e))?;
        let resp = send.send_request(req).await.map_err(|e| failed(&e))?;
        let (parts, body) = resp.into_parts();
        if parts.status != hyper::StatusCode::OK {
            let code = code_of_http(parts.status.as_u16());
            let why = format!(
                "unexpected HTTP status code received from server: {}",
                parts.status
            );
            return Err(rpc_error(code, &why));
        }
        let collected = body.collect().await.map_err(|e| failed(&e))?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let field = |name: &str| {
            trailers
                .get(name)
                .or_else(|| parts.headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = field("grpc-status")
            .and_then(|c| c.parse::<u32>().ok())
            .unwrap_or(2);
        if code != 0 {
            let message = field("grpc-message")
                .map(|m| percent_decode(&m))
                .unwrap_or_default();
            return Err(rpc_error(code, &message));
        }
        let data = collected.to_bytes();
        let status = response_status(&data)
            .ok_or_else(|| rpc_error(13, "grpc: failed to unmarshal the received message"))?;
        if status == 1 {
            Ok(())
        } else {
            Err(GrpcError::Unhealthy(serving_status(status)))
        }
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => r,
        Err(_) => Err(GrpcError::Timeout(within)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use hyper::body::Frame;

    #[test]
    fn frames_and_texts() {
        assert_eq!(&request_frame("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(&request_frame("db")[..], &[0, 0, 0, 0, 4, 0x0a, 2, b'd', b'b']);
        assert_eq!(response_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(1));
        assert_eq!(response_status(&[0, 0, 0, 0, 0]), Some(0), "absent: UNKNOWN");
        // An unknown length-delimited field before the status is skipped.
        assert_eq!(response_status(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 2]), Some(2));
        assert_eq!(response_status(&[0, 0, 0, 0, 9, 0x08]), None, "truncated");
        assert_eq!(response_status(&[1, 0, 0, 0, 0]), None, "compressed");
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(percent_decode("unknown%20service"), "unknown service");
    }

    /// A health server: service "" SERVING, "down" NOT_SERVING, "nohealth" answers as a server
    /// without the health service (Unimplemented), anything else NotFound; errors are
    /// trailers-only, as grpc-go answers them.
    async fn serve(listener: tokio::net::TcpListener) {
        use hyper::service::service_fn;
        type Frames = std::pin::Pin<
            Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>> + Send>,
        >;
        while let Ok((tcp, _)) = listener.accept().await {
            let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                let path = req.uri().path().to_string();
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default();
                let service = String::from_utf8_lossy(body.get(7..).unwrap_or_default()).into_owned();
                let trailers = |code: &str, msg: &str| {
                    let mut t = hyper::HeaderMap::new();
                    t.insert("grpc-status", code.parse().expect("value"));
                    t.insert("grpc-message", msg.parse().expect("value"));
                    t
                };
                let resp = hyper::Response::builder().header("content-type", "application/grpc");
                let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> =
                    if path != CHECK_PATH || service == "nohealth" {
                        let t = trailers("12", "unknown%20service%20grpc.health.v1.Health");
                        vec![Ok(Frame::trailers(t))]
                    } else {
                        match service.as_str() {
                            "" => vec![
                                Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 1]))),
                                Ok(Frame::trailers(trailers("0", ""))),
                            ],
                            "down" => vec![
                                Ok(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 2, 0x08, 2]))),
                                Ok(Frame::trailers(trailers("0", ""))),
                            ],
                            _ => vec![Ok(Frame::trailers(trailers("5", "unknown%20service")))],
                        }
                    };
                let stream: Frames = Box::pin(futures_util::stream::iter(frames));
                resp.body(StreamBody::new(stream))
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc),
            );
        }
    }

    #[tokio::test]
    async fn health_checks_report_the_kubelets_texts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(serve(listener));
        let second = Duration::from_secs(2);
        assert_eq!(check("127.0.0.1", port, "", second).await, Ok(()));
        assert_eq!(
            check("127.0.0.1", port, "down", second)
                .await
                .map_err(|e| e.to_string()),
            Err("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert_eq!(
            check("127.0.0.1", port, "db", second)
                .await
                .map_err(|e| e.to_string()),
            Err("error: health rpc probe failed: rpc error: code = NotFound desc = unknown service".into())
        );
        assert_eq!(
            check("127.0.0.1", port, "nohealth", second).await.map_err(|e| e.to_string()),
            Err("error: this server does not implement the grpc health protocol (grpc.health.v1.Health): unknown service grpc.health.v1.Health".into())
        );
        // A server that accepts and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let silent_port = silent.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = silent.accept().await {
                held.push(tcp);
            }
        });
        assert_eq!(
            check("127.0.0.1", silent_port, "", Duration::from_secs(1))
                .await
                .map_err(|e| e.to_string()),
            Err("timeout: health rpc did not complete within 1s".into())
        );
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let dead = closed.local_addr().expect("addr").port();
        drop(closed);
        assert_eq!(
            check("127.0.0.1", dead, "", Duration::from_secs(1))
                .await
                .map_err(|e| e.to_string()),
            Err(format!(
                "timeout: failed to connect service \"127.0.0.1:{dead}\" within 1s: context deadline exceeded"
            ))
        );
    }
}
