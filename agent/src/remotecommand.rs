//! `kubectl exec` and `kubectl attach` over SPDY/3.1: the kubelet's `v4.channel.k8s.io` stream
//! protocol, which kubectl falls back to when its WebSocket upgrade fails and which clients built
//! on client-go before 1.30 always speak. The client opens one SPDY stream per channel, named by
//! its `streamType` header (`error`, `stdin`, `stdout`, `stderr`, `resize`); the agent waits
//! until the streams the request names are all there (the kubelet's 30 s), then runs the
//! session.
//!
//! To exec and attach it is the same conversation as the WebSocket protocol: [`open`] presents
//! the connection as `v5.channel.k8s.io` channel messages. The client's stdin DATA is channel 0
//! and its FIN the close of channel 0, each JSON object on the resize stream is channel 4; our
//! channel 1 and 2 messages go out as DATA on stdout and stderr, the status on channel 3 as DATA
//! and FIN on the error stream, and the close as FIN on stdout and stderr and the end of the
//! connection (client-go waits for both FINs and the error stream's end).

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::exec::{self, ExecRequest};
use crate::spdy::{self, Frame, FrameReader, FrameWriter, Out};

/// The stream protocol served over SPDY (v1-v3 differ in how errors are reported).
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// How long the client has to open the streams its request names (the kubelet's default).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Most client input kept while the streams are still being opened.
const MAX_EARLY: usize = 1 << 20;
/// Longest resize object (`{"Width":65535,"Height":65535}` is 30 bytes).
const MAX_RESIZE: usize = 4 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum StreamType {
    Error,
    Stdin,
    Stdout,
    Stderr,
    Resize,
}

impl StreamType {
    /// The type a new stream's headers name; None for a type the protocol does not have.
    fn of(headers: &[(String, String)]) -> Option<Self> {
        let (_, t) = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("streamtype"))?;
        Some(match t.as_str() {
            "error" => Self::Error,
            "stdin" => Self::Stdin,
            "stdout" => Self::Stdout,
            "stderr" => Self::Stderr,
            "resize" => Self::Resize,
            _ => return None,
        })
    }
}

/// The streams a request needs (the kubelet's count): the error stream always, stdio as asked
/// (stderr only without a terminal, whose output is all on stdout), resize with a terminal.
fn expected(req: &ExecRequest) -> Vec<StreamType> {
    let mut v = vec![StreamType::Error];
    v.extend(req.stdin.then_some(StreamType::Stdin));
    v.extend(req.stdout.then_some(StreamType::Stdout));
    v.extend((req.stderr && !req.tty).then_some(StreamType::Stderr));
    v.extend(req.tty.then_some(StreamType::Resize));
    v
}

/// Why a session did not start.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("timed out waiting for client to create streams")]
    Timeout,
    #[error("the client left before creating its streams")]
    Left,
    #[error("the client sent over {MAX_EARLY} bytes before creating its streams")]
    TooEarly,
}

/// A session whose streams are open: the client's channel messages, ours, and the task that
/// writes ours (it ends, and closes the connection, once `out` is closed).
pub(crate) struct Session {
    pub(crate) incoming: mpsc::Receiver<Message>,
    pub(crate) out: mpsc::Sender<Message>,
    pub(crate) task: JoinHandle<()>,
}

/// Serves the SPDY connection `io` until the client has opened the streams `req` needs.
pub(crate) async fn open<IO>(io: IO, req: &ExecRequest) -> Result<Session, SessionError>
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let (frames, writer) = spdy::spawn_writer(wr);
    let (in_tx, incoming) = mpsc::channel(16);
    let (ready_tx, ready) = oneshot::channel();
    let reader = tokio::spawn(read(
        FrameReader::new(rd),
        expected(req),
        frames.clone(),
        in_tx,
        ready_tx,
    ));
    let streams = match tokio::time::timeout(STREAM_CREATION_TIMEOUT, ready).await {
        Ok(Ok(Ok(streams))) => streams,
        failed => {
            reader.abort();
            drop(frames);
            let _ = writer.await;
            return Err(match failed {
                Ok(Ok(Err(e))) => e,
                Ok(Err(_)) => SessionError::Left,
                _ => SessionError::Timeout,
            });
        }
    };
    let (out, out_rx) = mpsc::channel(64);
    let task = tokio::spawn(write(out_rx, streams, frames, reader, writer));
    Ok(Session { incoming, out, task })
}

