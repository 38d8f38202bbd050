//! `kubectl exec` on the node: `GET /exec/<namespace>/<pod>/<container>?command=...` upgraded to a
//! WebSocket speaking the `v5.channel.k8s.io` protocol (binary messages whose first byte is the
//! channel: 0 stdin, 1 stdout, 2 stderr, 3 the final Status, 4 terminal resize, 255 close of a
//! stream). The process runs through the runtime (`Exec`, stdio passed as descriptors): pipes,
//! or a pseudo-terminal with `tty=true`. The WebSocket itself (frames, fragments, masking, ping,
//! close) is tokio-tungstenite's; this module speaks the channel protocol over its messages.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Message, Role, WebSocketConfig};

/// The WebSocket subprotocols served, the preferred first: v4 clients (the Python client, for
/// one) never send channel 255, which is all that v5 adds.
pub const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];

/// How a session reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A WebSocket of `v5.channel.k8s.io` or `v4.channel.k8s.io` channel messages.
    WebSocket,
    /// SPDY/3.1 streams of `v4.channel.k8s.io` ([`crate::remotecommand`]).
    Spdy,
}

pub(crate) const STDIN: u8 = 0;
pub(crate) const STDOUT: u8 = 1;
pub(crate) const STDERR: u8 = 2;
pub(crate) const ERROR: u8 = 3;
pub(crate) const RESIZE: u8 = 4;
pub(crate) const CLOSE: u8 = 255;

/// Largest client message (and frame) accepted: stdin chunks and resize messages are small.
const MAX_MESSAGE: usize = 1 << 20;
/// How much is read from the connection at a time (the crate's default, 128 KiB, is sized for
/// bulk transfers; a session mostly carries keystrokes and small stdin chunks).
const READ_BUFFER: usize = 16 * 1024;
/// How long output is still relayed after the process exited (a background child may keep the
/// pipes open).
const DRAIN: Duration = Duration::from_secs(2);

/// Why an exec cannot be set up or run. The texts are what the user sees (an HTTP body, or the
/// message of the final Status).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("you must specify at least 1 command")]
    NoCommand,
    #[error("container {container} in pod {namespace}/{pod} is not running on this node")]
    NotRunning {
        namespace: String,
        pod: String,
        container: String,
    },
    #[error(transparent)]
    Runtime(#[from] runtime_api::ClientError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

impl ExecError {
    /// The HTTP status the agent answers an upgrade request with.
    pub fn status(&self) -> u16 {
        match self {
            ExecError::NoCommand => 400,
            ExecError::Task(_) => 500,
            ExecError::Runtime(e) if e.kind() == runtime_api::ErrorKind::Unavailable => 503,
            ExecError::Runtime(e) if e.kind() == runtime_api::ErrorKind::Internal => 500,
            ExecError::NotRunning { .. } | ExecError::Runtime(_) | ExecError::Io(_) => 404,
        }
    }
}

/// What the request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecRequest {
    /// Parses the query (`command` repeated, `stdin`/`stdout`/`stderr`/`tty` flags).
    pub fn parse(query: Option<&str>) -> Result<Self, ExecError> {
        let r = Self::parse_flags(query);
        if r.command.is_empty() {
            return Err(ExecError::NoCommand);
        }
        Ok(r)
    }

    /// The query without the need for a command (attach).
    pub fn parse_flags(query: Option<&str>) -> Self {
        let mut r = ExecRequest::default();
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let flag = matches!(v, "true" | "1");
            match k {
                "command" => r.command.push(kcore::url::percent_decode(v)),
                "stdin" => r.stdin = flag,
                "stdout" => r.stdout = flag,
                "stderr" => r.stderr = flag,
                "tty" => r.tty = flag,
                _ => {}
            }
        }
        r
    }
}

pub(crate) fn runtime_client() -> Result<runtime_api::Client, ExecError> {
    Ok(runtime_api::Client::connect(Path::new(runtime_api::SOCKET))?)
}