type Ready = oneshot::Sender<Result<HashMap<StreamType, u32>, SessionError>>;

/// Reads the client's frames: accepts its streams, says when the expected ones are there, and
/// turns what arrives on stdin and resize into channel messages. Returning (the client left)
/// closes `incoming`.
async fn read<R: AsyncRead + Unpin>(
    mut reader: FrameReader<R>,
    mut missing: Vec<StreamType>,
    frames: mpsc::Sender<Out>,
    incoming: mpsc::Sender<Message>,
    ready: Ready,
) {
    let mut streams: HashMap<u32, StreamType> = HashMap::new();
    let mut ready = Some(ready);
    let mut early: Vec<Message> = Vec::new();
    let mut early_bytes = 0usize;
    let mut resize = BytesMut::new();
    loop {
        let frame = match reader.next().await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => return tracing::debug!(error = %e, "exec connection"),
        };
        let messages = match frame {
            Frame::SynStream { id, headers, .. } => {
                // Every stream is accepted (spdystream replies before anyone looks at it);
                // one of no known type, or a second of a type, is then ignored, as the
                // kubelet does.
                if frames.send(Out::Reply(id)).await.is_err() {
                    return;
                }
                match StreamType::of(&headers) {
                    Some(t) if !streams.values().any(|&s| s == t) => {
                        streams.insert(id, t);
                        missing.retain(|&m| m != t);
                    }
                    t => tracing::debug!(stream = id, kind = ?t, "stream ignored"),
                }
                if missing.is_empty()
                    && let Some(r) = ready.take()
                {
                    if r.send(Ok(streams.iter().map(|(&id, &t)| (t, id)).collect()))
                        .is_err()
                    {
                        return;
                    }
                    std::mem::take(&mut early)
                } else {
                    Vec::new()
                }
            }
            Frame::Data { id, fin, data } => match streams.get(&id) {
                Some(StreamType::Stdin) => {
                    let mut m = Vec::with_capacity(2);
                    if !data.is_empty() {
                        m.push(exec::channel_message(exec::STDIN, &data));
                    }
                    if fin {
                        m.push(exec::channel_message(exec::CLOSE, &[exec::STDIN]));
                    }
                    m
                }
                Some(StreamType::Resize) => resizes(&mut resize, &data),
                _ => Vec::new(),
            },
            // Pings from the client have odd ids: echoed.
            Frame::Ping { id } if id % 2 == 1 => {
                if frames.send(Out::Frame(FrameWriter::ping(id))).await.is_err() {
                    return;
                }
                Vec::new()
            }
            Frame::GoAway => return,
            Frame::RstStream { .. } | Frame::Ping { .. } | Frame::Ignored => Vec::new(),
        };
        for m in messages {
            if ready.is_some() {
                early_bytes += m.len();
                if early_bytes > MAX_EARLY {
                    if let Some(r) = ready.take() {
                        let _ = r.send(Err(SessionError::TooEarly));
                    }
                    return;
                }
                early.push(m);
            } else if incoming.send(m).await.is_err() {
                return;
            }
        }
    }
}

/// The resize objects completed by `data` (client-go writes one JSON object per size), each as
/// a channel 4 message; what is incomplete stays in `buf`. Garbage is dropped.
fn resizes(buf: &mut BytesMut, data: &[u8]) -> Vec<Message> {
    buf.extend_from_slice(data);
    let mut out = Vec::new();
    let mut used = 0;
    let mut objects = serde_json::Deserializer::from_slice(buf).into_iter::<serde_json::Value>();
    loop {
        match objects.next() {
            Some(Ok(v)) => {
                used = objects.byte_offset();
                if let Ok(json) = serde_json::to_vec(&v) {
                    out.push(exec::channel_message(exec::RESIZE, &json));
                }
            }
            Some(Err(e)) if e.is_eof() => break,
            Some(Err(_)) => {
                used = buf.len();
                break;
            }
            None => {
                used = buf.len();
                break;
            }
        }
    }
    let _ = buf.split_to(used);
    if buf.len() > MAX_RESIZE {
        buf.clear();
    }
    out
}