/// The runtime id of the running container `name` of pod `namespace/pod`.
pub fn find_container(namespace: &str, pod: &str, name: &str) -> Result<String, ExecError> {
    let mut client = runtime_client()?;
    let sandboxes = client.list_sandboxes()?;
    let ids: Vec<&str> = sandboxes
        .iter()
        .filter(|s| s.namespace == namespace && s.name == pod)
        .map(|s| s.id.as_str())
        .collect();
    let containers = client.list_containers()?;
    containers
        .iter()
        .find(|c| {
            ids.contains(&c.sandbox_id.as_str()) && c.name == name && c.state == runtime_api::State::Running
        })
        .map(|c| c.id.clone())
        .ok_or_else(|| ExecError::NotRunning {
            namespace: namespace.into(),
            pod: pod.into(),
            container: name.into(),
        })
}

/// The Status kubectl reads from channel 3 (its exit code comes from the `ExitCode` cause).
pub fn status(exit: Result<i32, ExecError>) -> serde_json::Value {
    match exit {
        Ok(0) => json!({"metadata": {}, "status": "Success"}),
        Ok(code) => json!({
            "metadata": {}, "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Err(e) => {
            json!({"metadata": {}, "status": "Failure", "message": e.to_string(), "reason": "InternalError"})
        }
    }
}

/// A binary message on `channel`.
pub(crate) fn channel_message(channel: u8, data: &[u8]) -> Message {
    let mut p = BytesMut::with_capacity(data.len() + 1);
    p.put_u8(channel);
    p.put_slice(data);
    Message::Binary(p.freeze())
}

/// The body of a resize message (`{"Width":80,"Height":24}`); what is missing is 0.
#[derive(Debug, Default, Deserialize)]
struct TerminalSize {
    #[serde(rename = "Width", default)]
    width: u64,
    #[serde(rename = "Height", default)]
    height: u64,
}

/// Our ends of a process's stdio and the process's own ends, which go to the runtime.
struct Stdio {
    /// Where stdin goes (the terminal's master with a tty).
    stdin: OwnedFd,
    /// What output is read from, with its channel.
    outputs: Vec<(OwnedFd, u8)>,
    /// The process's stdin, stdout and stderr.
    child: [OwnedFd; 3],
}

impl Stdio {
    /// Three pipes, or one pseudo-terminal for all three with `tty`.
    fn new(tty: bool) -> std::io::Result<Self> {
        if tty {
            let (master, slave) = runtime_api::pty::openpty()?;
            let reader = master.try_clone()?;
            let child = [slave.try_clone()?, slave.try_clone()?, slave];
            return Ok(Stdio {
                stdin: master,
                outputs: vec![(reader, STDOUT)],
                child,
            });
        }
        let (in_r, in_w) = std::io::pipe()?;
        let (out_r, out_w) = std::io::pipe()?;
        let (err_r, err_w) = std::io::pipe()?;
        Ok(Stdio {
            stdin: in_w.into(),
            outputs: vec![(out_r.into(), STDOUT), (err_r.into(), STDERR)],
            child: [in_r.into(), out_w.into(), err_w.into()],
        })
    }
}

/// A started process: our ends of its stdio and its exit code to come.
struct Session {
    stdin: OwnedFd,
    outputs: Vec<(OwnedFd, u8)>,
    exit: JoinHandle<Result<i32, ExecError>>,
}

/// Starts `req` in container `id` through the runtime.
async fn start(id: String, req: &ExecRequest) -> Result<Session, ExecError> {
    let Stdio {
        stdin,
        outputs,
        child,
    } = Stdio::new(req.tty)?;
    let command = req.command.clone();
    let exec_id = tokio::task::spawn_blocking(move || {
        let mut client = runtime_client()?;
        let fds = [child[0].as_raw_fd(), child[1].as_raw_fd(), child[2].as_raw_fd()];
        let r = client.exec(&id, command, fds);
        drop(child); // The process has its own copies now: EOF reaches us when it exits.
        Ok::<_, ExecError>(r?)
    })
    .await??;
    tracing::debug!(exec_id = %exec_id, "exec started");
    let exit = tokio::task::spawn_blocking(move || Ok(runtime_client()?.wait_exec(&exec_id)?));
    Ok(Session { stdin, outputs, exit })
}

/// Runs `req` in container `id` and serves the session on `io` (the upgraded connection) until
/// the process has exited and its output is delivered, or the client left. The client's
/// streams are all there before the process starts (SPDY opens them one by one).
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: S,
    transport: Transport,
    id: String,
    req: ExecRequest,
) {
    let Some(ch) = Channels::open(io, transport, &req).await else {
        return;
    };
    let session = start(id, &req).await;
    serve_session(ch, &req, session).await;
}

/// Serves a started (or failed) session on `ch`.
async fn serve_session<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    mut ch: Channels<S>,
    req: &ExecRequest,
    session: Result<Session, ExecError>,
) {
    let exit = match session {
        Ok(session) => relay(&mut ch.messages, session, req, ch.out.clone()).await,
        Err(e) => Some(Err(e)),
    };
    match &exit {
        Some(Ok(code)) => tracing::debug!(exit_code = code, "exec ended"),
        Some(Err(e)) => tracing::debug!(error = %e, "exec failed"),
        None => tracing::debug!("exec client left"),
    }
    ch.finish(exit).await;
}

/// A session's channels, whatever the transport: messages from the client, and a sender whose
/// messages a task of its own writes, so a client that sends (stdin) never waits on one that
/// is not read, and the other way round.
pub(crate) struct Channels<S> {
    pub(crate) messages: Incoming<S>,
    pub(crate) out: mpsc::Sender<Message>,
    writer: Writer<S>,
}

/// What the client sends, as channel messages.
pub(crate) enum Incoming<S> {
    WebSocket(futures_util::stream::SplitStream<WebSocketStream<S>>),
    Spdy(mpsc::Receiver<Message>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream for Incoming<S> {
    type Item = Result<Message, tokio_tungstenite::tungstenite::Error>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        match self.get_mut() {
            Incoming::WebSocket(s) => s.poll_next_unpin(cx),
            Incoming::Spdy(r) => r.poll_recv(cx).map(|m| m.map(Ok)),
        }
    }
}

/// The task writing our messages: it hands a WebSocket's sink back for the final shutdown; a
/// SPDY session closes its connection itself.
enum Writer<S> {
    WebSocket(JoinHandle<Sink<S>>),
    Spdy(JoinHandle<()>),
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Channels<S> {
    /// The channels of the upgraded connection `io`; None when a SPDY client did not open the
    /// streams `req` needs (logged).
    pub(crate) async fn open(io: S, transport: Transport, req: &ExecRequest) -> Option<Self> {
        if transport == Transport::Spdy {
            return match crate::remotecommand::open(io, req).await {
                Ok(s) => Some(Self {
                    messages: Incoming::Spdy(s.incoming),
                    out: s.out,
                    writer: Writer::Spdy(s.task),
                }),
                Err(e) => {
                    tracing::debug!(error = %e, "SPDY session not started");
                    None
                }
            };
        }
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(0)
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let ws = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
        let (sink, messages) = ws.split();
        let (out, out_rx) = mpsc::channel::<Message>(64);
        let writer = tokio::spawn(write_messages(sink, out_rx));
        Some(Self {
            messages: Incoming::WebSocket(messages),
            out,
            writer: Writer::WebSocket(writer),
        })
    }

    /// Ends the session: the status on channel 3 and a normal close (unless `exit` is None:
    /// the client left and there is nobody to tell), then our side of the connection shut down.
    pub(crate) async fn finish(self, exit: Option<Result<i32, ExecError>>) {
        let Channels {
            messages,
            out: out_tx,
            writer,
        } = self;
        if let Some(exit) = exit {
            let status = status(exit).to_string();
            let _ = out_tx.send(channel_message(ERROR, status.as_bytes())).await;
            let normal = CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            };
            let _ = out_tx.send(Message::Close(Some(normal))).await;
        }
        drop(out_tx);
        match (writer, messages) {
            // Our side of the connection is shut down (TLS close_notify, then FIN) rather than
            // just dropped, so the API server's splice sees a clean end.
            (Writer::WebSocket(writer), Incoming::WebSocket(messages)) => {
                if let Ok(sink) = writer.await
                    && let Ok(mut ws) = messages.reunite(sink)
                {
                    let _ = ws.get_mut().shutdown().await;
                }
            }
            // A SPDY session closes its connection itself.
            (Writer::Spdy(task), _) => {
                let _ = task.await;
            }
            (Writer::WebSocket(writer), _) => {
                let _ = writer.await;
            }
        }
    }
}

type Sink<S> = SplitSink<WebSocketStream<S>, Message>;

/// Sends what `out` carries, then completes the close (answering the client's close if it sent
/// one). Hands the sink back for the final shutdown.
async fn write_messages<S: AsyncRead + AsyncWrite + Unpin>(
    mut sink: Sink<S>,
    mut out: mpsc::Receiver<Message>,
) -> Sink<S> {
    while let Some(m) = out.recv().await {
        if sink.send(m).await.is_err() {
            return sink;
        }
    }
    let _ = sink.close().await;
    sink
}

/// Copies a descriptor's output to the client on `channel` until EOF (or EIO, a closed
/// terminal). Reads are asynchronous, so dropping the task closes the descriptor.
async fn pump_output(fd: OwnedFd, channel: u8, out: mpsc::Sender<Message>) {
    if runtime_api::pty::set_nonblocking(fd.as_fd()).is_err() {
        return;
    }
    // `AsyncFd::new` is deprecated because a `T` that does not own its descriptor could close it
    // while registered; here `T` is a `File` that owns it alone, which is the sound case (the
    // replacement, `register`, is `unsafe`, which this crate forbids).
    #[allow(deprecated)]
    let Ok(afd) = tokio::io::unix::AsyncFd::new(std::fs::File::from(fd)) else {
        return;
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(mut guard) = afd.readable().await else {
            return;
        };
        match guard.try_io(|f| {
            let mut file: &std::fs::File = f.get_ref();
            file.read(&mut buf)
        }) {
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(n)) => {
                if out.send(channel_message(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
            Err(_would_block) => {}
        }
    }
}

/// Stdin goes through a bounded channel to a writer thread: a process that does not read holds
/// the client back instead of filling our memory. Dropping the sender closes stdin. The
/// descriptor may be non-blocking (a container's terminal, which the runtime also reads): a
/// full buffer is waited out, not taken for an error.
pub(crate) fn stdin_writer(fd: OwnedFd) -> mpsc::Sender<Bytes> {
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    let mut file = std::fs::File::from(fd);
    std::thread::spawn(move || {
        while let Some(chunk) = rx.blocking_recv() {
            let mut rest = &chunk[..];
            while !rest.is_empty() {
                match file.write(rest) {
                    Ok(0) => return,
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        }
    });
    tx
}

/// The exit code (or why there is none); None when the client left first. Leaving closes the
/// process's stdin and our ends of its output (a terminal hangs up), and stops waiting for it.
async fn relay<M>(
    messages: &mut M,
    session: Session,
    req: &ExecRequest,
    out: mpsc::Sender<Message>,
) -> Option<Result<i32, ExecError>>
where
    M: Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let Session {
        stdin: stdin_ours,
        outputs,
        exit,
    } = session;
    let pumps: Vec<_> = outputs
        .into_iter()
        .map(|(fd, channel)| tokio::spawn(pump_output(fd, channel, out.clone())))
        .collect();
    let tty = req.tty;
    let resize_fd = if tty { stdin_ours.try_clone().ok() } else { None };
    let mut stdin = if req.stdin || tty {
        Some(stdin_writer(stdin_ours))
    } else {
        drop(stdin_ours);
        None
    };
    let mut exit = std::pin::pin!(exit);
    let code = loop {
        tokio::select! {
            done = &mut exit => break done.map_err(ExecError::from).and_then(|r| r),
            m = messages.next() => match m {
                // Text is not what kubectl sends, but it carries a channel byte all the same.
                Some(Ok(Message::Binary(data))) => on_channel(data, &mut stdin, resize_fd.as_ref(), tty).await,
                Some(Ok(Message::Text(text))) => on_channel(Bytes::from(text), &mut stdin, resize_fd.as_ref(), tty).await,
                // Pings are answered by the crate; pongs and raw frames carry nothing for us.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => {
                    // The client left: close everything of ours; the process sees EOF, a broken
                    // pipe or a hangup. Its exit is no longer awaited.
                    for p in &pumps {
                        p.abort();
                    }
                    return None;
                }
            },
        }
    };
    drop((stdin, resize_fd));
    let deadline = tokio::time::Instant::now() + DRAIN;
    for p in pumps {
        let abort = p.abort_handle();
        if tokio::time::timeout_at(deadline, p).await.is_err() {
            abort.abort();
        }
    }
    Some(code)
}

/// One client message: stdin data, a terminal resize or the close of stdin.
pub(crate) async fn on_channel(
    data: Bytes,
    stdin: &mut Option<mpsc::Sender<Bytes>>,
    resize_fd: Option<&OwnedFd>,
    tty: bool,
) {
    match data.first() {
        Some(&STDIN) => {
            if let Some(w) = stdin.as_ref() {
                let _ = w.send(data.slice(1..)).await;
            }
        }
        Some(&RESIZE) => {
            if let (Some(fd), Ok(size)) = (resize_fd, serde_json::from_slice::<TerminalSize>(&data[1..])) {
                let dim = |n: u64| u16::try_from(n).unwrap_or(u16::MAX);
                let _ = runtime_api::pty::set_window_size(fd.as_fd(), dim(size.width), dim(size.height));
            }
        }
        Some(&CLOSE) if data[1..] == [STDIN] && !tty => *stdin = None,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Instant;

    use tokio::io::DuplexStream;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

    use super::*;

    #[test]
    fn parses_kubectl_queries() {
        let r = ExecRequest::parse(Some(
            "command=sh&command=-c&command=echo+hi%3B+exit+3&container=main&stderr=true&stdout=true",
        ))
        .expect("valid");
        assert_eq!(r.command, ["sh", "-c", "echo hi; exit 3"]);
        assert!(r.stdout && r.stderr && !r.stdin && !r.tty);
        let none = ExecRequest::parse(Some("stdout=true")).expect_err("no command");
        assert_eq!(none.to_string(), "you must specify at least 1 command");
        assert_eq!(none.status(), 400);
    }

    #[test]
    fn exit_status_for_kubectl() {
        assert_eq!(status(Ok(0))["status"], "Success");
        let s = status(Ok(3));
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(
            s["details"]["causes"][0],
            json!({"reason": "ExitCode", "message": "3"})
        );
        let gone = ExecError::NotRunning {
            namespace: "default".into(),
            pod: "web".into(),
            container: "main".into(),
        };
        assert_eq!(
            gone.to_string(),
            "container main in pod default/web is not running on this node"
        );
        assert_eq!(gone.status(), 404);
        let s = status(Err(gone));
        assert_eq!(
            (&s["status"], &s["reason"]),
            (&json!("Failure"), &json!("InternalError"))
        );
    }

    type Client = WebSocketStream<DuplexStream>;

    /// `sh -c script` on the host in place of the runtime, with the stdio a session gets.
    fn local_session(script: &str, tty: bool) -> Session {
        let Stdio {
            stdin,
            outputs,
            child,
        } = Stdio::new(tty).expect("stdio");
        let [i, o, e] = child;
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]).stdin(i).stdout(o).stderr(e);
        let mut process = cmd.spawn().expect("sh");
        drop(cmd); // Our copies of the process's ends: EOF must reach the pumps.
        let exit = tokio::task::spawn_blocking(move || Ok(process.wait()?.code().unwrap_or(-1)));
        Session { stdin, outputs, exit }
    }

    /// A client connected to `serve_session` over an in-memory connection.
    async fn connect(req: ExecRequest, session: Result<Session, ExecError>) -> (Client, JoinHandle<()>) {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let ch = Channels::open(theirs, Transport::WebSocket, &req)
                .await
                .expect("channels");
            serve_session(ch, &req, session).await
        });
        let client = WebSocketStream::from_raw_socket(ours, Role::Client, None).await;
        (client, server)
    }