/// Writes our channel messages as frames on the client's streams until the close (or until
/// the session drops its sender), then ends stdout and stderr, stops reading and lets the
/// writer close the connection.
async fn write(
    mut out: mpsc::Receiver<Message>,
    streams: HashMap<StreamType, u32>,
    frames: mpsc::Sender<Out>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
) {
    let data = |t: StreamType, bytes: &[u8], fin: bool| -> Vec<Bytes> {
        streams
            .get(&t)
            .map(|&id| FrameWriter::data(id, bytes, fin))
            .unwrap_or_default()
    };
    'session: while let Some(m) = out.recv().await {
        let to_send = match m {
            Message::Binary(b) => match b.split_first() {
                Some((&exec::STDOUT, rest)) => data(StreamType::Stdout, rest, false),
                Some((&exec::STDERR, rest)) => data(StreamType::Stderr, rest, false),
                Some((&exec::ERROR, rest)) => data(StreamType::Error, rest, true),
                _ => Vec::new(),
            },
            Message::Close(_) => break,
            _ => Vec::new(),
        };
        for f in to_send {
            if frames.send(Out::Frame(f)).await.is_err() {
                break 'session;
            }
        }
    }
    for t in [StreamType::Stdout, StreamType::Stderr] {
        for f in data(t, b"", true) {
            let _ = frames.send(Out::Frame(f)).await;
        }
    }
    reader.abort();
    drop(frames);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel4(m: &[Message]) -> Vec<String> {
        m.iter()
            .map(|m| match m {
                Message::Binary(b) if b[0] == exec::RESIZE => String::from_utf8_lossy(&b[1..]).into_owned(),
                other => panic!("not a resize: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn resize_objects_are_cut_out_of_the_stream() {
        let mut buf = BytesMut::new();
        assert!(resizes(&mut buf, b"{\"Width\":80,").is_empty(), "incomplete");
        let got = resizes(&mut buf, b"\"Height\":24}\n{\"Width\":100,\"Height\":40}\n{\"Wi");
        assert_eq!(
            channel4(&got),
            [r#"{"Height":24,"Width":80}"#, r#"{"Height":40,"Width":100}"#]
        );
        assert_eq!(&buf[..], b"\n{\"Wi", "the rest waits for its end");
        assert_eq!(channel4(&resizes(&mut buf, b"dth\":1,\"Height\":2}")).len(), 1);
        assert!(resizes(&mut buf, b"}garbage{").is_empty());
        assert!(buf.is_empty(), "garbage is dropped");
        assert!(resizes(&mut buf, &[b'['; MAX_RESIZE + 1]).is_empty());
        assert!(buf.is_empty(), "an endless object is dropped");
    }

    #[test]
    fn streams_a_request_waits_for() {
        let req = |stdin, stdout, stderr, tty| ExecRequest {
            command: vec!["sh".into()],
            stdin,
            stdout,
            stderr,
            tty,
        };
        use StreamType::*;
        assert_eq!(expected(&req(false, true, true, false)), [Error, Stdout, Stderr]);
        assert_eq!(expected(&req(true, true, false, false)), [Error, Stdin, Stdout]);
        // kubectl exec -it: stderr goes over the terminal, which has a resize stream.
        assert_eq!(
            expected(&req(true, true, true, true)),
            [Error, Stdin, Stdout, Resize]
        );
        assert_eq!(expected(&req(false, false, false, false)), [Error]);
    }

    #[test]
    fn a_client_leaving_before_its_streams_starts_nothing() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (ours, theirs) = tokio::io::duplex(4096);
            let req = ExecRequest {
                stdout: true,
                ..ExecRequest::default()
            };
            let opened = tokio::spawn(async move { open(theirs, &req).await.map(|_| ()) });
            drop(ours);
            let e = opened.await.expect("task").expect_err("no session");
            assert!(matches!(e, SessionError::Left), "{e:?}");
        });
    }
}