    /// What the server sent until it closed: data per channel, and the close code.
    #[derive(Debug, Default)]
    struct Received {
        channels: std::collections::BTreeMap<u8, Vec<u8>>,
        closed: bool,
        close: Option<CloseCode>,
        pongs: usize,
    }

    impl Received {
        fn text(&self, channel: u8) -> String {
            String::from_utf8_lossy(self.channels.get(&channel).map_or(&[][..], |v| v)).into_owned()
        }

        fn status(&self) -> serde_json::Value {
            serde_json::from_slice(self.channels.get(&ERROR).expect("a status")).expect("status JSON")
        }
    }

    async fn receive_all(client: &mut Client) -> Received {
        let mut r = Received::default();
        let read = async {
            while let Some(m) = client.next().await {
                // The server shuts the connection down right after its close frame: answering it
                // may fail.
                if r.closed && m.is_err() {
                    break;
                }
                match m.expect("message") {
                    Message::Binary(b) => {
                        let (channel, data) = b.split_first().expect("channel byte");
                        r.channels.entry(*channel).or_default().extend_from_slice(data);
                    }
                    Message::Close(f) => {
                        r.closed = true;
                        r.close = f.map(|f| f.code);
                    }
                    Message::Pong(_) => r.pongs += 1,
                    other => panic!("unexpected {other:?}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the session ends");
        r
    }

    fn request(stdin: bool, tty: bool) -> ExecRequest {
        ExecRequest {
            command: vec!["sh".into()],
            stdin,
            stdout: true,
            stderr: !tty,
            tty,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn stdin_reassembled_output_split_and_exit_code() {
        rt().block_on(async {
            let session = local_session("cat; echo err >&2; exit 3", false);
            let (mut client, server) = connect(request(true, false), Ok(session)).await;
            // One stdin message in two fragments with a ping between them, then stdin closed.
            let first = Frame::message(&b"\x00ab"[..], OpCode::Data(Data::Binary), false);
            let rest = Frame::message(&b"cd"[..], OpCode::Data(Data::Continue), true);
            client.send(Message::Frame(first)).await.expect("send");
            client.send(Message::Ping("p".into())).await.expect("send");
            client.send(Message::Frame(rest)).await.expect("send");
            client.send(channel_message(CLOSE, &[STDIN])).await.expect("send");
            let got = receive_all(&mut client).await;
            assert_eq!(got.text(STDOUT), "abcd");
            assert_eq!(got.text(STDERR), "err\n");
            let s = got.status();
            assert_eq!(s["reason"], "NonZeroExitCode");
            assert_eq!(s["details"]["causes"][0]["message"], "3");
            assert_eq!(got.close, Some(CloseCode::Normal));
            assert_eq!(got.pongs, 1, "the ping is answered");
            server.await.expect("server");
        });
    }

    #[test]
    fn terminal_resized_before_input() {
        rt().block_on(async {
            let session = local_session("read line; stty size; exit 0", true);
            let (mut client, server) = connect(request(true, true), Ok(session)).await;
            let resize = channel_message(RESIZE, br#"{"Width":100,"Height":40}"#);
            client.send(resize).await.expect("send");
            client.send(channel_message(STDIN, b"go\n")).await.expect("send");
            let got = receive_all(&mut client).await;
            assert!(got.text(STDOUT).contains("40 100"), "{:?}", got.text(STDOUT));
            assert_eq!(got.status()["status"], "Success");
            server.await.expect("server");
        });
    }

    #[test]
    fn client_leaving_ends_the_session() {
        rt().block_on(async {
            // `cat` only ends when its stdin closes, which our leaving does.
            let session = local_session("cat", false);
            let (mut client, server) = connect(request(true, false), Ok(session)).await;
            client.send(channel_message(STDIN, b"x")).await.expect("send");
            let echoed = client.next().await.expect("output").expect("message");
            assert_eq!(echoed, channel_message(STDOUT, b"x"));
            client.close(None).await.expect("close");
            let got = receive_all(&mut client).await;
            assert!(
                got.channels.is_empty(),
                "no status for a client that left: {got:?}"
            );
            tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .expect("the server stops")
                .expect("server");
        });
    }

    #[test]
    fn oversized_message_ends_the_session() {
        rt().block_on(async {
            let session = local_session("cat", false);
            let (mut client, server) = connect(request(true, false), Ok(session)).await;
            let big = vec![0u8; MAX_MESSAGE + 1];
            // The server stops reading: the send itself may or may not complete.
            let _ =
                tokio::time::timeout(Duration::from_secs(5), client.send(Message::Binary(big.into()))).await;
            tokio::time::timeout(Duration::from_secs(5), server)
                .await
                .expect("the server stops")
                .expect("server");
        });
    }

    #[test]
    fn output_relayed_at_most_two_seconds_after_exit() {
        rt().block_on(async {
            // The background `sleep` keeps stdout and stderr open after the shell exited.
            let session = local_session("sleep 10 & echo started", false);
            let started = Instant::now();
            let (mut client, server) = connect(request(false, false), Ok(session)).await;
            let got = receive_all(&mut client).await;
            assert_eq!(got.text(STDOUT), "started\n");
            assert_eq!(got.status()["status"], "Success");
            let took = started.elapsed();
            assert!(took >= DRAIN && took < DRAIN * 3, "{took:?}");
            server.await.expect("server");
        });
    }

    #[test]
    fn failed_start_reported_as_status() {
        rt().block_on(async {
            let failed = Err(ExecError::Io(std::io::Error::other("no runtime here")));
            let (mut client, server) = connect(request(false, false), failed).await;
            let got = receive_all(&mut client).await;
            let s = got.status();
            assert_eq!(s["reason"], "InternalError");
            assert_eq!(s["message"], "no runtime here");
            assert_eq!(got.close, Some(CloseCode::Normal));
            server.await.expect("server");
        });
    }

    /// A SPDY client opening `streams` (id, streamType) as client-go does, sending `input`
    /// (stream id, bytes, fin) once they are replied to, and collecting until the server closes:
    /// the data and FIN of each stream.
    async fn spdy_session(
        req: ExecRequest,
        session: Session,
        streams: &[(u32, &str)],
        input: &[(u32, &[u8], bool)],
    ) -> std::collections::BTreeMap<u32, (Vec<u8>, bool)> {
        use crate::spdy::{self, FrameReader, FrameWriter};
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let ch = Channels::open(theirs, Transport::Spdy, &req)
                .await
                .expect("streams");
            serve_session(ch, &req, Ok(session)).await
        });
        let (rd, mut wr) = tokio::io::split(ours);
        let mut deflate = spdy::dict_deflate();
        for (id, kind) in streams {
            let syn = spdy::syn_stream(&mut deflate, *id, false, &[("streamtype", kind)]);
            wr.write_all(&syn).await.expect("write");
        }
        for (id, data, fin) in input {
            for f in FrameWriter::data(*id, data, *fin) {
                wr.write_all(&f).await.expect("write");
            }
        }
        let mut got = std::collections::BTreeMap::<u32, (Vec<u8>, bool)>::new();
        let mut frames = FrameReader::new(rd);
        let read = async {
            while let Some(f) = frames.next().await.expect("frame") {
                if let crate::spdy::Frame::Data { id, fin, data } = f {
                    let e = got.entry(id).or_default();
                    assert!(!e.1, "data after FIN on stream {id}");
                    e.0.extend_from_slice(&data);
                    e.1 |= fin;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the server closes");
        server.await.expect("server");
        got
    }

    #[test]
    fn the_same_session_over_spdy() {
        rt().block_on(async {
            let session = local_session("cat; echo err >&2; exit 3", false);
            let streams = [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")];
            let got = spdy_session(
                request(true, false),
                session,
                &streams,
                &[(3, b"ab", false), (3, b"cd", true)],
            )
            .await;
            let text = |id: u32| String::from_utf8_lossy(&got[&id].0).into_owned();
            assert_eq!(text(5), "abcd");
            assert_eq!(text(7), "err\n");
            let status: serde_json::Value = serde_json::from_slice(&got[&1].0).expect("status JSON");
            assert_eq!(status["reason"], "NonZeroExitCode");
            assert_eq!(status["details"]["causes"][0]["message"], "3");
            assert!(
                got[&1].1 && got[&5].1 && got[&7].1,
                "every stream the server writes ends: {got:?}"
            );
            assert!(!got.contains_key(&3), "nothing is written on stdin");
        });
    }

    #[test]
    fn a_terminal_over_spdy_takes_resizes_from_their_stream() {
        rt().block_on(async {
            let session = local_session("read line; stty size; exit 0", true);
            // No stderr stream with a terminal; a stream of no known type is accepted and ignored.
            let streams = [
                (1, "error"),
                (3, "stdin"),
                (5, "stdout"),
                (7, "resize"),
                (9, "video"),
            ];
            let input: [(u32, &[u8], bool); 3] = [
                (7, b"{\"Width\":100,", false),
                (7, b"\"Height\":40}\n", false),
                (3, b"go\n", false),
            ];
            let got = spdy_session(request(true, true), session, &streams, &input).await;
            let out = String::from_utf8_lossy(&got[&5].0);
            assert!(out.contains("40 100"), "{out:?}");
            let status: serde_json::Value = serde_json::from_slice(&got[&1].0).expect("status JSON");
            assert_eq!(status["status"], "Success");
        });
    }
}
